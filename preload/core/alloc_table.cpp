#include "core/alloc_table.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <mutex>

namespace offload {

AllocTable::AllocTable(size_t reserve) { entries_.reserve(reserve); }

size_t AllocTable::upper(DevPtr addr) const {
  auto it = std::upper_bound(entries_.begin(), entries_.end(), addr,
                             [](DevPtr a, const AllocEntry& e) { return a < e.base; });
  return static_cast<size_t>(it - entries_.begin());
}

const AllocEntry* AllocTable::find_locked(DevPtr addr) const {
  size_t i = upper(addr);
  if (i == 0) return nullptr;
  const AllocEntry& e = entries_[i - 1];
  return addr - e.base < e.size ? &e : nullptr;
}

void AllocTable::set_exact(bool exact) {
  std::unique_lock lock(mu_);
  exact_ = exact;
  const size_t slots = std::max<size_t>(1024, std::bit_ceil(entries_.capacity() * 2));
  entries_.assign(exact ? slots : 0, AllocEntry{0, 0, 0});
  used_ = 0;
}

size_t AllocTable::home(DevPtr base) const {
  uint64_t x = base >> 8;  // allocations are at least 256-byte aligned
  x ^= x >> 31;
  x *= 0x9e3779b97f4a7c15ull;
  x ^= x >> 29;
  return static_cast<size_t>(x) & (entries_.size() - 1);
}

size_t AllocTable::probe(DevPtr base) const {
  size_t i = home(base);
  while (entries_[i].base != 0 && entries_[i].base != base) i = (i + 1) & (entries_.size() - 1);
  return i;
}

void AllocTable::grow() {
  std::vector<AllocEntry> old(entries_.size() * 2, AllocEntry{0, 0, 0});
  old.swap(entries_);
  for (const AllocEntry& e : old)
    if (e.base) entries_[probe(e.base)] = e;
}

size_t AllocTable::insert_exact(DevPtr base, uint64_t size, AllocId id, AllocEntry* replaced) {
  size_t n = 0;
  {
    std::unique_lock lock(mu_);
    if ((used_ + 1) * 2 > entries_.size()) grow();
    const size_t i = probe(base);
    if (entries_[i].base == base) {  // its free went unseen
      if (replaced) replaced[n++] = entries_[i];
      live_bytes_.fetch_sub(entries_[i].size, std::memory_order_relaxed);
    } else {
      ++used_;
    }
    entries_[i] = AllocEntry{base, size, id};
    note_id(id);
  }
  live_bytes_.fetch_add(size, std::memory_order_relaxed);
  return n;
}

std::optional<AllocEntry> AllocTable::erase_exact(DevPtr base) {
  std::unique_lock lock(mu_);
  size_t i = probe(base);
  if (entries_[i].base != base || base == 0) return std::nullopt;
  const AllocEntry e = entries_[i];
  live_bytes_.fetch_sub(e.size, std::memory_order_relaxed);
  --used_;
  // Backward-shift deletion: later entries of the run move up where their probe allows it.
  const size_t mask = entries_.size() - 1;
  for (size_t j = (i + 1) & mask; entries_[j].base != 0; j = (j + 1) & mask) {
    const size_t k = home(entries_[j].base);
    // j's entry may fill the hole at i unless its home lies cyclically in (i, j].
    const bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
    if (stays) continue;
    entries_[i] = entries_[j];
    i = j;
  }
  entries_[i] = AllocEntry{0, 0, 0};
  return e;
}

size_t AllocTable::insert(DevPtr base, uint64_t size, AllocId id, AllocEntry* replaced) {
  if (size == 0) size = 1;  // a zero-byte allocation still owns its address
  if (exact_) return insert_exact(base, size, id, replaced);
  size_t n = 0;
  auto drop = [&](size_t i) {
    if (replaced && n < kMaxReplaced) replaced[n++] = entries_[i];
    live_bytes_.fetch_sub(entries_[i].size, std::memory_order_relaxed);
    entries_.erase(entries_.begin() + static_cast<ptrdiff_t>(i));
  };
  {
    std::unique_lock lock(mu_);
    size_t i = upper(base);
    // Drop stale entries that overlap the new range (their frees went unseen).
    while (i > 0 && entries_[i - 1].base + entries_[i - 1].size > base) drop(--i);
    while (i < entries_.size() && entries_[i].base < base + size) drop(i);
    entries_.insert(entries_.begin() + static_cast<ptrdiff_t>(i), AllocEntry{base, size, id});
    note_id(id);
  }
  live_bytes_.fetch_add(size, std::memory_order_relaxed);
  DevPtr lo = lo_.load(std::memory_order_relaxed);
  while (base < lo && !lo_.compare_exchange_weak(lo, base)) {}
  DevPtr hi = hi_.load(std::memory_order_relaxed);
  while (base + size > hi && !hi_.compare_exchange_weak(hi, base + size)) {}
  return n;
}

std::optional<AllocEntry> AllocTable::erase(DevPtr base) {
  if (exact_) return erase_exact(base);
  std::unique_lock lock(mu_);
  size_t i = upper(base);
  if (i == 0 || entries_[i - 1].base != base) return std::nullopt;
  AllocEntry e = entries_[i - 1];
  entries_.erase(entries_.begin() + static_cast<ptrdiff_t>(i - 1));
  live_bytes_.fetch_sub(e.size, std::memory_order_relaxed);
  return e;
}

std::optional<AllocEntry> AllocTable::find(DevPtr addr) const {
  std::shared_lock lock(mu_);
  if (exact_) {
    if (addr == 0) return std::nullopt;
    const AllocEntry& e = entries_[probe(addr)];
    return e.base == addr ? std::optional<AllocEntry>(e) : std::nullopt;
  }
  const AllocEntry* e = find_locked(addr);
  return e ? std::optional<AllocEntry>(*e) : std::nullopt;
}

size_t AllocTable::scan(const void* words, size_t nwords, AllocId* out, size_t count,
                        size_t cap) const {
  if (exact_) {  // nothing is scanned in exact mode
    std::sort(out, out + count);
    return static_cast<size_t>(std::unique(out, out + count) - out);
  }
  const DevPtr lo = lo_.load(std::memory_order_relaxed);
  const DevPtr hi = hi_.load(std::memory_order_relaxed);
  const auto* bytes = static_cast<const unsigned char*>(words);
  bool locked = false;
  std::shared_lock lock(mu_, std::defer_lock);
  for (size_t w = 0; w < nwords; ++w) {
    DevPtr v;
    std::memcpy(&v, bytes + w * 8, sizeof v);
    if (v < lo || v >= hi) continue;  // most words are sizes, strides, scalars
    if (!locked) {
      lock.lock();
      locked = true;
    }
    const AllocEntry* e = find_locked(v);
    if (!e) continue;
    // Consecutive words often point into the same allocation; the rest is deduplicated
    // when the output fills (a multi-tensor kernel passes hundreds of pointers) and at the end.
    if (count > 0 && out[count - 1] == e->id) continue;
    if (count == cap) {
      std::sort(out, out + count);
      count = static_cast<size_t>(std::unique(out, out + count) - out);
      if (count == cap) break;  // truly full: the caller sees count == cap
    }
    out[count++] = e->id;
  }
  std::sort(out, out + count);
  return static_cast<size_t>(std::unique(out, out + count) - out);
}

size_t AllocTable::size() const {
  std::shared_lock lock(mu_);
  return exact_ ? used_ : entries_.size();
}

}  // namespace offload

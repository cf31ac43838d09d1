#include "core/alloc_table.h"

#include <algorithm>
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

size_t AllocTable::insert(DevPtr base, uint64_t size, AllocId id, AllocEntry* replaced) {
  if (size == 0) size = 1;  // a zero-byte allocation still owns its address
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
  }
  live_bytes_.fetch_add(size, std::memory_order_relaxed);
  DevPtr lo = lo_.load(std::memory_order_relaxed);
  while (base < lo && !lo_.compare_exchange_weak(lo, base)) {}
  DevPtr hi = hi_.load(std::memory_order_relaxed);
  while (base + size > hi && !hi_.compare_exchange_weak(hi, base + size)) {}
  return n;
}

std::optional<AllocEntry> AllocTable::erase(DevPtr base) {
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
  const AllocEntry* e = find_locked(addr);
  return e ? std::optional<AllocEntry>(*e) : std::nullopt;
}

size_t AllocTable::scan(const void* words, size_t nwords, AllocId* out, size_t count,
                        size_t cap) const {
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
  return entries_.size();
}

}  // namespace offload

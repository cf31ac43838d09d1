#include "offload/pool_layout.h"

#include <algorithm>
#include <cstring>

namespace offload {
namespace {
uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
uint64_t data_offset_for(uint32_t max_leases) {
  return round_up(sizeof(PoolHeader) + uint64_t{max_leases} * sizeof(LeaseSlot), kDataAlign);
}
}  // namespace

uint64_t pool_total_bytes(uint64_t data_bytes, uint32_t max_leases) {
  return data_offset_for(max_leases) + round_up(data_bytes, kLeaseAlign);
}

std::optional<LeaseTable> LeaseTable::format(void* base, uint64_t total, uint32_t max_leases, uint32_t owner_pid) {
  uint64_t off = data_offset_for(max_leases);
  if (!base || max_leases == 0 || total <= off) return std::nullopt;
  auto* h = static_cast<PoolHeader*>(base);
  std::memset(base, 0, off);
  std::memcpy(h->magic, kPoolMagic, sizeof h->magic);
  h->layout_version = kPoolLayoutVersion;
  h->max_leases = max_leases;
  h->table_offset = sizeof(PoolHeader);
  h->data_offset = off;
  h->data_bytes = (total - off) / kLeaseAlign * kLeaseAlign;
  h->generation = 1;
  h->owner_pid = owner_pid;
  return LeaseTable(static_cast<unsigned char*>(base), h, *h);
}

std::optional<LeaseTable> LeaseTable::open(void* base, uint64_t total, std::string* why) {
  auto fail = [&](const char* m) {
    if (why) *why = m;
    return std::nullopt;
  };
  if (!base || total < sizeof(PoolHeader)) return fail("segment smaller than a pool header");
  // Checked on a copy: another process may write the shared header between check and use.
  PoolHeader h;
  std::memcpy(&h, base, sizeof h);
  if (std::memcmp(h.magic, kPoolMagic, sizeof h.magic) != 0) return fail("not a liboffload pool (bad magic)");
  if (h.layout_version != kPoolLayoutVersion) return fail("pool layout version not supported");
  if (h.max_leases == 0 || h.table_offset != sizeof(PoolHeader) || h.data_offset != data_offset_for(h.max_leases) ||
      h.data_offset > total || h.data_bytes > total - h.data_offset)
    return fail("pool header does not match the segment's size");
  return LeaseTable(static_cast<unsigned char*>(base), static_cast<PoolHeader*>(base), h);
}

LeaseSlot LeaseTable::slot(uint32_t i) const {
  LeaseSlot s;
  std::memcpy(&s, base_ + table_offset_ + uint64_t{i} * sizeof(LeaseSlot), sizeof s);
  return s;
}

std::vector<std::pair<uint64_t, uint64_t>> LeaseTable::used_extents() const {
  std::vector<std::pair<uint64_t, uint64_t>> v;
  for (uint32_t i = 0; i < max_leases_; ++i)
    if (LeaseSlot s = slot(i); s.used && in_bounds(s)) v.emplace_back(s.offset, s.bytes);
  std::sort(v.begin(), v.end());
  return v;
}

std::optional<uint64_t> LeaseTable::lease(uint64_t bytes, uint32_t client_id, uint32_t pid, uint32_t pid_start) {
  if (bytes == 0 || bytes > data_bytes_) return std::nullopt;
  bytes = round_up(bytes, kLeaseAlign);
  LeaseSlot* free_slot = nullptr;
  for (uint32_t i = 0; i < max_leases_ && !free_slot; ++i)
    if (!slot(i).used) free_slot = slot_at(i);
  if (!free_slot) return std::nullopt;
  uint64_t at = 0;
  for (auto [off, len] : used_extents()) {
    if (off >= at + bytes) break;  // the gap before this extent fits
    at = std::max(at, off + len);
  }
  if (at + bytes > data_bytes_) return std::nullopt;
  *free_slot = LeaseSlot{1, client_id, pid, pid_start, at, bytes};
  return at;
}

bool LeaseTable::release(uint64_t offset, uint32_t client_id) {
  for (uint32_t i = 0; i < max_leases_; ++i) {
    LeaseSlot s = slot(i);
    if (s.used && s.offset == offset && s.client_id == client_id) {
      *slot_at(i) = LeaseSlot{};
      return true;
    }
  }
  return false;
}

uint64_t LeaseTable::release_all(uint32_t client_id) {
  uint64_t freed = 0;
  for (uint32_t i = 0; i < max_leases_; ++i) {
    LeaseSlot s = slot(i);
    if (s.used && s.client_id == client_id) {
      if (in_bounds(s)) freed += s.bytes;
      *slot_at(i) = LeaseSlot{};
    }
  }
  return freed;
}

uint64_t LeaseTable::used_bytes() const {
  uint64_t n = 0;
  for (auto [off, len] : used_extents()) n += len;
  return n;
}

uint64_t LeaseTable::leased_by(uint32_t client_id) const {
  uint64_t n = 0;
  for (uint32_t i = 0; i < max_leases_; ++i)
    if (LeaseSlot s = slot(i); s.used && s.client_id == client_id && in_bounds(s)) n += s.bytes;
  return n;
}

uint64_t LeaseTable::largest_free() const {
  uint64_t at = 0, best = 0;
  for (auto [off, len] : used_extents()) {
    if (off > at) best = std::max(best, off - at);
    at = std::max(at, off + len);
  }
  return std::max(best, data_bytes_ - std::min(at, data_bytes_));
}

std::vector<LeaseSlot> LeaseTable::leases() const {
  std::vector<LeaseSlot> v;
  for (uint32_t i = 0; i < max_leases_; ++i)
    if (LeaseSlot s = slot(i); s.used && in_bounds(s)) v.push_back(s);
  return v;
}

uint32_t LeaseTable::bad_slots() const {
  uint32_t n = 0;
  for (uint32_t i = 0; i < max_leases_; ++i)
    if (LeaseSlot s = slot(i); s.used && !in_bounds(s)) ++n;
  return n;
}

}  // namespace offload

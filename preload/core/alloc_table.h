// AllocTable: the interval map of live device allocations.
//
// Any address inside [base, base + size) resolves to its allocation, so a view with a
// storage offset (an interior pointer) is attributed to the allocation that owns it.
//
// Threading: insert/erase take an exclusive lock, lookups a shared one; no call is made
// while a lock is held, and nothing allocates after construction unless the table grows
// past its reserved capacity (rare: it doubles).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <shared_mutex>
#include <vector>

#include "core/driver.h"
#include "planner/types.h"  // AllocId

namespace offload {

struct AllocEntry {
  DevPtr base;
  uint64_t size;
  AllocId id;
};

class AllocTable {
 public:
  explicit AllocTable(size_t reserve = 1 << 16);

  // Adds [base, base+size). Entries overlapping it are removed (the driver reused the
  // range; their frees went unseen) and written to `replaced` (up to kMaxReplaced; any
  // beyond are removed all the same). Returns how many were written.
  static constexpr size_t kMaxReplaced = 16;
  size_t insert(DevPtr base, uint64_t size, AllocId id, AllocEntry* replaced = nullptr);
  // Removes the allocation that starts at `base`; nullopt if none does.
  std::optional<AllocEntry> erase(DevPtr base);
  // The allocation containing `addr`, if any.
  std::optional<AllocEntry> find(DevPtr addr) const;

  // Appends to `out` the id of every allocation that one of the `nwords` 8-byte words at
  // `words` points into, up to `cap` entries in all; out[0, returned count) is then sorted
  // and free of duplicates (entries already there included). Returns the new count.
  size_t scan(const void* words, size_t nwords, AllocId* out, size_t count, size_t cap) const;

  size_t size() const;
  uint64_t live_bytes() const { return live_bytes_.load(std::memory_order_relaxed); }

 private:
  size_t upper(DevPtr addr) const;  // first entry with base > addr
  const AllocEntry* find_locked(DevPtr addr) const;

  mutable std::shared_mutex mu_;
  std::vector<AllocEntry> entries_;  // sorted by base, non-overlapping
  std::atomic<DevPtr> lo_{~DevPtr{0}}, hi_{0};  // bounds of every address ever inserted
  std::atomic<uint64_t> live_bytes_{0};
};

}  // namespace offload

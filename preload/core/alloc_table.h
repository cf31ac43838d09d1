// AllocTable: the interval map of live device allocations.
//
// Any address inside [base, base + size) resolves to its allocation, so a view with a
// storage offset (an interior pointer) is attributed to the allocation that owns it.
//
// Exact mode (set_exact, before any entry: light observation, where no launch is scanned): an
// allocation is found by its base address alone, in a hash table. A sorted vector's insert and
// erase move the entries after it, about 0.4 us an allocation and its free with a few thousand
// live on the H200's host (docs/results.md, "What watching costs"); the hash's are constant.
// scan() then finds nothing, find() only bases, and insert() replaces only an entry at the same
// base.
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
  // The largest plain id inserted so far: ids are handed out in order, so one above it was not yet born.
  AllocId max_id() const { return max_id_.load(std::memory_order_relaxed); }
  void set_exact(bool exact);  // before the first insert

 private:
  // Exact mode's open-addressing table (linear probing; base 0 marks an empty slot).
  size_t home(DevPtr base) const;
  size_t probe(DevPtr base) const;  // its slot, or the empty slot where it would go
  void grow();
  size_t insert_exact(DevPtr base, uint64_t size, AllocId id, AllocEntry* replaced);
  std::optional<AllocEntry> erase_exact(DevPtr base);

  size_t upper(DevPtr addr) const;  // first entry with base > addr
  const AllocEntry* find_locked(DevPtr addr) const;

  mutable std::shared_mutex mu_;
  std::vector<AllocEntry> entries_;  // sorted by base, non-overlapping (exact: the hash's slots)
  bool exact_ = false;
  size_t used_ = 0;  // exact: entries in the hash
  std::atomic<DevPtr> lo_{~DevPtr{0}}, hi_{0};  // bounds of every address ever inserted
  std::atomic<uint64_t> live_bytes_{0};
  std::atomic<AllocId> max_id_{0};  // of plain ids (a range's or an arena member's carries its high bits)
  void note_id(AllocId id) {  // under the lock
    if (id < (AllocId{1} << 62) && id > max_id_.load(std::memory_order_relaxed)) max_id_.store(id, std::memory_order_relaxed);
  }
};

// The allocation holding `p` in the AllocTable `table` (a Residency::Finder): its id, base, size.
inline bool find_alloc(void* table, DevPtr p, AllocId* id, DevPtr* base, uint64_t* bytes) {
  const std::optional<AllocEntry> e = static_cast<const AllocTable*>(table)->find(p);
  if (!e) return false;
  *id = e->id, *base = e->base, *bytes = e->size;
  return true;
}

// The largest allocation id `table` has held (a Residency::Horizon).
inline AllocId alloc_horizon(void* table) { return static_cast<const AllocTable*>(table)->max_id(); }

}  // namespace offload

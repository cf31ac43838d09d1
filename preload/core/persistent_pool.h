// PersistentPool: large allocations ours from birth (OFFLOAD_PERSISTENT_MIN).
//
// Weights and optimizer state are allocated before any plan exists, from PyTorch's pool, where
// nothing can be unmapped. Served from here instead, each such allocation lives in its own
// reserved range backed by its own physical handle: the executor can later move it out with one
// copy and one unmap and back with one map and one copy, as it does an arena, while the
// pointer PyTorch holds stays valid.
//
// Freed blocks are kept by size and handed out again, so a training step, which repeats its
// sizes, makes no driver call once warm. Reuse follows cudaFreeAsync's stream order: on the
// freeing stream at once, on another stream after it waits for an event recorded at the free.
// Kept blocks over `cache_bytes` are released once their frees have completed; when the device
// is full, every completed kept block is released before the allocation is given up (then the
// caller forwards it to the normal allocator).
//
// Thread-safe: one mutex; driver calls are made under it (they do not call back into hooks).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>

#include "core/backing.h"
#include "core/driver.h"

namespace offload {

class PersistentPool {
 public:
  struct Options {
    uint64_t min_bytes = 0;              // smaller allocations are not ours; 0: none are
    uint64_t cache_bytes = 4ull << 30;   // freed bytes kept for reuse beyond which they are released
    // Each block's range is reserved at this many times its size (lend's *room): a weight that
    // is no multiple of the executor's unit reloads on whole units mapped past its end (lora's
    // 376 MiB embedding on six units of 72 MiB) instead of a handle of its own remainder, which
    // no leaving weight has. Address space costs nothing here; the memory mapped is counted by
    // its handles. 1: no room past a block's end.
    uint64_t room = 2;
  };
  struct Stats {
    uint64_t allocs = 0;        // served
    uint64_t reused = 0;        // of those, from a kept block
    uint64_t cross_stream = 0;  // of those, on another stream than the free (an event wait)
    uint64_t created = 0;       // blocks created (range, handle, map)
    uint64_t released = 0;      // blocks given back to the driver
    uint64_t refused = 0;       // allocations the device had no room for (forwarded)
    uint64_t live_bytes = 0, cached_bytes = 0;
    uint64_t lent_bytes = 0;    // of live_bytes, those whose backing the executor holds
    uint64_t peak_bytes = 0;    // physical bytes (live - lent + cached) at their highest
  };

  PersistentPool(Driver& d, Options o);
  ~PersistentPool();  // gives every block back (kept ones after their frees complete)
  PersistentPool(const PersistentPool&) = delete;
  PersistentPool& operator=(const PersistentPool&) = delete;

  // A block of at least `bytes` usable by work queued on `s` from now on; 0 when the
  // allocation is not ours (below min_bytes, no VMM, or no room on the device).
  DevPtr alloc(uint64_t bytes, Stream s);
  // False when `p` is not the start of a live block of ours (the caller forwards the free).
  bool free(DevPtr p, Stream s);
  bool owns(DevPtr p) const;
  // The live block's rounded size; 0 if `p` is not the start of one.
  uint64_t block_bytes(DevPtr p) const;
  Stats stats() const;
  uint64_t min_bytes() const { return o_.min_bytes; }
  void reset_peak();
  // No more allocations are served (alloc returns 0: the caller's allocator serves them); kept
  // blocks are released once their frees complete. The shim closes the pool when it plans:
  // what outlives a step (weights, optimizer state) is born by then, and what is born later
  // lives within a step, where cudaMallocAsync's pool serves it (each allocation and free a
  // stream operation; OFFLOAD_BLOCK_CACHE keeps those off the GPU: core/block_cache.h).
  void close();

  // Weight streaming. lend: the executor takes the live block's backing (mapped at `p`); from
  // then on it maps and unmaps the block's range itself, and the pool counts the block's bytes
  // as lent, not held. False if `p` is not the start of a live block not lent already.
  // unlend: a backing of the block's size, mapped at `p` again, goes back to the pool (not
  // necessarily the one lent: a streamed weight comes back on whatever handles it was last
  // reloaded into; it may map past the block's end, within *room: Options::room).
  bool lend(DevPtr p, Backing* backing, uint64_t* bytes, uint64_t* room = nullptr);
  bool unlend(DevPtr p, Backing backing);

 private:
  struct Block {
    DevPtr va = 0;
    uint64_t bytes = 0;    // rounded to the granularity
    uint64_t room = 0;     // the range reserved at va: Options::room times bytes
    Backing backing;       // empty: lent
    uint64_t event = 0;    // recorded on `freed_on` at the free (0: none could be made)
    Stream freed_on = 0;
    uint64_t seq = 0;      // order of the frees
  };
  DevPtr create(uint64_t bytes);                  // holds mu_
  void give_back(Block& b);                       // holds mu_; its free has completed
  // Releases kept blocks whose frees have completed, oldest first, until `target` kept
  // bytes remain (0: all it can). Returns the bytes released. Holds mu_.
  uint64_t trim(uint64_t target);
  void note_peak();

  Driver& d_;
  Options o_;
  uint64_t gran_ = 0;
  mutable std::mutex mu_;
  std::unordered_map<DevPtr, Block> live_;
  std::multimap<uint64_t, Block> kept_;  // by size; equal sizes in the order they were freed
  uint64_t frees_ = 0;
  bool closed_ = false;
  Stats st_;
};

}  // namespace offload

// BlockCache: the step's allocations reused on the stream that freed them, with no stream
// operation (OFFLOAD_BLOCK_CACHE).
//
// Under backend:cudaMallocAsync every tensor is one cudaMallocAsync and one cudaFreeAsync, and
// each pair costs the GPU 0.3-1.4 us (docs/results.md: sync_cost.py's pool_ops); a
// lora step makes 4766 pairs. PyTorch's native allocator reuses its blocks without any: that is
// most of what the hand-written baseline gains from it. Here a block freed on stream s is kept,
// by its exact size, and handed to the next allocation of that size on s. Stream order puts
// that allocation's work after every use the free was ordered after (the freeing stream's
// later work follows the free), which is cudaFreeAsync's own rule for reuse on that stream.
// Only the freeing stream reuses a block: another stream would need an event, which is the
// cost this saves. Not the per-thread default stream: its handle names another stream on each
// thread. A training step repeats its sizes, so once warm most allocations hit.
//
// Never for memory a graph capture made or will replay: an allocation made while its stream
// was capturing (or when that could not be told) is marked and its free forwarded, and nothing
// is taken or kept on a capturing stream. Kept bytes are bounded (frees past the bound are
// forwarded); when the device is full the caller drains the cache (forwarding every kept
// block's free) and tries again. A trim of the pool (torch.cuda.empty_cache()) leaves the kept
// blocks, at most the bound, in place: drained there, the pool comes back larger and its pool
// watch revises a plan that met the budget (lora: docs/results.md).
//
// Thread-safe: one mutex, no driver calls under it (drain hands the blocks out first).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/driver.h"

namespace offload {

class BlockCache {
 public:
  struct Stats {
    uint64_t hits = 0;       // allocations served from a kept block
    uint64_t misses = 0;     // allocations looked up and forwarded
    uint64_t kept = 0;       // frees kept
    uint64_t forwarded = 0;  // frees forwarded: past the bound, or a capture's memory
    uint64_t captured = 0;   // allocations made while their stream captured (never kept)
    uint64_t drains = 0, drained_blocks = 0;  // drains that gave blocks back, and those blocks
    uint64_t kept_bytes = 0, kept_peak = 0;
  };

  explicit BlockCache(uint64_t max_bytes = 0) : max_(max_bytes) {}
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  bool enabled() const { return max_.load(std::memory_order_relaxed) != 0; }
  // A new bound (0: off; kept blocks stay until drained).
  void set_max(uint64_t bytes) { max_.store(bytes, std::memory_order_relaxed); }

  // A kept block of exactly `bytes` freed on `s` in context `ctx`, now the caller's; 0: none
  // (forward it). `capturing`: the stream's capture state (1 capturing, 0 not, -1 unknown).
  // Blocks are kept per context, the device's: the legacy stream's handle is the same on each.
  // A context of 0 (unknown) is never served.
  DevPtr take(uint64_t bytes, uint64_t ctx, Stream s, int capturing);
  // The caller's allocator served `p` on `s`: made while capturing (or unknown), it is marked
  // so that its free is forwarded.
  void note_forwarded(DevPtr p, Stream s, int capturing);
  // True: the free of `p` (`bytes`) on `s` in context `ctx` is kept here and must not be
  // forwarded.
  bool keep(DevPtr p, uint64_t bytes, uint64_t ctx, Stream s, int capturing);
  // Every block kept in context `ctx`, emptied from the cache, with its freeing stream: the
  // caller forwards their frees (the device is full).
  std::vector<std::pair<DevPtr, Stream>> drain(uint64_t ctx);
  Stats stats() const;

 private:
  struct Key {
    uint64_t ctx;
    Stream s;
    uint64_t bytes;
    bool operator==(const Key& o) const { return ctx == o.ctx && s == o.s && bytes == o.bytes; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return std::hash<uint64_t>()((k.bytes * 31 + k.s) * 31 + k.ctx); }
  };
  std::atomic<uint64_t> max_;
  mutable std::mutex mu_;
  std::unordered_map<Key, std::vector<DevPtr>, KeyHash> kept_;  // freed last, taken first
  std::unordered_set<DevPtr> captured_;                          // never kept
  std::atomic<size_t> captured_n_{0};                            // its size, read without the lock
  Stats st_;
};

}  // namespace offload

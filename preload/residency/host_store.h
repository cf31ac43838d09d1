// HostStore: pinned host memory for the bytes the residency manager evicts, grown on demand.
//
// With a device budget, what the cap forces out must have somewhere to go, and how much that
// is becomes known only as the process allocates. The store maps anonymous memory in chunks
// (pinned with Driver::pin_host, which faults them in, in pieces of at most `pin_piece` bytes:
// one huge registration fails or takes minutes) and hands out slots inside them. A slot never
// spans two chunks; a slot larger than a chunk gets one of its own (its size in whole chunks).
// Inside the chunks, slots are placed best fit and freed slots merge with free neighbours of the
// same chunk, so that a step whose mix of sizes out at once changes (a plan's prefetches and
// early evictions do) is served from room already pinned: with slots reused by exact size only,
// the recorded steps' stores grew 15-66% past their most bytes in use (`offloadctl replay
// --cap`, host_mapped_bytes against host_peak_bytes; docs/results.md), and every byte of growth
// is pinned on the thread that evicts. A slot over pin_piece takes a whole free chunk of at most twice its size.
//
// A copy never spans two pinned registrations (a driver may take such a copy for pinned memory
// it is not): a chunk of at most pin_piece is one registration, and a larger one holds one
// slot, registered in pieces of pin_piece from its start, as copies are split.
//
// `limit` bounds the store's memory that this process made (0: MemAvailable at construction less
// a quarter); what offloadd's pool lends is the node's, counted there. take() returns nullptr
// past it: the caller says how much more was needed.
//
// Chunks come first from a ChunkSource when one is given: offloadd's node-wide pool, whose pages
// the daemon faulted in before this process needed them, so that only pinning is left to pay
// here (making fresh memory cost 340 ms/GiB on the H200's host, pinning made memory about 42).
//
// The store can also grow ahead of need, off the evicting thread (grow_ahead(), from the shim's
// worker): in steady steps the bytes on the host still creep up (the reference at half its peak
// on the H200: pinned where it was needed, 173-469 ms a step; docs/results.md). Off by default:
// made on the worker, the memory held the training thread up about as long.
//
// Thread-safe: one mutex, held by take() while it makes a chunk (the evicting thread waits for it
// anyway), never by grow_ahead() while it makes one. Never called from a hook while another of
// its locks is held.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/driver.h"

namespace offload {

// Host memory made elsewhere, lent to the store a chunk at a time for the rest of the process
// (offloadd takes a client's leases back when its connection ends).
class ChunkSource {
 public:
  struct Lent {
    void* p = nullptr;
    bool counted = false;  // this process's memory (made ahead here): it counts against the store's limit
  };
  virtual ~ChunkSource() = default;
  // `bytes` at a page-aligned address, or none (the store then maps its own); with `may_count`
  // false, only memory that is not counted (another process's: offloadd's pool).
  virtual Lent lend(uint64_t bytes, bool may_count) = 0;
};

class HostStore {
 public:
  struct Options {
    uint64_t chunk_bytes = 256ull << 20;
    uint64_t pin_piece = 1ull << 30;  // registrations and copies never span more
    uint64_t limit = 0;                // bytes of this process's memory at most; 0: from MemAvailable
  };
  struct Stats {
    uint64_t mapped = 0, in_use = 0, peak_in_use = 0, chunks = 0, pin_failures = 0;
    uint64_t refused = 0;  // take() past the limit
    uint64_t counted = 0;  // of `mapped`, the bytes counted against the limit (all but offloadd's)
    int64_t pin_ns = 0;    // wall time pinning chunks where take() needed them (which faults them in)
    uint64_t lent = 0;     // of `mapped`, the bytes a ChunkSource lent
    int64_t pin_lent_ns = 0;   // of pin_ns, pinning what a ChunkSource lent (made before, so quicker)
    uint64_t free_blocks = 0;  // free blocks inside chunks (how fragmented the room is)
    uint64_t ahead = 0;        // of `mapped`, the bytes grow_ahead() made
    int64_t ahead_ns = 0;      // wall time grow_ahead() spent making and pinning them (not in pin_ns)
  };

  HostStore(Driver& d, Options o, ChunkSource* source = nullptr);
  ~HostStore();
  HostStore(const HostStore&) = delete;
  HostStore& operator=(const HostStore&) = delete;

  // `bytes` of pinned host memory, or nullptr past the limit (or when the OS refuses); with
  // `grow` false, only from room already pinned.
  void* take(uint64_t bytes, bool grow = true);
  void give(void* p, uint64_t bytes);
  // While less than `reserve` bytes lie free, or less than twice that and no free block holds
  // the largest slot asked for (of at most pin_piece, or over it), one chunk more that holds it,
  // made and pinned with no lock held (its pages faulted in first: pinning made memory holds the
  // driver about 42 ms/GiB, making it as it pins about 340). For a thread other than the
  // evicting one. Returns the bytes added: 0 when the room suffices, another grow_ahead() runs,
  // the limit is near or the OS refuses.
  uint64_t grow_ahead(uint64_t reserve);
  uint64_t limit() const { return o_.limit; }
  uint64_t pin_piece() const { return o_.pin_piece; }
  Stats stats() const;

  // MemAvailable from /proc/meminfo, bytes; 0 if unknown.
  static uint64_t mem_available();
  // The limit when none is given: three quarters of `available` (MemAvailable), shared among the
  // node's `local_ranks` processes (each store grows on its own; eight at three quarters each
  // would promise the host six times over).
  static uint64_t default_limit(uint64_t available, int local_ranks = 1) {
    return available / 4 * 3 / static_cast<uint64_t>(local_ranks > 1 ? local_ranks : 1);
  }

 private:
  struct Chunk {
    unsigned char* base;
    uint64_t bytes;
    bool lent;  // the source's: never unmapped here
  };
  using BySize = std::multimap<uint64_t, unsigned char*>;
  struct Free {
    uint64_t bytes;
    uint32_t chunk;  // blocks merge only within one chunk: one pinned registration
    BySize::iterator by_size;
  };
  void* take_locked(uint64_t bytes);
  uint64_t chunk_for(uint64_t bytes) const;  // the chunk made for a slot that finds no room
  uint64_t ahead_size_locked(uint64_t reserve) const;  // the chunk grow_ahead() makes; 0: none
  void note_taken(uint64_t bytes);
  void add_free(unsigned char* p, uint64_t bytes, uint32_t chunk);
  void drop_free(std::map<unsigned char*, Free>::iterator it);
  uint32_t chunk_of(const unsigned char* p) const;
  struct Made {
    unsigned char* base = nullptr;
    bool lent = false;     // the source's
    bool counted = false;  // against the limit
    int64_t pin_ns = 0;
    uint64_t pin_failures = 0;
  };
  // Mapped or lent, and pinned; `fault_first`: its pages faulted in before pinning; `may_count`:
  // memory counted against the limit may be used (else only what offloadd lends).
  Made map_chunk(uint64_t size, bool fault_first, bool may_count) const;
  void pin(Made* m, uint64_t size) const;
  void note_made(const Made& m);
  uint32_t add_chunk(const Made& m, uint64_t size);

  Driver& d_;
  Options o_;
  ChunkSource* source_;
  mutable std::mutex mu_;
  std::vector<Chunk> chunks_;
  std::map<const unsigned char*, uint32_t> chunk_at_;  // base -> index in chunks_
  std::map<unsigned char*, Free> free_;                // free blocks inside chunks, by address
  BySize free_by_size_;                                // the same blocks, by size (best fit)
  std::multimap<uint64_t, void*> free_big_;            // free chunks over pin_piece, whole, by size
  Stats st_;
  uint64_t growing_ = 0;  // bytes grow_ahead() is making outside the lock
  uint64_t largest_asked_ = 0;      // the largest slot of at most pin_piece asked for
  uint64_t largest_big_asked_ = 0;  // the largest slot over pin_piece asked for
};

// What a step spent making pinned host memory, said once to the user: when the store made (did not
// borrow) at least a GiB in the step and pinning took at least a quarter of it and half a second, a line saying so, with the offloadd pool that would have made them before the
// job (the store's bytes and a quarter more); "" otherwise. From the step's host stats and the
// ones at the step before.
std::string host_making_note(uint64_t step, int64_t step_ns, const HostStore::Stats& now, const HostStore::Stats& was);

}  // namespace offload

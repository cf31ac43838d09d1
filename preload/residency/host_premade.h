// PremadeHost: host memory for evicted bytes, faulted in before evictions need it.
//
// What holds a capped process's first step is making host memory: faulting fresh anonymous
// memory in costs about 300-470 ms/GiB on the GPU machines' hosts, pinning memory already faulted
// in about 42 (docs/results.md, "The first step waits for host memory"). Between the first
// allocation under the budget and the first eviction the process builds its model and starts
// its first step while the host's memory system is idle: a thread of its own faults memory in
// then, and the host store takes its chunks from here first, so that only pinning is left to pay.
//
// The thread goes on while steps evict, to its target (`past_first_take`; else it stops at the
// first lend(), which then waits for the piece it is faulting): a write a page takes only that
// mapping's lock, and the driver's mappings on other threads kept their speed, where populating
// in the kernel (MAP_POPULATE, MADV_POPULATE_WRITE) holds the process's mmap lock and slowed them
// 200-1,000-fold (scripts/gpu/fault_probe.cpp; docs/results.md). Either way the store is lent
// only pages already faulted, which the thread never writes again.
// What the store has not taken is given back to the system (madvise DONTNEED) once no take has
// come for `idle_ns`, or, when none came at all (the model fits the budget, or its first
// eviction is late), for `unused_ns` since the making ended. The memory is one reservation,
// never inherited by a forked child (MADV_DONTFORK).
//
// A first ChunkSource (offloadd's pool) is asked first; while `skip()` is true (that pool can
// lend), nothing is made here.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

#include "residency/host_store.h"

namespace offload {

class PremadeHost final : public ChunkSource {
 public:
  struct Options {
    uint64_t target = 0;                  // bytes to fault in at most (the reservation's size)
    uint64_t piece = 64ull << 20;         // faulted between looks at whether to stop
    int64_t idle_ns = 10'000'000'000;     // no take for this long since the last: the rest goes back
    int64_t unused_ns = 60'000'000'000;   // no take at all for this long since the making ended: all of it
    // The making goes on past the first take, to the target (the store is lent only pages already
    // faulted, which the thread never writes again); false: it stops there.
    bool past_first_take = true;
  };
  struct Stats {
    uint64_t made = 0;      // bytes faulted in here
    uint64_t taken = 0;     // bytes lent to the store
    uint64_t released = 0;  // bytes made, never taken, given back
    int64_t make_ns = 0;    // the thread's time faulting
    bool making = false;    // the thread is still at it
  };

  // Reserves `o.target` bytes (nothing when 0 or the reservation fails); start() begins the making.
  explicit PremadeHost(Options o, ChunkSource* first = nullptr, std::function<bool()> skip = {});
  ~PremadeHost() override;
  PremadeHost(const PremadeHost&) = delete;
  PremadeHost& operator=(const PremadeHost&) = delete;

  void start();
  // Faults up to `max_bytes` more in, on the caller's thread (the thread's step; tests); returns
  // the bytes faulted. 0 once stopped, at the target, or while skip() holds.
  uint64_t make_more(uint64_t max_bytes);
  // From the first source, else (with `may_count`) carved from what was faulted in here, counted
  // (without past_first_take, the first call here stops the making); none when what is left of it
  // is smaller.
  Lent lend(uint64_t bytes, bool may_count) override;
  // Gives back what was made and not taken, once the making has ended and no take has come for
  // idle_ns (unused_ns when none came yet); at most once. Returns the bytes given back. For the
  // shim's worker.
  uint64_t trim_idle(int64_t now_ns);
  // Stops the making and joins the thread (the exit paths; without past_first_take, lend() stops
  // it too).
  void stop();
  Stats stats() const;
  uint64_t reserved() const { return bytes_; }

 private:
  void run();
  void end_making();  // holds no lock; returns once the thread faults nothing more

  Options o_;
  ChunkSource* first_;
  std::function<bool()> skip_;
  unsigned char* base_ = nullptr;
  uint64_t bytes_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> frontier_{0};  // bytes from base_ faulted in
  std::atomic<bool> making_{false};    // run() is between pieces or in one
  std::atomic<int64_t> make_ns_{0};
  mutable std::mutex mu_;
  std::condition_variable made_cv_;  // run() ended
  uint64_t next_ = 0;                // bytes from base_ carved for the store
  uint64_t taken_ = 0, released_ = 0;
  int64_t last_ns_ = 0;              // the last take, or the end of the making
  bool trimmed_ = false;
  std::mutex thread_mu_;  // start() and stop() against each other
  std::thread thread_;
};

// How much to make ahead: `asked` bytes (OFFLOAD_HOST_PREMAKE), or for `auto` (asked == UINT64_MAX)
// as much as the budget and a quarter of the host's available memory shared among the node's
// `local_ranks` processes (each makes its own, at once); never past the store's `limit`.
uint64_t premake_target(uint64_t asked, uint64_t budget, uint64_t available, uint64_t limit, int local_ranks);

}  // namespace offload

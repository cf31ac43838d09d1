// EventLog: the lock-free multi-producer, single-consumer ring between the hooks and the
// shim's worker thread.
//
// Hooks append one Event per allocation, free and launch (plus the allocation ids a launch
// touches) without allocation: a slot and its access room are claimed together under a
// spinlock a few instructions long, and published by storing the sequence number last. The
// worker drains in order. If the worker falls behind by a whole ring, appends are dropped
// and counted (never block a launch).
#pragma once

#include <sys/mman.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <stdexcept>

#include "core/alloc_table.h"
#include "core/driver.h"
#include "planner/types.h"  // EventKind, is_launch

namespace offload {

enum EventFlags : uint8_t {
  kAccessesTruncated = 1,  // more allocations touched than recorded
  kLayoutUnknown = 2,      // kernel parameters could not be scanned
};

// A launch we cannot see into (a graph replay, a kernel whose parameters could not all be
// scanned): it may touch every allocation.
inline bool blind_launch(EventKind kind, uint8_t flags) {
  return kind == EventKind::Graph || (flags & (kLayoutUnknown | kAccessesTruncated));
}

struct Event {
  uint64_t seq = 0;        // global order of appends; launches: the CUPTI external id
  EventKind kind{};
  uint8_t flags = 0;
  uint32_t func = 0;       // kernels: FuncRegistry id
  Stream stream = 0;
  uint64_t a = 0;          // alloc/free: AllocId; copy/memset: bytes
  uint64_t b = 0;          // alloc: bytes; free: bytes
  DevPtr ptr = 0;          // alloc/free: base address; copy/memset: destination
  uint64_t live_bytes = 0; // tracked bytes live when the event happened
  uint64_t access_begin = 0;
  uint32_t access_count = 0;
  uint32_t access_room = 0;  // reserved in the access ring (>= access_count)
  uint64_t host_ns = 0;      // kernels, with a lead clock set: when the hook forwarded it (0: not taken)
};

class EventLog {
 public:
  // Both rings are mapped and faulted in up front: a page fault on the launch path costs
  // more than the rest of the hook (measured: most of a 0.8 us hook on a fresh ring).
  explicit EventLog(size_t capacity_pow2 = 1 << 16, size_t access_capacity_pow2 = 1 << 20)
      : cap_(capacity_pow2), acap_(access_capacity_pow2) {
    if (cap_ == 0 || (cap_ & (cap_ - 1)) || acap_ == 0 || (acap_ & (acap_ - 1))) throw std::invalid_argument("EventLog capacities must be powers of two");
    slots_ = static_cast<Slot*>(map(sizeof(Slot) * cap_));
    accesses_ = static_cast<AllocId*>(map(sizeof(AllocId) * acap_));
  }
  ~EventLog() {
    munmap(slots_, sizeof(Slot) * cap_);
    munmap(accesses_, sizeof(AllocId) * acap_);
  }
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  // A claimed slot: its sequence number (0: the ring is full and the event is dropped) and
  // the room reserved for its accesses.
  struct Claim {
    uint64_t seq = 0;
    uint64_t access_begin = 0;
    uint32_t access_room = 0;
  };

  // Claims the next sequence number and room for `n` accesses, together, so that events
  // and their accesses are in the same order in both rings (the consumer frees access room
  // in event order). If the access ring lacks room the event still goes in, flagged
  // truncated, with none. The lock is a few instructions long and nothing is called under it.
  Claim claim(uint32_t n) {
    Claim c;
    while (lock_.test_and_set(std::memory_order_acquire)) {
    }
    uint64_t head = head_.load(std::memory_order_relaxed);
    if (head - tail_.load(std::memory_order_acquire) >= cap_) {
      lock_.clear(std::memory_order_release);
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return c;
    }
    c.seq = head + 1;
    head_.store(head + 1, std::memory_order_relaxed);
    uint64_t ahead = ahead_.load(std::memory_order_relaxed);
    if (n && ahead + n - atail_.load(std::memory_order_acquire) <= acap_) {
      c.access_begin = ahead;
      c.access_room = n;
      ahead_.store(ahead + n, std::memory_order_relaxed);
    } else {
      c.access_begin = ahead;
    }
    lock_.clear(std::memory_order_release);
    return c;
  }

  // Publishes `e` in a claimed slot, with its accesses copied into the claimed room.
  void publish(const Claim& c, Event e, const AllocId* acc, uint32_t n) {
    if (n > c.access_room) {
      e.flags |= kAccessesTruncated;
      n = 0;
    }
    for (uint32_t i = 0; i < n; ++i) accesses_[(c.access_begin + i) & (acap_ - 1)] = acc[i];
    e.access_begin = c.access_begin;
    e.access_count = n;
    e.access_room = c.access_room;
    e.seq = c.seq;
    Slot& s = slots_[(c.seq - 1) & (cap_ - 1)];
    s.event = e;
    s.ready.store(c.seq, std::memory_order_release);
  }

  // Consumer: calls f(const Event&, const AllocId* accesses) for each published event in
  // order, stopping at the first unpublished one. Returns how many were consumed.
  template <class F>
  size_t drain(F&& f) {
    size_t n = 0;
    uint64_t t = tail_.load(std::memory_order_relaxed);
    AllocId tmp[kMaxInline];
    for (;;) {
      Slot& s = slots_[t & (cap_ - 1)];
      if (s.ready.load(std::memory_order_acquire) != t + 1) break;
      Event e = s.event;
      uint32_t m = e.access_count < kMaxInline ? e.access_count : kMaxInline;
      for (uint32_t i = 0; i < m; ++i) tmp[i] = accesses_[(e.access_begin + i) & (acap_ - 1)];
      if (m < e.access_count) e.flags |= kAccessesTruncated;
      e.access_count = m;
      // Rooms were handed out in event order: everything before this one's end is read.
      atail_.store(e.access_begin + e.access_room, std::memory_order_release);
      ++t;
      tail_.store(t, std::memory_order_release);
      f(e, tmp);
      ++n;
    }
    return n;
  }

  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  uint64_t appended() const { return head_.load(std::memory_order_relaxed); }

  static constexpr uint32_t kMaxInline = 4096;

 private:
  struct Slot {
    std::atomic<uint64_t> ready{0};
    Event event;
  };
  static void* map(size_t bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return p;
  }

  size_t cap_, acap_;
  Slot* slots_;
  AllocId* accesses_;
  alignas(64) std::atomic_flag lock_ = ATOMIC_FLAG_INIT;
  alignas(64) std::atomic<uint64_t> head_{0};
  alignas(64) std::atomic<uint64_t> tail_{0};
  alignas(64) std::atomic<uint64_t> ahead_{0};
  alignas(64) std::atomic<uint64_t> atail_{0};
  std::atomic<uint64_t> dropped_{0};
};

}  // namespace offload

// EventLog: the lock-free multi-producer, single-consumer ring between the hooks and the
// shim's worker thread.
//
// Hooks append one Event per allocation, free and launch (plus the allocation ids a launch
// touches) without locks or allocation: a slot is claimed with one fetch_add and published
// by storing its sequence number last. The worker drains in order. If the worker falls
// behind by a whole ring, appends are dropped and counted (never block a launch).
#pragma once

#include <sys/mman.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

#include "core/alloc_table.h"
#include "core/driver.h"

namespace offload {

enum class EventKind : uint8_t { Kernel, Copy, Memset, Graph, Alloc, Free, Mark };

inline bool is_launch(EventKind k) { return k <= EventKind::Graph; }

enum EventFlags : uint8_t {
  kAccessesTruncated = 1,  // more allocations touched than recorded
  kLayoutUnknown = 2,      // kernel parameters could not be scanned
};

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
};

class EventLog {
 public:
  // Both rings are mapped and faulted in up front: a page fault on the launch path costs
  // more than the rest of the hook (measured: most of a 0.8 us hook on a fresh ring).
  explicit EventLog(size_t capacity_pow2 = 1 << 16, size_t access_capacity_pow2 = 1 << 20)
      : cap_(capacity_pow2), acap_(access_capacity_pow2) {
    slots_ = static_cast<Slot*>(map(sizeof(Slot) * cap_));
    accesses_ = static_cast<AllocId*>(map(sizeof(AllocId) * acap_));
  }
  ~EventLog() {
    munmap(slots_, sizeof(Slot) * cap_);
    munmap(accesses_, sizeof(AllocId) * acap_);
  }
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  // Claims the next sequence number; 0 if the ring is full (the event is dropped).
  uint64_t claim() {
    uint64_t head = head_.load(std::memory_order_relaxed);
    if (head - tail_.load(std::memory_order_acquire) >= cap_ - kSlack) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return 0;
    }
    return head_.fetch_add(1, std::memory_order_relaxed) + 1;
  }

  // Publishes `e` under sequence `seq` (from claim()), with its accesses copied in.
  void publish(uint64_t seq, Event e, const AllocId* acc, uint32_t n) {
    if (n) {
      uint64_t begin = ahead_.fetch_add(n, std::memory_order_relaxed);
      if (begin + n - atail_.load(std::memory_order_acquire) > acap_) {
        e.flags |= kAccessesTruncated;
        n = 0;
      } else {
        for (uint32_t i = 0; i < n; ++i) accesses_[(begin + i) & (acap_ - 1)] = acc[i];
      }
      e.access_begin = begin;
    }
    e.access_count = n;
    e.seq = seq;
    Slot& s = slots_[(seq - 1) & (cap_ - 1)];
    s.event = e;
    s.ready.store(seq, std::memory_order_release);
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
      if (e.access_count) atail_.store(e.access_begin + e.access_count, std::memory_order_release);
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
  static constexpr size_t kSlack = 256;  // room for producers racing past the full check
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
  alignas(64) std::atomic<uint64_t> head_{0};
  alignas(64) std::atomic<uint64_t> tail_{0};
  alignas(64) std::atomic<uint64_t> ahead_{0};
  alignas(64) std::atomic<uint64_t> atail_{0};
  std::atomic<uint64_t> dropped_{0};
};

}  // namespace offload

// SimDriver's model of the executor's half of the Driver seam: host-page virtual memory
// that faults where a GPU would read unmapped memory, and a GPU that runs stream work later
// (copies last, under copy delay), so that a missing reload or stream wait fails a test.
#include "core/sim_driver.h"
#include "core/range_hash.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace offload {
namespace {

constexpr uint64_t kG = 64 << 10;  // the default granularity

unsigned char* at(DevPtr p) { return reinterpret_cast<unsigned char*>(p); }

bool all_bytes(const unsigned char* p, uint64_t n, unsigned char v) {
  for (uint64_t i = 0; i < n; ++i)
    if (p[i] != v) return false;
  return true;
}

// A reserved range backed by a fresh (garbage-filled) handle.
struct Arena {
  SimDriver& d;
  DevPtr va;
  uint64_t h;
  explicit Arena(SimDriver& drv, uint64_t bytes) : d(drv), va(drv.reserve(bytes)), h(drv.create_physical(bytes)) {
    EXPECT_TRUE(d.map(va, bytes, h));
  }
};

// ---- Virtual memory ------------------------------------------------------------------------

TEST(SimVmm, DefaultsAndAlignedReservations) {
  SimDriver d;
  EXPECT_EQ(d.vmm_granularity(), kG);
  EXPECT_EQ(d.device_total_bytes(), 16ull << 30);
  d.set_device_total_bytes(80ull << 30);
  EXPECT_EQ(d.device_total_bytes(), 80ull << 30);

  d.set_granularity(2 << 20);
  for (int i = 0; i < 4; ++i) {
    DevPtr va = d.reserve(6 << 20);
    ASSERT_NE(va, 0u);
    EXPECT_EQ(va % (2 << 20), 0u) << "reservations start on a granule";
    d.unreserve(va, 6 << 20);
  }
  EXPECT_EQ(d.reserve((2 << 20) + 4096), 0u) << "not a multiple of the granularity";
  EXPECT_EQ(d.vmm_stats().misuses, 1u);

  d.set_granularity(0);  // a driver that cannot tell
  EXPECT_EQ(d.vmm_granularity(), 0u);
  EXPECT_EQ(d.reserve(kG), 0u);
}

TEST(SimVmm, FreshPhysicalMemoryReadsGarbage) {
  SimDriver d;
  DevPtr va = d.reserve(2 * kG);
  uint64_t h = d.create_physical(2 * kG);
  ASSERT_NE(va, 0u);
  ASSERT_NE(h, 0u);
  ASSERT_TRUE(d.map(va, 2 * kG, h));
  EXPECT_TRUE(all_bytes(at(va), 2 * kG, SimDriver::kGarbage));
  EXPECT_TRUE(d.is_mapped(va));
  EXPECT_TRUE(d.is_mapped(va + 2 * kG - 1));
  EXPECT_FALSE(d.is_mapped(va + 2 * kG));
  ASSERT_TRUE(d.unmap(va, 2 * kG));
  EXPECT_FALSE(d.is_mapped(va));
  d.release_physical(h);
  d.unreserve(va, 2 * kG);
  EXPECT_EQ(d.vmm_stats().misuses, 0u);
}

TEST(SimVmm, OneHandleAtTwoAddressesSharesItsBytes) {
  SimDriver d;
  DevPtr a = d.reserve(kG), b = d.reserve(4 * kG);
  uint64_t h = d.create_physical(kG);
  ASSERT_TRUE(d.map(a, kG, h));
  std::memset(at(a), 0x3c, kG);
  ASSERT_TRUE(d.unmap(a, kG));

  // Evicted and re-backed elsewhere: the physical memory kept its bytes.
  ASSERT_TRUE(d.map(b + 2 * kG, kG, h));
  EXPECT_TRUE(all_bytes(at(b + 2 * kG), kG, 0x3c));

  // Both at once: a write through one address is seen through the other.
  ASSERT_TRUE(d.map(a, kG, h));
  at(a)[123] = 0x77;
  EXPECT_EQ(at(b + 2 * kG)[123], 0x77);

  auto st = d.vmm_stats();
  EXPECT_EQ(st.maps, 3u);
  EXPECT_EQ(st.unmaps, 1u);
  EXPECT_EQ(st.mapped_bytes, 2 * kG);
  EXPECT_EQ(st.mapped_peak, 2 * kG);
  EXPECT_EQ(st.physical_bytes, kG) << "two mappings, one physical allocation";
  EXPECT_EQ(st.misuses, 0u);

  ASSERT_TRUE(d.unmap(a, kG));
  ASSERT_TRUE(d.unmap(b + 2 * kG, kG));
  d.release_physical(h);
  st = d.vmm_stats();
  EXPECT_EQ(st.mapped_bytes, 0u);
  EXPECT_EQ(st.physical_bytes, 0u);
  EXPECT_EQ(st.creates, 1u);
  EXPECT_EQ(st.releases, 1u);
  EXPECT_EQ(st.misuses, 0u);
}

// The H200's driver maps a handle whole or not at all: cuMemMap of part of one answers
// CUDA_ERROR_NOT_SUPPORTED (scripts/gpu/vmm_probe.cpp). So does the simulated driver, so
// that code which would rely on it fails here first.
TEST(SimVmm, AHandleIsMappedWholeOrNotAtAll) {
  SimDriver d;
  DevPtr va = d.reserve(3 * kG);
  uint64_t big = d.create_physical(3 * kG);
  EXPECT_FALSE(d.map(va, kG, big)) << "the start of a larger handle";
  EXPECT_EQ(d.vmm_stats().misuses, 1u);
  ASSERT_TRUE(d.map(va, 3 * kG, big));
  EXPECT_TRUE(d.unmap(va, 3 * kG));
  d.release_physical(big);
  d.unreserve(va, 3 * kG);
  EXPECT_EQ(d.vmm_stats().misuses, 1u);
}

TEST(SimVmm, MisusesFailAndAreCounted) {
  SimDriver d;
  DevPtr va = d.reserve(4 * kG);
  uint64_t h = d.create_physical(2 * kG);
  uint64_t misuses = 0;
  auto expect_misuse = [&](const char* what) {
    EXPECT_EQ(d.vmm_stats().misuses, ++misuses) << what;
  };

  EXPECT_FALSE(d.map(va + 4 * kG, kG, h));  // just past the reservation
  expect_misuse("map outside a reservation");
  EXPECT_FALSE(d.map(va + 3 * kG, 2 * kG, h));
  expect_misuse("map straddling the end of a reservation");
  EXPECT_FALSE(d.map(va, 3 * kG, h));
  expect_misuse("map larger than the handle");
  EXPECT_FALSE(d.map(va + 4096, kG, h));
  expect_misuse("map at an address off the granularity");
  EXPECT_FALSE(d.map(va, kG + 4096, h));
  expect_misuse("map of a size off the granularity");
  EXPECT_FALSE(d.map(va, kG, 999));
  expect_misuse("map of an unknown handle");
  EXPECT_EQ(d.create_physical(kG + 4096), 0u);
  expect_misuse("physical size off the granularity");

  ASSERT_TRUE(d.map(va + kG, 2 * kG, h));
  EXPECT_FALSE(d.map(va + kG, kG, h));
  expect_misuse("map over a mapping");
  EXPECT_FALSE(d.map(va, 2 * kG, h));
  expect_misuse("map overlapping the start of a mapping");
  EXPECT_FALSE(d.map(va + 2 * kG, 2 * kG, h));
  expect_misuse("map overlapping the end of a mapping");
  uint64_t one = d.create_physical(kG);
  EXPECT_TRUE(d.map(va + 3 * kG, kG, one)) << "the granule right after a mapping is free";

  EXPECT_FALSE(d.unmap(va + kG, kG));
  expect_misuse("unmap of part of a mapping");
  EXPECT_FALSE(d.unmap(va, kG));
  expect_misuse("unmap of what is not mapped");

  std::memset(at(va + kG), 0x42, 2 * kG);
  d.release_physical(h);
  expect_misuse("release of a handle still mapped");
  EXPECT_TRUE(all_bytes(at(va + kG), 2 * kG, 0x42)) << "the mapping keeps working";
  EXPECT_EQ(d.vmm_stats().physical_bytes, kG) << "`one` alone";
  d.release_physical(h);
  expect_misuse("release of an unknown handle");
  EXPECT_TRUE(d.unmap(va + kG, 2 * kG));
  EXPECT_EQ(d.vmm_stats().misuses, misuses);

  d.unreserve(va, 4 * kG);
  expect_misuse("unreserve of a range with a mapping left in it");
  EXPECT_EQ(d.vmm_stats().mapped_bytes, 0u);
  d.unreserve(va, 4 * kG);
  expect_misuse("unreserve of what is not reserved");
  d.release_physical(one);
  EXPECT_EQ(d.vmm_stats().misuses, misuses);
  EXPECT_EQ(d.vmm_stats().physical_bytes, 0u);
}

TEST(SimVmm, PhysicalLimitRefusesAndPeaksReset) {
  SimDriver d;
  d.set_physical_limit(3 * kG);
  uint64_t a = d.create_physical(2 * kG);
  ASSERT_NE(a, 0u);
  EXPECT_EQ(d.create_physical(2 * kG), 0u) << "would exceed the limit: the device is full";
  uint64_t b = d.create_physical(kG);
  ASSERT_NE(b, 0u) << "what fits still succeeds";
  EXPECT_NE(a, b);
  EXPECT_EQ(d.vmm_stats().physical_bytes, 3 * kG);
  EXPECT_EQ(d.vmm_stats().misuses, 0u) << "a full device is not a misuse";

  d.release_physical(a);
  EXPECT_EQ(d.vmm_stats().physical_bytes, kG);
  EXPECT_EQ(d.vmm_stats().physical_peak, 3 * kG);
  d.reset_peaks();
  EXPECT_EQ(d.vmm_stats().physical_peak, kG);
  uint64_t c = d.create_physical(2 * kG);
  EXPECT_NE(c, 0u) << "released bytes are free again";
  EXPECT_EQ(d.vmm_stats().physical_peak, 3 * kG);
  d.release_physical(b);
  d.release_physical(c);
}

TEST(SimVmm, PlainAllocationsStillWork) {
  SimDriver d;
  DevPtr p = d.alloc(1000);
  std::memset(at(p), 1, 1000);
  EXPECT_FALSE(d.is_mapped(p)) << "alloc() is outside the VMM model";
  d.free(p);
}

// ---- Death: the faults a missed reload must cause ----------------------------------------

// "threadsafe": each death test re-executes the binary rather than forking a process
// with threads in it. They pass under ASan and TSan too (each sanitizer reports the SIGSEGV
// and the process still dies), so they are not skipped there.
class SimDeath : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(SimDeath, KernelTouchingAnEvictedRangeFaults) {
  SimDriver d;
  DevPtr va = d.reserve(kG);
  uint64_t h = d.create_physical(kG);
  ASSERT_TRUE(d.map(va, kG, h));
  d.launch(0, [va] { at(va)[0] = 1; });
  d.run_all();  // mapped: fine
  ASSERT_TRUE(d.unmap(va, kG));
  d.launch(kPerThreadStream, [va] { at(va)[kG / 2] = 1; });
  EXPECT_DEATH(d.run_all(), "");
}

TEST_F(SimDeath, ReadingANeverMappedReservationFaults) {
  SimDriver d;
  DevPtr va = d.reserve(kG);
  volatile unsigned char sink = 0;
  d.launch(d.create_stream(), [va, &sink] { sink = at(va)[0]; });
  EXPECT_DEATH(d.run_all(), "");
}

TEST_F(SimDeath, CopyFromAnEvictedRangeFaults) {
  SimDriver d;
  DevPtr va = d.reserve(kG);
  std::vector<unsigned char> host(kG);
  ASSERT_TRUE(d.copy_to_host(host.data(), va, kG, 0));
  EXPECT_DEATH(d.run_all(), "");
}

// Copies without their bytes (set_copy_bytes(false)) still fault on a granule that is not
// mapped, in either direction, wherever in the range it is; with every granule mapped they run.
TEST_F(SimDeath, CopiesWithoutBytesStillFaultOnAnUnmappedGranule) {
  for (const bool to_device : {false, true}) {
    SimDriver d;
    d.set_copy_bytes(false);
    const DevPtr va = d.reserve(3 * kG);
    const uint64_t h0 = d.create_physical(kG), h1 = d.create_physical(kG), h2 = d.create_physical(kG);
    ASSERT_TRUE(d.map(va, kG, h0));
    ASSERT_TRUE(d.map(va + kG, kG, h1));
    ASSERT_TRUE(d.map(va + 2 * kG, kG, h2));
    std::vector<unsigned char> host(3 * kG);
    // From the middle of the first granule into the middle of the third.
    auto copy = [&] {
      return to_device ? d.copy_to_device(va + kG / 2, host.data(), 2 * kG, 0)
                       : d.copy_to_host(host.data(), va + kG / 2, 2 * kG, 0);
    };
    ASSERT_TRUE(copy());
    d.run_all();  // all mapped: fine
    EXPECT_EQ(d.vmm_stats().misuses, 0u);
    ASSERT_TRUE(d.unmap(va + kG, kG));  // the middle one goes
    ASSERT_TRUE(copy());
    EXPECT_DEATH(d.run_all(), "") << (to_device ? "to the device" : "to the host");
  }
}

TEST_F(SimDeath, WaitingOnWorkQueuedBehindTheWaiterIsADeadlock) {
  SimDriver d;
  Stream s = d.create_stream();
  uint64_t e = d.create_event();
  d.launch(s, [&d, e] { d.event_sync(e); });  // waits for a capture queued after itself
  ASSERT_TRUE(d.record_event(e, s));
  EXPECT_DEATH(d.run_all(), "deadlock in event_sync");
}

// ---- Streams and events --------------------------------------------------------------------

TEST(SimStreams, WorkRunsLaterAndInOrderPerStream) {
  SimDriver d;
  Stream a = d.create_stream(), b = d.create_stream();
  EXPECT_NE(a, 0u);
  EXPECT_NE(a, b);
  EXPECT_NE(a, kPerThreadStream);
  std::mt19937_64 rng(7);
  for (int round = 0; round < 20; ++round) {
    std::vector<int> seen_a, seen_b, seen_0, seen_2;
    for (int i = 0; i < 10; ++i) {
      d.launch(a, [&, i] { seen_a.push_back(i); });
      d.launch(b, [&, i] { seen_b.push_back(i); });
      d.launch(0, [&, i] { seen_0.push_back(i); });
      d.launch(kPerThreadStream, [&, i] { seen_2.push_back(i); });
    }
    EXPECT_TRUE(seen_a.empty()) << "nothing runs at enqueue time";
    EXPECT_EQ(d.pending_ops(), 40u);
    int steps = 0;
    while (d.step(rng)) ++steps;
    EXPECT_EQ(steps, 40);
    EXPECT_EQ(d.pending_ops(), 0u);
    std::vector<int> want{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    EXPECT_EQ(seen_a, want);
    EXPECT_EQ(seen_b, want);
    EXPECT_EQ(seen_0, want);
    EXPECT_EQ(seen_2, want);
  }
  EXPECT_FALSE(d.step(rng)) << "nothing left";
}

TEST(SimStreams, StepInterleavesStreams) {
  // Streams are independent: across seeds both orders of two single-op streams occur.
  bool a_first = false, b_first = false;
  for (uint64_t seed = 0; seed < 64; ++seed) {
    SimDriver d;
    std::vector<char> order;
    d.launch(0, [&] { order.push_back('a'); });
    d.launch(kPerThreadStream, [&] { order.push_back('b'); });
    std::mt19937_64 rng(seed);
    while (d.step(rng)) {
    }
    ASSERT_EQ(order.size(), 2u);
    (order[0] == 'a' ? a_first : b_first) = true;
  }
  EXPECT_TRUE(a_first);
  EXPECT_TRUE(b_first);
}

TEST(SimEvents, QueryReflectsTheLastCapture) {
  SimDriver d;
  Stream s = d.create_stream();
  uint64_t e = d.create_event();
  ASSERT_NE(e, 0u);
  EXPECT_EQ(d.event_query(e), 1) << "never recorded counts as complete";
  EXPECT_EQ(d.event_query(e + 1000), -1) << "unknown event";
  EXPECT_FALSE(d.record_event(e + 1000, s));
  EXPECT_FALSE(d.stream_wait(s, e + 1000));
  EXPECT_FALSE(d.event_sync(e + 1000));

  bool ran = false;
  d.launch(s, [&] { ran = true; });
  ASSERT_TRUE(d.record_event(e, s));
  EXPECT_EQ(d.event_query(e), 0) << "recorded, not executed";
  std::mt19937_64 rng(1);
  ASSERT_TRUE(d.step(rng));  // the kernel
  EXPECT_TRUE(ran);
  EXPECT_EQ(d.event_query(e), 0) << "the record itself has not run yet";
  ASSERT_TRUE(d.step(rng));  // the record
  EXPECT_EQ(d.event_query(e), 1);

  d.destroy_event(e);
  EXPECT_EQ(d.event_query(e), -1);
  EXPECT_EQ(d.live_events(), 0u);
}

TEST(SimEvents, SyncRunsJustUntilTheCaptureCompletes) {
  SimDriver d;
  Stream s = d.create_stream(), other = d.create_stream();
  uint64_t e = d.create_event();
  std::vector<int> ran;
  d.launch(s, [&] { ran.push_back(1); });
  d.record_event(e, s);
  d.launch(s, [&] { ran.push_back(2); });
  EXPECT_TRUE(d.event_sync(e));
  EXPECT_EQ(d.event_query(e), 1);
  EXPECT_EQ(ran, std::vector<int>{1}) << "work after the capture is still queued";
  EXPECT_EQ(d.pending_ops(), 1u);

  // A capture behind a wait on another stream's capture: sync runs both streams.
  uint64_t f = d.create_event();
  d.launch(other, [&] { ran.push_back(3); });
  d.record_event(f, other);
  d.stream_wait(s, f);
  d.record_event(e, s);
  EXPECT_EQ(d.event_query(e), 0);
  EXPECT_TRUE(d.event_sync(e));
  EXPECT_EQ(d.event_query(f), 1);
  EXPECT_EQ(d.event_query(e), 1);
  std::sort(ran.begin(), ran.end());
  EXPECT_EQ(ran, (std::vector<int>{1, 2, 3}));
  EXPECT_TRUE(d.event_sync(d.create_event())) << "nothing captured: returns at once";
}

TEST(SimEvents, WaitConcernsTheCaptureCurrentWhenItWasIssued) {
  SimDriver d;
  d.set_copy_delay(true);  // c's copy, and the capture 2 behind it, run last
  Stream a = d.create_stream(), b = d.create_stream(), c = d.create_stream();
  uint64_t e = d.create_event();

  EXPECT_TRUE(d.stream_wait(b, e));
  EXPECT_EQ(d.pending_ops(), 0u) << "a wait on a never-recorded event is a no-op";

  Arena ar(d, kG);
  std::vector<unsigned char> host(kG, 1);
  bool b_ran = false;
  d.record_event(e, a);  // capture 1
  d.stream_wait(b, e);   // waits for capture 1 only
  d.launch(b, [&] { b_ran = true; });
  d.copy_to_device(ar.va, host.data(), kG, c);
  d.record_event(e, c);  // capture 2, behind the copy

  std::mt19937_64 rng(3);
  ASSERT_TRUE(d.step(rng));
  ASSERT_TRUE(d.step(rng));
  ASSERT_TRUE(d.step(rng));
  EXPECT_TRUE(b_ran) << "capture 1 done: b's wait is over although capture 2 is not";
  EXPECT_EQ(d.event_query(e), 0) << "the query concerns capture 2";
  d.run_all();
  EXPECT_EQ(d.event_query(e), 1);
}

TEST(SimEvents, DestroyedEventsQueuedWorkStillRuns) {
  SimDriver d;
  Stream a = d.create_stream(), b = d.create_stream();
  uint64_t e = d.create_event();
  bool first = false, second_saw_first = false;
  d.launch(a, [&] { first = true; });
  d.record_event(e, a);
  d.stream_wait(b, e);
  d.launch(b, [&] { second_saw_first = first; });
  d.destroy_event(e);
  d.set_copy_delay(true);
  std::mt19937_64 rng(11);
  while (d.step(rng)) {
  }
  EXPECT_EQ(d.pending_ops(), 0u);
  EXPECT_TRUE(second_saw_first) << "the wait still orders b after a";
}

// ---- Copies: executed late, so missing waits read wrong bytes -------------------------------

TEST(SimCopies, ReadAndWriteAtExecutionTime) {
  SimDriver d;
  Arena ar(d, kG);
  std::vector<unsigned char> src(kG, 0x11), back(kG, 0);
  ASSERT_TRUE(d.copy_to_device(ar.va, src.data(), kG, 0));
  std::fill(src.begin(), src.end(), 0x22);  // before the copy runs
  EXPECT_TRUE(all_bytes(at(ar.va), kG, SimDriver::kGarbage)) << "nothing copied yet";
  ASSERT_TRUE(d.copy_to_host(back.data(), ar.va, kG, 0));
  EXPECT_TRUE(all_bytes(back.data(), kG, 0)) << "nothing copied back yet";
  d.run_all();
  EXPECT_TRUE(all_bytes(at(ar.va), kG, 0x22));
  EXPECT_TRUE(all_bytes(back.data(), kG, 0x22)) << "same stream: the D2H ran after the H2D";
  EXPECT_FALSE(d.copy_to_device(0, src.data(), kG, 0));
  EXPECT_FALSE(d.copy_to_host(nullptr, ar.va, kG, 0));
}

// A reload on the prefetch stream and a kernel on the compute stream reading it.
std::vector<unsigned char> reload_then_read(bool wait, bool random_steps, uint64_t seed) {
  SimDriver d;
  d.set_copy_delay(true);
  Stream prefetch = d.create_stream(), compute = d.create_stream();
  Arena ar(d, kG);
  std::vector<unsigned char> host(kG, 0x11), seen(kG, 0);
  d.copy_to_device(ar.va, host.data(), kG, prefetch);
  if (wait) {
    uint64_t e = d.create_event();
    d.record_event(e, prefetch);
    d.stream_wait(compute, e);
  }
  d.launch(compute, [&] { std::memcpy(seen.data(), at(ar.va), kG); });
  if (random_steps) {
    std::mt19937_64 rng(seed);
    while (d.step(rng)) {
    }
    EXPECT_EQ(d.pending_ops(), 0u);
  } else {
    d.run_all();
  }
  return seen;
}

TEST(SimCopies, MissingStreamWaitReadsGarbageUnderCopyDelay) {
  auto seen = reload_then_read(/*wait=*/false, /*random_steps=*/false, 0);
  EXPECT_TRUE(all_bytes(seen.data(), kG, SimDriver::kGarbage));
  for (uint64_t seed = 0; seed < 16; ++seed) {
    seen = reload_then_read(false, true, seed);
    EXPECT_TRUE(all_bytes(seen.data(), kG, SimDriver::kGarbage)) << "seed " << seed;
  }
}

TEST(SimCopies, StreamWaitOrdersTheKernelAfterTheReload) {
  auto seen = reload_then_read(/*wait=*/true, /*random_steps=*/false, 0);
  EXPECT_TRUE(all_bytes(seen.data(), kG, 0x11));
  for (uint64_t seed = 0; seed < 16; ++seed) {
    seen = reload_then_read(true, true, seed);
    EXPECT_TRUE(all_bytes(seen.data(), kG, 0x11)) << "seed " << seed;
  }
}

TEST(SimCopies, CopyDelayRunsCopiesOnlyWhenNothingElseCan) {
  SimDriver d;
  d.set_copy_delay(true);
  Arena ar(d, kG);
  std::vector<unsigned char> host(kG, 0x11);
  std::vector<int> order;
  d.copy_to_device(ar.va, host.data(), kG, 0);
  d.launch(0, [&] { order.push_back(1); });  // behind the copy: must wait for it
  d.launch(kPerThreadStream, [&] { order.push_back(2); });
  d.launch(kPerThreadStream, [&] { order.push_back(3); });
  std::mt19937_64 rng(5);
  ASSERT_TRUE(d.step(rng));
  ASSERT_TRUE(d.step(rng));
  EXPECT_EQ(order, (std::vector<int>{2, 3})) << "the other stream's kernels go first";
  EXPECT_TRUE(all_bytes(at(ar.va), kG, SimDriver::kGarbage));
  ASSERT_TRUE(d.step(rng));  // only the copy is runnable now
  EXPECT_TRUE(all_bytes(at(ar.va), kG, 0x11));
  ASSERT_TRUE(d.step(rng));
  EXPECT_EQ(order, (std::vector<int>{2, 3, 1}));
}

// An offload round trip through the driver, as the executor does it: D2H after the
// producer, unmap, map a fresh handle, H2D, and the consumer behind an event.
TEST(SimCopies, EvictAndReloadRoundTripKeepsTheBytes) {
  for (uint64_t seed = 0; seed < 8; ++seed) {
    SimDriver d;
    d.set_copy_delay(true);
    Stream compute = d.create_stream(), offload = d.create_stream(), prefetch = d.create_stream();
    Arena ar(d, 2 * kG);
    std::vector<unsigned char> staging(2 * kG, 0), seen(2 * kG, 0);
    uint64_t produced = d.create_event(), saved = d.create_event(), loaded = d.create_event();

    d.launch(compute, [&] { std::memset(at(ar.va), 0x5a, 2 * kG); });
    d.record_event(produced, compute);
    d.stream_wait(offload, produced);
    d.copy_to_host(staging.data(), ar.va, 2 * kG, offload);
    d.record_event(saved, offload);
    ASSERT_TRUE(d.event_sync(saved));
    ASSERT_TRUE(d.unmap(ar.va, 2 * kG));
    d.release_physical(ar.h);
    EXPECT_EQ(d.vmm_stats().physical_bytes, 0u);

    uint64_t h2 = d.create_physical(2 * kG);
    ASSERT_TRUE(d.map(ar.va, 2 * kG, h2));
    d.copy_to_device(ar.va, staging.data(), 2 * kG, prefetch);
    d.record_event(loaded, prefetch);
    d.stream_wait(compute, loaded);
    d.launch(compute, [&] { std::memcpy(seen.data(), at(ar.va), 2 * kG); });
    std::mt19937_64 rng(seed);
    while (d.step(rng)) {
    }
    EXPECT_TRUE(all_bytes(seen.data(), 2 * kG, 0x5a)) << "seed " << seed;
    EXPECT_EQ(d.vmm_stats().misuses, 0u);
  }
}

// Unmapping memory that a queued copy still reads (or one still running) is a misuse, whatever
// bytes the copy then finds: the GPU would fault. Once the copy has run, the unmapping is fine.
TEST(SimCopies, UnmappingMemoryAQueuedCopyUsesIsAMisuse) {
  for (bool ran : {false, true}) {
    SimDriver d;
    Stream s = d.create_stream();
    Arena ar(d, 2 * kG);
    std::vector<unsigned char> host(kG, 0);
    d.copy_to_host(host.data(), ar.va + kG, kG, s);  // the second granule only
    if (ran) d.run_all();
    const uint64_t before = d.vmm_stats().misuses;
    ASSERT_TRUE(d.unmap(ar.va, 2 * kG));
    EXPECT_EQ(d.vmm_stats().misuses, before + (ran ? 0 : 1)) << ran;
  }
}

// ---- Threads -------------------------------------------------------------------------------

TEST(SimThreads, ConcurrentProducersAndAStepper) {
  SimDriver d;
  d.set_copy_delay(true);
  constexpr int kThreads = 4, kRounds = 50;
  std::vector<DevPtr> vas(kThreads);
  for (auto& va : vas) {
    va = d.reserve(kG);
    ASSERT_TRUE(d.map(va, kG, d.create_physical(kG)));
  }
  std::atomic<int> producing{kThreads};
  std::vector<int> bad(kThreads, 0);
  std::vector<std::thread> producers;
  for (int t = 0; t < kThreads; ++t) {
    producers.emplace_back([&, t] {
      Stream copy = d.create_stream(), compute = d.create_stream();
      uint64_t e = d.create_event();
      std::vector<std::vector<unsigned char>> bufs;
      bufs.reserve(kRounds);
      for (int r = 0; r < kRounds; ++r) {
        bufs.emplace_back(kG, static_cast<unsigned char>(r + 1));
        d.copy_to_device(vas[t], bufs.back().data(), kG, copy);
        d.record_event(e, copy);
        d.stream_wait(compute, e);
        DevPtr va = vas[t];
        d.launch(compute, [&bad, t, va, r] {
          if (!all_bytes(at(va), kG, static_cast<unsigned char>(r + 1))) ++bad[t];
        });
        d.record_event(e, compute);
        d.stream_wait(copy, e);  // the next copy overwrites what this kernel reads
        if (r % 8 == 0) d.event_sync(e);
      }
      d.event_sync(e);
      d.destroy_event(e);
      --producing;
    });
  }
  std::mt19937_64 rng(99);
  while (producing.load() > 0) d.step(rng);
  for (auto& th : producers) th.join();
  d.run_all();
  EXPECT_EQ(d.pending_ops(), 0u);
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(bad[t], 0) << "thread " << t;
  EXPECT_EQ(d.live_events(), 0u);
}

TEST(SimThreads, ConcurrentMapAndUnmapOfDisjointRanges) {
  SimDriver d;
  DevPtr va = d.reserve(8 * kG);
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      DevPtr mine = va + 2 * kG * t;
      for (int i = 0; i < 50; ++i) {
        uint64_t h = d.create_physical(2 * kG);
        ASSERT_NE(h, 0u);
        ASSERT_TRUE(d.map(mine, 2 * kG, h));
        at(mine)[i] = static_cast<unsigned char>(t);
        ASSERT_TRUE(d.unmap(mine, 2 * kG));
        d.release_physical(h);
      }
    });
  }
  for (auto& th : ts) th.join();
  auto st = d.vmm_stats();
  EXPECT_EQ(st.maps, 200u);
  EXPECT_EQ(st.unmaps, 200u);
  EXPECT_EQ(st.mapped_bytes, 0u);
  EXPECT_LE(st.mapped_peak, 8 * kG);
  EXPECT_EQ(st.physical_bytes, 0u);
  EXPECT_EQ(st.misuses, 0u);
}

// ---- Hashes of device memory (recompute's probes) ---------------------------------------------

// The hash is a sum over words, so that the GPU's threads may add their parts in any order: the
// parts of any split of the words add up to the whole. One word changed, or one byte of a tail
// shorter than a word, always changes it.
TEST(RangeHash, PartsAddUpAndAnyOneWordOrTailByteChangesIt) {
  std::vector<unsigned char> b(8 * 1000 + 5);
  std::mt19937_64 rng(7);
  for (auto& c : b) c = static_cast<unsigned char>(rng());
  const uint64_t whole = range_hash::of(b.data(), b.size());
  uint64_t even = 0, odd = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    uint64_t w;
    std::memcpy(&w, b.data() + 8 * i, 8);
    (i % 2 ? odd : even) += range_hash::mix(w, i);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, b.data() + 8000, 5);
  EXPECT_EQ(even + odd + range_hash::mix(tail, 1000), whole);
  for (size_t at : {size_t{0}, size_t{8 * 517 + 3}, size_t{8000}, b.size() - 1}) {
    b[at] ^= 0x40;
    EXPECT_NE(range_hash::of(b.data(), b.size()), whole) << at;
    b[at] ^= 0x40;
  }
  // The same words at other places hash differently: a word's index is mixed in.
  std::vector<unsigned char> swapped(b);
  std::swap_ranges(swapped.begin(), swapped.begin() + 8, swapped.begin() + 8);
  EXPECT_NE(range_hash::of(swapped.data(), swapped.size()), whole);
}

// The simulated GPU takes a hash in stream order: behind work queued before it, ahead of work
// queued after, read once the stream has passed it.
TEST(SimDriverHash, TakenInStreamOrder) {
  SimDriver d;
  Arena a(d, kG);
  std::memset(at(a.va), 1, kG);
  const Stream s = d.create_stream();
  d.launch(s, [&] { std::memset(at(a.va), 2, kG); });
  const int64_t t = d.hash_start(a.va, kG, s);
  d.launch(s, [&] { std::memset(at(a.va), 3, kG); });
  ASSERT_GE(t, 0);
  const uint64_t e = d.create_event();
  d.record_event(e, s);
  d.event_sync(e);
  std::vector<unsigned char> twos(kG, 2);
  EXPECT_EQ(d.hash_value(t), range_hash::of(twos.data(), kG));
  EXPECT_EQ(d.hashes(), 1u);
  d.set_hashing(false);
  EXPECT_EQ(d.hash_start(a.va, kG, s), -1);
}

}  // namespace
}  // namespace offload

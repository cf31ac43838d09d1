// Grants made apart from their mappings (Residency::Options::grant_apart), on the simulated
// driver, whose ungranted mappings fault on any access: a stream that uses a range waits on the
// GPU for its grant, a copy out too, and without the streams' waits a kernel touches memory that
// is not granted yet. (Random programs with grants apart: residency_test.cpp.)
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>

#include "cap_rig.h"
#include "sanitizers.h"

namespace offload {
namespace {

using namespace cap_rig;
using Fault = Residency::Options::Fault;

Residency::Options apart(uint64_t budget, Fault fault = Fault::None) {
  Residency::Options o = CapRig::options(budget, fault);
  o.grant_apart = true;
  return o;
}

// Releases the simulated driver's grants after `ms`, from a thread of its own.
struct ReleaseLater {
  SimDriver& sim;
  std::thread t;
  ReleaseLater(SimDriver& s, int ms) : sim(s), t([this, ms] {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    sim.hold_grants(false);
  }) {}
  ~ReleaseLater() { t.join(); }
};

TEST(GrantsApart, AStreamThatUsesARangeWaitsOnTheGPUForItsGrant) {
  CapRig r(apart(8 * kGran));
  r.sim.hold_grants(true);  // the grant takes long (a copy to the host runs)
  const DevPtr p = r.alloc(kGran, kA);
  ASSERT_NE(p, 0u) << r.res.error();
  // Launches on the allocating stream and on another: the mapping call returned at once, and
  // neither kernel runs before the grant.
  bool first = false, second = false;
  ASSERT_TRUE(r.kernel(kA, {p}, [&] {
    words(p)[0] = 7;
    first = true;
  }));
  r.join(kA, kB);
  ASSERT_TRUE(r.kernel(kB, {p}, [&] {
    words(p)[1] = words(p)[0] + 1;
    second = true;
  }));
  std::mt19937_64 rng(1);
  r.gpu(rng, 100);
  EXPECT_FALSE(first);
  EXPECT_FALSE(second);
  EXPECT_GT(r.sim.pending_ops(), 0u);
  r.sim.hold_grants(false);
  r.sim.run_all();
  EXPECT_TRUE(first);
  EXPECT_TRUE(second);
  EXPECT_EQ(words(p)[1], 8u);
  const Residency::Stats s = r.res.stats();
  EXPECT_EQ(s.grants_apart, 1u);
  EXPECT_GE(s.grant_stream_waits, 2u);  // the allocating stream, and kB's launch
  EXPECT_EQ(s.grant_waits, 0u);         // the host never waited
  EXPECT_EQ(r.sim.vmm_stats().misuses, 0u);
}

// A copy or a memset is looked at by the driver when it is called (a copy into memory not granted
// yet failed there on an H100): the host waits for the grant first, and the copy is then queued.
TEST(GrantsApart, ACopyIntoARangeWaitsOnTheHostForItsGrant) {
  CapRig r(apart(8 * kGran));
  r.sim.hold_grants(true);
  const DevPtr p = r.alloc(kGran, kA);
  ASSERT_NE(p, 0u);
  const auto t0 = std::chrono::steady_clock::now();
  {
    ReleaseLater later(r.sim, 50);
    r.tr.on_memset(p, kGran, kA);
  }
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(40));
  const Residency::Stats s = r.res.stats();
  EXPECT_EQ(s.grant_waits, 1u);
  EXPECT_GE(s.grant_wait_ns, 40'000'000u);
  r.sim.run_all();
  EXPECT_EQ(r.sim.vmm_stats().misuses, 0u);
}

// At exit the grants asked for are made and the Granter's thread is joined; ranges mapped after
// that are granted where they are mapped.
TEST(GrantsApart, EndingGrantsMakesThosePendingAndLaterOnesAreMadeInline) {
  CapRig r(apart(8 * kGran));
  r.sim.hold_grants(true);
  const DevPtr p = r.alloc(kGran, kA);
  ASSERT_TRUE(r.kernel(kA, {p}, fill(p, kGran, 3)));
  {
    ReleaseLater later(r.sim, 30);
    r.res.end_grants();  // waits for p's grant
  }
  r.sim.run_all();
  EXPECT_EQ(words(p)[0], mix(3));
  const DevPtr q = r.alloc(kGran, kB);
  ASSERT_NE(q, 0u);
  ASSERT_TRUE(r.kernel(kB, {q}, fill(q, kGran, 4)));
  r.sim.run_all();
  EXPECT_EQ(words(q)[0], mix(4));
  EXPECT_EQ(r.res.stats().grants_apart, 1u);  // p's alone
  EXPECT_EQ(r.sim.vmm_stats().misuses, 0u);
}

// Without the streams' waits the first kernel runs on a mapping not granted yet: it faults.
TEST(GrantsApart, WithoutTheStreamsWaitAKernelTouchesMemoryNotGrantedYet) {
#if defined(OFFLOAD_TEST_ASAN) || defined(OFFLOAD_TEST_TSAN)
  GTEST_SKIP() << "a deliberate fault, which the sanitizers report as their own";
#endif
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        CapRig r(apart(8 * kGran, Fault::SkipGrantWait));
        r.sim.hold_grants(true);
        const DevPtr p = r.alloc(kGran, kA);
        r.kernel(kA, {p}, fill(p, kGran, 1));
        std::mt19937_64 rng(1);
        r.gpu(rng, 100);
        r.sim.hold_grants(false);
        std::_Exit(0);
      },
      "");
}

// A range evicted before its grant is made: the host waits for the grant before it queues the copy
// out (the driver checks a copy's memory then), and the bytes come back intact.
TEST(GrantsApart, ACopyOutWaitsForTheGrantAndTheBytesComeBack) {
  CapRig r(apart(2 * kGran));
  r.sim.hold_grants(true);
  const DevPtr p = r.alloc(kGran, kA);
  ASSERT_TRUE(r.kernel(kA, {p}, fill(p, kGran, 5)));
  DevPtr q = 0;
  {
    ReleaseLater later(r.sim, 50);
    q = r.alloc(2 * kGran, kA);  // p goes out: its copy is queued once its grant is made
  }
  ASSERT_NE(q, 0u) << r.res.error();
  ASSERT_TRUE(r.kernel(kA, {q}, fill(q, 2 * kGran, 6)));
  r.sim.run_all();
  r.res.poll();  // the copy out is found done
  EXPECT_EQ(r.res.state_of(p), Residency::State::OnHost);
  uint64_t got = 0;
  ASSERT_TRUE(r.kernel(kA, {p}, [&] { got = hash(p, kGran); }));
  r.sim.run_all();
  std::vector<uint64_t> want(kGran / 8);
  for (uint64_t k = 0; k < want.size(); ++k) want[k] = mix(5 + k);
  EXPECT_EQ(got, hash(reinterpret_cast<DevPtr>(want.data()), kGran));
  EXPECT_LE(r.sim.vmm_stats().physical_peak, 2 * kGran);
  EXPECT_EQ(r.sim.vmm_stats().misuses, 0u);  // no grant over an unmapped range, no unmap under a copy
  EXPECT_GE(r.res.stats().grants_apart, 2u);  // p and q; p's reload is granted where it is mapped
  EXPECT_GE(r.res.stats().grant_waits, 1u);
}

}  // namespace
}  // namespace offload

namespace offload {
namespace {

using namespace cap_rig;

// The copy gate (Residency::Options::copy_gate) on the simulated driver: the manager gates its
// copy stream, each copy out arrives in chunks of the gate's size, the mappings made once it is
// set count as gated grants, and every range comes back with its bytes. Without the option,
// nothing is gated.
TEST(CopyGate, CopiesOutGoInChunksOfTheGateAndEveryRangeComesBackIntact) {
  for (const uint64_t gate : {uint64_t(0), kGran / 4}) {
    Residency::Options o = CapRig::options(4 * kGran, Residency::Options::Fault::None);
    o.copy_gate = gate;
    CapRig r(o);
    const std::vector<DevPtr> t = filled_ranges(r, 10);
    ASSERT_EQ(t.size(), 10u);
    for (int i = 0; i < 10; ++i) {
      uint64_t got = 0;
      ASSERT_TRUE(r.kernel(kA, {t[i]}, [&, i] { got = hash(t[i], kGran); }));
      r.sim.run_all();
      EXPECT_EQ(got, filled_hash(i)) << "range " << i << ", gate " << gate;
    }
    const Residency::Stats s = r.res.stats();
    ASSERT_GE(s.evictions - s.clean_out, 6u);
    if (!gate) {
      EXPECT_EQ(r.sim.gated_chunks(), 0u);
      EXPECT_EQ(s.gate_grants, 0u);
      continue;
    }
    // Every copy out of a range of kGran in four chunks; a range may be copied out more than once.
    EXPECT_EQ(r.sim.gated_chunks() % 4, 0u);
    EXPECT_GE(r.sim.gated_chunks(), 4 * (s.evictions - s.clean_out));
    EXPECT_GT(s.gate_grants, 0u);
    EXPECT_LE(r.sim.vmm_stats().physical_peak, 4 * kGran);
    EXPECT_EQ(r.sim.vmm_stats().misuses, 0u);
  }
}

}  // namespace
}  // namespace offload

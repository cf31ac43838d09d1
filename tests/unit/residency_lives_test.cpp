// The residency manager and the lives of ranges: what a range freed while it copies out costs,
// what a handle given on carries, and how a range's next use is predicted from the step before
// (its uses, its free).
#include <gtest/gtest.h>

#include <functional>

#include "cap_rig.h"

namespace offload {
namespace {

using namespace cap_rig;

// x goes out for z and hands z its handle while its copy out is still queued; then the program
// frees x. Its bytes are dead: the host does not wait for that copy (it used to, as for a range
// taken back), and x's memory and host slot go back once the copy has ended.
TEST(ResidencyLives, ARangeFreedWhileCopyingOutIsRetiredWithoutWaitingForItsCopy) {
  Residency::Options o = CapRig::options(2 * kGran, Residency::Options::Fault::None);
  o.low_share = 0;  // nothing evicted ahead of need
  CapRig r(o);
  const DevPtr x = r.alloc(kGran, kA), y = r.alloc(kGran, kA);
  ASSERT_TRUE(r.kernel(kA, {x}, fill(x, kGran, 1)));
  ASSERT_TRUE(r.kernel(kA, {y}, fill(y, kGran, 2)));
  r.sim.run_all();
  const Residency::Stats before = r.res.stats();
  const DevPtr z = r.alloc(kGran, kA);  // x, the least recently used, goes out for it
  ASSERT_NE(z, 0u) << r.res.error();
  ASSERT_EQ(r.res.state_of(x), Residency::State::CopyingOut);
  ASSERT_EQ(r.res.stats().handovers, before.handovers + 1);
  r.free(x, kA);
  EXPECT_EQ(r.res.stats().waits, before.waits) << "nothing to wait for: x's bytes are dead";
  EXPECT_EQ(r.res.stats().taken_back, before.taken_back);
  EXPECT_EQ(r.res.stats().freed_copying_given, before.freed_copying_given + 1);
  EXPECT_GT(r.sim.pending_ops(), 0u) << "x's copy out is still queued";
  ASSERT_TRUE(r.kernel(kA, {z}, fill(z, kGran, 3)));
  uint64_t got_y = 0, got_z = 0;
  ASSERT_TRUE(r.kernel(kA, {y, z}, [&] { got_y = hash(y, kGran), got_z = hash(z, kGran); }));
  r.sim.run_all();
  r.res.poll();
  EXPECT_EQ(got_y, filled_hash(2));
  EXPECT_EQ(got_z, filled_hash(3));
  EXPECT_EQ(r.host.stats().in_use, 0u) << "x's host slot is back";
  EXPECT_LE(r.sim.vmm_stats().physical_peak, 2 * kGran);
  EXPECT_EQ(r.sim.vmm_stats().misuses, 0u);
  // x's address is unmapped and its slot reused: a new range is made and written whole.
  const DevPtr w = r.alloc(kGran, kA);
  ASSERT_NE(w, 0u) << r.res.error();
  uint64_t got_w = 0;
  ASSERT_TRUE(r.kernel(kA, {w}, fill(w, kGran, 4)));
  ASSERT_TRUE(r.kernel(kA, {w}, [&] { got_w = hash(w, kGran); }));
  r.sim.run_all();
  EXPECT_EQ(got_w, filled_hash(4));
  EXPECT_EQ(r.sim.vmm_stats().misuses, 0u);
}

// q's last launch still reads it when the program frees q; a range r of another size takes q's
// handle (its stream waits for q's free), goes out before any launch touches it, and gives the
// handle to z on another stream. z waits for r's copy out, which must follow what r waited for:
// else z writes the handle while q's launch has not read it yet.
TEST(ResidencyLives, AHandleGivenOnCarriesTheWaitsOfItsMapping) {
  for (const auto fault : {Residency::Options::Fault::None, Residency::Options::Fault::SkipMapCarry}) {
    SCOPED_TRACE(fault == Residency::Options::Fault::None ? "carried" : "not carried");
    Residency::Options o = CapRig::options(2 * kGran, fault);
    o.low_share = 0;  // nothing evicted ahead of need
    o.refit = false;  // q's range is not grown into rr
    CapRig r(o);
    const DevPtr q = r.alloc(kGran, kA);
    ASSERT_NE(q, 0u);
    ASSERT_TRUE(r.kernel(kA, {q}, fill(q, kGran, 1)));
    r.sim.run_all();
    r.sim.hold(kA, true);  // q's last launch has not run yet
    uint64_t got_q = 0;
    ASSERT_TRUE(r.kernel(kA, {q}, [&] { got_q = hash(q, kGran); }));
    r.free(q, kA);
    const Residency::Stats before = r.res.stats();
    const DevPtr rr = r.alloc(2 * kGran, kA);  // q is let go: its handle is a spare until its free ends
    ASSERT_NE(rr, 0u) << r.res.error();
    ASSERT_EQ(r.res.stats().freed_given, before.freed_given + 1);
    const DevPtr z = r.alloc(2 * kGran, kB);  // rr goes out, its handles given to z at once
    ASSERT_NE(z, 0u) << r.res.error();
    ASSERT_EQ(r.res.state_of(rr), Residency::State::CopyingOut);
    ASSERT_EQ(r.res.stats().handovers, before.handovers + 1);
    ASSERT_TRUE(r.kernel(kB, {z}, fill(z, 2 * kGran, 2)));
    r.sim.run_all();  // everything not held behind kA
    r.sim.hold(kA, false);
    r.sim.run_all();
    uint64_t got_z = 0;
    ASSERT_TRUE(r.kernel(kB, {z}, [&] { got_z = hash(z, 2 * kGran); }));
    r.sim.run_all();
    if (fault == Residency::Options::Fault::None) {
      EXPECT_EQ(got_q, filled_hash(1)) << "q's last launch read z's bytes";
    } else {
      EXPECT_NE(got_q, filled_hash(1)) << "the rig no longer gives q's handle on before q's launch ran";
    }
    EXPECT_EQ(got_z, filled_hash(2, 2 * kGran));
    EXPECT_LE(r.sim.vmm_stats().physical_peak, 2 * kGran);
    EXPECT_EQ(r.sim.vmm_stats().misuses, 0u);
  }
}

// Two ranges living across steps under a budget of three granules: `hot` used at the launches
// `hot_at` names and `cold` at `cold_at` of each `period`-launch step. Three steps, then the
// fourth up to `ask_at`, where a range twice their size is allocated: what each is then.
struct TwoLasting {
  Residency::State hot, cold;
  uint64_t misuses;
};
TwoLasting ask_after_two_lasting(uint64_t period, const std::function<bool(int)>& hot_at, int cold_at, int ask_at) {
  Residency::Options o = CapRig::options(3 * kGran, Residency::Options::Fault::None);
  o.low_share = 0;  // nothing evicted ahead of need
  CapRig r(o);
  const DevPtr hot = r.alloc(kGran, kA), cold = r.alloc(kGran, kA);
  r.res.set_period(period);
  uint64_t sink = 0;
  auto launch = [&](int i) {
    if (hot_at(i)) r.kernel(kA, {hot}, [&] { sink += words(hot)[0]; });
    else if (i == cold_at) r.kernel(kA, {cold}, [&] { sink += words(cold)[0]; });
    else r.kernel(kA, {}, [] {});
  };
  for (int step = 0; step < 3; ++step)
    for (int i = 0; i < int(period); ++i) launch(i);
  for (int i = 0; i < ask_at; ++i) launch(i);
  EXPECT_NE(r.alloc(2 * kGran, kA), 0u) << r.res.error();
  TwoLasting out{r.res.state_of(hot), r.res.state_of(cold), 0};
  r.sim.run_all();
  out.misuses = r.sim.vmm_stats().misuses;
  return out;
}

// A range living across steps is predicted to be used next where its first use in the last step
// recurs, even when it was used more than 8 times since: w, used at every other launch in the
// step's first half, is needed (at the next step's 2) before v (at its 3), so v goes out for a
// range twice their size. Remembering w's last 8 uses alone put its next use at 6, after v's.
TEST(ResidencyLives, ARangeUsedManyTimesAStepIsPredictedFromItsFirstUse) {
  const TwoLasting out = ask_after_two_lasting(40, [](int i) { return i >= 2 && i <= 20 && i % 2 == 0; }, 3, 26);
  EXPECT_EQ(out.hot, Residency::State::Resident);   // w
  EXPECT_NE(out.cold, Residency::State::Resident);  // v
  EXPECT_EQ(out.misuses, 0u);
}

// A range born at the same place every step and used more often than its uses are remembered
// (64): past the last one remembered, its next use is not known, and it is no better a victim
// than its last use makes it. t, born at each step's start, is used at its first 70 launches;
// u at 150. At launch 66 a range twice their size makes u go out, not t (predicted unused, t went
// out and came straight back).
TEST(ResidencyLives, PastTheUsesRememberedOfItsPlaceARangesNextUseIsNotKnown) {
  Residency::Options o = CapRig::options(3 * kGran, Residency::Options::Fault::None);
  o.low_share = 0;  // nothing evicted ahead of need
  CapRig r(o);
  const DevPtr u = r.alloc(kGran, kA);
  r.res.set_period(200);
  uint64_t sink = 0;
  DevPtr t = 0;
  auto launch = [&](int i) {
    if (i == 0) t = r.alloc(kGran, kA);
    if (i >= 1 && i <= 70) r.kernel(kA, {t}, [&, t] { sink += words(t)[0]; });
    else if (i == 150) r.kernel(kA, {u}, [&] { sink += words(u)[0]; });
    else r.kernel(kA, {}, [] {});
    if (i == 80) r.free(t, kA);
  };
  for (int step = 0; step < 3; ++step)
    for (int i = 0; i < 200; ++i) launch(i);
  for (int i = 0; i < 67; ++i) launch(i);
  ASSERT_NE(r.alloc(2 * kGran, kA), 0u) << r.res.error();
  EXPECT_EQ(r.res.state_of(t), Residency::State::Resident);
  EXPECT_NE(r.res.state_of(u), Residency::State::Resident);
  r.sim.run_all();
  EXPECT_EQ(r.sim.vmm_stats().misuses, 0u);
}

// A range living across steps and used more often than its uses are remembered: the uses a period
// ago are forgotten, and its next use is near (the mean gap between those remembered), not where
// its first remembered use recurs. m is used at launches 1-120 of each step, v at 150; at launch
// 90 a range twice their size makes v go out (used in 60), not m (used at the next launch; its
// first remembered use, launch 26, recurs 136 launches on).
TEST(ResidencyLives, ARangeUsedMoreOftenThanRememberedIsUsedSoon) {
  const TwoLasting out = ask_after_two_lasting(200, [](int i) { return i >= 1 && i <= 120; }, 150, 90);
  EXPECT_EQ(out.hot, Residency::State::Resident);   // m
  EXPECT_NE(out.cold, Residency::State::Resident);  // v
  EXPECT_EQ(out.misuses, 0u);
}

// How deep the copy stream runs, in launches: a copy out started at a launch and found done ten
// launches on (the stream it waits for held until then) counts ten (Stats::out_lag).
TEST(ResidencyLives, ACopyOutsLagIsCountedInLaunches) {
  Residency::Options o = CapRig::options(2 * kGran, Residency::Options::Fault::None);
  o.low_share = 0;  // nothing evicted ahead of need
  CapRig r(o);
  const DevPtr a = r.alloc(kGran, kA);
  r.kernel(kA, {a}, fill(a, kGran, 1));
  const DevPtr b = r.alloc(kGran, kA);
  r.kernel(kA, {b}, fill(b, kGran, 2));
  r.sim.run_all();
  EXPECT_EQ(r.res.stats().out_lag, 0u) << "no copy out yet";
  r.sim.hold(kA, true);  // the copy out waits for a's launch, queued behind the held stream
  const DevPtr c = r.alloc(kGran, kA);  // a goes out
  ASSERT_NE(c, 0u) << r.res.error();
  for (int i = 0; i < 10; ++i) r.kernel(kB, {b}, [] {});
  r.res.poll();
  EXPECT_EQ(r.res.stats().out_lag, 0u) << "its copy is not done";
  r.sim.hold(kA, false);
  r.sim.run_all();
  r.res.poll();
  EXPECT_EQ(r.res.stats().out_lag, 10u);
  EXPECT_NE(r.res.state_of(a), Residency::State::Resident);
  r.sim.run_all();
  EXPECT_EQ(r.sim.vmm_stats().misuses, 0u);
}

// Options::pool_short. An allocation `res.alloc` leaves to the pool (0, not refused) is served by
// the allocator, as the shim forwards it: the simulated pool here.
DevPtr alloc_or_pool(CapRig& r, uint64_t bytes, bool* pooled) {
  uint64_t tag = 0;
  bool refused = false;
  DevPtr p = r.res.alloc(bytes, kA, &tag, &refused);
  *pooled = !p && !refused;
  if (*pooled) {
    p = r.sim.alloc(bytes);
    r.res.small_allocated(bytes, p);
  }
  if (p) r.tr.on_alloc(p, bytes, kA, tag);
  return p;
}
// The pool's free is stream-ordered: its memory goes back once the queued work has run (`later`).
void free_or_pool(CapRig& r, DevPtr p, uint64_t bytes, std::vector<DevPtr>* later) {
  r.tr.on_free(p, kA);
  if (r.res.free(p, kA)) return;
  r.res.small_freed(bytes, p);
  later->push_back(p);
}

// Options for the tests of short lives: a budget, pool_short, and half the budget for pooled bytes.
Residency::Options short_options(uint64_t budget, uint32_t pool_short) {
  Residency::Options o = CapRig::options(budget, Residency::Options::Fault::None);
  o.pool_short = pool_short;
  o.pool_short_share = 0.5;
  return o;
}
// The budget held at every sample, by our count and the driver's, with no misuse of its calls.
void expect_within(CapRig& r, uint64_t budget) {
  EXPECT_LE(r.res.stats().footprint_peak, budget);
  EXPECT_LE(r.sim.vmm_stats().physical_peak, budget);
  EXPECT_EQ(r.sim.vmm_stats().misuses, 0u);
}

// Steps of 10 launches. `t` (two granules) is born at the step's first launch and lives `t_life`
// launches; `l` (one granule) is born at the second and lives 8. With pool_short = 4, once a step
// has shown their lives, `t` is left to the pool (no mapping, its bytes in the pool's share) and
// `l` keeps a range; a `t` that then lives 6 launches sends its place back to a range the step
// after. The share grown for `t` then gives way to a launch whose ranges need the room.
TEST(ResidencyLives, AShortLifeIsLeftToThePoolAndALongOneGoesBackToARange) {
  constexpr uint64_t kBudget = 8 * kGran;
  CapRig r(short_options(kBudget, 4));
  uint64_t sink = 0, expect = 0;
  struct Seen {
    bool t_pooled = false, l_pooled = false;
    uint64_t t_maps = 0;
  };
  auto step = [&](int n, uint64_t t_life) {
    Seen seen;
    std::vector<DevPtr> later;
    DevPtr t = 0, l = 0;
    for (uint64_t i = 0; i < 10; ++i) {
      if (i == 0) {
        const uint64_t maps = r.res.stats().maps;
        t = alloc_or_pool(r, 2 * kGran, &seen.t_pooled);
        seen.t_maps = r.res.stats().maps - maps;
        EXPECT_NE(t, 0u) << r.res.error();
        EXPECT_TRUE(r.kernel(kA, {t}, fill(t, 2 * kGran, uint64_t(n))));
      } else if (i == 1) {
        l = alloc_or_pool(r, kGran, &seen.l_pooled);
        EXPECT_NE(l, 0u) << r.res.error();
        EXPECT_TRUE(r.kernel(kA, {l}, fill(l, kGran, uint64_t(n) + 100)));
      } else if (i == t_life) {
        EXPECT_TRUE(r.kernel(kA, {t}, [&, t] { sink += hash(t, 2 * kGran); }));
        expect += filled_hash(uint64_t(n), 2 * kGran);
      } else if (i == 9) {
        EXPECT_TRUE(r.kernel(kA, {l}, [&, l] { sink += hash(l, kGran); }));
        expect += filled_hash(uint64_t(n) + 100, kGran);
      } else {
        EXPECT_TRUE(r.kernel(kA, {}, [] {}));
      }
      if (i == t_life) free_or_pool(r, t, 2 * kGran, &later);
      if (i == 9) free_or_pool(r, l, kGran, &later);
    }
    r.sim.run_all();
    for (DevPtr p : later) r.sim.free(p);
    r.res.poll();
    return seen;
  };
  const Seen first = step(0, 3);
  EXPECT_FALSE(first.t_pooled) << "no period yet: every allocation is a range";
  r.res.set_period(10);
  const Seen second = step(1, 3);  // lives seen at their places
  EXPECT_FALSE(second.t_pooled);
  const Seen third = step(2, 3);
  EXPECT_TRUE(third.t_pooled) << "t lived 3 launches a step before";
  EXPECT_EQ(third.t_maps, 0u);
  EXPECT_FALSE(third.l_pooled) << "l lived 8";
  EXPECT_EQ(r.res.stats().pooled, 1u);
  EXPECT_GE(r.res.stats().pool_share, 2 * kGran) << "the pooled bytes count in the pool's share";
  const Seen fourth = step(3, 6);  // pooled, and lives longer than predicted
  EXPECT_TRUE(fourth.t_pooled);
  EXPECT_EQ(r.res.stats().pooled_long, 1u);
  const Seen fifth = step(4, 3);
  EXPECT_FALSE(fifth.t_pooled) << "its place lived 6 launches last step";
  const Seen sixth = step(5, 3);
  EXPECT_TRUE(sixth.t_pooled);
  EXPECT_EQ(sink, expect) << "every use read the bytes written";
  // The share grown for t outlives it. A launch whose ranges need all but the pool's floor takes
  // it back down instead of being refused.
  const uint64_t share = r.res.stats().pool_share;
  ASSERT_GE(share, 2 * kGran);
  r.res.set_period(0);  // nothing more pooled: these allocations are ranges
  std::vector<DevPtr> big;
  for (int i = 0; i < 3; ++i) {
    big.push_back(r.alloc(2 * kGran, kA));
    ASSERT_NE(big.back(), 0u) << r.res.error();
    ASSERT_TRUE(r.kernel(kA, {big.back()}, fill(big.back(), 2 * kGran, 200 + uint64_t(i))));
  }
  uint64_t got = 0;
  ASSERT_TRUE(r.kernel(kA, {big[0], big[1], big[2]}, [&] {
    got = hash(big[0], 2 * kGran) + hash(big[1], 2 * kGran) + hash(big[2], 2 * kGran);
  })) << r.res.error();
  r.sim.run_all();
  uint64_t want = 0;
  for (uint64_t i = 0; i < 3; ++i) want += filled_hash(200 + i, 2 * kGran);
  EXPECT_EQ(got, want);
  EXPECT_LT(r.res.stats().pool_share, share);
  EXPECT_EQ(r.res.stats().pool_shrinks, 1u);
  expect_within(r, kBudget);
}

// A short life is pooled only into room no live range holds: with `w` resident in 7 of 8
// granules, the 2-granule `t` whose place lived 2 launches gets a range (w goes out for it on
// need) instead of the share growing by evicting w, which left the share grown past the short
// lives and moved three times the bytes on a recorded step (docs/results.md).
TEST(ResidencyLives, AShortLifeIsPooledOnlyIntoRoomNoLiveRangeHolds) {
  constexpr uint64_t kBudget = 8 * kGran;
  Residency::Options o = short_options(kBudget, 4);
  o.low_share = 0;  // nothing evicted ahead of need
  CapRig r(o);
  uint64_t sink = 0, expect = 0;
  DevPtr w = 0;
  auto step = [&](int n) {
    std::vector<DevPtr> later;
    bool pooled = false;
    DevPtr t = 0;
    for (uint64_t i = 0; i < 10; ++i) {
      if (i == 0) {
        t = alloc_or_pool(r, 2 * kGran, &pooled);
        EXPECT_NE(t, 0u) << r.res.error();
        EXPECT_TRUE(r.kernel(kA, {t}, fill(t, 2 * kGran, uint64_t(n))));
      } else if (i == 2) {
        EXPECT_TRUE(r.kernel(kA, {t}, [&, t] { sink += hash(t, 2 * kGran); }));
        expect += filled_hash(uint64_t(n), 2 * kGran);
        free_or_pool(r, t, 2 * kGran, &later);
      } else if (i == 5 && w) {
        EXPECT_TRUE(r.kernel(kA, {w}, [&] { sink += words(w)[0]; }));
        expect += mix(7);
      } else {
        EXPECT_TRUE(r.kernel(kA, {}, [] {}));
      }
    }
    r.sim.run_all();
    for (DevPtr p : later) r.sim.free(p);
    r.res.poll();
    return pooled;
  };
  step(0);
  r.res.set_period(10);
  step(1);
  EXPECT_TRUE(step(2)) << "free room: t is pooled";
  w = r.alloc(7 * kGran, kA);
  ASSERT_NE(w, 0u) << r.res.error();
  ASSERT_TRUE(r.kernel(kA, {w}, fill(w, 7 * kGran, 7)));
  for (int i = 0; i < 9; ++i) ASSERT_TRUE(r.kernel(kA, {}, [] {}));  // back to the step's first launch
  const uint64_t out = r.res.stats().bytes_out;
  EXPECT_FALSE(step(3)) << "only 1 granule no live range holds: t gets a range";
  EXPECT_GT(r.res.stats().bytes_out, out) << "w went out for t's range, on need";
  EXPECT_EQ(sink, expect) << "every use read the bytes written";
  expect_within(r, kBudget);
}

// The pool's share gives way to a launch's ranges by trimming the pool down to what the launch
// leaves, not to nothing: the pool would map again what it gave back. The share grew to 4
// granules for 3 small ones since freed (the pool keeps their 3); the launch needs 6 of 8.
TEST(ResidencyLives, ThePoolIsTrimmedOnlyByWhatALaunchNeeds) {
  constexpr uint64_t kBudget = 8 * kGran;
  Residency::Options o = short_options(kBudget, 0);  // the option off: the trim is the cap's own
  o.low_share = 0;
  CapRig r(o);
  r.sim.set_pool(0, 0);
  ASSERT_TRUE(r.res.admit_small(3 * kGran));
  r.res.small_allocated(3 * kGran);
  r.sim.set_pool(3 * kGran, 3 * kGran);
  r.res.small_freed(3 * kGran);
  r.sim.set_pool(3 * kGran, 0);
  ASSERT_GE(r.res.stats().pool_share, 4 * kGran);
  std::vector<DevPtr> t;
  for (int i = 0; i < 3; ++i) {
    t.push_back(r.alloc(2 * kGran, kA));
    ASSERT_NE(t.back(), 0u) << r.res.error();
    ASSERT_TRUE(r.kernel(kA, {t.back()}, fill(t.back(), 2 * kGran, uint64_t(i))));
  }
  uint64_t got = 0;
  ASSERT_TRUE(r.kernel(kA, {t[0], t[1], t[2]}, [&] {
    got = hash(t[0], 2 * kGran) + hash(t[1], 2 * kGran) + hash(t[2], 2 * kGran);
  })) << r.res.error();
  r.sim.run_all();
  EXPECT_EQ(got, filled_hash(0, 2 * kGran) + filled_hash(1, 2 * kGran) + filled_hash(2, 2 * kGran));
  EXPECT_EQ(r.sim.pool_trims().last_keep, 2 * kGran) << "trimmed to what the launch leaves";
  EXPECT_EQ(r.sim.pool_reserved_current(), 2 * kGran);
  EXPECT_EQ(r.res.stats().pool_share, 2 * kGran);
  EXPECT_LE(r.sim.vmm_stats().physical_peak + 2 * kGran, kBudget);
  EXPECT_EQ(r.sim.vmm_stats().misuses, 0u);
}

}  // namespace
}  // namespace offload

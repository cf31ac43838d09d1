// Adaptation: PlanWatch decides, from the GPU time of the steps a plan runs, when the plan is
// revised and how much slower the next plan takes the link to be; a slower link makes the
// planner move less or predict more time (checked on a recorded step).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "planner/planner.h"
#include "recorded_step.h"

namespace offload {
namespace {

constexpr int64_t kMs = 1'000'000;

TEST(PlanWatch, StepsWithinTheSlackKeepThePlan) {
  PlanWatch w(200 * kMs);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(w.observe(219 * kMs), 0.0) << i;  // +9.5%: within a tenth
  EXPECT_EQ(w.revisions(), 0u);
}

TEST(PlanWatch, ThreeSlowStepsInARowReviseOnce) {
  PlanWatch w(200 * kMs);
  EXPECT_EQ(w.observe(260 * kMs), 0.0);
  EXPECT_EQ(w.observe(260 * kMs), 0.0);
  double f = w.observe(260 * kMs);
  EXPECT_NEAR(f, 200.0 / 260.0, 1e-9);
  EXPECT_EQ(w.revisions(), 1u);
  EXPECT_EQ(w.slow_steps(), 0u);  // counting starts again
}

TEST(PlanWatch, AFastStepResetsTheCount) {
  PlanWatch w(200 * kMs);
  w.observe(260 * kMs);
  w.observe(260 * kMs);
  EXPECT_EQ(w.observe(205 * kMs), 0.0);
  EXPECT_EQ(w.observe(260 * kMs), 0.0);
  EXPECT_EQ(w.observe(260 * kMs), 0.0);
  EXPECT_GT(w.observe(260 * kMs), 0.0);
}

TEST(PlanWatch, TheFactorIsBoundedAndRevisionsAreCapped) {
  PlanWatch w(100 * kMs, 2);
  for (int i = 0; i < 2; ++i) w.observe(1000 * kMs);
  EXPECT_EQ(w.observe(1000 * kMs), 0.5);  // ten times slower: at most half
  w.replanned(100 * kMs);
  for (int i = 0; i < 2; ++i) w.observe(110'500'000);
  EXPECT_EQ(w.observe(110'500'000), 0.9);  // 10.5% slower: at least a tenth off
  w.replanned(100 * kMs);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(w.observe(1000 * kMs), 0.0) << "third revision of two";
  EXPECT_EQ(w.revisions(), 2u);
}

TEST(PlanWatch, ShortStepsNeedAMillisecondOver) {
  PlanWatch w(2 * kMs);  // a tenth is 0.2 ms: the slack is 1 ms
  for (int i = 0; i < 5; ++i) EXPECT_EQ(w.observe(2 * kMs + kMs / 2), 0.0);
  for (int i = 0; i < 2; ++i) w.observe(4 * kMs);
  EXPECT_GT(w.observe(4 * kMs), 0.0);
}

// A plan's first steps move its data in and are not judged; each new plan settles again. Three
// slow steps after the settling ones revise it.
TEST(PlanWatch, APlansFirstStepsAreNotJudged) {
  PlanWatch w(200 * kMs, 3, 2);
  EXPECT_EQ(w.observe(1000 * kMs), 0.0);  // the step the plan came in at
  EXPECT_EQ(w.observe(1000 * kMs), 0.0);  // the one after
  EXPECT_EQ(w.slow_steps(), 0u);
  EXPECT_EQ(w.observe(260 * kMs), 0.0);
  EXPECT_EQ(w.observe(260 * kMs), 0.0);
  EXPECT_EQ(w.slow_steps(), 2u);
  EXPECT_NEAR(w.observe(260 * kMs), 200.0 / 260.0, 1e-9);
  w.replanned(260 * kMs);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(w.observe(2000 * kMs), 0.0) << "settling again: " << i;
  EXPECT_EQ(w.observe(2000 * kMs), 0.0);
  EXPECT_EQ(w.slow_steps(), 1u);
  EXPECT_EQ(w.revisions(), 1u);
}

// Moe on the H200: the plan predicted 1863.6 ms; the steps from the one it came in at
// took 2283.5, 2526.7, 2131.8, then 1764.3 ms of GPU time. Judged from the start, the third
// revised it; settled, the fast fourth keeps it.
TEST(PlanWatch, MoesMoveInDoesNotReviseItsPlan) {
  const int64_t steps[] = {2'283'500'000, 2'526'700'000, 2'131'800'000, 1'764'300'000, 1'870'100'000, 1'862'400'000};
  PlanWatch judged(1'863'600'000), settled(1'863'600'000, 3, 2);
  double first = 0;
  for (int64_t s : steps) {
    if (double f = judged.observe(s); f > 0 && first == 0) first = f;
    EXPECT_EQ(settled.observe(s), 0.0);
  }
  EXPECT_GT(first, 0.0);
  EXPECT_EQ(settled.revisions(), 0u);
}

TEST(PlanWatch, NoPredictionNoRevision) {
  PlanWatch w(0);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(w.observe(500 * kMs), 0.0);
}

// What a revision does to the next plan: with the link at the factor the watch returned, the
// same budget costs more predicted time, and no more bytes move than before.
TEST(PlanWatch, ASlowerLinkGivesASlowerPlanThatMovesNoMore) {
  const StepTrace t = recorded_step("reference");
  ASSERT_FALSE(t.launches.empty());
  PlannerOptions o;
  o.budget = 19ull << 30;
  PlannerResult a = plan_step(t, o);
  ASSERT_FALSE(a.plan.arenas.empty()) << a.why;
  PlanWatch w(a.prediction.step_ns);
  double f = 0;
  for (int i = 0; i < 3 && f == 0; ++i) f = w.observe(a.prediction.step_ns * 13 / 10);
  ASSERT_GT(f, 0.0);
  o.link.scale = f;
  PlannerResult b = plan_step(t, o);
  ASSERT_FALSE(b.plan.arenas.empty()) << b.why;
  EXPECT_GT(b.prediction.step_ns, a.prediction.step_ns);
  EXPECT_LE(b.prediction.peak_bytes, o.budget);
  EXPECT_LE(b.prediction.bytes_out, a.prediction.bytes_out + (a.plan.handle_bytes));
}

// Per-boundary feedback, measured: a step that sat idle before an arena's first use longer
// than the plan predicted says where, and by how much.
TEST(PlanFeedback, MeasuredLatenessFindsTheBoundaryThatWaited) {
  const StepTrace t = recorded_step("reference");
  PlannerOptions o;
  o.budget = 19ull << 30;
  const PlannerResult r = plan_step(t, o);
  ASSERT_FALSE(r.plan.arenas.empty()) << r.why;
  // The step as planned (no extra idle time) has nothing late.
  EXPECT_TRUE(measured_lateness(r.plan, r.prediction, t).empty());
  // The same step with 2 ms of idle GPU before the first use of the arena used last.
  size_t j = 0;
  for (size_t i = 0; i < r.plan.arenas.size(); ++i)
    if (r.plan.arenas[i].first_use > r.plan.arenas[j].first_use) j = i;
  const int64_t p = r.plan.arenas[j].first_use;
  StepTrace slow = t;
  for (TraceLaunch& l : slow.launches)
    if (static_cast<int64_t>(l.pos) >= p && l.gpu_start_ns >= 0) l.gpu_start_ns += 2 * kMs;
  const auto late = measured_lateness(r.plan, r.prediction, slow);
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0].first, p);
  EXPECT_GT(late[0].second, 2 * kMs - r.prediction.arenas[j].stall - 60'000);
  EXPECT_LE(late[0].second, 2 * kMs);
  // A step of another length is not compared.
  StepTrace other = t;
  other.launches.pop_back();
  EXPECT_TRUE(measured_lateness(r.plan, r.prediction, other).empty());
}

// Per-boundary feedback, used: reloads that arrive late at a boundary cost step time in the
// simulation, and the plan made with that knowledge does no worse under it than the old one.
TEST(PlanFeedback, LateReloadsCostTimeAndTheNextPlanAccountsForThem) {
  const StepTrace t = recorded_step("reference");
  PlannerOptions o;
  o.budget = 19ull << 30;
  const PlannerResult before = plan_step(t, o);
  ASSERT_FALSE(before.plan.arenas.empty()) << before.why;
  const GpuTimeline g = gpu_timeline(t);
  // The arena whose reload has the most slack before its use: late by that slack + 3 ms.
  size_t j = 0;
  int64_t slack = -1;
  for (size_t i = 0; i < before.plan.arenas.size(); ++i) {
    const ArenaTiming& at = before.prediction.arenas[i];
    if (!at.abandoned && at.use - at.reload_end > slack) slack = at.use - at.reload_end, j = i;
  }
  ASSERT_GE(slack, 0);
  LinkModel fed = o.link;
  fed.late_at = {{before.plan.arenas[j].first_use, slack + 3 * kMs}};
  const Prediction old_under_feedback = simulate(t, g, before.plan, fed, o.pool_overhead);
  // That use waits 3 ms longer; the step is no shorter (later waits may absorb some of it).
  EXPECT_GE(old_under_feedback.arenas[j].stall, before.prediction.arenas[j].stall + 3 * kMs - 1000);
  EXPECT_GE(old_under_feedback.step_ns, before.prediction.step_ns);
  o.link = fed;
  const PlannerResult after = plan_step(t, o);
  ASSERT_FALSE(after.plan.arenas.empty()) << after.why;
  EXPECT_LE(after.prediction.peak_bytes, o.budget);
  EXPECT_LE(after.prediction.step_ns, old_under_feedback.step_ns * 101 / 100);
  // Its own prediction includes the feedback.
  EXPECT_EQ(simulate(t, g, after.plan, fed, o.pool_overhead).step_ns, after.prediction.step_ns);
}

// PoolWatch, on the figures of the lora run on the H200 that passed its 20 GiB budget: the
// pool reserved 15.25 GiB for a step whose live bytes peaked at 13.207 GiB (1.1547x), the plan
// counted 1.15x and predicted 19.98 GiB.
constexpr uint64_t kGiB = 1ull << 30;
const uint64_t kLive = static_cast<uint64_t>(13.207 * kGiB), kPredicted = static_cast<uint64_t>(19.98 * kGiB);

// What PyTorch's pool serves of a step: weights in the shim's own ranges are not counted (the
// runtime's first pool factor is the pool's reservation over this, not over the whole peak).
TEST(PooledLivePeak, LeavesOutThePersistentAllocationsOfAtLeastTheMinimum) {
  constexpr uint64_t kMiB = 1 << 20;
  StepTrace t;
  t.launches.resize(4);
  for (uint32_t i = 0; i < 4; ++i) t.launches[i].pos = i;
  auto add = [&](uint64_t bytes, int64_t at, int64_t freed) {
    TraceAlloc a;
    a.ordinal = static_cast<uint32_t>(t.allocs.size());
    a.bytes = bytes;
    a.alloc_pos = at;
    a.free_pos = freed;
    t.allocs.push_back(a);
  };
  add(1024 * kMiB, -1, -1);  // a weight
  add(8 * kMiB, -1, -1);     // optimizer state below the minimum: the pool's
  add(100 * kMiB, 1, 3);     // activations
  add(300 * kMiB, 2, 3);
  EXPECT_EQ(pooled_live_peak(t, 0), (1024 + 8 + 400) * kMiB);  // no persistent pool: everything
  EXPECT_EQ(pooled_live_peak(t, 64 * kMiB), (8 + 400) * kMiB);
  EXPECT_EQ(pooled_live_peak(t, 2048 * kMiB), (1024 + 8 + 400) * kMiB);  // the weight is below it
}

TEST(MeasuredPoolFactor, CountsThePooledBytesInTheShimsOwnRangesBesideThePoolsReservation) {
  constexpr uint64_t kMiB = 1 << 20;
  // moe on the H200: the pool reserved 6.41 GiB; the shim's own ranges held the 38.7 GiB of
  // weights and 0.59 GiB of the step's large allocations; 5.2 GiB pooled.
  const uint64_t weights = 39629 * kMiB, own = weights + 604 * kMiB, reserved = 6564 * kMiB, pooled = 5325 * kMiB;
  EXPECT_NEAR(measured_pool_factor(reserved, own, weights, pooled, 1.15), (6564.0 + 604.0) / 5325.0, 1e-9);
  // The pool alone (no persistent pool): its reservation over the pooled bytes.
  EXPECT_NEAR(measured_pool_factor(reserved, 0, 0, pooled, 1.15), 6564.0 / 5325.0, 1e-9);
  // Never below the model, at most 2, the model when nothing was measured.
  EXPECT_EQ(measured_pool_factor(pooled, 0, 0, pooled, 1.15), 1.15);
  EXPECT_EQ(measured_pool_factor(3 * pooled, 0, 0, pooled, 1.15), 2.0);
  EXPECT_EQ(measured_pool_factor(0, own, weights, pooled, 1.15), 1.15);
  EXPECT_EQ(measured_pool_factor(reserved, own, weights, 0, 1.15), 1.15);
  // Weights past the own peak (a peak taken after they were lent) add nothing.
  EXPECT_NEAR(measured_pool_factor(reserved, 100 * kMiB, weights, pooled, 1.15), 6564.0 / 5325.0, 1e-9);
}

TEST(PoolWatch, APoolHoldingMoreThanPlannedPastTheBudgetRevisesThePlan) {
  PoolWatch w;
  const double f = w.observe(static_cast<uint64_t>(15.25 * kGiB), kLive, 1.15, kPredicted, 20 * kGiB);
  EXPECT_NEAR(f, 15.25 / 13.207 * 1.002, 1e-3);
  EXPECT_GT(f, 1.15);
  EXPECT_EQ(w.revisions(), 1u);
}

TEST(PoolWatch, APoolWithinThePlansFactorOrUnderTheBudgetKeepsIt) {
  PoolWatch w;
  // The other runs: 14.94-15.13 GiB for the same live bytes (1.131-1.146x): under what was planned.
  EXPECT_EQ(w.observe(static_cast<uint64_t>(15.13 * kGiB), kLive, 1.15, kPredicted, 20 * kGiB), 0.0);
  // 0.1% over the factor: noise, kept.
  EXPECT_EQ(w.observe(static_cast<uint64_t>(1.1511 * kLive), kLive, 1.15, kPredicted, 20 * kGiB), 0.0);
  // Over the factor, but the predicted peak grown by it still meets the budget: kept.
  EXPECT_EQ(w.observe(static_cast<uint64_t>(15.25 * kGiB), kLive, 1.15, 19 * kGiB, 20 * kGiB), 0.0);
  // Nothing measured (no pool, or the simulated driver): kept.
  EXPECT_EQ(w.observe(0, kLive, 1.15, kPredicted, 20 * kGiB), 0.0);
  EXPECT_EQ(w.revisions(), 0u);
}

// Moe on the H200: planned at 1.477x, the pool held 7.72 GiB for 4.39 GiB (1.758x) at
// the step the plan came in at, before the pool's trim at its marks; its steps after held 5.62.
// Settled, the first two steps of each install are not judged; a third like it is.
TEST(PoolWatch, APlansFirstStepsAreNotJudged) {
  const uint64_t live = static_cast<uint64_t>(4.39 * kGiB), moved_in = static_cast<uint64_t>(7.72 * kGiB);
  const uint64_t predicted = static_cast<uint64_t>(20.46 * kGiB);
  PoolWatch judged, settled(2, 2);
  EXPECT_GT(judged.observe(moved_in, live, 1.477, predicted, 20 * kGiB), 0.0);
  settled.planned();
  EXPECT_EQ(settled.observe(moved_in, live, 1.477, predicted, 20 * kGiB), 0.0);
  EXPECT_EQ(settled.observe(moved_in, live, 1.477, predicted, 20 * kGiB), 0.0);
  EXPECT_EQ(settled.revisions(), 0u);
  EXPECT_GT(settled.observe(moved_in, live, 1.477, predicted, 20 * kGiB), 0.0);
  settled.planned();  // the plan made again settles too
  EXPECT_EQ(settled.observe(moved_in, live, 1.761, predicted, 20 * kGiB), 0.0);
  EXPECT_EQ(settled.revisions(), 1u);
}

TEST(PoolWatch, RevisesAtMostTwiceAndNeverPastTwice) {
  PoolWatch w;
  EXPECT_GT(w.observe(static_cast<uint64_t>(1.3 * kLive), kLive, 1.15, kPredicted, 20 * kGiB), 0.0);
  EXPECT_DOUBLE_EQ(w.observe(static_cast<uint64_t>(3.0 * kLive), kLive, 1.3, kPredicted, 20 * kGiB), 2.0);
  EXPECT_EQ(w.observe(static_cast<uint64_t>(3.0 * kLive), kLive, 2.0, kPredicted, 20 * kGiB), 0.0);
  EXPECT_EQ(w.revisions(), 2u);
}

}  // namespace
}  // namespace offload

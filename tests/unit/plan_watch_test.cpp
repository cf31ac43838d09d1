// Adaptation: PlanWatch decides, from the GPU time of the steps a plan runs, when the plan is
// revised and how much slower the next plan takes the link to be; a slower link makes the
// planner move less or predict more time (checked on a recorded step).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "planner/planner.h"

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

TEST(PlanWatch, NoPredictionNoRevision) {
  PlanWatch w(0);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(w.observe(500 * kMs), 0.0);
}

// What a revision does to the next plan: with the link at the factor the watch returned, the
// same budget costs more predicted time, and no more bytes move than before.
TEST(PlanWatch, ASlowerLinkGivesASlowerPlanThatMovesNoMore) {
  std::ifstream is(std::string(OFFLOAD_TRACES_DIR) + "/reference.trace");
  StepTrace t;
  std::string err;
  ASSERT_TRUE(is && StepTrace::read(is, &t, &err)) << err;
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

}  // namespace
}  // namespace offload

#include "core/pool_trim.h"

#include <gtest/gtest.h>

namespace offload {
namespace {

TEST(PoolTrim, NothingBeforeAnyPlan) {
  PoolTrimTrigger t(2);
  for (uint64_t s = 0; s < 10; ++s) EXPECT_FALSE(t.due(0, 0, false));
  EXPECT_FALSE(t.due(0, 0, true)) << "no install yet, whatever `running` says";
}

TEST(PoolTrim, OnceAPlanHasRunItsStepsAndOnlyOnce) {
  PoolTrimTrigger t(2);
  EXPECT_FALSE(t.due(1, 0, true)) << "just installed";
  EXPECT_FALSE(t.due(1, 1, true)) << "one step under the plan";
  EXPECT_TRUE(t.due(1, 2, true)) << "two steps under the plan";
  EXPECT_FALSE(t.due(1, 3, true)) << "once per install";
  EXPECT_FALSE(t.due(1, 40, true));
}

TEST(PoolTrim, ADeviatedPlanWaitsForTheNextInstallCountedFromThere) {
  PoolTrimTrigger t(2);
  EXPECT_FALSE(t.due(1, 0, true));
  EXPECT_FALSE(t.due(1, 1, false)) << "deviated after one step: demand mode, no trim";
  EXPECT_FALSE(t.due(1, 5, false));
  // Re-planned: the counter goes on from 5; the new plan needs two steps of its own.
  EXPECT_FALSE(t.due(2, 5, true));
  EXPECT_FALSE(t.due(2, 6, true));
  EXPECT_TRUE(t.due(2, 7, true));
  EXPECT_FALSE(t.due(2, 8, true));
  // A revision after a trim: the next plan trims again (what demand mode reserved).
  EXPECT_FALSE(t.due(3, 9, true));
  EXPECT_TRUE(t.due(3, 11, true));
}

TEST(PoolTrim, ACallSeenLateCountsFromWhereItWasSeen) {
  PoolTrimTrigger t(2);
  // The first call after an install comes when the plan has already run 3 steps: counted from
  // there (the steps before it may have begun before the install's anchor).
  EXPECT_FALSE(t.due(1, 3, true));
  EXPECT_FALSE(t.due(1, 4, true));
  EXPECT_TRUE(t.due(1, 5, true));
}

}  // namespace
}  // namespace offload

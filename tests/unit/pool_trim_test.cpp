#include "core/pool_trim.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

namespace offload {
namespace {

constexpr uint64_t MiB = 1ull << 20;

// A stream-ordered pool as cuMemPoolTrimTo sees it: OS allocations (chunks), each either
// holding something live or free. A trim releases free chunks, last first, while what stays
// reserved is at least the bytes asked for.
struct FakePool {
  struct Chunk {
    uint64_t bytes;
    bool live;
  };
  explicit FakePool(std::vector<Chunk> c) : chunks(std::move(c)) {}

  std::vector<Chunk> chunks;
  bool works = true;
  std::vector<uint64_t> asked;

  uint64_t reserved() const {
    uint64_t n = 0;
    for (const Chunk& c : chunks) n += c.bytes;
    return n;
  }
  bool trim_to(uint64_t keep) {
    asked.push_back(keep);
    if (!works) return false;
    uint64_t r = reserved();
    for (size_t i = chunks.size(); i-- > 0;) {
      if (chunks[i].live || r - chunks[i].bytes < keep) continue;
      r -= chunks[i].bytes;
      chunks.erase(chunks.begin() + static_cast<std::ptrdiff_t>(i));
    }
    return true;
  }
  PoolTrim::Attempt attempt(PoolTrim& t, uint64_t keep) {
    return t.attempt(keep, [&] { return reserved(); }, [&](uint64_t n) { return trim_to(n); });
  }
};

TEST(PoolTrim, NothingBeforeAnyPlan) {
  PoolTrim t(2);
  for (uint64_t s = 0; s < 10; ++s) EXPECT_FALSE(t.due(0, 0, false));
  EXPECT_FALSE(t.due(0, 0, true)) << "no install yet, whatever `running` says";
}

TEST(PoolTrim, DueOnceAPlanHasRunItsStepsAndNotAgainOnceDone) {
  PoolTrim t(2);
  FakePool p({{100 * MiB, true}, {100 * MiB, false}, {100 * MiB, false}, {100 * MiB, false}, {100 * MiB, false}});
  EXPECT_FALSE(t.due(1, 0, true)) << "just installed";
  EXPECT_FALSE(t.due(1, 1, true)) << "one step under the plan";
  ASSERT_TRUE(t.due(1, 2, true)) << "two steps under the plan";
  const PoolTrim::Attempt a = p.attempt(t, 200 * MiB);
  EXPECT_TRUE(a.called);
  EXPECT_TRUE(a.done);
  EXPECT_EQ(a.before, 500 * MiB);
  EXPECT_EQ(a.after, 200 * MiB) << "no further than asked";
  EXPECT_EQ(p.asked, std::vector<uint64_t>{200 * MiB});
  EXPECT_FALSE(t.due(1, 3, true)) << "the target was reached: no more tries this install";
  EXPECT_FALSE(t.due(1, 40, true));
}

TEST(PoolTrim, APoolAlreadyUnderTheTargetIsNotTrimmedAndNotTriedAgain) {
  PoolTrim t(1);
  FakePool p({{100 * MiB, true}, {50 * MiB, false}});
  EXPECT_FALSE(t.due(1, 0, true));
  ASSERT_TRUE(t.due(1, 1, true));
  const PoolTrim::Attempt a = p.attempt(t, 200 * MiB);
  EXPECT_FALSE(a.called);
  EXPECT_TRUE(a.done);
  EXPECT_TRUE(p.asked.empty()) << "cuMemPoolTrimTo is not called for a pool within the target";
  EXPECT_FALSE(t.due(1, 2, true));
}

TEST(PoolTrim, APoolStillInUseIsTriedAgainAtTheNextStepsAndOnlyOncePerStep) {
  // Convnet's pool on the H200 (fe26f5e): one trim while a step ran released nothing.
  PoolTrim t(1, 8);
  FakePool p({{100 * MiB, true}, {100 * MiB, true}, {250 * MiB, true}, {250 * MiB, true}});
  EXPECT_FALSE(t.due(1, 0, true));
  ASSERT_TRUE(t.due(1, 1, true));
  PoolTrim::Attempt a = p.attempt(t, 200 * MiB);
  EXPECT_TRUE(a.called);
  EXPECT_FALSE(a.done);
  EXPECT_EQ(a.after, 700 * MiB) << "nothing could go";
  EXPECT_FALSE(t.due(1, 1, true)) << "once per step";
  // At the next step what was live in the last chunks has been freed.
  p.chunks[2].live = p.chunks[3].live = false;
  ASSERT_TRUE(t.due(1, 2, true));
  a = p.attempt(t, 200 * MiB);
  EXPECT_TRUE(a.called);
  EXPECT_TRUE(a.done);
  EXPECT_EQ(a.after, 200 * MiB);
  EXPECT_FALSE(t.due(1, 3, true));
}

TEST(PoolTrim, ATrimThatStopsAboveTheTargetAsksForLessNextTime) {
  // The reference workload's pool (fe26f5e): the trim kept at least what it was asked for and
  // stopped 20 MiB above it.
  PoolTrim t(1, 8);
  FakePool p({{990 * MiB, true}, {30 * MiB, false}, {30 * MiB, false}, {500 * MiB, false}});
  EXPECT_FALSE(t.due(1, 0, true));
  ASSERT_TRUE(t.due(1, 1, true));
  PoolTrim::Attempt a = p.attempt(t, 1000 * MiB);
  EXPECT_EQ(a.after, 1020 * MiB) << "990 + 30: the last 30 MiB chunk would go under 1000";
  EXPECT_FALSE(a.done);
  ASSERT_TRUE(t.due(1, 2, true));
  a = p.attempt(t, 1000 * MiB);
  EXPECT_EQ(p.asked.back(), 980 * MiB) << "asked for the overshoot less";
  EXPECT_EQ(a.after, 990 * MiB);
  EXPECT_TRUE(a.done);
}

TEST(PoolTrim, TriesAreBoundedPerInstallAndANewInstallStartsAgain) {
  PoolTrim t(1, 3);
  FakePool p({{100 * MiB, true}, {100 * MiB, true}, {100 * MiB, true}, {100 * MiB, true}});
  uint64_t step = 1, tries = 0;
  for (; step < 20; ++step) {
    if (!t.due(1, step, true)) continue;
    ++tries;
    const PoolTrim::Attempt a = p.attempt(t, 200 * MiB);
    EXPECT_EQ(a.done, tries == 3) << "try " << tries;
  }
  EXPECT_EQ(tries, 3u);
  EXPECT_EQ(p.asked, (std::vector<uint64_t>{200 * MiB, 0, 0})) << "after a 200 MiB overshoot: 200 less";
  // A revision installs a new plan: tries again, from its own first step and its own overshoot.
  p.chunks[2].live = p.chunks[3].live = false;
  EXPECT_FALSE(t.due(2, step, true)) << "just installed";
  ASSERT_TRUE(t.due(2, step + 1, true));
  const PoolTrim::Attempt a = p.attempt(t, 200 * MiB);
  EXPECT_EQ(p.asked.back(), 200 * MiB);
  EXPECT_EQ(a.after, 200 * MiB);
  EXPECT_TRUE(a.done);
}

TEST(PoolTrim, ADeviatedPlanIsNotTrimmedAndItsNextInstallCountsFromItsOwnSteps) {
  PoolTrim t(2);
  EXPECT_FALSE(t.due(1, 0, true));
  EXPECT_FALSE(t.due(1, 1, false)) << "deviated after one step: demand mode, no trim";
  EXPECT_FALSE(t.due(1, 5, false));
  // Re-planned: the counter goes on from 5; the new plan needs two steps of its own.
  EXPECT_FALSE(t.due(2, 5, true));
  EXPECT_FALSE(t.due(2, 6, true));
  EXPECT_TRUE(t.due(2, 7, true));
}

TEST(PoolTrim, ACallSeenLateCountsFromWhereItWasSeen) {
  PoolTrim t(2);
  // The first call after an install comes when the plan has already run 3 steps: counted from
  // there (the steps before it may have begun before the install's anchor).
  EXPECT_FALSE(t.due(1, 3, true));
  EXPECT_FALSE(t.due(1, 4, true));
  EXPECT_TRUE(t.due(1, 5, true));
}

TEST(PoolTrim, ADriverThatCannotTrimIsNotAskedAgain) {
  PoolTrim t(1);
  FakePool p({{100 * MiB, true}, {300 * MiB, false}});
  p.works = false;
  EXPECT_FALSE(t.due(1, 0, true));
  ASSERT_TRUE(t.due(1, 1, true));
  const PoolTrim::Attempt a = p.attempt(t, 200 * MiB);
  EXPECT_FALSE(a.called);
  EXPECT_TRUE(a.done);
  EXPECT_FALSE(t.due(1, 2, true));
  EXPECT_EQ(p.asked.size(), 1u);
}

}  // namespace
}  // namespace offload

// The built-in plan on the steps recorded on the H200 (tests/data/traces/), at several budgets:
// properties every plan must have, whatever the trace.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "planner/plan.h"
#include "planner/step_trace.h"
#include "recorded_step.h"

namespace offload {
namespace {


// Every property a plan of `t` must have.
void check(const StepTrace& t, const PlanOptions& o, const Plan& p) {
  const int64_t n = static_cast<int64_t>(t.launches.size());
  ASSERT_EQ(p.step_launches, t.launches.size());
  ASSERT_EQ(p.tokens.size(), t.launches.size());
  for (size_t i = 0; i < t.launches.size(); ++i) EXPECT_EQ(p.tokens[i], launch_token(t.launches[i].kind, t.launches[i].kernel));
  if (p.arenas.empty()) return;
  EXPECT_GE(p.handles, std::min<uint32_t>(2, static_cast<uint32_t>(p.arenas.size())));
  EXPECT_EQ(p.handle_bytes % o.granularity, 0u);
  if (p.budget && p.meets_budget) {
    EXPECT_LE(p.predicted_peak, p.budget);
  }
  // Under a budget a plan is made only if it lowers the predicted footprint (the step
  // without offload costs the same pool overhead on all it holds).
  if (p.budget) {
    EXPECT_LT(p.predicted_peak, static_cast<uint64_t>(static_cast<double>(p.plain_peak) * o.pool_overhead));
  }

  // Accesses per allocation ordinal.
  std::vector<std::vector<int64_t>> acc(t.allocs.size());
  for (const TraceLaunch& l : t.launches)
    for (uint32_t a : l.allocs) acc[a].push_back(l.pos);

  uint64_t host_end = 0;
  for (size_t i = 0; i < p.arenas.size(); ++i) {
    const ArenaPlan& a = p.arenas[i];
    SCOPED_TRACE("arena " + std::to_string(i));
    EXPECT_EQ(a.capacity, p.handle_bytes);
    EXPECT_LE(a.used, a.capacity);
    EXPECT_LT(a.evict_after, a.reload_at);
    EXPECT_LE(a.reload_at, a.first_use);
    EXPECT_GE(a.first_use - a.evict_after, std::max<int64_t>(2, n / o.min_gap_fraction));
    EXPECT_GE(a.host_offset, host_end) << "host extents overlap";
    host_end = a.host_offset + a.used;
    for (uint32_t m : a.members) {
      const TraceAlloc& ta = t.allocs[m];
      EXPECT_LE(ta.alloc_pos, a.evict_after) << "placed before its arena is evicted";
      EXPECT_GT(ta.free_pos, a.first_use - 1) << "alive when its arena comes back";
      for (int64_t q : acc[m]) EXPECT_FALSE(q > a.evict_after && q < a.first_use) << "used while evicted, at " << q;
    }
  }
  EXPECT_LE(p.host_bytes(), o.max_host_bytes);

  // Members: sorted by (pos, sub), indexed per position, non-overlapping inside each arena.
  ASSERT_EQ(p.member_index.size(), t.launches.size() + 1);
  for (size_t j = 1; j < p.members.size(); ++j) {
    const MemberPlan &x = p.members[j - 1], &y = p.members[j];
    EXPECT_TRUE(x.pos < y.pos || (x.pos == y.pos && x.sub < y.sub));
  }
  for (size_t q = 0; q < t.launches.size(); ++q)
    for (uint32_t j = p.member_index[q]; j < p.member_index[q + 1]; ++j) EXPECT_EQ(p.members[j].pos, q);
  EXPECT_EQ(p.member_index.back(), p.members.size());
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> spans(p.arenas.size());
  for (const MemberPlan& m : p.members) spans[m.arena].emplace_back(m.offset, m.offset + m.bytes);
  for (auto& s : spans) {
    std::sort(s.begin(), s.end());
    for (size_t j = 1; j < s.size(); ++j) EXPECT_LE(s[j - 1].second, s[j].first) << "members overlap";
    for (auto [b, e] : s) EXPECT_EQ(b % o.member_align, 0u);
  }
  // The sub-ordinal names the member's place among the allocations born before its launch.
  for (const MemberPlan& m : p.members) {
    uint32_t seen = 0;
    const TraceAlloc* found = nullptr;
    for (const TraceAlloc& a : t.allocs)
      if (a.alloc_pos == static_cast<int64_t>(m.pos) && seen++ == m.sub) found = &a;
    ASSERT_NE(found, nullptr);
    EXPECT_EQ(found->bytes, m.bytes);
  }
}

class RecordedPlan : public ::testing::TestWithParam<const char*> {};

TEST_P(RecordedPlan, EveryPlanKeepsItsPromises) {
  StepTrace t = recorded_step(GetParam());
  PlanOptions o;
  std::string why;
  Plan all = build_plan(t, o, &why);
  ASSERT_FALSE(all.arenas.empty()) << why;
  check(t, o, all);
  uint64_t last_moved = 0;
  // From a tight budget to a loose one: never more bytes moved for more room.
  for (double f : {0.95, 0.85, 0.75, 0.6, 0.5}) {
    o.budget = static_cast<uint64_t>(static_cast<double>(all.plain_peak) * f);
    Plan p = build_plan(t, o, &why);
    SCOPED_TRACE(std::string(GetParam()) + " at " + std::to_string(f) + ": " + (p.arenas.empty() ? why : p.describe()));
    check(t, o, p);
    uint64_t moved = 0;
    for (const ArenaPlan& a : p.arenas) moved += a.used;
    if (p.meets_budget) {
      EXPECT_GE(moved, last_moved);
    }
    last_moved = std::max(last_moved, moved);
  }
}

TEST_P(RecordedPlan, NothingToDoWithinTheBudgetAndTheHostPoolBounds) {
  StepTrace t = recorded_step(GetParam());
  PlanOptions o;
  std::string why;
  Plan all = build_plan(t, o, &why);
  o.budget = all.plain_peak + 1;
  EXPECT_TRUE(build_plan(t, o, &why).arenas.empty());
  EXPECT_NE(why.find("within the budget"), std::string::npos) << why;
  // A host pool that takes a quarter of it: the plan shrinks to fit and says the budget is not met.
  o.budget = all.plain_peak / 4;
  o.max_host_bytes = all.host_bytes() / 4;
  Plan small = build_plan(t, o, &why);
  check(t, o, small);
  EXPECT_TRUE(small.arenas.empty() || !small.meets_budget) << small.describe();
  o.max_host_bytes = 1;
  EXPECT_TRUE(build_plan(t, o, &why).arenas.empty());
  EXPECT_NE(why.find("host pool"), std::string::npos) << why;
}

TEST_P(RecordedPlan, SameTraceSamePlan) {
  StepTrace t = recorded_step(GetParam());
  PlanOptions o;
  std::string why;
  Plan a = build_plan(t, o, &why), b = build_plan(t, o, &why);
  EXPECT_EQ(a.describe(), b.describe());
  ASSERT_EQ(a.members.size(), b.members.size());
  for (size_t i = 0; i < a.members.size(); ++i) {
    EXPECT_EQ(a.members[i].offset, b.members[i].offset);
    EXPECT_EQ(a.members[i].arena, b.members[i].arena);
  }
}

INSTANTIATE_TEST_SUITE_P(Traces, RecordedPlan, ::testing::Values("reference", "convnet", "llama-compiled"));

TEST(Plan, TheReferenceAtHalfItsPeakMeetsTheBudget) {
  // docs/results.md: the GPU run's plan at 50% of the measured footprint.
  StepTrace t = recorded_step("reference");
  PlanOptions o;
  o.budget = 13723762688;
  std::string why;
  Plan p = build_plan(t, o, &why);
  ASSERT_FALSE(p.arenas.empty()) << why;
  EXPECT_TRUE(p.meets_budget) << p.describe();
  EXPECT_EQ(p.handle_bytes, round_up(p.handle_bytes, o.granularity));
}

}  // namespace
}  // namespace offload

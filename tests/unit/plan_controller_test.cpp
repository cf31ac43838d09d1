// PlanController on the simulated driver: a plan made from a recorded step, installed in the
// executor with the host memory the pool leased; made again once a deviation retires it; the
// allocator's pool trimmed under it at the marks; made again for the pool's measured factor and
// swapped in at a mark; revised when its steps keep running slower than predicted.
#include "plan_controller.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/sim_driver.h"
#include "recorded_step.h"

namespace offload {
namespace {

// The process around the controller: a host pool that records its leases (the executor is
// never asked to copy here, so one small buffer backs every extent).
class FakeProcess final : public PlanContext, public HostPool {
 public:
  bool ready = true;
  uint64_t next_launch = 0;
  std::vector<uint64_t> leased, released;
  std::vector<uint64_t> planned_steps;

  HostPool& host_pool() override { return *this; }
  bool host_pool_ready() override { return ready; }
  NodeShare node_share(uint64_t, uint32_t) override { return NodeShare{}; }
  uint64_t launches() override { return next_launch; }
  uint64_t steps_cut() override { return 0; }
  void drain_while_planning() override {}
  bool cut_untraced(const StepTrace&) override { return false; }
  void planned_from(const StepTrace& t) override { planned_steps.push_back(t.step); }

  std::optional<Extent> lease(uint64_t bytes, std::string*) override {
    leased.push_back(bytes);
    return Extent{buf_.data(), 0, bytes};
  }
  void release(const Extent& e) override { released.push_back(e.bytes); }
  std::string describe() const override { return "fake"; }
  unsigned char* data() { return buf_.data(); }

 private:
  std::pair<unsigned char*, uint64_t> data_area() override {
    return {buf_.data(), buf_.size()};
  }
  std::vector<unsigned char> buf_ = std::vector<unsigned char>(4096);
};

struct Rig {
  SimDriver drv;
  Executor ex{drv, Executor::Options{}};
  Settings settings;
  BlockCache cache;
  FakeProcess process;
  std::optional<PlanController> ctl;

  // timed: the planner, from the step's GPU times (a plan it can refine and watch); otherwise
  // the built-in plan: deterministic, and what build_plan gives below.
  explicit Rig(uint64_t budget, bool timed = false) {
    drv.set_device_total_bytes(80ull << 30);
    settings.device_budget = budget;
    settings.builtin_plan = !timed;
    ctl.emplace(drv, ex, settings, cache, nullptr, process);
  }
  // The plan the controller should make from `t`: the built-in one for the budget.
  Plan expected(const StepTrace& t) {
    PlanOptions o;
    o.budget = settings.plan_budget_bytes(drv.device_total_bytes());
    o.granularity = drv.vmm_granularity();
    std::string why;
    Plan p = build_plan(t, o, &why);
    EXPECT_FALSE(p.arenas.empty()) << why;
    return p;
  }
  // The planner's plan the controller makes first from `t` (the model's pool factor, one more
  // handle's room under the budget).
  Plan timed_expected(const StepTrace& t) {
    PlannerOptions po;
    po.budget = settings.budget_bytes(drv.device_total_bytes());
    po.granularity = drv.vmm_granularity();
    po.spare_handle = true;
    PlannerResult r = plan_step(t, po);
    EXPECT_FALSE(r.plan.arenas.empty()) << r.why;
    return std::move(r.plan);
  }
  // The installed plan's next step begins: its first launch passes the executor's gate (a step
  // is counted at its first launch; the others are not needed here). Returns that launch's number.
  uint64_t run_step(const StepTrace& t) {
    const uint64_t n = t.launches.size();
    const uint64_t at = plan_anchor(t.first_launch, n, process.next_launch);
    const TraceLaunch& first = t.launches.at(0);
    ex.before_launch(at, first.kind, first.kernel, first.stream, nullptr, 0, 0);
    process.next_launch = at + n;
    return at;
  }
  uint64_t pool() { return drv.pool_reserved_current(); }
};

constexpr uint64_t kReferenceHalf = 13723762688;  // half the reference step's footprint on the GPU

TEST(PlanController, PlansFromARepeatedStepAndInstallsWhatThePoolLeased) {
  const StepTrace t = recorded_step("reference");
  Rig rig(kReferenceHalf);
  const Plan want = rig.expected(t);

  rig.ctl->on_step(t, false);  // the first step seen: nothing to compare it with
  EXPECT_FALSE(rig.ex.installed());
  EXPECT_TRUE(rig.process.leased.empty());
  EXPECT_TRUE(rig.drv.pinned().empty()) << "no host memory is pinned before a plan leases it";

  rig.ctl->on_step(t, false);  // it repeats: planned, leased, pinned, installed
  ASSERT_TRUE(rig.ex.installed());
  using Pins = std::vector<std::pair<void*, uint64_t>>;
  EXPECT_EQ(rig.drv.pinned(), (Pins{{rig.process.data(), 4096}})) << "what the plan leased, pinned on the driver";
  EXPECT_FALSE(rig.ex.deviated());
  EXPECT_EQ(rig.ex.stats().plan, want.describe());
  ASSERT_EQ(rig.process.leased, std::vector<uint64_t>{want.host_bytes()});
  EXPECT_EQ(rig.process.planned_steps, std::vector<uint64_t>{t.step});
  const PlanController::Report r = rig.ctl->report();
  EXPECT_EQ(r.host_bytes, want.host_bytes());
  EXPECT_EQ(r.predicted_peak, want.predicted_peak);
  EXPECT_EQ(r.pool_overhead, PlanOptions{}.pool_overhead) << "no pool to measure: the model's factor";
  EXPECT_EQ(r.predicted.step_ns, 0) << "the built-in plan predicts no time";

  rig.ctl->on_step(t, false);  // the plan runs: nothing new
  EXPECT_EQ(rig.process.leased.size(), 1u);
  EXPECT_EQ(rig.ex.stats().installs, 1u);
  EXPECT_EQ(rig.drv.pinned().size(), 1u) << "pinned once";
}

TEST(PlanController, ARetiredPlanIsMadeAgainOnceTheArenasAreIdle) {
  const StepTrace t = recorded_step("reference");
  Rig rig(kReferenceHalf);
  rig.ctl->on_step(t, false);
  rig.ctl->on_step(t, false);
  ASSERT_TRUE(rig.ex.installed());
  const uint64_t host = rig.process.leased.at(0);

  rig.ex.retire("a deviation");  // as a launch off the plan would
  ASSERT_TRUE(rig.ex.deviated());
  rig.ctl->on_step(t, false);  // idle (nothing was placed): its host memory back, a plan again
  EXPECT_EQ(rig.process.released, std::vector<uint64_t>{host});
  EXPECT_EQ(rig.process.leased, (std::vector<uint64_t>{host, host}));
  EXPECT_TRUE(rig.ex.installed());
  EXPECT_FALSE(rig.ex.deviated());
  EXPECT_EQ(rig.ex.stats().installs, 2u);
  EXPECT_EQ(rig.ctl->report().host_bytes, host);
}

TEST(PlanController, KeepsDataResidentWithoutAHostPoolOrARepeatedStep) {
  const StepTrace ref = recorded_step("reference"), convnet = recorded_step("convnet");
  Rig rig(kReferenceHalf);
  rig.process.ready = false;
  rig.ctl->on_step(ref, false);
  rig.ctl->on_step(ref, false);
  EXPECT_FALSE(rig.ex.installed()) << "no host pool yet";
  EXPECT_TRUE(rig.process.leased.empty());

  rig.process.ready = true;
  rig.ctl->on_step(convnet, false);  // another shape of step
  rig.ctl->on_step(ref, false);      // does not repeat the one before it: not planned from
  EXPECT_FALSE(rig.ex.installed());
  rig.ctl->on_step(ref, false);
  EXPECT_TRUE(rig.ex.installed());
  EXPECT_EQ(rig.process.leased.size(), 1u);
}

constexpr uint64_t kGiB = 1ull << 30;
constexpr uint64_t kPoolBefore = 40 * kGiB;  // what the steps before a plan left the pool holding

TEST(PlanController, TrimsThePoolToTheBudgetLessItsHandlesAtTheMarkBeforeThePlansFirstStep) {
  const StepTrace t = recorded_step("reference");
  Rig rig(kReferenceHalf);
  const Plan want = rig.expected(t);
  const uint64_t keep = want.budget - uint64_t{want.handles} * want.handle_bytes;
  rig.drv.set_pool(kPoolBefore, kGiB);
  rig.ctl->on_step(t, true);
  rig.ctl->at_mark();  // no plan: the pool is left as it is
  rig.ctl->on_step(t, true);
  ASSERT_TRUE(rig.ex.installed());
  EXPECT_EQ(rig.pool(), kPoolBefore) << "trimmed at a mark, not when installed";

  rig.ctl->at_mark();  // the plan's handles are created in its first step: the pool leaves them room
  EXPECT_EQ(rig.pool(), keep);
  EXPECT_EQ(rig.drv.pool_trims().last_keep, keep);
  const PlanController::Report r = rig.ctl->report();
  EXPECT_EQ(r.pool_trims, 1u);
  EXPECT_EQ(r.pool_trimmed_bytes, kPoolBefore - keep);

  rig.drv.set_pool(kPoolBefore, kGiB);
  rig.run_step(t);  // taken at the mark: the first launch leaves the pool alone
  EXPECT_EQ(rig.pool(), kPoolBefore);
  EXPECT_EQ(rig.ex.stats().first_step_trims, 0u);
}

TEST(PlanController, TrimsThePoolBackUnderThePlansBudgetAtTheMarkAfterAPlannedStep) {
  const StepTrace t = recorded_step("reference");
  Rig rig(kReferenceHalf);
  const Plan want = rig.expected(t);
  rig.ctl->on_step(t, true);
  rig.ctl->on_step(t, true);
  ASSERT_TRUE(rig.ex.installed());
  rig.ctl->at_mark();  // the trim before the first step: the pool is not known yet
  rig.drv.set_pool(kPoolBefore, kGiB);
  rig.ctl->at_mark();
  EXPECT_EQ(rig.pool(), kPoolBefore) << "no planned step has run since the install";

  rig.run_step(t);
  rig.ctl->on_step(t, true);
  EXPECT_EQ(rig.pool(), kPoolBefore) << "a marked step is trimmed at its mark, not by the worker";
  rig.ctl->at_mark();
  // The pool keeps the plan's budget less what the executor held beside it: nothing placed here.
  ASSERT_EQ(rig.ex.stats().held_peak, 0u);
  EXPECT_EQ(rig.pool(), want.budget);
  EXPECT_EQ(rig.drv.pool_trims().calls, 1u);
  const PlanController::Report r = rig.ctl->report();
  EXPECT_EQ(r.pool_trims, 1u);
  EXPECT_EQ(r.pool_trimmed_bytes, kPoolBefore - want.budget);
}

TEST(PlanController, WithoutMarksTheWorkerTrimsThePoolAfterAPlannedStep) {
  const StepTrace t = recorded_step("reference");
  Rig rig(kReferenceHalf);
  const Plan want = rig.expected(t);
  rig.ctl->on_step(t, false);
  rig.ctl->on_step(t, false);
  ASSERT_TRUE(rig.ex.installed());
  rig.run_step(t);
  rig.ctl->on_step(t, false);  // the worker counts the plan's steps from the first it sees
  rig.drv.set_pool(kPoolBefore, kGiB);
  rig.run_step(t);
  rig.ctl->on_step(t, false);
  EXPECT_EQ(rig.pool(), want.budget);
  EXPECT_EQ(rig.ctl->report().pool_trims, 1u);
  EXPECT_EQ(rig.ctl->report().pool_trimmed_bytes, kPoolBefore - want.budget);
}

TEST(PlanController, LeavesAPoolWithinThePlansBudgetUntrimmed) {
  const StepTrace t = recorded_step("reference");
  Rig rig(kReferenceHalf);
  rig.drv.set_pool(4 * kGiB, kGiB);
  rig.ctl->on_step(t, true);
  rig.ctl->on_step(t, true);
  ASSERT_TRUE(rig.ex.installed());
  for (int step = 0; step < 3; ++step) {
    rig.ctl->at_mark();
    rig.run_step(t);
    rig.ctl->on_step(t, true);
  }
  rig.ctl->at_mark();
  EXPECT_EQ(rig.pool(), 4 * kGiB);
  EXPECT_EQ(rig.drv.pool_trims().calls, 0u) << "the driver is not asked to trim a pool within the bound";
  EXPECT_EQ(rig.ctl->report().pool_trims, 0u);
  EXPECT_EQ(rig.ctl->report().pool_trimmed_bytes, 0u);
}

// A budget at which the reference step has a plan for the pool at 1.2x its resident bytes
// (with PoolRefine's margin), so that one made again for that factor can go in.
constexpr uint64_t kRefineBudget = 16 * kGiB;

// A timed plan of the reference step, under which the pool grows at the mark after its first
// step from what the plan counts it to hold (1.15x the resident bytes) to 1.2x: enough to take
// the plan past its budget, so that the plan is to be made again for the pool's factor.
struct Grown {
  uint64_t resident = 0;  // the plan's resident peak
  uint64_t counted = 0;   // what the plan counts the pool to hold
  uint64_t grown = 0;     // what the pool holds at the mark after the first step
};
Grown grow_pool_under_timed_plan(Rig& rig, const StepTrace& t) {
  Grown g;
  rig.ctl->on_step(t, true);
  rig.ctl->on_step(t, true);
  EXPECT_TRUE(rig.ex.installed());
  const Executor::TrimView v = rig.ex.trim_view();
  g.resident = v.resident_peak;
  g.counted = v.predicted_peak - v.handle_bytes;
  g.grown = g.resident / 5 * 6;
  rig.drv.set_pool(g.counted, g.counted);
  rig.ctl->at_mark();  // the pool's level before the plan's first step
  rig.run_step(t);
  rig.drv.set_pool(g.grown, g.counted);  // what the step reserved beyond the plan's count is free at the mark
  rig.ctl->at_mark();
  return g;
}

TEST(PlanController, PlansAgainForAPoolFactorAboveThePlansAndSwapsItInAtTheNextMark) {
  const StepTrace t = recorded_step("reference");
  Rig rig(kRefineBudget, true);
  const Grown g = grow_pool_under_timed_plan(rig, t);
  ASSERT_EQ(rig.process.leased.size(), 1u) << "the plan is made again by the worker, not at the mark";
  const double seen = static_cast<double>(g.grown) / static_cast<double>(g.resident);
  EXPECT_DOUBLE_EQ(rig.ctl->report().pool_factor_seen, seen);
  const std::string first = rig.ex.stats().plan;
  const uint64_t first_peak = rig.ctl->report().predicted_peak;

  rig.ctl->on_step(t, true);  // made for the measured factor and staged, with host memory of its own
  ASSERT_EQ(rig.process.leased.size(), 2u);
  EXPECT_EQ(rig.ex.stats().installs, 1u) << "put in at a mark only";
  EXPECT_EQ(rig.ctl->report().pool_refined, 0u);

  rig.run_step(t);
  rig.ctl->at_mark();  // every arena is empty here: the plan goes in, and the pool is emptied of what is unused
  EXPECT_EQ(rig.ex.stats().installs, 2u);
  EXPECT_NE(rig.ex.stats().plan, first);
  EXPECT_EQ(rig.ctl->report().pool_refined, 1u);
  EXPECT_EQ(rig.drv.pool_trims().last_keep, 0u);
  EXPECT_EQ(rig.pool(), g.counted);
  // Made for more pool bytes per resident byte under the same budget, it leaves fewer resident.
  EXPECT_LT(rig.ex.trim_view().resident_peak, g.resident);
  EXPECT_TRUE(rig.process.released.empty()) << "the first plan's host memory goes when the worker adopts the new plan";

  rig.ctl->on_step(t, true);  // the worker adopts it
  EXPECT_EQ(rig.process.released, std::vector<uint64_t>{rig.process.leased[0]});
  const PlanController::Report r = rig.ctl->report();
  EXPECT_DOUBLE_EQ(r.pool_overhead, seen * (1 + PoolRefine::Options{}.up_margin));
  EXPECT_EQ(r.host_bytes, rig.process.leased[1]);
  EXPECT_EQ(r.predicted_peak, rig.ex.trim_view().predicted_peak);
  EXPECT_NE(r.predicted_peak, first_peak);
  EXPECT_EQ(r.pool_refined, 1u);
  EXPECT_EQ(rig.ex.stats().installs, 2u);
}

TEST(PlanController, DoesNotSwapAPlanInWhileAnArenaHoldsDataAndGivesItsHostMemoryBack) {
  const StepTrace t = recorded_step("reference");
  Rig rig(kRefineBudget, true);
  const Plan running = rig.timed_expected(t);
  grow_pool_under_timed_plan(rig, t);
  ASSERT_EQ(rig.ex.stats().plan, running.describe());
  rig.ctl->on_step(t, true);  // staged
  ASSERT_EQ(rig.process.leased.size(), 2u);

  // A member of the running plan is born in the next step and still lives at the mark.
  const uint64_t at = rig.run_step(t);
  const auto member = std::find_if(running.members.begin(), running.members.end(),
                                   [](const MemberPlan& m) { return m.sub == 0; });
  ASSERT_NE(member, running.members.end());
  uint64_t tag = 0;
  ASSERT_NE(rig.ex.place(member->bytes, t.launches.at(0).stream, at + member->pos, &tag), 0u);
  ASSERT_FALSE(rig.ex.idle());

  rig.ctl->at_mark();
  EXPECT_EQ(rig.ex.stats().installs, 1u);
  EXPECT_EQ(rig.ex.stats().plan, running.describe());
  EXPECT_EQ(rig.ctl->report().pool_refined, 0u);
  rig.ctl->on_step(t, true);  // the worker drops the staged plan
  EXPECT_EQ(rig.process.released, std::vector<uint64_t>{rig.process.leased[1]});
  EXPECT_EQ(rig.ctl->report().host_bytes, rig.process.leased[0]);
  EXPECT_EQ(rig.ex.stats().installs, 1u);
}

TEST(PlanController, RevisesATimedPlanWhoseStepsKeepRunningSlowerThanPredicted) {
  const StepTrace t = recorded_step("reference");
  StepTrace slow = t;  // the same launches, each three times as long on the GPU
  for (TraceLaunch& l : slow.launches) {
    if (l.gpu_start_ns > 0) l.gpu_start_ns *= 3;
    if (l.gpu_ns > 0) l.gpu_ns *= 3;
  }
  Rig rig(kReferenceHalf, true);
  rig.ctl->on_step(t, true);
  rig.ctl->on_step(t, true);
  ASSERT_TRUE(rig.ex.installed());
  const int64_t predicted = rig.ctl->report().predicted.step_ns;
  ASSERT_LT(gpu_timeline(t).total, predicted);
  ASSERT_GT(gpu_timeline(slow).total, predicted + predicted / 10);

  for (int step = 0; step < 6; ++step) rig.ctl->on_step(t, true);  // within the prediction: kept
  for (int step = 0; step < 2; ++step) rig.ctl->on_step(slow, true);
  EXPECT_EQ(rig.ctl->report().revisions, 0u) << "two slow steps are not enough";
  EXPECT_EQ(rig.ex.stats().installs, 1u);

  rig.ctl->on_step(slow, true);  // the third in a row: retired, and planned again from it
  const PlanController::Report r = rig.ctl->report();
  EXPECT_EQ(r.revisions, 1u);
  EXPECT_EQ(rig.ex.stats().installs, 2u);
  EXPECT_FALSE(rig.ex.deviated());
  EXPECT_EQ(rig.process.planned_steps.size(), 2u);
  // No boundary of the step is later than the rest: the link as a whole is taken to be slower,
  // by what PlanWatch measured, and the new plan is made for it.
  EXPECT_TRUE(r.link.late_at.empty());
  const double measured = static_cast<double>(gpu_timeline(slow).total);
  EXPECT_DOUBLE_EQ(r.link_scale, std::clamp(static_cast<double>(predicted) / measured, 0.5, 0.9));
  EXPECT_EQ(r.link.scale, r.link_scale);
}

}  // namespace
}  // namespace offload

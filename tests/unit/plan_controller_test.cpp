// PlanController on the simulated driver: a plan made from a recorded step, installed in the
// executor with the host memory the pool leased; made again once a deviation retires it.
#include "plan_controller.h"

#include <gtest/gtest.h>

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
  bool pin(const std::function<bool(void*, uint64_t)>&) override { return true; }

 private:
  std::vector<unsigned char> buf_ = std::vector<unsigned char>(4096);
};

struct Rig {
  SimDriver drv;
  Executor ex{drv, Executor::Options{}};
  Settings settings;
  BlockCache cache;
  FakeProcess process;
  std::optional<PlanController> ctl;

  explicit Rig(uint64_t budget) {
    drv.set_device_total_bytes(80ull << 30);
    settings.device_budget = budget;
    settings.builtin_plan = true;  // the built-in plan: deterministic, and what build_plan gives below
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
};

constexpr uint64_t kReferenceHalf = 13723762688;  // half the reference step's footprint on the GPU

TEST(PlanController, PlansFromARepeatedStepAndInstallsWhatThePoolLeased) {
  const StepTrace t = recorded_step("reference");
  Rig rig(kReferenceHalf);
  const Plan want = rig.expected(t);

  rig.ctl->on_step(t, false);  // the first step seen: nothing to compare it with
  EXPECT_FALSE(rig.ex.installed());
  EXPECT_TRUE(rig.process.leased.empty());

  rig.ctl->on_step(t, false);  // it repeats: planned, leased, installed
  ASSERT_TRUE(rig.ex.installed());
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

}  // namespace
}  // namespace offload

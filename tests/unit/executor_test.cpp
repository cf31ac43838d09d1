// The executor end to end on the simulated driver: a synthetic training step (a forward
// that saves activations, a backward that reads them back, an optimizer step) runs through
// the tracker, the step assembler, the built-in planner and the executor, on a simulated
// GPU that runs work later than it is queued, delays copies and unmaps evicted ranges. The
// weights and losses after N steps must be byte-identical to the same program without the
// executor. executor_random_test.cpp runs random programs and plans on the same rig, and
// shows with fault injection that the harness notices a missing wait.
#include <gtest/gtest.h>

#include <optional>

#include <cstring>
#include <iostream>
#include <vector>

#include "executor_rig.h"

namespace offload {
namespace {

using rig::mix;
using rig::words;

struct Config {
  uint32_t layers = 8;
  uint32_t steps = 8;
  uint64_t seed = 1;
  bool offload = true;
  bool copy_delay = true;
  uint32_t gpu_ops_per_launch = 2;  // how far the simulated GPU may run behind
  bool second_stream_backward = false;
  uint64_t budget = 0;
  uint64_t host_chunk = 0, host_phase = 0;  // pinned-chunk layout of the host memory
  uint32_t retire_at = UINT32_MAX;  // the plan is retired (a revision) before this step
  uint32_t swap_at = UINT32_MAX;    // a plan of other arenas goes in at this step's mark
  // The allocator's pool as a trim sees it (SimDriver::set_pool); 0: not modelled.
  uint64_t pool_reserved = 0, pool_in_use = 0;
  bool capturing = false;  // the compute stream says it captures a graph (SimDriver::set_capturing)
  // At each step's mark, as the runtime does: the first step's trim taken (take_first_step_trim),
  // after the GPU has caught up.
  bool trim_at_marks = false;
  Executor::Options exec{};
};

struct Outcome {
  std::vector<uint64_t> weights, losses;
  ExecutorStats stats;
  bool installed = false;
  // At the end of the step a plan was retired in, once the GPU has caught up: the handles the
  // executor still holds, and the bytes of them, and the plans installed until then.
  ExecutorStats at_retired_step_end;
  uint64_t installs_at_retire = 0, installs_at_retired_step_end = 0;
  // Before the plan put in at a mark, and whether it went in.
  ExecutorStats before_swap;
  bool swapped = false;
  std::string swap_why;
  SimDriver::PoolTrims pool_trims;
  uint64_t pool_reserved_after = 0;
  Executor::TrimView view;  // of the plan installed at the end
  uint32_t mark_trims = 0;      // trim_at_marks: first-step trims taken at a mark
  uint64_t mark_trim_keep = 0;  // and the bytes the last one kept
};

rig::Options rig_options(const Config& c) {
  rig::Options o;
  o.seed = c.seed;
  o.offload = c.offload;
  o.copy_delay = c.copy_delay;
  o.gpu_ops_min = o.gpu_ops_max = c.gpu_ops_per_launch;
  o.host_chunk = c.host_chunk;
  o.host_phase = c.host_phase;
  o.exec = c.exec;
  return o;
}

// A fixed training loop: L layers of one activation each, a forward temporary per layer,
// the backward on the compute stream or a second one.
class TrainLoop {
 public:
  explicit TrainLoop(const Config& c) : c_(c), r_(rig_options(c)) {
    r_.set_planner([budget = c.budget](const StepTrace& t, rig::Rig& r) {
      PlanOptions o;
      o.granularity = r.sim().vmm_granularity();
      o.budget = budget;
      o.segments = 4;
      std::string why;
      Plan p = build_plan(t, o, &why);
      EXPECT_FALSE(p.arenas.empty()) << why;
      return p;
    });
    fwd_ = r_.add_kernel("fwd", 4);
    tmp_ = r_.add_kernel("tmp", 2);
    loss_ = r_.add_kernel("loss", 3);
    bwd_ = r_.add_kernel("bwd", 3);
    opt_ = r_.add_kernel("opt", 3);
    fill_ = r_.add_kernel("fill", 2);
  }

  Outcome run() {
    const uint32_t L = c_.layers;
    DevPtr w = r_.alloc(8 * L, kCompute);
    DevPtr losses = r_.alloc(8 * c_.steps, kCompute);
    r_.kernel(fill_, kCompute, {w, 8 * L}, [=] {
      for (uint32_t i = 0; i < L; ++i) words(w)[i] = mix(i + 1);
    });
    const uint64_t nsteps = c_.steps;
    r_.kernel(fill_, kCompute, {losses, 8 * nsteps}, [=] { std::memset(words(losses), 0, 8 * nsteps); });
    if (c_.pool_reserved) r_.sim().set_pool(c_.pool_reserved, c_.pool_in_use);
    if (c_.capturing) r_.sim().set_capturing(kCompute, true);
    Outcome o;
    for (uint32_t s = 0; s < c_.steps; ++s) {
      if (s == c_.retire_at) {
        o.installs_at_retire = r_.installs();
        r_.executor().retire("a revision");
      }
      step(s, w, losses);
      if (c_.trim_at_marks)
        if (const std::optional<uint64_t> keep = r_.executor().take_first_step_trim()) {
          r_.sim().run_all();
          if (r_.sim().pool_trim(*keep)) ++o.mark_trims;
          o.mark_trim_keep = *keep;
        }
      if (s == c_.swap_at && r_.executor().installed()) {
        o.before_swap = r_.executor().stats();
        PlanOptions po;
        po.granularity = r_.sim().vmm_granularity();
        po.budget = c_.budget;
        po.segments = 2;  // other arenas, of another size: the executor's geometry changes
        std::string why;
        Plan p = build_plan(r_.planned_from(), po, &why);
        EXPECT_FALSE(p.arenas.empty()) << why;
        o.swapped = r_.install_at_mark(std::move(p), &o.swap_why);
      }
      if (s == c_.retire_at) {
        r_.finish();
        o.at_retired_step_end = r_.executor().stats();
        o.installs_at_retired_step_end = r_.installs();
      }
    }
    r_.finish();
    o.weights.assign(words(w), words(w) + L);
    o.losses.assign(words(losses), words(losses) + c_.steps);
    o.stats = r_.executor().stats();
    o.installed = r_.executor().installed();
    o.pool_trims = r_.sim().pool_trims();
    o.pool_reserved_after = r_.sim().pool_reserved_current();
    o.view = r_.executor().trim_view();
    return o;
  }

 private:
  static constexpr Stream kCompute = 0x7, kBackward = 0x8;

  uint64_t act_bytes(uint32_t l) const { return (64u << 10) * (1 + (l * 7 + c_.seed) % 5); }

  void step(uint32_t s, DevPtr w, DevPtr losses) {
    const uint32_t L = c_.layers;
    DevPtr x = r_.alloc(64 << 10, kCompute);
    r_.kernel(fill_, kCompute, {x, 64 << 10}, [=] {
      for (uint64_t i = 0; i < (64 << 10) / 8; ++i) words(x)[i] = mix(s * 1000003 + i);
    });
    std::vector<DevPtr> acts(L);
    DevPtr prev = x;
    uint64_t prev_bytes = 64 << 10;
    for (uint32_t l = 0; l < L; ++l) {
      uint64_t n = act_bytes(l);
      acts[l] = r_.alloc(n, kCompute);
      DevPtr a = acts[l];
      r_.kernel(fwd_, kCompute, {prev, a, w, n}, [=] {
        uint64_t wl = words(w)[l], np = prev_bytes / 8;
        for (uint64_t i = 0; i < n / 8; ++i) words(a)[i] = mix(words(prev)[i % np] ^ wl ^ i);
      });
      DevPtr t = r_.alloc(4096, kCompute);  // a forward temporary: never a candidate
      r_.kernel(tmp_, kCompute, {t, a}, [=] { words(t)[0] = words(a)[0]; });
      r_.free(t, kCompute);
      prev = a;
      prev_bytes = n;
    }
    DevPtr last = acts[L - 1];
    uint64_t last_n = act_bytes(L - 1);
    r_.kernel(loss_, kCompute, {last, losses, s}, [=] {
      uint64_t sum = 0;
      for (uint64_t i = 0; i < last_n / 8; ++i) sum += words(last)[i];
      words(losses)[s] = sum;
    });
    r_.free(x, kCompute);
    Stream bs = c_.second_stream_backward ? kBackward : kCompute;
    if (bs != kCompute) r_.join(kCompute, bs);  // the backward starts after the forward, as autograd orders it
    DevPtr g = r_.alloc(8 * L, bs);
    for (uint32_t l = L; l-- > 0;) {
      DevPtr a = acts[l];
      uint64_t n = act_bytes(l);
      r_.kernel(bwd_, bs, {a, g, l}, [=] {
        uint64_t h = 0;
        for (uint64_t i = 0; i < n / 8; ++i) h = mix(h ^ words(a)[i]);
        words(g)[l] = h;
      });
      r_.free(a, bs);
    }
    if (bs != kCompute) r_.join(bs, kCompute);
    r_.kernel(opt_, kCompute, {g, w, L}, [=] {
      for (uint32_t l = 0; l < L; ++l) words(w)[l] = mix(words(w)[l] + words(g)[l]);
    });
    r_.free(g, kCompute);
    r_.end_step();
  }

  Config c_;
  rig::Rig r_;
  Func fwd_, tmp_, loss_, bwd_, opt_, fill_;
};

Outcome run(Config c) { return TrainLoop(c).run(); }

TEST(Executor, OffloadedStepsMatchThePlainRunByteForByte) {
  Config c;
  Outcome plain = run([&] { Config p = c; p.offload = false; return p; }());
  Outcome off = run(c);
  ASSERT_TRUE(off.installed);
  EXPECT_EQ(off.weights, plain.weights);
  EXPECT_EQ(off.losses, plain.losses);
  EXPECT_GT(off.stats.evictions, 0u);
  EXPECT_GT(off.stats.reloads, 0u);
  EXPECT_EQ(off.stats.misses, 0u);
  EXPECT_EQ(off.stats.deviations, 0u);
  EXPECT_GT(off.stats.steps_active, 2u);
  std::cout << "evictions " << off.stats.evictions << " reloads " << off.stats.reloads << " abandoned "
            << off.stats.evictions_abandoned << " placed " << off.stats.placed << " busy " << off.stats.arena_busy
            << " handles " << off.stats.handles_created << " waits " << off.stats.budget_waits << " plan "
            << off.stats.plan << "\n";
}

TEST(Executor, CopiesSplitAtPinnedChunkBoundaries) {
  Config c;
  c.host_chunk = 100 * 1024 + 8;  // not a divisor of anything the arenas hold
  c.host_phase = 12344;
  Outcome plain = run([&] { Config p = c; p.offload = false; return p; }());
  Outcome off = run(c);
  ASSERT_TRUE(off.installed);
  EXPECT_GT(off.stats.evictions, 0u);
  EXPECT_EQ(off.weights, plain.weights);
  EXPECT_EQ(off.losses, plain.losses);
}

TEST(Executor, ARetiredPlanGivesItsHandlesBackAndTheNextPlanMakesItsOwn) {
  // Demand mode places nothing in an arena: a handle kept through it sits idle beside the pool
  // that now serves the whole step (on the H200: convnet with the block cache, revised, held
  // 8.26 GiB against plain's 5.62).
  Config c;
  c.steps = 12;
  c.retire_at = 5;
  Outcome plain = run([&] { Config p = c; p.offload = false; return p; }());
  Outcome off = run(c);
  ASSERT_EQ(off.installs_at_retire, 1u) << "planned before the retirement";
  const ExecutorStats& x = off.at_retired_step_end;
  EXPECT_EQ(x.deviations, 1u);
  EXPECT_GT(x.handles_created, 0u);
  EXPECT_EQ(x.held_bytes, 0u) << "every handle back to the device once the retired plan's arenas drained; created "
                              << x.handles_created << " released " << x.handles_released;
  EXPECT_EQ(x.handles_released, x.handles_created);
  // Planned again from the steps after it, with handles of its own, and byte-identical.
  ASSERT_TRUE(off.installed);
  EXPECT_EQ(off.stats.deviations, 1u);
  EXPECT_GT(off.stats.handles_created, x.handles_created);
  EXPECT_GT(off.stats.steps_active, x.steps_active);
  EXPECT_EQ(off.weights, plain.weights);
  EXPECT_EQ(off.losses, plain.losses);
}

TEST(Executor, APlanPutInAtAStepsMarkTakesOverWithNoStepInDemandMode) {
  // A plan made again for the allocator's measured factor goes in at a mark, where every arena is
  // empty once the GPU has caught up: the running plan is not retired first, so no step runs in
  // demand mode (whose pool would grow back to the step's whole peak).
  Config c;
  c.steps = 12;
  c.swap_at = 5;
  Outcome plain = run([&] { Config p = c; p.offload = false; return p; }());
  Outcome off = run(c);
  ASSERT_TRUE(off.swapped) << off.swap_why;
  const ExecutorStats& b = off.before_swap;
  EXPECT_EQ(b.installs, 1u);
  EXPECT_GT(b.evictions, 0u);
  ASSERT_TRUE(off.installed);
  EXPECT_EQ(off.stats.installs, 2u);
  EXPECT_EQ(off.stats.deviations, 0u) << "no demand mode";
  EXPECT_NE(off.stats.plan, b.plan) << "the second plan has arenas of its own";
  // Every step after the mark ran under the new plan, moving bytes, with nothing missed.
  EXPECT_EQ(off.stats.steps_active - b.steps_active, c.steps - 1 - c.swap_at);
  EXPECT_GT(off.stats.evictions, b.evictions);
  EXPECT_GT(off.stats.reloads, b.reloads);
  EXPECT_EQ(off.stats.misses, 0u);
  // The first plan's handles went back when the geometry changed.
  EXPECT_GE(off.stats.handles_released, b.handles_created);
  EXPECT_EQ(off.weights, plain.weights);
  EXPECT_EQ(off.losses, plain.losses);
}

TEST(Executor, AtAPlansFirstLaunchThePoolGoesDownToTheBudgetLessThePlansHandles) {
  // Steps without marks: what the steps before the plan reserved in the allocator's pool goes
  // back at the plan's first launch, before its first evictions create handles (on the H200,
  // convnet's pool stayed at plain's 5.62 GiB beside its handles through its first planned step:
  // 6.39 GiB against a 3.38 GiB budget).
  Config c;
  c.budget = 1 << 20;
  c.pool_reserved = 64 << 20;
  Outcome plain = run([&] { Config p = c; p.offload = false; return p; }());
  Outcome off = run(c);
  ASSERT_TRUE(off.installed);
  ASSERT_EQ(off.stats.installs, 1u);
  ASSERT_GT(off.stats.evictions, 0u);
  ASSERT_GT(off.view.budget, off.view.handle_bytes) << off.stats.plan;
  const uint64_t keep = off.view.budget - off.view.handle_bytes;
  EXPECT_EQ(off.stats.first_step_trims, 1u);
  EXPECT_EQ(off.pool_trims.calls, 1u) << "once per install";
  EXPECT_EQ(off.pool_trims.last_keep, keep);
  EXPECT_EQ(off.pool_reserved_after, keep);
  EXPECT_EQ(off.pool_trims.physical_at_last, 0u) << "before the plan's first handle";
  EXPECT_EQ(off.weights, plain.weights);
  EXPECT_EQ(off.losses, plain.losses);
  // A pool already within it is left alone; so is one the driver cannot trim.
  Config under = c;
  under.pool_reserved = keep;
  Outcome u = run(under);
  EXPECT_EQ(u.pool_trims.calls, 0u);
  EXPECT_EQ(u.stats.first_step_trims, 0u);
  Config unknown = c;
  unknown.pool_reserved = 0;
  EXPECT_EQ(run(unknown).stats.first_step_trims, 0u);
  // Nor while the launch's stream captures a graph.
  Config capturing = c;
  capturing.capturing = true;
  Outcome cap = run(capturing);
  EXPECT_EQ(cap.pool_trims.calls, 0u);
  EXPECT_EQ(cap.stats.first_step_trims, 0u);
}

TEST(Executor, APlansFirstStepTrimIsTakenOnceAtTheMarkAndNotAgainAtItsFirstLaunch) {
  // Marked steps: the runtime takes the trim at the mark before the plan's first step, after
  // the GPU has caught up; the first launch then leaves the pool alone. Once per install.
  Config c;
  c.budget = 1 << 20;
  c.pool_reserved = 64 << 20;
  c.trim_at_marks = true;
  Outcome plain = run([&] { Config p = c; p.offload = false; return p; }());
  Outcome off = run(c);
  ASSERT_TRUE(off.installed);
  ASSERT_EQ(off.stats.installs, 1u);
  ASSERT_GT(off.view.budget, off.view.handle_bytes) << off.stats.plan;
  EXPECT_EQ(off.mark_trims, 1u);
  EXPECT_EQ(off.mark_trim_keep, off.view.budget - off.view.handle_bytes);
  EXPECT_EQ(off.stats.first_step_trims, 0u) << "the first launch trimmed again";
  EXPECT_EQ(off.pool_trims.calls, 1u);
  EXPECT_EQ(off.pool_trims.physical_at_last, 0u) << "before the plan's first handle";
  EXPECT_EQ(off.weights, plain.weights);
  EXPECT_EQ(off.losses, plain.losses);
  // Retired and planned again: the new install's first step is trimmed once more, at its mark.
  Config again = c;
  again.retire_at = 4;
  again.pool_reserved = 64 << 20;
  Outcome r = run(again);
  EXPECT_GE(r.stats.installs, 2u);
  EXPECT_EQ(r.mark_trims, r.stats.installs);
  EXPECT_EQ(r.stats.first_step_trims, 0u);
}

}  // namespace
}  // namespace offload

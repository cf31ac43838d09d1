// The production planner's combined plan on the simulated driver: plan_step with
// PlannerOptions::persistent_min, at a budget that neither the activations alone nor the
// weights alone meet, returns the activation plan with weights added (plan_weights(t, g, o,
// &act)): arenas and weight windows in one Plan. The executor runs it, in a training loop
// whose weights are PersistentPool blocks (streamed) and whose activations come from the
// rig's caching pool (placed in arenas once the plan is in); weights and losses must be
// byte-identical to the same program run without the executor.
//
// The budget is found by the test: the trace of a step (the same for every seed: no GPU
// times, so every launch counts as 1 us in the planner) is planned at descending fractions
// of the plain footprint until plan_step returns arenas and windows together.
//
// Every case is a fixed seed: a failure names it (SCOPED_TRACE) and reruns alike.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "common/log.h"
#include "executor_rig.h"
#include "planner/planner.h"

#include "sanitizers.h"

namespace offload {
namespace {

using rig::hash_words;
using rig::mix;
using rig::words;

constexpr Stream kCompute = 0x7, kBackward = 0x8;
constexpr uint64_t kKiB = 1024;
constexpr uint64_t kWeightBytes = 512 * kKiB;     // every weight: the PersistentPool's
constexpr uint64_t kActBytes = 256 * kKiB;        // every activation: the caching pool's
constexpr uint64_t kPersistentMin = 384 * kKiB;   // between the two
constexpr uint64_t kMinBytes = 64 * kKiB;         // the planner's activation threshold
// Launches per layer and direction besides the one reading the weight (elementwise work on
// the activation in the forward, on the gradients in the backward): at 1 us a launch, a
// 512 KiB weight's copies (about 14 us out and 11 us back at the link's shared rates) fit
// between an early layer's forward and its backward.
constexpr uint32_t kExtra = 3;

#if defined(OFFLOAD_TEST_TSAN)
constexpr uint64_t kSeeds = 3;
#else
constexpr uint64_t kSeeds = 5;
#endif

struct QuietLog {
  QuietLog() { set_log_level("warn"); }
  ~QuietLog() { set_log_level("info"); }
};

struct Config {
  uint32_t layers = 8;
  uint32_t steps = 10;
  uint64_t seed = 1;
  bool offload = true;
  bool copy_delay = true;
  uint32_t gpu_ops_min = 1, gpu_ops_max = 4;
  size_t max_queued = 16;
  double host_sync = 0.3;
  bool second_stream_backward = false;
  // 0: the planner records the trace and installs nothing (the budget search); else
  // plan_step's budget.
  uint64_t budget = 0;
  // The driver places the weights' ranges around a gap, and the arenas' reservation in it:
  // the arenas lie between two weights, as a real driver's ranges may.
  bool arenas_between_weights = false;
};

// The first plan the rig got from plan_step.
struct FirstPlan {
  bool seen = false;
  size_t arenas = 0, weights = 0, windows = 0;
  bool meets_budget = false;
  uint64_t predicted_peak = 0, plain_peak = 0;
  uint64_t weight_bytes_mapped = 0;  // the bound on the streamed weights' mapped bytes
  uint64_t handle_bytes_total = 0;   // handles * handle_bytes
  uint64_t streamed_bytes = 0;       // the plan's weights' blocks
  uint64_t pooled_peak = 0;          // the pool's share as the plan counts it
  uint64_t trace_pooled = 0;         // the step's live peak less its persistent bytes
  std::string describe, why;
};

struct Outcome {
  std::vector<uint64_t> weights, losses;
  ExecutorStats stats;
  SimDriver::VmmStats vmm;
  bool installed = false;
  uint32_t evicted_at_end = 0, unreadable = 0;
  uint64_t max_physical = 0;  // the driver's VMM bytes, most after a launch from the plan's second step
  FirstPlan plan;
  std::optional<StepTrace> trace;  // the budget search's: the last step the rig assembled
  DevPtr arenas_at = 0;  // arenas_between_weights: the gap, once every placed range was reserved
};

PlannerOptions planner_options(uint64_t budget, uint64_t granularity) {
  PlannerOptions o;
  o.budget = budget;
  o.granularity = granularity;
  o.persistent_min = kPersistentMin;
  o.min_bytes = kMinBytes;
  return o;
}

rig::Options rig_options(const Config& c) { return rig::schedule_options(c, kPersistentMin); }

// L weights of 512 KiB (filled by a kernel before the first step). A step: the input, a
// forward where layer l reads all of weight l and the activation before it into activation l
// (then kExtra elementwise launches on activation l), a loss, a backward in reverse order (on
// the compute stream or a second one) where layer l reads all of weight l and activation l,
// frees the activation, and the optimizer rewrites every word of weight l (then kExtra
// launches on the gradients), and two launches that touch no weight.
//
// The optimizer runs per layer inside the backward (as an optimizer fused into the backward
// does), not as one launch over every weight after it: plan_weights counts the caching pool
// at its peak before every launch, so streaming lowers the predicted peak only by the
// weight bytes absent before *every* launch; after one launch touching every weight, all of
// them stay mapped until the first copy out ends (14 launches here), and no budget below the
// activations' own footprint would ever get a window (the budget search found none with a
// single optimizer launch at the end of the step).
class CombinedLoop {
 public:
  explicit CombinedLoop(const Config& c) : c_(c), r_(rig_options(c)) {
    r_.set_planner([this](const StepTrace& t, rig::Rig& r) {
      if (!c_.budget) {
        trace_ = t;
        return Plan{};
      }
      PlannerResult res = plan_step(t, planner_options(c_.budget, r.sim().vmm_granularity()));
      if (!first_.seen) {
        first_.seen = true;
        first_.arenas = res.plan.arenas.size();
        first_.weights = res.plan.weights.size();
        first_.windows = res.plan.windows.size();
        first_.meets_budget = res.plan.meets_budget;
        first_.predicted_peak = res.plan.predicted_peak;
        first_.plain_peak = res.plan.plain_peak;
        first_.describe = res.plan.describe();
        first_.why = res.why;
        first_.weight_bytes_mapped = res.plan.weight_bytes_mapped;
        first_.handle_bytes_total = uint64_t{res.plan.handles} * res.plan.handle_bytes;
        for (const WeightPlan& w : res.plan.weights) first_.streamed_bytes += round_up(w.bytes, r.sim().vmm_granularity());
        first_.pooled_peak = res.plan.pooled_peak;
        first_.trace_pooled = pooled_live_peak(t, kPersistentMin);
      }
      return std::move(res.plan);
    });
    fill_ = r_.add_kernel("fill", 2);
    fwd_ = r_.add_kernel("fwd", 4);
    act_ = r_.add_kernel("act", 3);
    loss_ = r_.add_kernel("loss", 3);
    bwd_ = r_.add_kernel("bwd", 4);
    grad_ = r_.add_kernel("grad", 3);
    opt_ = r_.add_kernel("opt", 3);
    norm_ = r_.add_kernel("norm", 3);
    log_ = r_.add_kernel("log", 3);
  }

  Outcome run() {
    const uint32_t L = c_.layers;
    Outcome o;
    if (c_.arenas_between_weights) place_ranges();
    w_.resize(L);
    for (uint32_t l = 0; l < L; ++l) {
      const uint64_t n = kWeightBytes;
      w_[l] = r_.alloc(n, kCompute);
      DevPtr w = w_[l];
      r_.kernel(fill_, kCompute, {w, n}, [=] {
        for (uint64_t i = 0; i < n / 8; ++i) words(w)[i] = mix((uint64_t{l} << 40) + i + 1);
      });
    }
    const uint64_t nlosses = c_.steps;
    losses_ = r_.alloc(8 * nlosses, kCompute);
    DevPtr losses = losses_;
    r_.kernel(fill_, kCompute, {losses, 8 * nlosses}, [=] { std::memset(words(losses), 0, 8 * nlosses); });
    norms_ = r_.alloc(8 * nlosses, kCompute);
    DevPtr norms = norms_;
    r_.kernel(fill_, kCompute, {norms, 8 * nlosses}, [=] { std::memset(words(norms), 0, 8 * nlosses); });
    for (uint32_t s = 0; s < c_.steps; ++s) step(s);
    r_.finish();
    o.stats = r_.executor().stats();
    // A weight whose window crosses into the next step is out after the last step: a pointer
    // query brings it back (as the application's reading it would).
    for (uint32_t l = 0; l < L; ++l)
      if (!r_.sim().is_mapped(w_[l])) {
        ++o.evicted_at_end;
        r_.executor().prepare_access(w_[l]);
      }
    r_.sim().run_all();
    for (uint32_t l = 0; l < L; ++l) {
      if (!r_.sim().is_mapped(w_[l])) {
        ++o.unreadable;
        continue;
      }
      o.weights.insert(o.weights.end(), words(w_[l]), words(w_[l]) + kWeightBytes / 8);
    }
    o.losses.assign(words(losses), words(losses) + nlosses);
    o.installed = r_.executor().installed();
    o.vmm = r_.sim().vmm_stats();
    o.max_physical = max_physical_;
    o.plan = first_;
    if (!c_.budget) o.trace = trace_;
    if (c_.arenas_between_weights) o.arenas_at = r_.sim().reserve_hints_left() == 0 ? gap_ : 0;
    return o;
  }

 private:
  // The weights' ranges (the PersistentPool reserves each at twice its size) in a free stretch
  // of address space, the first half below a gap of kGap and the rest above it; the next range
  // reserved after them (the plan's arenas) in the gap.
  static constexpr uint64_t kGap = 64ull << 20, kSlot = 2 * kWeightBytes;
  void place_ranges() {
    const uint64_t g = r_.sim().vmm_granularity(), span = c_.layers * kSlot + kGap + g;
    void* probe = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    ASSERT_NE(probe, MAP_FAILED);
    munmap(probe, span);
    const DevPtr base = (reinterpret_cast<DevPtr>(probe) + g - 1) / g * g;
    std::vector<DevPtr> at;
    for (uint32_t l = 0; l < c_.layers; ++l) at.push_back(base + l * kSlot + (l >= c_.layers / 2 ? kGap : 0));
    gap_ = base + (c_.layers / 2) * kSlot;
    at.push_back(gap_);
    r_.sim().reserve_at(std::move(at));
  }

  // A launch of a step; from the plan's second step on (every weight has then been through
  // its windows once), the driver's physical VMM bytes (weights' blocks and arena handles)
  // after it are sampled. (Physical bytes, not mapped ranges: a reload may take the handle of
  // a weight still being copied out, whose range stays mapped until its copy ends.)
  void launch(Func f, Stream st, std::vector<uint64_t> args, std::function<void()> body) {
    r_.kernel(f, st, std::move(args), std::move(body));
    if (active_steps_ >= 2) max_physical_ = std::max(max_physical_, r_.sim().vmm_stats().physical_bytes);
  }

  void step(uint32_t s) {
    const uint32_t L = c_.layers;
    if (r_.plan_runs_at(r_.tracker().launches())) ++active_steps_;
    const uint64_t xn = kActBytes;
    DevPtr x = r_.alloc(xn, kCompute);
    launch(fill_, kCompute, {x, xn}, [=] {
      for (uint64_t i = 0; i < xn / 8; ++i) words(x)[i] = mix(s * 1000003 + i);
    });
    std::vector<DevPtr> acts(L);
    DevPtr prev = x;
    for (uint32_t l = 0; l < L; ++l) {
      const uint64_t n = kActBytes, wn = kWeightBytes / 8;
      acts[l] = r_.alloc(n, kCompute);
      DevPtr a = acts[l], w = w_[l];
      launch(fwd_, kCompute, {prev, a, w, n}, [=] {
        const uint64_t h = hash_words(w, 0, wn);
        for (uint64_t i = 0; i < n / 8; ++i) words(a)[i] = mix(words(prev)[i] ^ h ^ i);
      });
      for (uint32_t k = 0; k < kExtra; ++k)
        launch(act_, kCompute, {a, n, k}, [=] {
          for (uint64_t i = 0; i < n / 8; i += 1 + k) words(a)[i] = mix(words(a)[i] + k);
        });
      prev = a;
    }
    DevPtr last = acts[L - 1], losses = losses_;
    launch(loss_, kCompute, {last, losses, s}, [=] {
      uint64_t sum = 0;
      for (uint64_t i = 0; i < kActBytes / 8; ++i) sum += words(last)[i];
      words(losses)[s] = sum;
    });
    r_.free(x, kCompute);
    const Stream bs = c_.second_stream_backward ? kBackward : kCompute;
    if (bs != kCompute) r_.join(kCompute, bs);  // the backward starts after the forward
    DevPtr g = r_.alloc(8 * L, bs);
    for (uint32_t l = L; l-- > 0;) {
      const uint64_t n = kActBytes, wn = kWeightBytes / 8;
      DevPtr a = acts[l], w = w_[l];
      launch(bwd_, bs, {a, g, w, l}, [=] {
        words(g)[l] = mix(hash_words(a, 0, n / 8) ^ hash_words(w, 0, wn));
      });
      r_.free(a, bs);
      launch(opt_, bs, {w, g, l}, [=] {
        for (uint64_t i = 0; i < wn; ++i) words(w)[i] = mix(words(w)[i] + words(g)[l] + i);
      });
      for (uint32_t k = 0; k < kExtra; ++k)
        launch(grad_, bs, {g, l, k}, [=] { words(g)[l] = mix(words(g)[l] + k + 1); });
    }
    if (bs != kCompute) r_.join(bs, kCompute);
    DevPtr norms = norms_;
    launch(norm_, kCompute, {g, norms, s}, [=] { words(norms)[s] = hash_words(g, 0, L); });
    r_.free(g, kCompute);
    launch(log_, kCompute, {losses, norms, s}, [=] { words(losses)[s] ^= mix(words(norms)[s]); });
    r_.end_step();
  }

  Config c_;
  rig::Rig r_;
  Func fill_, fwd_, act_, loss_, bwd_, grad_, opt_, norm_, log_;
  std::vector<DevPtr> w_;
  DevPtr losses_ = 0, norms_ = 0;
  uint64_t max_physical_ = 0;
  uint32_t active_steps_ = 0;
  FirstPlan first_;
  std::optional<StepTrace> trace_;
  DevPtr gap_ = 0;
};

Outcome run(const Config& c) { return CombinedLoop(c).run(); }
Outcome run_plain(Config c) {
  c.offload = false;
  return run(c);
}

std::string kib(uint64_t b) { return std::to_string(b >> 10) + " KiB"; }

// The budget search: a step's trace (offload on, nothing installed), planned at descending
// fractions of the plain footprint; the first (largest) budget at which plan_step returns
// arenas and windows that meet it. The footprints the planner predicts on the way go to the
// log, and into the failure message when no budget gives a combined plan.
struct Search {
  uint64_t budget = 0;
  uint64_t plain_footprint = 0;
  // At that budget: what the activations alone and the weights alone predict (both over it,
  // or plan_step would have returned that plan), and the combined plan in KiB.
  uint64_t activations_alone = 0, weights_alone = 0;
  bool weights_alone_meet = true;
  std::string table, plan_kib;
};

Search find_budget(Config c) {
  c.budget = 0;
  c.steps = 3;
  const Outcome rec = run(c);
  Search s;
  if (!rec.trace) {
    s.table = "no step was assembled";
    return s;
  }
  const StepTrace& t = *rec.trace;
  // The rig's granularity (rig::Options' default).
  const uint64_t gran = rig::Options{}.granularity;
  const PlannerResult plain = plan_step(t, planner_options(0, gran));
  s.plain_footprint = plain.plain_footprint;
  s.table = "launches " + std::to_string(t.launches.size()) + ", plain footprint " + kib(s.plain_footprint) + "\n";
  for (int pct = 99; pct >= 20; --pct) {
    const uint64_t budget = s.plain_footprint * static_cast<uint64_t>(pct) / 100;
    const PlannerOptions o = planner_options(budget, gran);
    const PlannerResult r = plan_step(t, o);
    // What each part alone predicts, for the report.
    PlannerOptions act_only = o;
    act_only.persistent_min = 0;
    const PlannerResult a = plan_step(t, act_only);
    const PlannerResult w = plan_weights(t, gpu_timeline(t), o);
    s.table += "  " + std::to_string(pct) + "% = " + kib(budget) + ": activations alone " +
               kib(a.prediction.peak_bytes) + " (" + std::to_string(a.plan.arenas.size()) + " arenas), weights alone " +
               kib(w.plan.predicted_peak) + " (" + std::to_string(w.plan.windows.size()) + " windows); plan_step: " +
               std::to_string(r.plan.arenas.size()) + " arenas, " + std::to_string(r.plan.windows.size()) +
               " windows, predicted " + kib(r.plan.predicted_peak) + (r.plan.meets_budget ? "" : " NOT met") + "\n";
    if (!r.plan.arenas.empty() && !r.plan.windows.empty() && r.plan.meets_budget) {
      s.budget = budget;
      s.activations_alone = a.prediction.peak_bytes;
      s.weights_alone = w.plan.predicted_peak;
      s.weights_alone_meet = w.plan.meets_budget;
      const Plan& p = r.plan;
      uint64_t moved = 0, wb = 0;
      for (const ArenaPlan& x : p.arenas) moved += x.used;
      for (const WeightPlan& x : p.weights) wb += x.bytes;
      s.plan_kib = std::to_string(p.arenas.size()) + " arenas (" + kib(moved) + " moved of " + kib(p.candidate_bytes) +
                   "), " + std::to_string(p.handles) + " handles of " + kib(p.handle_bytes) + "; " +
                   std::to_string(p.weights.size()) + " weights (" + kib(wb) + "), " + std::to_string(p.windows.size()) +
                   " windows, at most " + kib(p.weight_bytes_mapped) + " mapped; peak " + kib(p.plain_peak) +
                   " -> predicted " + kib(p.predicted_peak) + " (budget " + kib(budget) + ")";
      break;
    }
  }
  return s;
}

std::string describe(const Outcome& o) {
  const ExecutorStats& s = o.stats;
  return "arenas: evictions " + std::to_string(s.evictions) + " (abandoned " + std::to_string(s.evictions_abandoned) +
         ") reloads " + std::to_string(s.reloads) + " conservative " + std::to_string(s.conservative) + " misses " +
         std::to_string(s.misses) + " late " + std::to_string(s.late_reloads) + " placed " + std::to_string(s.placed) +
         " busy " + std::to_string(s.arena_busy) + " no_handle " + std::to_string(s.no_handle) + "; weights: evictions " +
         std::to_string(s.weight_evictions) + " reloads " + std::to_string(s.weight_reloads) + " misses " +
         std::to_string(s.weight_misses) + " abandoned " + std::to_string(s.weight_abandoned) + " waits " +
         std::to_string(s.weight_waits) + " over_bound " + std::to_string(s.weight_over_bound) + " mapped_peak " + kib(s.weight_mapped_peak) + "; deviations " +
         std::to_string(s.deviations) + " steps_active " + std::to_string(s.steps_active) + "; from the second planned step: VMM bytes at most " + kib(o.max_physical) + "; out after the run " + std::to_string(o.evicted_at_end);
}

void run_seeds(const Config& base) {
  QuietLog quiet;
  const Search found = find_budget(base);
  ASSERT_NE(found.budget, 0u) << "no budget gives plan_step's combined plan (arenas and windows):\n" << found.table;
  std::cout << "budget " << kib(found.budget) << " of a plain footprint of " << kib(found.plain_footprint)
            << ": activations alone " << kib(found.activations_alone) << ", weights alone " << kib(found.weights_alone)
            << "; plan " << found.plan_kib << "\n";
  // Neither part alone meets it: the combined plan is the only one that does.
  EXPECT_GT(found.activations_alone, found.budget);
  EXPECT_FALSE(found.weights_alone_meet);
  EXPECT_GT(found.weights_alone, found.budget);
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Config c = base;
    c.seed = seed;
    c.budget = found.budget;
    const Outcome plain = run_plain(c);
    const Outcome off = run(c);
    // The plan the rig got is the combined one.
    ASSERT_TRUE(off.plan.seen) << "the rig never planned";
    EXPECT_GT(off.plan.arenas, 0u) << off.plan.describe << " (" << off.plan.why << ")";
    EXPECT_GT(off.plan.windows, 0u) << off.plan.describe << " (" << off.plan.why << ")";
    EXPECT_TRUE(off.plan.meets_budget) << off.plan.describe;
    // The pool's share the runtime's pool watch compares with: the activations the arenas do
    // not take, so above 0 and below the step's live bytes outside the shim's own ranges.
    EXPECT_GT(off.plan.pooled_peak, 0u);
    EXPECT_LT(off.plan.pooled_peak, off.plan.trace_pooled);
    if (seed == 1) std::cout << "plan: " << off.plan.describe << "\n";
    if (c.arenas_between_weights) {
      EXPECT_NE(off.arenas_at, 0u) << "the arenas were not reserved between the weights";
    }
    // The same bytes.
    EXPECT_TRUE(off.installed);
    EXPECT_EQ(off.unreadable, 0u) << "a weight is still unmapped after a pointer query";
    EXPECT_EQ(off.weights.size(), plain.weights.size());
    EXPECT_TRUE(off.weights == plain.weights) << "the weights differ from the plain run's";
    EXPECT_EQ(off.losses, plain.losses);
    EXPECT_EQ(off.vmm.misuses, 0u);
    // Both kinds moved, nothing missed, the plan ran to the end.
    EXPECT_GT(off.stats.evictions, 0u) << describe(off);
    EXPECT_GT(off.stats.reloads, 0u) << describe(off);
    EXPECT_GT(off.stats.weight_evictions, 0u) << describe(off);
    EXPECT_GT(off.stats.weight_reloads, 0u) << describe(off);
    EXPECT_EQ(off.stats.misses, 0u) << describe(off);
    EXPECT_EQ(off.stats.weight_misses, 0u) << describe(off);
    EXPECT_EQ(off.stats.deviations, 0u) << describe(off);
    EXPECT_GT(off.stats.steps_active, 2u) << describe(off);
    // The memory the plan counted on is free: once every weight has been through its windows,
    // the driver's VMM memory (every weight's block, the arena handles) stays within what the
    // plan predicts for it: the weights not streamed, the streamed ones' bound, the handles.
    const uint64_t weights_vmm = uint64_t{c.layers} * kWeightBytes;
    EXPECT_LE(off.max_physical, weights_vmm - off.plan.streamed_bytes + off.plan.weight_bytes_mapped +
                                    off.plan.handle_bytes_total)
        << describe(off);
    std::cout << "seed " << seed << ": " << describe(off) << "\n";
  }
}

// 1. The backward on the compute stream; the GPU keeps up on the whole (a run of it now and
// then empties the queues), so that copies out, which run only when nothing else can, finish
// inside their windows.
TEST(CombinedPlan, ArenasAndWeightsTogetherMatchThePlainRunByteForByte) { run_seeds(Config{}); }

// 2. The backward on a second stream: arena reloads and weight reloads consumed there, their
// evictions after uses there.
TEST(CombinedPlan, BackwardOnASecondStreamMatchesThePlainRun) {
  Config c;
  c.second_stream_backward = true;
  run_seeds(c);
}

// 3. The host far ahead of the GPU (it never waits for it but when 32 ops are queued): last
// uses still queued when their evictions are issued, reloads issued long before the GPU gets
// there.
TEST(CombinedPlan, AGpuFarBehindTheHostStillMatches) {
  Config c;
  c.gpu_ops_min = 0;
  c.gpu_ops_max = 2;
  c.max_queued = 32;
  c.host_sync = 0;
  run_seeds(c);
}

// 4. The arenas' reservation between two weights' ranges: an arena member's free and a pointer
// query are the arenas', not the weights' (the executor's test of the weights' span once took
// every pointer in it for a weight's or the allocator's, and the free went to the allocator).
TEST(CombinedPlan, ArenasReservedBetweenTwoWeightsAreStillTheArenas) {
  Config c;
  c.arenas_between_weights = true;
  run_seeds(c);
}

}  // namespace
}  // namespace offload

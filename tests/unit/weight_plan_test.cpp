// plan_weights (planner/weight_plan.cpp) on synthetic steps: L layers, each with one
// weight born before the step that outlives it, used once in the forward (launch i) and once in
// the backward (launch 2L-1-i). check_weights() re-derives what a weight plan promises with its
// own walk over three steps (the middle one in steady state): the windows' positions, every
// reload's copy done before its use, the footprint and the streamed bytes mapped at every launch.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <cmath>
#include <fstream>
#include <sstream>
#include <random>
#include <string>
#include <vector>

#include "core/backing.h"
#include "planner/plan.h"
#include "planner/step_trace.h"
#include "expected_file.h"
#include "recorded_step.h"
#include "planner/planner.h"
#include "sanitizers.h"

namespace offload {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

struct LayerSpec {
  int layers = 16;
  std::vector<uint64_t> weight_bytes;  // per layer; empty: 64 MiB each
  std::vector<int64_t> dur;            // per launch (2L); empty: 4 ms each
  uint64_t act_bytes = 0;              // per layer, saved in the forward, freed in the backward
  uint64_t small_persistent = 8 * kMiB;  // outlives the step, under persistent_min: pooled
};

StepTrace layer_trace(const LayerSpec& s) {
  StepTrace t;
  const int L = s.layers, n = 2 * L;
  std::vector<uint32_t> w(static_cast<size_t>(L)), act(static_cast<size_t>(L), ~0u);
  auto alloc = [&](uint64_t bytes, int64_t born, int64_t freed) {
    TraceAlloc a;
    a.ordinal = static_cast<uint32_t>(t.allocs.size());
    a.bytes = bytes, a.alloc_pos = born, a.free_pos = freed;
    a.base = 0x7000'0000'0000ull + uint64_t{a.ordinal} * (1ull << 32);
    a.id = 1000 + a.ordinal;
    t.allocs.push_back(a);
    return a.ordinal;
  };
  const uint32_t small = alloc(s.small_persistent, -1, -1);
  for (int i = 0; i < L; ++i)
    w[static_cast<size_t>(i)] = alloc(s.weight_bytes.empty() ? 64 * kMiB : s.weight_bytes[static_cast<size_t>(i)], -1, -1);
  if (s.act_bytes)
    for (int i = 0; i < L; ++i) act[static_cast<size_t>(i)] = alloc(s.act_bytes, i, 2 * L - i);
  int64_t clock = 0;
  for (int p = 0; p < n; ++p) {
    TraceLaunch l;
    l.pos = static_cast<uint32_t>(p);
    l.kernel = static_cast<uint32_t>(p < L ? 1 : 2);
    l.gpu_start_ns = clock;
    l.gpu_ns = s.dur.empty() ? 4'000'000 : s.dur[static_cast<size_t>(p)];
    clock += l.gpu_ns;
    const int layer = p < L ? p : 2 * L - 1 - p;
    l.allocs = {w[static_cast<size_t>(layer)], small};
    if (s.act_bytes) l.allocs.push_back(act[static_cast<size_t>(layer)]);
    t.launches.push_back(l);
  }
  t.kernels = {{1, "forward"}, {2, "backward"}};
  t.gpu_busy_ns = clock;
  t.cupti_kernels = n;
  return t;
}

// `t` with every launch `factor` times as long (as dilated()): where a plan that waits keeps
// its promises.
StepTrace dilated_trace(const StepTrace& t, double factor) {
  StepTrace w = t;
  auto at = [&](int64_t x) { return static_cast<int64_t>(std::llround(static_cast<double>(x) * factor)); };
  for (TraceLaunch& l : w.launches) {
    const int64_t end = at(l.gpu_start_ns + l.gpu_ns);
    l.gpu_start_ns = at(l.gpu_start_ns);
    l.gpu_ns = end - l.gpu_start_ns;
  }
  return w;
}

PlannerOptions weight_options(uint64_t budget) {
  PlannerOptions o;
  o.budget = budget;
  o.persistent_min = 16 * kMiB;
  return o;
}

int64_t copy_ns(uint64_t bytes, double rate) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(static_cast<double>(bytes) / rate)));
}

// What the plan promises, walked independently over three steps (the middle one checked).
void check_weights(const StepTrace& t, const PlannerOptions& o, const Plan& p) {
  const int64_t n = static_cast<int64_t>(t.launches.size());
  std::vector<int64_t> start(static_cast<size_t>(n));
  for (int64_t q = 0; q < n; ++q) start[static_cast<size_t>(q)] = t.launches[static_cast<size_t>(q)].gpu_start_ns;
  const TraceLaunch& last = t.launches.back();
  const int64_t T = last.gpu_start_ns + last.gpu_ns;
  auto at = [&](int64_t q) { return start[static_cast<size_t>(q % n)] + (q / n) * T; };
  auto end_of = [&](int64_t q) { return q % n + 1 < n ? at(q + 1) : at(q) + last.gpu_ns; };
  auto first_from = [&](int64_t x) {
    int64_t q = 0;
    while (q < 4 * n && at(q) < x) ++q;
    return q;
  };
  ASSERT_EQ(p.step_launches, static_cast<uint64_t>(n));
  EXPECT_TRUE(p.arenas.empty());
  // Windows: sorted, inside their stretch, between uses of their weight.
  struct W {
    int64_t a, b, reload;  // unrolled: a in step 0, b and reload in step 0 or 1
    uint64_t bytes;
    uint32_t weight;
  };
  std::vector<W> ws;
  for (size_t i = 0; i < p.windows.size(); ++i) {
    const WeightWindow& x = p.windows[i];
    SCOPED_TRACE("window " + std::to_string(i));
    ASSERT_LT(x.weight, p.weights.size());
    if (i) {
      EXPECT_LE(p.windows[i - 1].evict_after, x.evict_after);
    }
    ASSERT_TRUE(x.evict_after >= 0 && x.evict_after < n && x.use >= 0 && x.use < n && x.reload_at >= 0 && x.reload_at < n);
    if (!x.wraps()) {
      EXPECT_LT(x.evict_after, x.reload_at);
      EXPECT_LE(x.reload_at, x.use);
      EXPECT_GT(x.use, x.evict_after + 1);
    } else {
      EXPECT_TRUE(x.reload_at > x.evict_after || x.reload_at <= x.use);
      EXPECT_NE(x.use + n, x.evict_after + 1);
    }
    const int64_t b = x.use + (x.wraps() ? n : 0), r = x.reload_at + (x.reload_at <= x.evict_after ? n : 0);
    EXPECT_LE(r, b);
    const WeightPlan& wp = p.weights[x.weight];
    const TraceAlloc& ta = t.allocs[wp.ordinal];
    EXPECT_EQ(wp.bytes, ta.bytes);
    EXPECT_EQ(wp.va, ta.base);
    EXPECT_EQ(wp.id, ta.id);
    EXPECT_TRUE(ta.alloc_pos < 0 && ta.free_pos < 0 && ta.bytes >= o.persistent_min);
    // The weight is used at both ends and nowhere in between.
    auto used = [&](int64_t q) {
      const auto& al = t.launches[static_cast<size_t>(q % n)].allocs;
      return std::find(al.begin(), al.end(), wp.ordinal) != al.end();
    };
    EXPECT_TRUE(used(x.evict_after));
    EXPECT_TRUE(used(b));
    for (int64_t q = x.evict_after + 1; q < b; ++q) EXPECT_FALSE(used(q)) << q;
    ws.push_back(W{x.evict_after, b, r, wp.bytes, x.weight});
  }
  // Host ranges: 4 KiB aligned, disjoint.
  for (size_t i = 0; i < p.weights.size(); ++i) {
    EXPECT_EQ(p.weights[i].host_offset % 4096, 0u);
    if (i) {
      EXPECT_GE(p.weights[i].host_offset, p.weights[i - 1].host_offset + p.weights[i - 1].bytes);
    }
  }
  // Copies out: FIFO from the end of the last use; steps 0..2.
  const double d2h = o.link.d2h_shared * o.link.scale, h2d = o.link.h2d_shared * o.link.scale;
  const size_t nw = ws.size();
  std::vector<int64_t> out_end(nw * 3);
  {
    std::vector<std::pair<int64_t, size_t>> q;
    for (int k = 0; k < 3; ++k)
      for (size_t i = 0; i < nw; ++i) q.push_back({end_of(ws[i].a) + k * T, k * nw + i});
    std::sort(q.begin(), q.end());
    int64_t free_at = 0;
    // A read-only weight copies nothing out: its "copy" ends once the FIFO reaches it.
    auto read_only = [&](size_t i) {
      return std::binary_search(o.read_only.begin(), o.read_only.end(), p.weights[ws[i].weight].ordinal);
    };
    for (auto [ready, j] : q)
      free_at = out_end[j] = std::max(ready, free_at) + (read_only(j % nw) ? 0 : copy_ns(ws[j % nw].bytes, d2h));
  }
  // Copies back: FIFO from the start of launch reload_at (not before the copy out ended), in
  // order of issue, the earlier use first among those issued at one launch.
  {
    std::vector<std::tuple<int64_t, int64_t, size_t>> q;
    for (int k = 0; k < 3; ++k)
      for (size_t i = 0; i < nw; ++i) q.push_back({at(ws[i].reload + k * n), ws[i].b + k * n, k * nw + i});
    std::sort(q.begin(), q.end());
    int64_t free_at = 0;
    for (auto [issued, use, j] : q) {
      EXPECT_GE(issued, out_end[j]) << "window " << j % nw << " reloaded before its copy out ends";
      free_at = std::max({issued, free_at, out_end[j]}) + copy_ns(ws[j % nw].bytes, h2d);
      if (j / nw == 1) {
        EXPECT_LE(free_at, at(use)) << "reload of window " << j % nw << " late for its use " << use;
      }
    }
  }
  // The middle step, launch by launch: a weight is absent from the first launch starting after
  // its copy out ends until reload_at.
  // A weight that streams counts in whole units of the executor's (weight_unit of the sizes of
  // those that may stream: persistent and used), when it is no multiple of one.
  std::vector<char> in_use(t.allocs.size(), 0);
  for (const TraceLaunch& l : t.launches)
    for (uint32_t a : l.allocs)
      if (a < in_use.size()) in_use[a] = 1;
  std::vector<uint64_t> sizes;
  for (const TraceAlloc& a : t.allocs)
    if (a.persistent(o.persistent_min) && in_use[a.ordinal]) sizes.push_back(round_up(a.bytes, o.granularity));
  const uint64_t unit = weight_unit(sizes);
  auto block = [&](uint64_t bytes) {
    const uint64_t g = round_up(bytes, o.granularity);
    return in_units(g, unit) ? round_up(g, unit) : g;
  };
  uint64_t persistent = 0, persistent_rounded = 0, streamed = 0;
  for (const TraceAlloc& a : t.allocs)
    if (a.persistent(o.persistent_min))
      persistent += a.bytes, persistent_rounded += in_use[a.ordinal] ? block(a.bytes) : round_up(a.bytes, o.granularity);
  for (const WeightPlan& wp : p.weights) streamed += wp.bytes;
  uint64_t most = 0, most_mapped = 0;
  // PyTorch's pool keeps its peak: the pooled bytes count at their most before every launch.
  int64_t pooled_peak = 0;
  for (int64_t q = 0; q < n; ++q) {
    int64_t live = 0;
    for (const TraceAlloc& a : t.allocs) {
      const bool born = a.alloc_pos < 0 || a.alloc_pos <= q, gone = a.free_pos >= 0 && a.free_pos <= q;
      if (born && !gone) live += static_cast<int64_t>(a.bytes);
    }
    pooled_peak = std::max(pooled_peak, live - static_cast<int64_t>(persistent));
  }
  for (int64_t q = n; q < 2 * n; ++q) {
    uint64_t absent = 0, absent_raw = 0;
    std::vector<char> gone(p.weights.size(), 0);
    for (int k = 0; k < 3; ++k)
      for (size_t i = 0; i < nw; ++i)
        if (first_from(out_end[k * nw + i]) <= q && q < ws[i].reload + k * n) {
          EXPECT_FALSE(gone[ws[i].weight]) << "two windows of weight " << ws[i].weight << " overlap at " << q - n;
          gone[ws[i].weight] = 1;
          absent += block(ws[i].bytes), absent_raw += ws[i].bytes;
        }
    const double pooled = static_cast<double>(pooled_peak) * o.pool_overhead;
    const uint64_t foot = static_cast<uint64_t>(pooled) + persistent_rounded - absent;
    most = std::max(most, foot);
    most_mapped = std::max(most_mapped, streamed - absent_raw);
    // The executor's bound before this launch covers the weights mapped here, in whole blocks.
    if (!p.windows.empty()) {
      ASSERT_EQ(p.weight_mapped_at.size(), static_cast<size_t>(n));
      uint64_t blocks = 0;
      for (const WeightPlan& wp : p.weights) blocks += block(wp.bytes);
      EXPECT_EQ(p.weight_mapped_at[static_cast<size_t>(q - n)], blocks - absent) << "launch " << q - n;
      EXPECT_LE(p.weight_mapped_at[static_cast<size_t>(q - n)], p.weight_bytes_mapped);
    }
  }
  if (p.meets_budget) {
    EXPECT_LE(most, p.budget);
  }
  EXPECT_NEAR(static_cast<double>(most), static_cast<double>(p.predicted_peak), 4096.0);
  if (!p.windows.empty()) {
    EXPECT_LE(most_mapped, p.weight_bytes_mapped);
  }
}

TEST(WeightPlan, StreamsLayerWeightsUnderTheBudget) {
  const StepTrace t = layer_trace(LayerSpec{});
  const PlannerOptions o = weight_options(400 * kMiB);
  const PlannerResult r = plan_weights(t, gpu_timeline(t), o);
  const Plan& p = r.plan;
  EXPECT_TRUE(p.meets_budget) << r.why << "; " << p.describe();
  EXPECT_LE(p.predicted_peak, o.budget);
  EXPECT_EQ(r.prediction.peak_bytes, p.predicted_peak);
  EXPECT_FALSE(p.windows.empty());
  EXPECT_GT(p.weight_bytes_mapped, 0u);
  EXPECT_EQ(p.predicted_step_ns, p.compute_ns);
  EXPECT_EQ(p.compute_ns, 128'000'000);
  EXPECT_GE(p.lower_bound_ns, p.compute_ns);
  EXPECT_GT(r.prediction.bytes_out, 0u);
  EXPECT_EQ(r.prediction.bytes_in, r.prediction.bytes_out);
  EXPECT_EQ(p.member_index.size(), p.step_launches + 1);
  EXPECT_NE(p.describe().find("weights streamed"), std::string::npos) << p.describe();
  EXPECT_GE(p.host_bytes(), p.weights.back().host_offset + p.weights.back().bytes);
  bool wraps = false;
  for (const WeightWindow& w : p.windows) wraps |= w.wraps();
  EXPECT_TRUE(wraps) << "the first layers' weights idle across the boundary";
  // Without arenas, the pool's share as the plan counts it is the one the runtime's pool watch
  // takes from a step (pooled_live_peak).
  EXPECT_GT(p.pooled_peak, 0u);
  EXPECT_EQ(p.pooled_peak, pooled_live_peak(t, o.persistent_min));
  check_weights(t, o, p);
}

TEST(WeightPlan, ABudgetAboveTheFootprintMovesNothing) {
  const StepTrace t = layer_trace(LayerSpec{});
  const PlannerResult r = plan_weights(t, gpu_timeline(t), weight_options(4ull << 30));
  EXPECT_TRUE(r.plan.windows.empty());
  EXPECT_TRUE(r.plan.weights.empty());
  EXPECT_TRUE(r.plan.meets_budget);
  EXPECT_TRUE(r.plan.empty());
  EXPECT_FALSE(r.why.empty());
}

TEST(WeightPlan, WithoutPersistentMinNoWeightStreams) {
  const StepTrace t = layer_trace(LayerSpec{});
  PlannerOptions o = weight_options(400 * kMiB);
  o.persistent_min = 0;
  const PlannerResult r = plan_weights(t, gpu_timeline(t), o);
  EXPECT_TRUE(r.plan.weights.empty());
  EXPECT_TRUE(r.plan.windows.empty());
  EXPECT_FALSE(r.why.empty());
  // And plan_step never streams one.
  EXPECT_TRUE(plan_step(t, o).plan.weights.empty());
}

TEST(WeightPlan, WindowsTooShortForTheLinkAreRejected) {
  const StepTrace t = layer_trace(LayerSpec{});
  PlannerOptions o = weight_options(400 * kMiB);
  o.link.scale = 1e-3;  // 64 MiB take over a second each way; the longest window is 120 ms
  const PlannerResult r = plan_weights(t, gpu_timeline(t), o);
  EXPECT_TRUE(r.plan.windows.empty());
  EXPECT_FALSE(r.plan.meets_budget);
  EXPECT_GT(r.plan.predicted_peak, o.budget);
  EXPECT_NE(r.why.find("too short"), std::string::npos) << r.why;
}

TEST(WeightPlan, ABusyLinkStreamsOnlyWhatFits) {
  // 2 ms launches: a copy out (1.8 ms) and back (1.4 ms) per launch in the forward and in the
  // backward leave the link little slack; whatever the planner keeps must still hold.
  LayerSpec s;
  s.dur.assign(32, 2'000'000);
  const StepTrace t = layer_trace(s);
  const PlannerOptions o = weight_options(300 * kMiB);
  const PlannerResult r = plan_weights(t, gpu_timeline(t), o);
  check_weights(t, o, r.plan);
}

// The same busy link with every weight marked read-only (offload_mark_read_only): no copy out
// takes the link, so more windows fit. At 160 MiB the plan cannot meet the budget unmarked
// (201 MiB at best when this was written) and does marked (137 MiB); it keeps its promises in
// the walk (which copies nothing out for them either) and predicts no bytes out.
TEST(WeightPlan, ReadOnlyWeightsCostNoCopyOut) {
  LayerSpec s;
  s.dur.assign(32, 2'000'000);
  const StepTrace t = layer_trace(s);
  PlannerOptions o = weight_options(160 * kMiB);
  const PlannerResult before = plan_weights(t, gpu_timeline(t), o);
  check_weights(t, o, before.plan);
  for (const TraceAlloc& a : t.allocs)
    if (a.persistent(o.persistent_min)) o.read_only.push_back(a.ordinal);
  ASSERT_FALSE(o.read_only.empty());
  const PlannerResult r = plan_weights(t, gpu_timeline(t), o);
  check_weights(t, o, r.plan);
  EXPECT_FALSE(before.plan.meets_budget) << (before.plan.predicted_peak >> 20) << " MiB";
  EXPECT_TRUE(r.plan.meets_budget) << (r.plan.predicted_peak >> 20) << " MiB";
  EXPECT_GT(r.plan.windows.size(), before.plan.windows.size());
  EXPECT_EQ(r.prediction.bytes_out, 0u);
  EXPECT_GT(r.prediction.bytes_in, 0u);
  EXPECT_GT(before.prediction.bytes_out, 0u);
}

TEST(WeightPlan, RandomStepsKeepTheirPromises) {
  std::mt19937_64 rng(7);
  int waits = 0;
  for (int c = 0; c < 40; ++c) {
    LayerSpec s;
    s.layers = 2 + static_cast<int>(rng() % 30);
    for (int i = 0; i < s.layers; ++i) s.weight_bytes.push_back((8 + rng() % 120) * kMiB + (rng() % 2) * 12345);
    for (int i = 0; i < 2 * s.layers; ++i) s.dur.push_back(200'000 + static_cast<int64_t>(rng() % 6'000'000));
    s.act_bytes = (rng() % 3) * 4 * kMiB;
    const StepTrace t = layer_trace(s);
    uint64_t total = 0;
    for (uint64_t b : s.weight_bytes) total += b;
    PlannerOptions o = weight_options(static_cast<uint64_t>(static_cast<double>(total) * (0.1 + 0.8 * (rng() % 100) / 100.0)));
    o.max_weight_stall = c % 2 ? 0.25 : 0.05;  // half the cases may wait a quarter of the step
    SCOPED_TRACE("case " + std::to_string(c) + ": " + std::to_string(s.layers) + " layers, budget " +
                 std::to_string(o.budget >> 20) + " MiB of " + std::to_string(total >> 20));
    const PlannerResult r = plan_weights(t, gpu_timeline(t), o);
    // A plan that waits keeps its promises on the timeline with its wait in it.
    check_weights(r.stall_ns ? dilated_trace(t, 1 + r.stall_share) : t, o, r.plan);
    if (!r.plan.meets_budget) {
      EXPECT_FALSE(r.why.empty());
      EXPECT_EQ(r.stall_ns, 0);
    }
    if (r.stall_ns) {
      EXPECT_TRUE(r.plan.meets_budget);
      EXPECT_LE(r.stall_ns, static_cast<int64_t>(o.max_weight_stall * static_cast<double>(r.plan.compute_ns)));
      EXPECT_EQ(r.plan.predicted_step_ns, r.plan.compute_ns + r.stall_ns);
      ++waits;
    }
  }
  EXPECT_GT(waits, 0) << "no case needed a wait: the property is not exercised";
}

// Where no plan whose copies hide meets the budget: the least planned wait (every launch longer
// by a share, up to max_weight_stall) that meets it. A forward of 1.2 ms launches against
// reloads of 64 MiB (read-only weights: no copy out) that take about 1.4 ms: hidden, the plan
// reaches 265 MiB; with the step waiting about 8%, 250 MiB.
TEST(WeightPlan, APlannedWaitMeetsABudgetTheHiddenCopiesMiss) {
  LayerSpec s;
  s.dur.assign(32, 2'000'000);
  for (int q = 0; q < 16; ++q) s.dur[static_cast<size_t>(q)] = 1'200'000;
  const StepTrace t = layer_trace(s);
  const int64_t compute = 16 * 1'200'000 + 16 * 2'000'000;
  PlannerOptions o = weight_options(250 * kMiB);
  for (const TraceAlloc& a : t.allocs)
    if (a.persistent(o.persistent_min)) o.read_only.push_back(a.ordinal);
  o.max_weight_stall = 0;
  const PlannerResult hidden = plan_weights(t, gpu_timeline(t), o);
  ASSERT_FALSE(hidden.plan.meets_budget) << (hidden.plan.predicted_peak >> 20) << " MiB";
  EXPECT_EQ(hidden.stall_ns, 0);
  EXPECT_GE(hidden.unmet_at, 0);
  EXPECT_EQ(hidden.plan.predicted_step_ns, compute);

  o.max_weight_stall = 0.10;
  const PlannerResult r = plan_weights(t, gpu_timeline(t), o);
  ASSERT_TRUE(r.plan.meets_budget) << r.why << "; " << (r.plan.predicted_peak >> 20) << " MiB";
  EXPECT_LE(r.plan.predicted_peak, o.budget);
  EXPECT_EQ(r.unmet_at, -1);
  EXPECT_GT(r.stall_share, 0.0);
  EXPECT_LE(r.stall_share, 0.10);
  EXPECT_NEAR(static_cast<double>(r.stall_ns), r.stall_share * static_cast<double>(compute), 2.0);
  // The compute is the trace's; the waits are in the predicted step alone.
  EXPECT_EQ(r.plan.compute_ns, compute);
  EXPECT_EQ(r.plan.predicted_step_ns, compute + r.stall_ns);
  EXPECT_EQ(r.plan.lower_bound_ns, std::max<int64_t>(compute, r.plan.lower_bound_ns));
  EXPECT_LT(r.plan.lower_bound_ns, r.plan.predicted_step_ns);
  EXPECT_GT(r.plan.windows.size(), hidden.plan.windows.size());
  // Every reload in time on the timeline that waits.
  check_weights(dilated_trace(t, 1 + r.stall_share), o, r.plan);
  // The least: 1/64 of the allowance less, and the budget is missed.
  o.max_weight_stall = 0;
  const PlannerResult less = plan_weights(t, dilated(gpu_timeline(t), 1 + r.stall_share - 0.1 / 64), o);
  EXPECT_FALSE(less.plan.meets_budget) << (less.plan.predicted_peak >> 20) << " MiB";
  // An allowance short of it: the plan that hides everything, said as not met, as before.
  o.max_weight_stall = 0.05;
  const PlannerResult small = plan_weights(t, gpu_timeline(t), o);
  EXPECT_FALSE(small.plan.meets_budget);
  EXPECT_EQ(small.stall_ns, 0);
  EXPECT_EQ(small.plan.windows.size(), hidden.plan.windows.size());
  EXPECT_EQ(small.plan.predicted_peak, hidden.plan.predicted_peak);
  // plan_step takes the plan that waits when nothing hidden meets the budget.
  o.max_weight_stall = 0.10;
  const PlannerResult stepped = plan_step(t, o);
  EXPECT_TRUE(stepped.plan.meets_budget);
  EXPECT_EQ(stepped.stall_ns, r.stall_ns);
  EXPECT_EQ(stepped.plan.windows.size(), r.plan.windows.size());
  o.max_weight_stall = 0;
  EXPECT_FALSE(plan_step(t, o).plan.meets_budget);
}

TEST(WeightPlan, PlanStepStreamsWeightsWhenActivationsCannotMeetTheBudget) {
  LayerSpec s;
  s.act_bytes = 1 * kMiB;  // 16 MiB of activations against 1 GiB of weights
  const StepTrace t = layer_trace(s);
  const PlannerOptions o = weight_options(400 * kMiB);
  PlannerOptions activations_only = o;
  activations_only.persistent_min = 0;
  const PlannerResult a = plan_step(t, activations_only);
  ASSERT_GT(a.prediction.peak_bytes, o.budget) << "activations alone must miss the budget";
  const PlannerResult r = plan_step(t, o);
  EXPECT_TRUE(r.plan.arenas.empty());
  EXPECT_FALSE(r.plan.windows.empty());
  EXPECT_TRUE(r.plan.meets_budget) << r.why;
  EXPECT_LE(r.prediction.peak_bytes, o.budget);
  check_weights(t, o, r.plan);
  // A budget activations meet alone keeps the activation plan.
  const PlannerResult easy = plan_step(t, weight_options(a.plain_footprint + kMiB));
  EXPECT_TRUE(easy.plan.windows.empty());
}

TEST(WeightPlan, PlanStepAddsWeightsToActivationsWhenNeitherMeetsTheBudgetAlone) {
  LayerSpec s;
  s.act_bytes = 64 * kMiB;  // 1 GiB of activations beside 1 GiB of weights
  const StepTrace t = layer_trace(s);
  const PlannerOptions o = weight_options(900 * kMiB);
  PlannerOptions activations_only = o;
  activations_only.persistent_min = 0;
  const PlannerResult a = plan_step(t, activations_only);
  ASSERT_GT(a.prediction.peak_bytes, o.budget) << "activations alone must miss the budget";
  const PlannerResult w = plan_weights(t, gpu_timeline(t), o);
  ASSERT_FALSE(w.plan.meets_budget) << "weights alone must miss the budget";
  const PlannerResult r = plan_step(t, o);
  EXPECT_FALSE(r.plan.arenas.empty());
  EXPECT_FALSE(r.plan.windows.empty());
  EXPECT_TRUE(r.plan.meets_budget) << r.why << "; " << r.plan.describe();
  EXPECT_LE(r.plan.predicted_peak, o.budget);
  EXPECT_LT(r.plan.predicted_peak, std::min(a.prediction.peak_bytes, w.plan.predicted_peak));
  // The weights' host bytes follow the arenas'; both directions count both kinds.
  uint64_t arena_host = 0, arena_bytes = 0;
  for (const ArenaPlan& ap : r.plan.arenas) arena_host = std::max(arena_host, ap.host_offset + ap.used), arena_bytes += ap.used;
  for (const WeightPlan& wp : r.plan.weights) EXPECT_GE(wp.host_offset, arena_host);
  EXPECT_GT(r.prediction.bytes_out, arena_bytes);
  EXPECT_GE(r.plan.predicted_step_ns, a.prediction.step_ns > 0 ? std::min(a.prediction.step_ns, r.plan.compute_ns) : 0);
  for (const WeightWindow& x : r.plan.windows) {
    if (x.wraps()) EXPECT_TRUE(x.reload_at > x.evict_after || x.reload_at <= x.use);
    else EXPECT_TRUE(x.evict_after < x.reload_at && x.reload_at <= x.use);
  }
}

// The lora workload's step as recorded on the H200 (tests/data/traces/lora.trace: 20.4 G frozen bf16
// parameters, 6929 launches, 4.2 s of GPU time), planned at 20 GiB with the shim's pool serving
// allocations of 64 MiB and more, as scripts/gpu/run.sh weights runs it. The plan keeps its
// promises in the independent walk, and matches the checked-in one (tests/data/plans/).
std::string serialize_weights(const Plan& p) {
  std::ostringstream s;
  s << "plan budget=" << p.budget << " meets_budget=" << (p.meets_budget ? 1 : 0) << " arenas=" << p.arenas.size()
    << " predicted_peak=" << p.predicted_peak << " weight_bytes_mapped=" << p.weight_bytes_mapped << "\n";
  for (const WeightPlan& w : p.weights) s << "weight ordinal=" << w.ordinal << " bytes=" << w.bytes << " host_offset=" << w.host_offset << "\n";
  for (const WeightWindow& w : p.windows)
    s << "window weight=" << w.weight << " evict_after=" << w.evict_after << " reload_at=" << w.reload_at << " use=" << w.use << "\n";
  return s.str();
}

TEST(WeightPlan, RecordedLoraStepStreamsUnderTwentyGiB) {
#if defined(OFFLOAD_TEST_TSAN)
  // One thread plans here: nothing for ThreadSanitizer to see, and 30 s of CI under it. The
  // plain and AddressSanitizer builds run it.
  GTEST_SKIP() << "single-threaded planning; run in the plain and ASan builds";
#endif
  const StepTrace t = recorded_step("lora");
  ASSERT_FALSE(t.launches.empty());
  PlannerOptions o = weight_options(20ull << 30);
  o.persistent_min = 64 * kMiB;
  // The shim's progress hook (it drains the event ring) is called for every weight the greedy
  // tries; the plan is still the one recorded below.
  uint64_t calls = 0;
  o.progress = [&calls] { ++calls; };
  const PlannerResult r = plan_step(t, o);
  const Plan& p = r.plan;
  SCOPED_TRACE(p.describe());
  EXPECT_GE(calls, p.weights.size());
  EXPECT_TRUE(p.meets_budget) << r.why;
  EXPECT_GT(p.weights.size(), 100u);
  EXPECT_FALSE(p.windows.empty());
  EXPECT_EQ(p.weight_mapped_at.size(), t.launches.size());
  EXPECT_LE(p.predicted_peak, o.budget);
  // Every copy hides: the step is the compute's.
  EXPECT_EQ(p.predicted_step_ns, gpu_timeline(t).total);
  // The windows in order, and the executor's bound within the plan's most (check_weights'
  // walk over 6929 launches and 6181 allocations takes minutes in a debug build).
  for (const WeightWindow& x : p.windows) {
    if (x.wraps()) EXPECT_TRUE(x.reload_at > x.evict_after || x.reload_at <= x.use);
    else EXPECT_TRUE(x.evict_after < x.reload_at && x.reload_at <= x.use);
  }
  EXPECT_EQ(*std::max_element(p.weight_mapped_at.begin(), p.weight_mapped_at.end()), p.weight_bytes_mapped);
  expect_file_matches(std::string(OFFLOAD_PLANS_DIR) + "/lora-20GiB-weights.plan", serialize_weights(p),
                      "the lora weight plan");
}

// Moe's recorded step (H200; cut by offload_mark_step, so kept in tests/data/traces/marked/, out
// of the detector replays, whose step detector finds no period of 38175 launches; 38175
// launches, 598 frozen weights of 38.2 GiB marked read-only, the pool factor that run's shim measured, 1.57): no plan whose copies all hide
// meets 20 GiB (20.86 GiB at best); the plan that waits does, as the shim's did on the GPU
// (66.5 ms, 19.97 GiB predicted, 19.56 held). Checked against the plan recorded here.
TEST(WeightPlan, RecordedMoeStepWaitsToMeetTwentyGiB) {
#if defined(OFFLOAD_TEST_TSAN)
  GTEST_SKIP() << "single-threaded planning; run in the plain and ASan builds";
#endif
  const StepTrace t = recorded_step("marked/moe");
  ASSERT_FALSE(t.launches.empty());
  PlannerOptions o = weight_options(20ull << 30);
  o.persistent_min = 32 * kMiB;
  o.pool_overhead = 1.57;
  o.spare_handle = true;  // as the shim plans
  for (const TraceAlloc& a : t.allocs)
    if (a.persistent(o.persistent_min)) o.read_only.push_back(a.ordinal);
  const int64_t compute = gpu_timeline(t).total;
  o.max_weight_stall = 0;
  const PlannerResult hidden = plan_step(t, o);
  EXPECT_FALSE(hidden.plan.meets_budget);
  EXPECT_GT(hidden.plan.predicted_peak, o.budget);
  o.max_weight_stall = 0.10;
  const PlannerResult r = plan_step(t, o);
  const Plan& p = r.plan;
  SCOPED_TRACE(p.describe());
  EXPECT_TRUE(p.meets_budget) << r.why;
  EXPECT_LE(p.predicted_peak, o.budget);
  EXPECT_GT(r.stall_ns, 0);
  EXPECT_LE(r.stall_share, 0.05);  // 3.6% on the GPU at this factor
  EXPECT_FALSE(p.arenas.empty());  // with the activations' arenas, as on the GPU
  EXPECT_GT(p.weights.size(), 500u);
  EXPECT_EQ(p.compute_ns, compute);
  EXPECT_EQ(p.predicted_step_ns, compute + r.stall_ns);
  EXPECT_LT(p.weight_bytes_mapped, hidden.plan.weight_bytes_mapped);
  EXPECT_EQ(*std::max_element(p.weight_mapped_at.begin(), p.weight_mapped_at.end()), p.weight_bytes_mapped);
  expect_file_matches(std::string(OFFLOAD_PLANS_DIR) + "/moe-20GiB-weights.plan", serialize_weights(p), "the moe weight plan");
}

}  // namespace
}  // namespace offload

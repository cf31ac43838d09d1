// offloadctl plan: what-if planning on a recorded step, without a GPU.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/env.h"
#include "core/plan.h"
#include "planner/planner.h"
#include "core/step_trace.h"

using namespace offload;

namespace {
double gib(uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024 * 1024); }
}  // namespace

// budget: bytes, or 0 for "offload every candidate".
int cmd_plan(const std::string& path, uint64_t budget, bool arenas, uint32_t segments) {
  std::ifstream is(path);
  if (!is) {
    fprintf(stderr, "offloadctl: cannot open %s\n", path.c_str());
    return 1;
  }
  StepTrace t;
  std::string err;
  if (!StepTrace::read(is, &t, &err)) {
    fprintf(stderr, "offloadctl: %s: %s\n", path.c_str(), err.c_str());
    return 1;
  }
  PlannerOptions o;
  o.budget = budget;
  if (segments) o.fallback_segments = segments;
  PlannerResult r = plan_step(t, o);
  const Plan& p = r.plan;
  printf("step %llu of %s: %zu launches, %zu allocations, %.1f ms of GPU time (%.0f%% of kernels timed)\n",
         static_cast<unsigned long long>(t.step), path.c_str(), t.launches.size(), t.allocs.size(),
         r.prediction.compute_ns / 1e6, 100 * gpu_timeline(t).measured);
  printf("layer period: %u launches (%.0f%% of the forward repeats), %zu segments\n", r.boundaries.period,
         100 * r.boundaries.match, r.boundaries.starts.size());
  if (r.hidden_bytes)
    printf("largest offload the compute hides: %.2f GiB in %u arenas, footprint %.2f GiB, step %.1f ms\n",
           gib(r.hidden_bytes), r.hidden_arenas, gib(r.hidden_peak), r.hidden_step_ns / 1e6);
  if (p.arenas.empty()) {
    printf("no plan: %s\n", r.why.c_str());
    return 0;
  }
  const Prediction& pr = r.prediction;
  printf("plan: %s\n", p.describe().c_str());
  printf("  footprint without offload %8.2f GiB\n", gib(r.plain_footprint));
  printf("  resident peak          %8.2f GiB (outside arenas)\n", gib(p.resident_peak));
  printf("  + arena handles        %8.2f GiB (%u x %llu MiB)\n", gib(uint64_t{p.handles} * p.handle_bytes), p.handles,
         static_cast<unsigned long long>(p.handle_bytes >> 20));
  printf("  = predicted peak       %8.2f GiB%s\n", gib(p.predicted_peak),
         budget ? (p.meets_budget ? "  (meets the budget)" : "  (does NOT meet the budget)") : "");
  printf("  moved per step         %8.2f GiB each way\n", gib(pr.bytes_out));
  printf("  step                   %8.1f ms predicted (compute %.1f ms: forward %.1f, backward %.1f; lower bound %.1f ms)\n",
         pr.step_ns / 1e6, pr.compute_ns / 1e6, pr.forward_ns / 1e6, pr.backward_ns / 1e6, pr.lower_bound_ns / 1e6);
  if (arenas) {
    printf("\n  arena  segment   MiB  evict-after reload-at first-use  out(ms)        in(ms)         stall(ms)\n");
    for (size_t i = 0; i < p.arenas.size(); ++i) {
      const ArenaPlan& a = p.arenas[i];
      const ArenaTiming& at = pr.arenas[i];
      printf("  %5zu  %7lld %6.0f  %11lld %9lld %9lld  %6.1f-%-6.1f  %6.1f-%-6.1f  %6.2f\n", i,
             static_cast<long long>(r.arena_segment[i]), static_cast<double>(a.used) / (1 << 20),
             static_cast<long long>(a.evict_after), static_cast<long long>(a.reload_at), static_cast<long long>(a.first_use),
             at.evict_start / 1e6, at.evict_end / 1e6, at.reload_start / 1e6, at.reload_end / 1e6, at.stall / 1e6);
    }
  }
  return 0;
}

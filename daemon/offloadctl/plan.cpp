// offloadctl plan: what-if planning on a recorded step, without a GPU.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/env.h"
#include "core/plan.h"
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
  PlanOptions o;
  o.budget = budget;
  if (segments) o.segments = segments;
  if (const char* g = getenv("OFFLOAD_PLAN_MIN_GAP_FRACTION")) o.min_gap_fraction = static_cast<uint32_t>(atoi(g));
  std::string why;
  Plan p = build_plan(t, o, &why);
  printf("step %llu of %s: %zu launches, %zu allocations\n", static_cast<unsigned long long>(t.step), path.c_str(),
         t.launches.size(), t.allocs.size());
  if (p.arenas.empty()) {
    printf("no plan: %s\n", why.c_str());
    return 0;
  }
  uint64_t moved = 0;
  for (const ArenaPlan& a : p.arenas) moved += a.used;
  printf("plan: %s\n", p.describe().c_str());
  printf("  peak without offload   %8.2f GiB\n", gib(p.plain_peak));
  printf("  resident peak          %8.2f GiB (outside arenas)\n", gib(p.resident_peak));
  printf("  + arena handles        %8.2f GiB (%u x %llu MiB)\n", gib(uint64_t{p.handles} * p.handle_bytes), p.handles,
         static_cast<unsigned long long>(p.handle_bytes >> 20));
  printf("  = predicted peak       %8.2f GiB%s\n", gib(p.predicted_peak),
         budget ? (p.meets_budget ? "  (meets the budget)" : "  (does NOT meet the budget)") : "");
  printf("  moved per step         %8.2f GiB each way\n", gib(moved));
  if (arenas) {
    printf("\n  arena   bytes(MiB)  members  evict-after  reload-at  first-use\n");
    for (size_t i = 0; i < p.arenas.size(); ++i) {
      const ArenaPlan& a = p.arenas[i];
      printf("  %5zu  %10.1f  %7zu  %11lld  %9lld  %9lld\n", i, static_cast<double>(a.used) / (1 << 20),
             a.members.size(), static_cast<long long>(a.evict_after), static_cast<long long>(a.reload_at),
             static_cast<long long>(a.first_use));
    }
  }
  return 0;
}

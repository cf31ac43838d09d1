// offloadctl's trace commands: read what the shim recorded, check it, replay it.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/replay.h"
#include "core/step_trace.h"

namespace fs = std::filesystem;
using namespace offload;

namespace {

bool load(const fs::path& p, StepTrace* t) {
  std::ifstream is(p);
  if (!is) {
    fprintf(stderr, "offloadctl: cannot open %s\n", p.c_str());
    return false;
  }
  std::string err;
  if (!StepTrace::read(is, t, &err)) {
    fprintf(stderr, "offloadctl: %s: %s\n", p.c_str(), err.c_str());
    return false;
  }
  return true;
}

double gib(uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024 * 1024); }

}  // namespace

int cmd_trace_show(const std::string& path, bool check) {
  std::vector<fs::path> files;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.path().extension() == ".trace") files.push_back(e.path());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  if (files.empty()) {
    fprintf(stderr, "offloadctl: no step traces (*.trace) in %s\n", path.c_str());
    return 1;
  }
  printf("%-6s %9s %8s %13s %8s %11s %7s %14s %13s %15s\n", "step", "launches", "kernels", "cupti_kernels",
         "seen", "gpu_busy_ms", "allocs", "activations", "no_bwd_access", "tiny(no_bwd)");
  int failures = 0, checked = 0;
  StepTrace last;
  for (const fs::path& f : files) {
    StepTrace t;
    if (!load(f, &t)) return 1;
    ActivationReport act = analyse_activations(t);
    size_t k = t.kernel_launches();
    char seen[32] = "-", busy[32] = "-", cupti[32] = "-";
    if (t.cupti_kernels >= 0) {
      snprintf(cupti, sizeof cupti, "%lld", static_cast<long long>(t.cupti_kernels));
      snprintf(seen, sizeof seen, "%.1f%%", t.cupti_kernels ? 100.0 * static_cast<double>(k) / static_cast<double>(t.cupti_kernels) : 100.0);
      snprintf(busy, sizeof busy, "%.2f", static_cast<double>(t.gpu_busy_ns) / 1e6);
    }
    size_t born = static_cast<size_t>(std::count_if(t.allocs.begin(), t.allocs.end(), [](auto& a) { return a.alloc_pos >= 0; }));
    char acts[48];
    snprintf(acts, sizeof acts, "%zu/%.2fGiB", act.activations, gib(act.activation_bytes));
    char tiny[32];
    snprintf(tiny, sizeof tiny, "%zu(%zu)", act.small, act.small_without_backward_access);
    if (files.size() > 1 && f.stem().string().rfind("step-", 0) != 0) printf("%s:\n", f.filename().c_str());
    printf("%-6llu %9zu %8zu %13s %8s %11s %7zu %14s %13zu %15s\n", static_cast<unsigned long long>(t.step),
           t.launches.size(), k, cupti, seen, busy, born, acts, act.without_backward_access.size(), tiny);
    if (check && t.cupti_kernels >= 0) {
      ++checked;
      if (static_cast<int64_t>(k) != t.cupti_kernels) {
        ++failures;
        printf("  FAIL step %llu: the shim saw %zu kernel launches, CUPTI recorded %lld kernels\n",
               static_cast<unsigned long long>(t.step), k, static_cast<long long>(t.cupti_kernels));
      }
      for (uint32_t o : act.without_backward_access) {
        ++failures;
        printf("  FAIL step %llu: activation #%u (%llu bytes) has no access after the forward\n",
               static_cast<unsigned long long>(t.step), o, static_cast<unsigned long long>(t.allocs[o].bytes));
      }
    }
    last = std::move(t);
  }
  // Where the GPU time of the last step went.
  std::map<uint32_t, std::pair<int64_t, int>> by_kernel;
  for (const TraceLaunch& l : last.launches)
    if (l.kind == EventKind::Kernel && l.gpu_ns >= 0) {
      by_kernel[l.kernel].first += l.gpu_ns;
      by_kernel[l.kernel].second += 1;
    }
  if (!by_kernel.empty()) {
    std::vector<std::pair<int64_t, uint32_t>> top;
    for (auto& [id, v] : by_kernel) top.emplace_back(v.first, id);
    std::sort(top.rbegin(), top.rend());
    printf("\nGPU time by kernel, step %llu (top 8):\n", static_cast<unsigned long long>(last.step));
    for (size_t i = 0; i < top.size() && i < 8; ++i) {
      std::string name = last.kernels[top[i].second];
      if (name.size() > 90) name = name.substr(0, 87) + "...";
      printf("  %9.3f ms  %5d x  %s\n", static_cast<double>(top[i].first) / 1e6, by_kernel[top[i].second].second,
             name.c_str());
    }
  }
  if (check) {
    if (checked == 0) {
      printf("\ncheck: FAIL: no step has GPU-time telemetry to check against\n");
      return 1;
    }
    printf("\ncheck: %s (%d steps checked, %d failures)\n", failures ? "FAIL" : "ok", checked, failures);
    return failures ? 1 : 0;
  }
  return 0;
}

int cmd_replay(const std::string& path, int repeats) {
  StepTrace rec;
  if (!load(path, &rec)) return 1;
  ActivationReport act = analyse_activations(rec);
  printf("recorded step %llu of %s: %zu launches (%zu kernels, %zu distinct), %zu allocations, "
         "%zu activations (%.2f GiB)\n",
         static_cast<unsigned long long>(rec.step), path.c_str(), rec.launches.size(), rec.kernel_launches(),
         rec.kernels.size(), rec.allocs.size(), act.activations, gib(act.activation_bytes));
  int rc = 0;
  for (bool marked : {true, false}) {
    ReplayResult r = replay(rec, ReplayOptions{repeats, marked});
    printf("\nreplay, %d steps, step boundaries from %s:\n", repeats,
           marked ? "offload_mark_step()" : "automatic detection");
    printf("  tracker time per launch: %.0f ns\n", r.hook_ns_mean);
    printf("  steps cut: %zu; launches per step:", r.steps.size());
    for (const StepTrace& t : r.steps) printf(" %zu", t.launches.size());
    printf("\n");
    if (marked) {
      bool ok = r.matching_steps + 1 >= r.steps.size() && r.matching_steps >= static_cast<size_t>(repeats) - 1;
      printf("  re-recorded steps identical to the recording (allocations, launches, accesses): %zu of %zu%s\n",
             r.matching_steps, r.steps.size(),
             ok ? (r.matching_steps < r.steps.size() ? " (the first also holds the set-up allocations)" : "")
                : "  <-- MISMATCH");
      if (!ok && !r.first_mismatch.empty()) printf("  first difference: %s\n", r.first_mismatch.c_str());
      if (!ok) rc = 1;
    } else {
      bool ok = r.period == rec.launches.size();
      printf("  detector period: %zu launches (recorded step: %zu)%s\n", r.period, rec.launches.size(),
             ok ? "" : "  <-- MISMATCH");
      if (!ok) rc = 1;
    }
  }
  printf("\nactivations without an access after the forward: %zu\n", act.without_backward_access.size());
  return rc;
}

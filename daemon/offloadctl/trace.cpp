// offloadctl trace show|check|chrome: read what the shim recorded (OFFLOAD_TRACE), summarise it,
// check it, convert it for a trace viewer.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/files.h"
#include "common/json_writer.h"
#include "offloadctl/trace_file.h"
#include "planner/step_trace.h"

namespace fs = std::filesystem;
using namespace offload;

bool offload::load_step_trace(const std::string& path, StepTrace* t) {
  errno = 0;
  std::ifstream is(path);
  if (!is) {
    fprintf(stderr, "offloadctl: cannot open %s%s%s\n", path.c_str(), errno ? ": " : "", errno ? strerror(errno) : "");
    return false;
  }
  std::string err;
  if (!StepTrace::read(is, t, &err)) {
    fprintf(stderr, "offloadctl: %s: %s\n", path.c_str(), err.c_str());
    return false;
  }
  return true;
}

namespace {

// The step files at `path`: the *.trace files of a directory in name order (step-000001.trace,
// ...), or the one file named. False, said on stderr, when there are none.
bool list_step_files(const std::string& path, std::vector<fs::path>* files) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.path().extension() == ".trace") files->push_back(e.path());
    std::sort(files->begin(), files->end());
  } else {
    files->push_back(path);
  }
  if (files->empty()) fprintf(stderr, "offloadctl: no step traces (*.trace) in %s\n", path.c_str());
  return !files->empty();
}

// One recorded step, as trace show prints it.
struct StepRow {
  std::string file;
  uint64_t step = 0;
  size_t launches = 0, kernels = 0, born = 0;
  int64_t cupti_kernels = -1, gpu_busy_ns = -1;  // -1: no GPU-time telemetry in the trace
  ActivationReport act;
};

void print_rows(const std::vector<StepRow>& rows) {
  printf("%-6s %9s %8s %13s %8s %11s %7s %14s %13s %15s\n", "step", "launches", "kernels", "cupti_kernels",
         "seen", "gpu_busy_ms", "allocs", "activations", "no_bwd_access", "tiny(no_bwd)");
  for (const StepRow& r : rows) {
    char seen[32] = "-", busy[32] = "-", cupti[32] = "-";
    if (r.cupti_kernels >= 0) {
      snprintf(cupti, sizeof cupti, "%lld", static_cast<long long>(r.cupti_kernels));
      snprintf(seen, sizeof seen, "%.1f%%",
               r.cupti_kernels ? 100.0 * static_cast<double>(r.kernels) / static_cast<double>(r.cupti_kernels) : 100.0);
      snprintf(busy, sizeof busy, "%.2f", static_cast<double>(r.gpu_busy_ns) / 1e6);
    }
    char acts[48], tiny[32];
    snprintf(acts, sizeof acts, "%zu/%.2fGiB", r.act.activations, gib(r.act.activation_bytes));
    snprintf(tiny, sizeof tiny, "%zu(%zu)", r.act.small, r.act.small_without_backward_access);
    if (rows.size() > 1 && r.file.rfind("step-", 0) != 0) printf("%s:\n", r.file.c_str());
    printf("%-6llu %9zu %8zu %13s %8s %11s %7zu %14s %13zu %15s\n", static_cast<unsigned long long>(r.step),
           r.launches, r.kernels, cupti, seen, busy, r.born, acts, r.act.without_backward_access.size(), tiny);
  }
}

}  // namespace

int cmd_trace_show(const std::string& path, bool check, bool json) {
  std::vector<fs::path> files;
  if (!list_step_files(path, &files)) return 1;
  std::vector<StepRow> rows;
  std::vector<std::string> failures;
  int checked = 0;
  StepTrace last;
  for (const fs::path& f : files) {
    StepTrace t;
    if (!load_step_trace(f, &t)) return 1;
    StepRow r;
    r.file = f.filename().string();
    r.step = t.step;
    r.launches = t.launches.size();
    r.kernels = t.kernel_launches();
    r.born = static_cast<size_t>(std::count_if(t.allocs.begin(), t.allocs.end(), [](auto& a) { return a.alloc_pos >= 0; }));
    r.act = analyse_activations(t);
    if (t.cupti_kernels >= 0) r.cupti_kernels = t.cupti_kernels, r.gpu_busy_ns = t.gpu_busy_ns;
    if (check && t.cupti_kernels >= 0) {
      ++checked;
      char buf[256];
      if (static_cast<int64_t>(r.kernels) != t.cupti_kernels) {
        snprintf(buf, sizeof buf, "step %llu: the shim saw %zu kernel launches, CUPTI recorded %lld kernels",
                 static_cast<unsigned long long>(t.step), r.kernels, static_cast<long long>(t.cupti_kernels));
        failures.push_back(buf);
      }
      for (uint32_t o : r.act.without_backward_access) {
        snprintf(buf, sizeof buf, "step %llu: activation #%u (%llu bytes) has no access after the forward",
                 static_cast<unsigned long long>(t.step), o, static_cast<unsigned long long>(t.allocs[o].bytes));
        failures.push_back(buf);
      }
    }
    rows.push_back(std::move(r));
    last = std::move(t);
  }
  // Where the GPU time of the last step went.
  std::map<uint32_t, std::pair<int64_t, int>> by_kernel;
  for (const TraceLaunch& l : last.launches)
    if (l.kind == EventKind::Kernel && l.gpu_ns >= 0) {
      by_kernel[l.kernel].first += l.gpu_ns;
      by_kernel[l.kernel].second += 1;
    }
  std::vector<std::pair<int64_t, uint32_t>> top;
  for (auto& [id, v] : by_kernel) top.emplace_back(v.first, id);
  std::sort(top.rbegin(), top.rend());
  if (top.size() > 8) top.resize(8);
  const bool failed = check && (checked == 0 || !failures.empty());
  if (json) {
    JsonWriter w;
    w.object().field("version", 1).array("steps");
    for (const StepRow& r : rows) {
      w.object().field("file", r.file).field("step", r.step).field("launches", r.launches).field("kernels", r.kernels);
      if (r.cupti_kernels >= 0) w.field("cupti_kernels", r.cupti_kernels).field("gpu_busy_ns", r.gpu_busy_ns);
      else w.key("cupti_kernels").null().key("gpu_busy_ns").null();
      w.field("allocs_born", r.born).field("activations", r.act.activations)
          .field("activation_bytes", r.act.activation_bytes)
          .field("activations_without_backward_access", r.act.without_backward_access.size())
          .field("small_activations", r.act.small)
          .field("small_without_backward_access", r.act.small_without_backward_access).end();
    }
    w.end().object("top_kernels_last_step").field("step", last.step).array("kernels");
    for (const auto& [ns, id] : top)
      w.object().field("name", last.kernels[id]).field("gpu_ns", ns).field("launches", by_kernel[id].second).end();
    w.end().end();
    if (check) {
      w.object("check").field("ok", !failed).field("steps_checked", checked).array("failures");
      for (const std::string& f : failures) w.value(f);
      w.end().end();
    }
    w.end();
    printf("%s\n", w.str().c_str());
    return failed ? 1 : 0;
  }
  print_rows(rows);
  for (const std::string& f : failures) printf("  FAIL %s\n", f.c_str());
  if (!top.empty()) {
    printf("\nGPU time by kernel, step %llu (top 8):\n", static_cast<unsigned long long>(last.step));
    for (const auto& [ns, id] : top) {
      std::string name = last.kernels[id];
      if (name.size() > 90) name = name.substr(0, 87) + "...";
      printf("  %9.3f ms  %5d x  %s\n", static_cast<double>(ns) / 1e6, by_kernel[id].second, name.c_str());
    }
  }
  if (check) {
    if (checked == 0) printf("\ncheck: FAIL: no step has GPU-time telemetry to check against\n");
    else printf("\ncheck: %s (%d steps checked, %zu failures)\n", failed ? "FAIL" : "ok", checked, failures.size());
  }
  return failed ? 1 : 0;
}

int cmd_trace_chrome(const std::string& path, const std::string& out) {
  std::vector<fs::path> files;
  if (!list_step_files(path, &files)) return 1;
  std::vector<StepTrace> steps(files.size());
  for (size_t i = 0; i < files.size(); ++i)
    if (!load_step_trace(files[i], &steps[i])) return 1;
  std::ostringstream os;
  write_chrome_trace(steps, os);
  if (out.empty()) {
    fwrite(os.str().data(), 1, os.str().size(), stdout);
    return 0;
  }
  std::string why;
  if (!replace_file(out, os.str(), &why)) {
    fprintf(stderr, "offloadctl: cannot write %s: %s\n", out.c_str(), why.c_str());
    return 1;
  }
  fprintf(stderr, "offloadctl: %zu step%s written to %s (open it in ui.perfetto.dev or chrome://tracing)\n",
          steps.size(), steps.size() == 1 ? "" : "s", out.c_str());
  return 0;
}

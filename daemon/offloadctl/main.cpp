// offloadctl: the command line for people and scripts.
//
//   offloadctl status [--json] [--watch [SECONDS]] [--socket PATH]
//                                   the pool and every client, from offloadd
//   offloadctl stop [--socket PATH]  stop offloadd (leases in use stay in the segment)
//   offloadctl doctor [--json] [--cudart PATH]
//                                   what this machine and environment lack to run under liboffload
//   offloadctl trace show PATH [--json]   summarise a trace directory (OFFLOAD_TRACE) or step file
//   offloadctl trace check PATH [--json]  visibility and activation checks; exit 1 if one fails
//   offloadctl trace chrome PATH [-o FILE] the steps as one Chrome/Perfetto trace (stdout by default)
//   offloadctl replay FILE [--steps N] [--offload FRACTION|--cap FRACTION] [--scale DIV] [--json]
//                                   replay a recorded step through the shim's pipeline on the
//                                   simulated driver and show what it saw; with --offload, the
//                                   executor too, under a budget, with every launch's data checked;
//                                   with --cap, the residency manager under a budget instead
//   offloadctl plan --trace FILE [--budget SIZE|SHARE [--gpu-memory SIZE]] [--persistent-min SIZE [--read-only] [--max-weight-wait S]]
//                   [--segments N] [--pool-overhead F]
//                   [--arenas|--json] [--html FILE]
//                                   the planner's plan for a recorded step, without a GPU: as
//                                   text, as JSON, and as a timeline page
//   offloadctl plan --trace FILE --sweep [--segments N] [--json]
//                                   the plan at budgets from 100% down to 30% of the footprint
//   offloadctl plan --trace FILE --persistent [--json]
//                                   what outlives the step (weights, optimizer state): how long
//                                   each sits unused, and whether its copies would fit there
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/env.h"
#include "offload_version.h"
#include "offloadctl/doctor.h"

extern char** environ;

int cmd_trace_show(const std::string& path, bool check, bool json);
int cmd_trace_chrome(const std::string& path, const std::string& out);
int cmd_replay(const std::string& path, int repeats, double offload_fraction, uint32_t divisor, bool json);
int cmd_replay_cap(const std::string& path, int repeats, double cap_fraction, uint32_t divisor, bool json);
int cmd_plan(const std::string& path, uint64_t budget, double fraction, bool arenas, uint32_t segments,
             const std::string& html, bool json, bool sweep, uint64_t persistent_min, double pool_overhead,
             bool read_only, double max_weight_wait);
int cmd_plan_persistent(const std::string& path, bool json);
int cmd_status(const std::string& socket, bool json, double watch_s);
int cmd_stop(const std::string& socket);

namespace {

struct HelpBlock {
  const char* command;
  const char* text;
};
// The usage, a block per command line (a command may have several).
constexpr HelpBlock kHelp[] = {
    {"status",
     "  status [--json] [--watch [SECONDS]] [--socket PATH]\n"
     "                         the pool and every client (pid, command, GPU, leased, resident,\n"
     "                         evicted, step time, exposed stall, misses, rank, GPU id) and the\n"
     "                         GPUs sharing the node's host link; --watch refreshes\n"},
    {"stop",
     "  stop [--socket PATH]   stop offloadd\n"},
    {"doctor",
     "  doctor [--json] [--cudart PATH]\n"
     "                         check what running under liboffload needs, a line each (ok, warn, fail)\n"
     "                         with what to do: the driver and a GPU, CUPTI (the file the shim would\n"
     "                         load), PyTorch's allocator setting, /dev/shm against the host pool,\n"
     "                         glibc, liboffload.so and LD_PRELOAD, unknown OFFLOAD_* variables; exit 1\n"
     "                         if a check fails. --cudart: the libcudart PyTorch loads (CUPTI of its\n"
     "                         CUDA is looked for first); --json: {\"ok\", \"checks\": [...]}\n"},
    {"trace",
     "  trace show PATH [--json]\n"
     "                         summarise a trace directory (OFFLOAD_TRACE=DIR) or one step file;\n"
     "                         --json: the steps, the last step's top kernels, as one JSON object\n"},
    {"trace",
     "  trace check PATH [--json]\n"
     "                         check visibility (shim launches == CUPTI kernels) and that every\n"
     "                         activation is touched in the backward; exit 1 if a check fails\n"},
    {"trace",
     "  trace chrome PATH [-o FILE]\n"
     "                         the steps of a trace directory or step file as one Chrome/Perfetto trace\n"
     "                         (ui.perfetto.dev, chrome://tracing): kernels per stream, copies, a span\n"
     "                         per step, live bytes; on stdout, or written to FILE\n"},
    {"replay",
     "  replay FILE [--steps N] [--offload FRACTION|--cap FRACTION] [--scale DIV] [--json]\n"
     "                         replay a recorded step on the simulated driver (default N=6); with\n"
     "                         --offload, the executor too, under a budget of FRACTION of the step's\n"
     "                         peak (N=12 by default), sizes divided by DIV (default 256), every\n"
     "                         launch's data checked; exit 1 on a mismatch or over the budget;\n"
     "                         --json: the same figures as one JSON object (bytes at the recording's\n"
     "                         size, not scaled); with --cap instead, the residency manager (the hard\n"
     "                         cap of OFFLOAD_DEVICE_BUDGET) under a budget of FRACTION of the peak,\n"
     "                         every launch's data checked; exit 1 on a mismatch, a held peak over\n"
     "                         the budget, a VMM misuse or a refusal; its policy from the\n"
     "                         OFFLOAD_CAP_TILE, _REFIT, _EXTRA_PIECES, _EVICT_FIRST and\n"
     "                         _PREFETCH_MAX settings\n"},
    {"plan",
     "  plan --trace FILE [--budget SIZE|SHARE [--gpu-memory SIZE]] [--persistent-min SIZE [--read-only]\n"
     "       [--max-weight-wait S]] [--segments N] [--arenas|--json]\n"
     "       [--html FILE] [--pool-overhead F]\n"
     "                         the plan the planner makes for a recorded step under a device budget:\n"
     "                         a size (12GiB), a share of the step's footprint without offload\n"
     "                         (75%step), or, as OFFLOAD_DEVICE_BUDGET reads it, a share of the GPU's\n"
     "                         memory (75%, 75%gpu or 0.75) with --gpu-memory giving that memory;\n"
     "                         none: the largest offload the compute hides.\n"
     "                         --arenas lists the arenas; --json prints the figures as one JSON\n"
     "                         object instead of text; --html writes the predicted step's timeline\n"
     "                         (compute, copy queues, footprint) as a self-contained page;\n"
     "                         --persistent-min: what outlives the step and is at least SIZE is the\n"
     "                         shim's own (OFFLOAD_PERSISTENT_MIN), and such weights may be streamed\n"
     "                         out and back between their uses when activations alone miss the budget;\n"
     "                         --read-only: those weights are marked read-only (a frozen base, as\n"
     "                         offload_mark_read_only marks it): they cost no copy out;\n"
     "                         --max-weight-wait SHARE: how much of the step a weight plan may wait for\n"
     "                         reloads to meet the budget (default 0.10, as the shim; 0: never);\n"
     "                         --pool-overhead: what the allocator holds for the live bytes outside the\n"
     "                         arenas, as a factor of them (default 1.15, the shim's floor; a run's\n"
     "                         figure is its pool's reserved high over its used high)\n"},
    {"plan",
     "  plan --trace FILE --sweep [--segments N] [--json] [--pool-overhead F]\n"
     "                         the plan at budgets of 100%, 95%, ... 30% of that footprint, a row each\n"
     "                         (peak, moved, step against compute and its lower bound); it stops\n"
     "                         after two budgets in a row that no plan meets\n"},
    {"plan",
     "  plan --trace FILE --persistent [--json]\n"
     "                         what outlives the step (weights, kept gradients, optimizer state): how\n"
     "                         long each sits unused in GPU time across the step boundary, and\n"
     "                         whether a copy out and back would fit there\n"},
    {"help",
     "  help                   this text\n"},
};
constexpr const char* kHeader = "usage: offloadctl <command>   (offloadctl --version: the version and the source commit)\n";

void usage(FILE* f) {
  fprintf(f, "%s", kHeader);
  for (const HelpBlock& b : kHelp) fprintf(f, "%s", b.text);
}

// COMMAND --help: that command's lines of the usage, or false for an unknown command.
bool usage_of(const std::string& command) {
  bool any = false;
  for (const HelpBlock& b : kHelp)
    if (command == b.command) {
      if (!any) printf("usage: offloadctl\n");
      printf("%s", b.text);
      any = true;
    }
  return any;
}


using Args = std::vector<std::string>;

// A usage error: one line, a pointer to the command's --help, status 2.
int usage_error(const std::string& command, const std::string& message) {
  fprintf(stderr, "offloadctl: %s\n(offloadctl %s --help lists its options)\n", message.c_str(), command.c_str());
  return 2;
}
[[gnu::format(printf, 2, 3)]] int usage_errorf(const char* command, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char line[512];
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  return usage_error(command, line);
}

int run_trace_chrome(const Args& a) {
  std::string path, out;
  for (size_t i = 2; i < a.size(); ++i) {
    if (a[i] == "-o" || a[i] == "--output") {
      if (i + 1 >= a.size() || a[i + 1].empty()) return usage_error("trace", a[i] + " needs a file name");
      out = a[++i];
    } else if (a[i].size() > 1 && a[i][0] == '-') {
      return usage_error("trace", "unknown option '" + a[i] + "' for trace chrome");
    } else if (path.empty()) {
      path = a[i];
    } else {
      return usage_error("trace", "trace chrome takes one PATH ('" + path + "', then '" + a[i] + "')");
    }
  }
  if (path.empty()) return usage_error("trace", "trace chrome needs a trace directory or step file");
  return cmd_trace_chrome(path, out);
}

int run_doctor(const Args& a) {
  bool json = false;
  std::string cudart;
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i] == "--json") {
      json = true;
    } else if (a[i] == "--cudart") {
      if (i + 1 >= a.size() || a[i + 1].empty()) return usage_error("doctor", "--cudart needs the path of a libcudart");
      cudart = a[++i];
      if (access(cudart.c_str(), R_OK) != 0) return usage_error("doctor", "--cudart '" + cudart + "': no such file");
    } else if (a[i].rfind("-", 0) == 0) {
      return usage_error("doctor", "unknown option '" + a[i] + "' for doctor");
    } else {
      return usage_error("doctor", "doctor takes no argument ('" + a[i] + "')");
    }
  }
  offload::doctor::ProbeOptions o;
  o.get = [](const char* n) { return static_cast<const char*>(getenv(n)); };
  o.env = environ;
  o.libdir = OFFLOAD_INSTALL_LIBDIR;
  o.cudart = cudart;
  return offload::doctor::run(o, json);
}

int run_status_or_stop(const Args& a) {
  std::string socket;
  bool json = false;
  double watch = 0;
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i] == "--socket" && i + 1 < a.size()) {
      socket = a[++i];
    } else if (a[0] == "status" && a[i] == "--json") {
      json = true;
    } else if (a[0] == "status" && a[i] == "--watch") {
      watch = 2;
      if (i + 1 < a.size() && a[i + 1][0] != '-') {
        char* end = nullptr;
        watch = strtod(a[i + 1].c_str(), &end);
        if (*end || watch < 0.1 || watch > 3600) {
          return usage_errorf(a[0].c_str(), "--watch '%s' is not valid: expected seconds from 0.1 to 3600", a[i + 1].c_str());
        }
        ++i;
      }
    } else {
      return usage_errorf(a[0].c_str(), "unknown option '%s' for %s", a[i].c_str(), a[0].c_str());
    }
  }
  return a[0] == "status" ? cmd_status(socket, json, watch) : cmd_stop(socket);
}

int run_replay(const Args& a) {
  int steps = 0;
  double fraction = 0, cap = 0;
  uint32_t divisor = 256;
  bool json = false;
  for (size_t i = 2; i < a.size(); ++i) {
    char* end = nullptr;
    if (a[i] == "--json") {
      json = true;
    } else if (a[i] == "--steps" && i + 1 < a.size()) {
      long n = strtol(a[++i].c_str(), &end, 10);
      if (*end || n < 3 || n > 1000) {
        return usage_errorf("replay", "--steps '%s' is not valid: expected a count from 3 to 1000", a[i].c_str());
      }
      steps = static_cast<int>(n);
    } else if (a[i] == "--offload" && i + 1 < a.size()) {
      fraction = strtod(a[++i].c_str(), &end);
      if (*end || !(fraction > 0 && fraction <= 1)) {
        return usage_errorf("replay", "--offload '%s' is not valid: expected a fraction of the peak, 0 < F <= 1",
                a[i].c_str());
      }
    } else if (a[i] == "--cap" && i + 1 < a.size()) {
      cap = strtod(a[++i].c_str(), &end);
      if (*end || !(cap > 0 && cap <= 1)) {
        return usage_errorf("replay", "--cap '%s' is not valid: expected a fraction of the peak, 0 < F <= 1",
                a[i].c_str());
      }
    } else if (a[i] == "--scale" && i + 1 < a.size()) {
      long d = strtol(a[++i].c_str(), &end, 10);
      if (*end || d < 1 || d > 1024) {
        return usage_errorf("replay", "--scale '%s' is not valid: expected a divisor from 1 to 1024", a[i].c_str());
      }
      divisor = static_cast<uint32_t>(d);
    } else {
      return usage_errorf("replay", "unknown option '%s' for replay", a[i].c_str());
    }
  }
  if (cap > 0 && fraction > 0) return usage_error("replay", "--offload and --cap are two modes: give one");
  if (cap > 0) return cmd_replay_cap(a[1], steps, cap, divisor, json);
  return cmd_replay(a[1], steps, fraction, divisor, json);
}

// What `plan` was asked for, as given on the command line.
struct PlanArgs {
  std::string trace, html, budget_text;
  offload::BudgetSpec spec;
  uint64_t budget = 0, persistent_min = 0, gpu_memory = 0;
  double fraction = 0, pool_overhead = 0, max_weight_wait = -1;
  bool arenas = false, json = false, sweep = false, budget_given = false, persistent = false, read_only = false;
  uint32_t segments = 0;
};

// Reads plan's options into *p; 0, or the exit status of a usage error already said.
int parse_plan(const Args& a, PlanArgs* p) {
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i] == "--trace" && i + 1 < a.size()) {
      p->trace = a[++i];
    } else if (a[i] == "--budget" && i + 1 < a.size()) {
      p->budget_given = true;
      p->budget_text = a[++i];
      const auto b = offload::parse_budget(a[i]);
      if (!b)
        return usage_errorf("plan", "--budget '%s' is not valid: expected a size such as 12GiB, a share of the "
                                    "step's footprint without offload (75%%step), or of the GPU's memory with "
                                    "--gpu-memory (75%%, 75%%gpu or 0.75)",
                            a[i].c_str());
      p->spec = *b;
    } else if (a[i] == "--gpu-memory" && i + 1 < a.size()) {
      const auto m = offload::parse_size(a[++i]);
      if (!m || *m == 0)
        return usage_errorf("plan", "--gpu-memory '%s' is not valid: expected a size such as 141GiB", a[i].c_str());
      p->gpu_memory = *m;
    } else if (a[i] == "--arenas") {
      p->arenas = true;
    } else if (a[i] == "--json") {
      p->json = true;
    } else if (a[i] == "--sweep") {
      p->sweep = true;
    } else if (a[i] == "--persistent-min" && i + 1 < a.size()) {
      auto b = offload::parse_size(a[++i]);
      if (!b || *b == 0) {
        return usage_errorf("plan", "--persistent-min '%s' is not valid: expected a size such as 2MiB", a[i].c_str());
      }
      p->persistent_min = *b;
    } else if (a[i] == "--pool-overhead" && i + 1 < a.size()) {
      char* end = nullptr;
      double v = strtod(a[++i].c_str(), &end);
      if (*end || a[i].empty() || !(v >= 1.0 && v <= 3.0)) {
        return usage_errorf("plan", "--pool-overhead '%s' is not valid: expected a factor from 1 to 3, such as 1.08",
                a[i].c_str());
      }
      p->pool_overhead = v;
    } else if (a[i] == "--read-only") {
      p->read_only = true;
    } else if (a[i] == "--max-weight-wait" && i + 1 < a.size()) {
      char* end = nullptr;
      double v = strtod(a[++i].c_str(), &end);
      if (*end || a[i].empty() || !(v >= 0.0 && v <= 0.5)) {
        return usage_errorf("plan", "--max-weight-wait '%s' is not valid: expected a share of the step from 0 to 0.5, "
                        "such as 0.05",
                a[i].c_str());
      }
      p->max_weight_wait = v;
    } else if (a[i] == "--persistent") {
      p->persistent = true;
    } else if (a[i] == "--html" && i + 1 < a.size()) {
      p->html = a[++i];
      if (p->html.empty()) {
        return usage_errorf("plan", "--html needs a file name");
      }
    } else if (a[i] == "--segments" && i + 1 < a.size()) {
      char* end = nullptr;
      long v = strtol(a[++i].c_str(), &end, 10);
      if (*end || v < 1 || v > 4096) {
        return usage_errorf("plan", "--segments '%s' is not valid: expected a count from 1 to 4096", a[i].c_str());
      }
      p->segments = static_cast<uint32_t>(v);
    } else {
      return usage_errorf("plan", "unknown option '%s' for plan", a[i].c_str());
    }
  }
  return 0;
}

int run_plan(const Args& a) {
  PlanArgs p;
  if (int rc = parse_plan(a, &p)) return rc;
  // One meaning of a share everywhere: of the GPU's memory, as OFFLOAD_DEVICE_BUDGET reads it;
  // "%step" says a share of the recorded step's footprint.
  if (p.gpu_memory && !(p.budget_given && p.spec.of == offload::BudgetSpec::Of::Gpu))
    return usage_errorf("plan", "--gpu-memory only sizes a --budget given as a share of the GPU's memory");
  if (p.budget_given) {
    using Of = offload::BudgetSpec::Of;
    if (p.spec.of == Of::Bytes) p.budget = p.spec.bytes;
    else if (p.spec.of == Of::Step) p.fraction = p.spec.share;
    else if (!p.gpu_memory)
      return usage_errorf("plan", "--budget '%s' is a share of the GPU's memory, which a trace does not record: give "
                                  "--gpu-memory SIZE, or write %g%%step for a share of the step's footprint",
                          p.budget_text.c_str(), p.spec.share * 100);
    else p.budget = static_cast<uint64_t>(p.spec.share * static_cast<double>(p.gpu_memory));
  }
  if (p.trace.empty()) {
    return usage_errorf("plan", "plan needs --trace FILE");
  }
  if (p.json && p.arenas) {
    return usage_errorf("plan", "--arenas lists arenas as text; --json gives only their count");
  }
  if (p.sweep && (p.budget_given || p.arenas || !p.html.empty())) {
    return usage_errorf("plan", "--sweep chooses its own budgets and prints one table: it takes no --budget, "
                    "--arenas or --html");
  }
  if ((p.read_only || p.max_weight_wait >= 0) && !p.persistent_min) {
    return usage_errorf("plan", "--read-only and --max-weight-wait are about streamed weights: they need --persistent-min");
  }
  if (p.persistent && (p.budget_given || p.arenas || p.sweep || !p.html.empty() || p.segments ||
                       p.persistent_min || p.pool_overhead > 0)) {
    return usage_errorf("plan", "--persistent prints one table of its own: it takes no other option but --json");
  }
  if (p.persistent) return cmd_plan_persistent(p.trace, p.json);
  return cmd_plan(p.trace, p.budget, p.fraction, p.arenas, p.segments, p.html, p.json, p.sweep, p.persistent_min,
                  p.pool_overhead, p.read_only, p.max_weight_wait);
}

}  // namespace

int main(int argc, char** argv) {
  // --option=value is --option value.
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos && eq > 2) {
      a.push_back(arg.substr(0, eq));
      a.push_back(arg.substr(eq + 1));
    } else {
      a.push_back(arg);
    }
  }
  if (a.empty() || a[0] == "help" || a[0] == "--help" || a[0] == "-h") {
    usage(a.empty() ? stderr : stdout);
    return a.empty() ? 2 : 0;
  }
  // COMMAND ... --help: that command's part of the usage.
  if (std::any_of(a.begin() + 1, a.end(), [](const std::string& x) { return x == "--help" || x == "-h"; }) &&
      usage_of(a[0]))
    return 0;
  if (a[0] == "--version") {
    printf("offloadctl %s (commit %s)\n", OFFLOAD_VERSION, OFFLOAD_COMMIT);
    return 0;
  }
  if (a[0] == "status" || a[0] == "stop") return run_status_or_stop(a);
  if (a[0] == "trace") {
    if (a.size() >= 2 && (a[1] == "show" || a[1] == "check")) {
      if (a.size() == 3 || (a.size() == 4 && a[3] == "--json")) return cmd_trace_show(a[2], a[1] == "check", a.size() == 4);
      return usage_error("trace", "trace " + a[1] + " takes a PATH, then --json or nothing");
    }
    if (a.size() >= 2 && a[1] == "chrome") return run_trace_chrome(a);
    return usage_error("trace", "trace needs show, check or chrome");
  }
  if (a[0] == "replay") {
    if (a.size() < 2 || a[1].rfind("--", 0) == 0) return usage_error("replay", "replay needs a step FILE first");
    return run_replay(a);
  }
  if (a[0] == "plan") return run_plan(a);
  if (a[0] == "doctor") return run_doctor(a);
  std::string joined;
  for (auto& s : a) joined += (joined.empty() ? "" : " ") + s;
  fprintf(stderr, "offloadctl: unknown command '%s'\n(offloadctl --help lists the commands)\n", joined.c_str());
  return 2;
}

// offloadctl's commands as a person or a script runs them: doctor's verdicts and its JSON,
// replay's JSON against its text, trace chrome's trace.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "it_support.h"
#include "json_mini.h"

namespace offload::it {
namespace {

std::string make_file(const std::string& path) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << "";
  return path;
}

// An environment without the host's settings that doctor reads.
std::map<std::string, std::string> clean_env(const TempDir& dir) {
  return {{"XDG_RUNTIME_DIR", dir.path() + "/xdg"},
          {"OFFLOAD_SOCKET", ""},
          {"OFFLOAD_CUPTI_LIB", ""},
          {"OFFLOAD_TELEMETRY", ""},
          {"CUDA_HOME", ""},
          {"LD_PRELOAD", ""},
          {"PYTORCH_ALLOC_CONF", ""},
          {"PYTORCH_CUDA_ALLOC_CONF", ""}};
}

// doctor --json: one object, a check per line of the text, the exit status its verdict. Here
// the allocator setting picks another backend (a failure) and a variable is misspelt (a warning),
// and CUPTI is looked for for a cu12 wheel's runtime.
TEST(OffloadctlDoctor, JsonGivesEachChecksVerdictAndTheExitStatusFollowsThem) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string cudart = make_file(dir.path() + "/sp/nvidia/cuda_runtime/lib/libcudart.so.12");
  make_file(dir.path() + "/sp/nvidia/cuda_cupti/lib/libcupti.so.12");
  std::map<std::string, std::string> env = clean_env(dir);
  env["PYTORCH_CUDA_ALLOC_CONF"] = "backend:native";
  env["OFFLOAD_BUDGET"] = "40GiB";
#ifdef OFFLOAD_LIB
  env["OFFLOAD_LIB"] = OFFLOAD_LIB;
#endif
  RunResult r = run_program({OFFLOADCTL_BIN, "doctor", "--json", "--cudart=" + cudart}, env, dir.path());
  testing::Json j;
  std::string err;
  ASSERT_TRUE(testing::parse_json(r.out, &j, &err)) << err << "\n" << r.out << "\nstderr: " << r.err;
  EXPECT_FALSE(j["ok"].b);
  EXPECT_EQ(r.exit_code(), 1) << describe_status(r.status);
  std::map<std::string, const testing::Json*> by_name;
  std::vector<std::string> names;
  for (const testing::Json& c : j["checks"].items) {
    names.push_back(c["name"].text);
    by_name[c["name"].text] = &c;
    const std::string& st = c["status"].text;
    EXPECT_TRUE(st == "ok" || st == "warn" || st == "fail") << st;
    EXPECT_FALSE(c["detail"].text.empty()) << c["name"].text;
    if (st != "ok") {
      EXPECT_FALSE(c["fix"].text.empty()) << c["name"].text << " says what is wrong, not what to do";
    }
  }
  const std::vector<std::string> want = {"driver", "cupti", "allocator", "shm", "glibc", "liboffload", "preload", "settings"};
  ASSERT_EQ(names, want);
  EXPECT_EQ((*by_name["allocator"])["status"].text, "fail");
  EXPECT_NE((*by_name["allocator"])["detail"].text.find("picks the native allocator"), std::string::npos);
  EXPECT_EQ((*by_name["settings"])["status"].text, "warn");
  EXPECT_NE((*by_name["settings"])["detail"].text.find("OFFLOAD_BUDGET (did you mean OFFLOAD_DEVICE_BUDGET?)"),
            std::string::npos)
      << (*by_name["settings"])["detail"].text;
  EXPECT_EQ((*by_name["preload"])["status"].text, "warn");
  EXPECT_NE((*by_name["cupti"])["status"].text, "fail") << "no CUPTI costs GPU times, never the run";
  EXPECT_NE((*by_name["cupti"])["detail"].text.find("for " + cudart + " (--cudart)"), std::string::npos)
      << (*by_name["cupti"])["detail"].text;
#ifdef OFFLOAD_LIB
  EXPECT_EQ((*by_name["liboffload"])["status"].text, "ok");
  EXPECT_EQ((*by_name["liboffload"])["detail"].text, OFFLOAD_LIB);
#endif

  // The text: a line per check, in the same order and with the same verdicts, then a summary.
  RunResult text = run_program({OFFLOADCTL_BIN, "doctor", "--cudart", cudart}, env, dir.path());
  EXPECT_EQ(text.exit_code(), 1);
  std::istringstream lines(text.out);
  std::string line;
  for (const testing::Json& c : j["checks"].items) {
    ASSERT_TRUE(std::getline(lines, line)) << text.out;
    EXPECT_EQ(line.rfind(c["status"].text + " ", 0), 0u) << line;
    EXPECT_NE(line.find(" " + c["name"].text + " "), std::string::npos) << line;
  }
  ASSERT_TRUE(std::getline(lines, line));
  EXPECT_EQ(line.rfind("doctor: 8 checks, ", 0), 0u) << line;
  EXPECT_FALSE(std::getline(lines, line)) << "nothing after the summary: " << line;
}

TEST(OffloadctlDoctor, UsageErrorsAreOneLineAndAPointerToHelp) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::map<std::string, std::string> env = clean_env(dir);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"doctor", "--bogus"}, "unknown option '--bogus' for doctor"},
      {{"doctor", "now"}, "doctor takes no argument ('now')"},
      {{"doctor", "--cudart"}, "--cudart needs the path of a libcudart"},
      {{"doctor", "--cudart", dir.path() + "/none.so.12"}, "--cudart '" + dir.path() + "/none.so.12': no such file"},
  };
  for (const auto& [args, message] : cases) {
    SCOPED_TRACE(args.back());
    std::vector<std::string> argv = {OFFLOADCTL_BIN};
    argv.insert(argv.end(), args.begin(), args.end());
    RunResult r = run_program(argv, env, dir.path());
    EXPECT_EQ(r.exit_code(), 2) << describe_status(r.status);
    EXPECT_EQ(r.err, "offloadctl: " + message + "\n(offloadctl doctor --help lists its options)\n");
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  RunResult r = run_program({OFFLOADCTL_BIN, "doctor", "--help"}, env, dir.path());
  EXPECT_EQ(r.exit_code(), 0);
  EXPECT_NE(r.out.find("doctor [--json] [--cudart PATH]"), std::string::npos) << r.out;
  r = run_program({OFFLOADCTL_BIN, "--help"}, env, dir.path());
  EXPECT_NE(r.out.find("doctor [--json]"), std::string::npos) << "the usage lists doctor";
}

// "%.2f" of bytes in GiB, as replay's text prints them.
std::string gib2(double bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f", bytes / (1024.0 * 1024 * 1024));
  return s;
}

// replay --json gives the figures the text prints: the recording, both replays, and under
// --offload the plan, every step's row of the table, the steady state and the verdict.
// plan --persistent --json: the figures of its text as one object, every allocation listed.
TEST(OffloadctlPlan, PersistentJsonCarriesTheFiguresTheTextPrints) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string trace = std::string(OFFLOAD_TRACES_DIR) + "/lora.trace";
  RunResult text = run_program({OFFLOADCTL_BIN, "plan", "--trace", trace, "--persistent"}, {}, dir.path(), 120000);
  RunResult js = run_program({OFFLOADCTL_BIN, "plan", "--trace=" + trace, "--persistent", "--json"}, {}, dir.path(), 120000);
  ASSERT_EQ(text.exit_code(), 0) << text.err;
  ASSERT_EQ(js.exit_code(), 0) << js.err;
  testing::Json j;
  std::string err;
  ASSERT_TRUE(testing::parse_json(js.out, &j, &err)) << err << "\n" << js.out;
  const size_t n = j["allocations"].items.size();
  ASSERT_GT(n, 0u);
  const std::string line = "outliving the step (at least 2 MiB): " + std::to_string(n) + " allocations, " +
                           gib2(j["bytes"].num) + " GiB (" + gib2(j["unused_bytes"].num) + " GiB never touched in the step)";
  EXPECT_NE(text.out.find(line), std::string::npos) << line << "\n" << text.out;
  EXPECT_NE(text.out.find(gib2(j["hidden_bytes"].num) + " GiB in " + j["hidden"].text + " allocations"), std::string::npos)
      << text.out;
  size_t fits = 0;
  for (const testing::Json& a : j["allocations"].items) fits += a["fits"].b;
  EXPECT_EQ(std::to_string(fits), j["hidden"].text);
}

TEST(OffloadctlReplay, JsonCarriesTheFiguresTheTextPrints) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string trace = std::string(OFFLOAD_TRACES_DIR) + "/reference.trace";
  // 4 steps, not 6: the same figures either way, at a third of the time under the sanitizers.
  RunResult text = run_program({OFFLOADCTL_BIN, "replay", trace, "--offload", "0.75", "--steps", "4"}, {}, dir.path(), 120000);
  RunResult js = run_program({OFFLOADCTL_BIN, "replay", trace, "--offload=0.75", "--steps=4", "--json"}, {}, dir.path(), 120000);
  ASSERT_EQ(text.exit_code(), 0) << describe_status(text.status) << "\n" << text.err;
  ASSERT_EQ(js.exit_code(), 0) << describe_status(js.status) << "\n" << js.err;
  testing::Json j;
  std::string err;
  ASSERT_TRUE(testing::parse_json(js.out, &j, &err)) << err << "\n" << js.out;
  EXPECT_TRUE(j["ok"].b);
  const testing::Json& rec = j["recorded"];
  const std::string first = "recorded step " + rec["step"].text + " of " + trace + ": " + rec["launches"].text +
                            " launches (" + rec["kernels"].text + " kernels, " + rec["distinct_kernels"].text +
                            " distinct), " + rec["allocations"].text + " allocations, " + rec["activations"].text +
                            " activations (" + gib2(rec["activation_bytes"].num) + " GiB)";
  EXPECT_EQ(text.out.substr(0, text.out.find('\n')), first);
  ASSERT_EQ(j["replays"].items.size(), 2u);
  const testing::Json& marked = j["replays"].items[0];
  EXPECT_EQ(marked["boundaries"].text, "marked");
  EXPECT_NE(text.out.find("accesses): " + marked["matching_steps"].text + " of " + marked["steps_cut"].text),
            std::string::npos);
  const testing::Json& detected = j["replays"].items[1];
  EXPECT_NE(text.out.find("detector period: " + detected["detector_period"].text + " launches"), std::string::npos);

  const testing::Json& off = j["offload"];
  EXPECT_TRUE(off["installed"].b);
  EXPECT_NE(text.out.find("budget " + gib2(off["budget_bytes"].num) + " GiB of a " +
                          gib2(off["recorded_peak_bytes"].num) + " GiB peak"),
            std::string::npos);
  EXPECT_NE(text.out.find("plan (scaled bytes): " + off["plan"].text + "\n"), std::string::npos);
  EXPECT_NE(text.out.find("plan, rescaled: " + off["arenas"].text + " arenas, " + off["handles"].text + " handles"),
            std::string::npos);
  ASSERT_EQ(off["per_step"].items.size(), static_cast<size_t>(off["steps"].num));
  for (const testing::Json& s : off["per_step"].items) {
    char row[160];
    std::snprintf(row, sizeof row, "  %4s %6s %9s %7s %6s %5s %9s %17s %17s\n", s["step"].text.c_str(),
                  s["plan"].text.c_str(), s["evictions"].text.c_str(), s["reloads"].text.c_str(),
                  s["misses"].text.c_str(), s["late"].text.c_str(), s["abandoned"].text.c_str(),
                  gib2(s["footprint_peak_bytes"].num).c_str(),
                  s["executor_peak_bytes"].type == testing::Json::Null ? "-"
                                                                      : gib2(s["executor_peak_bytes"].num).c_str());
    EXPECT_NE(text.out.find(row), std::string::npos) << "no row " << row << "in\n" << text.out;
  }
  const testing::Json& steady = off["steady"];
  EXPECT_TRUE(steady["within_budget"].b);
  EXPECT_NE(text.out.find("steady state (" + steady["steps"].text + " steps): footprint peak " +
                          gib2(steady["footprint_peak_bytes"].num) + " GiB"),
            std::string::npos);
  const testing::Json& ex = off["executor"];
  EXPECT_NE(text.out.find("executor: " + ex["evictions"].text + " evictions (" + ex["evictions_abandoned"].text +
                          " abandoned), " + ex["reloads"].text + " reloads"),
            std::string::npos);
  EXPECT_NE(text.out.find("content checks: " + off["launches_verified"].text + " launches verified (" +
                          off["words_checked"].text + " words), " + off["mismatches"].text + " mismatches"),
            std::string::npos);
}

// A budget no plan meets: the JSON says which check failed, and the exit status is 1 as for text.
TEST(OffloadctlReplay, JsonOfAFailedReplaySaysWhatFailed) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string trace = std::string(OFFLOAD_TRACES_DIR) + "/reference.trace";
  RunResult r = run_program({OFFLOADCTL_BIN, "replay", trace, "--offload", "0.05", "--steps", "4", "--json"}, {}, dir.path(), 120000);
  EXPECT_EQ(r.exit_code(), 1) << describe_status(r.status);
  testing::Json j;
  std::string err;
  ASSERT_TRUE(testing::parse_json(r.out, &j, &err)) << err << "\n" << r.out;
  EXPECT_FALSE(j["ok"].b);
  EXPECT_FALSE(j["offload"]["ok"].b);
  EXPECT_FALSE(j["offload"]["steady"]["within_budget"].b);
  EXPECT_TRUE(j["replays"].items[0]["ok"].b) << "the observing replays pass";
  r = run_program({OFFLOADCTL_BIN, "replay", trace, "--steps", "4", "--json"}, {}, dir.path(), 120000);
  EXPECT_EQ(r.exit_code(), 0);
  testing::Json plain;
  ASSERT_TRUE(testing::parse_json(r.out, &plain, &err)) << err;
  EXPECT_EQ(plain["offload"].type, testing::Json::Null) << "no --offload, no offload figures";
}

// --cap: the residency manager under the budget; the JSON carries the totals the text prints,
// and a budget no launch fits ends with the refusal said and exit status 1.
TEST(OffloadctlReplay, UnderTheCapTheBudgetHoldsOrTheRefusalIsSaid) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string trace = std::string(OFFLOAD_TRACES_DIR) + "/convnet.trace";
  const std::vector<std::string> args = {OFFLOADCTL_BIN, "replay", trace, "--cap", "0.5", "--steps", "4", "--scale", "1024"};
  RunResult text = run_program(args, {}, dir.path(), 120000);
  std::vector<std::string> json_args = args;
  json_args.push_back("--json");
  RunResult js = run_program(json_args, {}, dir.path(), 120000);
  ASSERT_EQ(text.exit_code(), 0) << describe_status(text.status) << "\n" << text.out << text.err;
  ASSERT_EQ(js.exit_code(), 0) << describe_status(js.status) << "\n" << js.err;
  testing::Json j;
  std::string err;
  ASSERT_TRUE(testing::parse_json(js.out, &j, &err)) << err << "\n" << js.out;
  EXPECT_TRUE(j["ok"].b);
  const testing::Json& cap = j["cap"];
  EXPECT_TRUE(cap["within_budget"].b);
  EXPECT_EQ(cap["per_step"].items.size(), 4u);
  EXPECT_EQ(cap["refusal"].type, testing::Json::Null);
  EXPECT_EQ(cap["mismatches"].num, 0);
  EXPECT_GT(cap["launches_verified"].num, 0);
  const testing::Json& st = cap["residency"];
  EXPECT_GT(st["evictions"].num, 0);
  // The manager's own host time on this machine's CPU (the simulated driver's calls are quick):
  // its scans ahead are part of its busy time.
  EXPECT_GT(st["ahead_ns"].num, 0);
  EXPECT_GE(st["busy_ns"].num, st["ahead_ns"].num);
  EXPECT_GE(st["prefetch_no_room"].num, 0);
  EXPECT_NE(text.out.find("totals: " + st["evictions"].text + " evictions (" + st["ahead"].text + " ahead, " +
                          st["abandoned"].text + " abandoned), " + st["reloads"].text + " reloads on demand, " +
                          st["prefetches"].text + " prefetches"),
            std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("content checks: " + cap["launches_verified"].text + " launches verified (" +
                          cap["words_checked"].text + " words), 0 mismatches"),
            std::string::npos)
      << text.out;

  RunResult r = run_program({OFFLOADCTL_BIN, "replay", trace, "--cap", "0.01", "--scale", "1024", "--json"}, {},
                            dir.path(), 120000);
  EXPECT_EQ(r.exit_code(), 1) << describe_status(r.status);
  testing::Json refused;
  ASSERT_TRUE(testing::parse_json(r.out, &refused, &err)) << err << "\n" << r.out;
  EXPECT_FALSE(refused["ok"].b);
  EXPECT_EQ(refused["cap"]["refusal"].type, testing::Json::String) << r.out;
  EXPECT_FALSE(refused["cap"]["refusal"].text.empty()) << r.out;
  r = run_program({OFFLOADCTL_BIN, "replay", trace, "--cap", "0.01", "--scale", "1024"}, {}, dir.path(), 120000);
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_NE(r.out.find("FAIL: refused: "), std::string::npos) << r.out;
  r = run_program({OFFLOADCTL_BIN, "replay", trace, "--cap", "0.5", "--offload", "0.5"}, {}, dir.path(), 120000);
  EXPECT_NE(r.exit_code(), 0) << "one mode at a time";
}

// Under the cap the manager's policy comes from the shim's own settings: exact tiling maps fewer
// pieces a step and makes more handles than the default (any spares), as on the GPU; a bad value
// is an error naming the variable.
TEST(OffloadctlReplay, UnderTheCapThePolicyComesFromTheShimsSettings) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string trace = std::string(OFFLOAD_TRACES_DIR) + "/convnet.trace";
  const std::vector<std::string> args = {OFFLOADCTL_BIN, "replay", trace,     "--cap", "0.5",
                                         "--steps",      "6",      "--scale", "1024",  "--json"};
  auto counts = [&](const std::map<std::string, std::string>& env, double* maps, double* created) {
    RunResult r = run_program(args, env, dir.path(), 120000);
    ASSERT_EQ(r.exit_code(), 0) << describe_status(r.status) << "\n" << r.err;
    testing::Json j;
    std::string err;
    ASSERT_TRUE(testing::parse_json(r.out, &j, &err)) << err << "\n" << r.out;
    const auto& steps = j["cap"]["per_step"].items;
    ASSERT_EQ(steps.size(), 6u);
    *maps = *created = 0;
    for (size_t i = 2; i < steps.size(); ++i) *maps += steps[i]["maps"].num, *created += steps[i]["created"].num;
  };
  double any_maps = 0, any_created = 0, exact_maps = 0, exact_created = 0;
  counts({}, &any_maps, &any_created);
  counts({{"OFFLOAD_CAP_TILE", "exact"}}, &exact_maps, &exact_created);
  EXPECT_LT(exact_maps, any_maps);
  EXPECT_GT(exact_created, any_created);
  RunResult bad = run_program(args, {{"OFFLOAD_CAP_TILE", "some"}}, dir.path(), 120000);
  EXPECT_EQ(bad.exit_code(), 2);
  EXPECT_NE(bad.err.find("OFFLOAD_CAP_TILE='some' is not valid"), std::string::npos) << bad.err;
}

// trace chrome on a directory of step files: one trace-event JSON with a span per step and the
// kernels under their demangled names, the same on stdout and in -o's file.
TEST(OffloadctlTraceChrome, ADirectoryOfStepsBecomesOneTrace) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  size_t traces = 0;
  for (const auto& e : std::filesystem::directory_iterator(OFFLOAD_TRACES_DIR))
    traces += e.path().extension() == ".trace";
  ASSERT_GT(traces, 1u);
  RunResult r = run_program({OFFLOADCTL_BIN, "trace", "chrome", OFFLOAD_TRACES_DIR}, {}, dir.path());
  ASSERT_EQ(r.exit_code(), 0) << describe_status(r.status) << "\n" << r.err;
  testing::Json j;
  std::string err;
  ASSERT_TRUE(testing::parse_json(r.out, &j, &err)) << err;
  size_t spans = 0, kernels = 0, mangled = 0, native = 0;
  for (const testing::Json& e : j["traceEvents"].items) {
    if (e["ph"].text != "X") continue;
    EXPECT_GE(e["dur"].num, 0) << e["name"].text;
    if (e["tid"].num == 1) ++spans;
    if (e["tid"].num >= 10) {
      ++kernels;
      mangled += e["name"].text.rfind("_Z", 0) == 0;
      native += e["name"].text.find("at::native::") != std::string::npos;
    }
  }
  EXPECT_EQ(spans, traces) << "a span per step";
  EXPECT_GT(kernels, 1000u);
  EXPECT_GT(native, 0u) << "kernel names demangled";
  // convnet's recording holds one cutlass symbol that neither __cxa_demangle nor c++filt reads.
  EXPECT_LT(mangled * 100, kernels) << "kernel names demangled";

  const std::string out = dir.path() + "/steps.json";
  RunResult w = run_program({OFFLOADCTL_BIN, "trace", "chrome", OFFLOAD_TRACES_DIR, "-o", out}, {}, dir.path());
  ASSERT_EQ(w.exit_code(), 0) << w.err;
  EXPECT_TRUE(w.out.empty()) << "the trace goes to the file only";
  EXPECT_EQ(read_file(out), r.out);

  RunResult one =
      run_program({OFFLOADCTL_BIN, "trace", "chrome", std::string(OFFLOAD_TRACES_DIR) + "/reference.trace"}, {}, dir.path());
  ASSERT_EQ(one.exit_code(), 0) << one.err;
  testing::Json j1;
  ASSERT_TRUE(testing::parse_json(one.out, &j1, &err)) << err;
  EXPECT_LT(j1["traceEvents"].items.size(), j["traceEvents"].items.size());
}

TEST(OffloadctlTraceChrome, BadPathsAndOptionsAreSaid) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string none = dir.path() + "/no-such-trace";
  RunResult r = run_program({OFFLOADCTL_BIN, "trace", "chrome", none}, {}, dir.path());
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_EQ(r.err, "offloadctl: cannot open " + none + ": No such file or directory\n");
  EXPECT_TRUE(r.out.empty()) << r.out;
  ASSERT_EQ(mkdir((dir.path() + "/empty").c_str(), 0700), 0);
  r = run_program({OFFLOADCTL_BIN, "trace", "chrome", dir.path() + "/empty"}, {}, dir.path());
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_NE(r.err.find("no step traces (*.trace) in " + dir.path() + "/empty"), std::string::npos) << r.err;
  std::ofstream(dir.path() + "/bad.trace") << "not a trace\n";
  r = run_program({OFFLOADCTL_BIN, "trace", "chrome", dir.path() + "/bad.trace"}, {}, dir.path());
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_EQ(r.err.rfind("offloadctl: " + dir.path() + "/bad.trace: ", 0), 0u) << r.err;
  r = run_program({OFFLOADCTL_BIN, "trace", "chrome", OFFLOAD_TRACES_DIR, "-o", dir.path() + "/no/dir/x.json"}, {},
                  dir.path());
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_NE(r.err.find("cannot write " + dir.path() + "/no/dir/x.json"), std::string::npos) << r.err;

  const std::vector<std::pair<std::vector<std::string>, std::string>> usage = {
      {{"trace", "chrome"}, "trace chrome needs a trace directory or step file"},
      {{"trace", "chrome", none, "-o"}, "-o needs a file name"},
      {{"trace", "chrome", none, "--json"}, "unknown option '--json' for trace chrome"},
      {{"trace", "chrome", none, none}, "trace chrome takes one PATH"},
  };
  for (const auto& [args, message] : usage) {
    SCOPED_TRACE(args.back());
    std::vector<std::string> argv = {OFFLOADCTL_BIN};
    argv.insert(argv.end(), args.begin(), args.end());
    r = run_program(argv, {}, dir.path());
    EXPECT_EQ(r.exit_code(), 2);
    EXPECT_EQ(r.err.rfind("offloadctl: " + message, 0), 0u) << r.err;
    EXPECT_NE(r.err.find("(offloadctl trace --help lists its options)"), std::string::npos) << r.err;
  }
  r = run_program({OFFLOADCTL_BIN, "trace", "--help"}, {}, dir.path());
  EXPECT_EQ(r.exit_code(), 0);
  EXPECT_NE(r.out.find("trace chrome PATH [-o FILE]"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace offload::it

// StepTrace: the per-step trace file (protocol/offload/trace_format.h), its Chrome JSON
// view, and the activation analysis made from a trace alone.
#include "planner/step_trace.h"

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "json_mini.h"
#include "offload/trace_format.h"
#include "planner/plan.h"

namespace offload {
namespace {

using offload::testing::Json;
using offload::testing::parse_json;

StepTrace sample() {
  StepTrace t;
  t.step = 42;
  t.kernels[0] = "void gemm<float, 128>(float const*, float*, int)";
  t.kernels[7] = "at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >";
  t.kernels[9] = "k";
  t.allocs = {
      {0, 1 << 20, 0, -1, -1},
      {1, 4096, 0x2, -1, 1},
      {2, 123456789012ull, 0x7f00deadbeef, 0, 3},
      {3, 1, 0x7f00deadbeef, 2, -1},
  };
  TraceLaunch l0{0, EventKind::Copy, 0, 0x2, 0, 1500, {0, 2}, std::nullopt, 0};
  TraceLaunch l1{1, EventKind::Kernel, 7, 0x7f00deadbeef, 1700, 12345, {2, 1, 0}, 250, 0};
  TraceLaunch l2{2, EventKind::Memset, 0, 0, -1, -1, {3}, std::nullopt, 0};
  TraceLaunch l3{3, EventKind::Graph, 0, 0x2, 20000, 999, {}, std::nullopt, 0};
  TraceLaunch l4{4, EventKind::Kernel, 0, 0, 30000, 1, {3, 0}, std::nullopt, 0};
  TraceLaunch l5{5, EventKind::Kernel, 9, 0x2, -1, -1, {}, std::nullopt, 0};
  t.launches = {l0, l1, l2, l3, l4, l5};
  t.gpu_busy_ns = 14846;
  t.cupti_kernels = 3;
  t.base_unix_ns = 1'764'748'800'123'456'789;
  return t;
}

void expect_equal(const StepTrace& a, const StepTrace& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.kernels, b.kernels);
  EXPECT_EQ(a.gpu_busy_ns, b.gpu_busy_ns);
  EXPECT_EQ(a.cupti_kernels, b.cupti_kernels);
  EXPECT_EQ(a.base_unix_ns, b.base_unix_ns);
  ASSERT_EQ(a.allocs.size(), b.allocs.size());
  for (size_t i = 0; i < a.allocs.size(); ++i) {
    SCOPED_TRACE("alloc " + std::to_string(i));
    EXPECT_EQ(a.allocs[i].ordinal, b.allocs[i].ordinal);
    EXPECT_EQ(a.allocs[i].bytes, b.allocs[i].bytes);
    EXPECT_EQ(a.allocs[i].stream, b.allocs[i].stream);
    EXPECT_EQ(a.allocs[i].alloc_pos, b.allocs[i].alloc_pos);
    EXPECT_EQ(a.allocs[i].free_pos, b.allocs[i].free_pos);
  }
  ASSERT_EQ(a.launches.size(), b.launches.size());
  for (size_t i = 0; i < a.launches.size(); ++i) {
    SCOPED_TRACE("launch " + std::to_string(i));
    const TraceLaunch &x = a.launches[i], &y = b.launches[i];
    EXPECT_EQ(x.pos, y.pos);
    EXPECT_EQ(x.kind, y.kind);
    EXPECT_EQ(x.kernel, y.kernel);
    EXPECT_EQ(x.stream, y.stream);
    EXPECT_EQ(x.gpu_start_ns, y.gpu_start_ns);
    EXPECT_EQ(x.gpu_ns, y.gpu_ns);
    EXPECT_EQ(x.allocs, y.allocs);
    EXPECT_EQ(x.lead_ns, y.lead_ns);
  }
}

std::string text(const StepTrace& t) {
  std::ostringstream os;
  t.write(os);
  return os.str();
}

bool read_text(const std::string& s, StepTrace* out, std::string* err) {
  std::istringstream is(s);
  return StepTrace::read(is, out, err);
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream is(s);
  for (std::string l; std::getline(is, l);) v.push_back(l);
  return v;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& l : v) s += l + "\n";
  return s;
}

// Index of the first line starting with `prefix`.
size_t find_line(const std::vector<std::string>& v, const std::string& prefix) {
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i].rfind(prefix, 0) == 0) return i;
  ADD_FAILURE() << "no line starting with " << prefix;
  return 0;
}

TEST(TraceIo, RoundTripKeepsEveryField) {
  const StepTrace t = sample();
  const std::string s = text(t);
  StepTrace back;
  std::string err;
  ASSERT_TRUE(read_text(s, &back, &err)) << err;
  expect_equal(t, back);
  EXPECT_EQ(text(back), s) << "writing what was read gives the same bytes";
}

TEST(TraceIo, ABaseIsWrittenOnlyWhenKnownAndAMalformedOneIsRefused) {
  StepTrace t = sample();
  auto v = lines(text(t));
  EXPECT_EQ(v[find_line(v, "base ")], "base 1764748800123456789");
  t.base_unix_ns.reset();
  for (const std::string& l : lines(text(t))) EXPECT_NE(l.rfind("base", 0), 0u) << l;
  for (const char* bad : {"base", "base x", "base 1 2", "base -5"}) {
    auto w = lines(text(sample()));
    w[find_line(w, "base ")] = bad;
    StepTrace out;
    std::string err;
    EXPECT_FALSE(read_text(join(w), &out, &err)) << bad;
    EXPECT_NE(err.find("malformed base line"), std::string::npos) << bad << ": " << err;
  }
}

TEST(TraceIo, RoundTripOfAnEmptyStep) {
  StepTrace t;
  t.step = 3;
  StepTrace back;
  std::string err;
  ASSERT_TRUE(read_text(text(t), &back, &err)) << err;
  expect_equal(t, back);
}

TEST(TraceIo, HeaderIsMagicAndVersion) {
  auto v = lines(text(sample()));
  ASSERT_FALSE(v.empty());
  EXPECT_EQ(v[0], std::string(trace_format::kMagic) + " " + std::to_string(trace_format::kMajor) + "." +
                      std::to_string(trace_format::kMinor));
  EXPECT_EQ(v.back(), "end");
}

TEST(TraceIo, RejectsWrongMagic) {
  auto v = lines(text(sample()));
  v[0] = "offload-trac 1.0";
  StepTrace out;
  std::string err;
  EXPECT_FALSE(read_text(join(v), &out, &err));
  EXPECT_NE(err.find("line 1"), std::string::npos) << err;
  EXPECT_NE(err.find("not an offload trace"), std::string::npos) << err;
  EXPECT_FALSE(read_text("", &out, &err));
  EXPECT_FALSE(read_text("{\"traceEvents\":[]}\n", &out, &err));
}

TEST(TraceIo, RejectsAnotherMajorVersionNamingIt) {
  auto v = lines(text(sample()));
  const uint32_t other = trace_format::kMajor + 1;
  v[0] = std::string(trace_format::kMagic) + " " + std::to_string(other) + ".3";
  StepTrace out;
  std::string err;
  EXPECT_FALSE(read_text(join(v), &out, &err));
  EXPECT_NE(err.find(std::to_string(other) + ".3"), std::string::npos) << "names the file's version: " << err;
  EXPECT_NE(err.find(std::to_string(trace_format::kMajor) + ".x"), std::string::npos)
      << "names the version it reads: " << err;
  EXPECT_NE(err.find("not supported"), std::string::npos) << err;
}

TEST(TraceIo, ALeadIsWrittenOnlyWhereMeasuredAndMayBeNegative) {
  StepTrace t = sample();
  std::string s = text(t);
  EXPECT_NE(s.find("launch 1 K 7 7f00deadbeef 1700 12345 3 2 1 0 lead 250\n"), std::string::npos) << s;
  EXPECT_EQ(s.find(" lead ", s.find("launch 2 ")), std::string::npos) << "no other launch has one";
  // A host clock a little ahead of the GPU's reads as a negative lead; it is kept as it is.
  t.launches[1].lead_ns = -40;
  StepTrace out;
  std::string err;
  ASSERT_TRUE(read_text(text(t), &out, &err)) << err;
  EXPECT_EQ(out.launches[1].lead_ns, -40);
  EXPECT_FALSE(out.launches[0].lead_ns.has_value());
}

// Format 1.2: the copies the GPU ran in the step (the shim's own among them), by start, with
// their bytes and direction; a copy in the gap before the first kernel starts below zero.
TEST(TraceIo, TransfersRoundTripWithTheirBytesAndDirection) {
  StepTrace t = sample();
  t.transfers = {{-300, 200, 4096, 1}, {100, 5000, 75497472, 1}, {200, 10, 64, 2}, {300, 1, 1, 8}, {400, 2, 3, 0}};
  const std::string s = text(t);
  EXPECT_NE(s.find("transfer -300 200 4096 h2d\n"), std::string::npos) << s;
  EXPECT_NE(s.find("transfer 200 10 64 d2h\n"), std::string::npos) << s;
  EXPECT_NE(s.find("transfer 300 1 1 d2d\n"), std::string::npos) << s;
  EXPECT_NE(s.find("transfer 400 2 3 other\n"), std::string::npos) << s;
  StepTrace out;
  std::string err;
  ASSERT_TRUE(read_text(s, &out, &err)) << err;
  expect_equal(t, out);
  ASSERT_EQ(out.transfers.size(), t.transfers.size());
  for (size_t i = 0; i < t.transfers.size(); ++i) {
    SCOPED_TRACE("transfer " + std::to_string(i));
    EXPECT_EQ(out.transfers[i].gpu_start_ns, t.transfers[i].gpu_start_ns);
    EXPECT_EQ(out.transfers[i].gpu_ns, t.transfers[i].gpu_ns);
    EXPECT_EQ(out.transfers[i].bytes, t.transfers[i].bytes);
    EXPECT_EQ(out.transfers[i].copy_kind, t.transfers[i].copy_kind);
  }
  // A kind the file has no word for (CUPTI's peer copy, 10) is written as other.
  t.transfers = {{0, 1, 1, 10}};
  ASSERT_TRUE(read_text(text(t), &out, &err)) << err;
  ASSERT_EQ(out.transfers.size(), 1u);
  EXPECT_EQ(out.transfers[0].copy_kind, 0);
  // Malformed transfer lines are refused, each with the same clear word.
  auto v = lines(text(t));
  size_t at = find_line(v, "transfer ");
  for (const char* bad : {"transfer 1 2 3", "transfer 1 2 3 sideways", "transfer 1 -2 3 h2d", "transfer 1 2 3 h2d 9",
                          "transfer x 2 3 h2d"}) {
    auto w = v;
    w[at] = bad;
    EXPECT_FALSE(read_text(join(w), &out, &err)) << bad;
    EXPECT_NE(err.find("malformed transfer line"), std::string::npos) << bad << ": " << err;
  }
}

TEST(TraceIo, AcceptsAnOlderMinorOfTheSameMajor) {
  auto v = lines(text(sample()));
  v[0] = std::string(trace_format::kMagic) + " " + std::to_string(trace_format::kMajor) + ".0";
  StepTrace out;
  std::string err;
  EXPECT_TRUE(read_text(join(v), &out, &err)) << err;
}

TEST(TraceIo, RejectsTruncatedInput) {
  auto v = lines(text(sample()));
  v.pop_back();  // no 'end'
  StepTrace out;
  std::string err;
  EXPECT_FALSE(read_text(join(v), &out, &err));
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;

  // Cut anywhere before the end: never accepted.
  auto full = lines(text(sample()));
  for (size_t keep = 0; keep + 1 < full.size(); ++keep) {
    std::vector<std::string> part(full.begin(), full.begin() + static_cast<ptrdiff_t>(keep));
    EXPECT_FALSE(read_text(join(part), &out, &err)) << "kept " << keep << " lines";
  }
  // Cut in the middle of a line.
  std::string s = text(sample());
  EXPECT_FALSE(read_text(s.substr(0, s.size() / 2), &out, &err));
}

TEST(TraceIo, RejectsCountsThatDoNotMatchTheStepLine) {
  auto v = lines(text(sample()));
  v.erase(v.begin() + static_cast<ptrdiff_t>(find_line(v, "launch 5 ")));  // last launch gone
  StepTrace out;
  std::string err;
  EXPECT_FALSE(read_text(join(v), &out, &err));
  EXPECT_NE(err.find("counts"), std::string::npos) << err;

  v = lines(text(sample()));
  v.erase(v.begin() + static_cast<ptrdiff_t>(find_line(v, "kernel 9 ")));
  EXPECT_FALSE(read_text(join(v), &out, &err));
  EXPECT_NE(err.find("counts"), std::string::npos) << err;
}

TEST(TraceIo, RejectsOutOfRangeOrdinals) {
  StepTrace t = sample();
  t.launches[1].allocs.push_back(static_cast<uint32_t>(t.allocs.size()));  // one past the last
  auto v = lines(text(t));
  StepTrace out;
  std::string err;
  EXPECT_FALSE(read_text(join(v), &out, &err));
  EXPECT_NE(err.find("bad allocation ordinal"), std::string::npos) << err;
  EXPECT_NE(err.find("line " + std::to_string(find_line(v, "launch 1 ") + 1) + ":"), std::string::npos)
      << "names the launch's line: " << err;
}

TEST(TraceIo, RejectsLaunchPositionsOutOfOrder) {
  auto v = lines(text(sample()));
  size_t i = find_line(v, "launch 2 ");
  std::swap(v[i], v[i + 1]);
  StepTrace out;
  std::string err;
  EXPECT_FALSE(read_text(join(v), &out, &err));
  EXPECT_NE(err.find("launch positions out of order"), std::string::npos) << err;
}

TEST(TraceIo, RejectsAllocOrdinalsOutOfOrder) {
  auto v = lines(text(sample()));
  size_t i = find_line(v, "alloc 1 ");
  std::swap(v[i], v[i + 1]);
  StepTrace out;
  std::string err;
  EXPECT_FALSE(read_text(join(v), &out, &err));
  EXPECT_NE(err.find("alloc ordinals out of order"), std::string::npos) << err;
}

TEST(TraceIo, RejectsPositionsPastTheEndOfTheStep) {
  StepTrace t = sample();
  t.allocs[3].free_pos = static_cast<int64_t>(t.launches.size()) + 1;
  StepTrace out;
  std::string err;
  EXPECT_FALSE(read_text(text(t), &out, &err));
  EXPECT_NE(err.find("past the end"), std::string::npos) << err;
  // Freed right after the last launch is a valid position.
  t.allocs[3].free_pos = static_cast<int64_t>(t.launches.size());
  EXPECT_TRUE(read_text(text(t), &out, &err)) << err;
}

TEST(TraceIo, RejectsMalformedRecords) {
  StepTrace out;
  std::string err;
  auto v = lines(text(sample()));
  auto with = [&](size_t i, const std::string& line) {
    auto w = v;
    w[i] = line;
    return join(w);
  };
  size_t launch1 = find_line(v, "launch 1 ");
  EXPECT_FALSE(read_text(with(launch1, "launch 1 X 7 0 0 0 0"), &out, &err)) << "unknown kind";
  EXPECT_FALSE(read_text(with(launch1, "launch 1 K 7"), &out, &err)) << "short launch";
  EXPECT_FALSE(read_text(with(launch1, "launch 1 K 7 0 0 0 2 1"), &out, &err)) << "fewer ordinals than n";
  EXPECT_FALSE(read_text(with(find_line(v, "alloc 2 "), "alloc 2 lots 0 0 3"), &out, &err));
  EXPECT_FALSE(read_text(with(1, "step 42 launches 6"), &out, &err)) << "short step line";
  EXPECT_FALSE(read_text(with(launch1, "launch 1 K 7 0 0 0 0 lead"), &out, &err)) << "lead without ns";
  EXPECT_FALSE(read_text(with(launch1, "launch 1 K 7 0 0 0 0 lead x"), &out, &err)) << "lead not a number";
  EXPECT_FALSE(read_text(with(launch1, "launch 1 K 7 0 0 0 0 lead 5 6"), &out, &err)) << "more after the lead";
  EXPECT_FALSE(read_text(with(launch1, "launch 1 K 7 0 0 0 1 0 0"), &out, &err)) << "more ordinals than n";
  EXPECT_NE(err.find("after its allocations"), std::string::npos) << err;
  EXPECT_FALSE(read_text(with(launch1, "lunch 1 K 7 0 0 0 0"), &out, &err));
  EXPECT_NE(err.find("unknown record"), std::string::npos) << err;
  // A header asking for absurd counts is refused before anything is reserved.
  EXPECT_FALSE(read_text(with(1, "step 1 launches 99999999999 allocs 0 kernels 0 gpu_busy_ns -1 cupti_kernels -1"),
                         &out, &err));
  EXPECT_NE(err.find("implausible"), std::string::npos) << err;
}

// --- Chrome JSON ------------------------------------------------------------------------

Json chrome_of(const std::vector<StepTrace>& steps) {
  std::ostringstream os;
  write_chrome_trace(steps, os);
  Json j;
  std::string err;
  EXPECT_TRUE(parse_json(os.str(), &j, &err)) << err << "\n" << os.str();
  return j;
}
Json chrome(const StepTrace& t) { return chrome_of({t}); }

std::vector<const Json*> events(const Json& j, const std::string& ph) {
  std::vector<const Json*> v;
  if (!j.has("traceEvents") || j["traceEvents"].type != Json::Array) {
    ADD_FAILURE() << "no traceEvents array";
    return v;
  }
  for (const Json& e : j["traceEvents"].items)
    if (e.has("ph") && e["ph"].text == ph) v.push_back(&e);
  return v;
}

// Thread id -> its name, from the thread_name metadata events; every id is an integer.
std::map<int, std::string> thread_names(const Json& j) {
  std::map<int, std::string> m;
  for (const Json* e : events(j, "M"))
    if ((*e)["name"].text == "thread_name") {
      EXPECT_EQ((*e)["tid"].type, Json::Number);
      m[static_cast<int>((*e)["tid"].num)] = (*e)["args"]["name"].text;
    }
  return m;
}

// The complete events on threads named `prefix`...
std::vector<const Json*> x_on(const Json& j, const std::string& prefix) {
  auto names = thread_names(j);
  std::vector<const Json*> v;
  for (const Json* e : events(j, "X")) {
    EXPECT_EQ((*e)["tid"].type, Json::Number) << "thread ids are integers";
    auto it = names.find(static_cast<int>((*e)["tid"].num));
    EXPECT_TRUE(it != names.end()) << "every thread with events is named";
    if (it != names.end() && it->second.rfind(prefix, 0) == 0) v.push_back(e);
  }
  return v;
}

TEST(ChromeJson, OneCompleteEventPerTimedLaunchOnItsNamedStream) {
  const StepTrace t = sample();
  Json j = chrome(t);
  ASSERT_EQ(j.type, Json::Object);
  auto xs = x_on(j, "stream ");
  auto names = thread_names(j);
  std::vector<const TraceLaunch*> timed;
  for (const TraceLaunch& l : t.launches)
    if (l.gpu_start_ns >= 0 && l.gpu_ns >= 0) timed.push_back(&l);
  ASSERT_EQ(xs.size(), timed.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    const Json& e = *xs[i];
    const TraceLaunch& l = *timed[i];
    SCOPED_TRACE("launch " + std::to_string(l.pos));
    ASSERT_TRUE(e.has("ts") && e.has("dur") && e.has("name") && e.has("tid") && e.has("args"));
    EXPECT_DOUBLE_EQ(e["ts"].num, static_cast<double>(l.gpu_start_ns) / 1000.0);
    EXPECT_DOUBLE_EQ(e["dur"].num, static_cast<double>(l.gpu_ns) / 1000.0);
    EXPECT_EQ(e["args"]["pos"].num, l.pos);
    EXPECT_EQ(e["args"]["step"].num, t.step);
    EXPECT_EQ(e["args"]["allocs"].num, l.allocs.size());
    const char* expected_name = l.kind == EventKind::Copy     ? "memcpy"
                                : l.kind == EventKind::Memset ? "memset"
                                : l.kind == EventKind::Graph  ? "graph"
                                                              : nullptr;
    EXPECT_EQ(e["name"].text, expected_name ? expected_name : t.kernels.at(l.kernel));
    std::ostringstream tid;
    tid << "stream 0x" << std::hex << l.stream;
    EXPECT_EQ(names[static_cast<int>(e["tid"].num)], tid.str());
  }
  ASSERT_EQ(x_on(j, "steps").size(), 1u);
  EXPECT_EQ((*x_on(j, "steps")[0])["name"].text, "step 42");
  EXPECT_DOUBLE_EQ((*x_on(j, "steps")[0])["dur"].num, 30.001) << "to the last kernel's end";
}

TEST(ChromeJson, KernelNamesAreDemangledAndOthersKept) {
  EXPECT_EQ(demangle("_ZN2at6native3fooEv"), "at::native::foo()");
  EXPECT_EQ(demangle("_Z6kernelPfi"), "kernel(float*, int)");
  EXPECT_EQ(demangle("ampere_sgemm_128x64_nn"), "ampere_sgemm_128x64_nn");
  EXPECT_EQ(demangle("_Znot a symbol"), "_Znot a symbol");
  StepTrace t;
  t.kernels[1] = "_Z6kernelPfi";
  t.launches.push_back(TraceLaunch{0, EventKind::Kernel, 1, 0, 0, 10, {}, std::nullopt, 0});
  Json j = chrome(t);
  auto xs = x_on(j, "stream ");
  ASSERT_EQ(xs.size(), 1u);
  EXPECT_EQ((*xs[0])["name"].text, "kernel(float*, int)");
}

TEST(ChromeJson, NamesAreEscaped) {
  StepTrace t;
  t.kernels[1] = "void k<\"quoted\", C:\\path>(int)";
  t.launches.push_back(TraceLaunch{0, EventKind::Kernel, 1, 0, 0, 10, {}, std::nullopt, 0});
  Json j = chrome(t);
  auto xs = x_on(j, "stream ");
  ASSERT_EQ(xs.size(), 1u);
  EXPECT_EQ((*xs[0])["name"].text, t.kernels[1]);
}

TEST(ChromeJson, UntimedStepIsStillValidJson) {
  StepTrace t = sample();
  for (TraceLaunch& l : t.launches) l.gpu_start_ns = l.gpu_ns = -1;
  t.gpu_busy_ns = -1;
  Json j = chrome(t);
  EXPECT_TRUE(events(j, "X").empty());
}

// Steps last from milliseconds to seconds and kernels a few microseconds: the timeline
// needs every nanosecond of `ts` (µs with three decimals) however far into the step.
TEST(ChromeJson, TimestampsKeepNanosecondResolutionLateInAStep) {
  StepTrace t;
  t.kernels[1] = "k";
  t.launches.push_back(TraceLaunch{0, EventKind::Kernel, 1, 0, 0, 2500, {}, std::nullopt, 0});
  t.launches.push_back(TraceLaunch{1, EventKind::Kernel, 1, 0, 1'234'567'891, 4'321, {}, std::nullopt, 0});
  Json j = chrome(t);
  auto xs = x_on(j, "stream ");
  ASSERT_EQ(xs.size(), 2u);
  EXPECT_NEAR((*xs[1])["ts"].num, 1234567.891, 0.0005) << "ts written as " << (*xs[1])["ts"].text;
  EXPECT_NEAR((*xs[1])["dur"].num, 4.321, 0.0005);
}

TEST(ChromeJson, TransfersGetATrackPerDirectionAndKeepTheSignOfAnEarlyStart) {
  StepTrace t;
  t.transfers = {{-1500, 2000, 4096, 1}, {7, 3, 64, 2}};
  Json j = chrome(t);
  auto h2d = x_on(j, "copies h2d");
  auto d2h = x_on(j, "copies d2h");
  ASSERT_EQ(h2d.size(), 1u);
  ASSERT_EQ(d2h.size(), 1u);
  EXPECT_NE((*h2d[0])["tid"].num, (*d2h[0])["tid"].num);
  EXPECT_DOUBLE_EQ((*h2d[0])["ts"].num, -1.5) << "written as " << (*h2d[0])["ts"].text;
  EXPECT_DOUBLE_EQ((*h2d[0])["dur"].num, 2.0);
  EXPECT_EQ((*h2d[0])["args"]["bytes"].num, 4096);
  EXPECT_DOUBLE_EQ((*d2h[0])["ts"].num, 0.007);
}

StepTrace one_kernel_step(uint64_t step, int64_t start, int64_t ns) {
  StepTrace t;
  t.step = step;
  t.kernels[1] = "k";
  t.launches.push_back(TraceLaunch{0, EventKind::Kernel, 1, 0, start, ns, {}, std::nullopt, 0});
  t.gpu_busy_ns = ns;
  return t;
}

// torch.profiler writes baseTimeNanoseconds and times from it; ours do the same, so that
// the difference of the two bases lays one trace over the other.
TEST(ChromeJson, StepsWithABaseTimeArePlacedByItAndTheTraceCarriesTheFirst) {
  StepTrace a = one_kernel_step(7, 0, 1000), b = one_kernel_step(8, 100, 2000);
  a.base_unix_ns = 1'764'748'800'000'000'000;
  b.base_unix_ns = *a.base_unix_ns + 5'000'000;
  Json j = chrome_of({a, b});
  ASSERT_TRUE(j.has("baseTimeNanoseconds"));
  EXPECT_EQ(j["baseTimeNanoseconds"].text, "1764748800000000000");
  auto xs = x_on(j, "stream ");
  ASSERT_EQ(xs.size(), 2u);
  EXPECT_DOUBLE_EQ((*xs[0])["ts"].num, 0.0);
  EXPECT_DOUBLE_EQ((*xs[1])["ts"].num, 5000.1) << "5 ms after the first step's zero, plus its start";
  EXPECT_EQ(x_on(j, "steps").size(), 2u);
}

TEST(ChromeJson, StepsWithoutABaseTimeFollowEachOther) {
  Json j = chrome_of({one_kernel_step(1, 0, 1000), one_kernel_step(2, 0, 1000)});
  EXPECT_FALSE(j.has("baseTimeNanoseconds"));
  auto xs = x_on(j, "stream ");
  ASSERT_EQ(xs.size(), 2u);
  EXPECT_GE((*xs[1])["ts"].num, (*xs[0])["ts"].num + (*xs[0])["dur"].num) << "no overlap";
}

// The counter follows the tracked allocations' live bytes at each timed launch's start.
TEST(ChromeJson, ACounterTrackFollowsTheLiveBytes) {
  StepTrace t;
  t.kernels[1] = "k";
  t.allocs = {{0, 100, 0, -1, -1}, {1, 50, 0, 1, 2}};  // 100 throughout; 50 from launch 1 to 2
  for (uint32_t p = 0; p < 3; ++p) t.launches.push_back(TraceLaunch{p, EventKind::Kernel, 1, 0, p * 10, 5, {}, std::nullopt, 0});
  t.gpu_busy_ns = 15;
  Json j = chrome(t);
  auto cs = events(j, "C");
  ASSERT_EQ(cs.size(), 3u);
  const double want[] = {100, 150, 100};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ((*cs[i])["args"]["bytes"].num, want[i]) << i;
    EXPECT_DOUBLE_EQ((*cs[i])["ts"].num, static_cast<double>(i) * 0.01) << i;
  }
}

// --- analyse_activations -----------------------------------------------------------------

constexpr uint64_t K = 1024;

// Live bytes (KiB) before each launch position:
//   0: W                                   1024
//   1: + A 256 + B 512 + S 1 + C 128       1921
//   2: - C 128 + T 2 + L 96 + E 200        2091   <- peak
//   3: - L 96                              1995   (L: a temporary of the turnaround)
//   4: - B 512 + D 256                     1739
//   5:                                     1739
//   6: - D 256 - E 200 + G 64              1347
//   7: - A 256 - S 1 - T 2                 1088
StepTrace activation_step() {
  StepTrace t;
  t.kernels[0] = "k";
  // ordinal, bytes, stream, alloc_pos, free_pos
  t.allocs = {
      {0, 1024 * K, 0, -1, -1},  // W: weights
      {1, 256 * K, 0, 1, 7},     // A: activation, read in the backward (6)
      {2, 512 * K, 0, 1, 4},     // B: activation, never read after the peak
      {3, 1 * K, 0, 1, 7},       // S: small, never read after the peak
      {4, 2 * K, 0, 2, 7},       // T: small, read in the backward (6)
      {5, 128 * K, 0, 1, 2},     // C: temporary, gone by the peak
      {6, 96 * K, 0, 2, 3},      // L: freed right after the peak launch (the loss's input)
      {7, 256 * K, 0, 4, 6},     // D: born after the peak
      {8, 64 * K, 0, 6, -1},     // G: gradient, outlives the step
      {9, 200 * K, 0, 2, 6},     // E: activation born at the peak, read at 5
  };
  std::vector<std::vector<uint32_t>> touches = {
      {0}, {0, 1, 2, 3, 5}, {4, 6, 9, 0}, {0}, {7}, {9}, {1, 4, 8}, {8, 0}};
  for (uint32_t p = 0; p < touches.size(); ++p)
    t.launches.push_back(TraceLaunch{p, EventKind::Kernel, 0, 0, -1, -1, touches[p], std::nullopt, 0});
  return t;
}

TEST(Activations, PeakAndActivationsOfAHandBuiltStep) {
  ActivationReport r = analyse_activations(activation_step());
  EXPECT_EQ(r.peak_pos, 2);
  EXPECT_EQ(r.peak_bytes, 2091 * K);
  EXPECT_EQ(r.turn_pos, 2);  // G, the first gradient, is born after the peak
  EXPECT_EQ(r.activations, 3u);  // A, B, E
  EXPECT_EQ(r.activation_bytes, (256 + 512 + 200) * K);
  EXPECT_EQ(r.without_backward_access, (std::vector<uint32_t>{2}));  // B
  EXPECT_EQ(r.small, 2u);                                             // S, T
  EXPECT_EQ(r.small_without_backward_access, 1u);                     // S
}

// A checkpointed step: the forward keeps only a segment's input X; the backward begins where
// the first weight gradient G is born (2), then remakes the segment (Q, R), and the live bytes
// peak there (4). Q is read once, before the peak, and freed after it.
//   0: W                   1024
//   1: + X 256 + F 128     1408
//   2: - F + G 64          1344   <- turn
//   3: + Q 512             1856
//   4: + R 1024            2880   <- peak
//   5:                     2880
//   6: - R                 1856
//   7: - X - Q             1088
TEST(Activations, UnderCheckpointingTheTurnIsTheFirstGradientNotThePeak) {
  StepTrace t;
  t.kernels[0] = "k";
  t.allocs = {
      {0, 1024 * K, 0, -1, -1},  // W
      {1, 256 * K, 0, 1, 7},     // X: the segment's input, read again in the backward (5)
      {2, 128 * K, 0, 1, 2},     // F: a forward temporary
      {3, 64 * K, 0, 2, -1},     // G: a weight's gradient, outlives the step
      {4, 512 * K, 0, 3, 7},     // Q: remade in the backward, last read before the peak
      {5, 1024 * K, 0, 4, 6},    // R: remade in the backward
  };
  std::vector<std::vector<uint32_t>> touches = {{0}, {0, 1, 2}, {3}, {4}, {5}, {1, 5}, {3}, {0}};
  for (uint32_t p = 0; p < touches.size(); ++p)
    t.launches.push_back(TraceLaunch{p, EventKind::Kernel, 0, 0, -1, -1, touches[p], std::nullopt, 0});
  ActivationReport r = analyse_activations(t);
  EXPECT_EQ(r.peak_pos, 4);
  EXPECT_EQ(r.turn_pos, 2);
  EXPECT_EQ(r.activations, 1u);  // X
  EXPECT_EQ(r.activation_bytes, 256 * K);
  EXPECT_TRUE(r.without_backward_access.empty());  // Q, taken for an activation at the peak, is not one
  // The planner turns there too: its candidates are what the forward saved (X), not Q or R.
  const StepFacts f = step_facts(t, 0);
  EXPECT_EQ(f.peak_pos, 2);
  EXPECT_EQ(f.peak, 2880 * K);
  EXPECT_EQ(f.candidates, (std::vector<uint32_t>{1}));
  // Where no gradient is born in the step (accumulated into ones that exist), the peak is the turn.
  t.allocs[3].alloc_pos = -1;
  r = analyse_activations(t);
  EXPECT_EQ(r.turn_pos, 4);
  EXPECT_EQ(r.without_backward_access, (std::vector<uint32_t>{4}));
}

TEST(Activations, ThresholdDecidesWhatIsSmall) {
  ActivationReport r = analyse_activations(activation_step(), /*min_bytes=*/1);
  EXPECT_EQ(r.activations, 5u);  // A, B, S, T, E (never L: it dies at the turnaround)
  EXPECT_EQ(r.activation_bytes, (256 + 512 + 1 + 2 + 200) * K);
  EXPECT_EQ(r.without_backward_access, (std::vector<uint32_t>{2, 3}));  // B, S
  EXPECT_EQ(r.small, 0u);
  EXPECT_EQ(r.small_without_backward_access, 0u);
}

TEST(Activations, SurvivesTheTraceRoundTrip) {
  StepTrace back;
  std::string err;
  ASSERT_TRUE(read_text(text(activation_step()), &back, &err)) << err;
  ActivationReport r = analyse_activations(back);
  EXPECT_EQ(r.peak_pos, 2);
  EXPECT_EQ(r.activations, 3u);
}

TEST(Activations, EmptyStepHasNoPeak) {
  ActivationReport r = analyse_activations(StepTrace{});
  EXPECT_EQ(r.peak_pos, -1);
  EXPECT_EQ(r.activations, 0u);
}

}  // namespace
}  // namespace offload

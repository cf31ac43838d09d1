#include "planner/step_trace.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <istream>
#include <ostream>
#include <sstream>

#include "offload/trace_format.h"
#include "offload/text.h"

namespace offload {
namespace {

char kind_char(EventKind k) {
  switch (k) {
    case EventKind::Kernel: return 'K';
    case EventKind::Copy: return 'C';
    case EventKind::Memset: return 'M';
    case EventKind::Graph: return 'G';
    default: return '?';
  }
}

bool kind_from(char c, EventKind* k) {
  switch (c) {
    case 'K': *k = EventKind::Kernel; return true;
    case 'C': *k = EventKind::Copy; return true;
    case 'M': *k = EventKind::Memset; return true;
    case 'G': *k = EventKind::Graph; return true;
    default: return false;
  }
}


// A transfer's direction as the file names it; kinds other than these three read back as 0.
const char* direction_name(uint8_t kind) {
  switch (kind) {
    case 1: return "h2d";
    case 2: return "d2h";
    case 8: return "d2d";
    default: return "other";
  }
}
bool direction_from(const std::string& s, uint8_t* kind) {
  if (s == "h2d") *kind = 1;
  else if (s == "d2h") *kind = 2;
  else if (s == "d2d") *kind = 8;
  else if (s == "other") *kind = 0;
  else return false;
  return true;
}
constexpr size_t kMaxTransfers = size_t{1} << 22;

// Nanoseconds as microseconds with all three decimals (the trace-event unit is us).
// A transfer may start before the step's first kernel: negative values keep one sign.
std::string micros(int64_t ns) {
  char b[32];
  const unsigned long long a = ns < 0 ? 0ull - static_cast<unsigned long long>(ns) : static_cast<unsigned long long>(ns);
  snprintf(b, sizeof b, "%s%llu.%03llu", ns < 0 ? "-" : "", a / 1000, a % 1000);
  return b;
}

}  // namespace

size_t StepTrace::kernel_launches() const {
  return static_cast<size_t>(std::count_if(launches.begin(), launches.end(), [](const TraceLaunch& l) {
    return l.kind == EventKind::Kernel;
  }));
}

void StepTrace::write(std::ostream& os) const {
  os << trace_format::kMagic << ' ' << trace_format::kMajor << '.' << trace_format::kMinor << '\n';
  os << "step " << step << " launches " << launches.size() << " allocs " << allocs.size()
     << " kernels " << kernels.size() << " gpu_busy_ns " << gpu_busy_ns << " cupti_kernels "
     << cupti_kernels << '\n';
  if (base_unix_ns) os << "base " << *base_unix_ns << '\n';
  for (const auto& [id, name] : kernels) os << "kernel " << id << ' ' << name << '\n';
  for (const TraceAlloc& a : allocs)
    os << "alloc " << a.ordinal << ' ' << a.bytes << ' ' << std::hex << a.stream << std::dec << ' '
       << a.alloc_pos << ' ' << a.free_pos << '\n';
  for (const TraceLaunch& l : launches) {
    os << "launch " << l.pos << ' ' << kind_char(l.kind) << ' ' << l.kernel << ' ' << std::hex
       << l.stream << std::dec << ' ' << l.gpu_start_ns << ' ' << l.gpu_ns << ' ' << l.allocs.size();
    for (uint32_t o : l.allocs) os << ' ' << o;
    if (l.lead_ns) os << " lead " << *l.lead_ns;
    os << '\n';
  }
  for (const TraceTransfer& x : transfers)
    os << "transfer " << x.gpu_start_ns << ' ' << x.gpu_ns << ' ' << x.bytes << ' ' << direction_name(x.copy_kind) << '\n';
  os << "end\n";
}

namespace {

// The counts the step line announces; the records after it must match them.
struct Counts {
  size_t launches = 0, allocs = 0, kernels = 0;
};

// Each reader below takes one line of the trace; it returns what is wrong with it, or nothing.

std::string read_magic(const std::string& line) {
  std::istringstream ss(line);
  std::string magic;
  uint32_t major = 0, minor = 0;
  char dot = 0;
  if (!(ss >> magic >> major >> dot >> minor) || magic != trace_format::kMagic || dot != '.')
    return "not an offload trace (expected '" + std::string(trace_format::kMagic) + " <major>.<minor>')";
  if (major != trace_format::kMajor)
    return "trace format " + std::to_string(major) + "." + std::to_string(minor) +
           " is not supported (this reader reads " + std::to_string(trace_format::kMajor) + ".x)";
  return {};
}

std::string read_step_line(const std::string& line, StepTrace* out, Counts* c) {
  std::istringstream ss(line);
  std::string w[6];
  if (!(ss >> w[0] >> out->step >> w[1] >> c->launches >> w[2] >> c->allocs >> w[3] >> c->kernels >> w[4] >>
        out->gpu_busy_ns >> w[5] >> out->cupti_kernels) ||
      w[0] != "step" || w[1] != "launches" || w[2] != "allocs" || w[3] != "kernels" || w[4] != "gpu_busy_ns" ||
      w[5] != "cupti_kernels")
    return "malformed step line";
  // Bound what a header may ask us to reserve.
  if (c->launches > (1u << 26) || c->allocs > (1u << 26) || c->kernels > (1u << 24))
    return "implausible counts in step line";
  return {};
}

std::string read_launch(std::istringstream& ss, const Counts& c, StepTrace* out) {
  TraceLaunch l;
  char k = 0;
  size_t n = 0;
  if (!(ss >> l.pos >> k >> l.kernel >> std::hex >> l.stream >> std::dec >> l.gpu_start_ns >> l.gpu_ns >> n) ||
      !kind_from(k, &l.kind))
    return "malformed launch line";
  if (l.pos != out->launches.size()) return "launch positions out of order";
  if (n > c.allocs) return "launch touches more allocations than the step has";
  l.allocs.resize(n);
  for (auto& o : l.allocs)
    if (!(ss >> o) || o >= c.allocs) return "bad allocation ordinal in launch";
  if (std::string more; ss >> more) {
    int64_t lead = 0;
    if (more != "lead" || !(ss >> lead) || (ss >> more))
      return "malformed launch line (after its allocations: 'lead <ns>' or nothing)";
    l.lead_ns = lead;
  }
  out->launches.push_back(std::move(l));
  return {};
}

// A record after the step line, its tag already read from `ss`.
std::string read_record(const std::string& tag, std::istringstream& ss, const Counts& c, StepTrace* out) {
  if (tag == "base") {
    int64_t b = 0;
    std::string more;
    if (!(ss >> b) || (ss >> more) || b < 0) return "malformed base line (base <unix_ns>)";
    out->base_unix_ns = b;
  } else if (tag == "kernel") {
    uint32_t id;
    if (!(ss >> id)) return "malformed kernel line";
    std::string name;
    std::getline(ss >> std::ws, name);
    out->kernels[id] = name;
  } else if (tag == "alloc") {
    TraceAlloc a;
    if (!(ss >> a.ordinal >> a.bytes >> std::hex >> a.stream >> std::dec >> a.alloc_pos >> a.free_pos))
      return "malformed alloc line";
    if (a.ordinal != out->allocs.size()) return "alloc ordinals out of order";
    out->allocs.push_back(a);
  } else if (tag == "launch") {
    return read_launch(ss, c, out);
  } else if (tag == "transfer") {
    TraceTransfer x;
    std::string dir, more;
    if (!(ss >> x.gpu_start_ns >> x.gpu_ns >> x.bytes >> dir) || (ss >> more) || x.gpu_ns < 0 ||
        !direction_from(dir, &x.copy_kind))
      return "malformed transfer line (transfer <start_ns> <ns> <bytes> h2d|d2h|d2d|other)";
    if (out->transfers.size() >= kMaxTransfers) return "implausibly many transfer lines";
    out->transfers.push_back(x);
  } else {
    return "unknown record '" + tag + "'";
  }
  return {};
}

}  // namespace

bool StepTrace::read(std::istream& is, StepTrace* out, std::string* error) {
  auto fail = [&](size_t line, const std::string& why) {
    if (error) *error = "line " + std::to_string(line) + ": " + why;
    return false;
  };
  *out = StepTrace{};
  std::string line;
  size_t ln = 0;
  if (!std::getline(is, line)) return fail(1, "empty input");
  ++ln;
  if (std::string why = read_magic(line); !why.empty()) return fail(ln, why);
  Counts c;
  if (!std::getline(is, line)) return fail(ln + 1, "missing step line");
  ++ln;
  if (std::string why = read_step_line(line, out, &c); !why.empty()) return fail(ln, why);
  out->allocs.reserve(c.allocs);
  out->launches.reserve(c.launches);
  while (std::getline(is, line)) {
    ++ln;
    std::istringstream ss(line);
    std::string tag;
    ss >> tag;
    if (tag == "end") break;
    if (std::string why = read_record(tag, ss, c, out); !why.empty()) return fail(ln, why);
  }
  if (line != "end") return fail(ln, "truncated trace (no 'end')");
  if (out->launches.size() != c.launches || out->allocs.size() != c.allocs || out->kernels.size() != c.kernels)
    return fail(ln, "record counts do not match the step line");
  for (const TraceAlloc& a : out->allocs)
    if (a.alloc_pos > static_cast<int64_t>(c.launches) || a.free_pos > static_cast<int64_t>(c.launches))
      return fail(ln, "allocation position past the end of the step");
  return true;
}

void StepTrace::write_chrome_json(std::ostream& os) const { write_chrome_trace({*this}, os); }

std::string demangle(const std::string& symbol) {
  if (symbol.rfind("_Z", 0) != 0) return symbol;
  int status = 0;
  char* d = abi::__cxa_demangle(symbol.c_str(), nullptr, nullptr, &status);
  std::string out = status == 0 && d ? d : symbol;
  free(d);
  return out;
}

namespace {

// Thread ids of the Chrome trace: small integers, each named by a metadata event.
constexpr int kStepsTid = 1;
constexpr int kFirstCopyTid = 2;     // + a direction's index
constexpr int kFirstStreamTid = 10;  // streams in order of first appearance

int copy_index(uint8_t kind) { return kind == 1 ? 0 : kind == 2 ? 1 : kind == 8 ? 2 : 3; }

// Where a step ends, from its time zero: its last kernel or copy end.
int64_t step_span(const StepTrace& t) {
  int64_t end = 0;
  for (const TraceLaunch& l : t.launches)
    if (l.gpu_start_ns >= 0 && l.gpu_ns >= 0) end = std::max(end, l.gpu_start_ns + l.gpu_ns);
  for (const TraceTransfer& x : t.transfers) end = std::max(end, x.gpu_start_ns + x.gpu_ns);
  return end;
}

// Live bytes of the tracked allocations before each launch position.
std::vector<int64_t> live_bytes(const StepTrace& t) {
  std::vector<int64_t> delta(t.launches.size() + 1, 0);
  int64_t live = 0;
  for (const TraceAlloc& a : t.allocs) {
    const auto b = static_cast<int64_t>(a.bytes);
    if (a.alloc_pos < 0) live += b;
    else if (static_cast<size_t>(a.alloc_pos) < delta.size()) delta[static_cast<size_t>(a.alloc_pos)] += b;
    if (a.free_pos >= 0 && static_cast<size_t>(a.free_pos) < delta.size()) delta[static_cast<size_t>(a.free_pos)] -= b;
  }
  std::vector<int64_t> out(t.launches.size());
  for (size_t p = 0; p < t.launches.size(); ++p) out[p] = live += delta[p];
  return out;
}

void thread_name(std::ostream& os, int tid, const std::string& name) {
  os << ",\n{\"ph\":\"M\",\"pid\":0,\"tid\":" << tid << ",\"name\":\"thread_name\",\"args\":{\"name\":\""
     << json_escape(name) << "\"}}";
}

}  // namespace

void write_chrome_trace(const std::vector<StepTrace>& steps, std::ostream& os) {
  std::optional<int64_t> base0;
  for (const StepTrace& t : steps)
    if (t.base_unix_ns) {
      base0 = t.base_unix_ns;
      break;
    }
  os << "{\"displayTimeUnit\":\"ns\",";
  if (base0) os << "\"baseTimeNanoseconds\":" << *base0 << ',';
  os << "\"traceEvents\":[\n";
  os << "{\"ph\":\"M\",\"pid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"liboffload: GPU time (CUPTI)\"}}";
  thread_name(os, kStepsTid, "steps");
  bool copy_named[4] = {};
  std::map<Stream, int> stream_tid;
  int64_t next = 0;  // where a step without a base time starts
  for (const StepTrace& t : steps) {
    const int64_t span = step_span(t);
    const int64_t off = t.base_unix_ns && base0 ? *t.base_unix_ns - *base0 : next;
    next = std::max(next, off + span + 1000);
    if (t.gpu_busy_ns >= 0)
      os << ",\n{\"ph\":\"X\",\"pid\":0,\"tid\":" << kStepsTid << ",\"name\":\"step " << t.step
         << "\",\"ts\":" << micros(off) << ",\"dur\":" << micros(span) << ",\"args\":{\"gpu_busy_ns\":"
         << t.gpu_busy_ns << ",\"launches\":" << t.launches.size() << "}}";
    std::map<uint32_t, std::string> names;
    const std::vector<int64_t> live = live_bytes(t);
    int64_t last_live = -1;
    for (const TraceLaunch& l : t.launches) {
      if (l.gpu_start_ns < 0 || l.gpu_ns < 0) continue;
      auto [it, fresh] = stream_tid.try_emplace(l.stream, kFirstStreamTid + static_cast<int>(stream_tid.size()));
      if (fresh) {
        char b[40];
        snprintf(b, sizeof b, "stream 0x%llx", static_cast<unsigned long long>(l.stream));
        thread_name(os, it->second, b);
      }
      std::string name;
      if (l.kind == EventKind::Kernel) {
        auto n = names.find(l.kernel);
        if (n == names.end()) n = names.emplace(l.kernel, demangle(t.kernels.count(l.kernel) ? t.kernels.at(l.kernel) : "?")).first;
        name = n->second;
      } else {
        name = l.kind == EventKind::Copy ? "memcpy" : l.kind == EventKind::Memset ? "memset" : "graph";
      }
      os << ",\n{\"ph\":\"X\",\"pid\":0,\"tid\":" << it->second << ",\"name\":\"" << json_escape(name)
         << "\",\"ts\":" << micros(off + l.gpu_start_ns) << ",\"dur\":" << micros(l.gpu_ns)
         << ",\"args\":{\"step\":" << t.step << ",\"pos\":" << l.pos << ",\"allocs\":" << l.allocs.size() << "}}";
      if (live[l.pos] != last_live) {
        last_live = live[l.pos];
        os << ",\n{\"ph\":\"C\",\"pid\":0,\"name\":\"live bytes (tracked allocations)\",\"ts\":"
           << micros(off + l.gpu_start_ns) << ",\"args\":{\"bytes\":" << last_live << "}}";
      }
    }
    for (const TraceTransfer& x : t.transfers) {
      const int i = copy_index(x.copy_kind);
      if (!copy_named[i]) {
        copy_named[i] = true;
        thread_name(os, kFirstCopyTid + i, std::string("copies ") + direction_name(x.copy_kind));
      }
      os << ",\n{\"ph\":\"X\",\"pid\":0,\"tid\":" << kFirstCopyTid + i << ",\"name\":\"copy "
         << direction_name(x.copy_kind) << "\",\"ts\":" << micros(off + x.gpu_start_ns) << ",\"dur\":"
         << micros(x.gpu_ns) << ",\"args\":{\"step\":" << t.step << ",\"bytes\":" << x.bytes << "}}";
    }
  }
  os << "\n]}\n";
}

int64_t turn_position(const StepTrace& t, int64_t peak_pos, uint64_t min_bytes) {
  int64_t turn = peak_pos;
  for (const TraceAlloc& a : t.allocs)
    if (a.alloc_pos >= 0 && a.free_pos < 0 && a.bytes >= min_bytes) turn = std::min(turn, a.alloc_pos);
  return turn;
}

ActivationReport analyse_activations(const StepTrace& t, uint64_t min_bytes) {
  ActivationReport r;
  const int64_t n = static_cast<int64_t>(t.launches.size());
  // Live bytes before each launch position, from births and deaths.
  std::vector<int64_t> delta(static_cast<size_t>(n) + 2, 0);
  int64_t base = 0;
  for (const TraceAlloc& a : t.allocs) {
    if (a.alloc_pos < 0) base += static_cast<int64_t>(a.bytes);
    else delta[static_cast<size_t>(a.alloc_pos)] += static_cast<int64_t>(a.bytes);
    if (a.free_pos >= 0) delta[static_cast<size_t>(a.free_pos)] -= static_cast<int64_t>(a.bytes);
  }
  int64_t live = base;
  for (int64_t p = 0; p < n; ++p) {
    live += delta[static_cast<size_t>(p)];
    if (r.peak_pos < 0 || live > static_cast<int64_t>(r.peak_bytes)) {
      r.peak_bytes = static_cast<uint64_t>(live);
      r.peak_pos = p;
    }
  }
  if (r.peak_pos < 0) return r;
  r.turn_pos = turn_position(t, r.peak_pos, min_bytes);
  std::vector<int64_t> last_use(t.allocs.size(), -1);
  for (const TraceLaunch& l : t.launches)
    for (uint32_t o : l.allocs) last_use[o] = std::max<int64_t>(last_use[o], l.pos);
  for (const TraceAlloc& a : t.allocs) {
    // Freed after the turn, but not at the turnaround itself: tensors the loss function
    // held (the input batch, logits) die when it returns, before any backward launch.
    if (a.alloc_pos < 0 || a.alloc_pos > r.turn_pos || a.free_pos <= r.turn_pos + 1) continue;
    bool unread = last_use[a.ordinal] < r.turn_pos;
    if (a.bytes < min_bytes) {
      ++r.small;
      r.small_without_backward_access += unread;
      continue;
    }
    ++r.activations;
    r.activation_bytes += a.bytes;
    if (unread) r.without_backward_access.push_back(a.ordinal);
  }
  return r;
}

}  // namespace offload

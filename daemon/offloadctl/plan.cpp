// offloadctl plan: what-if planning on a recorded step, without a GPU. The figures go out as
// text (people) or one JSON object (scripts); --html draws the predicted step as a page.
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "planner/plan.h"
#include "planner/planner.h"
#include "planner/recompute_choice.h"
#include "planner/step_trace.h"
#include "common/json_writer.h"
#include "offloadctl/trace_file.h"

using namespace offload;

namespace {
double ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }
long long ll(int64_t v) { return static_cast<long long>(v); }

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char b[1024];
  va_list ap;
  va_start(ap, f);
  vsnprintf(b, sizeof b, f, ap);
  va_end(ap);
  return b;
}

// Text from the trace (its path, kernel names) reaches the page and the JSON only through these.
std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '&') o += "&amp;";
    else if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '"') o += "&quot;";
    else if (c == '\'') o += "&#39;";
    else if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') o += '?';  // not allowed in XML
    else o += c;
  }
  return o;
}
std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += {'\\', c};
    else if (static_cast<unsigned char>(c) < 0x20) o += fmt("\\u%04x", c);
    else o += c;
  }
  return o + "\"";
}

uint64_t weight_bytes(const Plan& p) {
  uint64_t b = 0;
  for (const WeightPlan& w : p.weights) b += w.bytes;
  return b;
}

// Whether the predicted footprint (without a plan: the plain one) meets the budget; none: met.
bool meets(const PlannerResult& r, uint64_t budget) { return !budget || r.prediction.peak_bytes <= budget; }

// A weight plan that waits for its reloads to meet the budget (PlannerOptions::max_weight_stall).
void print_wait(const PlannerResult& r) {
  if (r.stall_ns)
    printf("  of which waits         %8.1f ms for reloads (%.1f%% of the compute), to meet the budget\n", ms(r.stall_ns),
           100 * r.stall_share);
}

// Where the link cannot hide the plan's copies, checkpointing the layers may be the faster way
// to the budget: its estimate beside the plan.
void print_checkpointing(const CheckpointEstimate& c, const Prediction& pr, uint64_t budget) {
  if (!c.known || !link_bound(pr)) return;
  printf("  checkpointing instead  ~%6.1f ms a step (the %zu layers' forward again: %.1f ms), at least %.2f GiB: %s\n",
         ms(c.step_ns), c.layers, ms(c.recompute_ns), gib(c.footprint),
         budget && c.footprint > budget ? "over the budget alone (with offload of the rest, at least that long)"
         : c.step_ns < pr.step_ns       ? "faster than this plan"
                                        : "no faster than this plan");
}

// Of the activations the plan moves, those a kernel could make again instead (choose_recompute).
void print_recompute(const StepTrace& t, const PlannerResult& r) {
  if (r.plan.arenas.empty()) return;
  const RecomputeEstimate e = choose_recompute(t, r);
  if (!e.remade) return;
  printf("  made again instead     %zu of %zu moved activations (%.2f GiB): their kernels %.1f ms against %.1f ms on the "
         "link one way, ~%.1f ms a step (an estimate; OFFLOAD_CAP_RECOMPUTE under the cap)\n",
         e.remade, e.remade + e.moved, gib(e.remade_bytes), ms(e.gpu_ns_added), ms(e.link_ns_saved), ms(e.step_ns));
}

std::string recompute_json(const StepTrace& t, const PlannerResult& r) {
  if (r.plan.arenas.empty()) return "null";
  const RecomputeEstimate e = choose_recompute(t, r);
  return fmt("{\"remade\":%zu,\"moved\":%zu,\"kept\":%zu,\"remade_bytes\":%llu,\"gpu_ns_added\":%lld,"
             "\"link_ns_saved\":%lld,\"step_ns\":%lld}",
             e.remade, e.moved, e.kept, ull(e.remade_bytes), ll(e.gpu_ns_added), ll(e.link_ns_saved), ll(e.step_ns));
}

std::string checkpointing_json(const CheckpointEstimate& c) {
  if (!c.known) return "null";
  return fmt("{\"step_ns\":%lld,\"recompute_ns\":%lld,\"layers\":%zu,\"footprint_at_least\":%llu}", ll(c.step_ns),
             ll(c.recompute_ns), c.layers, ull(c.footprint));
}

void print_json(const std::string& path, const StepTrace& t, const PlannerResult& r, uint64_t budget,
                const CheckpointEstimate& c) {
  const Plan& p = r.plan;
  const Prediction& pr = r.prediction;
  printf("{\"trace\":%s,\"step\":%llu,\"budget\":%llu,\"plain_footprint\":%llu,\"predicted_peak\":%llu,"
         "\"meets_budget\":%s,\"bytes_moved\":%llu,\"predicted_step_ns\":%lld,\"compute_ns\":%lld,\"forward_ns\":%lld,"
         "\"backward_ns\":%lld,\"lower_bound_ns\":%lld,\"hidden_bytes\":%llu,\"hidden_peak\":%llu,"
         "\"hidden_step_ns\":%lld,\"period\":%u,\"segments\":%zu,\"handles\":%u,\"handle_bytes\":%llu,\"spare\":%llu,"
         "\"arenas\":%zu,\"weights\":%zu,\"weight_bytes\":%llu,\"windows\":%zu,\"weight_bytes_mapped\":%llu,"
         "\"weight_wait_ns\":%lld,\"link_bound\":%s,\"checkpointing\":%s,\"recompute\":%s,\"why\":%s}\n",
         json_string(path).c_str(), ull(t.step), ull(budget), ull(r.plain_footprint), ull(pr.peak_bytes),
         meets(r, budget) ? "true" : "false", ull(pr.bytes_out), ll(pr.step_ns), ll(pr.compute_ns), ll(pr.forward_ns),
         ll(pr.backward_ns), ll(pr.lower_bound_ns), ull(r.hidden_bytes), ull(r.hidden_peak), ll(r.hidden_step_ns),
         r.boundaries.period, r.boundaries.starts.size(), p.handles, ull(p.handle_bytes), ull(p.spare), p.arenas.size(),
         p.weights.size(), ull(weight_bytes(p)), p.windows.size(), ull(p.weight_bytes_mapped), ll(r.stall_ns),
         link_bound(pr) ? "true" : "false", checkpointing_json(c).c_str(), recompute_json(t, r).c_str(),
         p.empty() ? json_string(r.why).c_str() : "null");
}

// --sweep: the step planned at 100%, 95%, ... 30% of its footprint without offload, one row
// (or JSON object) each. Two budgets in a row that no plan meets end it: lower ones fare no better.
int sweep(const std::string& path, const StepTrace& t, PlannerOptions o, uint64_t plain, bool json) {
  if (!json) {  // the largest hidden offload: without a budget (at 100% the planner stops early)
    o.budget = 0;
    const PlannerResult h = plan_step(t, o);
    printf("step %llu of %s: %.1f ms of GPU time; footprint without offload %.2f GiB\n", ull(t.step), path.c_str(),
           ms(h.prediction.compute_ns), gib(h.plain_footprint));
    if (h.hidden_bytes)
      printf("largest offload the compute hides: %.2f GiB, footprint %.2f GiB, step %.1f ms\n\n", gib(h.hidden_bytes),
             gib(h.hidden_peak), ms(h.hidden_step_ns));
    else
      printf("largest offload the compute hides: none\n\n");
    const std::string head = "%7s %6s %6s  %-5s %6s  %6s  %-10s %6s  %9s %6s";  // the row's widths
    printf((head + "  %10s\n").c_str(), "budget", "", "peak", "meets", "moved", "arenas", "handles", "step", "x compute",
           "bound", "step/bound");
    printf((head + "\n").c_str(), "%", "GiB", "GiB", "", "GiB", "", "    x MiB", "ms", "", "ms");
  }
  const char* sep = "[";
  int misses = 0;
  uint64_t lowest = ~uint64_t{0};  // the lowest peak of the budgets missed in a row
  for (int pct = 100; pct >= 30; pct -= 5) {
    o.budget = std::max<uint64_t>(1, static_cast<uint64_t>(static_cast<double>(plain) * pct / 100));
    const PlannerResult r = plan_step(t, o);
    const Prediction& pr = r.prediction;
    const bool met = meets(r, o.budget);
    const double x_compute = static_cast<double>(pr.step_ns) / static_cast<double>(std::max<int64_t>(1, pr.compute_ns));
    const double x_bound = static_cast<double>(pr.step_ns) / static_cast<double>(std::max<int64_t>(1, pr.lower_bound_ns));
    if (json) {
      printf("%s{\"budget_percent\":%d,\"budget\":%llu,\"predicted_peak\":%llu,\"meets_budget\":%s,\"bytes_moved\":%llu,"
             "\"arenas\":%zu,\"handles\":%u,\"handle_bytes\":%llu,\"predicted_step_ns\":%lld,\"step_per_compute\":%.3f,"
             "\"lower_bound_ns\":%lld,\"step_per_bound\":%.3f}",
             sep, pct, ull(o.budget), ull(pr.peak_bytes), met ? "true" : "false", ull(pr.bytes_out), r.plan.arenas.size(),
             r.plan.handles, ull(r.plan.handle_bytes), ll(pr.step_ns), x_compute, ll(pr.lower_bound_ns), x_bound);
      sep = ",\n";
    } else {
      printf("%6d%% %6.2f %6.2f  %-5s %6.2f  %6zu  %3u x %-4llu %6.1f  %8.2fx %6.1f  %10.2f\n", pct, gib(o.budget),
             gib(pr.peak_bytes), met ? "yes" : "NO", gib(pr.bytes_out), r.plan.arenas.size(), r.plan.handles,
             ull(r.plan.handle_bytes >> 20), ms(pr.step_ns), x_compute, ms(pr.lower_bound_ns), x_bound);
    }
    misses = met ? 0 : misses + 1;
    lowest = met ? ~uint64_t{0} : std::min(lowest, pr.peak_bytes);
    if (misses == 2 && pct > 30) {
      if (!json)
        printf("stopped: no plan meets %d%% or %d%% of the footprint; the lowest predicted peak there is %.2f GiB (%.0f%%)\n",
               pct + 5, pct, gib(lowest), 100.0 * static_cast<double>(lowest) / static_cast<double>(std::max<uint64_t>(1, plain)));
      break;
    }
  }
  if (json) printf("]\n");
  return 0;
}

// A round step for about `want` ticks over `range`.
double tick_step(double range, int want) {
  const double s = range / want, e = std::pow(10.0, std::floor(std::log10(s)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * e >= s) return m * e;
  return 10 * e;
}

// The predicted step drawn on one time axis: the figures it is drawn from, the axis and the
// SVG written so far.
struct StepDrawing {
  StepDrawing(const StepTrace& trace, const PlannerResult& result, const PlannerOptions& options)
      : t(trace), r(result), o(options), p(r.plan), pr(r.prediction), g(gpu_timeline(t)), f(step_facts(t, o.min_bytes)),
        n(std::min(t.launches.size(), pr.launch_start.size())), na(pr.arenas.size()),
        turn(std::min(n, static_cast<size_t>(f.peak_pos + 1))),
        compute_end(n ? pr.launch_start[n - 1] + g.dur[n - 1] : 0) {
    end = std::max<int64_t>({1, pr.step_ns, compute_end});
    for (const ArenaTiming& a : pr.arenas) end = std::max({end, a.evict_end, a.reload_end});
    s.setf(std::ios::fixed);
    s.precision(1);
  }
  static constexpr double L = 110, W = 1100;  // label column and plot width, px
  static constexpr double Y = 150, H = 220;   // the footprint's top and height, px

  double x(int64_t ns) const { return L + W * static_cast<double>(ns) / static_cast<double>(end); }
  void rect(double y, double h, int64_t a, int64_t b, const char* fill, const std::string& title) {
    s << "<rect x=\"" << x(a) << "\" y=\"" << y << "\" width=\"" << std::max(1.0, x(b) - x(a)) << "\" height=\"" << h
      << "\" fill=\"" << fill << "\"><title>" << xml_escape(title) << "</title></rect>\n";
  }
  void label(double x0, double y, const char* anchor, const std::string& text) {
    s << "<text x=\"" << x0 << "\" y=\"" << y << "\" text-anchor=\"" << anchor << "\">" << xml_escape(text) << "</text>\n";
  }

  const StepTrace& t;
  const PlannerResult& r;
  const PlannerOptions& o;
  const Plan& p;
  const Prediction& pr;
  const GpuTimeline g;
  const StepFacts f;
  const size_t n, na, turn;
  const int64_t compute_end;
  int64_t end = 0;
  std::ostringstream s;
};

// Compute: the forward by layer segment, the backward cut where each arena is first used.
void draw_compute(StepDrawing& d) {
  const PlannerResult& r = d.r;
  const Prediction& pr = d.pr;
  const size_t n = d.n, turn = d.turn;
  std::vector<size_t> cuts = {0, turn, n};
  for (int64_t b : r.boundaries.starts)
    if (b > 0 && static_cast<size_t>(b) < turn) cuts.push_back(static_cast<size_t>(b));
  for (const ArenaPlan& a : d.p.arenas)
    if (a.first_use > static_cast<int64_t>(turn) && static_cast<size_t>(a.first_use) < n) cuts.push_back(static_cast<size_t>(a.first_use));
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  d.label(d.L - 8, 38, "end", "compute");
  for (size_t k = 0, seg = 0; k + 1 < cuts.size(); ++k) {
    const size_t a = cuts[k], b = cuts[k + 1];
    const int64_t t0 = pr.launch_start[a], t1 = b < n ? pr.launch_start[b] : d.compute_end;
    const bool fwd = a < turn;
    d.rect(20, 28, t0, t1, fwd ? (seg % 2 ? "#7b9fc9" : "#4e79a7") : (k % 2 ? "#8cc97f" : "#59a14f"),
           fmt("%s %zu: launches %zu-%zu, %.2f-%.2f ms", fwd ? "forward segment" : "backward part", fwd ? seg : k - seg, a,
               b - 1, ms(t0), ms(t1)));
    if (fwd) ++seg;
  }
}

// Stalls: where a launch starts later than the unshifted timeline plus the stalls before it.
void draw_stalls(StepDrawing& d) {
  const StepTrace& t = d.t;
  const Prediction& pr = d.pr;
  const GpuTimeline& g = d.g;
  for (size_t i = 0; i < d.n; ++i) {
    const int64_t shift = pr.launch_start[i] - g.start[i], before = i ? pr.launch_start[i - 1] - g.start[i - 1] : 0;
    if (shift <= before) continue;
    std::string why;
    for (size_t j = 0; j < d.na; ++j)
      if (pr.arenas[j].stall > 0 && pr.arenas[j].use == pr.launch_start[i]) why += fmt(" %zu", j);
    const TraceLaunch& l = t.launches[i];
    auto name = t.kernels.find(l.kernel);
    d.rect(20, 28, pr.launch_start[i] - (shift - before), pr.launch_start[i], "#e15759",
           fmt("stall of %.3f ms before launch %zu", ms(shift - before), i) +
               (l.kind == EventKind::Kernel && name != t.kernels.end() ? " (" + name->second + ")" : "") +
               (why.empty() ? ": waiting for a handle or a copy out" : ": waiting for the reload of arena" + why));
  }
  if (pr.step_ns > d.compute_end)
    d.rect(20, 28, d.compute_end, pr.step_ns, "#e15759",
           fmt("%.3f ms after the last launch: copies out still running hold the next step", ms(pr.step_ns - d.compute_end)));
}

// The copy queues, one rectangle per arena; the same numbers on both.
void draw_copies(StepDrawing& d) {
  const PlannerResult& r = d.r;
  const Prediction& pr = d.pr;
  d.label(d.L - 8, 72, "end", "D2H (out)");
  d.label(d.L - 8, 100, "end", "H2D (back)");
  for (size_t i = 0; i < d.na; ++i) {
    const ArenaTiming& a = pr.arenas[i];
    const std::string what =
        fmt("arena %zu, segment %lld: %.1f MiB; born %.2f ms; out %.2f-%.2f ms (ready %.2f); reload issued %.2f ms, "
            "in %.2f-%.2f ms; first use %.2f ms; stall %.3f ms",
            i, ll(i < r.arena_segment.size() ? r.arena_segment[i] : -1), static_cast<double>(d.p.arenas[i].used) / (1 << 20),
            ms(a.born), ms(a.evict_start), ms(a.evict_end), ms(a.evict_ready), ms(a.reload_issue), ms(a.reload_start),
            ms(a.reload_end), ms(a.use), ms(a.stall));
    d.rect(58, 20, a.evict_start, a.evict_end, i % 2 ? "#f5a85c" : "#f28e2b", what);
    d.rect(86, 20, a.reload_start, a.reload_end, a.stall > 0 ? "#e15759" : (i % 2 ? "#c99cbd" : "#b07aa1"), what);
  }
}

// The footprint: resident bytes * pool overhead + handles in use, with the plan (by its
// simulated times) and without (by the measured ones). A handle is held from an arena's
// birth to its copy out's end, and from its reload to its last member's free.
void draw_footprint(StepDrawing& d, uint64_t budget) {
  const StepTrace& t = d.t;
  const PlannerResult& r = d.r;
  const PlannerOptions& o = d.o;
  const Plan& p = d.p;
  const Prediction& pr = d.pr;
  const size_t n = d.n, na = d.na;
  const double L = d.L, W = d.W, Y = d.Y, H = d.H;
  std::ostringstream& s = d.s;
  std::vector<int64_t> freed(na, d.compute_end);
  for (size_t i = 0; i < na; ++i) {
    int64_t last = -1;
    for (uint32_t m : p.arenas[i].members) last = t.allocs[m].free_pos < 0 ? static_cast<int64_t>(n) : std::max(last, t.allocs[m].free_pos);
    if (last >= 0 && static_cast<size_t>(last) < n) freed[i] = pr.launch_start[static_cast<size_t>(last)];
  }
  auto with_plan = [&](size_t i) {
    const int64_t at = pr.launch_start[i];
    uint64_t held = 0;
    for (size_t j = 0; j < na; ++j)
      held += (pr.arenas[j].born <= at && at < pr.arenas[j].evict_end) || (pr.arenas[j].reload_issue <= at && at < freed[j]);
    return static_cast<double>(pr.resident[i]) * o.pool_overhead + static_cast<double>(held * p.handle_bytes);
  };
  auto plain = [&](size_t i) { return static_cast<double>(d.f.live[i]) * o.pool_overhead; };
  double top = static_cast<double>(std::max({r.plain_footprint, budget, pr.peak_bytes}));
  for (size_t i = 0; i < n; ++i) top = std::max({top, with_plan(i), plain(i)});
  top = std::max(top * 1.05, 1.0);
  auto y = [&](double bytes) { return Y + H - H * bytes / top; };
  // One point per pixel column, the column's largest value: peaks survive any trace length.
  auto series = [&](auto when, auto value, int64_t until, const char* stroke, const char* title) {
    const size_t cols = static_cast<size_t>(std::ceil(d.x(until) - L)) + 1;
    std::vector<double> col(cols, -1);
    for (size_t i = 0; i < n; ++i) {
      size_t c = std::min(cols - 1, static_cast<size_t>(std::max(0.0, d.x(when(i)) - L)));
      col[c] = std::max(col[c], value(i));
    }
    s << "<polyline fill=\"none\" stroke=\"" << stroke << "\" stroke-width=\"1.5\" points=\"";
    for (size_t c = 0; c < cols; ++c) {
      if (col[c] < 0) col[c] = c ? col[c - 1] : 0;
      s << L + static_cast<double>(c) << ',' << y(col[c]) << ' ';
    }
    s << "\"><title>" << xml_escape(title) << "</title></polyline>\n";
  };
  const double gstep = tick_step(top / (1 << 30), 5);
  for (double v = 0; v * (1 << 30) < top; v += gstep) {
    s << "<line x1=\"" << L << "\" x2=\"" << L + W << "\" y1=\"" << y(v * (1 << 30)) << "\" y2=\"" << y(v * (1 << 30))
      << "\" stroke=\"#ddd\"/>\n";
    d.label(L - 8, y(v * (1 << 30)) + 4, "end", fmt("%g GiB", v));
  }
  auto level = [&](uint64_t bytes, const char* stroke, const char* name, double dy, const std::string& what) {
    const double ly = y(static_cast<double>(bytes));
    s << "<line x1=\"" << L << "\" x2=\"" << L + W << "\" y1=\"" << ly << "\" y2=\"" << ly << "\" stroke=\"" << stroke
      << "\" stroke-dasharray=\"6 4\"><title>" << xml_escape(what) << "</title></line>\n";
    d.label(L + W + 4, ly + dy, "start", fmt("%s %.2f GiB", name, gib(bytes)));
  };
  series([&](size_t i) { return d.g.start[i]; }, plain, d.g.total, "#999", "footprint without offload (measured times)");
  if (na)
    series([&](size_t i) { return pr.launch_start[i]; },
           [&](size_t i) { return static_cast<double>(pr.resident[i]) * o.pool_overhead + static_cast<double>(uint64_t{p.handles} * p.handle_bytes); },
           d.compute_end, "#a9c1dc", "resident * pool overhead + every handle kept: what the predicted peak counts");
  series([&](size_t i) { return pr.launch_start[i]; }, with_plan, d.compute_end, "#4e79a7",
         "footprint with the plan: resident * pool overhead + handles in use (simulated times)");
  if (budget) level(budget, "#e15759", "budget", -3, fmt("budget: %.2f GiB", gib(budget)));
  level(pr.peak_bytes, "#4e79a7", "peak", 12,
        fmt("predicted peak: %.2f GiB (the largest resident * pool overhead, plus every handle kept)", gib(pr.peak_bytes)));
}

// The time ticks, over the compute and under the footprint.
void draw_time_axis(StepDrawing& d) {
  const double tstep = tick_step(ms(d.end), 10);
  for (double v = 0; v <= ms(d.end); v += tstep) {
    const double tx = d.x(static_cast<int64_t>(v * 1e6));
    d.s << "<line x1=\"" << tx << "\" x2=\"" << tx << "\" y1=\"16\" y2=\"" << d.Y + d.H << "\" stroke=\"#eee\"/>\n";
    d.label(tx, 124, "middle", fmt("%g", v));
    d.label(tx, d.Y + d.H + 16, "middle", fmt("%g ms", v));
  }
}

// The page's header: the figures, as the text output gives them.
std::string header_table(const std::string& path, const StepTrace& t, const PlannerResult& r, uint64_t budget,
                         double fraction) {
  const Plan& p = r.plan;
  const Prediction& pr = r.prediction;
  std::string head = "<table>\n";
  auto row = [&](const char* k, const std::string& v) { head += "<tr><th>" + std::string(k) + "</th><td>" + xml_escape(v) + "</td></tr>\n"; };
  row("trace", fmt("step %llu of ", ull(t.step)) + path + fmt(": %zu launches, %zu allocations", t.launches.size(), t.allocs.size()));
  row("plan", p.empty() ? "none: " + r.why : p.describe());
  row("budget", !budget ? "none" : fraction > 0 ? fmt("%.2f GiB (%g%% of the footprint without offload)", gib(budget), 100 * fraction)
                                                 : fmt("%.2f GiB", gib(budget)));
  row("footprint without offload", fmt("%.2f GiB", gib(r.plain_footprint)));
  row("predicted peak", fmt("%.2f GiB", gib(pr.peak_bytes)) + (budget ? (meets(r, budget) ? " (meets the budget)" : " (does NOT meet the budget)") : ""));
  row("moved per step", fmt("%.2f GiB each way in %zu arenas, %u handles of %llu MiB", gib(pr.bytes_out), pr.arenas.size(), p.handles, ull(p.handle_bytes >> 20)));
  row("predicted step", fmt("%.1f ms (%.1f ms exposed)", ms(pr.step_ns), ms(pr.exposed_ns())));
  row("compute", fmt("%.1f ms: forward %.1f, backward %.1f", ms(pr.compute_ns), ms(pr.forward_ns), ms(pr.backward_ns)));
  row("lower bound", fmt("%.1f ms", ms(pr.lower_bound_ns)));
  row("largest hidden offload", r.hidden_bytes ? fmt("%.2f GiB in %u arenas: footprint %.2f GiB, step %.1f ms", gib(r.hidden_bytes),
                                                     r.hidden_arenas, gib(r.hidden_peak), ms(r.hidden_step_ns))
                                               : "none");
  head += "</table>\n";
  return head;
}

// The predicted step on one time axis: compute by segment with its stalls, the D2H and H2D
// queues (an arena a rectangle), and the footprint below. Self-contained: inline SVG and CSS.
std::string html_page(const std::string& path, const StepTrace& t, const PlannerResult& r, const PlannerOptions& o,
                      uint64_t budget, double fraction) {
  StepDrawing d(t, r, o);
  draw_compute(d);
  draw_stalls(d);
  draw_copies(d);
  draw_footprint(d, budget);
  draw_time_axis(d);
  const std::string head = header_table(path, t, r, budget, fraction);
  return "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"/><title>offloadctl plan: " + xml_escape(path) +
         "</title>\n<style>body{font:13px sans-serif;margin:16px}th{text-align:left;padding-right:12px;font-weight:600}"
         "svg text{font:11px sans-serif;fill:#333}</style></head>\n<body>\n<h3>Predicted step</h3>\n" + head +
         "<p>Hover for numbers. Compute: blue forward segments, green backward parts, red stalls. D2H/H2D: one "
         "rectangle per arena (red: its reload stalled the compute). Below: grey without offload, blue with the "
         "plan (light blue: counting every handle kept, as the predicted peak does); dashed: budget, predicted "
         "peak.</p>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
         std::to_string(static_cast<int>(d.L + d.W + 160)) + "\" height=\"" + std::to_string(static_cast<int>(d.Y + d.H + 30)) +
         "\">\n" + d.s.str() + "</svg>\n</body></html>\n";
}

// As the shim plans, with the command line's choices.
PlannerOptions plan_options(const StepTrace& t, uint32_t segments, uint64_t persistent_min, double pool_overhead,
                            bool read_only, double max_weight_wait) {
  PlannerOptions o;
  o.spare_handle = true;  // as the shim plans
  if (segments) o.fallback_segments = segments;
  o.persistent_min = persistent_min;
  if (pool_overhead > 0) o.pool_overhead = pool_overhead;
  if (max_weight_wait >= 0) o.max_weight_stall = max_weight_wait;
  if (read_only && persistent_min)  // as the shim lists the marked weights: ordinals ascending
    for (const TraceAlloc& a : t.allocs)
      if (a.persistent(persistent_min)) o.read_only.push_back(a.ordinal);
  return o;
}

// The plan in text: none and why, a plan of streamed weights alone, or one of arenas.
void print_plan(const StepTrace& t, const PlannerResult& r, uint64_t budget, const CheckpointEstimate& ckpt) {
  const Plan& p = r.plan;
  const Prediction& pr = r.prediction;
  if (p.empty()) {
    printf("no plan: %s\n", r.why.c_str());
  } else if (p.arenas.empty()) {
    printf("plan: %s\n", p.describe().c_str());
    printf("  footprint without offload %8.2f GiB\n", gib(r.plain_footprint));
    printf("  streamed weights       %8.2f GiB (%zu weights, %zu windows; at most %.2f GiB of them mapped at once)\n",
           gib(weight_bytes(p)), p.weights.size(), p.windows.size(), gib(p.weight_bytes_mapped));
    printf("  = predicted peak       %8.2f GiB%s\n", gib(p.predicted_peak),
           budget ? (p.meets_budget ? "  (meets the budget)" : "  (does NOT meet the budget)") : "");
    printf("  moved per step         %8.2f GiB out, %.2f GiB in\n", gib(pr.bytes_out), gib(pr.bytes_in));
    printf("  step                   %8.1f ms predicted (compute %.1f ms; lower bound %.1f ms)\n", ms(pr.step_ns),
           ms(pr.compute_ns), ms(pr.lower_bound_ns));
    print_wait(r);
    print_checkpointing(ckpt, pr, budget);
    if (!p.meets_budget) printf("  %s\n", r.why.c_str());
  } else {
    printf("plan: %s\n", p.describe().c_str());
    printf("  footprint without offload %8.2f GiB\n", gib(r.plain_footprint));
    printf("  resident peak          %8.2f GiB (outside arenas)\n", gib(p.resident_peak));
    printf("  + arena handles        %8.2f GiB (%u x %llu MiB)\n", gib(uint64_t{p.handles} * p.handle_bytes), p.handles,
           ull(p.handle_bytes >> 20));
    printf("  = predicted peak       %8.2f GiB%s\n", gib(p.predicted_peak),
           budget ? (p.meets_budget ? "  (meets the budget)" : "  (does NOT meet the budget)") : "");
    if (p.spare)
      printf("  room for one more handle %6llu MiB kept under the budget (a reload that finds every handle held takes one)\n",
             ull(p.spare >> 20));
    if (pr.bytes_out == pr.bytes_in) printf("  moved per step         %8.2f GiB each way\n", gib(pr.bytes_out));
    else printf("  moved per step         %8.2f GiB out, %.2f GiB in\n", gib(pr.bytes_out), gib(pr.bytes_in));
    printf("  step                   %8.1f ms predicted (compute %.1f ms: forward %.1f, backward %.1f; lower bound %.1f ms)\n",
           ms(pr.step_ns), ms(pr.compute_ns), ms(pr.forward_ns), ms(pr.backward_ns), ms(pr.lower_bound_ns));
    print_wait(r);
    print_checkpointing(ckpt, pr, budget);
    print_recompute(t, r);
  }
}

// --arenas: the plan's arenas and its weights' windows, a row each.
void print_schedule(const PlannerResult& r) {
  const Plan& p = r.plan;
  const Prediction& pr = r.prediction;
  if (!p.arenas.empty()) {
    printf("\n  arena  segment   MiB  evict-after reload-at first-use  out(ms)        in(ms)         stall(ms)\n");
    for (size_t i = 0; i < p.arenas.size(); ++i) {
      const ArenaPlan& a = p.arenas[i];
      const ArenaTiming& at = pr.arenas[i];
      printf("  %5zu  %7lld %6.0f  %11lld %9lld %9lld  %6.1f-%-6.1f  %6.1f-%-6.1f  %6.2f\n", i, ll(r.arena_segment[i]),
             static_cast<double>(a.used) / (1 << 20), ll(a.evict_after), ll(a.reload_at), ll(a.first_use),
             ms(at.evict_start), ms(at.evict_end), ms(at.reload_start), ms(at.reload_end), ms(at.stall));
    }
  }
  if (!p.windows.empty()) {
    printf("\n  window  weight    MiB  evict-after reload-at    use\n");
    for (size_t k = 0; k < p.windows.size(); ++k) {
      const WeightWindow& w = p.windows[k];
      printf("  %6zu  %6u %6.0f  %11lld %9lld %6lld%s\n", k, w.weight,
             static_cast<double>(p.weights[w.weight].bytes) / (1 << 20), ll(w.evict_after), ll(w.reload_at), ll(w.use),
             w.wraps() ? "  (next step)" : "");
    }
  }
}

}  // namespace

// budget: bytes, or 0 for none; fraction (> 0): the budget is that share of the step's
// footprint without offload instead.
// sweep: a row per budget from 100% to 30% of that footprint instead of one plan.
// persistent_min (> 0): weights of at least that many bytes may be streamed instead; read_only:
// all of them marked read-only; max_weight_wait (>= 0): PlannerOptions::max_weight_stall.
int cmd_plan(const std::string& path, uint64_t budget, double fraction, bool arenas, uint32_t segments,
             const std::string& html, bool json, bool sweep_budgets, uint64_t persistent_min, double pool_overhead,
             bool read_only, double max_weight_wait) {
  StepTrace t;
  if (!load_step_trace(path, &t)) return 1;
  PlannerOptions o = plan_options(t, segments, persistent_min, pool_overhead, read_only, max_weight_wait);
  // As plan_step computes PlannerResult::plain_footprint.
  const uint64_t plain = static_cast<uint64_t>(static_cast<double>(step_facts(t, o.min_bytes).peak) * o.pool_overhead);
  if (sweep_budgets) return sweep(path, t, o, plain, json);
  if (fraction > 0) {
    budget = std::max<uint64_t>(1, static_cast<uint64_t>(static_cast<double>(plain) * fraction));
  }
  o.budget = budget;
  PlannerResult r = plan_step(t, o);
  const Prediction& pr = r.prediction;
  if (!html.empty()) {
    std::ofstream os(html, std::ios::trunc);
    os << html_page(path, t, r, o, budget, fraction);
    if (!os.flush()) {
      fprintf(stderr, "offloadctl: cannot write %s\n", html.c_str());
      return 1;
    }
  }
  const CheckpointEstimate ckpt = estimate_checkpointing(t, o.pool_overhead);
  if (json) {
    print_json(path, t, r, budget, ckpt);
    return 0;
  }
  printf("step %llu of %s: %zu launches, %zu allocations, %.1f ms of GPU time (%.0f%% of kernels timed)\n",
         ull(t.step), path.c_str(), t.launches.size(), t.allocs.size(), ms(pr.compute_ns), 100 * gpu_timeline(t).measured);
  if (fraction > 0)
    printf("budget: %.2f GiB, %g%% of the footprint without offload (%.2f GiB)\n", gib(budget), 100 * fraction,
           gib(r.plain_footprint));
  printf("layer period: %u launches (%.0f%% of the forward repeats), %zu segments\n", r.boundaries.period,
         100 * r.boundaries.match, r.boundaries.starts.size());
  if (r.hidden_bytes)
    printf("largest offload the compute hides: %.2f GiB in %u arenas, footprint %.2f GiB, step %.1f ms\n",
           gib(r.hidden_bytes), r.hidden_arenas, gib(r.hidden_peak), ms(r.hidden_step_ns));
  print_plan(t, r, budget, ckpt);
  if (arenas) print_schedule(r);
  if (!html.empty()) printf("timeline: %s\n", html.c_str());
  return 0;
}

// --persistent: what outlives the step, and how long each allocation of it sits unused.
int cmd_plan_persistent(const std::string& path, bool json) {
  StepTrace t;
  if (!load_step_trace(path, &t)) return 1;
  const LinkModel link;
  const PersistentReport r = persistent_windows(t, link);
  size_t hidden = 0;
  for (const PersistentWindow& w : r.windows) hidden += w.hides;
  if (json) {
    JsonWriter w;
    w.object().field("step", t.step).field("step_ns", r.step_ns).field("bytes", r.bytes)
        .field("unused_bytes", r.unused_bytes).field("hidden_bytes", r.hidden_bytes).field("hidden", hidden)
        .field("link_busy_ns", r.link_busy_ns).field("d2h_gbps", link.d2h).field("h2d_gbps", link.h2d).array("allocations");
    for (const PersistentWindow& x : r.windows)
      w.object().field("ordinal", x.ordinal).field("bytes", x.bytes).field("uses", x.uses).field("idle_after", x.after)
          .field("idle_before", x.before).field("idle_ns", x.idle_ns).field("copy_ns", x.copy_ns).field("fits", x.hides).end();
    w.end().end();
    printf("%s\n", w.str().c_str());
    return 0;
  }
  printf("step %llu of %s: %.1f ms of GPU time\n", ull(t.step), path.c_str(), ms(r.step_ns));
  printf("outliving the step (at least 2 MiB): %zu allocations, %.2f GiB (%.2f GiB never touched in the step)\n",
         r.windows.size(), gib(r.bytes), gib(r.unused_bytes));
  printf("idle long enough for a copy out and back (%.1f + %.1f GB/s), each alone: %.2f GiB in %zu allocations;\n"
         "  their copies take %.1f ms of link time in all, against the step's %.1f ms\n",
         link.d2h, link.h2d, gib(r.hidden_bytes), hidden, ms(r.link_busy_ns), ms(r.step_ns));
  if (r.windows.empty()) return 0;
  printf("\n  %8s %6s %9s %9s  %-5s  %s\n", "MiB", "uses", "idle ms", "copy ms", "fits", "idle between launches");
  const size_t shown = std::min<size_t>(r.windows.size(), 12);
  for (size_t i = 0; i < shown; ++i) {
    const PersistentWindow& w = r.windows[i];
    std::string where = w.uses == 0 ? "never used"
                        : w.before <= w.after
                            ? std::to_string(w.after) + " and the next step's " + std::to_string(w.before)
                            : std::to_string(w.after) + " and " + std::to_string(w.before);
    printf("  %8.0f %6zu %9.1f %9.1f  %-5s  %s\n", static_cast<double>(w.bytes) / (1 << 20), w.uses, ms(w.idle_ns),
           ms(w.copy_ns), w.hides ? "yes" : "no", where.c_str());
  }
  if (shown < r.windows.size()) printf("  ... %zu more\n", r.windows.size() - shown);
  return 0;
}

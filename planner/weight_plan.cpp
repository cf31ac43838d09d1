// plan_weights: which idle stretches of the weights to stream out and back (see planner.h).
//
// Time is GPU time, unrolled: unrolled position q is launch q % n of step q / n, starting at
// start[q % n] + (q / n) * T. A window's copy out is ready at the end of its last use; its use
// is at start(use) (+T when it wraps). The link's two queues run at the shared rates (both
// directions busy at once): copies out one FIFO in order of readiness, copies back as late as
// possible, backward from the latest use. The schedule is periodic: each queue also holds the
// neighbouring steps' copies (two steps before for the copies out, two after for the copies
// back), so that a backlog crossing the step boundary delays this step's copies.
#include <algorithm>
#include <cmath>
#include <limits>

#include "planner/planner.h"
#include "planner/weight_unit.h"

namespace offload {
namespace {

int64_t link_ns(uint64_t bytes, double bytes_per_ns) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(static_cast<double>(bytes) / bytes_per_ns)));
}

// Positions of three consecutive steps, and their times.
struct Unrolled {
  const GpuTimeline& g;
  int64_t n;
  int64_t at(int64_t q) const { return g.start[static_cast<size_t>(q % n)] + (q / n) * g.total; }
  // The first q >= 0 starting at or after `x` (3n if none).
  int64_t first_from(int64_t x) const {
    int64_t lo = 0, hi = 3 * n;
    while (lo < hi) {
      int64_t mid = (lo + hi) / 2;
      if (at(mid) >= x) hi = mid;
      else lo = mid + 1;
    }
    return lo;
  }
  // The last q starting at or before `x` (-1 if none).
  int64_t last_by(int64_t x) const {
    int64_t lo = 0, hi = 3 * n;
    while (lo < hi) {
      int64_t mid = (lo + hi) / 2;
      if (at(mid) > x) hi = mid;
      else lo = mid + 1;
    }
    return lo - 1;
  }
};

// A candidate idle stretch of one weight: after launch `a`, before launch `b` (of the next
// step when it wraps).
struct Window {
  uint32_t weight = 0;   // index in the candidates
  int64_t a = 0, b = 0;  // positions in the step
  bool wrap = false;
  int64_t ready = 0, use = 0;      // end(a); start(b) (+T)
  int64_t d2h_ns = 0, h2d_ns = 0;  // at the shared rates
  int64_t idle() const { return use - ready; }
  int64_t b_unrolled(int64_t n) const { return b + (wrap ? n : 0); }
};

struct Timing {
  int64_t d2h_start = 0, d2h_end = 0, h2d_start = 0, h2d_end = 0;
  int64_t reload_q = 0;            // unrolled position the reload is issued at
  int64_t span_from = 0, span_to = 0;  // unrolled positions where the weight is absent: [from, to)
  bool feasible = false;
};

// The step's queues with the windows `sel` streamed; false when a window's copy back would
// have to start before its copy out ends, or a direction needs more than the step.
bool schedule(const Unrolled& u, const std::vector<Window>& w, const std::vector<uint32_t>& sel,
              std::vector<Timing>& tm) {
  const int64_t T = u.g.total;
  tm.assign(sel.size(), Timing{});
  int64_t out_ns = 0, in_ns = 0;
  for (uint32_t i : sel) out_ns += w[i].d2h_ns, in_ns += w[i].h2d_ns;
  bool all = out_ns <= T && in_ns <= T;
  struct Job {
    int64_t t;
    uint32_t i;  // in sel
    int k;       // the step: 0 is this one
  };
  std::vector<Job> jobs;
  jobs.reserve(sel.size() * 3);
  // Copies out: this step's and the two before, FIFO by readiness.
  for (uint32_t i = 0; i < sel.size(); ++i)
    for (int k = -2; k <= 0; ++k) jobs.push_back(Job{w[sel[i]].ready + k * T, i, k});
  std::sort(jobs.begin(), jobs.end(), [](const Job& x, const Job& y) { return x.t != y.t ? x.t < y.t : x.i < y.i; });
  int64_t free_at = std::numeric_limits<int64_t>::min();
  for (const Job& j : jobs) {
    const int64_t s = std::max(j.t, free_at), e = s + w[sel[j.i]].d2h_ns;
    free_at = e;
    if (j.k == 0) tm[j.i].d2h_start = s, tm[j.i].d2h_end = e;
  }
  // Copies back: this step's and the two after, as late as possible from the latest use.
  jobs.clear();
  for (uint32_t i = 0; i < sel.size(); ++i)
    for (int k = 0; k <= 2; ++k) jobs.push_back(Job{w[sel[i]].use + k * T, i, k});
  std::sort(jobs.begin(), jobs.end(), [](const Job& x, const Job& y) { return x.t != y.t ? x.t > y.t : x.i > y.i; });
  int64_t busy_from = std::numeric_limits<int64_t>::max();
  for (const Job& j : jobs) {
    const int64_t e = std::min(j.t, busy_from), s = e - w[sel[j.i]].h2d_ns;
    busy_from = s;
    if (j.k == 0) tm[j.i].h2d_start = s, tm[j.i].h2d_end = e;
  }
  for (uint32_t i = 0; i < sel.size(); ++i) {
    const Window& x = w[sel[i]];
    Timing& m = tm[i];
    // Issued at the last launch starting by the copy's planned start (after the copy out's
    // last use, at the latest at the use itself).
    m.reload_q = std::clamp(u.last_by(m.h2d_start), x.a + 1, x.b_unrolled(u.n));
    m.span_from = u.first_from(m.d2h_end);
    m.span_to = std::max(m.span_from, m.reload_q);
    // It fits when the copy back starts after the copy out ends, and the launch issuing it
    // starts after that too (the weight is out for at least one launch: the executor never
    // finds its own eviction still running).
    m.feasible = m.h2d_start > m.d2h_end && m.span_from < m.span_to;
    all = all && m.feasible;
  }
  return all;
}

bool covers(const Timing& m, int64_t p, int64_t n) {
  for (int64_t q = p; q < 3 * n; q += n)
    if (m.span_from <= q && q < m.span_to) return true;
  return false;
}

// Adds `v` over the positions of the unrolled span [from, to) folded into one step.
void add_span(std::vector<int64_t>& diff, int64_t from, int64_t to, int64_t n, int64_t v) {
  if (from >= to) return;
  const int64_t len = std::min(to - from, n), s = from % n, e = s + len;
  diff[static_cast<size_t>(s)] += v;
  diff[static_cast<size_t>(std::min(e, n))] -= v;
  if (e > n) {
    diff[0] += v;
    diff[static_cast<size_t>(e - n)] -= v;
  }
}

// Into `v`, whose memory the caller may keep from call to call (a step of moe's 38175 launches
// is 300 KiB a vector: allocated afresh for every window the greedy tried, the page faults of
// zeroing them were 64% of its time).
void prefix_into(const std::vector<int64_t>& diff, int64_t n, std::vector<int64_t>& v) {
  v.resize(static_cast<size_t>(n));
  int64_t c = 0;
  for (int64_t p = 0; p < n; ++p) v[static_cast<size_t>(p)] = c += diff[static_cast<size_t>(p)];
}

std::vector<int64_t> prefix(const std::vector<int64_t>& diff, int64_t n) {
  std::vector<int64_t> v;
  prefix_into(diff, n, v);
  return v;
}

// The step cannot be shorter than its compute `T`, nor than either direction's bytes at that
// direction's rate alone.
int64_t lower_bound(int64_t T, uint64_t bytes_out, uint64_t bytes_in, const LinkModel& link) {
  return std::max({T, bytes_out ? link_ns(bytes_out, link.d2h * link.scale) : 0,
                   bytes_in ? link_ns(bytes_in, link.h2d * link.scale) : 0});
}

PlannerResult plan_hidden(const StepTrace& t, const GpuTimeline& g, const PlannerOptions& o, const PlannerResult* arenas) {
  PlannerResult r;
  const int64_t n = static_cast<int64_t>(t.launches.size());
  Plan& p = r.plan;
  if (arenas && (arenas->plan.arenas.empty() || arenas->prediction.resident.size() != static_cast<size_t>(n))) arenas = nullptr;
  if (arenas) {
    r = *arenas;  // the arenas' plan and prediction, weights added below
  } else {
    p.budget = o.budget;
    p.step_launches = static_cast<uint64_t>(n);
    p.tokens = step_tokens(t);
    p.member_index.assign(static_cast<size_t>(n) + 1, 0);
    r.prediction = simulate(t, g, p, o.link, o.pool_overhead);
  }
  if (n == 0) {
    r.why = "the step has no launches";
    return r;
  }
  const StepFacts f = step_facts(t, o.min_bytes);
  p.plain_peak = p.resident_peak = f.peak;
  if (!arenas) {
    p.candidates = f.candidates.size();
    p.candidate_bytes = f.candidate_bytes;
  }
  r.plain_footprint = static_cast<uint64_t>(static_cast<double>(f.peak) * o.pool_overhead);
  const int64_t T = g.total;

  // The footprint without streaming: the shim's own blocks (persistent, at least
  // persistent_min) are exact, in whole granules; the rest sits in PyTorch's pool.
  uint64_t persistent = 0, persistent_rounded = 0;
  std::vector<uint32_t> cand;  // ordinals of the weights that may stream
  std::vector<std::vector<int64_t>> uses(t.allocs.size());
  for (const TraceLaunch& l : t.launches)
    for (uint32_t a : l.allocs)
      if (a < uses.size()) uses[a].push_back(l.pos);
  for (const TraceAlloc& a : t.allocs) {
    if (!o.persistent_min || !a.persistent(o.persistent_min)) continue;
    persistent += a.bytes;
    std::vector<int64_t>& us = uses[a.ordinal];
    std::sort(us.begin(), us.end());
    us.erase(std::unique(us.begin(), us.end()), us.end());
    if (!us.empty()) cand.push_back(a.ordinal);
  }
  // The executor reloads weights in units (weight_unit) and maps a weight that is no multiple
  // of the unit on whole units too, in the room its block's range has past its end
  // (PersistentPool): lora's embedding and head, 376 MiB, on six units of 72 (432 MiB), so
  // that every leaving weight's memory serves them. Such a weight counts at that size. The
  // unit here is the candidates'; the executor's, that of the weights streamed: the same when
  // all of them stream, as on lora.
  std::vector<uint64_t> cand_sizes;
  for (uint32_t c : cand) cand_sizes.push_back(round_up(t.allocs[c].bytes, o.granularity));
  const uint64_t unit = weight_unit(cand_sizes);
  auto block = [&](uint64_t bytes) {
    const uint64_t b = round_up(bytes, o.granularity);
    return in_units(b, unit) ? round_up(b, unit) : b;
  };
  for (const TraceAlloc& a : t.allocs)
    if (o.persistent_min && a.persistent(o.persistent_min))
      persistent_rounded += uses[a.ordinal].empty() ? round_up(a.bytes, o.granularity) : block(a.bytes);
  // With arenas, live bytes outside them (their members are in the handles, counted whole).
  std::vector<int64_t> live = live_bytes(t, nullptr);
  int64_t handles = 0;
  if (arenas) {
    for (int64_t q = 0; q < n; ++q) live[static_cast<size_t>(q)] = static_cast<int64_t>(arenas->prediction.resident[static_cast<size_t>(q)]);
    handles = static_cast<int64_t>(uint64_t{arenas->plan.handles} * arenas->plan.handle_bytes);
  }
  // PyTorch's pool keeps what it reserved (its release threshold is the maximum): the pooled
  // bytes count at their peak before every launch, and only the weights' own blocks come and
  // go. (Planned per launch instead, the pool's peak and the weights' peak coincide on the GPU
  // and the plan passes its budget by far.)
  const int64_t pooled = pooled_peak(live, persistent);
  const int64_t base_bytes = static_cast<int64_t>(static_cast<double>(pooled) * o.pool_overhead) +
                             static_cast<int64_t>(persistent_rounded) + handles;
  std::vector<int64_t> base(static_cast<size_t>(n), base_bytes);

  // Candidate windows: between consecutive uses, and across the boundary (never between
  // adjacent launches: nothing runs there to hide a copy).
  const double d2h = o.link.d2h_shared * o.link.scale, h2d = o.link.h2d_shared * o.link.scale;
  std::vector<Window> w;
  for (uint32_t c = 0; c < cand.size(); ++c) {
    const TraceAlloc& a = t.allocs[cand[c]];
    const std::vector<int64_t>& us = uses[a.ordinal];
    auto add = [&](int64_t from, int64_t to, bool wrap) {
      if (to + (wrap ? n : 0) == from + 1) return;
      Window x;
      x.weight = c, x.a = from, x.b = to, x.wrap = wrap;
      x.ready = g.start[static_cast<size_t>(from)] + g.dur[static_cast<size_t>(from)];
      x.use = g.start[static_cast<size_t>(to)] + (wrap ? T : 0);
      // Read-only: copied out once, in a step before the plan's steady state; nothing after.
      x.d2h_ns = std::binary_search(o.read_only.begin(), o.read_only.end(), a.ordinal) ? 0 : link_ns(a.bytes, d2h);
      x.h2d_ns = link_ns(a.bytes, h2d);
      w.push_back(x);
    };
    for (size_t i = 0; i + 1 < us.size(); ++i) add(us[i], us[i + 1], false);
    add(us.back(), us.front(), true);
  }

  // Each window alone: whether its copies fit, and where it would be absent.
  const Unrolled u{g, n};
  std::vector<Timing> alone(w.size());
  size_t too_short = 0;
  for (uint32_t i = 0; i < w.size(); ++i) {
    std::vector<Timing> one;
    schedule(u, w, {i}, one);
    alone[i] = one[0];
    too_short += !alone[i].feasible;
  }

  // Greedy: at the peak, stream the largest window that covers it, while the schedule of
  // everything chosen stays feasible.
  enum : char { kFree, kChosen, kRejected };
  std::vector<char> state(w.size(), kFree);
  std::vector<uint32_t> sel;
  std::vector<Timing> tm;
  std::vector<int64_t> absent_raw(static_cast<size_t>(n), 0), foot(base);
  // The footprint (and the streamed bytes absent) before each launch, with `sel` timed as `tm`.
  std::vector<int64_t> d, dr, absent;  // fold's, kept
  auto fold = [&](const std::vector<Timing>& times, std::vector<int64_t>& out_foot, std::vector<int64_t>& out_raw) {
    d.assign(static_cast<size_t>(n) + 1, 0);
    dr.assign(static_cast<size_t>(n) + 1, 0);
    for (size_t k = 0; k < sel.size(); ++k) {
      const uint64_t b = t.allocs[cand[w[sel[k]].weight]].bytes;
      add_span(d, times[k].span_from, times[k].span_to, n, static_cast<int64_t>(block(b)));
      add_span(dr, times[k].span_from, times[k].span_to, n, static_cast<int64_t>(b));
    }
    prefix_into(d, n, absent);
    prefix_into(dr, n, out_raw);
    for (int64_t q = 0; q < n; ++q) out_foot[static_cast<size_t>(q)] = base[static_cast<size_t>(q)] - absent[static_cast<size_t>(q)];
  };
  int64_t unmet_at = -1;
  std::vector<Timing> next;
  std::vector<int64_t> next_foot(foot.size()), next_raw;
  while (o.budget) {
    if (o.progress) o.progress();
    const int64_t peak = std::max_element(foot.begin(), foot.end()) - foot.begin();
    if (static_cast<uint64_t>(std::max<int64_t>(0, foot[static_cast<size_t>(peak)])) <= o.budget) break;
    int64_t best = -1;
    for (uint32_t i = 0; i < w.size(); ++i) {
      if (state[i] != kFree || !alone[i].feasible || !covers(alone[i], peak, n)) continue;
      if (best < 0) {
        best = i;
        continue;
      }
      const uint64_t bi = t.allocs[cand[w[i].weight]].bytes, bb = t.allocs[cand[w[static_cast<size_t>(best)].weight]].bytes;
      if (bi > bb || (bi == bb && w[i].idle() > w[static_cast<size_t>(best)].idle())) best = i;
    }
    if (best < 0) {
      unmet_at = peak;
      break;
    }
    sel.push_back(static_cast<uint32_t>(best));
    // Kept only if everything chosen still fits, the new one still covers the peak once it
    // queues behind the others, and the others' shorter absences raise no launch above the
    // peak.
    bool keep = schedule(u, w, sel, next) && covers(next.back(), peak, n);
    if (keep) {
      fold(next, next_foot, next_raw);
      keep = *std::max_element(next_foot.begin(), next_foot.end()) <= foot[static_cast<size_t>(peak)];
    }
    if (keep) {
      state[static_cast<size_t>(best)] = kChosen;
      std::swap(tm, next);
      std::swap(foot, next_foot);
      std::swap(absent_raw, next_raw);
    } else {
      sel.pop_back();
      state[static_cast<size_t>(best)] = kRejected;
    }
  }

  // The plan: weights in ordinal order, their windows by evict_after.
  std::vector<int64_t> weight_of(cand.size(), -1);
  std::vector<uint32_t> order(sel.size());
  for (uint32_t k = 0; k < sel.size(); ++k) order[k] = k;
  std::sort(order.begin(), order.end(), [&](uint32_t x, uint32_t y) {
    const Window &a = w[sel[x]], &b = w[sel[y]];
    return a.a != b.a ? a.a < b.a : a.weight < b.weight;
  });
  std::vector<char> streamed(cand.size(), 0);
  for (uint32_t i : sel) streamed[w[i].weight] = 1;
  uint64_t host = 0;
  for (const ArenaPlan& a : p.arenas) host = std::max(host, a.host_offset + a.used);
  uint64_t streamed_bytes = 0;
  for (uint32_t c = 0; c < cand.size(); ++c) {
    if (!streamed[c]) continue;
    const TraceAlloc& a = t.allocs[cand[c]];
    host = round_up(host, 4096);
    weight_of[c] = static_cast<int64_t>(p.weights.size());
    p.weights.push_back(WeightPlan{a.ordinal, a.bytes, host, a.base, a.id});
    host += a.bytes;
    streamed_bytes += a.bytes;
  }
  uint64_t moved = 0, moved_out = 0;
  for (uint32_t k : order) {
    const Window& x = w[sel[k]];
    WeightWindow ww;
    ww.weight = static_cast<uint32_t>(weight_of[x.weight]);
    ww.evict_after = x.a;
    ww.reload_at = tm[k].reload_q % n;
    ww.use = x.b;
    p.windows.push_back(ww);
    moved += t.allocs[cand[x.weight]].bytes;
    if (x.d2h_ns) moved_out += t.allocs[cand[x.weight]].bytes;
  }
  // Mapped: from a reload's issue to the end of the copy out, by position, in whole granules
  // (the executor maps each weight's whole block).
  {
    std::vector<int64_t> d(static_cast<size_t>(n) + 1, 0);
    uint64_t streamed_blocks = 0;
    for (uint32_t c = 0; c < cand.size(); ++c)
      if (streamed[c]) streamed_blocks += block(t.allocs[cand[c]].bytes);
    for (size_t k = 0; k < sel.size(); ++k)
      add_span(d, tm[k].span_from, tm[k].span_to, n,
               static_cast<int64_t>(block(t.allocs[cand[w[sel[k]].weight]].bytes)));
    const std::vector<int64_t> absent = prefix(d, n);
    const int64_t least_absent = sel.empty() ? 0 : *std::min_element(absent.begin(), absent.end());
    p.weight_bytes_mapped = sel.empty() ? 0 : streamed_blocks - static_cast<uint64_t>(least_absent);
    p.weight_mapped_at.clear();
    if (!sel.empty())
      for (int64_t q = 0; q < n; ++q) p.weight_mapped_at.push_back(streamed_blocks - static_cast<uint64_t>(absent[static_cast<size_t>(q)]));
  }
  (void)streamed_bytes;

  const uint64_t peak = static_cast<uint64_t>(std::max<int64_t>(0, *std::max_element(foot.begin(), foot.end())));
  p.predicted_peak = peak;
  p.meets_budget = !o.budget || peak <= o.budget;
  // Every chosen copy fits its window in the schedule: the step runs at the compute's pace.
  Prediction& pr = r.prediction;
  pr.peak_bytes = peak;
  // With arenas, their copies and stalls as simulated (the link's share the weights take
  // from them is not modelled: both plans assume the shared rates).
  const uint64_t out = pr.bytes_out + (arenas ? moved_out : 0), in = pr.bytes_in + (arenas ? moved : 0);
  pr.bytes_out = arenas ? out : moved_out;
  pr.bytes_in = arenas ? in : moved;
  pr.step_ns = arenas ? std::max(arenas->prediction.step_ns, T) : T;
  pr.lower_bound_ns = lower_bound(T, pr.bytes_out, pr.bytes_in, o.link);
  uint64_t resident_peak = 0;
  for (int64_t q = 0; q < n && q < static_cast<int64_t>(pr.resident.size()); ++q) {
    uint64_t& v = pr.resident[static_cast<size_t>(q)];
    v = static_cast<uint64_t>(std::max<int64_t>(0, live[static_cast<size_t>(q)] - absent_raw[static_cast<size_t>(q)]));
    resident_peak = std::max(resident_peak, v);
  }
  p.resident_peak = resident_peak;
  p.pooled_peak = static_cast<uint64_t>(std::max<int64_t>(0, pooled));
  p.predicted_step_ns = pr.step_ns;
  p.compute_ns = pr.compute_ns;
  p.lower_bound_ns = pr.lower_bound_ns;

  if (p.windows.empty()) {
    if (!o.persistent_min) r.why = "weights are not streamed (no persistent_min)";
    else if (cand.empty()) r.why = "nothing of at least " + std::to_string(o.persistent_min) + " bytes outlives the step and is used in it";
    else if (w.empty()) r.why = "no weight sits idle between two launches";
    else if (!o.budget) r.why = "no budget: weights are streamed only to meet one";
    else if (p.meets_budget) r.why = "the step's footprint with the weights in exact blocks (" + gib_text(peak) + ") is within the budget";
  }
  if (!p.meets_budget) {
    r.unmet_at = unmet_at;
    r.why = "no window whose copies fit covers the peak (" + gib_text(peak) + " before launch " + std::to_string(unmet_at) +
            "); " + std::to_string(too_short) + " of " + std::to_string(w.size()) + " windows are too short for their copies";
  }
  return r;
}

}  // namespace

GpuTimeline dilated(const GpuTimeline& g, double factor) {
  GpuTimeline w = g;
  if (factor <= 1) return w;
  auto at = [&](int64_t x) { return static_cast<int64_t>(std::llround(static_cast<double>(x) * factor)); };
  for (int64_t& s : w.start) s = at(s);
  const size_t n = w.start.size();
  w.total = at(g.total);
  for (size_t i = 0; i < n; ++i) w.dur[i] = (i + 1 < n ? w.start[i + 1] : w.total) - w.start[i];
  return w;
}

PlannerResult plan_weights_waiting(const StepTrace& t, const GpuTimeline& g, const PlannerOptions& o,
                                   const PlannerResult* arenas, PlannerResult hidden) {
  if (hidden.plan.meets_budget || !o.budget || hidden.unmet_at < 0 || o.max_weight_stall <= 0) return hidden;
  // The step waiting for its reloads, as if every launch took longer by the same share: the
  // link has that much more time everywhere between a weight's copy out and its use. The least
  // share, by bisection, that meets the budget; none when the whole allowance does not (the plan
  // that hides everything, said as not met). Where the step waits is the executor's to find:
  // at the uses whose reloads are late, in order.
  GpuTimeline longest = dilated(g, 1 + o.max_weight_stall);
  PlannerResult most = plan_hidden(t, longest, o, arenas);
  if (!most.plan.meets_budget) return hidden;
  double lo = 0, hi = o.max_weight_stall;
  int64_t total = longest.total;
  for (int i = 0; i < 6; ++i) {
    const double mid = (lo + hi) / 2;
    const GpuTimeline longer = dilated(g, 1 + mid);
    PlannerResult m = plan_hidden(t, longer, o, arenas);
    if (m.plan.meets_budget) hi = mid, most = std::move(m), total = longer.total;
    else lo = mid;
  }
  // The figures of the compute itself: the waits are the plan's, in its predicted step alone.
  Plan& p = most.plan;
  Prediction& pr = most.prediction;
  pr.lower_bound_ns = lower_bound(g.total, pr.bytes_out, pr.bytes_in, o.link);
  p.lower_bound_ns = pr.lower_bound_ns;
  if (!arenas) pr.compute_ns = g.total;
  p.compute_ns = pr.compute_ns;
  most.stall_ns = std::max<int64_t>(0, total - g.total);
  most.stall_share = hi;
  return most;
}

PlannerResult plan_weights(const StepTrace& t, const GpuTimeline& g, const PlannerOptions& o, const PlannerResult* arenas) {
  return plan_weights_waiting(t, g, o, arenas, plan_hidden(t, g, o, arenas));
}

}  // namespace offload

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

// The weights that may stream (born before the step, outliving it, at least persistent_min,
// used in it), and the footprint without streaming: the shim's own blocks (persistent, at
// least persistent_min) are exact, in whole granules; the rest sits in PyTorch's pool.
struct Candidates {
  std::vector<uint32_t> ordinals;
  std::vector<std::vector<int64_t>> uses;  // per ordinal, the launches touching it (the persistent: sorted, once each)
  uint64_t persistent = 0, persistent_rounded = 0;
  uint64_t granularity = 0, unit = 0;
  // The executor reloads weights in units (weight_unit) and maps a weight that is no multiple
  // of the unit on whole units too, in the room its block's range has past its end
  // (PersistentPool): lora's embedding and head, 376 MiB, on six units of 72 (432 MiB), so
  // that every leaving weight's memory serves them. Such a weight counts at that size. The
  // unit here is the candidates'; the executor's, that of the weights streamed: the same when
  // all of them stream, as on lora.
  uint64_t block(uint64_t bytes) const {
    const uint64_t b = round_up(bytes, granularity);
    return in_units(b, unit) ? round_up(b, unit) : b;
  }
};

Candidates weight_candidates(const StepTrace& t, const PlannerOptions& o) {
  Candidates c;
  c.granularity = o.granularity;
  c.uses.resize(t.allocs.size());
  for (const TraceLaunch& l : t.launches)
    for (uint32_t a : l.allocs)
      if (a < c.uses.size()) c.uses[a].push_back(l.pos);
  for (const TraceAlloc& a : t.allocs) {
    if (!o.persistent_min || !a.persistent(o.persistent_min)) continue;
    c.persistent += a.bytes;
    std::vector<int64_t>& us = c.uses[a.ordinal];
    std::sort(us.begin(), us.end());
    us.erase(std::unique(us.begin(), us.end()), us.end());
    if (!us.empty()) c.ordinals.push_back(a.ordinal);
  }
  std::vector<uint64_t> sizes;
  for (uint32_t ord : c.ordinals) sizes.push_back(round_up(t.allocs[ord].bytes, o.granularity));
  c.unit = weight_unit(sizes);
  for (const TraceAlloc& a : t.allocs)
    if (o.persistent_min && a.persistent(o.persistent_min))
      c.persistent_rounded += c.uses[a.ordinal].empty() ? round_up(a.bytes, o.granularity) : c.block(a.bytes);
  return c;
}

// The footprint before each launch with every weight resident (`foot`), from the live bytes
// outside the arenas (`live`) and PyTorch's pool's share at its peak (`pooled`).
struct Base {
  std::vector<int64_t> live;
  int64_t pooled = 0;
  std::vector<int64_t> foot;
};

Base base_footprint(const StepTrace& t, const PlannerOptions& o, const Candidates& c, const PlannerResult* arenas) {
  const int64_t n = static_cast<int64_t>(t.launches.size());
  Base b;
  // With arenas, live bytes outside them (their members are in the handles, counted whole).
  b.live = live_bytes(t, nullptr);
  int64_t handles = 0;
  if (arenas) {
    for (int64_t q = 0; q < n; ++q) b.live[static_cast<size_t>(q)] = static_cast<int64_t>(arenas->prediction.resident[static_cast<size_t>(q)]);
    handles = static_cast<int64_t>(uint64_t{arenas->plan.handles} * arenas->plan.handle_bytes);
  }
  // PyTorch's pool keeps what it reserved (its release threshold is the maximum): the pooled
  // bytes count at their peak before every launch, and only the weights' own blocks come and
  // go. (Planned per launch instead, the pool's peak and the weights' peak coincide on the GPU
  // and the plan passes its budget by far.)
  b.pooled = pooled_peak(b.live, c.persistent);
  const int64_t base_bytes = static_cast<int64_t>(static_cast<double>(b.pooled) * o.pool_overhead) +
                             static_cast<int64_t>(c.persistent_rounded) + handles;
  b.foot.assign(static_cast<size_t>(n), base_bytes);
  return b;
}

// Candidate windows: between consecutive uses, and across the boundary (never between
// adjacent launches: nothing runs there to hide a copy).
std::vector<Window> weight_windows(const StepTrace& t, const GpuTimeline& g, const PlannerOptions& o, const Candidates& cs) {
  const int64_t n = static_cast<int64_t>(t.launches.size()), T = g.total;
  const double d2h = o.link.d2h_shared * o.link.scale, h2d = o.link.h2d_shared * o.link.scale;
  std::vector<Window> w;
  for (uint32_t c = 0; c < cs.ordinals.size(); ++c) {
    const TraceAlloc& a = t.allocs[cs.ordinals[c]];
    const std::vector<int64_t>& us = cs.uses[a.ordinal];
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
  return w;
}

// Greedy: at the peak, stream the largest window that covers it, while the schedule of
// everything chosen stays feasible.
struct Greedy {
  const StepTrace& t;
  const Candidates& cs;
  const std::vector<Window>& w;
  const std::vector<int64_t>& base;  // the footprint before each launch, nothing streamed
  const Unrolled u;
  const int64_t n;
  std::vector<Timing> alone;  // each window alone: whether its copies fit, where it is absent
  size_t too_short = 0;       // windows whose copies do not fit even alone
  std::vector<uint32_t> sel;  // the windows chosen
  std::vector<Timing> tm;     // their timing together
  std::vector<int64_t> foot, absent_raw;  // the footprint and the streamed bytes absent, before each launch
  std::vector<int64_t> d, dr, absent;     // fold's, kept

  Greedy(const StepTrace& t, const GpuTimeline& g, const Candidates& cs, const std::vector<Window>& w,
         const std::vector<int64_t>& base)
      : t(t), cs(cs), w(w), base(base), u{g, static_cast<int64_t>(t.launches.size())}, n(u.n), alone(w.size()),
        foot(base), absent_raw(static_cast<size_t>(n), 0) {
    for (uint32_t i = 0; i < w.size(); ++i) {
      std::vector<Timing> one;
      schedule(u, w, {i}, one);
      alone[i] = one[0];
      too_short += !alone[i].feasible;
    }
  }

  uint64_t bytes(size_t window) const { return t.allocs[cs.ordinals[w[window].weight]].bytes; }

  // The footprint (and the streamed bytes absent) before each launch, with `sel` timed as `times`.
  void fold(const std::vector<Timing>& times, std::vector<int64_t>& out_foot, std::vector<int64_t>& out_raw) {
    d.assign(static_cast<size_t>(n) + 1, 0);
    dr.assign(static_cast<size_t>(n) + 1, 0);
    for (size_t k = 0; k < sel.size(); ++k) {
      const uint64_t b = bytes(sel[k]);
      add_span(d, times[k].span_from, times[k].span_to, n, static_cast<int64_t>(cs.block(b)));
      add_span(dr, times[k].span_from, times[k].span_to, n, static_cast<int64_t>(b));
    }
    prefix_into(d, n, absent);
    prefix_into(dr, n, out_raw);
    for (int64_t q = 0; q < n; ++q) out_foot[static_cast<size_t>(q)] = base[static_cast<size_t>(q)] - absent[static_cast<size_t>(q)];
  }

  enum : char { kFree, kChosen, kRejected };

  // The largest window still free that fits alone and covers launch `peak` (the longest idle
  // on a tie); -1: none.
  int64_t largest_covering(int64_t peak, const std::vector<char>& state) const {
    int64_t best = -1;
    for (uint32_t i = 0; i < w.size(); ++i) {
      if (state[i] != kFree || !alone[i].feasible || !covers(alone[i], peak, n)) continue;
      if (best < 0) {
        best = i;
        continue;
      }
      const uint64_t bi = bytes(i), bb = bytes(static_cast<size_t>(best));
      if (bi > bb || (bi == bb && w[i].idle() > w[static_cast<size_t>(best)].idle())) best = i;
    }
    return best;
  }

  // Chooses windows until the footprint meets `budget`; returns the launch before which it is
  // missed, or -1.
  int64_t run(uint64_t budget, const std::function<void()>& progress) {
    std::vector<char> state(w.size(), kFree);
    std::vector<Timing> next;
    std::vector<int64_t> next_foot(foot.size()), next_raw;
    while (budget) {
      if (progress) progress();
      const int64_t peak = std::max_element(foot.begin(), foot.end()) - foot.begin();
      if (static_cast<uint64_t>(std::max<int64_t>(0, foot[static_cast<size_t>(peak)])) <= budget) break;
      const int64_t best = largest_covering(peak, state);
      if (best < 0) return peak;
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
    return -1;
  }
};

// The plan: weights in ordinal order, their windows by evict_after. Returns the bytes the
// windows move in, and in `moved_out` those they copy out.
uint64_t add_windows(Plan& p, const Greedy& gr, uint64_t* moved_out) {
  const StepTrace& t = gr.t;
  const std::vector<uint32_t>& cand = gr.cs.ordinals;
  const std::vector<Window>& w = gr.w;
  std::vector<int64_t> weight_of(cand.size(), -1);
  std::vector<uint32_t> order(gr.sel.size());
  for (uint32_t k = 0; k < gr.sel.size(); ++k) order[k] = k;
  std::sort(order.begin(), order.end(), [&](uint32_t x, uint32_t y) {
    const Window &a = w[gr.sel[x]], &b = w[gr.sel[y]];
    return a.a != b.a ? a.a < b.a : a.weight < b.weight;
  });
  std::vector<char> streamed(cand.size(), 0);
  for (uint32_t i : gr.sel) streamed[w[i].weight] = 1;
  uint64_t host = 0;
  for (const ArenaPlan& a : p.arenas) host = std::max(host, a.host_offset + a.used);
  for (uint32_t c = 0; c < cand.size(); ++c) {
    if (!streamed[c]) continue;
    const TraceAlloc& a = t.allocs[cand[c]];
    host = round_up(host, 4096);
    weight_of[c] = static_cast<int64_t>(p.weights.size());
    p.weights.push_back(WeightPlan{a.ordinal, a.bytes, host, a.base, a.id});
    host += a.bytes;
  }
  uint64_t moved = 0;
  *moved_out = 0;
  for (uint32_t k : order) {
    const Window& x = w[gr.sel[k]];
    WeightWindow ww;
    ww.weight = static_cast<uint32_t>(weight_of[x.weight]);
    ww.evict_after = x.a;
    ww.reload_at = gr.tm[k].reload_q % gr.n;
    ww.use = x.b;
    p.windows.push_back(ww);
    moved += t.allocs[cand[x.weight]].bytes;
    if (x.d2h_ns) *moved_out += t.allocs[cand[x.weight]].bytes;
  }
  return moved;
}

// Mapped: from a reload's issue to the end of the copy out, by position, in whole granules
// (the executor maps each weight's whole block).
void set_mapped(Plan& p, const Greedy& gr) {
  const int64_t n = gr.n;
  const std::vector<uint32_t>& cand = gr.cs.ordinals;
  std::vector<char> streamed(cand.size(), 0);
  for (uint32_t i : gr.sel) streamed[gr.w[i].weight] = 1;
  std::vector<int64_t> d(static_cast<size_t>(n) + 1, 0);
  uint64_t streamed_blocks = 0;
  for (uint32_t c = 0; c < cand.size(); ++c)
    if (streamed[c]) streamed_blocks += gr.cs.block(gr.t.allocs[cand[c]].bytes);
  for (size_t k = 0; k < gr.sel.size(); ++k)
    add_span(d, gr.tm[k].span_from, gr.tm[k].span_to, n, static_cast<int64_t>(gr.cs.block(gr.bytes(gr.sel[k]))));
  const std::vector<int64_t> absent = prefix(d, n);
  const int64_t least_absent = gr.sel.empty() ? 0 : *std::min_element(absent.begin(), absent.end());
  p.weight_bytes_mapped = gr.sel.empty() ? 0 : streamed_blocks - static_cast<uint64_t>(least_absent);
  p.weight_mapped_at.clear();
  if (!gr.sel.empty())
    for (int64_t q = 0; q < n; ++q) p.weight_mapped_at.push_back(streamed_blocks - static_cast<uint64_t>(absent[static_cast<size_t>(q)]));
}

// Why the plan streams nothing, or misses the budget (r.why; r.unmet_at when missed).
void explain(PlannerResult& r, const PlannerOptions& o, const Greedy& gr, int64_t unmet_at) {
  const Plan& p = r.plan;
  const uint64_t peak = p.predicted_peak;
  if (p.windows.empty()) {
    if (!o.persistent_min) r.why = "weights are not streamed (no persistent_min)";
    else if (gr.cs.ordinals.empty()) r.why = "nothing of at least " + std::to_string(o.persistent_min) + " bytes outlives the step and is used in it";
    else if (gr.w.empty()) r.why = "no weight sits idle between two launches";
    else if (!o.budget) r.why = "no budget: weights are streamed only to meet one";
    else if (p.meets_budget) r.why = "the step's footprint with the weights in exact blocks (" + gib_text(peak) + ") is within the budget";
  }
  if (!p.meets_budget) {
    r.unmet_at = unmet_at;
    r.why = "no window whose copies fit covers the peak (" + gib_text(peak) + " before launch " + std::to_string(unmet_at) +
            "); " + std::to_string(gr.too_short) + " of " + std::to_string(gr.w.size()) + " windows are too short for their copies";
  }
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

  const Candidates cs = weight_candidates(t, o);
  const Base base = base_footprint(t, o, cs, arenas);
  const std::vector<Window> w = weight_windows(t, g, o, cs);
  Greedy gr(t, g, cs, w, base.foot);
  const int64_t unmet_at = gr.run(o.budget, o.progress);

  uint64_t moved_out = 0;
  const uint64_t moved = add_windows(p, gr, &moved_out);
  set_mapped(p, gr);

  const std::vector<int64_t>& foot = gr.foot;
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
    v = static_cast<uint64_t>(std::max<int64_t>(0, base.live[static_cast<size_t>(q)] - gr.absent_raw[static_cast<size_t>(q)]));
    resident_peak = std::max(resident_peak, v);
  }
  p.resident_peak = resident_peak;
  p.pooled_peak = static_cast<uint64_t>(std::max<int64_t>(0, base.pooled));
  p.predicted_step_ns = pr.step_ns;
  p.compute_ns = pr.compute_ns;
  p.lower_bound_ns = pr.lower_bound_ns;
  explain(r, o, gr, unmet_at);
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

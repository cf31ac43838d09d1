// The planner's search over arenas: which activations move, in arenas of what size, with how
// many handles, on the candidates that plan_step's strict or relaxed pass allows.
#include "planner/search.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <deque>
#include <limits>
#include <optional>

namespace offload::planner_detail {

namespace {

// Worth moving: an activation idle (in GPU time, from the end of its last forward use to
// the start of its first backward one) for at least its copy out and back. What the
// backward needs soon after the turnaround would only take the link when it is busiest.
// (Not strict: every activation, for a budget that needs more than what hides well.)
std::vector<uint32_t> movable_activations(const StepTrace& t, const PlannerOptions& o, const GpuTimeline& g,
                                          const StepFacts& f, bool strict) {
  std::vector<uint32_t> movable;
  for (uint32_t c : f.candidates) {
    const int64_t last = std::max(f.fwd_last[c], t.allocs[c].alloc_pos);
    const int64_t idle = g.start[static_cast<size_t>(f.bwd_first[c])] - (g.start[static_cast<size_t>(last)] + g.dur[static_cast<size_t>(last)]);
    const uint64_t b = t.allocs[c].bytes;
    if (!strict || idle >= copy_ns(b, o.link.d2h * o.link.scale) + copy_ns(b, o.link.h2d * o.link.scale)) movable.push_back(c);
  }
  return movable;
}

// The movable activations by segment, in birth order, and each group's segment.
struct Segments {
  std::vector<std::vector<uint32_t>> groups;
  std::vector<int64_t> segment;
};

// Segments: layer boundaries, else equal shares of the candidates' bytes.
Segments segments(const StepTrace& t, const PlannerOptions& o, const Boundaries& bounds,
                  const std::vector<uint32_t>& movable) {
  Segments s;
  auto& groups = s.groups;
  auto& group_segment = s.segment;
  uint64_t movable_bytes = 0;
  for (uint32_t c : movable) movable_bytes += t.allocs[c].bytes;
  if (bounds.match >= o.min_match && bounds.starts.size() >= 3) {
    const auto& st = bounds.starts;
    for (uint32_t c : movable) {
      int64_t seg = std::upper_bound(st.begin(), st.end(), t.allocs[c].alloc_pos) - st.begin() - 1;
      if (groups.empty() || group_segment.back() != seg) {
        groups.emplace_back();
        group_segment.push_back(seg);
      }
      groups.back().push_back(c);
    }
  } else {
    const uint64_t target = std::max(o.granularity, movable_bytes / std::max(1u, o.fallback_segments));
    uint64_t acc = 0;
    for (uint32_t c : movable) {
      if (groups.empty() || acc + t.allocs[c].bytes > target) {
        groups.emplace_back();
        group_segment.push_back(static_cast<int64_t>(groups.size()) - 1);
        acc = 0;
      }
      groups.back().push_back(c);
      acc += round_up(t.allocs[c].bytes, o.member_align);
    }
  }
  return s;
}

// An arena leaves after its last member's forward use and comes back before its first
// member's backward use: one member used far later in the forward, or far earlier in the
// backward, than the rest of its segment would pin the whole arena. Such members stay.
void drop_stragglers(Segments& s, const StepTrace& t, const GpuTimeline& g, const StepFacts& f) {
  auto& groups = s.groups;
  const int64_t slack = std::max<int64_t>(1, g.start[static_cast<size_t>(f.peak_pos)] /
                                                 static_cast<int64_t>(std::max<size_t>(1, groups.size())));
  auto last_end = [&](uint32_t c) {
    size_t q = static_cast<size_t>(std::max(f.fwd_last[c], t.allocs[c].alloc_pos));
    return g.start[q] + g.dur[q];
  };
  auto first_start = [&](uint32_t c) { return g.start[static_cast<size_t>(f.bwd_first[c])]; };
  for (auto& gr : groups) {
    std::vector<int64_t> ends, starts;
    for (uint32_t c : gr) ends.push_back(last_end(c)), starts.push_back(first_start(c));
    std::nth_element(ends.begin(), ends.begin() + static_cast<long>(ends.size() / 2), ends.end());
    std::nth_element(starts.begin(), starts.begin() + static_cast<long>(starts.size() / 2), starts.end());
    const int64_t end_med = ends[ends.size() / 2], start_med = starts[starts.size() / 2];
    std::erase_if(gr, [&](uint32_t c) { return last_end(c) > end_med + slack || first_start(c) < start_med - 2 * slack; });
  }
  for (size_t i = groups.size(); i-- > 0;)
    if (groups[i].empty()) {
      groups.erase(groups.begin() + static_cast<long>(i));
      s.segment.erase(s.segment.begin() + static_cast<long>(i));
    }
}

// An arena of a layout: its members in birth order, their segment, and its idle span.
struct Group {
  std::vector<uint32_t> members;
  int64_t segment;
  uint64_t bytes = 0;
  int64_t evict_after = -1, first_use = -1;
};
// A layout: the arenas, those that may move, and the handle size.
struct Layout {
  std::vector<Group> arenas;
  std::vector<size_t> offloadable;  // oldest first
  uint64_t cap = 0;
};

// The arenas offloadable in L, oldest first, as many as the host pool takes.
// The last segment is needed at once in backward: it stays. So does an arena without a
// gap between its last forward and first backward use, or one too large for a handle.
void mark_offloadable(Layout& L, const PlannerOptions& o) {
  const int64_t last_segment = L.arenas.back().segment;
  uint64_t host = 0;
  for (size_t i = 0; i < L.arenas.size(); ++i) {
    const Group& a = L.arenas[i];
    if (a.segment == last_segment || a.first_use <= a.evict_after + 1) continue;
    if (round_up(a.bytes, o.granularity) > L.cap) continue;
    // A sliver of a handle's size would hold a whole handle for little gain.
    if (a.bytes * 16 < L.cap) continue;
    host += round_up(a.bytes, 4096);
    if (host > o.max_host_bytes) break;
    L.offloadable.push_back(i);
  }
}

// Arenas: each segment's activations in `pieces` arenas of about equal bytes. One handle
// size serves every arena: the typical piece's; larger pieces (a language model's logits, a
// stem at full resolution) are cut to that size. Finer pieces need smaller handles (less
// memory held while copies trail the compute) at more driver calls; the search tries several.
Layout layout(const Segments& s, const StepTrace& t, const PlannerOptions& o, const StepFacts& f, uint32_t pieces,
              bool largest) {
  const auto& groups = s.groups;
  Layout L;
  std::vector<uint64_t> piece_bytes;
  for (const auto& gr : groups) {
    uint64_t b = 0;
    for (uint32_t c : gr) b += round_up(t.allocs[c].bytes, o.member_align);
    piece_bytes.push_back(std::max<uint64_t>(1, b / pieces));
  }
  std::vector<uint64_t> sorted = piece_bytes;
  std::sort(sorted.begin(), sorted.end());
  // Largest: handles as large as the largest single activation, so that it can move too.
  uint64_t biggest = 0;
  if (largest)
    for (const auto& gr : groups)
      for (uint32_t c : gr) biggest = std::max(biggest, round_up(t.allocs[c].bytes, o.member_align));
  L.cap = round_up(std::max({sorted[sorted.size() / 2], o.granularity, biggest}), o.granularity);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const uint64_t target = std::min(L.cap, round_up(piece_bytes[gi], o.member_align));
    L.arenas.push_back(Group{{}, s.segment[gi]});
    for (uint32_t c : groups[gi]) {
      uint64_t b = round_up(t.allocs[c].bytes, o.member_align);
      if (!L.arenas.back().members.empty() && L.arenas.back().bytes + b > target)
        L.arenas.push_back(Group{{}, s.segment[gi]});
      L.arenas.back().members.push_back(c);
      L.arenas.back().bytes += b;
    }
  }
  for (Group& a : L.arenas)
    for (uint32_t m : a.members) {
      a.evict_after = std::max({a.evict_after, f.fwd_last[m], t.allocs[m].alloc_pos});
      if (a.first_use < 0 || f.bwd_first[m] < a.first_use) a.first_use = f.bwd_first[m];
    }
  mark_offloadable(L, o);
  return L;
}

// Backward order of a plan's arenas: by first use, the later-born first on ties.
std::vector<size_t> backward_order(const std::vector<int64_t>& first_use) {
  std::vector<size_t> order(first_use.size());
  for (size_t j = 0; j < order.size(); ++j) order[j] = j;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return first_use[x] != first_use[y] ? first_use[x] < first_use[y] : x > y;
  });
  return order;
}

// Which arenas first: the oldest (they leave first and come back last: the longest
// windows), or spread evenly over the step (van der Corput order: any prefix is spread out),
// so that resident arenas between offloaded ones give the link time to catch up in backward.
std::vector<size_t> spread(const std::vector<size_t>& v) {
  // The i-th pick is the free position nearest above the i-th point of the sequence.
  std::vector<size_t> out;
  std::vector<char> taken(v.size(), 0);
  for (size_t i = 0; i < v.size(); ++i) {
    double x = 0, b = 0.5;
    for (size_t m = i + 1; m; m >>= 1, b /= 2)
      if (m & 1) x += b;
    size_t at = std::min(v.size() - 1, static_cast<size_t>(x * static_cast<double>(v.size())));
    while (taken[at]) at = (at + 1) % v.size();
    taken[at] = 1;
    out.push_back(v[at]);
  }
  return out;
}

// A candidate plan and its prediction; per arena, its segment.
struct Candidate {
  Plan plan;
  Prediction pred;
  std::vector<int64_t> segments;
};

// Search, for each arena size and handle count: with a budget, the fewest arenas that meet
// it (the footprint falls as k grows; every arena moved costs link time); the fastest such
// plan wins, fewer bytes moved breaking near-ties. Apart: the most arenas whose transfers
// the compute hides (exposed time grows with k), for the report and for "no budget".
struct Search {
  const StepTrace& t;
  const PlannerOptions& o;
  const GpuTimeline& g;
  const StepFacts& f;
  const Plan& step;  // the step's tokens and candidates
  const uint64_t plain_footprint;
  const int64_t hide_limit;
  std::optional<Candidate> best, hidden;
  bool best_meets = false;

  Candidate make(const Layout& L, size_t k, uint32_t h) const;
  void consider(Candidate&& c);
  void consider_hidden(Candidate&& c);
  void search(const Layout& L);
  bool fewest_meeting(const Layout& L, uint32_t h, const std::vector<uint64_t>& res_peak, int64_t& best_here,
                      uint64_t& best_unmet_here);
  bool most_hidden(const Layout& L, uint32_t h, int64_t& best_hidden_here);
  std::vector<uint64_t> resident_peaks(const Layout& L) const;
  // The footprint with the oldest k offloadable arenas of L moved, in h handles: the live bytes
  // outside arenas at their peak times the pool overhead, plus the handles, whatever the timing.
  uint64_t footprint(const Layout& L, const std::vector<uint64_t>& res_peak, size_t k, uint32_t h) const {
    return static_cast<uint64_t>(static_cast<double>(res_peak[k]) * o.pool_overhead) + uint64_t{h} * L.cap;
  }
};

// A candidate plan: the oldest k offloadable arenas of layout L, h handles. Reloads go in
// backward order, as early as a handle allows: a first simulation tells where each can be
// issued, and the plan asks for it there (never before its copy out is due to finish).
Candidate Search::make(const Layout& L, size_t k, uint32_t h) const {
  if (o.progress) o.progress();
  Candidate c;
  Plan& q = c.plan;
  q.budget = o.budget;
  q.step_launches = t.launches.size();
  q.tokens = step.tokens;
  q.plain_peak = f.peak;
  q.candidates = step.candidates;
  q.candidate_bytes = step.candidate_bytes;
  q.handles = h;
  q.handle_bytes = L.cap;
  // The first k of the layout's order, in birth order.
  std::vector<size_t> chosen(L.offloadable.begin(), L.offloadable.begin() + static_cast<long>(k));
  std::sort(chosen.begin(), chosen.end());
  std::vector<int64_t> uses;
  for (size_t j = 0; j < k; ++j) uses.push_back(L.arenas[chosen[j]].first_use);
  // First pass: all due from the turnaround on, one launch apart in backward order (the
  // executor queues held-back reloads in the order they fall due).
  std::vector<size_t> order = backward_order(uses);
  std::vector<int64_t> rank(k);
  for (size_t j = 0; j < order.size(); ++j) rank[order[j]] = static_cast<int64_t>(j);
  for (size_t j = 0; j < k; ++j) {
    const Group& a = L.arenas[chosen[j]];
    int64_t at = std::min<int64_t>(f.peak_pos + 1 + rank[j], a.first_use);
    add_arena(q, t, f, a.members, L.cap, std::max<int64_t>(at, a.evict_after + 1), o.member_align);
    c.segments.push_back(a.segment);
  }
  q.index_members();
  Prediction first = simulate(t, g, q, o.link, o.pool_overhead, f.peak_pos);
  if (!first.feasible) {
    c.pred = first;
    return c;
  }
  // Positions never decrease in backward order and stay within [evict_after + 1, first_use]
  // (always possible: backward order is by first use). Ties are fine: the executor queues
  // reloads due at one launch in backward order.
  int64_t prev = 0;
  for (size_t j : order) {
    ArenaPlan& a = q.arenas[j];
    int64_t when = std::max(first.arenas[j].reload_issue, first.arenas[j].evict_end);
    int64_t pos = std::lower_bound(first.launch_start.begin(), first.launch_start.end(), when) - first.launch_start.begin();
    pos = std::clamp<int64_t>(pos, std::max(a.evict_after + 1, prev), a.first_use);
    a.reload_at = pos;
    prev = pos;
  }
  c.pred = simulate(t, g, q, o.link, o.pool_overhead, f.peak_pos);
  return c;
}

void Search::consider(Candidate&& c) {
  if (!c.pred.feasible) return;
  bool meets = c.pred.peak_bytes <= o.budget;
  bool take = false;
  if (!best) take = true;
  else if (meets != best_meets) take = meets;
  else if (!meets) take = c.pred.peak_bytes < best->pred.peak_bytes;
  else {
    double a = static_cast<double>(c.pred.step_ns), b = static_cast<double>(best->pred.step_ns);
    take = a < b * 0.995 || (a <= b * 1.005 && c.pred.bytes_out < best->pred.bytes_out);
  }
  if (take) {
    best = std::move(c);
    best_meets = meets;
  }
}

// The hidden offload that lowers the footprint most (fewer bytes moved on a tie).
void Search::consider_hidden(Candidate&& c) {
  if (!c.pred.feasible || c.pred.exposed_ns() > hide_limit || c.pred.peak_bytes >= plain_footprint) return;
  if (!hidden || c.pred.peak_bytes < hidden->pred.peak_bytes ||
      (c.pred.peak_bytes == hidden->pred.peak_bytes && c.pred.bytes_out < hidden->pred.bytes_out))
    hidden = std::move(c);
}

// Live bytes outside arenas at their peak, for each k (the oldest k offloadable arenas of L moved).
std::vector<uint64_t> Search::resident_peaks(const Layout& L) const {
  const size_t n = t.launches.size(), kmax = L.offloadable.size();
  std::vector<uint64_t> res_peak(kmax + 1);
  std::vector<int64_t> res(f.live);
  res_peak[0] = f.peak;
  for (size_t k = 1; k <= kmax; ++k) {
    for (uint32_t m : L.arenas[L.offloadable[k - 1]].members) {
      const TraceAlloc& a = t.allocs[m];
      const int64_t end = a.free_pos < 0 ? static_cast<int64_t>(n) : std::min<int64_t>(a.free_pos, static_cast<int64_t>(n));
      for (int64_t q = std::max<int64_t>(0, a.alloc_pos); q < end; ++q) res[static_cast<size_t>(q)] -= static_cast<int64_t>(a.bytes);
    }
    res_peak[k] = static_cast<uint64_t>(std::max<int64_t>(0, *std::max_element(res.begin(), res.end())));
  }
  return res_peak;
}

// With h handles, the fewest arenas whose footprint meets the budget, else all of them.
// Gained: faster under the budget, or a lower footprint when none meets it (or infeasible:
// more handles may make it run).
bool Search::fewest_meeting(const Layout& L, uint32_t h, const std::vector<uint64_t>& res_peak, int64_t& best_here,
                            uint64_t& best_unmet_here) {
  const size_t kmax = L.offloadable.size();
  bool gained = false;
  size_t k = 1;
  while (k < kmax && footprint(L, res_peak, k, h) > o.budget) ++k;
  Candidate c = make(L, k, h);
  // Too few handles for that many arenas deadlock the forward: a few arenas fewer may run
  // (at a higher footprint, which may still be the lowest there is).
  for (size_t kk = k; !c.pred.feasible && kk > 1 && kk + 8 > k;) c = make(L, --kk, h);
  if (!c.pred.feasible) gained = true;
  else if (footprint(L, res_peak, k, h) <= o.budget) {
    if (c.pred.step_ns < best_here) best_here = c.pred.step_ns, gained = true;
  } else if (c.pred.peak_bytes < best_unmet_here) {
    best_unmet_here = c.pred.peak_bytes, gained = true;
  }
  consider(std::move(c));
  return gained;
}

// With h handles, the largest k the compute hides (the candidate of the last k that passed
// is lo's). Gained: it saves more than any fewer handles did.
bool Search::most_hidden(const Layout& L, uint32_t h, int64_t& best_hidden_here) {
  bool gained = false;
  size_t lo = 0, hi = L.offloadable.size();
  std::optional<Candidate> fit;
  while (lo < hi) {
    size_t mid = (lo + hi + 1) / 2;
    Candidate c = make(L, mid, h);
    if (c.pred.feasible && c.pred.exposed_ns() <= hide_limit) lo = mid, fit = std::move(c);
    else hi = mid - 1;
  }
  if (fit) {
    Candidate& c = *fit;
    const int64_t saved = static_cast<int64_t>(plain_footprint) - static_cast<int64_t>(c.pred.peak_bytes);
    if (saved > best_hidden_here) best_hidden_here = saved, gained = true;
    consider_hidden(std::move(c));
  }
  return gained;
}

// Every handle count for layout L.
void Search::search(const Layout& L) {
  const size_t kmax = L.offloadable.size();
  if (!kmax) return;
  uint32_t hmax = o.max_handles;
  if (o.max_inflight_bytes) hmax = std::min<uint32_t>(hmax, static_cast<uint32_t>(std::max<uint64_t>(2, o.max_inflight_bytes / L.cap)));
  hmax = std::min<uint32_t>(hmax, static_cast<uint32_t>(kmax) + 1);
  const std::vector<uint64_t> res_peak = resident_peaks(L);
  // More handles than help: stop after a few that bring nothing.
  int64_t best_here = kNever, best_hidden_here = -1;
  uint64_t best_unmet_here = ~uint64_t{0};
  uint32_t no_gain = 0;
  for (uint32_t h = 2; h <= hmax && no_gain < 3; ++h) {
    bool gained = false;
    if (o.budget) gained = fewest_meeting(L, h, res_peak, best_here, best_unmet_here);
    if (most_hidden(L, h, best_hidden_here)) gained = true;
    no_gain = gained ? 0 : no_gain + 1;
  }
}

// The chosen candidate becomes r's plan, with its prediction's figures.
void take_plan(PlannerResult& r, Candidate& chosen, const PlannerOptions& o) {
  Plan q = std::move(chosen.plan);
  r.prediction = std::move(chosen.pred);
  r.arena_segment = std::move(chosen.segments);
  q.resident_peak = *std::max_element(r.prediction.resident.begin(), r.prediction.resident.end());
  q.predicted_peak = r.prediction.peak_bytes;
  q.meets_budget = !o.budget || q.predicted_peak <= o.budget;
  q.predicted_step_ns = r.prediction.step_ns;
  q.compute_ns = r.prediction.compute_ns;
  q.lower_bound_ns = r.prediction.lower_bound_ns;
  r.plan = std::move(q);
}

}  // namespace

// The search behind plan_step, on the candidates `strict` allows; fills r.
void plan_with(const StepTrace& t, const PlannerOptions& o, const GpuTimeline& g, const StepFacts& f, bool strict,
               PlannerResult& r) {
  const std::vector<uint32_t> movable = movable_activations(t, o, g, f, strict);
  if (movable.empty()) {
    r.why = "no activation is idle long enough (in GPU time) to copy it out and back";
    return;
  }
  r.boundaries = layer_boundaries(r.plan.tokens, f.peak_pos);
  Segments segs = segments(t, o, r.boundaries, movable);
  if (strict) {
    drop_stragglers(segs, t, g, f);
    if (segs.groups.empty()) {
      r.why = "no segment's activations are idle together";
      return;
    }
  }
  const int64_t hide_limit = static_cast<int64_t>(static_cast<double>(g.total) * o.hide_tolerance);
  Search s{t, o, g, f, r.plan, r.plain_footprint, hide_limit, {}, {}, false};
  for (uint32_t variant = 0; variant < (strict ? 12u : 24u); ++variant) {
    const uint32_t pieces = std::array<uint32_t, 6>{1, 2, 3, 4, 6, 8}[variant % 6];
    Layout L = layout(segs, t, o, f, pieces, variant >= 12);
    if (variant % 12 >= 6) L.offloadable = spread(L.offloadable);
    s.search(L);
  }
  if (s.hidden) {
    r.hidden_bytes = s.hidden->pred.bytes_out;
    r.hidden_peak = s.hidden->pred.peak_bytes;
    r.hidden_step_ns = s.hidden->pred.step_ns;
    r.hidden_arenas = static_cast<uint32_t>(s.hidden->plan.arenas.size());
  }
  std::optional<Candidate>& chosen = o.budget ? s.best : s.hidden;
  if (!chosen) {
    r.why = o.budget ? "no plan the simulation can run (each waits for a handle that never frees)"
                     : "the compute hides no offload that lowers the footprint";
    return;
  }
  if (o.budget && chosen->pred.peak_bytes >= r.plain_footprint) {
    r.why = "offloading would not lower the footprint below " + gib_text(r.plain_footprint);
    return;
  }
  take_plan(r, *chosen, o);
}

}  // namespace offload::planner_detail

namespace offload {

CheckpointEstimate estimate_checkpointing(const StepTrace& t, double pool_overhead, bool gpu_work_only) {
  CheckpointEstimate e;
  const size_t n = t.launches.size();
  if (n < 2) return e;
  const GpuTimeline g = gpu_timeline(t);
  if (g.measured <= 0) return e;
  const StepFacts f = step_facts(t, kActivationMinBytes);
  const Boundaries b = layer_boundaries(step_tokens(t), f.peak_pos);
  if (!b.period) return e;
  // A layer: one period from a segment start (the first segment is what precedes the layers).
  auto work = [&](size_t from, size_t to) {  // the kernels' own GPU time in [from, to)
    int64_t ns = 0;
    for (size_t i = from; i < to; ++i) ns += std::max<int64_t>(0, t.launches[i].gpu_ns);
    return ns;
  };
  int64_t grown = 0, largest = 0;
  for (size_t i = 1; i < b.starts.size(); ++i) {
    const size_t from = static_cast<size_t>(b.starts[i]), to = from + b.period;
    if (to > static_cast<size_t>(f.peak_pos) || to >= n) break;
    const int64_t growth = std::max<int64_t>(0, f.live[to] - f.live[from]);
    grown += growth;
    largest = std::max(largest, growth);
    e.recompute_ns += gpu_work_only ? work(from, to) : g.start[to] - g.start[from];
    ++e.layers;
  }
  if (e.layers < 2) return CheckpointEstimate{};
  e.known = true;
  const int64_t step = !gpu_work_only ? g.total : t.gpu_busy_ns >= 0 ? t.gpu_busy_ns : work(0, n);
  e.step_ns = step + e.recompute_ns;
  const int64_t kept = std::max<int64_t>(0, static_cast<int64_t>(f.peak) - grown + largest);  // <= peak
  e.footprint = static_cast<uint64_t>(static_cast<double>(kept) * pool_overhead);
  return e;
}

}  // namespace offload

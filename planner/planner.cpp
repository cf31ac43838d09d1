#include "planner/planner.h"

#include "planner/search.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>

namespace offload {

GpuTimeline gpu_timeline(const StepTrace& t) {
  GpuTimeline g;
  const size_t n = t.launches.size();
  g.start.assign(n, 0);
  g.dur.assign(n, 0);
  size_t kernels = 0, timed = 0;
  int64_t end = 0, cur = 0;
  for (size_t i = 0; i < n; ++i) {
    const TraceLaunch& l = t.launches[i];
    if (l.kind == EventKind::Kernel) ++kernels;
    if (l.gpu_start_ns >= 0 && l.gpu_ns >= 0) {
      ++timed;
      cur = std::max(cur, l.gpu_start_ns);
      end = std::max(end, l.gpu_start_ns + l.gpu_ns);
    }
    g.start[i] = cur;
  }
  g.measured = kernels ? static_cast<double>(timed) / static_cast<double>(kernels) : 0;
  if (timed * 2 < kernels || end == 0) {
    // Not measured: every launch the same length (1 us), which keeps the order of things.
    for (size_t i = 0; i < n; ++i) g.start[i] = static_cast<int64_t>(i) * 1000;
    end = static_cast<int64_t>(n) * 1000;
  }
  g.total = std::max(end, n ? g.start[n - 1] : 0);
  for (size_t i = 0; i < n; ++i) g.dur[i] = (i + 1 < n ? g.start[i + 1] : g.total) - g.start[i];
  return g;
}

Boundaries layer_boundaries(const std::vector<uint64_t>& tokens, int64_t forward_end) {
  Boundaries b;
  b.starts.push_back(0);
  const int64_t m = std::min<int64_t>(forward_end + 1, static_cast<int64_t>(tokens.size()));
  if (m < 16) return b;
  // The period: the lag at which the forward best repeats itself (a block's launches).
  double best = 0;
  int64_t period = 0;
  for (int64_t p = 4; p <= m / 3; ++p) {
    int64_t same = 0;
    for (int64_t i = 0; i + p < m; ++i) same += tokens[static_cast<size_t>(i)] == tokens[static_cast<size_t>(i + p)];
    double r = static_cast<double>(same) / static_cast<double>(m - p);
    if (r > best + 1e-9) best = r, period = p;
  }
  b.match = best;
  b.period = static_cast<uint32_t>(period);
  if (!period) return b;
  // Repetitions: from the first position where a block repeats the next one, as long as
  // each block matches the one before it in most places.
  auto block_match = [&](int64_t s) {
    int64_t same = 0;
    for (int64_t i = 0; i < period; ++i)
      same += tokens[static_cast<size_t>(s + i)] == tokens[static_cast<size_t>(s + i + period)];
    return static_cast<double>(same) / static_cast<double>(period);
  };
  int64_t first = -1;
  for (int64_t s = 0; s + 2 * period <= m; ++s)
    if (block_match(s) >= 0.9) {
      first = s;
      break;
    }
  if (first < 0) return b;
  // The phase: among the first block's positions, one whose token occurs once per block.
  int64_t phase = first;
  for (int64_t s = first; s < first + period; ++s) {
    bool once = true;
    for (int64_t i = first; i < first + period && once; ++i) once = i == s || tokens[static_cast<size_t>(i)] != tokens[static_cast<size_t>(s)];
    if (once) {
      phase = s;
      break;
    }
  }
  if (phase > 0) b.starts.push_back(phase);
  for (int64_t s = phase; s + 2 * period <= m && block_match(s) >= 0.75; s += period) b.starts.push_back(s + period);
  return b;
}

void add_lateness(std::vector<std::pair<int64_t, int64_t>>& into, int64_t pos, int64_t ns) {
  auto it = std::find_if(into.begin(), into.end(), [&](const auto& e) { return e.first == pos; });
  if (it == into.end()) into.emplace_back(pos, ns);
  else it->second = std::max(it->second, ns);
}

std::vector<std::pair<int64_t, int64_t>> measured_lateness(const Plan& plan, const Prediction& pr,
                                                           const StepTrace& measured, int64_t slack_ns) {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (measured.launches.size() != plan.step_launches || pr.arenas.size() != plan.arenas.size()) return out;
  // The GPU's idle time before launch p: from the latest end among the launches before it.
  auto idle_before = [&](int64_t p) -> int64_t {
    const TraceLaunch& l = measured.launches[static_cast<size_t>(p)];
    if (l.gpu_start_ns < 0) return -1;
    int64_t end = -1;
    for (int64_t q = p - 1; q >= 0 && q >= p - 64; --q) {
      const TraceLaunch& b = measured.launches[static_cast<size_t>(q)];
      if (b.gpu_start_ns >= 0 && b.gpu_ns >= 0) end = std::max(end, b.gpu_start_ns + b.gpu_ns);
    }
    return end < 0 ? -1 : std::max<int64_t>(0, l.gpu_start_ns - end);
  };
  for (size_t i = 0; i < plan.arenas.size(); ++i) {
    const int64_t p = plan.arenas[i].first_use;
    if (p <= 0 || static_cast<size_t>(p) >= measured.launches.size() || pr.arenas[i].abandoned) continue;
    const int64_t idle = idle_before(p);
    const int64_t late = idle - pr.arenas[i].stall - slack_ns;
    if (idle >= 0 && late > 0) add_lateness(out, p, late);
  }
  std::sort(out.begin(), out.end());
  return out;
}

int64_t pooled_peak(const std::vector<int64_t>& live, uint64_t persistent) {
  int64_t most = 0;
  for (int64_t v : live) most = std::max(most, v - static_cast<int64_t>(persistent));
  return most;
}

uint64_t pooled_live_peak(const StepTrace& t, uint64_t persistent_min) {
  uint64_t persistent = 0;
  for (const TraceAlloc& a : t.allocs)
    if (persistent_min && a.persistent(persistent_min)) persistent += a.bytes;
  return static_cast<uint64_t>(std::max<int64_t>(0, pooled_peak(live_bytes(t, nullptr), persistent)));
}

double measured_pool_factor(uint64_t reserved, uint64_t own_peak, uint64_t weights, uint64_t pooled, double model) {
  if (!reserved || !pooled) return model;
  const uint64_t own = own_peak > weights ? own_peak - weights : 0;
  return std::clamp(static_cast<double>(reserved + own) / static_cast<double>(pooled), model, 2.0);
}

double PoolWatch::observe(uint64_t reserved, uint64_t live, double planned, uint64_t predicted_peak, uint64_t budget) {
  if (!reserved || !live || !budget || planned <= 0 || revisions_ >= max_) return 0;
  if (settling_.skip()) return 0;
  const double held = static_cast<double>(reserved) / static_cast<double>(live);
  if (held <= planned * 1.002) return 0;
  const double grown = static_cast<double>(predicted_peak) + (held - planned) * static_cast<double>(live);
  if (grown <= static_cast<double>(budget)) return 0;
  ++revisions_;
  return std::min(held * 1.002, 2.0);
}

double PlanWatch::observe(int64_t measured) {
  if (predicted_ <= 0 || measured <= 0) return 0;
  if (settling_.skip()) return 0;
  const int64_t slack = std::max<int64_t>(1'000'000, predicted_ / 10);
  slow_ = measured > predicted_ + slack ? slow_ + 1 : 0;
  if (slow_ < 3 || revisions_ >= max_) return 0;
  ++revisions_;
  slow_ = 0;
  return std::clamp(static_cast<double>(predicted_) / static_cast<double>(measured), 0.5, 0.9);
}

namespace {

// plan_step for activations alone.
PlannerResult plan_activations(const StepTrace& t, const PlannerOptions& o) {
  PlannerResult r;
  const size_t n = t.launches.size();
  Plan& p = r.plan;
  p.budget = o.budget;
  p.step_launches = n;
  p.tokens = step_tokens(t);
  p.member_index.assign(n + 1, 0);
  const GpuTimeline g = gpu_timeline(t);
  r.prediction = simulate(t, g, p, o.link, o.pool_overhead);
  if (n == 0) {
    r.why = "the step has no launches";
    return r;
  }
  const StepFacts f = step_facts(t, o.min_bytes);
  p.plain_peak = p.resident_peak = p.predicted_peak = f.peak;
  r.plain_footprint = static_cast<uint64_t>(static_cast<double>(f.peak) * o.pool_overhead);
  p.candidates = f.candidates.size();
  p.candidate_bytes = f.candidate_bytes;
  if (o.budget && r.plain_footprint <= o.budget) {
    r.why = "the step's footprint (" + gib_text(r.plain_footprint) + ") is within the budget";
    return r;
  }
  if (f.candidates.size() < 2) {
    r.why = "fewer than two activations to offload";
    return r;
  }

  PlannerResult strict = r;
  planner_detail::plan_with(t, o, g, f, true, strict);
  if (!o.budget || (!strict.plan.arenas.empty() && strict.plan.meets_budget)) return strict;
  // The budget needs more than what hides well: every activation is a candidate then (the
  // step gets slower, but it fits).
  PlannerResult all = r;
  planner_detail::plan_with(t, o, g, f, false, all);
  if (all.plan.arenas.empty()) return strict;
  if (strict.plan.arenas.empty() || all.plan.predicted_peak < strict.plan.predicted_peak) {
    all.hidden_bytes = strict.hidden_bytes, all.hidden_peak = strict.hidden_peak;
    all.hidden_step_ns = strict.hidden_step_ns, all.hidden_arenas = strict.hidden_arenas;
    return all;
  }
  return strict;
}

// PlannerOptions::spare_handle: the plan made again for the budget less one of its handles
// when its footprint leaves no room for one more. When no plan meets that budget, the plan for
// the whole budget stands.
PlannerResult with_spare_handle(const StepTrace& t, const PlannerOptions& o, PlannerResult r) {
  Plan& p = r.plan;
  if (!o.spare_handle || !o.budget || p.arenas.empty() || !p.meets_budget || o.budget <= p.handle_bytes) return r;
  if (p.predicted_peak + p.handle_bytes <= o.budget) {
    p.spare = p.handle_bytes;
    return r;
  }
  PlannerOptions less = o;
  less.budget -= p.handle_bytes;
  PlannerResult s = plan_activations(t, less);
  if (s.plan.arenas.empty() || !s.plan.meets_budget) return r;
  s.plan.budget = o.budget;  // the budget is the user's; the spare is room under it
  s.plan.spare = o.budget - s.plan.predicted_peak >= s.plan.handle_bytes ? s.plan.handle_bytes : 0;
  return s;
}

}  // namespace

PlannerResult plan_step(const StepTrace& t, const PlannerOptions& o) {
  PlannerResult act = with_spare_handle(t, o, plan_activations(t, o));
  if (!o.persistent_min || !o.budget || t.launches.empty() || act.prediction.peak_bytes <= o.budget) return act;
  // Activations alone miss the budget: weights alone, when they meet it (they move nothing
  // the backward waits for); else weights on top of the activation plan; else the lowest peak.
  const GpuTimeline g = gpu_timeline(t);
  auto with_hidden = [&](PlannerResult r) {
    r.hidden_bytes = act.hidden_bytes, r.hidden_peak = act.hidden_peak;
    r.hidden_step_ns = act.hidden_step_ns, r.hidden_arenas = act.hidden_arenas;
    return r;
  };
  // First with every copy hidden; then, where neither meets the budget, each allowed to wait
  // for its reloads (max_weight_stall), the one of them with the shorter step.
  PlannerOptions hidden = o;
  hidden.max_weight_stall = 0;
  PlannerResult wp = plan_weights(t, g, hidden);
  if (wp.plan.meets_budget) return with_hidden(std::move(wp));
  PlannerResult both;
  if (!act.plan.arenas.empty()) {
    both = plan_weights(t, g, hidden, &act);
    if (both.plan.meets_budget) return with_hidden(std::move(both));
  }
  if (o.max_weight_stall > 0) {
    PlannerResult waits = plan_weights_waiting(t, g, o, nullptr, wp);
    if (!act.plan.arenas.empty()) {
      PlannerResult both_waits = plan_weights_waiting(t, g, o, &act, both);
      if (both_waits.plan.meets_budget &&
          (!waits.plan.meets_budget || both_waits.prediction.step_ns < waits.prediction.step_ns))
        return with_hidden(std::move(both_waits));
    }
    if (waits.plan.meets_budget) return with_hidden(std::move(waits));
  }
  if (!both.plan.windows.empty() && both.plan.predicted_peak < std::min(wp.plan.predicted_peak, act.prediction.peak_bytes))
    return with_hidden(std::move(both));
  if (!wp.plan.windows.empty() && wp.plan.predicted_peak < act.prediction.peak_bytes) return with_hidden(std::move(wp));
  return act;
}

Plan plan_scaled(const StepTrace& t, const PlanOptions& po, uint32_t divisor, std::string* why) {
  PlannerOptions o;
  o.budget = po.budget;
  o.granularity = po.granularity;
  o.min_bytes = po.min_bytes;
  o.member_align = po.member_align;
  o.pool_overhead = po.pool_overhead;
  o.max_host_bytes = po.max_host_bytes;
  o.link.scale = 1.0 / std::max<uint32_t>(1, divisor);
  PlannerResult r = plan_step(t, o);
  *why = r.why;
  return std::move(r.plan);
}

LinkModel share_link(LinkModel one, const NodeLinkSums& node, uint32_t gpus) {
  if (gpus <= 1) return one;
  const double n = gpus;
  if (node.h2d > 0) one.h2d = std::min(one.h2d, node.h2d / n);
  if (node.d2h > 0) one.d2h = std::min(one.d2h, node.d2h / n);
  // A direction alone is never slower than while the other also copies.
  one.h2d_shared = std::min(one.h2d_shared, one.h2d);
  one.d2h_shared = std::min(one.d2h_shared, one.d2h);
  const double sum = one.h2d_shared + one.d2h_shared;
  if (node.both > 0 && sum > node.both / n) {
    const double f = node.both / n / sum;
    one.h2d_shared *= f;
    one.d2h_shared *= f;
  }
  return one;
}

PersistentReport persistent_windows(const StepTrace& t, const LinkModel& link, uint64_t min_bytes) {
  PersistentReport r;
  const GpuTimeline g = gpu_timeline(t);
  r.step_ns = g.total;
  std::vector<std::vector<int64_t>> uses(t.allocs.size());
  for (const TraceLaunch& l : t.launches)
    for (uint32_t a : l.allocs)
      if (a < uses.size()) uses[a].push_back(l.pos);
  const double h2d = link.h2d * link.scale, d2h = link.d2h * link.scale;  // bytes per ns
  for (const TraceAlloc& a : t.allocs) {
    if (!a.persistent(min_bytes)) continue;
    PersistentWindow w;
    w.ordinal = a.ordinal;
    w.bytes = a.bytes;
    std::vector<int64_t>& u = uses[a.ordinal];
    std::sort(u.begin(), u.end());
    u.erase(std::unique(u.begin(), u.end()), u.end());
    w.uses = u.size();
    w.copy_ns = static_cast<int64_t>(static_cast<double>(a.bytes) / d2h + static_cast<double>(a.bytes) / h2d);
    if (u.empty()) {
      w.idle_ns = g.total;
      r.unused_bytes += a.bytes;
    } else {
      auto end_of = [&](int64_t p) { return g.start[static_cast<size_t>(p)] + g.dur[static_cast<size_t>(p)]; };
      // Across the boundary: after the last use, to the first use of the next step.
      w.after = u.back(), w.before = u.front();
      w.idle_ns = g.total - end_of(u.back()) + g.start[static_cast<size_t>(u.front())];
      for (size_t i = 0; i + 1 < u.size(); ++i) {
        const int64_t gap = g.start[static_cast<size_t>(u[i + 1])] - end_of(u[i]);
        if (gap > w.idle_ns) w.idle_ns = gap, w.after = u[i], w.before = u[i + 1];
      }
    }
    w.hides = w.copy_ns <= w.idle_ns;
    r.bytes += a.bytes;
    if (w.hides) {
      r.hidden_bytes += a.bytes;
      r.link_busy_ns += w.copy_ns;
    }
    r.windows.push_back(w);
  }
  std::stable_sort(r.windows.begin(), r.windows.end(),
                   [](const PersistentWindow& x, const PersistentWindow& y) { return x.bytes > y.bytes; });
  return r;
}

}  // namespace offload

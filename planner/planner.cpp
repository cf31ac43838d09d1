#include "planner/planner.h"

#include "planner/search.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <deque>
#include <limits>
#include <optional>

namespace offload {
namespace planner_detail {

int64_t copy_ns(uint64_t bytes, double bytes_per_ns) {
  return static_cast<int64_t>(std::ceil(static_cast<double>(bytes) / bytes_per_ns));
}

}  // namespace planner_detail
namespace {

using planner_detail::copy_ns;
using planner_detail::kNever;

// The link: one FIFO queue per direction, sharing the bandwidth while both copy (a fluid
// model: rates change only when a queue starts or runs dry).
class Link {
 public:
  struct Job {
    uint32_t arena;
    int64_t ready;
    double left;  // bytes
    int64_t start = -1, end = -1;
  };
  explicit Link(const LinkModel& m) : m_(m) {}

  // Queues a copy of `bytes` that may start at `ready`; returns its index in `dir`.
  size_t push(bool d2h, uint32_t arena, int64_t ready, uint64_t bytes) {
    auto& q = d2h ? d2h_ : h2d_;
    q.push_back(Job{arena, ready, static_cast<double>(bytes)});
    return q.size() - 1;
  }
  const Job& job(bool d2h, size_t i) const { return d2h ? d2h_[i] : h2d_[i]; }
  int64_t now() const { return now_; }

  // The time of the next completion or start, kNever when nothing is queued.
  int64_t next_event() const {
    bool ad = active(d2h_, hd_), ah = active(h2d_, hh_);
    int64_t e = kNever;
    auto rate = [&](bool d2h) {
      double s = m_.scale;
      if (ad && ah) return (d2h ? m_.d2h_shared : m_.h2d_shared) * s;
      return (d2h ? m_.d2h : m_.h2d) * s;
    };
    if (ad) e = std::min(e, now_ + std::max<int64_t>(1, static_cast<int64_t>(std::ceil(d2h_[hd_].left / rate(true)))));
    else if (hd_ < d2h_.size()) e = std::min(e, std::max(now_, d2h_[hd_].ready));
    if (ah) e = std::min(e, now_ + std::max<int64_t>(1, static_cast<int64_t>(std::ceil(h2d_[hh_].left / rate(false)))));
    else if (hh_ < h2d_.size()) e = std::min(e, std::max(now_, h2d_[hh_].ready));
    return e;
  }

  // Moves the link to time `t`; calls done(d2h, job) for each copy completed on the way, in
  // time order (a callback may queue more copies, ready no earlier than their completion).
  template <typename F>
  void advance(int64_t t, F&& done) {
    while (now_ < t) {
      mark_start(d2h_, hd_);
      mark_start(h2d_, hh_);
      int64_t e = std::min(next_event(), t);
      bool ad = active(d2h_, hd_), ah = active(h2d_, hh_);
      double dt = static_cast<double>(e - now_), s = m_.scale;
      double rd = (ad && ah ? m_.d2h_shared : m_.d2h) * s, rh = (ad && ah ? m_.h2d_shared : m_.h2d) * s;
      now_ = e;
      if (ad) step(d2h_, hd_, rd * dt, true, done);
      if (ah) step(h2d_, hh_, rh * dt, false, done);
      // Heads that became ready start now.
      mark_start(d2h_, hd_);
      mark_start(h2d_, hh_);
    }
  }

 private:
  bool active(const std::vector<Job>& q, size_t h) const { return h < q.size() && q[h].ready <= now_; }
  void mark_start(std::vector<Job>& q, size_t h) {
    if (h < q.size() && q[h].ready <= now_ && q[h].start < 0) q[h].start = now_;
  }
  template <typename F>
  void step(std::vector<Job>& q, size_t& h, double bytes, bool d2h, F& done) {
    Job& j = q[h];
    j.left -= bytes;
    if (j.left <= 0.5) {
      j.end = now_;
      size_t idx = h++;
      if (h < q.size() && q[h].ready < now_) q[h].ready = now_;  // FIFO: starts after the one before
      done(d2h, idx);
    }
  }
  LinkModel m_;
  std::vector<Job> d2h_, h2d_;
  size_t hd_ = 0, hh_ = 0;
  int64_t now_ = 0;
};

}  // namespace

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

Prediction simulate(const StepTrace& t, const GpuTimeline& g, const Plan& plan, const LinkModel& link,
                    double pool_overhead, int64_t peak_pos) {
  Prediction pr;
  const size_t n = t.launches.size();
  if (peak_pos < 0) peak_pos = step_facts(t, 0).peak_pos;
  pr.compute_ns = g.total;
  const size_t turn = std::min(n, static_cast<size_t>(peak_pos + 1));
  pr.forward_ns = turn < n ? g.start[turn] : g.total;
  pr.backward_ns = g.total - pr.forward_ns;
  const size_t na = plan.arenas.size();
  pr.arenas.resize(na);
  // What happens to the arenas at each launch position, in the order the loop below takes it:
  // arenas whose last member is freed, reloads due, arenas born, first uses, evictions after
  // the launch. One sorted list walked with a cursor: the search calls this thousands of times
  // with a few dozen arenas against thousands of launches.
  enum Kind : uint8_t { kFreed, kDue, kBorn, kUsed, kEvict };
  struct At {
    uint32_t pos;
    Kind kind;
    uint32_t arena;
  };
  std::vector<At> at_pos;
  at_pos.reserve(5 * na);
  std::vector<int64_t> last_free(na, -1);
  std::vector<char> member(t.allocs.size(), 0);
  for (uint32_t i = 0; i < na; ++i) {
    const ArenaPlan& a = plan.arenas[i];
    int64_t b = static_cast<int64_t>(n);
    for (uint32_t m : a.members) {
      const TraceAlloc& ta = t.allocs[m];
      b = std::min(b, ta.alloc_pos);
      last_free[i] = std::max(last_free[i], ta.free_pos < 0 ? static_cast<int64_t>(n) : ta.free_pos);
      member[m] = 1;
      pr.arenas[i].bytes += ta.bytes;
    }
    auto at = [&](int64_t p) { return static_cast<uint32_t>(std::clamp<int64_t>(p, 0, static_cast<int64_t>(n))); };
    at_pos.push_back({at(b), kBorn, i});
    at_pos.push_back({at(a.reload_at), kDue, i});
    at_pos.push_back({at(last_free[i]), kFreed, i});
    at_pos.push_back({at(a.first_use), kUsed, i});
    at_pos.push_back({at(a.evict_after), kEvict, i});
    pr.bytes_out += a.used;
    pr.bytes_in += a.used;
  }
  // By position, then kind; reloads due at one launch in backward order, as the executor
  // queues them; the others by arena.
  std::sort(at_pos.begin(), at_pos.end(), [&](const At& x, const At& y) {
    if (x.pos != y.pos) return x.pos < y.pos;
    if (x.kind != y.kind) return x.kind < y.kind;
    if (x.kind == kDue) return reload_before(plan.arenas[x.arena], x.arena, plan.arenas[y.arena], y.arena);
    return x.arena < y.arena;
  });
  size_t cursor = 0;
  // The arenas of `kind` at position i, in order (the cursor passes the kinds in order).
  auto each = [&](size_t i, Kind kind, auto fn) {
    while (cursor < at_pos.size() && at_pos[cursor].pos == i && at_pos[cursor].kind < kind) ++cursor;
    for (; cursor < at_pos.size() && at_pos[cursor].pos == i && at_pos[cursor].kind == kind; ++cursor)
      if (!fn(at_pos[cursor].arena)) return false;
    return true;
  };
  // Live bytes outside arenas before each launch.
  pr.resident.assign(n, 0);
  {
    const std::vector<int64_t> live = live_bytes(t, &member);
    uint64_t most = 0;
    for (size_t i = 0; i < n; ++i) {
      pr.resident[i] = static_cast<uint64_t>(std::max<int64_t>(0, live[i]));
      most = std::max(most, pr.resident[i]);
    }
    pr.peak_bytes = static_cast<uint64_t>(static_cast<double>(most) * pool_overhead) + uint64_t{plan.handles} * plan.handle_bytes;
  }
  // Lower bound, per phase.
  auto bound = [&](int64_t compute, uint64_t bytes, double rate) { return std::max(compute, bytes ? copy_ns(bytes, rate * link.scale) : 0); };
  pr.lower_bound_ns = bound(pr.forward_ns, pr.bytes_out, link.d2h) + bound(pr.backward_ns, pr.bytes_in, link.h2d);

  std::vector<int64_t> late(n + 1, 0);
  for (const auto& [pos, ns] : link.late_at)
    if (pos >= 0 && static_cast<size_t>(pos) < n) late[static_cast<size_t>(pos)] = std::max(late[static_cast<size_t>(pos)], ns);
  Link l(link);
  int64_t free_handles = na ? plan.handles : 0, in_use = 0;
  std::vector<int64_t> d2h_job(na, -1), h2d_job(na, -1);
  std::deque<uint32_t> pending;  // reloads due and waiting for a handle, in order
  std::vector<char> evicted(na, 0), back(na, 0), holds(na, 0), abandoned(na, 0);
  int64_t shift = 0;
  pr.launch_start.assign(n, 0);
  auto take = [&](uint32_t i) {
    --free_handles;
    ++in_use;
    holds[i] = 1;
    pr.most_handles = std::max<uint64_t>(pr.most_handles, static_cast<uint64_t>(in_use));
  };
  auto give = [&](uint32_t i) {
    if (!holds[i]) return;
    holds[i] = 0;
    ++free_handles;
    --in_use;
  };
  auto issue_reload = [&](uint32_t i, int64_t when) {
    take(i);
    // Not before its bytes are on the host.
    int64_t ready = std::max(when, pr.arenas[i].evict_end);
    pr.arenas[i].reload_issue = when;
    h2d_job[i] = static_cast<int64_t>(l.push(false, i, ready, plan.arenas[i].used));
  };
  // A reload asked for while the copy out still runs: the executor keeps the memory (the
  // bytes never left) and the copy out's result is dropped.
  auto abandon = [&](uint32_t i, int64_t when) {
    abandoned[i] = back[i] = 1;
    pr.arenas[i].abandoned = true;
    pr.arenas[i].reload_issue = when;
  };
  // Issues the queued reloads that can go: the head's, while a handle is free (or its copy
  // out has not finished, which needs none).
  auto drain_pending = [&](int64_t when) {
    while (!pending.empty()) {
      uint32_t r = pending.front();
      if (evicted[r] && free_handles <= 0) break;
      pending.pop_front();
      if (evicted[r]) issue_reload(r, when);
      else abandon(r, when);
    }
  };
  auto on_done = [&](bool d2h, size_t idx) {
    const Link::Job& j = l.job(d2h, idx);
    ArenaTiming& at = pr.arenas[j.arena];
    if (d2h) {
      at.evict_start = j.start, at.evict_end = j.end;
      if (abandoned[j.arena]) return;
      evicted[j.arena] = 1;
      give(j.arena);
      drain_pending(j.end);
    } else {
      at.reload_start = j.start, at.reload_end = j.end;
      back[j.arena] = 1;
    }
  };
  // Waits (moves the link forward) until `ok()` holds; returns when, or kNever if it never does.
  auto wait_until = [&](int64_t from, auto ok) {
    l.advance(from, on_done);
    while (!ok()) {
      int64_t e = l.next_event();
      if (e == kNever) return kNever;
      l.advance(e, on_done);
    }
    return std::max(from, l.now());
  };
  auto fail = [&]() {
    pr.feasible = false;
    pr.step_ns = kNever / 4;
    return pr;
  };
  for (size_t i = 0; i < n; ++i) {
    const int64_t natural = g.start[i] + shift;
    int64_t s = natural;
    l.advance(s, on_done);
    each(i, kFreed, [&](uint32_t a) {
      give(a);
      return true;
    });
    each(i, kDue, [&](uint32_t a) {
      pending.push_back(a);
      return true;
    });
    if (!each(i, kBorn, [&](uint32_t a) {
          s = wait_until(s, [&] { return free_handles > 0; });
          if (s == kNever) return false;
          take(a);
          pr.arenas[a].born = s;
          return true;
        }))
      return fail();
    drain_pending(s);
    if (!each(i, kUsed, [&](uint32_t a) {
          // A first use before the reload was issued: the executor reloads on demand (or keeps
          // the memory, if the copy out is still running).
          if (h2d_job[a] < 0 && !back[a]) {
            auto it = std::find(pending.begin(), pending.end(), a);
            if (it != pending.end()) pending.erase(it);
            if (!evicted[a] && d2h_job[a] >= 0) {
              abandon(a, s);
            } else {
              s = wait_until(s, [&] { return free_handles > 0 && evicted[a] != 0; });
              if (s == kNever) return false;
              issue_reload(a, s);
            }
          }
          int64_t before = s;
          s = wait_until(s, [&] { return back[a] != 0; });
          if (s == kNever) return false;
          // Measured feedback: reloads used here came back later than the link model says.
          if (late[i] && !abandoned[a]) s = std::max(s, pr.arenas[a].reload_end + late[i]);
          pr.arenas[a].use = s;
          pr.arenas[a].stall += s - before;
          return true;
        }))
      return fail();
    shift += s - natural;
    pr.launch_start[i] = s;
    const int64_t end = s + g.dur[i];
    each(i, kEvict, [&](uint32_t a) {
      pr.arenas[a].evict_ready = end;
      d2h_job[a] = static_cast<int64_t>(l.push(true, a, end, plan.arenas[a].used));
      return true;
    });
  }
  pr.step_ns = g.total + shift;
  // Copies still running at the end of the step hold the next step up.
  int64_t tail = wait_until(pr.step_ns, [&] {
    for (uint32_t a = 0; a < na; ++a)
      if (d2h_job[a] >= 0 && !evicted[a]) return false;
    return true;
  });
  if (tail != kNever) pr.step_ns = std::max(pr.step_ns, tail);
  return pr;
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

// The step simulated under a plan, as planner.h's model has it: launches at their measured GPU
// times, arenas copied out and back on the link's two queues, launches waiting for the
// handles and reloads they need.
#include <algorithm>
#include <cmath>
#include <deque>

#include "planner/planner.h"
#include "planner/search.h"

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

// What happens to the arenas at each launch position, in the order Simulation::launch takes
// it: arenas whose last member is freed, reloads due, arenas born, first uses, evictions after
// the launch. One sorted list walked with a cursor: the search simulates thousands of times
// with a few dozen arenas against thousands of launches.
enum Kind : uint8_t { kFreed, kDue, kBorn, kUsed, kEvict };
struct At {
  uint32_t pos;
  Kind kind;
  uint32_t arena;
};

// The plan's arenas as events by position; marks their members in `member`, and counts their
// bytes into `pr` (each arena's, and those copied each way).
std::vector<At> arena_events(const StepTrace& t, const Plan& plan, std::vector<char>& member, Prediction& pr) {
  const size_t n = t.launches.size(), na = plan.arenas.size();
  std::vector<At> at_pos;
  at_pos.reserve(5 * na);
  std::vector<int64_t> last_free(na, -1);
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
  return at_pos;
}

// The step's launches in order, each starting when the handles and reloads it needs allow;
// the link copies the arenas out and back meanwhile. Fills the timings of `pr`.
struct Simulation {
  const GpuTimeline& g;
  const Plan& plan;
  Prediction& pr;
  const std::vector<At>& at_pos;
  const size_t n, na;
  size_t cursor = 0;
  std::vector<int64_t> late;  // per position, from LinkModel::late_at
  Link l;
  int64_t free_handles, in_use = 0;
  std::vector<int64_t> d2h_job, h2d_job;
  std::deque<uint32_t> pending;  // reloads due and waiting for a handle, in order
  std::vector<char> evicted, back, holds, abandoned;
  int64_t shift = 0;

  Simulation(const StepTrace& t, const GpuTimeline& g, const Plan& plan, const LinkModel& link, Prediction& pr,
             const std::vector<At>& at_pos)
      : g(g), plan(plan), pr(pr), at_pos(at_pos), n(t.launches.size()), na(plan.arenas.size()), late(n + 1, 0),
        l(link), free_handles(na ? plan.handles : 0), d2h_job(na, -1), h2d_job(na, -1), evicted(na, 0), back(na, 0),
        holds(na, 0), abandoned(na, 0) {
    for (const auto& [pos, ns] : link.late_at)
      if (pos >= 0 && static_cast<size_t>(pos) < n) late[static_cast<size_t>(pos)] = std::max(late[static_cast<size_t>(pos)], ns);
  }

  // The arenas of `kind` at position i, in order (the cursor passes the kinds in order).
  template <typename Fn>
  bool each(size_t i, Kind kind, Fn fn) {
    while (cursor < at_pos.size() && at_pos[cursor].pos == i && at_pos[cursor].kind < kind) ++cursor;
    for (; cursor < at_pos.size() && at_pos[cursor].pos == i && at_pos[cursor].kind == kind; ++cursor)
      if (!fn(at_pos[cursor].arena)) return false;
    return true;
  }
  void take(uint32_t i) {
    --free_handles;
    ++in_use;
    holds[i] = 1;
    pr.most_handles = std::max<uint64_t>(pr.most_handles, static_cast<uint64_t>(in_use));
  }
  void give(uint32_t i) {
    if (!holds[i]) return;
    holds[i] = 0;
    ++free_handles;
    --in_use;
  }
  void issue_reload(uint32_t i, int64_t when) {
    take(i);
    // Not before its bytes are on the host.
    int64_t ready = std::max(when, pr.arenas[i].evict_end);
    pr.arenas[i].reload_issue = when;
    h2d_job[i] = static_cast<int64_t>(l.push(false, i, ready, plan.arenas[i].used));
  }
  // A reload asked for while the copy out still runs: the executor keeps the memory (the
  // bytes never left) and the copy out's result is dropped.
  void abandon(uint32_t i, int64_t when) {
    abandoned[i] = back[i] = 1;
    pr.arenas[i].abandoned = true;
    pr.arenas[i].reload_issue = when;
  }
  // Issues the queued reloads that can go: the head's, while a handle is free (or its copy
  // out has not finished, which needs none).
  void drain_pending(int64_t when) {
    while (!pending.empty()) {
      uint32_t r = pending.front();
      if (evicted[r] && free_handles <= 0) break;
      pending.pop_front();
      if (evicted[r]) issue_reload(r, when);
      else abandon(r, when);
    }
  }
  void on_done(bool d2h, size_t idx) {
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
  }
  void advance(int64_t to) {
    l.advance(to, [this](bool d2h, size_t idx) { on_done(d2h, idx); });
  }
  // Waits (moves the link forward) until `ok()` holds; returns when, or kNever if it never does.
  template <typename Ok>
  int64_t wait_until(int64_t from, Ok ok) {
    advance(from);
    while (!ok()) {
      int64_t e = l.next_event();
      if (e == kNever) return kNever;
      advance(e);
    }
    return std::max(from, l.now());
  }

  // Arena a's first backward use, at launch i starting at `s` (moved on by the wait for it).
  bool first_use(size_t i, uint32_t a, int64_t& s) {
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
  }

  // Launch i; false when it waits for a handle that never frees.
  bool launch(size_t i) {
    const int64_t natural = g.start[i] + shift;
    int64_t s = natural;
    advance(s);
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
      return false;
    drain_pending(s);
    if (!each(i, kUsed, [&](uint32_t a) { return first_use(i, a, s); })) return false;
    shift += s - natural;
    pr.launch_start[i] = s;
    const int64_t end = s + g.dur[i];
    each(i, kEvict, [&](uint32_t a) {
      pr.arenas[a].evict_ready = end;
      d2h_job[a] = static_cast<int64_t>(l.push(true, a, end, plan.arenas[a].used));
      return true;
    });
    return true;
  }

  // The whole step; false when it waits for a handle that never frees.
  bool run() {
    pr.launch_start.assign(n, 0);
    for (size_t i = 0; i < n; ++i)
      if (!launch(i)) return false;
    pr.step_ns = g.total + shift;
    // Copies still running at the end of the step hold the next step up.
    int64_t tail = wait_until(pr.step_ns, [&] {
      for (uint32_t a = 0; a < na; ++a)
        if (d2h_job[a] >= 0 && !evicted[a]) return false;
      return true;
    });
    if (tail != kNever) pr.step_ns = std::max(pr.step_ns, tail);
    return true;
  }
};

}  // namespace

Prediction simulate(const StepTrace& t, const GpuTimeline& g, const Plan& plan, const LinkModel& link,
                    double pool_overhead, int64_t peak_pos) {
  Prediction pr;
  const size_t n = t.launches.size();
  if (peak_pos < 0) peak_pos = step_facts(t, 0).peak_pos;
  pr.compute_ns = g.total;
  const size_t turn = std::min(n, static_cast<size_t>(peak_pos + 1));
  pr.forward_ns = turn < n ? g.start[turn] : g.total;
  pr.backward_ns = g.total - pr.forward_ns;
  pr.arenas.resize(plan.arenas.size());
  std::vector<char> member(t.allocs.size(), 0);
  const std::vector<At> at_pos = arena_events(t, plan, member, pr);
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

  Simulation sim(t, g, plan, link, pr, at_pos);
  if (!sim.run()) {
    pr.feasible = false;
    pr.step_ns = kNever / 4;
  }
  return pr;
}

}  // namespace offload

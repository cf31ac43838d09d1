#include "planner/plan.h"

#include <algorithm>
#include <cstdio>

namespace offload {

std::string gib_text(uint64_t b) {
  char s[32];
  snprintf(s, sizeof s, "%.2f GiB", static_cast<double>(b) / (1ull << 30));
  return s;
}

std::vector<uint64_t> step_tokens(const StepTrace& t) {
  std::vector<uint64_t> tokens;
  tokens.reserve(t.launches.size());
  for (const TraceLaunch& l : t.launches) tokens.push_back(launch_token(l.kind, l.kernel));
  return tokens;
}

void Plan::index_members() {
  std::sort(members.begin(), members.end(), [](const MemberPlan& a, const MemberPlan& b) {
    return a.pos != b.pos ? a.pos < b.pos : a.sub < b.sub;
  });
  member_index.assign(step_launches + 1, 0);
  size_t mi = 0;
  for (size_t q = 0; q <= step_launches; ++q) {
    while (mi < members.size() && members[mi].pos < q) ++mi;
    member_index[q] = static_cast<uint32_t>(mi);
  }
}

uint64_t Plan::host_bytes() const {
  uint64_t b = 0;
  for (const ArenaPlan& a : arenas) b = std::max(b, a.host_offset + a.used);
  for (const WeightPlan& w : weights) b = std::max(b, w.host_offset + w.bytes);
  return b;
}

std::string Plan::describe() const {
  uint64_t moved = 0;
  for (const ArenaPlan& a : arenas) moved += a.used;
  std::string s;
  if (!arenas.empty() || weights.empty())
    s = std::to_string(arenas.size()) + " arenas offloaded (" + gib_text(moved) + " of " + gib_text(candidate_bytes) +
        " in " + std::to_string(candidates) + " activations), " + std::to_string(handles) + " handles of " +
        std::to_string(handle_bytes >> 20) + " MiB; ";
  if (!weights.empty()) {
    uint64_t wb = 0, streamed = 0;
    for (const WeightPlan& w : weights) wb += w.bytes;
    for (const WeightWindow& w : windows) streamed += weights[w.weight].bytes;
    s += std::to_string(weights.size()) + " weights streamed (" + gib_text(wb) + ", " + std::to_string(windows.size()) +
         " windows moving " + gib_text(streamed) + " each way, at most " + gib_text(weight_bytes_mapped) +
         " of them mapped at once); ";
  }
  s += "peak " + gib_text(plain_peak) + " -> predicted " + gib_text(predicted_peak);
  if (budget) s += std::string(" (budget ") + gib_text(budget) + (meets_budget ? ")" : ", NOT met)");
  if (predicted_step_ns > 0) {
    char m[128];
    snprintf(m, sizeof m, "; step %.1f ms predicted (compute %.1f ms, bound %.1f ms)", predicted_step_ns / 1e6,
             compute_ns / 1e6, lower_bound_ns / 1e6);
    s += m;
  }
  return s;
}

void resolve_weights(Plan& p, const StepTrace& t) {
  std::vector<uint32_t> index(p.weights.size(), ~uint32_t{0});
  std::vector<WeightPlan> kept;
  for (size_t i = 0; i < p.weights.size(); ++i) {
    WeightPlan w = p.weights[i];
    if (w.ordinal >= t.allocs.size() || !t.allocs[w.ordinal].base) continue;
    w.va = t.allocs[w.ordinal].base;
    w.id = t.allocs[w.ordinal].id;
    index[i] = static_cast<uint32_t>(kept.size());
    kept.push_back(w);
  }
  std::vector<WeightWindow> windows;
  for (WeightWindow w : p.windows)
    if (w.weight < index.size() && index[w.weight] != ~uint32_t{0}) {
      w.weight = index[w.weight];
      windows.push_back(w);
    }
  p.weights = std::move(kept);
  p.windows = std::move(windows);
}

std::vector<int64_t> live_bytes(const StepTrace& t, const std::vector<char>* skip) {
  const size_t n = t.launches.size();
  std::vector<int64_t> live(n, 0), delta(n + 1, 0);
  int64_t v = 0;
  for (const TraceAlloc& a : t.allocs) {
    if (skip && (*skip)[a.ordinal]) continue;
    if (a.alloc_pos < 0) v += static_cast<int64_t>(a.bytes);
    else if (static_cast<size_t>(a.alloc_pos) <= n) delta[static_cast<size_t>(a.alloc_pos)] += static_cast<int64_t>(a.bytes);
    if (a.free_pos >= 0 && static_cast<size_t>(a.free_pos) <= n) delta[static_cast<size_t>(a.free_pos)] -= static_cast<int64_t>(a.bytes);
  }
  for (size_t i = 0; i < n; ++i) live[i] = v += delta[i];
  return live;
}

StepFacts step_facts(const StepTrace& t, uint64_t min_bytes) {
  StepFacts f;
  const size_t n = t.launches.size();
  // Live bytes before each launch, and the peak.
  f.live = live_bytes(t, nullptr);
  if (n == 0) return f;
  f.peak_pos = std::max_element(f.live.begin(), f.live.end()) - f.live.begin();
  f.peak = static_cast<uint64_t>(f.live[static_cast<size_t>(f.peak_pos)]);
  // The turnaround is the peak, or the first gradient's birth where that comes earlier (under
  // activation checkpointing the peak lies late in the backward): as analyse_activations.
  f.peak_pos = turn_position(t, f.peak_pos, kActivationMinBytes);
  // Accesses per allocation: the last before the turnaround, the first after it.
  f.fwd_last.assign(t.allocs.size(), -1);
  f.bwd_first.assign(t.allocs.size(), -1);
  for (const TraceLaunch& l : t.launches)
    for (uint32_t a : l.allocs) {
      if (a >= t.allocs.size()) continue;
      if (l.pos <= f.peak_pos) f.fwd_last[a] = std::max<int64_t>(f.fwd_last[a], l.pos);
      else if (f.bwd_first[a] < 0) f.bwd_first[a] = l.pos;
    }
  // The sub-ordinal of each allocation among those born before the same launch.
  f.sub.assign(t.allocs.size(), 0);
  std::vector<uint32_t> seen(n, 0);
  for (const TraceAlloc& a : t.allocs)
    if (a.alloc_pos >= 0 && static_cast<size_t>(a.alloc_pos) < n) f.sub[a.ordinal] = seen[a.alloc_pos]++;
  // Candidates: activations (born by the peak, freed after the turnaround) read in backward.
  for (const TraceAlloc& a : t.allocs) {
    if (a.alloc_pos < 0 || a.alloc_pos > f.peak_pos || a.free_pos <= f.peak_pos + 1) continue;
    if (a.bytes < min_bytes || f.bwd_first[a.ordinal] < 0) continue;
    f.candidates.push_back(a.ordinal);
    f.candidate_bytes += a.bytes;
  }
  return f;
}

void add_arena(Plan& p, const StepTrace& t, const StepFacts& f, const std::vector<uint32_t>& members, uint64_t cap,
               int64_t reload_at, uint64_t member_align) {
  ArenaPlan ap;
  ap.capacity = cap;
  ap.reload_at = reload_at;
  if (!p.arenas.empty()) ap.host_offset = round_up(p.arenas.back().host_offset + p.arenas.back().used, 4096);
  ap.members = members;
  uint64_t off = 0;
  for (uint32_t m : members) {
    const TraceAlloc& ta = t.allocs[m];
    ap.evict_after = std::max({ap.evict_after, f.fwd_last[m], ta.alloc_pos});
    if (ap.first_use < 0 || f.bwd_first[m] < ap.first_use) ap.first_use = f.bwd_first[m];
    p.members.push_back(MemberPlan{static_cast<uint32_t>(ta.alloc_pos), f.sub[m], ta.bytes,
                                   static_cast<uint32_t>(p.arenas.size()), off});
    off += round_up(ta.bytes, member_align);
  }
  ap.used = off;
  p.arenas.push_back(std::move(ap));
}

namespace {

struct Arena {
  std::vector<uint32_t> members;  // ordinals
  uint64_t used = 0;
  int64_t evict_after = -1, first_use = -1;
};

// Arenas: consecutive candidates, about candidate_bytes / segments each.
std::vector<Arena> pack_arenas(const StepTrace& t, const StepFacts& f, const PlanOptions& o) {
  const uint64_t arena_target = std::max(o.granularity, f.candidate_bytes / std::max(1u, o.segments));
  std::vector<Arena> arenas;
  for (uint32_t c : f.candidates) {
    uint64_t bytes = round_up(t.allocs[c].bytes, o.member_align);
    if (arenas.empty() || (arenas.back().used + bytes > arena_target && !arenas.back().members.empty()))
      arenas.emplace_back();
    Arena& a = arenas.back();
    a.members.push_back(c);
    a.used += bytes;
  }
  for (Arena& a : arenas) {
    for (uint32_t m : a.members) {
      a.evict_after = std::max({a.evict_after, f.fwd_last[m], t.allocs[m].alloc_pos});
      if (a.first_use < 0 || f.bwd_first[m] < a.first_use) a.first_use = f.bwd_first[m];
    }
  }
  return arenas;
}

// Every arena but the last (its activations are needed at once in backward), and only
// those with a gap to hide a copy in.
// A copy out and back needs time to hide in: without GPU times, the built-in plan asks for
// an idle gap of a thirty-second of the step's launches (about half a layer of the
// reference workload).
std::vector<size_t> idle_arenas(const std::vector<Arena>& arenas, size_t n, const PlanOptions& o) {
  const int64_t min_gap = std::max<int64_t>(2, static_cast<int64_t>(n) / o.min_gap_fraction);
  std::vector<size_t> offloadable;
  for (size_t i = 0; i + 1 < arenas.size(); ++i)
    if (arenas[i].first_use - arenas[i].evict_after >= min_gap) offloadable.push_back(i);
  return offloadable;
}

// The oldest arenas of `offloadable` moved, in handles of `cap` bytes: what that costs.
struct Offload {
  const StepTrace& t;
  const StepFacts& f;
  const PlanOptions& o;
  const std::vector<Arena>& arenas;
  std::vector<size_t> offloadable;
  uint64_t cap = 0;

  size_t n() const { return t.launches.size(); }

  uint64_t resident_peak(size_t k) const {
    std::vector<int64_t> res(f.live);
    for (size_t j = 0; j < k; ++j)
      for (uint32_t m : arenas[offloadable[j]].members) {
        const TraceAlloc& a = t.allocs[m];
        for (int64_t q = a.alloc_pos; q < a.free_pos && q < static_cast<int64_t>(n()); ++q)
          res[static_cast<size_t>(q)] -= static_cast<int64_t>(a.bytes);
      }
    return static_cast<uint64_t>(*std::max_element(res.begin(), res.end()));
  }

  // Reloads go one arena ahead in backward order: arena j comes back when the arena consumed
  // just before it is first used (the first consumed, at the turnaround).
  int64_t reload_at(size_t kk, size_t j) const {
    const Arena& a = arenas[offloadable[j]];
    int64_t at = f.peak_pos + 1;
    for (size_t i = 0; i < kk; ++i) {
      int64_t first = arenas[offloadable[i]].first_use;
      if (first < a.first_use) at = std::max(at, first);  // arenas first used together come back together
    }
    return std::clamp<int64_t>(at, a.evict_after + 1, a.first_use);
  }

  // Physical handles: the most arenas mapped at once when the oldest kk are offloaded. In the
  // forward an arena is mapped from its first member's birth until its copy out is done,
  // taken to be when the arena after next starts filling (the copies trail the compute);
  // in the backward from its reload until its last member is freed.
  uint64_t handles_needed(size_t kk) const {
    std::vector<int32_t> count(n() + 1, 0);
    auto span = [&](int64_t a, int64_t b) {
      a = std::clamp<int64_t>(a, 0, static_cast<int64_t>(n()));
      b = std::clamp<int64_t>(b, a, static_cast<int64_t>(n()));
      ++count[static_cast<size_t>(a)];
      --count[static_cast<size_t>(b)];
    };
    for (size_t j = 0; j < kk; ++j) {
      const Arena& a = arenas[offloadable[j]];
      int64_t born = static_cast<int64_t>(n()), last_free = 0;
      for (uint32_t m : a.members) {
        born = std::min(born, t.allocs[m].alloc_pos);
        last_free = std::max(last_free, t.allocs[m].free_pos);
      }
      size_t after_next = offloadable[j] + 2;
      int64_t out_done = a.evict_after + 1;
      if (after_next < arenas.size())
        for (uint32_t m : arenas[after_next].members) out_done = std::max(out_done, t.allocs[m].alloc_pos);
      span(born, out_done + 1);
      span(reload_at(kk, j), last_free + 1);
    }
    int32_t most = 0, run = 0;
    for (size_t q = 0; q <= n(); ++q) most = std::max(most, run += count[q]);
    return std::max<uint64_t>(2, static_cast<uint64_t>(most));
  }

  // The stream-ordered pool reserves more than the live bytes it hands out (fragmentation):
  // what stays outside arenas costs pool_overhead times its size.
  uint64_t predicted(size_t kk, uint64_t* res) const {
    *res = resident_peak(kk);
    return static_cast<uint64_t>(static_cast<double>(*res) * o.pool_overhead) + std::min<uint64_t>(handles_needed(kk), kk) * cap;
  }
};

struct Choice {
  uint64_t cap = 0, res = 0, pred = ~uint64_t{0}, moved = 0;
  std::vector<size_t> arenas;
  size_t k = 0;
  bool meets = false;
};

// With handles of `cap` bytes (larger arenas stay resident): offload the oldest k arenas of
// `all_offloadable`, the smallest k that meets the budget, else all of them the host pool takes.
// k = 0: the host pool takes none.
Choice choose_for_cap(Offload& off, const std::vector<size_t>& all_offloadable, uint64_t cap) {
  const PlanOptions& o = off.o;
  const uint64_t target = o.budget;
  off.cap = cap;
  off.offloadable.clear();
  for (size_t i : all_offloadable)
    if (round_up(off.arenas[i].used, o.granularity) <= cap) off.offloadable.push_back(i);
  size_t k = off.offloadable.size();
  uint64_t host = 0;
  for (size_t j = 0; j < off.offloadable.size(); ++j) {
    host += off.arenas[off.offloadable[j]].used;
    if (host > o.max_host_bytes) {
      k = j;
      break;
    }
  }
  if (k == 0) return Choice{};
  uint64_t res = 0, pred = off.predicted(k, &res);
  if (o.budget && pred <= target) {
    // Fewer arenas may do: every one moved costs link time.
    size_t lo = 1, hi = k;
    while (lo < hi) {
      size_t mid = (lo + hi) / 2;
      uint64_t r2;
      if (off.predicted(mid, &r2) <= target) hi = mid;
      else lo = mid + 1;
    }
    k = lo;
    pred = off.predicted(k, &res);
  }
  Choice ch{cap, res, pred, 0, std::vector<size_t>(off.offloadable.begin(), off.offloadable.begin() + static_cast<long>(k)),
            k, !o.budget || pred <= target};
  for (size_t i : ch.arenas) ch.moved += off.arenas[i].used;
  return ch;
}

// Every handle has the size of the largest offloaded arena, so one arena far larger than
// the others (a single huge activation, such as a language model's logits) would make
// every handle that large. Each arena size is tried as the handle size (larger arenas stay
// resident); the best choice wins.
Choice best_choice(Offload& off, const std::vector<size_t>& all_offloadable) {
  const PlanOptions& o = off.o;
  std::vector<uint64_t> caps;
  for (size_t i : all_offloadable) caps.push_back(round_up(off.arenas[i].used, o.granularity));
  std::sort(caps.begin(), caps.end());
  caps.erase(std::unique(caps.begin(), caps.end()), caps.end());
  Choice best;
  for (uint64_t c : caps) {
    Choice ch = choose_for_cap(off, all_offloadable, c);
    if (ch.k == 0) continue;
    // Without a budget: every candidate (the most bytes moved). With one: meeting it first,
    // then moving the fewest bytes; else the lowest peak.
    bool better = !o.budget ? ch.moved > best.moved
                            : ch.meets ? (!best.meets || ch.moved < best.moved) : (!best.meets && ch.pred < best.pred);
    if (better) best = std::move(ch);
  }
  return best;
}

}  // namespace

Plan build_plan(const StepTrace& t, const PlanOptions& o, std::string* why) {
  Plan p;
  p.budget = o.budget;
  const size_t n = t.launches.size();
  p.step_launches = n;
  p.tokens = step_tokens(t);
  p.member_index.assign(n + 1, 0);
  if (n == 0) {
    *why = "the step has no launches";
    return p;
  }

  const StepFacts f = step_facts(t, o.min_bytes);
  p.plain_peak = f.peak;
  p.resident_peak = p.predicted_peak = p.plain_peak;
  if (o.budget && p.plain_peak <= o.budget) {
    *why = "the step's peak (" + gib_text(p.plain_peak) + ") is within the budget";
    return p;
  }
  p.candidate_bytes = f.candidate_bytes;
  p.candidates = f.candidates.size();
  if (f.candidates.size() < 2) {
    *why = "fewer than two activations to offload";
    return p;
  }

  const std::vector<Arena> arenas = pack_arenas(t, f, o);
  const std::vector<size_t> all_offloadable = idle_arenas(arenas, n, o);
  if (all_offloadable.empty()) {
    *why = "no activation is idle between its forward and backward use";
    return p;
  }
  Offload off{t, f, o, arenas, {}, 0};
  const Choice best = best_choice(off, all_offloadable);
  if (best.k == 0) {
    *why = "the host pool cannot take even one arena (" + gib_text(arenas[all_offloadable[0]].used) + ")";
    return p;
  }
  off.cap = best.cap;
  off.offloadable = best.arenas;
  const size_t k = best.k;
  const uint64_t res = best.res, pred = best.pred;
  const uint64_t plain_footprint = static_cast<uint64_t>(static_cast<double>(p.plain_peak) * o.pool_overhead);
  if (o.budget && pred >= plain_footprint) {
    *why = "offloading would not lower the footprint below " + gib_text(plain_footprint) + " (the best plan keeps " + gib_text(res) +
           " outside arenas, and " + std::to_string(off.handles_needed(k)) + " arenas of " + std::to_string(off.cap >> 20) +
           " MiB mapped at once)";
    return p;
  }
  p.meets_budget = !o.budget || pred <= o.budget;
  p.resident_peak = res;
  p.predicted_peak = pred;
  p.handles = static_cast<uint32_t>(std::min<uint64_t>(off.handles_needed(k), k));
  p.handle_bytes = off.cap;

  // Reload one arena ahead: while the backward consumes arena j+1, arena j comes back.
  for (size_t j = 0; j < k; ++j) add_arena(p, t, f, arenas[off.offloadable[j]].members, off.cap, off.reload_at(k, j), o.member_align);
  p.index_members();
  return p;
}

}  // namespace offload

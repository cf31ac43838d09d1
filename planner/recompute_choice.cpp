#include "planner/recompute_choice.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

namespace offload {

bool kernel_draws_random(const std::string& name) {
  std::string low = name;
  for (char& c : low) c = char(std::tolower(static_cast<unsigned char>(c)));
  for (const char* w : {"philox", "curand", "random", "randperm", "distribution", "dropout", "bernoulli",
                        "multinomial"})
    if (low.find(w) != std::string::npos) return true;
  return false;
}

namespace {

// The first launch touching each ordinal, and its first touch at or after `from` (-1: none).
struct Touches {
  std::vector<int64_t> first;
  std::vector<std::vector<uint32_t>> at;  // per ordinal, the positions touching it
  explicit Touches(const StepTrace& t) : first(t.allocs.size(), -1), at(t.allocs.size()) {
    for (const TraceLaunch& l : t.launches)
      for (uint32_t o : l.allocs)
        if (o < at.size() && (at[o].empty() || at[o].back() != l.pos)) at[o].push_back(l.pos);
    for (size_t o = 0; o < at.size(); ++o)
      if (!at[o].empty()) first[o] = at[o].front();
  }
};

}  // namespace

RecomputeEstimate choose_recompute(const StepTrace& t, const PlannerResult& r, const LinkModel& link) {
  RecomputeEstimate e;
  const Touches touches(t);
  const double out_rate = link.d2h * link.scale, in_rate = link.h2d * link.scale;  // bytes per ns
  const double slow = std::min(out_rate, in_rate);
  std::vector<bool> moved(t.allocs.size(), false);
  for (const ArenaPlan& a : r.plan.arenas)
    for (uint32_t m : a.members) {
      if (m >= t.allocs.size()) continue;
      moved[m] = true;
      const TraceAlloc& x = t.allocs[m];
      const int64_t p = touches.first[m];
      bool ok = p >= 0 && static_cast<size_t>(p) < t.launches.size();
      const TraceLaunch* l = ok ? &t.launches[static_cast<size_t>(p)] : nullptr;
      ok = ok && l->kind == EventKind::Kernel && l->gpu_ns >= 0;
      if (ok) {
        auto name = t.kernels.find(l->kernel);
        ok = name == t.kernels.end() || !kernel_draws_random(name->second);
      }
      size_t inputs = 0;
      for (size_t i = 0; ok && i < l->allocs.size(); ++i) {
        const uint32_t o = l->allocs[i];
        if (o == m || o >= t.allocs.size()) continue;
        if (touches.first[o] == p && t.allocs[o].alloc_pos >= 0) ok = false;  // a second new one
        const int64_t freed = t.allocs[o].free_pos;
        if (freed >= 0 && freed <= a.first_use) ok = false;  // gone when it is needed again
        ++inputs;
      }
      const int64_t copy_ns = static_cast<int64_t>(x.bytes / out_rate + x.bytes / in_rate);
      ok = ok && inputs > 0 && 2 * l->gpu_ns < copy_ns;
      if (!ok) {
        ++e.moved;
        e.moved_bytes += x.bytes;
        continue;
      }
      ++e.remade;
      e.remade_bytes += x.bytes;
      e.gpu_ns_added += l->gpu_ns;
      e.link_ns_saved += static_cast<int64_t>(x.bytes / slow);
      e.remade_list.push_back({m, static_cast<uint32_t>(p), l->gpu_ns, copy_ns});
    }
  e.kept = analyse_activations(t).activations;
  e.kept -= std::min(e.kept, e.moved + e.remade);
  const Prediction& pr = r.prediction;
  const int64_t exposed = std::max<int64_t>(0, pr.step_ns - pr.compute_ns);
  e.step_ns = pr.compute_ns + e.gpu_ns_added + std::max<int64_t>(0, exposed - e.link_ns_saved);
  std::sort(e.remade_list.begin(), e.remade_list.end(),
            [](const RecomputeChoice& a, const RecomputeChoice& b) { return a.ordinal < b.ordinal; });
  return e;
}

std::string serialize(const RecomputeEstimate& e) {
  std::string s;
  char buf[256];
  std::snprintf(buf, sizeof buf, "kept=%zu moved=%zu remade=%zu moved_bytes=%llu remade_bytes=%llu step_us=%lld\n",
                e.kept, e.moved, e.remade, static_cast<unsigned long long>(e.moved_bytes),
                static_cast<unsigned long long>(e.remade_bytes), static_cast<long long>(e.step_ns / 1000));
  s += buf;
  for (const RecomputeChoice& c : e.remade_list) {
    std::snprintf(buf, sizeof buf, "remade ordinal=%u producer=%u producer_us=%lld copy_us=%lld\n", c.ordinal, c.producer,
                  static_cast<long long>(c.producer_ns / 1000), static_cast<long long>(c.copy_ns / 1000));
    s += buf;
  }
  return s;
}

}  // namespace offload

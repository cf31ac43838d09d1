#include "core/replay.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <cstring>

#include "core/sim_driver.h"
#include "core/tracker.h"

namespace offload {
namespace {

using Key = std::tuple<uint64_t, int64_t, int64_t>;  // bytes, born, freed

std::vector<Key> touched(const StepTrace& t, const TraceLaunch& l) {
  std::vector<Key> k;
  for (uint32_t o : l.allocs) k.emplace_back(t.allocs[o].bytes, t.allocs[o].alloc_pos, t.allocs[o].free_pos);
  std::sort(k.begin(), k.end());
  return k;
}

}  // namespace

bool same_step(const StepTrace& a, const StepTrace& b, std::string* why) {
  auto fail = [&](std::string s) {
    if (why) *why = std::move(s);
    return false;
  };
  if (a.launches.size() != b.launches.size())
    return fail("launch count " + std::to_string(a.launches.size()) + " vs " + std::to_string(b.launches.size()));
  std::vector<Key> aa, ba;
  for (const TraceAlloc& x : a.allocs) aa.emplace_back(x.bytes, x.alloc_pos, x.free_pos);
  for (const TraceAlloc& x : b.allocs) ba.emplace_back(x.bytes, x.alloc_pos, x.free_pos);
  std::sort(aa.begin(), aa.end());
  std::sort(ba.begin(), ba.end());
  if (aa != ba) return fail("the allocations differ");
  for (size_t i = 0; i < a.launches.size(); ++i) {
    const TraceLaunch &x = a.launches[i], &y = b.launches[i];
    std::string xn = x.kind == EventKind::Kernel ? a.kernels.at(x.kernel) : "";
    std::string yn = y.kind == EventKind::Kernel ? b.kernels.at(y.kernel) : "";
    if (x.kind != y.kind || xn != yn || x.stream != y.stream)
      return fail("launch " + std::to_string(i) + " is a different launch");
    if (touched(a, x) != touched(b, y)) return fail("launch " + std::to_string(i) + " touches other allocations");
  }
  return true;
}

ReplayResult replay(const StepTrace& rec, const ReplayOptions& opt) {
  SimDriver drv;
  EventLog log(1 << 16, 1 << 20);
  Tracker tracker(drv, log);
  StepAssembler::Options ao;
  ao.telemetry_wait_ns = 0;  // no GPU times to wait for
  StepAssembler asm_(tracker.funcs(), ao);
  ReplayResult res;

  // One simulated kernel per recorded kernel, wide enough for its widest launch.
  std::map<uint32_t, size_t> width;
  for (const TraceLaunch& l : rec.launches)
    if (l.kind == EventKind::Kernel) width[l.kernel] = std::max(width[l.kernel], l.allocs.size());
  std::map<uint32_t, Func> funcs;
  for (auto& [id, w] : width) {
    uint32_t bytes = static_cast<uint32_t>(8 * std::max<size_t>(w, 1));
    funcs[id] = drv.add_kernel(rec.kernels.count(id) ? rec.kernels.at(id) : "?",
                               {{0, bytes}, {bytes, 4}, {bytes + 8, 8}});
  }

  // Births and deaths before each position (frees first: the allocator may reuse them).
  const size_t n = rec.launches.size();
  std::vector<std::vector<uint32_t>> born(n + 1), dies(n + 1);
  std::vector<uint32_t> before_step;  // ordinals alive when the step starts
  for (const TraceAlloc& a : rec.allocs) {
    if (a.alloc_pos >= 0) born[static_cast<size_t>(a.alloc_pos)].push_back(a.ordinal);
    else before_step.push_back(a.ordinal);
    if (a.free_pos >= 0) dies[static_cast<size_t>(a.free_pos)].push_back(a.ordinal);
  }
  // Allocations born in a step that outlive it become, next step, the ones of the same size
  // that the recording shows freed after having been born before the step (gradients).
  std::map<uint64_t, std::vector<uint32_t>> carried_by_size;  // bytes -> ordinals freed in-step
  for (uint32_t o : before_step)
    if (rec.allocs[o].free_pos >= 0) carried_by_size[rec.allocs[o].bytes].push_back(o);

  auto pump = [&] {
    log.drain([&](const Event& e, const AllocId* acc) { asm_.consume(e, acc); });
    for (StepTrace& t : asm_.take_ready(0, false)) res.steps.push_back(std::move(t));
  };

  std::vector<DevPtr> addr(rec.allocs.size(), 0);
  auto alloc = [&](uint32_t o) {
    addr[o] = drv.alloc(rec.allocs[o].bytes);
    tracker.on_alloc(addr[o], rec.allocs[o].bytes, rec.allocs[o].stream);
  };
  auto release = [&](uint32_t o) {
    tracker.on_free(addr[o], rec.allocs[o].stream);
    drv.free(addr[o]);
    addr[o] = 0;
  };
  for (uint32_t o : before_step) alloc(o);

  std::vector<unsigned char> buf;
  for (int r = 0; r < opt.repeats; ++r) {
    for (size_t p = 0; p <= n; ++p) {
      for (uint32_t o : dies[p])
        if (addr[o]) release(o);
      for (uint32_t o : born[p]) alloc(o);
      if (p == n) break;
      const TraceLaunch& l = rec.launches[p];
      // Interior pointers: views point past their storage's start.
      auto ptr = [&](uint32_t o) { return addr[o] + (rec.allocs[o].bytes > 64 ? 32 : 0); };
      switch (l.kind) {
        case EventKind::Kernel: {
          size_t w = width[l.kernel];
          buf.assign(8 * std::max<size_t>(w, 1) + 16, 0);
          for (size_t i = 0; i < l.allocs.size(); ++i) {
            DevPtr v = ptr(l.allocs[i]);
            std::memcpy(buf.data() + 8 * i, &v, 8);
          }
          uint32_t scalar = 7;
          uint64_t stride = 4096;
          std::memcpy(buf.data() + 8 * std::max<size_t>(w, 1), &scalar, 4);
          std::memcpy(buf.data() + 8 * std::max<size_t>(w, 1) + 8, &stride, 8);
          void* params[3] = {buf.data(), buf.data() + 8 * std::max<size_t>(w, 1),
                             buf.data() + 8 * std::max<size_t>(w, 1) + 8};
          tracker.on_kernel(funcs[l.kernel], l.stream, params, nullptr);
          break;
        }
        case EventKind::Copy:
          tracker.on_copy(l.allocs.size() > 0 ? ptr(l.allocs[0]) : 0,
                          l.allocs.size() > 1 ? ptr(l.allocs[1]) : 0, 0, l.stream);
          break;
        case EventKind::Memset:
          tracker.on_memset(l.allocs.empty() ? 0 : ptr(l.allocs[0]), 0, l.stream);
          break;
        default:
          tracker.on_graph(l.stream);
      }
      if ((p & 255) == 0) pump();
    }
    // Carry what outlives the step into the next one's "born before" slots.
    std::map<uint64_t, size_t> used;
    for (const TraceAlloc& a : rec.allocs) {
      if (a.alloc_pos < 0 || a.free_pos >= 0 || !addr[a.ordinal]) continue;
      auto it = carried_by_size.find(a.bytes);
      size_t& k = used[a.bytes];
      if (it != carried_by_size.end() && k < it->second.size()) {
        addr[it->second[k++]] = addr[a.ordinal];
        addr[a.ordinal] = 0;
      } else {
        release(a.ordinal);  // nothing in the recording carries it: let it go
      }
    }
    if (opt.mark_steps) tracker.mark_step();
    pump();
  }
  for (StepTrace& t : asm_.take_ready(0, true)) res.steps.push_back(std::move(t));
  res.period = asm_.detector().period();
  res.hook_ns_mean = tracker.counters().hook_ns_mean();
  for (const StepTrace& t : res.steps) {
    std::string why;
    if (same_step(rec, t, &why)) ++res.matching_steps;
    else if (res.first_mismatch.empty()) res.first_mismatch = "step " + std::to_string(t.step) + ": " + why;
  }
  return res;
}

}  // namespace offload

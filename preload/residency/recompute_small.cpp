// Recompute's small allocations (recompute.cpp): those outside the ranges (PyTorch's pool: a
// bias, a norm's weights) that a producer reads. The tracker's table finds them at a launch's
// argument positions; probes learn whether a kernel writes them there as for ranges; a version,
// kept only for those some producer lists, moves at every launch that may write one (a launch we
// cannot see into: all of them; one touching no range: all it touches) and at its free. A
// producer is made again only while each is as it read it, and writes none of them. A range made
// from one may be dropped: a launch that may write it, or its free, makes such ranges again first
// (rc_guard_smalls), as for ranges' dependents.
// A producer may also write small allocations besides its output (a norm's mean and inverse
// deviation): those are its small side, kept across a launch made again as a range side is
// (recompute_side.cpp). Followed too, for their frees and for the streams that touch them.
#include <algorithm>

#include "residency/residency.h"

namespace offload {

using recompute::kSmallBit;

int32_t Residency::rc_small_at(DevPtr v, const AllocId* acc, size_t nsmall) {
  // One found already holds it; once every one the tracker saw is found, nothing else is looked up
  // (most words of a packed buffer are sizes and strides).
  for (size_t i = 0; i < rc_.smalls.size(); ++i)
    if (v >= rc_.smalls[i].base && v - rc_.smalls[i].base < rc_.smalls[i].bytes) return int32_t(i);
  AllocId id = 0;
  DevPtr base = 0;
  uint64_t bytes = 0;
  if (!v || rc_.smalls.size() >= nsmall || !finder_(finder_ctx_, v, &id, &base, &bytes) ||
      !std::binary_search(acc, acc + nsmall, id))
    return -1;
  for (size_t i = 0; i < rc_.smalls.size(); ++i)
    if (rc_.smalls[i].id == id) return int32_t(i);  // (an empty one: no address inside it)
  rc_.smalls.push_back({id, base, bytes});
  return int32_t(rc_.smalls.size() - 1);
}

void Residency::rc_bump_small(AllocId id) {
  if (auto it = rc_.small.find(id); it != rc_.small.end()) it->second.version = ++rc_.clock;
}

void Residency::rc_bump_smalls(bool all, const AllocId* acc, size_t n) {
  if (rc_.small.empty()) return;
  if (all) {
    for (auto& [id, sm] : rc_.small) sm.version = ++rc_.clock;
    return;
  }
  for (size_t i = 0; i < n && acc[i] < kRangeIdBit; ++i) rc_bump_small(acc[i]);
}

bool Residency::rc_smalls_kept(const recompute::Producer& p) const {
  for (const auto& [id, v] : p.small_inputs) {
    auto it = rc_.small.find(id);
    if (it == rc_.small.end() || it->second.freed || it->second.version != v) return false;
  }
  // Its small sides only still allocated: their bytes are saved and put back around the launch.
  return rc_small_sides_live(p);
}

bool Residency::rc_small_sides_live(const recompute::Producer& p) const {
  for (const recompute::Producer::SmallSide& w : p.small_side) {
    auto it = rc_.small.find(w.id);
    if (it == rc_.small.end() || it->second.freed) return false;
  }
  return true;
}

AllocId Residency::rc_floor_smalls(bool blind, const AllocId* acc, size_t n) {
  AllocId top;
  if (blind) {
    top = horizon_ ? horizon_(finder_ctx_) + 1 : kRangeIdBit;
  } else {
    const size_t nsmall = size_t(std::lower_bound(acc, acc + n, kRangeIdBit) - acc);  // acc is sorted
    top = nsmall ? acc[nsmall - 1] + 1 : 0;
  }
  AllocId was = rc_small_floor_.load(std::memory_order_relaxed);
  while (top > was && !rc_small_floor_.compare_exchange_weak(was, top, std::memory_order_relaxed)) {
  }
  return was;
}

void Residency::rc_follow_small(AllocId id) {
  ++rc_.small[id].consumers;
  ++rc_.small_consumers;
  rc_small_watch_.store(true, std::memory_order_release);
}

void Residency::rc_unfollow_small(AllocId id) {
  auto it = rc_.small.find(id);
  if (it == rc_.small.end()) return;
  --rc_.small_consumers;
  if (--it->second.consumers == 0) {  // nothing left to follow it for
    // A put-back still running on another stream: no launch would wait for it once unfollowed.
    if (it->second.put_event) {
      wait_event(it->second.put_event);
      drop_event(it->second.put_event);
    }
    rc_.small.erase(it);
  }
  rc_small_watch_.store(rc_.small_consumers > 0, std::memory_order_release);
}

void Residency::rc_touch_smalls(bool blind, const AllocId* acc, size_t n, Stream s, uint64_t launch_no) {
  if (rc_.small.empty()) return;
  auto touch = [&](recompute::Small& sm) {
    if (sm.put_stream && sm.put_stream != s && o_.fault != Options::Fault::RecomputeSkipReadOrder) {
      if (query_event(sm.put_event) == 1) sm.put_stream = 0;
      else order_after(s, sm.put_event);
    }
    note_touch(sm.touches, s, launch_no);
  };
  if (blind) {
    for (auto& [id, sm] : rc_.small) touch(sm);
    return;
  }
  for (size_t i = 0; i < n && acc[i] < kRangeIdBit; ++i)
    if (auto it = rc_.small.find(acc[i]); it != rc_.small.end()) touch(it->second);
}

void Residency::rc_small_writes(bool blind, const AllocId* acc, size_t n) {
  std::vector<AllocId>& w = rc_.small_writes;
  w.clear();
  if (rc_.small.empty()) return;
  if (blind) {
    for (const auto& [id, sm] : rc_.small) w.push_back(id);
    return;
  }
  for (size_t i = 0; i < n && acc[i] < kRangeIdBit; ++i)
    if (rc_.small.count(acc[i]) && rc_small_may_write(acc[i])) w.push_back(acc[i]);
}

int32_t Residency::rc_small_index(AllocId id) const {
  for (uint32_t j = 0; j < rc_.smalls.size(); ++j)
    if (rc_.smalls[j].id == id) return int32_t(j);
  return -1;
}

bool Residency::rc_small_may_write(AllocId id) const {
  if (!rc_.learned) return true;
  const int32_t j = rc_small_index(id);
  // At no position the scan found (it found fewer than the tracker): taken as written.
  return j < 0 || std::binary_search(rc_.small_written.begin(), rc_.small_written.end(), uint32_t(j));
}

bool Residency::rc_guard_smalls(Stream s, const uint32_t* keep, size_t nkeep, std::string* why, bool freeing) {
  if (o_.fault == Options::Fault::RecomputeNoWriteGuard) return true;
  for (AllocId id : rc_.small_writes) {
    auto it = rc_.small.find(id);
    if (it == rc_.small.end() || !it->second.dependents) continue;
    std::vector<uint32_t>& deps = rc_.deps;
    deps.clear();
    for (uint32_t k = 0; k < slots_.size(); ++k) {
      const Range& d = slots_[k];
      if (!d.live || !d.dropped) continue;
      const recompute::Producer& p = rc_.producers[d.producer];
      bool from = std::any_of(p.small_inputs.begin(), p.small_inputs.end(), [&](const auto& x) { return x.first == id; });
      // A side is written over by every launch made again: only its free matters (its address goes).
      from = from || (freeing && std::any_of(p.small_side.begin(), p.small_side.end(), [&](const auto& w) { return w.id == id; }));
      if (from) deps.push_back(k);
    }
    if (!rc_restore_deps(s, keep, nkeep, why)) return false;
  }
  return true;
}

std::pair<DevPtr, uint64_t> Residency::rc_span(const recompute::Probe& pr, uint32_t k) const {
  if (k & kSmallBit) return {pr.smalls[k & ~kSmallBit].base, pr.smalls[k & ~kSmallBit].bytes};
  return {slots_[k].va, slots_[k].asked};
}

}  // namespace offload

// Recompute's dropped ranges (recompute.cpp): when an evicted range may go without a copy, the
// room making it again takes (a chain of dropped inputs included), making it again with its
// inputs, and making dropped ranges again before what they are made from is written or freed.
#include <algorithm>
#include <string>

#include "residency/residency.h"

namespace offload {

using recompute::KernelKnow;
using recompute::Producer;

bool Residency::rc_can_drop(uint32_t slot) const {
  const Range& r = slots_[slot];
  if (r.producer < 0 || r.dependents || r.in_graph || !r.live) return false;
  const Producer& p = rc_.producers[r.producer];
  if (rc_.know[p.kernel].trust != KernelKnow::Trust::Trusted || p.out_version != r.version || rc_prelude_banned(p) ||
      rc_chain_unchecked(p))
    return false;
  // Its small allocations as it read them, and none that the launch being prepared may write.
  if (!rc_smalls_kept(p)) return false;
  for (const auto& [id, v] : p.small_inputs)
    if (rc_.writing && std::find(rc_.small_writes.begin(), rc_.small_writes.end(), id) != rc_.small_writes.end())
      return false;
  for (const auto& [k, v] : p.inputs) {
    // An input may be on the host (or going there): its bytes are kept, and it is reloaded first;
    // or dropped itself: made again first.
    if (!rc_input_kept(slots_[k], v)) return false;
    if (rc_.writing && std::binary_search(rc_.writes.begin(), rc_.writes.end(), k)) return false;
  }
  if (p.has_side() && (!rc_side_ready(p, false) || rc_side_unchecked(p))) return false;
  // Room to make it again at any later launch: it and what it is made from beside the most one
  // launch needed.
  const uint64_t need = rc_need(slot);
  return need != UINT64_MAX && need + largest_need_ + pool_share_ <= limit();
}

uint64_t Residency::rc_need(uint32_t slot, int depth) const {
  if (depth > kMaxChain) return UINT64_MAX;
  const Range& r = slots_[slot];
  const Producer& p = rc_.producers[r.producer];
  uint64_t bytes = r.bytes;
  for (const auto& [k, v] : p.inputs) {
    const Range& in = slots_[k];
    uint64_t n = in.bytes;
    if (in.dropped && in.producer >= 0 && o_.fault != Options::Fault::RecomputeChainRoomFlat) n = rc_need(k, depth + 1);
    if (n == UINT64_MAX) return n;
    bytes += n;
  }
  // The side, and the buffer it is kept in.
  if (p.has_side()) bytes += p.side_bytes + std::max(p.side_bytes, rc_side_.bytes);
  return bytes;
}

bool Residency::rc_check_wanted(uint32_t slot) const {
  const Range& r = slots_[slot];
  if (r.producer < 0 || r.dropped || !r.host) return false;
  const Producer& p = rc_.producers[r.producer];
  if (rc_all_checked(p) || p.out_version != r.version) return false;
  if (!rc_side_ready(p, false) || !rc_smalls_kept(p)) return false;
  bool away = false;
  for (const auto& [k, v] : p.inputs) {
    const Range& in = slots_[k];
    if (!rc_input_kept(in, v)) return false;
    away = away || in.state == State::OnHost || in.state == State::CopyingOut;
  }
  return away;
}

uint64_t Residency::rc_restore_bytes(uint32_t slot) const {
  const Range& r = slots_[slot];
  const Producer& p = rc_.producers[r.producer];
  uint64_t bytes = r.bytes;
  for (const auto& [k, v] : p.inputs) {
    if (slots_[k].state != State::OnHost) continue;
    const uint64_t n = slots_[k].dropped ? rc_need(k) : slots_[k].bytes;
    if (n == UINT64_MAX) return n;
    bytes += n;
  }
  if (p.has_side() && !(rc_side_.backed() && rc_side_.bytes >= p.side_bytes)) bytes += p.side_bytes;
  return bytes;
}

void Residency::rc_drop(Range& r) {
  r.dropped = true;
  for (const auto& [k, v] : rc_.producers[r.producer].inputs) ++slots_[k].dependents;
  for (const auto& [k, va, bytes, fills] : rc_.producers[r.producer].side) ++slots_[k].side_of;
  for (const auto& [id, v] : rc_.producers[r.producer].small_inputs) ++rc_.small[id].dependents;
  for (const recompute::Producer::SmallSide& w : rc_.producers[r.producer].small_side) ++rc_.small[w.id].dependents;
  ++st_.dropped;
  st_.dropped_bytes += r.bytes;
}

void Residency::rc_undrop(Range& r) {
  if (!r.dropped) return;
  r.dropped = false;
  for (const auto& [k, v] : rc_.producers[r.producer].inputs) --slots_[k].dependents;
  for (const auto& [k, va, bytes, fills] : rc_.producers[r.producer].side) --slots_[k].side_of;
  for (const auto& [id, v] : rc_.producers[r.producer].small_inputs)
    if (auto it = rc_.small.find(id); it != rc_.small.end()) --it->second.dependents;
  for (const recompute::Producer::SmallSide& w : rc_.producers[r.producer].small_side)
    if (auto it = rc_.small.find(w.id); it != rc_.small.end()) --it->second.dependents;
}

void Residency::rc_keep_list(const Producer& p, uint32_t slot, const uint32_t* keep, size_t nkeep,
                             std::vector<uint32_t>* out) const {
  out->assign(keep, keep + nkeep);
  out->push_back(slot);
  for (const auto& [k, v] : p.inputs) out->push_back(k);
  for (const auto& [k, va, bytes, fills] : p.side) out->push_back(k);
}

bool Residency::rc_restore(uint32_t slot, Stream s, const uint32_t* keep, size_t nkeep, std::string* why) {
  Range& r = slots_[slot];
  const Producer& p = rc_.producers[r.producer];
  if (rc_.keeps.size() <= rc_.restoring) rc_.keeps.emplace_back();
  std::vector<uint32_t>& kept = rc_.keeps[rc_.restoring];
  struct Deeper {
    uint32_t& depth;
    ~Deeper() { --depth; }
  } deeper{++rc_.restoring};
  rc_keep_list(p, slot, keep, nkeep, &kept);
  for (size_t i = nkeep + 1; i < kept.size(); ++i)
    if (slots_[kept[i]].state == State::CopyingOut) abandon(slots_[kept[i]]);
  const size_t mine = kept.size() - nkeep - 1;  // its inputs and side, after `keep` and it
  std::sort(kept.begin(), kept.end());
  // Room for one range at a time, as it is backed: spares that would tile their sum may not tile
  // each of them. Its inputs are copied in, or made again first where dropped (bring_back); its
  // side is never dropped.
  for (size_t i = 0; i < mine; ++i) {
    const uint32_t k = i < p.inputs.size() ? p.inputs[i].first : p.side[i - p.inputs.size()].slot;
    if (slots_[k].state == State::OnHost && !bring_back(k, s, kept.data(), kept.size(), why)) return false;
  }
  if (p.has_side() && !rc_side_buffer(p.side_bytes, s, kept.data(), kept.size(), why)) return false;
  const bool held = std::exchange(rc_.side_held, p.has_side());
  const bool done = make_room(r.bytes, kept.data(), kept.size(), why) && reload(slot, s, why);
  rc_.side_held = held;
  return done;
}

bool Residency::rc_guard(const std::vector<uint32_t>& written, Stream s, const uint32_t* keep, size_t nkeep,
                         std::string* why, bool freeing) {
  if (o_.fault == Options::Fault::RecomputeNoWriteGuard) return true;
  for (uint32_t x : written) {
    // A side is written over by every launch made again: only its free matters (its address goes).
    if (!slots_[x].dependents && !(freeing && slots_[x].side_of)) continue;
    std::vector<uint32_t>& deps = rc_.deps;
    deps.clear();
    for (uint32_t k = 0; k < slots_.size(); ++k) {
      const Range& d = slots_[k];
      if (!d.live || !d.dropped) continue;
      const Producer& p = rc_.producers[d.producer];
      bool from = std::any_of(p.inputs.begin(), p.inputs.end(), [&](const auto& in) { return in.first == x; });
      from = from || (freeing && std::any_of(p.side.begin(), p.side.end(), [&](const auto& w) { return w.slot == x; }));
      if (from) deps.push_back(k);
    }
    if (!rc_restore_deps(s, keep, nkeep, why)) return false;
  }
  return true;
}

bool Residency::rc_restore_deps(Stream s, const uint32_t* keep, size_t nkeep, std::string* why) {
  for (uint32_t k : rc_.deps) {
    if (slots_[k].state == State::CopyingOut) abandon(slots_[k]);  // still mapped: kept
    if (slots_[k].state != State::OnHost) continue;
    if (!rc_restore(k, s, keep, nkeep, why)) return false;
    ++st_.restored_early;
  }
  return true;
}

}  // namespace offload

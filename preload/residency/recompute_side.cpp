// Recompute's side (recompute.cpp): the ranges and small allocations a producer's launch writes
// besides its output, kept across every launch made again. After every stream's work on them so far, their bytes are
// copied into a buffer of the manager's own (held once made, let go last for room), the ranges
// zeroed, the launch made, and the bytes put back, all on the launch's stream; later work on
// another stream that touches them waits for that.
#include <algorithm>
#include <string>

#include "common/log.h"
#include "planner/plan.h"  // round_up
#include "residency/residency.h"

namespace offload {

using recompute::KernelKnow;
using recompute::Producer;

bool Residency::rc_side_unchecked(const Producer& p) const {
  const KernelKnow& kk = rc_.know[p.kernel];
  return std::any_of(p.side_at.begin(), p.side_at.end(), [&](uint32_t at) {
    const KernelKnow::Pos* pos = kk.find(at);
    return !pos || pos->side != KernelKnow::SideChecked;
  });
}

bool Residency::rc_side_ready(const Producer& p, bool resident) const {
  for (const auto& [k, va, bytes, fills] : p.side) {
    const Range& w = slots_[k];
    // Mapped where the launch's arguments point, whichever life it is in: the bytes there are
    // put back. Not dropped (its bytes exist nowhere else) nor a graph's.
    if (!w.live || w.va != va || w.bytes < bytes || w.dropped || w.in_graph) return false;
    if (resident && (!w.backed() || (w.state != State::Resident && w.state != State::CopyingIn))) return false;
  }
  // A small side still allocated (the pool's memory may be given back once freed).
  return rc_small_sides_live(p);
}

bool Residency::rc_side_save(const Producer& p, Stream s) {
  const bool wait = o_.fault != Options::Fault::RecomputeSkipSideWait;
  uint64_t off = 0;
  for (const auto& [k, va, bytes, fills] : p.side) {
    Range& w = slots_[k];
    if (wait) {
      order_after_touches(s, w.touches);
      if (w.read_stream && w.read_stream != s) order_after(s, w.read_event);
      if (w.state == State::CopyingIn && w.in_stream != s) order_after(s, w.copy_event);
    }
    if (!d_.copy_device(rc_side_.va + off, va, bytes, s)) return false;
    off += bytes;
  }
  // A small side after every launch that touched it since its producer's (those before, the
  // program ordered before that launch, which the range's copy out followed).
  for (const Producer::SmallSide& w : p.small_side) {
    recompute::Small& sm = rc_.small[w.id];
    if (wait) {
      order_after_touches(s, sm.touches);
      if (sm.put_stream && sm.put_stream != s) order_after(s, sm.put_event);
    }
    if (!d_.copy_device(rc_side_.va + off, w.va, w.bytes, s)) return false;
    off += w.bytes;
  }
  bool zeroed = true;
  if (o_.fault != Options::Fault::RecomputeSideNotZeroed) {
    for (const auto& [k, va, bytes, fills] : p.side) zeroed = zeroed && d_.zero_device(va, bytes, s);
    for (const Producer::SmallSide& w : p.small_side) zeroed = zeroed && d_.zero_device(w.va, w.bytes, s);
  }
  if (!zeroed) rc_side_put_back(p, s);
  return zeroed;
}

void Residency::rc_side_put_back(const Producer& p, Stream s) {
  const bool keep = o_.fault != Options::Fault::RecomputeSideNotKept;
  uint64_t off = 0;
  auto put = [&](DevPtr va, uint64_t bytes) {
    if (keep && !d_.copy_device(va, rc_side_.va + off, bytes, s))
      log().error("recompute: putting back {:.1f} MiB a launch made again wrote besides its output failed", bytes / double(1 << 20));
    off += bytes;
  };
  for (const auto& [k, va, bytes, fills] : p.side) put(va, bytes);
  for (const Producer::SmallSide& w : p.small_side) put(w.va, w.bytes);
  if (!p.has_side()) return;
  if (!rc_.side_event) rc_.side_event = new_event();
  record_event(rc_.side_event, s);
  rc_.side_stream = s;
  // Work on another stream that touches a small side later waits for this (rc_touch_smalls).
  for (const Producer::SmallSide& w : p.small_side) {
    recompute::Small& sm = rc_.small[w.id];
    if (!sm.put_event) sm.put_event = new_event();
    record_event(sm.put_event, s);
    sm.put_stream = s;
    note_touch(sm.touches, s, launches_seen_);
  }
}

bool Residency::rc_side_buffer(uint64_t bytes, Stream s, const uint32_t* keep, size_t nkeep, std::string* why) {
  Range& b = rc_side_;
  if (b.backed() && b.bytes >= bytes) {
    if (rc_.side_event && rc_.side_stream != s) order_after(s, rc_.side_event);
    return true;
  }
  rc_side_release();  // too small: its handles become spares, which may back the larger one
  const uint64_t size = round_up(bytes, gran_);
  // Room is made only where the caller says what to keep (a remake inside a reload does not know
  // its launch's ranges: it takes the room only if it fits as things are).
  if (keep ? !make_room(size, keep, nkeep, why) : !fits(size)) return false;
  b.va = d_.reserve(size);
  b.cap = b.bytes = size;
  if (b.va && back_range(b, s, why)) return true;
  if (b.va) d_.unreserve(b.va, b.cap);
  b = Range{};
  return false;
}

void Residency::rc_side_room(uint32_t slot, Stream s, const uint32_t* keep, size_t nkeep) {
  const Range& r = slots_[slot];
  if (r.producer < 0) return;
  const Producer& p = rc_.producers[r.producer];
  if (!p.has_side() || (rc_side_.backed() && rc_side_.bytes >= p.side_bytes) || !rc_side_ready(p, true)) return;
  std::vector<uint32_t>& kept = rc_.side_keep;
  rc_keep_list(p, slot, keep, nkeep, &kept);
  std::sort(kept.begin(), kept.end());
  std::string why;
  rc_side_buffer(p.side_bytes, s, kept.data(), kept.size(), &why);  // else it is copied in
}

void Residency::rc_side_release() {
  Range& b = rc_side_;
  if (!b.va) return;
  if (rc_.side_event) wait_event(rc_.side_event);
  unmap_pieces(b);
  spare_pieces(b);
  d_.unreserve(b.va, b.cap);
  b = Range{};
}

}  // namespace offload

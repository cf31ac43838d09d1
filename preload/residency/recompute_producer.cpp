// Recompute's producers (recompute.cpp): the record of a launch that made a range, kept to launch
// it again, and the log's lines that name the kernels kept from being one.
#include <algorithm>
#include <cstring>
#include <string>

#include "common/log.h"
#include "residency/residency.h"

namespace offload {

using recompute::KernelKnow;
using recompute::Producer;

void Residency::rc_drop_producer(Range& r) {
  if (r.producer < 0) return;
  Producer& p = rc_.producers[r.producer];
  for (const auto& [k, v] : p.inputs) --slots_[k].consumers;
  p.inputs.clear();
  for (const auto& [id, v] : p.small_inputs) rc_unfollow_small(id);
  p.small_inputs.clear();
  for (const Producer::SmallSide& w : p.small_side) rc_unfollow_small(w.id);
  p.small_side.clear();
  rc_.free_producers.push_back(r.producer);
  r.producer = -1;
}

// Kernels that make a range and write (or may write) an allocation outside the ranges are named once
// each (a dozen at most), with what they wrote there: what keeps a layer's output from a producer.
void Residency::rc_say_small(KernelKnow& kk, uint32_t kernel, uint32_t fresh, bool table) {
  kk.said_small = true;
  ++rc_.kernels_said_small;
  std::string what;
  for (AllocId id : rc_.small_hit) {
    const int32_t j = rc_small_index(id);
    what += what.empty() ? "" : ", ";
    what += j < 0 ? std::string("an allocation at no argument position seen")
                  : fmt::format("{:#x} ({} bytes)", rc_.smalls[j].base, rc_.smalls[j].bytes);
  }
  if (table) what += what.empty() ? "a pointer table or an arena" : ", a pointer table or an arena";
  log().info("recompute: kernel {} made a range of {} KiB and also wrote outside the ranges {}: never made again",
             namer_ ? namer_(namer_ctx_, kernel) : std::to_string(kernel), slots_[fresh].asked >> 10, what);
}

void Residency::rc_record_producer(uint32_t kernel, const LaunchArgs* a, uint32_t fresh,
                                   const std::vector<uint32_t>& touched, uint32_t len) {
  const std::vector<uint32_t>& at_slot = rc_.at_slot;
  const int32_t np = a->packed ? -1 : a->fi->nparams;  // -1: packed
  ++st_.producers;
  int32_t id;
  if (!rc_.free_producers.empty()) {
    id = rc_.free_producers.back();
    rc_.free_producers.pop_back();
  } else {
    id = int32_t(rc_.producers.size());
    rc_.producers.emplace_back();
  }
  Producer& p = rc_.producers[id];
  p.f = a->f;
  p.geom = a->geom;
  const auto* attrs = static_cast<const unsigned char*>(a->geom.attrs);
  p.attrs.assign(attrs, attrs ? attrs + a->geom.attr_bytes : attrs);
  p.geom.attrs = nullptr;  // the hook's: set to the copy when launched again
  p.kernel = kernel;
  p.params = a->fi->params;
  p.nparams = np;
  p.args.assign(len, 0);
  if (a->packed) std::memcpy(p.args.data(), a->packed, len);
  for (int32_t i = 0; i < np; ++i)
    std::memcpy(p.args.data() + p.params[i].offset, a->params[i], p.params[i].size);
  Range& out = slots_[fresh];
  p.out_version = out.version;
  p.inputs.clear();
  p.side.clear();
  p.side_at.clear();
  p.side_bytes = 0;
  for (uint32_t k : touched) {
    if (k == fresh) continue;
    if (o_.fault != Options::Fault::RecomputeIgnoreWrites &&
        std::binary_search(rc_.written.begin(), rc_.written.end(), k)) {
      p.side.push_back({k, slots_[k].va, slots_[k].bytes});
      p.side_bytes += slots_[k].bytes;
      for (size_t i = 0; i < at_slot.size(); ++i)
        if (at_slot[i] == k) p.side_at.push_back(rc_.at[i]);
      continue;
    }
    p.inputs.push_back({k, slots_[k].version});
    ++slots_[k].consumers;
  }
  // The small allocations it writes (rc_.small_hit: its small side, kept) and those it reads.
  p.small_inputs.clear();
  p.small_side.clear();
  for (uint32_t j = 0; j < rc_.smalls.size(); ++j) {
    const recompute::SmallAt& sm = rc_.smalls[j];
    rc_follow_small(sm.id);
    if (std::find(rc_.small_hit.begin(), rc_.small_hit.end(), sm.id) == rc_.small_hit.end()) {
      p.small_inputs.push_back({sm.id, rc_.small[sm.id].version});
      continue;
    }
    p.small_side.push_back({sm.id, sm.base, sm.bytes});
    p.side_bytes += sm.bytes;
    for (size_t i = 0; i < at_slot.size(); ++i)
      if (at_slot[i] == (recompute::kSmallBit | j)) p.side_at.push_back(rc_.at[i]);
  }
  out.producer = id;
}

// Kernels that make a range and write others are named once each (a dozen at most), with what else
// they wrote and whether that is kept across a launch made again (`never`: why not): which range a
// library's workspace is, and why a kernel is never made again.
void Residency::rc_say_side(KernelKnow& kk, uint32_t kernel, uint32_t fresh, const char* never) {
  kk.said_not_alone = true;
  ++rc_.kernels_said_alone;
  std::string others;
  for (uint32_t k : rc_.written)
    if (k != fresh) others += fmt::format("{}{:#x} ({} KiB)", others.empty() ? "" : ", ", slots_[k].va, slots_[k].asked >> 10);
  log().info("recompute: kernel {} made a range of {} KiB and also wrote {}: {}{}",
             namer_ ? namer_(namer_ctx_, kernel) : std::to_string(kernel), slots_[fresh].asked >> 10, others,
             never ? "never made again: " : "kept across its launches made again", never ? never : "");
}

// Kernels that write a range some producer made (after it, so that it is copied, not made again)
// are named once each (a dozen at most), with the producer's kernel and the argument positions
// (parameter.word) pointing at the range, each alone there or beside another: most copies back
// under recompute are of such ranges, and whether the write is real or a position taken as written
// (an operand once updated in place) decides what would let them be made again.
void Residency::rc_say_took(KernelKnow& kk, uint32_t kernel, uint32_t slot) {
  kk.said_took = true;
  ++rc_.kernels_said_took;
  const Range& r = slots_[slot];
  const uint32_t maker = rc_.producers[r.producer].kernel;
  const size_t here = size_t(std::count(rc_.at_slot.begin(), rc_.at_slot.end(), slot));
  std::string where;
  for (size_t i = 0; i < rc_.at_slot.size(); ++i) {
    if (rc_.at_slot[i] != slot) continue;
    const KernelKnow::Pos* p = kk.find(rc_.at[i]);
    where += fmt::format("{}{}.{} ({}{})", where.empty() ? "" : ", ", rc_.at[i] >> 16, rc_.at[i] & 0xffff,
                         here == 1 ? "alone" : "beside another",
                         !p ? "" : p->written_alone ? ", seen writing alone" : p->clean_alone ? ", seen clean alone" : "");
  }
  auto name = [&](uint32_t k) { return namer_ ? namer_(namer_ctx_, k) : std::to_string(k); };
  log().info("recompute: kernel {} writes ranges other launches made (here {} KiB, made by {}), at {}: those are "
             "copied, not made again",
             name(kernel), r.asked >> 10, name(maker), where.empty() ? std::string("no argument position") : where);
}

}  // namespace offload

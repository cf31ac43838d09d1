// Recompute's producers (recompute.cpp): the record of a launch that made a range, kept to launch
// it again, and the log's lines that name the kernels kept from being one.
#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/log.h"
#include "core/launch_args.h"
#include "residency/residency.h"

namespace offload {

using recompute::KernelKnow;
using recompute::Producer;
using recompute::kMaxArgBytes;

namespace {
// Fills before a producer launched again ahead of it: deterministic mode fills once, a partial
// fill (a slice set after zeros) adds one more.
constexpr int kMaxPrelude = 4;
constexpr size_t kMaxSmallFills = 64;  // small allocations with fills kept, waiting for their producer
}  // namespace

void Residency::rc_free_producer(int32_t id) {
  while (id >= 0) {
    Producer& p = rc_.producers[id];
    for (const auto& [k, v] : p.inputs) --slots_[k].consumers;
    p.inputs.clear();
    for (const auto& [sid, v] : p.small_inputs) rc_unfollow_small(sid);
    p.small_inputs.clear();
    for (const Producer::SmallSide& w : p.small_side) {
      rc_unfollow_small(w.id);
      rc_free_producer(w.fills);
    }
    for (const Producer::Side& w : p.side) rc_free_producer(w.fills);
    p.side.clear();
    p.small_side.clear();
    rc_.free_producers.push_back(id);
    id = std::exchange(p.prelude, -1);
  }
}

void Residency::rc_drop_producer(Range& r) {
  if (r.producer < 0) return;
  rc_free_producer(r.producer);
  r.producer = -1;
}

bool Residency::rc_fill_only(const Range& r) const {
  if (o_.fault == Options::Fault::RecomputeNoPrelude) return false;
  int depth = 0;
  for (int32_t id = r.producer; id >= 0; id = rc_.producers[id].prelude) {
    const Producer& p = rc_.producers[id];
    if (++depth >= kMaxPrelude || !p.reads_nothing() || rc_.know[p.kernel].trust == KernelKnow::Trust::Banned) return false;
  }
  return depth > 0;
}

const char* Residency::rc_not_updatable(const Range& r, uint32_t slot) const {
  if (!o_.updates || o_.fault == Options::Fault::RecomputeNoUpdates || o_.fault == Options::Fault::RecomputeNoPrelude)
    return "updates in place are off (OFFLOAD_CAP_RECOMPUTE_UPDATES)";
  if (r.producer < 0 || rc_.producers[r.producer].out_version != r.version) return "written since its producer";
  int depth = 0;
  for (int32_t id = r.producer; id >= 0; id = rc_.producers[id].prelude) {
    const Producer& p = rc_.producers[id];
    if (++depth >= kMaxPrelude) return "its chain is four deep";
    if (p.has_side() || !p.small_side.empty()) return "a launch in its chain writes besides it";
    if (rc_.know[p.kernel].trust == KernelKnow::Trust::Banned) return "a kernel in its chain is banned";
    for (const auto& [k, v] : p.inputs) {
      if (k == slot) return "its chain reads it";
      if (!slots_[k].live || slots_[k].version != v) return "an input of its chain changed since";
    }
    if (!rc_smalls_kept(p)) return "a small input of its chain changed since";  // it has no small side
  }
  return nullptr;
}

bool Residency::rc_prelude_banned(const Producer& p) const {
  for (int32_t id = p.prelude; id >= 0; id = rc_.producers[id].prelude)
    if (rc_.know[rc_.producers[id].kernel].trust == KernelKnow::Trust::Banned) return true;
  return false;
}

bool Residency::rc_member_unchecked(const Producer& q) const {
  const KernelKnow& k = rc_.know[q.kernel];
  return q.reads() && k.trust != KernelKnow::Trust::Trusted && !k.chain_checked;
}

bool Residency::rc_chain_unchecked(const Producer& p) const {
  if (o_.fault == Options::Fault::RecomputeChainUnchecked) return false;
  for (int32_t id = p.prelude; id >= 0; id = rc_.producers[id].prelude)
    if (rc_member_unchecked(rc_.producers[id])) return true;
  return false;
}

bool Residency::rc_all_checked(const Producer& p) const {
  return rc_.know[p.kernel].trust != KernelKnow::Trust::Unchecked && !rc_side_unchecked(p) && !rc_chain_unchecked(p);
}

void Residency::rc_gather_inputs(int32_t head) {
  if (o_.fault == Options::Fault::RecomputeUpdateInputsOwn) return;
  Producer& h = rc_.producers[head];
  for (int32_t id = h.prelude; id >= 0; id = rc_.producers[id].prelude) {
    Producer& p = rc_.producers[id];
    p.gathered = p.gathered || !p.reads_nothing();
    for (const auto& in : p.inputs) {
      const bool had = std::any_of(h.inputs.begin(), h.inputs.end(), [&](const auto& x) { return x.first == in.first; });
      if (had) --slots_[in.first].consumers;  // counted once, by the head
      else h.inputs.push_back(in);
    }
    p.inputs.clear();
    for (const auto& sm : p.small_inputs) {
      const bool had = std::any_of(h.small_inputs.begin(), h.small_inputs.end(), [&](const auto& x) { return x.first == sm.first; });
      if (had) rc_unfollow_small(sm.first);
      else h.small_inputs.push_back(sm);
    }
    p.small_inputs.clear();
  }
}

bool Residency::rc_launch_chain(int32_t head, Stream s) {
  int32_t chain[kMaxPrelude];
  int n = 0;
  for (int32_t id = head; id >= 0 && n < kMaxPrelude; id = rc_.producers[id].prelude) chain[n++] = id;
  while (n > 0)
    if (!rc_launch_again(rc_.producers[chain[--n]], s)) return false;
  return true;
}

bool Residency::rc_launch_preludes(const Producer& p, Stream s) {
  if (o_.fault == Options::Fault::RecomputeSkipPrelude) return true;
  for (const Producer::Side& w : p.side)
    if (!rc_launch_chain(w.fills, s)) return false;
  for (const Producer::SmallSide& w : p.small_side)
    if (!rc_launch_chain(w.fills, s)) return false;
  return rc_launch_chain(p.prelude, s);
}

bool Residency::rc_note_small_fill(uint32_t kernel, AllocId id, const LaunchArgs* a, uint32_t len) {
  if (o_.fault == Options::Fault::RecomputeNoPrelude || len > kMaxArgBytes) return false;
  if (kernel >= rc_.know.size()) rc_.know.resize(kernel + 1);
  KernelKnow& kk = rc_.know[kernel];
  rc_looked_at_name(kk, kernel);
  if (kk.rng || kk.trust == KernelKnow::Trust::Banned) return false;
  const auto it = rc_.small_fills.find(id);
  const bool had = it != rc_.small_fills.end();
  int depth = 0;
  for (int32_t q = had ? it->second : -1; q >= 0; q = rc_.producers[q].prelude) ++depth;
  if (depth + 1 >= kMaxPrelude) return false;
  if (!had && rc_.small_fills.size() >= kMaxSmallFills) {
    // Those under the floor were touched since by other launches: never a producer's new side.
    const AllocId floor = rc_small_floor_.load(std::memory_order_relaxed);
    for (auto i = rc_.small_fills.begin(); i != rc_.small_fills.end();)
      if (i->first < floor) {
        rc_free_producer(i->second);
        i = rc_.small_fills.erase(i);
      } else {
        ++i;
      }
    if (rc_.small_fills.size() >= kMaxSmallFills) return false;
  }
  const int32_t q = rc_record_launch(kernel, a, len);
  int32_t& head = rc_.small_fills[id];
  rc_.producers[q].prelude = had ? head : -1;
  head = q;
  return true;
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

int32_t Residency::rc_record_launch(uint32_t kernel, const LaunchArgs* a, uint32_t len) {
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
  p.nparams = a->packed ? -1 : a->fi->nparams;  // -1: packed
  p.args.assign(len, 0);
  if (a->packed) std::memcpy(p.args.data(), a->packed, len);
  for (int32_t i = 0; i < p.nparams; ++i)
    std::memcpy(p.args.data() + p.params[i].offset, a->params[i], p.params[i].size);
  p.inputs.clear();
  p.side.clear();
  p.side_at.clear();
  p.side_bytes = 0;
  p.small_inputs.clear();
  p.small_side.clear();
  p.prelude = -1;
  p.gathered = false;
  return id;
}

void Residency::rc_record_producer(uint32_t kernel, const LaunchArgs* a, uint32_t fresh,
                                   const std::vector<uint32_t>& touched, uint32_t len) {
  const std::vector<uint32_t>& at_slot = rc_.at_slot;
  ++st_.producers;
  const int32_t id = rc_record_launch(kernel, a, len);
  Producer& p = rc_.producers[id];
  Range& out = slots_[fresh];
  p.out_version = out.version;
  for (uint32_t k : touched) {
    if (k == fresh) continue;
    if (o_.fault != Options::Fault::RecomputeIgnoreWrites &&
        std::binary_search(rc_.written.begin(), rc_.written.end(), k)) {
      int32_t fills = -1;
      for (auto& [slot, chain] : rc_.side_fills)
        if (slot == k) fills = std::exchange(chain, -1);
      p.side.push_back({k, slots_[k].va, slots_[k].bytes, fills});
      p.side_bytes += slots_[k].bytes;
      for (size_t i = 0; i < at_slot.size(); ++i)
        if (at_slot[i] == k) p.side_at.push_back(rc_.at[i]);
      continue;
    }
    p.inputs.push_back({k, slots_[k].version});
    ++slots_[k].consumers;
  }
  // The small allocations it writes (rc_.small_hit: its small side, kept, with the fills since its
  // birth) and those it reads.
  for (uint32_t j = 0; j < rc_.smalls.size(); ++j) {
    const recompute::SmallAt& sm = rc_.smalls[j];
    rc_follow_small(sm.id);
    if (std::find(rc_.small_hit.begin(), rc_.small_hit.end(), sm.id) == rc_.small_hit.end()) {
      p.small_inputs.push_back({sm.id, rc_.small[sm.id].version});
      continue;
    }
    int32_t fills = -1;
    if (auto it = rc_.small_fills.find(sm.id); it != rc_.small_fills.end()) {
      fills = it->second;
      rc_.small_fills.erase(it);
    }
    p.small_side.push_back({sm.id, sm.base, sm.bytes, fills});
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
void Residency::rc_say_took(KernelKnow& kk, uint32_t kernel, uint32_t slot, int32_t producer) {
  kk.said_took = true;
  ++rc_.kernels_said_took;
  const Range& r = slots_[slot];
  const uint32_t maker = rc_.producers[producer].kernel;
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
  // Why it is not kept as the range's producer, after the chain that made it.
  const char* not_update = rc_not_updatable(r, slot);
  log().info("recompute: kernel {} writes ranges other launches made (here {} KiB, made by {}), at {}: those are "
             "copied, not made again ({})",
             name(kernel), r.asked >> 10, name(maker), where.empty() ? std::string("no argument position") : where,
             not_update ? not_update : "this launch writes another range, or makes one, too");
}

void Residency::rc_count_kept_back(const Range& r) {
  if (r.written_as == recompute::WrittenAs::Transfer) {
    ++rc_.transfer_kept_back;
    rc_.transfer_kept_back_bytes += r.bytes;
  } else if (r.written_by < rc_.know.size()) {
    ++rc_.know[r.written_by].kept_back;
    rc_.know[r.written_by].kept_back_bytes += r.bytes;
  }
}

std::string Residency::rc_top_writers(size_t n) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<std::pair<uint64_t, int64_t>> top;  // bytes, kernel (-1: copies and memsets)
  if (rc_.transfer_kept_back) top.push_back({rc_.transfer_kept_back_bytes, -1});
  for (uint32_t k = 0; k < rc_.know.size(); ++k)
    if (rc_.know[k].kept_back) top.push_back({rc_.know[k].kept_back_bytes, k});
  std::sort(top.begin(), top.end(), std::greater<>());
  std::string out;
  for (size_t i = 0; i < top.size() && i < n; ++i) {
    const auto [bytes, k] = top[i];
    const uint32_t ranges = k < 0 ? rc_.transfer_kept_back : rc_.know[k].kept_back;
    const std::string name = k < 0 ? "copies and memsets" : namer_ ? namer_(namer_ctx_, uint32_t(k)) : std::to_string(k);
    out += fmt::format("{}{}: {} ranges, {:.2f} GiB", out.empty() ? "" : "; ", name, ranges, bytes / double(1ull << 30));
  }
  return out;
}

// Writers that keep ranges from being made again (a producer kept, the range written since by a
// write not learned) are named once each (a dozen at most), with why the write was taken: what
// would let those ranges be made again, on a GPU.
void Residency::rc_say_written(const Range& r, const Producer& p) {
  auto name = [&](uint32_t k) { return namer_ ? namer_(namer_ctx_, k) : std::to_string(k); };
  std::string who, why;
  if (r.written_as == recompute::WrittenAs::Transfer) {
    if (std::exchange(rc_.said_transfer, true)) return;
    who = "a copy or memset";
    why = "it writes its destination";
  } else if (r.written_as == recompute::WrittenAs::Blind) {
    if (std::exchange(rc_.said_blind, true)) return;
    who = "a launch we cannot see into";
    why = "a graph's, or one whose arguments were not read: it may write all it touches";
  } else {
    if (r.written_by >= rc_.know.size()) return;
    KernelKnow& kk = rc_.know[r.written_by];
    if (std::exchange(kk.said_written, true)) return;
    who = "kernel " + name(r.written_by);
    if (r.written_as == recompute::WrittenAs::Learned) {
      why = "learned to write it";
    } else {
      std::string few;
      for (const KernelKnow::Pos& q : kk.pos)
        if (q.seen < kRecomputeProbes || q.unsettled())
          few += fmt::format("{}{}.{} (seen {}{})", few.empty() ? "" : ", ", q.at >> 16, q.at & 0xffff, q.seen,
                             q.unsettled() ? ", written only beside another" : "");
      std::string here = r.written_at == recompute::kFirstLaunch ? "its first launch" : "its launch was not described";
      if (r.written_at < recompute::kFirstLaunch) {
        const KernelKnow::Pos* q = kk.find(r.written_at);
        here = fmt::format("at its launch, position {}.{} {}", r.written_at >> 16, r.written_at & 0xffff,
                           !q ? std::string("was never seen by a probe")
                              : q->seen < kRecomputeProbes ? fmt::format("was seen by {} probes", q->seen)
                                                           : std::string("was alone, written before only beside another"));
      }
      why = fmt::format("its writes not learned after {} probes ({}){}{}", kk.probes, here, few.empty() ? "" : "; ", few);
    }
  }
  ++rc_.kernels_said_written;
  log().info("recompute: a range of {} KiB made by {} was written since by {} ({}): copied, not made again",
             r.asked >> 10, name(p.kernel), who, why);
}

}  // namespace offload

// Recompute (Options::recompute): a range that one launch produced is made again, by launching
// that launch once more into it, instead of copying its bytes back; once that launch's kernel is
// trusted, the range is dropped at eviction instead of copied out.
//
// A launch of a kernel K is the producer of its output R only when all of this holds:
//   - R was born and first touched by that launch, which touched no other new range, no pointer
//     table and no allocation outside the ranges (whose versions are not followed);
//   - K's name does not say it draws random numbers (philox, curand, dropout, ...);
//   - K's writes were learned (probes, below) at every argument position the launch points into
//     ranges from. Ranges it wrote besides R (its side: a library's workspace, running statistics)
//     are kept across every second launch: saved beside on the device, zeroed (a workspace's
//     counters start at zero, as the library's own memset or the kernel's last act leaves them),
//     and put back after it, so that no write outside R outlives it. Only where the driver copies
//     on the device and the side is at most kMaxSide; else a kernel that writes outside its output
//     is never made again. Whether R depended on the side's bytes is left to the check below.
// R is made again only while R and every other range the launch touched (its inputs) have the
// version they had then: a range's version moves at every launch that may write it (a kernel by
// what it was seen to write, or all it touches while that is not known; a copy, a memset, a graph:
// all they touch) and at each new life. The inputs are resident when it runs: reloaded first for
// a dropped range, or for a kernel not checked yet; otherwise the copy goes in instead.
// The first time K is made again, the result is compared byte for byte with the saved copy, still
// on the host: a difference bans K for the process, and the copy goes in instead.
// A dropped range's inputs are never dropped, written or freed before it is made again (rc_guard),
// and a drop needs room to make it again beside the largest launch (rc_can_drop).
//
// Probes learn at which argument positions a kernel writes, from launches whose writes matter,
// until each position a launch points from was seen kProbes times (Options::kernel_probes a kernel at
// most): the ranges a launch touches are hashed before it is forwarded and after it has run (on
// the GPU, core/range_hash.h; else copied to the host). A range whose bytes changed was written,
// and so was a new one whatever its bytes did. Per position, not per launch shape: an elementwise
// kernel points into ranges from some of its positions in one launch and from others in the next.
#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "common/clock.h"
#include "common/log.h"
#include "core/func_registry.h"
#include "planner/recompute_choice.h"  // kernel_draws_random
#include "residency/residency.h"

namespace offload {

using recompute::Bump;
using recompute::KernelKnow;
using recompute::Probe;
using recompute::Producer;
using recompute::kMaxArgBytes;
using recompute::kSmallBit;

namespace {

constexpr size_t kMaxAt = 64;               // argument positions into ranges and small allocations a launch may have
constexpr uint64_t kProbeMax = 256ull << 20;  // bytes a probe copies to the host (twice), at most, without GPU hashes
constexpr uint8_t kProbes = Residency::kRecomputeProbes;
// The bytes a producer may write besides its output and have kept: PyTorch gives cuBLAS a 32 MiB
// workspace on sm90. The buffer they are kept in is held while recompute runs.
constexpr uint64_t kMaxSide = 64ull << 20;

uint64_t this_thread() { return std::hash<std::thread::id>{}(std::this_thread::get_id()); }

// Why a launch came without what it takes to launch it again, for the log.
std::string why_undescribed(const LaunchArgs* a) {
  if (!a) return "no arguments handed on (a cooperative launch)";
  if (a->geom.refused_attr >= 0) return "launch attribute " + std::to_string(a->geom.refused_attr);
  if (!a->fi || a->fi->nparams < 0) return "no parameter layout";
  if (a->extra || !a->params) return "`extra` holds more than a packed buffer";
  return "more than " + std::to_string(kMaxAt) + " pointers into ranges and small allocations";
}

}  // namespace

bool Residency::rc_described(const LaunchArgs* a) {
  return a && a->fi && a->geom.refused_attr < 0 && (a->packed || (a->fi->nparams >= 0 && a->params && !a->extra));
}

void Residency::rc_looked_at_name(KernelKnow& kk, uint32_t kernel) const {
  if (kk.rng < 0)
    kk.rng = o_.fault != Options::Fault::RecomputeIgnoreNames && namer_ && kernel_draws_random(namer_(namer_ctx_, kernel));
}

uint32_t Residency::rc_args_len(const LaunchArgs& a) {
  uint32_t len = a.packed ? a.packed_len : 0;
  for (int32_t i = 0; !a.packed && i < a.fi->nparams; ++i) len = std::max(len, a.fi->params[i].offset + a.fi->params[i].size);
  return len;
}

void Residency::rc_new_life(Range& r) {
  rc_drop_producer(r);
  r.producer_lost = false;
  r.fresh = r.live;
  r.version = ++rc_.clock;
}

bool Residency::rc_may_write(uint32_t kernel, bool blind, const std::vector<uint32_t>& touched, const AllocId* acc,
                             size_t n) {
  // Where the launch points into the ranges it touches, and into the small allocations it touches.
  const LaunchArgs* a = blind ? nullptr : current_launch_args();
  std::vector<uint32_t>& at = rc_.at;
  std::vector<uint32_t>& at_slot = rc_.at_slot;
  at.clear();
  at_slot.clear();
  rc_.smalls.clear();
  size_t nsmall = 0;  // acc is sorted: the small allocations' (plain) ids first
  while (finder_ && nsmall < n && acc[nsmall] < kRangeIdBit) ++nsmall;
  // Its arguments one by one (by the kernel's layout), or packed in one buffer (`extra`: read as
  // one parameter of that size).
  const bool packed = a && a->packed;
  bool described = rc_described(a);
  // Words outside every range's address space point into no range: not looked up there.
  const DevPtr lo = by_va_.empty() ? 0 : by_va_.begin()->first;
  const DevPtr hi = by_va_.empty() ? 0 : by_va_.rbegin()->first + slots_[by_va_.rbegin()->second].cap;
  const int32_t nparams = !described ? 0 : packed ? 1 : a->fi->nparams;
  for (int32_t i = 0; described && i < nparams; ++i) {
    const uint32_t size = packed ? a->packed_len : a->fi->params[i].size;
    const auto* bytes = static_cast<const unsigned char*>(packed ? a->packed : a->params[i]);
    for (uint32_t w = 0; described && w + 8 <= size; w += 8) {
      DevPtr v;
      std::memcpy(&v, bytes + w, 8);
      const int32_t k = v >= lo && v < hi ? slot_of(v) : -1;
      uint32_t target;
      if (k >= 0) {
        if (!slots_[k].live || !std::binary_search(touched.begin(), touched.end(), uint32_t(k))) continue;
        target = uint32_t(k);
      } else {
        const int32_t j = nsmall ? rc_small_at(v, acc, nsmall) : -1;
        if (j < 0) continue;
        target = kSmallBit | uint32_t(j);
      }
      if (at.size() == kMaxAt) described = false;
      at.push_back(uint32_t(i) << 16 | w / 8);
      at_slot.push_back(target);
    }
  }
  // What it may write: the ranges at the positions its kernel was seen to write at, once every
  // position it points from was seen kProbes times; else everything it touches.
  // A position written so far only where it aliased another is not learned at a launch where it
  // is alone, while the kernel may still be probed: that launch is watched to tell.
  const KernelKnow* kk = kernel < rc_.know.size() ? &rc_.know[kernel] : nullptr;
  const bool by_alias = o_.fault != Options::Fault::RecomputeAliasedWrites;
  auto alone = [&](size_t i) { return std::count(at_slot.begin(), at_slot.end(), at_slot[i]) == 1; };
  rc_.learned = described && kk;
  rc_.unlearned_at = described && !kk ? recompute::kFirstLaunch : UINT32_MAX;
  for (size_t i = 0; rc_.learned && i < at.size(); ++i) {
    const KernelKnow::Pos* p = kk->find(at[i]);
    rc_.learned = p && p->seen >= kProbes && !(by_alias && p->unsettled() && kk->probes < o_.kernel_probes && alone(i));
    if (!rc_.learned) rc_.unlearned_at = at[i];  // for the log (rc_say_written)
  }
  auto writes_at = [&](size_t i) {
    const KernelKnow::Pos* p = kk->find(at[i]);
    return by_alias && alone(i) ? p->writes() : p->written;
  };
  // A copy or memset writes its destination only (its source is read).
  const TransferDst* t = rc_.learned || o_.fault == Options::Fault::RecomputeCopyWritesAll ? nullptr : current_transfer();
  rc_.written.clear();
  for (uint32_t k : touched) {
    bool written = !rc_.learned;
    if (t) written = t->dst < slots_[k].va + slots_[k].cap && slots_[k].va < t->dst + std::max<uint64_t>(t->bytes, 1);
    for (size_t i = 0; !written && i < at.size(); ++i) written = at_slot[i] == k && writes_at(i);
    if (written) rc_.written.push_back(k);
  }
  rc_.small_written.clear();
  for (uint32_t j = 0; j < rc_.smalls.size(); ++j) {
    bool written = !rc_.learned;
    for (size_t i = 0; !written && i < at.size(); ++i) written = at_slot[i] == (kSmallBit | j) && writes_at(i);
    if (written) rc_.small_written.push_back(j);
  }
  return described;
}

bool Residency::rc_small_side_kept(const KernelKnow& kk, uint64_t side_bytes) const {
  if (o_.fault == Options::Fault::RecomputeNoSmallSide || !d_.device_copies()) return false;
  for (AllocId id : rc_.small_hit) {
    // New at this launch: the first launch made held whatever the allocation held, so the zeros of
    // the launch made again serve as well. One written before may be read (running statistics).
    if (id < rc_.small_floor) return false;
    const int32_t j = rc_small_index(id);
    if (j < 0) return false;  // written at no position the scan found
    side_bytes += rc_.smalls[j].bytes;
    for (size_t i = 0; i < rc_.at_slot.size(); ++i) {
      if (rc_.at_slot[i] != (kSmallBit | uint32_t(j))) continue;
      const KernelKnow::Side side = kk.find(rc_.at[i])->side;
      if (side != KernelKnow::SideSeen && side != KernelKnow::SideChecked) return false;
    }
  }
  return side_bytes <= kMaxSide;
}

int64_t Residency::rc_made_in_place(const std::vector<uint32_t>& touched) {
  // A launch that makes no new range and writes one range only fills wrote, or one whose
  // producer chain can run again before it (an in-place update), makes that one: the fills, or
  // the chain, become its prelude if it is its producer. -1: none (-2 inside: more than one, or
  // a new range too).
  rc_.filled.clear();
  int64_t made = -1;
  for (uint32_t k : touched) {
    const Range& r = slots_[k];
    if (r.fresh) return -1;
    if (rc_fill_only(r)) rc_.filled.push_back(k);
    else if (!rc_updatable(r, k)) continue;
    if (std::binary_search(rc_.written.begin(), rc_.written.end(), k)) made = made == -1 ? int64_t(k) : -2;
  }
  return rc_.learned && made >= 0 ? made : -1;
}

recompute::Made Residency::rc_bump_touched(uint32_t kernel, recompute::KernelKnow& kk, const std::vector<uint32_t>& touched,
                                           int64_t made, bool blind) {
  const bool learned = rc_.learned;
  recompute::Made m;
  rc_.bumped.clear();
  rc_.fresh.clear();
  for (uint32_t k : touched) {
    Range& r = slots_[k];
    const bool written = std::binary_search(rc_.written.begin(), rc_.written.end(), k);
    if (r.fresh) {
      m.fresh = k, ++m.nfresh, rc_.fresh.push_back(k);
    } else if (int64_t(k) == made) {
      // Made by this launch, after fills: they become its prelude if it is its producer.
      m.fresh = k, ++m.nfresh;
      m.prelude = std::exchange(r.producer, -1);
    } else if (written) {
      ++m.others_written;
    }
    r.fresh = false;
    if (!written) continue;
    if (learned && r.producer >= 0) {  // else a probe may find it was not written after all
      if (rc_fill_only(r)) {
        rc_.side_fills.push_back({k, std::exchange(r.producer, -1)});  // for its producer's side
      } else {
        if (!kk.said_took && rc_.kernels_said_took < 12) rc_say_took(kk, kernel, k, r.producer);
        rc_drop_producer(r);
      }
      r.producer_lost = true;
    }
    const uint64_t was = r.version;
    r.version = ++rc_.clock;
    // Who wrote it last without a learned write: named where a producer it had is refused for it.
    r.written_by = kernel;
    r.written_at = rc_.unlearned_at;
    r.written_as = learned ? recompute::WrittenAs::Learned
                   : current_transfer() ? recompute::WrittenAs::Transfer
                   : blind ? recompute::WrittenAs::Blind
                           : recompute::WrittenAs::Unlearned;
    rc_.bumped.push_back({k, was, r.version});
  }
  return m;
}

bool Residency::rc_note_small_writes(const AllocId* acc, size_t n, bool* table) {
  // Small allocations producers read: moved where this launch may write them (at the positions its
  // kernel was seen to write at; all it touches while that is not known). A launch that writes one,
  // or touches one no position shows, an arena or a pointer table, is no producer.
  bool small = false;
  *table = false;
  rc_.small_hit.clear();
  for (size_t i = 0; i < n; ++i) {
    const AllocId id = acc[i];
    if (tables_.count(id) || (id >= kRangeIdBit && !is_range_id(id))) {
      small = *table = true;
      continue;
    }
    if (id >= kRangeIdBit) continue;
    const bool w = rc_small_may_write(id);
    if (w) rc_bump_small(id), rc_.small_hit.push_back(id);
    small = small || w;
  }
  return small;
}

bool Residency::rc_side_known(const recompute::KernelKnow& kk, uint32_t fresh, uint64_t* side_bytes) const {
  // Ranges written besides the new one are its side, kept across a second launch where they can be:
  // each seen written at a side position, none at one refused.
  bool sides_known = true;
  *side_bytes = 0;
  for (uint32_t k : rc_.written) {
    if (k == fresh) continue;
    *side_bytes += slots_[k].bytes;
    bool seen = o_.fault == Options::Fault::RecomputeSideAnyWrite;
    for (size_t i = 0; rc_.learned && i < rc_.at_slot.size(); ++i) {
      if (rc_.at_slot[i] != k) continue;
      const recompute::KernelKnow::Side side = kk.find(rc_.at[i])->side;
      seen = seen || side == recompute::KernelKnow::SideSeen || side == recompute::KernelKnow::SideChecked;
      sides_known = sides_known && side != recompute::KernelKnow::SideRefused;
    }
    sides_known = sides_known && seen;
  }
  return sides_known;
}

void Residency::rc_take_prelude(recompute::KernelKnow& kk, uint32_t kernel, uint32_t fresh, int32_t prelude) {
  Range& r = slots_[fresh];
  if (r.producer >= 0) {
    rc_.producers[r.producer].prelude = prelude;
    if (!rc_.producers[prelude].reads_nothing()) ++st_.producers_updated;
    rc_gather_inputs(r.producer);
    return;
  }
  // Not a producer itself (it draws random numbers, writes another range besides): the chain
  // it wrote over is lost, as for any write.
  if (!rc_.producers[prelude].reads_nothing() && !kk.said_took && rc_.kernels_said_took < 12)
    rc_say_took(kk, kernel, fresh, prelude);
  rc_free_producer(prelude);
  r.producer_lost = true;
}

void Residency::rc_note_launch(uint32_t kernel, Stream s, uint64_t launch_no, const AllocId* acc, size_t n,
                               const std::vector<uint32_t>& touched, bool blind) {
  if (rc_.probe.active && rc_.probe.thread == this_thread()) rc_.probe.active = false;  // its launch was never reported
  const LaunchArgs* a = blind ? nullptr : current_launch_args();
  // before_launch worked out what it may write already (nothing since moves a range's address).
  const bool described = std::exchange(rc_.prepared, false) ? rc_.described : rc_may_write(kernel, blind, touched, acc, n);
  if (kernel >= rc_.know.size()) rc_.know.resize(kernel + 1);
  KernelKnow& kk = rc_.know[kernel];
  const bool learned = rc_.learned;
  const recompute::Made m = rc_bump_touched(kernel, kk, touched, rc_made_in_place(touched), blind);
  const uint32_t fresh = m.fresh;
  bool table = false;
  bool small = rc_note_small_writes(acc, n, &table);
  rc_touch_smalls(blind, acc, n, s, launch_no);
  if (!blind && !described) {
    ++st_.undescribed;
    // Which kernels cannot be made again at all, named once each (a dozen at most): what recompute
    // can do for a model depends on them.
    if (!kk.said_undescribed && rc_.kernels_said < 12) {
      kk.said_undescribed = true;
      ++rc_.kernels_said;
      log().info("recompute: kernel {} cannot be launched again: {}", namer_ ? namer_(namer_ctx_, kernel) : std::to_string(kernel),
                 why_undescribed(a));
    }
  }
  if (blind || !described) return;
  // A producer: one new range, written, and nothing else written but its side.
  rc_looked_at_name(kk, kernel);
  const bool banned = kk.trust == KernelKnow::Trust::Banned;
  const bool makes_one = learned && m.nfresh == 1 && std::find(rc_.at_slot.begin(), rc_.at_slot.end(), fresh) != rc_.at_slot.end();
  uint64_t side_bytes = 0;
  const bool sides_known = rc_side_known(kk, fresh, &side_bytes);
  const bool keeps_side = m.others_written && sides_known && side_bytes <= kMaxSide && d_.device_copies();
  const bool alone = !m.others_written || keeps_side || o_.fault == Options::Fault::RecomputeIgnoreWrites;
  // Small allocations it writes are its small side where each is at positions seen writing it
  // while a range was made, none refused, and all of the side fits kMaxSide: else no producer.
  if (small && !table && learned && rc_small_side_kept(kk, side_bytes)) small = false;
  if (makes_one && alone && small) {
    ++st_.not_producer_small;
    if (!kk.said_small && rc_.kernels_said_small < 12) rc_say_small(kk, kernel, fresh, table);
  }
  if (makes_one && !alone) ++st_.not_producer_alone;
  if (makes_one && m.others_written && !kk.said_not_alone && rc_.kernels_said_alone < 12)
    rc_say_side(kk, kernel, fresh, keeps_side ? nullptr
                                   : !sides_known ? "not seen writing there while making a range, or refused"
                                   : side_bytes > kMaxSide ? "more than 64 MiB"
                                                           : "the driver does not copy on the device");
  const uint32_t len = rc_args_len(*a);
  const bool recorded = makes_one && alone && !small && !kk.rng && !banned && len <= kMaxArgBytes;
  if (recorded) rc_record_producer(kernel, a, fresh, touched, len);
  for (const auto& [k, chain] : rc_.side_fills) rc_free_producer(chain);  // not kept as a side's
  rc_.side_fills.clear();
  if (m.prelude >= 0) rc_take_prelude(kk, kernel, fresh, m.prelude);
  if (recorded) {
    const Producer& p = rc_.producers[slots_[fresh].producer];
    bool filled = p.prelude >= 0;
    for (const Producer::Side& w : p.side) filled = filled || w.fills >= 0;
    for (const Producer::SmallSide& w : p.small_side) filled = filled || w.fills >= 0;
    if (filled) ++st_.producers_filled;
  }
  rc_start_probe(kernel, s, touched, m.nfresh > 0);
}

void Residency::rc_start_probe(uint32_t kernel, Stream s, const std::vector<uint32_t>& touched, bool makes_new) {
  // Only a kernel whose writes matter: one that makes a new range (a producer, maybe), or touches
  // a range that has a producer or that a producer was made from (whose version it would move).
  // (Allocations outside the ranges it touches are not watched: a producer never reads one.)
  const recompute::KernelKnow& kk = rc_.know[kernel];
  if (rc_.learned) return;
  bool matters = makes_new;
  for (uint32_t k : touched) matters = matters || slots_[k].consumers > 0 || slots_[k].producer >= 0;
  for (const recompute::SmallAt& sm : rc_.smalls) matters = matters || rc_.small.count(sm.id);
  if (!matters) return;
  // A launch whose writes matter and are not learned takes all it touches as written; why it is
  // not watched instead is counted.
  ++st_.unlearned;
  if (kk.probes >= o_.kernel_probes) {
    ++st_.probes_spent;
    return;
  }
  if (rc_.probe.active) {
    ++st_.probes_busy;
    return;
  }
  uint64_t bytes = 0;
  for (uint32_t k : touched) {
    bytes += slots_[k].asked;
    if (!slots_[k].backed()) {
      ++st_.probes_unbacked;
      return;
    }
  }
  for (const recompute::SmallAt& sm : rc_.smalls) bytes += sm.bytes;
  const uint64_t t0 = mono_now_ns();
  Probe& pr = rc_.probe;
  pr.before.clear();
  // Hashed on the GPU where the driver can (no wait here: the tickets are read at the finish);
  // else copied to the host, up to kProbeMax.
  // Each touched range and each small allocation it points at (kSmallBit | its index).
  pr.smalls = rc_.smalls;
  std::vector<uint32_t>& what = rc_.probe_what;
  what = touched;
  for (uint32_t j = 0; j < pr.smalls.size(); ++j) what.push_back(kSmallBit | j);
  pr.on_gpu = what.size() * 2 <= Driver::kHashTickets;
  for (size_t i = 0; pr.on_gpu && i < what.size(); ++i) {
    const auto [va, n] = rc_span(pr, what[i]);
    const int64_t t = d_.hash_start(va, n, s);
    pr.on_gpu = t >= 0;
    pr.before.push_back({what[i], uint64_t(t)});
  }
  if (!pr.on_gpu) {
    pr.before.clear();
    if (bytes > kProbeMax) {
      ++st_.probes_unbacked;
      return;
    }
    for (uint32_t k : what) {
      const auto [va, n] = rc_span(pr, k);
      pr.before.push_back({k, rc_hash(va, n, s)});
    }
  }
  pr.active = true;
  pr.thread = this_thread();
  pr.kernel = kernel;
  pr.s = s;
  pr.at = rc_.at;
  pr.at_slot = rc_.at_slot;
  // A new range counts as written whatever its bytes do (rc_finish_probe): a kernel may write the
  // bytes it happened to hold (zeros, often, in memory just made). It is not filled with a pattern
  // to show that: something the shim does not see (a synchronous copy) may have filled it.
  pr.fresh = rc_.fresh;
  pr.filled = rc_.filled;
  pr.bumped = rc_.bumped;
  st_.probe_ns += mono_now_ns() - t0;
}

void Residency::rc_finish_probe() {
  Probe& pr = rc_.probe;
  if (pr.thread != this_thread()) return;
  pr.active = false;
  const uint64_t t0 = mono_now_ns();
  KernelKnow& kk = rc_.know[pr.kernel];
  // The hashes after the launch: on the GPU, taken behind it on its stream and waited for once.
  std::vector<uint64_t>& after = rc_.after;
  after.clear();
  auto backed = [&](uint32_t k) { return (k & recompute::kSmallBit) || slots_[k].backed(); };
  for (const auto& [k, h] : pr.before) {
    const auto [va, n] = rc_span(pr, k);
    if (!backed(k)) {
      after.push_back(~h);  // gone since: counted as written
    } else if (!pr.on_gpu) {
      after.push_back(rc_hash(va, n, pr.s));
    } else {
      const int64_t t = d_.hash_start(va, n, pr.s);
      after.push_back(t < 0 ? ~uint64_t{0} : uint64_t(t));
    }
  }
  if (pr.on_gpu) {
    const uint64_t ev = new_event();
    record_event(ev, pr.s);
    wait_event(ev);
    drop_event(ev);
    for (size_t i = 0; i < pr.before.size(); ++i) {
      const bool ok = after[i] != ~uint64_t{0} && backed(pr.before[i].first);
      pr.before[i].second = d_.hash_value(int64_t(pr.before[i].second));
      after[i] = ok ? d_.hash_value(int64_t(after[i])) : ~pr.before[i].second;
    }
  }
  std::vector<uint32_t>& wrote = rc_.wrote;
  wrote.clear();
  for (size_t i = 0; i < pr.before.size(); ++i) {
    const uint32_t k = pr.before[i].first;
    const bool fresh = o_.fault != Options::Fault::RecomputeFreshByHash &&
                       std::find(pr.fresh.begin(), pr.fresh.end(), k) != pr.fresh.end();
    if (!fresh && after[i] == pr.before[i].second) {
      // Not written: a range's version back, unless another launch has moved it since (a small
      // allocation's stays moved).
      for (const Bump& b : pr.bumped)
        if (b.slot == k && !(k & recompute::kSmallBit) && slots_[k].version == b.now) slots_[k].version = b.was;
      continue;
    }
    wrote.push_back(k);
  }
  // Writes are learned per position, the union over the probes that saw it. Positions that share
  // a written range in this launch (an in-place update) are all taken as written: the hash cannot
  // tell which one wrote.
  // A written range made before a launch that made a new one marks its positions as sides: seen
  // written for real, by its bytes (an aliased in-place operand of a launch that makes nothing new
  // is not one).
  // Writing a range only fills wrote before makes it as writing a new one does.
  auto in = [](const std::vector<uint32_t>& v, uint32_t k) { return std::find(v.begin(), v.end(), k) != v.end(); };
  bool made = !pr.fresh.empty();
  for (uint32_t k : pr.filled) made = made || in(wrote, k);
  for (size_t j = 0; j < pr.at.size(); ++j) {
    KernelKnow::Pos& p = kk.find_or_add(pr.at[j]);
    p.seen = uint8_t(std::min(255, p.seen + 1));
    const bool w = std::find(wrote.begin(), wrote.end(), pr.at_slot[j]) != wrote.end();
    p.written = p.written || w;
    if (std::count(pr.at_slot.begin(), pr.at_slot.end(), pr.at_slot[j]) == 1) (w ? p.written_alone : p.clean_alone) = true;
    const bool made_here = in(pr.fresh, pr.at_slot[j]) || (pr.fresh.empty() && in(pr.filled, pr.at_slot[j]));
    if (w && !made_here && made && p.side == KernelKnow::NoSide) p.side = KernelKnow::SideSeen;
  }
  if (kk.probes < 255) ++kk.probes;
  ++st_.probes;
  if (pr.on_gpu) ++st_.probes_on_gpu;
  st_.probe_ns += mono_now_ns() - t0;
}

bool Residency::rc_remake(uint32_t slot, Stream s) {
  Range& r = slots_[slot];
  const Producer& p = rc_.producers[r.producer];
  KernelKnow& kk = rc_.know[p.kernel];
  const bool versions = o_.fault != Options::Fault::RecomputeIgnoreVersions;
  if (versions && p.out_version != r.version) {
    ++st_.remake_written;
    rc_count_kept_back(r);
    if (rc_.kernels_said_written < 12) rc_say_written(r, p);
    return false;
  }
  if (kk.trust == KernelKnow::Trust::Banned || rc_prelude_banned(p)) {
    ++st_.remake_stale;
    return false;
  }
  if (versions && !rc_smalls_kept(p)) {
    ++st_.remake_stale;
    return false;
  }
  for (const auto& [k, v] : p.inputs) {
    const Range& in = slots_[k];
    if (!in.live || (versions && in.version != v)) {
      ++st_.remake_stale;
      return false;
    }
    if (in.state != State::Resident && in.state != State::CopyingIn) {
      ++st_.remake_away;
      return false;
    }
  }
  // After an input's reload on another stream. Its writes before the launch made again need no
  // wait: they preceded the original launch, which the copy out of this range followed; one after
  // it would have changed its version.
  if (o_.fault != Options::Fault::RecomputeSkipInputWait)
    for (const auto& [k, v] : p.inputs) {
      const Range& in = slots_[k];
      if (in.state == State::CopyingIn && in.in_stream != s) order_after(s, in.copy_event);
    }
  // After another launch made again on another stream that wrote an input as its side (zeroed and
  // put back there): the program ordered nothing around that.
  if (o_.fault != Options::Fault::RecomputeSkipReadOrder)
    for (const auto& [k, v] : p.inputs) {
      Range& in = slots_[k];
      if (!in.read_stream || in.read_stream == s) continue;
      if (query_event(in.read_event) == 1) in.read_stream = 0;
      else order_after(s, in.read_event);
    }
  if (p.nparams > 256) return false;
  if (p.has_side() && (!rc_side_ready(p, true) || !rc_side_buffer(p.side_bytes, s, nullptr, 0, nullptr))) {
    ++st_.remake_away;
    return false;
  }
  // Its side, saved and zeroed after all work on it so far (the program ordered none of it before
  // this launch): then the launch, then the side put back.
  if (!rc_side_save(p, s)) return false;
  const bool launched = rc_launch_preludes(p, s) && rc_launch_again(p, s);
  rc_side_put_back(p, s);
  if (!launched) return false;
  // Its inputs are read, and its side written, on `s` now: an eviction or a free of one waits for
  // that (a touch on `s`), and so does a launch on another stream that touches one (read_event).
  auto read_here = [&](Range& in) {
    release_clean(in);  // used now, as a launch's touch would
    add_touch(in, s, launches_seen_);
    if (!in.read_event) in.read_event = new_event();
    record_event(in.read_event, s);
    in.read_stream = s;
  };
  for (const auto& [k, v] : p.inputs) read_here(slots_[k]);
  for (const auto& [k, va, bytes, fills] : p.side) read_here(slots_[k]);
  if (p.has_side()) {
    ++st_.side_kept;
    st_.side_kept_bytes += p.side_bytes;
  }
  if (!rc_check_remade(p, r, s)) return false;  // the copy in overwrites what it wrote
  copying_in(r, s);
  if (r.host) host_.give(r.host, r.bytes);
  rc_undrop(r);
  r.host = nullptr;
  ++st_.recomputed;
  st_.recomputed_bytes += r.bytes;
  return true;
}


bool Residency::rc_check_remade(const Producer& p, const Range& r, Stream s) {
  // Checked: a kernel's first launch made again, one whose side is at positions not checked yet
  // (zeroed there, a kernel that reads what it also writes gives other bytes), and one after a
  // chain with a kernel not checked yet.
  if (rc_all_checked(p) || o_.fault == Options::Fault::RecomputeUnchecked) return true;
  KernelKnow& kk = rc_.know[p.kernel];
  const bool side_new = rc_side_unchecked(p);
  const bool chain_new = rc_chain_unchecked(p);
  ++st_.recompute_checks;
  const bool same = rc_same(r.va, r.host, r.asked, s);
  for (uint32_t at : p.side_at) {  // positions found out either way
    KernelKnow::Pos& pos = kk.find_or_add(at);
    if (pos.side == KernelKnow::SideSeen) pos.side = same ? KernelKnow::SideChecked : KernelKnow::SideRefused;
  }
  auto name = [&](uint32_t kernel) { return namer_ ? namer_(namer_ctx_, kernel) : std::to_string(kernel); };
  if (!same && side_new) {
    // Its side, not the kernel, is what is refused: launches that write there are no producers.
    ++st_.side_refused;
    log().info("recompute: kernel {} made again with what it writes besides zeroed gave other bytes; those "
               "launches are not made again", name(p.kernel));
    return false;
  }
  // The chain's kernels not checked yet: checked with it, or banned with it (which of them gave
  // other bytes is not known).
  for (int32_t id = p.prelude; chain_new && id >= 0; id = rc_.producers[id].prelude) {
    const Producer& q = rc_.producers[id];
    KernelKnow& qk = rc_.know[q.kernel];
    if (!rc_member_unchecked(q) || qk.trust == KernelKnow::Trust::Banned) continue;  // banned in this loop already
    if (same) {
      qk.chain_checked = true;
      continue;
    }
    qk.trust = KernelKnow::Trust::Banned;
    ++st_.recompute_bans;
    log().warn("recompute: kernel {} launched again before kernel {} did not give the bytes they gave before; "
               "it is not launched again", name(q.kernel), name(p.kernel));
  }
  if (!same && kk.trust == KernelKnow::Trust::Unchecked) {
    kk.trust = KernelKnow::Trust::Banned;
    ++st_.recompute_bans;
    log().warn("recompute: kernel {} made again did not give the bytes it gave before; it is not made again", name(p.kernel));
  }
  if (!same) return false;
  kk.trust = KernelKnow::Trust::Trusted;
  return true;
}

bool Residency::rc_launch_again(const Producer& p, Stream s) {
  void* params[256];
  for (int32_t i = 0; i < p.nparams; ++i) params[i] = const_cast<unsigned char*>(p.args.data()) + p.params[i].offset;
  size_t packed_len = p.args.size();
  void* extra[] = {reinterpret_cast<void*>(1), const_cast<unsigned char*>(p.args.data()), reinterpret_cast<void*>(2), &packed_len,
                   nullptr};  // CU_LAUNCH_PARAM_BUFFER_POINTER, _SIZE, _END
  LaunchGeom g = p.geom;
  g.attrs = p.attrs.empty() ? nullptr : p.attrs.data();
  return p.nparams < 0 ? d_.launch_kernel(p.f, g, s, nullptr, extra) : d_.launch_kernel(p.f, g, s, params);
}

}  // namespace offload

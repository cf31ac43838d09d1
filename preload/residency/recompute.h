// The residency manager's state for making ranges again (Residency::Options::recompute): what
// it knows of each kernel, the producers of live ranges, the probe in progress, and scratch.
// recompute.cpp holds the rules and says why.
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/driver.h"  // ParamInfo, LaunchGeom

namespace offload::recompute {

// How a range was last written (Range::written_as): by a launch whose writes were learned, by one
// not learned yet (every range it touches taken as written), by a copy or memset, or by a launch
// we cannot see into.
enum class WrittenAs : uint8_t { None, Learned, Unlearned, Transfer, Blind };

// A stream that touched a range or a followed small allocation, with the number of its last
// launch there that did.
struct Touch {
  Stream s;
  uint64_t launch;
};

// Per kernel id: the argument positions (parameter << 16 | word) its probed launches pointed into
// ranges at, how often each was seen and whether a launch wrote the range there; and whether a
// launch of it made again may be trusted.
struct KernelKnow {
  enum class Trust : uint8_t { Unchecked, Trusted, Banned } trust = Trust::Unchecked;
  int8_t rng = -1;  // its name says it draws random numbers (-1: not looked at yet)
  uint8_t probes = 0;  // launches probed so far
  bool said_undescribed = false;  // its launches without arguments to launch again were named in the log
  bool said_not_alone = false;    // a launch of it that wrote besides its new range was named
  bool said_small = false;        // a launch of it that wrote outside the ranges was named
  bool said_took = false;         // a launch of it that wrote a range another launch made was named
  bool said_written = false;      // a range made again refused for its unlearned write was named
  // Launched again first in an update's chain whose bytes were checked (Trusted: checked alone).
  // Enough to launch it again in a chain, not alone: the update may hide a difference.
  bool chain_checked = false;
  // Ranges copied back, not made again, because a write of it (the last since their producer)
  // moved their version or took their producer: what recompute loses to it.
  uint32_t kept_back = 0;
  uint64_t kept_back_bytes = 0;
  // A side position: one a probe saw write a range made before its launch (bytes changed), in a
  // launch that made a new range; checked by a launch made again that zeroed it and still gave
  // the bytes the first launch gave, or refused by one that did not.
  enum Side : uint8_t { NoSide, SideSeen, SideChecked, SideRefused };
  // Written: seen written in some probe. A launch that updates an operand in place points two
  // positions at one range, and a probe cannot tell which of them wrote it: both count as written.
  // Seen alone (the only position at its range), written or not, tells them apart: a position
  // seen unwritten alone and never written alone writes only where it aliases another (an input
  // of an in-place update).
  struct Pos {
    uint32_t at;
    uint8_t seen;  // probes that saw it
    bool written;
    Side side;
    bool written_alone = false, clean_alone = false;
    bool writes() const { return written && (written_alone || !clean_alone); }  // where it is alone
    bool unsettled() const { return written && !written_alone && !clean_alone; }  // written, never seen alone
  };
  std::vector<Pos> pos;  // by `at`
  const Pos* find(uint32_t at) const {
    for (const Pos& p : pos)
      if (p.at == at) return &p;
    return nullptr;
  }
  Pos& find_or_add(uint32_t at) {
    if (const Pos* p = find(at)) return const_cast<Pos&>(*p);
    return pos.emplace_back(Pos{at, 0, false, NoSide});
  }
};
// A producer: the launch as the driver takes it again, its output's version and its other
// ranges' versions then.
struct Producer {
  Func f = 0;
  LaunchGeom geom;
  uint32_t kernel = 0;
  const ParamInfo* params = nullptr;
  int32_t nparams = 0;  // -1: `args` is the packed buffer, launched again through `extra`
  std::vector<unsigned char> args;
  std::vector<unsigned char> attrs;  // geom.attrs points here when it is launched again
  uint64_t out_version = 0;
  std::vector<std::pair<uint32_t, uint64_t>> inputs;  // slot, version
  // Ranges it wrote besides its output, kept across a launch made again: their
  // bytes saved beside, the ranges zeroed, the launch, the bytes put back.
  struct Side {
    uint32_t slot;
    DevPtr va;
    uint64_t bytes;  // as mapped then: the launch writes within them
    int32_t fills;   // where only fills wrote it before (Producer records, newest first): launched again after it is zeroed; -1: none
  };
  std::vector<Side> side;
  // Small allocations it wrote besides its output (a norm's mean and inverse deviation), kept the
  // same way.
  struct SmallSide {
    AllocId id;
    DevPtr va;
    uint64_t bytes;
    int32_t fills;  // the fills since its birth (Producer records, newest first), launched again after it is zeroed; -1: none
  };
  std::vector<SmallSide> small_side;
  std::vector<uint32_t> side_at;  // the argument positions pointing into either
  uint64_t side_bytes = 0;        // both together
  bool has_side() const { return side_bytes > 0; }
  std::vector<std::pair<AllocId, uint64_t>> small_inputs;  // small allocations it read, and their versions
  // A launch that wrote the output before it and read nothing (a fill: PyTorch's deterministic mode
  // fills each new tensor before its operation writes it; zeros before an accumulation), launched
  // again first; its own prelude before it. -1: none.
  int32_t prelude = -1;
  bool reads_nothing() const { return inputs.empty() && small_inputs.empty() && !has_side(); }
  bool gathered = false;  // a chain's member whose inputs moved to the chain's head (rc_gather_inputs)
  bool reads() const { return !reads_nothing() || gathered; }
};
// A small allocation (outside the ranges: PyTorch's pool, a bias, a norm's weights) that producers
// read: its version, moved by every launch that may write it and by its free, and how many
// producers list it. Only those listed are followed.
struct Small {
  uint64_t version = 0;
  uint32_t consumers = 0;
  uint32_t dependents = 0;  // dropped ranges made from it: made again before it is written (an input) or freed
  bool freed = false;
  // As a producer's side: the last launch on each stream that touched it since it was followed (a
  // launch made again saves it after those), and the copy that put it back after one (later work on
  // another stream waits for that).
  std::vector<Touch> touches;
  uint64_t put_event = 0;
  Stream put_stream = 0;
};
// One a launch points at: in the positions' targets as kSmallBit | its index among the launch's.
struct SmallAt {
  AllocId id;
  DevPtr base;
  uint64_t bytes;
};
inline constexpr uint32_t kSmallBit = 1u << 31;
inline constexpr uint32_t kMaxArgBytes = 4096;  // a kernel's parameters kept to launch again, as CUDA has long limited them
inline constexpr uint32_t kFirstLaunch = ~0u - 1;  // State::unlearned_at: the kernel's first launch
struct Bump {  // a version moved by a launch of unknown writes
  uint32_t slot;
  uint64_t was, now;
};
struct Made {  // what one launch made among the ranges it touches (rc_bump_touched)
  uint32_t fresh = 0, nfresh = 0;  // a range it made (the last), and how many
  uint32_t others_written = 0;     // ranges it may write besides
  int32_t prelude = -1;            // the chain an update in place was made by, now its prelude
};
struct Probe {
  bool active = false;
  uint64_t thread = 0;
  uint32_t kernel = 0;
  Stream s = 0;
  std::vector<uint32_t> at, at_slot;
  std::vector<std::pair<uint32_t, uint64_t>> before;  // slot, hash (or the GPU's ticket for it)
  bool on_gpu = false;  // hashed by the driver (Driver::hash_start): `before` holds tickets
  std::vector<Bump> bumped;
  std::vector<uint32_t> fresh;  // the new ranges it touches: written, whatever their bytes do
  std::vector<uint32_t> filled; // ranges only fills wrote so far: making one counts as making a range
  std::vector<SmallAt> smalls;  // the small allocations it points at (kSmallBit | index in `before`)
};

struct State {
  std::vector<KernelKnow> know;
  uint64_t clock = 0;
  std::vector<Producer> producers;
  std::vector<int32_t> free_producers;
  Probe probe;
  // A launch's positions into ranges and the slots there, the slots it may write (whether as its
  // kernel was seen to write: learned), the new ranges it touches; scratch.
  std::vector<uint32_t> at, at_slot, written, fresh;
  std::vector<uint32_t> filled;          // the ranges it touches that only fills wrote (rc_fill_only)
  std::vector<std::pair<uint32_t, int32_t>> side_fills;  // of those, the ones it writes besides: slot, fills
  std::vector<SmallAt> smalls;           // the small allocations it points at (at_slot: kSmallBit | index)
  std::vector<uint32_t> small_written;   // of those, the indices it may write
  std::unordered_map<AllocId, Small> small;  // those producers read
  // Small allocations that fills alone touched since their birth: the fills (Producer records,
  // newest first), handed to the producer that writes one as its side.
  std::unordered_map<AllocId, int32_t> small_fills;
  uint64_t small_consumers = 0;          // their consumers in all
  bool learned = false;
  std::vector<Bump> bumped;
  std::vector<uint32_t> deps, side_keep;  // scratch
  // rc_restore's keep lists, one per depth (a dropped input made again inside it): a deque, so that
  // a deeper one never moves those being read.
  std::deque<std::vector<uint32_t>> keeps;
  uint32_t restoring = 0;
  // While a launch that may write these (or a free of one) is being prepared, no range made from
  // one of them is dropped: rc_guard has made those again already, and would not see a new one.
  std::vector<uint32_t> writes;
  std::vector<AllocId> small_writes;  // the small allocations it may write (those followed)
  bool writing = false;
  bool prepared = false, described = false;  // before_launch's rc_may_write, for rc_note_launch
  std::vector<unsigned char> stage;  // host staging for hashes and checks
  std::vector<uint64_t> after;       // a probe's hashes after its launch (scratch)
  std::vector<uint32_t> probe_what;  // what a probe hashes: slots, and kSmallBit | small index (scratch)
  std::vector<uint32_t> wrote;       // the ranges a probe found written (scratch)
  uint32_t kernels_said = 0;         // kernels named for launches without arguments (a dozen at most)
  uint32_t kernels_said_alone = 0;   // kernels named for writing besides their new range
  uint32_t kernels_said_small = 0;   // kernels named for writing outside the ranges
  uint32_t kernels_said_took = 0;    // kernels named for writing a range a producer made
  uint32_t kernels_said_written = 0; // writers named for a range made again refused for their write
  bool said_transfer = false, said_blind = false;
  uint32_t transfer_kept_back = 0;  // as KernelKnow::kept_back, for copies and memsets
  uint64_t transfer_kept_back_bytes = 0;
  uint32_t unlearned_at = 0;  // the position that kept a launch's writes from being learned (UINT32_MAX: none)
  std::vector<AllocId> small_hit;    // the small allocations a launch may write (scratch)
  AllocId small_floor = 0;           // rc_small_floor_ before this launch: small allocations new at it are at or above
  uint64_t side_event = 0;           // after the last use of the side buffer, on side_stream
  Stream side_stream = 0;
  bool side_held = false;            // a dropped range is being made again with it: not let go for room
};

}  // namespace offload::recompute

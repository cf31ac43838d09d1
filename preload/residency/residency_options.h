// The residency manager's options (Residency::Options): the budget, how ranges are backed and
// let go, recompute's rules, and the faults tests switch on to prove a rule is needed. Each says
// which environment variable sets it (common/env.h) and why its default is what it is.
#pragma once

#include <cstdint>
#include <cstdio>

#include "core/gate_chunks.h"

namespace offload {

inline constexpr double kGiB = double(1ull << 30);  // bytes in a GiB, for messages

// A size for a message: GiB from 1 GiB up, else MiB (a 2 MiB allocation is not "0.00 GiB").
struct SizeText {
  char s[32];
  explicit SizeText(uint64_t b) {
    if (b >= (1ull << 30)) std::snprintf(s, sizeof s, "%.2f GiB", b / double(1ull << 30));
    else std::snprintf(s, sizeof s, "%.1f MiB", b / double(1 << 20));
  }
};

struct ResidencyOptions {
  uint64_t budget = 0;     // device bytes: our handles plus the pool's share
  uint64_t min_bytes = 0;  // allocations served as ranges; 0: the VMM granularity
  // Bytes set aside for the allocator's pool (allocations under min_bytes) at the start;
  // the share grows with what the pool holds, never past the budget less one range.
  uint64_t pool_floor = 64ull << 20;
  // Room the share keeps above what the pool holds: between two looks at it, the pool grows by
  // at most one chunk of its own (a small allocation that finds no free block).
  uint64_t pool_step = 32ull << 20;
  // Kept free below the budget for device memory that grows outside the allocator between two
  // looks at it (modules loaded lazily, library workspaces): their growth since the first range
  // is measured (Driver::device_used_bytes) and taken off the budget too.
  uint64_t headroom = 0;
  // Kept free by evicting ahead, off the allocation path, so that a reload or an allocation
  // finds room without the host waiting for a copy out; 0: low_share of the budget.
  uint64_t low_water = 0;
  double low_share = 0.125;
  bool prefetch = true;  // reload ahead what the step before predicts is used soon
  // Launches ahead of its predicted use that a range is reloaded at first; doubled (up to a
  // quarter of the step) each time a prefetch is still copying when its launch comes, and a
  // quarter shorter each time one is evicted again before its use (the room cannot hold
  // what a lead that long brings in).
  uint64_t prefetch_lead = 24;
  uint64_t prefetch_lead_max = UINT64_MAX;  // the lead's ceiling besides a quarter of the step
  // A late prefetch doubles the lead only when none went out unused within the lead's launches
  // before it (OFFLOAD_CAP_PREFETCH_GROW=unwasted): then the room, not the lead, ran short.
  // Checkpointed Llama at half its peak on an H100 ended every step with the lead at its
  // ceiling while 221-1,180 prefetches a step went out unused (docs/results.md). Off: on an
  // H100 no family's step was faster with it, and as many prefetches came late.
  bool lead_grow_unwasted = false;
  // Ranges due for a prefetch go out nearest predicted use first (OFFLOAD_CAP_PREFETCH_ORDER=
  // nearest), so that the free room and the copy stream's queue serve the range needed soonest;
  // false (the default), in the order the ranges were made, where a range used hundreds of
  // launches on can take the room, and the link, ahead of one used next (a late prefetch then
  // lengthens the lead, which queues more ahead of it). On an H100 no family gained, and as many
  // prefetches came late (docs/results.md).
  bool prefetch_nearest = false;
  // The step's period is not used (OFFLOAD_CAP_VICTIMS=lru): victims are the least recently used,
  // nothing is prefetched or evicted by its predicted next use, and ranges come back on demand,
  // as before a period is found. On an H100, checkpointed Llama at half its peak took 1.04-1.32 s
  // over its last step without a period and 1.6-3.1 s a step once the prefetch lead was at its
  // ceiling, though 2.2 s at a smaller budget (docs/results.md). Off: not compared over whole runs.
  bool lru_victims = false;
  // A range prefetched and evicted again unused is prefetched again only once half its distance
  // to the use it was brought in for has passed, and in later steps never for a use past the
  // place in the step where it went out (OFFLOAD_CAP_PREFETCH_HOLD=on): the room that threw it
  // out is needed there again every step.
  // Checkpointed Llama at half its peak on an H100 prefetched 19-30 GiB a step, 522-1,150 of its
  // 1,025-1,658 prefetches going out unused, to use 0.2-0.9 GiB on demand (docs/results.md).
  bool prefetch_hold = false;
  // A range due for a prefetch is brought back only when the room left after it holds what the
  // live bytes rose by, a step earlier, between this place and its use
  // (OFFLOAD_CAP_PREFETCH_ROOM=on, RoomProfile): room an allocation is about to take is not
  // room to prefetch into. On by default: on an H100 it sent 58-72% fewer prefetches out unused
  // on checkpointed Llama and 19-46% fewer on the reference, with no family measurably slower
  // (docs/results.md).
  bool prefetch_room = true;
  // The largest physical handle made: a range is backed by handles of this size and one for
  // the rest (or by spares of any size that tile it). 0: one handle per range, and a spare
  // backs only a range of its size.
  uint64_t piece_max = 64ull << 20;
  // A range of at most this many bytes is backed by one handle of its size: a spare of that
  // size, or one made, never smaller spares (each piece costs a mapping, its access grant and
  // an unmapping every time the range is mapped, about what making and releasing a small handle
  // costs once), while making a handle costs at most twice what a piece's mapping and unmapping
  // do, as measured here (on the H200: 27-49 us against 100-140 in a small model's step, about
  // 1.7 ms against 210 us in a 59 GiB Llama's). 0: any range may be tiled.
  uint64_t whole_max = 0;
  bool whole_measured = true;  // false: whole_max applies whatever the costs (the replay's simulated driver)
  // Pieces more than the fewest that back it (whole pieces and one tail) a range may map from
  // spares: each costs a mapping and an unmapping every time the range comes back, while the
  // rest is made new (and as many bytes of spares dropped). Default: no limit.
  uint64_t extra_pieces = 1ull << 20;
  // Instead, while the costs are measured (whole_measured) and known: as many extra pieces as
  // making one handle costs in pieces' mappings and unmappings (at least 1, at most
  // kExtraAutoMost). With no limit the mappings of a loop grow step after step without end
  // (the recorded llama-compiled step: 1,173 to 4,126 over 40 steps, `offloadctl replay`);
  // any limit keeps them flat, and the cost of making a handle, which on the H200 rose from
  // 31-98 us to 2.2 ms as the device filled (docs/results.md), sets how many handles that
  // limit may make instead. Not the default: on the H200 it was 1.6% faster with 4 GiB of the
  // device outside the budget and 5% slower over steps 21-40 with 256 MiB.
  bool extra_auto = false;
  // Spares back a range only where they tile all of it, or as whole pieces and a tail of its
  // exact size, the rest made as whole pieces and one tail: every handle has a size some range
  // has, and a loop's handles stop growing in number. false (the default, the one measured on
  // the GPU): any spares, and the remainder made at whatever size they leave, which fewer
  // handles are made for but which makes the handles held smaller step after step.
  bool tile_exact = false;
  // A freed range of another size serves an allocation by its own address when that changes
  // fewer bytes of mappings than backing a new range would: its pieces beyond the new size are
  // dropped (once its free is known complete), and pieces mapped after them for the rest, up to
  // the address space it reserved (twice its first size). Mapping, not copying, is what a Llama
  // step spent its host time on: about 1,100 of 1,419 allocations a step mapped a new range.
  bool refit = true;
  // With tile_exact: a range's tail (what is left past its whole pieces) is rounded up to a size
  // class (granules 1, 2, 3, 4, 6, 8, 12, ... up to a piece) where that adds at most an eighth
  // of the range, so that fewer handle sizes exist and a spare of the class backs the next one.
  bool size_classes = false;
  // Spare handles whose last work (a copy out, a freed range's work) still runs are released
  // after those whose work is done, and only when nothing else makes room: releasing one makes
  // the host wait for that work, which drains the GPU's queue (on the H200 it took a 59 GiB
  // Llama's step from 1234 to 1133 ms, docs/results.md). false: smallest first whatever their
  // work, as a comparison.
  bool busy_spares_last = true;
  // The copies out that an allocation or a launch starts are queued after the mappings it makes:
  // an access grant made while a copy to the host runs took 0.7-1 ms a piece on the H200,
  // against about 50 us otherwise (scripts/gpu/load_probe.cpp, docs/results.md). false: each
  // copy is queued as its eviction starts, as a comparison.
  bool copies_after_maps = true;
  // When nothing else makes room without the host waiting, a resident range whose handles can
  // back part of the need is evicted (its copy out gives them; the taker's stream waits for it)
  // before a spare whose last work still runs is released (the host waits for that work).
  // OFFLOAD_CAP_EVICT_FIRST; off: it trades host waits for bytes moved, not yet measured on a GPU.
  bool evict_before_busy_release = false;
  // A range that one launch produced (recompute.cpp): instead of copying it back, that launch
  // is made again into it, when every other range it touched is resident and unchanged since.
  // OFFLOAD_CAP_RECOMPUTE; off: its cost and gain on a GPU are not measured yet.
  bool recompute = false;
  // With recompute: a resident range its producer could make again (dropped, nothing copied) is
  // picked for eviction as if its next use were this many times further. OFFLOAD_CAP_DROP_FIRST;
  // 1 (the default): by next use alone. 16 moved 1-44% fewer bytes out on eight of nine recorded
  // steps (docs/results.md); not measured on a GPU, where each drop costs its kernel again.
  uint32_t drop_first = 1;
  // With recompute: a kernel's launches probed for their writes, at most
  // (OFFLOAD_CAP_RECOMPUTE_PROBES; four positions' worth of Residency::kRecomputeProbes).
  uint8_t kernel_probes = 12;
  // With recompute: a launch writing a range another launch made becomes its producer, the chain
  // run again before it (OFFLOAD_CAP_RECOMPUTE_UPDATES; off: not yet measured on a GPU).
  bool updates = false;
  // Freed ranges kept for reuse are let go for room by when the step asks for their size again,
  // furthest first (a freed range of the size asked for serves it with no mapping); false (the
  // default, OFFLOAD_CAP_KEEP_ASKED): the smallest first. On the recorded steps it mapped 4.4%
  // less at half their peak; on the H200's large Llama at 70% free, 3.6% more (docs/results.md).
  bool keep_asked = false;
  // Once the step's length is known, an allocation born where the step before freed one of its
  // size within this many launches, never evicted in that life, is left to the allocator's pool
  // (inside its share of the budget) instead of a range of its own: a range maps its pieces
  // (and grants access) at birth whenever its room went to a reload, at 0.1-0.7 ms a piece, and
  // allocations made 60-85% of a capped step's mappings (docs/results.md). The pooled bytes live
  // at once stay under pool_short_share of the budget. OFFLOAD_CAP_POOL_SHORT; 0 (the default): off.
  uint32_t pool_short = 0;
  double pool_short_share = 0.25;
  // Evicting ahead of need leaves out what is used within this many launches: true
  // (OFFLOAD_CAP_AHEAD_HORIZON=ceiling), the prefetch lead's ceiling, a quarter step; false (the
  // default, =lead), the current prefetch lead, which an unused prefetch shortens by a quarter:
  // at its floor of 8 launches a range used a few hundred launches on goes out and can be taken
  // back before its copy ends (docs/results.md). On the recorded steps the ceiling brought back
  // 14% less on demand and 4% more host waits; on the H200 (the reference at 50%) 16% fewer
  // bytes out a step in the same step time.
  bool ahead_to_ceiling = false;
  // A range's access grant is made apart from its mappings, on a thread of its own
  // (OFFLOAD_CAP_GRANT=apart): the mapping thread goes on, and every stream that uses the range
  // before the grant is known made waits for it on the GPU (Driver::stream_wait_word). A grant
  // made while a copy to the host runs took about 0.7 ms on the H200, against 0.05 idle, and
  // mappings were 20-40% of the manager's host time in a step (docs/results.md). Off (the
  // default): on an H100 ResNet-50 at 50% spent 30-47 ms a step less in the manager and took
  // 24 +- 24 ms longer, its kernels waiting on the GPU for the grants. Not with recompute (its
  // own launches would need the same waits); without the driver's word, grants stay inline.
  bool grant_apart = false;
  // Copies out queued in chunks of this many bytes behind a gate that each access grant closes
  // (OFFLOAD_CAP_GATE; Driver::gate_copies_out), so that the grant need not wait for a copy to the
  // host. 0 (the default): off. On an H100, chunks that widen past 32 queued (4 MiB at first)
  // made ResNet-50 6% and the reference 14% faster, the LSTM and Llama no faster, as Llama's
  // and the reference's grants waited for the wide chunks (docs/results.md).
  uint64_t copy_gate = 0;
  uint32_t copy_gate_ahead = GateChunks::kAhead;  // OFFLOAD_CAP_GATE_AHEAD: chunks of the gate's size queued before they widen
  enum class Fault : uint8_t { None, SkipEvictWait, SkipGivenWait, SkipRefitFreeCheck, IgnoreCapture, SkipReloadWait,
                             RecomputeIgnoreVersions, RecomputeIgnoreNames, RecomputeIgnoreWrites,
                             RecomputeUnchecked, RecomputeSkipInputWait, RecomputeSkipReadOrder, RecomputeFreshByHash,
                             RecomputeNoWriteGuard, RecomputeSideNotKept, RecomputeSideNotZeroed,
                             RecomputeSkipSideWait, RecomputeSideAnyWrite, RecomputeAliasedWrites, RecomputeNoSmallSide,
                             RecomputeNoCheckAhead, RecomputeNoChains, RecomputeChainRoomFlat,
                             RecomputeNoPrelude, RecomputeSkipPrelude, RecomputeCopyWritesAll,
                             TagEventsAsAsked, RecomputeNoUpdates, RecomputeUpdateInputsOwn,
                             RecomputeChainUnchecked, SkipMapCarry, SkipGrantWait, SkipReloadRoom };  // tests: proves a missing wait is caught
  Fault fault = Fault::None;
};

}  // namespace offload

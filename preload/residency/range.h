// A range of the residency manager (residency.h): the device memory of one allocation, its
// state, its uses and what making it again needs; the physical pieces that back it and the
// spares they come from.
#pragma once

#include <cstdint>
#include <vector>

#include "core/driver.h"
#include "residency/recompute.h"

namespace offload {

enum class RangeState : uint8_t { Resident, CopyingOut, OnHost, CopyingIn };

namespace residency_range {

inline constexpr uint64_t kNoKey = UINT64_MAX;

struct Piece {
  uint64_t handle, bytes;
};
struct Spare {
  uint64_t handle;
  uint64_t event;  // the copy out still reading it (its range was given), 0: none
};
struct Range {
  DevPtr va = 0;
  uint64_t bytes = 0;   // rounded to the granularity: mapped when backed (the allocation's size or a little more)
  uint64_t cap = 0;     // address space reserved at va (at least bytes)
  std::vector<Piece> pieces;  // mapped one after another from va; empty while on the host
  uint64_t grant_no = 0;      // Options::grant_apart: the Granter's number of its last grant; 0: made
  bool backed() const { return !pieces.empty(); }
  RangeState state = RangeState::Resident;
  bool live = false;    // false: freed, kept mapped for reuse (or a slot not in use)
  void* host = nullptr;
  uint64_t copy_event = 0;    // our copy's (out: on the copy stream; in: on in_stream)
  Stream in_stream = 0;
  uint64_t last_use = 0;      // launch number
  Stream free_stream = 0;
  // Freed: after its last work. Live: after the work of its memory's earlier users (a previous
  // owner's free, or what the spares it maps waited for), which its copy out and its free follow.
  uint64_t free_event = 0;
  uint64_t free_seq = 0;      // the order its free_event was recorded in, among all frees
  // The stream that waited for the earlier users of the spares it maps, while no launch there
  // has touched it since (whose event would cover those waits): its copy out or free records
  // free_event there first (carry_out). 0: none.
  Stream carry = 0;
  uint32_t inflight = 0;      // launches between before_launch and after_launch
  // Copying out, its handles given to the spares (and maybe mapped by another range) already:
  // the copy still reads them here, so the range cannot keep its bytes if touched; unmapped
  // once the copy is done.
  bool given = false;
  // Its eviction began while its reload was still copying in: the reload's event, kept while
  // it copies out. The copy out waits for the reload; a launch that takes the range back
  // (abandon) waits for the reload alone, not for the copy out behind it.
  uint64_t load_event = 0;
  // Streams that touched the range since it was made resident, each with the launch
  // number of its last touch there.
  using Touch = recompute::Touch;
  std::vector<Touch> touches;
  // The last launches that touched it, oldest first from upos - nuses: a step's worth. With 8, a
  // range used at every layer had its first uses in a step forgotten and went out just before
  // them (docs/results.md, "Ranges copied out for nothing").
  static constexpr int kUses = 64;
  uint64_t uses[kUses] = {};
  uint8_t nuses = 0, upos = 0;
  bool prefetched = false;    // reloaded ahead and not yet touched
  bool moved = false;         // evicted (or dropped) in this life
  // Prefetched and not touched since: `host` still holds its bytes, read by the copy in once
  // this event is done. An eviction then copies nothing out (clean); a touch gives the slot back.
  uint64_t host_read = 0;
  bool clean_out = false;     // copying out with nothing to copy: the host has its bytes
  // Its copy in's end, the last work on its memory: a range given its handles waits for that
  // alone, not for the copies out queued before its (empty) one. Its eviction still ends with
  // the copy stream, so that a touch before then keeps it with nothing copied.
  uint64_t in_done = 0;
  // Its eviction's: whether it was ahead of need, and its next use then, in launches (capped).
  bool out_ahead = false;
  uint32_t out_next = 0;
  uint32_t out_lead = 0, out_lag = 0;  // lead_reach() and out_lag_ then (capped), for Stats
  uint64_t out_at = 0, pf_at = 0;  // the launches seen when its copy out, and its prefetch, started
  uint64_t pf_hold = 0, pf_hold_at = 0;  // Options::prefetch_hold: not before; nor across 1 + this phase
  // Options::recompute: born and not yet touched; bumped at each new life and at every launch
  // that may write it; the launch that produced it (rc_.producers), -1: none known.
  bool fresh = false;
  uint64_t version = 0;       // from rc_.clock: never the same twice, whatever the slot
  int32_t producer = -1;
  bool producer_lost = false;  // this life's producer was dropped by a later write
  recompute::WrittenAs written_as = recompute::WrittenAs::None;  // its last write, and the kernel's id
  uint32_t written_by = 0;
  uint32_t written_at = UINT32_MAX;  // unlearned: the position that kept its writes from being learned
  // The last launch made again that read it, on read_stream: a launch on another stream that
  // touches it before that is known complete waits for it (the application cannot order
  // its own work after a launch it never made).
  uint64_t read_event = 0;
  Stream read_stream = 0;
  // Evicted without a copy: its producer makes it again (rc_restore). While it is, every range
  // it is made from counts it among its dependents, and is neither dropped nor written nor freed
  // before it is made again.
  bool dropped = false;
  uint32_t dependents = 0;
  uint32_t consumers = 0;     // producers that list it among their inputs
  uint32_t side_of = 0;       // dropped ranges whose producer writes it besides them: never dropped, freed after them
  uint64_t asked = 0;         // the bytes its allocation asked for
  bool in_graph = false;      // a launch recorded into a CUDA graph touched it: never freed
  bool graph_freed = false;   // and the application has freed it
  // Its life in the step: born at launch `birth`; `key` names its place of birth (phase in
  // the step, order among the allocations at that launch, size) once the period is known;
  // `life` the launches after birth that touched it; `pred` what the range born at the same
  // place a step earlier was touched at (its predicted uses).
  uint64_t birth = 0;
  uint64_t key = kNoKey;
  std::vector<uint32_t> life, pred;
};

}  // namespace residency_range
}  // namespace offload

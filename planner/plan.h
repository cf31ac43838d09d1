// Plan: what the executor does in every step from the one it is installed in: which
// allocations it places in which arena, when each arena is evicted and reloaded, and how
// many physical handles it keeps. Positions are launch positions within the step, as in
// StepTrace.
//
// build_plan is the built-in planner (until the GPU-time planner lands): arenas are
// consecutive activations in birth order; every arena of the forward but the last is a
// candidate; arenas are offloaded oldest first, only as many as the device budget needs
// (all candidates without a budget); each is reloaded one arena ahead of its first
// backward use. It is a pure function of the trace and the options.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/step_trace.h"

namespace offload {

// `v` rounded up to a multiple of `a` (a = 0: v).
inline uint64_t round_up(uint64_t v, uint64_t a) { return a ? (v + a - 1) / a * a : v; }
// Bytes as a person reads them in a log line: "12.34 GiB".
std::string gib_text(uint64_t bytes);

// What a launch is, as the executor checks it against the plan: its kind, and for a kernel
// its function id. A step whose launches do not match the plan's is a deviation.
inline uint64_t launch_token(EventKind kind, uint32_t kernel) {
  return (uint64_t{static_cast<uint8_t>(kind)} << 32) | (kind == EventKind::Kernel ? kernel : 0);
}

// The tokens of every launch of `t`, by position.
std::vector<uint64_t> step_tokens(const StepTrace& t);

struct ArenaPlan {
  uint64_t capacity = 0;     // virtual bytes (a multiple of the handle size)
  uint64_t used = 0;         // bytes copied out and back (end of the last member)
  int64_t evict_after = -1;  // evicted at the first launch after this position
  int64_t reload_at = -1;    // reload starts at this launch
  int64_t first_use = -1;    // first backward launch touching a member
  uint64_t host_offset = 0;  // where its bytes go in the host extent
  std::vector<uint32_t> members;  // trace ordinals, for reports
};

struct MemberPlan {
  uint32_t pos = 0;      // born before launch `pos`
  uint32_t sub = 0;      // the sub-th allocation made before that launch (any size)
  uint64_t bytes = 0;
  uint32_t arena = 0;
  uint64_t offset = 0;   // within the arena
};

// A block that outlives the step (a weight, optimizer state), served by the PersistentPool
// (OFFLOAD_PERSISTENT_MIN), moved out in the idle stretches between its uses.
struct WeightPlan {
  uint32_t ordinal = 0;      // in the trace the plan was made from
  uint64_t bytes = 0;        // copied out and back (the allocation's size)
  uint64_t host_offset = 0;  // in the host extent, after the arenas'
  DevPtr va = 0;             // filled in from the trace by the shim (TraceAlloc::base)
  uint64_t id = 0;           // likewise (TraceAlloc::id): the id launches name it by
};

// One idle stretch of a weight: evicted at the first launch after `evict_after`, reloaded at
// launch `reload_at`, used again at launch `use`. When use <= evict_after the stretch crosses
// the step boundary: the reload and the use are in the next step (reload_at > evict_after:
// still in this one).
struct WeightWindow {
  uint32_t weight = 0;       // index in Plan::weights
  int64_t evict_after = -1, reload_at = -1, use = -1;
  bool wraps() const { return use <= evict_after; }
};

struct Plan {
  uint64_t step_launches = 0;     // launches per step
  std::vector<uint64_t> tokens;   // launch_token per position
  std::vector<ArenaPlan> arenas;  // offloaded arenas, in birth order
  std::vector<MemberPlan> members;  // sorted by (pos, sub)
  std::vector<uint32_t> member_index;  // first member born before each position (size N+1)
  std::vector<WeightPlan> weights;     // streamed weights (each its own physical handle)
  std::vector<WeightWindow> windows;   // their idle stretches, by evict_after
  // Streamed weights' bytes mapped at once, at most, and before each launch (the executor's
  // bound: a reload issued at launch p that would map more than weight_mapped_at[p] first
  // waits for evictions in flight to finish, which keeps a host running ahead of the GPU from
  // mapping weights before the plan frees room for them; empty: weight_bytes_mapped throughout).
  uint64_t weight_bytes_mapped = 0;
  std::vector<uint64_t> weight_mapped_at;
  uint32_t handles = 0;           // physical handles kept (the most arenas mapped at once)
  uint64_t handle_bytes = 0;      // size of each (= every arena's capacity)

  // Predictions, from the trace's allocation sizes.
  uint64_t plain_peak = 0;        // live bytes at the peak without offload
  uint64_t resident_peak = 0;     // live bytes outside arenas at their peak
  // A plan with weights: PyTorch's pool's share at its peak as the plan counts it (the live
  // bytes outside arenas less the persistent ones, which the pool overhead multiplies); 0: none.
  uint64_t pooled_peak = 0;
  uint64_t predicted_peak = 0;    // resident_peak * pool overhead + handles * handle_bytes
  uint64_t budget = 0;            // 0: none given
  bool meets_budget = true;
  // Room kept under `budget` beside predicted_peak for one handle more than `handles`
  // (PlannerOptions::spare_handle); 0: none promised (or `budget` already leaves it out).
  uint64_t spare = 0;
  // From measured GPU times (the planner); 0: not predicted.
  int64_t predicted_step_ns = 0, compute_ns = 0, lower_bound_ns = 0;
  uint64_t candidates = 0, candidate_bytes = 0;
  uint64_t host_bytes() const;
  bool empty() const { return arenas.empty() && windows.empty(); }
  // Sorts members by (pos, sub) and fills member_index (step_launches + 1 entries).
  void index_members();
  std::string describe() const;   // one line for the log
};

struct PlanOptions {
  uint64_t budget = 0;              // device bytes; 0: offload every candidate
  uint64_t granularity = 2u << 20;  // physical allocation granularity
  uint64_t min_bytes = kActivationMinBytes;
  uint32_t segments = 64;           // target number of arenas over the candidates
  uint32_t min_gap_fraction = 32;   // an arena must be idle for n / this launches
  // Pool bytes reserved per live byte outside arenas. Measured on the reference workload
  // (H200, cudaMallocAsync): 1.05 without offload, 1.14 at half the budget.
  double pool_overhead = 1.15;
  uint64_t member_align = 4096;
  uint64_t max_host_bytes = ~uint64_t{0};  // what the host pool can take
};

// The order reloads due at one launch are issued in: backward order (the earlier first use
// first; on a tie the later-born arena, index i, first).
inline bool reload_before(const ArenaPlan& a, uint32_t i, const ArenaPlan& b, uint32_t j) {
  return a.first_use != b.first_use ? a.first_use < b.first_use : i > j;
}

// Where a plan made from step `t` can start: the first step boundary at or after launch
// number `next` (the number the next launch will get), steps being t.launches.size() long.
inline uint64_t plan_anchor(uint64_t traced_first_launch, uint64_t step_launches, uint64_t next) {
  uint64_t a = traced_first_launch + step_launches;
  if (a < next) a += (next - a + step_launches - 1) / step_launches * step_launches;
  return a;
}

// Live bytes before each launch of `t`, leaving out the allocations `skip` marks (by
// ordinal; null: none).
std::vector<int64_t> live_bytes(const StepTrace& t, const std::vector<char>* skip);

// What a planner needs to know about a step, from its trace alone.
struct StepFacts {
  std::vector<int64_t> live;             // live bytes before each launch
  int64_t peak_pos = 0;                  // the turnaround: the peak of live bytes, or the first gradient's birth before it
  uint64_t peak = 0;
  std::vector<int64_t> fwd_last, bwd_first;  // per ordinal: last use by the peak, first after it
  std::vector<uint32_t> sub;             // per ordinal: its rank among those born before its launch
  std::vector<uint32_t> candidates;      // activations read in backward, in birth order
  uint64_t candidate_bytes = 0;
};
StepFacts step_facts(const StepTrace& t, uint64_t min_bytes);

// Appends to `p` an arena of `cap` bytes holding `members` (ordinals, in birth order) at
// member_align offsets, and its host range after the arenas before it.
void add_arena(Plan& p, const StepTrace& t, const StepFacts& f, const std::vector<uint32_t>& members, uint64_t cap,
               int64_t reload_at, uint64_t member_align);

// Fills the weights' addresses and ids from `t`, the trace the plan was made from in this
// process; a weight the trace does not place (read from a file) is dropped with its windows.
void resolve_weights(Plan& p, const StepTrace& t);

// The plan for steps like `t`. An empty plan (no arenas) when nothing is worth moving:
// `why` then says why.
Plan build_plan(const StepTrace& t, const PlanOptions& o, std::string* why);

}  // namespace offload

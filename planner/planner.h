// The planner: which arenas to offload, and when to bring each back, so that the copies
// hide behind compute in measured GPU time. A pure library: no I/O, no clocks, no driver.
// offloadctl plans with it on recorded traces; the shim plans with it in-process.
//
// Model. The step's launches run on the GPU at the times CUPTI measured (GpuTimeline). An
// offloaded arena is copied out on one D2H queue once its last forward use has run, and back
// on one H2D queue; both share the PCIe link (LinkModel: each direction alone, and the two
// at once). Arenas live in `handles` physical handles of one size: a handle is taken when an
// arena's first member is born and given back when its copy out completes (forward), or when
// its last member is freed (backward); a reload needs one. When none is free the launch that
// needs it waits, and so does every launch after it: stalls add up.
//
// Choice. Arenas are the activations of one layer boundary segment (segments come from the
// period of the forward's launch sequence; without a period, from byte size). The last
// segment stays resident (the backward needs it at once). For each number k of offloaded
// arenas (oldest first: they leave first and come back last) and each handle count, the
// step is simulated; the plan is the fastest one whose peak meets the budget, fewer bytes
// moved breaking ties. Reloads are issued as early as a handle allows, in backward order,
// and never before the arena's copy out is predicted complete.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "planner/plan.h"
#include "planner/step_trace.h"

namespace offload {

// The PCIe link, in bytes per nanosecond (= GB/s). Defaults: the pinned figures measured on
// the H200 (53.8 H2D, 54.4 D2H, 85 in sum at once, D2H suffering most).
struct LinkModel {
  double h2d = 53.8, d2h = 54.4;
  double h2d_shared = 48.0, d2h_shared = 37.0;  // each, while the other direction also copies
  // Feedback: the link as the shim measured it, relative to these figures.
  double scale = 1.0;
  // Feedback per layer boundary: (launch position, ns) where reloads first used at that launch
  // arrived later than modelled in a step the shim ran (measured_lateness).
  std::vector<std::pair<int64_t, int64_t>> late_at;
};

// Several GPUs on one node copy through the same host: each gets less than the single-GPU
// figures when all copy at once. `node` holds the node's sums with every GPU copying (each way
// alone, and both ways at once; offloadd --node-link, measured by scripts/bench/link.py
// --gpus N), in GB/s; 0 = not measured. With `gpus` of them copying, each direction gets the
// smaller of its single-GPU figure and its share of the node's sum; the figures for both
// directions at once shrink in proportion when their sum exceeds a GPU's share of the node's.
struct NodeLinkSums {
  double h2d = 0, d2h = 0, both = 0;
};
LinkModel share_link(LinkModel one, const NodeLinkSums& node, uint32_t gpus);

// Launch times on the GPU, by position: start (monotone, from the step's first kernel) and
// the time until the next position starts (the last: until the step's last kernel ends).
struct GpuTimeline {
  std::vector<int64_t> start, dur;
  int64_t total = 0;
  double measured = 0;  // share of kernel launches CUPTI gave a time for
};
GpuTimeline gpu_timeline(const StepTrace& t);

// Allocations that outlive the step (weights, kept gradients, optimizer state): how long
// each sits unused in GPU time, counting across the step boundary (from its last use in
// this step to its first in the next), and whether the link could take it out and bring it
// back inside that stretch. What weight and optimizer-state offload could hide; each one
// judged alone, the link's other traffic not counted (`link_busy_ns` sums them).
struct PersistentWindow {
  uint32_t ordinal = 0;
  uint64_t bytes = 0;
  size_t uses = 0;        // launches touching it in the step
  int64_t after = -1;     // the idle stretch starts after this launch (-1: never used)
  int64_t before = -1;    // and ends before this one (<= after: in the next step)
  int64_t idle_ns = 0;    // the longest idle stretch, GPU time
  int64_t copy_ns = 0;    // out and back, each direction alone
  bool hides = false;     // copy_ns <= idle_ns
};
struct PersistentReport {
  std::vector<PersistentWindow> windows;  // at least min_bytes, the most bytes first
  uint64_t bytes = 0;                     // of those
  uint64_t hidden_bytes = 0;              // whose copies fit their idle stretch
  uint64_t unused_bytes = 0;              // not touched in the step at all
  int64_t link_busy_ns = 0;               // the hidden ones' copies, summed
  int64_t step_ns = 0;
};
PersistentReport persistent_windows(const StepTrace& t, const LinkModel& link, uint64_t min_bytes = 2u << 20);

// Layer boundaries: positions where a repetition of the forward's launch motif begins.
struct Boundaries {
  uint32_t period = 0;                 // launches per repetition; 0: no period found
  double match = 0;                    // share of forward launches that repeat at that period
  std::vector<int64_t> starts;         // segment starts (first: 0), ascending
};
Boundaries layer_boundaries(const std::vector<uint64_t>& tokens, int64_t forward_end);

// What the planner is asked. budget 0: the largest offload the compute hides.
struct PlannerOptions {
  uint64_t budget = 0;
  uint64_t granularity = 2u << 20;
  uint64_t min_bytes = kActivationMinBytes;
  double pool_overhead = 1.15;      // as PlanOptions
  uint64_t member_align = 4096;
  uint64_t max_host_bytes = ~uint64_t{0};
  uint64_t max_inflight_bytes = 0;  // reload bytes in flight (handles x size); 0: no cap
  uint32_t max_handles = 64;
  double min_match = 0.75;          // a period must repeat this share of the forward
  uint32_t fallback_segments = 32;  // segments by bytes when no period is found
  // Exposed time the "hidden" offload may add, as a share of the step's compute.
  double hide_tolerance = 0.01;
  // Allocations at least this big are the shim's own (OFFLOAD_PERSISTENT_MIN): those born
  // before the step that outlive it (weights) may be streamed, and sit in exact blocks rather
  // than in PyTorch's pool. 0: weights are never streamed.
  uint64_t persistent_min = 0;
  // Trace ordinals (sorted) of allocations the application marked read-only
  // (offload_mark_read_only): the executor copies such a weight out once, and later evictions
  // copy nothing, so its windows cost no copy out (their end is its last use, in the FIFO).
  std::vector<uint32_t> read_only;
  // A plan of activations keeps room under the budget for one more of its handles: it is made
  // again for the budget less one handle when its footprint leaves less. The executor takes one
  // handle over the plan's count when a reload finds every handle held by arenas whose copies
  // out the host abandoned (it asked for them back before the GPU had copied them out), which
  // this GPU-time model does not see (measured: docs/results.md).
  bool spare_handle = false;
  // Weights: when no plan whose copies all hide meets the budget, the step may wait for reloads
  // up to this share of its compute (planned as every launch that much longer); the least
  // share that meets the budget is taken. 0: copies only where they hide. Where weights carry
  // little work per byte (moe), no plan that hides every copy meets the budget, but one that
  // waits a few percent does (docs/results.md). A tenth: the most weight streaming may cost
  // against the resident step.
  double max_weight_stall = 0.10;
  LinkModel link;
  // Called between the planner's units of work (a candidate simulated, a weight tried), on the
  // planning thread; it must not touch the trace being planned. The shim drains its event ring
  // there, because the same worker drains and plans, and a long plan would otherwise let the
  // ring overflow (a moe step has more events than the ring holds). Nothing in the plan depends
  // on it.
  std::function<void()> progress;
};

// One arena's predicted times, ns from the step's start.
struct ArenaTiming {
  uint64_t bytes = 0;
  int64_t born = 0, evict_ready = 0, evict_start = 0, evict_end = 0;
  int64_t reload_issue = 0, reload_start = 0, reload_end = 0, use = 0;
  int64_t stall = 0;  // the wait for this arena before its first backward use
  bool abandoned = false;  // reload asked for before the copy out finished: it stayed
};

struct Prediction {
  bool feasible = true;                // false: the step would wait for a handle that never frees
  int64_t compute_ns = 0, forward_ns = 0, backward_ns = 0;  // without offload
  int64_t step_ns = 0;                 // with it
  int64_t lower_bound_ns = 0;          // per phase: max(compute, bytes / link), summed
  uint64_t bytes_out = 0, bytes_in = 0;
  uint64_t peak_bytes = 0;             // footprint: resident * overhead + handles * size
  uint64_t most_handles = 0;           // handles in use at once
  std::vector<ArenaTiming> arenas;
  std::vector<int64_t> launch_start;   // simulated start of every launch
  std::vector<uint64_t> resident;      // live bytes outside arenas, before every launch
  int64_t exposed_ns() const { return step_ns - compute_ns; }
};

// The step simulated under `plan` (arenas in plan order; timing by segment if known).
// peak_pos: the step's turnaround (StepFacts::peak_pos), -1 to find it.
Prediction simulate(const StepTrace& t, const GpuTimeline& g, const Plan& plan, const LinkModel& link,
                    double pool_overhead, int64_t peak_pos = -1);

struct PlannerResult {
  Plan plan;                       // empty (no arenas) when nothing should move; see why
  Prediction prediction;           // of `plan` (of plain when empty)
  Boundaries boundaries;
  std::vector<int64_t> arena_segment;  // per plan arena, its segment
  // The largest offload the compute hides (exposed <= hide_tolerance of the step), and the
  // footprint it reaches: the smallest budget at which offloading costs (almost) nothing.
  uint64_t hidden_bytes = 0, hidden_peak = 0;
  int64_t hidden_step_ns = 0;
  uint32_t hidden_arenas = 0;
  uint64_t plain_footprint = 0;    // plain peak * pool overhead
  // Weights: the launch before which the budget was missed (-1: met, or no weights), and the
  // planned waits taken to meet it: every launch `stall_share` longer, `stall_ns` in all (in
  // the step's predicted time).
  int64_t unmet_at = -1;
  int64_t stall_ns = 0;
  double stall_share = 0;
  std::string why;
};

// Per-boundary feedback: for each arena of `plan` (predicted as `pr`), how much longer than
// predicted the GPU sat idle before its first backward use in `measured`, a step the plan ran
// (with CUPTI times). Idle time under `slack_ns` is noise. Positions with nothing late are
// left out.
std::vector<std::pair<int64_t, int64_t>> measured_lateness(const Plan& plan, const Prediction& pr,
                                                           const StepTrace& measured, int64_t slack_ns = 50'000);

// Records that reloads first used at launch `pos` arrived `ns` late: the most seen there.
void add_lateness(std::vector<std::pair<int64_t, int64_t>>& into, int64_t pos, int64_t ns);

// The steps after a plan comes in that a watch does not judge (they move the plan's data in):
// `steps` after each restart(), `left` at first.
class Settling {
 public:
  Settling(uint32_t steps, uint32_t left) : steps_(steps), left_(left) {}
  void restart() { left_ = steps_; }
  // Whether this step goes unjudged (counted).
  bool skip() {
    if (!left_) return false;
    --left_;
    return true;
  }

 private:
  uint32_t steps_, left_;
};

// Adaptation: watches the GPU time of the steps a plan runs and says when to plan again
// with a slower link. A step is slow when it runs over the prediction by more than a tenth
// (and 1 ms); three slow steps in a row revise the plan, at most `max_revisions` times. The
// link is slowed by the share of the step the prediction accounted for (at least 10%, at
// most half), so that the next plan moves less, or starts its reloads earlier.
class PlanWatch {
 public:
  // `settle`: the steps after each plan (the constructor's, or replanned's) that are not judged.
  // A plan's first steps move its data in and run slower than the plan predicts; judged, they
  // would revise a plan that keeps its time, and a plan made again from steps in demand mode
  // does not hold.
  explicit PlanWatch(int64_t predicted_step_ns, uint32_t max_revisions = 3, uint32_t settle = 0)
      : predicted_(predicted_step_ns), max_(max_revisions), settling_(settle, settle) {}
  // One step's measured GPU time (first kernel start to last kernel end). Returns the factor
  // to multiply the link model's speed by, or 0 to keep the plan.
  double observe(int64_t measured_step_ns);
  void replanned(int64_t predicted_step_ns) {
    predicted_ = predicted_step_ns, slow_ = 0;
    settling_.restart();
  }
  uint32_t revisions() const { return revisions_; }
  uint32_t slow_steps() const { return slow_; }

 private:
  int64_t predicted_;
  uint32_t max_;
  Settling settling_;
  uint32_t slow_ = 0, revisions_ = 0;
};

// What PyTorch's pool holds for at most in a step, as plan_weights counts it: the peak over the
// launches of the live bytes (`live`, before each) less the persistent ones, which sit in the
// shim's own ranges. The pool keeps what it reserved (its release threshold is the maximum).
int64_t pooled_peak(const std::vector<int64_t>& live, uint64_t persistent);
// The same for a step: its live peak less its persistent allocations of at least
// `persistent_min` bytes (none when 0), at least 0.
uint64_t pooled_live_peak(const StepTrace& t, uint64_t persistent_min);

// The pool factor measured before the first plan: what the pooled bytes (`pooled`, as
// pooled_live_peak counts them) cost on the device, over them. PyTorch's pool reserved
// `reserved` at its high mark; the pooled bytes of at least OFFLOAD_PERSISTENT_MIN sit in the
// shim's own ranges instead, whose physical peak `own_peak` also holds the weights (`weights`
// bytes, not pooled). Never below `model`, at most 2; `model` when nothing was measured.
double measured_pool_factor(uint64_t reserved, uint64_t own_peak, uint64_t weights, uint64_t pooled, double model);

// Adaptation, memory: the plan counts what the allocator holds for the live bytes outside the
// shim's own memory as pool_overhead times them, measured once before the first plan. Under the
// plan the pool can hold more, enough to pass the budget (lora at 20 GiB: docs/results.md). A
// step under the plan whose pool
// holds more than planned by over 0.2%, so much more that the plan's predicted peak grown by the
// difference passes the budget, revises the plan with the measured factor and 0.2% to spare, at
// most `max_revisions` times. A pool that holds less keeps the plan (a smaller footprint).
//
// `settle`: the steps after each install (planned()) that are not judged. Until the pool's trim at
// the plan's first marks, the pool still holds the resident layout's blocks, so judging those
// steps would revise a plan that holds; the plans made again from steps in demand mode do not.
class PoolWatch {
 public:
  explicit PoolWatch(uint32_t max_revisions = 2, uint32_t settle = 0) : max_(max_revisions), settling_(settle, 0) {}
  // A plan came in: its first `settle` steps are not judged.
  void planned() { settling_.restart(); }
  // The pool's reserved bytes at a step's end, the step's peak of live bytes (StepFacts::peak),
  // the factor and predicted peak the running plan was made with, and the budget. Returns the
  // factor to plan with again, or 0 to keep the plan.
  double observe(uint64_t reserved, uint64_t live, double planned, uint64_t predicted_peak, uint64_t budget);
  uint32_t revisions() const { return revisions_; }

 private:
  uint32_t max_;
  Settling settling_;
  uint32_t revisions_ = 0;
};

// Weight streaming: which idle stretches (WeightWindow) of the weights to copy out and back so
// that the footprint meets o.budget. Candidates: allocations born before the step that outlive
// it, of at least o.persistent_min bytes, used in the step; their windows lie between
// consecutive uses and across the step boundary (never between adjacent launches). In GPU time,
// at the link's shared rates, over three unrolled steps: copies out are one FIFO queue from the
// end of the last use, copies back one queue as late as possible before the use (each step's
// queues also hold the neighbouring steps' copies). Its reload is issued at the last launch
// starting by the copy back's planned start; the weight is absent from the first launch
// starting after its copy out ends until that launch. A window fits when that stretch holds a
// launch at least (the copy out ends before the reload's launch starts). Footprint before each
// launch: the peak of (live - persistent) * pool_overhead (PyTorch's pool keeps what it
// reserved) + persistent in whole granules - absent weights. Greedy: while the peak is over the
// budget, the largest window (the longest idle on a tie) that covers the peak joins if
// everything chosen still fits; predicted_step_ns is the compute's (every chosen copy hides).
// When that misses the budget, and o.max_weight_stall allows it: the same on the timeline with
// every launch longer by a share (the step waiting for reloads), the least share up to
// max_weight_stall, found by bisection, that meets the budget; predicted_step_ns includes it.
// With `arenas` (an activation plan and its prediction), weights are added to it: the
// footprint starts from its resident bytes and handles, and the step from its predicted time.
PlannerResult plan_weights(const StepTrace& t, const GpuTimeline& g, const PlannerOptions& o,
                           const PlannerResult* arenas = nullptr);
// The same from the plan that hides everything (`hidden`: plan_weights' result for `t`, `g` and
// `arenas` with max_weight_stall 0), which it returns when that meets the budget or no wait does.
PlannerResult plan_weights_waiting(const StepTrace& t, const GpuTimeline& g, const PlannerOptions& o,
                                   const PlannerResult* arenas, PlannerResult hidden);

// `g` with every launch `factor` times as long (at least 1).
GpuTimeline dilated(const GpuTimeline& g, double factor);

// Plans steps like `t`. Without GPU times in the trace (CUPTI off), every launch counts as
// the same length. With o.persistent_min and a budget that activations alone miss: weights
// alone (plan_weights) when they meet it, else the activation plan with weights added, else
// whichever has the lowest peak.
PlannerResult plan_step(const StepTrace& t, const PlannerOptions& o);

// Activation checkpointing of the step's repeated layers instead, estimated from the step: the
// layers' forward runs again in the backward (its GPU time is added), and of the activations the
// layers leave live at the turn only the largest layer's stays (each layer's input, which
// checkpointing keeps, is not counted: the footprint is a floor). Known only when the forward
// has repeated layers (layer_boundaries) and GPU times.
struct CheckpointEstimate {
  bool known = false;
  size_t layers = 0;
  int64_t recompute_ns = 0;  // the layers' forward, once more
  int64_t step_ns = 0;       // the step's GPU time plus that
  uint64_t footprint = 0;    // at least, with the allocator's overhead
};
// gpu_work_only: from the kernels' own GPU times, not the timeline between them, for a step whose
// GPU waited for the host (a paged step under the cap: its timeline holds the stalls, which
// checkpointing would not have).
CheckpointEstimate estimate_checkpointing(const StepTrace& t, double pool_overhead, bool gpu_work_only = false);

// The link cannot hide the copies: the step (predicted, or measured) more than 10% over its compute.
// Checkpointing the layers (estimate_checkpointing) may then be the faster way to the budget.
inline bool link_bound(int64_t step_ns, int64_t compute_ns) {
  return compute_ns > 0 && static_cast<double>(step_ns) > 1.10 * static_cast<double>(compute_ns);
}
inline bool link_bound(const Prediction& pr) { return link_bound(pr.step_ns, pr.compute_ns); }

// The planner where the built-in plan's options are at hand (the replay on the simulated
// driver): same budget, granularity, thresholds and pool overhead. Sizes there are the
// recorded ones / `divisor`, so the link is slowed alike and copies take the GPU's time.
Plan plan_scaled(const StepTrace& t, const PlanOptions& po, uint32_t divisor, std::string* why);

}  // namespace offload

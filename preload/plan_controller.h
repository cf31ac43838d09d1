// PlanController: the life of a plan of arenas (OFFLOAD_CAP=0, a device budget given). It decides
// when a step is planned from, leases the plan's host memory, installs the plan in the executor,
// watches the steps it runs (GPU time: PlanWatch; the allocator's hold: PoolWatch), trims the
// allocator's pool under it (PoolTrim), and makes it again for the allocator's measured factor
// (PoolRefine), swapping the new plan in at a step's mark. The hard cap (residency/) is not its.
//
// It owns: the plan made last and its prediction, the planner's feedback (link scale, lateness
// per boundary, the allocator's factor), the installed plan's host extent, the trim and refine
// state and the staged swap. It is given, by reference: the Driver (never a concrete binding, so
// that tests run it on SimDriver), the Executor it installs into, the settings, the block cache
// whose bound it sets, the persistent pool (may be null), and a PlanContext for what only the
// process around it knows.
//
// A plan's life:
//
//   no plan --(a step repeats the one before, the executor idle, a host pool)--> planned
//   planned --(the host pool leases its bytes)--> installed  (refused: planned for less, <= 12 tries)
//   installed --(the step it comes in at and the next: kPlanSettleSteps)--> watched
//   watched --(3 steps slower than predicted: PlanWatch)--> revised  (retired; planned again)
//   watched --(the pool past the budget under a weight plan: PoolWatch)--> revised
//   watched --(the pool holds more than the plan's budget: PoolTrim, at the marks)--> trimmed
//   watched --(the pool's factor measured at the marks: PoolRefine)--> refined  (made again)
//   refined --(staged by the worker, put in at a mark, every arena empty)--> swapped
//   swapped --(the worker adopts it at the next step)--> installed
//   any --(a deviation: the executor retires the plan)--> no plan  (planned again once idle)
//
// Threads: on_step() and report() run on the runtime's worker (the caller holds its pump lock,
// so they never run at once); at_mark() runs on the application's thread (offload_mark_step).
// Lock order: trim_mu_, then swap_mu_, then the Executor's and the Driver's own. The host pool is
// leased and released under neither (its lock is the daemon link's). The atomics carry what the
// mark measured to the worker and to report().
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/env.h"
#include "core/block_cache.h"
#include "core/driver.h"
#include "core/executor.h"
#include "core/persistent_pool.h"
#include "core/pool_trim.h"
#include "host_pool.h"
#include "planner/planner.h"

namespace offload {

// Steps a new plan runs before PlanWatch judges its GPU time and PoolWatch its pool: the step it
// comes in at and the one after, which move its data out of a resident layout.
inline constexpr uint32_t kPlanSettleSteps = 2;
// While a plan is made, the event ring is drained at most this often (PlannerOptions::progress).
inline constexpr int64_t kPlanDrainNs = 10'000'000;

// What the controller asks of the process around it (the runtime; a fake in tests).
class PlanContext {
 public:
  virtual ~PlanContext() = default;
  // offloadd's pool, or this process's own; ready: one that can lease now.
  virtual HostPool& host_pool() = 0;
  virtual bool host_pool_ready() = 0;
  // GPUs of this node sharing the host link (offloadd counts them; asked at each timed plan).
  // `gpus_before`: the count of the last answer, so that only a change is logged.
  virtual NodeShare node_share(uint64_t budget, uint32_t gpus_before) = 0;
  virtual uint64_t launches() = 0;   // the number the next launch gets
  virtual uint64_t steps_cut() = 0;  // steps cut so far (for the log)
  // Called now and then while a plan is made: the event ring must not overflow meanwhile.
  virtual void drain_while_planning() = 0;
  // The step was cut while GPU tracing was paused (OFFLOAD_TELEMETRY=sampled).
  virtual bool cut_untraced(const StepTrace& t) = 0;
  // A plan was made from `t` (OFFLOAD_TRACE keeps the step).
  virtual void planned_from(const StepTrace& t) = 0;
};

class PlanController {
 public:
  PlanController(Driver& driver, Executor& executor, const Settings& settings, BlockCache& cache,
                 PersistentPool* persistent, PlanContext& context);
  PlanController(const PlanController&) = delete;
  PlanController& operator=(const PlanController&) = delete;

  // Worker: a step was cut. Adopts a swapped plan, watches and trims the running one, stages a
  // refined one, or plans from `t`. marked: steps are marked by offload_mark_step (trims are
  // then made at the marks).
  void on_step(const StepTrace& t, bool marked);
  // Application's thread, at offload_mark_step: the pool's quietest moment (the step's
  // activations are freed). Puts a staged plan in, trims the pool, measures its factor.
  void at_mark();

  // What the stats show of the plan (worker).
  struct Report {
    uint64_t pool_trims = 0, pool_trimmed_bytes = 0;
    uint64_t weight_bound = 0;  // Plan::weight_bytes_mapped
    size_t windows = 0;
    Prediction predicted;
    uint64_t hidden_bytes = 0, hidden_peak = 0, predicted_peak = 0;
    double link_scale = 1.0;
    uint32_t revisions = 0, pool_revisions = 0;
    double pool_overhead = 0, pool_factor_seen = 0;
    uint32_t pool_refined = 0;
    uint32_t gpus = 1;
    LinkModel link;
    uint64_t host_bytes = 0;
  };
  Report report() const;

 private:
  struct Made {  // one try of the planner
    std::string why;
    int64_t wait_ns = 0;  // the step's planned waits for weight reloads, to meet the budget
    double wait_share = 0;
  };
  void say(const std::string& note);  // the last reason for not planning, said once
  // Pins the host memory a plan copies through, as leased to it (the rest of the pool stays
  // unpinned); an extent that cannot be pinned is copied through more slowly.
  void pin(const Extent& e);
  void plan_from(const StepTrace& t);
  double measured_factor(const StepTrace& t, const PlanOptions& o);
  PlannerOptions planner_options(const StepTrace& t, const PlanOptions& o, uint64_t budget, bool timed);
  Plan make_plan(const StepTrace& t, PlanOptions& o, PlannerOptions& po, uint64_t budget, bool timed,
                 bool first, Made* m);
  void put_in(const StepTrace& t, Plan plan, const Extent& ext, const PlanOptions& o, const PlannerOptions& po,
              bool timed, const Made& m, int64_t planning_from);
  // A step run under the planner's plan: revises the plan when steps keep running slower
  // than predicted (the link is slower than the model says).
  void watch_plan(const StepTrace& t);
  void watch_pool(const StepTrace& t);  // PoolWatch: the allocator's hold under a weight plan
  void trim_pool(const Executor::TrimView& v);  // PoolTrim: the pool back under the plan's budget
  // PoolRefine (pool_trim.h): the allocator's factor under a plan of arenas, measured at the
  // marks (refine_at_mark, the application's thread, under trim_mu_); the plan made again for it
  // (refine_plan, the worker) and put in at a later mark (swap_at_mark), where every arena is
  // empty; the worker then takes it over (adopt_swap).
  void refine_at_mark(const Executor::TrimView& v, bool trim_due, const std::function<void()>& sync);
  bool swap_at_mark(const std::function<void()>& sync);
  void refine_plan(double factor);
  void adopt_swap();
  // Before an installed plan's first step, at its mark: the pool trimmed to the budget less the
  // plan's handles, once the GPU has caught up (sync).
  void trim_before_first_step(const std::function<void()>& sync);
  // Gives the pool's unused memory back, once the GPU has caught up (sync).
  void empty_pool(const std::function<void()>& sync);

  Driver& driver_;
  Executor& executor_;
  const Settings& settings_;
  BlockCache& cache_;
  PersistentPool* const persistent_;
  PlanContext& context_;

  // Worker state.
  std::vector<uint64_t> last_tokens_;    // the previous step's launches, to see steps repeat
  std::optional<Extent> host_;           // the installed plan's host memory
  std::string plan_note_;                // the last reason for not planning, said once
  bool pin_failed_said_ = false;
  // The plan made last and what the planner predicts of it (empty for the built-in plan): for
  // the stats and the adaptation. Then the planner's feedback.
  Plan planned_;
  Prediction predicted_;
  uint64_t hidden_bytes_ = 0, hidden_peak_ = 0;  // the largest offload the compute hides
  double link_scale_ = 1.0;              // the link as measured against the planner's model
  NodeShare share_;                      // GPUs sharing the host link, from offloadd
  LinkModel planned_link_;               // the link the last plan was made for
  double pool_overhead_ = 0;             // allocator bytes per live byte; 0 until measured
  std::string first_factor_note_;        // how the factor was measured from the step last planned from
  uint64_t cache_bound_said_ = 0;        // the cache's bound under the budget, once logged
  double overhead_before_revision_ = 0;  // pool_overhead_ before a pool revision, until re-planned
  bool pool_revision_undone_ = false;    // a revision left no plan within the budget: no more
  StepTrace plan_trace_;                 // the step the installed plan was made from
  PlannerOptions plan_opts_;             // and the planner's options for it
  double base_factor_ = 0;               // the allocator's factor that plan was made with
  std::optional<PlanWatch> watch_;       // the planner's plan against the steps it runs
  PoolWatch pool_watch_{2, kPlanSettleSteps};  // and the allocator's hold against the plan's
  std::vector<std::pair<int64_t, int64_t>> late_at_;  // per-boundary lateness measured so far

  // Shared with the mark.
  std::mutex trim_mu_;                   // trim_, refine_: the mark's thread, or the worker
  PoolTrim trim_;                        // per plan, from its first step until the pool is under it
  PoolRefine refine_;
  std::atomic<uint64_t> pool_trims_{0}, pool_trimmed_bytes_{0};
  std::atomic<double> refine_factor_{0};  // a factor to plan again with, from a mark, for the worker
  std::atomic<double> refine_seen_{0};   // the pool's factor at the last mark it grew (stats)
  std::atomic<uint32_t> refined_{0};     // plans put in at a mark for a measured factor (stats)
  std::atomic<bool> refinable_{false};   // the installed plan: timed, of arenas alone, no block cache
  struct Swap {
    Plan plan;
    Prediction prediction;
    Extent host;
    uint64_t first_launch = 0;  // of the traced step the plan was made from
    double factor = 0;
    std::string desc;
    bool installed = false, refused = false;
    std::string why;
  };
  std::mutex swap_mu_;
  std::optional<Swap> swap_;             // staged by the worker, put in at a mark
};

}  // namespace offload

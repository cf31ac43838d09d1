// Runtime: the one process-wide object of liboffload.so, built once when the library
// loads. It owns the driver binding, the tracker, the CUPTI telemetry and the worker
// thread that turns the event log into step traces, stats and trace files. A plan of arenas'
// life is the PlanController's (plan_controller.h): the runtime forwards each step cut and each
// mark to it, and answers its questions as its PlanContext (host pool, node share, launches).
//
// Hooks reach it through shim.h's free functions, never this header; runtime() returns nullptr
// when the shim is disabled, not yet built, shutting down, or in a forked child (which only
// forwards).
//
// Preload safety: the worker starts with every signal blocked; the exit handler only sets
// a flag; the fork handler turns the child into a pass-through.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <memory>
#include <optional>
#include <thread>
#include <unordered_set>

#include <unistd.h>

#include "common/env.h"
#include "common/json_writer.h"
#include "core/event_log.h"
#include "core/executor.h"
#include "core/block_cache.h"
#include "core/persistent_pool.h"
#include "core/tracker.h"
#include "cuda_driver.h"
#include "core/telemetry_sampler.h"
#include "cupti_telemetry.h"
#include "host_pool.h"
#include "plan_controller.h"
#include "planner/planner.h"
#include "residency/cap_and_plan.h"
#include "residency/host_premade.h"
#include "residency/residency.h"
#include "shim.h"
#include "step_telemetry.h"

namespace offload {

class Runtime final : private PlanContext {
 public:
  explicit Runtime(Settings s);
  ~Runtime();

  Tracker& tracker() { return tracker_; }
  // offload_mark_step(), on the application's thread: the step's end, and the pool's quietest
  // moment (the step's activations are freed), where PoolTrim's tries are made.
  void mark_step();

  // The allocation hooks' calls. place: with the hard cap (a budget, OFFLOAD_CAP on), every
  // allocation of at least its threshold is a range of the residency manager's, and a smaller one
  // goes to the allocator once the pool's share has room (Refused: the budget cannot hold it; the
  // hook answers out-of-memory). Without it: a planned allocation from an arena, else a large one
  // from the persistent pool (OFFLOAD_PERSISTENT_MIN), else the caller forwards it.
  // track_alloc: tracks one the allocator served; release: tracks a free and says whether it
  // was ours (then the allocator must not see it).
  enum class Placed { Forward, Served, Refused };
  Placed place(uint64_t bytes, Stream s, void** p) {
    if (settings_.cap && offloading_requested_) return place_capped(bytes, s, p);
    uint64_t tag = 0;
    DevPtr a = offloading_ ? executor_.place(bytes, s, tracker_.launches(), &tag) : 0;
    if (!a && persistent_ && bytes >= persistent_->min_bytes()) {
      driver_.learn_context();  // an allocation may come before any launch
      a = persistent_->alloc(bytes, s);
    }
    if (!a) return Placed::Forward;
    *p = reinterpret_cast<void*>(a);
    tracker_.on_alloc(a, bytes, s, tag);
    if (offloading_) executor_.note_live(tracker_.allocs().live_bytes());
    return Placed::Served;
  }
  void track_alloc(void* p, uint64_t bytes, Stream s) {
    if (Residency* r = cap_.load(std::memory_order_acquire)) forwarded_capped(*r, reinterpret_cast<DevPtr>(p), bytes);
    tracker_.on_alloc(reinterpret_cast<DevPtr>(p), bytes, s);
    if (planning_) executor_.note_live(tracker_.allocs().live_bytes());
  }
  bool release(void* p, Stream s) {
    const DevPtr d = reinterpret_cast<DevPtr>(p);
    if (Residency* r = cap_.load(std::memory_order_acquire)) return release_capped(*r, d, s);
    uint64_t size = 0;  // the block's, for the cache
    const bool cache = cache_.enabled(), marked = executor_.any_read_only();
    if (cache || marked)
      if (auto e = tracker_.allocs().find(d)) {
        // A range marked read-only is no longer the application's word once freed.
        if (marked) executor_.forget_read_only(e->base, e->size);
        if (e->base == d) size = e->size;
      }
    tracker_.on_free(d, s);
    if (offloading_ && executor_.release(d, s)) return true;
    if (persistent_ && persistent_->free(d, s)) return true;
    return cache_.keep(d, size, cache ? context() : 0, s, cache ? capturing(s) : -1);
  }
  // OFFLOAD_BLOCK_CACHE (core/block_cache.h), for allocations neither the executor nor the
  // persistent pool took. cached: a kept block of the size freed on `s` (true, *p set,
  // tracked). forwarded: the allocator served `p` (marked if a graph capture made it).
  // drain_cache: every kept block, for the caller to free through the allocator (the device
  // was full).
  bool cached(uint64_t bytes, Stream s, void** p) {
    if (!cache_.enabled()) return false;
    DevPtr a = cache_.take(bytes, context(), s, capturing(s));
    if (!a) return false;
    *p = reinterpret_cast<void*>(a);
    track_alloc(*p, bytes, s);
    return true;
  }
  void forwarded(void* p, Stream s) {
    if (cache_.enabled()) cache_.note_forwarded(reinterpret_cast<DevPtr>(p), s, capturing(s));
  }
  std::vector<std::pair<DevPtr, Stream>> drain_cache() { return cache_.drain(context()); }  // this device's
  BlockCache& block_cache() { return cache_; }
  // Tests: where a stream's capture state and the thread's context come from (the driver's
  // by default).
  void set_cache_probes(int (*capture)(Stream), uint64_t (*ctx)()) {
    capture_probe_.store(capture, std::memory_order_relaxed);
    context_probe_.store(ctx, std::memory_order_relaxed);
  }
  void reset_peak() {
    executor_.reset_peak();
    if (persistent_) persistent_->reset_peak();
  }
  // A pointer query (Triton checks its arguments): an evicted arena is mapped back first.
  void prepare_access(DevPtr p) {
    if (Residency* r = cap_.load(std::memory_order_acquire)) r->prepare_access(p);
    if (planning_) executor_.prepare_access(p);
  }
  // The launch hooks' calls around a forwarded launch. refused: the residency manager refused the
  // launch the tracker just saw (its working set cannot fit the budget); the hook answers
  // out-of-memory instead of forwarding it. launched: it was forwarded.
  // Light observation: the launch hooks only count (Settings::observe_full says when).
  bool light() const { return light_; }
  bool holds_budget() const { return offloading_requested_; }  // OFFLOAD_DEVICE_BUDGET given
  void count_unscanned() { tracker_.counters().unscanned.fetch_add(1, std::memory_order_relaxed); }
  bool refused() { return cap_.load(std::memory_order_relaxed) && Residency::take_refusal(); }
  void launched() {
    if (Residency* r = cap_.load(std::memory_order_relaxed)) r->after_launch();
  }
  CuptiTelemetry& telemetry() { return telemetry_; }
  void mark_read_only(DevPtr p, uint64_t bytes) { executor_.mark_read_only(p, bytes); }
  bool read_only(DevPtr p, uint64_t bytes) { return executor_.read_only(p, bytes); }

  // Drains, joins GPU times and finishes every step that can be: those whose GPU times are
  // in, or all that are cut if `no_wait` (a caller who synchronised the GPU).
  void pump(bool no_wait);
  size_t drain_events();  // the event ring into the assembler, under pump_mu_: how many
  std::string stats_json();
  void stop();
  // From the exit handler: ends the worker and joins it, waiting at most 200 ms.
  void end_at_exit();
  // In a forked child, from the fork handler: closes inherited descriptors and mappings
  // without taking any lock (another thread of the parent may have held one at fork).
  void drop_in_child();

 private:
  void worker();
  void emit(StepTrace& t);
  void write_summary();
  // Under OFFLOAD_TRACE: PREFIX<step>.trace (and its Chrome trace JSON).
  void write_trace(const StepTrace& t, const char* prefix, bool chrome_json);
  std::string stats_json_locked();

  Placed place_capped(uint64_t bytes, Stream s, void** p);
  void forwarded_capped(Residency& r, DevPtr p, uint64_t bytes);  // the allocator served what place_capped forwarded
  // Allocations a CUDA graph capture made (the graph's memory, used at each replay): forwarded,
  // not counted in the pool's share, and their frees forwarded.
  std::mutex graph_mu_;
  std::unordered_set<DevPtr> graph_allocs_;
  std::atomic<bool> any_graph_alloc_{false};
  bool forget_graph_alloc(DevPtr p);
  bool release_capped(Residency& r, DevPtr d, Stream s);
  void start_cap();  // once, at the first allocation: the budget in bytes needs the device
  // A budget with launches but no allocation reaching the shim (PyTorch's own allocator, not
  // routed here): the budget is not held, and the log says so once, with the fix.
  void check_allocations_seen();
  bool said_no_allocations_ = false;
  // The first steps under the cap, one line each; once, where the link is the bound, the
  // estimate of checkpointing the layers instead.
  void log_capped_step(const StepTrace& t, int64_t wall_ns);
  void grow_host_ahead();  // the worker's: the host store grown to its reserve, a chunk at a time
  bool said_checkpointing_ = false;
  // PlanContext: what the plan controller asks of the process.
  HostPool& host_pool() override;  // offloadd's, or this process's own without a daemon
  bool host_pool_ready() override { return private_pool_ || link_.connected(); }
  NodeShare node_share(uint64_t budget, uint32_t gpus_before) override;
  uint64_t launches() override { return tracker_.launches(); }
  uint64_t steps_cut() override { return assembler_.steps_cut(); }
  void drain_while_planning() override { drained_while_planning_ += drain_events(); }
  bool cut_untraced(const StepTrace& t) override {
    return telemetry_.paused() || t.first_launch < resumed_at_launch_;
  }
  void planned_from(const StepTrace& t) override {
    if (!settings_.trace_dir.empty()) write_trace(t, "/planned-", false);
  }
  // The stats' parts, each one value written into `w`.
  void executor_json(JsonWriter& w);
  static void planner_json(JsonWriter& w, const PlanController::Report& p);
  void persistent_json(JsonWriter& w) const;  // null without OFFLOAD_PERSISTENT_MIN

  Settings settings_;
  CudaDriver driver_;
  EventLog log_;
  Tracker tracker_;
  Executor executor_;
  const bool offloading_requested_;      // OFFLOAD_DEVICE_BUDGET given
  const bool light_;                     // OFFLOAD_OBSERVE=light (the default without a budget)
  const bool offloading_;                // and met by a plan of arenas (OFFLOAD_CAP=0)
  // A plan of arenas runs: alone (offloading_) or on top of the cap (OFFLOAD_CAP_PLAN), where
  // the residency manager and the executor both gate launches (gates_) and the executor's
  // handles are made in the manager's room.
  const bool planning_;
  std::unique_ptr<CapAndPlan> gates_;
  // The hard cap (OFFLOAD_CAP, the default with a budget): built at the first allocation.
  std::unique_ptr<ChunkSource> pool_chunks_;  // the store's chunks from offloadd's pool
  std::unique_ptr<PremadeHost> premade_;      // then those faulted in before the first eviction
  bool said_premade_ = false;                 // its first take said (worker)
  std::unique_ptr<HostStore> host_store_;
  std::unique_ptr<Residency> residency_;
  std::atomic<Residency*> cap_{nullptr};
  std::once_flag cap_once_;
  uint64_t cap_context_ = 0;             // the context (device) the budget holds on; 0 unknown
  int cap_device_ = -1;                  // its device ordinal
  std::atomic<bool> other_device_said_{false};
  Residency::Stats last_step_cap_;       // the cap's counters at the last step cut (worker)
  HostStore::Stats last_step_host_;      // the host store's, likewise
  bool said_host_making_ = false;
  // Host memory the worker keeps made ahead for evicted bytes (OFFLOAD_HOST_AHEAD), set once steps
  // are found; 0 until then and when off.
  std::atomic<uint64_t> host_reserve_{0};
  uint64_t capped_steps_logged_ = 0;
  uint64_t logged_through_launch_ = 0;   // the launches run when the last step's line was written
  size_t last_step_launches_ = 0;        // the last step's launches (worker)
  static constexpr uint64_t kCappedStepsLogged = 8;
  static constexpr uint64_t kLaunchesBeforeNoAllocations = 1000;
  std::atomic<bool> refused_said_{false};
  std::unique_ptr<PersistentPool> persistent_;  // OFFLOAD_PERSISTENT_MIN set
  BlockCache cache_;                     // OFFLOAD_BLOCK_CACHE (off: 0 bytes)
  std::string share_note_;               // why offloadd gave no share, said once
  PlanController plan_;                  // a plan of arenas' life (planning_)
  std::atomic<int (*)(Stream)> capture_probe_{nullptr};
  std::atomic<uint64_t (*)()> context_probe_{nullptr};
  int capturing(Stream s) {
    auto probe = capture_probe_.load(std::memory_order_relaxed);
    return probe ? probe(s) : driver_.stream_capturing(s);
  }
  uint64_t context() {
    auto probe = context_probe_.load(std::memory_order_relaxed);
    return probe ? probe() : driver_.current_context();
  }
  void block_cache_json(JsonWriter& w) const;
  bool said_rank_ = false;               // the early Attach of a job's rank was tried
  CuptiTelemetry telemetry_;
  TelemetrySampler sampler_;  // OFFLOAD_TELEMETRY=sampled: when CUPTI traces
  void sample_telemetry();
  uint64_t resumed_at_launch_ = 0;  // tracing last resumed before this launch
  std::mutex pump_mu_;  // one pump at a time (worker or a stats query)
  StepAssembler assembler_;
  std::deque<StepSummary> summaries_;  // under pump_mu_
  uint64_t steps_written_ = 0;
  std::atomic<uint64_t> drained_while_planning_{0};  // events the planner's progress drained
  bool telemetry_started_ = false;
  std::vector<GpuRecord> gpu_;
  void time_steps_with_markers();
  void push_step(uint64_t step, uint64_t step_ns, uint64_t launches);  // telemetry to offloadd
  // At each step cut, before its push: that step's bytes out and host waits (step_telemetry.h).
  void cut_step_telemetry();
  StepTelemetry step_telemetry_;
  DaemonLink link_;
  bool event_timing_ = false;
  std::deque<Tracker::Marker> markers_;
  std::unique_ptr<PrivatePool> private_pool_;  // when no daemon can be reached
  int64_t last_cut_ns_ = 0;
  std::atomic<int64_t> cap_started_ns_{0};  // the first allocation under the cap: where step 0's time starts
  std::atomic<bool> stop_{false};
  std::atomic<bool> worker_done_{false};
  const pid_t owner_pid_ = getpid();
  std::mutex wake_mu_;
  std::condition_variable wake_;
  std::thread thread_;
};

Runtime* runtime();

// The settings the link to offloadd runs with. offloadd's pool holds the bytes a plan of arenas
// moves; the hard cap keeps its own store and observing moves nothing. Then the shim connects to
// a running offloadd (status, telemetry) but starts none (OFFLOAD_DAEMON=auto becomes connect): a
// process that only watches, or runs under the cap, pays for no daemon and no pool.
Settings link_settings(Settings s);

}  // namespace offload

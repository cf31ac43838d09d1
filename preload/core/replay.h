// Replay: drives a recorded step through the same observing pipeline the shim runs on the
// GPU (AllocTable, FuncRegistry, parameter scan, EventLog, StepDetector, StepAssembler), on
// the simulated driver. Used by `offloadctl replay` (the demo on a machine without a GPU)
// and by tests.
//
// Each kernel of the recording becomes a simulated kernel whose parameters are a struct of
// device pointers (interior pointers, as views are) followed by scalars, so the scan must
// find exactly the allocations the recording says the launch touched.
//
// Offload mode (ReplayOptions::offload) adds the acting half, wired as preload/runtime.cpp
// wires it: allocations go through Executor::place first, frees through Executor::release,
// the tracker gates every launch through the executor, and a plan is built from a step that
// repeats the one before (build_plan, the GPU's budget scaled down) and installed. Sizes are
// divided by `size_divisor` so that a 24 GiB step needs about a hundred MiB of host memory.
// Every launch becomes a simulated kernel with a body that, for each allocation the launch
// touches, checks the words the previous toucher wrote (a signature of allocation ordinal,
// step and position) and writes its own: a missing reload (an unmapped range faults; a fresh
// handle reads 0xA5 garbage) or a missing stream wait reads as a mismatch. The simulated GPU
// runs behind the host, in a seeded random order, with copies delayed.
//
// Cap mode (ReplayOptions::cap) routes the allocations, frees and launches through a manager
// above the core (preload/residency/replay_cap.h wires the residency manager in), with the
// same scaling, simulated GPU and content checks; a refusal ends the replay. With
// ReplayOptions::relaunch its kernels can be launched again by the manager.
//
// Single-threaded: everything, the simulated GPU included, runs on the caller's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/executor.h"
#include "planner/step_trace.h"

namespace offload {

class AllocTable;
class SimDriver;

// Cap mode's manager, as the shim's allocation hooks and worker see it.
class ReplayCap {
 public:
  virtual ~ReplayCap() = default;
  // Before the first allocation, on the replay's driver (its granularity set): the launch gate.
  virtual LaunchGate* attach(SimDriver& d, uint64_t granularity, const AllocTable& allocs) = 0;
  // An allocation: its address (*tag for the tracker), 0 for the replay's pool to serve it, or 0
  // with *refused set when the budget cannot hold it.
  virtual DevPtr alloc(uint64_t bytes, Stream s, uint64_t* tag, bool* refused) = 0;
  virtual void pooled(DevPtr p, uint64_t bytes) = 0;  // alloc gave 0: the replay's pool served it at p
  virtual bool free(DevPtr p, Stream s, uint64_t bytes, AllocId id) = 0;  // false: the pool's (counted freed)
  virtual bool refused_launch() = 0;  // the gate refused the launch the tracker just saw
  virtual void after_launch() = 0;    // the launch was forwarded
  virtual void poll() = 0;            // the worker's turn
  virtual void step_seen(size_t launches) = 0;  // the pipeline cut a step of this many launches
  virtual void begin_step() = 0;
  virtual void end_step() = 0;
  virtual void detach() = 0;  // the GPU has finished: let go of everything on the driver
};

struct ReplayOptions {
  int repeats = 6;           // steps to replay
  bool mark_steps = false;   // call mark_step() after each step instead of detecting

  // Offload mode.
  bool offload = false;
  double budget_fraction = 0.5;  // device budget, of the recorded step's peak live bytes
  // Every allocation's bytes / this, rounded up to 8 bytes, at least 64. The VMM granularity,
  // the activation threshold and the member alignment are scaled alike. The time goes into
  // the bytes moved (the simulated driver maps fresh pages at every map); past 512 the 64-byte
  // floor starts to blur the activation threshold.
  uint32_t size_divisor = 256;
  uint64_t seed = 1;             // the simulated GPU's scheduler
  uint32_t gpu_ops_max = 3;      // ops the GPU runs after each launch: 0 to this, at random
  size_t max_queued = 512;       // past this many queued ops the host waits for the GPU
  bool copy_delay = true;        // copies run only when nothing else can (SimDriver)
  Executor::Options exec{};      // fault injection, for the tests that prove a fault is seen
  // The planner: given a replayed step (carrying the recorded GPU times), the options the
  // built-in plan would use at this scale, and the divisor, a plan (empty: *why says why).
  // Unset: the built-in plan.
  std::function<Plan(const StepTrace&, const PlanOptions&, uint32_t divisor, std::string* why)> planner;

  // Cap mode (not with offload): the manager; the scaling, GPU and checks above apply.
  ReplayCap* cap = nullptr;
  // Kernels the driver can launch again (a manager that makes ranges again): each launch's
  // signatures travel in its arguments, and a kernel writes only what it touches first after its
  // birth, or first after fills only (deterministic mode fills each new tensor), reading (checking)
  // the rest, as a recording does not say which launches write in place.
  bool relaunch = false;
};

// One replayed step, offload mode.
struct ReplayOffloadStep {
  bool active = false;  // the executor ran the plan in it
  uint64_t evictions = 0, reloads = 0, misses = 0, late_reloads = 0, abandoned = 0;
  uint64_t footprint_peak = 0;  // live allocations outside arenas + physical handles
  uint64_t device_peak = 0;     // the executor's own reckoning (ExecutorStats::device_peak)
};

struct ReplayOffload {
  uint32_t divisor = 1;          // bytes below are scaled (recording bytes / divisor)
  uint64_t granularity = 0;
  uint64_t host_chunk = 0;       // pinned-chunk size of the host memory given to the executor
  uint64_t recorded_peak = 0;    // the step's peak live bytes, scaled
  uint64_t budget = 0;
  bool installed = false;
  int first_active = -1;         // index of the first step the plan ran in
  std::string plan;              // Plan::describe, or why none was made
  uint64_t predicted_peak = 0, handle_bytes = 0, moved_per_step = 0;
  uint32_t handles = 0, arenas = 0;
  bool meets_budget = false;     // the planner's prediction
  std::vector<ReplayOffloadStep> steps;
  // Steady state: the active steps after the first.
  size_t steady_steps = 0;
  uint64_t steady_misses = 0, steady_footprint = 0, steady_device_peak = 0;
  ExecutorStats stats;           // at the end
  uint64_t vmm_misuses = 0;      // SimDriver API misuses (0 for a correct executor)
  // Content checks.
  uint64_t launches_verified = 0;  // launches that checked at least one allocation
  uint64_t words_checked = 0, mismatches = 0;
  std::string first_mismatch;
};

struct ReplayResult {
  std::vector<StepTrace> steps;  // as the pipeline re-recorded them
  size_t period = 0;             // the detector's period (launches), 0 if it never locked
  size_t matching_steps = 0;     // re-recorded steps equal to the recording (scaled, offloading)
  std::string first_mismatch;    // why the first non-matching steady step differs
  double hook_ns_mean = 0;       // host time of the tracker's launch bookkeeping
  // Offload mode; in cap mode only the scale, the per-step footprint, the VMM misuses and the
  // content checks are filled (the manager reports the rest).
  ReplayOffload offload;
  bool stopped = false;          // cap mode: a refusal ended the replay early
};

ReplayResult replay(const StepTrace& recorded, const ReplayOptions& opt);

// The recording with every allocation's bytes divided as ReplayOptions::size_divisor says.
StepTrace scale_step(const StepTrace& t, uint32_t divisor);
// Live bytes at the step's peak (what build_plan calls plain_peak).
uint64_t peak_live_bytes(const StepTrace& t);

// Equality up to renumbering: per launch, kind, kernel name, stream and the multiset of
// (bytes, born, freed) of the allocations it touched; and the same allocations overall.
bool same_step(const StepTrace& a, const StepTrace& b, std::string* why);

}  // namespace offload

// Tracker: the observing half of the shim.
//
// Hot path (called from hooks, any thread): on_alloc / on_free keep the interval map of
// live allocations; on_kernel scans a launch's parameters against it; every event goes into
// the EventLog with the allocations it touches. None of these allocate (after a kernel's
// first launch), block, or call the driver except to learn a new kernel's layout.
//
// Worker side (one thread): StepAssembler drains the log, finds step boundaries, joins GPU
// times and turns each step into a StepTrace.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/alloc_table.h"
#include "core/event_log.h"
#include "core/executor.h"
#include "core/func_registry.h"
#include "core/launch_args.h"
#include "core/step_detector.h"
#include "planner/step_trace.h"
#include "core/telemetry.h"

namespace offload {

struct TrackerCounters {
  std::atomic<uint64_t> kernels{0}, copies{0}, memsets{0}, graphs{0}, collectives{0};
  std::atomic<uint64_t> allocs{0}, frees{0}, unknown_frees{0}, opaque_kernels{0};
  std::atomic<uint64_t> hook_cycles{0}, hooked{0};  // host time in our launch bookkeeping
  std::atomic<uint64_t> unscanned{0};  // launches only counted (OFFLOAD_OBSERVE=light)
  double hook_ns_mean() const;
};

// Nanoseconds per TSC cycle, calibrated once (20 ms) on first use.
double ns_per_tsc_cycle();

class Tracker {
 public:
  Tracker(Driver& driver, EventLog& log);

  // `tag`: non-zero for an arena member (Executor::place's tag): its id says which arena.
  void on_alloc(DevPtr p, uint64_t bytes, Stream s, uint64_t tag = 0);
  void on_free(DevPtr p, Stream s);
  // Each returns the launch's sequence number (0 if the event was dropped).
  // `params`: the kernelParams array (may be null); `extra`: the extra array (may be null).
  // `geom`: the launch's grid, block and shared memory, when the hook has them (plain launches):
  // the gate may then launch it again (LaunchArgs).
  uint64_t on_kernel(Func f, Stream s, void** params, void** extra, const LaunchGeom* geom = nullptr);
  // `host_src`: the source of a host-to-device copy. A small one is scanned for pointers into
  // arenas: the copy writes a pointer table, and launches reading it touch what it points to.
  uint64_t on_copy(DevPtr dst, DevPtr src, uint64_t bytes, Stream s, const void* host_src = nullptr);
  static constexpr uint64_t kMaxTableBytes = 4096;
  uint64_t on_memset(DevPtr dst, uint64_t bytes, Stream s);
  // A batch of `count` copies on `s` (cuMemcpyBatchAsync): `dsts` and `srcs` are arrays of
  // `count` 8-byte addresses each, `bytes` the batch's sum. One launch touching all of them; past
  // kMaxAccesses allocations it is marked truncated, and the gate treats it as one it cannot see into.
  uint64_t on_copies(const void* dsts, const void* srcs, size_t count, uint64_t bytes, Stream s);
  // An NCCL collective (or send/recv) on `s`, reading `send` and writing `recv` (either may be
  // 0). Recorded as a copy: a stream-ordered data movement touching both buffers.
  uint64_t on_collective(DevPtr send, DevPtr recv, uint64_t bytes, Stream s);
  uint64_t on_graph(Stream s);
  void mark_step();

  // Step-boundary markers, for timing steps with CUDA events when CUPTI's records are not
  // to be had. The worker arms the launch number at which the next step starts; the hook
  // making that launch records a marker on its stream first. With marks_record set,
  // mark_step() records one on the legacy stream instead.
  struct Marker {
    uint64_t launch_no = 0;  // the first launch of the step it starts
    uint64_t handle = 0;
  };
  void arm_marker(uint64_t launch_no) { marker_at_.store(launch_no, std::memory_order_relaxed); }
  void set_marks_record(bool on) { marks_record_.store(on, std::memory_order_relaxed); }
  bool take_marker(Marker* m);
  uint64_t launches() const { return launches_.load(std::memory_order_relaxed); }

  // The executor, told of every launch (with what it touches) before it is forwarded.
  void set_gate(LaunchGate* g) { gate_.store(g, std::memory_order_release); }
  LaunchGate* current_gate() const { return gate_.load(std::memory_order_acquire); }
  // The gate sees each plain launch's arguments and geometry (current_launch_args) while it looks
  // at it: only a gate that launches kernels again wants them (Residency::Options::recompute).
  void set_pass_launch_args(bool on) { pass_args_.store(on, std::memory_order_relaxed); }
  // OFFLOAD_TRACE_LEAD: a clock on the GPU records' time base (CUPTI's), read as each kernel is
  // forwarded, so that a trace can say how long before its start the host handed it over.
  using Clock = uint64_t (*)();
  void set_lead_clock(Clock c) { lead_clock_.store(c, std::memory_order_release); }

  const AllocTable& allocs() const { return table_; }
  // Light observation (before the first allocation): no launch is scanned, so allocations are
  // kept by base alone (AllocTable's exact mode) and give the step assembler no events; their
  // counts and the footprint stay.
  void set_light() {
    table_.set_exact(true);
    light_ = true;
  }
  FuncRegistry& funcs() { return funcs_; }
  TrackerCounters& counters() { return counters_; }

  static constexpr uint32_t kMaxAccesses = 1024;

 private:
  uint64_t publish(Event e, const AllocId* acc, uint32_t n);
  uint64_t on_transfer(EventKind kind, DevPtr dst, DevPtr src, uint64_t bytes, Stream s, const void* host_src,
                       std::atomic<uint64_t>* counter = nullptr);
  uint64_t count_launch(Stream s);  // returns the launch's number
  void gate(uint64_t n, EventKind kind, uint32_t kernel, Stream s, const AllocId* acc, size_t count, uint8_t flags) {
    if (LaunchGate* g = gate_.load(std::memory_order_acquire)) g->before_launch(n, kind, kernel, s, acc, count, flags);
  }
  void put_marker(uint64_t launch_no, uint64_t handle);

  Driver& driver_;
  std::atomic<uint64_t> launches_{0};
  std::atomic<uint64_t> marker_at_{~uint64_t{0}};
  std::atomic<bool> marks_record_{false};
  std::atomic<uint64_t> marker_launch_{0}, marker_handle_{0};
  AllocTable table_;
  bool light_ = false;
  FuncRegistry funcs_;
  EventLog& log_;
  std::atomic<AllocId> next_id_{1};
  std::atomic<LaunchGate*> gate_{nullptr};
  std::atomic<bool> pass_args_{false};
  std::atomic<Clock> lead_clock_{nullptr};
  TrackerCounters counters_;
};

struct StepSummary {
  uint64_t step = 0;
  uint64_t first_launch = 0;
  int64_t gpu_step_ns = -1;  // from step-boundary markers (when CUPTI's records are not to be had)
  size_t launches = 0, kernels = 0, allocs_born = 0;
  int64_t cupti_kernels = -1, gpu_busy_ns = -1;
  size_t activations = 0, activations_unaccessed = 0;
};

class StepAssembler {
 public:
  struct Options {
    StepDetector::Options detector{};
    int64_t telemetry_wait_ns = 3'000'000'000;  // give up waiting for GPU times after this
    int64_t telemetry_settle_ns = 100'000'000;  // once the counts match, wait this long
    size_t max_pending_events = 4u << 20;      // without boundaries, drop history past this
  };
  StepAssembler(const FuncRegistry& funcs, Options o);

  void consume(const Event& e, const AllocId* acc);
  void add_gpu_records(std::vector<GpuRecord>& recs);
  // Steps whose GPU times have arrived or that waited long enough; every cut step if
  // `no_wait`; and, if `final`, the unfinished step too.
  std::vector<StepTrace> take_ready(int64_t now_ns, bool final, bool no_wait = false);

  // GPU records exist only for launches from `seq` on (telemetry started then).
  void gpu_times_from(uint64_t seq) { gpu_from_seq_ = seq; }
  // Records stopped coming (another CUPTI client took them): steps not finished yet may
  // have only part of theirs, so none of them, and no later step, is counted or timed.
  void telemetry_lost();

  const StepDetector& detector() const { return detector_; }
  bool marked() const { return marked_; }
  uint64_t steps_cut() const { return next_step_; }

 private:
  struct Pending {
    Event e;
    size_t acc_begin;
  };
  struct Live {
    uint64_t bytes;
    Stream stream;
    DevPtr base;
  };
  struct Cut {
    StepTrace trace;
    std::vector<uint64_t> seqs;  // launch seq per position
    bool timed = false;           // every launch of the step came after telemetry started
    uint64_t kernels_through = 0; // timed kernel launches up to the end of this step
    int64_t cut_ns = 0;
  };
  void cut_at(size_t n_events, int64_t now_ns);
  void finish(Cut& c);
  void take_transfers(StepTrace& t, uint64_t t0, uint64_t end);  // finish's: the step's copies

  const FuncRegistry& funcs_;
  Options opt_;
  StepDetector detector_;
  std::vector<Pending> pending_;
  std::vector<AllocId> pending_acc_;
  std::vector<uint64_t> pending_launch_no_;  // launch number of each pending launch event
  uint64_t launch_no_ = 0;
  std::unordered_map<AllocId, Live> live_;  // live at the start of the pending window
  bool marked_ = false;
  uint64_t next_step_ = 0;
  int64_t now_ns_ = 0;
  std::deque<Cut> cuts_;
  uint64_t name_hash_of(uint32_t func);
  std::unordered_map<uint32_t, uint64_t> name_hashes_;
  std::unordered_set<uint64_t> known_names_;  // name hashes of kernels we have launched
  std::vector<GpuRecord> records_;   // kernel records not yet aligned
  uint64_t records_in_ = 0;          // kernel records received
  uint64_t aligned_corr_ = 0;        // records up to here belong to finished steps
  // Copy records not yet given to a step (by arrival; at most kMaxCopies kept), and the end of
  // the last timed step's kernels: a copy that starts before it came too late for its step.
  std::vector<GpuRecord> copies_;
  static constexpr size_t kMaxCopies = size_t{1} << 18;
  uint64_t transfers_from_ = 0;
  uint64_t timed_kernels_ = 0;       // our kernel launches since telemetry started
  uint64_t gpu_from_seq_ = ~uint64_t{0};
};

}  // namespace offload

// StepTrace: what one training step did, in the terms the planner needs: which
// allocations it made and freed, which launches touched which allocations, and how long
// each launch ran on the GPU. Written and read in the format of protocol/offload/trace_format.h.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "planner/types.h"

namespace offload {

struct TraceAlloc {
  uint32_t ordinal = 0;
  uint64_t bytes = 0;
  Stream stream = 0;
  int64_t alloc_pos = -1;  // launch position it was born before; -1: before the step
  int64_t free_pos = -1;   // launch position it was freed before; -1: outlives the step
  // Where it lives and the tracker's id for it, in the process that traced it (not written:
  // a trace read from a file has 0).
  DevPtr base = 0;
  uint64_t id = 0;
  // Born before the step and outliving it, at least `min_bytes`: a weight, or optimizer state
  // (what OFFLOAD_PERSISTENT_MIN serves from the shim's own ranges).
  bool persistent(uint64_t min_bytes) const { return alloc_pos < 0 && free_pos < 0 && bytes >= min_bytes; }
};

struct TraceLaunch {
  uint32_t pos = 0;
  EventKind kind = EventKind::Kernel;
  uint32_t kernel = 0;        // kernel id (kernels only)
  Stream stream = 0;
  int64_t gpu_start_ns = -1;  // from the step's first GPU start; -1: not measured
  int64_t gpu_ns = -1;
  std::vector<uint32_t> allocs;  // ordinals touched
  // OFFLOAD_TRACE_LEAD: its GPU start less the moment the host forwarded it. Small: the GPU
  // had nothing else queued and waited for the host; large: the launch waited in the queue.
  std::optional<int64_t> lead_ns;
  uint64_t host_ns = 0;  // when it was forwarded, on the GPU records' clock (not written)
};

// A copy the GPU ran during the step, whoever issued it (the application's, the shim's own
// reloads and evictions): CUPTI's memcpy records, with OFFLOAD_TRACE and telemetry on. From
// them a reader sees when the link was busy beside each kernel.
struct TraceTransfer {
  int64_t gpu_start_ns = 0;  // from the step's first kernel start (negative: before it)
  int64_t gpu_ns = 0;
  uint64_t bytes = 0;
  uint8_t copy_kind = 0;     // GpuRecord::copy_kind: 1 host to device, 2 device to host, ...
};

struct StepTrace {
  uint64_t step = 0;
  uint64_t first_launch = 0;  // the process's launch number of position 0 (not written)
  std::map<uint32_t, std::string> kernels;  // kernel id -> name
  std::vector<TraceAlloc> allocs;           // by ordinal
  std::vector<TraceLaunch> launches;        // by position
  std::vector<TraceTransfer> transfers;     // by start (1.2)
  int64_t gpu_busy_ns = -1;                 // union of kernel intervals; -1: not measured
  int64_t cupti_kernels = -1;               // CUPTI kernel records in the step; -1: none
  // The step's time zero (its first kernel start) on the GPU records' clock (not written).
  int64_t gpu_origin_ns = -1;
  // The same instant as Unix time in ns (1.3): a trace then lines up with another profiler's.
  std::optional<int64_t> base_unix_ns;

  size_t kernel_launches() const;

  void write(std::ostream& os) const;
  // Parses one step; on error returns false and says why in *error.
  static bool read(std::istream& is, StepTrace* out, std::string* error);
  // One step as Chrome/Perfetto trace-event JSON (write_chrome_trace of this step alone).
  void write_chrome_json(std::ostream& os) const;
};

// Steps as one Chrome/Perfetto trace-event JSON: kernels per stream (integer thread ids,
// each named) under their demangled names, the copies per direction, a span per step, and a
// counter of the tracked allocations' live bytes. Steps with a Unix base time are placed by
// it, and the trace's baseTimeNanoseconds is the first one's, as torch.profiler writes it;
// steps without one follow each other. Untimed launches are left out.
void write_chrome_trace(const std::vector<StepTrace>& steps, std::ostream& os);

// A kernel's symbol as a person reads it ("void at::native::foo<float>(int)"); the symbol
// itself when it is not a mangled C++ name.
std::string demangle(const std::string& symbol);

// Activations, as seen from the trace alone: allocations of at least `min_bytes` born in the
// step before its turn from the forward to the backward and freed after the first launch that
// follows it (saved in the forward, released in the backward; what dies at the turnaround itself
// is a forward temporary the loss function held). The turn is the peak of live bytes, or the
// first birth of an allocation of at least `min_bytes` that outlives the step (a weight's
// gradient) where that comes earlier: under activation checkpointing the peak lies late in the
// backward, where the recomputed segments and the gradients meet. Smaller ones are counted
// apart: a few bytes of RNG state that SDPA saves and never reads again when dropout is off are
// not offload candidates.
struct ActivationReport {
  int64_t peak_pos = -1;
  uint64_t peak_bytes = 0;
  int64_t turn_pos = -1;  // the turn from the forward to the backward (above)
  size_t activations = 0;
  uint64_t activation_bytes = 0;
  std::vector<uint32_t> without_backward_access;  // ordinals never touched after the turn
  size_t small = 0, small_without_backward_access = 0;  // those under min_bytes
};
inline constexpr uint64_t kActivationMinBytes = 64 * 1024;
// The turn from the forward to the backward (ActivationReport above): `peak_pos`, or the first
// birth of an allocation of at least `min_bytes` that outlives the step where that comes earlier.
int64_t turn_position(const StepTrace& t, int64_t peak_pos, uint64_t min_bytes);
ActivationReport analyse_activations(const StepTrace& t, uint64_t min_bytes = kActivationMinBytes);

}  // namespace offload

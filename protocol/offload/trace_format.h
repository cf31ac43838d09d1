// The per-step trace file format (OFFLOAD_TRACE=DIR writes one file per step).
//
// A line-oriented text format, so that a person can read it and diff two steps:
//
//   offload-trace <major>.<minor>
//   step <index> launches <n> allocs <n> kernels <n> gpu_busy_ns <ns> cupti_kernels <n>
//   base <unix_ns>                                              (1.3; optional)
//   kernel <kernel-id> <name>                                  (one per distinct kernel)
//   alloc <ordinal> <bytes> <stream> <alloc_pos> <free_pos>    (alloc_pos -1: born before the
//                                                              step; free_pos -1: outlives it)
//   launch <pos> <kind> <kernel-id> <stream> <gpu_start_ns> <gpu_ns> <n> <alloc-ordinal>...
//          [lead <ns>]                                          (1.1; OFFLOAD_TRACE_LEAD=1)
//   transfer <gpu_start_ns> <gpu_ns> <bytes> <direction>        (1.2; zero or more, by start)
//   end
//
// Positions count launch-like events (kernels, copies, memsets, graph launches) from 0 at
// the start of the step; an allocation at position p happened before launch p. Ordinals
// number allocations in the order they were born in the step, after those born before it
// (sorted by address). <kind> is one of: K kernel, C copy, M memset, G graph launch.
// Streams are the process's own handle values, printed in hex; 0 is the legacy stream.
// GPU times come from CUPTI; gpu_start_ns counts from the step's first kernel start;
// -1 means not measured. A kernel name is the rest of its line. A kernel's lead (from 1.1) is
// its GPU start less the moment the shim forwarded it to the driver, both on CUPTI's clock:
// how long it waited queued. Near zero, the GPU had run out of work and waited for the host.
//
// A transfer (from 1.2) is a copy the GPU ran in the step's span, whoever issued it: the
// application's copies and the shim's own reloads and evictions alike, with CUPTI on. It
// belongs to the step whose last kernel ends after it starts; its start counts from the step's
// first kernel start and may be negative (a copy in the gap before it). <direction> is h2d,
// d2h, d2d or other.
//
// The base (from 1.3) is the step's time zero as Unix time in nanoseconds, when the shim could
// relate the GPU records' clock to the host's: a reader lays the step over another profiler's
// trace with it (torch.profiler's trace carries its own as baseTimeNanoseconds).
//
// Readers reject another major version; a reader of minor m reads files of minor <= m.
#pragma once

#include <cstdint>

namespace offload::trace_format {
inline constexpr const char* kMagic = "offload-trace";
inline constexpr uint32_t kMajor = 1;
inline constexpr uint32_t kMinor = 3;
}  // namespace offload::trace_format

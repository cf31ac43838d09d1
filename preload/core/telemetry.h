// GPU-time telemetry as the core sees it: records of the kernels that ran on the GPU, with
// the driver's correlation id (handed out in API-call order, across threads) and a hash of
// the kernel's name. The StepAssembler joins them to our launches by aligning the two
// sequences by name: every launch we saw has a record; a record we cannot align is a launch
// we did not see. (CUPTI's external correlation ids cannot do this: they attach to the
// outermost API call, the runtime's cudaLaunchKernel, which starts before our driver hook.)
// Production: preload/cupti_telemetry.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/hash.h"  // name_hash, the hash both sides use for kernel names
#include "core/event_log.h"

namespace offload {

struct GpuRecord {
  EventKind kind = EventKind::Kernel;  // Kernel, Copy or Memset
  uint64_t name_hash = 0;  // kernels: name_hash() of the kernel's (mangled) name
  uint64_t corr = 0;       // the driver's correlation id (API call order)
  uint64_t start_ns = 0, end_ns = 0;
  // Copies: the bytes moved and which way (CUPTI's memcpy kind; 1 host to device, 2 device to
  // host, 8 device to device, others as CUPTI numbers them).
  uint64_t bytes = 0;
  uint8_t copy_kind = 0;
};

class Telemetry {
 public:
  virtual ~Telemetry() = default;
  // Appends the records delivered so far to `out`. `force` also asks for records still in
  // partly filled buffers: those of kernels not yet finished then come without times
  // (start_ns == 0), so only a caller who synchronised the GPU should force.
  virtual void collect(std::vector<GpuRecord>* out, bool force) = 0;
  // "cupti", or why GPU times are missing or degraded.
  virtual std::string state() const = 0;
};

}  // namespace offload

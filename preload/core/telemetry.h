// GPU-time telemetry as the core sees it: records of what ran on the GPU, each joined to
// our launch sequence number (the CUPTI external correlation id), or 0 when the launch
// did not pass through our hooks. Production: preload/cupti_telemetry.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/event_log.h"

namespace offload {

struct GpuRecord {
  EventKind kind = EventKind::Kernel;  // Kernel, Copy or Memset
  uint64_t seq = 0;   // our launch sequence number; 0: not launched through our hooks
  uint64_t corr = 0;  // the driver's correlation id (API call order)
  uint64_t start_ns = 0, end_ns = 0;
};

class Telemetry {
 public:
  virtual ~Telemetry() = default;
  // Flushes what the GPU has finished and appends it to `out`.
  virtual void collect(std::vector<GpuRecord>* out) = 0;
  // "cupti", or why GPU times are missing or degraded.
  virtual std::string state() const = 0;
};

}  // namespace offload

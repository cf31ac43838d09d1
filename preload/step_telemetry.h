// The telemetry a process pushes to offloadd after each step (offloadctl status's columns and
// the per-client metrics): what moving its data cost in that step. The totals come from the
// residency manager under the hard cap, from the executor when a plan of arenas runs.
#pragma once

#include <cstdint>

#include "offload/protocol.h"
#include "residency/residency.h"

namespace offload {

struct MoveTotals {
  uint64_t bytes_out = 0;  // copied out to host memory, so far
  uint64_t wait_ns = 0;    // the host's time waiting for a copy or a free before it could go on, so far
  uint64_t misses = 0;     // demand reloads so far: launches that found data not resident
};

MoveTotals move_totals(const Residency::Stats& s);

class StepTelemetry {
 public:
  // At a step's end, with the totals then: that step's share is what make() reports next.
  void cut(const MoveTotals& now);
  // evicted_bytes: bytes copied out in the last step cut; exposed_stall_ns: the host's waits in
  // it; misses: so far (a counter).
  proto::Telemetry make(uint64_t step, uint64_t step_ns, uint64_t launches, uint64_t resident_bytes) const;

 private:
  MoveTotals last_, step_;
};

}  // namespace offload

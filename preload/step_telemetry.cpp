#include "step_telemetry.h"

namespace offload {

MoveTotals move_totals(const Residency::Stats& s) { return {s.bytes_out, s.wait_ns, s.reloads}; }

void StepTelemetry::cut(const MoveTotals& now) {
  // Totals only grow; a source that started over (a new plan's executor) counts from zero.
  auto since = [](uint64_t now, uint64_t last) { return now >= last ? now - last : now; };
  step_ = {since(now.bytes_out, last_.bytes_out), since(now.wait_ns, last_.wait_ns), now.misses};
  last_ = now;
}

proto::Telemetry StepTelemetry::make(uint64_t step, uint64_t step_ns, uint64_t launches,
                                     uint64_t resident_bytes) const {
  proto::Telemetry t{};
  t.step = step;
  t.step_ns = step_ns;
  t.launches = launches;
  t.resident_bytes = resident_bytes;
  t.evicted_bytes = step_.bytes_out;
  t.exposed_stall_ns = step_.wait_ns;
  t.misses = step_.misses;
  return t;
}

}  // namespace offload

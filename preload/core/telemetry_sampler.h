// TelemetrySampler: which steps CUPTI traces under OFFLOAD_TELEMETRY=sampled.
//
// Kernel tracing costs GPU time on every kernel (docs/results.md: +0.5% on the
// reference workload, +29% on a launch-bound one). Planning needs a traced step, and a running
// plan needs traced steps to be watched (three slow ones in a row revise it); between those,
// tracing buys nothing. So: traced whenever no plan runs (planning, or planning again after a
// deviation); once a plan runs, traced for `watch` more steps, then paused for `rest` steps,
// then traced for `watch` steps again, and so on. A miss (a reload that came late, or a weight
// touched while out) ends a pause at once and starts a new `watch` stretch: the plan's watch
// then sees the slow steps and may revise the plan. Pure: the runtime does the switching.
#pragma once

#include <cstdint>

namespace offload {

class TelemetrySampler {
 public:
  struct Options {
    uint64_t watch = 4;  // steps traced in a row (the first may be traced in part)
    uint64_t rest = 60;  // steps paused between them (4 traced in every 64)
  };
  enum class Action { None, Pause, Resume };

  TelemetrySampler() = default;
  explicit TelemetrySampler(Options o) : o_(o) {}
  // Called as steps are cut: `steps` cut so far, whether a plan runs (installed, not deviated),
  // whether tracing is paused now, and the plan's misses so far (any count that only grows).
  // What to switch, if anything.
  Action next(uint64_t steps, bool plan_running, bool paused, uint64_t misses = 0);

 private:
  Options o_;
  bool counting_ = false;  // a traced stretch with a plan running has begun
  uint64_t since_ = 0;     // at this many steps cut
  uint64_t resume_at_ = 0;
  uint64_t misses_ = 0;    // as last seen
};

inline TelemetrySampler::Action TelemetrySampler::next(uint64_t steps, bool plan_running, bool paused,
                                                      uint64_t misses) {
  const bool missed = misses > misses_;
  misses_ = misses;
  if (missed && plan_running) {  // a new stretch from here: resumed if paused
    counting_ = true;
    since_ = steps;
    return paused ? Action::Resume : Action::None;
  }
  if (!plan_running) {
    counting_ = false;
    return paused ? Action::Resume : Action::None;
  }
  if (paused) {
    if (steps < resume_at_) return Action::None;
    counting_ = true;
    since_ = steps;
    return Action::Resume;
  }
  if (!counting_) {
    counting_ = true;
    since_ = steps;
    return Action::None;
  }
  if (steps < since_ + o_.watch) return Action::None;
  counting_ = false;
  resume_at_ = steps + o_.rest;
  return Action::Pause;
}

}  // namespace offload

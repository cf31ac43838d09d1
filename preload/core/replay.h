// Replay: drives a recorded step through the same observing pipeline the shim runs on the
// GPU (AllocTable, FuncRegistry, parameter scan, EventLog, StepDetector, StepAssembler), on
// the simulated driver. Used by `offloadctl replay` (the main job on a machine without a
// GPU) and by tests.
//
// Each kernel of the recording becomes a simulated kernel whose parameters are a struct of
// device pointers (interior pointers, as views are) followed by scalars, so the scan must
// find exactly the allocations the recording says the launch touched.
#pragma once

#include <string>
#include <vector>

#include "core/step_trace.h"

namespace offload {

struct ReplayOptions {
  int repeats = 6;           // steps to replay
  bool mark_steps = false;   // call mark_step() after each step instead of detecting
};

struct ReplayResult {
  std::vector<StepTrace> steps;  // as the pipeline re-recorded them
  size_t period = 0;             // the detector's period (launches), 0 if it never locked
  size_t matching_steps = 0;     // re-recorded steps equal to the recording
  std::string first_mismatch;    // why the first non-matching steady step differs
  double hook_ns_mean = 0;       // host time of the tracker's launch bookkeeping
};

ReplayResult replay(const StepTrace& recorded, const ReplayOptions& opt);

// Equality up to renumbering: per launch, kind, kernel name, stream and the multiset of
// (bytes, born, freed) of the allocations it touched; and the same allocations overall.
bool same_step(const StepTrace& a, const StepTrace& b, std::string* why);

}  // namespace offload

// offloadctl's commands that read a recorded step (trace show/check, replay, plan).
#pragma once

#include <string>

#include "planner/step_trace.h"

namespace offload {

// Reads one step from `path`; on failure says why on stderr ("offloadctl: ...") and
// returns false.
bool load_step_trace(const std::string& path, StepTrace* t);

}  // namespace offload

// offloadctl's commands that read a recorded step (trace show/check, replay, plan).
#pragma once

#include <cstdint>
#include <string>

#include "planner/step_trace.h"

namespace offload {

// Reads one step from `path`; on failure says why on stderr ("offloadctl: ...") and
// returns false.
bool load_step_trace(const std::string& path, StepTrace* t);

// Figures as the commands print them.
inline double gib(uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024 * 1024); }
inline double mib(uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024); }
inline unsigned long long ull(uint64_t v) { return static_cast<unsigned long long>(v); }

}  // namespace offload

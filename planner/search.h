// Internals shared by planner.cpp, simulate.cpp and search.cpp: not part of the planner's interface.
#pragma once

#include <cstdint>
#include <limits>

#include "planner/plan.h"
#include "planner/planner.h"

namespace offload::planner_detail {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
int64_t copy_ns(uint64_t bytes, double bytes_per_ns);  // rounded up

// The search behind plan_step, on the candidates `strict` allows; fills r.
void plan_with(const StepTrace& t, const PlannerOptions& o, const GpuTimeline& g, const StepFacts& f, bool strict,
               PlannerResult& r);

}  // namespace offload::planner_detail

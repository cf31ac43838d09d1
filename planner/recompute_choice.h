// Keep, move or make again: of the activations a plan of arenas moves, which a kernel could make
// again instead, in GPU time against the link's. A pure estimate from the traced step, for
// `offloadctl plan` and its tests; under the cap the residency manager decides online by the
// same rules as far as a trace can tell them (residency/recompute.cpp), and more strictly: it
// also knows which launches write in place, which a trace does not.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/planner.h"
#include "planner/step_trace.h"

namespace offload {

// A kernel whose name says it draws random numbers: made again, it would draw new ones (or, with
// its generator's state in its arguments, the same ones in a step that expects new ones).
bool kernel_draws_random(const std::string& name);

struct RecomputeChoice {
  uint32_t ordinal = 0;     // the activation
  uint32_t producer = 0;    // the launch that made it
  int64_t producer_ns = 0;  // its GPU time
  int64_t copy_ns = 0;      // the link's, out and back
};

struct RecomputeEstimate {
  size_t kept = 0, moved = 0, remade = 0;       // activations: resident, moved, made again
  uint64_t moved_bytes = 0, remade_bytes = 0;   // (moved_bytes: what still moves)
  int64_t link_ns_saved = 0;  // one way, the remade bytes at the slower direction's rate
  int64_t gpu_ns_added = 0;   // the producers' GPU time, run again
  int64_t step_ns = 0;        // the plan's predicted step with them made again (an estimate)
  std::vector<RecomputeChoice> remade_list;
};

// For the plan in `r` (planned from `t`): an activation the plan moves is made again instead when
// the launch that first touched it is a kernel not named for random numbers, made no other new
// allocation, read at least one allocation (a launch reading nothing is a fill that later launches
// add into), every allocation it read is alive at the activation's first use in the backward, and
// its GPU time is under the activation's copy one way. The step: the plan's compute with the
// producers' time added, plus what of its exposed copy time the saved bytes do not take off.
RecomputeEstimate choose_recompute(const StepTrace& t, const PlannerResult& r, const LinkModel& link = {});

// Its lines, for checked-in expected files.
std::string serialize(const RecomputeEstimate& e);

}  // namespace offload

// TelemetrySampler: CUPTI traces whenever no plan runs, and a running plan's steps in
// stretches of `watch` between pauses of `rest`.
#include "core/telemetry_sampler.h"

#include <gtest/gtest.h>

#include <string>

namespace offload {
namespace {

using Action = TelemetrySampler::Action;

// Drives the sampler as the runtime does (one call per step cut) and keeps the pause state;
// returns the steps traced, as a string of 'T' (traced) and '.' (paused), one per step.
struct Drive {
  TelemetrySampler s;
  bool paused = false;
  uint64_t steps = 0;
  int pauses = 0, resumes = 0;
  uint64_t misses = 0;
  std::string run(uint64_t n, bool plan_running) {
    std::string out;
    for (uint64_t i = 0; i < n; ++i) {
      ++steps;
      switch (s.next(steps, plan_running, paused, misses)) {
        case Action::Pause:
          EXPECT_FALSE(paused) << "paused twice";
          paused = true;
          ++pauses;
          break;
        case Action::Resume:
          EXPECT_TRUE(paused) << "resumed while tracing";
          paused = false;
          ++resumes;
          break;
        case Action::None:
          break;
      }
      out += paused ? '.' : 'T';
    }
    return out;
  }
};

TEST(TelemetrySampler, TracesUntilAPlanRunsThenWatchesInStretches) {
  Drive d{TelemetrySampler({.watch = 3, .rest = 5})};
  EXPECT_EQ(d.run(6, false), "TTTTTT") << "no plan: every step traced (the planner needs one)";
  EXPECT_EQ(d.pauses, 0);
  // A plan runs: `watch` traced steps, `rest` paused, and again.
  EXPECT_EQ(d.run(20, true), "TTT.....TTT.....TTT.");
  EXPECT_EQ(d.pauses, 3);
  EXPECT_EQ(d.resumes, 2);
}

TEST(TelemetrySampler, ResumesAtOnceWhenThePlanStopsRunning) {
  Drive d{TelemetrySampler({.watch = 2, .rest = 50})};
  d.run(3, false);
  EXPECT_EQ(d.run(4, true), "TT..");
  ASSERT_TRUE(d.paused);
  // A deviation (or a revision): the plan is not running; tracing comes back at the next step,
  // and stays while no plan runs.
  EXPECT_EQ(d.run(3, false), "TTT");
  EXPECT_EQ(d.resumes, 1);
  // Planned again: a full `watch` stretch before the next pause.
  EXPECT_EQ(d.run(4, true), "TT..");
}

// A miss while paused: traced again at once, for a full stretch (the watch sees the slow
// steps); a miss while traced lengthens the stretch.
TEST(TelemetrySampler, AMissEndsAPauseAndStartsAStretch) {
  Drive d{TelemetrySampler({.watch = 3, .rest = 50})};
  d.run(2, false);
  EXPECT_EQ(d.run(5, true), "TTT..");
  d.misses = 1;
  EXPECT_EQ(d.run(5, true), "TTT..") << "resumed at the miss, paused after a stretch";
  EXPECT_EQ(d.resumes, 1);
  EXPECT_EQ(d.run(1, true), ".") << "the same count again is no news";
  d.run(48, true);
  ASSERT_FALSE(d.paused) << "the rest is over";
  EXPECT_EQ(d.run(1, true), "T");
  d.misses = 3;
  EXPECT_EQ(d.run(4, true), "TTT.") << "a miss while traced starts the stretch again";
}

TEST(TelemetrySampler, NothingToDoWithoutAPlanAndNotPaused) {
  TelemetrySampler s;
  for (uint64_t i = 1; i < 100; ++i) EXPECT_EQ(s.next(i, false, false), Action::None);
}

}  // namespace
}  // namespace offload

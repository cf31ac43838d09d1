// The residency manager (the hard cap) on the steps recorded on the H200 (tests/data/traces/),
// replayed on the simulated driver with every launch checking the data the previous toucher of
// each allocation left: the budget holds at every instant, bytes really move, and none is lost.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <sys/wait.h>

#include "planner/step_trace.h"
#include "residency/replay_cap.h"
#include "sanitizers.h"

namespace offload {
namespace {

// Sizes / 1024 keep each trace's replay to a few seconds in a Debug build (the time goes into
// the bytes mapped and copied); four steps give the period (two equal steps) and two more.
#if defined(OFFLOAD_TEST_TSAN) || defined(OFFLOAD_TEST_ASAN)
constexpr int kRepeats = 3;
#else
constexpr int kRepeats = 4;
#endif
constexpr uint32_t kDivisor = 1024;

StepTrace load(const std::string& name) {
  std::filesystem::path p = std::filesystem::path(OFFLOAD_TRACES_DIR) / (name + ".trace");
  std::ifstream is(p);
  StepTrace t;
  std::string err;
  EXPECT_TRUE(is.good()) << "cannot open " << p;
  EXPECT_TRUE(StepTrace::read(is, &t, &err)) << p << ": " << err;
  return t;
}

CapReplayOptions options(double fraction, int repeats = kRepeats) {
  CapReplayOptions o;
  o.repeats = repeats;
  o.budget_fraction = fraction;
  o.size_divisor = kDivisor;
  return o;
}

void expect_clean(const std::string& name, int repeats = kRepeats) {
  const CapReplay c = replay_under_cap(load(name), options(0.5, repeats));
  EXPECT_TRUE(c.refusal.empty()) << c.refusal;
  EXPECT_EQ(c.steps.size(), static_cast<size_t>(repeats));
  EXPECT_GT(c.launches_verified, 0u);
  EXPECT_EQ(c.mismatches, 0u) << c.first_mismatch;
  EXPECT_EQ(c.vmm_misuses, 0u);
  EXPECT_LE(c.stats.held_peak, c.budget);
  EXPECT_LE(c.stats.footprint_peak, c.budget);
  EXPECT_LE(c.physical_peak, c.budget);
  EXPECT_GT(c.stats.evictions, 0u) << "the cap moved nothing";
  EXPECT_GT(c.stats.reloads + c.stats.prefetches, 0u) << "nothing came back";
  EXPECT_GT(c.stats.period, 0u) << "two equal steps give the period";
  EXPECT_TRUE(c.ok());
}

TEST(ReplayCap, ReferenceAtHalfThePeak) { expect_clean("reference"); }
TEST(ReplayCap, ConvnetAtHalfThePeak) { expect_clean("convnet"); }
TEST(ReplayCap, LlamaCompiledAtHalfThePeak) { expect_clean("llama-compiled"); }
TEST(ReplayCap, LoraAtHalfThePeak) { expect_clean("lora", 3); }  // four times the launches of the others

// The checks are real: when an eviction unmaps a range without waiting for the launches that
// use it, a launch reads a range already gone (the simulated driver faults on it) or what a
// later owner of its handles wrote. Every seed tried (1-5) failed on these two recordings.
TEST(ReplayCap, AMissingEvictionWaitIsSeen) {
  for (const char* name : {"convnet", "llama-compiled"}) {
    const StepTrace rec = load(name);
    CapReplayOptions o = options(0.5);
    o.fault = Residency::Options::Fault::SkipEvictWait;
    EXPECT_EXIT(
        {
          const CapReplay c = replay_under_cap(rec, o);
          std::_Exit(c.mismatches == 0 && c.vmm_misuses == 0 ? 0 : 1);
        },
        [](int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }, "")
        << name;
  }
}

// A budget no launch fits: the refusal ends the replay and says why, and the check fails.
TEST(ReplayCap, AnImpossibleBudgetIsRefused) {
  const CapReplay c = replay_under_cap(load("reference"), options(0.01));
  EXPECT_FALSE(c.refusal.empty());
  EXPECT_FALSE(c.ok());
  EXPECT_EQ(c.mismatches, 0u) << "a refused launch never runs: " << c.first_mismatch;
}

}  // namespace
}  // namespace offload

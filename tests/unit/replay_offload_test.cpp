// The executor on the steps recorded on the H200 (tests/data/traces/), replayed on the simulated
// driver: every launch of the recording checks the data the previous launch left in each
// allocation it touches and writes its own, while the executor evicts and reloads under the
// budget the GPU runs used. A missed reload faults (unmapped range) or reads garbage (a fresh
// handle); a missed stream wait reads stale data: both count as mismatches.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <sys/wait.h>

#include "core/replay.h"
#include "planner/step_trace.h"
#include "planner/planner.h"
#include "sanitizers.h"
#include "residency/replay_cap.h"

namespace offload {
namespace {

// Under the sanitizers, fewer bytes and steps: the time goes into the bytes copied and
// mapped, which they instrument. (Past a divisor of 512 the 64-byte floor of the scaled sizes
// starts to blur the activation threshold.) The plan is made after step 1 and runs from step 3.
#if defined(OFFLOAD_TEST_TSAN)
constexpr uint32_t kDivisor = 512;
constexpr int kRepeats = 6, kScheduleRepeats = 5;
#elif defined(OFFLOAD_TEST_ASAN)
constexpr uint32_t kDivisor = 512;
constexpr int kRepeats = 7, kScheduleRepeats = 6;
#else
constexpr uint32_t kDivisor = 256;
constexpr int kRepeats = 8, kScheduleRepeats = 6;
#endif

StepTrace load(const std::string& name) {
#ifdef OFFLOAD_TRACES_DIR
  std::filesystem::path p = std::filesystem::path(OFFLOAD_TRACES_DIR) / (name + ".trace");
#else
  std::filesystem::path p = std::filesystem::path(__FILE__).parent_path() / "../data/traces" / (name + ".trace");
#endif
  std::ifstream is(p);
  StepTrace t;
  std::string err;
  EXPECT_TRUE(is.good()) << "cannot open " << p;
  EXPECT_TRUE(StepTrace::read(is, &t, &err)) << p << ": " << err;
  return t;
}

ReplayOptions offload_options(double fraction) {
  ReplayOptions o;
  o.repeats = kRepeats;
  o.mark_steps = true;
  o.offload = true;
  o.budget_fraction = fraction;
  o.size_divisor = kDivisor;
  return o;
}

void expect_clean(const std::string& name, double fraction, bool planner = false) {
  StepTrace rec = load(name);
  ASSERT_FALSE(rec.launches.empty());
  ReplayOptions o = offload_options(fraction);
  if (planner) o.planner = plan_scaled;
  ReplayResult r = replay(rec, o);
  const ReplayOffload& ro = r.offload;
  ASSERT_TRUE(ro.installed) << ro.plan;
  EXPECT_EQ(ro.mismatches, 0u) << ro.first_mismatch;
  EXPECT_GT(ro.launches_verified, rec.launches.size()) << "the bodies checked almost nothing";
  EXPECT_GT(ro.stats.evictions, 0u);
  EXPECT_GT(ro.stats.reloads, 0u);
  EXPECT_EQ(ro.stats.deviations, 0u);
  EXPECT_EQ(ro.stats.copy_failures, 0u);
  EXPECT_EQ(ro.vmm_misuses, 0u);
  // Steps 0 and 1 are observed, the plan is made when step 1 (a repeat of step 0) is cut and
  // starts with step 2; step 3 on is the steady state.
  EXPECT_EQ(ro.first_active, 2);
  EXPECT_EQ(ro.steady_steps, static_cast<size_t>(kRepeats - 3));
  EXPECT_EQ(ro.steady_misses, 0u);
  EXPECT_LE(ro.steady_footprint, ro.budget) << "scaled bytes; plan " << ro.plan;
  EXPECT_LE(ro.steady_device_peak, ro.budget);
  for (size_t i = 0; i < ro.steps.size(); ++i)
    if (ro.steps[i].active) {
      EXPECT_GT(ro.steps[i].evictions, 0u) << "step " << i;
      EXPECT_GT(ro.steps[i].reloads, 0u) << "step " << i;
    }
  // What the tracker sees does not change with the data in arenas.
  EXPECT_GE(r.matching_steps + 1, r.steps.size()) << r.first_mismatch;
  std::cout << name << ": " << ro.plan << "\n  evictions " << ro.stats.evictions << " reloads " << ro.stats.reloads
            << " late " << ro.stats.late_reloads << " abandoned " << ro.stats.evictions_abandoned << "; steady footprint "
            << ro.steady_footprint << " of budget " << ro.budget << " (scaled bytes); " << ro.launches_verified
            << " launches verified\n";
}

TEST(ReplayOffload, ReferenceAtHalfThePeak) { expect_clean("reference", 0.5); }
TEST(ReplayOffload, ConvnetAt60Percent) { expect_clean("convnet", 0.6); }
TEST(ReplayOffload, LlamaCompiledAt80Percent) { expect_clean("llama-compiled", 0.8); }
// The same with the GPU-time planner's plans (the recorded kernel times, the link scaled
// like the bytes): spread-out arenas, reloads held back for handles, ties at one launch.
TEST(ReplayOffload, ReferenceAtHalfThePeakPlanned) { expect_clean("reference", 0.5, true); }
TEST(ReplayOffload, ConvnetAt60PercentPlanned) { expect_clean("convnet", 0.6, true); }
TEST(ReplayOffload, LlamaCompiledAt80PercentPlanned) { expect_clean("llama-compiled", 0.8, true); }

// The checks are real: without the wait for a reload's copy, a launch reads the garbage of
// the fresh handle (or a stale copy) and the replay says so.
TEST(ReplayOffload, AMissingReloadWaitIsSeen) {
  StepTrace rec = load("llama-compiled");
  ReplayOptions o = offload_options(0.8);
  o.repeats = 5;
  o.exec.fault = Executor::Options::Fault::SkipReloadWait;
  ReplayResult r = replay(rec, o);
  ASSERT_TRUE(r.offload.installed) << r.offload.plan;
  EXPECT_GT(r.offload.stats.reloads, 0u);
  EXPECT_GT(r.offload.mismatches, 0u);
  std::cout << r.offload.mismatches << " mismatches; first: " << r.offload.first_mismatch << "\n";
}

// Other schedules of the simulated GPU: a GPU kept close behind the host, and one that runs far
// behind it, in other orders.
TEST(ReplayOffload, OtherGpuSchedules) {
  struct Case {
    const char* trace;
    double fraction;
    uint64_t seed;
    uint32_t gpu_ops_max;
    size_t max_queued;
  };
  for (const Case& c : {Case{"convnet", 0.6, 2, 1, 64}, Case{"llama-compiled", 0.8, 3, 8, 4096}}) {
    ReplayOptions o = offload_options(c.fraction);
    o.repeats = kScheduleRepeats;
    o.seed = c.seed;
    o.gpu_ops_max = c.gpu_ops_max;
    o.max_queued = c.max_queued;
    ReplayResult r = replay(load(c.trace), o);
    ASSERT_TRUE(r.offload.installed) << c.trace << ": " << r.offload.plan;
    EXPECT_EQ(r.offload.mismatches, 0u) << c.trace << ": " << r.offload.first_mismatch;
    EXPECT_GT(r.offload.steady_steps, 0u) << c.trace;
    EXPECT_EQ(r.offload.steady_misses, 0u) << c.trace;
    EXPECT_LE(r.offload.steady_footprint, r.offload.budget) << c.trace;
    EXPECT_GT(r.offload.stats.reloads, 0u) << c.trace;
  }
}


// Under the cap: the residency manager (the hard cap) on the steps recorded on the H200 (tests/data/traces/),
// replayed on the simulated driver with every launch checking the data the previous toucher of
// each allocation left: the budget holds at every instant, bytes really move, and none is lost.
namespace cap {


// Sizes / 1024 keep each trace's replay to a few seconds in a Debug build (the time goes into
// the bytes mapped and copied); four steps give the period (two equal steps) and two more.
#if defined(OFFLOAD_TEST_TSAN) || defined(OFFLOAD_TEST_ASAN)
constexpr int kRepeats = 3;
#else
constexpr int kRepeats = 4;
#endif
constexpr uint32_t kDivisor = 1024;

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
  // Ranges are taken back and prefetches wasted only at launches, inside the steps: the steps'
  // counts add up to the run's.
  uint64_t taken_back = 0, wasted = 0;
  for (const CapReplayStep& s : c.steps) taken_back += s.taken_back, wasted += s.prefetch_wasted;
  EXPECT_EQ(taken_back, c.stats.taken_back);
  EXPECT_EQ(wasted, c.stats.prefetch_wasted);
  EXPECT_TRUE(c.ok());
}

TEST(ReplayCap, ReferenceAtHalfThePeak) { expect_clean("reference"); }
TEST(ReplayCap, ConvnetAtHalfThePeak) { expect_clean("convnet"); }
TEST(ReplayCap, LlamaCompiledAtHalfThePeak) { expect_clean("llama-compiled"); }
TEST(ReplayCap, LoraAtHalfThePeak) { expect_clean("lora", 3); }  // four times the launches of the others

// OFFLOAD_CAP_PREFETCH_ROOM, on the recorded checkpointed Llama step at 60% of its peak: without
// it most prefetches of a steady step go out again unused (the next allocation takes the
// room they came into and evicts them, used furthest ahead); leaving free what the allocations
// before a range's use took a step earlier, almost none do, no more ranges come back on demand
// and fewer bytes go out. Four steps: the third has a period, the fourth the third's profile.
TEST(ReplayCap, PrefetchesLeaveTheRoomTheAllocationsBeforeTheirUseTook) {
  CapReplayOptions o = options(0.6, 4);
  o.policy.prefetch_room = false;
  const CapReplay plain = replay_under_cap(load("ckpt/hf_llama-ckpt"), o);
  o.policy.prefetch_room = true;
  const CapReplay room = replay_under_cap(load("ckpt/hf_llama-ckpt"), o);
  for (const CapReplay* c : {&plain, &room}) {
    EXPECT_TRUE(c->ok()) << c->refusal << c->first_mismatch;
    ASSERT_EQ(c->steps.size(), 4u);
  }
  const CapReplayStep &a = plain.steps.back(), &b = room.steps.back();
  EXPECT_GT(a.prefetch_wasted * 2, a.prefetches) << "without the rule most go out unused";
  EXPECT_LT(b.prefetch_wasted * 20, a.prefetch_wasted) << b.prefetch_wasted << " of " << b.prefetches;
  EXPECT_LE(b.reloads, a.reloads);
  EXPECT_LT(b.bytes_out, a.bytes_out);
}

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

// OFFLOAD_CAP_PIECE reaches the replay, scaled as the sizes are: one handle per range (0) backs
// every range with one mapping, where pieces of 64 MiB map several for the larger ones.
TEST(ReplayCap, ThePieceSizeIsThePolicys) {
  const StepTrace rec = load("reference");
  CapReplayOptions whole = options(0.5, 3);
  whole.policy.piece_max = 0;
  const CapReplay one = replay_under_cap(rec, whole);
  const CapReplay pieces = replay_under_cap(rec, options(0.5, 3));
  EXPECT_EQ(one.piece_max, 0u);
  EXPECT_EQ(pieces.piece_max, (64ull << 20) / kDivisor);
  EXPECT_TRUE(one.ok() && pieces.ok()) << one.refusal << pieces.refusal;
  EXPECT_EQ(one.mismatches, 0u) << one.first_mismatch;
  EXPECT_LT(one.stats.maps, pieces.stats.maps);
}

// Spare handles still read by a copy out (or a freed range's work) are released last, and only
// when nothing else makes room: releasing one first made the host wait for that work. On the
// recorded steps of a transformer and a convnet the waits for such releases fall by more than half
// (reference 2 against 42, resnet50 6 against 13 at these sizes), every byte still checked. The
// host's waits fall with them on the reference (31 against 53); on resnet50 they have come out
// equal (40) since a range carries the waits of its mapping to its copy out: not compared there.
TEST(ReplayCap, SparesStillInUseAreReleasedLast) {
  for (const char* name : {"reference", "resnet50"}) {
    const StepTrace rec = load(name);
    CapReplayOptions before = options(0.5, 4);
    before.policy.busy_spares_last = false;
    const CapReplay any = replay_under_cap(rec, before);
    const CapReplay last = replay_under_cap(rec, options(0.5, 4));
    for (const CapReplay* c : {&any, &last}) {
      EXPECT_TRUE(c->ok()) << name << ": " << c->refusal;
      EXPECT_EQ(c->mismatches, 0u) << name << ": " << c->first_mismatch;
      EXPECT_LE(c->physical_peak, c->budget) << name;
    }
    EXPECT_GT(any.stats.waits, 0u) << name;
    if (std::string(name) == "reference") {
      EXPECT_LT(last.stats.waits, any.stats.waits) << name << ": " << last.stats.waits << " against "
                                                   << any.stats.waits;
    }
    // The waits counted by what waited: the releases of spares still in use are what fell.
    for (const CapReplay* c : {&any, &last})
      EXPECT_LE(c->stats.waits_room + c->stats.waits_release + c->stats.waits_abandon, c->stats.waits) << name;
    EXPECT_LT(2 * last.stats.waits_release, any.stats.waits_release)
        << name << ": " << last.stats.waits_release << " against " << any.stats.waits_release;
  }
}

// With evict_before_busy_release (and the shim's default policy otherwise), an allocation that finds
// no room without the host waiting evicts a range whose handles can back it (the GPU orders the
// taker after that copy) instead of releasing a spare still in use: such releases' waits fall by
// half or more, and the host's waits with them, every byte checked and the budget held.
TEST(ReplayCap, EvictingFirstTakesWaitsOff) {
  for (const char* name : {"resnet50", "hf_gpt2"}) {
    const StepTrace rec = load(name);
    CapReplayOptions o = options(0.5);
    apply_cap_policy(Settings{}, &o.policy);
    const CapReplay off = replay_under_cap(rec, o);
    o.policy.evict_before_busy_release = true;
    const CapReplay first = replay_under_cap(rec, o);
    for (const CapReplay* c : {&off, &first}) {
      EXPECT_TRUE(c->ok()) << name << ": " << c->refusal;
      EXPECT_EQ(c->mismatches, 0u) << name << ": " << c->first_mismatch;
      EXPECT_LE(c->physical_peak, c->budget) << name;
    }
    EXPECT_GT(off.stats.waits_release, 0u) << name;
    // resnet50: 45 against 98; hf_gpt2: 0 against 6.
    EXPECT_LE(2 * first.stats.waits_release, off.stats.waits_release)
        << name << ": " << first.stats.waits_release << " against " << off.stats.waits_release;
    // All the host's waits, on resnet50 (116 against 160). hf_gpt2 waits a few dozen times either
    // way, and which way has differed between a Release and an AddressSanitizer build of the same
    // code (each giving the same figures run after run): not compared.
    if (std::string(name) == "resnet50") {
      EXPECT_LT(first.stats.waits, off.stats.waits) << name << ": " << first.stats.waits << " against " << off.stats.waits;
    }
  }
}

// With recompute on (and the shim's default policy otherwise), on recorded steps whose kernels the
// replay's driver can launch again (each writes only what it touches first after its birth): ranges
// are made again and dropped, every byte checked and the budget held at every instant.
TEST(ReplayCap, MakingRangesAgainKeepsTheBudgetAndTheBytes) {
  uint64_t remade = 0, dropped = 0;
  for (const char* name : {"hf_llama", "hf_gpt2", "llama-compiled", "reference"}) {
    CapReplayOptions o = options(0.5);
    apply_cap_policy(Settings{}, &o.policy);
    o.policy.recompute = true;
    const CapReplay c = replay_under_cap(load(name), o);
    EXPECT_TRUE(c.ok()) << name << ": " << c.refusal;
    EXPECT_EQ(c.mismatches, 0u) << name << ": " << c.first_mismatch;
    EXPECT_LE(c.stats.held_peak, c.budget) << name;
    EXPECT_LE(c.physical_peak, c.budget) << name;
    EXPECT_EQ(c.stats.recompute_bans, 0u) << name;
    remade += c.stats.recomputed;
    dropped += c.stats.dropped;
  }
  EXPECT_GT(remade, 0u);
  EXPECT_GT(dropped, 0u);
  // compiled_gpt2 at sizes / 256: a small allocation a producer points at is freed and its address
  // given to another before the producer's range is needed (the replay's kernel writes it there, at
  // a position its probes saw only read): its free must keep the range from being made again.
  {
    CapReplayOptions o = options(0.5);
    apply_cap_policy(Settings{}, &o.policy);
    o.policy.recompute = true;
    o.size_divisor = 256;
    const CapReplay c = replay_under_cap(load("compiled_gpt2"), o);
    EXPECT_EQ(c.mismatches, 0u) << c.first_mismatch;
    EXPECT_LE(c.stats.held_peak, c.budget);
  }
  // A recorded kernel writes at a position in some launches and only reads there in others: taken
  // as its side wherever it was ever written (not only where seen writing a range made before a
  // launch that made a new one), that input is zeroed for the second launch, which reads it.
  CapReplayOptions o = options(0.5);
  apply_cap_policy(Settings{}, &o.policy);
  o.policy.recompute = true;
  o.fault = Residency::Options::Fault::RecomputeSideAnyWrite;
  EXPECT_GT(replay_under_cap(load("llama-compiled"), o).mismatches, 0u);
}

// A budget no launch fits: the refusal ends the replay and says why, and the check fails.
TEST(ReplayCap, AnImpossibleBudgetIsRefused) {
  const CapReplay c = replay_under_cap(load("reference"), options(0.01));
  EXPECT_FALSE(c.refusal.empty());
  EXPECT_FALSE(c.ok());
  EXPECT_EQ(c.mismatches, 0u) << "a refused launch never runs: " << c.first_mismatch;
}

}  // namespace cap

}  // namespace
}  // namespace offload

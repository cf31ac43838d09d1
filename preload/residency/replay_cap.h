// Replay under the cap: a recorded step replayed (core/replay.h) with every allocation of at
// least the scaled granularity served by the residency manager under a budget of a fraction of
// the step's peak live bytes, on the simulated driver, wired as runtime_cap.cpp wires it. The
// content checks of offload mode apply: a range reloaded short, late or unordered reads as a
// mismatch. Used by `offloadctl replay --cap` and by tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/replay.h"
#include "residency/residency.h"

namespace offload {

struct CapReplayOptions {
  int repeats = 6;
  double budget_fraction = 0.5;  // of the recorded step's peak live bytes
  uint32_t size_divisor = 256;   // as ReplayOptions::size_divisor
  uint64_t seed = 1;
  Residency::Options::Fault fault = Residency::Options::Fault::None;  // tests
  // The manager's policy (apply_cap_policy: the shim's OFFLOAD_CAP_* settings; min_bytes and
  // piece_max are the GPU's sizes, scaled as the trace's are): what a change of policy does to
  // the mappings a step is counted here first.
  Residency::Options policy;
};

// One step's counts (Residency::Stats differences) and peaks, scaled bytes.
struct CapReplayStep {
  uint64_t held_peak = 0;      // our handles, at their highest in the step (sampled at every call)
  uint64_t footprint_peak = 0; // held + the pool's share, likewise
  uint64_t device_peak = 0;    // the simulated driver's handles + the pool's live bytes, likewise
  uint64_t evictions = 0, reloads = 0, prefetches = 0, prefetch_hits = 0;
  uint64_t maps = 0, unmaps = 0, created = 0, released = 0, waits = 0;
  uint64_t taken_back = 0;       // ranges touched after their handles were handed on (the host waits)
  uint64_t prefetch_wasted = 0;  // prefetched ranges evicted again before their use
  uint64_t created_bytes = 0;  // of the handles made (making costs about its size)
  uint64_t bytes_out = 0, bytes_in = 0;  // copied out, and copied in on demand
  uint64_t host_mapped = 0;    // the host store's bytes at the step's end (it only grows)
  uint64_t host_peak = 0;      // its most bytes in use so far
};

struct CapReplay {
  uint32_t divisor = 1;
  uint64_t granularity = 0, piece_max = 0, host_chunk = 0;
  uint64_t recorded_peak = 0, budget = 0;
  std::vector<CapReplayStep> steps;
  Residency::Stats stats;           // at the end
  HostStore::Stats host;
  uint64_t physical_peak = 0;       // SimDriver's, whole replay
  uint64_t vmm_misuses = 0;
  uint64_t launches_verified = 0, words_checked = 0, mismatches = 0;
  std::string first_mismatch;
  std::string refusal;              // Residency::error() when a refusal ended the replay
  size_t matching_steps = 0, steps_replayed = 0;
  bool within() const { return stats.held_peak <= budget && stats.footprint_peak <= budget; }
  bool ok() const { return refusal.empty() && within() && vmm_misuses == 0 && mismatches == 0 && launches_verified > 0; }
};

CapReplay replay_under_cap(const StepTrace& recorded, const CapReplayOptions& o);

}  // namespace offload

// StepDetector: finds training-step boundaries in the launch sequence.
//
// A training step repeats the same launches with the same allocation pattern, so each
// launch is reduced to a token (kernel and the tracked bytes live at the launch) and the
// detector looks for the longest periodic suffix of the token history that holds at least
// two whole periods. Tokens carry live bytes so that the repeated blocks of one forward
// pass (same kernels, growing memory) are not mistaken for steps. The phase is the launch
// with the fewest live bytes in a period: a step starts when the previous one has freed
// its activations and gradients.
//
// Once locked, every launch is checked against the reference period; a mismatch (new
// shapes, an eval step) unlocks, and detection starts over from the last boundary.
//
// Pure: no clocks, no I/O. Not thread-safe (the shim's worker owns it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace offload {

class StepDetector {
 public:
  struct Options {
    size_t min_period = 16;       // shorter loops are kernels inside a step
    size_t max_history = 1 << 20; // tokens kept while searching
  };
  StepDetector() : StepDetector(Options{}) {}
  explicit StepDetector(Options o) : opt_(o) {}

  // One launch, in order. Launch numbers count from 0 over the detector's life.
  void push(uint64_t token, uint64_t live_bytes);
  // Runs detection if unlocked and returns the launch numbers (ascending, each > the last
  // returned) before which a step starts. Boundaries found while locked are returned here
  // too, so the caller cuts steps only from poll().
  std::vector<uint64_t> poll();

  bool locked() const { return locked_; }
  size_t period() const { return locked_ ? ref_.size() : 0; }
  // While locked: the launch number at which the next step will start.
  uint64_t next_boundary() const { return next_boundary_; }
  uint64_t deviations() const { return deviations_; }
  uint64_t launches() const { return base_ + tokens_.size(); }

  // Combines a launch's kernel id, kind and live bytes into a token.
  static uint64_t token(uint32_t kind, uint64_t what, uint64_t live_bytes);

 private:
  void detect();
  void trim(uint64_t keep_from);

  Options opt_;
  std::vector<uint64_t> tokens_, live_;  // history; tokens_[i] is launch base_ + i
  uint64_t base_ = 0;
  bool locked_ = false;
  std::vector<uint64_t> ref_;  // the locked period's tokens, starting at a boundary
  uint64_t next_boundary_ = 0; // while locked: launch number of the next boundary
  uint64_t last_emitted_ = 0;
  bool emitted_any_ = false;
  uint64_t checked_ = 0;       // while locked: launches verified against ref_
  uint64_t deviations_ = 0;
  uint64_t searched_at_ = 0;   // history length at the last fruitless search
  std::vector<uint64_t> out_;
};

}  // namespace offload

// PoolTrim: when and how far the shim gives the stream-ordered pool's unused memory back to the
// device.
//
// PyTorch's cudaMallocAsync backend keeps every byte its pool ever reserved (release threshold
// UINT64_MAX; only torch.cuda.empty_cache() trims). The steps observed before a plan, and a step
// run in demand mode after a deviation, reserve the step's whole peak; without a trim the process
// holds that peak for the rest of the run, whatever OFFLOAD_DEVICE_BUDGET says. So once an
// installed plan has run `after` steps, the shim trims the pool to the budget less the most the
// executor has held beside it (Runtime::trim_pool): what the plan's steps need stays.
//
// One cuMemPoolTrimTo call is not always enough (measured on the H200, fe26f5e):
// - It releases whole OS allocations, and only those with nothing live in them (a free whose
//   completion the driver has not yet seen counts as live). Called while a step runs, it may
//   release nothing: convnet's pool stayed at 5.62 GiB against 2.04 GiB to keep.
// - It keeps at least the bytes asked for, so it can stop one allocation above them: the
//   reference workload's pool came to 11.81 GiB against 11.79.
// So the trim is tried again at the next planned steps, up to `tries` times per install, until
// the pool is at most the bytes to keep; each try after one that stopped above them asks for
// that much less.
#pragma once

#include <algorithm>
#include <cstdint>

namespace offload {

class PoolTrim {
 public:
  explicit PoolTrim(uint64_t after = 1, uint32_t tries = 8) : after_(after), tries_(tries) {}

  // `installs`: plans installed so far; `steps_active`: steps run under any plan so far (the
  // executor's counter, never reset); `running`: a plan is installed and has not deviated.
  // True at most once per planned step: from the step at which the install has run `after`
  // steps, until a try reaches its target (attempt) or `tries` tries are spent.
  bool due(uint64_t installs, uint64_t steps_active, bool running) {
    if (installs != seen_) {
      seen_ = installs;
      base_ = steps_active;
      last_ = UINT64_MAX;
      left_ = tries_;
      slack_ = 0;
    }
    if (!left_ || !running || installs == 0 || steps_active < base_ + after_ || steps_active == last_) return false;
    last_ = steps_active;
    return true;
  }

  struct Attempt {
    uint64_t before = 0;  // the pool's reserved bytes before the try
    uint64_t after = 0;   // and after it
    uint64_t asked = 0;   // what cuMemPoolTrimTo was asked to keep (0 and !called: not called)
    bool called = false;  // the pool was trimmed (it held more than `keep`, and the call worked)
    bool done = false;    // no more tries for this install (target reached, nothing to do, or tries spent)
  };

  // One try, after due() said so: `reserved()` reads the pool's reserved bytes (0: unknown),
  // `trim_to(bytes)` trims it (false: the driver cannot).
  template <class Reserved, class TrimTo>
  Attempt attempt(uint64_t keep, Reserved reserved, TrimTo trim_to) {
    Attempt a;
    if (left_) --left_;
    a.before = reserved();
    a.after = a.before;
    if (!a.before || a.before <= keep) return finish(a);
    a.asked = keep > slack_ ? keep - slack_ : 0;
    if (!trim_to(a.asked)) return finish(a);
    a.called = true;
    a.after = reserved();
    if (a.after <= keep) return finish(a);
    slack_ = std::max(slack_, a.after - keep);
    a.done = left_ == 0;
    return a;
  }

 private:
  Attempt finish(Attempt a) {
    left_ = 0;
    a.done = true;
    return a;
  }

  uint64_t after_;
  uint32_t tries_;
  uint64_t seen_ = 0, base_ = 0, last_ = UINT64_MAX, slack_ = 0;
  uint32_t left_ = 0;
};

}  // namespace offload

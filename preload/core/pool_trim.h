// PoolTrimTrigger: when the shim gives the stream-ordered pool's unused memory back to the device.
//
// PyTorch's cudaMallocAsync backend keeps every byte its pool ever reserved (release threshold
// UINT64_MAX; only torch.cuda.empty_cache() trims). The steps observed before a plan, and a step
// run in demand mode after a deviation, reserve the step's whole peak; without a trim the process
// holds that peak for the rest of the run, whatever OFFLOAD_DEVICE_BUDGET says. So once per
// installed plan, after it has run `after` whole steps (what those earlier steps freed has long
// been freed in stream order by then), the shim trims the pool to the budget less the most the
// executor has held beside it (Runtime::trim_pool): what the plan's steps need stays.
#pragma once

#include <cstdint>

namespace offload {

class PoolTrimTrigger {
 public:
  explicit PoolTrimTrigger(uint64_t after = 2) : after_(after) {}

  // `installs`: plans installed so far; `steps_active`: steps run under any plan so far (the
  // executor's counter, never reset); `running`: a plan is installed and has not deviated.
  // True once per install, at the first call after that install has run `after` steps.
  bool due(uint64_t installs, uint64_t steps_active, bool running) {
    if (installs != seen_) {
      seen_ = installs;
      base_ = steps_active;
      done_ = false;
    }
    if (done_ || !running || installs == 0 || steps_active < base_ + after_) return false;
    done_ = true;
    return true;
  }

 private:
  uint64_t after_;
  uint64_t seen_ = 0, base_ = 0;
  bool done_ = true;
};

}  // namespace offload

// LaunchArgs: the kernel launch a hook is making, as the driver would take it again.
//
// The launch hook knows the function, its geometry and its arguments; the tracker passes them
// to the gate (the residency manager) through a thread-local pointer for the span of its
// before_launch, so that a range a launch produced can be made again by launching it once more
// (Residency::Options::recompute) instead of copying its bytes back. A cooperative launch, and one
// with a launch attribute the hook does not know, are never launched again (`refused_attr`).
#pragma once

#include <cstddef>
#include <cstdint>

#include "planner/types.h"  // Func

namespace offload {

struct FuncInfo;

struct LaunchGeom {
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block[3] = {1, 1, 1};
  uint32_t smem = 0;
  // Launch attributes as the driver takes them (cuLaunchKernelEx's CUlaunchAttribute array:
  // bytes the core does not read), `nattrs` of `attr_bytes` in all; valid while the hook runs, or
  // while whoever copied them keeps them.
  const void* attrs = nullptr;
  uint32_t nattrs = 0, attr_bytes = 0;
  // A launch attribute that forbids launching it again (a cooperative launch, one this build does
  // not know), or -1.
  int32_t refused_attr = -1;
};

struct LaunchArgs {
  Func f = 0;
  const FuncInfo* fi = nullptr;  // its parameter layout (nparams < 0: unknown)
  void** params = nullptr;       // the kernelParams array
  void** extra = nullptr;        // the extra array (then params are not to be relied on)
  LaunchGeom geom;
  // The arguments packed in one buffer, as `extra` gives them (CU_LAUNCH_PARAM_BUFFER_POINTER and
  // _SIZE, no other key); nullptr otherwise. cuBLAS's GEMMs are launched so.
  const void* packed = nullptr;
  uint32_t packed_len = 0;
};

// A launch's `extra` array (cuLaunchKernel's): its packed argument buffer and that buffer's size
// (CU_LAUNCH_PARAM_BUFFER_POINTER, _SIZE), and whether it holds nothing else up to its END (then a
// launch with it can be made again from a copy of the buffer). False: no buffer and size in it.
struct ExtraBuffer {
  const void* buf = nullptr;
  size_t len = 0;
  bool only = false;
};
bool read_extra(void** extra, ExtraBuffer* out);

// The launch being made on this thread while the gate looks at it; nullptr otherwise, or when
// the hook could not describe it.
const LaunchArgs* current_launch_args();

// The copy or memset being made on this thread while the gate looks at it: what it writes (its
// source is only read); nullptr otherwise.
struct TransferDst {
  DevPtr dst = 0;
  uint64_t bytes = 0;
};
const TransferDst* current_transfer();

class TransferScope {
 public:
  explicit TransferScope(const TransferDst* t);
  ~TransferScope();
  TransferScope(const TransferScope&) = delete;
  TransferScope& operator=(const TransferScope&) = delete;

 private:
  const TransferDst* prev_;
};

class LaunchArgsScope {
 public:
  explicit LaunchArgsScope(const LaunchArgs* a);
  ~LaunchArgsScope();
  LaunchArgsScope(const LaunchArgsScope&) = delete;
  LaunchArgsScope& operator=(const LaunchArgsScope&) = delete;

 private:
  const LaunchArgs* prev_;
};

}  // namespace offload

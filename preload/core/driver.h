// The Driver seam: the few things the core asks of the GPU driver.
//
// Production binds it to the CUDA driver (preload/cuda_driver.cpp, entry points resolved
// at run time); tests and `offloadctl replay` bind it to SimDriver, which backs "device
// memory" with host pages. Core code receives a Driver& and never names CUDA.
//
// Threading: every method may be called from any thread, concurrently.
#pragma once

#include <cstddef>
#include <cstdint>

namespace offload {

using DevPtr = uint64_t;   // a device address (CUdeviceptr)
using Stream = uint64_t;   // a stream handle value; 0 legacy, 2 per-thread default
using Func = uint64_t;     // a kernel handle (CUfunction or CUkernel)

inline constexpr Stream kPerThreadStream = 0x2;

struct ParamInfo {
  uint32_t offset;  // byte offset of the parameter in the launch's argument buffer
  uint32_t size;    // bytes
};

class Driver {
 public:
  virtual ~Driver() = default;

  // Parameter layout of `f`. Writes up to `cap` entries and returns the parameter count,
  // or -1 if the driver cannot tell (then only the `extra` buffer of a launch is scanned).
  virtual int param_layout(Func f, ParamInfo* out, int cap) = 0;

  // The kernel's (mangled) name, or nullptr. The string lives as long as the module.
  virtual const char* func_name(Func f) = 0;
};

}  // namespace offload

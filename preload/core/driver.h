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

  // Step-boundary markers, for timing steps on the GPU when CUPTI's records are not to be
  // had (telemetry off, or another CUPTI client took the buffers). record_marker is called
  // from a hook on the launching thread, once per step: it records an event on `s` and
  // returns a handle (0 on failure). The worker asks for the GPU time between two markers
  // (-1 until both have been reached) and releases them.
  virtual uint64_t record_marker(Stream s) = 0;
  // Pins host memory for fast, async copies (cuMemHostRegister, portable). Called from the
  // worker thread, after a launch has shown the driver which context to use. False if
  // the driver refused or no context is known yet.
  virtual bool pin_host(void* p, uint64_t bytes) = 0;
  virtual int64_t marker_elapsed_ns(uint64_t from, uint64_t to) = 0;
  virtual void release_marker(uint64_t m) = 0;
};

}  // namespace offload

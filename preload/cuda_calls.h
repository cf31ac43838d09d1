#pragma once
// libcuda's entry points as the CUDA driver wrapper calls them: resolved once from libcuda's own
// handle, each result checked and logged one way, a context made current for a scope. Internal to
// the CUDA driver wrapper (cuda_driver.cpp).

#include <cuda.h>

#include <cstdint>

#include "capture_mode.h"
#include "core/driver.h"

namespace offload::cu {

// True when `result` is CUDA_SUCCESS; otherwise logs `fn` and the result and returns false.
// The first kLoudFailures of the process at warn level, later ones at debug: a call failing
// every step must not flood the terminal. CUDA_ERROR_DEINITIALIZED only at debug: the driver is
// going away with the process, and the worker's last polls at exit meet it (15-27 warnings a run
// on the H200 before). Never throws: it runs inside the hooks.
bool cu_ok(int result, const char* fn) noexcept;

// A query's answer: 1 done, 0 not yet (CUDA_ERROR_NOT_READY, an answer, not logged), -1 failed.
int cu_query(int result, const char* fn) noexcept;

// The executor's entry points. real_dlsym on libcuda's own handle returns libcuda's
// definitions, never our wrappers of the same names (cuMemcpy*Async are interposed).
struct ExecApi {
  decltype(&cuCtxGetCurrent) get_ctx;
  decltype(&cuCtxPushCurrent_v2) push_ctx;
  decltype(&cuCtxPopCurrent_v2) pop_ctx;
  decltype(&cuCtxGetDevice) get_device;
  decltype(&cuCtxSynchronize) ctx_sync;
  decltype(&cuDeviceTotalMem_v2) total_mem;
  decltype(&cuMemGetAllocationGranularity) granularity;
  decltype(&cuMemAddressReserve) reserve;
  decltype(&cuMemAddressFree) free_va;
  decltype(&cuMemCreate) create;
  decltype(&cuMemRelease) release;
  decltype(&cuMemMap) map;
  decltype(&cuMemUnmap) unmap;
  decltype(&cuMemSetAccess) set_access;
  decltype(&cuStreamCreate) stream_create;
  decltype(&cuEventCreate) event_create;
  decltype(&cuEventDestroy_v2) event_destroy;
  decltype(&cuEventRecord) event_record;
  decltype(&cuStreamWaitEvent) stream_wait;
  decltype(&cuStreamQuery) stream_query;
  decltype(&cuStreamIsCapturing) is_capturing;
  decltype(&cuEventQuery) event_query;
  decltype(&cuEventSynchronize) event_sync;
  decltype(&cuMemcpyDtoHAsync_v2) dtoh;
  decltype(&cuMemcpyHtoDAsync_v2) htod;
  decltype(&cuLaunchKernel) launch;
  decltype(&cuLaunchKernelEx) launch_ex;
  decltype(&cuMemcpyDtoDAsync_v2) dtod;
  decltype(&cuMemsetD8Async) memset8;
  // Optional: grants made apart (Residency::Options::grant_apart) need them.
  decltype(&cuStreamWaitValue64_v2) wait_value64;
  decltype(&cuMemHostRegister_v2) host_register;
  decltype(&cuMemHostGetDevicePointer_v2) host_device_ptr;
  decltype(&cuDeviceGetAttribute) device_attr;
  // Optional: the copy gate (Residency::Options::copy_gate) needs it.
  decltype(&cuStreamWaitValue32_v2) wait_value32;
};

// nullptr until libcuda is loaded, or if it lacks any of them (VMM needs CUDA 10.2).
const ExecApi* exec_api();

// Makes `ctx` current for the scope on a thread that has none (the worker); a hook's
// thread keeps its own. False when neither is to be had.
class CtxScope {
 public:
  CtxScope(const ExecApi* a, void* ctx) : a_(a) {  // relaxed_ first: the context calls are ours too
    if (!a) return;
    CUcontext cur = nullptr;
    if (cu_ok(a->get_ctx(&cur), "cuCtxGetCurrent") && cur) {
      ok_ = true;
    } else if (ctx && cu_ok(a->push_ctx(static_cast<CUcontext>(ctx)), "cuCtxPushCurrent_v2")) {
      ok_ = pushed_ = true;
    }
  }
  ~CtxScope() {
    CUcontext popped = nullptr;
    if (pushed_) cu_ok(a_->pop_ctx(&popped), "cuCtxPopCurrent_v2");
  }
  CtxScope(const CtxScope&) = delete;
  CtxScope& operator=(const CtxScope&) = delete;
  explicit operator bool() const { return ok_; }

 private:
  RelaxedCapture relaxed_;
  const ExecApi* a_;
  bool ok_ = false, pushed_ = false;
};

inline CUstream as_stream(Stream s) { return reinterpret_cast<CUstream>(static_cast<uintptr_t>(s)); }
inline CUevent as_event(uint64_t e) { return reinterpret_cast<CUevent>(static_cast<uintptr_t>(e)); }

}  // namespace offload::cu

#include "cuda_calls.h"
#undef cuGetProcAddress  // hook_table.h declares the entry point itself

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <type_traits>

#include "common/log.h"
#include "hooks/hook_table.h"

namespace offload::cu {
namespace {

// The driver's name of `result` (e.g. "CUDA_ERROR_OUT_OF_MEMORY"), nullptr when it has none.
// Resolved on the first failure: libcuda is loaded by then, as something of it just failed.
const char* cu_error_name(int result) noexcept {
  static const auto get_name = [] {
    void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    return h ? reinterpret_cast<decltype(&cuGetErrorName)>(hooks::real_dlsym(h, "cuGetErrorName")) : nullptr;
  }();
  const char* name = nullptr;
  if (!get_name || get_name(static_cast<CUresult>(result), &name) != CUDA_SUCCESS) return nullptr;
  return name;
}

}  // namespace

// True when `result` is CUDA_SUCCESS; otherwise logs `fn` and the result and returns false.
// The first kLoudFailures of the process at warn level, later ones at debug: a call failing
// every step must not flood the terminal. CUDA_ERROR_DEINITIALIZED only at debug: the driver is
// going away with the process, and the worker's last polls at exit meet it (15-27 warnings a run
// on the H200 before). Never throws: it runs inside the hooks.
bool cu_ok(int result, const char* fn) noexcept {
  if (result == CUDA_SUCCESS) return true;
  note_capture_error(result);
  constexpr uint64_t kLoudFailures = 32;
  static std::atomic<uint64_t> failures{0};
  try {
    const auto level = result != CUDA_ERROR_DEINITIALIZED &&
                               failures.fetch_add(1, std::memory_order_relaxed) < kLoudFailures
                           ? spdlog::level::warn
                           : spdlog::level::debug;
    if (const char* name = cu_error_name(result))
      log().log(level, "{} failed: CUresult {} ({})", fn, result, name);
    else
      log().log(level, "{} failed: CUresult {}", fn, result);
  } catch (...) {
  }
  return false;
}

// A query's answer: 1 done, 0 not yet (CUDA_ERROR_NOT_READY, an answer, not logged), -1 failed.
int cu_query(int result, const char* fn) noexcept {
  if (result == CUDA_ERROR_NOT_READY) return 0;
  return cu_ok(result, fn) ? 1 : -1;
}

// nullptr until libcuda is loaded, or if it lacks any of them (VMM needs CUDA 10.2).
const ExecApi* exec_api() {
  static ExecApi api{};
  static std::atomic<int> state{0};  // 0 unresolved, 1 resolved, -1 incomplete
  int s = state.load(std::memory_order_acquire);
  if (s) return s > 0 ? &api : nullptr;
  // A call before libcuda is loaded fails without spending the once: a later one resolves.
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return nullptr;
  static std::once_flag once;
  std::call_once(once, [h] {
    bool all = true;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(hooks::real_dlsym(h, name));
      all = all && fn;
    };
    sym(api.get_ctx, "cuCtxGetCurrent");
    sym(api.push_ctx, "cuCtxPushCurrent_v2");
    sym(api.pop_ctx, "cuCtxPopCurrent_v2");
    sym(api.get_device, "cuCtxGetDevice");  // not cuCtxGetDevice_v2: that one takes a context
    sym(api.ctx_sync, "cuCtxSynchronize");
    sym(api.total_mem, "cuDeviceTotalMem_v2");
    sym(api.granularity, "cuMemGetAllocationGranularity");
    sym(api.reserve, "cuMemAddressReserve");
    sym(api.free_va, "cuMemAddressFree");
    sym(api.create, "cuMemCreate");
    sym(api.release, "cuMemRelease");
    sym(api.map, "cuMemMap");
    sym(api.unmap, "cuMemUnmap");
    sym(api.set_access, "cuMemSetAccess");
    sym(api.stream_create, "cuStreamCreate");
    sym(api.event_create, "cuEventCreate");
    sym(api.event_destroy, "cuEventDestroy_v2");
    sym(api.event_record, "cuEventRecord");
    sym(api.stream_wait, "cuStreamWaitEvent");
    sym(api.stream_query, "cuStreamQuery");
    sym(api.is_capturing, "cuStreamIsCapturing");
    sym(api.event_query, "cuEventQuery");
    sym(api.event_sync, "cuEventSynchronize");
    sym(api.dtoh, "cuMemcpyDtoHAsync_v2");
    sym(api.htod, "cuMemcpyHtoDAsync_v2");
    // Optional: only a launch made again (Residency::Options::recompute) needs it.
    api.launch = reinterpret_cast<decltype(api.launch)>(hooks::real_dlsym(h, "cuLaunchKernel"));
    api.launch_ex = reinterpret_cast<decltype(api.launch_ex)>(hooks::real_dlsym(h, "cuLaunchKernelEx"));
    api.dtod = reinterpret_cast<decltype(api.dtod)>(hooks::real_dlsym(h, "cuMemcpyDtoDAsync_v2"));
    api.memset8 = reinterpret_cast<decltype(api.memset8)>(hooks::real_dlsym(h, "cuMemsetD8Async"));
    api.wait_value64 = reinterpret_cast<decltype(api.wait_value64)>(hooks::real_dlsym(h, "cuStreamWaitValue64_v2"));
    api.host_register = reinterpret_cast<decltype(api.host_register)>(hooks::real_dlsym(h, "cuMemHostRegister_v2"));
    api.host_device_ptr =
        reinterpret_cast<decltype(api.host_device_ptr)>(hooks::real_dlsym(h, "cuMemHostGetDevicePointer_v2"));
    api.device_attr = reinterpret_cast<decltype(api.device_attr)>(hooks::real_dlsym(h, "cuDeviceGetAttribute"));
    api.wait_value32 = reinterpret_cast<decltype(api.wait_value32)>(hooks::real_dlsym(h, "cuStreamWaitValue32_v2"));
    state.store(all ? 1 : -1, std::memory_order_release);
  });
  return state.load(std::memory_order_acquire) > 0 ? &api : nullptr;
}

}  // namespace offload::cu

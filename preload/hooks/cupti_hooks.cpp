// CUPTI allows one owner of the activity buffers. When another client (torch.profiler's
// Kineto) registers for them, our telemetry steps aside first, so that the profiler works
// as it would without us; steps are then timed with CUDA events instead.
#include <cupti.h>
#undef cuGetProcAddress
#include <dlfcn.h>

#include <atomic>

#include "hooks/hook.h"

#define OFFLOAD_EXPORT extern "C" __attribute__((visibility("default")))

OFFLOAD_EXPORT CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc request,
                                                          CUpti_BuffersCallbackCompleteFunc complete) {
  return offload::hooks::no_throw([&]() -> CUptiResult {
    using Fn = CUptiResult (*)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
    static std::atomic<void*> found{nullptr};
    void* p = found.load(std::memory_order_acquire);
    if (!p) {
      p = offload::hooks::real_dlsym(RTLD_NEXT, "cuptiActivityRegisterCallbacks");
      // PyTorch's libcupti is a dependency of libtorch_cuda, which Python loads with RTLD_LOCAL:
      // not in the global scope RTLD_NEXT searches, while Kineto's call binds to this export.
      // Failing it left torch.profiler with no CUDA activity at all under the shim.
      if (!p)
        p = offload::hooks::find_loaded("cuptiActivityRegisterCallbacks",
                                        reinterpret_cast<const void*>(&cuptiActivityRegisterCallbacks));
      if (p) found.store(p, std::memory_order_release);
    }
    auto real = reinterpret_cast<Fn>(p);
    if (!real) return CUPTI_ERROR_NOT_INITIALIZED;  // no libcupti loaded: nobody to forward to
    offload::shim::cupti_registering(reinterpret_cast<const void*>(request));
    return real(request, complete);
  });
}

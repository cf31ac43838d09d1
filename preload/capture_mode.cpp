#include "capture_mode.h"

#include <cuda.h>
#undef cuGetProcAddress  // cuda.h maps it to _v2, which hook_table.h declares itself
#include <dlfcn.h>

#include "hooks/hook_table.h"

namespace offload {

static_assert(capture_detail::kRelaxed == CU_STREAM_CAPTURE_MODE_RELAXED);

bool capture_detail::exchange(int* mode) {
  using Exchange = CUresult (*)(CUstreamCaptureMode*);
  static std::atomic<Exchange> fn{nullptr};
  Exchange f = fn.load(std::memory_order_acquire);
  if (!f) {
    void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!h) return false;  // not loaded yet: no capture either
    f = reinterpret_cast<Exchange>(hooks::real_dlsym(h, "cuThreadExchangeStreamCaptureMode"));
    dlclose(h);
    if (!f) return false;
    fn.store(f, std::memory_order_release);
  }
  auto m = static_cast<CUstreamCaptureMode>(*mode);
  if (f(&m) != CUDA_SUCCESS) return false;
  *mode = static_cast<int>(m);
  return true;
}

void note_capture_error(int result) {
  if (result == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED || result == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ||
      result == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT || result == CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD)
    note_capture_seen();
}

void relax_capture_checks_for_good() {
  if (capture_detail::relaxed_for_good) return;
  int mode = capture_detail::kRelaxed;
  capture_detail::relaxed_for_good = capture_detail::exchange(&mode);
}

}  // namespace offload

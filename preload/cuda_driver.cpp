#include "cuda_driver.h"

#include <cuda.h>
#undef cuGetProcAddress
#include <dlfcn.h>

#include "hooks/hook_table.h"

namespace offload {

CudaDriver::CudaDriver() = default;

bool CudaDriver::ready() {
  // Resolved on first use (a kernel's first launch), when libcuda is certainly loaded.
  if (resolved_) return func_param_info_ != nullptr;
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (h) {
    func_param_info_ = reinterpret_cast<GetParamInfo>(hooks::real_dlsym(h, "cuFuncGetParamInfo"));
    kernel_param_info_ = reinterpret_cast<GetParamInfo>(hooks::real_dlsym(h, "cuKernelGetParamInfo"));
    func_get_name_ = reinterpret_cast<GetName>(hooks::real_dlsym(h, "cuFuncGetName"));
    kernel_get_name_ = reinterpret_cast<GetName>(hooks::real_dlsym(h, "cuKernelGetName"));
  }
  resolved_ = true;
  return func_param_info_ != nullptr;
}

int CudaDriver::param_layout(Func f, ParamInfo* out, int cap) {
  if (!ready()) return -1;
  // cuLaunchKernel accepts a CUkernel in place of a CUfunction: ask as one, then the other.
  // Past the last parameter the driver answers CUDA_ERROR_INVALID_VALUE; a handle of the
  // other kind gets a different error.
  for (GetParamInfo q : {func_param_info_, kernel_param_info_}) {
    if (!q) continue;
    for (int n = 0; n <= 4096; ++n) {
      size_t off = 0, size = 0;
      int r = q(f, static_cast<size_t>(n), &off, &size);
      if (r == CUDA_ERROR_INVALID_VALUE) return n;
      if (r != CUDA_SUCCESS) break;
      if (n < cap) out[n] = ParamInfo{static_cast<uint32_t>(off), static_cast<uint32_t>(size)};
    }
  }
  return -1;
}

const char* CudaDriver::func_name(Func f) {
  if (!ready()) return nullptr;
  for (GetName q : {func_get_name_, kernel_get_name_}) {
    const char* name = nullptr;
    if (q && q(&name, f) == CUDA_SUCCESS && name) return name;
  }
  return nullptr;
}

}  // namespace offload

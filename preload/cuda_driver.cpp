#include "cuda_driver.h"

#include <cuda.h>
#undef cuGetProcAddress
#include <dlfcn.h>

#include <mutex>

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
  // Called from a launch hook: the launching thread's context is the one to pin host memory in.
  if (!ctx_.load(std::memory_order_relaxed))
    if (const EventApi* a = events()) {
      void* c = nullptr;
      if (a->get_ctx(&c) == CUDA_SUCCESS && c) ctx_.store(c, std::memory_order_relaxed);
    }
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

namespace offload {
namespace {
struct MarkerRec {
  void* event;
  void* ctx;
};
}  // namespace

const CudaDriver::EventApi* CudaDriver::events() {
  static EventApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!h) return;
    auto sym = [&](const char* a, const char* b = nullptr) {
      void* p = hooks::real_dlsym(h, a);
      return p || !b ? p : hooks::real_dlsym(h, b);
    };
    api.create = reinterpret_cast<int (*)(void**, unsigned)>(sym("cuEventCreate"));
    api.record = reinterpret_cast<int (*)(void*, void*)>(sym("cuEventRecord"));
    api.query = reinterpret_cast<int (*)(void*)>(sym("cuEventQuery"));
    api.elapsed = reinterpret_cast<int (*)(float*, void*, void*)>(sym("cuEventElapsedTime_v2", "cuEventElapsedTime"));
    api.destroy = reinterpret_cast<int (*)(void*)>(sym("cuEventDestroy_v2", "cuEventDestroy"));
    api.get_ctx = reinterpret_cast<int (*)(void**)>(sym("cuCtxGetCurrent"));
    api.push_ctx = reinterpret_cast<int (*)(void*)>(sym("cuCtxPushCurrent_v2", "cuCtxPushCurrent"));
    api.pop_ctx = reinterpret_cast<int (*)(void**)>(sym("cuCtxPopCurrent_v2", "cuCtxPopCurrent"));
    api.host_register = reinterpret_cast<int (*)(void*, size_t, unsigned)>(sym("cuMemHostRegister_v2", "cuMemHostRegister"));
  });
  const EventApi* a = &api;
  return a->create && a->record && a->query && a->elapsed && a->destroy && a->get_ctx && a->push_ctx && a->pop_ctx
             ? a
             : nullptr;
}

uint64_t CudaDriver::record_marker(Stream s) {
  const EventApi* a = events();
  if (!a) return 0;
  void* ctx = nullptr;
  void* ev = nullptr;
  if (a->get_ctx(&ctx) != CUDA_SUCCESS || !ctx || a->create(&ev, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return 0;
  if (a->record(ev, reinterpret_cast<void*>(s)) != CUDA_SUCCESS) {
    a->destroy(ev);
    return 0;
  }
  return reinterpret_cast<uint64_t>(new MarkerRec{ev, ctx});
}

int64_t CudaDriver::marker_elapsed_ns(uint64_t from, uint64_t to) {
  const EventApi* a = events();
  if (!a || !from || !to) return -1;
  auto* f = reinterpret_cast<MarkerRec*>(from);
  auto* t = reinterpret_cast<MarkerRec*>(to);
  // The worker thread has no context of its own: borrow the markers'.
  if (a->push_ctx(f->ctx) != CUDA_SUCCESS) return -1;
  float ms = 0;
  int64_t ns = -1;
  if (a->query(f->event) == CUDA_SUCCESS && a->query(t->event) == CUDA_SUCCESS &&
      a->elapsed(&ms, f->event, t->event) == CUDA_SUCCESS)
    ns = static_cast<int64_t>(static_cast<double>(ms) * 1e6);
  void* popped = nullptr;
  a->pop_ctx(&popped);
  return ns;
}

void CudaDriver::release_marker(uint64_t m) {
  const EventApi* a = events();
  if (!a || !m) return;
  auto* r = reinterpret_cast<MarkerRec*>(m);
  if (a->push_ctx(r->ctx) == CUDA_SUCCESS) {
    a->destroy(r->event);
    void* popped = nullptr;
    a->pop_ctx(&popped);
  }
  delete r;
}

}  // namespace offload

namespace offload {
bool CudaDriver::pin_host(void* p, uint64_t bytes) {
  const EventApi* a = events();
  void* ctx = ctx_.load(std::memory_order_relaxed);
  if (!a || !a->host_register || !ctx || a->push_ctx(ctx) != CUDA_SUCCESS) return false;
  bool ok = a->host_register(p, static_cast<size_t>(bytes), CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS;
  void* popped = nullptr;
  a->pop_ctx(&popped);
  return ok;
}
}  // namespace offload

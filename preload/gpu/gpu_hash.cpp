#include "gpu/gpu_hash.h"

#include <cuda.h>
#undef cuGetProcAddress  // cuda.h names its newest version; the hook table lists both
#include <dlfcn.h>

#include "common/log.h"
#include "gpu/range_hash_ptx.h"
#include "hooks/hook_table.h"

namespace offload::gpu {

bool GpuHash::load_locked(void* ctx) {
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return false;
  // The real entry points: the module, its launches and its host memory are the shim's own.
  auto sym = [h](const char* name) { return hooks::real_dlsym(h, name); };
  auto load = reinterpret_cast<decltype(&cuModuleLoadData)>(sym("cuModuleLoadData"));
  auto get = reinterpret_cast<decltype(&cuModuleGetFunction)>(sym("cuModuleGetFunction"));
  auto host_alloc = reinterpret_cast<decltype(&cuMemHostAlloc)>(sym("cuMemHostAlloc"));
  auto dev_ptr = reinterpret_cast<decltype(&cuMemHostGetDevicePointer_v2)>(sym("cuMemHostGetDevicePointer_v2"));
  launch_ = reinterpret_cast<Launch>(sym("cuLaunchKernel"));
  if (!load || !get || !host_alloc || !dev_ptr || !launch_) return false;
  CUmodule mod = nullptr;
  CUfunction fn = nullptr;
  void* parts = nullptr;
  CUdeviceptr dev = 0;
  CUresult r = load(&mod, kRangeHashPtx);
  if (r == CUDA_SUCCESS) r = get(&fn, mod, "offload_range_hash");
  if (r == CUDA_SUCCESS)
    r = host_alloc(&parts, size_t(kTickets) * kBlocks * sizeof(uint64_t), CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE);
  if (r == CUDA_SUCCESS) r = dev_ptr(&dev, parts, 0);
  if (r != CUDA_SUCCESS) {
    log().warn("recompute: the hashing kernel could not be loaded (CUresult {}): probes copy to the host", int(r));
    return false;
  }
  ctx_ = ctx, fn_ = fn, parts_ = static_cast<uint64_t*>(parts), dev_parts_ = dev;
  return true;
}

int64_t GpuHash::start(void* ctx, uint64_t va, uint64_t bytes, void* stream) {
  std::lock_guard lock(mu_);
  if (state_ == 0) state_ = load_locked(ctx) ? 1 : -1;
  if (state_ < 0 || ctx != ctx_) return -1;
  const int64_t t = next_++;
  CUdeviceptr out = dev_parts_ + uint64_t(t % kTickets) * kBlocks * sizeof(uint64_t);
  CUdeviceptr src = va;
  unsigned long long n = bytes;
  void* params[] = {&src, &n, &out};
  if (launch_(fn_, kBlocks, 1, 1, kThreads, 1, 1, 0, stream, params, nullptr) != CUDA_SUCCESS) return -1;
  return t;
}

uint64_t GpuHash::value(int64_t ticket) const {
  const uint64_t* p = parts_ + uint64_t(ticket % kTickets) * kBlocks;
  uint64_t h = 0;
  for (unsigned b = 0; b < kBlocks; ++b) h += p[b];
  return h;
}

}  // namespace offload::gpu

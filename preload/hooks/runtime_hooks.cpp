// Allocation hooks. Route 1: PyTorch under PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
// allocates every tensor with cudaMallocAsync and frees it with cudaFreeAsync; our exported
// definitions bind ahead of libcudart's. Route 2: the offload_malloc/offload_free pair for
// torch.cuda.memory.CUDAPluggableAllocator, on the driver's stream-ordered pool.
#include <cuda.h>
#undef cuGetProcAddress
#include <cuda_runtime_api.h>

#include <utility>

#include "hooks/hook.h"
#include "offload/offload.h"

#define OFFLOAD_EXPORT extern "C" __attribute__((visibility("default")))

using namespace offload;
using namespace offload::hooks;

namespace {
inline DevPtr dptr(const void* p) { return reinterpret_cast<DevPtr>(p); }

// The device was full with blocks the shim kept: their frees go to the allocator, and the
// failure that found it full is taken off the runtime's last error.
void free_kept(const std::pair<DevPtr, Stream>* kept, size_t n) noexcept {
  auto free_async = real_as<HookId::cudaFreeAsync, decltype(&::cudaFreeAsync)>();
  for (size_t i = 0; i < n; ++i)
    if (free_async) free_async(reinterpret_cast<void*>(kept[i].first), reinterpret_cast<cudaStream_t>(kept[i].second));
  // Found as the real entry points are: in whichever library defines it, loaded locally or not.
  static auto get_last = reinterpret_cast<decltype(&::cudaGetLastError)>(
      find_loaded("cudaGetLastError", reinterpret_cast<const void*>(&free_kept)));
  if (get_last) (void)get_last();
}
}  // namespace

#define MALLOC_ASYNC(NAME, PTSZ)                                                                    \
  OFFLOAD_EXPORT cudaError_t NAME(void** p, size_t n, cudaStream_t s) {                             \
    return allocate<HookId::NAME, decltype(&::cudaMallocAsync)>(                                    \
        p, n, stream_id(s, PTSZ), [&](auto real) { return real(p, n, s); }, free_kept);          \
  }
MALLOC_ASYNC(cudaMallocAsync, false)
MALLOC_ASYNC(cudaMallocAsync_ptsz, true)

#define MALLOC_FROM_POOL(NAME, PTSZ)                                                                \
  OFFLOAD_EXPORT cudaError_t NAME(void** p, size_t n, cudaMemPool_t pool, cudaStream_t s) {         \
    return allocate<HookId::NAME, decltype(&::cudaMallocFromPoolAsync)>(                            \
        p, n, stream_id(s, PTSZ), [&](auto real) { return real(p, n, pool, s); });                  \
  }
MALLOC_FROM_POOL(cudaMallocFromPoolAsync, false)
MALLOC_FROM_POOL(cudaMallocFromPoolAsync_ptsz, true)

#define FREE_ASYNC(NAME, PTSZ)                                                                      \
  OFFLOAD_EXPORT cudaError_t NAME(void* p, cudaStream_t s) {                                        \
    return release<HookId::NAME, decltype(&::cudaFreeAsync)>(                                       \
        p, stream_id(s, PTSZ), [&](auto real) { return real(p, s); });                              \
  }
FREE_ASYNC(cudaFreeAsync, false)
FREE_ASYNC(cudaFreeAsync_ptsz, true)

// Route 2. PyTorch makes `device` current before calling us; the runtime's stream-ordered
// allocator (the real cudaMallocAsync, as under route 1) serves the device's default pool
// and initialises the context on threads that have not used CUDA yet (autograd's).
OFFLOAD_EXPORT void* offload_malloc(size_t size, int, void* stream) {
  void* p = nullptr;
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t r = allocate<HookId::cudaMallocAsync, decltype(&::cudaMallocAsync)>(
      &p, size, dptr(stream), [&](auto real) { return real(&p, size, s); }, free_kept);
  return r == cudaSuccess ? p : nullptr;
}

OFFLOAD_EXPORT void offload_free(void* ptr, size_t, int, void* stream) {
  release<HookId::cudaFreeAsync, decltype(&::cudaFreeAsync)>(
      ptr, dptr(stream), [&](auto real) { return real(ptr, static_cast<cudaStream_t>(stream)); });
}

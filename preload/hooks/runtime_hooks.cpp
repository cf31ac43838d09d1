// Allocation hooks. Route 1: PyTorch under PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
// allocates every tensor with cudaMallocAsync and frees it with cudaFreeAsync; our exported
// definitions bind ahead of libcudart's. Route 2: the offload_malloc/offload_free pair for
// torch.cuda.memory.CUDAPluggableAllocator, on the driver's stream-ordered pool.
#include <cuda.h>
#undef cuGetProcAddress
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <utility>
#include <vector>

#include "hooks/hook.h"
#include "offload/offload.h"

#define OFFLOAD_EXPORT extern "C" __attribute__((visibility("default")))

using namespace offload;
using namespace offload::hooks;

namespace {
inline DevPtr dptr(const void* p) { return reinterpret_cast<DevPtr>(p); }

// Blocks kept by the BlockCache, freed through the allocator on the streams that freed them.
void free_kept(const std::vector<std::pair<DevPtr, Stream>>& kept) {
  auto free_async = real_as<HookId::cudaFreeAsync, decltype(&::cudaFreeAsync)>();
  for (auto [q, qs] : kept)
    if (free_async) free_async(reinterpret_cast<void*>(q), reinterpret_cast<cudaStream_t>(qs));
}

// A runtime entry point the shim calls but does not hook, found as the real ones are: in
// whichever library defines it, loaded locally or not. Looked up until found.
template <class Fn>
Fn runtime_fn(std::atomic<Fn>& cached, const char* name) {
  Fn f = cached.load(std::memory_order_acquire);
  if (!f) {
    f = reinterpret_cast<Fn>(find_loaded(name, reinterpret_cast<const void*>(&free_kept)));
    cached.store(f, std::memory_order_release);
  }
  return f;
}

// The device was full with blocks kept by the BlockCache: their frees go to the allocator, and
// the failure that found it full is taken off the runtime's last error.
void forward_kept(const std::vector<std::pair<DevPtr, Stream>>& kept) {
  free_kept(kept);
  static std::atomic<decltype(&::cudaGetLastError)> get_last{nullptr};
  if (auto f = runtime_fn(get_last, "cudaGetLastError")) (void)f();
}
}  // namespace

#define MALLOC_ASYNC(NAME, PTSZ)                                                                    \
  OFFLOAD_EXPORT cudaError_t NAME(void** p, size_t n, cudaStream_t s) {                             \
    return allocate<HookId::NAME, decltype(&::cudaMallocAsync)>(                                    \
        p, n, stream_id(s, PTSZ), [&](auto real) { return real(p, n, s); }, forward_kept);          \
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

// torch.cuda.empty_cache() under backend:cudaMallocAsync synchronizes the device and trims its
// pool to give its memory back; blocks the BlockCache keeps would stay out of that. So the
// current device's kept blocks (PyTorch makes the pool's device current first) are freed on
// their streams, those streams synchronized so that the frees have run when the trim looks,
// and then the trim is forwarded. Nothing kept, the trim is forwarded alone.
OFFLOAD_EXPORT cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t min_bytes_to_keep) {
  static std::atomic<decltype(&::cudaMemPoolTrimTo)> trim{nullptr};
  static std::atomic<decltype(&::cudaStreamSynchronize)> sync{nullptr};
  {
    HookGuard guard;
    Runtime* rt = guard.outermost() ? runtime() : nullptr;
    if (rt) {
      auto kept = rt->drain_cache();
      if (!kept.empty()) {
        free_kept(kept);
        std::vector<Stream> streams;
        for (auto [q, qs] : kept)
          if (std::find(streams.begin(), streams.end(), qs) == streams.end()) streams.push_back(qs);
        if (auto f = runtime_fn(sync, "cudaStreamSynchronize"))
          for (Stream qs : streams) (void)f(reinterpret_cast<cudaStream_t>(qs));
      }
    }
  }
  auto f = runtime_fn(trim, "cudaMemPoolTrimTo");
  return f ? f(pool, min_bytes_to_keep) : cudaErrorNotSupported;
}

// Route 2. PyTorch makes `device` current before calling us; the runtime's stream-ordered
// allocator (the real cudaMallocAsync, as under route 1) serves the device's default pool
// and initialises the context on threads that have not used CUDA yet (autograd's).
OFFLOAD_EXPORT void* offload_malloc(size_t size, int, void* stream) {
  void* p = nullptr;
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t r = allocate<HookId::cudaMallocAsync, decltype(&::cudaMallocAsync)>(
      &p, size, dptr(stream), [&](auto real) { return real(&p, size, s); }, forward_kept);
  return r == cudaSuccess ? p : nullptr;
}

OFFLOAD_EXPORT void offload_free(void* ptr, size_t, int, void* stream) {
  release<HookId::cudaFreeAsync, decltype(&::cudaFreeAsync)>(
      ptr, dptr(stream), [&](auto real) { return real(ptr, static_cast<cudaStream_t>(stream)); });
}

// The one hook table: every CUDA name liboffload.so interposes, listed once.
//
// Every route by which a caller can obtain an entry point is served from this table:
//   export   - our exported symbol of the same name binds first (LD_PRELOAD)
//   dlsym    - dlsym on any handle returns our wrapper for a listed name
//   gpa      - cuGetProcAddress (v1 and _v2) returns our wrapper for the base name, picking
//              the variant by cudaVersion and the per-thread-stream flag, as the driver does
//   rt_entry - cudaGetDriverEntryPoint / cudaGetDriverEntryPointByVersion, likewise
// The first real entry point any route resolves for a name is stored in its slot and is
// what our wrapper forwards to (the driver hands out equivalent pointers per name).
//
// Threading: slots are atomics; lookups take no lock and allocate nothing.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

// cuda.h maps this name to its newest version; the table lists both versions by their own names.
#undef cuMemcpyBatchAsync

// X(symbol, base name for cuGetProcAddress, first cudaVersion of this variant, ptsz)
#define OFFLOAD_DRIVER_HOOKS(X)                                         \
  X(cuLaunchKernel, "cuLaunchKernel", 4000, 0)                          \
  X(cuLaunchKernel_ptsz, "cuLaunchKernel", 7000, 1)                     \
  X(cuLaunchKernelEx, "cuLaunchKernelEx", 11060, 0)                     \
  X(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 11060, 1)                \
  X(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 9000, 0)    \
  X(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 9000, 1) \
  X(cuMemcpyAsync, "cuMemcpyAsync", 4000, 0)                            \
  X(cuMemcpyAsync_ptsz, "cuMemcpyAsync", 7000, 1)                       \
  X(cuMemcpyHtoDAsync_v2, "cuMemcpyHtoDAsync", 3020, 0)                 \
  X(cuMemcpyHtoDAsync_v2_ptsz, "cuMemcpyHtoDAsync", 7000, 1)            \
  X(cuMemcpyDtoHAsync_v2, "cuMemcpyDtoHAsync", 3020, 0)                 \
  X(cuMemcpyDtoHAsync_v2_ptsz, "cuMemcpyDtoHAsync", 7000, 1)            \
  X(cuMemcpyDtoDAsync_v2, "cuMemcpyDtoDAsync", 3020, 0)                 \
  X(cuMemcpyDtoDAsync_v2_ptsz, "cuMemcpyDtoDAsync", 7000, 1)            \
  X(cuMemcpyPeerAsync, "cuMemcpyPeerAsync", 4000, 0)                    \
  X(cuMemcpyPeerAsync_ptsz, "cuMemcpyPeerAsync", 7000, 1)               \
  X(cuMemcpy2DAsync_v2, "cuMemcpy2DAsync", 3020, 0)                     \
  X(cuMemcpy2DAsync_v2_ptsz, "cuMemcpy2DAsync", 7000, 1)                \
  X(cuMemcpy, "cuMemcpy", 4000, 0)                                      \
  X(cuMemcpy_ptds, "cuMemcpy", 7000, 1)                                 \
  X(cuMemcpyHtoD_v2, "cuMemcpyHtoD", 3020, 0)                           \
  X(cuMemcpyHtoD_v2_ptds, "cuMemcpyHtoD", 7000, 1)                      \
  X(cuMemcpyDtoH_v2, "cuMemcpyDtoH", 3020, 0)                           \
  X(cuMemcpyDtoH_v2_ptds, "cuMemcpyDtoH", 7000, 1)                      \
  X(cuMemcpyDtoD_v2, "cuMemcpyDtoD", 3020, 0)                           \
  X(cuMemcpyDtoD_v2_ptds, "cuMemcpyDtoD", 7000, 1)                      \
  X(cuMemcpyPeer, "cuMemcpyPeer", 4000, 0)                              \
  X(cuMemcpyPeer_ptds, "cuMemcpyPeer", 7000, 1)                         \
  X(cuMemcpy2D_v2, "cuMemcpy2D", 3020, 0)                               \
  X(cuMemcpy2D_v2_ptds, "cuMemcpy2D", 7000, 1)                          \
  X(cuMemcpy2DUnaligned_v2, "cuMemcpy2DUnaligned", 3020, 0)             \
  X(cuMemcpy2DUnaligned_v2_ptds, "cuMemcpy2DUnaligned", 7000, 1)        \
  X(cuMemcpy3D_v2, "cuMemcpy3D", 3020, 0)                               \
  X(cuMemcpy3D_v2_ptds, "cuMemcpy3D", 7000, 1)                          \
  X(cuMemcpy3DAsync_v2, "cuMemcpy3DAsync", 3020, 0)                     \
  X(cuMemcpy3DAsync_v2_ptsz, "cuMemcpy3DAsync", 7000, 1)                \
  X(cuMemcpy3DPeer, "cuMemcpy3DPeer", 4000, 0)                          \
  X(cuMemcpy3DPeer_ptds, "cuMemcpy3DPeer", 7000, 1)                     \
  X(cuMemcpy3DPeerAsync, "cuMemcpy3DPeerAsync", 4000, 0)                \
  X(cuMemcpy3DPeerAsync_ptsz, "cuMemcpy3DPeerAsync", 7000, 1)           \
  X(cuMemcpyBatchAsync, "cuMemcpyBatchAsync", 12080, 0)                 \
  X(cuMemcpyBatchAsync_ptsz, "cuMemcpyBatchAsync", 12080, 1)            \
  X(cuMemcpyBatchAsync_v2, "cuMemcpyBatchAsync", 13000, 0)              \
  X(cuMemcpyBatchAsync_v2_ptsz, "cuMemcpyBatchAsync", 13000, 1)         \
  X(cuMemsetD8_v2, "cuMemsetD8", 3020, 0)                               \
  X(cuMemsetD8_v2_ptds, "cuMemsetD8", 7000, 1)                          \
  X(cuMemsetD16_v2, "cuMemsetD16", 3020, 0)                             \
  X(cuMemsetD16_v2_ptds, "cuMemsetD16", 7000, 1)                        \
  X(cuMemsetD32_v2, "cuMemsetD32", 3020, 0)                             \
  X(cuMemsetD32_v2_ptds, "cuMemsetD32", 7000, 1)                        \
  X(cuMemsetD2D8_v2, "cuMemsetD2D8", 3020, 0)                           \
  X(cuMemsetD2D8_v2_ptds, "cuMemsetD2D8", 7000, 1)                      \
  X(cuMemsetD2D16_v2, "cuMemsetD2D16", 3020, 0)                         \
  X(cuMemsetD2D16_v2_ptds, "cuMemsetD2D16", 7000, 1)                    \
  X(cuMemsetD2D32_v2, "cuMemsetD2D32", 3020, 0)                         \
  X(cuMemsetD2D32_v2_ptds, "cuMemsetD2D32", 7000, 1)                    \
  X(cuMemsetD8Async, "cuMemsetD8Async", 3020, 0)                        \
  X(cuMemsetD8Async_ptsz, "cuMemsetD8Async", 7000, 1)                   \
  X(cuMemsetD16Async, "cuMemsetD16Async", 3020, 0)                      \
  X(cuMemsetD16Async_ptsz, "cuMemsetD16Async", 7000, 1)                 \
  X(cuMemsetD32Async, "cuMemsetD32Async", 3020, 0)                      \
  X(cuMemsetD32Async_ptsz, "cuMemsetD32Async", 7000, 1)                 \
  X(cuMemsetD2D8Async, "cuMemsetD2D8Async", 3020, 0)                    \
  X(cuMemsetD2D8Async_ptsz, "cuMemsetD2D8Async", 7000, 1)               \
  X(cuMemsetD2D16Async, "cuMemsetD2D16Async", 3020, 0)                  \
  X(cuMemsetD2D16Async_ptsz, "cuMemsetD2D16Async", 7000, 1)             \
  X(cuMemsetD2D32Async, "cuMemsetD2D32Async", 3020, 0)                  \
  X(cuMemsetD2D32Async_ptsz, "cuMemsetD2D32Async", 7000, 1)             \
  X(cuGraphLaunch, "cuGraphLaunch", 10000, 0)                           \
  X(cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, 1)                      \
  X(cuPointerGetAttribute, "cuPointerGetAttribute", 4000, 0)            \
  X(cuPointerGetAttributes, "cuPointerGetAttributes", 7000, 0)          \
  X(cuGetProcAddress, "cuGetProcAddress", 11030, 0)                     \
  X(cuGetProcAddress_v2, "cuGetProcAddress", 12000, 0)

// X(symbol, ptsz): runtime (and NCCL) names, served by export and dlsym only.
#define OFFLOAD_RUNTIME_HOOKS(X)                  \
  X(cudaMallocAsync, 0)                           \
  X(cudaMallocAsync_ptsz, 1)                      \
  X(cudaFreeAsync, 0)                             \
  X(cudaFreeAsync_ptsz, 1)                        \
  X(cudaMallocFromPoolAsync, 0)                   \
  X(cudaMallocFromPoolAsync_ptsz, 1)              \
  X(cudaGetDriverEntryPoint, 0)                   \
  X(cudaGetDriverEntryPoint_ptsz, 1)              \
  X(cudaGetDriverEntryPointByVersion, 0)          \
  X(cudaGetDriverEntryPointByVersion_ptsz, 1)    \
  X(ncclAllReduce, 0)                             \
  X(ncclBroadcast, 0)                             \
  X(ncclBcast, 0)                                 \
  X(ncclReduce, 0)                                \
  X(ncclAllGather, 0)                             \
  X(ncclReduceScatter, 0)                         \
  X(ncclSend, 0)                                  \
  X(ncclRecv, 0)

namespace offload::hooks {

enum class HookId : uint16_t {
#define OFFLOAD_ENUM_D(sym, base, ver, ptsz) sym,
#define OFFLOAD_ENUM_R(sym, ptsz) sym,
  OFFLOAD_DRIVER_HOOKS(OFFLOAD_ENUM_D) OFFLOAD_RUNTIME_HOOKS(OFFLOAD_ENUM_R)
#undef OFFLOAD_ENUM_D
#undef OFFLOAD_ENUM_R
  kCount
};

enum Route : uint32_t { kExport = 1, kDlsym = 2, kGetProcAddress = 4, kRuntimeEntryPoint = 8 };

struct HookEntry {
  const char* symbol;
  const char* base;     // nullptr for runtime names
  int min_version;
  bool ptsz;
  bool driver;          // lives in libcuda (else libcudart)
  void* wrapper;        // our function
  std::atomic<void*> real{nullptr};
  std::atomic<uint32_t> routes{0};  // Route bits that handed out `wrapper`
};

HookEntry* hook_table();
constexpr size_t kHookCount = static_cast<size_t>(HookId::kCount);

inline HookEntry& entry(HookId id) { return hook_table()[static_cast<size_t>(id)]; }

// The entry whose exported name is `symbol`, or nullptr.
HookEntry* find_symbol(const char* symbol);
// The entry cuGetProcAddress would resolve `base` to, or nullptr.
HookEntry* find_proc(const char* base, int cuda_version, bool ptsz);

// Route bookkeeping: given the real entry point a route found for a name, remembers it
// and returns what the caller should receive (our wrapper, or `real` if not ours).
void* serve_symbol(const char* symbol, void* real, Route route);
void* serve_proc(const char* base, void* real, int cuda_version, bool ptsz, Route route);

// The real entry point behind `id`, resolving it from libcuda/libcudart if no route has
// yet. Aborts with a message naming the symbol if it cannot be found: forwarding to
// nothing would be worse.
void* real(HookId id);

// dlsym that is never ours (bootstrapped with dlvsym).
void* real_dlsym(void* handle, const char* name);
// The first definition of `name` in a loaded library other than the one holding `self`,
// in load order, whether the library was loaded globally or locally (RTLD_LOCAL). Slow (a
// dlopen per library): for entry points resolved once. The names are looked at in batches of
// at most `batch` libraries (0: as many as fit its room), for tests.
void* find_loaded(const char* name, const void* self, size_t batch = 0);

// dlsym(RTLD_NEXT) lookups answered by walking the load order (those not answered from the
// answers kept per calling site and name).
uint64_t dlsym_next_walks();

// Counters for routes that handed out a real, unwrapped entry point of a listed name
// (a version we do not wrap): launches through it are invisible to us.
uint64_t unwrapped_routes();

}  // namespace offload::hooks

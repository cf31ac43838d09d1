// Driver-API hooks: kernel launches, async copies and memsets, graph launches.
// Each is one line: hook.h's launch<> guards, forwards, and tells the tracker.
#include <cuda.h>
#undef cuGetProcAddress

#include "hooks/hook.h"
#include "hooks/launch_attrs.h"

#define OFFLOAD_EXPORT extern "C" __attribute__((visibility("default")))

using namespace offload;
using namespace offload::hooks;

namespace {
inline Func fn(CUfunction f) { return reinterpret_cast<Func>(f); }
inline DevPtr dev(CUdeviceptr p) { return static_cast<DevPtr>(p); }
inline DevPtr host(const void*) { return 0; }  // host side of a copy: not ours to track

}  // namespace

#define LAUNCH_KERNEL(NAME, PTSZ)                                                                   \
  OFFLOAD_EXPORT CUresult NAME(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,    \
                               unsigned by, unsigned bz, unsigned smem, CUstream s, void** p, void** e) { \
    return launch<HookId::NAME, decltype(&::cuLaunchKernel)>(                                       \
        [&](Runtime& rt) {                                                                          \
          const shim::Geom g{{gx, gy, gz}, {bx, by, bz}, smem};                                     \
          shim::on_kernel(rt, fn(f), stream_id(s, PTSZ), p, e, &g);                                 \
        },                                                                                          \
        [&](auto real) { return real(f, gx, gy, gz, bx, by, bz, smem, s, p, e); });                 \
  }
LAUNCH_KERNEL(cuLaunchKernel, false)
LAUNCH_KERNEL(cuLaunchKernel_ptsz, true)

#define LAUNCH_KERNEL_EX(NAME, PTSZ)                                                                \
  OFFLOAD_EXPORT CUresult NAME(const CUlaunchConfig* c, CUfunction f, void** p, void** e) {         \
    return launch<HookId::NAME, decltype(&::cuLaunchKernelEx)>(                                     \
        [&](Runtime& rt) {                                                                          \
          const shim::Geom g = c ? shim::Geom{{c->gridDimX, c->gridDimY, c->gridDimZ},              \
                                              {c->blockDimX, c->blockDimY, c->blockDimZ},           \
                                              c->sharedMemBytes, c->attrs, c->numAttrs,             \
                                              unsigned(c->numAttrs * sizeof(CUlaunchAttribute))}    \
                                 : shim::Geom{};                                                    \
          shim::on_kernel(rt, fn(f), stream_id(c ? c->hStream : nullptr, PTSZ), p, e,               \
                          c && relaunchable(c) ? &g : nullptr);                                     \
        },                                                                                          \
        [&](auto real) { return real(c, f, p, e); });                                               \
  }
LAUNCH_KERNEL_EX(cuLaunchKernelEx, false)
LAUNCH_KERNEL_EX(cuLaunchKernelEx_ptsz, true)

#define LAUNCH_COOPERATIVE(NAME, PTSZ)                                                              \
  OFFLOAD_EXPORT CUresult NAME(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,    \
                               unsigned by, unsigned bz, unsigned smem, CUstream s, void** p) {     \
    return launch<HookId::NAME, decltype(&::cuLaunchCooperativeKernel)>(                            \
        [&](Runtime& rt) { shim::on_kernel(rt, fn(f), stream_id(s, PTSZ), p, nullptr); },             \
        [&](auto real) { return real(f, gx, gy, gz, bx, by, bz, smem, s, p); });                    \
  }
LAUNCH_COOPERATIVE(cuLaunchCooperativeKernel, false)
LAUNCH_COOPERATIVE(cuLaunchCooperativeKernel_ptsz, true)

// HSRC: the host source of a host-to-device copy (scanned for device pointers: a pointer table).
#define COPY(NAME, BASE, PTSZ, PARAMS, ARGS, DST, SRC, BYTES, HSRC)                                 \
  OFFLOAD_EXPORT CUresult NAME PARAMS {                                                             \
    return launch<HookId::NAME, decltype(&::BASE)>(                                                 \
        [&](Runtime& rt) { shim::on_copy(rt, DST, SRC, BYTES, stream_id(s, PTSZ), HSRC); },           \
        [&](auto real) { return real ARGS; });                                                      \
  }
COPY(cuMemcpyAsync, cuMemcpyAsync, false, (CUdeviceptr d, CUdeviceptr sr, size_t n, CUstream s),
     (d, sr, n, s), dev(d), dev(sr), n, nullptr)
COPY(cuMemcpyAsync_ptsz, cuMemcpyAsync, true, (CUdeviceptr d, CUdeviceptr sr, size_t n, CUstream s),
     (d, sr, n, s), dev(d), dev(sr), n, nullptr)
COPY(cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2, false, (CUdeviceptr d, const void* h, size_t n, CUstream s),
     (d, h, n, s), dev(d), host(h), n, h)
COPY(cuMemcpyHtoDAsync_v2_ptsz, cuMemcpyHtoDAsync_v2, true, (CUdeviceptr d, const void* h, size_t n, CUstream s),
     (d, h, n, s), dev(d), host(h), n, h)
COPY(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2, false, (void* h, CUdeviceptr sr, size_t n, CUstream s),
     (h, sr, n, s), host(h), dev(sr), n, nullptr)
COPY(cuMemcpyDtoHAsync_v2_ptsz, cuMemcpyDtoHAsync_v2, true, (void* h, CUdeviceptr sr, size_t n, CUstream s),
     (h, sr, n, s), host(h), dev(sr), n, nullptr)
COPY(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2, false, (CUdeviceptr d, CUdeviceptr sr, size_t n, CUstream s),
     (d, sr, n, s), dev(d), dev(sr), n, nullptr)
COPY(cuMemcpyDtoDAsync_v2_ptsz, cuMemcpyDtoDAsync_v2, true, (CUdeviceptr d, CUdeviceptr sr, size_t n, CUstream s),
     (d, sr, n, s), dev(d), dev(sr), n, nullptr)
COPY(cuMemcpyPeerAsync, cuMemcpyPeerAsync, false,
     (CUdeviceptr d, CUcontext dc, CUdeviceptr sr, CUcontext sc, size_t n, CUstream s),
     (d, dc, sr, sc, n, s), dev(d), dev(sr), n, nullptr)
COPY(cuMemcpyPeerAsync_ptsz, cuMemcpyPeerAsync, true,
     (CUdeviceptr d, CUcontext dc, CUdeviceptr sr, CUcontext sc, size_t n, CUstream s),
     (d, dc, sr, sc, n, s), dev(d), dev(sr), n, nullptr)
COPY(cuMemcpy2DAsync_v2, cuMemcpy2DAsync_v2, false, (const CUDA_MEMCPY2D* c, CUstream s), (c, s),
     c ? dev(c->dstDevice) : 0, c ? dev(c->srcDevice) : 0, c ? c->WidthInBytes * c->Height : 0, nullptr)
COPY(cuMemcpy2DAsync_v2_ptsz, cuMemcpy2DAsync_v2, true, (const CUDA_MEMCPY2D* c, CUstream s), (c, s),
     c ? dev(c->dstDevice) : 0, c ? dev(c->srcDevice) : 0, c ? c->WidthInBytes * c->Height : 0, nullptr)

#define MEMSET(NAME, BASE, PTSZ, T, UNIT)                                                           \
  OFFLOAD_EXPORT CUresult NAME(CUdeviceptr d, T v, size_t n, CUstream s) {                          \
    return launch<HookId::NAME, decltype(&::BASE)>(                                                 \
        [&](Runtime& rt) { shim::on_memset(rt, dev(d), n * UNIT, stream_id(s, PTSZ)); },              \
        [&](auto real) { return real(d, v, n, s); });                                               \
  }
MEMSET(cuMemsetD8Async, cuMemsetD8Async, false, unsigned char, 1)
MEMSET(cuMemsetD8Async_ptsz, cuMemsetD8Async, true, unsigned char, 1)
MEMSET(cuMemsetD16Async, cuMemsetD16Async, false, unsigned short, 2)
MEMSET(cuMemsetD16Async_ptsz, cuMemsetD16Async, true, unsigned short, 2)
MEMSET(cuMemsetD32Async, cuMemsetD32Async, false, unsigned int, 4)
MEMSET(cuMemsetD32Async_ptsz, cuMemsetD32Async, true, unsigned int, 4)

#define MEMSET2D(NAME, BASE, PTSZ, T, UNIT)                                                         \
  OFFLOAD_EXPORT CUresult NAME(CUdeviceptr d, size_t pitch, T v, size_t w, size_t h, CUstream s) {  \
    return launch<HookId::NAME, decltype(&::BASE)>(                                                 \
        [&](Runtime& rt) { shim::on_memset(rt, dev(d), pitch * h, stream_id(s, PTSZ)); },             \
        [&](auto real) { return real(d, pitch, v, w, h, s); });                                     \
  }
MEMSET2D(cuMemsetD2D8Async, cuMemsetD2D8Async, false, unsigned char, 1)
MEMSET2D(cuMemsetD2D8Async_ptsz, cuMemsetD2D8Async, true, unsigned char, 1)
MEMSET2D(cuMemsetD2D32Async, cuMemsetD2D32Async, false, unsigned int, 4)
MEMSET2D(cuMemsetD2D32Async_ptsz, cuMemsetD2D32Async, true, unsigned int, 4)

// A graph replay runs kernels we cannot see one by one: it is recorded as one opaque launch
// (later issues make everything it could touch resident first).
#define GRAPH_LAUNCH(NAME, PTSZ)                                                                    \
  OFFLOAD_EXPORT CUresult NAME(CUgraphExec g, CUstream s) {                                         \
    return launch<HookId::NAME, decltype(&::cuGraphLaunch)>(                                        \
        [&](Runtime& rt) { shim::on_graph(rt, stream_id(s, PTSZ)); },                                 \
        [&](auto real) { return real(g, s); });                                                     \
  }
GRAPH_LAUNCH(cuGraphLaunch, false)
GRAPH_LAUNCH(cuGraphLaunch_ptsz, true)

// Pointer queries. Triton's launchers check every pointer argument with cuPointerGetAttribute
// before they launch: an evicted arena must be mapped again before that check (the launch
// that follows waits for the reload like any other).
OFFLOAD_EXPORT CUresult cuPointerGetAttribute(void* data, CUpointer_attribute a, CUdeviceptr p) {
  return query<HookId::cuPointerGetAttribute, decltype(&::cuPointerGetAttribute)>(
      dev(p), [&](auto real) { return real(data, a, p); });
}

OFFLOAD_EXPORT CUresult cuPointerGetAttributes(unsigned n, CUpointer_attribute* a, void** data, CUdeviceptr p) {
  return query<HookId::cuPointerGetAttributes, decltype(&::cuPointerGetAttributes)>(
      dev(p), [&](auto real) { return real(n, a, data, p); });
}

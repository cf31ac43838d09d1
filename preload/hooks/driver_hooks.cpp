// Driver-API hooks: kernel launches, copies and memsets (stream-ordered and synchronous), graph launches.
// Each is one line: hook.h's launch<> guards, forwards, and tells the tracker.
#include <cuda.h>
#undef cuGetProcAddress

#include <algorithm>

#include "hooks/hook.h"
#include "hooks/launch_attrs.h"

#define OFFLOAD_EXPORT extern "C" __attribute__((visibility("default")))

using namespace offload;
using namespace offload::hooks;

namespace {
inline Func fn(CUfunction f) { return reinterpret_cast<Func>(f); }
inline DevPtr dev(CUdeviceptr p) { return static_cast<DevPtr>(p); }
inline DevPtr host(const void*) { return 0; }  // host side of a copy: not ours to track
// A 2D copy's side: its first byte when it is device memory (a host or array side's device
// pointer is not read by the driver and may hold anything).
inline DevPtr side(CUmemorytype t, CUdeviceptr p, size_t x, size_t y, size_t pitch) {
  return t == CU_MEMORYTYPE_DEVICE || t == CU_MEMORYTYPE_UNIFIED ? dev(p + y * pitch + x) : 0;
}
inline DevPtr dst2d(const CUDA_MEMCPY2D* c) {
  return c ? side(c->dstMemoryType, c->dstDevice, c->dstXInBytes, c->dstY, c->dstPitch) : 0;
}
inline DevPtr src2d(const CUDA_MEMCPY2D* c) {
  return c ? side(c->srcMemoryType, c->srcDevice, c->srcXInBytes, c->srcY, c->srcPitch) : 0;
}
// The bytes a 2D copy spans on its wider side: every row but the last at its pitch, then a row.
inline uint64_t bytes2d(const CUDA_MEMCPY2D* c) {
  if (!c || !c->Height || !c->WidthInBytes) return 0;
  const size_t pitch = std::max({c->srcPitch, c->dstPitch, c->WidthInBytes});
  return uint64_t(pitch) * (c->Height - 1) + c->WidthInBytes;
}
// The same for a 3D copy (CUDA_MEMCPY3D or its cross-context form): a side's first byte is at
// its z, y and x in slices of pitch x height rows.
template <class C>
DevPtr dst3d(const C* c) {
  return c ? side(c->dstMemoryType, c->dstDevice + c->dstZ * c->dstPitch * c->dstHeight, c->dstXInBytes, c->dstY,
                  c->dstPitch)
           : 0;
}
template <class C>
DevPtr src3d(const C* c) {
  return c ? side(c->srcMemoryType, c->srcDevice + c->srcZ * c->srcPitch * c->srcHeight, c->srcXInBytes, c->srcY,
                  c->srcPitch)
           : 0;
}
template <class C>
uint64_t bytes3d(const C* c) {
  if (!c || !c->Height || !c->WidthInBytes || !c->Depth) return 0;
  const uint64_t pitch = std::max({c->srcPitch, c->dstPitch, c->WidthInBytes});
  const uint64_t slice = std::max({c->srcPitch * c->srcHeight, c->dstPitch * c->dstHeight, pitch * c->Height});
  return slice * (c->Depth - 1) + pitch * (c->Height - 1) + c->WidthInBytes;
}

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

// The attributes it would be launched again with are a filtered copy (launch_attrs.h) on the
// hook's stack, valid while it runs: the shim copies what it keeps.
#define LAUNCH_KERNEL_EX(NAME, PTSZ)                                                                \
  OFFLOAD_EXPORT CUresult NAME(const CUlaunchConfig* c, CUfunction f, void** p, void** e) {         \
    return launch<HookId::NAME, decltype(&::cuLaunchKernelEx)>(                                     \
        [&](Runtime& rt) {                                                                          \
          if (!c) return shim::on_kernel(rt, fn(f), stream_id(nullptr, PTSZ), p, e);                \
          CUlaunchAttribute kept[kMaxRelaunchAttrs];                                                \
          const RelaunchAttrs ra = relaunch_attrs(c, kept);                                         \
          const shim::Geom g{{c->gridDimX, c->gridDimY, c->gridDimZ},                               \
                             {c->blockDimX, c->blockDimY, c->blockDimZ},                            \
                             c->sharedMemBytes, kept, ra.n,                                         \
                             unsigned(ra.n * sizeof(CUlaunchAttribute)), ra.refused};               \
          shim::on_kernel(rt, fn(f), stream_id(c->hStream, PTSZ), p, e, &g);                        \
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

// A copy on STREAM, stream-ordered or synchronous. HSRC: the host source of a host-to-device copy
// (scanned for device pointers: a pointer table).
#define COPY_HOOK(NAME, BASE, STREAM, PARAMS, ARGS, DST, SRC, BYTES, HSRC)                          \
  OFFLOAD_EXPORT CUresult NAME PARAMS {                                                             \
    return launch<HookId::NAME, decltype(&::BASE)>(                                                 \
        [&](Runtime& rt) { shim::on_copy(rt, DST, SRC, BYTES, STREAM, HSRC); },                       \
        [&](auto real) { return real ARGS; });                                                      \
  }
#define COPY(NAME, BASE, PTSZ, PARAMS, ARGS, DST, SRC, BYTES, HSRC) \
  COPY_HOOK(NAME, BASE, stream_id(s, PTSZ), PARAMS, ARGS, DST, SRC, BYTES, HSRC)
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
     dst2d(c), src2d(c), bytes2d(c), nullptr)
COPY(cuMemcpy2DAsync_v2_ptsz, cuMemcpy2DAsync_v2, true, (const CUDA_MEMCPY2D* c, CUstream s), (c, s),
     dst2d(c), src2d(c), bytes2d(c), nullptr)

COPY(cuMemcpy3DAsync_v2, cuMemcpy3DAsync_v2, false, (const CUDA_MEMCPY3D* c, CUstream s), (c, s), dst3d(c), src3d(c),
     bytes3d(c), nullptr)
COPY(cuMemcpy3DAsync_v2_ptsz, cuMemcpy3DAsync_v2, true, (const CUDA_MEMCPY3D* c, CUstream s), (c, s), dst3d(c),
     src3d(c), bytes3d(c), nullptr)
COPY(cuMemcpy3DPeerAsync, cuMemcpy3DPeerAsync, false, (const CUDA_MEMCPY3D_PEER* c, CUstream s), (c, s), dst3d(c),
     src3d(c), bytes3d(c), nullptr)
COPY(cuMemcpy3DPeerAsync_ptsz, cuMemcpy3DPeerAsync, true, (const CUDA_MEMCPY3D_PEER* c, CUstream s), (c, s),
     dst3d(c), src3d(c), bytes3d(c), nullptr)

// The synchronous copies, on the default stream (legacy; the calling thread's own for _ptds):
// seen as a copy on that stream, so that what they touch is resident first, then forwarded (the
// driver returns once the copy is done). PyTorch copies asynchronously; other libraries in the
// process (and a copy the user makes with cudaMemcpy) may not.
#define SYNC_COPY(NAME, BASE, PTDS, PARAMS, ARGS, DST, SRC, BYTES, HSRC) \
  COPY_HOOK(NAME, BASE, stream_id(nullptr, PTDS), PARAMS, ARGS, DST, SRC, BYTES, HSRC)
SYNC_COPY(cuMemcpy, cuMemcpy, false, (CUdeviceptr d, CUdeviceptr sr, size_t n), (d, sr, n), dev(d), dev(sr), n, nullptr)
SYNC_COPY(cuMemcpy_ptds, cuMemcpy, true, (CUdeviceptr d, CUdeviceptr sr, size_t n), (d, sr, n), dev(d), dev(sr), n,
          nullptr)
SYNC_COPY(cuMemcpyHtoD_v2, cuMemcpyHtoD_v2, false, (CUdeviceptr d, const void* h, size_t n), (d, h, n), dev(d),
          host(h), n, h)
SYNC_COPY(cuMemcpyHtoD_v2_ptds, cuMemcpyHtoD_v2, true, (CUdeviceptr d, const void* h, size_t n), (d, h, n), dev(d),
          host(h), n, h)
SYNC_COPY(cuMemcpyDtoH_v2, cuMemcpyDtoH_v2, false, (void* h, CUdeviceptr sr, size_t n), (h, sr, n), host(h), dev(sr),
          n, nullptr)
SYNC_COPY(cuMemcpyDtoH_v2_ptds, cuMemcpyDtoH_v2, true, (void* h, CUdeviceptr sr, size_t n), (h, sr, n), host(h),
          dev(sr), n, nullptr)
SYNC_COPY(cuMemcpyDtoD_v2, cuMemcpyDtoD_v2, false, (CUdeviceptr d, CUdeviceptr sr, size_t n), (d, sr, n), dev(d),
          dev(sr), n, nullptr)
SYNC_COPY(cuMemcpyDtoD_v2_ptds, cuMemcpyDtoD_v2, true, (CUdeviceptr d, CUdeviceptr sr, size_t n), (d, sr, n), dev(d),
          dev(sr), n, nullptr)
SYNC_COPY(cuMemcpyPeer, cuMemcpyPeer, false, (CUdeviceptr d, CUcontext dc, CUdeviceptr sr, CUcontext sc, size_t n),
          (d, dc, sr, sc, n), dev(d), dev(sr), n, nullptr)
SYNC_COPY(cuMemcpyPeer_ptds, cuMemcpyPeer, true,
          (CUdeviceptr d, CUcontext dc, CUdeviceptr sr, CUcontext sc, size_t n), (d, dc, sr, sc, n), dev(d), dev(sr),
          n, nullptr)
SYNC_COPY(cuMemcpy2D_v2, cuMemcpy2D_v2, false, (const CUDA_MEMCPY2D* c), (c), dst2d(c), src2d(c), bytes2d(c), nullptr)
SYNC_COPY(cuMemcpy2D_v2_ptds, cuMemcpy2D_v2, true, (const CUDA_MEMCPY2D* c), (c), dst2d(c), src2d(c), bytes2d(c),
          nullptr)
SYNC_COPY(cuMemcpy2DUnaligned_v2, cuMemcpy2DUnaligned_v2, false, (const CUDA_MEMCPY2D* c), (c), dst2d(c), src2d(c),
          bytes2d(c), nullptr)
SYNC_COPY(cuMemcpy2DUnaligned_v2_ptds, cuMemcpy2DUnaligned_v2, true, (const CUDA_MEMCPY2D* c), (c), dst2d(c),
          src2d(c), bytes2d(c), nullptr)
SYNC_COPY(cuMemcpy3D_v2, cuMemcpy3D_v2, false, (const CUDA_MEMCPY3D* c), (c), dst3d(c), src3d(c), bytes3d(c), nullptr)
SYNC_COPY(cuMemcpy3D_v2_ptds, cuMemcpy3D_v2, true, (const CUDA_MEMCPY3D* c), (c), dst3d(c), src3d(c), bytes3d(c),
          nullptr)
SYNC_COPY(cuMemcpy3DPeer, cuMemcpy3DPeer, false, (const CUDA_MEMCPY3D_PEER* c), (c), dst3d(c), src3d(c), bytes3d(c),
          nullptr)
SYNC_COPY(cuMemcpy3DPeer_ptds, cuMemcpy3DPeer, true, (const CUDA_MEMCPY3D_PEER* c), (c), dst3d(c), src3d(c),
          bytes3d(c), nullptr)

// Batches of copies: every address in the batch is looked at, as one launch on the stream.
// CUDA 12.8's first version reports a failed copy's index; 13.0's _v2 does not.
using BatchCopyFirst = CUresult (*)(CUdeviceptr*, CUdeviceptr*, size_t*, size_t, CUmemcpyAttributes*, size_t*, size_t,
                                    size_t*, CUstream);
using BatchCopy = CUresult (*)(CUdeviceptr*, CUdeviceptr*, size_t*, size_t, CUmemcpyAttributes*, size_t*, size_t,
                               CUstream);
#define BATCH_COPY(NAME, SIG, PTSZ, FAIL_PARAM, FAIL_ARG)                                           \
  OFFLOAD_EXPORT CUresult NAME(CUdeviceptr* d, CUdeviceptr* sr, size_t* n, size_t count, CUmemcpyAttributes* a,      \
                               size_t* ai, size_t na FAIL_PARAM, CUstream s) {                      \
    return launch<HookId::NAME, SIG>(                                                               \
        [&](Runtime& rt) { shim::on_copies(rt, d, sr, n, count, stream_id(s, PTSZ)); },               \
        [&](auto real) { return real(d, sr, n, count, a, ai, na FAIL_ARG, s); });                   \
  }
#define OFFLOAD_FAIL_PARAM , size_t* fail
#define OFFLOAD_FAIL_ARG , fail
BATCH_COPY(cuMemcpyBatchAsync, BatchCopyFirst, false, OFFLOAD_FAIL_PARAM, OFFLOAD_FAIL_ARG)
BATCH_COPY(cuMemcpyBatchAsync_ptsz, BatchCopyFirst, true, OFFLOAD_FAIL_PARAM, OFFLOAD_FAIL_ARG)
BATCH_COPY(cuMemcpyBatchAsync_v2, BatchCopy, false, , )
BATCH_COPY(cuMemcpyBatchAsync_v2_ptsz, BatchCopy, true, , )
#undef OFFLOAD_FAIL_PARAM
#undef OFFLOAD_FAIL_ARG

// A memset of BYTES from `d` on STREAM, stream-ordered or synchronous; 1D (`n` elements of
// UNIT bytes) or 2D (`h` rows of `pitch`).
#define MEMSET_HOOK(NAME, BASE, STREAM, PARAMS, ARGS, BYTES)                                        \
  OFFLOAD_EXPORT CUresult NAME PARAMS {                                                             \
    return launch<HookId::NAME, decltype(&::BASE)>(                                                \
        [&](Runtime& rt) { shim::on_memset(rt, dev(d), BYTES, STREAM); },                             \
        [&](auto real) { return real ARGS; });                                                      \
  }
#define MEMSET(NAME, BASE, PTSZ, T, UNIT)                                                           \
  MEMSET_HOOK(NAME, BASE, stream_id(s, PTSZ), (CUdeviceptr d, T v, size_t n, CUstream s), (d, v, n, s), n * UNIT)
MEMSET(cuMemsetD8Async, cuMemsetD8Async, false, unsigned char, 1)
MEMSET(cuMemsetD8Async_ptsz, cuMemsetD8Async, true, unsigned char, 1)
MEMSET(cuMemsetD16Async, cuMemsetD16Async, false, unsigned short, 2)
MEMSET(cuMemsetD16Async_ptsz, cuMemsetD16Async, true, unsigned short, 2)
MEMSET(cuMemsetD32Async, cuMemsetD32Async, false, unsigned int, 4)
MEMSET(cuMemsetD32Async_ptsz, cuMemsetD32Async, true, unsigned int, 4)

#define MEMSET2D(NAME, BASE, PTSZ, T)                                                   \
  MEMSET_HOOK(NAME, BASE, stream_id(s, PTSZ), (CUdeviceptr d, size_t pitch, T v, size_t w, size_t h, CUstream s), \
              (d, pitch, v, w, h, s), pitch * h)
MEMSET2D(cuMemsetD2D8Async, cuMemsetD2D8Async, false, unsigned char)
MEMSET2D(cuMemsetD2D8Async_ptsz, cuMemsetD2D8Async, true, unsigned char)
MEMSET2D(cuMemsetD2D16Async, cuMemsetD2D16Async, false, unsigned short)
MEMSET2D(cuMemsetD2D16Async_ptsz, cuMemsetD2D16Async, true, unsigned short)
MEMSET2D(cuMemsetD2D32Async, cuMemsetD2D32Async, false, unsigned int)
MEMSET2D(cuMemsetD2D32Async_ptsz, cuMemsetD2D32Async, true, unsigned int)

// The synchronous memsets, on the default stream as the synchronous copies above.
#define SYNC_MEMSET(NAME, BASE, PTDS, T, UNIT) \
  MEMSET_HOOK(NAME, BASE, stream_id(nullptr, PTDS), (CUdeviceptr d, T v, size_t n), (d, v, n), n * UNIT)
SYNC_MEMSET(cuMemsetD8_v2, cuMemsetD8_v2, false, unsigned char, 1)
SYNC_MEMSET(cuMemsetD8_v2_ptds, cuMemsetD8_v2, true, unsigned char, 1)
SYNC_MEMSET(cuMemsetD16_v2, cuMemsetD16_v2, false, unsigned short, 2)
SYNC_MEMSET(cuMemsetD16_v2_ptds, cuMemsetD16_v2, true, unsigned short, 2)
SYNC_MEMSET(cuMemsetD32_v2, cuMemsetD32_v2, false, unsigned int, 4)
SYNC_MEMSET(cuMemsetD32_v2_ptds, cuMemsetD32_v2, true, unsigned int, 4)

#define SYNC_MEMSET2D(NAME, BASE, PTDS, T)                                                          \
  MEMSET_HOOK(NAME, BASE, stream_id(nullptr, PTDS), (CUdeviceptr d, size_t pitch, T v, size_t w, size_t h), \
              (d, pitch, v, w, h), pitch * h)
SYNC_MEMSET2D(cuMemsetD2D8_v2, cuMemsetD2D8_v2, false, unsigned char)
SYNC_MEMSET2D(cuMemsetD2D8_v2_ptds, cuMemsetD2D8_v2, true, unsigned char)
SYNC_MEMSET2D(cuMemsetD2D16_v2, cuMemsetD2D16_v2, false, unsigned short)
SYNC_MEMSET2D(cuMemsetD2D16_v2_ptds, cuMemsetD2D16_v2, true, unsigned short)
SYNC_MEMSET2D(cuMemsetD2D32_v2, cuMemsetD2D32_v2, false, unsigned int)
SYNC_MEMSET2D(cuMemsetD2D32_v2_ptds, cuMemsetD2D32_v2, true, unsigned int)

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

// Whether the H200's driver maps part of a physical handle at a non-zero offset (cuMemMap's
// `offset`, documented as "currently must be zero"; CUDA 13.0 on the H200: CUDA_ERROR_NOT_SUPPORTED),
// and whether one cuMemUnmap takes back several mappings made one after another, at what cost. On the GPU machine:
//   g++ -std=c++20 -O2 -I/usr/local/cuda/include scripts/gpu/offset_probe.cpp -o /tmp/offset_probe \
//     -L/usr/local/cuda/lib64/stubs -lcuda && /tmp/offset_probe
#include <cuda.h>
#include <chrono>
#include <cstdio>
#include <vector>
static double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char* s; cuGetErrorName(r_, &s); printf("%s -> %s\n", #x, s); } } while (0)
int main() {
  cuInit(0);
  CUdevice dev; cuDeviceGet(&dev, 0);
  CUcontext ctx; cuDevicePrimaryCtxRetain(&ctx, dev); cuCtxSetCurrent(ctx);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  const size_t M = 1 << 20, big = 1024 * M;
  printf("granularity %zu KiB\n", gran >> 10);
  CUmemGenericAllocationHandle h;
  CK(cuMemCreate(&h, big, &prop, 0));
  CUmemAccessDesc acc = {};
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUdeviceptr whole, part;
  CK(cuMemAddressReserve(&whole, big, 0, 0, 0));
  CK(cuMemAddressReserve(&part, big, 0, 0, 0));
  CK(cuMemMap(whole, big, 0, h, 0));
  CK(cuMemSetAccess(whole, big, &acc, 1));
  CK(cuMemsetD32(whole, 0, big / 4));
  // A prefix, then a piece at 16 MiB, mapped at `part`.
  CUresult a = cuMemMap(part, 8 * M, 0, h, 0);
  CUresult b = cuMemMap(part + 8 * M, 8 * M, 16 * M, h, 0);
  printf("prefix map: %d, offset map: %d\n", a, b);
  if (a == CUDA_SUCCESS && b == CUDA_SUCCESS) {
    CK(cuMemSetAccess(part, 16 * M, &acc, 1));
    CK(cuMemsetD32(part + 8 * M, 0x12345678u, 8 * M / 4));
    CK(cuCtxSynchronize());
    unsigned v[4] = {};
    CK(cuMemcpyDtoH(&v[0], whole + 16 * M, 4));
    CK(cuMemcpyDtoH(&v[1], whole + 24 * M - 4, 4));
    CK(cuMemcpyDtoH(&v[2], whole + 8 * M, 4));
    CK(cuMemcpyDtoH(&v[3], whole + 24 * M, 4));
    printf("aliases the handle at 16 MiB: %s (%08x %08x; outside %08x %08x)\n",
           v[0] == 0x12345678u && v[1] == 0x12345678u && v[2] == 0 && v[3] == 0 ? "yes" : "NO", v[0], v[1], v[2], v[3]);
    CK(cuMemUnmap(part, 16 * M));
  }
  // One cuMemUnmap over several mappings made one after another (a range backed by pieces),
  // against one per piece; with the GPU idle and while a stream of memsets keeps it busy.
  CUstream busy_stream;
  cuStreamCreate(&busy_stream, CU_STREAM_NON_BLOCKING);
  for (int busy = 0; busy < 2; ++busy)
    for (size_t piece : {2 * M, 8 * M, 64 * M}) {
      const int pieces = 8, n = 50;
      std::vector<CUmemGenericAllocationHandle> hs(pieces);
      for (auto& x : hs) CK(cuMemCreate(&x, piece, &prop, 0));
      double t_map = 0, t_acc = 0, t_one = 0, t_each = 0;
      int one_ok = 0;
      for (int i = 0; i < n; ++i) {
        if (busy)
          for (int k = 0; k < 4; ++k) cuMemsetD32Async(whole, k, big / 4, busy_stream);
        for (int round = 0; round < 2; ++round) {
          double t0 = now_us();
          for (int j = 0; j < pieces; ++j) CK(cuMemMap(part + j * piece, piece, 0, hs[j], 0));
          double t1 = now_us();
          CK(cuMemSetAccess(part, pieces * piece, &acc, 1));
          double t2 = now_us();
          t_map += t1 - t0, t_acc += t2 - t1;
          if (round == 0) {
            CUresult r = cuMemUnmap(part, pieces * piece);
            t_one += now_us() - t2;
            if (r == CUDA_SUCCESS) ++one_ok;
            else for (int j = 0; j < pieces; ++j) cuMemUnmap(part + j * piece, piece);
          } else {
            for (int j = 0; j < pieces; ++j) CK(cuMemUnmap(part + j * piece, piece));
            t_each += now_us() - t2;
          }
        }
      }
      cuStreamSynchronize(busy_stream);
      printf("%s, 8 pieces of %zu MiB: map %.1f us a piece, access %.1f us a range; one unmap for all %.1f us (%d of %d "
             "succeeded), one a piece %.1f us\n", busy ? "GPU busy" : "GPU idle", piece / M, t_map / (2 * n * pieces),
             t_acc / (2 * n), t_one / n, one_ok, n, t_each / n);
      for (auto& x : hs) cuMemRelease(x);
    }
  CK(cuMemUnmap(whole, big));
  cuMemRelease(h);
  return 0;
}

// Checks the shim's hashing kernel (preload/gpu/range_hash.cu, as the PTX liboffload.so carries)
// against the host's hash (preload/core/range_hash.h) on random bytes of several sizes, odd tails
// included, with the same grid and the same sum of block parts as gpu/gpu_hash.cpp; and times it.
// Recompute's probes hash every range a launch touches before and after it. On the GPU machine:
//   g++ -std=c++20 -O2 -Ipreload -I/usr/local/cuda/include scripts/gpu/hash_probe.cpp -o /tmp/hash_probe
//     -L/usr/local/cuda/lib64/stubs -lcuda && /tmp/hash_probe
#include <cuda.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "core/range_hash.h"
#include "gpu/gpu_hash.h"
#include "gpu/range_hash_ptx.h"

static void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* s = "?";
  cuGetErrorName(r, &s);
  std::fprintf(stderr, "%s: %s\n", what, s);
  std::exit(1);
}
#define CK(x) check((x), #x)

int main() {
  using offload::gpu::GpuHash;
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CUmodule mod;
  CUfunction fn;
  CK(cuModuleLoadData(&mod, offload::gpu::kRangeHashPtx));
  CK(cuModuleGetFunction(&fn, mod, "offload_range_hash"));
  void* parts_host;
  CK(cuMemHostAlloc(&parts_host, GpuHash::kBlocks * 8, CU_MEMHOSTALLOC_DEVICEMAP));
  CUdeviceptr parts;
  CK(cuMemHostGetDevicePointer(&parts, parts_host, 0));
  CUstream s;
  CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  const uint64_t max = 4ull << 30;
  CUdeviceptr buf;
  CK(cuMemAlloc(&buf, max));
  std::mt19937_64 rng(1);
  int bad = 0;
  for (uint64_t n : {uint64_t{1}, uint64_t{7}, uint64_t{8}, uint64_t{4093}, uint64_t{2} << 20, (uint64_t{64} << 20) + 13,
                     uint64_t{1} << 30, max - 3}) {
    std::vector<unsigned char> h(n);
    for (uint64_t i = 0; i + 8 <= n; i += 8) *reinterpret_cast<uint64_t*>(&h[i]) = rng();
    for (uint64_t i = n & ~uint64_t{7}; i < n; ++i) h[i] = static_cast<unsigned char>(rng());
    CK(cuMemcpyHtoD(buf, h.data(), n));
    const uint64_t want = offload::range_hash::of(h.data(), n);
    unsigned long long bytes = n;
    void* params[] = {&buf, &bytes, &parts};
    double best = 1e30;
    uint64_t got = 0;
    for (int rep = 0; rep < 5; ++rep) {
      CK(cuStreamSynchronize(s));
      const auto t0 = std::chrono::steady_clock::now();
      CK(cuLaunchKernel(fn, GpuHash::kBlocks, 1, 1, GpuHash::kThreads, 1, 1, 0, s, params, nullptr));
      CK(cuStreamSynchronize(s));
      best = std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      got = 0;
      for (unsigned b = 0; b < GpuHash::kBlocks; ++b) got += static_cast<uint64_t*>(parts_host)[b];
    }
    const bool ok = got == want;
    bad += !ok;
    std::printf("%12llu bytes: %s  %9.1f us (launch to sync, best of 5)  %7.1f GB/s\n", (unsigned long long)n,
                ok ? "same" : "DIFFERENT", best, n / best / 1e3);
  }
  std::printf(bad ? "hash_probe: %d sizes differ\n" : "hash_probe: all sizes the same\n", bad);
  return bad ? 1 : 0;
}

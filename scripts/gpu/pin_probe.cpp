// How fast pinned host memory for evicted bytes can be made ready on this machine, in ms per
// GiB of 4 GiB: faulted in (MAP_POPULATE) then pinned, pinned unfaulted (pinning faults it in),
// cuMemHostAlloc, faulting in on several threads, and faulting in one thread's way: a write a
// page against madvise(MADV_POPULATE_WRITE) a 64 MiB piece. On the GPU machine:
//   g++ -std=c++20 -O2 -I/usr/local/cuda/include scripts/gpu/pin_probe.cpp -o /tmp/pin_probe \
//     -L/usr/local/cuda/lib64/stubs -lcuda -lpthread && /tmp/pin_probe
#include <cuda.h>
#include <sys/mman.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
static double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}
int main() {
  const size_t G = 1ull << 30, n = 4 * G;
  cuInit(0);
  CUdevice dev; cuDeviceGet(&dev, 0);
  CUcontext ctx; cuDevicePrimaryCtxRetain(&ctx, dev); cuCtxSetCurrent(ctx);
  for (int round = 0; round < 2; ++round) {
    auto t = std::chrono::steady_clock::now();
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    double a = ms_since(t); t = std::chrono::steady_clock::now();
    CUresult r = cuMemHostRegister(p, n, CU_MEMHOSTREGISTER_PORTABLE);
    double b = ms_since(t);
    cuMemHostUnregister(p); munmap(p, n);
    printf("populate %.0f ms/GiB, then register %.0f ms/GiB (%d)\n", a / 4, b / 4, r);
    t = std::chrono::steady_clock::now();
    p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    r = cuMemHostRegister(p, n, CU_MEMHOSTREGISTER_PORTABLE);
    b = ms_since(t);
    cuMemHostUnregister(p); munmap(p, n);
    printf("register unpopulated: %.0f ms/GiB (%d)\n", b / 4, r);
    t = std::chrono::steady_clock::now();
    void* h = nullptr;
    r = cuMemHostAlloc(&h, n, CU_MEMHOSTALLOC_PORTABLE);
    a = ms_since(t); t = std::chrono::steady_clock::now();
    memset(h, 1, n);
    b = ms_since(t);
    cuMemFreeHost(h);
    printf("cuMemHostAlloc: %.0f ms/GiB (%d), first write after %.0f ms/GiB\n", a / 4, r, b / 4);
    for (int populate = 0; populate < 2; ++populate) {
      auto* q = static_cast<unsigned char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
      t = std::chrono::steady_clock::now();
      int bad = 0;
      for (size_t off = 0; off < n; off += 64ull << 20)
        if (populate) bad |= madvise(q + off, 64ull << 20, 23 /* MADV_POPULATE_WRITE */);
        else for (size_t k = 0; k < (64ull << 20); k += 4096) static_cast<volatile unsigned char*>(q)[off + k] = 0;
      a = ms_since(t);
      munmap(q, n);
      printf("fault in on one thread, %s: %.0f ms/GiB%s\n", populate ? "MADV_POPULATE_WRITE" : "a write a page", a / 4, bad ? " (refused)" : "");
    }
    for (int th : {4, 8}) {
      t = std::chrono::steady_clock::now();
      std::vector<void*> ps(th);
      std::vector<std::thread> ts;
      for (int i = 0; i < th; ++i) ts.emplace_back([&, i] { ps[i] = mmap(nullptr, n / th, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0); });
      for (auto& x : ts) x.join();
      a = ms_since(t);
      for (void* q : ps) munmap(q, n / th);
      printf("populate on %d threads: %.0f ms/GiB\n", th, a / 4);
    }
  }
  return 0;
}

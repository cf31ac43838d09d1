// Whether faulting host memory in on one thread holds up another thread's device mappings and
// mmap calls, as the shim's thread making host memory ahead does while the model is built. The
// main thread maps and unmaps 2 MiB of device memory (cuMemCreate, cuMemMap, cuMemSetAccess,
// cuMemUnmap, cuMemRelease) and maps and unmaps 1 MiB of host memory, in a loop, while a second
// thread faults 8 GiB in: not at all, a write a page, or madvise(MADV_POPULATE_WRITE) in pieces
// of 64 MiB or 2 MiB. Prints the loop's mean and worst time in each case. On the GPU machine:
//   g++ -std=c++20 -O2 -I/usr/local/cuda/include scripts/gpu/fault_probe.cpp -o /tmp/fault_probe
//     -L/usr/local/cuda/lib64/stubs -lcuda -lpthread && /tmp/fault_probe
#include <cuda.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

namespace {

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// mode 0: nothing; 1: a write a page; 2: populate 64 MiB at a time; 3: populate 2 MiB at a time.
void fault_in(int mode, unsigned char* p, size_t n) {
  const size_t piece = mode == 3 ? (2ull << 20) : (64ull << 20);
  for (size_t off = 0; off < n; off += piece) {
    if (mode == 1)
      for (size_t k = 0; k < piece; k += 4096) static_cast<volatile unsigned char*>(p)[off + k] = 0;
    else
      madvise(p + off, piece, 23 /* MADV_POPULATE_WRITE */);
  }
}

}  // namespace

int main() {
  cuInit(0);
  CUdevice dev;
  cuDeviceGet(&dev, 0);
  CUcontext ctx;
  cuDevicePrimaryCtxRetain(&ctx, dev);
  cuCtxSetCurrent(ctx);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const size_t two = 2ull << 20, n = 8ull << 30;
  CUdeviceptr va;
  cuMemAddressReserve(&va, two, 0, 0, 0);
  const char* names[] = {"nothing", "a write a page", "MADV_POPULATE_WRITE 64 MiB", "MADV_POPULATE_WRITE 2 MiB"};
  for (int round = 0; round < 2; ++round)
    for (int mode = 0; mode < 4; ++mode) {
      auto* p = static_cast<unsigned char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
      std::atomic<bool> done{mode == 0};
      double fault_ms = 0;
      std::thread t([&] {
        const auto t0 = std::chrono::steady_clock::now();
        fault_in(mode, p, n);
        fault_ms = ms_since(t0);
        done = true;
      });
      const auto t0 = std::chrono::steady_clock::now();
      double worst = 0;
      int loops = 0;
      while (!done || (mode == 0 && loops < 2000)) {
        const auto t1 = std::chrono::steady_clock::now();
        CUmemGenericAllocationHandle h;
        cuMemCreate(&h, two, &prop, 0);
        cuMemMap(va, two, 0, h, 0);
        cuMemSetAccess(va, two, &access, 1);
        cuMemUnmap(va, two);
        cuMemRelease(h);
        void* q = mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        static_cast<volatile char*>(q)[0] = 1;
        munmap(q, 1 << 20);
        worst = std::max(worst, ms_since(t1));
        ++loops;
        if (mode == 0 && loops >= 2000) break;
      }
      const double total = ms_since(t0);
      t.join();
      munmap(p, n);
      std::printf("%-28s faulting %5.0f ms/GiB; map loop %6.3f ms mean, %7.2f ms worst (%d loops)\n", names[mode],
                  fault_ms / 8, total / loops, worst, loops);
    }
  return 0;
}

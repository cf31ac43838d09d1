// Whether a virtual range keeps its access grant (cuMemSetAccess) when it is unmapped and mapped
// again, what the grant costs beside the mapping, and what making a handle costs by its size. Each case runs in a child of its own (a
// fault ends that child's context). On the GPU machine:
//   g++ -std=c++20 -O2 -I/usr/local/cuda/include scripts/gpu/access_probe.cpp -o /tmp/access_probe
//   -L/usr/local/cuda/lib64/stubs -lcuda && /tmp/access_probe
#include <cuda.h>
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
static double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
static const char* name(CUresult r) {
  const char* s = "?";
  cuGetErrorName(r, &s);
  return s;
}
struct Ctx {
  CUmemAllocationProp prop = {};
  CUmemAccessDesc acc = {};
  Ctx() {
    cuInit(0);
    CUdevice dev;
    cuDeviceGet(&dev, 0);
    CUcontext ctx;
    cuDevicePrimaryCtxRetain(&ctx, dev);
    cuCtxSetCurrent(ctx);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
};
// Case 1: map A, grant, unmap, map B at the same address, no grant: is B usable there?
static int remap_without_grant() {
  Ctx c;
  const size_t sz = 8 << 20;
  CUmemGenericAllocationHandle a, b;
  cuMemCreate(&a, sz, &c.prop, 0);
  cuMemCreate(&b, sz, &c.prop, 0);
  CUdeviceptr va;
  cuMemAddressReserve(&va, sz, 0, 0, 0);
  cuMemMap(va, sz, 0, a, 0);
  cuMemSetAccess(va, sz, &c.acc, 1);
  printf("  first mapping, granted: memset %s\n", name(cuMemsetD32(va, 1, sz / 4)));
  cuCtxSynchronize();
  cuMemUnmap(va, sz);
  cuMemMap(va, sz, 0, b, 0);
  CUresult w = cuMemsetD32(va, 2, sz / 4);
  CUresult s = cuCtxSynchronize();
  unsigned v = 0;
  CUresult r = cuMemcpyDtoH(&v, va, 4);
  printf("  mapped again, not granted: memset %s, sync %s, read %s value %u\n", name(w), name(s), name(r), v);
  return s == CUDA_SUCCESS && r == CUDA_SUCCESS && v == 2 ? 0 : 1;
}
// Case 2: the grant's cost: for one range, for two neighbouring ranges in one call, and for a
// range whose neighbour is mapped and granted already.
static int grant_costs() {
  Ctx c;
  const size_t sz = 8 << 20;
  const int n = 100;
  CUmemGenericAllocationHandle h[4];
  for (auto& x : h) cuMemCreate(&x, sz, &c.prop, 0);
  CUdeviceptr va;
  cuMemAddressReserve(&va, 4 * sz, 0, 0, 0);
  double one = 0, two = 0, beside = 0, again = 0;
  for (int i = 0; i < n; ++i) {
    cuMemMap(va, sz, 0, h[0], 0);
    double t0 = now_us();
    cuMemSetAccess(va, sz, &c.acc, 1);
    double t1 = now_us();
    cuMemSetAccess(va, sz, &c.acc, 1);  // granted already
    again += now_us() - t1;
    one += t1 - t0;
    cuMemMap(va + sz, sz, 0, h[1], 0);
    t0 = now_us();
    cuMemSetAccess(va + sz, sz, &c.acc, 1);  // its neighbour granted
    beside += now_us() - t0;
    cuMemUnmap(va, 2 * sz);
    cuMemMap(va, sz, 0, h[0], 0);
    cuMemMap(va + sz, sz, 0, h[1], 0);
    t0 = now_us();
    cuMemSetAccess(va, 2 * sz, &c.acc, 1);
    two += now_us() - t0;
    cuMemUnmap(va, 2 * sz);
  }
  printf("  grant one range %.1f us, the same again %.1f us, its neighbour %.1f us, two ranges in one call %.1f us\n",
         one / n, again / n, beside / n, two / n);
  return 0;
}
// Case 3: making and releasing a handle, by size.
static int handle_costs() {
  Ctx c;
  for (size_t mib : {2, 8, 32, 64, 256}) {
    const int n = 40;
    double made = 0, released = 0;
    for (int i = 0; i < n; ++i) {
      CUmemGenericAllocationHandle h;
      double t0 = now_us();
      if (cuMemCreate(&h, mib << 20, &c.prop, 0) != CUDA_SUCCESS) return 1;
      double t1 = now_us();
      cuMemRelease(h);
      made += t1 - t0, released += now_us() - t1;
    }
    printf("  %3zu MiB: made in %.1f us, released in %.1f us\n", mib, made / n, released / n);
  }
  return 0;
}
int main() {
  int (*cases[])() = {grant_costs, handle_costs, remap_without_grant};
  const char* names[] = {"grant costs", "handle costs", "remap without a grant"};
  for (int i = 0; i < 3; ++i) {
    printf("%s:\n", names[i]);
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
      const int rc = cases[i]();
      fflush(stdout);
      _exit(rc);
    }
    int st = 0;
    waitpid(p, &st, 0);
    printf("  -> %s\n", WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "yes/ok" : "no");
  }
  return 0;
}

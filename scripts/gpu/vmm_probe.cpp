// What the driver's virtual memory calls accept, on the GPU at hand: a handle mapped in part
// (from its start), several handles mapped one after another in one reservation, one handle
// mapped at two addresses, and the access grant over a range of several mappings. Each line
// prints the call's result; a failing one its error name.
#include <cuda.h>

#include <cstdio>
#include <initializer_list>

static bool ok(const char* what, CUresult r) {
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  std::printf("%-60s %s\n", what, r == CUDA_SUCCESS ? "ok" : (name ? name : "?"));
  return r == CUDA_SUCCESS;
}

int main() {
  CUdevice dev;
  CUcontext ctx;
  if (!ok("cuInit", cuInit(0)) || !ok("cuDeviceGet", cuDeviceGet(&dev, 0)) ||
      !ok("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&ctx, dev)) || !ok("cuCtxSetCurrent", cuCtxSetCurrent(ctx)))
    return 1;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  size_t g = 0, rec = 0;
  cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  cuMemGetAllocationGranularity(&rec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  std::printf("granularity %zu, recommended %zu\n", g, rec);
  CUmemAccessDesc acc{};
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (size_t big : {2 * g, 8 * g, 188 * g}) {
    std::printf("-- handles of %zu MiB\n", big >> 20);
    CUmemGenericAllocationHandle a, b;
    ok("create a", cuMemCreate(&a, big, &prop, 0));
    ok("create b (g)", cuMemCreate(&b, g, &prop, 0));
    CUdeviceptr va, va2;
    ok("reserve", cuMemAddressReserve(&va, 2 * big, 0, 0, 0));
    ok("reserve 2", cuMemAddressReserve(&va2, 2 * big, 0, 0, 0));
    // 1. a in part, from its start.
    ok("map a, len big-g (part of it)", cuMemMap(va, big - g, 0, a, 0));
    ok("set access on that", cuMemSetAccess(va, big - g, &acc, 1));
    // 2. b right after it: two mappings one after another.
    ok("map b after it", cuMemMap(va + big - g, g, 0, b, 0));
    ok("set access on b", cuMemSetAccess(va + big - g, g, &acc, 1));
    ok("memset over both", cuMemsetD8(va, 0x5a, big));
    ok("ctx sync", cuCtxSynchronize());
    // 3. a mapped whole at a second address while mapped in part at the first.
    ok("map a whole at a second address", cuMemMap(va2, big, 0, a, 0));
    ok("set access there", cuMemSetAccess(va2, big, &acc, 1));
    unsigned char x = 0;
    ok("read it back there", cuMemcpyDtoH(&x, va2 + big - 2 * g, 1));
    std::printf("   byte seen through the second mapping: 0x%02x (0x5a expected)\n", x);
    ok("unmap second", cuMemUnmap(va2, big));
    // 4. one unmap over both mappings, then piece by piece.
    CUresult both = cuMemUnmap(va, big);
    ok("unmap over both mappings at once", both);
    if (both != CUDA_SUCCESS) {
      ok("unmap a's piece", cuMemUnmap(va, big - g));
      ok("unmap b", cuMemUnmap(va + big - g, g));
    }
    // 5. set access over a range of two mappings.
    ok("map a part again", cuMemMap(va, big - g, 0, a, 0));
    ok("map b again", cuMemMap(va + big - g, g, 0, b, 0));
    ok("set access over both at once", cuMemSetAccess(va, big, &acc, 1));
    ok("unmap a's piece", cuMemUnmap(va, big - g));
    ok("unmap b", cuMemUnmap(va + big - g, g));
    ok("release a", cuMemRelease(a));
    ok("release b", cuMemRelease(b));
    cuMemAddressFree(va, 2 * big);
    cuMemAddressFree(va2, 2 * big);
  }
  return 0;
}

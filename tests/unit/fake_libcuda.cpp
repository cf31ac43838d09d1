// A stand-in for the driver as CudaDriver binds it: built with the soname libcuda.so.1, so that
// once dlopen'ed, CudaDriver's dlopen("libcuda.so.1", RTLD_NOLOAD) finds it. Exports the entry
// points CudaDriver resolves for its executor half, each answering CUDA_SUCCESS unless
// offload_fake_fail named it. Loaded only in a child process: in the test binary's own process
// the hook tests rely on no libcuda being loaded.
#include <cstddef>
#include <cstring>

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {
const char* g_failing = nullptr;  // the entry point that fails, nullptr for none
int g_result = 0;                 // what it answers
char g_context;                   // the address is the one context there is

int answer(const char* fn) { return g_failing && std::strcmp(g_failing, fn) == 0 ? g_result : 0; }
}  // namespace

// `fn` (a string literal, or nullptr for none) answers `result` from now on; the others succeed.
FAKE_EXPORT void offload_fake_fail(const char* fn, int result) {
  g_failing = fn;
  g_result = result;
}

FAKE_EXPORT int cuCtxGetCurrent(void** ctx) {
  *ctx = &g_context;
  return answer("cuCtxGetCurrent");
}

FAKE_EXPORT int cuMemAddressReserve(unsigned long long* va, size_t, size_t, unsigned long long, unsigned long long) {
  *va = 0x7f0000000000ull;
  return answer("cuMemAddressReserve");
}

// As the driver: the names of the results it knows; CUDA_ERROR_INVALID_VALUE for another.
FAKE_EXPORT int cuGetErrorName(int result, const char** name) {
  *name = result == 2 ? "CUDA_ERROR_OUT_OF_MEMORY" : result == 600 ? "CUDA_ERROR_NOT_READY" : nullptr;
  return *name || result == 0 ? 0 : 1;
}

#define FAKE(fn, ...) \
  FAKE_EXPORT int fn(__VA_ARGS__) { return answer(#fn); }
FAKE(cuCtxPushCurrent_v2, void*)
FAKE(cuCtxPopCurrent_v2, void**)
FAKE(cuCtxGetDevice, int*)
FAKE(cuCtxSynchronize)
FAKE(cuDeviceTotalMem_v2, size_t*, int)
FAKE(cuMemGetAllocationGranularity, size_t*, const void*, int)
FAKE(cuMemAddressFree, unsigned long long, size_t)
FAKE(cuMemCreate, unsigned long long*, size_t, const void*, unsigned long long)
FAKE(cuMemRelease, unsigned long long)
FAKE(cuMemMap, unsigned long long, size_t, size_t, unsigned long long, unsigned long long)
FAKE(cuMemUnmap, unsigned long long, size_t)
FAKE(cuMemSetAccess, unsigned long long, size_t, const void*, size_t)
FAKE(cuStreamCreate, void**, unsigned)
FAKE(cuEventCreate, void**, unsigned)
FAKE(cuEventDestroy_v2, void*)
FAKE(cuEventRecord, void*, void*)
FAKE(cuStreamWaitEvent, void*, void*, unsigned)
FAKE(cuStreamQuery, void*)
FAKE(cuStreamIsCapturing, void*, int*)
FAKE(cuEventQuery, void*)
FAKE(cuEventSynchronize, void*)
FAKE(cuMemcpyDtoHAsync_v2, void*, unsigned long long, size_t, void*)
FAKE(cuMemcpyHtoDAsync_v2, unsigned long long, const void*, size_t, void*)

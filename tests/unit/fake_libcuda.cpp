// A stand-in for the driver as CudaDriver binds it: built with the soname libcuda.so.1, so that
// once dlopen'ed, CudaDriver's dlopen("libcuda.so.1", RTLD_NOLOAD) finds it. Exports the entry
// points CudaDriver resolves for its executor half, each answering CUDA_SUCCESS unless
// offload_fake_fail named it. Loaded only in a child process: in the test binary's own process
// the hook tests rely on no libcuda being loaded.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

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

FAKE_EXPORT int cuCtxGetDevice(int* dev) {
  *dev = 0;
  return answer("cuCtxGetDevice");
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

// Graph capture as the driver's global mode has it: while another thread captures (set by
// offload_fake_capture), an event query is refused (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) unless
// the calling thread's capture mode is relaxed (2).
namespace {
int g_capturing = 0;
thread_local int t_mode = 0;  // CU_STREAM_CAPTURE_MODE_GLOBAL
}  // namespace
FAKE_EXPORT void offload_fake_capture(int on) { g_capturing = on; }
FAKE_EXPORT int offload_fake_capture_mode() { return t_mode; }
FAKE_EXPORT int cuThreadExchangeStreamCaptureMode(int* mode) {
  const int old = t_mode;
  t_mode = *mode;
  *mode = old;
  return 0;
}
FAKE_EXPORT int cuStreamIsCapturing(void*, int* status) {
  *status = g_capturing;
  return answer("cuStreamIsCapturing");
}
FAKE_EXPORT int cuEventQuery(void*) {
  if (g_capturing && t_mode != 2) return 900;
  return answer("cuEventQuery");
}

#define FAKE(fn, ...) \
  FAKE_EXPORT int fn(__VA_ARGS__) { return answer(#fn); }
FAKE(cuCtxPushCurrent_v2, void*)
FAKE(cuCtxPopCurrent_v2, void**)
FAKE(cuCtxSynchronize)
FAKE(cuDeviceTotalMem_v2, size_t*, int)
FAKE(cuMemGetAllocationGranularity, size_t*, const void*, int)
FAKE(cuMemAddressFree, unsigned long long, size_t)
FAKE(cuMemCreate, unsigned long long*, size_t, const void*, unsigned long long)
FAKE(cuMemRelease, unsigned long long)
FAKE(cuMemMap, unsigned long long, size_t, size_t, unsigned long long, unsigned long long)
FAKE(cuMemUnmap, unsigned long long, size_t)
FAKE(cuStreamCreate, void**, unsigned)
FAKE(cuEventCreate, void**, unsigned)
FAKE(cuEventDestroy_v2, void*)
FAKE(cuEventRecord, void*, void*)
FAKE(cuStreamWaitEvent, void*, void*, unsigned)
FAKE(cuStreamQuery, void*)
FAKE(cuEventSynchronize, void*)
FAKE(cuEventElapsedTime_v2, float*, void*, void*)
FAKE(cuMemcpyHtoDAsync_v2, unsigned long long, const void*, size_t, void*)

// A launch: its geometry and its first parameter's first 8 bytes, kept for offload_fake_last_launch.
namespace {
unsigned long long g_launch[9];
}  // namespace
FAKE_EXPORT int cuLaunchKernel(void*, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                               unsigned smem, void*, void** params, void** extra) {
  const unsigned long long v[] = {gx, gy, gz, bx, by, bz, smem, extra ? 1ull : 0ull, 0};
  std::memcpy(g_launch, v, sizeof v);
  if (params && params[0]) std::memcpy(&g_launch[8], params[0], 8);
  return answer("cuLaunchKernel");
}
FAKE_EXPORT void offload_fake_last_launch(unsigned long long out[9]) { std::memcpy(out, g_launch, sizeof g_launch); }

// A launch with attributes: its grid's x, its attribute count and its first attribute's id.
namespace {
unsigned long long g_launch_ex[3];
}  // namespace
struct FakeLaunchConfig {  // CUlaunchConfig's layout, as far as read here
  unsigned gx, gy, gz, bx, by, bz, smem;
  void* stream;
  const int* attrs;  // CUlaunchAttribute: its id is its first word
  unsigned nattrs;
};
FAKE_EXPORT int cuLaunchKernelEx(const FakeLaunchConfig* c, void*, void**, void**) {
  g_launch_ex[0] = c->gx;
  g_launch_ex[1] = c->nattrs;
  g_launch_ex[2] = c->nattrs && c->attrs ? static_cast<unsigned long long>(c->attrs[0]) : 0;
  return answer("cuLaunchKernelEx");
}
FAKE_EXPORT void offload_fake_last_launch_ex(unsigned long long out[3]) {
  std::memcpy(out, g_launch_ex, sizeof g_launch_ex);
}

// The copy gate's calls (CudaDriver::gate_copies_out): copies out, waits and grants are logged in
// order ("wait:GATE", "copy:BYTES", "grant:GATE", GATE the gate word's value then).
namespace {
std::string g_log;
uintptr_t g_gate = 0;  // the address the last wait read
}  // namespace
FAKE_EXPORT size_t offload_fake_log(char* out, size_t cap) {
  const size_t n = g_log.size() < cap ? g_log.size() : cap - 1;
  std::memcpy(out, g_log.data(), n);
  out[n] = 0;
  g_log.clear();
  return n;
}
FAKE_EXPORT int cuMemHostRegister_v2(void*, size_t, unsigned) { return answer("cuMemHostRegister_v2"); }
FAKE_EXPORT int cuMemHostGetDevicePointer_v2(unsigned long long* d, void* p, unsigned) {
  *d = reinterpret_cast<uintptr_t>(p);
  return answer("cuMemHostGetDevicePointer_v2");
}
FAKE_EXPORT int cuStreamWaitValue32_v2(void*, unsigned long long addr, unsigned, unsigned) {
  g_gate = addr;
  g_log += "wait:" + std::to_string(*reinterpret_cast<volatile uint32_t*>(addr)) + " ";
  return answer("cuStreamWaitValue32_v2");
}
FAKE_EXPORT int cuMemcpyDtoHAsync_v2(void*, unsigned long long, size_t bytes, void*) {
  g_log += "copy:" + std::to_string(bytes) + " ";
  return answer("cuMemcpyDtoHAsync_v2");
}
FAKE_EXPORT int cuMemSetAccess(unsigned long long, size_t, const void*, size_t) {
  g_log += "grant:" + (g_gate ? std::to_string(*reinterpret_cast<volatile uint32_t*>(g_gate)) : std::string("-")) + " ";
  return answer("cuMemSetAccess");
}

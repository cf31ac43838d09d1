#include "cuda_driver.h"

#include <cuda.h>
#include <atomic>
#undef cuGetProcAddress
#include <dlfcn.h>

#include <cstdint>
#include <mutex>
#include <type_traits>

#include "capture_mode.h"
#include "common/log.h"
#include "cuda_calls.h"
#include "hooks/hook_table.h"
#include "nvtx_marks.h"

namespace offload {
using cu::as_event;
using cu::as_stream;
using cu::cu_ok;
using cu::cu_query;
using cu::CtxScope;
using cu::exec_api;
using cu::ExecApi;

CudaDriver::CudaDriver() = default;

bool CudaDriver::ready() {
  // Resolved on first use (a kernel's first launch), when libcuda is certainly loaded.
  if (resolved_) return func_param_info_ != nullptr;
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (h) {
    func_param_info_ = reinterpret_cast<GetParamInfo>(hooks::real_dlsym(h, "cuFuncGetParamInfo"));
    kernel_param_info_ = reinterpret_cast<GetParamInfo>(hooks::real_dlsym(h, "cuKernelGetParamInfo"));
    func_get_name_ = reinterpret_cast<GetName>(hooks::real_dlsym(h, "cuFuncGetName"));
    kernel_get_name_ = reinterpret_cast<GetName>(hooks::real_dlsym(h, "cuKernelGetName"));
  }
  resolved_ = true;
  return func_param_info_ != nullptr;
}

void CudaDriver::learn_context() {
  if (ctx_.load(std::memory_order_relaxed)) return;
  if (const EventApi* a = events()) {
    void* c = nullptr;
    if (cu_ok(a->get_ctx(&c), "cuCtxGetCurrent") && c) ctx_.store(c, std::memory_order_relaxed);
  }
}

int CudaDriver::param_layout(Func f, ParamInfo* out, int cap) {
  if (!ready()) return -1;
  // Called from a launch hook: the launching thread's context is the one to pin host memory in.
  learn_context();
  // cuLaunchKernel accepts a CUkernel in place of a CUfunction: ask as one, then the other.
  // Past the last parameter the driver answers CUDA_ERROR_INVALID_VALUE; a handle of the
  // other kind gets a different error.
  for (GetParamInfo q : {func_param_info_, kernel_param_info_}) {
    if (!q) continue;
    for (int n = 0; n <= 4096; ++n) {
      size_t off = 0, size = 0;
      int r = q(f, static_cast<size_t>(n), &off, &size);
      if (r == CUDA_ERROR_INVALID_VALUE) return n;
      if (r != CUDA_SUCCESS) break;
      if (n < cap) out[n] = ParamInfo{static_cast<uint32_t>(off), static_cast<uint32_t>(size)};
    }
  }
  return -1;
}

const char* CudaDriver::func_name(Func f) {
  if (!ready()) return nullptr;
  for (GetName q : {func_get_name_, kernel_get_name_}) {
    const char* name = nullptr;
    if (q && q(&name, f) == CUDA_SUCCESS && name) return name;
  }
  return nullptr;
}

}  // namespace offload

namespace offload {
namespace {
struct MarkerRec {
  void* event;
  void* ctx;
};
}  // namespace

const CudaDriver::EventApi* CudaDriver::events() {
  static EventApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!h) return;
    auto sym = [&](const char* a, const char* b = nullptr) {
      void* p = hooks::real_dlsym(h, a);
      return p || !b ? p : hooks::real_dlsym(h, b);
    };
    api.create = reinterpret_cast<int (*)(void**, unsigned)>(sym("cuEventCreate"));
    api.record = reinterpret_cast<int (*)(void*, void*)>(sym("cuEventRecord"));
    api.query = reinterpret_cast<int (*)(void*)>(sym("cuEventQuery"));
    api.elapsed = reinterpret_cast<int (*)(float*, void*, void*)>(sym("cuEventElapsedTime_v2", "cuEventElapsedTime"));
    api.destroy = reinterpret_cast<int (*)(void*)>(sym("cuEventDestroy_v2", "cuEventDestroy"));
    api.get_ctx = reinterpret_cast<int (*)(void**)>(sym("cuCtxGetCurrent"));
    api.push_ctx = reinterpret_cast<int (*)(void*)>(sym("cuCtxPushCurrent_v2", "cuCtxPushCurrent"));
    api.pop_ctx = reinterpret_cast<int (*)(void**)>(sym("cuCtxPopCurrent_v2", "cuCtxPopCurrent"));
    api.host_register = reinterpret_cast<int (*)(void*, size_t, unsigned)>(sym("cuMemHostRegister_v2", "cuMemHostRegister"));
  });
  const EventApi* a = &api;
  return a->create && a->record && a->query && a->elapsed && a->destroy && a->get_ctx && a->push_ctx && a->pop_ctx
             ? a
             : nullptr;
}

uint64_t CudaDriver::record_marker(Stream s) {
  RelaxedCapture relaxed;
  const EventApi* a = events();
  if (!a) return 0;
  void* ctx = nullptr;
  void* ev = nullptr;
  if (!cu_ok(a->get_ctx(&ctx), "cuCtxGetCurrent") || !ctx || !cu_ok(a->create(&ev, CU_EVENT_DEFAULT), "cuEventCreate"))
    return 0;
  if (!cu_ok(a->record(ev, reinterpret_cast<void*>(s)), "cuEventRecord")) {
    cu_ok(a->destroy(ev), "cuEventDestroy_v2");
    return 0;
  }
  return reinterpret_cast<uint64_t>(new MarkerRec{ev, ctx});
}

int64_t CudaDriver::marker_elapsed_ns(uint64_t from, uint64_t to) {
  RelaxedCapture relaxed;
  const EventApi* a = events();
  if (!a || !from || !to) return -1;
  auto* f = reinterpret_cast<MarkerRec*>(from);
  auto* t = reinterpret_cast<MarkerRec*>(to);
  // The worker thread has no context of its own: borrow the markers'.
  if (!cu_ok(a->push_ctx(f->ctx), "cuCtxPushCurrent_v2")) return -1;
  float ms = 0;
  int64_t ns = -1;
  if (cu_query(a->query(f->event), "cuEventQuery") > 0 && cu_query(a->query(t->event), "cuEventQuery") > 0 &&
      cu_ok(a->elapsed(&ms, f->event, t->event), "cuEventElapsedTime_v2"))
    ns = static_cast<int64_t>(static_cast<double>(ms) * 1e6);
  void* popped = nullptr;
  cu_ok(a->pop_ctx(&popped), "cuCtxPopCurrent_v2");
  return ns;
}

void CudaDriver::release_marker(uint64_t m) {
  RelaxedCapture relaxed;
  const EventApi* a = events();
  if (!a || !m) return;
  auto* r = reinterpret_cast<MarkerRec*>(m);
  if (cu_ok(a->push_ctx(r->ctx), "cuCtxPushCurrent_v2")) {
    cu_ok(a->destroy(r->event), "cuEventDestroy_v2");
    void* popped = nullptr;
    cu_ok(a->pop_ctx(&popped), "cuCtxPopCurrent_v2");
  }
  delete r;
}

}  // namespace offload

namespace offload {
bool CudaDriver::pin_host(void* p, uint64_t bytes) {
  RelaxedCapture relaxed;
  const EventApi* a = events();
  void* ctx = ctx_.load(std::memory_order_relaxed);
  if (!a || !a->host_register || !ctx || !cu_ok(a->push_ctx(ctx), "cuCtxPushCurrent_v2")) return false;
  bool ok = cu_ok(a->host_register(p, static_cast<size_t>(bytes), CU_MEMHOSTREGISTER_PORTABLE), "cuMemHostRegister_v2");
  void* popped = nullptr;
  cu_ok(a->pop_ctx(&popped), "cuCtxPopCurrent_v2");
  return ok;
}
}  // namespace offload

namespace offload {
namespace {

CUmemAllocationProp device_memory(int dev) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = dev;
  return p;
}

}  // namespace

// Asked with ctx_ itself current: a hook's thread may have another device's context.
int CudaDriver::device() {
  int d = device_.load(std::memory_order_relaxed);
  if (d >= 0) return d;
  const ExecApi* a = exec_api();
  void* ctx = context();
  if (!a || !ctx || !cu_ok(a->push_ctx(static_cast<CUcontext>(ctx)), "cuCtxPushCurrent_v2")) return -1;
  CUdevice dev = -1;
  if (!cu_ok(a->get_device(&dev), "cuCtxGetDevice")) dev = -1;
  CUcontext popped = nullptr;
  cu_ok(a->pop_ctx(&popped), "cuCtxPopCurrent_v2");
  if (dev >= 0) device_.store(dev, std::memory_order_relaxed);
  return dev;
}

uint64_t CudaDriver::vmm_granularity() {
  uint64_t g = granularity_.load(std::memory_order_relaxed);
  if (g) return g;
  int dev = device();
  if (dev < 0) return 0;
  const ExecApi* a = exec_api();
  CtxScope scope(a, context());
  CUmemAllocationProp prop = device_memory(dev);
  size_t n = 0;
  if (!scope ||
      !cu_ok(a->granularity(&n, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity"))
    return 0;
  granularity_.store(n, std::memory_order_relaxed);
  return n;
}

uint64_t CudaDriver::device_total_bytes() {
  uint64_t t = total_bytes_.load(std::memory_order_relaxed);
  if (t) return t;
  int dev = device();
  if (dev < 0) return 0;
  const ExecApi* a = exec_api();
  CtxScope scope(a, context());
  size_t n = 0;
  if (!scope || !cu_ok(a->total_mem(&n, dev), "cuDeviceTotalMem_v2")) return 0;
  total_bytes_.store(n, std::memory_order_relaxed);
  return n;
}

std::string CudaDriver::gpu_id() {
  int dev = device();
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (dev < 0 || !h) return {};
  using BusIdFn = CUresult (*)(char*, int, CUdevice);
  auto bus_id = reinterpret_cast<BusIdFn>(hooks::real_dlsym(h, "cuDeviceGetPCIBusId"));
  char buf[32] = {};
  if (!bus_id || !cu_ok(bus_id(buf, sizeof buf, dev), "cuDeviceGetPCIBusId")) return {};
  return buf;
}

namespace {
// The pool entry points, resolved once: pool queries run on the allocation path (every
// allocation under the cap's size asks how much the pool holds), where a dlsym per query costs
// more than the query.
struct PoolApi {
  decltype(&cuDeviceGetDefaultMemPool) get_pool = nullptr;
  decltype(&cuMemPoolGetAttribute) get_attr = nullptr;
  decltype(&cuMemPoolTrimTo) trim = nullptr;
};

const PoolApi* pool_api() {
  static PoolApi api;
  static std::atomic<bool> ready{false};
  static std::mutex mu;
  if (ready.load(std::memory_order_acquire)) return &api;
  std::lock_guard<std::mutex> lk(mu);
  if (ready.load(std::memory_order_relaxed)) return &api;
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return nullptr;  // libcuda not loaded yet: nothing has allocated from a pool either
  api.get_pool = reinterpret_cast<decltype(api.get_pool)>(hooks::real_dlsym(h, "cuDeviceGetDefaultMemPool"));
  api.get_attr = reinterpret_cast<decltype(api.get_attr)>(hooks::real_dlsym(h, "cuMemPoolGetAttribute"));
  api.trim = reinterpret_cast<decltype(api.trim)>(hooks::real_dlsym(h, "cuMemPoolTrimTo"));
  if (!api.get_pool || !api.get_attr || !api.trim) return nullptr;
  ready.store(true, std::memory_order_release);
  return &api;
}

// The device's default stream-ordered pool (the one cudaMallocAsync draws from), looked up once
// per device; nullptr when the driver has none (CUDA_ERROR_NOT_SUPPORTED: an answer, not logged).
CUmemoryPool default_pool(int dev, const PoolApi** api) {
  constexpr int kDevices = 64;
  static std::atomic<CUmemoryPool> pools[kDevices] = {};
  *api = pool_api();
  if (dev < 0 || dev >= kDevices || !*api) return nullptr;
  CUmemoryPool pool = pools[dev].load(std::memory_order_acquire);
  if (pool) return pool;
  const CUresult r = (*api)->get_pool(&pool, dev);
  if (r == CUDA_ERROR_NOT_SUPPORTED || !cu_ok(r, "cuDeviceGetDefaultMemPool")) return nullptr;
  pools[dev].store(pool, std::memory_order_release);
  return pool;
}

uint64_t default_pool_attribute(int dev, CUmemPool_attribute what) {
  RelaxedCapture relaxed;
  const PoolApi* api = nullptr;
  CUmemoryPool pool = default_pool(dev, &api);
  cuuint64_t v = 0;
  if (!pool || !cu_ok(api->get_attr(pool, what, &v), "cuMemPoolGetAttribute")) return 0;
  return v;
}
}  // namespace

uint64_t CudaDriver::pool_reserved_high() { return default_pool_attribute(device(), CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH); }

uint64_t CudaDriver::pool_reserved_current() {
  return default_pool_attribute(device(), CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
}

bool CudaDriver::pool_trim(uint64_t keep) {
  RelaxedCapture relaxed;
  const PoolApi* api = nullptr;
  CUmemoryPool pool = default_pool(device(), &api);
  return pool && cu_ok(api->trim(pool, keep), "cuMemPoolTrimTo");
}

uint64_t CudaDriver::device_used_bytes() {
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return 0;
  static auto get = reinterpret_cast<decltype(&cuMemGetInfo_v2)>(hooks::real_dlsym(h, "cuMemGetInfo_v2"));
  dlclose(h);
  const ExecApi* a = exec_api();
  if (!get || !a) return 0;
  CtxScope scope(a, context());
  size_t free = 0, total = 0;
  if (!scope || !cu_ok(get(&free, &total), "cuMemGetInfo_v2") || free > total) return 0;
  return total - free;
}

// With ctx_ itself current, as device(): the calling thread may have another device's context.
bool CudaDriver::synchronize() {
  const ExecApi* a = exec_api();
  void* ctx = context();
  if (!a || !ctx || !cu_ok(a->push_ctx(static_cast<CUcontext>(ctx)), "cuCtxPushCurrent_v2")) return false;
  const bool ok = cu_ok(a->ctx_sync(), "cuCtxSynchronize");
  CUcontext popped = nullptr;
  cu_ok(a->pop_ctx(&popped), "cuCtxPopCurrent_v2");
  return ok;
}

DevPtr CudaDriver::reserve(uint64_t bytes) {
  const ExecApi* a = exec_api();
  CtxScope scope(a, context());
  CUdeviceptr va = 0;
  if (!scope || !cu_ok(a->reserve(&va, bytes, 0, 0, 0), "cuMemAddressReserve")) return 0;
  return va;
}

void CudaDriver::unreserve(DevPtr va, uint64_t bytes) {
  const ExecApi* a = exec_api();
  CtxScope scope(a, context());
  if (scope && va) cu_ok(a->free_va(va, bytes), "cuMemAddressFree");
}

uint64_t CudaDriver::create_physical(uint64_t bytes) {
  int dev = device();
  if (dev < 0) return 0;
  const ExecApi* a = exec_api();
  CtxScope scope(a, context());
  CUmemAllocationProp prop = device_memory(dev);
  CUmemGenericAllocationHandle h = 0;
  if (!scope || !cu_ok(a->create(&h, bytes, &prop, 0), "cuMemCreate")) return 0;
  return h;
}

void CudaDriver::release_physical(uint64_t handle) {
  const ExecApi* a = exec_api();
  CtxScope scope(a, context());
  if (scope && handle) cu_ok(a->release(handle), "cuMemRelease");
}

bool CudaDriver::map(DevPtr va, uint64_t bytes, uint64_t handle) { return map_run(va, &handle, &bytes, 1); }

// One access grant over the whole run: the grant costs about as much as a mapping, and one
// over several mappings is what PyTorch's expandable segments do too. The mappings and the
// grant are cuda_grants.cpp's, which grants made apart use alone.
bool CudaDriver::map_run(DevPtr va, const uint64_t* handles, const uint64_t* sizes, size_t n) {
  if (device() < 0 || !map_run_ungranted(va, handles, sizes, n)) return false;
  uint64_t bytes = 0;
  for (size_t i = 0; i < n; ++i) bytes += sizes[i];
  if (grant(va, bytes)) return true;
  // A mapping nobody may access would only fault later, in some kernel: take them back.
  for (size_t j = 0, o = 0; j < n; o += sizes[j++]) unmap(va + o, sizes[j]);
  return false;
}

bool CudaDriver::unmap(DevPtr va, uint64_t bytes) {
  const ExecApi* a = exec_api();
  CtxScope scope(a, context());
  return scope && cu_ok(a->unmap(va, bytes), "cuMemUnmap");
}

Stream CudaDriver::create_stream() {
  const ExecApi* a = exec_api();
  CtxScope scope(a, context());
  CUstream s = nullptr;
  if (!scope || !cu_ok(a->stream_create(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate")) return 0;
  nvtx::name_stream(reinterpret_cast<Stream>(s), "liboffload copies");
  if (size_t i = n_created_.fetch_add(1); i < kStreamsKept) created_[i].store(reinterpret_cast<Stream>(s));
  return reinterpret_cast<Stream>(s);
}

std::vector<Stream> CudaDriver::created_streams() const {
  std::vector<Stream> v;
  for (size_t i = 0; i < std::min(n_created_.load(), kStreamsKept); ++i)
    if (Stream s = created_[i].load()) v.push_back(s);
  return v;
}

uint64_t CudaDriver::create_event() {
  const ExecApi* a = exec_api();
  CtxScope scope(a, context());
  CUevent e = nullptr;
  if (!scope || !cu_ok(a->event_create(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate")) return 0;
  return reinterpret_cast<uint64_t>(e);
}

void CudaDriver::destroy_event(uint64_t e) {
  const ExecApi* a = exec_api();
  CtxScope scope(a, context());
  if (scope && e) cu_ok(a->event_destroy(as_event(e)), "cuEventDestroy_v2");
}

bool CudaDriver::record_event(uint64_t e, Stream s) {
  const ExecApi* a = exec_api();
  CtxScope scope(a, context());
  return scope && e && cu_ok(a->event_record(as_event(e), as_stream(s)), "cuEventRecord");
}

bool CudaDriver::stream_wait(Stream s, uint64_t e) {
  const ExecApi* a = exec_api();
  CtxScope scope(a, context());
  return scope && e && cu_ok(a->stream_wait(as_stream(s), as_event(e), 0), "cuStreamWaitEvent");
}

int CudaDriver::event_query(uint64_t e) {
  const ExecApi* a = exec_api();
  CtxScope scope(a, context());
  if (!scope || !e) return -1;
  return cu_query(a->event_query(as_event(e)), "cuEventQuery");
}

int CudaDriver::stream_query(Stream s) {
  const ExecApi* a = exec_api();
  CtxScope scope(a, context());
  if (!scope || !a->stream_query) return -1;
  return cu_query(a->stream_query(as_stream(s)), "cuStreamQuery");
}

int CudaDriver::stream_capturing(Stream s) {
  const ExecApi* a = exec_api();
  CtxScope scope(a, context());
  if (!scope || !a->is_capturing) return -1;
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  if (a->is_capturing(as_stream(s), &st) != CUDA_SUCCESS) return -1;  // e.g. legacy stream in a global capture
  if (st == CU_STREAM_CAPTURE_STATUS_NONE) return 0;
  note_capture_seen();
  return 1;
}

uint64_t CudaDriver::current_context() {
  const ExecApi* a = exec_api();
  CUcontext c = nullptr;
  if (!a || !cu_ok(a->get_ctx(&c), "cuCtxGetCurrent")) return 0;
  return reinterpret_cast<uint64_t>(c);
}

bool CudaDriver::event_sync(uint64_t e) {
  const ExecApi* a = exec_api();
  CtxScope scope(a, context());
  return scope && e && cu_ok(a->event_sync(as_event(e)), "cuEventSynchronize");
}

bool CudaDriver::copy_to_host(void* dst, DevPtr src, uint64_t bytes, Stream s) {
  if (s && gate_stream_.load(std::memory_order_acquire) == s) return gated_copy_to_host(dst, src, bytes, s);
  const ExecApi* a = exec_api();
  CtxScope scope(a, context());
  nvtx::Range range(nvtx::Move::Evict, bytes);
  return scope && cu_ok(a->dtoh(dst, src, bytes, as_stream(s)), "cuMemcpyDtoHAsync_v2");
}

bool CudaDriver::copy_to_device(DevPtr dst, const void* src, uint64_t bytes, Stream s) {
  const ExecApi* a = exec_api();
  CtxScope scope(a, context());
  nvtx::Range range(nvtx::Move::Reload, bytes);
  return scope && cu_ok(a->htod(dst, src, bytes, as_stream(s)), "cuMemcpyHtoDAsync_v2");
}

bool CudaDriver::launch_kernel(Func f, const LaunchGeom& g, Stream s, void** params, void** extra) {
  const ExecApi* a = exec_api();
  CtxScope scope(a, context());
  if (g.nattrs) {  // with the launch's attributes, as cuLaunchKernelEx took them
    CUlaunchConfig c{};
    c.gridDimX = g.grid[0], c.gridDimY = g.grid[1], c.gridDimZ = g.grid[2];
    c.blockDimX = g.block[0], c.blockDimY = g.block[1], c.blockDimZ = g.block[2];
    c.sharedMemBytes = g.smem;
    c.hStream = as_stream(s);
    c.attrs = static_cast<CUlaunchAttribute*>(const_cast<void*>(g.attrs));
    c.numAttrs = g.nattrs;
    return scope && a->launch_ex && g.attrs && g.attr_bytes == g.nattrs * sizeof(CUlaunchAttribute) &&
           cu_ok(a->launch_ex(&c, reinterpret_cast<CUfunction>(f), params, extra), "cuLaunchKernelEx");
  }
  return scope && a->launch && cu_ok(a->launch(reinterpret_cast<CUfunction>(f), g.grid[0], g.grid[1], g.grid[2], g.block[0],
                                  g.block[1], g.block[2], g.smem, as_stream(s), params, extra),
                        "cuLaunchKernel");
}

int64_t CudaDriver::hash_start(DevPtr va, uint64_t bytes, Stream s) {
  static_assert(gpu::GpuHash::kTickets == kHashTickets);
  const ExecApi* a = exec_api();
  CtxScope scope(a, context());
  CUcontext cur = nullptr;
  if (!scope || !cu_ok(a->get_ctx(&cur), "cuCtxGetCurrent") || !cur) return -1;
  return hash_.start(cur, va, bytes, as_stream(s));
}

uint64_t CudaDriver::hash_value(int64_t ticket) { return hash_.value(ticket); }

bool CudaDriver::device_copies() {
  const ExecApi* a = exec_api();
  return a && a->dtod && a->memset8;
}

bool CudaDriver::copy_device(DevPtr dst, DevPtr src, uint64_t bytes, Stream s) {
  const ExecApi* a = exec_api();
  CtxScope scope(a, context());
  return scope && a->dtod && cu_ok(a->dtod(dst, src, bytes, as_stream(s)), "cuMemcpyDtoDAsync_v2");
}

bool CudaDriver::zero_device(DevPtr dst, uint64_t bytes, Stream s) {
  const ExecApi* a = exec_api();
  CtxScope scope(a, context());
  return scope && a->memset8 && cu_ok(a->memset8(dst, 0, bytes, as_stream(s)), "cuMemsetD8Async");
}

}  // namespace offload

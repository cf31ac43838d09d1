// The hook table and the hooks themselves, compiled from the shim's own sources into this
// test binary (see tests/CMakeLists.txt): every route serves every name, and the exported
// wrappers forward to the real entry point and tell the tracker.
//
// The table's slots are process-wide and the first real entry point a route resolves wins,
// so every test starts by installing one fake per name (once per process, before anything
// else can resolve a slot): the tests then pass in any order and alone.
#include <cuda.h>
#include <cupti.h>
#undef cuGetProcAddress
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <gtest/gtest.h>

#include "cupti_telemetry.h"
#include "hooks/launch_attrs.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hooks/hook.h"
#include "hooks/hook_table.h"
#include "json_mini.h"
#include "offload/offload.h"
#include "runtime.h"
#include "sanitizers.h"

// Our exports whose declarations cuda.h / cuda_runtime_api.h only give under other names.
extern "C" {
CUresult cuGetProcAddress(const char* sym, void** pfn, int ver, cuuint64_t flags);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                             unsigned bz, unsigned smem, CUstream s, void** p, void** e);
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr d, const void* h, size_t n);
CUresult cuMemcpyBatchAsync(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count, CUmemcpyAttributes* a,
                            size_t* ai, size_t na, size_t* fail, CUstream s);
cudaError_t cudaMallocAsync_ptsz(void** p, size_t n, cudaStream_t s);
cudaError_t cudaFreeAsync_ptsz(void* p, cudaStream_t s);
cudaError_t cudaGetDriverEntryPoint_ptsz(const char* sym, void** pfn, unsigned long long flags,
                                         cudaDriverEntryPointQueryResult* status);
cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char* sym, void** pfn, unsigned int ver,
                                                  unsigned long long flags, cudaDriverEntryPointQueryResult* status);
// From next_first_lib (linked in; it depends on next_second_lib).
void* offload_test_lookup_next(void* (*lookup)(void*, const char*));
}

// Unit tests never start CUPTI: there is no GPU. Runs before the shim's own constructor
// (default priority) reads the environment; a value set by the caller is kept.
__attribute__((constructor(101))) static void hook_test_env() {
  setenv("OFFLOAD_TELEMETRY", "off", 0);
  setenv("OFFLOAD_DAEMON", "off", 0);  // hermetic: no daemon is started from these tests
  setenv("OFFLOAD_OBSERVE", "full", 0);  // the launch hooks scan: what most tests here check
}

namespace {

using namespace offload;
using namespace offload::hooks;

void* fake_lib() {
  static void* h = dlopen(OFFLOAD_FAKE_CUDA_LIB, RTLD_NOW | RTLD_LOCAL);
  return h;
}
void* fake_lib_sym(const char* name) { return real_dlsym(fake_lib(), name); }

// Distinct, stable addresses standing for "the driver's entry point of <name>".
void* proc_of(const std::string& name) {
  static std::map<std::string, char> storage;  // node-based: addresses never move
  return &storage[name];
}

// --- fakes of the real entry points -----------------------------------------------------------

struct LaunchCall {
  CUfunction f;
  unsigned g[3], b[3], smem;
  CUstream s;
  void** params;
  void** extra;
};
std::mutex g_fake_mu;  // the fakes below may be called from several threads at once
std::vector<LaunchCall> g_launches;
std::function<void()> g_inside_launch;  // runs inside the fake (nested-call test)

CUresult fake_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                     unsigned bz, unsigned smem, CUstream s, void** p, void** e) {
  {
    std::lock_guard lock(g_fake_mu);
    g_launches.push_back({f, {gx, gy, gz}, {bx, by, bz}, smem, s, p, e});
  }
  if (auto inner = g_inside_launch) inner();
  return CUDA_SUCCESS;
}

// cuLaunchKernelEx: the attribute ids the driver was given, and its extra array.
std::vector<int> g_launch_ex_attrs;
void** g_launch_ex_extra = nullptr;
CUresult fake_launch_ex(const CUlaunchConfig* c, CUfunction, void**, void** e) {
  std::lock_guard lock(g_fake_mu);
  g_launch_ex_attrs.clear();
  for (unsigned i = 0; i < c->numAttrs; ++i) g_launch_ex_attrs.push_back(c->attrs[i].id);
  g_launch_ex_extra = e;
  return CUDA_SUCCESS;
}

struct MallocCall {
  size_t n;
  cudaStream_t s;
};
std::vector<MallocCall> g_mallocs;
std::vector<std::pair<void*, cudaStream_t>> g_frees;
cudaError_t g_malloc_result = cudaSuccess;
int g_malloc_full = 0;  // the next this many calls find the device full

cudaError_t fake_malloc(void** p, size_t n, cudaStream_t s) {
  std::lock_guard lock(g_fake_mu);
  g_mallocs.push_back({n, s});
  if (g_malloc_result != cudaSuccess) return g_malloc_result;
  if (g_malloc_full > 0) {
    --g_malloc_full;
    return cudaErrorMemoryAllocation;
  }
  *p = std::aligned_alloc(256, (n + 255) / 256 * 256);
  return cudaSuccess;
}
cudaError_t fake_free(void* p, cudaStream_t s) {
  std::lock_guard lock(g_fake_mu);
  g_frees.push_back({p, s});
  std::free(p);
  return cudaSuccess;
}

int g_copies = 0, g_memsets = 0, g_graphs = 0;
CUresult fake_htod(CUdeviceptr, const void*, size_t, CUstream) { ++g_copies; return CUDA_SUCCESS; }
CUresult fake_memset32(CUdeviceptr, unsigned, size_t, CUstream) { ++g_memsets; return CUDA_SUCCESS; }
// The synchronous copies and memsets: the stream-less calls, counted with the others.
CUresult fake_dtoh_sync(void*, CUdeviceptr, size_t) { ++g_copies; return CUDA_SUCCESS; }
CUresult fake_htod_sync(CUdeviceptr, const void*, size_t) { ++g_copies; return CUDA_SUCCESS; }
CUresult fake_2d_sync(const CUDA_MEMCPY2D*) { ++g_copies; return CUDA_SUCCESS; }
CUresult fake_3d_sync(const CUDA_MEMCPY3D*) { ++g_copies; return CUDA_SUCCESS; }
CUresult fake_memset32_sync(CUdeviceptr, unsigned, size_t) { ++g_memsets; return CUDA_SUCCESS; }
// Batches of copies, CUDA 13's and 12.8's (which reports a failed copy's index).
size_t g_batch_count = 0;
CUresult fake_batch(CUdeviceptr*, CUdeviceptr*, size_t*, size_t count, CUmemcpyAttributes*, size_t*, size_t, CUstream) {
  g_batch_count = count;
  ++g_copies;
  return CUDA_SUCCESS;
}
CUresult fake_batch_first(CUdeviceptr*, CUdeviceptr*, size_t*, size_t count, CUmemcpyAttributes*, size_t*, size_t,
                          size_t* fail, CUstream) {
  g_batch_count = count;
  *fail = SIZE_MAX;
  ++g_copies;
  return CUDA_SUCCESS;
}
CUresult fake_graph(CUgraphExec, CUstream) {
  ++g_graphs;
  if (auto inner = g_inside_launch) inner();
  return CUDA_SUCCESS;
}

// Entry-point queries: succeed with proc_of(name), except for "cuNoSuchThing".
struct Query {
  std::string sym;
  long long version;
  unsigned long long flags;
};
std::vector<Query> g_queries;
bool known(const char* sym) { return std::strcmp(sym, "cuNoSuchThing") != 0; }

CUresult fake_gpa_v1(const char* sym, void** pfn, int ver, cuuint64_t flags) {
  g_queries.push_back({sym, ver, flags});
  if (!pfn) return CUDA_ERROR_INVALID_VALUE;
  if (!known(sym)) return CUDA_ERROR_NOT_FOUND;
  *pfn = proc_of(sym);
  return CUDA_SUCCESS;
}
CUresult fake_gpa_v2(const char* sym, void** pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult* st) {
  g_queries.push_back({sym, ver, flags});
  if (!pfn) return CUDA_ERROR_INVALID_VALUE;
  if (!known(sym)) {
    if (st) *st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
  }
  *pfn = proc_of(sym);
  if (st) *st = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}
cudaError_t fake_rt_entry(const char* sym, void** pfn, unsigned long long flags, cudaDriverEntryPointQueryResult* st) {
  g_queries.push_back({sym, -1, flags});
  if (!known(sym)) return cudaErrorSymbolNotFound;
  *pfn = proc_of(sym);
  if (st) *st = cudaDriverEntryPointSuccess;
  return cudaSuccess;
}
cudaError_t fake_rt_entry_v(const char* sym, void** pfn, unsigned int ver, unsigned long long flags,
                            cudaDriverEntryPointQueryResult* st) {
  g_queries.push_back({sym, ver, flags});
  if (!known(sym)) return cudaErrorSymbolNotFound;
  *pfn = proc_of(sym);
  if (st) *st = cudaDriverEntryPointSuccess;
  return cudaSuccess;
}

// --- installing them -----------------------------------------------------------------------

struct Installed {
  void* real_before[kHookCount];  // what each slot held before we installed (nullptr)
  void* fake[kHookCount];         // the real entry point we installed
  void* served[kHookCount];       // what serve_symbol handed back when installing
};

Installed& installed() {
  static Installed inst;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::map<std::string, void*> specific = {
        {"cuLaunchKernel", reinterpret_cast<void*>(&fake_launch)},
        {"cuLaunchKernel_ptsz", reinterpret_cast<void*>(&fake_launch)},
        {"cuLaunchKernelEx", reinterpret_cast<void*>(&fake_launch_ex)},
        {"cudaMallocAsync", reinterpret_cast<void*>(&fake_malloc)},
        {"cudaMallocAsync_ptsz", reinterpret_cast<void*>(&fake_malloc)},
        {"cudaFreeAsync", reinterpret_cast<void*>(&fake_free)},
        {"cudaFreeAsync_ptsz", reinterpret_cast<void*>(&fake_free)},
        {"cuMemcpyHtoDAsync_v2", reinterpret_cast<void*>(&fake_htod)},
        {"cuMemsetD32Async", reinterpret_cast<void*>(&fake_memset32)},
        {"cuMemcpyDtoH_v2", reinterpret_cast<void*>(&fake_dtoh_sync)},
        {"cuMemcpyHtoD_v2_ptds", reinterpret_cast<void*>(&fake_htod_sync)},
        {"cuMemcpy2D_v2", reinterpret_cast<void*>(&fake_2d_sync)},
        {"cuMemcpy3D_v2", reinterpret_cast<void*>(&fake_3d_sync)},
        {"cuMemsetD32_v2", reinterpret_cast<void*>(&fake_memset32_sync)},
        {"cuMemcpyBatchAsync_v2", reinterpret_cast<void*>(&fake_batch)},
        {"cuMemcpyBatchAsync", reinterpret_cast<void*>(&fake_batch_first)},
        {"cuGraphLaunch", reinterpret_cast<void*>(&fake_graph)},
        {"cuGetProcAddress", reinterpret_cast<void*>(&fake_gpa_v1)},
        {"cuGetProcAddress_v2", reinterpret_cast<void*>(&fake_gpa_v2)},
        {"cudaGetDriverEntryPoint", reinterpret_cast<void*>(&fake_rt_entry)},
        {"cudaGetDriverEntryPoint_ptsz", reinterpret_cast<void*>(&fake_rt_entry)},
        {"cudaGetDriverEntryPointByVersion", reinterpret_cast<void*>(&fake_rt_entry_v)},
        {"cudaGetDriverEntryPointByVersion_ptsz", reinterpret_cast<void*>(&fake_rt_entry_v)},
    };
    for (size_t i = 0; i < kHookCount; ++i) {
      HookEntry& e = hook_table()[i];
      auto it = specific.find(e.symbol);
      void* f = it != specific.end() ? it->second : fake_lib_sym(e.symbol);
      inst.real_before[i] = e.real.load();
      inst.fake[i] = f;
      inst.served[i] = serve_symbol(e.symbol, f, kDlsym);
    }
  });
  return inst;
}

class Hooks : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(fake_lib(), nullptr) << dlerror();
    installed();
    g_launches.clear();
    g_mallocs.clear();
    g_frees.clear();
    g_queries.clear();
    g_malloc_result = cudaSuccess;
    g_malloc_full = 0;
    g_inside_launch = nullptr;
  }
};

std::string name_of(void* wrapper) {
  for (size_t i = 0; i < kHookCount; ++i)
    if (hook_table()[i].wrapper == wrapper) return hook_table()[i].symbol;
  return wrapper ? "(not a wrapper)" : "(null)";
}

// --- the table --------------------------------------------------------------------------------

TEST_F(Hooks, TableListsEveryNameOnceWithItsOwnWrapper) {
#define COUNT_D(sym, base, ver, ptsz) +1
#define COUNT_R(sym, ptsz) +1
  constexpr size_t listed = 0 OFFLOAD_DRIVER_HOOKS(COUNT_D) OFFLOAD_RUNTIME_HOOKS(COUNT_R);
#undef COUNT_D
#undef COUNT_R
  ASSERT_EQ(kHookCount, listed);
  std::map<std::string, int> names;
  std::map<void*, int> wrappers;
  for (size_t i = 0; i < kHookCount; ++i) {
    const HookEntry& e = hook_table()[i];
    SCOPED_TRACE(e.symbol);
    EXPECT_EQ(++names[e.symbol], 1) << "listed twice";
    ASSERT_NE(e.wrapper, nullptr);
    EXPECT_EQ(++wrappers[e.wrapper], 1) << "shares a wrapper";
    if (e.driver) {
      ASSERT_NE(e.base, nullptr);
      EXPECT_EQ(std::strncmp(e.symbol, e.base, std::strlen(e.base)), 0) << "the symbol extends its base name";
      EXPECT_GT(e.min_version, 0);
      EXPECT_EQ(e.ptsz, std::strstr(e.symbol, "_ptsz") != nullptr || std::strstr(e.symbol, "_ptds") != nullptr);
    } else {
      EXPECT_EQ(e.base, nullptr);
      EXPECT_TRUE(std::strncmp(e.symbol, "cuda", 4) == 0 || std::strncmp(e.symbol, "nccl", 4) == 0);
    }
    EXPECT_EQ(&entry(static_cast<HookId>(i)), &e);
  }
}

TEST_F(Hooks, FindSymbolFindsEveryEntry) {
  for (size_t i = 0; i < kHookCount; ++i) {
    HookEntry& e = hook_table()[i];
    EXPECT_EQ(find_symbol(e.symbol), &e) << e.symbol;
  }
  EXPECT_EQ(find_symbol("cuFakeNotHooked"), nullptr);
  EXPECT_EQ(find_symbol("cuLaunchKernel_v2"), nullptr);
  EXPECT_EQ(find_symbol("malloc"), nullptr);
  EXPECT_EQ(find_symbol(""), nullptr);
  EXPECT_EQ(find_symbol(nullptr), nullptr);
}

TEST_F(Hooks, ServeSymbolHandsOutTheWrapperAndTheFirstRealWins) {
  const Installed& in = installed();
  void* later = proc_of("a later, different real entry point");
  for (size_t i = 0; i < kHookCount; ++i) {
    HookEntry& e = hook_table()[i];
    SCOPED_TRACE(e.symbol);
    EXPECT_EQ(in.real_before[i], nullptr) << "nothing resolved the slot before the fakes";
    ASSERT_NE(in.fake[i], nullptr);
    EXPECT_EQ(in.served[i], e.wrapper);
    EXPECT_EQ(e.real.load(), in.fake[i]);
    EXPECT_TRUE(e.routes.load() & kDlsym);
    EXPECT_EQ(real(static_cast<HookId>(i)), in.fake[i]) << "the wrapper forwards to the fake";
    EXPECT_EQ(serve_symbol(e.symbol, later, kDlsym), e.wrapper);
    EXPECT_EQ(e.real.load(), in.fake[i]) << "first one wins";
    // Asked of ourselves (RTLD_DEFAULT finds our export): the wrapper, and the slot unchanged.
    EXPECT_EQ(serve_symbol(e.symbol, e.wrapper, kDlsym), e.wrapper);
    EXPECT_EQ(e.real.load(), in.fake[i]);
  }
}

TEST_F(Hooks, NamesNotInTheTablePassThrough) {
  void* p = proc_of("cuFakeNotHooked");
  EXPECT_EQ(serve_symbol("cuFakeNotHooked", p, kDlsym), p);
  EXPECT_EQ(serve_symbol("malloc", p, kDlsym), p);
  EXPECT_EQ(serve_proc("cuMemAlloc", p, 13000, false, kGetProcAddress), p);
  EXPECT_EQ(serve_proc("cuMemAlloc", p, 13000, true, kRuntimeEntryPoint), p);
  EXPECT_EQ(serve_symbol(nullptr, p, kDlsym), p);
}

TEST_F(Hooks, NoRealEntryPointMeansNull) {
  for (size_t i = 0; i < kHookCount; ++i) {
    HookEntry& e = hook_table()[i];
    EXPECT_EQ(serve_symbol(e.symbol, nullptr, kDlsym), nullptr) << e.symbol;
    if (e.base) {
      EXPECT_EQ(serve_proc(e.base, nullptr, 13000, e.ptsz, kGetProcAddress), nullptr) << e.symbol;
    }
  }
  EXPECT_EQ(serve_symbol("cuFakeNotHooked", nullptr, kDlsym), nullptr);
  EXPECT_EQ(serve_proc("cuMemAlloc", nullptr, 13000, false, kGetProcAddress), nullptr);
}

TEST_F(Hooks, ServeProcServesEachVariantFromItsFirstVersion) {
  void* p = proc_of("driver's pointer");
  for (size_t i = 0; i < kHookCount; ++i) {
    HookEntry& e = hook_table()[i];
    if (!e.driver) continue;
    SCOPED_TRACE(e.symbol);
    void* got = serve_proc(e.base, p, e.min_version, e.ptsz, kGetProcAddress);
    EXPECT_EQ(got, e.wrapper) << "got " << name_of(got);
    EXPECT_TRUE(e.routes.load() & kGetProcAddress);
    EXPECT_EQ(e.real.load(), installed().fake[i]) << "the first real still wins";
  }
}

TEST_F(Hooks, ServeProcPicksTheVariantByVersionAndStream) {
  void* p = proc_of("driver's pointer");
  auto served = [&](const char* base, int ver, bool ptsz) {
    return name_of(serve_proc(base, p, ver, ptsz, kGetProcAddress));
  };
  EXPECT_EQ(served("cuMemcpyHtoDAsync", 13000, true), "cuMemcpyHtoDAsync_v2_ptsz");
  EXPECT_EQ(served("cuMemcpyBatchAsync", 12080, false), "cuMemcpyBatchAsync");
  EXPECT_EQ(served("cuMemcpyBatchAsync", 13000, false), "cuMemcpyBatchAsync_v2");
  EXPECT_EQ(served("cuMemcpyBatchAsync", 13000, true), "cuMemcpyBatchAsync_v2_ptsz");
  EXPECT_EQ(served("cuMemcpyHtoD", 13000, true), "cuMemcpyHtoD_v2_ptds");
  EXPECT_EQ(served("cuMemcpyHtoDAsync", 13000, false), "cuMemcpyHtoDAsync_v2");
  EXPECT_EQ(served("cuGetProcAddress", 13000, false), "cuGetProcAddress_v2");
  EXPECT_EQ(served("cuGetProcAddress", 12000, false), "cuGetProcAddress_v2");
  EXPECT_EQ(served("cuGetProcAddress", 11030, false), "cuGetProcAddress");
  EXPECT_EQ(served("cuGetProcAddress", 13000, true), "cuGetProcAddress_v2") << "no per-thread variant";
  EXPECT_EQ(served("cuLaunchKernel", 13000, true), "cuLaunchKernel_ptsz");
  EXPECT_EQ(served("cuLaunchKernel", 13000, false), "cuLaunchKernel");
  EXPECT_EQ(served("cuLaunchKernel", 6050, true), "cuLaunchKernel") << "no per-thread variant before 7.0";
  EXPECT_EQ(served("cuLaunchKernelEx", 12080, true), "cuLaunchKernelEx_ptsz");
  EXPECT_EQ(served("cuGraphLaunch", 13000, true), "cuGraphLaunch_ptsz");
  EXPECT_EQ(served("cuMemsetD2D32Async", 13000, false), "cuMemsetD2D32Async");
}

TEST_F(Hooks, AListedNameAtAVersionWeDoNotWrapPassesThroughAndIsCounted) {
  void* p = proc_of("driver's pointer");
  uint64_t before = unwrapped_routes();
  EXPECT_EQ(serve_proc("cuLaunchKernelEx", p, 11000, false, kGetProcAddress), p);
  EXPECT_EQ(serve_proc("cuGetProcAddress", p, 11020, false, kGetProcAddress), p);
  EXPECT_EQ(unwrapped_routes(), before + 2);
  EXPECT_EQ(serve_proc("cuMemAlloc", p, 11000, false, kGetProcAddress), p);
  EXPECT_EQ(unwrapped_routes(), before + 2) << "a name we do not list is not counted";
}

// --- the routes, through the exported functions ------------------------------------------------

TEST_F(Hooks, DlsymRouteServesEveryName) {
  for (size_t i = 0; i < kHookCount; ++i) {
    HookEntry& e = hook_table()[i];
    SCOPED_TRACE(e.symbol);
    ASSERT_NE(fake_lib_sym(e.symbol), nullptr);
    EXPECT_EQ(dlsym(fake_lib(), e.symbol), e.wrapper);
    EXPECT_EQ(e.real.load(), installed().fake[i]);
  }
  EXPECT_EQ(dlsym(fake_lib(), "cuFakeNotHooked"), fake_lib_sym("cuFakeNotHooked"));
  EXPECT_NE(dlsym(fake_lib(), "cuFakeNotHooked"), nullptr);
  EXPECT_EQ(dlsym(fake_lib(), "cuNoSuchSymbol"), nullptr);
  EXPECT_EQ(dlsym(RTLD_DEFAULT, "strlen"), real_dlsym(RTLD_DEFAULT, "strlen"));
}

// dlsym(RTLD_NEXT, name) means "the first definition after the caller's object". A library
// whose dlsym calls bind to the shim's dlsym must get the same answer as from libc's: the
// wrapper may not make the lookup relative to itself. Here the caller is next_first_lib,
// and the next definition is next_second_lib's (returns 2), not the caller's own (returns 1).
TEST_F(Hooks, DlsymRtldNextStaysRelativeToTheCaller) {
  using Lookup = void* (*)(void*, const char*);
  using Fn = int (*)();
  auto libc_dlsym = reinterpret_cast<Lookup>(dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34"));
  if (!libc_dlsym) libc_dlsym = reinterpret_cast<Lookup>(dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.2.5"));
  ASSERT_NE(libc_dlsym, nullptr);
  auto direct = reinterpret_cast<Fn>(offload_test_lookup_next(libc_dlsym));
  ASSERT_NE(direct, nullptr);
  ASSERT_EQ(direct(), 2) << "the test's libraries are not in the expected order";
  auto through_shim = reinterpret_cast<Fn>(offload_test_lookup_next(&::dlsym));
  ASSERT_NE(through_shim, nullptr);
  EXPECT_EQ(through_shim(), 2) << "the shim's dlsym resolved RTLD_NEXT relative to itself, "
                                  "handing the caller its own definition back";
}

// Interposers ask dlsym(RTLD_NEXT) for the same names constantly: the answer is kept per
// calling site and name, and found again only when an object was loaded or unloaded since
// (the next definition may then be another, or gone).
TEST_F(Hooks, DlsymRtldNextIsKeptPerCallerUntilTheLoadOrderChanges) {
  using Named = void* (*)(void* (*)(void*, const char*), const char*);
  auto lookup = reinterpret_cast<Named>(real_dlsym(RTLD_DEFAULT, "offload_test_lookup_next_named"));
  ASSERT_NE(lookup, nullptr);
  void* const first = lookup(&::dlsym, "offload_test_next_symbol");
  ASSERT_NE(first, nullptr);
  const uint64_t walks = dlsym_next_walks();
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(lookup(&::dlsym, "offload_test_next_symbol"), first);
  EXPECT_EQ(dlsym_next_walks(), walks) << "the load order was walked again for an answer already found";

  // A definition loaded after the caller becomes the answer, and stops being it once unloaded.
  EXPECT_EQ(lookup(&::dlsym, "offload_test_late_symbol"), nullptr);
  for (int round = 0; round < 2; ++round) {
    void* late = dlopen(OFFLOAD_NEXT_LATE_LIB, RTLD_NOW | RTLD_GLOBAL);
    ASSERT_NE(late, nullptr) << dlerror();
    void* found = lookup(&::dlsym, "offload_test_late_symbol");
    EXPECT_EQ(found, real_dlsym(late, "offload_test_late_symbol"));
    ASSERT_NE(found, nullptr);
    EXPECT_EQ(reinterpret_cast<int (*)()>(found)(), 3);
    ASSERT_EQ(dlclose(late), 0);
    EXPECT_EQ(lookup(&::dlsym, "offload_test_late_symbol"), nullptr)
        << "an answer from an unloaded library was kept";
    EXPECT_NE(dlerror(), nullptr) << "a failed lookup leaves dlerror() its message";
  }
  EXPECT_EQ(lookup(&::dlsym, "offload_test_next_symbol"), first);
}

// PyTorch's libnccl is a dependency of libtorch_cuda, which Python loads with RTLD_LOCAL: not
// in the global scope that RTLD_NEXT searches, while libtorch_cuda's calls still bind to our
// exported collectives. The fake library stands for it here (loaded RTLD_LOCAL).
TEST_F(Hooks, ARealInALocallyLoadedLibraryIsFound) {
  const HookEntry& e = entry(HookId::ncclAllGather);
  ASSERT_NE(fake_lib_sym("ncclAllGather"), nullptr);
  EXPECT_EQ(real_dlsym(RTLD_NEXT, "ncclAllGather"), nullptr) << "the fake library is not loaded locally";
  EXPECT_EQ(find_loaded("ncclAllGather", e.wrapper), fake_lib_sym("ncclAllGather"));
  EXPECT_EQ(find_loaded("cuFakeNotHooked", e.wrapper), fake_lib_sym("cuFakeNotHooked"));
  EXPECT_EQ(find_loaded("offload_no_such_symbol", e.wrapper), nullptr);
  // Libraries in the global scope count too: the first in load order (next_first_lib's own
  // definition returns 1, next_second_lib's 2).
  auto fn = reinterpret_cast<int (*)()>(find_loaded("offload_test_next_symbol", e.wrapper));
  ASSERT_NE(fn, nullptr);
  EXPECT_EQ(fn(), 1);
  // The same answers when the libraries are looked at one or two at a time.
  for (const size_t batch : {1, 2}) {
    SCOPED_TRACE("batches of " + std::to_string(batch));
    EXPECT_EQ(find_loaded("ncclAllGather", e.wrapper, batch), fake_lib_sym("ncclAllGather"));
    EXPECT_EQ(find_loaded("offload_no_such_symbol", e.wrapper, batch), nullptr);
    EXPECT_EQ(find_loaded("offload_test_next_symbol", e.wrapper, batch), reinterpret_cast<void*>(fn));
  }
}

// The walk for a locally loaded definition runs while other threads load and unload libraries
// (Python importing an extension, the shim's worker opening libcuda): the loader's locks are
// never taken in the reverse order, so neither side waits for ever. A child process, ended by
// an alarm if the two deadlock.
TEST_F(Hooks, FindingALocalDefinitionWhileAnotherThreadLoadsLibrariesNeverDeadlocks) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto race = [] {
    alarm(60);
    const HookEntry& e = entry(HookId::ncclAllGather);
    std::atomic<bool> stop{false};
    std::thread loader([&] {
      while (!stop.load()) {
        void* h = dlopen(OFFLOAD_NEXT_LATE_LIB, RTLD_NOW | RTLD_LOCAL);
        if (!h) std::_Exit(3);
        dlclose(h);
        usleep(20);  // the loader's lock is not fair: a loop without a pause starves the walk
      }
    });
#ifdef OFFLOAD_TEST_TSAN
    constexpr int kLookups = 100;  // each dlopen costs ThreadSanitizer a scan of every module
#else
    constexpr int kLookups = 2000;  // the walk this replaced deadlocked in each of 3 runs of 2000
#endif
    void* const want = fake_lib_sym("ncclAllGather");
    for (int i = 0; i < kLookups; ++i)
      if (find_loaded("ncclAllGather", e.wrapper) != want) std::_Exit(4);
    stop.store(true);
    loader.join();
    std::_Exit(0);
  };
  EXPECT_EXIT(race(), ::testing::ExitedWithCode(0), "");
}

// torch.profiler's Kineto registers for CUPTI's activity buffers through a libcupti that
// Python loaded locally (a dependency of libtorch_cuda), while its call binds to our export:
// the registration must reach that library, or the profiler records no CUDA activity.
void test_buffer_request(uint8_t**, size_t*, size_t*) {}
void test_buffer_complete(CUcontext, uint32_t, uint8_t*, size_t, size_t) {}
TEST_F(Hooks, AProfilersCuptiRegistrationReachesALocallyLoadedCupti) {
  auto calls = reinterpret_cast<int (*)()>(fake_lib_sym("offload_fake_cupti_register_calls"));
  ASSERT_NE(calls, nullptr);
  ASSERT_EQ(real_dlsym(RTLD_NEXT, "cuptiActivityRegisterCallbacks"), nullptr)
      << "a CUPTI in the global scope: this test would not see the local one";
  const int before = calls();
  EXPECT_EQ(cuptiActivityRegisterCallbacks(test_buffer_request, test_buffer_complete), CUPTI_SUCCESS);
  EXPECT_EQ(calls(), before + 1);
}

cuuint64_t gpa_flags(bool ptsz) {
  return ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT;
}

TEST_F(Hooks, GetProcAddressRoutesServeEveryDriverName) {
  for (size_t i = 0; i < kHookCount; ++i) {
    HookEntry& e = hook_table()[i];
    if (!e.driver) continue;
    SCOPED_TRACE(e.symbol);
    void* pfn = nullptr;
    ASSERT_EQ(cuGetProcAddress(e.base, &pfn, e.min_version, gpa_flags(e.ptsz)), CUDA_SUCCESS);
    EXPECT_EQ(pfn, e.wrapper) << "v1 gave " << name_of(pfn);
    pfn = nullptr;
    CUdriverProcAddressQueryResult st{};
    ASSERT_EQ(cuGetProcAddress_v2(e.base, &pfn, e.min_version, gpa_flags(e.ptsz), &st), CUDA_SUCCESS);
    EXPECT_EQ(pfn, e.wrapper) << "v2 gave " << name_of(pfn);
    EXPECT_EQ(st, CU_GET_PROC_ADDRESS_SUCCESS);
  }
  // The query reached the (fake) driver unchanged.
  ASSERT_FALSE(g_queries.empty());
  EXPECT_EQ(g_queries.back().sym, hook_table()[static_cast<size_t>(HookId::cuGetProcAddress_v2)].base);
}

TEST_F(Hooks, GetProcAddressPassesOtherNamesAndFailuresThrough) {
  void* pfn = nullptr;
  ASSERT_EQ(cuGetProcAddress_v2("cuMemAlloc", &pfn, 13000, 0, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(pfn, proc_of("cuMemAlloc"));
  pfn = reinterpret_cast<void*>(0x1);
  CUdriverProcAddressQueryResult st{};
  EXPECT_EQ(cuGetProcAddress_v2("cuNoSuchThing", &pfn, 13000, 0, &st), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(pfn, reinterpret_cast<void*>(0x1)) << "untouched on failure";
  EXPECT_EQ(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(cuGetProcAddress("cuNoSuchThing", &pfn, 13000, 0), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(pfn, reinterpret_cast<void*>(0x1));
  EXPECT_EQ(cuGetProcAddress_v2("cuLaunchKernel", nullptr, 13000, 0, nullptr), CUDA_ERROR_INVALID_VALUE)
      << "a null pfn is the driver's to refuse";
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
TEST_F(Hooks, RuntimeEntryPointRoutesServeDriverNames) {
  auto get = [](const char* sym, unsigned long long flags) {
    void* pfn = nullptr;
    cudaDriverEntryPointQueryResult st{};
    EXPECT_EQ(cudaGetDriverEntryPoint(sym, &pfn, flags, &st), cudaSuccess);
    return name_of(pfn);
  };
  auto get_ptsz = [](const char* sym, unsigned long long flags) {
    void* pfn = nullptr;
    EXPECT_EQ(cudaGetDriverEntryPoint_ptsz(sym, &pfn, flags, nullptr), cudaSuccess);
    return name_of(pfn);
  };
  auto by_version = [](const char* sym, unsigned ver, unsigned long long flags, bool ptsz_entry) {
    void* pfn = nullptr;
    cudaError_t r = ptsz_entry ? cudaGetDriverEntryPointByVersion_ptsz(sym, &pfn, ver, flags, nullptr)
                               : cudaGetDriverEntryPointByVersion(sym, &pfn, ver, flags, nullptr);
    EXPECT_EQ(r, cudaSuccess);
    return name_of(pfn);
  };
  EXPECT_EQ(get("cuLaunchKernel", cudaEnableDefault), "cuLaunchKernel");
  EXPECT_EQ(get("cuLaunchKernel", cudaEnablePerThreadDefaultStream), "cuLaunchKernel_ptsz");
  EXPECT_EQ(get("cuMemcpyHtoDAsync", cudaEnableDefault), "cuMemcpyHtoDAsync_v2");
  EXPECT_EQ(get_ptsz("cuLaunchKernel", cudaEnableDefault), "cuLaunchKernel_ptsz")
      << "the _ptsz runtime entry point defaults to per-thread streams";
  EXPECT_EQ(get_ptsz("cuLaunchKernel", cudaEnableLegacyStream), "cuLaunchKernel");
  EXPECT_EQ(by_version("cuGetProcAddress", 11030, cudaEnableDefault, false), "cuGetProcAddress");
  EXPECT_EQ(by_version("cuGetProcAddress", 12000, cudaEnableDefault, false), "cuGetProcAddress_v2");
  EXPECT_EQ(by_version("cuMemsetD8Async", 13000, cudaEnableDefault, true), "cuMemsetD8Async_ptsz");
  EXPECT_EQ(by_version("cuMemsetD8Async", 13000, cudaEnableLegacyStream, true), "cuMemsetD8Async");
  for (size_t i = 0; i < kHookCount; ++i) {
    HookEntry& e = hook_table()[i];
    if (!e.driver) continue;
    EXPECT_EQ(by_version(e.base, static_cast<unsigned>(e.min_version),
                         e.ptsz ? cudaEnablePerThreadDefaultStream : cudaEnableLegacyStream, false),
              e.symbol);
    EXPECT_TRUE(e.routes.load() & kRuntimeEntryPoint) << e.symbol;
  }
  void* pfn = nullptr;
  EXPECT_EQ(cudaGetDriverEntryPoint("cuMemAlloc", &pfn, cudaEnableDefault, nullptr), cudaSuccess);
  EXPECT_EQ(pfn, proc_of("cuMemAlloc"));
  pfn = nullptr;
  EXPECT_EQ(cudaGetDriverEntryPoint("cuNoSuchThing", &pfn, cudaEnableDefault, nullptr), cudaErrorSymbolNotFound);
  EXPECT_EQ(pfn, nullptr);
}
#pragma GCC diagnostic pop

// --- the hooks, end to end -------------------------------------------------------------------

bool g_runtime_used = false;

// The shim never tears its runtime down (its exit handler only sets a flag), so its worker
// would outlive the tests unjoined. The test binary stops it once the tests are done.
class StopRuntime : public ::testing::Environment {
 public:
  void TearDown() override {
    if (!g_runtime_used) return;
    if (Runtime* r = runtime()) r->stop();
  }
};
[[maybe_unused]] ::testing::Environment* const g_stop_runtime =
    ::testing::AddGlobalTestEnvironment(new StopRuntime);

Runtime* rt() {
  g_runtime_used = true;
  Runtime* r = runtime();
  EXPECT_NE(r, nullptr) << "the shim's runtime was not built: OFFLOAD_* settings invalid or disabled?";
  return r;
}

bool driver_loaded() {
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (h) dlclose(h);
  return h != nullptr;
}

// Paused (no budget here), a launch and an allocation are forwarded and not seen; resumed, both are.
TEST_F(Hooks, APausedShimForwardsWithoutObservingUntilResumed) {
  Runtime* r = rt();
  ASSERT_NE(r, nullptr);
  TrackerCounters& c = r->tracker().counters();
  auto f = reinterpret_cast<CUfunction>(0x5a5a0);
  ASSERT_EQ(offload_pause_observation(1), 0);
  const uint64_t kernels = c.kernels.load(), allocs = c.allocs.load();
  EXPECT_EQ(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr), CUDA_SUCCESS);
  void* p = nullptr;
  EXPECT_EQ(cudaMallocAsync(&p, 4096, nullptr), cudaSuccess);
  EXPECT_EQ(g_launches.size(), 1u) << "forwarded all the same";
  EXPECT_EQ(c.kernels.load(), kernels);
  EXPECT_EQ(c.allocs.load(), allocs);
  EXPECT_EQ(cudaFreeAsync(p, nullptr), cudaSuccess);

  ASSERT_EQ(offload_pause_observation(0), 0);
  EXPECT_EQ(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cudaMallocAsync(&p, 4096, nullptr), cudaSuccess);
  EXPECT_EQ(c.kernels.load(), kernels + 1);
  EXPECT_EQ(c.allocs.load(), allocs + 1);
  EXPECT_EQ(cudaFreeAsync(p, nullptr), cudaSuccess);
}

TEST_F(Hooks, LaunchKernelForwardsItsArgumentsAndIsCounted) {
  Runtime* r = rt();
  ASSERT_NE(r, nullptr);
  TrackerCounters& c = r->tracker().counters();
  const uint64_t kernels = c.kernels.load(), opaque = c.opaque_kernels.load();
  auto f = reinterpret_cast<CUfunction>(0x5a5a0);
  auto s = reinterpret_cast<CUstream>(0x77);
  uint64_t arg = 42;
  void* params[] = {&arg};
  CUresult res = cuLaunchKernel(f, 1, 2, 3, 4, 5, 6, 128, s, params, nullptr);
  EXPECT_EQ(res, CUDA_SUCCESS);
  ASSERT_EQ(g_launches.size(), 1u);
  const LaunchCall& l = g_launches[0];
  EXPECT_EQ(l.f, f);
  EXPECT_EQ(l.g[0], 1u);
  EXPECT_EQ(l.g[1], 2u);
  EXPECT_EQ(l.g[2], 3u);
  EXPECT_EQ(l.b[0], 4u);
  EXPECT_EQ(l.b[1], 5u);
  EXPECT_EQ(l.b[2], 6u);
  EXPECT_EQ(l.smem, 128u);
  EXPECT_EQ(l.s, s);
  EXPECT_EQ(l.params, params);
  EXPECT_EQ(l.extra, nullptr);
  EXPECT_EQ(c.kernels.load(), kernels + 1);
  // The layout comes from libcuda (cuFuncGetParamInfo). Not loaded here: unknown, so the
  // launch is counted as opaque.
  if (!driver_loaded()) {
    EXPECT_EQ(c.opaque_kernels.load(), opaque + 1);
  }

  // The per-thread variant forwards the same way.
  EXPECT_EQ(cuLaunchKernel_ptsz(f, 7, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(g_launches.size(), 2u);
  EXPECT_EQ(g_launches[1].g[0], 7u);
  EXPECT_EQ(g_launches[1].s, nullptr);
  EXPECT_EQ(c.kernels.load(), kernels + 2);
}

TEST_F(Hooks, CopiesMemsetsAndGraphsAreForwardedAndCounted) {
  Runtime* r = rt();
  ASSERT_NE(r, nullptr);
  TrackerCounters& c = r->tracker().counters();
  const uint64_t copies = c.copies.load(), memsets = c.memsets.load(), graphs = c.graphs.load();
  const int fc = g_copies, fm = g_memsets, fg = g_graphs;
  char host[16] = {};
  EXPECT_EQ(cuMemcpyHtoDAsync(0x1000, host, sizeof host, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cuMemsetD32Async(0x1000, 7, 4, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphLaunch(reinterpret_cast<CUgraphExec>(0x10), nullptr), CUDA_SUCCESS);
  EXPECT_EQ(g_copies, fc + 1);
  EXPECT_EQ(g_memsets, fm + 1);
  EXPECT_EQ(g_graphs, fg + 1);
  EXPECT_EQ(c.copies.load(), copies + 1);
  EXPECT_EQ(c.memsets.load(), memsets + 1);
  EXPECT_EQ(c.graphs.load(), graphs + 1);
}

// What the gate (the residency manager under a budget) is shown of each copy or memset.
struct SeenGate : LaunchGate {
  struct Seen {
    EventKind kind;
    Stream s;
    std::vector<AllocId> acc;
  };
  std::vector<Seen> seen;
  void before_launch(uint64_t, EventKind kind, uint32_t, Stream s, const AllocId* acc, size_t n, uint8_t) override {
    seen.push_back({kind, s, std::vector<AllocId>(acc, acc + n)});
  }
  void note_pointer_table(AllocId, const AllocId*, size_t) override {}
};

// What the gate is shown of a cuLaunchKernelEx launch to launch it again (current_launch_args).
struct ArgsGate : LaunchGate {
  bool had = false;
  int refused = -2;
  std::vector<int> ids;
  const void* packed = nullptr;
  uint32_t packed_len = 0;
  void before_launch(uint64_t, EventKind, uint32_t, Stream, const AllocId*, size_t, uint8_t) override {
    const LaunchArgs* a = current_launch_args();
    had = a != nullptr;
    if (!a) return;
    refused = a->geom.refused_attr;
    ids.clear();
    for (uint32_t i = 0; i < a->geom.nattrs; ++i) ids.push_back(static_cast<const CUlaunchAttribute*>(a->geom.attrs)[i].id);
    packed = a->packed;
    packed_len = a->packed_len;
  }
  void note_pointer_table(AllocId, const AllocId*, size_t) override {}
};

// cuLaunchKernelEx is forwarded with the caller's attributes as given, and shows the gate the
// ones a second launch would carry: programmatic serialization dropped, a cluster kept; a
// cooperative launch shown with that attribute named; arguments packed in `extra` shown as one
// buffer.
TEST_F(Hooks, ALaunchExShowsWhatItWouldBeLaunchedAgainWith) {
  Runtime* r = rt();
  ASSERT_NE(r, nullptr);
  Tracker& t = r->tracker();
  ArgsGate gate;
  LaunchGate* before = t.current_gate();
  t.set_gate(&gate);
  t.set_pass_launch_args(true);
  auto f = reinterpret_cast<CUfunction>(0x5a5b0);
  CUlaunchAttribute a[2]{};
  a[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  a[0].value.programmaticStreamSerializationAllowed = 1;
  a[1].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  a[1].value.clusterDim.x = 2;
  CUlaunchConfig c{};
  c.gridDimX = c.gridDimY = c.gridDimZ = c.blockDimX = c.blockDimY = c.blockDimZ = 1;
  c.attrs = a;
  c.numAttrs = 2;
  uint64_t arg = 42;
  void* params[] = {&arg};
  EXPECT_EQ(cuLaunchKernelEx(&c, f, params, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(g_launch_ex_attrs, (std::vector<int>{CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                                                  CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION}));  // as given
  EXPECT_TRUE(gate.had);
  EXPECT_EQ(gate.refused, -1);
  EXPECT_EQ(gate.ids, std::vector<int>{CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION});
  a[1].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
  EXPECT_EQ(cuLaunchKernelEx(&c, f, params, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(gate.refused, int(CU_LAUNCH_ATTRIBUTE_COOPERATIVE));
  c.numAttrs = 0;
  uint64_t buf[2] = {5, 6};
  size_t len = sizeof buf;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &len, CU_LAUNCH_PARAM_END};
  EXPECT_EQ(cuLaunchKernelEx(&c, f, nullptr, extra), CUDA_SUCCESS);
  EXPECT_EQ(gate.refused, -1);
  EXPECT_EQ(gate.packed, static_cast<const void*>(buf));
  EXPECT_EQ(gate.packed_len, sizeof buf);
  EXPECT_EQ(g_launch_ex_extra, extra);
  t.set_pass_launch_args(false);
  t.set_gate(before);
}

// A synchronous copy or memset touches device memory as a stream-ordered one does: the gate sees
// it, on the legacy default stream (the calling thread's own for a _ptds entry point), with the
// allocations it touches, so that they are resident before it is forwarded. A 2D or 3D copy's host
// side is not read as a device pointer, whatever its device field holds.
TEST_F(Hooks, SynchronousCopiesAndMemsetsAreSeenOnTheDefaultStream) {
  Runtime* r = rt();
  ASSERT_NE(r, nullptr);
  TrackerCounters& c = r->tracker().counters();
  const uint64_t copies = c.copies.load(), memsets = c.memsets.load();
  const int fc = g_copies, fm = g_memsets;
  void *p = nullptr, *q = nullptr;
  ASSERT_EQ(cudaMallocAsync(&p, 4096, nullptr), cudaSuccess);
  ASSERT_EQ(cudaMallocAsync(&q, 4096, nullptr), cudaSuccess);
  const DevPtr a = reinterpret_cast<DevPtr>(p), b = reinterpret_cast<DevPtr>(q);
  const AllocId ida = r->tracker().allocs().find(a)->id;

  SeenGate gate;
  Tracker& t = r->tracker();
  LaunchGate* before = t.current_gate();
  t.set_gate(&gate);
  char h[64] = {};
  EXPECT_EQ(cuMemcpyDtoH_v2(h, a + 8, 16), CUDA_SUCCESS);
  EXPECT_EQ(cuMemcpyHtoD_v2_ptds(a, h, 16), CUDA_SUCCESS);
  EXPECT_EQ(cuMemsetD32_v2(a + 64, 7, 4), CUDA_SUCCESS);
  CUDA_MEMCPY2D copy{};
  copy.srcMemoryType = CU_MEMORYTYPE_HOST;
  copy.srcHost = h;
  copy.srcDevice = b;  // not read: the source is host memory
  copy.srcPitch = 16;
  copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  copy.dstDevice = a;
  copy.dstY = 2;
  copy.dstPitch = 32;
  copy.WidthInBytes = 16;
  copy.Height = 2;
  EXPECT_EQ(cuMemcpy2D_v2(&copy), CUDA_SUCCESS);
  // A 3D copy out of b's third slice (two rows of 64 bytes each) into host memory whose device
  // field points at a.
  CUDA_MEMCPY3D cube{};
  cube.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  cube.srcDevice = b;
  cube.srcZ = 2;
  cube.srcPitch = 64;
  cube.srcHeight = 2;
  cube.dstMemoryType = CU_MEMORYTYPE_HOST;
  cube.dstHost = h;
  cube.dstDevice = a;  // not read
  cube.dstPitch = 16;
  cube.dstHeight = 2;
  cube.WidthInBytes = 16;
  cube.Height = 2;
  cube.Depth = 1;
  EXPECT_EQ(cuMemcpy3D_v2(&cube), CUDA_SUCCESS);
  t.set_gate(before);

  EXPECT_EQ(g_copies, fc + 4) << "forwarded";
  EXPECT_EQ(g_memsets, fm + 1);
  EXPECT_EQ(c.copies.load(), copies + 4);
  EXPECT_EQ(c.memsets.load(), memsets + 1);
  ASSERT_EQ(gate.seen.size(), 5u);
  const std::vector<AllocId> just_a{ida};
  EXPECT_EQ(gate.seen[0].kind, EventKind::Copy);
  EXPECT_EQ(gate.seen[0].s, Stream{0});
  EXPECT_EQ(gate.seen[0].acc, just_a);
  EXPECT_EQ(gate.seen[1].s, kPerThreadStream);
  EXPECT_EQ(gate.seen[1].acc, just_a);
  EXPECT_EQ(gate.seen[2].kind, EventKind::Memset);
  EXPECT_EQ(gate.seen[2].s, Stream{0});
  EXPECT_EQ(gate.seen[2].acc, just_a);
  EXPECT_EQ(gate.seen[3].acc, just_a) << "the host side of a 2D copy was read as a device pointer";
  const std::vector<AllocId> just_b{r->tracker().allocs().find(b)->id};
  EXPECT_EQ(gate.seen[4].acc, just_b) << "a 3D copy's sides";
  ASSERT_EQ(cudaFreeAsync(p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaFreeAsync(q, nullptr), cudaSuccess);
}

// A batch of copies touches every address in it: the gate sees one copy on the batch's stream
// with each allocation once (host addresses are not ours), so that all are resident before it is
// forwarded; both versions of the entry point forward their own arguments.
TEST_F(Hooks, ABatchOfCopiesIsSeenWithEveryAllocationItTouches) {
  Runtime* r = rt();
  ASSERT_NE(r, nullptr);
  TrackerCounters& c = r->tracker().counters();
  const uint64_t copies = c.copies.load();
  void *p = nullptr, *q = nullptr;
  ASSERT_EQ(cudaMallocAsync(&p, 4096, nullptr), cudaSuccess);
  ASSERT_EQ(cudaMallocAsync(&q, 4096, nullptr), cudaSuccess);
  const DevPtr a = reinterpret_cast<DevPtr>(p), b = reinterpret_cast<DevPtr>(q);
  std::vector<AllocId> both{r->tracker().allocs().find(a)->id, r->tracker().allocs().find(b)->id};
  std::sort(both.begin(), both.end());
  char h[64] = {};
  CUdeviceptr dsts[3] = {a, a + 64, reinterpret_cast<CUdeviceptr>(h)};
  CUdeviceptr srcs[3] = {reinterpret_cast<CUdeviceptr>(h), b + 128, a + 256};
  size_t sizes[3] = {16, 32, 8};
  CUmemcpyAttributes attr{};
  size_t attr_at = 0, fail = 0;
  auto s = reinterpret_cast<CUstream>(0x77);

  SeenGate gate;
  Tracker& t = r->tracker();
  LaunchGate* before = t.current_gate();
  t.set_gate(&gate);
  EXPECT_EQ(cuMemcpyBatchAsync_v2(dsts, srcs, sizes, 3, &attr, &attr_at, 1, s), CUDA_SUCCESS);
  EXPECT_EQ(g_batch_count, 3u);
  g_batch_count = 0;
  EXPECT_EQ(cuMemcpyBatchAsync(dsts, srcs, sizes, 2, &attr, &attr_at, 1, &fail, s), CUDA_SUCCESS);
  EXPECT_EQ(g_batch_count, 2u);
  EXPECT_EQ(fail, SIZE_MAX) << "the first version's failed index reaches the caller";
  t.set_gate(before);

  EXPECT_EQ(c.copies.load(), copies + 2);
  ASSERT_EQ(gate.seen.size(), 2u);
  EXPECT_EQ(gate.seen[0].kind, EventKind::Copy);
  EXPECT_EQ(gate.seen[0].s, reinterpret_cast<Stream>(s));
  EXPECT_EQ(gate.seen[0].acc, both);
  EXPECT_EQ(gate.seen[1].acc, both);  // its two copies write a and read b
  ASSERT_EQ(cudaFreeAsync(p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaFreeAsync(q, nullptr), cudaSuccess);
}

TEST_F(Hooks, ACallMadeInsideAHookOnlyForwards) {
  Runtime* r = rt();
  ASSERT_NE(r, nullptr);
  TrackerCounters& c = r->tracker().counters();
  const uint64_t kernels = c.kernels.load(), graphs = c.graphs.load();
  // A graph launch whose "driver" launches a kernel through our export (as a library
  // layered on the driver would): the inner launch is not ours to count.
  g_inside_launch = [] {
    g_inside_launch = nullptr;
    cuLaunchKernel(reinterpret_cast<CUfunction>(0x5a5b0), 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr);
  };
  EXPECT_EQ(cuGraphLaunch(reinterpret_cast<CUgraphExec>(0x10), nullptr), CUDA_SUCCESS);
  EXPECT_EQ(g_launches.size(), 1u) << "the inner launch was forwarded";
  EXPECT_EQ(c.graphs.load(), graphs + 1);
  EXPECT_EQ(c.kernels.load(), kernels) << "and not observed";
  // Outside a hook again: observed.
  cuLaunchKernel(reinterpret_cast<CUfunction>(0x5a5b0), 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr);
  EXPECT_EQ(c.kernels.load(), kernels + 1);
}

TEST_F(Hooks, MallocAsyncAndFreeAsyncKeepTheAllocationTable) {
  Runtime* r = rt();
  ASSERT_NE(r, nullptr);
  TrackerCounters& c = r->tracker().counters();
  const AllocTable& table = r->tracker().allocs();
  const uint64_t allocs = c.allocs.load(), frees = c.frees.load();
  auto s = reinterpret_cast<cudaStream_t>(0x99);

  void* p = nullptr;
  ASSERT_EQ(cudaMallocAsync(&p, 4096, s), cudaSuccess);
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(g_mallocs.size(), 1u);
  EXPECT_EQ(g_mallocs[0].n, 4096u);
  EXPECT_EQ(g_mallocs[0].s, s);
  EXPECT_EQ(c.allocs.load(), allocs + 1);
  const DevPtr base = reinterpret_cast<DevPtr>(p);
  auto e = table.find(base + 1000);  // an interior pointer
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->base, base);
  EXPECT_EQ(e->size, 4096u);
  EXPECT_TRUE(table.find(base + 4095).has_value());
  EXPECT_FALSE(table.find(base + 4096).has_value());

  // A kernel reading it through the packed-argument route is scanned without faulting.
  DevPtr buf[2] = {base + 64, 3};
  size_t size = sizeof buf;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
  EXPECT_EQ(cuLaunchKernel(reinterpret_cast<CUfunction>(0x5a5c0), 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, extra),
            CUDA_SUCCESS);
  EXPECT_EQ(g_launches.back().extra, extra);

  ASSERT_EQ(cudaFreeAsync(p, s), cudaSuccess);
  ASSERT_EQ(g_frees.size(), 1u);
  EXPECT_EQ(g_frees[0].first, p);
  EXPECT_EQ(g_frees[0].second, s);
  EXPECT_EQ(c.frees.load(), frees + 1);
  EXPECT_FALSE(table.find(base + 1000).has_value()) << "gone after the free";
  EXPECT_FALSE(table.find(base).has_value());
}

TEST_F(Hooks, PerThreadMallocAndFreeAreTrackedToo) {
  Runtime* r = rt();
  ASSERT_NE(r, nullptr);
  const AllocTable& table = r->tracker().allocs();
  void* p = nullptr;
  ASSERT_EQ(cudaMallocAsync_ptsz(&p, 100, nullptr), cudaSuccess);
  EXPECT_TRUE(table.find(reinterpret_cast<DevPtr>(p) + 99).has_value());
  ASSERT_EQ(cudaFreeAsync_ptsz(p, nullptr), cudaSuccess);
  EXPECT_FALSE(table.find(reinterpret_cast<DevPtr>(p) + 99).has_value());
}

TEST_F(Hooks, AFailedMallocIsNotTracked) {
  Runtime* r = rt();
  ASSERT_NE(r, nullptr);
  TrackerCounters& c = r->tracker().counters();
  const uint64_t allocs = c.allocs.load();
  const size_t live = r->tracker().allocs().size();
  g_malloc_result = cudaErrorMemoryAllocation;
  void* p = reinterpret_cast<void*>(0x1234);
  EXPECT_EQ(cudaMallocAsync(&p, 1 << 20, nullptr), cudaErrorMemoryAllocation);
  EXPECT_EQ(g_mallocs.size(), 1u) << "forwarded";
  EXPECT_EQ(c.allocs.load(), allocs);
  EXPECT_EQ(r->tracker().allocs().size(), live);
  EXPECT_FALSE(r->tracker().allocs().find(0x1234).has_value());
}

// OFFLOAD_BLOCK_CACHE end to end: a freed block goes back to the next allocation of its size
// on its stream without reaching the allocator; another stream, a capture, or a full device
// go to the allocator (the full device after the kept blocks were freed there).
int g_capture_state = 0;
int capture_probe(Stream) { return g_capture_state; }
uint64_t context_probe() { return 0xc0; }  // one device

struct CacheOn {
  Runtime* r;
  explicit CacheOn(Runtime* rt) : r(rt) {
    g_capture_state = 0;
    r->set_cache_probes(&capture_probe, &context_probe);
    r->block_cache().set_max(1 << 20);
  }
  ~CacheOn() {
    r->block_cache().set_max(0);
    for (auto [q, qs] : r->drain_cache()) cudaFreeAsync(reinterpret_cast<void*>(q), reinterpret_cast<cudaStream_t>(qs));
    r->set_cache_probes(nullptr, nullptr);
  }
};

TEST_F(Hooks, AFreedBlockServesTheNextAllocationOfItsSizeOnItsStreamWithoutTheAllocator) {
  Runtime* r = rt();
  ASSERT_NE(r, nullptr);
  CacheOn on(r);
  const AllocTable& table = r->tracker().allocs();
  TrackerCounters& c = r->tracker().counters();
  auto s = reinterpret_cast<cudaStream_t>(0x77), other = reinterpret_cast<cudaStream_t>(0x78);
  void* p = nullptr;
  ASSERT_EQ(cudaMallocAsync(&p, 4096, s), cudaSuccess);
  ASSERT_EQ(g_mallocs.size(), 1u);
  const uint64_t frees = c.frees.load(), allocs = c.allocs.load();
  ASSERT_EQ(cudaFreeAsync(p, s), cudaSuccess);
  EXPECT_TRUE(g_frees.empty()) << "kept, not freed";
  EXPECT_EQ(c.frees.load(), frees + 1) << "the tracker sees the free";
  EXPECT_FALSE(table.find(reinterpret_cast<DevPtr>(p)).has_value());

  void* q = nullptr;
  ASSERT_EQ(cudaMallocAsync(&q, 4096, s), cudaSuccess);
  EXPECT_EQ(q, p) << "the kept block";
  EXPECT_EQ(g_mallocs.size(), 1u) << "the allocator was not asked";
  EXPECT_EQ(c.allocs.load(), allocs + 1) << "the tracker sees the allocation";
  EXPECT_TRUE(table.find(reinterpret_cast<DevPtr>(q) + 4095).has_value());

  // Freed again and asked for on another stream, or in another size: the allocator serves.
  ASSERT_EQ(cudaFreeAsync(q, s), cudaSuccess);
  void* x = nullptr;
  ASSERT_EQ(cudaMallocAsync(&x, 4096, other), cudaSuccess);
  EXPECT_NE(x, p);
  void* y = nullptr;
  ASSERT_EQ(cudaMallocAsync(&y, 8192, s), cudaSuccess);
  EXPECT_NE(y, p);
  EXPECT_EQ(g_mallocs.size(), 3u);
  ASSERT_EQ(cudaFreeAsync(x, other), cudaSuccess);
  ASSERT_EQ(cudaFreeAsync(y, s), cudaSuccess);
  EXPECT_EQ(r->block_cache().stats().kept_bytes, 4096u + 4096u + 8192u);
  EXPECT_NE(r->stats_json().find("\"block_cache\":{\"max_bytes\":"), std::string::npos);
}

TEST_F(Hooks, UnderACaptureTheAllocatorServesAndItsMemoryIsNeverKept) {
  Runtime* r = rt();
  ASSERT_NE(r, nullptr);
  CacheOn on(r);
  auto s = reinterpret_cast<cudaStream_t>(0x79);
  void* p = nullptr;
  ASSERT_EQ(cudaMallocAsync(&p, 4096, s), cudaSuccess);
  ASSERT_EQ(cudaFreeAsync(p, s), cudaSuccess);  // kept
  g_capture_state = 1;
  void* g = nullptr;
  ASSERT_EQ(cudaMallocAsync(&g, 4096, s), cudaSuccess);
  EXPECT_NE(g, p) << "a capture gets the allocator's (graph) memory, not a kept block";
  EXPECT_EQ(g_mallocs.size(), 2u);
  g_capture_state = 0;
  ASSERT_EQ(cudaFreeAsync(g, s), cudaSuccess);
  ASSERT_EQ(g_frees.size(), 1u) << "memory made under a capture is freed by the allocator";
  EXPECT_EQ(g_frees[0].first, g);
}

TEST_F(Hooks, AFullDeviceGetsTheKeptBlocksBackThenTheAllocatorIsAskedAgain) {
  Runtime* r = rt();
  ASSERT_NE(r, nullptr);
  CacheOn on(r);
  auto s = reinterpret_cast<cudaStream_t>(0x7a), t = reinterpret_cast<cudaStream_t>(0x7b);
  void *a = nullptr, *b = nullptr;
  ASSERT_EQ(cudaMallocAsync(&a, 4096, s), cudaSuccess);
  ASSERT_EQ(cudaMallocAsync(&b, 2048, t), cudaSuccess);
  ASSERT_EQ(cudaFreeAsync(a, s), cudaSuccess);
  ASSERT_EQ(cudaFreeAsync(b, t), cudaSuccess);
  ASSERT_TRUE(g_frees.empty());
  auto last_error_calls = reinterpret_cast<int (*)()>(fake_lib_sym("offload_fake_last_error_calls"));
  ASSERT_NE(last_error_calls, nullptr);
  const int cleared = last_error_calls();
  g_malloc_full = 1;
  void* p = nullptr;
  ASSERT_EQ(cudaMallocAsync(&p, 1 << 16, s), cudaSuccess) << "the second answer, after the kept blocks went back";
  EXPECT_EQ(last_error_calls(), cleared + 1) << "the first failure taken off the runtime's last error";
  EXPECT_EQ(g_mallocs.size(), 4u) << "two before, the full one, the retry";
  ASSERT_EQ(g_frees.size(), 2u);
  std::map<void*, cudaStream_t> freed(g_frees.begin(), g_frees.end());
  EXPECT_EQ(freed[a], s) << "each on the stream that freed it";
  EXPECT_EQ(freed[b], t);
  EXPECT_EQ(r->block_cache().stats().kept_bytes, 0u);
  EXPECT_TRUE(r->tracker().allocs().find(reinterpret_cast<DevPtr>(p)).has_value());
  // Still full with nothing kept: the failure is the caller's, untracked.
  g_malloc_full = 1;
  void* q = nullptr;
  EXPECT_EQ(cudaMallocAsync(&q, 1 << 16, s), cudaErrorMemoryAllocation);
  ASSERT_EQ(cudaFreeAsync(p, s), cudaSuccess);
}

// Hooks on several threads while the shim's worker drains and a stats query pumps too.
TEST_F(Hooks, ConcurrentHooksWithTheWorkerRunning) {
  Runtime* r = rt();
  ASSERT_NE(r, nullptr);
  TrackerCounters& c = r->tracker().counters();
  const uint64_t kernels = c.kernels.load(), allocs = c.allocs.load(), frees = c.frees.load();
  const size_t live = r->tracker().allocs().size();
  constexpr int kThreads = 4, kIters = 300;
  std::atomic<int> running{kThreads}, failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      auto s = reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(0x100 + t));
      for (int i = 0; i < kIters; ++i) {
        void* p = nullptr;
        if (cudaMallocAsync(&p, 256 + static_cast<size_t>(i), s) != cudaSuccess) failures.fetch_add(1);
        DevPtr buf[1] = {reinterpret_cast<DevPtr>(p) + 8};
        size_t size = sizeof buf;
        void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
        if (cuLaunchKernel(reinterpret_cast<CUfunction>(0x5b000 + 0x10 * (i % 8)), 1, 1, 1, 1, 1, 1, 0,
                           reinterpret_cast<CUstream>(s), nullptr, extra) != CUDA_SUCCESS)
          failures.fetch_add(1);
        if (cudaFreeAsync(p, s) != cudaSuccess) failures.fetch_add(1);
      }
      running.fetch_sub(1);
    });
  std::vector<char> buf(1 << 16);
  int queries = 0;
  while (running.load() > 0 || queries == 0) {
    EXPECT_GT(offload_stats_json(buf.data(), buf.size()), 0);
    ++queries;
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(c.kernels.load(), kernels + kThreads * kIters);
  EXPECT_EQ(c.allocs.load(), allocs + kThreads * kIters);
  EXPECT_EQ(c.frees.load(), frees + kThreads * kIters);
  EXPECT_EQ(r->tracker().allocs().size(), live);
  offload::testing::Json j;
  std::string err;
  ASSERT_GT(offload_stats_json(buf.data(), buf.size()), 0);
  ASSERT_TRUE(offload::testing::parse_json(buf.data(), &j, &err)) << err;
  EXPECT_EQ(j["counters"]["dropped_events"].num, 0);
}

// Light observation (the default without a budget or a trace): a launch is forwarded as it
// is and counted, and nothing scans it; allocations are still tracked.
TEST_F(Hooks, UnderLightObservationALaunchIsCountedNotScanned) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process reads OFFLOAD_OBSERVE
  setenv("OFFLOAD_OBSERVE", "light", 1);
  auto light = [] {
    Runtime* r = runtime();
    if (!r || !r->light()) std::_Exit(2);
    TrackerCounters& c = r->tracker().counters();
    uint64_t arg = 42;
    void* params[] = {&arg};
    const size_t forwarded = g_launches.size();
    if (cuLaunchKernel(reinterpret_cast<CUfunction>(0x5a5a0), 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr) != CUDA_SUCCESS)
      std::_Exit(3);
    void* p = nullptr;
    if (cudaMallocAsync(&p, 4096, nullptr) != cudaSuccess) std::_Exit(4);
    const bool ok = g_launches.size() == forwarded + 1 && g_launches.back().params == params &&
                    c.unscanned.load() == 1 && c.kernels.load() == 0 && c.allocs.load() == 1;
    (void)cudaFreeAsync(p, nullptr);
    std::_Exit(ok ? 0 : 5);
  };
  EXPECT_EXIT(light(), ::testing::ExitedWithCode(0), "");
  setenv("OFFLOAD_OBSERVE", "full", 1);
  EXPECT_FALSE(rt()->light()) << "this process observes in full";
}

// --- the C API -----------------------------------------------------------------------------

// A variable liboffload does not read (a typo) is named, with the known name it is closest
// to, when the process first uses CUDA; a child that does not use it says nothing.
TEST_F(Hooks, AnUnknownSettingIsNamedWhenCudaIsUsed) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  setenv("OFFLOAD_BUDGET", "40GiB", 1);
  setenv("OFFLOAD_TELEMETRY", "off", 1);
  auto use_cuda = [] {
    void* p = nullptr;
    (void)cudaMallocAsync(&p, 4096, nullptr);
    (void)cudaFreeAsync(p, nullptr);
    std::_Exit(0);
  };
  EXPECT_EXIT(use_cuda(), ::testing::ExitedWithCode(0),
              "OFFLOAD_\\* variables liboffload does not read: OFFLOAD_BUDGET \\(did you mean OFFLOAD_DEVICE_BUDGET\\?\\)");
  EXPECT_EXIT(std::_Exit(0), ::testing::ExitedWithCode(0), "^$");
  unsetenv("OFFLOAD_BUDGET");
  unsetenv("OFFLOAD_TELEMETRY");
}

// A bad setting is said in one line, once, and only when the process uses CUDA: every child
// that merely inherits LD_PRELOAD (a shell, a compiler, a data-loader worker) stays silent.
TEST_F(Hooks, ABadSettingIsSaidOnceInOneLineWhenCudaIsUsed) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: its constructor reads the setting
  setenv("OFFLOAD_DEVICE_BUDGET", "lots", 1);
  auto use_cuda = [] {
    void* p = nullptr;
    for (int i = 0; i < 3; ++i) {
      (void)cudaMallocAsync(&p, 4096, nullptr);
      (void)cudaFreeAsync(p, nullptr);
    }
    std::exit(0);
  };
  EXPECT_EXIT(use_cuda(), ::testing::ExitedWithCode(0),
              "^\\[offload error\\] pid [0-9]+: bad OFFLOAD_\\* settings \\(OFFLOAD_DEVICE_BUDGET='lots' is not valid[^\n]*\n$");
  EXPECT_EXIT(std::exit(0), ::testing::ExitedWithCode(0), "^$");
  // One rank of a job: its lines name it.
  setenv("RANK", "3", 1);
  setenv("LOCAL_RANK", "1", 1);
  EXPECT_EXIT(use_cuda(), ::testing::ExitedWithCode(0),
              "^\\[offload error\\] rank 3 pid [0-9]+: bad OFFLOAD_\\* settings \\(OFFLOAD_DEVICE_BUDGET='lots'[^\n]*\n$");
  unsetenv("RANK");
  unsetenv("LOCAL_RANK");
  unsetenv("OFFLOAD_DEVICE_BUDGET");
}

// However the process ends while the worker runs, after hooks were in use, it ends with its own
// status: no std::terminate from a thread left joinable (that would be SIGABRT), no hang.
TEST_F(Hooks, ExitPathsEndWithTheirOwnStatusWhileTheWorkerRuns) {
  // Each child runs this test alone in a fresh process: a forked copy of this one would be a
  // pass-through child, with no runtime to end.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto busy = [] {
    if (!runtime()) std::abort();
    // Launches and allocations from another thread for a while (the worker pumps meanwhile);
    // that thread ends before the exit, as the fakes it calls are this binary's statics.
    std::atomic<bool> stop{false};
    std::thread t([&] {
      while (!stop.load()) {
        void* p = nullptr;
        (void)cudaMallocAsync(&p, 512, nullptr);
        (void)cuLaunchKernel(reinterpret_cast<CUfunction>(0x5c000), 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr);
        (void)cudaFreeAsync(p, nullptr);
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    stop.store(true);
    t.join();
  };
  EXPECT_EXIT((busy(), std::exit(3)), ::testing::ExitedWithCode(3), "");
  EXPECT_EXIT((busy(), std::quick_exit(4)), ::testing::ExitedWithCode(4), "");
  EXPECT_EXIT((busy(), std::_Exit(5)), ::testing::ExitedWithCode(5), "");
  EXPECT_EXIT(
      {
        busy();
        const pid_t child = fork();  // a data-loader worker: forwards only, and ends at once
        if (child == 0) std::_Exit(0);
        int status = 0;
        waitpid(child, &status, 0);
        std::exit(WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 6 : 7);
      },
      ::testing::ExitedWithCode(6), "");
}

TEST_F(Hooks, StatsJsonIsValidAndAgreesWithTheTracker) {
  Runtime* r = rt();
  ASSERT_NE(r, nullptr);
  cuLaunchKernel(reinterpret_cast<CUfunction>(0x5a5d0), 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr);
  std::vector<char> buf(1 << 16);
  int n = offload_stats_json(buf.data(), buf.size());
  ASSERT_GT(n, 0);
  EXPECT_EQ(static_cast<size_t>(n), std::strlen(buf.data()));
  offload::testing::Json j;
  std::string err;
  ASSERT_TRUE(offload::testing::parse_json(buf.data(), &j, &err)) << err << "\n" << buf.data();
  ASSERT_TRUE(j.has("counters"));
  EXPECT_EQ(j["counters"]["kernels"].num, static_cast<double>(r->tracker().counters().kernels.load()));
  ASSERT_TRUE(j.has("routes"));
  ASSERT_TRUE(j["routes"].has("cuLaunchKernel"));
  bool dlsym_route = false;
  for (const auto& x : j["routes"]["cuLaunchKernel"].items) dlsym_route |= x.text == "dlsym";
  EXPECT_TRUE(dlsym_route);
  EXPECT_EQ(offload_stats_json(buf.data(), 8), -1) << "too small a buffer";
  EXPECT_EQ(offload_stats_json(nullptr, 0), -1);
}

// A mark on an allocation ends when the application frees it (the free hook forgets it), so
// that memory reused for something written is never taken for read-only.
TEST_F(Hooks, FreeingAMarkedAllocationEndsTheMark) {
  Runtime* r = rt();
  ASSERT_NE(r, nullptr);
  auto s = reinterpret_cast<cudaStream_t>(0x99);
  void* p = nullptr;
  void* q = nullptr;
  ASSERT_EQ(cudaMallocAsync(&p, 8192, s), cudaSuccess);
  ASSERT_EQ(cudaMallocAsync(&q, 8192, s), cudaSuccess);
  const DevPtr a = reinterpret_cast<DevPtr>(p), b = reinterpret_cast<DevPtr>(q);
  ASSERT_EQ(offload_mark_read_only(p, 8192), 0);
  ASSERT_EQ(offload_mark_read_only(q, 8192), 0);
  EXPECT_TRUE(r->read_only(a, 8192));
  EXPECT_TRUE(r->read_only(b + 4096, 4096));
  ASSERT_EQ(cudaFreeAsync(p, s), cudaSuccess);
  EXPECT_FALSE(r->read_only(a, 8192)) << "freed: the mark is gone";
  EXPECT_FALSE(r->read_only(a, 1));
  EXPECT_TRUE(r->read_only(b, 8192)) << "another allocation's mark stays";
  ASSERT_EQ(cudaFreeAsync(q, s), cudaSuccess);
  EXPECT_FALSE(r->read_only(b, 8192));
}

// offload_mark_read_only: a null or empty range is refused (-1); a range is taken (0).
TEST_F(Hooks, MarkReadOnlyTakesARangeAndRefusesAnEmptyOne) {
  ASSERT_NE(rt(), nullptr);
  EXPECT_EQ(offload_mark_read_only(nullptr, 4096), -1);
  int word = 0;
  EXPECT_EQ(offload_mark_read_only(&word, 0), -1);
  EXPECT_EQ(offload_mark_read_only(reinterpret_cast<void*>(0x7f0000000000), 1 << 20), 0);
}

TEST_F(Hooks, MarkStepTurnsAutomaticDetectionOff) {
  ASSERT_NE(rt(), nullptr);
  cuLaunchKernel(reinterpret_cast<CUfunction>(0x5a5e0), 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr);
  offload_mark_step();
  std::vector<char> buf(1 << 16);
  ASSERT_GT(offload_stats_json(buf.data(), buf.size()), 0);
  offload::testing::Json j;
  std::string err;
  ASSERT_TRUE(offload::testing::parse_json(buf.data(), &j, &err)) << err;
  EXPECT_EQ(j["step_detection"].text, "offload_mark_step");
  EXPECT_GE(j["steps"].num, 1);
}

}  // namespace

namespace offload {
namespace {

// Only a plan of arenas (a budget with OFFLOAD_CAP=0) needs offloadd's pool: a process that only
// watches, or runs under the cap, connects to a running daemon but never starts one.
TEST(DaemonLinkSettings, OnlyAPlanOfArenasStartsADaemon) {
  Settings watch;  // no budget; OFFLOAD_DAEMON=auto by default
  EXPECT_EQ(watch.daemon, "auto");
  EXPECT_EQ(link_settings(watch).daemon, "connect");
  Settings cap = watch;
  cap.device_budget = 8ull << 30;  // the hard cap, the default
  EXPECT_EQ(link_settings(cap).daemon, "connect");
  Settings arenas = cap;
  arenas.cap = false;
  EXPECT_EQ(link_settings(arenas).daemon, "auto");
  for (const char* asked : {"connect", "off"}) {  // what the user set stays
    Settings s = arenas;
    s.daemon = asked;
    EXPECT_EQ(link_settings(s).daemon, asked);
    s = watch;
    s.daemon = asked;
    EXPECT_EQ(link_settings(s).daemon, asked);
  }
}

// A profiler that registers for CUPTI's activity records before our telemetry starts must
// keep them: our registration is interposed, and ours then never begins.
TEST(CuptiYield, AnotherClientFirstMeansOursNeverStarts) {
  std::atomic<uint64_t> launches{1};
  CuptiTelemetry t("", launches);
  CuptiTelemetry::note_other_client();
  EXPECT_FALSE(t.start());
  EXPECT_FALSE(t.flowing());
  EXPECT_NE(t.state().find("another CUPTI client"), std::string::npos) << t.state();
}

}  // namespace
}  // namespace offload

// Every exported wrapper runs in a noexcept body: an exception thrown by what a hook calls ends
// the process there instead of unwinding into the C caller (undefined behaviour).
namespace {
using LaunchSig = decltype(&::cuLaunchKernel);
auto throwing_call = [](auto) -> CUresult { throw 1; };
auto observe_nothing = [](offload::Runtime&) {};
static_assert(noexcept(offload::hooks::launch<offload::hooks::HookId::cuLaunchKernel, LaunchSig>(observe_nothing, throwing_call)));
static_assert(noexcept(offload::hooks::release<offload::hooks::HookId::cudaFreeAsync, decltype(&::cudaFreeAsync)>(
    nullptr, 0, [](auto) -> cudaError_t { throw 1; })));
static_assert(noexcept(offload::hooks::query<offload::hooks::HookId::cuPointerGetAttribute, decltype(&::cuPointerGetAttribute)>(
    0, throwing_call)));
static_assert(noexcept(offload::hooks::no_throw([]() -> int { throw 1; })));

// Which cuLaunchKernelEx launches are handed on to be launched again, and with what: attributes
// that shape, place or hint are kept as given; programmatic serialization and the events a launch
// signals are dropped (cuBLAS's GEMMs on sm90 ask for the former); a cooperative launch, a
// graph-only or unknown attribute, too many attributes, or a config counting attributes it does
// not give, are refused.
TEST(LaunchAttrs, ShapeIsKeptOverlapAndEventsDroppedTheRestRefused) {
  using offload::hooks::relaunch_attrs;
  CUlaunchAttribute out[offload::hooks::kMaxRelaunchAttrs];
  CUlaunchConfig c{};
  EXPECT_EQ(relaunch_attrs(&c, out).n, 0u);  // none
  EXPECT_EQ(relaunch_attrs(&c, out).refused, -1);
  CUlaunchAttribute a[4]{};
  c.attrs = a;
  c.numAttrs = 4;
  a[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  a[0].value.clusterDim.x = 2;
  a[1].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  a[1].value.programmaticStreamSerializationAllowed = 1;
  a[2].id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
  a[2].value.priority = -1;
  a[3].id = CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT;
  auto r = relaunch_attrs(&c, out);
  ASSERT_EQ(r.refused, -1);
  ASSERT_EQ(r.n, 2u);
  EXPECT_EQ(out[0].id, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
  EXPECT_EQ(out[0].value.clusterDim.x, 2u);
  EXPECT_EQ(out[1].id, CU_LAUNCH_ATTRIBUTE_PRIORITY);
  EXPECT_EQ(out[1].value.priority, -1);
  a[3].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT;
  EXPECT_EQ(relaunch_attrs(&c, out).n, 2u);
  for (int bad : {int(CU_LAUNCH_ATTRIBUTE_COOPERATIVE), int(CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE), 99}) {
    a[2].id = CUlaunchAttributeID(bad);
    r = relaunch_attrs(&c, out);
    EXPECT_EQ(r.refused, bad);
    EXPECT_EQ(r.n, 0u);
  }
  std::vector<CUlaunchAttribute> many(offload::hooks::kMaxRelaunchAttrs + 1);
  for (auto& m : many) m.id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
  c.attrs = many.data();
  c.numAttrs = unsigned(many.size());
  EXPECT_GE(relaunch_attrs(&c, out).refused, 0);
  c.numAttrs = offload::hooks::kMaxRelaunchAttrs;
  EXPECT_EQ(relaunch_attrs(&c, out).n, offload::hooks::kMaxRelaunchAttrs);
  c.attrs = nullptr;
  EXPECT_GE(relaunch_attrs(&c, out).refused, 0);
}
}  // namespace

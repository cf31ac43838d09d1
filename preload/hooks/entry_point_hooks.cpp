// Entry-point routes: dlsym, cuGetProcAddress (v1, _v2), cudaGetDriverEntryPoint and
// cudaGetDriverEntryPointByVersion. Each forwards, then hands back our wrapper for any
// name in the hook table (hook_table.cpp decides which).
#include <cuda.h>
#undef cuGetProcAddress
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <link.h>

#include <cstddef>
#include <cstring>
#include <mutex>

#include "hooks/hook.h"

#define OFFLOAD_EXPORT extern "C" __attribute__((visibility("default")))

using namespace offload::hooks;

namespace {
using GpaV1 = CUresult (*)(const char*, void**, int, cuuint64_t);
using GpaV2 = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
using RtEntry = cudaError_t (*)(const char*, void**, unsigned long long, cudaDriverEntryPointQueryResult*);
using RtEntryV = cudaError_t (*)(const char*, void**, unsigned int, unsigned long long,
                                 cudaDriverEntryPointQueryResult*);
constexpr bool ptds(cuuint64_t flags) { return flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM; }
// The runtime's flags: cudaEnableDefault (0) means "as this runtime entry point was built":
// per-thread for the _ptsz entry points.
constexpr bool rt_ptds(unsigned long long flags, bool ptsz_entry) {
  return (flags & cudaEnablePerThreadDefaultStream) || (ptsz_entry && flags == cudaEnableDefault);
}
}  // namespace

namespace {
// dlsym(RTLD_NEXT, name) means "the first definition after the caller's object", but the
// real dlsym, called from here, would search after liboffload.so. Walk the load order from
// the caller's object instead.
void* next_after(const void* caller, const char* name) {
  Dl_info info;
  link_map* lm = nullptr;
  if (!dladdr1(caller, &info, reinterpret_cast<void**>(&lm), RTLD_DL_LINKMAP) || !lm)
    return real_dlsym(RTLD_NEXT, name);
  // Fast path: the first definition after liboffload.so, if it lies after the caller, is also
  // the first after the caller. (Tools preloaded after us, such as compute-sanitizer's
  // injection libraries, resolve through dlsym(RTLD_NEXT) constantly: a dlopen per loaded
  // object on every call is too slow for them.)
  void* const after_us = real_dlsym(RTLD_NEXT, name);
  if (void* p = after_us) {
    Dl_info pi;
    link_map* plm = nullptr;
    if (dladdr1(p, &pi, reinterpret_cast<void**>(&plm), RTLD_DL_LINKMAP) && plm)
      for (link_map* l = lm->l_next; l; l = l->l_next)
        if (l == plm) return p;
  }
  for (link_map* l = lm->l_next; l; l = l->l_next) {
    if (!l->l_name || !*l->l_name) continue;  // the vDSO
    // A dependency's link_map is not a usable handle until dlopen has made it one.
    void* h = dlopen(l->l_name, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) continue;
    void* p = real_dlsym(h, name);
    dlclose(h);
    if (p) return p;
  }
  // Defined nowhere after us: the lookup again, for dlerror()'s message (the dlclose above
  // cleared it); callers such as ctypes read it after a NULL.
  return after_us ? nullptr : real_dlsym(RTLD_NEXT, name);
}

// The loader's count of objects loaded and unloaded so far: an answer found by walking the
// load order holds while it is unchanged. dl_iterate_phdr reports it with the first object.
struct LoadGeneration {
  unsigned long long adds = 0, subs = 0;
  bool operator==(const LoadGeneration&) const = default;
};
LoadGeneration load_generation() {
  LoadGeneration g;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t size, void* out) {
        if (size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs))
          *static_cast<LoadGeneration*>(out) = {info->dlpi_adds, info->dlpi_subs};
        return 1;  // the first object carries the counts
      },
      &g);
  return g;
}

// dlsym(RTLD_NEXT) answers, kept per calling site and name until an object is loaded or
// unloaded: interposers ask for the same names constantly, and a walk of the load order costs
// about 100 times libc's lookup (docs/reliability.md). Fixed slots, no allocation; only
// found answers are kept, so that a failed lookup still leaves dlerror() its message.
class NextCache {
 public:
  void* find(const void* caller, const char* name, LoadGeneration g) {
    std::lock_guard<std::mutex> lock(m_);
    const Slot& s = slots_[slot_of(caller, name)];
    return s.caller == caller && s.gen == g && std::strcmp(s.name, name) == 0 ? s.answer : nullptr;
  }
  void keep(const void* caller, const char* name, LoadGeneration g, void* answer) {
    const size_t n = std::strlen(name);
    if (n >= kName) return;
    std::lock_guard<std::mutex> lock(m_);
    Slot& s = slots_[slot_of(caller, name)];
    s.caller = caller;
    s.gen = g;
    std::memcpy(s.name, name, n + 1);
    s.answer = answer;
    ++walks_;
  }
  uint64_t walks() {
    std::lock_guard<std::mutex> lock(m_);
    return walks_;
  }

 private:
  static constexpr size_t kSlots = 256, kName = 64;
  struct Slot {
    const void* caller = nullptr;
    LoadGeneration gen;
    char name[kName] = {};
    void* answer = nullptr;
  };
  static size_t slot_of(const void* caller, const char* name) {
    uint64_t h = reinterpret_cast<uintptr_t>(caller) * 0x9E3779B97F4A7C15ull;
    for (const char* c = name; *c; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 0x100000001B3ull;
    return (h ^ (h >> 29)) % kSlots;
  }
  std::mutex m_;
  Slot slots_[kSlots];
  uint64_t walks_ = 0;
};
constinit NextCache next_cache;

void* next_after_cached(const void* caller, const char* name) {
  const LoadGeneration g = load_generation();
  if (void* p = next_cache.find(caller, name, g)) return p;
  void* p = next_after(caller, name);
  if (p) next_cache.keep(caller, name, g, p);
  return p;
}
}  // namespace

namespace offload::hooks {
uint64_t dlsym_next_walks() { return next_cache.walks(); }
}  // namespace offload::hooks

OFFLOAD_EXPORT void* dlsym(void* handle, const char* name) {
  void* caller = __builtin_return_address(0);  // read here: the lambda below has its own
  return no_throw([&]() -> void* {
    void* real = handle == RTLD_NEXT ? next_after_cached(caller, name) : real_dlsym(handle, name);
    // A search that reaches our own export (RTLD_DEFAULT, the program's handle) found the shim's
    // wrapper, not the symbol: in a process without CUDA it would answer non-NULL, and a call
    // would abort. The answer is the definition elsewhere, as without the shim, or none.
    if (real) {
      const HookEntry* e = find_symbol(name);
      if (e && real == e->wrapper) {
        real = find_loaded(name, real);
        // Nothing else defines it: a failed lookup of our own leaves dlerror() its message
        // (callers such as ctypes read it after a NULL).
        if (!real) real = real_dlsym(RTLD_NEXT, name);
      }
    }
    return serve_symbol(name, real, kDlsym);
  });
}

// dlvsym is not interposed: the real dlsym is bootstrapped through it, and CUDA's entry
// points are not looked up by version string.

OFFLOAD_EXPORT CUresult cuGetProcAddress(const char* sym, void** pfn, int ver, cuuint64_t flags) {
  return no_throw([&] {
    CUresult r = reinterpret_cast<GpaV1>(real(HookId::cuGetProcAddress))(sym, pfn, ver, flags);
    if (r == CUDA_SUCCESS && pfn) *pfn = serve_proc(sym, *pfn, ver, ptds(flags), kGetProcAddress);
    return r;
  });
}

OFFLOAD_EXPORT CUresult cuGetProcAddress_v2(const char* sym, void** pfn, int ver, cuuint64_t flags,
                                            CUdriverProcAddressQueryResult* status) {
  return no_throw([&] {
    CUresult r = reinterpret_cast<GpaV2>(real(HookId::cuGetProcAddress_v2))(sym, pfn, ver, flags, status);
    if (r == CUDA_SUCCESS && pfn) *pfn = serve_proc(sym, *pfn, ver, ptds(flags), kGetProcAddress);
    return r;
  });
}

#define RT_ENTRY(NAME, PTSZ)                                                                        \
  OFFLOAD_EXPORT cudaError_t NAME(const char* sym, void** pfn, unsigned long long flags,            \
                                  cudaDriverEntryPointQueryResult* status) {                        \
    return no_throw([&] {                                                                           \
      cudaError_t r = reinterpret_cast<RtEntry>(real(HookId::NAME))(sym, pfn, flags, status);       \
      if (r == cudaSuccess && pfn)                                                                  \
        *pfn = serve_proc(sym, *pfn, CUDART_VERSION, rt_ptds(flags, PTSZ), kRuntimeEntryPoint);     \
      return r;                                                                                     \
    });                                                                                             \
  }
RT_ENTRY(cudaGetDriverEntryPoint, false)
RT_ENTRY(cudaGetDriverEntryPoint_ptsz, true)

#define RT_ENTRY_BY_VERSION(NAME, PTSZ)                                                             \
  OFFLOAD_EXPORT cudaError_t NAME(const char* sym, void** pfn, unsigned int ver,                    \
                                  unsigned long long flags, cudaDriverEntryPointQueryResult* status) { \
    return no_throw([&] {                                                                           \
      cudaError_t r = reinterpret_cast<RtEntryV>(real(HookId::NAME))(sym, pfn, ver, flags, status); \
      if (r == cudaSuccess && pfn)                                                                  \
        *pfn = serve_proc(sym, *pfn, static_cast<int>(ver), rt_ptds(flags, PTSZ), kRuntimeEntryPoint); \
      return r;                                                                                     \
    });                                                                                             \
  }
RT_ENTRY_BY_VERSION(cudaGetDriverEntryPointByVersion, false)
RT_ENTRY_BY_VERSION(cudaGetDriverEntryPointByVersion_ptsz, true)

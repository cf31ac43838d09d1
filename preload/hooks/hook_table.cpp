#include "hooks/hook_table.h"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

// Declarations of every wrapper (defined in driver_hooks.cpp / runtime_hooks.cpp /
// nccl_hooks.cpp / entry_point_hooks.cpp). Only their addresses are needed here.
extern "C" {
#define OFFLOAD_DECL_D(sym, base, ver, ptsz) void sym();
#define OFFLOAD_DECL_R(sym, ptsz) void sym();
OFFLOAD_DRIVER_HOOKS(OFFLOAD_DECL_D)
OFFLOAD_RUNTIME_HOOKS(OFFLOAD_DECL_R)
#undef OFFLOAD_DECL_D
#undef OFFLOAD_DECL_R
}

namespace offload::hooks {
namespace {

HookEntry g_table[kHookCount] = {
#define OFFLOAD_ROW_D(sym, base, ver, ptsz) {#sym, base, ver, ptsz != 0, true, reinterpret_cast<void*>(&::sym), {}, {}},
#define OFFLOAD_ROW_R(sym, ptsz) {#sym, nullptr, 0, ptsz != 0, false, reinterpret_cast<void*>(&::sym), {}, {}},
    OFFLOAD_DRIVER_HOOKS(OFFLOAD_ROW_D) OFFLOAD_RUNTIME_HOOKS(OFFLOAD_ROW_R)
#undef OFFLOAD_ROW_D
#undef OFFLOAD_ROW_R
};

std::atomic<uint64_t> g_unwrapped{0};

using DlsymFn = void* (*)(void*, const char*);

DlsymFn bootstrap_dlsym() {
  // glibc >= 2.34 versions dlsym GLIBC_2.34; older ones GLIBC_2.2.5.
  void* p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (!p) p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  if (!p) {
    static const char msg[] = "[offload error] cannot find the real dlsym; aborting\n";
    ssize_t ignored = write(2, msg, sizeof msg - 1);
    (void)ignored;
    abort();
  }
  return reinterpret_cast<DlsymFn>(p);
}

void die_unresolved(const char* symbol) {
  char buf[256];
  const char* lib = symbol[0] == 'n' ? "NCCL" : symbol[2] == 'd' ? "CUDA runtime" : "CUDA driver";
  int n = snprintf(buf, sizeof buf, "[offload error] no real '%s' to forward to (is the %s library loaded?); aborting\n",
                   symbol, lib);
  ssize_t ignored = write(2, buf, static_cast<size_t>(n > 0 ? n : 0));
  (void)ignored;
  abort();
}

// Every name we interpose starts with "cu" (driver, runtime) or "nccl": anything else is
// turned away with two comparisons (dlsym is called for every symbol Python resolves).
bool is_candidate(const char* name) {
  return name && ((name[0] == 'c' && name[1] == 'u') || (name[0] == 'n' && name[1] == 'c' && name[2] == 'c' && name[3] == 'l'));
}

}  // namespace

HookEntry* hook_table() { return g_table; }

HookEntry* find_symbol(const char* symbol) {
  if (!is_candidate(symbol)) return nullptr;
  for (HookEntry& e : g_table)
    if (std::strcmp(e.symbol, symbol) == 0) return &e;
  return nullptr;
}

HookEntry* find_proc(const char* base, int cuda_version, bool ptsz) {
  if (!is_candidate(base)) return nullptr;
  HookEntry* best = nullptr;
  for (int pass = 0; pass < 2 && !best; ++pass) {
    bool want = pass == 0 ? ptsz : false;  // a name without a ptsz variant serves both
    for (HookEntry& e : g_table) {
      if (!e.base || e.ptsz != want || std::strcmp(e.base, base) != 0) continue;
      if (e.min_version > cuda_version) continue;
      if (!best || e.min_version > best->min_version) best = &e;
    }
    if (!ptsz) break;
  }
  return best;
}

namespace {
void* serve(HookEntry* e, void* real, Route route) {
  if (!real) return real;
  if (!e) return real;
  if (real == e->wrapper) return real;  // asked of ourselves (RTLD_DEFAULT, or a re-query)
  void* expected = nullptr;
  e->real.compare_exchange_strong(expected, real, std::memory_order_acq_rel);
  e->routes.fetch_or(route, std::memory_order_relaxed);
  return e->wrapper;
}
}  // namespace

void* serve_symbol(const char* symbol, void* real, Route route) {
  return serve(find_symbol(symbol), real, route);
}

void* serve_proc(const char* base, void* real, int cuda_version, bool ptsz, Route route) {
  HookEntry* e = find_proc(base, cuda_version, ptsz);
  if (!e && real && is_candidate(base)) {
    // A listed base name at a version we do not wrap: launches through it go unseen.
    for (HookEntry& x : g_table)
      if (x.base && std::strcmp(x.base, base) == 0) {
        g_unwrapped.fetch_add(1, std::memory_order_relaxed);
        break;
      }
  }
  return serve(e, real, route);
}

void* real_dlsym(void* handle, const char* name) {
  static DlsymFn fn = bootstrap_dlsym();
  return fn(handle, name);
}

// The loaded objects' names, copied out of dl_iterate_phdr a batch at a time and looked up
// after the walk. The walk holds the loader's list lock; a dlopen inside it takes the load
// lock, the reverse of another thread's dlopen of a new library, and the two deadlock
// (Hooks.FindingALocalDefinitionWhileAnotherThreadLoadsLibrariesNeverDeadlocks). The batch is
// on the caller's stack: nothing allocates on a hook's path, and no lock of ours is held while
// the loader's are taken (a library's constructor may call a hook that resolves here).
namespace {
struct NameBatch {
  static constexpr size_t kRoom = 8 << 10, kMost = 128;
  char room[kRoom];
  uint32_t start[kMost];
  uint32_t count = 0;
  uint32_t most = kMost;
  size_t used = 0;
  size_t skip = 0;  // objects before this batch (from the previous walks)
  size_t seen = 0;  // objects walked, the ones copied included
  bool full = false;
  const link_map* own = nullptr;
};

int copy_name(dl_phdr_info* info, size_t, void* arg) {
  auto* b = static_cast<NameBatch*>(arg);
  if (b->seen < b->skip) {
    ++b->seen;
    return 0;
  }
  const char* name = info->dlpi_name;
  if (!name || !*name || (b->own && info->dlpi_addr == b->own->l_addr)) {  // the program, the vDSO, us
    ++b->seen;
    return 0;
  }
  const size_t n = std::strlen(name) + 1;
  if (b->count == b->most || b->used + n > NameBatch::kRoom) {
    b->full = true;  // this one starts the next batch
    return 1;
  }
  std::memcpy(b->room + b->used, name, n);
  b->start[b->count++] = static_cast<uint32_t>(b->used);
  b->used += n;
  ++b->seen;
  return 0;
}
}  // namespace

void* find_loaded(const char* name, const void* self, size_t batch) {
  Dl_info own;
  link_map* own_map = nullptr;
  if (!dladdr1(self, &own, reinterpret_cast<void**>(&own_map), RTLD_DL_LINKMAP)) own_map = nullptr;
  NameBatch b;
  b.most = batch > 0 && batch < NameBatch::kMost ? static_cast<uint32_t>(batch) : NameBatch::kMost;
  b.own = own_map;
  for (size_t skip = 0;;) {
    b.count = 0;
    b.used = 0;
    b.skip = skip;
    b.seen = 0;
    b.full = false;
    dl_iterate_phdr(copy_name, &b);
    for (uint32_t i = 0; i < b.count; ++i) {
      // A library's link_map is not a usable handle until dlopen has made it one; one unloaded
      // since the walk is simply not found.
      void* h = dlopen(b.room + b.start[i], RTLD_LAZY | RTLD_NOLOAD);
      if (!h) continue;
      void* p = real_dlsym(h, name);
      dlclose(h);
      Dl_info where;
      link_map* m = nullptr;
      // dlsym on a library's handle also searches its dependencies: ours does not count.
      if (p && own_map && dladdr1(p, &where, reinterpret_cast<void**>(&m), RTLD_DL_LINKMAP) && m == own_map) p = nullptr;
      if (p) return p;
    }
    if (!b.full || b.seen == skip) return nullptr;
    skip = b.seen;
  }
}

void* real(HookId id) {
  HookEntry& e = entry(id);
  void* p = e.real.load(std::memory_order_acquire);
  if (p) return p;
  // Reached through our exported symbol before any other route resolved it.
  void* handle = e.driver ? dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD) : RTLD_NEXT;
  if (e.driver && !handle) handle = dlopen("libcuda.so.1", RTLD_LAZY);
  if (handle) p = real_dlsym(handle, e.symbol);
  if (p == e.wrapper) p = nullptr;
  // A library loaded with RTLD_LOCAL is not in the global scope that RTLD_NEXT searches, yet
  // its callers bind to our export first: PyTorch's libnccl, a dependency of libtorch_cuda,
  // which Python loads locally. Then the first other loaded object that defines the name.
  if (!p && !e.driver) p = find_loaded(e.symbol, e.wrapper);
  if (!p) die_unresolved(e.symbol);
  void* expected = nullptr;
  if (!e.real.compare_exchange_strong(expected, p, std::memory_order_acq_rel)) p = expected;
  e.routes.fetch_or(kExport, std::memory_order_relaxed);
  return p;
}

uint64_t unwrapped_routes() { return g_unwrapped.load(std::memory_order_relaxed); }

}  // namespace offload::hooks

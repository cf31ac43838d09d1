#include "hooks/hook_table.h"

#include <dlfcn.h>
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
  int n = snprintf(buf, sizeof buf,
                   "[offload error] no real '%s' to forward to (is the CUDA %s library loadable?); aborting\n",
                   symbol, symbol[2] == 'd' ? "runtime" : "driver");
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

void* real(HookId id) {
  HookEntry& e = entry(id);
  void* p = e.real.load(std::memory_order_acquire);
  if (p) return p;
  // Reached through our exported symbol before any other route resolved it.
  void* handle = e.driver ? dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD) : RTLD_NEXT;
  if (e.driver && !handle) handle = dlopen("libcuda.so.1", RTLD_LAZY);
  if (handle) p = real_dlsym(handle, e.symbol);
  if (p == e.wrapper) p = nullptr;
  if (!p) die_unresolved(e.symbol);
  void* expected = nullptr;
  if (!e.real.compare_exchange_strong(expected, p, std::memory_order_acq_rel)) p = expected;
  e.routes.fetch_or(kExport, std::memory_order_relaxed);
  return p;
}

uint64_t unwrapped_routes() { return g_unwrapped.load(std::memory_order_relaxed); }

}  // namespace offload::hooks

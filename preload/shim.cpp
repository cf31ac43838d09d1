// The hooks' side of the runtime (shim.h): each function is the runtime's answer, and the
// allocation router.
#include "shim.h"

#include <atomic>

#include "cupti_telemetry.h"
#include "runtime.h"

namespace offload {

namespace {
__attribute__((tls_model("initial-exec"))) thread_local bool t_in_hook = false;
std::atomic<bool> g_paused{false};  // offload_pause_observation
}  // namespace

HookGuard::HookGuard() noexcept : outermost_(!t_in_hook) { t_in_hook = true; }
HookGuard::~HookGuard() {
  if (outermost_) t_in_hook = false;
}

namespace shim {

Runtime* active() noexcept { return g_paused.load(std::memory_order_relaxed) ? nullptr : runtime(); }

bool counted_light(Runtime& rt) noexcept {
  if (!rt.light()) return false;
  rt.count_unscanned();
  return true;
}

void on_kernel(Runtime& rt, Func f, Stream s, void** params, void** extra, const Geom* geom) noexcept {
  if (!geom) {
    rt.tracker().on_kernel(f, s, params, extra);
    return;
  }
  LaunchGeom g;
  for (int i = 0; i < 3; ++i) g.grid[i] = geom->grid[i], g.block[i] = geom->block[i];
  g.smem = geom->smem;
  g.attrs = geom->attrs;
  g.nattrs = geom->nattrs;
  g.attr_bytes = geom->attr_bytes;
  g.refused_attr = geom->refused_attr;
  rt.tracker().on_kernel(f, s, params, extra, &g);
}
void on_copy(Runtime& rt, DevPtr dst, DevPtr src, uint64_t bytes, Stream s, const void* host_src) noexcept {
  rt.tracker().on_copy(dst, src, bytes, s, host_src);
}
void on_memset(Runtime& rt, DevPtr dst, uint64_t bytes, Stream s) noexcept { rt.tracker().on_memset(dst, bytes, s); }
void on_copies(Runtime& rt, const void* dsts, const void* srcs, const size_t* sizes, size_t count, Stream s) noexcept {
  uint64_t bytes = 0;
  for (size_t i = 0; sizes && i < count; ++i) bytes += sizes[i];
  rt.tracker().on_copies(dsts, srcs, count, bytes, s);
}
void on_graph(Runtime& rt, Stream s) noexcept { rt.tracker().on_graph(s); }
void on_collective(Runtime& rt, DevPtr send, DevPtr recv, uint64_t bytes, Stream s) noexcept {
  rt.tracker().on_collective(send, recv, bytes, s);
}

bool refused(Runtime& rt) noexcept { return rt.refused(); }
void launched(Runtime& rt) noexcept { rt.launched(); }

// In order: the runtime's own placement (the hard cap's ranges, an arena, the persistent pool;
// refused when the budget cannot hold it), a block kept on free (OFFLOAD_BLOCK_CACHE), then the
// allocator, asked once more after the kept blocks are handed back if it was full.
int allocate(Runtime& rt, uint64_t bytes, Stream s, void** p, Allocator& a) noexcept {
  switch (rt.place(bytes, s, p)) {
    case Runtime::Placed::Served: return 0;
    case Runtime::Placed::Refused: return 2;  // cudaErrorMemoryAllocation
    case Runtime::Placed::Forward: break;
  }
  const bool keeps = a.can_free_kept();
  if (keeps && rt.cached(bytes, s, p)) return 0;
  int result = a.forward();
  if (keeps && result != 0) {
    auto kept = rt.drain_cache();
    if (!kept.empty()) {
      a.free_kept(kept.data(), kept.size());
      result = a.forward();
    }
  }
  if (result == 0) {
    rt.track_alloc(*p, bytes, s);
    if (keeps) rt.forwarded(*p, s);
  }
  return result;
}

bool release(Runtime& rt, void* p, Stream s) noexcept { return rt.release(p, s); }
void prepare_access(Runtime& rt, DevPtr p) noexcept { rt.prepare_access(p); }

void cupti_registering(const void* request) noexcept {
  if (!CuptiTelemetry::is_our_callback(request)) CuptiTelemetry::note_other_client();
}

}  // namespace shim
}  // namespace offload

extern "C" __attribute__((visibility("default"))) int offload_pause_observation(int paused) {
  try {  // nothing is thrown across the C boundary (building the runtime may throw)
    offload::Runtime* rt = offload::runtime();
    if (!rt || rt->holds_budget()) return -1;
    offload::g_paused.store(paused != 0, std::memory_order_relaxed);
    return 0;
  } catch (...) {
    return -1;
  }
}

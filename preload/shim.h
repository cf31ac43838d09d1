// What a hook may ask of liboffload.so: a few free functions on an opaque Runtime. The hooks
// (preload/hooks/) include this header and nothing of the runtime, the tracker or the planner.
//
//   HookGuard g; Runtime* rt = g.outermost() ? active() : nullptr;   nullptr: only forward
//   launches:    counted_light, then on_kernel/on_copy/on_memset/on_graph/on_collective,
//                refused (answer out-of-memory instead of forwarding), launched
//   allocations: allocate (the one router: where each allocation goes), release,
//                prepare_access (a pointer query announces a use)
//   CUPTI:       cupti_registering (another client takes the activity buffers)
//
// None of them allocates on the fast path, throws, or takes a lock another hook may hold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "planner/types.h"  // DevPtr, Stream, Func

namespace offload {

class Runtime;

// The hooks' reentrancy guard: true while this thread is inside one of our hooks.
struct HookGuard {
  HookGuard() noexcept;
  ~HookGuard();
  bool outermost() const { return outermost_; }
  HookGuard(const HookGuard&) = delete;
  HookGuard& operator=(const HookGuard&) = delete;

 private:
  bool outermost_;
};

namespace shim {

// The process's runtime, built on first use; nullptr when the shim is disabled, has bad
// settings, is shutting down, or runs in a forked child (the hooks then only forward).
Runtime* active() noexcept;

// Light observation (the default without a budget): counts the launch and answers true; the
// hook then only forwards it.
bool counted_light(Runtime& rt) noexcept;
// What a launch touches, recorded before it is forwarded.
// `geom`: grid, block and shared memory of a plain launch (core/launch_args.h); nullptr otherwise.
struct Geom {
  unsigned grid[3], block[3], smem;
  const void* attrs = nullptr;  // cuLaunchKernelEx's attributes, `nattrs` of `attr_bytes` in all
  unsigned nattrs = 0, attr_bytes = 0;
  int refused_attr = -1;  // an attribute that forbids launching it again (hooks/launch_attrs.h)
};
void on_kernel(Runtime& rt, Func f, Stream s, void** params, void** extra, const Geom* geom = nullptr) noexcept;
void on_copy(Runtime& rt, DevPtr dst, DevPtr src, uint64_t bytes, Stream s, const void* host_src) noexcept;
void on_memset(Runtime& rt, DevPtr dst, uint64_t bytes, Stream s) noexcept;
// A batch of copies (cuMemcpyBatchAsync): `count` destination and source addresses and sizes.
void on_copies(Runtime& rt, const void* dsts, const void* srcs, const size_t* sizes, size_t count, Stream s) noexcept;
void on_graph(Runtime& rt, Stream s) noexcept;
void on_collective(Runtime& rt, DevPtr send, DevPtr recv, uint64_t bytes, Stream s) noexcept;
// The budget refuses the launch just recorded (its working set cannot fit): the hook answers
// out-of-memory and does not forward it. launched: it was forwarded.
bool refused(Runtime& rt) noexcept;
void launched(Runtime& rt) noexcept;

// The allocator behind one allocation hook: forward() asks it (0 is success, *p set), and
// free_kept() hands it back blocks the shim kept for reuse when it was found full (only the
// stream-ordered allocator's entry points keep blocks: can_free_kept).
class Allocator {
 public:
  virtual int forward() noexcept = 0;
  virtual bool can_free_kept() const noexcept { return false; }
  virtual void free_kept(const std::pair<DevPtr, Stream>*, size_t) noexcept {}

 protected:
  ~Allocator() = default;
};

// The allocation router: a range of the hard cap's, an arena's or the persistent pool's, a
// kept block, or the allocator's; the tracker sees it once. Answers the status the hook
// returns (0, or 2, out of memory, when the budget cannot hold it).
int allocate(Runtime& rt, uint64_t bytes, Stream s, void** p, Allocator& a) noexcept;
// A free: true when the shim took it (the allocator must not see it).
bool release(Runtime& rt, void* p, Stream s) noexcept;
// A pointer query (Triton checks its arguments): an evicted range is mapped back first.
void prepare_access(Runtime& rt, DevPtr p) noexcept;

// Another CUPTI client (torch.profiler's Kineto) registers for the activity buffers, with
// `request` as its callback: the shim's telemetry steps aside (one owner of the buffers).
void cupti_registering(const void* request) noexcept;

}  // namespace shim
}  // namespace offload

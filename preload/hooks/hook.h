// What every hook does, once: guard, resolve the real entry point, forward, and tell the
// core. The hook files hold nothing but one-line uses of these.
//
//   launch<Id>(observe, call): observe(tracker) records the launch and what it touches,
//       then call(real) forwards; nested or pass-through calls only forward, and under light
//       observation the launch is only counted.
//   after_ok<Id>(call, observe): forwards, then observes if the call succeeded (allocs).
//   before<Id>(observe, call): observes, then forwards (frees).
//
// Nothing here allocates, throws, or takes a lock another hook may hold.
#pragma once

#include <cstddef>
#include <type_traits>

#include "hooks/hook_table.h"
#include "runtime.h"

namespace offload::hooks {

template <auto Fn>
using FnPtr = decltype(Fn);

template <HookId Id, class Sig>
inline Sig real_as() {
  return reinterpret_cast<Sig>(real(Id));
}

template <HookId Id, class Sig, class Observe, class Call>
inline auto launch(Observe&& observe, Call&& call) {
  Sig fn = real_as<Id, Sig>();
  HookGuard guard;
  Runtime* rt = guard.outermost() ? runtime() : nullptr;
  if (!rt) return call(fn);
  if (rt->light()) {
    rt->count_unscanned();
    return call(fn);
  }
  observe(rt->tracker());
  using R = decltype(call(fn));
  // Refused under the device budget: out of memory (CUDA_ERROR_OUT_OF_MEMORY,
  // cudaErrorMemoryAllocation and ncclSystemError are all 2), and the launch never runs.
  if (rt->refused()) return static_cast<R>(2);
  R result = call(fn);
  rt->launched();
  return result;
}

template <HookId Id, class Sig, class Call, class Observe>
inline auto after_ok(Call&& call, Observe&& observe) {
  Sig fn = real_as<Id, Sig>();
  HookGuard guard;
  auto result = call(fn);
  Runtime* rt = guard.outermost() ? runtime() : nullptr;
  if (rt && result == decltype(result){}) observe(rt->tracker());
  return result;
}

template <HookId Id, class Sig, class Observe, class Call>
inline auto before(Observe&& observe, Call&& call) {
  Sig fn = real_as<Id, Sig>();
  HookGuard guard;
  if (Runtime* rt = guard.outermost() ? runtime() : nullptr) observe(rt->tracker());
  return call(fn);
}

// allocate<Id>(p, bytes, stream, call[, forward_kept]): the executor may serve the allocation
// from an arena (a planned one); otherwise it is forwarded. The tracker sees it either way.
// With forward_kept (the stream-ordered allocator's entry points, not a named pool's), a block
// the BlockCache kept (OFFLOAD_BLOCK_CACHE) is tried before the allocator; when the allocator
// fails and the cache holds blocks, forward_kept(blocks) frees them through the allocator and
// clears the failure from the runtime's last error (the caller sees only the second answer),
// and the allocator is asked once more.
template <HookId Id, class Sig, class Call, class ForwardKept = std::nullptr_t>
inline auto allocate(void** p, uint64_t bytes, Stream s, Call&& call, ForwardKept&& forward_kept = nullptr) {
  constexpr bool cache = !std::is_same_v<std::decay_t<ForwardKept>, std::nullptr_t>;
  Sig fn = real_as<Id, Sig>();
  HookGuard guard;
  Runtime* rt = guard.outermost() ? runtime() : nullptr;
  using R = decltype(call(fn));
  if (rt) switch (rt->place(bytes, s, p)) {
      case Runtime::Placed::Served: return R{};
      case Runtime::Placed::Refused: return static_cast<R>(2);  // cudaErrorMemoryAllocation
      case Runtime::Placed::Forward: break;
    }
  if constexpr (cache) {
    if (rt && rt->cached(bytes, s, p)) return R{};
  }
  R result = call(fn);
  if constexpr (cache) {
    if (rt && result != R{}) {
      auto kept = rt->drain_cache();
      if (!kept.empty()) {
        forward_kept(kept);
        result = call(fn);
      }
    }
  }
  if (rt && result == R{}) {
    rt->track_alloc(*p, bytes, s);
    if constexpr (cache) rt->forwarded(*p, s);
  }
  return result;
}

// release<Id>(p, stream, call): an arena member's free stays with the executor; any other
// is forwarded. The tracker sees it either way.
template <HookId Id, class Sig, class Call>
inline auto release(void* p, Stream s, Call&& call) {
  Sig fn = real_as<Id, Sig>();
  HookGuard guard;
  Runtime* rt = guard.outermost() ? runtime() : nullptr;
  using R = decltype(call(fn));
  if (rt && rt->release(p, s)) return R{};
  return call(fn);
}

// query<Id>(ptr, call): a question about `ptr` (its attributes) that announces a use: the
// executor maps an evicted arena back first, then the question is forwarded.
template <HookId Id, class Sig, class Call>
inline auto query(DevPtr ptr, Call&& call) {
  Sig fn = real_as<Id, Sig>();
  HookGuard guard;
  if (Runtime* rt = guard.outermost() ? runtime() : nullptr) rt->prepare_access(ptr);
  return call(fn);
}

// Stream identity as the tracker records it: the null stream of a _ptsz entry point is the
// calling thread's per-thread default stream.
inline Stream stream_id(const void* s, bool ptsz) {
  return (s == nullptr && ptsz) ? kPerThreadStream : reinterpret_cast<Stream>(s);
}

}  // namespace offload::hooks

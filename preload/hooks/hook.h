// What every hook does, once: guard, resolve the real entry point, forward, and tell the
// shim (shim.h). The hook files hold nothing but one-line uses of these.
//
//   launch<Id>(observe, call): observe(rt) records the launch and what it touches, then
//       call(real) forwards; nested or pass-through calls only forward, and under light
//       observation the launch is only counted.
//   allocate<Id>(p, bytes, stream, call[, free_kept]): the shim's router places it.
//   release<Id>(p, stream, call): a free; the shim's own stay with it.
//   query<Id>(ptr, call): a question about a pointer that announces a use.
//
// Nothing here allocates, throws, or takes a lock another hook may hold. Every exported wrapper
// runs its body in a noexcept function (these templates, or no_throw for the hand-written
// ones): the C declarations cannot say noexcept, and an exception must never unwind into C.
#pragma once

#include <cstddef>
#include <type_traits>

#include "core/driver.h"  // kPerThreadStream
#include "hooks/hook_table.h"
#include "shim.h"

namespace offload::hooks {

// The body of a hand-written exported wrapper: f(), and std::terminate rather than unwinding.
template <class F>
inline auto no_throw(F&& f) noexcept {
  return f();
}

template <HookId Id, class Sig>
inline Sig real_as() {
  return reinterpret_cast<Sig>(real(Id));
}

template <HookId Id, class Sig, class Observe, class Call>
inline auto launch(Observe&& observe, Call&& call) noexcept {
  Sig fn = real_as<Id, Sig>();
  HookGuard guard;
  Runtime* rt = guard.outermost() ? shim::active() : nullptr;
  if (!rt || shim::counted_light(*rt)) return call(fn);
  observe(*rt);
  using R = decltype(call(fn));
  // Refused under the device budget: out of memory (CUDA_ERROR_OUT_OF_MEMORY,
  // cudaErrorMemoryAllocation and ncclSystemError are all 2), and the launch never runs.
  if (shim::refused(*rt)) return static_cast<R>(2);
  R result = call(fn);
  shim::launched(*rt);
  return result;
}

// The allocator of one allocation hook, for the shim's router: call(real) forwards; with
// free_kept (the stream-ordered allocator's entry points, not a named pool's), blocks the shim
// kept can be handed back to the allocator when it is found full.
template <class Sig, class Call, class FreeKept>
class HookAllocator final : public shim::Allocator {
 public:
  HookAllocator(Sig fn, Call& call, FreeKept& free_kept) : fn_(fn), call_(call), free_kept_(free_kept) {}
  int forward() noexcept override { return static_cast<int>(call_(fn_)); }
  bool can_free_kept() const noexcept override { return kKeeps; }
  void free_kept(const std::pair<DevPtr, Stream>* blocks, size_t n) noexcept override {
    if constexpr (kKeeps) free_kept_(blocks, n);
  }

 private:
  static constexpr bool kKeeps = !std::is_same_v<std::decay_t<FreeKept>, std::nullptr_t>;
  Sig fn_;
  Call& call_;
  FreeKept& free_kept_;
};

template <HookId Id, class Sig, class Call, class FreeKept = std::nullptr_t>
inline auto allocate(void** p, uint64_t bytes, Stream s, Call&& call, FreeKept&& free_kept = nullptr) noexcept {
  Sig fn = real_as<Id, Sig>();
  HookGuard guard;
  Runtime* rt = guard.outermost() ? shim::active() : nullptr;
  if (!rt) return call(fn);
  using R = decltype(call(fn));
  HookAllocator<Sig, Call, FreeKept> a(fn, call, free_kept);
  return static_cast<R>(shim::allocate(*rt, bytes, s, p, a));
}

template <HookId Id, class Sig, class Call>
inline auto release(void* p, Stream s, Call&& call) noexcept {
  Sig fn = real_as<Id, Sig>();
  HookGuard guard;
  Runtime* rt = guard.outermost() ? shim::active() : nullptr;
  using R = decltype(call(fn));
  if (rt && shim::release(*rt, p, s)) return R{};
  return call(fn);
}

// An evicted range is mapped back before the question is forwarded.
template <HookId Id, class Sig, class Call>
inline auto query(DevPtr ptr, Call&& call) noexcept {
  Sig fn = real_as<Id, Sig>();
  HookGuard guard;
  if (Runtime* rt = guard.outermost() ? shim::active() : nullptr) shim::prepare_access(*rt, ptr);
  return call(fn);
}

// Stream identity as the tracker records it: the null stream of a _ptsz entry point is the
// calling thread's per-thread default stream.
inline Stream stream_id(const void* s, bool ptsz) {
  return (s == nullptr && ptsz) ? kPerThreadStream : reinterpret_cast<Stream>(s);
}

}  // namespace offload::hooks

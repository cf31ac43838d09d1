// NCCL collectives. NCCL's kernels do not take the user's buffers as arguments (they reach
// them through NCCL's own structures), so the launch scan cannot see what a collective reads
// and writes: the API calls are interposed instead, and their buffers count as touched on
// the collective's stream (reloaded first if evicted; that stream joins the arena's list, so
// no eviction copies out from under a running collective).
//
// NCCL's header is not needed: the types are declared here as the ABI has them (enums are
// int, communicators and streams are pointers).
#include <cstddef>
#include <cstdint>

#include "hooks/hook.h"

#define OFFLOAD_EXPORT extern "C" __attribute__((visibility("default")))

using namespace offload;
using namespace offload::hooks;

namespace {

using Comm = void*;
using CudaStream = void*;

// Bytes per element of ncclDataType_t: int8, uint8, int32, uint32, int64, uint64, float16,
// float32, float64, bfloat16, fp8 e4m3, fp8 e5m2.
uint64_t elem_bytes(int t) {
  static constexpr uint8_t size[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return t >= 0 && t < static_cast<int>(sizeof size) ? size[t] : 1;
}

inline DevPtr dptr(const void* p) { return reinterpret_cast<DevPtr>(p); }

using AllReduceFn = int (*)(const void*, void*, size_t, int, int, Comm, CudaStream);
using BroadcastFn = int (*)(const void*, void*, size_t, int, int, Comm, CudaStream);
using BcastFn = int (*)(void*, size_t, int, int, Comm, CudaStream);
using ReduceFn = int (*)(const void*, void*, size_t, int, int, int, Comm, CudaStream);
using AllGatherFn = int (*)(const void*, void*, size_t, int, Comm, CudaStream);
using ReduceScatterFn = int (*)(const void*, void*, size_t, int, int, Comm, CudaStream);
using SendRecvFn = int (*)(const void*, size_t, int, int, Comm, CudaStream);
using RecvFn = int (*)(void*, size_t, int, int, Comm, CudaStream);

}  // namespace

#define COLLECTIVE(ID, FN, SEND, RECV, BYTES, ARGS)                                                   \
  launch<HookId::ID, FN>(                                                                           \
      [&](Runtime& rt) { shim::on_collective(rt, dptr(SEND), dptr(RECV), BYTES, stream_id(s, false)); }, \
      [&](auto real) { return real ARGS; })

OFFLOAD_EXPORT int ncclAllReduce(const void* sb, void* rb, size_t n, int dt, int op, Comm c, CudaStream s) {
  return COLLECTIVE(ncclAllReduce, AllReduceFn, sb, rb, n * elem_bytes(dt), (sb, rb, n, dt, op, c, s));
}

OFFLOAD_EXPORT int ncclBroadcast(const void* sb, void* rb, size_t n, int dt, int root, Comm c, CudaStream s) {
  return COLLECTIVE(ncclBroadcast, BroadcastFn, sb, rb, n * elem_bytes(dt), (sb, rb, n, dt, root, c, s));
}

OFFLOAD_EXPORT int ncclBcast(void* b, size_t n, int dt, int root, Comm c, CudaStream s) {
  return COLLECTIVE(ncclBcast, BcastFn, b, b, n * elem_bytes(dt), (b, n, dt, root, c, s));
}

OFFLOAD_EXPORT int ncclReduce(const void* sb, void* rb, size_t n, int dt, int op, int root, Comm c, CudaStream s) {
  return COLLECTIVE(ncclReduce, ReduceFn, sb, rb, n * elem_bytes(dt), (sb, rb, n, dt, op, root, c, s));
}

OFFLOAD_EXPORT int ncclAllGather(const void* sb, void* rb, size_t n, int dt, Comm c, CudaStream s) {
  return COLLECTIVE(ncclAllGather, AllGatherFn, sb, rb, n * elem_bytes(dt), (sb, rb, n, dt, c, s));
}

OFFLOAD_EXPORT int ncclReduceScatter(const void* sb, void* rb, size_t n, int dt, int op, Comm c, CudaStream s) {
  return COLLECTIVE(ncclReduceScatter, ReduceScatterFn, sb, rb, n * elem_bytes(dt), (sb, rb, n, dt, op, c, s));
}

OFFLOAD_EXPORT int ncclSend(const void* sb, size_t n, int dt, int peer, Comm c, CudaStream s) {
  return COLLECTIVE(ncclSend, SendRecvFn, sb, nullptr, n * elem_bytes(dt), (sb, n, dt, peer, c, s));
}

OFFLOAD_EXPORT int ncclRecv(void* rb, size_t n, int dt, int peer, Comm c, CudaStream s) {
  return COLLECTIVE(ncclRecv, RecvFn, nullptr, rb, n * elem_bytes(dt), (rb, n, dt, peer, c, s));
}

// CudaDriver's copy gate (Residency::Options::copy_gate). An access grant (cuMemSetAccess) made
// while a copy to the host runs takes about 0.7-1.1 ms, and about 0.05 ms while none runs, even with
// copies queued behind a wait (docs/results.md, "The driver's calls while copies run"). So copies
// to the host on the gated stream are queued in chunks, each behind a wait until a word of host
// memory says the gate is open (cuStreamWaitValue32). A grant closes the gate, grants and opens it
// again: it then waits for the chunk already past the gate and no more (81 us with 4 MiB chunks on
// an H100, against 111 when it first waited for that chunk to end; docs/results.md, "copies out
// held at a gate"). The gate only delays copies: no byte or order changes. Chunks widen with what
// is queued ahead of the link (core/gate_chunks.h).
#include <cuda.h>

#include <algorithm>
#include <new>

#include "common/clock.h"
#include "common/log.h"
#include "cuda_calls.h"
#include "cuda_driver.h"
#include "nvtx_marks.h"

namespace offload {

using cu::as_stream;
using cu::cu_ok;
using cu::CtxScope;
using cu::exec_api;

bool CudaDriver::gate_copies_out(Stream s, uint64_t chunk, uint32_t ahead) {
  if (!s || !chunk || gate_) return false;  // one gated stream a process
  const cu::ExecApi* a = exec_api();
  if (!a || !a->wait_value32 || !a->host_register || !a->host_device_ptr) {
    log().info("OFFLOAD_CAP_GATE: the driver lacks stream memory operations; copies out are not gated");
    return false;
  }
  CtxScope scope(a, context());
  if (!scope) return false;
  uint64_t dptr = 0;
  void* page = device_page(&dptr);
  if (!page) return false;
  auto* open = new (page) std::atomic<uint32_t>{1};
  gate_ = open;  // kept for the process's life: the stream may wait on it until the end
  gate_dev_ = dptr;
  gate_chunks_size_ = GateChunks(chunk, ahead);
  gate_stream_.store(s, std::memory_order_release);
  log().info("copies out gated in chunks of {} KiB, wider past {} of them queued", chunk >> 10, ahead);
  return true;
}

Driver::GateCounts CudaDriver::gate_counts() {
  return {gate_grants_.load(std::memory_order_relaxed), gate_closed_ns_.load(std::memory_order_relaxed),
          gate_chunks_.load(std::memory_order_relaxed)};
}

void CudaDriver::gate_off() {
  log().warn("a stream memory operation failed: copies out are no longer gated");
  gate_stream_.store(0, std::memory_order_release);
  gate_->store(1);  // for ever: chunks already queued behind the gate go on
}

bool CudaDriver::gated_copy_to_host(void* dst, DevPtr src, uint64_t bytes, Stream s) {
  const cu::ExecApi* a = exec_api();
  CtxScope scope(a, context());
  if (!scope) return false;
  nvtx::Range range(nvtx::Move::Evict, bytes);
  const CUstream cs = as_stream(s);
  auto* out = static_cast<unsigned char*>(dst);
  std::lock_guard<std::mutex> lk(gate_mu_);  // the estimate of what is queued ahead
  for (uint64_t off = 0, n = 0; off < bytes; off += n) {
    n = gate_chunks_size_.next(uint64_t(mono_ns()), bytes - off);
    gate_chunks_.fetch_add(1, std::memory_order_relaxed);
    if (gate_stream_.load(std::memory_order_acquire) == s &&
        !cu_ok(a->wait_value32(cs, gate_dev_, 1, CU_STREAM_WAIT_VALUE_EQ), "cuStreamWaitValue32")) {
      gate_off();
      return cu_ok(a->dtoh(out + off, src + off, bytes - off, cs), "cuMemcpyDtoHAsync_v2");
    }
    if (!cu_ok(a->dtoh(out + off, src + off, n, cs), "cuMemcpyDtoHAsync_v2")) return false;
  }
  return true;
}

bool CudaDriver::gate_close() {
  // gate_ is read only once the gated stream is seen: it was written before that, once.
  if (!gate_stream_.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lk(closers_mu_);
  if (closers_++ == 0) {
    gate_->store(0);
    closed_at_ = uint64_t(mono_ns());
  }
  gate_grants_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void CudaDriver::gate_open() {
  std::lock_guard<std::mutex> lk(closers_mu_);
  if (--closers_ == 0) {
    gate_->store(1);
    gate_closed_ns_.fetch_add(uint64_t(mono_ns()) - closed_at_, std::memory_order_relaxed);
  }
}

}  // namespace offload

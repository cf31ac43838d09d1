// CudaDriver's copy gate (Residency::Options::copy_gate). An access grant (cuMemSetAccess) made
// while a copy to the host runs takes about 0.7 ms, and about 0.05 ms while none runs, even with
// copies queued behind a wait (docs/results.md, "The driver's calls while copies run"). So copies
// to the host on the gated stream are queued in chunks, each behind a wait until a word of host
// memory says the gate is open (cuStreamWaitValue32) and between two counts the stream writes (the
// chunk past the gate, the chunk ended). A grant closes the gate, waits until the last chunk past
// it has ended, for at most a bound, grants, and opens it again. The gate only delays copies: no
// byte or order changes, and a grant never waits past the bound.
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

namespace {
uint64_t now_ns() { return uint64_t(mono_ns()); }
// After the counts agree, they are read again this much later: the GPU may have read the gate
// open just before it closed, and its count of a chunk past it takes a trip over the link.
constexpr uint64_t kSettleNs = 3'000;
}  // namespace

bool CudaDriver::gate_copies_out(Stream s, uint64_t chunk) {
  if (!s || !chunk || gate_) return false;  // one gated stream a process
  const cu::ExecApi* a = exec_api();
  if (!a || !a->wait_value32 || !a->write_value32 || !a->host_register || !a->host_device_ptr) {
    log().info("OFFLOAD_CAP_GATE: the driver lacks stream memory operations; copies out are not gated");
    return false;
  }
  CtxScope scope(a, context());
  if (!scope) return false;
  uint64_t dptr = 0;
  void* page = device_page(&dptr);
  if (!page) return false;
  auto* w = new (page) GateWords{};
  w->open.store(1);
  gate_ = w;  // kept for the process's life: the stream may wait on it until the end
  gate_dev_ = dptr;
  gate_chunk_ = chunk;
  // A chunk takes chunk / ~55 GB/s on the link; the wait covers the chunk past the gate and one
  // the stream may have started behind it, at 10 GB/s, and at least 200 us.
  gate_drain_max_ns_ = std::max<uint64_t>(200'000, chunk / 10);
  gate_stream_.store(s, std::memory_order_release);
  log().info("copies out gated in chunks of {} KiB; a grant waits at most {} us for them", chunk >> 10,
             gate_drain_max_ns_ / 1000);
  return true;
}

Driver::GateCounts CudaDriver::gate_counts() {
  return {gate_grants_.load(std::memory_order_relaxed), gate_drain_ns_.load(std::memory_order_relaxed),
          gate_cut_.load(std::memory_order_relaxed)};
}

void CudaDriver::gate_off() {
  log().warn("a stream memory operation failed: copies out are no longer gated");
  gate_stream_.store(0, std::memory_order_release);
  gate_->open.store(1);  // for ever: chunks already queued behind the gate go on
}

bool CudaDriver::gated_copy_to_host(void* dst, DevPtr src, uint64_t bytes, Stream s) {
  const cu::ExecApi* a = exec_api();
  CtxScope scope(a, context());
  if (!scope) return false;
  nvtx::Range range(nvtx::Move::Evict, bytes);
  const CUstream cs = as_stream(s);
  auto at = [this](const std::atomic<uint32_t>& word) {
    return gate_dev_ + uint64_t(reinterpret_cast<const char*>(&word) - reinterpret_cast<const char*>(gate_));
  };
  auto* out = static_cast<unsigned char*>(dst);
  std::lock_guard<std::mutex> lk(gate_mu_);  // the chunks' numbers follow their order on the stream
  for (uint64_t off = 0; off < bytes; off += gate_chunk_) {
    const uint64_t n = std::min(gate_chunk_, bytes - off);
    const bool gated = gate_stream_.load(std::memory_order_acquire) == s;
    const uint32_t k = gate_seq_ + 1;
    if (gated && (!cu_ok(a->wait_value32(cs, at(gate_->open), 1, CU_STREAM_WAIT_VALUE_EQ), "cuStreamWaitValue32") ||
                  !cu_ok(a->write_value32(cs, at(gate_->passed), k, CU_STREAM_WRITE_VALUE_DEFAULT),
                         "cuStreamWriteValue32"))) {
      gate_off();
      return cu_ok(a->dtoh(out + off, src + off, bytes - off, cs), "cuMemcpyDtoHAsync_v2");
    }
    const bool copied = cu_ok(a->dtoh(out + off, src + off, n, cs), "cuMemcpyDtoHAsync_v2");
    if (gated) {
      gate_seq_ = k;  // counted ended even when refused: a grant must not wait for it
      if (!cu_ok(a->write_value32(cs, at(gate_->done), k, CU_STREAM_WRITE_VALUE_DEFAULT), "cuStreamWriteValue32"))
        gate_off();
    }
    if (!copied) return false;
  }
  return true;
}

bool CudaDriver::gate_close() {
  // gate_ is read only once the gated stream is seen: it was written before that, once.
  if (!gate_stream_.load(std::memory_order_acquire)) return false;
  {
    std::lock_guard<std::mutex> lk(closers_mu_);
    if (closers_++ == 0) gate_->open.store(0);
  }
  const uint64_t t0 = now_ns();
  uint64_t t = t0, agreed = 0;
  for (;;) {
    t = now_ns();
    if (gate_->done.load(std::memory_order_acquire) != gate_->passed.load(std::memory_order_acquire)) {
      agreed = 0;
    } else if (!agreed) {
      agreed = t;
    } else if (t - agreed >= kSettleNs) {
      break;
    }
    if (t - t0 > gate_drain_max_ns_) {
      gate_cut_.fetch_add(1, std::memory_order_relaxed);
      break;
    }
  }
  gate_drain_ns_.fetch_add(t - t0, std::memory_order_relaxed);
  gate_grants_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void CudaDriver::gate_open() {
  std::lock_guard<std::mutex> lk(closers_mu_);
  if (--closers_ == 0) gate_->open.store(1);
}

}  // namespace offload

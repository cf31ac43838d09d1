// GateChunks: the size of each chunk a copy out is queued in behind the copy gate
// (Residency::Options::copy_gate, preload/cuda_gate.cpp).
//
// Chunks have the gate's size while about `ahead` of them are queued ahead of the link; past
// that, each takes an `ahead`-th of the bytes queued ahead, so that the stream's operations grow
// with the logarithm of what is queued, not with its bytes. The driver blocks the host once a
// stream holds too many operations: 4 MiB chunks throughout took 810-870 ms a step to queue on
// a Llama and the reference, which queue seconds of copies ahead (docs/results.md). What is
// ahead is estimated from the bytes queued at kBytesPerNs, not asked of the GPU.
#pragma once

#include <algorithm>
#include <cstdint>

namespace offload {

class GateChunks {
 public:
  // About this many chunks of the gate's size ahead of the link by default (OFFLOAD_CAP_GATE_AHEAD).
  // On an H100 queueing a gated 4 MiB chunk took 3.5 us with 16 or 64 ahead and 83 us, a chunk's
  // time on the link, with 256 or more: the driver then blocks the host (docs/results.md).
  static constexpr uint32_t kAhead = 32;
  // The link's rate for the estimate, in bytes a ns (40 GB/s: a little below what copies out
  // reach, so that the estimate errs long and the chunks large).
  static constexpr uint64_t kBytesPerNs = 40;

  explicit GateChunks(uint64_t chunk, uint32_t ahead = kAhead) : chunk_(chunk ? chunk : 1), ahead_(ahead ? ahead : 1) {}

  // The next chunk of a copy with `left` bytes still to queue, at `now_ns`; counted as queued.
  uint64_t next(uint64_t now_ns, uint64_t left) {
    until_ = std::max(until_, now_ns);
    const uint64_t ahead = (until_ - now_ns) * kBytesPerNs;
    const uint64_t share = (ahead / ahead_ + chunk_ - 1) / chunk_ * chunk_;
    const uint64_t n = std::min(std::max(chunk_, share), left);
    until_ += n / kBytesPerNs;
    return n;
  }

 private:
  uint64_t chunk_;
  uint64_t ahead_;
  uint64_t until_ = 0;  // when the chunks queued would end
};

}  // namespace offload

// GpuHash: core/range_hash.h's hash of device memory, taken by a kernel of the shim's own in
// stream order (gpu/range_hash.cu, carried as PTX). Recompute's probes hash every range a launch
// touches before and after it; copying those bytes to the host instead cost seconds in a step.
#pragma once

#include <cstdint>
#include <mutex>

namespace offload::gpu {

class GpuHash {
 public:
  static constexpr unsigned kBlocks = 1024;   // the kernel's grid: each block writes one part
  static constexpr unsigned kThreads = 256;   // its block (range_hash.cu's reduction assumes it)
  static constexpr int64_t kTickets = 512;    // parts kept: a ticket is reused after that many

  // Enqueues the hash of [va, va + bytes) on `stream` (a CUstream) in context `ctx`, current on
  // the calling thread. A ticket, whose value() is the hash once the stream has passed this
  // point; -1 when it cannot (libcuda lacks an entry point, the module does not load, another
  // context than the first).
  int64_t start(void* ctx, uint64_t va, uint64_t bytes, void* stream);
  uint64_t value(int64_t ticket) const;

 private:
  bool load_locked(void* ctx);
  std::mutex mu_;
  int state_ = 0;  // 0: not tried, 1: loaded, -1: failed (not tried again)
  void* ctx_ = nullptr;
  void* fn_ = nullptr;            // CUfunction
  uint64_t* parts_ = nullptr;     // kTickets x kBlocks, pinned and mapped for the device
  uint64_t dev_parts_ = 0;        // the same, as the device addresses it
  int64_t next_ = 0;
  using Launch = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                         void**, void**);
  Launch launch_ = nullptr;
};

}  // namespace offload::gpu

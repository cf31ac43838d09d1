// CuptiTelemetry: per-launch GPU time from the CUPTI activity API, inside the process.
//
// libcupti is loaded at run time (never linked). Each launch through our hooks pushes its
// sequence number as a CUPTI external correlation id, so every kernel, memcpy and memset
// record joins back to the launch that made it; records without one come from launches
// we did not see, which is how visibility is checked against ground truth.
//
// CUPTI allows one owner of the activity buffers. If another client (torch.profiler's
// Kineto) takes them over, our records stop; we notice, say so once, and report the
// state instead of numbers.
//
// Threading: push/pop from any launching thread; start/collect from the worker only.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <map>
#include <vector>

#include "core/telemetry.h"

namespace offload {

class CuptiTelemetry final : public Telemetry {
 public:
  // `lib_hint`: explicit libcupti path ("" to search). `launches`: the tracker's kernel
  // counter, used to tell "no work" from "no records".
  CuptiTelemetry(std::string lib_hint, const std::atomic<uint64_t>& launches);
  ~CuptiTelemetry() override;

  bool start();  // loads CUPTI and enables activity records; false: see state()
  bool active() const { return active_.load(std::memory_order_acquire); }
  void push(uint64_t seq);
  void pop();

  void collect(std::vector<GpuRecord>* out) override;
  std::string state() const override;
  // Record counts, for telling "no records" from "records we could not join".
  std::string counters_json() const;

 private:
  struct Raw {
    GpuRecord r;
    uint32_t waited = 0;
  };
  void on_buffer(uint8_t* buf, size_t valid);
  static void request_cb(uint8_t** buf, size_t* size, size_t* max_records);
  static void complete_cb(void* ctx, uint32_t stream, uint8_t* buf, size_t size, size_t valid);

  std::string lib_hint_;
  const std::atomic<uint64_t>& launches_;
  std::atomic<bool> active_{false};
  mutable std::mutex mu_;
  std::string state_ = "not started";
  std::vector<Raw> raw_;                              // under mu_
  std::map<uint64_t, uint64_t> ext_;                  // corr -> seq, under mu_
  uint64_t max_joined_ = 0;                           // under mu_
  uint64_t buffers_ = 0;                              // completed buffers, under mu_
  uint64_t n_kernel_ = 0, n_copy_ = 0, n_memset_ = 0, n_ext_ = 0, n_joined_ = 0, n_unjoined_ = 0;  // under mu_
  uint64_t last_buffers_ = 0, last_launches_ = 0;
  int silent_collects_ = 0;
  bool taken_over_ = false;

  // Resolved CUPTI entry points.
  void* lib_ = nullptr;
  int (*flush_all_)(uint32_t) = nullptr;
  int (*get_next_)(uint8_t*, size_t, void**) = nullptr;
  int (*push_)(int, uint64_t) = nullptr;
  int (*pop_)(int, uint64_t*) = nullptr;
};

}  // namespace offload

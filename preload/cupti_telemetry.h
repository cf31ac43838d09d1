// CuptiTelemetry: per-launch GPU time from the CUPTI activity API, inside the process.
//
// libcupti is loaded at run time (never linked). Kernel records carry the driver's
// correlation id and the kernel's name; the StepAssembler aligns them with our launches
// (core/telemetry.h says why not CUPTI's external ids), so a record left over is a launch
// we did not see: visibility is checked against ground truth. Nothing is added to the
// launch path.
//
// CUPTI allows one owner of the activity buffers. If another client (torch.profiler's
// Kineto) takes them over, our records stop; we notice, say so once, and report the
// state instead of numbers.
//
// Threading: start/collect from the worker only; CUPTI calls the buffer callbacks from
// its own thread or from within collect().
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
  // Records are flowing to us: started, and no other client has taken the buffers.
  bool flowing() const {
    return active() && !taken_over_.load(std::memory_order_relaxed) && !paused_.load(std::memory_order_relaxed);
  }
  // OFFLOAD_TELEMETRY=sampled: our activity kinds off and on again (records stop and resume;
  // the runtime times steps with events meanwhile). False: not started, yielded, or already so.
  bool pause();
  bool resume();
  bool paused() const { return paused_.load(std::memory_order_relaxed); }
  // Another CUPTI client registers for activity records (our interposed
  // cuptiActivityRegisterCallbacks saw it): turn ours off so that it works as if alone.
  void yield_to_other_client();
  // From the interposed cuptiActivityRegisterCallbacks: marks that another client exists
  // (so ours never starts) and makes the live telemetry, if any, step aside.
  static void note_other_client();
  bool yielded() const { return yielded_.load(); }
  // Now, on the time base of the activity records (cuptiGetTimestamp); null until started.
  uint64_t (*clock() const)();
  static bool is_our_callback(const void* request_fn);

  void collect(std::vector<GpuRecord>* out, bool force) override;
  std::string state() const override;
  // Record counts, for telling "no records" from "records we could not join".
  std::string counters_json() const;
  // CUPTI's id for a stream (what its records and torch.profiler's trace call "stream"); -1
  // when no CUPTI is loaded or it does not know the stream.
  int64_t stream_id(uint64_t stream) const;

 private:
  void on_buffer(uint8_t* buf, size_t valid);
  static void request_cb(uint8_t** buf, size_t* size, size_t* max_records);
  static void complete_cb(void* ctx, uint32_t stream, uint8_t* buf, size_t size, size_t valid);

  std::string lib_hint_;
  const std::atomic<uint64_t>& launches_;
  std::atomic<bool> active_{false};
  mutable std::mutex mu_;
  std::string state_ = "not started";
  std::vector<GpuRecord> raw_;                        // under mu_
  uint64_t buffers_ = 0;                              // completed buffers, under mu_
  uint64_t n_kernel_ = 0, n_copy_ = 0, n_memset_ = 0;  // under mu_
  uint64_t last_buffers_ = 0, last_launches_ = 0;
  int silent_collects_ = 0;
  std::atomic<bool> taken_over_{false};
  std::atomic<bool> yielded_{false};
  std::atomic<bool> paused_{false};
  std::mutex switch_mu_;  // our kinds switched off or on by one thread at a time

  // Resolved CUPTI entry points.
  void* lib_ = nullptr;
  int (*flush_all_)(uint32_t) = nullptr;
  int (*get_next_)(uint8_t*, size_t, void**) = nullptr;
  int (*disable_)(int) = nullptr;
  int (*enable_)(int) = nullptr;
};

}  // namespace offload

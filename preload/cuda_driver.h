// CudaDriver: the Driver seam bound to the real CUDA driver. Entry points are resolved
// from libcuda.so.1 at run time (never linked) through the hook table's real dlsym.
#pragma once

#include <atomic>
#include <mutex>
#include <vector>

#include "core/driver.h"
#include "core/gate_chunks.h"
#include "gpu/gpu_hash.h"

namespace offload {

class CudaDriver final : public Driver {
 public:
  CudaDriver();
  int param_layout(Func f, ParamInfo* out, int cap) override;
  const char* func_name(Func f) override;
  uint64_t record_marker(Stream s) override;
  int64_t marker_elapsed_ns(uint64_t from, uint64_t to) override;
  void release_marker(uint64_t m) override;
  bool pin_host(void* p, uint64_t bytes) override;

  // What the executor moves bytes with (second half of cuda_driver.cpp).
  uint64_t vmm_granularity() override;
  uint64_t device_total_bytes() override;
  std::string gpu_id() override;
  // Takes the calling thread's current context as ours if none is known yet (the first
  // launch, or an allocation before any launch, tells it).
  void learn_context();
  uint64_t pool_reserved_high() override;
  uint64_t pool_reserved_current() override;
  bool pool_trim(uint64_t keep) override;
  uint64_t device_used_bytes() override;
  bool synchronize() override;
  int stream_query(Stream s) override;
  int stream_capturing(Stream s) override;
  uint64_t current_context() override;
  // The device of the first context seen (-1 until one is known); cached, as are its fixed
  // properties.
  int device();
  DevPtr reserve(uint64_t bytes) override;
  void unreserve(DevPtr va, uint64_t bytes) override;
  uint64_t create_physical(uint64_t bytes) override;
  void release_physical(uint64_t handle) override;
  bool map(DevPtr va, uint64_t bytes, uint64_t handle) override;
  bool map_run(DevPtr va, const uint64_t* handles, const uint64_t* sizes, size_t n) override;
  bool unmap(DevPtr va, uint64_t bytes) override;
  // Grants apart (cuda_grants.cpp): the word lives in registered host memory the GPU reads, made
  // on the first call; nullptr where the device cannot wait on 64-bit values.
  bool map_run_ungranted(DevPtr va, const uint64_t* handles, const uint64_t* sizes, size_t n) override;
  bool grant(DevPtr va, uint64_t bytes) override;
  std::atomic<uint64_t>* grant_word() override;
  bool stream_wait_word(Stream s, uint64_t value) override;
  // The copy gate (cuda_gate.cpp): one word in registered host memory, made on the first call.
  bool gate_copies_out(Stream s, uint64_t chunk, uint32_t ahead) override;
  GateCounts gate_counts() override;
  Stream create_stream() override;
  // The streams create_stream made (the shim's own copies run on them), at most kStreamsKept.
  std::vector<Stream> created_streams() const;
  static constexpr size_t kStreamsKept = 16;
  uint64_t create_event() override;
  void destroy_event(uint64_t e) override;
  bool record_event(uint64_t e, Stream s) override;
  bool stream_wait(Stream s, uint64_t e) override;
  int event_query(uint64_t e) override;
  bool event_sync(uint64_t e) override;
  bool copy_to_host(void* dst, DevPtr src, uint64_t bytes, Stream s) override;
  bool copy_to_device(DevPtr dst, const void* src, uint64_t bytes, Stream s) override;
  bool launch_kernel(Func f, const LaunchGeom& g, Stream s, void** params, void** extra = nullptr) override;
  int64_t hash_start(DevPtr va, uint64_t bytes, Stream s) override;
  uint64_t hash_value(int64_t ticket) override;
  bool device_copies() override;
  bool copy_device(DevPtr dst, DevPtr src, uint64_t bytes, Stream s) override;
  bool zero_device(DevPtr dst, uint64_t bytes, Stream s) override;

 private:
  gpu::GpuHash hash_;
  std::atomic<Stream> created_[kStreamsKept] = {};
  std::atomic<size_t> n_created_{0};
  bool ready();
  using GetParamInfo = int (*)(uint64_t, size_t, size_t*, size_t*);
  using GetName = int (*)(const char**, uint64_t);
  GetParamInfo func_param_info_ = nullptr, kernel_param_info_ = nullptr;
  GetName func_get_name_ = nullptr, kernel_get_name_ = nullptr;
  bool resolved_ = false;

  // Event entry points, resolved once (std::call_once) on the first marker.
  struct EventApi {
    int (*create)(void**, unsigned) = nullptr;
    int (*record)(void*, void*) = nullptr;
    int (*query)(void*) = nullptr;
    int (*elapsed)(float*, void*, void*) = nullptr;
    int (*destroy)(void*) = nullptr;
    int (*get_ctx)(void**) = nullptr;
    int (*push_ctx)(void*) = nullptr;
    int (*pop_ctx)(void**) = nullptr;
    int (*host_register)(void*, size_t, unsigned) = nullptr;
  };
  const EventApi* events();
  std::atomic<void*> ctx_{nullptr};  // the context of the first kernel we learned about
  void* context() const { return ctx_.load(std::memory_order_relaxed); }

  std::atomic<int> device_{-1};
  std::once_flag word_once_;
  std::atomic<uint64_t>* word_ = nullptr;  // grant_word(): host memory, registered
  uint64_t word_dev_ = 0;                  // its address as the GPU sees it
  std::atomic<uint64_t> granularity_{0}, total_bytes_{0};

  // Around a grant: close the gate (false: no gate); then, only where it closed, open it again.
  bool gate_close();
  void gate_open();
  bool gated_copy_to_host(void* dst, DevPtr src, uint64_t bytes, Stream s);
  // A zeroed page of host memory registered for the GPU to read and write (its address there in
  // `dev`), kept for the process's life; nullptr on failure. In a context's scope.
  void* device_page(uint64_t* dev);
  void gate_off();  // a stream operation failed: copies go ungated, the gate stays open
  std::atomic<uint32_t>* gate_ = nullptr;  // 1 while copies may start, 0 while a grant is made
  uint64_t gate_dev_ = 0;                   // gate_'s address as the GPU sees it
  std::atomic<Stream> gate_stream_{0};      // the gated stream; 0: none (off)
  std::mutex closers_mu_;
  int closers_ = 0;                         // grants under way: the last one out opens the gate
  uint64_t closed_at_ = 0;                  // under closers_mu_
  std::mutex gate_mu_;
  GateChunks gate_chunks_size_{0};          // under gate_mu_
  std::atomic<uint64_t> gate_grants_{0}, gate_closed_ns_{0}, gate_chunks_{0};
};

}  // namespace offload

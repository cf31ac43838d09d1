// SimDriver: a Driver without a GPU, for tests and for `offloadctl replay`.
//
// Kernels are registered with a name and a parameter layout; "device memory" is host
// memory from mmap, so a device address is a real address and scanning a launch's
// arguments behaves exactly as on the GPU.
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/driver.h"

namespace offload {

class SimDriver final : public Driver {
 public:
  ~SimDriver() override;

  Func add_kernel(std::string name, std::vector<ParamInfo> params);
  // Registers a kernel the driver cannot describe (param_layout returns -1).
  Func add_opaque_kernel(std::string name);

  DevPtr alloc(size_t bytes);
  void free(DevPtr p);

  int param_layout(Func f, ParamInfo* out, int cap) override;
  const char* func_name(Func f) override;
  // Markers read a simulated GPU clock that tests advance; a marker is "reached" once the
  // clock has been advanced past the moment it was recorded (reach_markers()).
  uint64_t record_marker(Stream s) override;
  int64_t marker_elapsed_ns(uint64_t from, uint64_t to) override;
  void release_marker(uint64_t m) override;
  bool pin_host(void* p, uint64_t bytes) override;
  std::vector<std::pair<void*, uint64_t>> pinned() const;
  void advance_clock(int64_t ns);
  void reach_markers();
  size_t live_markers() const;

  size_t param_queries() const { return param_queries_; }

 private:
  struct Kernel {
    std::string name;
    std::vector<ParamInfo> params;
    bool opaque = false;
  };
  mutable std::mutex mu_;
  std::vector<Kernel*> kernels_;                 // Func = index + 1, times 16
  std::unordered_map<DevPtr, size_t> mappings_;  // base -> bytes
  size_t param_queries_ = 0;
  struct Marker {
    int64_t at;
    bool reached;
  };
  int64_t clock_ns_ = 0;
  std::vector<std::pair<void*, uint64_t>> pinned_;
  uint64_t next_marker_ = 1;
  std::unordered_map<uint64_t, Marker> markers_;
};

}  // namespace offload

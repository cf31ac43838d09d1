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

  size_t param_queries() const { return param_queries_; }

 private:
  struct Kernel {
    std::string name;
    std::vector<ParamInfo> params;
    bool opaque = false;
  };
  std::mutex mu_;
  std::vector<Kernel*> kernels_;                 // Func = index + 1, times 16
  std::unordered_map<DevPtr, size_t> mappings_;  // base -> bytes
  size_t param_queries_ = 0;
};

}  // namespace offload

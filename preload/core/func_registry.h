// FuncRegistry: what we know about each kernel handle, learned once per handle.
//
// The launch hook needs a kernel's parameter layout on every launch; asking the driver
// each time would cost more than the launch. The first launch of a handle asks the Driver
// (under a mutex, the slow path) and publishes the answer; every later lookup is a few
// lock-free loads. Storage is preallocated: the hot path never allocates.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/driver.h"

namespace offload {

struct FuncInfo {
  uint32_t id;              // dense, in order of first launch
  int32_t nparams;          // -1: layout unknown
  const ParamInfo* params;  // nparams entries
};

class FuncRegistry {
 public:
  explicit FuncRegistry(Driver& driver, size_t capacity = 1 << 16,
                        size_t param_capacity = 1 << 20);

  // Info for `f`, learning it on first sight (then *learned is set, if given). nullptr only
  // when the registry is full.
  const FuncInfo* get(Func f, bool* learned = nullptr);

  // Name of function id `id` ("?" if the driver gave none). Off the hot path.
  std::string name(uint32_t id) const;
  size_t count() const;

 private:
  struct Slot {
    std::atomic<Func> key{0};
    FuncInfo info{};
  };
  const FuncInfo* learn(Func f, size_t slot, bool* learned);

  Driver& driver_;
  std::unique_ptr<Slot[]> slots_;
  size_t mask_;
  std::unique_ptr<ParamInfo[]> params_;
  size_t param_capacity_;
  size_t params_used_ = 0;  // under mu_
  mutable std::mutex mu_;
  std::vector<std::string> names_;  // by id, under mu_
};

}  // namespace offload

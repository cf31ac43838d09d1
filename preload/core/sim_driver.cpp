#include "core/sim_driver.h"

#include <sys/mman.h>

#include <algorithm>
#include <new>

namespace offload {

SimDriver::~SimDriver() {
  for (auto& [base, bytes] : mappings_) munmap(reinterpret_cast<void*>(base), bytes);
  for (Kernel* k : kernels_) delete k;
}

Func SimDriver::add_kernel(std::string name, std::vector<ParamInfo> params) {
  std::lock_guard lock(mu_);
  kernels_.push_back(new Kernel{std::move(name), std::move(params), false});
  return static_cast<Func>(kernels_.size()) * 16;
}

Func SimDriver::add_opaque_kernel(std::string name) {
  std::lock_guard lock(mu_);
  kernels_.push_back(new Kernel{std::move(name), {}, true});
  return static_cast<Func>(kernels_.size()) * 16;
}

DevPtr SimDriver::alloc(size_t bytes) {
  size_t len = std::max<size_t>(bytes, 1);
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  std::lock_guard lock(mu_);
  mappings_[reinterpret_cast<DevPtr>(p)] = len;
  return reinterpret_cast<DevPtr>(p);
}

void SimDriver::free(DevPtr p) {
  std::lock_guard lock(mu_);
  auto it = mappings_.find(p);
  if (it == mappings_.end()) return;
  munmap(reinterpret_cast<void*>(p), it->second);
  mappings_.erase(it);
}

int SimDriver::param_layout(Func f, ParamInfo* out, int cap) {
  std::lock_guard lock(mu_);
  ++param_queries_;
  size_t i = f / 16;
  if (f % 16 || i == 0 || i > kernels_.size() || kernels_[i - 1]->opaque) return -1;
  const auto& ps = kernels_[i - 1]->params;
  for (size_t k = 0; k < ps.size() && static_cast<int>(k) < cap; ++k) out[k] = ps[k];
  return static_cast<int>(ps.size());
}

const char* SimDriver::func_name(Func f) {
  std::lock_guard lock(mu_);
  size_t i = f / 16;
  if (f % 16 || i == 0 || i > kernels_.size()) return nullptr;
  return kernels_[i - 1]->name.c_str();
}

}  // namespace offload

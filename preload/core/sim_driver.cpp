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

uint64_t SimDriver::record_marker(Stream) {
  std::lock_guard lock(mu_);
  uint64_t id = next_marker_++;
  markers_[id] = Marker{clock_ns_, false};
  return id;
}

int64_t SimDriver::marker_elapsed_ns(uint64_t from, uint64_t to) {
  std::lock_guard lock(mu_);
  auto a = markers_.find(from), b = markers_.find(to);
  if (a == markers_.end() || b == markers_.end() || !a->second.reached || !b->second.reached) return -1;
  return b->second.at - a->second.at;
}

void SimDriver::release_marker(uint64_t m) {
  std::lock_guard lock(mu_);
  markers_.erase(m);
}

bool SimDriver::pin_host(void* p, uint64_t bytes) {
  std::lock_guard lock(mu_);
  pinned_.emplace_back(p, bytes);
  return true;
}

std::vector<std::pair<void*, uint64_t>> SimDriver::pinned() const {
  std::lock_guard lock(mu_);
  return pinned_;
}

void SimDriver::advance_clock(int64_t ns) {
  std::lock_guard lock(mu_);
  clock_ns_ += ns;
}

void SimDriver::reach_markers() {
  std::lock_guard lock(mu_);
  for (auto& [id, m] : markers_) m.reached = true;
}

size_t SimDriver::live_markers() const {
  std::lock_guard lock(mu_);
  return markers_.size();
}

}  // namespace offload

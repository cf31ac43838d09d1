#include "core/func_registry.h"

#include <algorithm>

namespace offload {
namespace {
size_t hash(Func f) { return static_cast<size_t>((f >> 4) * 0x9E3779B97F4A7C15ull >> 16); }
size_t round_pow2(size_t n) {
  size_t p = 1;
  while (p < n) p <<= 1;
  return p;
}
constexpr int kMaxParams = 1024;
}  // namespace

FuncRegistry::FuncRegistry(Driver& driver, size_t capacity, size_t param_capacity)
    : driver_(driver),
      slots_(new Slot[round_pow2(capacity)]),
      mask_(round_pow2(capacity) - 1),
      params_(new ParamInfo[param_capacity]),
      param_capacity_(param_capacity) {
  names_.reserve(1024);
}

const FuncInfo* FuncRegistry::get(Func f, bool* learned) {
  for (size_t i = hash(f), n = 0; n <= mask_; ++i, ++n) {
    Slot& s = slots_[i & mask_];
    Func k = s.key.load(std::memory_order_acquire);
    if (k == f) return &s.info;
    if (k == 0) return learn(f, i & mask_, learned);
  }
  return nullptr;
}

const FuncInfo* FuncRegistry::learn(Func f, size_t slot, bool* learned) {
  std::lock_guard lock(mu_);
  // Another thread may have claimed this or a later slot meanwhile: probe again.
  for (size_t i = slot, n = 0; n <= mask_; ++i, ++n) {
    Slot& s = slots_[i & mask_];
    Func k = s.key.load(std::memory_order_acquire);
    if (k == f) return &s.info;
    if (k != 0) continue;
    ParamInfo* dst = params_.get() + params_used_;
    int cap = static_cast<int>(std::min<size_t>(kMaxParams, param_capacity_ - params_used_));
    int n_params = driver_.param_layout(f, dst, cap);
    if (n_params > cap) n_params = -1;  // out of room: treat the layout as unknown
    if (n_params > 0) params_used_ += static_cast<size_t>(n_params);
    const char* nm = driver_.func_name(f);
    s.info = FuncInfo{static_cast<uint32_t>(names_.size()), n_params, dst};
    names_.emplace_back(nm ? nm : "?");
    s.key.store(f, std::memory_order_release);
    if (learned) *learned = true;
    return &s.info;
  }
  return nullptr;
}

std::string FuncRegistry::name(uint32_t id) const {
  std::lock_guard lock(mu_);
  return id < names_.size() ? names_[id] : std::string("?");
}

size_t FuncRegistry::count() const {
  std::lock_guard lock(mu_);
  return names_.size();
}

}  // namespace offload

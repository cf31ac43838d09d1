// SimDriver's kernels: registered, described, launched (again), and recorded into graphs; and its
// device-to-device copies.
#include <algorithm>
#include <cstring>
#include <memory>

#include "core/range_hash.h"
#include "core/sim_driver.h"

namespace offload {

Func SimDriver::add_kernel(std::string name, std::vector<ParamInfo> params) {
  return add_kernel(std::move(name), std::move(params), Body{});
}

Func SimDriver::add_kernel(std::string name, std::vector<ParamInfo> params, Body body) {
  std::lock_guard lock(mu_);
  kernels_.push_back(new Kernel{std::move(name), std::move(params), false, std::move(body)});
  return static_cast<Func>(kernels_.size()) * 16;
}

Func SimDriver::add_opaque_kernel(std::string name) {
  std::lock_guard lock(mu_);
  kernels_.push_back(new Kernel{std::move(name), {}, true, {}});
  return static_cast<Func>(kernels_.size()) * 16;
}

const SimDriver::Kernel* SimDriver::kernel_locked(Func f) const {
  const size_t i = f / 16;
  return f % 16 || i == 0 || i > kernels_.size() ? nullptr : kernels_[i - 1];
}

int SimDriver::param_layout(Func f, ParamInfo* out, int cap) {
  std::lock_guard lock(mu_);
  ++param_queries_;
  const Kernel* k = kernel_locked(f);
  if (!k || k->opaque) return -1;
  for (size_t i = 0; i < k->params.size() && static_cast<int>(i) < cap; ++i) out[i] = k->params[i];
  return static_cast<int>(k->params.size());
}

const char* SimDriver::func_name(Func f) {
  std::lock_guard lock(mu_);
  const Kernel* k = kernel_locked(f);
  return k ? k->name.c_str() : nullptr;
}

bool SimDriver::launch_kernel(Func f, const LaunchGeom& g, Stream s, void** params, void** extra) {
  std::lock_guard lock(mu_);
  const auto* attrs = static_cast<const unsigned char*>(g.attrs);
  last_attrs_.assign(attrs, attrs ? attrs + g.attr_bytes : attrs);
  const Kernel* k = kernel_locked(f);
  if (!k || !k->body || !params == !extra) return false;
  size_t len = 0;
  for (const ParamInfo& p : k->params) len = std::max<size_t>(len, p.offset + p.size);
  auto args = std::make_shared<std::vector<unsigned char>>(len);
  if (extra) {  // the arguments packed as the layout lays them out, as CUDA takes them
    ExtraBuffer x;
    if (!read_extra(extra, &x) || !x.only || x.len < len) return false;
    std::memcpy(args->data(), x.buf, len);
  } else {
    for (size_t i = 0; i < k->params.size(); ++i)
      std::memcpy(args->data() + k->params[i].offset, params[i], k->params[i].size);
  }
  ++kernel_launches_;
  enqueue(s, Op{Op::kKernel, [body = k->body, args] { body(args->data()); }, {}, 0});
  return true;
}

int64_t SimDriver::hash_start(DevPtr va, uint64_t bytes, Stream s) {
  if (!hashing_) return -1;
  std::lock_guard lock(mu_);
  const int64_t t = int64_t(hashes_++);
  uint64_t* out = &hash_ring_[t % kHashTickets];
  // Reads the range where it lies when the GPU gets there (an unmapped one faults, on purpose).
  enqueue(s, Op{Op::kKernel, [out, va, bytes] { *out = range_hash::of(reinterpret_cast<const unsigned char*>(va), bytes); },
                {}, 0});
  return t;
}

uint64_t SimDriver::hash_value(int64_t ticket) {
  std::lock_guard lock(mu_);
  return hash_ring_[ticket % kHashTickets];
}

bool SimDriver::copy_device(DevPtr dst, DevPtr src, uint64_t bytes, Stream s) {
  if (!device_copies_ || (bytes && (!dst || !src))) return false;
  std::lock_guard lock(mu_);
  ++device_copies_made_;
  // Read and written where they lie when the GPU gets there (an unmapped one faults, on purpose).
  enqueue(s, Op{Op::kKernel, [dst, src, bytes] { std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes); },
                {}, 0});
  return true;
}

bool SimDriver::zero_device(DevPtr dst, uint64_t bytes, Stream s) {
  if (!device_copies_ || (bytes && !dst)) return false;
  std::lock_guard lock(mu_);
  ++device_copies_made_;
  enqueue(s, Op{Op::kKernel, [dst, bytes] { std::memset(reinterpret_cast<void*>(dst), 0, bytes); }, {}, 0});
  return true;
}

void SimDriver::launch(Stream s, std::function<void()> body) {
  std::lock_guard lock(mu_);
  enqueue(s, Op{Op::kKernel, std::move(body), {}, 0});
}

int SimDriver::stream_capturing(Stream s) {
  std::lock_guard lock(mu_);
  return capture_.count(s) || std::find(capturing_.begin(), capturing_.end(), s) != capturing_.end() ? 1 : 0;
}

void SimDriver::begin_capture(Stream s) {
  std::lock_guard lock(mu_);
  if (capture_.count(s)) ++stats_.misuses;
  capture_[s];
}

uint64_t SimDriver::end_capture(Stream s) {
  std::lock_guard lock(mu_);
  auto it = capture_.find(s);
  if (it == capture_.end()) {
    ++stats_.misuses;
    return 0;
  }
  graphs_.push_back(std::move(it->second));
  capture_.erase(it);
  return graphs_.size();
}

void SimDriver::launch_graph(Stream s, uint64_t graph) {
  std::lock_guard lock(mu_);
  if (graph == 0 || graph > graphs_.size()) {
    ++stats_.misuses;
    return;
  }
  std::vector<std::function<void()>> work = graphs_[graph - 1];
  enqueue(s, Op{Op::kKernel, [work] {
                  for (const auto& w : work) w();
                }, {}, 0});
}

size_t SimDriver::captured_ops() const {
  std::lock_guard lock(mu_);
  return captured_ops_;
}

void SimDriver::set_capturing(Stream s, bool on) {
  std::lock_guard lock(mu_);
  auto it = std::find(capturing_.begin(), capturing_.end(), s);
  if (on && it == capturing_.end()) capturing_.push_back(s);
  if (!on && it != capturing_.end()) capturing_.erase(it);
}

}  // namespace offload

// SimDriver's grants made apart from their mappings (Residency::Options::grant_apart): mappings
// not granted yet fault on any access and refuse copies, grants made from any thread, and streams
// that wait on the grant word; and the copy gate's chunks and gated grants, counted.
#include <sys/mman.h>

#include <chrono>
#include <thread>

#include "core/sim_driver.h"

namespace offload {

bool SimDriver::map_run_ungranted(DevPtr va, const uint64_t* handles, const uint64_t* sizes, size_t n) {
  if (on_map_run) on_map_run(sizes, n);
  uint64_t off = 0;
  for (size_t i = 0; i < n; off += sizes[i++]) {
    if (const uint64_t ns = map_delay_ns_.load(std::memory_order_relaxed))
      std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
    std::lock_guard lock(mu_);
    if (map_locked(va + off, sizes[i], handles[i], false)) continue;
    for (size_t j = 0, o = 0; j < i; o += sizes[j++]) unmap(va + o, sizes[j]);  // mu_ is taken again there
    return false;
  }
  return true;
}

bool SimDriver::gate_copies_out(Stream s, uint64_t chunk, uint32_t) {  // chunks of one size here
  if (!s || !chunk || gate_chunk_.load()) return false;
  gate_stream_.store(s);
  gate_chunk_.store(chunk);
  return true;
}

bool SimDriver::grant(DevPtr va, uint64_t bytes) {
  if (gate_chunk_.load()) gate_grants_.fetch_add(1);
  {
    std::unique_lock hold(grant_hold_mu_);
    grant_hold_cv_.wait(hold, [this] { return !grants_held_; });
  }
  std::lock_guard lock(mu_);
  // Every byte of [va, va + bytes) mapped ungranted or granted already, as cuMemSetAccess needs.
  DevPtr at = va;
  for (auto m = mapped_.find(va); m != mapped_.end() && m->first == at && at < va + bytes; ++m) at += m->second.bytes;
  if (at != va + bytes) {
    ++stats_.misuses;
    return false;
  }
  for (auto m = mapped_.find(va); m != mapped_.end() && m->first < va + bytes; ++m) {
    if (m->second.granted) continue;
    if (mprotect(reinterpret_cast<void*>(m->first), m->second.bytes, PROT_READ | PROT_WRITE) != 0) return false;
    m->second.granted = true;
  }
  return true;
}

void SimDriver::hold_grants(bool on) {
  {
    std::lock_guard hold(grant_hold_mu_);
    grants_held_ = on;
  }
  grant_hold_cv_.notify_all();
}

bool SimDriver::stream_wait_word(Stream s, uint64_t value) {
  std::lock_guard lock(mu_);
  enqueue(s, Op{Op::kWaitWord, {}, {}, value, 0, 0});
  return true;
}

bool SimDriver::word_waits_locked() const {
  for (const auto& [s, q] : queues_)
    if (!q.running && !q.ops.empty() && q.ops.front().kind == Op::kWaitWord) return true;
  return false;
}

bool SimDriver::ungranted_locked(DevPtr va, uint64_t bytes) {
  auto m = mapped_.upper_bound(va);
  if (m != mapped_.begin()) --m;
  for (; m != mapped_.end() && m->first < va + bytes; ++m)
    if (m->first + m->second.bytes > va && !m->second.granted) {
      ++stats_.misuses;
      return true;
    }
  return false;
}

}  // namespace offload

#include "core/block_cache.h"

#include <algorithm>

namespace offload {

DevPtr BlockCache::take(uint64_t bytes, uint64_t ctx, Stream s, int capturing) {
  if (!enabled() || capturing != 0 || s == kPerThreadStream || ctx == 0) return 0;
  std::lock_guard lock(mu_);
  auto it = kept_.find(Key{ctx, s, bytes});
  if (it == kept_.end() || it->second.empty()) {
    ++st_.misses;
    return 0;
  }
  DevPtr p = it->second.back();
  it->second.pop_back();
  st_.kept_bytes -= bytes;
  ++st_.hits;
  return p;
}

void BlockCache::note_forwarded(DevPtr p, Stream, int capturing) {
  if (!enabled() || capturing == 0) return;
  std::lock_guard lock(mu_);
  captured_.insert(p);
  captured_n_.store(captured_.size(), std::memory_order_relaxed);
  ++st_.captured;
}

bool BlockCache::keep(DevPtr p, uint64_t bytes, uint64_t ctx, Stream s, int capturing) {
  if (!enabled() && captured_n_.load(std::memory_order_relaxed) == 0) return false;
  std::lock_guard lock(mu_);
  const bool captured = captured_.erase(p) != 0;
  if (captured) captured_n_.store(captured_.size(), std::memory_order_relaxed);
  if (captured || s == kPerThreadStream || ctx == 0 || capturing != 0 || bytes == 0 || st_.kept_bytes + bytes > max_.load(std::memory_order_relaxed)) {
    ++st_.forwarded;
    return false;
  }
  kept_[Key{ctx, s, bytes}].push_back(p);
  st_.kept_bytes += bytes;
  st_.kept_peak = std::max(st_.kept_peak, st_.kept_bytes);
  ++st_.kept;
  return true;
}

std::vector<std::pair<DevPtr, Stream>> BlockCache::drain(uint64_t ctx) {
  std::vector<std::pair<DevPtr, Stream>> out;
  std::lock_guard lock(mu_);
  for (auto it = kept_.begin(); it != kept_.end();) {
    if (it->first.ctx != ctx) {
      ++it;
      continue;
    }
    for (DevPtr p : it->second) out.emplace_back(p, it->first.s);
    st_.kept_bytes -= it->first.bytes * it->second.size();
    it = kept_.erase(it);
  }
  if (!out.empty()) {
    ++st_.drains;
    st_.drained_blocks += out.size();
  }
  return out;
}

BlockCache::Stats BlockCache::stats() const {
  std::lock_guard lock(mu_);
  return st_;
}

}  // namespace offload

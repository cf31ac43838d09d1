// Short lives left to the allocator's pool (Options::pool_short). A range maps its pieces, and
// grants access to them, at its birth whenever its room went to a reload since; an allocation
// the pool serves maps nothing once the pool holds its bytes. Which allocations are short is
// predicted from the step before, by their place of birth, as their uses are (ahead.cpp): one
// born where the last one lived at most pool_short launches and was never evicted. Its bytes
// count in the pool's share of the budget, which grows for it as for a small allocation.
#include <algorithm>

#include "residency/residency.h"

namespace offload {

thread_local uint64_t Residency::tl_pool_key = residency_range::kNoKey;

bool Residency::pool_short(uint64_t bytes, uint64_t key) {
  if (!o_.pool_short || key == kNoKey || external_) return false;
  const auto it = spans_.find(key);
  if (it == spans_.end() || it->second.moved || it->second.span > o_.pool_short) return false;
  // The pooled bytes live at once stay a share of the budget: the pool's memory is never evicted.
  if (pooled_live_ + bytes > uint64_t(double(o_.budget) * o_.pool_short_share)) return false;
  if (!admit_locked(bytes, true)) return false;  // no room for the share to grow: a range instead
  tl_pool_key = key;
  return true;
}

bool Residency::shrink_pool_share(uint64_t most) {
  const uint64_t floor = std::min(o_.pool_floor, o_.budget / 2);
  auto least = [&](uint64_t reserved) {
    return std::max({floor, round_up(std::max({small_live_ + o_.pool_step, pool_need_, reserved}), gran_)});
  };
  if (most >= pool_share_) return true;
  if (least(0) >= pool_share_) return false;
  uint64_t reserved = see_pool();
  if (least(reserved) > most && reserved > small_live_) {
    ++st_.pool_trims;
    d_.pool_trim(most);  // what it must give back, no more: the pool maps again what it gives
    reserved = see_pool();
  }
  if (least(reserved) >= pool_share_) return false;
  pool_share_ = std::max(least(reserved), most);
  ++st_.pool_shrinks;
  st_.pool_share = pool_share_;
  return pool_share_ <= most;
}

void Residency::small_allocated(uint64_t bytes, DevPtr p) {
  std::lock_guard<std::mutex> lk(mu_);
  small_live_ += bytes;
  const uint64_t key = tl_pool_key;
  tl_pool_key = kNoKey;
  if (key == kNoKey || !p || bytes < o_.min_bytes) return;
  pooled_[p] = Pooled{key, last_launch_.load(std::memory_order_relaxed)};
  pooled_live_ += bytes;
  ++st_.pooled;
  st_.pooled_bytes += bytes;
}

void Residency::small_freed(uint64_t bytes, DevPtr p) {
  std::lock_guard<std::mutex> lk(mu_);
  small_live_ -= std::min(small_live_, bytes);
  if (!p || bytes < o_.min_bytes) return;
  const auto it = pooled_.find(p);
  if (it == pooled_.end()) return;
  const Pooled e = it->second;
  pooled_.erase(it);
  pooled_live_ -= std::min(pooled_live_, bytes);
  // Its life is the prediction at its place next step: a long one sends that place back to ranges.
  const uint64_t span = last_launch_.load(std::memory_order_relaxed) - e.birth;
  if (span > o_.pool_short) ++st_.pooled_long;
  note_span(e.key, span, false);
}

}  // namespace offload

#include "core/step_detector.h"

#include <algorithm>

namespace offload {

uint64_t StepDetector::token(uint32_t kind, uint64_t what, uint64_t live_bytes) {
  uint64_t h = (uint64_t{kind} << 56) ^ what;
  h ^= live_bytes * 0x9E3779B97F4A7C15ull;
  h ^= h >> 29;
  return h;
}

void StepDetector::push(uint64_t token, uint64_t live_bytes) {
  tokens_.push_back(token);
  live_.push_back(live_bytes);
  if (!locked_) return;
  for (; checked_ < base_ + tokens_.size(); ++checked_) {
    uint64_t pos = (checked_ + ref_.size() - next_boundary_ % ref_.size()) % ref_.size();
    // pos: offset of launch `checked_` in the locked period (boundaries are ≡ next_boundary_).
    if (checked_ == next_boundary_) {
      out_.push_back(checked_);
      last_emitted_ = checked_;
      emitted_any_ = true;
      next_boundary_ += ref_.size();
    }
    if (tokens_[checked_ - base_] != ref_[pos]) {
      // The step left the pattern: stop predicting; search again from its start.
      locked_ = false;
      ++deviations_;
      searched_at_ = 0;
      trim(last_emitted_);
      return;
    }
  }
  // While locked, history before the last boundary is no longer needed.
  if (emitted_any_ && last_emitted_ > base_ + opt_.max_history / 2) trim(last_emitted_);
}

void StepDetector::trim(uint64_t keep_from) {
  if (keep_from <= base_) return;
  size_t n = static_cast<size_t>(std::min<uint64_t>(keep_from - base_, tokens_.size()));
  tokens_.erase(tokens_.begin(), tokens_.begin() + static_cast<ptrdiff_t>(n));
  live_.erase(live_.begin(), live_.begin() + static_cast<ptrdiff_t>(n));
  base_ += n;
}

std::vector<uint64_t> StepDetector::poll() {
  if (!locked_) detect();
  std::vector<uint64_t> out;
  out.swap(out_);
  return out;
}

void StepDetector::detect() {
  const size_t n = tokens_.size();
  if (n < 2 * opt_.min_period || n == searched_at_) return;
  if (n > opt_.max_history) {
    trim(base_ + (n - opt_.max_history));
    return detect();
  }
  searched_at_ = n;
  // Prefix function of the reversed history: r[j] = tokens_[n-1-j]. The smallest period of
  // the last L launches is L - pi[L-1].
  std::vector<uint32_t> pi(n, 0);
  for (size_t i = 1; i < n; ++i) {
    uint32_t k = pi[i - 1];
    while (k > 0 && tokens_[n - 1 - i] != tokens_[n - 1 - k]) k = pi[k - 1];
    if (tokens_[n - 1 - i] == tokens_[n - 1 - k]) ++k;
    pi[i] = k;
  }
  size_t L = 0, p = 0;
  for (size_t l = n; l >= 2 * opt_.min_period; --l) {
    size_t per = l - pi[l - 1];
    if (l >= 2 * per) {
      L = l;
      p = per;
      break;
    }
  }
  if (p < opt_.min_period) return;
  // Phase: the launch with the fewest live bytes within the last whole period.
  const uint64_t end = base_ + n;  // one past the last launch
  uint64_t best = end - p;
  for (uint64_t i = end - p; i < end; ++i)
    if (live_[i - base_] < live_[best - base_]) best = i;
  // On a plateau of the minimum, the step starts where the plateau does.
  for (uint64_t k = 0; k + 1 < p && best > base_ && live_[best - 1 - base_] == live_[best - base_]; ++k) --best;
  // Boundaries inside the periodic region [end - L, end): best, best - p, ...
  uint64_t first = best;
  while (first >= end - L + p && first >= p) first -= p;
  if (first < end - L) first += p;
  for (uint64_t b = first; b < end; b += p) {
    if (emitted_any_ && b <= last_emitted_) continue;
    out_.push_back(b);
    last_emitted_ = b;
    emitted_any_ = true;
  }
  // The reference is the period starting at the last boundary; if that boundary is less
  // than a period from the end, the previous period, which is identical, stands in.
  uint64_t ref_start = last_emitted_ + p <= end ? last_emitted_ : last_emitted_ - p;
  ref_.assign(tokens_.begin() + static_cast<ptrdiff_t>(ref_start - base_),
              tokens_.begin() + static_cast<ptrdiff_t>(ref_start - base_ + p));
  locked_ = true;
  next_boundary_ = last_emitted_ + p;
  checked_ = end;
  trim(last_emitted_ > p ? last_emitted_ - p : 0);
}

}  // namespace offload

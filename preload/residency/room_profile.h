// RoomProfile: the bytes the application held live at each launch of the step before, so that
// a prefetch can ask how much more the allocations before its range's use will need.
//
// A prefetch takes free room; an allocation that then finds none evicts the resident range used
// furthest ahead, which is the one just prefetched, and a launch later it is due again. On the
// recorded checkpointed Llama step every one of 1,502 unused prefetches a step went out within
// 16 launches of coming in (docs/results.md). The profile says, from the step before, how far
// the live bytes rise between now and a use: room for that is not room to prefetch into.
//
// note() is called at each launch that the manager sees (launch numbers only grow); a launch
// not seen takes the live bytes of the next one seen. The step before's profile is kept as a
// sparse table, so that rise() is two lookups whatever the distance. No allocation happens
// except when the period changes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace offload {

class RoomProfile {
 public:
  // The live bytes at launch `launch_no` of steps `period` launches long.
  void note(uint64_t launch_no, uint64_t period, uint64_t live) {
    if (!period) return;
    if (period != period_) restart(period, launch_no);
    const uint64_t step = launch_no / period_;
    while (step_ < step) {  // the rest of the step ended takes the last bytes seen in it
      std::fill(cur_.begin() + std::min<uint64_t>(next_, period_), cur_.end(), last_);
      finish_step();
      next_ = 0;
      ++step_;
    }
    const uint64_t phase = launch_no % period_;
    if (next_ <= phase) std::fill(cur_.begin() + next_, cur_.begin() + phase + 1, live);
    next_ = std::max(next_, phase + 1);
    last_ = live;
  }
  // How far the live bytes rose over the `d` launches after `launch_no`, above their level at
  // its place, in the step before; 0 while no whole step is known.
  uint64_t rise(uint64_t launch_no, uint64_t d) const {
    if (!ready_ || !d) return 0;
    d = std::min(d, period_ - 1);
    const uint64_t at = launch_no % period_, first = at + 1, last = at + d;  // wraps past the end
    uint64_t top = last < period_ ? max_of(first, last) : std::max(first < period_ ? max_of(first, period_ - 1) : 0, max_of(0, last - period_));
    const uint64_t here = table_[at];
    return top > here ? top - here : 0;
  }
  bool ready() const { return ready_; }

 private:
  void restart(uint64_t period, uint64_t launch_no) {
    period_ = period;
    cur_.assign(period, 0);
    levels_ = 1;
    while ((uint64_t(1) << levels_) <= period) ++levels_;
    table_.assign(levels_ * period, 0);
    step_ = launch_no / period;
    next_ = launch_no % period;  // the places before it in this step are not known
    std::fill(cur_.begin(), cur_.begin() + next_, 0);
    ready_ = false;
  }
  void finish_step() {
    std::copy(cur_.begin(), cur_.end(), table_.begin());
    for (uint64_t k = 1; k < levels_; ++k) {
      const uint64_t half = uint64_t(1) << (k - 1);
      uint64_t* row = &table_[k * period_];
      const uint64_t* below = &table_[(k - 1) * period_];
      for (uint64_t i = 0; i + (uint64_t(1) << k) <= period_; ++i) row[i] = std::max(below[i], below[i + half]);
    }
    ready_ = true;
  }
  uint64_t max_of(uint64_t lo, uint64_t hi) const {  // inclusive, lo <= hi < period_
    uint64_t k = 0;
    while ((uint64_t(2) << k) <= hi - lo + 1) ++k;
    return std::max(table_[k * period_ + lo], table_[k * period_ + hi + 1 - (uint64_t(1) << k)]);
  }

  uint64_t period_ = 0, levels_ = 0, step_ = 0, next_ = 0, last_ = 0;
  bool ready_ = false;
  std::vector<uint64_t> cur_;    // this step's live bytes by place
  std::vector<uint64_t> table_;  // the step before's: row k holds the maxima of 2^k places
};

}  // namespace offload

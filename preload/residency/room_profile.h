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
// sparse table, so that rise() is two lookups whatever the distance. Memory is taken only when
// the period changes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace offload {

class RoomProfile {
 public:
  // At most `places` places are kept: a longer step is kept in groups of launches (the highest
  // live bytes in each for what lies ahead, the lowest for where a launch is), so that the
  // table stays under about 2 MB whatever the step's length.
  explicit RoomProfile(uint64_t places = 16384) : most_(std::max<uint64_t>(places, 1)) {}

  // The live bytes at launch `launch_no` of steps `period` launches long.
  void note(uint64_t launch_no, uint64_t period, uint64_t live) {
    if (!period) return;
    if (period != period_) restart(period, launch_no);
    const uint64_t step = launch_no / period_;
    while (step_ < step) {  // the rest of the step ended takes the last bytes seen in it
      fill(next_, period_ - 1, last_);
      finish_step();
      next_ = 0;
      ++step_;
    }
    const uint64_t phase = launch_no % period_;
    if (next_ <= phase) fill(next_, phase, live);
    next_ = std::max(next_, phase + 1);
    last_ = live;
  }
  // How far the live bytes rose over the `d` launches after `launch_no`, above their level at
  // its place, in the step before; 0 while no whole step is known.
  uint64_t rise(uint64_t launch_no, uint64_t d) const {
    if (!ready_ || !d) return 0;
    d = std::min(d, period_ - 1);
    const uint64_t at = launch_no % period_, first = at + 1, last = at + d;  // wraps past the end
    const uint64_t top = last < period_ ? max_of(first / per_, last / per_)
                                        : std::max(first < period_ ? max_of(first / per_, groups_ - 1) : 0,
                                                   max_of(0, (last - period_) / per_));
    const uint64_t here = low_[at / per_];
    return top > here ? top - here : 0;
  }
  bool ready() const { return ready_; }

 private:
  void restart(uint64_t period, uint64_t launch_no) {
    period_ = period;
    per_ = (period + most_ - 1) / most_;
    groups_ = (period + per_ - 1) / per_;
    cur_hi_.assign(groups_, 0);
    cur_lo_.assign(groups_, UINT64_MAX);
    low_.assign(groups_, 0);
    levels_ = 1;
    while ((uint64_t(1) << levels_) <= groups_) ++levels_;
    table_.assign(levels_ * groups_, 0);
    step_ = launch_no / period;
    next_ = launch_no % period;  // the places before it in this step are not known: 0
    if (next_) fill(0, next_ - 1, 0);
    ready_ = false;
  }
  void fill(uint64_t from, uint64_t to, uint64_t live) {  // places from..to, inclusive
    if (from > to) return;
    for (uint64_t g = from / per_; g <= to / per_; ++g) {
      cur_hi_[g] = std::max(cur_hi_[g], live);
      cur_lo_[g] = std::min(cur_lo_[g], live);
    }
  }
  void finish_step() {
    std::copy(cur_hi_.begin(), cur_hi_.end(), table_.begin());
    for (uint64_t g = 0; g < groups_; ++g) low_[g] = cur_lo_[g] == UINT64_MAX ? cur_hi_[g] : cur_lo_[g];
    for (uint64_t k = 1; k < levels_; ++k) {
      const uint64_t half = uint64_t(1) << (k - 1);
      uint64_t* row = &table_[k * groups_];
      const uint64_t* below = &table_[(k - 1) * groups_];
      for (uint64_t i = 0; i + (uint64_t(1) << k) <= groups_; ++i) row[i] = std::max(below[i], below[i + half]);
    }
    std::fill(cur_hi_.begin(), cur_hi_.end(), 0);
    std::fill(cur_lo_.begin(), cur_lo_.end(), UINT64_MAX);
    ready_ = true;
  }
  uint64_t max_of(uint64_t lo, uint64_t hi) const {  // groups, inclusive, lo <= hi < groups_
    uint64_t k = 0;
    while ((uint64_t(2) << k) <= hi - lo + 1) ++k;
    return std::max(table_[k * groups_ + lo], table_[k * groups_ + hi + 1 - (uint64_t(1) << k)]);
  }

  uint64_t most_, period_ = 0, per_ = 1, groups_ = 0, levels_ = 0, step_ = 0, next_ = 0, last_ = 0;
  bool ready_ = false;
  std::vector<uint64_t> cur_hi_, cur_lo_;  // this step's highest and lowest live bytes by group
  std::vector<uint64_t> low_;              // the step before's lowest, by group
  std::vector<uint64_t> table_;            // its highest: row k holds the maxima of 2^k groups
};

}  // namespace offload

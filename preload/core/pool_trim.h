// PoolTrim: when and how far the shim gives the stream-ordered pool's unused memory back to the
// device.
//
// PyTorch's cudaMallocAsync backend keeps every byte its pool ever reserved (release threshold
// UINT64_MAX; only torch.cuda.empty_cache() trims). The steps observed before a plan, and a step
// run in demand mode after a deviation, reserve the step's whole peak; without a trim the process
// holds that peak for the rest of the run, whatever OFFLOAD_DEVICE_BUDGET says. So once an
// installed plan has run `after` steps, the shim trims the pool to the budget less the most the
// executor has held beside it (PlanController::trim_pool): what the plan's steps need stays.
//
// One cuMemPoolTrimTo call is not always enough (measured: docs/results.md):
// - It releases whole OS allocations, and only those with nothing live in them (a free whose
//   completion the driver has not yet seen counts as live). Called while a step runs, it may
//   release nothing: convnet's pool stayed at 5.62 GiB against 2.04 GiB to keep.
// - It keeps at least the bytes asked for, so it can stop one allocation above them: the
//   reference workload's pool came to 11.81 GiB against 11.79.
// So the trim is tried again at the next planned steps, up to `tries` times per install, until
// the pool is at most the bytes to keep; each try after one that stopped above them asks for
// that much less.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>

namespace offload {

class PoolTrim {
 public:
  explicit PoolTrim(uint64_t after = 1, uint32_t tries = 8) : after_(after), tries_(tries) {}

  // `installs`: plans installed so far; `steps_active`: steps run under any plan so far (the
  // executor's counter, never reset); `running`: a plan is installed and has not deviated.
  // True at most once per planned step: from the step at which the install has run `after`
  // steps, until a try reaches its target (attempt) or `tries` tries are spent.
  bool due(uint64_t installs, uint64_t steps_active, bool running) {
    if (installs != seen_) {
      seen_ = installs;
      base_ = steps_active;
      last_ = UINT64_MAX;
      left_ = tries_;
      slack_ = 0;
    }
    if (!left_ || !running || installs == 0 || steps_active < base_ + after_ || steps_active == last_) return false;
    last_ = steps_active;
    return true;
  }

  // The tries for the install counted `installs` are over (due() has seen it, and no try is left).
  bool over(uint64_t installs) const { return installs == seen_ && left_ == 0; }

  struct Attempt {
    uint64_t before = 0;  // the pool's reserved bytes before the try
    uint64_t after = 0;   // and after it
    uint64_t asked = 0;   // what cuMemPoolTrimTo was asked to keep (0 and !called: not called)
    bool called = false;  // the pool was trimmed (it held more than `keep`, and the call worked)
    bool done = false;    // no more tries for this install (target reached, nothing to do, or tries spent)
  };

  // One try, after due() said so: `reserved()` reads the pool's reserved bytes (0: unknown),
  // `trim_to(bytes)` trims it (false: the driver cannot).
  template <class Reserved, class TrimTo>
  Attempt attempt(uint64_t keep, Reserved reserved, TrimTo trim_to) {
    Attempt a;
    if (left_) --left_;
    a.before = reserved();
    a.after = a.before;
    if (!a.before || a.before <= keep) return finish(a);
    a.asked = keep > slack_ ? keep - slack_ : 0;
    if (!trim_to(a.asked)) return finish(a);
    a.called = true;
    a.after = reserved();
    if (a.after <= keep) return finish(a);
    slack_ = std::max(slack_, a.after - keep);
    a.done = left_ == 0;
    return a;
  }

 private:
  Attempt finish(Attempt a) {
    left_ = 0;
    a.done = true;
    return a;
  }

  uint64_t after_;
  uint32_t tries_;
  uint64_t seen_ = 0, base_ = 0, last_ = UINT64_MAX, slack_ = 0;
  uint32_t left_ = 0;
};

// PoolRefine: the allocator's factor under a plan of arenas, measured at the step's mark, and
// when to plan again for it.
//
// A plan counts what PyTorch's pool reserves for the live bytes outside the arenas as a factor
// of them: the larger of what the pool held before the plan and 1.15. Under the plan the pool
// holds another factor, which depends on the budget and the run (docs/results.md). Planned at
// a factor higher than the pool's, a plan offloads more than it needs and its last arenas hold
// every handle at the turnaround, so the first reload waits.
//
// A step shows what it needs only when the pool grew during it: otherwise the pool holds what an
// earlier step or a trim left. So once the PoolTrim tries of an install are over, the pool is
// emptied of what is unused at one mark (probe), and the next steps reserve what they need. The
// factor is the most the pool held over the plan's resident peak at the `window` marks after it
// (those where it grew). When that with `margin` added is lower than planned by at least
// `min_gain`, the plan is made again for it (at most `max_down` times), with room for one more
// handle than it has (PlanController::refine_plan). At every mark where the pool grew, a pool holding
// more than planned, by so much that the plan's peak grown by the difference passes the budget,
// plans again for the measured factor with `up_margin` added (at most `max_up` times; back to
// the first plan when that factor is within 0.005 of its own: plan_factor). The runtime puts the new plan in at a step's mark, where every arena is empty,
// so no step runs in demand mode for it, and empties the pool of what is unused there, so that
// the new plan's steps reserve for their own layout.
class PoolRefine {
 public:
  struct Options {
    // Added to the factor measured over the window. The first step after an emptied pool needs
    // less than the steps after it, but within 3 steps the pool holds its steady factor, and 3%
    // over it has held on the GPU (docs/results.md).
    double margin = 0.03;
    double up_margin = 0.03;  // added to a factor a grown pool showed
    double min_gain = 0.01;   // a lower factor worth a new plan
    uint32_t window = 3;      // marks after the probe whose largest factor counts
    uint32_t max_down = 1, max_up = 2;
  };
  PoolRefine() : o_(Options{}) {}
  explicit PoolRefine(Options o) : o_(o) {}

  enum class Action { None, Probe, Replan };
  struct Mark {
    uint64_t installs = 0;        // plans installed so far
    bool running = false;         // a plan of arenas runs (installed, not deviated, no weights)
    bool trim_done = true;        // PoolTrim's tries for this install are over
    uint64_t reserved = 0;        // the pool's reserved bytes now, before anything is trimmed here
    uint64_t resident = 0;        // the plan's resident peak: live bytes outside its arenas
    double planned = 0;           // the factor the plan was made with
    uint64_t predicted_peak = 0;  // the plan's footprint
    uint64_t budget = 0;
    // Room the plan keeps under `budget` for one handle more than its count (the executor's
    // reload that finds every handle held; Plan::spare). 0 when `budget` leaves it out already.
    uint64_t spare = 0;
  };
  // At a step's mark. Replan: factor() is the one to plan with. After the mark's trims (a probe
  // included), after_mark() says what the pool then holds.
  Action at_mark(const Mark& m) {
    const bool grew = m.reserved > after_ && after_ != kUnknown;
    after_ = kUnknown;
    if (m.installs != seen_) {
      seen_ = m.installs;
      probed_ = false;
    }
    if (!m.running || !m.reserved || !m.resident || m.planned <= 0) return Action::None;
    const double f = static_cast<double>(m.reserved) / static_cast<double>(m.resident);
    if (grew) last_ = f;
    if (grew && f > m.planned * 1.002 && up_ < o_.max_up) {
      // The pool's growth counts against the room kept for the spare handle too: a pool a
      // little over its planned factor can be within the budget without the spare handle and
      // over it with one.
      const double over = (f - m.planned) * static_cast<double>(m.resident);
      if (static_cast<double>(m.predicted_peak + m.spare) + over > static_cast<double>(m.budget)) {
        ++up_;
        left_ = 0;
        factor_ = f * (1 + o_.up_margin);
        return Action::Replan;
      }
    }
    if (down_ >= o_.max_down || !m.trim_done) return Action::None;
    if (!probed_) {
      probed_ = true;
      left_ = o_.window;
      best_ = 0;
      return Action::Probe;
    }
    if (!left_) return Action::None;
    if (grew) best_ = std::max(best_, f);
    if (--left_ > 0 || best_ <= 0) return Action::None;
    if (best_ * (1 + o_.margin) + o_.min_gain <= m.planned) {
      ++down_;
      factor_ = best_ * (1 + o_.margin);
      return Action::Replan;
    }
    return Action::None;
  }
  void after_mark(uint64_t reserved) { after_ = reserved; }

  // The factor to plan with when factor() is asked for, under a plan made for `current`, the
  // first plan (whole budget) having been made for `base`. *whole: plan with the whole budget
  // (the first plan again); otherwise keep room for one more handle. Lower than `current`: the
  // asked factor. Higher: back to `base` when the asked one is within 0.005 of it and a lower
  // one runs (the first plan was enough); else the asked one, above `base` too (the pool needs
  // more than the first plan counted).
  static double plan_factor(double asked, double current, double base, bool* whole) {
    *whole = current < base - 0.005 && asked >= base - 0.005 && asked <= base + 0.005;
    return *whole ? base : asked;
  }
  double factor() const { return factor_; }
  double last_measured() const { return last_; }  // the factor seen at the last mark the pool grew; 0: none
  uint32_t lowered() const { return down_; }
  uint32_t raised() const { return up_; }

 private:
  static constexpr uint64_t kUnknown = ~uint64_t{0};
  Options o_;
  uint64_t seen_ = 0, after_ = kUnknown;
  bool probed_ = false;
  double factor_ = 0, last_ = 0, best_ = 0;
  uint32_t down_ = 0, up_ = 0, left_ = 0;
};

}  // namespace offload

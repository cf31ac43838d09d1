// StepDetector on synthetic launch sequences.
//
// A launch is (kernel, live bytes). A "step" is a fixed sequence of launches; the
// detector must find its length as the period and put the boundaries where the step's
// live bytes are lowest (a step starts once the previous one has freed its activations).
#include "core/step_detector.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace offload {
namespace {

struct Launch {
  uint32_t kernel;
  uint64_t live;
};
using Seq = std::vector<Launch>;

constexpr uint64_t kParams = 1000000;  // bytes of weights, live throughout

struct Feeder {
  StepDetector d;
  std::vector<uint64_t> boundaries;
  explicit Feeder(StepDetector::Options o = {}) : d(o) {}
  void push(const Launch& l) { d.push(StepDetector::token(0, l.kernel, l.live), l.live); }
  void poll() {
    for (uint64_t b : d.poll()) {
      if (!boundaries.empty()) {
        EXPECT_GT(b, boundaries.back()) << "boundaries must ascend";
      }
      EXPECT_LT(b, d.launches()) << "a boundary names a launch that happened";
      boundaries.push_back(b);
    }
  }
  // Polls after every launch (as a worker that keeps up would).
  void feed(const Seq& s) {
    for (const Launch& l : s) {
      push(l);
      poll();
    }
  }
  void feed_then_poll(const Seq& s) {
    for (const Launch& l : s) push(l);
    poll();
  }
};

Seq warmup(size_t n) {
  Seq s;
  for (size_t i = 0; i < n; ++i) s.push_back({static_cast<uint32_t>(5000 + i), kParams / 2 + i});
  return s;
}

Seq repeat(const Seq& step, int n) {
  Seq s;
  for (int i = 0; i < n; ++i) s.insert(s.end(), step.begin(), step.end());
  return s;
}

Seq concat(std::initializer_list<Seq> parts) {
  Seq s;
  for (const Seq& p : parts) s.insert(s.end(), p.begin(), p.end());
  return s;
}

// A small training step: load a batch, 8 forward kernels each saving an activation, 8
// backward kernels each releasing one, an optimizer kernel while the gradients are live.
// Lowest live bytes: the first launch (the batch copy).
Seq small_step() {
  Seq s;
  const uint64_t act = 4096, grad = 50000;
  s.push_back({1, kParams});
  for (uint32_t k = 0; k < 8; ++k) s.push_back({10 + k, kParams + (k + 1) * act});
  for (uint32_t k = 0; k < 8; ++k) s.push_back({20 + k, kParams + grad + (8 - k) * act});
  s.push_back({30, kParams + grad});
  return s;
}

// A transformer-like step: 16 identical blocks of `block` kernels in the forward, each
// block's activations adding to the live bytes; the backward in reverse; an optimizer.
Seq block_step(uint32_t block, bool grow) {
  Seq s;
  const uint64_t act = 1 << 20, grad = 1 << 22;
  for (uint32_t b = 0; b < 16; ++b)
    for (uint32_t j = 0; j < block; ++j)
      s.push_back({100 + j, kParams + (grow ? b * act : 0) + (j ? 64 * j : 0)});
  for (uint32_t b = 16; b-- > 0;)
    for (uint32_t j = 0; j < block; ++j)
      s.push_back({200 + j, kParams + grad + (grow ? b * act : 0) + 64 * (block - j)});
  s.push_back({300, kParams + grad});
  return s;
}

std::vector<uint64_t> starts(uint64_t first, uint64_t period, uint64_t count) {
  std::vector<uint64_t> v;
  for (uint64_t k = 0; k < count; ++k) v.push_back(first + k * period);
  return v;
}

TEST(StepDetector, WarmupThenIdenticalStepsLocksOnTheStep) {
  const Seq step = small_step();
  ASSERT_GE(step.size(), 16u);
  const Seq w = warmup(7);
  Feeder f;
  f.feed(concat({w, repeat(step, 5)}));
  EXPECT_TRUE(f.d.locked());
  EXPECT_EQ(f.d.period(), step.size());
  EXPECT_EQ(f.d.deviations(), 0u);
  // Every step start, the first included (it ends the warm-up): 7, 7+L, ..., 7+4L.
  EXPECT_EQ(f.boundaries, starts(w.size(), step.size(), 5));
}

TEST(StepDetector, OnePollAtTheEndFindsTheSameBoundaries) {
  const Seq step = small_step();
  Feeder f;
  f.feed_then_poll(concat({warmup(11), repeat(step, 4)}));
  EXPECT_TRUE(f.d.locked());
  EXPECT_EQ(f.d.period(), step.size());
  EXPECT_EQ(f.boundaries, starts(11, step.size(), 4));
}

TEST(StepDetector, DoesNotLockBeforeTwoWholeSteps) {
  const Seq step = small_step();
  Feeder f;
  Seq s = concat({warmup(5), step});
  s.insert(s.end(), step.begin(), step.end() - 1);  // one launch short of two steps
  f.feed(s);
  EXPECT_FALSE(f.d.locked());
  EXPECT_EQ(f.d.period(), 0u);
  EXPECT_TRUE(f.boundaries.empty());
  f.feed({step.back()});
  EXPECT_TRUE(f.d.locked());
  EXPECT_EQ(f.boundaries, starts(5, step.size(), 2));
}

TEST(StepDetector, BoundaryIsAtTheLowestLiveBytesNotAtTheFirstLaunchFed) {
  // The sequence starts mid-step: the detector must still cut where live bytes are lowest.
  const Seq step = small_step();
  const size_t offset = 5;
  Seq s = warmup(3);
  s.insert(s.end(), step.begin() + offset, step.end());  // a partial first step
  Seq rest = repeat(step, 4);
  s.insert(s.end(), rest.begin(), rest.end());
  Feeder f;
  f.feed(s);
  EXPECT_EQ(f.d.period(), step.size());
  const uint64_t first_start = 3 + (step.size() - offset);
  EXPECT_EQ(f.boundaries, starts(first_start, step.size(), 4));
}

// Locking when the last boundary is less than a period from the end of the history (the
// usual case for a worker that polls at arbitrary times): the reference period must be read
// from inside the history. Sized so that the history fills its vector exactly (64 tokens:
// 24 warm-up + 2 steps of 20) and the step starts 5 launches in: a read past the end of the
// history is past the end of its allocation (AddressSanitizer reports it).
TEST(StepDetector, LockingNearTheEndReadsTheReferenceInsideTheHistory) {
  Seq step;
  for (uint32_t i = 0; i < 20; ++i) step.push_back({600 + i, i == 5 ? kParams : kParams + 100 + i});
  Seq s = warmup(24);
  Seq r = repeat(step, 2);
  s.insert(s.end(), r.begin(), r.end());
  ASSERT_EQ(s.size(), 64u);
  Feeder f;
  f.feed(s);
  EXPECT_TRUE(f.d.locked());
  EXPECT_EQ(f.d.period(), 20u);
  EXPECT_EQ(f.boundaries, starts(24 + 5, 20, 2));
  // The reference is right: the next step is followed without a deviation.
  f.feed(step);
  EXPECT_TRUE(f.d.locked());
  EXPECT_EQ(f.d.deviations(), 0u);
  EXPECT_EQ(f.boundaries, starts(24 + 5, 20, 3));
}

TEST(StepDetector, OnAPlateauOfTheMinimumTheStepStartsWhereThePlateauDoes) {
  Seq step;
  for (uint32_t k = 0; k < 4; ++k) step.push_back({400 + k, kParams});  // 4 launches at the minimum
  for (uint32_t k = 0; k < 20; ++k) step.push_back({410 + k, kParams + 1000 * (k + 1)});
  Feeder f;
  f.feed(concat({warmup(6), repeat(step, 4)}));
  EXPECT_EQ(f.d.period(), step.size());
  EXPECT_EQ(f.boundaries, starts(6, step.size(), 4));
}

TEST(StepDetector, SixteenGrowingForwardBlocksAreNotAPeriod) {
  const uint32_t block = 20;  // longer than min_period: a block alone could pass as a step
  const Seq step = block_step(block, /*grow=*/true);
  const Seq w = warmup(9);
  Feeder f;
  // The first step and the whole forward of the second: 31 repeated blocks in a row.
  Seq s = concat({w, step});
  s.insert(s.end(), step.begin(), step.begin() + 16 * block);
  f.feed(s);
  EXPECT_FALSE(f.d.locked()) << "locked on period " << f.d.period();
  EXPECT_TRUE(f.boundaries.empty());
  // The rest of the second step and a third: now the step is the period.
  s.assign(step.begin() + 16 * block, step.end());
  f.feed(concat({s, step}));
  EXPECT_TRUE(f.d.locked());
  EXPECT_EQ(f.d.period(), step.size());
  EXPECT_EQ(f.boundaries, starts(w.size(), step.size(), 3));
}

TEST(StepDetector, IdenticalBlocksWithoutGrowthDoLookPeriodic) {
  // The control for the test above: with the live bytes taken out, a block is a period.
  const uint32_t block = 20;
  const Seq step = block_step(block, /*grow=*/false);
  Feeder f;
  Seq s = warmup(9);
  s.insert(s.end(), step.begin(), step.begin() + 3 * block);
  f.feed(s);
  EXPECT_TRUE(f.d.locked());
  EXPECT_EQ(f.d.period(), block);
}

Seq with_kernel_changed(Seq s, size_t pos) {
  s[pos].kernel += 7777;
  return s;
}
Seq with_live_changed(Seq s, size_t pos) {
  s[pos].live += 512;
  return s;
}

void expect_unlock_and_relock(const Seq& step, const Seq& odd) {
  const Seq w = warmup(4);
  Feeder f;
  f.feed(concat({w, repeat(step, 3)}));
  ASSERT_TRUE(f.d.locked());
  ASSERT_EQ(f.d.period(), step.size());

  // Feed the odd step up to and including its first difference.
  size_t diff = 0;
  while (diff < std::min(step.size(), odd.size()) && step[diff].kernel == odd[diff].kernel &&
         step[diff].live == odd[diff].live)
    ++diff;
  ASSERT_LT(diff, odd.size());
  f.feed(Seq(odd.begin(), odd.begin() + static_cast<ptrdiff_t>(diff)));
  EXPECT_TRUE(f.d.locked()) << "still matching before the difference";
  f.feed({odd[diff]});
  EXPECT_FALSE(f.d.locked());
  EXPECT_EQ(f.d.deviations(), 1u);

  f.feed(Seq(odd.begin() + static_cast<ptrdiff_t>(diff) + 1, odd.end()));
  f.feed(repeat(step, 4));
  EXPECT_TRUE(f.d.locked());
  EXPECT_EQ(f.d.period(), step.size());
  EXPECT_EQ(f.d.deviations(), 1u);

  // Boundaries: every step start, the odd step's included, each once.
  std::vector<uint64_t> want = starts(w.size(), step.size(), 4);  // 3 steps + the odd one
  const uint64_t after_odd = w.size() + 3 * step.size() + odd.size();
  for (uint64_t b : starts(after_odd, step.size(), 4)) want.push_back(b);
  EXPECT_EQ(f.boundaries, want);
}

TEST(StepDetector, ADifferentKernelUnlocksAndItRelocksLater) {
  const Seq step = small_step();
  expect_unlock_and_relock(step, with_kernel_changed(step, 7));
}

TEST(StepDetector, DifferentLiveBytesUnlockAndItRelocksLater) {
  const Seq step = small_step();
  expect_unlock_and_relock(step, with_live_changed(step, 12));
}

TEST(StepDetector, ALongerOddStepUnlocksAndItRelocksLater) {
  const Seq step = small_step();
  Seq odd = step;  // e.g. an eval pass inserted mid-step
  odd.insert(odd.begin() + 10, {{9001, kParams + 77}, {9002, kParams + 78}, {9003, kParams + 79}});
  expect_unlock_and_relock(step, odd);
}

TEST(StepDetector, TokenSeparatesKernelKindAndLiveBytes) {
  const uint64_t t = StepDetector::token(0, 5, 1000);
  EXPECT_EQ(t, StepDetector::token(0, 5, 1000));
  EXPECT_NE(t, StepDetector::token(1, 5, 1000));
  EXPECT_NE(t, StepDetector::token(0, 6, 1000));
  EXPECT_NE(t, StepDetector::token(0, 5, 1001));
}

// Property: random step length and content, random warm-up, random polling. The detector
// must lock on the step length and cut exactly at each step's unique live-bytes minimum.
TEST(StepDetector, RandomStepsProperty) {
  for (uint32_t seed = 1; seed <= 60; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    auto uni = [&](uint32_t lo, uint32_t hi) { return static_cast<uint32_t>(lo + rng() % (hi - lo + 1)); };
    const uint32_t len = uni(16, 150);
    const uint32_t min_at = uni(0, len - 1);
    Seq step(len);
    for (uint32_t i = 0; i < len; ++i)
      step[i] = {uni(1, 40), i == min_at ? kParams : kParams + uni(1, 100000)};
    const uint32_t wlen = uni(0, 60), nsteps = uni(3, 6);
    Seq s;
    for (uint32_t i = 0; i < wlen; ++i) s.push_back({uni(1000, 2000), uni(0, 3 * kParams)});
    Seq r = repeat(step, static_cast<int>(nsteps));
    s.insert(s.end(), r.begin(), r.end());

    Feeder f;
    const uint32_t poll_every = uni(1, 64);
    for (size_t i = 0; i < s.size(); ++i) {
      f.push(s[i]);
      if (i % poll_every == 0) f.poll();
    }
    f.poll();
    ASSERT_TRUE(f.d.locked());
    EXPECT_EQ(f.d.period(), len);
    EXPECT_EQ(f.boundaries, starts(wlen + min_at, len, nsteps));
    EXPECT_EQ(f.d.launches(), s.size());
  }
}

}  // namespace
}  // namespace offload

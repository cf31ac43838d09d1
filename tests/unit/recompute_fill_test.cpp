// Recompute after fills: PyTorch's deterministic mode fills every new tensor before the operation
// that made it writes it, and an accumulation starts from zeros. A launch that reads nothing (a
// fill) and wrote a range or small allocation first is launched again before the launch that then
// wrote it, so that the range that launch made is still made again. Each rule has a test that
// fails without it: the fills of the output, of a range side and of a small side, launched again
// in order (or the check refuses the remake), and a small allocation another launch touched since
// its fill is no new side.
#include "recompute_rig.h"

namespace offload {
namespace recompute_test {
namespace {

// y filled, then updated in place by bump (which reads what the fill wrote): bump makes y, after
// the fill. Without the fill kept, y has no producer and is copied; without it launched again, the
// remake reads bytes no fill wrote and the first remake's check refuses the kernel.
TEST(RecomputeFill, ARangeFilledThenWrittenIsMadeAgainFromItsFill) {
  for (Fault f : {Fault::None, Fault::RecomputeNoPrelude, Fault::RecomputeSkipPrelude}) {
    SCOPED_TRACE(f == Fault::None ? "fills kept" : f == Fault::RecomputeNoPrelude ? "fills not kept" : "fills not launched");
    Rig r(3, f);
    const DevPtr x = learned_input(r, false);
    const DevPtr y = r.alloc();
    r.launch(r.fill, {y, 4});
    r.launch(r.bump, {y});
    r.evict({y}, {x});
    r.use(y);
    EXPECT_TRUE(r.is(y, [](uint64_t i) { return 4000 + i + 1; }));
    const Residency::Stats st = r.res.stats();
    EXPECT_EQ(st.recomputed, f == Fault::None ? 1u : 0u);
    EXPECT_EQ(st.copied_lost, f == Fault::RecomputeNoPrelude ? 1u : 0u);
    EXPECT_EQ(st.recompute_bans, f == Fault::RecomputeSkipPrelude ? 1u : 0u);
    EXPECT_EQ(st.producers_filled > 0, f != Fault::RecomputeNoPrelude);
  }
}

// Deterministic mode's order: a new range filled, then written whole by the operation reading x;
// two fills in a row (a slice set after zeros) stay in order. Made again, then used by a launch
// that writes it: the dropped range made again before that write is the same.
TEST(RecomputeFill, AnOperationAfterFillsIsItsRangesProducer) {
  for (Fault f : {Fault::None, Fault::RecomputeNoPrelude}) {
    SCOPED_TRACE(f == Fault::None ? "fills kept" : "fills not kept");
    Rig r(3, f);
    const DevPtr x = learned_input(r, true);
    const DevPtr y = r.alloc();
    r.launch(r.fill, {y, 1});
    r.launch(r.fill, {y, 2});
    r.launch(r.scale, {y, x});
    r.evict({y}, {x});
    r.use(y);
    EXPECT_TRUE(r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
    const Residency::Stats st = r.res.stats();
    EXPECT_EQ(st.recomputed, f == Fault::None ? 2u : 1u);  // trust_scale's, and y's
    EXPECT_EQ(st.copied_lost, f == Fault::None ? 0u : 1u);
  }
}

// acc(out, in, ctr) reads the counter it also writes: out = in + ctr[0]. Filled before, the
// counter (a range, or a small allocation) is zeroed around the remake as any side is, and filled
// again before it, so that the remake reads what the first launch read.
TEST(RecomputeFill, ASideFilledBeforeIsFilledAgainBeforeTheRemake) {
  for (bool small : {false, true})
    for (Fault f : {Fault::None, Fault::RecomputeSkipPrelude, Fault::RecomputeNoPrelude}) {
      SCOPED_TRACE(std::string(small ? "small side, " : "range side, ") +
                   (f == Fault::None ? "fills kept" : f == Fault::RecomputeNoPrelude ? "fills not kept" : "fills not launched"));
      Rig r(5, f);
      const DevPtr x = learned_input(r, false);
      auto counter = [&] { return small ? r.small_alloc() : r.alloc(); };
      auto fill = [&](DevPtr c) { small ? r.launch(r.setb, {c, 5}) : r.launch(r.fill, {c, 5}); };
      learn(r, r.acc, 1, {x, counter()});
      const DevPtr c = counter();
      fill(c);
      const uint64_t c0 = small ? 5 : 5000;
      const DevPtr y = r.alloc();
      r.launch(r.acc, {y, x, c});
      if (small) {
        r.evict({y}, {x});  // a small allocation is never evicted
      } else {
        r.evict({y}, {x, c});
      }
      r.use(y);
      EXPECT_TRUE(r.is(y, [&](uint64_t i) { return 7000 + i + c0; }));
      EXPECT_EQ(r.word(c, 0), c0 + 1);  // put back as the first launch left it
      const Residency::Stats st = r.res.stats();
      // Without the fills kept, a filled small allocation is no new side: acc makes nothing.
      const bool made = f == Fault::None;
      EXPECT_EQ(st.recomputed, made ? 1u : 0u);
      if (made) {
        EXPECT_EQ(st.side_kept, 1u);
      }
      if (!small || f != Fault::RecomputeNoPrelude) {
        EXPECT_EQ(st.side_refused, made ? 0u : 1u);  // the check saw the remake read a zeroed counter
      } else {
        EXPECT_EQ(st.not_producer_small, 1u);
      }
    }
}

// A small allocation filled, then read by another launch before the one that writes it besides
// its output: what it holds then is the program's, no fill's alone, and it is no new side.
TEST(RecomputeFill, ASmallAllocationTouchedSinceItsFillIsNoNewSide) {
  for (bool touched : {false, true}) {
    SCOPED_TRACE(touched ? "read since its fill" : "only filled");
    Rig r(5);
    const DevPtr x = learned_input(r, false);
    learn(r, r.acc, 1, {x, r.small_alloc()});
    learn(r, r.addb, 1, {x, r.small_alloc()});
    const DevPtr c = r.small_alloc();
    r.launch(r.setb, {c, 5});
    if (touched) {
      const DevPtr t = r.alloc();
      r.launch(r.addb, {t, x, c});
      r.free(t);
    }
    const DevPtr y = r.alloc();
    r.launch(r.acc, {y, x, c});
    r.evict({y}, {x});
    r.use(y);
    EXPECT_TRUE(r.is(y, [](uint64_t i) { return 7000 + i + 5; }));
    const Residency::Stats st = r.res.stats();
    EXPECT_EQ(st.recomputed, touched ? 0u : 1u);
    EXPECT_EQ(st.not_producer_small, touched ? 1u : 0u);
  }
}

}  // namespace
}  // namespace recompute_test
}  // namespace offload

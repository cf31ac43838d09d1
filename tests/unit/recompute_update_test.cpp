// Recompute after in-place updates: a launch that writes a range another launch made (a bias
// added, a mask applied, a residual summed into it) becomes that range's producer, with the
// launches that made it launched again before it, while every input of the chain is as it was
// read. Each rule has a test that fails without it: the chain kept (or the range is copied back),
// and its first launch's inputs guarded with the update's own (or a write to one goes unnoticed
// and the range is made again from the new bytes).
#include "recompute_rig.h"

namespace offload {
namespace recompute_test {
namespace {

// Makes bump trusted: a chain of scale (from x) and bump, evicted and made again, checked.
void trust_bump(Rig& r, DevPtr x) {
  const DevPtr t = r.alloc();
  r.launch(r.scale, {t, x});
  r.launch(r.bump, {t});
  r.evict({t}, {x});
  const uint64_t checks = r.res.stats().recompute_checks;
  r.use(t);
  EXPECT_EQ(r.res.stats().recompute_checks, checks + 1);
  r.free(t);
}

// y = scale(x), then bumped in place: bump makes y, scale launched again before it. Its first
// remake is checked; once trusted, y is dropped at eviction and made again.
TEST(RecomputeUpdate, ARangeUpdatedInPlaceIsMadeAgainByItsChain) {
  for (Fault f : {Fault::None, Fault::RecomputeNoUpdates}) {
    SCOPED_TRACE(f == Fault::None ? "updates kept" : "updates not kept");
    Rig r(4, f);
    const DevPtr x = learned_input(r, true);
    const uint64_t made_before = r.res.stats().recomputed;
    const DevPtr y = r.alloc();
    r.launch(r.scale, {y, x});
    r.launch(r.bump, {y});
    auto want = [](uint64_t i) { return 3 * (7000 + i) + 1 + 1; };
    r.evict({y}, {x});
    r.use(y);
    EXPECT_TRUE(r.is(y, want));
    r.evict({y}, {x});
    r.use(y);
    EXPECT_TRUE(r.is(y, want));
    const Residency::Stats st = r.res.stats();
    EXPECT_EQ(st.recomputed - made_before, f == Fault::None ? 2u : 0u);
    EXPECT_EQ(st.copied_lost, f == Fault::None ? 0u : 2u);
    EXPECT_EQ(st.producers_updated, f == Fault::None ? 1u : 0u);
    EXPECT_EQ(st.recompute_bans, 0u);
    if (f == Fault::None) {
      EXPECT_GT(st.dropped, 0u);  // the second eviction, once bump's remake was checked
    }
  }
}

// The chain reads x through its first launch only. Dropped, y is made again before a later write
// to x, as for any input of a producer; with only the update's own inputs followed, x is bumped
// under it and y made again afterwards from the new bytes.
TEST(RecomputeUpdate, TheFirstLaunchsInputsAreGuardedAsTheUpdatesOwn) {
  for (Fault f : {Fault::None, Fault::RecomputeUpdateInputsOwn}) {
    SCOPED_TRACE(f == Fault::None ? "inputs gathered" : "the update's own inputs only");
    Rig r(4, f);
    const DevPtr x = learned_input(r, true);
    trust_bump(r, x);
    const DevPtr y = r.alloc();
    r.launch(r.scale, {y, x});
    r.launch(r.bump, {y});
    const uint64_t dropped = r.res.stats().dropped;
    r.evict({y}, {x});
    ASSERT_EQ(r.res.stats().dropped, dropped + 1);
    r.launch(r.bump, {x});
    r.use(y);
    const bool right = r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1 + 1; });
    if (f == Fault::None) {
      EXPECT_TRUE(right);
      EXPECT_GT(r.res.stats().restored_early, 0u);
    } else {
      EXPECT_FALSE(right);
    }
  }
}

// A chain whose first launch's kernel was never checked is checked whole on its first remake:
// then the chain may be dropped, and the kernel launched again in chains, though not alone.
TEST(RecomputeUpdate, AChainWithAKernelNeverCheckedIsCheckedWhole) {
  Rig r(4);
  const DevPtr x = learned_input(r, false);
  auto want = [](uint64_t i) { return 3 * (7000 + i) + 1 + 1; };
  const DevPtr y = r.alloc();
  r.launch(r.scale, {y, x});
  r.launch(r.bump, {y});
  Residency::Stats st = r.res.stats();
  r.evict({y}, {x});
  EXPECT_EQ(r.res.stats().dropped, st.dropped);  // copied: nothing in the chain checked
  r.use(y);
  EXPECT_TRUE(r.is(y, want));
  EXPECT_EQ(r.res.stats().recompute_checks, st.recompute_checks + 1);
  EXPECT_EQ(r.res.stats().recomputed, st.recomputed + 1);
  r.free(y);
  const DevPtr y2 = r.alloc();
  r.launch(r.scale, {y2, x});
  r.launch(r.bump, {y2});
  st = r.res.stats();
  r.evict({y2}, {x});
  EXPECT_EQ(r.res.stats().dropped, st.dropped + 1);
  r.use(y2);
  EXPECT_TRUE(r.is(y2, want));
  EXPECT_EQ(r.res.stats().recompute_checks, st.recompute_checks);
  r.free(y2);
  // scale alone is still checked before it is trusted: copied out, made again, compared.
  const DevPtr t = produce_and_evict(r, x);
  EXPECT_EQ(r.res.stats().dropped, st.dropped + 1);
  r.use(t);
  EXPECT_TRUE(r.is(t, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
  EXPECT_EQ(r.res.stats().recompute_checks, st.recompute_checks + 1);
  EXPECT_EQ(r.res.stats().recompute_bans, 0u);
}

// bump trusted, then a chain of a kernel never checked (an atomic reduction, other bytes each
// run) and bump: the range is copied out and the chain's first remake compared, which bans the
// reduction. Taking the chain as checked because bump is drops the range and makes it again wrong.
TEST(RecomputeUpdate, AChainThatGivesOtherBytesBansItsKernelNeverChecked) {
  for (Fault f : {Fault::None, Fault::RecomputeChainUnchecked}) {
    SCOPED_TRACE(f == Fault::None ? "chain checked" : "the update's kernel checked only");
    Rig r(4, f);
    const DevPtr x = learned_input(r, true);
    learn(r, r.noisy, 1, {x});
    trust_bump(r, x);
    const uint64_t bans = r.res.stats().recompute_bans;
    const DevPtr y = r.alloc();
    r.launch(r.noisy, {y, x});
    r.launch(r.bump, {y});
    const uint64_t first = r.word(y, 0);  // x + the reduction's run + 1
    r.evict({y}, {x});
    r.use(y);
    const bool right = r.is(y, [first](uint64_t i) { return first + i; });
    if (f == Fault::None) {
      EXPECT_TRUE(right);
      EXPECT_EQ(r.res.stats().recompute_bans, bans + 1);
    } else {
      EXPECT_FALSE(right);
    }
  }
}

// An update whose chain read an input written since is not kept: y's producer is lost, and the
// log says why (the first such write of a kernel is named).
TEST(RecomputeUpdate, AnUpdateNotKeptSaysWhy) {
  Rig r(4);
  const DevPtr x = learned_input(r, true);
  const DevPtr y = r.alloc();
  r.launch(r.scale, {y, x});
  r.launch(r.bump, {x});
  ::testing::internal::CaptureStderr();
  r.launch(r.bump, {y});
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("recompute: kernel bump writes ranges other launches made"), std::string::npos) << said;
  EXPECT_NE(said.find("(an input of its chain changed since)"), std::string::npos) << said;
  const uint64_t lost = r.res.stats().copied_lost;
  r.evict({y}, {x});
  r.use(y);
  EXPECT_EQ(r.res.stats().copied_lost, lost + 1);
  EXPECT_TRUE(r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1 + 1; }));
}

}  // namespace
}  // namespace recompute_test
}  // namespace offload

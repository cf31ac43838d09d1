// Recompute under the cap with small allocations (outside the ranges: PyTorch's pool, a bias): a
// producer may read them, and is made again only while each is as it read it. Each rule has a test
// that fails without it: a small input written since (by a launch touching it alone, by a memset
// through the hooks, by a launch we cannot see into) or freed refuses the remake; a launch that
// writes a small allocation is no producer; a range dropped from one is made again before the
// small allocation is written or freed.
#include "recompute_rig.h"

namespace offload {
namespace recompute_test {
namespace {

// x, a bias b (small) holding `v`, and addb learned from them (with `trust`, checked once too).
struct Biased {
  DevPtr x, b;
};
Biased biased(Rig& r, uint64_t v, bool trust = false) {
  const DevPtr x = learned_input(r, false);
  const DevPtr b = r.small_alloc();
  r.launch(r.setb, {b, v});
  if (trust) trust_addb(r, x, b);
  else learn(r, r.addb, 1, {x, b});
  return {x, b};
}

// A memset of b to v words, through the hooks as the shim sees one.
void memset_bias(Rig& r, DevPtr b, uint64_t v) {
  r.tr.on_memset(b, 64, kA);
  ASSERT_FALSE(Residency::take_refusal());
  r.sim.launch(kA, [b, v] { std::fill(words(b), words(b) + 8, v); });
  r.res.after_launch();
}

// y = addb(x, b), then y evicted while x stays.
DevPtr biased_product(Rig& r, const Biased& in) {
  const DevPtr y = r.alloc();
  r.launch(r.addb, {y, in.x, in.b});
  r.evict({y}, {in.x});
  return y;
}

TEST(RecomputeSmall, AProducerThatReadsASmallAllocationIsMadeAgain) {
  Rig r(3);
  const Biased in = biased(r, 5);
  const DevPtr y = biased_product(r, in);
  const uint64_t in_before = r.res.stats().bytes_in;
  r.use(y);
  EXPECT_TRUE(r.is(y, [](uint64_t i) { return 7000 + i + 5; }));
  EXPECT_EQ(r.res.stats().recomputed, 1u);
  EXPECT_EQ(r.res.stats().bytes_in, in_before);  // nothing copied in for it
  EXPECT_EQ(r.res.stats().not_producer_small, 0u);
  EXPECT_EQ(r.res.stats().dropped, 0u);  // addb was not checked yet: copied out
}

// The bias written after y was made from it, in each way the shim sees a write: the remake would
// read the new bias. addb is trusted first (one clean remake), so that no check stands between a
// wrong remake and the range.
TEST(RecomputeSmall, ASmallInputWrittenSinceIsRefused) {
  enum How { Alone, Memset, Blind };
  for (How how : {Alone, Memset, Blind})
    for (Fault f : {Fault::None, Fault::RecomputeIgnoreVersions}) {
      SCOPED_TRACE(std::string(how == Alone ? "a launch touching it alone" : how == Memset ? "a memset" : "a blind launch") +
                   (f == Fault::None ? ", checked" : ", versions ignored"));
      Rig r(3, f);
      const Biased in = biased(r, 5, true);
      const DevPtr y = biased_product(r, in);
      if (how == Alone) {
        r.launch(r.setb, {in.b, 9});
      } else if (how == Memset) {
        memset_bias(r, in.b, 9);
      } else {
        const Func opaque = r.sim.add_opaque_kernel("opaque_set");
        std::vector<uint64_t> args{in.b};
        std::vector<void*> p{&args[0]};
        const LaunchGeom g;
        r.tr.on_kernel(opaque, kA, p.data(), nullptr, &g);
        ASSERT_FALSE(Residency::take_refusal());
        r.sim.launch(kA, [b = in.b] { std::fill(words(b), words(b) + 8, 9); });
        r.res.after_launch();
        r.evict({y}, {in.x});  // it needed every range, y too: out again
      }
      r.use(y);
      const bool right = r.is(y, [](uint64_t i) { return 7000 + i + 5; });
      if (f == Fault::None) {
        EXPECT_TRUE(right);
        EXPECT_EQ(r.res.stats().recomputed, 1u);  // the trusting one
        EXPECT_GE(r.res.stats().remake_stale, 1u);
      } else {
        EXPECT_FALSE(right);  // the rule is what kept the bytes
      }
    }
}

TEST(RecomputeSmall, ASmallInputFreedIsRefused) {
  Rig r(3);
  const Biased in = biased(r, 5);
  const DevPtr y = biased_product(r, in);
  r.small_free(in.b);
  r.use(y);
  EXPECT_TRUE(r.is(y, [](uint64_t i) { return 7000 + i + 5; }));
  EXPECT_EQ(r.res.stats().recomputed, 0u);
  EXPECT_EQ(r.res.stats().remake_stale, 1u);
}

// Once its kernel is trusted, a range made from a small allocation is dropped, and a write of the
// small allocation (by a launch touching it alone, by a memset) or its free makes it again first.
// Without that it could not be made again at all, and the process stops.
TEST(RecomputeSmall, AWriteOrFreeOfASmallInputMakesItsDroppedRangesAgainFirst) {
  enum How { Alone, Memset, Free };
  for (How how : {Alone, Memset, Free}) {
    SCOPED_TRACE(how == Alone ? "a launch touching it alone" : how == Memset ? "a memset" : "its free");
    auto run = [how](Fault f) {
      Rig r(4, f);
      const Biased in = biased(r, 5, true);
      const DevPtr y = biased_product(r, in);
      ASSERT_EQ(r.res.stats().dropped, 1u);
      if (how == Alone) {
        r.launch(r.setb, {in.b, 9});
      } else if (how == Memset) {
        memset_bias(r, in.b, 9);
      } else {
        r.small_free(in.b);
      }
      EXPECT_EQ(r.res.stats().restored_early, 1u);
      r.use(y);
      EXPECT_TRUE(r.is(y, [](uint64_t i) { return 7000 + i + 5; }));
    };
    run(Fault::None);
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_DEATH(run(Fault::RecomputeNoWriteGuard), "could not be made again: its bytes are lost");
  }
}

// A launch that writes a small allocation besides its output (running statistics kept small): made
// again, it would write it once more.
TEST(RecomputeSmall, ALaunchThatWritesASmallAllocationIsNoProducer) {
  Rig r(3);
  const DevPtr x = learned_input(r, false);
  const DevPtr s = r.small_alloc();
  r.launch(r.setb, {s, 0});
  learn(r, r.normb, 1, {x, s});  // the probes see it write s
  const DevPtr y = r.alloc();
  ::testing::internal::CaptureStderr();
  r.launch(r.normb, {y, x, s});
  const std::string said = ::testing::internal::GetCapturedStderr();
  // The log names the kernel and what it wrote outside the ranges (a norm's mean, on a GPU).
  char where[64];
  std::snprintf(where, sizeof where, "also wrote outside the ranges %#llx (64 bytes): never made again", static_cast<unsigned long long>(s));
  EXPECT_NE(said.find("kernel normb made a range of 64 KiB"), std::string::npos) << said;
  EXPECT_NE(said.find(where), std::string::npos) << said;
  r.evict({y}, {x});
  r.use(y);
  EXPECT_TRUE(r.is(y, [](uint64_t i) { return 2 * (7000 + i); }));
  EXPECT_EQ(r.word(s, 0), Residency::kRecomputeProbes + 1u);
  EXPECT_EQ(r.res.stats().recomputed, 0u);
  EXPECT_EQ(r.res.stats().not_producer_small, 1u);
}

}  // namespace
}  // namespace recompute_test
}  // namespace offload

// Recompute under the cap with small allocations (outside the ranges: PyTorch's pool, a bias): a
// producer may read them, and is made again only while each is as it read it; one it writes is its
// small side, kept across the launch made again. Each rule has a test that fails without it: a
// small input written since (by a launch touching it alone, by a memset through the hooks, by a
// launch we cannot see into) or freed refuses the remake; a range dropped from one is made again
// before the small allocation is written (an input) or freed (an input or a side); a small side is
// put back, in stream order, and refused where the output reads it.
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

// normb (out = 2 in, s[0] += 1) learned from x, its probes on one small allocation.
void learn_normb(Rig& r, DevPtr x) {
  const DevPtr s0 = r.small_alloc();
  r.launch(r.setb, {s0, 0});
  learn(r, r.normb, 1, {x, s0});
}

// y = normb(x, s) with s new, as a norm's mean and inverse deviation are, and its first word as
// the launch left it; then y evicted while x stays.
struct Normed {
  DevPtr y, s;
  uint64_t s0;
};
Normed normed(Rig& r, DevPtr x, DevPtr s = 0) {
  if (!s) s = r.small_alloc();
  const DevPtr y = r.alloc();
  r.launch(r.normb, {y, x, s});
  const uint64_t s0 = r.word(s, 0);
  r.evict({y}, {x});
  return {y, s, s0};
}

// normb trusted: one range made with a new small allocation, made again and checked.
void trust_normb(Rig& r, DevPtr x) {
  const Normed n = normed(r, x);
  const uint64_t checks = r.res.stats().recompute_checks;
  r.use(n.y);
  ASSERT_EQ(r.res.stats().recompute_checks, checks + 1);
  r.free(n.y);
}

// A launch that writes a small allocation new at it besides its output (a norm's mean): made
// again, it would write it once more. Its bytes are saved, zeroed and put back around the launch
// made again, as a range side's. Without that (small sides off), or where the allocation was
// written before by other than a kernel that touches it alone (it may be read: running statistics),
// the launch is no producer and the log names it.
TEST(RecomputeSmall, ANewSmallAllocationWrittenBesidesIsKeptAcrossTheRemake) {
  enum Case { Kept, NotKept, Off, NotNew };
  for (Case c : {Kept, NotKept, Off, NotNew}) {
    SCOPED_TRACE(c == Kept ? "kept" : c == NotKept ? "not put back" : c == Off ? "small sides off" : "written before");
    Rig r(4, c == NotKept ? Fault::RecomputeSideNotKept : c == Off ? Fault::RecomputeNoSmallSide : Fault::None);
    const DevPtr x = learned_input(r, false);
    learn_normb(r, x);
    DevPtr s = r.small_alloc();
    if (c == NotNew) memset_bias(r, s, 0);
    ::testing::internal::CaptureStderr();
    const Normed n = normed(r, x, s);
    const std::string said = ::testing::internal::GetCapturedStderr();
    const bool none = c == Off || c == NotNew;
    char where[96];
    std::snprintf(where, sizeof where, "also wrote outside the ranges %#llx (64 bytes): never made again",
                  static_cast<unsigned long long>(s));
    EXPECT_EQ(said.find("kernel normb made a range of 64 KiB") != std::string::npos, none) << said;
    EXPECT_EQ(said.find(where) != std::string::npos, none) << said;
    r.use(n.y);
    EXPECT_TRUE(r.is(n.y, [](uint64_t i) { return 2 * (7000 + i); }));
    const Residency::Stats st = r.res.stats();
    EXPECT_EQ(r.word(s, 0), c == NotKept ? 1u : n.s0);  // not put back: zeroed, counted once
    EXPECT_EQ(st.recomputed, none ? 0u : 1u);
    EXPECT_EQ(st.not_producer_small, none ? 1u : 0u);
    if (c == Kept) {
      EXPECT_EQ(st.side_kept, 1u);
      EXPECT_EQ(st.side_kept_bytes, 64u);
      EXPECT_EQ(st.recompute_checks, 1u);
    }
  }
}

// A kernel whose output reads the small allocation it also writes (here one the pool handed over
// holding 5): zeroed for the second launch, the output differs, and the check refuses that side;
// unchecked, the range would be wrong.
TEST(RecomputeSmall, AKernelWhoseOutputReadsItsSmallSideIsRefusedAtItsCheck) {
  for (Fault f : {Fault::None, Fault::RecomputeUnchecked}) {
    SCOPED_TRACE(f == Fault::None ? "checked" : "unchecked");
    Rig r(4, f);
    const DevPtr x = learned_input(r, false);
    const DevPtr c0 = r.small_alloc();
    r.launch(r.setb, {c0, 0});
    learn(r, r.acc, 1, {x, c0});
    auto made = [&] {  // y = acc(x, c): y = x + 5, c new, holding 5
      const DevPtr c = r.small_alloc();
      words(c)[0] = 5;
      const DevPtr y = r.alloc();
      r.launch(r.acc, {y, x, c});
      r.evict({y}, {x});
      r.use(y);
      EXPECT_EQ(r.word(c, 0), 6u);  // put back either way
      return r.is(y, [](uint64_t i) { return 7000 + i + 5; });
    };
    const bool right = made();
    if (f == Fault::None) {
      EXPECT_TRUE(right);
      EXPECT_EQ(r.res.stats().side_refused, 1u);
      // Its later launches that write such a c are no producers: copied back.
      EXPECT_TRUE(made());
      EXPECT_EQ(r.res.stats().recomputed, 0u);
      EXPECT_EQ(r.res.stats().not_producer_small, 1u);
    } else {
      EXPECT_FALSE(right);
    }
  }
}

// A small side is saved after every stream's work on it so far, and a later launch on another
// stream that touches it waits until it is put back: the program ordered neither around a launch
// it never made. Here s is set on kB just before (or just after) y is made again on kA; either way
// the set must survive.
TEST(RecomputeSmall, ASmallSideIsKeptInStreamOrder) {
  for (bool later : {false, true})
    for (Fault f : {Fault::None, later ? Fault::RecomputeSkipReadOrder : Fault::RecomputeSkipSideWait}) {
      SCOPED_TRACE(std::string(later ? "set after" : "set before") + (f == Fault::None ? ", ordered" : ", not ordered"));
      int wrong = 0;
      for (uint64_t seed = 1; seed <= 8; ++seed) {
        Rig r(4, f);
        const DevPtr x = learned_input(r, false);
        learn_normb(r, x);
        trust_normb(r, x);
        const Normed n = normed(r, x);
        if (!later) r.launch(r.setb, {n.s, 77}, kB);
        r.use(n.y, kA);  // y made again on kA
        if (later) r.launch(r.setb, {n.s, 77}, kB);
        std::mt19937_64 rng(seed);
        while (r.sim.step(rng)) {
        }
        EXPECT_EQ(r.res.stats().side_kept, 2u);
        EXPECT_TRUE(r.is(n.y, [](uint64_t i) { return 2 * (7000 + i); }));
        if (r.word(n.s, 0) != 77) ++wrong;
      }
      if (f == Fault::None) EXPECT_EQ(wrong, 0);
      else EXPECT_GT(wrong, 0);
    }
}

// Once its kernel is trusted, a range whose producer wrote a small side is dropped. A write of the
// small allocation leaves it dropped (the side's bytes are put back whatever they are); its free
// makes it again first, while the address is still the program's. Without that it could not be
// made again at all, and the process stops.
TEST(RecomputeSmall, AFreeOfASmallSideMakesItsDroppedRangeAgainFirst) {
  for (bool freed : {false, true}) {
    SCOPED_TRACE(freed ? "freed" : "written");
    auto run = [freed](Fault f) {
      Rig r(6, f);  // room to make y again beside the largest launch
      const DevPtr x = learned_input(r, false);
      learn_normb(r, x);
      trust_normb(r, x);
      const Normed n = normed(r, x);
      ASSERT_EQ(r.res.stats().dropped, 1u);
      if (freed) r.small_free(n.s);
      else r.launch(r.setb, {n.s, 9});
      EXPECT_EQ(r.res.stats().restored_early, freed ? 1u : 0u);
      r.use(n.y);
      EXPECT_TRUE(r.is(n.y, [](uint64_t i) { return 2 * (7000 + i); }));
      if (!freed) {
        EXPECT_EQ(r.word(n.s, 0), 9u);
      }
    };
    run(Fault::None);
    if (freed) {
      GTEST_FLAG_SET(death_test_style, "threadsafe");
      EXPECT_DEATH(run(Fault::RecomputeNoWriteGuard), "could not be made again: its bytes are lost");
    }
  }
}

}  // namespace
}  // namespace recompute_test
}  // namespace offload

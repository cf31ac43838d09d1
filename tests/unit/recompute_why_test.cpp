// Recompute's account of the ranges it did not make again (Residency::Stats): every range copied
// in with recompute on is counted by why no launch made it instead, so that a run on a GPU says
// which rule stands between its ranges and being made again.
#include <array>
#include <cstring>

#include "recompute_rig.h"

namespace offload {
namespace recompute_test {
namespace {

enum Reason { Made, Lasting, Unmade, Lost, Written, Stale, Away, kReasons };

std::array<uint64_t, kReasons> reasons(const Residency::Stats& s) {
  return {s.recomputed, s.copied_lasting, s.copied_unmade, s.copied_lost, s.remake_written, s.remake_stale, s.remake_away};
}

// The one reason counted when `p` is touched (made again or copied in): -1 where none or several.
int why(Rig& r, DevPtr p) {
  const auto before = reasons(r.res.stats());
  r.use(p);
  const auto after = reasons(r.res.stats());
  int found = -1;
  uint64_t counted = 0;
  for (int i = 0; i < kReasons; ++i) {
    counted += after[i] - before[i];
    if (after[i] != before[i]) found = i;
  }
  return counted == 1 ? found : -1;
}

TEST(RecomputeWhy, EachRangeCopiedInSaysWhyNoLaunchMadeIt) {
  Rig r(4);
  const DevPtr x = learned_input(r, true);
  learn(r, r.rng, 1, {x});

  // Made again: in none of the copied counts.
  const DevPtr y = produce_and_evict(r, x);
  EXPECT_EQ(why(r, y), Made);
  r.free(y);

  // Its producer taken by a later launch that wrote it in place and is no producer itself (it
  // draws random numbers); the log names the writer once, with the producer and the positions.
  const DevPtr z = r.alloc();
  r.launch(r.scale, {z, x});
  ::testing::internal::CaptureStderr();
  r.launch(r.rng, {z, z});
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("kernel philox_masked_scale writes ranges other launches made (here 64 KiB, made by scale), at "
                      "0.0 (beside another, seen writing alone), 1.0 (beside another, seen clean alone): those are "
                      "copied, not made again"),
            std::string::npos)
      << said;
  r.evict({z}, {x});
  EXPECT_EQ(why(r, z), Lost);
  const uint64_t draw = r.draws;
  EXPECT_TRUE(r.is(z, [&](uint64_t i) { return (3 * (7000 + i) + 1) ^ (draw << 32); }));

  // The next life of its range forgets the producer lost in this one.
  r.free(z);
  std::vector<DevPtr> others;
  DevPtr n = r.alloc();
  while (n != z && others.size() < 3) others.push_back(std::exchange(n, r.alloc()));
  ASSERT_EQ(n, z);  // the freed range taken again
  for (DevPtr o : others) r.free(o);
  r.launch(r.rng, {n, x});
  r.evict({n}, {x});
  EXPECT_EQ(why(r, n), Unmade);
  r.free(n);

  // No producer in its life: made by a kernel that draws random numbers.
  const DevPtr u = produce_and_evict(r, x, r.rng);
  EXPECT_EQ(why(r, u), Unmade);
  r.free(u);

  // An input changed since: stale, not lost.
  const DevPtr v = r.alloc();
  r.launch(r.scale, {v, x});
  r.launch(r.bump, {x});
  r.evict({v}, {x});
  EXPECT_EQ(why(r, v), Stale);

  // With a step of 2 launches known, a range with no producer alive for longer than that (a
  // weight, optimizer state) is lasting.
  r.free(v);
  const DevPtr w = r.alloc();
  r.launch(r.rng, {w, x});
  for (int i = 0; i < 3; ++i) r.use(x);
  r.evict({w}, {x});
  r.res.set_period(2);  // x touched in it, half the live bytes: taken
  ASSERT_EQ(r.res.stats().period, 2u);
  EXPECT_EQ(why(r, w), Lasting);
}

// A copy through the hooks, as the shim sees cudaMemcpyAsync between two allocations.
void copy(Rig& r, DevPtr dst, DevPtr src) {
  r.tr.on_copy(dst, src, kGran, kA, nullptr);
  ASSERT_FALSE(Residency::take_refusal());
  r.sim.launch(kA, [dst, src] { std::memcpy(words(dst), words(src), kGran); });
  r.res.after_launch();
}

// A copy writes its destination and only reads its source: a range made from the source is still
// made again; one the copy wrote is copied, and the log says a copy wrote it.
TEST(RecomputeWhy, ACopyWritesOnlyItsDestination) {
  for (Fault f : {Fault::None, Fault::RecomputeCopyWritesAll}) {
    SCOPED_TRACE(f == Fault::None ? "destination only" : "source taken as written too");
    Rig r(5, f);
    const DevPtr x = learned_input(r, true);
    const DevPtr y = r.alloc();
    r.launch(r.scale, {y, x});
    const DevPtr z = r.alloc();
    copy(r, z, x);
    r.evict({y}, {x});
    EXPECT_EQ(why(r, y), f == Fault::None ? Made : Stale);
    EXPECT_TRUE(r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
    // Written by a copy after it was made: copied in, and named.
    copy(r, y, z);
    ::testing::internal::CaptureStderr();
    r.evict({y}, {x});
    EXPECT_EQ(why(r, y), Written);
    const std::string said = ::testing::internal::GetCapturedStderr();
    if (f == Fault::None) {
      EXPECT_NE(said.find("recompute: a range of 64 KiB made by scale was written since by a copy or memset (it "
                          "writes its destination): copied, not made again"),
                std::string::npos)
          << said;
    }
    EXPECT_TRUE(r.is(y, [](uint64_t i) { return 7000 + i; }));
  }
}

// A kernel whose probes are spent before a position points into a range (in its probed launches
// that position pointed at memory outside every allocation): its launch is not learned, takes all
// it touches as written, is counted, and the log names that position when a range it touched is
// refused for it.
// Returns the kernel `wide` (out = a + b + c + d + e), probed twelve times with x at each of
// positions 1 to 4 in turn and `out` (memory the tracker never heard of) at the others.
Func probe_wide(Rig& r, DevPtr x, DevPtr out) {
  const Func wide = r.sim.add_kernel("wide", params(6), [](const unsigned char* a) {
    for (uint64_t i = 0; i < kWords; ++i) {
      uint64_t v = 0;
      for (int k = 1; k < 6; ++k) v += words(arg(a, k))[i];
      words(arg(a, 0))[i] = v;
    }
  });
  for (int at = 1; at <= 4; ++at)
    for (uint8_t i = 0; i < Residency::kRecomputeProbes; ++i) {
      std::vector<uint64_t> args{r.alloc(), out, out, out, out, out};
      args[at] = x;
      r.launch(wide, args);
      r.free(args[0]);
    }
  return wide;
}

TEST(RecomputeWhy, AWriterNotLearnedIsNamedWithThePositionItsProbesNeverSaw) {
  Rig r(5);
  const DevPtr x = learned_input(r, true);
  const DevPtr out = r.sim.alloc(kGran);  // the tracker never hears of it: zeros
  std::memset(words(out), 0, kGran);
  const Func wide = probe_wide(r, x, out);  // three probes at each of positions 1 to 4, twelve in all
  const uint64_t unlearned = r.res.stats().unlearned;  // the probed launches among them
  EXPECT_EQ(r.res.stats().probes_spent, 0u);
  const DevPtr z = r.alloc();
  r.launch(r.scale, {z, x});
  const DevPtr w = r.alloc();
  r.launch(wide, {w, out, out, out, out, z});  // only reads z, but nothing says so
  EXPECT_EQ(r.res.stats().unlearned, unlearned + 1);
  EXPECT_EQ(r.res.stats().probes_spent, 1u);
  ::testing::internal::CaptureStderr();
  r.evict({z}, {x});
  EXPECT_EQ(why(r, z), Written);
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("was written since by kernel wide (its writes not learned after 12 probes (at its launch, "
                      "position 5.0 was never seen by a probe))"),
            std::string::npos)
      << said;
  EXPECT_TRUE(r.is(z, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
  r.sim.free(out);
}

// The same kernel allowed more probes (OFFLOAD_CAP_RECOMPUTE_PROBES): the launch with a range at
// the position its first twelve never saw is watched instead, found to read it only, and the
// range keeps its producer.
TEST(RecomputeWhy, MoreProbesLearnAPositionTheFirstOnesNeverSaw) {
  Rig r(5, Fault::None, true, 1, false, 15);
  const DevPtr x = learned_input(r, true);
  const DevPtr out = r.sim.alloc(kGran);
  std::memset(words(out), 0, kGran);
  const Func wide = probe_wide(r, x, out);
  const uint64_t probes = r.res.stats().probes;
  const DevPtr z = r.alloc();
  r.launch(r.scale, {z, x});
  const DevPtr w = r.alloc();
  r.launch(wide, {w, out, out, out, out, z});
  EXPECT_EQ(r.res.stats().probes, probes + 1);
  EXPECT_EQ(r.res.stats().probes_spent, 0u);
  r.evict({z}, {x});
  EXPECT_EQ(why(r, z), Made);
  EXPECT_TRUE(r.is(z, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
  r.sim.free(out);
}

// The writers that kept ranges from being made again are counted by the last write since each
// range's producer, and the most bytes first: a learned write that took the producer (bump, twice)
// and one not learned yet (zero, once).
TEST(RecomputeWhy, TheWritersThatKeepRangesFromBeingMadeAgainAreCounted) {
  Rig r(5, Fault::RecomputeNoUpdates);
  const DevPtr x = learned_input(r, true);
  EXPECT_EQ(r.res.rc_top_writers(5), "");
  for (int i = 0; i < 3; ++i) {
    const Func f = i < 2 ? r.bump : r.zero;
    const DevPtr y = r.alloc();
    r.launch(r.scale, {y, x});
    ::testing::internal::CaptureStderr();
    r.launch(f, {y});
    const std::string said = ::testing::internal::GetCapturedStderr();
    if (i == 0) {  // the first take is named, with why bump is not kept as y's producer
      EXPECT_NE(said.find("recompute: kernel bump writes ranges other launches made"), std::string::npos) << said;
      EXPECT_NE(said.find("(updates in place are off (OFFLOAD_CAP_RECOMPUTE_UPDATES))"), std::string::npos) << said;
    }
    r.evict({y}, {x});
    r.use(y);
    r.free(y);
  }
  const Residency::Stats st = r.res.stats();
  EXPECT_EQ(st.copied_lost + st.remake_written, 3u);
  const std::string top = r.res.rc_top_writers(5);
  EXPECT_EQ(top.find("bump: 2 ranges"), 0u) << top;
  EXPECT_NE(top.find("; zero: 1 ranges"), std::string::npos) << top;
  EXPECT_EQ(r.res.rc_top_writers(1).find(';'), std::string::npos);
}

}  // namespace
}  // namespace recompute_test
}  // namespace offload

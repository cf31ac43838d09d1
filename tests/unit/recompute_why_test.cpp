// Recompute's account of the ranges it did not make again (Residency::Stats): every range copied
// in with recompute on is counted by why no launch made it instead, so that a run on a GPU says
// which rule stands between its ranges and being made again.
#include "recompute_rig.h"

namespace offload {
namespace recompute_test {
namespace {

struct Why {
  uint64_t made, lasting, unmade, lost, written, stale, away;
  explicit Why(const Residency::Stats& s)
      : made(s.recomputed), lasting(s.copied_lasting), unmade(s.copied_unmade), lost(s.copied_lost),
        written(s.remake_written), stale(s.remake_stale), away(s.remake_away) {}
  Why operator-(const Why& o) const {
    Why d = *this;
    d.made -= o.made, d.lasting -= o.lasting, d.unmade -= o.unmade, d.lost -= o.lost, d.written -= o.written;
    d.stale -= o.stale, d.away -= o.away;
    return d;
  }
  uint64_t total() const { return made + lasting + unmade + lost + written + stale + away; }
};

TEST(RecomputeWhy, EachRangeCopiedInSaysWhyNoLaunchMadeIt) {
  Rig r(4);
  const DevPtr x = learned_input(r, true);
  learn(r, r.rng, 1, {x});

  // Made again: in none of the copied counts.
  Why w0(r.res.stats());
  const DevPtr y = produce_and_evict(r, x);
  r.use(y);
  Why d = Why(r.res.stats()) - w0;
  EXPECT_EQ(d.made, 1u);
  EXPECT_EQ(d.total(), 1u);
  r.free(y);

  // Its producer taken by a later launch that wrote it (bump, learned to write its operand).
  w0 = Why(r.res.stats());
  const DevPtr z = r.alloc();
  r.launch(r.scale, {z, x});
  r.launch(r.bump, {z});
  r.evict({z}, {x});
  r.use(z);
  d = Why(r.res.stats()) - w0;
  EXPECT_EQ(d.lost, 1u);
  EXPECT_EQ(d.total(), 1u);
  EXPECT_TRUE(r.is(z, [](uint64_t i) { return 3 * (7000 + i) + 1 + 1; }));

  // The next life of its range forgets the producer lost in this one.
  r.free(z);
  std::vector<DevPtr> others;
  DevPtr n = r.alloc();
  while (n != z && others.size() < 3) others.push_back(std::exchange(n, r.alloc()));
  ASSERT_EQ(n, z);  // the freed range taken again
  for (DevPtr o : others) r.free(o);
  r.launch(r.rng, {n, x});
  r.evict({n}, {x});
  w0 = Why(r.res.stats());
  r.use(n);
  d = Why(r.res.stats()) - w0;
  EXPECT_EQ(d.unmade, 1u);
  EXPECT_EQ(d.total(), 1u);
  r.free(n);

  // No producer in its life: made by a kernel that draws random numbers.
  w0 = Why(r.res.stats());
  const DevPtr u = produce_and_evict(r, x, r.rng);
  r.use(u);
  d = Why(r.res.stats()) - w0;
  EXPECT_EQ(d.unmade, 1u);
  EXPECT_EQ(d.total(), 1u);
  r.free(u);

  // An input changed since: stale, not lost.
  w0 = Why(r.res.stats());
  const DevPtr v = r.alloc();
  r.launch(r.scale, {v, x});
  r.launch(r.bump, {x});
  r.evict({v}, {x});
  r.use(v);
  d = Why(r.res.stats()) - w0;
  EXPECT_EQ(d.stale, 1u);
  EXPECT_EQ(d.total(), 1u);

  // With a step of 2 launches known, a range with no producer alive for longer than that (a
  // weight, optimizer state) is lasting.
  r.free(v);
  const DevPtr w = r.alloc();
  r.launch(r.rng, {w, x});
  for (int i = 0; i < 3; ++i) r.use(x);
  r.evict({w}, {x});
  r.res.set_period(2);  // x touched in it, half the live bytes: taken
  ASSERT_EQ(r.res.stats().period, 2u);
  w0 = Why(r.res.stats());
  r.use(w);
  d = Why(r.res.stats()) - w0;
  EXPECT_EQ(d.lasting, 1u);
  EXPECT_EQ(d.total(), 1u);
}

}  // namespace
}  // namespace recompute_test
}  // namespace offload

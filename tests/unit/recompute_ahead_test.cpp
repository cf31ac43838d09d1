// Recompute with prefetching: a range whose kernel is not checked yet is made again, and checked,
// where it is prefetched, its inputs brought back first, as a demand reload does. A range
// prefetched is never reloaded on demand: without this, a kernel whose products are prefetched
// would never be made again, never trusted, and nothing it makes would ever be dropped.
#include "recompute_rig.h"

namespace offload {
namespace recompute_test {
namespace {

// One step on a budget of three ranges: a = fill(7) + 1, y = made from a (scale; a fill of its own in
// the steps before, which give a range born at y's place, so that scale is not checked on demand
// there), three more ranges that push a and y out (a first: its next use is last), each read and
// freed, then y used (a while), then a. Returns whether y held 3 a + 1.
bool step(Rig& r, bool first, size_t freed_before = 3) {
  const DevPtr h = r.alloc();  // a launch first: a is born inside the step, and its life is learned
  r.launch(r.fill, {h, 1});
  r.free(h);
  const DevPtr a = r.alloc();
  r.launch(r.fill, {a, 7});
  r.launch(r.bump, {a});  // a written in place: no launch makes it again, so it is copied, not dropped
  const DevPtr y = r.alloc();
  if (first) r.launch(r.fill, {y, 3});
  else r.launch(r.scale, {y, a});
  std::vector<DevPtr> more;
  for (uint64_t i = 0; i < 3; ++i) {
    more.push_back(r.alloc());
    r.launch(r.fill, {more.back(), 10 + i});
  }
  r.sim.run_all();  // the copies out land
  r.res.poll();
  for (size_t i = 0; i < more.size(); ++i) {  // each read, the first `freed_before` freed: room before y's use
    r.use(more[i]);
    if (i < freed_before) r.free(more[i]);
  }
  for (int i = 0; i < 8; ++i) r.use(y);  // a's use far enough that only y is due
  const bool right = first || r.is(y, [](uint64_t i) { return 3 * (7001 + i) + 1; });
  r.use(a);
  for (size_t i = freed_before; i < more.size(); ++i) r.free(more[i]);
  r.free(y);
  r.free(a);
  return right;
}

TEST(RecomputeAhead, AKernelNotCheckedIsCheckedWhereItsRangeIsPrefetched) {
  for (Fault f : {Fault::None, Fault::RecomputeNoCheckAhead}) {
    SCOPED_TRACE(f == Fault::None ? "checked ahead" : "copied ahead");
    Rig r(3, f, true, 1, /*prefetch=*/true);
    const DevPtr x = learned_input(r, false);  // fill, scale, read learned; scale not checked
    r.free(x);
    const uint64_t before = r.tr.launches();
    step(r, true);
    r.res.set_period(r.tr.launches() - before);
    step(r, true);  // its ranges' lives, for the next step's predictions
    const Residency::Stats was = r.res.stats();
    EXPECT_TRUE(step(r, false));
    const Residency::Stats now = r.res.stats();
    EXPECT_GT(now.prefetches, was.prefetches) << "no room " << now.prefetch_no_room - was.prefetch_no_room;
    EXPECT_EQ(now.recompute_bans, 0u);
    if (f == Fault::None) {
      EXPECT_EQ(now.recompute_checks, was.recompute_checks + 1);  // scale's, ahead
      EXPECT_GE(now.recomputed, was.recomputed + 1);
    } else {
      EXPECT_EQ(now.recompute_checks, was.recompute_checks);  // y copied in ahead, never made again
    }
  }
}

// With room for y alone before its use (one of the three freed), y is not left to its use: it is
// copied in ahead as any other at the last launch before it, and its kernel waits to be checked.
TEST(RecomputeAhead, WithoutRoomForItsInputsARangeIsStillCopiedInAhead) {
  Rig r(3, Fault::None, true, 1, /*prefetch=*/true);
  const DevPtr x = learned_input(r, false);
  r.free(x);
  const uint64_t before = r.tr.launches();
  step(r, true, 1);
  r.res.set_period(r.tr.launches() - before);
  step(r, true, 1);
  const Residency::Stats was = r.res.stats();
  EXPECT_TRUE(step(r, false, 1));
  const Residency::Stats now = r.res.stats();
  EXPECT_GT(now.prefetch_hits, was.prefetch_hits);  // y, used where it was brought in ahead
  EXPECT_EQ(now.recompute_checks, was.recompute_checks);  // not made again on demand either
}

}  // namespace
}  // namespace recompute_test
}  // namespace offload

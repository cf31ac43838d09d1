// Recompute under the cap: ranges dropped at eviction (nothing copied out) once their producer's
// kernel is trusted, made again where used, or earlier, before a launch writes or the program
// frees what they are made from; and random two-stream programs against a model of their bytes.
#include "poll_threads.h"
#include "recompute_rig.h"

namespace offload {
namespace recompute_test {
namespace {

// Once its kernel is trusted, a range its producer can make again is dropped: nothing is copied
// out, nothing copied back, no host memory taken.
TEST(Recompute, ATrustedProducersRangeIsDroppedAndMadeAgain) {
  Rig r(4);
  const DevPtr x = learned_input(r, true);
  const Residency::Stats before = r.res.stats();
  const uint64_t host_before = r.res.host_stats().in_use;
  const DevPtr y = produce_and_evict(r, x);
  const Residency::Stats mid = r.res.stats();
  EXPECT_EQ(mid.dropped, before.dropped + 1);
  EXPECT_EQ(mid.bytes_out, before.bytes_out + (mid.evictions - before.evictions - 1) * kGran);  // y's copied nothing
  EXPECT_EQ(r.res.host_stats().in_use, host_before + (mid.evictions - before.evictions - 1) * kGran);
  r.use(y);
  EXPECT_EQ(r.res.stats().recomputed, mid.recomputed + 1);
  EXPECT_EQ(r.res.stats().bytes_in, mid.bytes_in);
  EXPECT_TRUE(r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
}

// A launch about to write a range that dropped ranges are made from: they are made again first,
// from the bytes it still holds. Without that they could not be made again at all.
TEST(Recompute, AWriteToAnInputMakesItsDroppedRangesAgainFirst) {
  auto run = [](Fault f) {
    Rig r(4, f);
    const DevPtr x = learned_input(r, true);
    const DevPtr y = produce_and_evict(r, x);
    EXPECT_EQ(r.res.stats().dropped, 1u);
    r.launch(r.bump, {x});
    EXPECT_EQ(r.res.stats().restored_early, 1u);
    r.use(y);
    EXPECT_TRUE(r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
    EXPECT_TRUE(r.is(x, [](uint64_t i) { return 7000 + i + 1; }));
  };
  run(Fault::None);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(run(Fault::RecomputeNoWriteGuard), "could not be made again: its bytes are lost");
}

TEST(Recompute, AFreeOfAnInputMakesItsDroppedRangesAgainFirst) {
  Rig r(4);
  const DevPtr x = learned_input(r, true);
  const DevPtr y = produce_and_evict(r, x);
  ASSERT_EQ(r.res.stats().dropped, 1u);
  r.free(x);
  EXPECT_EQ(r.res.stats().restored_early, 1u);
  r.use(y);
  EXPECT_TRUE(r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
}

// A range written besides a dropped one (its side) and then freed: the dropped range is made
// again first, while the side is still mapped where the launch writes it. Without that it could
// not be made again at all, and the process stops.
TEST(Recompute, AFreeOfASideMakesItsDroppedRangesAgainFirst) {
  auto run = [](Fault f) {
    Rig r(7, f);  // a drop needs room for y, x, stats and the buffer stats is kept in, beside norm's 3
    const DevPtr x = learned_input(r, false);
    const DevPtr stats = r.alloc();
    r.launch(r.fill, {stats, 0});
    trust_norm(r, x, stats);
    const DevPtr y = r.alloc();
    r.launch(r.norm, {y, x, stats});
    const uint64_t dropped = r.res.stats().dropped;
    r.evict({y}, {x, stats});
    ASSERT_EQ(r.res.stats().dropped, dropped + 1);
    r.free(stats);
    EXPECT_EQ(r.res.stats().restored_early, 1u);
    r.use(y);
    EXPECT_TRUE(r.is(y, [](uint64_t i) { return 2 * (7000 + i); }));
  };
  run(Fault::None);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(run(Fault::RecomputeNoWriteGuard), "could not be made again: its bytes are lost");
}

// The buffer a side is kept in is held once made, inside the budget, and let go last when a
// launch needs its room: here one that touches the whole budget.
TEST(Recompute, TheBufferSidesAreKeptInIsLetGoForRoom) {
  Rig r(4);
  const DevPtr x = learned_input(r, false);
  const DevPtr stats = r.alloc();
  r.launch(r.fill, {stats, 0});
  const uint64_t ran = trust_norm(r, x, stats);  // its remake made the buffer, one granule
  EXPECT_EQ(r.res.stats().side_kept, 1u);
  EXPECT_EQ(r.res.stats().held, 4 * kGran);  // x, stats, the buffer, and a freed range kept for reuse
  const DevPtr a = r.alloc();
  r.launch(r.fill, {a, 4});
  const DevPtr out = r.alloc();
  r.launch(r.sum3, {out, x, stats, a});  // four granules at once: the buffer goes
  EXPECT_TRUE(r.is(out, [&](uint64_t i) { return 7000 + i + (i ? i : ran) + 4000 + i; }));
  EXPECT_EQ(r.res.stats().refused_launches, 0u);
}

// With drop_first, a range that can be dropped is evicted before one used longer ago that would
// be copied out: nothing crosses the link for it.
TEST(Recompute, ARangeThatCanBeDroppedGoesFirstWithDropFirst) {
  for (uint32_t factor : {1u, 16u}) {
    SCOPED_TRACE(factor);
    Rig r(4, Fault::None, true, factor);
    const DevPtr x = learned_input(r, true);
    const DevPtr z = r.alloc();
    r.launch(r.fill, {z, 8});  // fill is not checked: z would be copied out
    const DevPtr y = r.alloc();
    r.launch(r.scale, {y, x});  // scale is: y can be dropped
    r.use(x);
    const Residency::Stats before = r.res.stats();
    const DevPtr w = r.alloc();  // a fourth granule: one of z and y goes
    r.launch(r.fill, {w, 9});
    r.sim.run_all();
    r.res.poll();
    const Residency::Stats after = r.res.stats();
    EXPECT_EQ(after.evictions, before.evictions + 1);
    if (factor == 1) {
      EXPECT_EQ(r.state(z), Residency::State::OnHost);  // used longest ago
      EXPECT_EQ(after.bytes_out, before.bytes_out + kGran);
    } else {
      EXPECT_EQ(r.state(y), Residency::State::OnHost);
      EXPECT_EQ(after.dropped, before.dropped + 1);
      EXPECT_EQ(after.bytes_out, before.bytes_out);  // nothing copied out
    }
    r.use(y);
    EXPECT_TRUE(r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
    r.use(z);
    EXPECT_TRUE(r.is(z, [](uint64_t i) { return 8000 + i; }));
  }
}

// An input evicted (copied out) after the drop comes back first, then the range is made from it.
TEST(Recompute, AnInputEvictedAfterTheDropIsReloadedToMakeItAgain) {
  Rig r(4);
  const DevPtr x = learned_input(r, true);
  const DevPtr y = produce_and_evict(r, x);
  ASSERT_EQ(r.res.stats().dropped, 1u);
  r.evict({x}, {});
  const Residency::Stats before = r.res.stats();
  r.use(y);
  EXPECT_EQ(r.res.stats().recomputed, before.recomputed + 1);
  EXPECT_EQ(r.res.stats().bytes_in, before.bytes_in + kGran);  // x's
  EXPECT_TRUE(r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
  EXPECT_TRUE(r.is(x, [](uint64_t i) { return 7000 + i; }));
}

// No drop where making the range again could not find room: it and its inputs beside what one
// launch has needed must fit the budget.
TEST(Recompute, NothingIsDroppedWithoutRoomToMakeItAgain) {
  Rig r(3);
  const DevPtr x = learned_input(r, true);  // scale needed 2 granules: y and x with it would need 4
  const DevPtr y = produce_and_evict(r, x);
  EXPECT_EQ(r.res.stats().dropped, 0u);
  r.use(y);
  EXPECT_TRUE(r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
}

// A chain on `granules`: a = scale(x), y = scale(a), a evicted first, then y. Returns the ranges
// it dropped, leaving a and y in *a and *y.
uint64_t chain(Rig& r, DevPtr x, DevPtr* a, DevPtr* y) {
  *a = r.alloc();
  r.launch(r.scale, {*a, x});
  *y = r.alloc();
  r.launch(r.scale, {*y, *a});
  const uint64_t dropped = r.res.stats().dropped;
  r.evict({*a}, {x, *y});
  r.evict({*y}, {x});
  return r.res.stats().dropped - dropped;
}
bool chained(Rig& r, DevPtr y) { return r.is(y, [](uint64_t i) { return 3 * (3 * (7000 + i) + 1) + 1; }); }

// A range made from a dropped range is dropped too once its kernel is trusted (a chain: a layer's
// norm, then the GEMM reading it), and made again where used, the dropped input made again first.
// Without chains it is copied out.
TEST(Recompute, ARangeMadeFromADroppedOneIsDroppedTooAndBothAreMadeAgain) {
  for (Fault f : {Fault::None, Fault::RecomputeNoChains}) {
    SCOPED_TRACE(f == Fault::None ? "chains" : "no chains");
    Rig r(6, f);
    const DevPtr x = learned_input(r, true);
    DevPtr a, y;
    EXPECT_EQ(chain(r, x, &a, &y), f == Fault::None ? 2u : 1u);
    const uint64_t in = r.res.stats().bytes_in;
    r.use(y);
    if (f == Fault::None) {
      EXPECT_EQ(r.res.stats().bytes_in, in);  // nothing copied: a, then y, made again
    }
    EXPECT_TRUE(chained(r, y));
    r.use(a);
    EXPECT_TRUE(r.is(a, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
  }
}

// A chain is dropped only where making it all again fits beside the largest launch: y from a
// dropped a needs y, a and x (three ranges) beside scale's two, which four cannot hold; counted
// as y and a alone, it would be dropped.
TEST(Recompute, AChainIsDroppedOnlyWhereMakingItAllAgainFits) {
  for (Fault f : {Fault::None, Fault::RecomputeChainRoomFlat}) {
    SCOPED_TRACE(f == Fault::None ? "the chain's room" : "its own inputs' room");
    Rig r(4, f);
    const DevPtr x = learned_input(r, true);
    DevPtr a, y;
    EXPECT_EQ(chain(r, x, &a, &y), f == Fault::None ? 1u : 2u);
    r.use(y);
    EXPECT_TRUE(chained(r, y));
  }
}

// Random programs on two streams under a small budget, recompute on, scale trusted from the start:
// every range reads back what a model of the program says, whatever was made again, copied back or
// refused. (With versions ignored, some of its checks fail; without the write guard a dropped
// range is lost and the process stops.) With Sides, norm (trusted too) makes ranges as well,
// writing a shared statistics range besides them, which the program also writes, reads and frees;
// with Smalls, addb (trusted too) makes ranges from a small allocation (a bias), which the program
// also writes by launches touching it alone and frees for another; with Aliases, add2 makes
// ranges from two others and also updates one in place from another (its output and first input
// the same range), learned as the program runs; with SmallSides, normb (trusted too) makes ranges
// writing a new small allocation each besides them (a norm's mean), which the program later
// writes or frees.
struct Totals {
  uint64_t remade = 0, dropped = 0, early = 0, side_kept = 0;
};
enum class Mode { Plain, Sides, Smalls, Aliases, SmallSides };
void random_program(uint64_t seed, Mode mode, Totals* t) {
  SCOPED_TRACE(seed);
  const bool sides = mode == Mode::Sides;
  std::mt19937_64 rng(seed);
  Rig r(3 + seed % 2 + (sides ? 2 : 0));
  const DevPtr x0 = r.alloc();
  r.launch(r.fill, {x0, 3});
  learn_common(r, x0);
  trust_scale(r, x0);  // from here on only the rules stand between a wrong remake and a range
  struct Live {
    DevPtr p;
    Stream last;
    std::vector<uint64_t> want;
  };
  std::vector<Live> live{{x0, kA, {}}};
  for (uint64_t i = 0; i < kWords; ++i) live[0].want.push_back(3000 + i);
  DevPtr ws = 0;  // the statistics norm writes, while live
  if (sides) {
    ws = r.alloc();
    r.launch(r.fill, {ws, 0});
    live.push_back({ws, kA, std::vector<uint64_t>(kWords)});
    for (uint64_t i = 0; i < kWords; ++i) live[1].want[i] = i;
    live[1].want[0] = trust_norm(r, x0, ws);
  }
  DevPtr bs = 0;  // the bias addb reads
  Stream bs_last = kA;
  uint64_t bs_v = 1;  // every word of it
  if (mode == Mode::Smalls) {
    bs = r.small_alloc();
    r.launch(r.setb, {bs, bs_v});
    trust_addb(r, x0, bs);
  }
  struct SmallLive {
    DevPtr p;
    Stream last;
    uint64_t want[8];
  };
  std::vector<SmallLive> smalls;  // the small sides normb wrote, while live
  if (mode == Mode::SmallSides) {
    const DevPtr s0 = r.small_alloc();
    r.launch(r.setb, {s0, 0});
    learn(r, r.normb, 1, {x0, s0});
    const DevPtr y = r.alloc(), s1 = r.small_alloc();  // trusted: made once, evicted, made again
    r.launch(r.normb, {y, x0, s1});
    r.evict({y}, {x0});
    r.use(y);
    r.free(y);
  }
  auto check_small = [&](const SmallLive& m) {
    r.sim.run_all();
    EXPECT_EQ(std::memcmp(words(m.p), m.want, sizeof m.want), 0);
  };
  auto find = [&](DevPtr p) { return std::find_if(live.begin(), live.end(), [&](const Live& l) { return l.p == p; }); };
  auto join = [&](Stream from, Stream to) {
    if (from == to) return;
    const uint64_t ev = r.sim.create_event();
    r.sim.record_event(ev, from);
    r.sim.stream_wait(to, ev);
    r.sim.destroy_event(ev);
  };
  auto check = [&](Live& l) {
    r.use(l.p, l.last);
    r.sim.run_all();
    EXPECT_EQ(std::memcmp(words(l.p), l.want.data(), kGran), 0);
  };
  for (int op = 0; op < 300; ++op) {
    const Stream s = rng() % 3 ? kA : kB;
    Live& src = live[rng() % live.size()];
    const int what = int(rng() % 10);
    if (what < 4 && live.size() < 5 + seed % 3 + (sides ? 1 : 0)) {  // a new range, from another or filled
      Live n{r.alloc(s), s, std::vector<uint64_t>(kWords)};
      const auto w = find(ws);
      Live& other = live[rng() % live.size()];
      if ((what == 1 || what == 2) && mode == Mode::Aliases) {  // add2: src + other
        join(src.last, s);
        join(other.last, s);
        r.launch(r.add2, {n.p, src.p, other.p}, s);
        for (uint64_t i = 0; i < kWords; ++i) n.want[i] = src.want[i] + other.want[i];
        src.last = other.last = s;
      } else if ((what == 1 || what == 2) && mode == Mode::SmallSides) {  // normb: 2 src, a new m[0] counts it
        const DevPtr m = r.small_alloc();
        SmallLive ml{m, s, {}};
        for (uint64_t i = 0; i < 8; ++i) ml.want[i] = words(m)[i] = 100 * uint64_t(op) + i;  // what the pool left there
        ++ml.want[0];
        join(src.last, s);
        r.launch(r.normb, {n.p, src.p, m}, s);
        for (uint64_t i = 0; i < kWords; ++i) n.want[i] = 2 * src.want[i];
        smalls.push_back(ml);
        src.last = s;
      } else if ((what == 1 || what == 2) && bs) {  // addb: src + the bias
        join(src.last, s);
        join(bs_last, s);
        r.launch(r.addb, {n.p, src.p, bs}, s);
        for (uint64_t i = 0; i < kWords; ++i) n.want[i] = src.want[i] + bs_v;
        src.last = bs_last = s;
      } else if ((what == 1 || what == 2) && w != live.end() && src.p != ws) {  // norm: 2 src, and ws[0] counts it
        join(src.last, s);
        join(w->last, s);
        r.launch(r.norm, {n.p, src.p, ws}, s);
        for (uint64_t i = 0; i < kWords; ++i) n.want[i] = 2 * src.want[i];
        ++w->want[0];
        src.last = w->last = s;
      } else if (what < 3) {
        join(src.last, s);
        r.launch(r.scale, {n.p, src.p}, s);
        for (uint64_t i = 0; i < kWords; ++i) n.want[i] = 3 * src.want[i] + 1;
        src.last = s;
      } else {
        const uint64_t k = rng() % 100;
        r.launch(r.fill, {n.p, k}, s);
        for (uint64_t i = 0; i < kWords; ++i) n.want[i] = k * 1000 + i;
      }
      live.push_back(std::move(n));
    } else if (what < 6 && bs && rng() % 3 == 0) {  // the bias written, or freed and another made
      join(bs_last, s);
      if (rng() % 4 == 0) {
        join(s, kA);
        r.small_free(bs);
        bs = r.small_alloc();
      }
      bs_v = rng() % 50;
      r.launch(r.setb, {bs, bs_v}, s);
      bs_last = s;
    } else if (what < 6 && !smalls.empty() && rng() % 2) {  // a small side written, or freed
      const size_t k = rng() % smalls.size();
      SmallLive& m = smalls[k];
      join(m.last, s);
      if (rng() % 2) {
        join(s, kA);
        check_small(m);
        r.small_free(m.p);
        smalls.erase(smalls.begin() + long(k));
      } else {
        const uint64_t v = rng() % 50;
        r.launch(r.setb, {m.p, v}, s);
        std::fill(m.want, m.want + 8, v);
        m.last = s;
      }
    } else if (what < 6 && mode == Mode::Aliases && rng() % 2) {  // src += other, in place
      Live& other = live[rng() % live.size()];
      join(src.last, s);
      join(other.last, s);
      r.launch(r.add2, {src.p, src.p, other.p}, s);
      const std::vector<uint64_t> add = other.want;  // other may be src
      for (uint64_t i = 0; i < kWords; ++i) src.want[i] += add[i];
      src.last = other.last = s;
    } else if (what < 6) {  // written in place
      join(src.last, s);
      r.launch(r.bump, {src.p}, s);
      for (uint64_t& w : src.want) ++w;
      src.last = s;
    } else if (what < 8 || live.size() < 3 || (src.p == ws && rng() % 8)) {  // read (ws rarely freed)
      join(src.last, s);
      r.use(src.p, s);
      src.last = s;
    } else {  // freed
      const size_t k = size_t(&src - live.data());
      join(src.last, s);
      r.free(src.p, s);
      if (src.p == ws) ws = 0;
      live.erase(live.begin() + long(k));
    }
    for (int g = int(rng() % 8); g-- > 0 && r.sim.step(rng);) {
    }
    if (op % 50 == 49) check(live[rng() % live.size()]);
  }
  for (Live& l : live) check(l);
  for (const SmallLive& m : smalls) check_small(m);
  t->remade += r.res.stats().recomputed;
  t->dropped += r.res.stats().dropped;
  t->early += r.res.stats().restored_early;
  t->side_kept += r.res.stats().side_kept;
}

TEST(Recompute, RandomProgramsReadBackTheirBytes) {
  Totals t;
  for (uint64_t seed = 1; seed <= 6; ++seed) random_program(seed, Mode::Plain, &t);
  EXPECT_GT(t.remade, 0u);   // the programs do make ranges again,
  EXPECT_GT(t.dropped, 0u);  // drop ranges instead of copying them out,
  EXPECT_GT(t.early, 0u);    // and make dropped ranges again before their inputs are written
}

TEST(Recompute, RandomProgramsWithSmallInputsReadBackTheirBytes) {
  Totals t;
  for (uint64_t seed = 1; seed <= 6; ++seed) random_program(seed, Mode::Smalls, &t);
  EXPECT_GT(t.remade, 6u);   // more than each check of addb's
  EXPECT_GT(t.dropped, 0u);
  EXPECT_GT(t.early, 0u);    // made again before the bias was written or freed
}

// add2 learned from launches in place and out of place alike: ranges it makes are made again, and
// its in-place updates still move the versions they must.
TEST(Recompute, RandomProgramsWithUpdatesInPlaceReadBackTheirBytes) {
  Totals t;
  for (uint64_t seed = 1; seed <= 6; ++seed) random_program(seed, Mode::Aliases, &t);
  EXPECT_GT(t.remade, 6u);  // more than each trust_scale's one
  EXPECT_GT(t.dropped, 0u);
}

TEST(Recompute, RandomProgramsWithSmallSidesReadBackTheirBytes) {
  Totals t;
  for (uint64_t seed = 1; seed <= 6; ++seed) random_program(seed, Mode::SmallSides, &t);
  EXPECT_GT(t.side_kept, 6u);  // more than each trust's one
  EXPECT_GT(t.dropped, 0u);
  EXPECT_GT(t.early, 0u);  // made again before a small side was freed
}

TEST(Recompute, RandomProgramsWithSidesReadBackTheirBytes) {
  Totals t;
  for (uint64_t seed = 1; seed <= 6; ++seed) random_program(seed, Mode::Sides, &t);
  EXPECT_GT(t.side_kept, 6u);  // more than each trust_norm's one
  EXPECT_GT(t.dropped, 0u);
}

// Two threads, each on its own stream with its own input, making ranges from it, writing it in
// place, reading and freeing, under a budget that makes them evict (and drop) each other's ranges,
// while a third polls as the shim's worker does: every range checks out on the GPU.
TEST(RecomputeThreads, OwnStreamsKeepTheirBytes) {
  Rig r(4);
  {
    const DevPtr x = learned_input(r, true);
    r.free(x);
  }
  r.sim.run_all();
  auto loop = [&](Stream s, uint64_t seed) {
    std::mt19937_64 rng(seed);
    const DevPtr x = r.alloc(s);
    r.launch(r.fill, {x, seed}, s);
    uint64_t base = seed * 1000;
    std::vector<std::pair<DevPtr, uint64_t>> ys;  // a range made by scale, and the base it was made from
    for (int i = 0; i < 40; ++i) {
      if (ys.size() < 4) {
        const DevPtr y = r.alloc(s);
        r.launch(r.scale, {y, x}, s);
        ys.push_back({y, base});
      }
      const auto& [y, b] = ys[rng() % ys.size()];
      r.launch(r.check, {y, b}, s);
      if (rng() % 4 == 0) {
        r.launch(r.bump, {x}, s);
        ++base;
      }
      if (rng() % 5 == 0) {
        const size_t k = rng() % ys.size();
        r.free(ys[k].first, s);
        ys.erase(ys.begin() + long(k));
      }
    }
    for (const auto& [y, b] : ys) r.launch(r.check, {y, b}, s);
    for (const auto& [y, b] : ys) r.free(y, s);
    r.free(x, s);
  };
  run_two_polled(r.res, kA, kB, loop);
  r.sim.run_all();
  EXPECT_EQ(r.bad.load(), 0u) << r.bad_what;
  const Residency::Stats st = r.res.stats();
  EXPECT_GT(st.evictions, 0u);
  EXPECT_GT(st.recomputed, 1u);  // more than trust_scale's
  EXPECT_GT(st.dropped, 0u);
}

// The same with a workspace and a bias of each thread's own: norm makes ranges writing the
// workspace besides them (kept across every launch made again) and addb makes ranges from the bias
// (a small allocation), which each thread also writes now and then.
TEST(RecomputeThreads, OwnWorkspacesAndBiasesKeepTheirBytes) {
  Rig r(7);
  {
    const DevPtr x = learned_input(r, true);
    const DevPtr ws = r.alloc();
    r.launch(r.fill, {ws, 0});
    trust_norm(r, x, ws);
    const DevPtr b = r.small_alloc();
    r.launch(r.setb, {b, 1});
    trust_addb(r, x, b);
    r.free(ws);
    r.free(x);
    r.small_free(b);
  }
  r.sim.run_all();
  auto loop = [&](Stream s, uint64_t seed) {
    std::mt19937_64 rng(seed);
    const DevPtr x = r.alloc(s), ws = r.alloc(s);
    r.launch(r.fill, {x, seed}, s);
    r.launch(r.fill, {ws, 0}, s);
    const DevPtr b = r.small_alloc();
    uint64_t base = seed * 1000, v = 1;
    r.launch(r.setb, {b, v}, s);
    struct Made {
      DevPtr p;
      bool by_norm;
      uint64_t base, v;
    };
    std::vector<Made> ys;
    for (int i = 0; i < 40; ++i) {
      if (ys.size() < 6) {
        const DevPtr y = r.alloc(s);
        const bool by_norm = rng() % 2;
        if (by_norm) r.launch(r.norm, {y, x, ws}, s);
        else r.launch(r.addb, {y, x, b}, s);
        ys.push_back({y, by_norm, base, v});
      }
      const Made& m = ys[rng() % ys.size()];
      if (m.by_norm) r.launch(r.checkn, {m.p, m.base}, s);
      else r.launch(r.checkb, {m.p, m.base, m.v}, s);
      if (rng() % 5 == 0) {
        r.launch(r.bump, {x}, s);
        ++base;
      }
      if (rng() % 5 == 0) {
        v = rng() % 50;
        r.launch(r.setb, {b, v}, s);
      }
      if (rng() % 5 == 0) {
        const size_t k = rng() % ys.size();
        r.free(ys[k].p, s);
        ys.erase(ys.begin() + long(k));
      }
    }
    for (const Made& m : ys) {
      if (m.by_norm) r.launch(r.checkn, {m.p, m.base}, s);
      else r.launch(r.checkb, {m.p, m.base, m.v}, s);
    }
    for (const Made& m : ys) r.free(m.p, s);
    r.free(ws, s);
    r.free(x, s);
  };
  run_two_polled(r.res, kA, kB, loop);
  r.sim.run_all();
  EXPECT_EQ(r.bad.load(), 0u) << r.bad_what;
  const Residency::Stats st = r.res.stats();
  EXPECT_GT(st.evictions, 0u);
  EXPECT_GT(st.side_kept, 1u);  // more than trust_norm's
  EXPECT_GT(st.recomputed, 3u);
}

}  // namespace
}  // namespace recompute_test
}  // namespace offload

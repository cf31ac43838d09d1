// Recompute under the cap (Residency::Options::recompute), on the simulated driver: a range that
// one launch produced is made again by that launch instead of copied back, and only when it is
// safe. Each refusal rule has a test that fails when the rule is switched off (a Fault): an input
// changed after the original launch, a kernel that draws random numbers, a kernel that writes
// outside its output, a kernel whose remake differs from the saved bytes, and the two stream
// orders (after an input's reload; a later writer after the remake).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "core/event_log.h"
#include "core/sim_driver.h"
#include "core/tracker.h"
#include "residency/host_store.h"
#include "residency/residency.h"

namespace offload {
namespace recompute_test {
namespace {

using Fault = Residency::Options::Fault;
constexpr uint64_t kGran = 64 << 10;
constexpr uint64_t kWords = kGran / 8;
constexpr Stream kA = 0x2000, kB = 0x3000;

uint64_t* words(uint64_t p) { return reinterpret_cast<uint64_t*>(p); }
uint64_t arg(const unsigned char* a, int i) {
  uint64_t v;
  std::memcpy(&v, a + 8 * i, 8);
  return v;
}
std::vector<ParamInfo> params(int n) {
  std::vector<ParamInfo> p;
  for (int i = 0; i < n; ++i) p.push_back({uint32_t(8 * i), 8});
  return p;
}

// The shim's wiring for ranges, with kernels the simulated driver can launch again.
struct Rig {
  explicit Rig(uint64_t granules, Fault fault = Fault::None, bool recompute = true)
      : tr(sim, log), host(sim, host_options()), res(sim, host, options(granules, fault, recompute)) {
    tr.set_gate(&res);
    res.set_namer([](void* t, uint32_t k) { return static_cast<Tracker*>(t)->funcs().name(k); }, &tr);
    // fill(out, seed): out[i] = seed * 1000 + i
    fill = sim.add_kernel("fill", params(2), [](const unsigned char* a) {
      for (uint64_t i = 0; i < kWords; ++i) words(arg(a, 0))[i] = arg(a, 1) * 1000 + i;
    });
    // scale(out, in): out = 3 in + 1, an elementwise kernel
    scale = sim.add_kernel("scale", params(2), [](const unsigned char* a) {
      for (uint64_t i = 0; i < kWords; ++i) words(arg(a, 0))[i] = 3 * words(arg(a, 1))[i] + 1;
    });
    // bump(p): p += 1, in place
    bump = sim.add_kernel("bump", params(1), [](const unsigned char* a) {
      for (uint64_t i = 0; i < kWords; ++i) words(arg(a, 0))[i] += 1;
    });
    // read(p): reads p, writes nothing
    read = sim.add_kernel("read", params(1), [](const unsigned char* a) {
      volatile uint64_t sink = 0;
      for (uint64_t i = 0; i < kWords; ++i) sink = sink + words(arg(a, 0))[i];
    });
    // A dropout-like kernel: each run draws from the generator's state, which advances.
    rng = sim.add_kernel("philox_masked_scale", params(2), [this](const unsigned char* a) {
      const uint64_t draw = ++draws;
      for (uint64_t i = 0; i < kWords; ++i) words(arg(a, 0))[i] = words(arg(a, 1))[i] ^ (draw << 32);
    });
    // An atomically accumulated result: its bytes depend on how often it ran (nothing in the name
    // says so).
    noisy = sim.add_kernel("reduce_atomic", params(2), [this](const unsigned char* a) {
      const uint64_t run = ++runs;
      for (uint64_t i = 0; i < kWords; ++i) words(arg(a, 0))[i] = words(arg(a, 1))[i] + run;
    });
    // norm(out, in, stats): out = 2 in, and stats[0] counts the launches (running statistics).
    norm = sim.add_kernel("norm_with_stats", params(3), [](const unsigned char* a) {
      for (uint64_t i = 0; i < kWords; ++i) words(arg(a, 0))[i] = 2 * words(arg(a, 1))[i];
      words(arg(a, 2))[0] += 1;
    });
    // zero(p): p = 0
    zero = sim.add_kernel("zero", params(1), [](const unsigned char* a) {
      for (uint64_t i = 0; i < kWords; ++i) words(arg(a, 0))[i] = 0;
    });
    // relu(p): p = max(p, 0), in place, on signed words
    relu = sim.add_kernel("relu", params(1), [](const unsigned char* a) {
      for (uint64_t i = 0; i < kWords; ++i) words(arg(a, 0))[i] = std::max<int64_t>(int64_t(words(arg(a, 0))[i]), 0);
    });
    // split(a, b, in): two new ranges at once
    split = sim.add_kernel("split", params(3), [](const unsigned char* a) {
      for (uint64_t i = 0; i < kWords; ++i) {
        words(arg(a, 0))[i] = words(arg(a, 2))[i] + 5;
        words(arg(a, 1))[i] = words(arg(a, 2))[i] + 7;
      }
    });
  }
  ~Rig() { sim.run_all(); }

  static HostStore::Options host_options() {
    HostStore::Options o;
    o.chunk_bytes = 1 << 20;
    o.limit = 64 << 20;
    return o;
  }
  static Residency::Options options(uint64_t granules, Fault fault, bool recompute) {
    Residency::Options o;
    o.budget = granules * kGran;
    o.pool_floor = 0;
    o.pool_step = 0;
    o.prefetch = false;  // reloads happen where a launch needs them: the tests say where
    o.low_water = 1;     // nothing evicted ahead: evictions happen where room is needed
    o.recompute = recompute;
    o.fault = fault;
    return o;
  }

  DevPtr alloc(Stream s = kA) {
    uint64_t tag = 0;
    bool refused = false;
    const DevPtr p = res.alloc(kGran, s, &tag, &refused);
    EXPECT_NE(p, 0u) << res.error();
    if (p) tr.on_alloc(p, kGran, s, tag);
    return p;
  }
  void free(DevPtr p, Stream s = kA) {
    tr.on_free(p, s);
    EXPECT_TRUE(res.free(p, s));
  }
  // A launch as the hook makes it: the tracker (whose gate is the manager) with its geometry,
  // then the driver.
  void launch(Func f, std::vector<uint64_t> args, Stream s = kA) {
    std::vector<void*> p(args.size());
    for (size_t i = 0; i < args.size(); ++i) p[i] = &args[i];
    const LaunchGeom g;
    tr.on_kernel(f, s, p.data(), nullptr, &g);
    ASSERT_FALSE(Residency::take_refusal()) << res.error();
    ASSERT_TRUE(sim.launch_kernel(f, g, s, p.data()));
    res.after_launch();
  }
  // Touches `p` on `s` with a launch that reads it (reloading or remaking it first).
  void use(DevPtr p, Stream s = kA) { launch(read, {p}, s); }
  Residency::State state(DevPtr p) { return res.state_of(p); }
  // Takes room until every one of `out` is on the host, `keep` used before each taking (the least
  // recently used go first), then gives the room back.
  void evict(std::initializer_list<DevPtr> out, std::initializer_list<DevPtr> keep) {
    std::vector<DevPtr> extras;
    auto resident = [&] {
      for (DevPtr p : out)
        if (state(p) == Residency::State::Resident || state(p) == Residency::State::CopyingIn) return true;
      return false;
    };
    for (int i = 0; i < 16 && resident(); ++i) {
      for (DevPtr p : keep) use(p);
      extras.push_back(alloc());
      launch(fill, {extras.back(), 99});
    }
    sim.run_all();
    res.poll();
    for (DevPtr p : out) EXPECT_EQ(state(p), Residency::State::OnHost);
    for (DevPtr p : keep) EXPECT_NE(state(p), Residency::State::OnHost);
    for (DevPtr p : extras) free(p);
  }
  uint64_t word(DevPtr p, uint64_t i) {
    sim.run_all();
    res.poll();
    return words(p)[i];
  }
  bool is(DevPtr p, std::function<uint64_t(uint64_t)> want) {
    sim.run_all();
    for (uint64_t i = 0; i < kWords; ++i)
      if (words(p)[i] != want(i)) return false;
    return true;
  }

  SimDriver sim_{};
  SimDriver& sim = granular(sim_);
  static SimDriver& granular(SimDriver& s) {
    s.set_granularity(kGran);
    return s;
  }
  EventLog log{1 << 12, 1 << 16};
  Tracker tr;
  HostStore host;
  Residency res;
  Func fill = 0, scale = 0, bump = 0, read = 0, rng = 0, noisy = 0, norm = 0, split = 0, zero = 0, relu = 0;
  uint64_t draws = 0, runs = 0;
};

// y = f(x) (scale by default), then y evicted while x stays resident. Returns y.
DevPtr produce_and_evict(Rig& r, DevPtr x, Func f = 0) {
  const DevPtr y = r.alloc();
  r.launch(f ? f : r.scale, {y, x});
  r.evict({y}, {x});
  return y;
}

// Learns what `f` writes: its first launches are watched (probed), each on `fresh` new ranges
// (made for it, freed after) and then `rest`.
void learn(Rig& r, Func f, int fresh, std::vector<DevPtr> rest) {
  for (uint8_t i = 0; i < Residency::kRecomputeProbes; ++i) {
    std::vector<uint64_t> args;
    for (int k = 0; k < fresh; ++k) args.push_back(r.alloc());
    const size_t made = args.size();
    for (DevPtr p : rest) args.push_back(p);
    r.launch(f, args);
    for (size_t k = 0; k < made; ++k) r.free(args[k]);
  }
}

// The kernels every test uses, learned: fill, scale (from x), read and bump. A kernel is watched
// only where its writes matter: where it makes a new range, or touches one a producer was made
// from, as x is while a range made from it by a learned scale lives.
void learn_common(Rig& r, DevPtr x) {
  learn(r, r.fill, 1, {5});
  learn(r, r.scale, 1, {x});
  const DevPtr t = r.alloc();
  r.launch(r.scale, {t, x});
  learn(r, r.read, 0, {x});
  r.free(t);
  learn(r, r.bump, 1, {});
}

// Makes scale trusted: one remake, checked.
void trust_scale(Rig& r, DevPtr x) {
  const DevPtr y = produce_and_evict(r, x);
  r.use(y);
  ASSERT_EQ(r.res.stats().recompute_checks, 1u);
  ASSERT_EQ(r.res.stats().recompute_bans, 0u);
  r.free(y);
}

TEST(Recompute, AProducedRangeIsMadeAgainInsteadOfCopiedIn) {
  Rig r(3);
  const DevPtr x = r.alloc();
  r.launch(r.fill, {x, 7});
  learn_common(r, x);
  const DevPtr y = produce_and_evict(r, x);
  const uint64_t in_before = r.res.stats().bytes_in;
  r.use(y);
  const Residency::Stats st = r.res.stats();
  EXPECT_EQ(st.recomputed, 1u);
  EXPECT_EQ(st.recompute_checks, 1u);  // its first remake, checked against the saved copy
  EXPECT_EQ(st.recompute_bans, 0u);
  EXPECT_EQ(st.bytes_in, in_before);   // nothing copied in for it
  EXPECT_TRUE(r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
  EXPECT_EQ(st.probes, 4u * Residency::kRecomputeProbes);  // fill, read, scale, bump
  // A second remake of the kernel is trusted: not checked again.
  r.evict({y}, {x});
  r.use(y);
  EXPECT_EQ(r.res.stats().recomputed, 2u);
  EXPECT_EQ(r.res.stats().recompute_checks, 1u);
  EXPECT_TRUE(r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
}

TEST(Recompute, OffMakesNothingAgain) {
  Rig r(3, Fault::None, false);
  const DevPtr x = r.alloc();
  r.launch(r.fill, {x, 7});
  learn_common(r, x);
  const DevPtr y = produce_and_evict(r, x);
  const uint64_t in_before = r.res.stats().bytes_in;
  r.use(y);
  EXPECT_EQ(r.res.stats().recomputed, 0u);
  EXPECT_EQ(r.res.stats().probes, 0u);
  EXPECT_EQ(r.res.stats().bytes_in, in_before + kGran);
  EXPECT_TRUE(r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
}

// Its input written after the original launch: the remake would read the new bytes. The kernel is
// trusted first (one clean remake), so that no check stands between a wrong remake and the range.
TEST(Recompute, AnInputChangedSinceTheLaunchIsRefused) {
  for (Fault f : {Fault::None, Fault::RecomputeIgnoreVersions}) {
    SCOPED_TRACE(f == Fault::None ? "checked" : "versions ignored");
    Rig r(3, f);
    const DevPtr x = r.alloc();
    r.launch(r.fill, {x, 7});
    learn_common(r, x);
    trust_scale(r, x);
    r.launch(r.bump, {x});
    // x is 7000 + i + 1 now; y is made from it, then x written again.
    const DevPtr y = r.alloc();
    r.launch(r.scale, {y, x});
    r.launch(r.bump, {x});
    r.evict({y}, {x});
    r.use(y);
    const bool right = r.is(y, [](uint64_t i) { return 3 * (7000 + i + 1) + 1; });
    if (f == Fault::None) {
      EXPECT_TRUE(right);
      EXPECT_EQ(r.res.stats().recomputed, 1u);  // refused: copied in
    } else {
      EXPECT_FALSE(right);  // the rule is what kept the bytes
    }
  }
}

TEST(Recompute, AKernelThatDrawsRandomNumbersIsNeverMadeAgain) {
  for (Fault f : {Fault::None, Fault::RecomputeIgnoreNames}) {
    SCOPED_TRACE(f == Fault::None ? "checked" : "names ignored");
    Rig r(3, f);
    const DevPtr x = r.alloc();
    r.launch(r.fill, {x, 7});
    learn_common(r, x);
    learn(r, r.rng, 1, {x});
    const DevPtr y = produce_and_evict(r, x, r.rng);
    r.use(y);
    const Residency::Stats st = r.res.stats();
    constexpr uint64_t draw = Residency::kRecomputeProbes + 1;  // its draw after those of the probes
    EXPECT_TRUE(r.is(y, [](uint64_t i) { return (7000 + i) ^ (draw << 32); }));
    if (f == Fault::None) {
      EXPECT_EQ(st.recompute_checks, 0u);  // not even tried
      EXPECT_EQ(st.recomputed, 0u);
    } else {
      EXPECT_EQ(st.recompute_checks, 1u);  // tried: the check caught it
      EXPECT_EQ(st.recompute_bans, 1u);
    }
  }
}

// A kernel that writes a range besides its output (running statistics): made again, it would
// write that range a second time.
TEST(Recompute, AKernelThatWritesOutsideItsOutputIsNeverMadeAgain) {
  for (Fault f : {Fault::None, Fault::RecomputeIgnoreWrites}) {
    SCOPED_TRACE(f == Fault::None ? "checked" : "writes ignored");
    Rig r(4, f);
    const DevPtr x = r.alloc();
    r.launch(r.fill, {x, 7});
    learn_common(r, x);
    const DevPtr stats = r.alloc();
    r.launch(r.fill, {stats, 0});
    learn(r, r.norm, 1, {x, stats});  // writes its output and stats
    const DevPtr y = r.alloc();
    r.launch(r.norm, {y, x, stats});
    r.evict({y}, {x, stats});
    r.use(y);
    EXPECT_TRUE(r.is(y, [](uint64_t i) { return 2 * (7000 + i); }));
    const uint64_t launches = r.word(stats, 0);
    constexpr uint64_t ran = Residency::kRecomputeProbes + 1;
    if (f == Fault::None) {
      EXPECT_EQ(launches, ran);
      EXPECT_EQ(r.res.stats().recomputed, 0u);
    } else {
      EXPECT_EQ(launches, ran + 1);  // written again by the remake
    }
  }
}

// A launch that made two new ranges: made again for one, it would write the other too, which may
// have moved on since. Either may be the one moved on. Two rules refuse it (a producer makes one
// new range; the other one counts as an input, whose version moved), so removing either alone
// leaves this test passing.
TEST(Recompute, ALaunchThatMakesTwoNewRangesIsNeverMadeAgain) {
  for (int moved : {0, 1}) {
    SCOPED_TRACE(moved ? "second moved on" : "first moved on");
    Rig r(4);
    const DevPtr x = r.alloc();
    r.launch(r.fill, {x, 7});
    learn_common(r, x);
    learn(r, r.split, 2, {x});
    const DevPtr a = r.alloc(), b = r.alloc();
    r.launch(r.split, {a, b, x});
    const DevPtr on = moved ? b : a, out = moved ? a : b;
    r.launch(r.bump, {on});
    r.evict({out}, {x, on});
    r.use(out);
    EXPECT_EQ(r.res.stats().recomputed, 0u);
    EXPECT_TRUE(r.is(a, [&](uint64_t i) { return 7000 + i + 5 + (moved ? 0 : 1); }));
    EXPECT_TRUE(r.is(b, [&](uint64_t i) { return 7000 + i + 7 + (moved ? 1 : 0); }));
  }
}

// A kernel whose remake gives other bytes than its launch did: the first remake is compared with
// the saved copy, the difference bans the kernel and the copy goes in.
TEST(Recompute, AKernelWhoseRemakeDiffersIsBanned) {
  for (Fault f : {Fault::None, Fault::RecomputeUnchecked}) {
    SCOPED_TRACE(f == Fault::None ? "checked" : "unchecked");
    Rig r(3, f);
    const DevPtr x = r.alloc();
    r.launch(r.fill, {x, 7});
    learn_common(r, x);
    learn(r, r.noisy, 1, {x});
    const DevPtr y = produce_and_evict(r, x, r.noisy);
    r.use(y);
    constexpr uint64_t run = Residency::kRecomputeProbes + 1;  // its run after those of the probes
    const bool right = r.is(y, [](uint64_t i) { return 7000 + i + run; });
    if (f == Fault::None) {
      EXPECT_TRUE(right);
      EXPECT_EQ(r.res.stats().recompute_bans, 1u);
      EXPECT_EQ(r.res.stats().recomputed, 0u);
      // Banned: not tried again.
      r.evict({y}, {x});
      r.use(y);
      EXPECT_EQ(r.res.stats().recompute_checks, 1u);
      EXPECT_TRUE(r.is(y, [](uint64_t i) { return 7000 + i + run; }));
    } else {
      EXPECT_FALSE(right);
    }
  }
}

// The remake reads an input reloaded on another stream: it waits for that copy. The kernel is
// trusted first; the copy is held back until nothing else can run, so a remake that does not wait
// for it reads the input before its bytes arrive.
TEST(Recompute, AMakeAgainWaitsForItsInputsReloadOnAnotherStream) {
  for (Fault f : {Fault::None, Fault::RecomputeSkipInputWait}) {
    SCOPED_TRACE(f == Fault::None ? "waits" : "no wait");
    Rig r(3, f);
    const DevPtr x = r.alloc();
    r.launch(r.fill, {x, 7});
    learn_common(r, x);
    trust_scale(r, x);
    const DevPtr y = r.alloc();
    r.launch(r.scale, {y, x});
    r.evict({x, y}, {});  // both out; x reloaded first, on kB
    r.sim.set_copy_delay(true);
    std::vector<uint64_t> args{x};
    std::vector<void*> p{&args[0]};
    const LaunchGeom g;
    r.tr.on_kernel(r.read, kB, p.data(), nullptr, &g);  // x reloaded on kB (copy queued)
    r.sim.launch_kernel(r.read, g, kB, p.data());
    r.res.after_launch();
    r.use(y, kA);  // y made again on kA from x
    std::mt19937_64 rng(1);
    while (r.sim.step(rng)) {
    }
    const bool right = r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; });
    EXPECT_EQ(r.res.stats().recomputed, 2u);
    if (f == Fault::None) EXPECT_TRUE(right);
    else EXPECT_FALSE(right);
  }
}

// A launch on another stream that writes an input after the remake was queued: it waits for the
// remake, which the application never ordered its work after.
TEST(Recompute, ALaterWriterOnAnotherStreamWaitsForTheRemake) {
  for (Fault f : {Fault::None, Fault::RecomputeSkipReadOrder}) {
    SCOPED_TRACE(f == Fault::None ? "ordered" : "not ordered");
    int wrong = 0;
    for (uint64_t seed = 1; seed <= 8; ++seed) {
      Rig r(3, f);
      const DevPtr x = r.alloc();
      r.launch(r.fill, {x, 7});
      learn_common(r, x);
      r.launch(r.bump, {x});  // x is 7001 + i
      trust_scale(r, x);
      const DevPtr y = r.alloc();
      r.launch(r.scale, {y, x});
      r.evict({y}, {x});
      // y made again on kA, then x bumped on kB: the program orders kB after nothing of kA's.
      std::vector<uint64_t> ya{y}, xa{x};
      std::vector<void*> yp{&ya[0]}, xp{&xa[0]};
      const LaunchGeom g;
      r.tr.on_kernel(r.read, kA, yp.data(), nullptr, &g);
      r.sim.launch_kernel(r.read, g, kA, yp.data());
      r.res.after_launch();
      r.tr.on_kernel(r.bump, kB, xp.data(), nullptr, &g);
      r.sim.launch_kernel(r.bump, g, kB, xp.data());
      r.res.after_launch();
      std::mt19937_64 rng(seed);
      while (r.sim.step(rng)) {
      }
      EXPECT_EQ(r.res.stats().recomputed, 2u);
      if (!r.is(y, [](uint64_t i) { return 3 * (7000 + i + 1) + 1; })) ++wrong;  // x was 7001+i when y was made
    }
    if (f == Fault::None) EXPECT_EQ(wrong, 0);
    else EXPECT_GT(wrong, 0);
  }
}

// A kernel that writes zeros, watched on new memory that already held zeros (as memory just made
// often does): a new range counts as written whatever its bytes do. Taken for a reader, its later
// launches on an input would leave that input's version alone.
TEST(Recompute, AWriteOfTheBytesANewRangeHeldStillCounts) {
  for (Fault f : {Fault::None, Fault::RecomputeFreshByHash}) {
    SCOPED_TRACE(f == Fault::None ? "new counts as written" : "by its bytes alone");
    Rig r(3, f);
    const DevPtr x = r.alloc();
    r.launch(r.fill, {x, 7});
    learn_common(r, x);
    for (uint8_t i = 0; i < Residency::kRecomputeProbes; ++i) {
      const DevPtr t = r.alloc();
      r.sim.run_all();
      std::memset(words(t), 0, kGran);  // zeros already, as new memory often is
      r.launch(r.zero, {t});
      r.free(t);
    }
    trust_scale(r, x);
    const DevPtr y = r.alloc();
    r.launch(r.scale, {y, x});
    r.launch(r.zero, {x});
    r.evict({y}, {x});
    r.use(y);
    const bool right = r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; });
    if (f == Fault::None) EXPECT_TRUE(right);
    else EXPECT_FALSE(right);
  }
}

// An in-place kernel whose first watched launch changes nothing (every value already positive):
// its writes are what its first launches wrote together, so a later launch that does change its
// range moves that range's version.
TEST(Recompute, AWriteHiddenInOneWatchedLaunchShowsInAnother) {
  Rig r(4);
  const DevPtr x = r.alloc();
  r.launch(r.fill, {x, 7});
  learn_common(r, x);
  const DevPtr pos = r.alloc(), neg = r.alloc();
  r.launch(r.fill, {pos, 1});
  r.launch(r.fill, {neg, 1});
  r.launch(r.bump, {neg});
  r.launch(r.relu, {pos});  // changes nothing
  std::vector<int64_t> minus(kWords, -1);
  for (uint8_t i = 1; i < Residency::kRecomputeProbes; ++i) {
    r.sim.run_all();
    std::memcpy(words(neg), minus.data(), kGran);  // the host's own bytes: negative everywhere
    r.launch(r.relu, {neg});                       // changes everything
  }
  r.free(pos);
  r.free(neg);
  trust_scale(r, x);
  // x negative in half its words, y made from it, then x rectified.
  r.sim.run_all();
  for (uint64_t i = 0; i < kWords; i += 2) words(x)[i] = uint64_t(-1);
  const DevPtr y = r.alloc();
  r.launch(r.scale, {y, x});
  r.launch(r.relu, {x});
  r.evict({y}, {x});
  r.use(y);
  EXPECT_TRUE(r.is(y, [](uint64_t i) { return i % 2 ? 3 * (7000 + i) + 1 : 3 * uint64_t(-1) + 1; }));
  EXPECT_EQ(r.res.stats().recomputed, 1u);  // trust_scale's alone
}

// Random programs on two streams under a small budget, recompute on, scale trusted from the start:
// every range reads back what a model of the program says, whatever was made again, copied back or
// refused. (With versions ignored, 16 of its checks fail.)
TEST(Recompute, RandomProgramsReadBackTheirBytes) {
  uint64_t remade = 0, dropped = 0, early = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE(seed);
    std::mt19937_64 rng(seed);
    Rig r(3 + seed % 2);
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
      if (what < 4 && live.size() < 5 + seed % 3) {  // a new range, from another or filled
        Live n{r.alloc(s), s, std::vector<uint64_t>(kWords)};
        if (what < 3) {
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
      } else if (what < 6) {  // written in place
        join(src.last, s);
        r.launch(r.bump, {src.p}, s);
        for (uint64_t& w : src.want) ++w;
        src.last = s;
      } else if (what < 8 || live.size() < 3) {  // read
        join(src.last, s);
        r.use(src.p, s);
        src.last = s;
      } else {  // freed
        const size_t k = size_t(&src - live.data());
        join(src.last, s);
        r.free(src.p, s);
        live.erase(live.begin() + long(k));
      }
      for (int g = int(rng() % 8); g-- > 0 && r.sim.step(rng);) {
      }
      if (op % 50 == 49) check(live[rng() % live.size()]);
    }
    for (Live& l : live) check(l);
    remade += r.res.stats().recomputed;
    dropped += r.res.stats().dropped;
    early += r.res.stats().restored_early;
  }
  EXPECT_GT(remade, 0u);  // the programs do make ranges again,
  EXPECT_GT(dropped, 0u);  // drop ranges instead of copying them out,
  EXPECT_GT(early, 0u);    // and make dropped ranges again before their inputs are written
}

// Once its kernel is trusted, a range its producer can make again is dropped: nothing is copied
// out, nothing copied back, no host memory taken.
TEST(Recompute, ATrustedProducersRangeIsDroppedAndMadeAgain) {
  Rig r(4);
  const DevPtr x = r.alloc();
  r.launch(r.fill, {x, 7});
  learn_common(r, x);
  trust_scale(r, x);
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
    const DevPtr x = r.alloc();
    r.launch(r.fill, {x, 7});
    learn_common(r, x);
    trust_scale(r, x);
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
  const DevPtr x = r.alloc();
  r.launch(r.fill, {x, 7});
  learn_common(r, x);
  trust_scale(r, x);
  const DevPtr y = produce_and_evict(r, x);
  ASSERT_EQ(r.res.stats().dropped, 1u);
  r.free(x);
  EXPECT_EQ(r.res.stats().restored_early, 1u);
  r.use(y);
  EXPECT_TRUE(r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
}

// An input evicted (copied out) after the drop comes back first, then the range is made from it.
TEST(Recompute, AnInputEvictedAfterTheDropIsReloadedToMakeItAgain) {
  Rig r(4);
  const DevPtr x = r.alloc();
  r.launch(r.fill, {x, 7});
  learn_common(r, x);
  trust_scale(r, x);
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
  const DevPtr x = r.alloc();
  r.launch(r.fill, {x, 7});
  learn_common(r, x);
  trust_scale(r, x);  // scale needed 2 granules: y and x with it would need 4
  const DevPtr y = produce_and_evict(r, x);
  EXPECT_EQ(r.res.stats().dropped, 0u);
  r.use(y);
  EXPECT_TRUE(r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
}

// A kernel is watched only where its writes matter: where it makes a new range, or touches one a
// producer was made from. Elsewhere it is taken to write all it touches, at no cost.
TEST(Recompute, OnlyLaunchesWhoseWritesMatterAreWatched) {
  Rig r(4);
  const DevPtr x = r.alloc();
  r.launch(r.fill, {x, 7});
  learn_common(r, x);
  const DevPtr z = r.alloc();
  r.launch(r.fill, {z, 1});
  const uint64_t probes = r.res.stats().probes;
  for (int i = 0; i < 3; ++i) r.launch(r.relu, {z});
  EXPECT_EQ(r.res.stats().probes, probes);  // z is no producer's input
  const DevPtr t = r.alloc();
  r.launch(r.scale, {t, z});  // now it is
  r.launch(r.relu, {z});
  EXPECT_EQ(r.res.stats().probes, probes + 1);
}

}  // namespace
}  // namespace recompute_test
}  // namespace offload

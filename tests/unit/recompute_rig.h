// The rig of the recompute tests: the residency manager wired as the shim wires it, on the
// simulated driver, with kernels it can launch again, and the steps the tests share.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <cinttypes>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "core/event_log.h"
#include "core/sim_driver.h"
#include "core/tracker.h"
#include "residency/host_store.h"
#include "residency/residency.h"

namespace offload::recompute_test {

using Fault = Residency::Options::Fault;
inline constexpr uint64_t kGran = 64 << 10;
inline constexpr uint64_t kWords = kGran / 8;
inline constexpr Stream kA = 0x2000, kB = 0x3000, kC = 0x4000;

inline uint64_t* words(uint64_t p) { return reinterpret_cast<uint64_t*>(p); }
inline uint64_t arg(const unsigned char* a, int i) {
  uint64_t v;
  std::memcpy(&v, a + 8 * i, 8);
  return v;
}
inline std::vector<ParamInfo> params(int n) {
  std::vector<ParamInfo> p;
  for (int i = 0; i < n; ++i) p.push_back({uint32_t(8 * i), 8});
  return p;
}

// The shim's wiring for ranges, with kernels the simulated driver can launch again.
struct Rig {
  explicit Rig(uint64_t granules, Fault fault = Fault::None, bool recompute = true, uint32_t drop_first = 1,
               bool prefetch = false, uint8_t kernel_probes = 4 * Residency::kRecomputeProbes)
      : tr(sim, log),
        host(sim, host_options()),
        res(sim, host, options(granules, fault, recompute, drop_first, prefetch, kernel_probes)) {
    tr.set_gate(&res);
    tr.set_pass_launch_args(true);
    res.set_namer([](void* t, uint32_t k) { return static_cast<Tracker*>(t)->funcs().name(k); }, &tr);
    res.set_finder(find_alloc, const_cast<AllocTable*>(&tr.allocs()), alloc_horizon);
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
    // acc(out, in, ctr): out = in + ctr[0], and ctr[0] counts the launches: its output reads the
    // range it also writes.
    acc = sim.add_kernel("acc_with_counter", params(3), [](const unsigned char* a) {
      const uint64_t c = words(arg(a, 2))[0];
      for (uint64_t i = 0; i < kWords; ++i) words(arg(a, 0))[i] = words(arg(a, 1))[i] + c;
      words(arg(a, 2))[0] = c + 1;
    });
    // sem(out, in, flag): out = 5 in where flag[0] starts at zero (else garbage), and flag[0] set
    // after: a split-K workspace's counter, zeroed by the library before each launch.
    sem = sim.add_kernel("gemm_splitk_sem", params(3), [](const unsigned char* a) {
      const uint64_t f = words(arg(a, 2))[0];
      for (uint64_t i = 0; i < kWords; ++i) words(arg(a, 0))[i] = f ? 0xdead : 5 * words(arg(a, 1))[i];
      words(arg(a, 2))[0] = 1;
    });
    // add2(out, a, b): out = a + b (in place where out is a)
    add2 = sim.add_kernel("add2", params(3), [](const unsigned char* a) {
      for (uint64_t i = 0; i < kWords; ++i) words(arg(a, 0))[i] = words(arg(a, 1))[i] + words(arg(a, 2))[i];
    });
    // sum3(out, a, b, c): out = a + b + c
    sum3 = sim.add_kernel("sum3", params(4), [](const unsigned char* a) {
      for (uint64_t i = 0; i < kWords; ++i)
        words(arg(a, 0))[i] = words(arg(a, 1))[i] + words(arg(a, 2))[i] + words(arg(a, 3))[i];
    });
    // addb(out, in, b): out = in + b[i % 8], b a small allocation (a bias)
    addb = sim.add_kernel("addb", params(3), [](const unsigned char* a) {
      for (uint64_t i = 0; i < kWords; ++i) words(arg(a, 0))[i] = words(arg(a, 1))[i] + words(arg(a, 2))[i % 8];
    });
    // setb(b, v): b[0..8) = v, a launch touching a small allocation alone
    setb = sim.add_kernel("setb", params(2), [](const unsigned char* a) {
      for (uint64_t i = 0; i < 8; ++i) words(arg(a, 0))[i] = arg(a, 1);
    });
    // normb(out, in, s): out = 2 in, and s[0] counts the launches, s a small allocation
    normb = sim.add_kernel("normb", params(3), [](const unsigned char* a) {
      for (uint64_t i = 0; i < kWords; ++i) words(arg(a, 0))[i] = 2 * words(arg(a, 1))[i];
      words(arg(a, 2))[0] += 1;
    });
    // checkn(p, base): counts in `bad` a p that is not 2 (base + i) (a range norm made)
    checkn = sim.add_kernel("checkn", params(2), [this](const unsigned char* a) {
      for (uint64_t i = 0; i < kWords; i += 97)
        if (words(arg(a, 0))[i] != 2 * (arg(a, 1) + i)) {
          note_bad("checkn", arg(a, 0), i, words(arg(a, 0))[i], 2 * (arg(a, 1) + i));
          ++bad;
          return;
        }
    });
    // checkb(p, base, v): counts in `bad` a p that is not base + i + v (a range addb made)
    checkb = sim.add_kernel("checkb", params(3), [this](const unsigned char* a) {
      for (uint64_t i = 0; i < kWords; i += 97)
        if (words(arg(a, 0))[i] != arg(a, 1) + i + arg(a, 2)) {
          note_bad("checkb", arg(a, 0), i, words(arg(a, 0))[i], arg(a, 1) + i + arg(a, 2));
          ++bad;
          return;
        }
    });
    // zero(p): p = 0
    zero = sim.add_kernel("zero", params(1), [](const unsigned char* a) {
      for (uint64_t i = 0; i < kWords; ++i) words(arg(a, 0))[i] = 0;
    });
    // relu(p): p = max(p, 0), in place, on signed words
    relu = sim.add_kernel("relu", params(1), [](const unsigned char* a) {
      for (uint64_t i = 0; i < kWords; ++i) words(arg(a, 0))[i] = std::max<int64_t>(int64_t(words(arg(a, 0))[i]), 0);
    });
    // check(p, base): counts in `bad` a p that is not 3 (base + i) + 1 (a range scale made)
    check = sim.add_kernel("check", params(2), [this](const unsigned char* a) {
      for (uint64_t i = 0; i < kWords; i += 97)
        if (words(arg(a, 0))[i] != 3 * (arg(a, 1) + i) + 1) {
          note_bad("check", arg(a, 0), i, words(arg(a, 0))[i], 3 * (arg(a, 1) + i) + 1);
          ++bad;
          return;
        }
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

  // What each check that failed read, for the failure's message: which range, which word, and
  // what it held (another range's bytes, or a write missed, show in the value).
  void note_bad(const char* kernel, uint64_t p, uint64_t i, uint64_t got, uint64_t want) {
    char line[160];
    std::snprintf(line, sizeof line, "%s at %#" PRIx64 ", word %" PRIu64 ": %" PRIu64 " where %" PRIu64 " was due\n",
                  kernel, p, i, got, want);
    std::lock_guard<std::mutex> lk(bad_mu);
    bad_what += line;
  }
  std::mutex bad_mu;
  std::string bad_what;

  static HostStore::Options host_options() {
    HostStore::Options o;
    o.chunk_bytes = 1 << 20;
    o.limit = 64 << 20;
    return o;
  }
  static Residency::Options options(uint64_t granules, Fault fault, bool recompute, uint32_t drop_first, bool prefetch,
                                    uint8_t kernel_probes) {
    Residency::Options o;
    o.kernel_probes = kernel_probes;
    o.updates = true;  // as OFFLOAD_CAP_RECOMPUTE_UPDATES=1 sets it (RecomputeNoUpdates: off)
    o.budget = granules * kGran;
    o.pool_floor = 0;
    o.pool_step = 0;
    o.prefetch = prefetch;  // off: reloads happen where a launch needs them, where the tests say
    o.low_water = 1;     // nothing evicted ahead: evictions happen where room is needed
    o.recompute = recompute;
    o.drop_first = drop_first;
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
  // A small allocation of 8 words outside the ranges (the pool's), as the shim sees one.
  DevPtr small_alloc() {
    const DevPtr p = sim.alloc(64);
    tr.on_alloc(p, 64, kA, 0);
    return p;
  }
  void small_free(DevPtr p) {
    const std::optional<AllocEntry> e = tr.allocs().find(p);
    ASSERT_TRUE(e);
    tr.on_free(p, kA);
    EXPECT_FALSE(res.free(p, kA));
    res.forget_table(e->id, kA);  // as the shim does for a free that is not a range's
    sim.run_all();  // the pool's free is in stream order: after what was queued before it
    sim.free(p);
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
  Func fill = 0, scale = 0, bump = 0, read = 0, rng = 0, noisy = 0, norm = 0, split = 0, zero = 0, relu = 0, check = 0;
  Func acc = 0, sem = 0, add2 = 0, sum3 = 0, addb = 0, setb = 0, normb = 0, checkn = 0, checkb = 0;
  std::atomic<uint64_t> bad{0};
  uint64_t draws = 0, runs = 0;
};

// y = f(x) (scale by default), then y evicted while x stays resident. Returns y.
inline DevPtr produce_and_evict(Rig& r, DevPtr x, Func f = 0) {
  const DevPtr y = r.alloc();
  r.launch(f ? f : r.scale, {y, x});
  r.evict({y}, {x});
  return y;
}

// Learns what `f` writes: its first launches are watched (probed), each on `fresh` new ranges
// (made for it, freed after) and then `rest`.
inline void learn(Rig& r, Func f, int fresh, std::vector<DevPtr> rest) {
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
inline void learn_common(Rig& r, DevPtr x) {
  learn(r, r.fill, 1, {5});
  learn(r, r.scale, 1, {x});
  const DevPtr t = r.alloc();
  r.launch(r.scale, {t, x});
  learn(r, r.read, 0, {x});
  r.free(t);
  learn(r, r.bump, 1, {});
}

// Makes scale trusted: one remake, checked.
inline void trust_scale(Rig& r, DevPtr x) {
  const DevPtr y = produce_and_evict(r, x);
  r.use(y);
  ASSERT_EQ(r.res.stats().recompute_checks, 1u);
  ASSERT_EQ(r.res.stats().recompute_bans, 0u);
  r.free(y);
}

// Learns `f` (f(out, ins...)) from `ins` and makes it trusted with one remake, checked: its output
// made, evicted while `keep` stays, and made again.
inline void trust(Rig& r, Func f, const std::vector<DevPtr>& ins, std::initializer_list<DevPtr> keep) {
  learn(r, f, 1, ins);
  const DevPtr y = r.alloc();
  std::vector<uint64_t> args{y};
  args.insert(args.end(), ins.begin(), ins.end());
  r.launch(f, args);
  r.evict({y}, keep);
  const uint64_t checks = r.res.stats().recompute_checks;
  r.use(y);
  EXPECT_EQ(r.res.stats().recompute_checks, checks + 1);
  EXPECT_EQ(r.res.stats().recompute_bans, 0u);
  r.free(y);
}

// Learns norm (writing `stats` besides its output) and makes it trusted with one remake, checked.
// Its launches count in stats[0]: returns how many ran.
inline uint64_t trust_norm(Rig& r, DevPtr x, DevPtr stats) {
  trust(r, r.norm, {x, stats}, {x, stats});
  return Residency::kRecomputeProbes + 1;
}

// Learns addb (out = in + b[i % 8], b a small allocation) from x and b, and makes it trusted with
// one remake, checked.
inline void trust_addb(Rig& r, DevPtr x, DevPtr b) { trust(r, r.addb, {x, b}, {x}); }

// The input most tests make ranges from: x = 7000 + i, the common kernels learned from it, and
// (with `trust`) scale checked once.
inline DevPtr learned_input(Rig& r, bool trust) {
  const DevPtr x = r.alloc();
  r.launch(r.fill, {x, 7});
  learn_common(r, x);
  if (trust) trust_scale(r, x);
  return x;
}

}  // namespace offload::recompute_test

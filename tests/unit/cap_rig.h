// The hard cap's test rig on the simulated driver: allocations through Residency::alloc,
// launches through the tracker (whose gate is the residency manager) and then the simulated GPU,
// with helpers that fill ranges and hash them.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "core/event_log.h"
#include "core/sim_driver.h"
#include "core/tracker.h"
#include "residency/host_store.h"
#include "residency/residency.h"
#include "sim_words.h"

namespace offload::cap_rig {

constexpr uint64_t kGran = 64 << 10;
constexpr Stream kA = 0x2000, kB = 0x3000;  // after the residency's copy stream (0x1000)
// Seeds of the randomised tests: their time goes into the simulated GPU's bodies, which
// ThreadSanitizer instruments to no purpose (one thread runs them).
#ifdef OFFLOAD_TEST_TSAN
constexpr uint64_t kSeeds = 2;
#else
constexpr uint64_t kSeeds = 8;
#endif

using sim_words::mix;
using sim_words::words;

// The shim's wiring for ranges: allocations through Residency::alloc, launches through the
// tracker (whose gate is the residency manager) and then the simulated GPU.
struct CapRig {
  explicit CapRig(uint64_t budget, Residency::Options::Fault fault = Residency::Options::Fault::None)
      : CapRig(options(budget, fault)) {}
  explicit CapRig(const Residency::Options& o) : tr(sim, log), host(sim, host_options()), res(sim, host, o) {
    tr.set_gate(&res);
    res.set_namer([](void* t, uint32_t k) { return static_cast<Tracker*>(t)->funcs().name(k); }, &tr);
    k1 = sim.add_kernel("one", {{0, 8}});
    k2 = sim.add_kernel("two", {{0, 8}, {8, 8}});
    k3 = sim.add_kernel("three", {{0, 8}, {8, 8}, {16, 8}});
  }
  ~CapRig() { sim.run_all(); }

  static HostStore::Options host_options() {
    HostStore::Options o;
    o.chunk_bytes = 1 << 20;
    o.limit = 256 << 20;
    return o;
  }
  static Residency::Options options(uint64_t budget, Residency::Options::Fault fault) {
    Residency::Options o;
    o.budget = budget;
    o.pool_floor = 0;
    o.pool_step = 0;  // the pool is not modelled unless a test says so (SimDriver::set_pool)
    o.fault = fault;
    return o;
  }
  static SimDriver& granular(SimDriver& s) {
    s.set_granularity(kGran);
    return s;
  }

  DevPtr alloc(uint64_t bytes, Stream s) {
    uint64_t tag = 0;
    bool refused = false;
    DevPtr p = res.alloc(bytes, s, &tag, &refused);
    if (p) tr.on_alloc(p, bytes, s, tag);
    return p;
  }
  void free(DevPtr p, Stream s) {
    tr.on_free(p, s);
    EXPECT_TRUE(res.free(p, s));
  }
  // A kernel touching `args`; false when the residency manager refused it (it never runs).
  bool kernel(Stream s, std::vector<uint64_t> args, std::function<void()> body) {
    std::vector<void*> params(args.size());
    for (size_t i = 0; i < args.size(); ++i) params[i] = &args[i];
    const Func f = args.size() == 1 ? k1 : args.size() == 2 ? k2 : k3;
    tr.on_kernel(f, s, params.data(), nullptr);
    if (Residency::take_refusal()) return false;
    sim.launch(s, std::move(body));
    res.after_launch();
    return true;
  }
  // Work queued on `to` from now on follows the work queued on `from` (the program's order).
  void join(Stream from, Stream to) {
    uint64_t ev = sim.create_event();
    sim.record_event(ev, from);
    sim.stream_wait(to, ev);
    sim.destroy_event(ev);
  }
  void gpu(std::mt19937_64& rng, int ops) {
    for (int i = 0; i < ops && sim.step(rng); ++i) {
    }
  }

  SimDriver sim_{};
  SimDriver& sim = granular(sim_);
  EventLog log{1 << 12, 1 << 16};
  Tracker tr;
  HostStore host;
  Residency res;
  Func k1 = 0, k2 = 0, k3 = 0;
};

// Fills a range with words that depend on `seed` and their index.
inline std::function<void()> fill(DevPtr p, uint64_t bytes, uint64_t seed) {
  return [=] {
    for (uint64_t i = 0; i < bytes / 8; ++i) words(p)[i] = mix(seed + i);
  };
}
inline uint64_t hash(DevPtr p, uint64_t bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t i = 0; i < bytes / 8; ++i) h = (h ^ words(p)[i]) * 0x100000001b3ull;
  return h;
}

// `n` ranges of a granule allocated on kA, each filled with its index as the seed, then run and
// polled; empty (and a failure added) if one was refused.
inline std::vector<DevPtr> filled_ranges(CapRig& r, int n) {
  std::vector<DevPtr> t;
  for (int i = 0; i < n; ++i) {
    const DevPtr p = r.alloc(kGran, kA);
    if (!p || !r.kernel(kA, {p}, fill(p, kGran, uint64_t(i)))) {
      ADD_FAILURE() << "range " << i << " refused: " << r.res.error();
      return {};
    }
    t.push_back(p);
  }
  r.sim.run_all();
  r.res.poll();
  return t;
}

// The hash of a range filled with `seed`.
inline uint64_t filled_hash(uint64_t seed, uint64_t bytes = kGran) {
  std::vector<uint64_t> want(bytes / 8);
  for (uint64_t k = 0; k < want.size(); ++k) want[k] = mix(seed + k);
  return hash(reinterpret_cast<DevPtr>(want.data()), bytes);
}

}  // namespace offload::cap_rig

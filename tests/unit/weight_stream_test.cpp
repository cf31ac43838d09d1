// Weight streaming on the simulated driver: a training loop whose weights are blocks of the
// PersistentPool, lent to the executor, which copies each out in the idle stretches between
// its uses (unmapping it: a kernel touching it then faults) and back before its next use. The
// plans come from the trace alone, independently of the production planner: every stretch of
// two launches or more between two uses of a weight (across the step boundary too) is a
// window, its reload anywhere from the first launch after the last use to the use itself,
// chosen by a seeded generator. The weights and losses must be byte-identical to the same
// program run without the executor; fault injection shows that the comparison notices a
// missing wait.
//
// Every case is a fixed seed: a failure names it (SCOPED_TRACE) and reruns alike.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "common/log.h"
#include "executor_rig.h"

#include "sanitizers.h"

namespace offload {
namespace {

using rig::hash_words;
using rig::mix;
using rig::words;

constexpr Stream kCompute = 0x7, kBackward = 0x8;
constexpr uint64_t kKiB = 1024;
constexpr uint64_t kPersistentMin = 128 * kKiB;  // weights are at least this; nothing else is

#if defined(OFFLOAD_TEST_TSAN)
constexpr uint64_t kSeeds = 3;
#else
constexpr uint64_t kSeeds = 5;
#endif

struct QuietLog {
  QuietLog() { set_log_level("warn"); }
  ~QuietLog() { set_log_level("info"); }
};

// How the test's planner places a window's reload.
enum class Windows : uint8_t {
  Sound,  // anywhere in (evict_after, use]: never a miss
  Late,   // a window that ends inside the step says its use (and reload) is one launch later
          // than the real use: the launch touches the weight before the plan reloads it
  AtUse,  // at the use itself: the longest a weight stays out, its consumer right behind the copy
};

struct Config {
  uint32_t layers = 6;
  uint32_t steps = 8;
  uint64_t seed = 1;  // the GPU schedule's and the planner's
  bool offload = true;
  bool copy_delay = true;
  uint32_t gpu_ops_min = 2, gpu_ops_max = 2;
  size_t max_queued = 0;
  double host_sync = 0;
  bool second_stream_backward = false;
  Windows windows = Windows::Sound;
  // The plan's weight_bytes_mapped: -1 picks 0 (none) or a bound by seed; else this many
  // of the largest weight's bytes (0: none).
  int bound_weights = -1;
  // After the steps, one more forward, then every weight is freed (test of release()).
  bool free_weights_mid_step = false;
  // Even layers' weights are frozen: the optimizer leaves them alone. mark_frozen: and the
  // program says so (Executor::mark_read_only) once they are filled.
  bool frozen_even = false, mark_frozen = false;
  // Odd layers' weights are (2 + odd_extra) * 128 KiB, even ones 256 KiB.
  uint32_t odd_extra = 1;
  // Layer 0's weight, in KiB instead (0: as above): a size outside the others' unit, as lora's
  // embedding is.
  uint32_t first_weight_kib = 0;
  uint64_t pool_room = PersistentPool::Options{}.room;  // 1: no room past a weight's block
  // The plan is retired (a revision) before this step; the rig plans again once it is idle.
  uint32_t retire_at = UINT32_MAX;
  Executor::Options exec{};
};

struct Outcome {
  std::vector<uint64_t> weights, losses;
  ExecutorStats stats;
  PersistentPool::Stats pool;
  SimDriver::VmmStats vmm;
  bool installed = false;
  uint64_t weight_bytes = 0, largest_weight = 0;
  uint64_t bound = 0;             // the last plan's weight_bytes_mapped
  uint32_t windows = 0;           // the last plan's
  uint32_t evicted_at_free = 0;   // weights unmapped when the program freed them
  uint32_t evicted_at_end = 0;    // weights out after the run (brought back to be read)
  uint32_t unreadable = 0;        // weights still unmapped after that (none may be)
  uint64_t min_physical = ~uint64_t{0};  // the driver's physical bytes, least after a launch of a plan's step
  uint64_t physical_at_stats = 0;         // the driver's physical bytes when `stats` was read
  uint64_t installs_at_retire = 0, installs = 0;
};

// The test's planner: the weights and their windows, from the trace alone.
Plan weight_plan(const StepTrace& t, const Config& c, uint64_t install) {
  std::mt19937_64 rng(mix(c.seed * 1000003 + install));
  Plan p;
  const auto n = static_cast<int64_t>(t.launches.size());
  p.step_launches = static_cast<uint64_t>(n);
  p.tokens = step_tokens(t);
  p.index_members();
  std::vector<std::vector<int64_t>> uses(t.allocs.size());
  for (size_t pos = 0; pos < t.launches.size(); ++pos)
    for (uint32_t o : t.launches[pos].allocs)
      if (o < uses.size() && (uses[o].empty() || uses[o].back() != static_cast<int64_t>(pos)))
        uses[o].push_back(static_cast<int64_t>(pos));
  uint64_t host = 0, largest = 0;
  for (const TraceAlloc& a : t.allocs) {
    if (a.alloc_pos != -1 || a.free_pos != -1 || a.bytes < kPersistentMin || uses[a.ordinal].empty()) continue;
    const auto k = static_cast<uint32_t>(p.weights.size());
    WeightPlan w;
    w.ordinal = a.ordinal;
    w.bytes = a.bytes;
    w.host_offset = host;
    host += a.bytes;
    largest = std::max(largest, a.bytes);
    p.weights.push_back(w);
    const std::vector<int64_t>& u = uses[a.ordinal];
    auto add = [&](int64_t after, int64_t use) {
      WeightWindow win;
      win.weight = k;
      win.evict_after = after;
      win.use = use;
      // (after, use], or across the boundary (after, n) then [0, use].
      std::vector<int64_t> at;
      if (use > after) {
        for (int64_t q = after + 1; q <= use; ++q) at.push_back(q);
      } else {
        for (int64_t q = after + 1; q < n; ++q) at.push_back(q);
        for (int64_t q = 0; q <= use; ++q) at.push_back(q);
      }
      win.reload_at = c.windows == Windows::AtUse ? use : at[rng() % at.size()];
      if (c.windows == Windows::Late && use > after && use + 1 < n) win.use = win.reload_at = use + 1;
      p.windows.push_back(win);
    };
    for (size_t i = 0; i + 1 < u.size(); ++i)
      if (u[i + 1] - u[i] >= 2) add(u[i], u[i + 1]);
    if (n - u.back() + u.front() >= 2) add(u.back(), u.front());
  }
  std::sort(p.windows.begin(), p.windows.end(),
            [](const WeightWindow& x, const WeightWindow& y) { return x.evict_after < y.evict_after; });
  if (c.bound_weights > 0) p.weight_bytes_mapped = static_cast<uint64_t>(c.bound_weights) * largest;
  else if (c.bound_weights < 0 && rng() % 2) p.weight_bytes_mapped = (2 + rng() % 3) * largest;
  return p;
}

rig::Options rig_options(const Config& c) {
  rig::Options o = rig::schedule_options(c, kPersistentMin);
  o.exec = c.exec;
  o.pool_room = c.pool_room;
  return o;
}

// L weights of 256 or 384 KiB (odd_extra) (filled by a kernel before the first step). A step: the input,
// a forward where layer l reads all of weight l and the activation before it, a loss, a
// backward in reverse order (on the compute stream or a second one) where layer l reads all
// of weight l and its activation, an optimizer that rewrites every word of every weight, and
// two launches that touch no weight (a gradient norm, folded into the loss). Activations are
// smaller than the pool's threshold: only the weights are streamed.
class WeightLoop {
 public:
  explicit WeightLoop(const Config& c) : c_(c), r_(rig_options(c)) {
    r_.set_planner([this](const StepTrace& t, rig::Rig&) {
      Plan p = weight_plan(t, c_, installs_++);
      EXPECT_FALSE(p.windows.empty()) << "the trace shows no streamable weight";
      bound_ = p.weight_bytes_mapped;
      windows_ = static_cast<uint32_t>(p.windows.size());
      return p;
    });
    fill_ = r_.add_kernel("fill", 2);
    fwd_ = r_.add_kernel("fwd", 4);
    loss_ = r_.add_kernel("loss", 3);
    bwd_ = r_.add_kernel("bwd", 4);
    opt_ = r_.add_kernel("opt", 2 + static_cast<int>(c.layers));
    norm_ = r_.add_kernel("norm", 3);
    log_ = r_.add_kernel("log", 3);
  }

  Outcome run() {
    const uint32_t L = c_.layers;
    Outcome o;
    w_.resize(L);
    for (uint32_t l = 0; l < L; ++l) {
      const uint64_t n = weight_bytes(l);
      w_[l] = r_.alloc(n, kCompute);
      DevPtr w = w_[l];
      r_.kernel(fill_, kCompute, {w, n}, [=] {
        for (uint64_t i = 0; i < n / 8; ++i) words(w)[i] = mix((uint64_t{l} << 40) + i + 1);
      });
      if (c_.offload && c_.frozen_even && c_.mark_frozen && frozen(l)) r_.executor().mark_read_only(w, n);
      o.weight_bytes += n;
      o.largest_weight = std::max(o.largest_weight, n);
    }
    const uint64_t nlosses = c_.steps + 1;
    losses_ = r_.alloc(8 * nlosses, kCompute);
    DevPtr losses = losses_;
    r_.kernel(fill_, kCompute, {losses, 8 * nlosses}, [=] { std::memset(words(losses), 0, 8 * nlosses); });
    norms_ = r_.alloc(8 * nlosses, kCompute);
    DevPtr norms = norms_;
    r_.kernel(fill_, kCompute, {norms, 8 * nlosses}, [=] { std::memset(words(norms), 0, 8 * nlosses); });
    for (uint32_t s = 0; s < c_.steps; ++s) {
      if (s == c_.retire_at) {
        o.installs_at_retire = r_.installs();
        r_.executor().retire("a revision");
      }
      step(s, true);
    }
    if (c_.free_weights_mid_step) {
      step(c_.steps, false);  // a forward, then the weights go, some of them evicted
      r_.executor().poll();
      for (uint32_t l = 0; l < L; ++l) o.evicted_at_free += !r_.sim().is_mapped(w_[l]);
      for (uint32_t l = 0; l < L; ++l) r_.free(w_[l], kCompute);
    }
    r_.finish();
    o.stats = r_.executor().stats();  // before the weights are brought back to be read
    o.physical_at_stats = r_.sim().vmm_stats().physical_bytes;
    o.installs = r_.installs();
    if (!c_.free_weights_mid_step) {
      // A weight whose window crosses into the next step is out after the last step: a
      // pointer query brings it back (as the application's reading it would).
      for (uint32_t l = 0; l < L; ++l)
        if (!r_.sim().is_mapped(w_[l])) {
          ++o.evicted_at_end;
          r_.executor().prepare_access(w_[l]);
        }
      r_.sim().run_all();
      for (uint32_t l = 0; l < L; ++l) {
        if (!r_.sim().is_mapped(w_[l])) {
          ++o.unreadable;  // reading it would fault
          continue;
        }
        o.weights.insert(o.weights.end(), words(w_[l]), words(w_[l]) + weight_bytes(l) / 8);
      }
    }
    o.losses.assign(words(losses), words(losses) + nlosses);
    o.installed = r_.executor().installed();
    o.pool = r_.persistent()->stats();
    o.vmm = r_.sim().vmm_stats();
    o.bound = bound_;
    o.min_physical = min_physical_;
    o.windows = windows_;
    return o;
  }

 private:
  uint64_t weight_bytes(uint32_t l) const {
    if (l == 0 && c_.first_weight_kib) return c_.first_weight_kib * kKiB;
    return (2 + l % 2 * c_.odd_extra) * 128 * kKiB;
  }
  bool frozen(uint32_t l) const { return c_.frozen_even && l % 2 == 0; }
  uint64_t act_bytes(uint32_t l) const { return 32 * kKiB * (1 + (l * 7 + c_.seed) % 3); }

  // A launch of a step; once a plan is in, the driver's physical bytes after it are sampled.
  void launch(Func f, Stream st, std::vector<uint64_t> args, std::function<void()> body) {
    r_.kernel(f, st, std::move(args), std::move(body));
    if (r_.executor().installed()) min_physical_ = std::min(min_physical_, r_.sim().vmm_stats().physical_bytes);
  }

  // One step; without the backward, the forward's activations are freed after the loss.
  void step(uint32_t s, bool backward) {
    const uint32_t L = c_.layers;
    const uint64_t xn = 32 * kKiB;
    DevPtr x = r_.alloc(xn, kCompute);
    launch(fill_, kCompute, {x, xn}, [=] {
      for (uint64_t i = 0; i < xn / 8; ++i) words(x)[i] = mix(s * 1000003 + i);
    });
    std::vector<DevPtr> acts(L);
    DevPtr prev = x;
    uint64_t prev_bytes = xn;
    for (uint32_t l = 0; l < L; ++l) {
      const uint64_t n = act_bytes(l), wn = weight_bytes(l) / 8;
      acts[l] = r_.alloc(n, kCompute);
      DevPtr a = acts[l], w = w_[l];
      launch(fwd_, kCompute, {prev, a, w, n}, [=] {
        const uint64_t h = hash_words(w, 0, wn), np = prev_bytes / 8;
        for (uint64_t i = 0; i < n / 8; ++i) words(a)[i] = mix(words(prev)[i % np] ^ h ^ i);
      });
      prev = a;
      prev_bytes = n;
    }
    DevPtr last = acts[L - 1], losses = losses_;
    const uint64_t last_n = act_bytes(L - 1);
    launch(loss_, kCompute, {last, losses, s}, [=] {
      uint64_t sum = 0;
      for (uint64_t i = 0; i < last_n / 8; ++i) sum += words(last)[i];
      words(losses)[s] = sum;
    });
    r_.free(x, kCompute);
    if (!backward) {
      for (DevPtr a : acts) r_.free(a, kCompute);
      return;
    }
    const Stream bs = c_.second_stream_backward ? kBackward : kCompute;
    if (bs != kCompute) r_.join(kCompute, bs);  // the backward starts after the forward
    DevPtr g = r_.alloc(8 * L, bs);
    for (uint32_t l = L; l-- > 0;) {
      const uint64_t n = act_bytes(l), wn = weight_bytes(l) / 8;
      DevPtr a = acts[l], w = w_[l];
      launch(bwd_, bs, {a, g, w, l}, [=] {
        words(g)[l] = mix(hash_words(a, 0, n / 8) ^ hash_words(w, 0, wn));
      });
      r_.free(a, bs);
    }
    if (bs != kCompute) r_.join(bs, kCompute);
    std::vector<uint64_t> args{g, L};
    std::vector<DevPtr> ws;
    std::vector<uint64_t> wns, ls;
    for (uint32_t l = 0; l < L; ++l) {
      args.push_back(frozen(l) ? 0 : w_[l]);  // a frozen weight is not the optimizer's
      if (frozen(l)) continue;
      ws.push_back(w_[l]);
      wns.push_back(weight_bytes(l) / 8);
      ls.push_back(l);
    }
    launch(opt_, kCompute, std::move(args), [=] {
      for (size_t k = 0; k < ws.size(); ++k)
        for (uint64_t i = 0; i < wns[k]; ++i) words(ws[k])[i] = mix(words(ws[k])[i] + words(g)[ls[k]] + i);
    });
    // Two launches after the optimizer that touch no weight: a weight's stretch across the
    // step boundary starts inside the step (its reload may come in the same step or the next).
    DevPtr norms = norms_;
    launch(norm_, kCompute, {g, norms, s}, [=] { words(norms)[s] = hash_words(g, 0, L); });
    r_.free(g, kCompute);
    launch(log_, kCompute, {losses, norms, s}, [=] { words(losses)[s] ^= mix(words(norms)[s]); });
    r_.end_step();
  }

  Config c_;
  rig::Rig r_;
  Func fill_, fwd_, loss_, bwd_, opt_, norm_, log_;
  std::vector<DevPtr> w_;
  DevPtr losses_ = 0, norms_ = 0;
  uint64_t installs_ = 0, bound_ = 0, min_physical_ = ~uint64_t{0};
  uint32_t windows_ = 0;
};

Outcome run(const Config& c) { return WeightLoop(c).run(); }
Outcome run_plain(Config c) {
  c.offload = false;
  return run(c);
}

std::string describe(const Outcome& o) {
  const ExecutorStats& s = o.stats;
  return "windows " + std::to_string(o.windows) + " bound " + std::to_string(o.bound >> 10) + " KiB; evictions " +
         std::to_string(s.weight_evictions) + " reloads " + std::to_string(s.weight_reloads) + " misses " +
         std::to_string(s.weight_misses) + " abandoned " + std::to_string(s.weight_abandoned) + " waits " +
         std::to_string(s.weight_waits) + " handovers " + std::to_string(s.weight_handovers) + " split " +
         std::to_string(s.weight_split) + " settles " + std::to_string(s.weight_settles) + " over_bound " +
         std::to_string(s.weight_over_bound) + " mapped_peak " +
         std::to_string(s.weight_mapped_peak >> 10) + " KiB of " + std::to_string(o.weight_bytes >> 10) +
         " KiB; deviations " + std::to_string(s.deviations) + " steps_active " + std::to_string(s.steps_active) +
         "; out after the run " + std::to_string(o.evicted_at_end);
}

// Checks shared by every run that must match: the bytes, the plan running to the end, the
// driver's rules kept.
void expect_same(const Outcome& off, const Outcome& plain) {
  EXPECT_TRUE(off.installed);
  EXPECT_EQ(off.unreadable, 0u) << "a weight is still unmapped after a pointer query";
  EXPECT_EQ(off.weights.size(), plain.weights.size());
  EXPECT_TRUE(off.weights == plain.weights) << "the weights differ from the plain run's";
  EXPECT_EQ(off.losses, plain.losses);
  EXPECT_EQ(off.vmm.misuses, 0u);
  EXPECT_GT(off.stats.steps_active, 2u);
  // What the executor says it holds is some of the driver's physical memory.
  EXPECT_LE(off.stats.held_bytes, off.physical_at_stats);
}

Config sound_config(uint64_t seed) {
  Config c;
  c.seed = seed;
  c.layers = 8;
  // The GPU keeps up on the whole (a run of it now and then empties the queues), so that
  // copies out, which run only when nothing else can, finish inside a window.
  c.gpu_ops_min = 1;
  c.gpu_ops_max = 4;
  c.max_queued = 16;
  c.host_sync = 0.3;
  return c;
}

// 0. A plan retired mid-run (a pool revision) and made again for the same weights: the new
// install keeps the weights as they are, and what the executor says it holds still counts
// them (an install that tore the old one down once set the count to 0 under mapped weights,
// and it went below zero as they left: moe's small shapes on the H200).
TEST(WeightStream, APlanRetiredAndPutInAgainKeepsCountingItsWeights) {
  QuietLog quiet;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Config c = sound_config(seed);
    c.steps = 12;
    c.retire_at = 6;
    const Outcome plain = run_plain(c);
    const Outcome off = run(c);
    expect_same(off, plain);
    EXPECT_GE(off.stats.deviations, 1u);
    EXPECT_GT(off.installs, off.installs_at_retire) << "the rig did not plan again after the retirement";
    EXPECT_GT(off.installs_at_retire, 0u);
    std::cout << "seed " << seed << ": held " << off.stats.held_bytes << " of " << off.physical_at_stats
              << " physical; " << describe(off) << "\n";
  }
}

// 1. Sound windows, copies delayed: the same bytes, weights moved, no miss, no deviation.
TEST(WeightStream, StreamedRunMatchesThePlainRunByteForByte) {
  QuietLog quiet;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Config c = sound_config(seed);
    const Outcome plain = run_plain(c);
    const Outcome off = run(c);
    expect_same(off, plain);
    EXPECT_GT(off.stats.weight_evictions, 0u);
    EXPECT_GT(off.stats.weight_reloads, 0u);
    EXPECT_EQ(off.stats.weight_misses, 0u);
    EXPECT_EQ(off.stats.misses, 0u);
    EXPECT_EQ(off.stats.deviations, 0u);
    EXPECT_EQ(off.stats.weights, c.layers);
    EXPECT_EQ(off.pool.lent_bytes, off.weight_bytes) << "every weight is lent to the executor";
    std::cout << "seed " << seed << ": " << describe(off) << "\n";
  }
}

// 2. The backward on a second stream: an eviction after a backward use waits for that stream,
// a reload's consumer there waits for the copy.
TEST(WeightStream, BackwardOnASecondStreamMatchesThePlainRun) {
  QuietLog quiet;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Config c = sound_config(seed);
    c.second_stream_backward = true;
    const Outcome plain = run_plain(c);
    const Outcome off = run(c);
    expect_same(off, plain);
    EXPECT_GT(off.stats.weight_evictions, 0u);
    EXPECT_GT(off.stats.weight_reloads, 0u);
    EXPECT_EQ(off.stats.weight_misses, 0u);
    EXPECT_EQ(off.stats.deviations, 0u);
    std::cout << "seed " << seed << ": " << describe(off) << "\n";
  }
}

// 3. Windows whose use (and reload) the plan puts a launch after the real use: the launch
// finds its weight evicted, the executor reloads it on demand (a miss) or keeps it (an
// eviction abandoned), and the bytes stay right.
TEST(WeightStream, AWeightTouchedBeforeItsPlannedReloadIsAMissNotWrongBytes) {
  QuietLog quiet;
  uint64_t misses = 0;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Config c = sound_config(seed);
    c.windows = Windows::Late;
    c.copy_delay = false;  // copies out finish early: the weight is evicted when touched
    c.gpu_ops_min = 2;
    c.gpu_ops_max = 4;
    const Outcome plain = run_plain(c);
    const Outcome off = run(c);
    expect_same(off, plain);
    EXPECT_GT(off.stats.weight_evictions, 0u);
    EXPECT_EQ(off.stats.deviations, 0u);
    EXPECT_GE(off.stats.misses, off.stats.weight_misses);
    misses += off.stats.weight_misses;
    std::cout << "seed " << seed << ": " << describe(off) << "\n";
  }
  EXPECT_GT(misses, 0u) << "no late window ever found its weight evicted";
}

// 4. A plan that allows two weights' bytes mapped at once (the optimizer alone needs all of
// them): the same bytes; a reload past the bound waits for a weight leaving.
// 4a'. Frozen weights marked read-only (offload_mark_read_only): each is copied out once under
// a plan, later evictions copy nothing, and the bytes still match the plain run. Against the
// same program unmarked, fewer bytes leave the device; the trainable (odd) weights still copy.
TEST(WeightStream, ReadOnlyWeightsAreCopiedOutOnce) {
  QuietLog quiet;
  uint64_t clean = 0, marked_out = 0, unmarked_out = 0;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Config c = sound_config(seed);
    c.frozen_even = true;
    const Outcome plain = run_plain(c);
    const Outcome unmarked = run(c);
    c.mark_frozen = true;
    const Outcome marked = run(c);
    expect_same(unmarked, plain);
    expect_same(marked, plain);
    EXPECT_EQ(marked.stats.weight_misses, 0u);
    EXPECT_EQ(unmarked.stats.weight_clean_evictions, 0u);
    EXPECT_EQ(unmarked.stats.weight_read_only, 0u);
    EXPECT_EQ(marked.stats.weight_read_only, c.layers / 2);  // every frozen weight is streamed here
    EXPECT_LE(marked.stats.weight_bytes_out, unmarked.stats.weight_bytes_out);
    clean += marked.stats.weight_clean_evictions;
    marked_out += marked.stats.weight_bytes_out;
    unmarked_out += unmarked.stats.weight_bytes_out;
    std::cout << "seed " << seed << ": read-only " << marked.stats.weight_read_only << ", clean evictions "
              << marked.stats.weight_clean_evictions << " of " << marked.stats.weight_evictions << "; out "
              << marked.stats.weight_bytes_out / kKiB << " KiB against " << unmarked.stats.weight_bytes_out / kKiB
              << " KiB unmarked\n";
  }
  EXPECT_GT(clean, 0u);
  EXPECT_LT(marked_out, unmarked_out);
}

// 4a''. A mark ends with its range: the free hook forgets every mark the freed allocation
// overlaps (a weight under it copies out again), and no other.
TEST(WeightStream, AMarkEndsWithItsRange) {
  SimDriver sim;
  Executor ex(sim, Executor::Options{});
  ex.mark_read_only(0x10000, 0x1000);
  EXPECT_TRUE(ex.any_read_only());
  ex.forget_read_only(0x10800, 0x10);  // a piece of it freed: the whole mark goes
  EXPECT_FALSE(ex.any_read_only());
  ex.mark_read_only(0x10000, 0x1000);
  ex.forget_read_only(0x20000, 0x1000);  // elsewhere: the mark stays
  EXPECT_TRUE(ex.any_read_only());
}

TEST(WeightStream, ATightMappedBoundStillMatches) {
  QuietLog quiet;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Config c = sound_config(seed);
    c.bound_weights = 2;
    const Outcome plain = run_plain(c);
    const Outcome off = run(c);
    expect_same(off, plain);
    EXPECT_EQ(off.bound, 2 * off.largest_weight);
    EXPECT_GT(off.stats.weight_evictions, 0u);
    EXPECT_EQ(off.stats.weight_misses, 0u);
    EXPECT_EQ(off.stats.deviations, 0u);
    std::cout << "seed " << seed << ": " << describe(off) << "\n";
  }
}

// 4b. What the bound is for: past it, the executor waits for an eviction in flight before
// it maps another weight. Every weight here is used by the optimizer and evicted after it, so
// a bound of two weights must show waits (summed over the seeds), or the mapped bytes must
// stay near the bound.
TEST(WeightStream, ATightMappedBoundMakesReloadsWait) {
  QuietLog quiet;
  uint64_t waits = 0, handovers = 0, settles = 0, listed = 0;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Config c = sound_config(seed);
    c.bound_weights = 2;
    // A handle per weight: with units (Options::unit_weights, on by default) the host rarely
    // waits at all, and under ThreadSanitizer's three seeds it did not.
    c.exec.unit_weights = false;
    const Outcome plain = run_plain(c);
    const Outcome off = run(c);
    expect_same(off, plain);
    waits += off.stats.weight_waits;
    handovers += off.stats.weight_handovers;
    settles += off.stats.weight_settles;
    // The last active step's longest waits, as the stats report them: where, what for, and
    // whether the launch's stream had run dry (the simulated driver knows: 0 or 1).
    const auto& last = off.stats.last_step_waits;
    EXPECT_LE(last.size(), 16u);
    EXPECT_LE(last.size(), off.stats.last_step_wait_count);
    EXPECT_LE(off.stats.last_step_drained, off.stats.last_step_wait_count);
    for (size_t k = 0; k < last.size(); ++k) {
      EXPECT_GE(last[k].pos, 0);
      EXPECT_TRUE(last[k].kind == 'w' || last[k].kind == 's' || last[k].kind == 'a') << last[k].kind;
      EXPECT_TRUE(last[k].drained == 0 || last[k].drained == 1);
      if (k) {
        EXPECT_GE(last[k - 1].cycles, last[k].cycles);
      }
    }
    listed += last.size();
    EXPECT_TRUE(off.stats.weight_waits + off.stats.weight_handovers > 0 ||
                off.stats.weight_mapped_peak <= off.bound + off.largest_weight)
        << describe(off);
  }
  EXPECT_GT(waits, 0u);
  EXPECT_GT(listed, 0u);
  // A reload that finds a weight of its size on its way out takes that weight's memory and
  // waits for its copy out on the GPU (the bytes still match: expect_same above).
  EXPECT_GT(handovers, 0u);
  // And a weight touched again before its last use is seen complete, its memory another's
  // by then, makes the host wait for that use (settles, counted only when it does wait).
  EXPECT_GT(settles, 0u);
}

// Weights of two sizes (256 and 512 KiB) under a bound of three of the largest: a reload
// that finds no weight of its size leaving takes pieces (kept handles and leaving weights'
// handles of other sizes, a new handle for the rest within the bound), ordered on the GPU
// after their copies out, where the host waited before (Options::split_weights off, the
// comparison). The bytes match both ways; split reloads happen; the host waits no more than
// without them. How much less depends on where the simulated device's allocations land (they are
// mmap addresses, and which weight's memory a reload finds leaving follows them): over the five
// seeds the host waited 66 times against 93 in one build (-O1), and 85 against 84 in another
// (ASan). So the waits are held to at most 5% over, not to fewer. (These random plans ignore
// the bound: past it with nothing leaving, a reload maps over it.) Memory in units
// (Options::unit_weights) is off in both: this is the path without them.
TEST(WeightStream, ReloadsTakePiecesOfOtherSizesInsteadOfWaiting) {
  QuietLog quiet;
  uint64_t waits_split = 0, waits_whole = 0, split = 0;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Config c = sound_config(seed);
    c.odd_extra = 2;  // one of the larger is two of the smaller: pieces can add up
    c.bound_weights = 3;
    c.exec.unit_weights = false;
    const Outcome plain = run_plain(c);
    const Outcome pieces = run(c);
    c.exec.split_weights = false;
    const Outcome whole = run(c);
    expect_same(pieces, plain);
    expect_same(whole, plain);
    EXPECT_EQ(whole.stats.weight_split, 0u);
    waits_split += pieces.stats.weight_waits;
    waits_whole += whole.stats.weight_waits;
    split += pieces.stats.weight_split;
    std::cout << "seed " << seed << ": split " << pieces.stats.weight_split << ", host waits " << pieces.stats.weight_waits
              << " against " << whole.stats.weight_waits << " without\n";
  }
  EXPECT_GT(split, 0u);
  EXPECT_LE(waits_split * 100, waits_whole * 105);
}

// Weights of 256 and 384 KiB (no whole handle of one is a piece of the other but the
// 256 KiB in a 384 KiB reload) under a bound of three of the largest: with the weights' memory
// in units of their common divisor (128 KiB, Options::unit_weights), every leaving weight's
// memory fits every reload, and the host waits less than with a handle per weight and pieces
// of whole handles. Without units, lora's host on the H200 waited many times a step for
// leaving weights of other sizes, losing its lead on the GPU (the step's start idled for it).
// The bytes match; the reloads' new memory is all units.
TEST(WeightStream, UnitPiecesLetEveryLeavingWeightServeEveryReload) {
  QuietLog quiet;
  uint64_t waits_unit = 0, waits_pieces = 0, handovers_unit = 0;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Config c = sound_config(seed);
    c.bound_weights = 3;
    const Outcome plain = run_plain(c);
    const Outcome unit = run(c);
    c.exec.unit_weights = false;
    const Outcome pieces = run(c);
    expect_same(unit, plain);
    expect_same(pieces, plain);
    EXPECT_EQ(unit.stats.weight_misses, 0u);
    waits_unit += unit.stats.weight_waits;
    waits_pieces += pieces.stats.weight_waits;
    handovers_unit += unit.stats.weight_handovers;
    std::cout << "seed " << seed << ": host waits " << unit.stats.weight_waits << " in units against "
              << pieces.stats.weight_waits << " without; handovers " << unit.stats.weight_handovers << " against "
              << pieces.stats.weight_handovers << "\n";
  }
  EXPECT_GT(handovers_unit, 0u);
  EXPECT_LT(waits_unit, waits_pieces);
}

// One weight outside the unit, as lora's embedding is (376 MiB beside 216 and 288 MiB
// blocks, units of 72 MiB): here 320 KiB beside 256 and 384 KiB, at most 4 pieces a weight, so
// the unit is 128 KiB. With room past its block (the pool's default) it reloads on three whole
// units mapped past its end; without, on two units and a 64 KiB tail of its own, which only a
// kept tail or new memory can serve. On the H200 without room the embedding's reload made the
// host wait its whole lead, every step. The bytes match in
// every mode; the host waits least with room, and less with a tail than with a handle per
// weight.
TEST(WeightStream, AWeightOutsideTheUnitReloadsOnWholeUnitsPastItsEnd) {
  QuietLog quiet;
  uint64_t waits = 0, waits_tail = 0, waits_whole = 0, split = 0, reloads = 0;
  // Host waits depend on where the ranges land (the same seed counts alike with address
  // randomization off, not from run to run with it on): one seed's counts vary, from 0 to 9
  // with a tail. Eight seeds in every build, so that the sums compare the three ways and not
  // the layout (three seeds under ThreadSanitizer once summed 4 and 4).
  constexpr uint64_t kUnitSeeds = 8;
  for (uint64_t seed = 1; seed <= kUnitSeeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Config c = sound_config(seed);
    c.bound_weights = 3;
    c.first_weight_kib = 320;
    c.exec.unit_max_pieces = 4;
    const Outcome plain = run_plain(c);
    const Outcome room = run(c);
    c.pool_room = 1;
    const Outcome tail = run(c);
    c.exec.unit_weights = false;
    const Outcome whole = run(c);
    expect_same(room, plain);
    expect_same(tail, plain);
    expect_same(whole, plain);
    EXPECT_EQ(room.stats.weight_misses, 0u);
    EXPECT_EQ(room.vmm.misuses, 0u);
    waits += room.stats.weight_waits;
    waits_tail += tail.stats.weight_waits;
    waits_whole += whole.stats.weight_waits;
    split += room.stats.weight_split;
    reloads += room.stats.weight_reloads;
    std::cout << "seed " << seed << ": host waits " << room.stats.weight_waits << " with room, " << tail.stats.weight_waits
              << " with a tail, " << whole.stats.weight_waits << " without units; " << describe(room) << "\n";
  }
  // Reloads on several handles, most of them (a plan streaming only some of the weights may
  // pick another unit), and the host waits less at each step.
  EXPECT_GT(split, reloads / 2);
  EXPECT_LT(waits, waits_tail);
  EXPECT_LT(waits_tail, waits_whole);
}

// 4c. The point of streaming: while weights are evicted, their device memory is free. The
// loop samples the driver's physical bytes after every launch once a plan is installed
// (only the weights' blocks are VMM memory here: no arenas, activations from the caching
// pool); at the lowest point some weight must be out. (An evicted weight's handle was once
// kept unmapped for the next reload and never released: streaming then freed nothing.)
TEST(WeightStream, EvictedWeightsGiveTheirDeviceMemoryBack) {
  QuietLog quiet;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    for (int bound : {0, 2}) {
      Config c = sound_config(seed);
      c.bound_weights = bound;
      const Outcome off = run(c);
      EXPECT_GT(off.stats.weight_evictions, 0u);
      EXPECT_LT(off.min_physical, off.weight_bytes) << "bound " << bound << ": " << describe(off);
    }
  }
}

// 5. The program frees every weight after the forward of one more step, with some of them
// evicted: no crash, the pool has them back (nothing of them live or lent), the plan is
// abandoned (a deviation), and the losses match.
TEST(WeightStream, FreeingStreamedWeightsMidStepGivesThemBackToThePool) {
  QuietLog quiet;
  uint32_t evicted = 0;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Config c = sound_config(seed);
    c.free_weights_mid_step = true;
    c.copy_delay = seed % 2 == 0;  // with delayed copies some are still being copied out
    const Outcome plain = run_plain(c);
    const Outcome off = run(c);
    EXPECT_EQ(off.losses, plain.losses);
    EXPECT_GT(off.stats.weight_evictions, 0u);
    EXPECT_GE(off.stats.deviations, 1u);
    EXPECT_EQ(off.stats.weights, 0u) << "the executor still holds a freed weight";
    EXPECT_EQ(off.pool.live_bytes, 0u) << "only the weights were the pool's";
    EXPECT_EQ(off.pool.lent_bytes, 0u);
    EXPECT_EQ(off.vmm.misuses, 0u);
    evicted += off.evicted_at_free;
    std::cout << "seed " << seed << ": " << off.evicted_at_free << " weights evicted at the free; "
              << describe(off) << "\n";
  }
  EXPECT_GT(evicted, 0u) << "no run freed a weight while it was evicted";
}

// ---- Fault injection -----------------------------------------------------------------------

enum class Verdict : uint8_t { Same, Differ, Died };
const char* name(Verdict v) { return v == Verdict::Same ? "same bytes" : v == Verdict::Differ ? "different bytes" : "died"; }

// In a child process: a missing wait may fault (a kernel on an unmapped weight) as well as
// give wrong bytes.
Verdict run_in_child(const Config& c, const Outcome& plain) {
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    return Verdict::Same;
  }
  if (pid == 0) {
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0) {
      dup2(null, 1);
      dup2(null, 2);
    }
    Outcome off = run(c);
    _exit(off.weights == plain.weights && off.losses == plain.losses ? 0 : 3);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Verdict::Same;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 3) return Verdict::Differ;
  return Verdict::Died;
}

// Each seed runs with the fault off first (it must match), then with it on, in a child.
void expect_fault_caught(Executor::Options::Fault fault, bool copy_delay, int bound_weights = -1) {
#if defined(OFFLOAD_TEST_TSAN)
  // Whether the comparison notices a dropped wait is the test's sensitivity, not a question of
  // threads; each seed forks a child. The plain and AddressSanitizer builds run them (70 s of
  // the ThreadSanitizer run saved).
  GTEST_SKIP() << "fault injection runs in the plain and ASan builds";
#endif
  QuietLog quiet;
  int caught = 0;
  uint64_t reloads = 0;
  std::string verdicts;
  for (uint64_t seed = 1; seed <= kSeeds + 3; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Config c = sound_config(seed);
    c.copy_delay = copy_delay;
    // The GPU runs further behind (the last use before an eviction is often still queued)
    // and each weight stays out as long as its window allows, its consumer queued right
    // behind the copy in. Each seed here noticed both faults when this test was written.
    c.gpu_ops_min = 0;
    c.gpu_ops_max = 2;
    c.max_queued = 32;
    c.host_sync = 0;
    c.windows = Windows::AtUse;
    c.bound_weights = bound_weights;
    const Outcome plain = run_plain(c);
    const Outcome clean = run(c);
    expect_same(clean, plain);
    reloads += fault == Executor::Options::Fault::SkipHandoverWait ? clean.stats.weight_handovers : clean.stats.weight_reloads;
    c.exec.fault = fault;
    Verdict v = run_in_child(c, plain);
    caught += v != Verdict::Same;
    verdicts += " " + std::to_string(seed) + ": " + name(v) + ";";
  }
  std::cout << (fault == Executor::Options::Fault::SkipReloadWait  ? "no reload wait"
                : fault == Executor::Options::Fault::SkipEvictWait ? "no evict wait"
                                                                    : "no hand-over wait")
            << ":" << verdicts << "\n";
  EXPECT_GT(reloads, 0u) << "no weight moved (or took another's memory) without the fault";
  EXPECT_GE(caught, 2) << "the missing wait went unnoticed:" << verdicts;
}

// 6. A launch that reads a reloaded weight without waiting for the copy in: with copies
// delayed it reads what the handle held before (another weight's bytes, or garbage).
TEST(WeightStreamFault, MissingReloadWaitIsCaught) {
  expect_fault_caught(Executor::Options::Fault::SkipReloadWait, true);
}

// A copy out that does not wait for the weight's last use (the optimizer's write): it copies
// stale bytes, or the weight is unmapped under a queued kernel.
TEST(WeightStreamFault, MissingEvictWaitIsCaught) {
  expect_fault_caught(Executor::Options::Fault::SkipEvictWait, false);
}

// A reload that takes the memory of weights on their way out (the same size, or pieces of
// any size) and writes it without waiting for their copies out: it overwrites bytes still
// being copied out, or still read by their last use.
TEST(WeightStreamFault, MissingHandoverWaitIsCaught) {
  expect_fault_caught(Executor::Options::Fault::SkipHandoverWait, true, 2);
}

}  // namespace
}  // namespace offload

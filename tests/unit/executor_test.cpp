// The executor end to end on the simulated driver: a synthetic training step (a forward
// that saves activations, a backward that reads them back, an optimizer step) runs through
// the tracker, the step assembler, the built-in planner and the executor, on a simulated
// GPU that runs work later than it is queued, delays copies and unmaps evicted ranges. The
// weights and losses after N steps must be byte-identical to the same program without the
// executor. Fault injection shows that the harness notices a missing wait.
#include <gtest/gtest.h>

#include <cstring>
#include <iostream>
#include <functional>
#include <memory>
#include <random>

#include "core/executor.h"
#include "core/plan.h"
#include "core/sim_driver.h"
#include "core/tracker.h"

namespace offload {
namespace {

uint64_t mix(uint64_t x) {
  x ^= x >> 31;
  x *= 0x9e3779b97f4a7c15ull;
  x ^= x >> 29;
  return x;
}

struct Config {
  uint32_t layers = 8;
  uint32_t steps = 8;
  uint64_t seed = 1;
  bool offload = true;
  bool copy_delay = true;
  uint32_t gpu_ops_per_launch = 2;  // how far the simulated GPU may run behind
  bool second_stream_backward = false;
  uint64_t budget = 0;
  uint64_t host_chunk = 0, host_phase = 0;  // pinned-chunk layout of the host memory
  Executor::Options exec{};
};

struct Outcome {
  std::vector<uint64_t> weights, losses;
  ExecutorStats stats;
  bool installed = false;
};

// The shim's wiring, without a GPU: hooks -> tracker (+ executor gate) -> simulated GPU.
class Rig {
 public:
  explicit Rig(const Config& c)
      : c_(c), log_(1 << 16, 1 << 18), tr_(sim_, log_), as_(tr_.funcs(), options()), ex_(sim_, c.exec), rng_(c.seed) {
    sim_.set_copy_delay(c.copy_delay);
    if (c.offload) tr_.set_gate(&ex_);
    fwd_ = sim_.add_kernel("fwd", {{0, 8}, {8, 8}, {16, 8}, {24, 8}});
    tmp_ = sim_.add_kernel("tmp", {{0, 8}, {8, 8}});
    loss_ = sim_.add_kernel("loss", {{0, 8}, {8, 8}, {16, 8}});
    bwd_ = sim_.add_kernel("bwd", {{0, 8}, {8, 8}, {16, 8}});
    opt_ = sim_.add_kernel("opt", {{0, 8}, {8, 8}, {16, 8}});
    fill_ = sim_.add_kernel("fill", {{0, 8}, {8, 8}});
  }
  ~Rig() { sim_.run_all(); }

  Outcome run() {
    const uint32_t L = c_.layers;
    DevPtr w = alloc(8 * L, kCompute);
    DevPtr losses = alloc(8 * c_.steps, kCompute);
    launch(fill_, kCompute, {w, 8 * L}, [=] {
      for (uint32_t i = 0; i < L; ++i) words(w)[i] = mix(i + 1);
    });
    const uint64_t nsteps = c_.steps;
    launch(fill_, kCompute, {losses, 8 * nsteps}, [=] { std::memset(words(losses), 0, 8 * nsteps); });
    for (uint32_t s = 0; s < c_.steps; ++s) step(s, w, losses);
    sim_.run_all();
    pump();
    Outcome o;
    o.weights.assign(words(w), words(w) + L);
    o.losses.assign(words(losses), words(losses) + c_.steps);
    o.stats = ex_.stats();
    o.installed = ex_.installed();
    return o;
  }

 private:
  static constexpr Stream kCompute = 0x7, kBackward = 0x8;
  static uint64_t* words(DevPtr p) { return reinterpret_cast<uint64_t*>(p); }

  static StepAssembler::Options options() {
    StepAssembler::Options o;
    o.telemetry_wait_ns = 0;
    return o;
  }

  uint64_t act_bytes(uint32_t l) const { return (64u << 10) * (1 + (l * 7 + c_.seed) % 5); }

  DevPtr alloc(uint64_t bytes, Stream s) {
    uint64_t tag = 0;
    DevPtr p = c_.offload ? ex_.place(bytes, s, tr_.launches(), &tag) : 0;
    if (!p) p = sim_.alloc(bytes);
    tr_.on_alloc(p, bytes, s, tag);
    ex_.note_live(tr_.allocs().live_bytes());
    return p;
  }

  void free(DevPtr p, Stream s) {
    tr_.on_free(p, s);
    if (c_.offload && ex_.release(p, s)) return;
    sim_.launch(s, [this, p] { sim_.free(p); });  // stream-ordered, like cudaFreeAsync
  }

  void launch(Func f, Stream s, std::vector<uint64_t> args, std::function<void()> body) {
    void* params[8];
    for (size_t i = 0; i < args.size(); ++i) params[i] = &args[i];
    tr_.on_kernel(f, s, params, nullptr);
    sim_.launch(s, std::move(body));
    for (uint32_t i = 0; i < c_.gpu_ops_per_launch; ++i) sim_.step(rng_);
  }

  void step(uint32_t s, DevPtr w, DevPtr losses) {
    const uint32_t L = c_.layers;
    DevPtr x = alloc(64 << 10, kCompute);
    launch(fill_, kCompute, {x, 64 << 10}, [=] {
      for (uint64_t i = 0; i < (64 << 10) / 8; ++i) words(x)[i] = mix(s * 1000003 + i);
    });
    std::vector<DevPtr> acts(L);
    DevPtr prev = x;
    uint64_t prev_bytes = 64 << 10;
    for (uint32_t l = 0; l < L; ++l) {
      uint64_t n = act_bytes(l);
      acts[l] = alloc(n, kCompute);
      DevPtr a = acts[l];
      launch(fwd_, kCompute, {prev, a, w, n}, [=] {
        uint64_t wl = words(w)[l], np = prev_bytes / 8;
        for (uint64_t i = 0; i < n / 8; ++i) words(a)[i] = mix(words(prev)[i % np] ^ wl ^ i);
      });
      DevPtr t = alloc(4096, kCompute);  // a forward temporary: never a candidate
      launch(tmp_, kCompute, {t, a}, [=] { words(t)[0] = words(a)[0]; });
      free(t, kCompute);
      prev = a;
      prev_bytes = n;
    }
    DevPtr last = acts[L - 1];
    uint64_t last_n = act_bytes(L - 1);
    launch(loss_, kCompute, {last, losses, s}, [=] {
      uint64_t sum = 0;
      for (uint64_t i = 0; i < last_n / 8; ++i) sum += words(last)[i];
      words(losses)[s] = sum;
    });
    free(x, kCompute);
    Stream bs = c_.second_stream_backward ? kBackward : kCompute;
    if (bs != kCompute) {
      // The backward stream starts after the forward (as autograd orders it).
      uint64_t ev = sim_.create_event();
      sim_.record_event(ev, kCompute);
      sim_.stream_wait(bs, ev);
    }
    DevPtr g = alloc(8 * L, bs);
    for (uint32_t l = L; l-- > 0;) {
      DevPtr a = acts[l];
      uint64_t n = act_bytes(l);
      launch(bwd_, bs, {a, g, l}, [=] {
        uint64_t h = 0;
        for (uint64_t i = 0; i < n / 8; ++i) h = mix(h ^ words(a)[i]);
        words(g)[l] = h;
      });
      free(a, bs);
    }
    if (bs != kCompute) {
      uint64_t ev = sim_.create_event();
      sim_.record_event(ev, bs);
      sim_.stream_wait(kCompute, ev);
    }
    launch(opt_, kCompute, {g, w, L}, [=] {
      for (uint32_t l = 0; l < L; ++l) words(w)[l] = mix(words(w)[l] + words(g)[l]);
    });
    free(g, kCompute);
    tr_.mark_step();
    pump();
  }

  // The worker: assemble steps; plan from a step that repeats the one before.
  void pump() {
    log_.drain([&](const Event& e, const AllocId* acc) { as_.consume(e, acc); });
    ex_.poll();
    for (StepTrace& t : as_.take_ready(0, false, true)) {
      std::vector<uint64_t> tokens;
      for (const TraceLaunch& l : t.launches) tokens.push_back(launch_token(l.kind, l.kernel));
      bool repeats = tokens == last_tokens_;
      last_tokens_ = tokens;
      if (!c_.offload || !repeats || ex_.installed() || !ex_.idle()) continue;
      PlanOptions o;
      o.granularity = sim_.vmm_granularity();
      o.budget = c_.budget;
      o.segments = 4;
      std::string why;
      Plan p = build_plan(t, o, &why);
      ASSERT_FALSE(p.arenas.empty()) << why;
      host_.assign(p.host_bytes() + c_.host_phase, 0);
      uint64_t n = p.step_launches, anchor = t.first_launch + n, now = tr_.launches();
      if (anchor <= now) anchor += (now - anchor) / n * n + n;
      // The host memory as if pinned in chunks of c_.host_chunk from `phase` bytes before it.
      HostMemory hm{host_.data() + c_.host_phase, host_.data(), c_.host_chunk};
      ASSERT_TRUE(ex_.install(std::move(p), anchor, hm, &why)) << why;
    }
  }

  Config c_;
  SimDriver sim_;
  EventLog log_;
  Tracker tr_;
  StepAssembler as_;
  Executor ex_;
  std::mt19937_64 rng_;
  Func fwd_, tmp_, loss_, bwd_, opt_, fill_;
  std::vector<uint64_t> last_tokens_;
  std::vector<unsigned char> host_;
};

Outcome run(Config c) { return Rig(c).run(); }

TEST(Executor, OffloadedStepsMatchThePlainRunByteForByte) {
  Config c;
  Outcome plain = run([&] { Config p = c; p.offload = false; return p; }());
  Outcome off = run(c);
  ASSERT_TRUE(off.installed);
  EXPECT_EQ(off.weights, plain.weights);
  EXPECT_EQ(off.losses, plain.losses);
  EXPECT_GT(off.stats.evictions, 0u);
  EXPECT_GT(off.stats.reloads, 0u);
  EXPECT_EQ(off.stats.misses, 0u);
  EXPECT_EQ(off.stats.deviations, 0u);
  EXPECT_GT(off.stats.steps_active, 2u);
  std::cout << "evictions " << off.stats.evictions << " reloads " << off.stats.reloads << " abandoned "
            << off.stats.evictions_abandoned << " placed " << off.stats.placed << " busy " << off.stats.arena_busy
            << " handles " << off.stats.handles_created << " waits " << off.stats.budget_waits << " plan "
            << off.stats.plan << "\n";
}

TEST(Executor, CopiesSplitAtPinnedChunkBoundaries) {
  Config c;
  c.host_chunk = 100 * 1024 + 8;  // not a divisor of anything the arenas hold
  c.host_phase = 12344;
  Outcome plain = run([&] { Config p = c; p.offload = false; return p; }());
  Outcome off = run(c);
  ASSERT_TRUE(off.installed);
  EXPECT_GT(off.stats.evictions, 0u);
  EXPECT_EQ(off.weights, plain.weights);
  EXPECT_EQ(off.losses, plain.losses);
}

}  // namespace
}  // namespace offload

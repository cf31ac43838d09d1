// The shim's wiring without a GPU, for the executor tests: a program's hooks go to the
// tracker (and through it to the executor's launch gate) and its kernels to the simulated
// GPU, which runs them later, in an order a seeded scheduler picks; pump() is the worker
// (assemble steps, plan from a step that repeats the one before, install), as
// preload/plan_controller.cpp's plan_from does it.
//
// A program allocates, frees and launches through the Rig only, so that the same program
// run with offload off (Options::offload = false) is the reference its bytes are compared
// with. Everything runs on the test's thread; the simulated GPU executes ops only when the
// rig steps it after a launch, at a host sync, when its queues are full, or when the
// executor waits for an event. Memory the executor does not place comes from a caching pool
// (reused once the freeing stream reaches the free), so a program that reads memory it did
// not write reads bytes that differ from run to run, and fails the comparison.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/executor.h"
#include "core/persistent_pool.h"
#include "planner/plan.h"
#include "core/sim_driver.h"
#include "core/tracker.h"
#include "residency/cap_and_plan.h"
#include "residency/host_store.h"
#include "residency/residency.h"
#include "sim_words.h"

namespace offload::rig {

using sim_words::mix;
using sim_words::words;

// Every word of [from, to) changes the result.
inline uint64_t hash_words(DevPtr p, uint64_t from, uint64_t to) {
  const uint64_t* w = words(p);
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t i = from; i < to; ++i) h = (h ^ w[i]) * 0x100000001b3ull;
  return h;
}

struct Options {
  uint64_t seed = 1;  // the GPU scheduler's
  bool offload = true;
  bool copy_delay = true;
  uint32_t gpu_ops_min = 2, gpu_ops_max = 2;  // ops the simulated GPU runs after each launch
  double host_sync = 0;  // chance that the host waits for the GPU at the end of a step
  size_t max_queued = 0;  // past this many queued ops the host waits for the GPU (0: never)
  uint64_t granularity = 64 << 10;
  uint64_t host_chunk = 0, host_phase = 0;  // pinned-chunk layout of the host memory
  uint64_t physical_limit = 0;  // SimDriver::set_physical_limit (0: none)
  // Allocations of at least this many bytes come from a PersistentPool, whose blocks the
  // executor may stream (0: no pool, as without OFFLOAD_PERSISTENT_MIN).
  uint64_t persistent_min = 0;
  uint64_t pool_room = PersistentPool::Options{}.room;
  // The hard cap under the plan, as the shim runs it with OFFLOAD_CAP_PLAN: a residency manager
  // holds this budget (0: none), serves every allocation of at least the granularity that the
  // executor does not place, and makes the room the executor's handles are made in.
  uint64_t cap_budget = 0;
  Executor::Options exec{};
};

// A test's configuration as rig options: the simulated GPU's schedule (its seed, offload,
// copy_delay, gpu_ops_min/max, max_queued and host_sync fields) and a PersistentPool for
// allocations of at least `persistent_min`.
template <class Config>
Options schedule_options(const Config& c, uint64_t persistent_min) {
  Options o;
  o.seed = c.seed;
  o.offload = c.offload;
  o.copy_delay = c.copy_delay;
  o.gpu_ops_min = c.gpu_ops_min;
  o.gpu_ops_max = c.gpu_ops_max;
  o.max_queued = c.max_queued;
  o.host_sync = c.host_sync;
  o.persistent_min = persistent_min;
  return o;
}

class Rig;
// The worker's planner: the plan for steps like `t`, or an empty one (none installed).
using Planner = std::function<Plan(const StepTrace& t, Rig& rig)>;

class Rig {
 public:
  explicit Rig(const Options& o)
      : o_(o), log_(1 << 16, 1 << 18), tr_(sim_, log_), as_(tr_.funcs(), assembler_options()), ex_(sim_, o.exec),
        rng_(o.seed) {
    sim_.set_granularity(o.granularity);
    sim_.set_copy_delay(o.copy_delay);
    if (o.physical_limit) sim_.set_physical_limit(o.physical_limit);
    if (o.persistent_min) {
      PersistentPool::Options po;
      po.min_bytes = o.persistent_min;
      po.room = o.pool_room;
      persistent_ = std::make_unique<PersistentPool>(sim_, po);
      ex_.set_persistent(persistent_.get());
    }
    if (o.cap_budget) {
      HostStore::Options ho;
      ho.chunk_bytes = 1 << 20;
      ho.limit = 1ull << 30;
      host_store_ = std::make_unique<HostStore>(sim_, ho);
      Residency::Options ro;
      ro.budget = o.cap_budget;
      ro.pool_floor = ro.pool_step = 0;  // the caching pool below is not counted
      res_ = std::make_unique<Residency>(sim_, *host_store_, ro);
      if (o.offload) {
        ex_.set_room(res_.get());
        gates_ = std::make_unique<CapAndPlan>(*res_, ex_);
        tr_.set_gate(gates_.get());
      } else {
        tr_.set_gate(res_.get());
      }
    } else if (o.offload) {
      tr_.set_gate(&ex_);
    }
    planner_ = [](const StepTrace& t, Rig& r) {
      PlanOptions po;
      po.granularity = r.sim().vmm_granularity();
      po.segments = 4;
      std::string why;
      return build_plan(t, po, &why);
    };
  }
  ~Rig() { sim_.run_all(); }
  Rig(const Rig&) = delete;
  Rig& operator=(const Rig&) = delete;

  void set_planner(Planner p) { planner_ = std::move(p); }

  // Kernels whose parameters are all 8-byte words.
  Func add_kernel(std::string name, int nparams) {
    std::vector<ParamInfo> params;
    for (int i = 0; i < nparams; ++i) params.push_back(ParamInfo{8u * static_cast<uint32_t>(i), 8});
    return sim_.add_kernel(std::move(name), std::move(params));
  }

  // cudaMallocAsync through the executor, as the allocator hook does; what the executor does
  // not place comes from the PersistentPool (persistent_min and larger, if set), else from a
  // caching pool, as PyTorch's does.
  DevPtr alloc(uint64_t bytes, Stream s) {
    uint64_t tag = 0;
    DevPtr p = o_.offload ? ex_.place(bytes, s, tr_.launches(), &tag) : 0;
    if (!p && persistent_ && bytes >= o_.persistent_min) p = persistent_->alloc(bytes, s);
    if (!p && res_) {
      bool refused = false;
      p = gates_ ? gates_->alloc(bytes, s, &tag, &refused) : res_->alloc(bytes, s, &tag, &refused);
      EXPECT_FALSE(refused) << res_->error();
    }
    if (!p) {
      if (auto it = pool_.find(bytes); it != pool_.end()) {
        p = it->second;
        pool_.erase(it);
      } else {
        p = sim_.alloc(bytes);
      }
      pool_sizes_[p] = bytes;
    }
    tr_.on_alloc(p, bytes, s, tag);
    ex_.note_live(tr_.allocs().live_bytes());
    return p;
  }

  // cudaFreeAsync: the block is back in the pool once the stream reaches the free, so that it
  // is reused only after every use the program ordered before it (the program orders a free
  // after the uses on other streams, as record_stream does).
  void free(DevPtr p, Stream s) {
    tr_.on_free(p, s);
    if (res_ && res_->free(p, s)) return;
    if (o_.offload && ex_.release(p, s)) return;
    if (persistent_ && persistent_->free(p, s)) return;
    auto it = pool_sizes_.find(p);
    ASSERT_NE(it, pool_sizes_.end()) << "free of an unknown pointer";
    uint64_t bytes = it->second;
    pool_sizes_.erase(it);
    sim_.launch(s, [this, p, bytes] { pool_.emplace(bytes, p); });
  }

  void kernel(Func f, Stream s, std::vector<uint64_t> args, std::function<void()> body) {
    std::vector<void*> params(args.size());
    for (size_t i = 0; i < args.size(); ++i) params[i] = &args[i];
    tr_.on_kernel(f, s, params.data(), nullptr);
    forward(s, std::move(body));
  }

  // cudaMemcpyAsync device to device; cudaMemsetAsync.
  void copy(DevPtr dst, DevPtr src, uint64_t bytes, Stream s) {
    tr_.on_copy(dst, src, bytes, s);
    forward(s, [dst, src, bytes] { std::memcpy(words(dst), words(src), bytes); });
  }
  void memset(DevPtr dst, int value, uint64_t bytes, Stream s) {
    tr_.on_memset(dst, bytes, s);
    forward(s, [dst, value, bytes] { std::memset(words(dst), value, bytes); });
  }
  // A graph replay: the rig cannot tell what it touches.
  void graph(Stream s, std::function<void()> body) {
    tr_.on_graph(s);
    forward(s, std::move(body));
  }

  // Work queued on `to` from now on waits for the work queued on `from` so far.
  void join(Stream from, Stream to) {
    uint64_t ev = sim_.create_event();
    sim_.record_event(ev, from);
    sim_.stream_wait(to, ev);
    sim_.destroy_event(ev);
  }

  // The end of a training step (the application's mark), then the worker's turn. Now and
  // then the host waits for the GPU first (a loss.item()).
  void end_step() {
    tr_.mark_step();
    if (o_.host_sync > 0 && std::bernoulli_distribution(o_.host_sync)(rng_)) sim_.run_all();
    pump();
  }
  void finish() {
    sim_.run_all();
    pump();
  }

  SimDriver& sim() { return sim_; }
  Executor& executor() { return ex_; }
  Residency* residency() { return res_.get(); }
  Tracker& tracker() { return tr_; }
  PersistentPool* persistent() { return persistent_.get(); }
  uint64_t installs() const { return installs_; }
  // The step the installed plan was made from (empty before any).
  const StepTrace& planned_from() const { return planned_from_; }
  // As the runtime puts a plan made again in at a step's mark: the GPU caught up (every arena is
  // empty), `p` installed over the running plan, with host memory of its own, from the next step.
  bool install_at_mark(Plan p, std::string* why) {
    sim_.run_all();
    ex_.poll();
    resolve_weights(p, planned_from_);
    host_next_.assign(p.host_bytes() + o_.host_phase, 0);
    const uint64_t anchor = plan_anchor(planned_from_.first_launch, p.step_launches, tr_.launches());
    HostMemory hm{host_next_.data() + o_.host_phase, host_next_.data(), o_.host_chunk};
    if (!ex_.install(std::move(p), anchor, hm, why)) return false;
    host_.swap(host_next_);  // the old plan's host memory goes once nothing can copy from it
    anchor_ = anchor;
    ++installs_;
    return true;
  }
  // Installed and not abandoned, and its first step has begun or begins at launch `n`.
  bool plan_runs_at(uint64_t n) { return ex_.installed() && !ex_.deviated() && anchor_ <= n; }

 private:
  static StepAssembler::Options assembler_options() {
    StepAssembler::Options o;
    o.telemetry_wait_ns = 0;
    return o;
  }

  // The launch the tracker saw goes to the GPU, as the hook forwards it (the cap never refuses
  // one in these programs: their budgets hold every launch's ranges).
  void forward(Stream s, std::function<void()> body) {
    if (res_ && Residency::take_refusal()) ADD_FAILURE() << "a launch refused under the cap: " << res_->error();
    sim_.launch(s, std::move(body));
    if (res_) res_->after_launch();
    run_gpu();
  }

  // The simulated GPU runs behind the host by a random number of ops; when its queues are
  // full the host waits for it (so that delayed copies, which run only when nothing else
  // can, do not wait for ever behind a GPU that never catches up).
  void run_gpu() {
    uint32_t n = std::uniform_int_distribution<uint32_t>(o_.gpu_ops_min, o_.gpu_ops_max)(rng_);
    for (uint32_t i = 0; i < n; ++i) sim_.step(rng_);
    if (o_.max_queued && sim_.pending_ops() > o_.max_queued) sim_.run_all();
  }

  void pump() {
    log_.drain([&](const Event& e, const AllocId* acc) { as_.consume(e, acc); });
    ex_.poll();
    if (res_) res_->poll();
    for (StepTrace& t : as_.take_ready(0, false, true)) {
      std::vector<uint64_t> tokens = step_tokens(t);
      bool repeats = tokens == last_tokens_;
      last_tokens_ = std::move(tokens);
      if (!o_.offload || !repeats || (ex_.installed() && !ex_.deviated()) || !ex_.idle()) continue;
      Plan p = planner_(t, *this);
      planned_from_ = t;
      resolve_weights(p, t);  // the weights' addresses and ids, from this process's trace
      if (p.empty()) continue;
      // The executor is idle: nothing of the previous host memory is being copied.
      host_.assign(p.host_bytes() + o_.host_phase, 0);
      const uint64_t anchor = plan_anchor(t.first_launch, p.step_launches, tr_.launches());
      // The host memory as if pinned in chunks of host_chunk from host_phase bytes before it.
      HostMemory hm{host_.data() + o_.host_phase, host_.data(), o_.host_chunk};
      std::string why;
      ASSERT_TRUE(ex_.install(std::move(p), anchor, hm, &why)) << why;
      anchor_ = anchor;
      ++installs_;
    }
  }

  Options o_;
  SimDriver sim_;
  EventLog log_;
  Tracker tr_;
  StepAssembler as_;
  std::vector<unsigned char> host_, host_next_;
  StepTrace planned_from_;
  // Before the executor, which gives lent weights back to it when it goes.
  std::unique_ptr<PersistentPool> persistent_;
  // Before the executor too, whose handles go back to its room when it goes.
  std::unique_ptr<HostStore> host_store_;
  std::unique_ptr<Residency> res_;
  std::unique_ptr<CapAndPlan> gates_;
  Executor ex_;
  std::mt19937_64 rng_;
  Planner planner_;
  std::vector<uint64_t> last_tokens_;
  std::unordered_multimap<uint64_t, DevPtr> pool_;  // bytes -> free block (SimDriver frees them at the end)
  std::unordered_map<DevPtr, uint64_t> pool_sizes_;  // live blocks from the pool
  uint64_t installs_ = 0, anchor_ = ~uint64_t{0};  // anchor_: where the last plan installed runs from
};

}  // namespace offload::rig

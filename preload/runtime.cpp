#include "runtime.h"

#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/files.h"
#include "common/log.h"
#include "hooks/hook_table.h"
#include "offload/offload.h"
#include "planner/planner.h"

namespace offload {

namespace {

std::atomic<Runtime*> g_runtime{nullptr};
std::atomic<bool> g_pass_through{false};  // set at exit and in forked children
const Settings* g_settings = nullptr;      // set once by the library constructor
std::once_flag g_build_once;
__attribute__((tls_model("initial-exec"))) thread_local bool t_in_hook = false;

int64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

constexpr size_t kSummariesKept = 256;

// This process's command line, for offloadctl status.
std::string command_line() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  // argv[0] without its directory, then the arguments.
  size_t end0 = s.find('\0');
  std::string argv0 = s.substr(0, end0);
  std::string rest = end0 == std::string::npos ? "" : s.substr(end0);
  std::string out = argv0.substr(argv0.rfind('/') == std::string::npos ? 0 : argv0.rfind('/') + 1) + rest;
  for (char& c : out)  // argument separators, and newlines or tabs inside an argument
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

const char* route_names[] = {"export", "dlsym", "cuGetProcAddress", "cudaGetDriverEntryPoint"};

}  // namespace

HookGuard::HookGuard() : outermost_(!t_in_hook) { t_in_hook = true; }
HookGuard::~HookGuard() {
  if (outermost_) t_in_hook = false;
}

Runtime* runtime() {
  if (g_pass_through.load(std::memory_order_relaxed)) return nullptr;
  if (Runtime* rt = g_runtime.load(std::memory_order_acquire)) return rt;
  if (!g_settings) return nullptr;
  // Built on the first allocation or launch we see, so that processes which only inherit
  // LD_PRELOAD (compilers, data-loader workers) never pay for the rings or the worker.
  std::call_once(g_build_once, [] { g_runtime.store(new Runtime(*g_settings), std::memory_order_release); });
  return g_runtime.load(std::memory_order_acquire);
}

namespace {

// offloadd's pool holds the bytes a plan of arenas moves; the hard cap keeps its own store and
// observing moves nothing. Then the shim connects to a running offloadd (status, telemetry) but
// starts none: a process that only watches, or fits its budget, pays for no daemon and no pool.
Settings link_settings(Settings s) {
  const bool arenas = s.offload() && !s.cap;
  if (!arenas && s.daemon == "auto") s.daemon = "connect";
  return s;
}

}  // namespace

Runtime::Runtime(Settings s)
    : settings_(std::move(s)),
      tracker_(driver_, log_),
      executor_(driver_, Executor::Options{}),
      offloading_requested_(settings_.offload()),
      offloading_(settings_.offload() && !settings_.cap),
      telemetry_(settings_.cupti_lib, tracker_.counters().kernels),
      assembler_(tracker_.funcs(), StepAssembler::Options{}),
      link_(link_settings(settings_), command_line()) {
  cache_.set_max(settings_.block_cache);
  if (offloading_) tracker_.set_gate(&executor_);
  if (settings_.persistent_min) {
    PersistentPool::Options po;
    po.min_bytes = settings_.persistent_min;
    persistent_ = std::make_unique<PersistentPool>(driver_, po);
    executor_.set_persistent(persistent_.get());
  }
  // Traces go only to a directory of this user that nobody else may write to: in a directory
  // another user made first, they could plant symlinks to the user's files.
  if (std::string why; !settings_.trace_dir.empty() && !prepare_trace_dir(settings_.trace_dir, &why)) {
    log().error("OFFLOAD_TRACE={}: {}; traces are off", settings_.trace_dir, why);
    settings_.trace_dir.clear();
  }
  // The worker inherits a mask with every signal blocked: signals go to the application.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  thread_ = std::thread([this] { worker(); });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

Runtime::~Runtime() { stop(); }

void Runtime::drop_in_child() { link_.drop_in_child(); }

void Runtime::stop() {
  stop_.store(true);
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Runtime::worker() {
  pthread_setname_np(pthread_self(), "offload-worker");
  while (!stop_.load(std::memory_order_relaxed)) {
    {
      std::unique_lock lock(wake_mu_);
      wake_.wait_for(lock, std::chrono::milliseconds(20));
    }
    if (stop_.load(std::memory_order_relaxed) || g_pass_through.load(std::memory_order_relaxed)) break;
    pump(false);
  }
}

void Runtime::pump(bool no_wait) {
  std::lock_guard lock(pump_mu_);
  // CUPTI starts once the process has launched on the GPU, never in processes that only
  // inherited LD_PRELOAD (compilers, data-loader workers).
  if (!telemetry_started_ && settings_.telemetry && tracker_.counters().kernels.load() > 0) {
    telemetry_started_ = true;
    if (telemetry_.start()) {
      assembler_.gpu_times_from(log_.appended() + 1);
      log().info("GPU-time telemetry: CUPTI activity records on");
      if (settings_.trace_lead) {
        if (auto clock = telemetry_.clock()) tracker_.set_lead_clock(clock);
        else log().warn("OFFLOAD_TRACE_LEAD: this CUPTI has no cuptiGetTimestamp; traces go without leads");
      }
    }
    else log().warn("GPU-time telemetry: {}", telemetry_.state());
  }
  // The host pool: offloadd's if it can be reached (started if need be), else a private one.
  link_.poll(mono_ns() / 1'000'000);
  if (offloading_ && !link_.usable() && !private_pool_) {
    private_pool_ = std::make_unique<PrivatePool>(settings_.host_pool_bytes);
    log().warn("no offloadd ({}): using a {}", link_.failure(), private_pool_->describe());
  }
  // A rank of a job (RANK or LOCAL_RANK set) says so as soon as it is connected, so that
  // offloadctl shows every rank from the start; its GPU follows at its first plan.
  if (!said_rank_ && link_.connected()) {
    said_rank_ = true;
    AttachInfo early = attach_info_from_env(-1, settings_.device_budget, "");
    std::string why;
    if ((early.rank >= 0 || early.local_rank >= 0) && !link_.attach(early, &why))
      log().debug("offloadd: rank not announced ({})", why);
  }
  // Pin the pool once, as soon as a launch has shown which context to pin it in.
  HostPool* pool = &host_pool();
  // Only a plan of arenas copies through it: the hard cap has a host store of its own.
  bool pool_ready = offloading_ && (private_pool_ || link_.connected());
  if (pool_ready && !pool->pinned() && !pin_failed_ && tracker_.funcs().count() > 0) {
    // Pinning takes the worker for as long as the driver needs (48 GiB on the H200's host in the
    // refine runs), and the steps wait to be cut and planned meanwhile: the time is logged.
    const int64_t pin_from = mono_ns();
    if (pool->pin([&](void* p, uint64_t n) { return driver_.pin_host(p, n); })) {
      log().info("host pool pinned in {:.0f} ms: {}", static_cast<double>(mono_ns() - pin_from) / 1e6, pool->describe());
    } else {
      pin_failed_ = true;
      log().warn("could not pin the host pool ({}): copies to it will be slower", pool->describe());
    }
  }
  drain_events();
  telemetry_.collect(&gpu_, no_wait);
  assembler_.add_gpu_records(gpu_);
  for (StepTrace& t : assembler_.take_ready(mono_ns(), false, no_wait)) {
    emit(t);
    if (offloading_) plan_from(t);
  }
  if (offloading_) executor_.poll();
  if (Residency* r = cap_.load(std::memory_order_acquire)) r->poll();
  check_allocations_seen();
  sample_telemetry();
  time_steps_with_markers();
}

size_t Runtime::drain_events() {
  return log_.drain([&](const Event& e, const AllocId* acc) { assembler_.consume(e, acc); });
}

void Runtime::sample_telemetry() {
  if (!settings_.telemetry_sampled || !telemetry_started_ || !telemetry_.active()) return;
  const bool running = offloading_ && executor_.installed() && !executor_.deviated();
  switch (sampler_.next(assembler_.steps_cut(), running, telemetry_.paused(), executor_.misses())) {
    case TelemetrySampler::Action::Pause:
      // time_steps_with_markers() sees the records stop: steps are timed with events meanwhile.
      if (telemetry_.pause()) log().info("GPU-time telemetry paused at step {}: the plan runs", assembler_.steps_cut());
      break;
    case TelemetrySampler::Action::Resume:
      if (telemetry_.resume()) {
        assembler_.gpu_times_from(log_.appended() + 1);
        resumed_at_launch_ = tracker_.launches();
        log().info("GPU-time telemetry resumed at step {}", assembler_.steps_cut());
      }
      break;
    case TelemetrySampler::Action::None:
      break;
  }
}

void Runtime::plan_from(const StepTrace& t) {
  adopt_swap();
  std::vector<uint64_t> tokens = step_tokens(t);
  bool repeats = tokens == last_tokens_;
  last_tokens_ = std::move(tokens);
  // Plan from a step that repeats the one before it (the first steps build optimizer state),
  // when no plan runs or the running one was abandoned, and once its arenas have drained.
  if (executor_.installed() && !executor_.deviated()) {
    watch_plan(t);
    if (!executor_.deviated()) watch_pool(t);  // unless watch_plan revised it already
    // Steps marked by offload_mark_step() trim there (mark_step); others here, at whatever
    // point of the next step the worker has reached.
    if (!assembler_.marked()) {
      std::lock_guard lock(trim_mu_);
      const Executor::TrimView v = executor_.trim_view();
      if (trim_.due(v.installs, v.steps_active, !executor_.deviated())) trim_pool(v);
    }
    if (const double f = refine_factor_.exchange(0); f > 0 && !executor_.deviated()) refine_plan(f);
  }
  if (!repeats || (executor_.installed() && !executor_.deviated()) || !executor_.idle()) return;
  auto say = [&](const std::string& note) {
    if (note != plan_note_) log().info("{}", note);
    plan_note_ = note;
  };
  // What outlives a step is born by now (the steps repeat): the pool of the shim's own keeps
  // it, and what is born from here on comes from PyTorch's pool.
  if (persistent_) persistent_->close();
  HostPool* pool = &host_pool();
  if (!private_pool_ && !link_.connected()) return say("no host pool yet: keeping data resident");
  uint64_t total = driver_.device_total_bytes();
  PlanOptions o;
  const uint64_t budget = settings_.budget_bytes(total);
  if (!budget) return say("the GPU's memory size is unknown: OFFLOAD_DEVICE_BUDGET as a fraction cannot apply");
  // Blocks OFFLOAD_BLOCK_CACHE keeps stay in the device's pool outside the plan. A plan of
  // activations alone has no watch on the pool's hold: it gets the budget less what the cache
  // may keep. A weight plan fills the whole budget: PoolWatch measures the pool, kept blocks
  // included, and revises a plan that the pool takes past the budget (watch_pool).
  o.budget = settings_.plan_budget_bytes(total);
  if (settings_.block_cache && cache_bound_said_ != settings_.block_cache_under(budget)) {
    cache_bound_said_ = settings_.block_cache_under(budget);
    cache_.set_max(cache_bound_said_);
    log().info("OFFLOAD_BLOCK_CACHE: at most {:.2f} GiB kept; a plan of activations fills {:.2f} GiB of the {:.2f} GiB budget",
               static_cast<double>(cache_bound_said_) / (1 << 30), static_cast<double>(o.budget) / (1 << 30),
               static_cast<double>(budget) / (1 << 30));
  }
  if (uint64_t g = driver_.vmm_granularity()) o.granularity = g;
  // What the allocator holds for the step's live bytes, measured before the first plan (the
  // default pool's high-water mark against the step's peak), never below the model's.
  // With several streams (FSDP2) the pool holds far more than the model's 1.15, which would have
  // the plan think a budget met that is not (docs/results.md). Measured again from each step
  // planned from, and kept only when a plan is installed: a model's first repeating steps may be
  // its constructor's (moe), whose few live bytes would fix the factor at its clamp for good.
  double factor = pool_overhead_;
  if (factor <= 0) {
    // Against what the pool serves: with OFFLOAD_PERSISTENT_MIN the weights sit in the shim's
    // own ranges, and against the step's whole live peak (mostly weights) the factor would be
    // far below 1 and clamped to the model's, under what the pool holds. The step's allocations
    // of at least the minimum are pooled bytes too, held in the shim's ranges: their physical
    // peak counts with the pool's reservation.
    const uint64_t min = persistent_ ? persistent_->min_bytes() : 0;
    uint64_t own_peak = 0, weights = 0;
    if (persistent_) {
      own_peak = persistent_->stats().peak_bytes;
      const uint64_t g = std::max<uint64_t>(1, driver_.vmm_granularity());
      for (const TraceAlloc& a : t.allocs)
        if (a.persistent(min)) weights += (a.bytes + g - 1) / g * g;
    }
    const uint64_t reserved = driver_.pool_reserved_high(), live = pooled_live_peak(t, min);
    factor = measured_pool_factor(reserved, own_peak, weights, live, o.pool_overhead);
    const uint64_t own = own_peak > weights ? own_peak - weights : 0;  // as measured_pool_factor counts it
    first_factor_note_ = fmt::format(
        "the allocator holds {:.2f}x the step's live bytes ({:.2f} GiB for {:.2f} GiB, {:.2f} GiB of them in the "
        "shim's own ranges): planning with that",
        factor, static_cast<double>(reserved + own) / (1 << 30), static_cast<double>(live) / (1 << 30),
        static_cast<double>(own) / (1 << 30));
  }
  o.pool_overhead = factor;
  if (host_) {
    pool->release(*host_);
    host_.reset();
  }
  // The planner when the step's kernels have GPU times (CUPTI, or none taken over); else the
  // built-in plan, which needs none.
  const bool timed = !settings_.builtin_plan && gpu_timeline(t).measured >= 0.5;
  // Sampled telemetry resumes when no plan runs: a step cut while tracing was paused is not
  // planned from (the built-in plan would move less); the next traced one is.
  if (!timed && settings_.telemetry_sampled && (telemetry_.paused() || t.first_launch < resumed_at_launch_)) return;
  PlannerOptions po;
  po.granularity = o.granularity;
  po.pool_overhead = o.pool_overhead;
  po.spare_handle = true;
  // This worker drains the event ring too, and a plan can take longer than the ring lasts (moe:
  // 1.6-4 s a plan, about 78000 events a step, 65536 slots). The planner drains it now and then
  // into the assembler, which cuts the steps when the plan is made (each is a copy: `t` is not
  // touched). Kept in plan_opts_ for refine_plan, on this thread too.
  po.progress = [this, at = mono_ns()]() mutable {
    const int64_t now = mono_ns();
    if (now - at < kPlanDrainNs) return;
    at = now;
    drained_while_planning_ += drain_events();
  };
  if (persistent_) po.persistent_min = persistent_->min_bytes();
  // Weights the application marked read-only cost the plan no copy out (ordinals ascending).
  if (po.persistent_min && executor_.any_read_only())
    for (const TraceAlloc& a : t.allocs)
      if (a.base && a.persistent(po.persistent_min) && executor_.read_only(a.base, a.bytes))
        po.read_only.push_back(a.ordinal);
  if (timed) {
    share_ = node_share(budget);
    po.link = share_link(LinkModel{}, NodeLinkSums{share_.h2d, share_.d2h, share_.both}, share_.gpus);
  }
  po.link.scale = link_scale_;
  planned_link_ = po.link;
  // Lateness is per launch position: it means nothing for a step of another shape.
  if (!planned_.tokens.empty() && planned_.tokens != last_tokens_) late_at_.clear();
  po.link.late_at = late_at_;
  const int64_t planning_from = mono_ns();
  for (int attempt = 0; attempt < 12; ++attempt) {
    std::string why;
    int64_t wait_ns = 0;  // the step's planned waits for weight reloads, to meet the budget
    double wait_share = 0;
    Plan plan;
    if (timed) {
      po.max_host_bytes = o.max_host_bytes;
      auto planned = [&] {
        po.budget = budget;
        PlannerResult r = plan_step(t, po);
        if (r.plan.weights.empty() && o.budget < budget) {  // activations alone: the cache's room left
          po.budget = o.budget;
          r = plan_step(t, po);
        }
        return r;
      };
      PlannerResult r = planned();
      // A pool revision after which no plan meets the budget would trade a plan a little past it
      // for one far past it (a weight plan revised to keep every weight resident:
      // docs/results.md). Plan with the overhead from before the revision instead.
      if (!r.plan.meets_budget && overhead_before_revision_ > 0) {
        log().warn("with the allocator at {:.3f}x its live bytes no plan meets the budget: planning with {:.3f}x "
                   "again, and no more pool revisions", pool_overhead_, overhead_before_revision_);
        pool_overhead_ = po.pool_overhead = o.pool_overhead = overhead_before_revision_;
        pool_revision_undone_ = true;
        r = planned();
      }
      overhead_before_revision_ = 0;
      wait_ns = r.stall_ns, wait_share = r.stall_share;
      plan = std::move(r.plan);
      predicted_ = std::move(r.prediction);
      hidden_bytes_ = r.hidden_bytes, hidden_peak_ = r.hidden_peak;
      why = r.why;
      if (r.hidden_bytes && attempt == 0)
        log().info("planner: the compute hides up to {:.2f} GiB per step (footprint {:.2f} GiB, step {:.1f} ms predicted)",
                   static_cast<double>(r.hidden_bytes) / (1 << 30), static_cast<double>(r.hidden_peak) / (1 << 30),
                   static_cast<double>(r.hidden_step_ns) / 1e6);
      if (!watch_) watch_.emplace(predicted_.step_ns, 3, kPlanSettleSteps);
      else watch_->replanned(predicted_.step_ns);
    } else {
      plan = build_plan(t, o, &why);
      predicted_ = Prediction{};
      hidden_bytes_ = hidden_peak_ = 0;
    }
    resolve_weights(plan, t);
    planned_ = plan;
    if (plan.empty()) return say("not offloading: " + why);
    std::string refused;
    std::optional<Extent> ext = pool->lease(plan.host_bytes(), &refused);
    if (!ext) {
      // A full pool keeps data resident: try a smaller plan that fits what the pool gives.
      say("host pool refused " + std::to_string(plan.host_bytes() >> 20) + " MiB (" + refused + "): planning for less");
      o.max_host_bytes = plan.host_bytes() / 2;
      continue;
    }
    const uint64_t n = plan.step_launches;
    uint64_t anchor = plan_anchor(t.first_launch, n, tracker_.launches());
    std::string desc = plan.describe();
    bool meets = plan.meets_budget;
    HostMemory hm{ext->host, ext->host - ext->offset, kPinChunk};
    if (!executor_.install(std::move(plan), anchor, hm, &why)) {
      pool->release(*ext);
      return say("not offloading: " + why);
    }
    host_ = ext;
    if (pool_overhead_ <= 0) {  // the first plan: the factor measured from its step is kept
      pool_overhead_ = o.pool_overhead;
      if (pool_overhead_ > PlanOptions{}.pool_overhead) log().info("{}", first_factor_note_);
    }
    pool_watch_.planned();
    // Under OFFLOAD_TRACE, the step each plan is made from too (for offloadctl plan), whichever
    // steps OFFLOAD_TRACE_STEPS writes (a model's first steps may be its constructor's).
    if (!settings_.trace_dir.empty()) write_trace(t, "/planned-", false);
    plan_trace_ = t;
    plan_opts_ = po;
    base_factor_ = po.pool_overhead;
    refine_factor_.store(0);  // asked for under the plan before this one
    refinable_.store(timed && settings_.pool_refine && !settings_.block_cache && planned_.weights.empty() &&
                     !planned_.arenas.empty());
    plan_note_.clear();
    log().info("plan: {}", desc);
    // How late a plan comes in: some models' plans start many steps after their steps repeat
    // (convnet: docs/results.md), and this line shows where the time went.
    log().info("plan made from step {} in {:.0f} ms ({} steps cut since); it runs from launch {}, {} launches on",
               t.step, static_cast<double>(mono_ns() - planning_from) / 1e6,
               assembler_.steps_cut() > t.step + 1 ? assembler_.steps_cut() - t.step - 1 : 0, anchor,
               anchor > tracker_.launches() ? anchor - tracker_.launches() : 0);
    if (wait_ns)
      log().info("the plan waits {:.1f} ms a step for weight reloads ({:.1f}% of the compute): no plan whose copies all "
                 "hide meets the budget",
                 static_cast<double>(wait_ns) / 1e6, 100 * wait_share);
    if (!meets) log().warn("OFFLOAD_DEVICE_BUDGET cannot be met by what the plan can move; the rest stays resident");
    return;
  }
  say("not offloading: the host pool has no room (OFFLOAD_HOST_POOL)");
}

NodeShare Runtime::node_share(uint64_t budget) {
  if (private_pool_ || !link_.connected()) return NodeShare{};
  std::string why;
  std::optional<NodeShare> s = link_.attach(attach_info_from_env(driver_.device(), budget, driver_.gpu_id()), &why);
  if (!s) {
    if (why != share_note_) log().info("offloadd: {}; planning with this GPU's link alone", why);
    share_note_ = why;
    return NodeShare{};
  }
  if (s->gpus != share_.gpus && s->h2d > 0)
    log().info("{} GPU(s) of this node share the host link ({:.1f} GB/s H2D, {:.1f} D2H, {:.1f} both ways, summed)",
               s->gpus, s->h2d, s->d2h, s->both);
  else if (s->gpus != share_.gpus)
    log().info("{} GPU(s) of this node share the host link (its sums not measured: offloadd --node-link)", s->gpus);
  return *s;
}

void Runtime::watch_pool(const StepTrace& t) {
  // Plans with weights: the pool holds the step's live bytes less the shim's own (as the weight
  // planner counts them). With arenas too, it holds what the arena plan leaves resident less
  // the shim's own: the plan's pooled_peak. (Those plans were not watched before: on moe the
  // pool held about 1.4x where the plan counted 1.15x, 21.28 GiB against a 20 GiB budget.)
  if (planned_.weights.empty() || !persistent_ || pool_revision_undone_) return;
  const uint64_t reserved = driver_.pool_reserved_current();
  if (!reserved) return;
  const uint64_t pooled =
      planned_.arenas.empty() ? pooled_live_peak(t, persistent_->min_bytes()) : planned_.pooled_peak;
  if (!pooled) return;
  const uint64_t budget = settings_.budget_bytes(driver_.device_total_bytes());
  const double f = pool_watch_.observe(reserved, pooled, pool_overhead_, planned_.predicted_peak, budget);
  if (f <= 0) return;
  log().warn("plan revised: the allocator holds {:.2f} GiB for the step's {:.2f} GiB ({:.3f}x) where the plan counted "
             "{:.3f}x, which takes its {:.2f} GiB past the budget of {:.2f} GiB: planning again with {:.3f}x",
             static_cast<double>(reserved) / (1 << 30), static_cast<double>(pooled) / (1 << 30),
             static_cast<double>(reserved) / static_cast<double>(pooled), pool_overhead_,
             static_cast<double>(planned_.predicted_peak) / (1 << 30), static_cast<double>(budget) / (1 << 30), f);
  overhead_before_revision_ = pool_overhead_;
  pool_overhead_ = f;
  executor_.retire("revising the plan");
}

void Runtime::mark_step() {
  tracker_.mark_step();
  if (!offloading_ || !executor_.installed() || executor_.deviated()) return;
  // The step's activations are freed here, but their frees may still be queued: the pool
  // releases an OS allocation only when it has seen every free in it complete. So a try waits
  // for the GPU first, once per try (at most PoolTrim's 8 per plan). Tried from the worker, at a
  // moment of its own, the trim may release nothing or need several tries (docs/results.md).
  std::lock_guard lock(trim_mu_);
  bool synced = false;
  const std::function<void()> sync = [&] {
    if (synced) return;
    synced = true;
    if (!driver_.synchronize()) log().debug("step's mark: could not wait for the GPU; going on with what it has seen");
  };
  if (swap_at_mark(sync)) {
    // The new plan's steps reserve what they need from a pool emptied of what is unused: what
    // the pool kept for the old plan's layout would otherwise stay beside it, and the new plan's
    // steps would hold more than its factor.
    empty_pool(sync);
    refine_.after_mark(driver_.pool_reserved_current());
    (void)executor_.take_first_step_trim();  // emptied already
    return;  // a new install: its trims and measures start from its own steps
  }
  const Executor::TrimView v = executor_.trim_view();
  trim_before_first_step(sync);
  const bool trim_due = trim_.due(v.installs, v.steps_active, true);
  refine_at_mark(v, trim_due, sync);
  if (trim_due) {
    sync();
    trim_pool(v);
  }
  if (refinable_.load() && v.arenas_only) refine_.after_mark(driver_.pool_reserved_current());
}

void Runtime::refine_at_mark(const Executor::TrimView& v, bool trim_due, const std::function<void()>& sync) {
  if (!refinable_.load() || !v.arenas_only || !v.resident_peak) return;
  PoolRefine::Mark m;
  m.installs = v.installs;
  m.running = true;
  m.trim_done = !trim_due && trim_.over(v.installs);
  m.reserved = driver_.pool_reserved_current();  // before anything is trimmed at this mark
  m.resident = v.resident_peak;
  m.planned = static_cast<double>(v.predicted_peak - std::min(v.predicted_peak, v.handle_bytes)) /
              static_cast<double>(v.resident_peak);
  m.predicted_peak = v.predicted_peak;
  m.budget = v.budget;
  m.spare = v.spare;  // 0 for a plan made again for the pool: its budget leaves the room out
  switch (refine_.at_mark(m)) {
    case PoolRefine::Action::Probe:
      // What the pool holds unused goes back, once: the next step reserves what it needs.
      empty_pool(sync);
      break;
    case PoolRefine::Action::Replan:
      refine_factor_.store(refine_.factor());
      break;
    case PoolRefine::Action::None:
      break;
  }
  if (refine_.last_measured() > 0) refine_seen_.store(refine_.last_measured());
}

void Runtime::trim_before_first_step(const std::function<void()>& sync) {
  // At the mark before a plan's first step, after the GPU has caught up, so that the pool has
  // seen every free of the steps before (Executor::take_first_step_trim says why and how much).
  const std::optional<uint64_t> keep = executor_.take_first_step_trim();
  if (!keep) return;
  const uint64_t before = driver_.pool_reserved_current();
  if (!before || before <= *keep) return;
  sync();
  if (!driver_.pool_trim(*keep)) return log().debug("the pool's trim before the plan's first step failed");
  const uint64_t after = driver_.pool_reserved_current();
  ++pool_trims_;
  pool_trimmed_bytes_ += before > after ? before - after : 0;
  log().info("pool trimmed before the plan's first step: {:.2f} GiB reserved -> {:.2f} GiB (at most {:.2f} GiB kept)",
             static_cast<double>(before) / (1 << 30), static_cast<double>(after) / (1 << 30),
             static_cast<double>(*keep) / (1 << 30));
}

void Runtime::empty_pool(const std::function<void()>& sync) {
  sync();
  if (!driver_.pool_trim(0)) log().debug("pool refine: the pool could not be emptied of what is unused");
}

HostPool& Runtime::host_pool() {
  return private_pool_ ? static_cast<HostPool&>(*private_pool_) : static_cast<HostPool&>(link_);
}

bool Runtime::swap_at_mark(const std::function<void()>& sync) {
  std::lock_guard lock(swap_mu_);
  if (!swap_ || swap_->installed || swap_->refused) return false;
  // Every arena is empty at a mark once the GPU has caught up (their members are freed, the
  // copies done): the new plan goes in with no step in demand mode.
  sync();
  const uint64_t anchor = plan_anchor(swap_->first_launch, swap_->plan.step_launches, tracker_.launches());
  HostMemory hm{swap_->host.host, swap_->host.host - swap_->host.offset, kPinChunk};
  Plan p = swap_->plan;
  std::string why;
  if (!executor_.install(std::move(p), anchor, hm, &why)) {
    swap_->refused = true;
    swap_->why = why;
    return false;
  }
  swap_->installed = true;
  refined_.fetch_add(1);
  log().info("plan put in at the step's mark, for the allocator at {:.3f}x its live bytes: {}", swap_->factor,
             swap_->desc);
  return true;
}

void Runtime::refine_plan(double factor) {
  if (!refinable_.load() || plan_trace_.launches.empty() || pool_overhead_ <= 0) return;
  {
    std::lock_guard lock(swap_mu_);
    if (swap_) return;
  }
  const bool lower = factor < pool_overhead_;
  const double seen = refine_seen_.load();
  auto keep = [&](const std::string& why) {
    log().info("the allocator holds {:.3f}x the live bytes outside the arenas, where the plan counted {:.3f}x; "
               "a plan for {:.3f}x is not put in: {}",
               seen, pool_overhead_, factor, why);
  };
  // A reload that finds every handle held takes one more (Executor::acquire_handle: an arena
  // whose copy out the host abandoned keeps its handle; the planner's GPU-time model does not see
  // that). Planned from the measured factor, the pool has no slack left for it: the plan keeps
  // room for one more handle of the running plan's size, where the first plan keeps room for
  // one of its own (PlannerOptions::spare_handle).
  bool whole = false;
  factor = PoolRefine::plan_factor(factor, pool_overhead_, base_factor_, &whole);
  PlannerOptions po = plan_opts_;
  po.pool_overhead = factor;
  if (!whole) {
    po.budget = po.budget > planned_.handle_bytes ? po.budget - planned_.handle_bytes : 0;
    po.spare_handle = false;
  }
  PlannerResult r = plan_step(plan_trace_, po);
  if (r.plan.empty()) return keep(r.why);
  if (!r.plan.meets_budget) return keep("no plan meets the budget at that factor");
  if (!r.plan.weights.empty()) return keep("that plan would stream weights");
  if (lower && r.prediction.step_ns >= predicted_.step_ns) return keep("that plan is predicted no faster");
  resolve_weights(r.plan, plan_trace_);
  HostPool* pool = &host_pool();
  std::string refused;
  std::optional<Extent> ext = pool->lease(r.plan.host_bytes(), &refused);
  if (!ext) return keep("the host pool refused " + std::to_string(r.plan.host_bytes() >> 20) + " MiB (" + refused + ")");
  Swap sw;
  sw.desc = r.plan.describe();
  sw.plan = std::move(r.plan);
  sw.prediction = std::move(r.prediction);
  sw.host = *ext;
  sw.first_launch = plan_trace_.first_launch;
  sw.factor = factor;
  log().info("the allocator holds {:.3f}x the live bytes outside the arenas, where the plan counted {:.3f}x: "
             "a plan for {:.3f}x goes in at a step's mark ({:.1f} ms predicted, against {:.1f})",
             seen, pool_overhead_, factor, sw.prediction.step_ns / 1e6, predicted_.step_ns / 1e6);
  std::lock_guard lock(swap_mu_);
  swap_ = std::move(sw);
}

void Runtime::adopt_swap() {
  std::optional<Swap> sw;
  {
    std::lock_guard lock(swap_mu_);
    if (!swap_) return;
    const bool waiting = !swap_->installed && !swap_->refused;
    // Staged for a plan that no longer runs: the worker plans anew.
    if (waiting && executor_.installed() && !executor_.deviated()) return;
    sw = std::move(swap_);
    swap_.reset();
  }
  HostPool* pool = &host_pool();
  if (!sw->installed) {
    pool->release(sw->host);
    if (sw->refused) log().info("the plan for the allocator at {:.3f}x was not put in: {}", sw->factor, sw->why);
    return;
  }
  // The plan before it ran no copy after the mark it was replaced at: its host memory is free.
  if (host_) pool->release(*host_);
  host_ = sw->host;
  planned_ = std::move(sw->plan);
  predicted_ = std::move(sw->prediction);
  pool_overhead_ = plan_opts_.pool_overhead = sw->factor;
  if (watch_) watch_->replanned(predicted_.step_ns);
}

void Runtime::trim_pool(const Executor::TrimView& v) {
  // What the steps before the plan (or in demand mode) reserved beyond the budget goes back to
  // the device: the pool keeps at most the budget the installed plan was made for less the most
  // the executor has held beside the pool, so that nothing a planned step needs is given back
  // (the next step would reserve it again). The executor's copy of the plan, not planned_: this
  // runs on the application's thread too, while the worker may be planning.
  const uint64_t keep = v.budget > v.held_peak ? v.budget - v.held_peak : 0;
  const PoolTrim::Attempt a = trim_.attempt(
      keep, [&] { return driver_.pool_reserved_current(); }, [&](uint64_t n) { return driver_.pool_trim(n); });
  if (!a.called) {
    if (a.before > keep) log().debug("the pool's trim to {} bytes failed", a.asked);
    return;
  }
  ++pool_trims_;
  pool_trimmed_bytes_ += a.before > a.after ? a.before - a.after : 0;
  auto gib = [](uint64_t b) { return static_cast<double>(b) / (1 << 30); };
  if (a.after <= keep)
    log().info("pool trimmed under the plan: {:.2f} GiB reserved -> {:.2f} GiB (at most {:.2f} GiB kept)",
               gib(a.before), gib(a.after), gib(keep));
  else if (a.done)
    log().info("pool trimmed under the plan: {:.2f} GiB reserved -> {:.2f} GiB, above the {:.2f} GiB to keep after "
               "the last try: the rest is in use",
               gib(a.before), gib(a.after), gib(keep));
  else
    log().debug("pool trim: {:.2f} GiB reserved -> {:.2f} GiB, above the {:.2f} GiB to keep; again next step",
                gib(a.before), gib(a.after), gib(keep));
}

void Runtime::watch_plan(const StepTrace& t) {
  if (predicted_.step_ns <= 0 || !watch_) return;
  const GpuTimeline g = gpu_timeline(t);
  if (g.measured < 0.5) return;
  const double factor = watch_->observe(g.total);
  if (factor <= 0) return;
  // Where the step waited longer than predicted, per boundary: the next plan knows those
  // reloads arrive late. Without such a place, the link as a whole is taken to be slower.
  std::vector<std::pair<int64_t, int64_t>> late = measured_lateness(planned_, predicted_, t);
  if (!late.empty()) {
    int64_t most = 0;
    for (const auto& [pos, ns] : late) {
      most = std::max(most, ns);
      add_lateness(late_at_, pos, ns);
    }
    log().warn("plan revised: 3 steps in a row took longer on the GPU than the {:.1f} ms predicted (the last {:.1f} ms); "
               "reloads arrived late at {} layer boundaries (up to {:.2f} ms): planning again with that",
               predicted_.step_ns / 1e6, g.total / 1e6, late.size(), most / 1e6);
    executor_.retire("revising the plan");
    return;
  }
  log().warn("plan revised: 3 steps in a row took longer on the GPU than the {:.1f} ms predicted (the last {:.1f} ms); "
             "planning again with the link at {:.0f}% of its model",
             predicted_.step_ns / 1e6, g.total / 1e6, 100 * link_scale_ * factor);
  link_scale_ *= factor;
  executor_.retire("revising the plan");
}

void Runtime::push_step(uint64_t step, uint64_t step_ns, uint64_t launches) {
  proto::Telemetry tm{};
  tm.step = step;
  tm.step_ns = step_ns;
  tm.resident_bytes = tracker_.allocs().live_bytes();
  tm.launches = launches;
  if (Residency* r = cap_.load(std::memory_order_acquire)) {
    // Under the cap: the bytes out and the demand reloads so far (offloadctl status's columns).
    const Residency::Stats c = r->stats();
    tm.evicted_bytes = c.bytes_out;
    tm.misses = c.reloads;
    tm.resident_bytes = c.held;
  }
  link_.push(tm);
}

void Runtime::time_steps_with_markers() {
  // Without CUPTI's records (telemetry off, failed, or taken over by another CUPTI client),
  // steps are timed on the GPU with an event at each step boundary.
  if (tracker_.counters().kernels.load() == 0) return;  // nothing runs on a GPU here yet
  bool want = telemetry_started_ ? !telemetry_.flowing() : !settings_.telemetry;
  if (want && telemetry_started_ && !event_timing_) assembler_.telemetry_lost();
  if (want && !event_timing_ && !telemetry_.paused())  // a pause is said by sample_telemetry
    log().info("GPU-time telemetry: {}; timing steps with CUDA events at step boundaries instead",
               settings_.telemetry ? telemetry_.state() : std::string("off (OFFLOAD_TELEMETRY=off)"));
  event_timing_ = want;
  tracker_.set_marks_record(event_timing_ && assembler_.marked());
  if (event_timing_ && !assembler_.marked() && assembler_.detector().locked())
    tracker_.arm_marker(assembler_.detector().next_boundary());
  Tracker::Marker m;
  while (tracker_.take_marker(&m)) markers_.push_back(m);
  while (markers_.size() >= 2) {
    const Tracker::Marker &m0 = markers_[0], &m1 = markers_[1];
    // The step these two markers span: it must start at the first and end at the second
    // (a marker armed too late for its boundary is missing, and the gap is two steps long).
    StepSummary* step = nullptr;
    bool later = summaries_.empty() || summaries_.back().first_launch < m0.launch_no;
    for (StepSummary& s : summaries_)
      if (s.first_launch == m0.launch_no) step = &s;
    if (!step && later) break;  // its step is not assembled yet
    if (step && step->first_launch + step->launches == m1.launch_no) {
      int64_t ns = driver_.marker_elapsed_ns(m0.handle, m1.handle);
      if (ns < 0) break;  // not reached on the GPU yet
      step->gpu_step_ns = ns;
      push_step(step->step, static_cast<uint64_t>(ns), step->launches);
    }
    driver_.release_marker(m0.handle);
    markers_.pop_front();
  }
}

void Runtime::emit(StepTrace& t) {
  ActivationReport act = analyse_activations(t);
  StepSummary s;
  s.step = t.step;
  s.first_launch = t.first_launch;
  s.launches = t.launches.size();
  s.kernels = t.kernel_launches();
  for (const TraceAlloc& a : t.allocs) s.allocs_born += a.alloc_pos >= 0;
  s.cupti_kernels = t.cupti_kernels;
  s.gpu_busy_ns = t.gpu_busy_ns;
  s.activations = act.activations;
  s.activations_unaccessed = act.without_backward_access.size();
  summaries_.push_back(s);
  int64_t now = mono_ns();
  if (Residency* r = cap_.load(std::memory_order_acquire)) {
    // Two steps of the same length in launches in a row: that is the period the residency
    // manager predicts next uses with.
    if (!t.launches.empty() && t.launches.size() == last_step_launches_) r->set_period(t.launches.size());
    last_step_launches_ = t.launches.size();
    log_capped_step(t.step, now - last_cut_ns_);
  }
  push_step(t.step, t.gpu_busy_ns > 0 ? static_cast<uint64_t>(t.gpu_busy_ns) : static_cast<uint64_t>(now - last_cut_ns_),
            t.launches.size());
  last_cut_ns_ = now;
  if (summaries_.size() > kSummariesKept) summaries_.pop_front();
  if (!settings_.trace_dir.empty() && steps_written_ < settings_.trace_steps) {
    write_trace(t, "/step-", true);
    ++steps_written_;
  }
  if (!settings_.trace_dir.empty()) write_summary();
}

namespace {
// A trace file that cannot be written is said once: it would fail again every step.
void warn_trace(const std::string& why) {
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) log().warn("OFFLOAD_TRACE: {}; later failures are not logged", why);
}
}  // namespace

void Runtime::write_trace(const StepTrace& t, const char* prefix, bool chrome_json) {
  char name[64];
  snprintf(name, sizeof name, "%s%06llu", prefix, static_cast<unsigned long long>(t.step));
  std::string why;
  std::ostringstream os;
  t.write(os);
  if (!write_file_nofollow(settings_.trace_dir + name + ".trace", os.str(), &why)) warn_trace(why);
  if (chrome_json && t.gpu_busy_ns >= 0) {
    std::ostringstream chrome;
    t.write_chrome_json(chrome);
    if (!write_file_nofollow(settings_.trace_dir + name + ".chrome.json", chrome.str(), &why))
      warn_trace(why);
  }
}

void Runtime::write_summary() {
  std::string why;
  if (!replace_file(settings_.trace_dir + "/summary.json", stats_json_locked() + '\n', &why))
    warn_trace(why);
}

std::string Runtime::stats_json() {
  {
    // A query also pumps, so that a caller who synchronised the GPU sees its last steps.
    pump(true);
  }
  std::lock_guard lock(pump_mu_);
  return stats_json_locked();
}

std::string Runtime::stats_json_locked() {
  TrackerCounters& c = tracker_.counters();
  std::ostringstream os;
  auto ld = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  os << "{\"version\":1,\"pid\":" << getpid() << ",\"telemetry\":\"" << telemetry_.state() << "\""
     << ",\"cupti\":" << telemetry_.counters_json()
     << ",\"host_pool\":\"" << (private_pool_ ? private_pool_->describe() : link_.describe()) << "\""
     << ",\"step_detection\":\"" << (assembler_.marked() ? "offload_mark_step" : "automatic") << "\""
     << ",\"locked\":" << (assembler_.detector().locked() ? "true" : "false")
     << ",\"period\":" << assembler_.detector().period()
     << ",\"deviations\":" << assembler_.detector().deviations()
     << ",\"steps\":" << assembler_.steps_cut()
     << ",\"drained_while_planning\":" << ld(drained_while_planning_)
     << ",\"counters\":{\"kernels\":" << ld(c.kernels) << ",\"copies\":" << ld(c.copies)
     << ",\"memsets\":" << ld(c.memsets) << ",\"graph_launches\":" << ld(c.graphs)
     << ",\"collectives\":" << ld(c.collectives)
     << ",\"allocs\":" << ld(c.allocs) << ",\"frees\":" << ld(c.frees)
     << ",\"unknown_frees\":" << ld(c.unknown_frees) << ",\"opaque_kernels\":" << ld(c.opaque_kernels)
     << ",\"dropped_events\":" << log_.dropped() << ",\"unwrapped_routes\":" << hooks::unwrapped_routes()
     << ",\"live_allocs\":" << tracker_.allocs().size() << ",\"live_bytes\":" << tracker_.allocs().live_bytes()
     << ",\"functions\":" << tracker_.funcs().count() << "}"
     << ",\"hook_ns_mean\":" << c.hook_ns_mean()
     << ",\"executor\":" << executor_json()
     << ",\"residency\":" << residency_json(cap_.load(std::memory_order_acquire))
     << ",\"persistent\":" << persistent_json()
     << ",\"block_cache\":" << block_cache_json()
     << ",\"routes\":{";
  bool first = true;
  for (size_t i = 0; i < hooks::kHookCount; ++i) {
    const hooks::HookEntry& e = hooks::hook_table()[i];
    uint32_t r = e.routes.load(std::memory_order_relaxed);
    if (!r) continue;
    os << (first ? "" : ",") << "\"" << e.symbol << "\":[";
    first = false;
    bool f2 = true;
    for (int b = 0; b < 4; ++b)
      if (r & (1u << b)) {
        os << (f2 ? "" : ",") << "\"" << route_names[b] << "\"";
        f2 = false;
      }
    os << "]";
  }
  os << "},\"recent_steps\":[";
  first = true;
  for (const StepSummary& s : summaries_) {
    os << (first ? "" : ",") << "{\"step\":" << s.step << ",\"launches\":" << s.launches
       << ",\"kernels\":" << s.kernels << ",\"cupti_kernels\":" << s.cupti_kernels
       << ",\"gpu_busy_ns\":" << s.gpu_busy_ns << ",\"gpu_step_ns\":" << s.gpu_step_ns
       << ",\"allocs_born\":" << s.allocs_born
       << ",\"activations\":" << s.activations << ",\"activations_unaccessed\":" << s.activations_unaccessed
       << "}";
    first = false;
  }
  os << "]}";
  return os.str();
}

std::string Runtime::persistent_json() const {
  if (!persistent_) return "null";
  const PersistentPool::Stats p = persistent_->stats();
  std::ostringstream os;
  os << "{\"min_bytes\":" << persistent_->min_bytes() << ",\"allocs\":" << p.allocs << ",\"reused\":" << p.reused
     << ",\"cross_stream\":" << p.cross_stream << ",\"created\":" << p.created << ",\"released\":" << p.released
     << ",\"refused\":" << p.refused << ",\"live_bytes\":" << p.live_bytes << ",\"cached_bytes\":" << p.cached_bytes
     << ",\"lent_bytes\":" << p.lent_bytes << ",\"peak_bytes\":" << p.peak_bytes << "}";
  return os.str();
}

std::string Runtime::block_cache_json() const {
  const BlockCache::Stats b = cache_.stats();
  std::ostringstream os;
  os << "{\"max_bytes\":" << settings_.block_cache << ",\"hits\":" << b.hits << ",\"misses\":" << b.misses
     << ",\"kept\":" << b.kept << ",\"forwarded\":" << b.forwarded << ",\"captured\":" << b.captured
     << ",\"drains\":" << b.drains << ",\"drained_blocks\":" << b.drained_blocks
     << ",\"kept_bytes\":" << b.kept_bytes << ",\"kept_peak\":" << b.kept_peak << "}";
  return os.str();
}

std::string Runtime::executor_json() {
  ExecutorStats x = executor_.stats();
  std::ostringstream os;
  uint64_t total = driver_.device_total_bytes();
  os << "{\"on\":" << (offloading_ ? "true" : "false") << ",\"budget\":" << settings_.budget_bytes(total)
     << ",\"installed\":" << (executor_.installed() ? "true" : "false")
     << ",\"deviated\":" << (executor_.deviated() ? "true" : "false") << ",\"plan\":\"" << x.plan << "\""
     << ",\"installs\":" << x.installs << ",\"deviations\":" << x.deviations
     << ",\"pool_trims\":" << pool_trims_.load() << ",\"pool_trimmed_bytes\":" << pool_trimmed_bytes_.load()
     << ",\"steps_active\":" << x.steps_active << ",\"placed\":" << x.placed << ",\"arena_busy\":" << x.arena_busy << ",\"no_handle\":" << x.no_handle
     << ",\"evictions\":" << x.evictions << ",\"evictions_abandoned\":" << x.evictions_abandoned
     << ",\"reloads\":" << x.reloads << ",\"misses\":" << x.misses << ",\"late_reloads\":" << x.late_reloads
     << ",\"copy_failures\":" << x.copy_failures << ",\"pointer_tables\":" << x.pointer_tables << ",\"conservative\":" << x.conservative
     << ",\"bytes_out\":" << x.bytes_out << ",\"bytes_in\":" << x.bytes_in
     << ",\"handles_created\":" << x.handles_created << ",\"handles_released\":" << x.handles_released
     << ",\"over_budget\":" << x.over_budget << ",\"first_step_trims\":" << x.first_step_trims << ",\"budget_waits\":" << x.budget_waits
     << ",\"handovers\":" << x.handovers
     << ",\"held_bytes\":" << x.held_bytes << ",\"held_peak\":" << x.held_peak
     << ",\"device_peak\":" << x.device_peak << ",\"weights\":{\"lent\":" << x.weights
     << ",\"evictions\":" << x.weight_evictions << ",\"reloads\":" << x.weight_reloads
     << ",\"misses\":" << x.weight_misses << ",\"abandoned\":" << x.weight_abandoned
     << ",\"bytes_out\":" << x.weight_bytes_out << ",\"bytes_in\":" << x.weight_bytes_in
     << ",\"mapped_peak\":" << x.weight_mapped_peak << ",\"bound\":" << planned_.weight_bytes_mapped
     << ",\"waits\":" << x.weight_waits << ",\"handovers\":" << x.weight_handovers << ",\"split\":" << x.weight_split << ",\"settles\":" << x.weight_settles << ",\"read_only\":" << x.weight_read_only
     << ",\"clean_evictions\":" << x.weight_clean_evictions << ",\"over_bound\":" << x.weight_over_bound
     << ",\"windows\":" << planned_.windows.size() << "},\"planner\":{\"gpu_time\":" << (predicted_.step_ns > 0 ? "true" : "false")
     << ",\"predicted_step_ns\":" << predicted_.step_ns << ",\"compute_ns\":" << predicted_.compute_ns
     << ",\"lower_bound_ns\":" << predicted_.lower_bound_ns << ",\"forward_ns\":" << predicted_.forward_ns
     << ",\"backward_ns\":" << predicted_.backward_ns << ",\"bytes_moved\":" << predicted_.bytes_out << ",\"hidden_bytes\":" << hidden_bytes_
     << ",\"hidden_peak\":" << hidden_peak_ << ",\"predicted_peak\":" << planned_.predicted_peak
     << ",\"link_scale\":" << link_scale_ << ",\"revisions\":" << (watch_ ? watch_->revisions() : 0) << ",\"pool_revisions\":" << pool_watch_.revisions()
     << ",\"pool_overhead\":" << pool_overhead_ << ",\"pool_factor_seen\":" << refine_seen_.load()
     << ",\"pool_refined\":" << refined_.load() << ",\"link\":{\"gpus\":" << share_.gpus << ",\"h2d\":" << planned_link_.h2d << ",\"d2h\":" << planned_link_.d2h
     << ",\"h2d_shared\":" << planned_link_.h2d_shared << ",\"d2h_shared\":" << planned_link_.d2h_shared << "}}"
     << ",\"host_bytes\":" << (host_ ? host_->bytes : 0);
  const double ns = ns_per_tsc_cycle();
  os << ",\"gate_ns_mean\":"
     << (x.gate_calls ? static_cast<double>(x.gate_cycles - x.gate_wait_cycles) * ns / static_cast<double>(x.gate_calls) : 0.0)
     << ",\"budget_wait_ms\":" << static_cast<double>(x.wait_cycles) * ns / 1e6 << ",\"recent_misses\":[";
  for (size_t i = 0; i < x.recent_misses.size(); ++i) os << (i ? "," : "") << x.recent_misses[i];
  os << "],\"recent_late\":[";
  for (size_t i = 0; i < x.recent_late.size(); ++i) os << (i ? "," : "") << x.recent_late[i];
  // [position, microseconds, kind, drained] of the last active step's longest host waits.
  os << "],\"last_step_waits\":{\"count\":" << x.last_step_wait_count << ",\"drained\":" << x.last_step_drained << ",\"longest\":[";
  for (size_t i = 0; i < x.last_step_waits.size(); ++i) {
    const auto& w = x.last_step_waits[i];
    os << (i ? "," : "") << "[" << w.pos << "," << static_cast<double>(w.cycles) * ns / 1e3 << ",\"" << w.kind << "\"," << w.drained << "]";
  }
  os << "]}}";
  return os.str();
}

namespace {

__attribute__((constructor)) void offload_init() {
  std::vector<std::string> errors;
  Settings s = read_settings([](const char* n) { return getenv(n); }, &errors);
  set_log_level(s.log_level);
  for (const std::string& e : errors) log().error("{}", e);
  if (!errors.empty()) {
    log().error("bad OFFLOAD_* settings: liboffload forwards every call and observes nothing");
    return;
  }
  if (!s.enabled) return;
  // A forked child (a data-loader worker) only forwards, and lets go of the daemon
  // connection and the pool mapping it inherited: were it to keep the socket open, the
  // daemon would not see the parent die until the child does.
  pthread_atfork(nullptr, nullptr, [] {
    g_pass_through.store(true);
    if (Runtime* rt = g_runtime.load(std::memory_order_acquire)) rt->drop_in_child();
  });
  atexit([] { g_pass_through.store(true); });
  g_settings = new Settings(std::move(s));
}

}  // namespace
}  // namespace offload

extern "C" {

__attribute__((visibility("default"))) void offload_mark_step(void) {
  try {
    if (offload::Runtime* rt = offload::runtime()) rt->mark_step();
  } catch (...) {
  }
}

__attribute__((visibility("default"))) int offload_mark_read_only(const void* ptr, size_t bytes) {
  try {
    if (!ptr || !bytes) return -1;
    if (offload::Runtime* rt = offload::runtime()) rt->mark_read_only(reinterpret_cast<offload::DevPtr>(ptr), bytes);
    return 0;
  } catch (...) {
    return -1;
  }
}

__attribute__((visibility("default"))) void offload_reset_peak(void) {
  try {
    if (offload::Runtime* rt = offload::runtime()) rt->reset_peak();
  } catch (...) {
  }
}

__attribute__((visibility("default"))) int offload_stats_json(char* buf, size_t len) {
  try {
    offload::Runtime* rt = offload::runtime();
    std::string s = rt ? rt->stats_json() : std::string("{\"version\":1,\"state\":\"pass-through\"}");
    if (!buf || s.size() + 1 > len) return -1;
    memcpy(buf, s.c_str(), s.size() + 1);
    return static_cast<int>(s.size());
  } catch (...) {
    return -1;  // nothing is thrown across the C boundary
  }
}

}  // extern "C"

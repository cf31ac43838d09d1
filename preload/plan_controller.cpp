#include "plan_controller.h"

#include <algorithm>

#include "common/clock.h"
#include "common/log.h"

namespace offload {

PlanController::PlanController(Driver& driver, Executor& executor, const Settings& settings, BlockCache& cache,
                               PersistentPool* persistent, PlanContext& context)
    : driver_(driver),
      executor_(executor),
      settings_(settings),
      cache_(cache),
      persistent_(persistent),
      context_(context) {}

void PlanController::say(const std::string& note) {
  if (note != plan_note_) log().info("{}", note);
  plan_note_ = note;
}

void PlanController::on_step(const StepTrace& t, bool marked) {
  adopt_swap();
  std::vector<uint64_t> tokens = step_tokens(t);
  bool repeats = tokens == last_tokens_;
  last_tokens_ = std::move(tokens);
  // Plan from a step that repeats the one before it (the first steps build optimizer state),
  // when no plan runs or the running one was abandoned, and once its arenas have drained.
  if (executor_.installed() && !executor_.deviated()) {
    watch_plan(t);
    if (!executor_.deviated()) watch_pool(t);  // unless watch_plan revised it already
    // Steps marked by offload_mark_step() trim there (at_mark); others here, at whatever
    // point of the next step the worker has reached.
    if (!marked) {
      std::lock_guard lock(trim_mu_);
      const Executor::TrimView v = executor_.trim_view();
      if (trim_.due(v.installs, v.steps_active, !executor_.deviated())) trim_pool(v);
    }
    if (const double f = refine_factor_.exchange(0); f > 0 && !executor_.deviated()) refine_plan(f);
  }
  if (!repeats || (executor_.installed() && !executor_.deviated()) || !executor_.idle()) return;
  plan_from(t);
}

double PlanController::measured_factor(const StepTrace& t, const PlanOptions& o) {
  // What the allocator holds for the step's live bytes, measured before the first plan (the
  // default pool's high-water mark against the step's peak), never below the model's.
  // With several streams (FSDP2) the pool holds far more than the model's 1.15, which would have
  // the plan think a budget met that is not (docs/results.md). Measured again from each step
  // planned from, and kept only when a plan is installed: a model's first repeating steps may be
  // its constructor's (moe), whose few live bytes would fix the factor at its clamp for good.
  if (pool_overhead_ > 0) return pool_overhead_;
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
  const double factor = measured_pool_factor(reserved, own_peak, weights, live, o.pool_overhead);
  const uint64_t own = own_peak > weights ? own_peak - weights : 0;  // as measured_pool_factor counts it
  first_factor_note_ = fmt::format(
      "the allocator holds {:.2f}x the step's live bytes ({:.2f} GiB for {:.2f} GiB, {:.2f} GiB of them in the "
      "shim's own ranges): planning with that",
      factor, static_cast<double>(reserved + own) / (1 << 30), static_cast<double>(live) / (1 << 30),
      static_cast<double>(own) / (1 << 30));
  return factor;
}

PlannerOptions PlanController::planner_options(const StepTrace& t, const PlanOptions& o, uint64_t budget,
                                               bool timed) {
  PlannerOptions po;
  po.granularity = o.granularity;
  po.pool_overhead = o.pool_overhead;
  po.spare_handle = true;
  // The worker drains the event ring too, and a plan can take longer than the ring lasts (moe:
  // 1.6-4 s a plan, about 78000 events a step, 65536 slots). The planner drains it now and then
  // into the assembler, which cuts the steps when the plan is made (each is a copy: `t` is not
  // touched). Kept in plan_opts_ for refine_plan, on the worker too.
  po.progress = [this, at = mono_ns()]() mutable {
    const int64_t now = mono_ns();
    if (now - at < kPlanDrainNs) return;
    at = now;
    context_.drain_while_planning();
  };
  if (persistent_) po.persistent_min = persistent_->min_bytes();
  // Weights the application marked read-only cost the plan no copy out (ordinals ascending).
  if (po.persistent_min && executor_.any_read_only())
    for (const TraceAlloc& a : t.allocs)
      if (a.base && a.persistent(po.persistent_min) && executor_.read_only(a.base, a.bytes))
        po.read_only.push_back(a.ordinal);
  if (timed) {
    share_ = context_.node_share(budget, share_.gpus);
    po.link = share_link(LinkModel{}, NodeLinkSums{share_.h2d, share_.d2h, share_.both}, share_.gpus);
  }
  po.link.scale = link_scale_;
  planned_link_ = po.link;
  // Lateness is per launch position: it means nothing for a step of another shape.
  if (!planned_.tokens.empty() && planned_.tokens != last_tokens_) late_at_.clear();
  po.link.late_at = late_at_;
  return po;
}

void PlanController::plan_from(const StepTrace& t) {
  // What outlives a step is born by now (the steps repeat): the pool of the shim's own keeps
  // it, and what is born from here on comes from PyTorch's pool.
  if (persistent_) persistent_->close();
  if (!context_.host_pool_ready()) return say("no host pool yet: keeping data resident");
  HostPool& pool = context_.host_pool();
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
  o.pool_overhead = measured_factor(t, o);
  if (host_) {
    pool.release(*host_);
    host_.reset();
  }
  // The planner when the step's kernels have GPU times (CUPTI, or none taken over); else the
  // built-in plan, which needs none.
  const bool timed = !settings_.builtin_plan && gpu_timeline(t).measured >= 0.5;
  // Sampled telemetry resumes when no plan runs: a step cut while tracing was paused is not
  // planned from (the built-in plan would move less); the next traced one is.
  if (!timed && settings_.telemetry_sampled && context_.cut_untraced(t)) return;
  PlannerOptions po = planner_options(t, o, budget, timed);
  const int64_t planning_from = mono_ns();
  for (int attempt = 0; attempt < 12; ++attempt) {
    Made m;
    Plan plan = make_plan(t, o, po, budget, timed, attempt == 0, &m);
    if (plan.empty()) return say("not offloading: " + m.why);
    std::string refused;
    std::optional<Extent> ext = pool.lease(plan.host_bytes(), &refused);
    if (!ext) {
      // A full pool keeps data resident: try a smaller plan that fits what the pool gives.
      say("host pool refused " + std::to_string(plan.host_bytes() >> 20) + " MiB (" + refused + "): planning for less");
      o.max_host_bytes = plan.host_bytes() / 2;
      continue;
    }
    pin(*ext);
    return put_in(t, std::move(plan), *ext, o, po, timed, m, planning_from);
  }
  say("not offloading: the host pool has no room (OFFLOAD_HOST_POOL)");
}

void PlanController::pin(const Extent& e) {
  HostPool& pool = context_.host_pool();
  const uint64_t before = pool.pinned_bytes();
  const int64_t from = mono_ns();
  const bool ok = pool.pin_extent(e, [&](void* p, uint64_t n) { return driver_.pin_host(p, n); });
  if (const uint64_t added = pool.pinned_bytes() - before)
    log().info("pinned {:.2f} GiB of the host pool for the plan in {:.0f} ms ({})", static_cast<double>(added) / (1 << 30),
               static_cast<double>(mono_ns() - from) / 1e6, pool.describe());
  if (!ok && !pin_failed_said_) {
    pin_failed_said_ = true;
    log().warn("could not pin the plan's host memory ({}): copies through it will be slower", pool.describe());
  }
}

Plan PlanController::make_plan(const StepTrace& t, PlanOptions& o, PlannerOptions& po, uint64_t budget, bool timed,
                               bool first, Made* m) {
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
    m->wait_ns = r.stall_ns, m->wait_share = r.stall_share;
    plan = std::move(r.plan);
    predicted_ = std::move(r.prediction);
    hidden_bytes_ = r.hidden_bytes, hidden_peak_ = r.hidden_peak;
    m->why = r.why;
    if (r.hidden_bytes && first)
      log().info("planner: the compute hides up to {:.2f} GiB per step (footprint {:.2f} GiB, step {:.1f} ms predicted)",
                 static_cast<double>(r.hidden_bytes) / (1 << 30), static_cast<double>(r.hidden_peak) / (1 << 30),
                 static_cast<double>(r.hidden_step_ns) / 1e6);
    if (!watch_) watch_.emplace(predicted_.step_ns, 3, kPlanSettleSteps);
    else watch_->replanned(predicted_.step_ns);
  } else {
    plan = build_plan(t, o, &m->why);
    predicted_ = Prediction{};
    hidden_bytes_ = hidden_peak_ = 0;
  }
  resolve_weights(plan, t);
  planned_ = plan;
  return plan;
}

void PlanController::put_in(const StepTrace& t, Plan plan, const Extent& ext, const PlanOptions& o,
                            const PlannerOptions& po, bool timed, const Made& m, int64_t planning_from) {
  const uint64_t n = plan.step_launches;
  uint64_t anchor = plan_anchor(t.first_launch, n, context_.launches());
  std::string desc = plan.describe();
  bool meets = plan.meets_budget;
  HostMemory hm{ext.host, ext.host - ext.offset, kPinChunk};
  std::string why;
  if (!executor_.install(std::move(plan), anchor, hm, &why)) {
    context_.host_pool().release(ext);
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
  context_.planned_from(t);
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
  const uint64_t cut = context_.steps_cut(), launches = context_.launches();
  log().info("plan made from step {} in {:.0f} ms ({} steps cut since); it runs from launch {}, {} launches on",
             t.step, static_cast<double>(mono_ns() - planning_from) / 1e6, cut > t.step + 1 ? cut - t.step - 1 : 0,
             anchor, anchor > launches ? anchor - launches : 0);
  if (m.wait_ns)
    log().info("the plan waits {:.1f} ms a step for weight reloads ({:.1f}% of the compute): no plan whose copies all "
               "hide meets the budget",
               static_cast<double>(m.wait_ns) / 1e6, 100 * m.wait_share);
  if (!meets) log().warn("OFFLOAD_DEVICE_BUDGET cannot be met by what the plan can move; the rest stays resident");
  if (timed && link_bound(predicted_))
    if (const CheckpointEstimate c = estimate_checkpointing(t, po.pool_overhead); c.known)
      log().info("the link cannot hide this plan's copies ({:.1f} ms a step predicted, {:.1f} ms of compute): "
                 "checkpointing the model's {} layers would take about {:.1f} ms a step and keep at least {:.2f} GiB",
                 static_cast<double>(predicted_.step_ns) / 1e6, static_cast<double>(predicted_.compute_ns) / 1e6,
                 c.layers, static_cast<double>(c.step_ns) / 1e6, static_cast<double>(c.footprint) / (1 << 30));
}

void PlanController::watch_pool(const StepTrace& t) {
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

void PlanController::watch_plan(const StepTrace& t) {
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

void PlanController::at_mark() {
  if (!executor_.installed() || executor_.deviated()) return;
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

void PlanController::refine_at_mark(const Executor::TrimView& v, bool trim_due, const std::function<void()>& sync) {
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

void PlanController::trim_before_first_step(const std::function<void()>& sync) {
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

void PlanController::empty_pool(const std::function<void()>& sync) {
  sync();
  if (!driver_.pool_trim(0)) log().debug("pool refine: the pool could not be emptied of what is unused");
}

bool PlanController::swap_at_mark(const std::function<void()>& sync) {
  std::lock_guard lock(swap_mu_);
  if (!swap_ || swap_->installed || swap_->refused) return false;
  // Every arena is empty at a mark once the GPU has caught up (their members are freed, the
  // copies done): the new plan goes in with no step in demand mode.
  sync();
  const uint64_t anchor = plan_anchor(swap_->first_launch, swap_->plan.step_launches, context_.launches());
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

void PlanController::refine_plan(double factor) {
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
  HostPool* pool = &context_.host_pool();
  std::string refused;
  std::optional<Extent> ext = pool->lease(r.plan.host_bytes(), &refused);
  if (!ext) return keep("the host pool refused " + std::to_string(r.plan.host_bytes() >> 20) + " MiB (" + refused + ")");
  pin(*ext);
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

void PlanController::adopt_swap() {
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
  HostPool* pool = &context_.host_pool();
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

void PlanController::trim_pool(const Executor::TrimView& v) {
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

PlanController::Report PlanController::report() const {
  Report r;
  r.pool_trims = pool_trims_.load();
  r.pool_trimmed_bytes = pool_trimmed_bytes_.load();
  r.weight_bound = planned_.weight_bytes_mapped;
  r.windows = planned_.windows.size();
  r.predicted = predicted_;
  r.hidden_bytes = hidden_bytes_;
  r.hidden_peak = hidden_peak_;
  r.predicted_peak = planned_.predicted_peak;
  r.link_scale = link_scale_;
  r.revisions = watch_ ? watch_->revisions() : 0;
  r.pool_revisions = pool_watch_.revisions();
  r.pool_overhead = pool_overhead_;
  r.pool_factor_seen = refine_seen_.load();
  r.pool_refined = refined_.load();
  r.gpus = share_.gpus;
  r.link = planned_link_;
  r.host_bytes = host_ ? host_->bytes : 0;
  return r;
}

}  // namespace offload

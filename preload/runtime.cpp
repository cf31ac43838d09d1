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

#include "capture_mode.h"
#include "common/files.h"
#include "common/json_writer.h"
#include "common/log.h"
#include "common/clock.h"
#include "hooks/hook_table.h"
#include "offload/offload.h"
#include "planner/planner.h"
#include "offload_version.h"

namespace offload {

namespace {

std::atomic<Runtime*> g_runtime{nullptr};
std::atomic<bool> g_pass_through{false};  // set at exit and in forked children
const Settings* g_settings = nullptr;      // set once by the library constructor
const std::string* g_settings_error = nullptr;  // or, with bad settings, what is wrong with them
std::once_flag g_error_once;
const std::string* g_settings_warning = nullptr;  // OFFLOAD_* names set but not read (typos)
std::once_flag g_build_once;

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

Runtime* runtime() {
  if (g_pass_through.load(std::memory_order_relaxed)) return nullptr;
  if (Runtime* rt = g_runtime.load(std::memory_order_acquire)) return rt;
  if (!g_settings) {
    if (g_settings_error) std::call_once(g_error_once, [] { log().error("{}", *g_settings_error); });
    return nullptr;
  }
  // Built on the first allocation or launch we see, so that processes which only inherit
  // LD_PRELOAD (compilers, data-loader workers) never pay for the rings or the worker.
  std::call_once(g_build_once, [] {
    // Said when the process first uses CUDA, as a bad setting is: not in every child.
    if (g_settings_warning) log().warn("{}", *g_settings_warning);
    g_runtime.store(new Runtime(*g_settings), std::memory_order_release);
  });
  return g_runtime.load(std::memory_order_acquire);
}

Settings link_settings(Settings s) {
  const bool arenas = s.offload() && !s.cap;
  if (!arenas && s.daemon == "auto") s.daemon = "connect";
  return s;
}

namespace {

std::unique_ptr<PersistentPool> persistent_pool(Driver& driver, const Settings& s) {
  if (!s.persistent_min) return nullptr;
  PersistentPool::Options po;
  po.min_bytes = s.persistent_min;
  return std::make_unique<PersistentPool>(driver, po);
}

}  // namespace

Runtime::Runtime(Settings s)
    : settings_(std::move(s)),
      tracker_(driver_, log_),
      executor_(driver_, Executor::Options{}),
      offloading_requested_(settings_.offload()),
      light_(!settings_.observe_full()),
      offloading_(settings_.offload() && !settings_.cap),
      planning_(settings_.offload() && (!settings_.cap || settings_.cap_plan)),
      // Under the cap the manager serves every large allocation: no pool of the shim's own.
      persistent_(settings_.offload() && settings_.cap ? nullptr : persistent_pool(driver_, settings_)),
      plan_(driver_, executor_, settings_, cache_, persistent_.get(), *this),
      telemetry_(settings_.cupti_lib, tracker_.counters().kernels),
      assembler_(tracker_.funcs(), StepAssembler::Options{}),
      link_(link_settings(settings_), command_line()) {
  cache_.set_max(settings_.block_cache);
  if (light_) tracker_.set_light();
  if (offloading_) tracker_.set_gate(&executor_);
  if (persistent_) executor_.set_persistent(persistent_.get());
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

Runtime::~Runtime() {
  stop();
  executor_.set_room(nullptr);  // the residency manager goes first (members end in reverse)
}

void Runtime::drop_in_child() { link_.drop_in_child(); }

void Runtime::stop() {
  stop_.store(true);
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (premade_) premade_->stop();
}

void Runtime::worker() {
  pthread_setname_np(pthread_self(), "offload-worker");
  while (!stop_.load(std::memory_order_relaxed)) {
    {
      std::unique_lock lock(wake_mu_);
      wake_.wait_for(lock, std::chrono::milliseconds(20));
    }
    if (stop_.load(std::memory_order_relaxed) || g_pass_through.load(std::memory_order_relaxed)) break;
    relax_capture_checks_for_good();  // a thread of ours: never captures (retried until libcuda is loaded)
    pump(false);
    grow_host_ahead();  // outside the pump's lock: a query of the stats never waits for pinning
  }
  worker_done_.store(true, std::memory_order_release);
}

void Runtime::end_at_exit() {
  // Only the process that started the worker has it (a forked child has the object alone).
  if (getpid() != owner_pid_ || !thread_.joinable()) return;
  stop_.store(true);
  wake_.notify_all();
  // The worker ends within one pump; one stuck in the driver while the process tears it down
  // is left to the exit rather than waited for without bound.
  for (int i = 0; i < 200 && !worker_done_.load(std::memory_order_acquire); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (worker_done_.load(std::memory_order_acquire)) thread_.join();
  else thread_.detach();
  if (premade_) premade_->stop();  // within one piece (tens of ms)
  if (Residency* r = cap_.load(std::memory_order_acquire)) r->end_grants();  // OFFLOAD_CAP_GRANT=apart's thread
}

void Runtime::pump(bool no_wait) {
  std::lock_guard lock(pump_mu_);
  // CUPTI starts once the process has launched on the GPU, never in processes that only
  // inherited LD_PRELOAD (compilers, data-loader workers).
  if (!telemetry_started_ && settings_.telemetry && !light_ && tracker_.counters().kernels.load() > 0) {
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
  if (planning_ && !link_.usable() && !private_pool_) {
    // Under the cap a plan moves what the budget forces out, which a fixed 4 GiB would cut short:
    // unless OFFLOAD_HOST_POOL says otherwise, the private pool is as large as the host memory
    // evicted bytes may take (its pages are made only where a plan leases them).
    uint64_t bytes = settings_.host_pool_bytes;
    if (host_store_ && !settings_.host_pool_set) bytes = std::max(bytes, host_store_->limit());
    private_pool_ = std::make_unique<PrivatePool>(bytes);
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
  drain_events();
  telemetry_.collect(&gpu_, no_wait);
  assembler_.add_gpu_records(gpu_);
  for (StepTrace& t : assembler_.take_ready(mono_ns(), false, no_wait)) {
    emit(t);
    if (planning_) plan_.on_step(t, assembler_.marked());
  }
  if (planning_) executor_.poll();
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
  const bool running = planning_ && executor_.installed() && !executor_.deviated();
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

void Runtime::mark_step() {
  tracker_.mark_step();
  if (planning_) plan_.at_mark();
}

NodeShare Runtime::node_share(uint64_t budget, uint32_t gpus_before) {
  if (private_pool_ || !link_.connected()) return NodeShare{};
  std::string why;
  std::optional<NodeShare> s = link_.attach(attach_info_from_env(driver_.device(), budget, driver_.gpu_id()), &why);
  if (!s) {
    if (why != share_note_) log().info("offloadd: {}; planning with this GPU's link alone", why);
    share_note_ = why;
    return NodeShare{};
  }
  if (s->gpus != gpus_before && s->h2d > 0)
    log().info("{} GPU(s) of this node share the host link ({:.1f} GB/s H2D, {:.1f} D2H, {:.1f} both ways, summed)",
               s->gpus, s->h2d, s->d2h, s->both);
  else if (s->gpus != gpus_before)
    log().info("{} GPU(s) of this node share the host link (its sums not measured: offloadd --node-link)", s->gpus);
  return *s;
}

HostPool& Runtime::host_pool() {
  return private_pool_ ? static_cast<HostPool&>(*private_pool_) : static_cast<HostPool&>(link_);
}

void Runtime::push_step(uint64_t step, uint64_t step_ns, uint64_t launches) {
  // Under the cap the device bytes we hold; otherwise the live allocations.
  Residency* r = cap_.load(std::memory_order_acquire);
  link_.push(step_telemetry_.make(step, step_ns, launches, r ? r->stats().held : tracker_.allocs().live_bytes()));
}

void Runtime::cut_step_telemetry() {
  MoveTotals t;
  if (Residency* r = cap_.load(std::memory_order_acquire)) t = move_totals(r->stats());
  else if (!offloading_) return;
  if (planning_) {  // a plan of arenas, alone or on top of the cap: its moves count too
    const Executor::Moves m = executor_.moves();
    t.bytes_out += m.bytes_out;
    t.wait_ns += static_cast<uint64_t>(static_cast<double>(m.wait_cycles) * ns_per_tsc_cycle());
    t.misses += m.misses;
  }
  step_telemetry_.cut(t);
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
    log_capped_step(t, now - (last_cut_ns_ ? last_cut_ns_ : cap_started_ns_.load(std::memory_order_relaxed)));
  }
  cut_step_telemetry();
  push_step(t.step, t.gpu_busy_ns > 0 ? static_cast<uint64_t>(t.gpu_busy_ns) : static_cast<uint64_t>(now - last_cut_ns_),
            t.launches.size());
  last_cut_ns_ = now;
  if (summaries_.size() > kSummariesKept) summaries_.pop_front();
  if (!settings_.trace_dir.empty() && steps_written_ < settings_.trace_steps) {
    // The step's zero as Unix time: the records' clock now against the host's, read together.
    if (auto clock = telemetry_.clock(); clock && t.gpu_origin_ns >= 0)
      t.base_unix_ns = unix_ns() - static_cast<int64_t>(clock()) + t.gpu_origin_ns;
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
  auto ld = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  JsonWriter w;
  w.object().field("version", 1).field("pid", getpid()).field("observe", light_ ? "light" : "full")
      .field("telemetry", light_ ? std::string("off: light observation") : telemetry_.state());
  w.key("cupti").raw(telemetry_.counters_json());
  w.field("host_pool", private_pool_ ? private_pool_->describe() : link_.describe())
      .field("step_detection", assembler_.marked() ? "offload_mark_step" : "automatic")
      .field("locked", assembler_.detector().locked())
      .field("period", assembler_.detector().period())
      .field("deviations", assembler_.detector().deviations())
      .field("steps", assembler_.steps_cut())
      .field("drained_while_planning", ld(drained_while_planning_));
  w.object("counters").field("kernels", ld(c.kernels)).field("copies", ld(c.copies)).field("memsets", ld(c.memsets))
      .field("graph_launches", ld(c.graphs)).field("collectives", ld(c.collectives))
      .field("allocs", ld(c.allocs)).field("frees", ld(c.frees))
      .field("unknown_frees", ld(c.unknown_frees)).field("opaque_kernels", ld(c.opaque_kernels))
      .field("dropped_events", log_.dropped()).field("unwrapped_routes", hooks::unwrapped_routes())
      .field("live_allocs", tracker_.allocs().size()).field("live_bytes", tracker_.allocs().live_bytes())
      .field("functions", tracker_.funcs().count()).field("unscanned_launches", ld(c.unscanned)).end();
  w.field("hook_ns_mean", c.hook_ns_mean());
  executor_json(w.key("executor"));
  w.key("residency").raw(residency_json(cap_.load(std::memory_order_acquire)));
  if (cap_.load(std::memory_order_acquire) && premade_) {  // host memory made ahead of evictions
    const PremadeHost::Stats pm = premade_->stats();
    w.object("host_premade").field("target", premade_->reserved()).field("made", pm.made).field("taken", pm.taken)
        .field("released", pm.released).field("make_ns", uint64_t(pm.make_ns)).field("making", pm.making).end();
  }
  persistent_json(w.key("persistent"));
  block_cache_json(w.key("block_cache"));
  w.object("routes");
  for (size_t i = 0; i < hooks::kHookCount; ++i) {
    const hooks::HookEntry& e = hooks::hook_table()[i];
    const uint32_t r = e.routes.load(std::memory_order_relaxed);
    if (!r) continue;
    w.array(e.symbol);
    for (int b = 0; b < 4; ++b)
      if (r & (1u << b)) w.value(route_names[b]);
    w.end();
  }
  // The streams the shim copies on, with CUPTI's ids: a profiler's trace names them by those.
  w.end().array("copy_streams");
  for (Stream st : driver_.created_streams()) {
    char hex[32];
    snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(st));
    w.object().field("handle", hex).field("cupti_id", telemetry_.stream_id(st)).end();
  }
  w.end().array("recent_steps");
  for (const StepSummary& s : summaries_)
    w.object().field("step", s.step).field("launches", s.launches).field("kernels", s.kernels)
        .field("cupti_kernels", s.cupti_kernels).field("gpu_busy_ns", s.gpu_busy_ns).field("gpu_step_ns", s.gpu_step_ns)
        .field("allocs_born", s.allocs_born).field("activations", s.activations)
        .field("activations_unaccessed", s.activations_unaccessed).end();
  w.end().end();
  return w.str();
}

void Runtime::persistent_json(JsonWriter& w) const {
  if (!persistent_) {
    w.null();
    return;
  }
  const PersistentPool::Stats p = persistent_->stats();
  w.object().field("min_bytes", persistent_->min_bytes()).field("allocs", p.allocs).field("reused", p.reused)
      .field("cross_stream", p.cross_stream).field("created", p.created).field("released", p.released)
      .field("refused", p.refused).field("live_bytes", p.live_bytes).field("cached_bytes", p.cached_bytes)
      .field("lent_bytes", p.lent_bytes).field("peak_bytes", p.peak_bytes).end();
}

void Runtime::block_cache_json(JsonWriter& w) const {
  const BlockCache::Stats b = cache_.stats();
  w.object().field("max_bytes", settings_.block_cache).field("hits", b.hits).field("misses", b.misses)
      .field("kept", b.kept).field("forwarded", b.forwarded).field("captured", b.captured)
      .field("drains", b.drains).field("drained_blocks", b.drained_blocks)
      .field("kept_bytes", b.kept_bytes).field("kept_peak", b.kept_peak).end();
}

// The plan's half of the executor's object: what the planner predicted and learned.
void Runtime::planner_json(JsonWriter& w, const PlanController::Report& p) {
  w.object("planner").field("gpu_time", p.predicted.step_ns > 0)
      .field("predicted_step_ns", p.predicted.step_ns).field("compute_ns", p.predicted.compute_ns)
      .field("lower_bound_ns", p.predicted.lower_bound_ns).field("forward_ns", p.predicted.forward_ns)
      .field("backward_ns", p.predicted.backward_ns).field("bytes_moved", p.predicted.bytes_out)
      .field("hidden_bytes", p.hidden_bytes).field("hidden_peak", p.hidden_peak)
      .field("predicted_peak", p.predicted_peak).field("link_scale", p.link_scale)
      .field("revisions", p.revisions).field("pool_revisions", p.pool_revisions)
      .field("pool_overhead", p.pool_overhead).field("pool_factor_seen", p.pool_factor_seen)
      .field("pool_refined", p.pool_refined);
  w.object("link").field("gpus", p.gpus).field("h2d", p.link.h2d).field("d2h", p.link.d2h)
      .field("h2d_shared", p.link.h2d_shared).field("d2h_shared", p.link.d2h_shared).end();
  w.end();
}

void Runtime::executor_json(JsonWriter& w) {
  const ExecutorStats x = executor_.stats();
  const PlanController::Report p = plan_.report();
  const uint64_t total = driver_.device_total_bytes();
  w.object().field("on", planning_).field("on_cap", planning_ && !offloading_).field("budget", settings_.budget_bytes(total))
      .field("installed", executor_.installed()).field("deviated", executor_.deviated()).field("plan", x.plan)
      .field("installs", x.installs).field("deviations", x.deviations)
      .field("pool_trims", p.pool_trims).field("pool_trimmed_bytes", p.pool_trimmed_bytes)
      .field("steps_active", x.steps_active).field("placed", x.placed).field("arena_busy", x.arena_busy)
      .field("no_handle", x.no_handle).field("evictions", x.evictions)
      .field("evictions_abandoned", x.evictions_abandoned).field("reloads", x.reloads).field("misses", x.misses)
      .field("late_reloads", x.late_reloads).field("copy_failures", x.copy_failures)
      .field("pointer_tables", x.pointer_tables).field("conservative", x.conservative)
      .field("bytes_out", x.bytes_out).field("bytes_in", x.bytes_in)
      .field("handles_created", x.handles_created).field("handles_released", x.handles_released)
      .field("over_budget", x.over_budget).field("first_step_trims", x.first_step_trims)
      .field("budget_waits", x.budget_waits).field("handovers", x.handovers)
      .field("held_bytes", x.held_bytes).field("held_peak", x.held_peak).field("device_peak", x.device_peak);
  w.object("weights").field("lent", x.weights).field("evictions", x.weight_evictions)
      .field("reloads", x.weight_reloads).field("misses", x.weight_misses).field("abandoned", x.weight_abandoned)
      .field("bytes_out", x.weight_bytes_out).field("bytes_in", x.weight_bytes_in)
      .field("mapped_peak", x.weight_mapped_peak).field("bound", p.weight_bound).field("waits", x.weight_waits)
      .field("handovers", x.weight_handovers).field("split", x.weight_split).field("settles", x.weight_settles)
      .field("read_only", x.weight_read_only).field("clean_evictions", x.weight_clean_evictions)
      .field("over_bound", x.weight_over_bound).field("windows", p.windows).end();
  planner_json(w, p);
  w.field("host_bytes", p.host_bytes);
  const double ns = ns_per_tsc_cycle();
  w.field("gate_ns_mean",
          x.gate_calls ? static_cast<double>(x.gate_cycles - x.gate_wait_cycles) * ns / static_cast<double>(x.gate_calls)
                       : 0.0)
      .field("budget_wait_ms", static_cast<double>(x.wait_cycles) * ns / 1e6);
  w.array("recent_misses");
  for (uint64_t m : x.recent_misses) w.value(m);
  w.end().array("recent_late");
  for (uint64_t l : x.recent_late) w.value(l);
  // [position, microseconds, kind, drained] of the last active step's longest host waits.
  w.end().object("last_step_waits").field("count", x.last_step_wait_count).field("drained", x.last_step_drained);
  w.array("longest");
  for (const auto& wt : x.last_step_waits)
    w.array().value(wt.pos).value(static_cast<double>(wt.cycles) * ns / 1e3).value(std::string_view(&wt.kind, 1))
        .value(wt.drained).end();
  w.end().end().end();
}

namespace {

__attribute__((constructor)) void offload_init() {
  std::vector<std::string> errors;
  Settings s = read_settings([](const char* n) { return getenv(n); }, &errors);
  // torchrun's: info on each node's first rank (LOCAL_RANK 0), warn on the others; every line
  // names the rank (RANK, the job's) and the pid.
  auto rank_of = [](const char* name) { return env_int(getenv(name), 0, INT32_MAX).value_or(-1); };
  const int local_rank = rank_of("LOCAL_RANK"), rank = rank_of("RANK");
  set_log_level(s.log_level_for(local_rank >= 0 ? local_rank : rank));
  set_log_origin(rank >= 0 ? rank : local_rank);
  if (!errors.empty()) {
    // Said once, and only if the process uses CUDA (runtime() is asked): every preloaded
    // child (compilers, shells, data-loader workers) would otherwise repeat it.
    std::string line = "bad OFFLOAD_* settings (";
    for (size_t i = 0; i < errors.size(); ++i) line += (i ? "; " : "") + errors[i];
    g_settings_error = new std::string(line + "): liboffload forwards every call and observes nothing");
    return;
  }
  if (!s.enabled) return;
  std::vector<std::string> unknown = unknown_settings(environ);
  if (!unknown.empty()) {
    std::string line = "OFFLOAD_* variables liboffload does not read: ";
    for (size_t i = 0; i < unknown.size(); ++i) line += (i ? "; " : "") + unknown[i];
    g_settings_warning = new std::string(line);
  }
  // A forked child (a data-loader worker) only forwards, and lets go of the daemon
  // connection and the pool mapping it inherited: were it to keep the socket open, the
  // daemon would not see the parent die until the child does.
  pthread_atfork(nullptr, nullptr, [] {
    g_pass_through.store(true);
    if (Runtime* rt = g_runtime.load(std::memory_order_acquire)) rt->drop_in_child();
  });
  // At exit: hooks only forward from here on, and the worker is ended and joined (bounded), so
  // that no thread is left joinable.
  atexit([] {
    g_pass_through.store(true);
    if (Runtime* rt = g_runtime.load(std::memory_order_acquire)) rt->end_at_exit();
  });
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

__attribute__((visibility("default"))) const char* offload_version(void) {
  return OFFLOAD_VERSION " (commit " OFFLOAD_COMMIT ")";
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

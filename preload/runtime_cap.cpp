// The Runtime's wiring of the hard cap (residency/residency.h): built at the first allocation,
// it serves the allocation hooks and gates every launch. The policy lives in Residency.
#include <cinttypes>
#include <cstdlib>

#include "common/clock.h"
#include "common/log.h"
#include "runtime.h"

namespace offload {
namespace {

std::string kernel_name(void* ctx, uint32_t kernel) {
  return "kernel " + static_cast<FuncRegistry*>(ctx)->name(kernel);
}

}  // namespace

void Runtime::start_cap() {
  cap_started_ns_.store(mono_ns(), std::memory_order_relaxed);
  driver_.learn_context();
  const uint64_t total = driver_.device_total_bytes();
  const uint64_t budget = settings_.budget_bytes(total);
  if (!budget) {
    log().error("OFFLOAD_DEVICE_BUDGET is a share of the GPU's memory, which the driver does not tell: no cap");
    return;
  }
  HostStore::Options ho;
  const uint64_t avail = HostStore::mem_available();
  const int ranks = attach_info_from_env(-1, 0, "").local_world;
  ho.limit = settings_.host_limit ? settings_.host_limit : HostStore::default_limit(avail, ranks);
  // A plan of arenas on top (OFFLOAD_CAP_PLAN) pins the pool's extents in its own grid: the store
  // then keeps to this process's memory, so that no page is registered twice.
  if (!planning_) pool_chunks_ = std::make_unique<LinkChunks>(link_);
  ChunkSource* chunks = pool_chunks_.get();
  if (!planning_ && settings_.host_premake) {
    // Faulted in while the model is built and the first steps run (to the target, or until the
    // first eviction with OFFLOAD_HOST_PREMAKE_UNTIL=eviction): unless set, as much as the budget
    // (what a model twice its size forces out) and a quarter of the host's available memory among
    // the node's ranks, which a model that fits holds for a minute for nothing. The making stops where the host's available memory has halved (other
    // processes, data loaders): host memory the job needs is not taken for a head start.
    PremadeHost::Options po;
    po.past_first_take = settings_.host_premake_past_eviction;
    po.target = premake_target(settings_.host_premake == Settings::kHostPremakeAuto ? UINT64_MAX : settings_.host_premake,
                               budget, avail, ho.limit, ranks);
    premade_ = std::make_unique<PremadeHost>(po, chunks, [this, floor = avail / 2] {
      return link_.up() || HostStore::mem_available() < floor;
    });
    chunks = premade_.get();
  }
  host_store_ = std::make_unique<HostStore>(driver_, ho, chunks);
  Residency::Options ro;
  ro.budget = budget;
  ro.min_bytes = settings_.cap_min;
  apply_cap_policy(settings_, &ro);
  // Outside growth between two looks at it (every 20 ms): the whole growth over a run was
  // 56-100 MiB on the H200 (docs/results.md, "outside"), so one look's worth is far less.
  ro.headroom = std::min<uint64_t>(budget / 64, 64ull << 20);
  residency_ = std::make_unique<Residency>(driver_, *host_store_, ro);
  residency_->set_namer(kernel_name, &tracker_.funcs());
  residency_->set_finder(find_alloc, const_cast<AllocTable*>(&tracker_.allocs()), alloc_horizon);
  tracker_.set_pass_launch_args(ro.recompute);
  if (planning_) {
    executor_.set_room(residency_.get());
    gates_ = std::make_unique<CapAndPlan>(*residency_, executor_);
    tracker_.set_gate(gates_.get());
  } else {
    tracker_.set_gate(residency_.get());
  }
  cap_context_ = context();
  cap_device_ = driver_.device();
  cap_.store(residency_.get(), std::memory_order_release);
  if (premade_) premade_->start();
  log().info("device budget {:.2f} GiB ({} bytes), held from the first allocation: allocations of at least {:.1f} MiB "
             "are moved to host memory (up to {:.1f} GiB, OFFLOAD_HOST_LIMIT) when the budget needs room",
             budget / kGiB, budget, residency_->min_bytes() / double(1 << 20), host_store_->limit() / kGiB);
  if (ro.recompute)
    log().info("OFFLOAD_CAP_RECOMPUTE: a range one launch produced is made again instead of copied back, and dropped "
               "at eviction once its kernel is checked; the first launches of each kernel are watched for what they "
               "write (two waits for their stream each)");
}

namespace {
thread_local bool tl_graph_alloc = false;  // place_capped forwarded a capture's allocation
}  // namespace

Runtime::Placed Runtime::place_capped(uint64_t bytes, Stream s, void** p) {
  tl_graph_alloc = false;
  Residency* r = cap_.load(std::memory_order_acquire);
  if (!r) {
    std::call_once(cap_once_, [this] { start_cap(); });
    r = cap_.load(std::memory_order_acquire);
    if (!r) return Placed::Forward;
  }
  // The budget is the first device's: another device's allocations (one process driving two
  // GPUs) go to its allocator untouched. A thread with no current context yet (PyTorch's
  // autograd thread skips cudaSetDevice for device 0) allocates on the device the runtime then
  // makes current: device 0's, which is ours when the budget is device 0's. Forwarding those
  // let the backward's first allocation (the logits' gradient, GiBs) bypass the budget.
  if (cap_context_) {
    const uint64_t c = context();
    if (c ? c != cap_context_ : cap_device_ != 0) {
      if (bytes >= r->min_bytes() && !other_device_said_.exchange(true))
        log().info("allocations on another device pass through untouched: the budget holds on device {}", cap_device_);
      return Placed::Forward;
    }
  }
  // A graph capture's allocation is the graph's for every replay (the driver's graph pool): a range
  // of ours would be given to another allocation once the capture frees it, under the replays.
  if (capturing(s) == 1) {
    tl_graph_alloc = true;
    return Placed::Forward;
  }
  uint64_t tag = 0;
  // A member of the plan's arenas, at its planned place (its handle made in the cap's room).
  if (planning_)
    if (const DevPtr a = executor_.place(bytes, s, tracker_.launches(), &tag)) {
      *p = reinterpret_cast<void*>(a);
      tracker_.on_alloc(a, bytes, s, tag);
      executor_.note_live(tracker_.allocs().live_bytes());
      return Placed::Served;
    }
  // A refusal is said once, small or not: PyTorch's out-of-memory error alone does not say that
  // the budget, not the GPU, was too small.
  auto refuse = [&] {
    if (refused_said_.exchange(true) == false) log().error("out of memory under the device budget: {}", r->error());
    return Placed::Refused;
  };
  if (bytes < r->min_bytes()) return r->admit_small(bytes) ? Placed::Forward : refuse();
  bool refused = false;
  const DevPtr a = gates_ ? gates_->alloc(bytes, s, &tag, &refused) : r->alloc(bytes, s, &tag, &refused);
  if (refused) return refuse();
  if (!a) return Placed::Forward;
  *p = reinterpret_cast<void*>(a);
  tracker_.on_alloc(a, bytes, s, tag);
  return Placed::Served;
}

void Runtime::forwarded_capped(Residency& r, DevPtr p, uint64_t bytes) {
  if (!tl_graph_alloc) {
    r.small_allocated(bytes, p);
    return;
  }
  tl_graph_alloc = false;
  std::lock_guard<std::mutex> lk(graph_mu_);
  graph_allocs_.insert(p);
  any_graph_alloc_.store(true, std::memory_order_release);
}

bool Runtime::forget_graph_alloc(DevPtr p) {
  if (!any_graph_alloc_.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lk(graph_mu_);
  return graph_allocs_.erase(p) != 0;
}

bool Runtime::release_capped(Residency& r, DevPtr d, Stream s) {
  if (forget_graph_alloc(d)) {
    tracker_.on_free(d, s);
    return false;  // the allocator's (the graph's) memory
  }
  std::optional<AllocEntry> e = tracker_.allocs().find(d);
  tracker_.on_free(d, s);
  if (r.free(d, s)) return true;
  if (planning_ && executor_.release(d, s)) return true;
  if (e && e->base == d) {
    r.small_freed(e->size, d);
    r.forget_table(e->id, s);
  }
  return false;
}

void Runtime::check_allocations_seen() {
  if (said_no_allocations_ || !offloading_requested_) return;
  TrackerCounters& c = tracker_.counters();
  if (c.allocs.load(std::memory_order_relaxed) != 0) {
    said_no_allocations_ = true;  // routed: nothing to say
    return;
  }
  if (c.kernels.load(std::memory_order_relaxed) < kLaunchesBeforeNoAllocations) return;
  said_no_allocations_ = true;
  const char* conf = getenv("PYTORCH_CUDA_ALLOC_CONF");
  log().error("OFFLOAD_DEVICE_BUDGET is set but no allocation has reached liboffload after {} launches "
              "(PYTORCH_CUDA_ALLOC_CONF={}): PyTorch's allocator is not routed through the shim, and the budget "
              "is NOT held. Set PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, or use the CUDAPluggableAllocator "
              "pair offload_malloc/offload_free",
              kLaunchesBeforeNoAllocations, conf ? conf : "unset");
}

void Runtime::grow_host_ahead() {
  if (!cap_.load(std::memory_order_acquire)) return;
  const uint64_t reserve = host_reserve_.load(std::memory_order_relaxed);
  if (reserve) host_store_->grow_ahead(reserve);
  if (!premade_) return;
  const PremadeHost::Stats pm = premade_->stats();
  if (!said_premade_ && pm.taken) {
    said_premade_ = true;
    log().info("host memory for evicted bytes: {:.2f} GiB faulted in before the first eviction ({:.1f} s on a thread of "
               "its own, OFFLOAD_HOST_PREMAKE), only its pinning left to pay",
               pm.made / kGiB, pm.make_ns / 1e9);
  }
  if (const uint64_t back = premade_->trim_idle(mono_ns()))
    log().info("host memory faulted in ahead and not needed given back: {:.2f} GiB of {:.2f} GiB ({:.2f} GiB taken)",
               back / kGiB, pm.made / kGiB, pm.taken / kGiB);
}

void Runtime::log_capped_step(const StepTrace& t, int64_t wall_ns) {
  const uint64_t step = t.step;
  const Residency::Stats now = residency_->stats();
  const Residency::Stats& was = last_step_cap_;
  // The first steps' boundaries are found only once the period shows, after later launches ran:
  // those steps are cut together, and the first one's line holds their time and moves.
  const bool late = t.first_launch + t.launches.size() <= logged_through_launch_;
  logged_through_launch_ = std::max(logged_through_launch_, tracker_.launches());
  if (late) {
    if (capped_steps_logged_ < kCappedStepsLogged) {
      ++capped_steps_logged_;
      log().info("step {}: its end was found after the line above was written, which counts it", step);
    }
    return;
  }
  if (capped_steps_logged_ < kCappedStepsLogged) {
    ++capped_steps_logged_;
    log().info("step {}: {:.1f} ms, {:.2f} GiB evicted ({} ahead), {} reloads on demand ({:.2f} GiB), {} ahead "
               "({:.2f} GiB, {} used), {} host waits, {} handovers, peak {:.2f} of {:.2f} GiB",
               step, wall_ns / 1e6, (now.bytes_out - was.bytes_out) / kGiB, now.ahead - was.ahead,
               now.reloads - was.reloads, (now.bytes_in - was.bytes_in) / kGiB, now.prefetches - was.prefetches,
               (now.prefetch_bytes - was.prefetch_bytes) / kGiB, now.prefetch_hits - was.prefetch_hits,
               now.waits - was.waits, now.handovers - was.handovers, now.footprint_peak / kGiB, residency_->budget() / kGiB);
    if (now.probes || now.recomputed || now.dropped)  // OFFLOAD_CAP_RECOMPUTE
      log().info("step {}: {} ranges made again ({:.2f} GiB), {} dropped at eviction ({:.2f} GiB), {} made again "
                 "early; {} launches watched for their writes ({:.1f} ms), {} kernels checked, {} banned; {} "
                 "launches without arguments to launch again; {} producers recorded, {} not for writing a small "
                 "allocation, {} for writing another range; {} made again keeping what they "
                 "write besides ({:.1f} MiB, {} refused); copied back: {} as an input was away, {} as one had changed, {} "
                 "as it was written since, {} living across steps, {} with no producer, {} whose producer a later "
                 "write took",
                 step, now.recomputed - was.recomputed, (now.recomputed_bytes - was.recomputed_bytes) / kGiB,
                 now.dropped - was.dropped, (now.dropped_bytes - was.dropped_bytes) / kGiB,
                 now.restored_early - was.restored_early, now.probes - was.probes, (now.probe_ns - was.probe_ns) / 1e6,
                 now.recompute_checks - was.recompute_checks, now.recompute_bans - was.recompute_bans,
                 now.undescribed - was.undescribed, now.producers - was.producers,
                 now.not_producer_small - was.not_producer_small, now.not_producer_alone - was.not_producer_alone,
                 now.side_kept - was.side_kept, (now.side_kept_bytes - was.side_kept_bytes) / double(1 << 20),
                 now.side_refused - was.side_refused,
                 now.remake_away - was.remake_away,
                 now.remake_stale - was.remake_stale, now.remake_written - was.remake_written,
                 now.copied_lasting - was.copied_lasting, now.copied_unmade - was.copied_unmade,
                 now.copied_lost - was.copied_lost);
    if (now.remake_written || now.copied_lost) {
      const std::string top = residency_->rc_top_writers(5);
      if (!top.empty())
        log().info("step {}: recompute: copied back, not made again, by the last write since their producer (so far): {}", step, top);
    }
  }
  const bool moved = now.bytes_out != was.bytes_out || now.bytes_in != was.bytes_in;
  last_step_cap_ = now;
  const HostStore::Stats host = residency_->host_stats();
  if (!said_host_making_)
    if (const std::string note = host_making_note(step, wall_ns, host, last_step_host_); !note.empty()) {
      said_host_making_ = true;
      log().info("{}", note);
    }
  last_step_host_ = host;
  // From the first step found on, the host memory the next steps' evictions may need is made
  // ahead by the worker: in steady steps the bytes on the host still grow by up to a GiB or two,
  // pinned otherwise on the training thread (docs/results.md, "Host memory made ahead").
  if (settings_.host_ahead)
    host_reserve_.store(settings_.host_ahead == Settings::kHostAheadAuto
                            ? std::max<uint64_t>(host.peak_in_use / 16, 256ull << 20)
                            : settings_.host_ahead,
                        std::memory_order_relaxed);
  // A step past the first few that moved bytes and took over 1.1x its GPU time: the link is the
  // bound, and checkpointing the layers may be faster (the planner's estimate, docs/design.md),
  // from the kernels' own times: this step's timeline holds its stalls, checkpointing's would not.
  if (said_checkpointing_ || !moved || capped_steps_logged_ < 3 || !link_bound(wall_ns, t.gpu_busy_ns)) return;
  said_checkpointing_ = true;
  if (const CheckpointEstimate c = estimate_checkpointing(t, 1.0, /*gpu_work_only=*/true); c.known)
    log().info("step {} took {:.1f} ms under the budget for {:.1f} ms of GPU work: the link is the bound. Checkpointing "
               "the model's {} layers would take about {:.1f} ms a step and need at least {:.2f} GiB (budget {:.2f} GiB)",
               step, wall_ns / 1e6, t.gpu_busy_ns / 1e6, c.layers, c.step_ns / 1e6, c.footprint / kGiB,
               residency_->budget() / kGiB);
}

}  // namespace offload

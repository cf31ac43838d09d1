#include "residency/replay_cap.h"

#include <algorithm>
#include <memory>

#include "core/alloc_table.h"
#include "core/sim_driver.h"

namespace offload {
namespace {

// The residency manager behind the replay's hooks, as Runtime::place_capped, release_capped,
// the worker and the step-end hook drive it.
class CapGate final : public ReplayCap {
 public:
  CapGate(const Residency::Options& ro, const HostStore::Options& ho, CapReplay* out) : ro_(ro), ho_(ho), out_(out) {}

  LaunchGate* attach(SimDriver& d, uint64_t, const AllocTable& allocs) override {
    drv_ = &d;
    host_ = std::make_unique<HostStore>(d, ho_);
    res_ = std::make_unique<Residency>(d, *host_, ro_);
    res_->set_finder(find_alloc, const_cast<AllocTable*>(&allocs), alloc_horizon);
    return res_.get();
  }
  DevPtr alloc(uint64_t bytes, Stream s, uint64_t* tag, bool* refused) override {
    // Under min_bytes: the allocator's pool serves it once its share of the budget holds it.
    if (bytes < res_->min_bytes()) {
      if (!res_->admit_small(bytes)) {
        *refused = true;
        return 0;
      }
      return 0;
    }
    const DevPtr p = res_->alloc(bytes, s, tag, refused);
    sample();
    return p;
  }
  void pooled(DevPtr p, uint64_t bytes) override {
    res_->small_allocated(bytes, p);
    sample();
  }
  bool free(DevPtr p, Stream s, uint64_t bytes, AllocId id) override {
    if (res_->free(p, s)) return true;
    res_->small_freed(bytes, p);
    res_->forget_table(id, s);  // as the shim does: a pointer table, or a small allocation a producer read
    return false;
  }
  bool refused_launch() override { return Residency::take_refusal(); }
  void after_launch() override {
    res_->after_launch();
    sample();
  }
  void poll() override { res_->poll(); }
  // As Runtime's step hook: two steps of the same length in a row give the period.
  void step_seen(size_t launches) override {
    if (launches && launches == last_launches_) res_->set_period(launches);
    last_launches_ = launches;
  }
  void begin_step() override {
    at_start_ = res_->stats();
    step_ = CapReplayStep{};
    sample();
  }
  void end_step() override {
    const Residency::Stats s = res_->stats();
    step_.evictions = s.evictions - at_start_.evictions;
    step_.reloads = s.reloads - at_start_.reloads;
    step_.prefetches = s.prefetches - at_start_.prefetches;
    step_.prefetch_hits = s.prefetch_hits - at_start_.prefetch_hits;
    step_.maps = s.maps - at_start_.maps;
    step_.unmaps = s.unmaps - at_start_.unmaps;
    step_.created = s.created - at_start_.created;
    step_.created_bytes = s.created_bytes - at_start_.created_bytes;
    step_.released = s.released - at_start_.released;
    step_.waits = s.waits - at_start_.waits;
    step_.taken_back = s.taken_back - at_start_.taken_back;
    step_.prefetch_wasted = s.prefetch_wasted - at_start_.prefetch_wasted;
    step_.bytes_out = s.bytes_out - at_start_.bytes_out;
    step_.bytes_in = s.bytes_in - at_start_.bytes_in;
    const HostStore::Stats h = res_->host_stats();
    step_.host_mapped = h.mapped;
    step_.host_peak = h.peak_in_use;
    out_->steps.push_back(step_);
  }
  void detach() override {
    res_->poll();
    out_->stats = res_->stats();
    out_->host = res_->host_stats();
    out_->refusal = res_->error();
    res_.reset();
    host_.reset();
    out_->physical_peak = drv_->vmm_stats().physical_peak;
  }

 private:
  // Held bytes change only inside the manager's calls: a look after each is the step's peak.
  void sample() {
    const Residency::Stats s = res_->stats();
    step_.held_peak = std::max(step_.held_peak, s.held);
    step_.footprint_peak = std::max(step_.footprint_peak, s.held + std::max(s.pool_share, s.pool_reserved));
  }

  Residency::Options ro_;
  HostStore::Options ho_;
  CapReplay* out_;
  SimDriver* drv_ = nullptr;
  std::unique_ptr<HostStore> host_;
  std::unique_ptr<Residency> res_;
  Residency::Stats at_start_;
  CapReplayStep step_;
  size_t last_launches_ = 0;
};

// The GPU's sizes scaled by the divisor, in whole granules (pages at least).
uint64_t scaled(uint64_t bytes, uint64_t div, uint64_t unit) { return std::max(unit, round_up(bytes / div, unit)); }

}  // namespace

CapReplay replay_under_cap(const StepTrace& rec, const CapReplayOptions& o) {
  CapReplay out;
  const uint64_t div = std::max<uint32_t>(o.size_divisor, 1);
  out.divisor = static_cast<uint32_t>(div);
  out.granularity = scaled(2u << 20, div, 4096);  // as the replay scales it
  // OFFLOAD_CAP_PIECE (policy.piece_max, the GPU's size; 0: one handle per range) scaled too.
  out.piece_max = o.policy.piece_max ? scaled(o.policy.piece_max, div, out.granularity) : 0;
  out.recorded_peak = peak_live_bytes(scale_step(rec, out.divisor));
  out.budget = static_cast<uint64_t>(o.budget_fraction * static_cast<double>(out.recorded_peak));

  Residency::Options ro = o.policy;
  ro.budget = out.budget;
  // OFFLOAD_CAP_MIN (policy.min_bytes, the GPU's size) scaled as the sizes are.
  ro.min_bytes = o.policy.min_bytes ? scaled(o.policy.min_bytes, div, out.granularity) : out.granularity;
  ro.piece_max = out.piece_max;
  ro.whole_max = o.policy.whole_max ? scaled(o.policy.whole_max, div, out.granularity) : 0;
  ro.whole_measured = false;  // the simulated driver's costs are not the GPU's
  ro.pool_floor = 0;  // the replay's pool is counted by its live bytes (admit_small), not modelled
  ro.pool_step = 0;
  ro.fault = o.fault;
  HostStore::Options ho;
  ho.chunk_bytes = out.host_chunk = scaled(256ull << 20, div, 4096);
  ho.pin_piece = scaled(1ull << 30, div, 4096);
  ho.limit = 2 * out.recorded_peak + 2 * ho.chunk_bytes;  // room for everything out at once
  CapGate gate(ro, ho, &out);

  ReplayOptions ropt;
  ropt.repeats = o.repeats;
  ropt.mark_steps = true;
  ropt.budget_fraction = o.budget_fraction;
  ropt.size_divisor = out.divisor;
  ropt.seed = o.seed;
  ropt.cap = &gate;
  ropt.relaunch = ro.recompute;  // kernels the manager can launch again
  const ReplayResult r = replay(rec, ropt);
  out.vmm_misuses = r.offload.vmm_misuses;
  out.launches_verified = r.offload.launches_verified;
  out.words_checked = r.offload.words_checked;
  out.mismatches = r.offload.mismatches;
  out.first_mismatch = r.offload.first_mismatch;
  out.matching_steps = r.matching_steps;
  out.steps_replayed = r.steps.size();
  for (size_t i = 0; i < out.steps.size() && i < r.offload.steps.size(); ++i)
    out.steps[i].device_peak = r.offload.steps[i].footprint_peak;
  if (r.stopped && out.refusal.empty()) out.refusal = "a launch or an allocation was refused";
  return out;
}

}  // namespace offload

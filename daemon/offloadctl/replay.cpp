// offloadctl replay: a recorded step through the shim's pipeline on the simulated driver, with
// --offload under the plan of arenas, with --cap under the residency manager.
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/json_writer.h"
#include "core/replay.h"
#include "core/tracker.h"
#include "offloadctl/trace_file.h"
#include "planner/planner.h"
#include "planner/step_trace.h"
#include "residency/replay_cap.h"

using namespace offload;

namespace {

// One replay of the recording through the observing pipeline.
struct ObserveRun {
  bool marked = false;  // step boundaries from offload_mark_step(), else detected
  ReplayResult r;
  bool ok = false;
};

// Offload mode: the executor on the simulated driver, every launch's data checked.
struct OffloadRun {
  ReplayOptions o;
  ReplayResult r;
  bool gpu_times = false;  // the GPU-time planner (else the built-in plan)
};

// Everything `replay` found, printed as text or as JSON.
struct Replayed {
  std::string path;
  StepTrace rec;
  ActivationReport act;
  int repeats = 0;
  std::vector<ObserveRun> runs;
  std::optional<OffloadRun> offload;
};

// The offload run's verdicts; ok() is the exit status's.
struct OffloadVerdict {
  bool installed = false, steady = false, within = false, vmm_ok = false, content_ok = false;
  bool ok() const { return installed && steady && within && vmm_ok && content_ok; }
};

OffloadVerdict verdict_of(const ReplayOffload& ro) {
  OffloadVerdict v;
  v.installed = ro.installed;
  v.steady = ro.steady_steps > 0;
  v.within = v.steady && ro.steady_footprint <= ro.budget;
  v.vmm_ok = ro.vmm_misuses == 0;
  v.content_ok = ro.mismatches == 0;
  return v;
}

bool replayed_ok(const Replayed& rp) {
  for (const ObserveRun& run : rp.runs)
    if (!run.ok) return false;
  return !rp.offload || verdict_of(rp.offload->r.offload).ok();
}

Replayed run_replay(const std::string& path, StepTrace rec, int steps, double fraction, uint32_t divisor) {
  Replayed rp;
  rp.path = path;
  rp.rec = std::move(rec);
  rp.act = analyse_activations(rp.rec);
  rp.repeats = steps ? steps : 6;
  for (bool marked : {true, false}) {
    ReplayOptions ro;
    ro.repeats = rp.repeats;
    ro.mark_steps = marked;
    ObserveRun run{marked, replay(rp.rec, ro), false};
    if (marked)
      run.ok = run.r.matching_steps + 1 >= run.r.steps.size() && run.r.matching_steps >= static_cast<size_t>(rp.repeats) - 1;
    else
      run.ok = run.r.period == rp.rec.launches.size();
    rp.runs.push_back(std::move(run));
  }
  if (fraction > 0) {
    // The planner when the recording has GPU times, as in the shim (OFFLOAD_PLANNER=builtin: the
    // built-in plan).
    const char* planner = getenv("OFFLOAD_PLANNER");
    OffloadRun off;
    off.gpu_times = gpu_timeline(rp.rec).measured >= 0.5 && !(planner && std::string(planner) == "builtin");
    off.o.repeats = steps ? steps : 12;
    off.o.mark_steps = true;
    off.o.offload = true;
    off.o.budget_fraction = fraction;
    off.o.size_divisor = divisor;
    if (off.gpu_times) off.o.planner = plan_scaled;
    off.r = replay(rp.rec, off.o);
    rp.offload = std::move(off);
  }
  return rp;
}

void print_offload_steps(const ReplayOffload& ro) {
  auto rescaled = [&](uint64_t scaled) { return gib(scaled) * ro.divisor; };
  printf("\n  %4s %6s %9s %7s %6s %5s %9s %17s %17s\n", "step", "plan", "evictions", "reloads", "misses", "late",
         "abandoned", "footprint GiB", "executor GiB");
  for (size_t i = 0; i < ro.steps.size(); ++i) {
    const ReplayOffloadStep& s = ro.steps[i];
    const char* phase = !s.active ? "-" : static_cast<int>(i) == ro.first_active ? "first" : "steady";
    char dev[32] = "-";
    if (s.active) snprintf(dev, sizeof dev, "%.2f", rescaled(s.device_peak));
    printf("  %4zu %6s %9llu %7llu %6llu %5llu %9llu %17.2f %17s\n", i, phase,
           static_cast<unsigned long long>(s.evictions), static_cast<unsigned long long>(s.reloads),
           static_cast<unsigned long long>(s.misses), static_cast<unsigned long long>(s.late_reloads),
           static_cast<unsigned long long>(s.abandoned), rescaled(s.footprint_peak), dev);
  }
  printf("  (footprint: live allocations outside arenas + physical handles the simulated driver holds, its\n"
         "  peak in the step; executor: its own reckoning, ExecutorStats::device_peak; both rescaled)\n");
}

void print_executor_stats(const ReplayOffload& ro) {
  auto rescaled = [&](uint64_t scaled) { return gib(scaled) * ro.divisor; };
  const ExecutorStats& st = ro.stats;
  printf("  executor: %llu evictions (%llu abandoned), %llu reloads, %llu misses, %llu late; %.2f GiB out, %.2f GiB\n"
         "  in; handles %llu created, %llu over budget, %llu budget waits; %llu placed, %llu served by the\n"
         "  allocator (arena busy %llu, no handle %llu); %llu deviations, %llu copy failures\n",
         static_cast<unsigned long long>(st.evictions), static_cast<unsigned long long>(st.evictions_abandoned),
         static_cast<unsigned long long>(st.reloads), static_cast<unsigned long long>(st.misses),
         static_cast<unsigned long long>(st.late_reloads), rescaled(st.bytes_out), rescaled(st.bytes_in),
         static_cast<unsigned long long>(st.handles_created), static_cast<unsigned long long>(st.over_budget),
         static_cast<unsigned long long>(st.budget_waits), static_cast<unsigned long long>(st.placed),
         static_cast<unsigned long long>(st.arena_busy + st.no_handle),
         static_cast<unsigned long long>(st.arena_busy), static_cast<unsigned long long>(st.no_handle),
         static_cast<unsigned long long>(st.deviations), static_cast<unsigned long long>(st.copy_failures));
  if (st.gate_calls) {
    // Host time in the executor's launch gate, waits for the budget apart (simulated driver:
    // its calls are cheap, so this is the gate's own bookkeeping).
    double ns = ns_per_tsc_cycle();
    printf("  executor gate: %.0f ns per launch (waits apart); %.1f ms waiting for the budget in all\n",
           static_cast<double>(st.gate_cycles - st.gate_wait_cycles) * ns / static_cast<double>(st.gate_calls),
           static_cast<double>(st.wait_cycles) * ns / 1e6);
  }
}

void print_offload(const OffloadRun& off) {
  const ReplayOffload& ro = off.r.offload;
  const double d = ro.divisor;
  auto rescaled = [&](uint64_t scaled) { return gib(scaled) * d; };
  auto mib = [](uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024); };
  const OffloadVerdict v = verdict_of(ro);
  printf("\noffload: the executor on the simulated driver, %d steps, budget %.2f of the step's peak\n", off.o.repeats,
         off.o.budget_fraction);
  printf("  sizes / %u, VMM granularity %llu KiB; host memory pinned in chunks of %.1f KiB (copies split at\n"
         "  the chunk boundaries); the simulated GPU runs 0-%u ops after each launch, in a seeded random\n"
         "  order (seed %llu), copies only when nothing else can run\n",
         ro.divisor, static_cast<unsigned long long>(ro.granularity >> 10), static_cast<double>(ro.host_chunk) / 1024,
         off.o.gpu_ops_max, static_cast<unsigned long long>(off.o.seed));
  printf("  budget %.2f GiB of a %.2f GiB peak (scaled: %.1f of %.1f MiB)\n", rescaled(ro.budget),
         rescaled(ro.recorded_peak), mib(ro.budget), mib(ro.recorded_peak));
  printf("  planner: %s\n", off.gpu_times ? "GPU time (the recorded kernel times; the link scaled like the bytes)" : "built-in");
  printf("  plan (scaled bytes): %s\n", ro.plan.c_str());
  if (!v.installed) {
    printf("  FAIL: no plan was installed\n");
    return;
  }
  printf("  plan, rescaled: %u arenas, %u handles of %.0f MiB, %.2f GiB moved each way per step, predicted peak\n"
         "  %.2f GiB (%s)\n",
         ro.arenas, ro.handles, mib(ro.handle_bytes) * d, rescaled(ro.moved_per_step), rescaled(ro.predicted_peak),
         ro.meets_budget ? "meets the budget" : "does NOT meet the budget");
  print_offload_steps(ro);
  if (!v.steady) {
    printf("\n  FAIL: the plan never reached a steady step (more --steps?)\n");
  } else {
    printf("\n  steady state (%zu steps): footprint peak %.2f GiB (scaled %.1f MiB) vs budget %.2f GiB: %s;\n"
           "  executor device peak %.2f GiB, predicted %.2f GiB; misses %llu%s\n",
           ro.steady_steps, rescaled(ro.steady_footprint), mib(ro.steady_footprint), rescaled(ro.budget),
           v.within ? "within" : "OVER THE BUDGET  <-- FAIL", rescaled(ro.steady_device_peak),
           rescaled(ro.predicted_peak), static_cast<unsigned long long>(ro.steady_misses),
           ro.steady_misses ? "  <-- demand reloads" : "");
  }
  print_executor_stats(ro);
  if (!v.vmm_ok)
    printf("  FAIL: %llu misuses of the VMM API (simulated driver)\n", static_cast<unsigned long long>(ro.vmm_misuses));
  printf("  re-recorded steps identical to the (scaled) recording: %zu of %zu\n", off.r.matching_steps,
         off.r.steps.size());
  printf("  content checks: %llu launches verified (%llu words), %llu mismatches%s\n",
         static_cast<unsigned long long>(ro.launches_verified), static_cast<unsigned long long>(ro.words_checked),
         static_cast<unsigned long long>(ro.mismatches), ro.mismatches ? "  <-- FAIL" : "");
  if (!v.content_ok) printf("  first mismatch: %s\n", ro.first_mismatch.c_str());
}

void print_text(const Replayed& rp) {
  const StepTrace& rec = rp.rec;
  printf("recorded step %llu of %s: %zu launches (%zu kernels, %zu distinct), %zu allocations, "
         "%zu activations (%.2f GiB)\n",
         static_cast<unsigned long long>(rec.step), rp.path.c_str(), rec.launches.size(), rec.kernel_launches(),
         rec.kernels.size(), rec.allocs.size(), rp.act.activations, gib(rp.act.activation_bytes));
  for (const ObserveRun& run : rp.runs) {
    const ReplayResult& r = run.r;
    printf("\nreplay, %d steps, step boundaries from %s:\n", rp.repeats,
           run.marked ? "offload_mark_step()" : "automatic detection");
    printf("  tracker time per launch: %.0f ns\n", r.hook_ns_mean);
    printf("  steps cut: %zu; launches per step:", r.steps.size());
    for (const StepTrace& t : r.steps) printf(" %zu", t.launches.size());
    printf("\n");
    if (run.marked) {
      printf("  re-recorded steps identical to the recording (allocations, launches, accesses): %zu of %zu%s\n",
             r.matching_steps, r.steps.size(),
             run.ok ? (r.matching_steps < r.steps.size() ? " (the first also holds the set-up allocations)" : "")
                    : "  <-- MISMATCH");
      if (!run.ok && !r.first_mismatch.empty()) printf("  first difference: %s\n", r.first_mismatch.c_str());
    } else {
      printf("  detector period: %zu launches (recorded step: %zu)%s\n", r.period, rec.launches.size(),
             run.ok ? "" : "  <-- MISMATCH");
    }
  }
  printf("\nactivations without an access after the forward: %zu\n", rp.act.without_backward_access.size());
  if (rp.offload) print_offload(*rp.offload);
}

// Scaled bytes as the recording's bytes.
uint64_t unscaled(const ReplayOffload& ro, uint64_t scaled) { return scaled * ro.divisor; }

void offload_json(JsonWriter& w, const OffloadRun& off) {
  const ReplayOffload& ro = off.r.offload;
  const OffloadVerdict v = verdict_of(ro);
  w.object("offload").field("ok", v.ok()).field("steps", off.o.repeats).field("budget_fraction", off.o.budget_fraction)
      .field("size_divisor", ro.divisor).field("granularity", ro.granularity).field("host_chunk", ro.host_chunk)
      .field("gpu_ops_max", off.o.gpu_ops_max).field("seed", off.o.seed)
      .field("budget_bytes", unscaled(ro, ro.budget)).field("recorded_peak_bytes", unscaled(ro, ro.recorded_peak))
      .field("planner", off.gpu_times ? "gpu_time" : "builtin").field("plan", ro.plan).field("installed", ro.installed);
  if (ro.installed) {
    w.field("arenas", ro.arenas).field("handles", ro.handles).field("handle_bytes", unscaled(ro, ro.handle_bytes))
        .field("moved_per_step_bytes", unscaled(ro, ro.moved_per_step))
        .field("predicted_peak_bytes", unscaled(ro, ro.predicted_peak)).field("meets_budget", ro.meets_budget);
    w.array("per_step");
    for (size_t i = 0; i < ro.steps.size(); ++i) {
      const ReplayOffloadStep& s = ro.steps[i];
      w.object().field("step", i).field("plan", !s.active ? "-" : static_cast<int>(i) == ro.first_active ? "first" : "steady")
          .field("evictions", s.evictions).field("reloads", s.reloads).field("misses", s.misses)
          .field("late", s.late_reloads).field("abandoned", s.abandoned)
          .field("footprint_peak_bytes", unscaled(ro, s.footprint_peak));
      if (s.active) w.field("executor_peak_bytes", unscaled(ro, s.device_peak));
      else w.key("executor_peak_bytes").null();
      w.end();
    }
    w.end();
    if (v.steady)
      w.object("steady").field("steps", ro.steady_steps).field("footprint_peak_bytes", unscaled(ro, ro.steady_footprint))
          .field("within_budget", v.within).field("executor_peak_bytes", unscaled(ro, ro.steady_device_peak))
          .field("misses", ro.steady_misses).end();
    else
      w.key("steady").null();
    const ExecutorStats& st = ro.stats;
    w.object("executor").field("evictions", st.evictions).field("evictions_abandoned", st.evictions_abandoned)
        .field("reloads", st.reloads).field("misses", st.misses).field("late_reloads", st.late_reloads)
        .field("bytes_out", unscaled(ro, st.bytes_out)).field("bytes_in", unscaled(ro, st.bytes_in))
        .field("handles_created", st.handles_created).field("over_budget", st.over_budget)
        .field("budget_waits", st.budget_waits).field("placed", st.placed)
        .field("served_by_allocator", st.arena_busy + st.no_handle).field("arena_busy", st.arena_busy)
        .field("no_handle", st.no_handle).field("deviations", st.deviations).field("copy_failures", st.copy_failures);
    if (st.gate_calls) {
      const double ns = ns_per_tsc_cycle();
      w.field("gate_ns_per_launch",
              static_cast<double>(st.gate_cycles - st.gate_wait_cycles) * ns / static_cast<double>(st.gate_calls))
          .field("budget_wait_ms", static_cast<double>(st.wait_cycles) * ns / 1e6);
    }
    w.end().field("vmm_misuses", ro.vmm_misuses).field("matching_steps", off.r.matching_steps)
        .field("steps_replayed", off.r.steps.size()).field("launches_verified", ro.launches_verified)
        .field("words_checked", ro.words_checked).field("mismatches", ro.mismatches);
    if (ro.mismatches) w.field("first_mismatch", ro.first_mismatch);
    else w.key("first_mismatch").null();
  }
  w.end();
}

void print_json(const Replayed& rp) {
  const StepTrace& rec = rp.rec;
  JsonWriter w;
  w.object().field("version", 1).field("ok", replayed_ok(rp)).field("file", rp.path);
  w.object("recorded").field("step", rec.step).field("launches", rec.launches.size())
      .field("kernels", rec.kernel_launches()).field("distinct_kernels", rec.kernels.size())
      .field("allocations", rec.allocs.size()).field("activations", rp.act.activations)
      .field("activation_bytes", rp.act.activation_bytes)
      .field("activations_without_backward_access", rp.act.without_backward_access.size()).end();
  w.array("replays");
  for (const ObserveRun& run : rp.runs) {
    const ReplayResult& r = run.r;
    w.object().field("boundaries", run.marked ? "marked" : "detected").field("ok", run.ok).field("steps", rp.repeats)
        .field("tracker_ns_per_launch", r.hook_ns_mean).field("steps_cut", r.steps.size()).array("launches_per_step");
    for (const StepTrace& t : r.steps) w.value(t.launches.size());
    w.end();
    if (run.marked) {
      w.field("matching_steps", r.matching_steps);
      if (!run.ok && !r.first_mismatch.empty()) w.field("first_difference", r.first_mismatch);
      else w.key("first_difference").null();
    } else {
      w.field("detector_period", r.period);
    }
    w.end();
  }
  w.end();
  if (rp.offload) offload_json(w, *rp.offload);
  else w.key("offload").null();
  w.end();
  printf("%s\n", w.str().c_str());
}

// --cap: a recorded step under the residency manager's budget on the simulated driver, every
// launch's data checked (residency/replay_cap.h).
void print_steps(const CapReplay& c) {
  printf("\n  %4s %11s %11s %11s %9s %7s %10s %6s %6s %6s %7s %8s %5s\n", "step", "held MiB", "footprint",
         "device MiB", "evictions", "reloads", "prefetches", "(hits)", "maps", "unmaps", "created", "released",
         "waits");
  for (size_t i = 0; i < c.steps.size(); ++i) {
    const CapReplayStep& s = c.steps[i];
    printf("  %4zu %11.2f %11.2f %11.2f %9llu %7llu %10llu %6llu %6llu %6llu %7llu %8llu %5llu\n", i, mib(s.held_peak),
           mib(s.footprint_peak), mib(s.device_peak), ull(s.evictions), ull(s.reloads), ull(s.prefetches),
           ull(s.prefetch_hits), ull(s.maps), ull(s.unmaps), ull(s.created), ull(s.released), ull(s.waits));
  }
  printf("  (scaled MiB, each the step's highest: held, the manager's handles; footprint, held + the pool's\n"
         "  share; device, the simulated driver's handles + the pool's live bytes; reloads on demand)\n");
}

void print_text(const std::string& path, const StepTrace& rec, const CapReplayOptions& o, const CapReplay& c) {
  const Residency::Stats& st = c.stats;
  printf("recorded step %llu of %s: %zu launches, %zu allocations\n", ull(rec.step), path.c_str(),
         rec.launches.size(), rec.allocs.size());
  printf("\ncap: the residency manager on the simulated driver, %d steps, budget %.2f of the step's peak\n",
         o.repeats, o.budget_fraction);
  printf("  sizes / %u: granularity %llu KiB (ranges from it up), pieces of at most %.2f MiB, host chunks of\n"
         "  %.2f MiB; budget %.2f MiB of a %.2f MiB peak (rescaled: %.2f of %.2f GiB)\n",
         c.divisor, ull(c.granularity >> 10), mib(c.piece_max), mib(c.host_chunk), mib(c.budget),
         mib(c.recorded_peak), gib(c.budget) * c.divisor, gib(c.recorded_peak) * c.divisor);
  print_steps(c);
  printf("\n  held peak %.2f MiB, footprint peak %.2f MiB vs budget %.2f MiB: %s; simulated driver's physical\n"
         "  peak %.2f MiB\n",
         mib(st.held_peak), mib(st.footprint_peak), mib(c.budget), c.within() ? "within" : "OVER THE BUDGET  <-- FAIL",
         mib(c.physical_peak));
  printf("  totals: %llu evictions (%llu ahead, %llu abandoned), %llu reloads on demand, %llu prefetches (%llu\n"
         "  used, %llu evicted unused); %llu maps, %llu unmaps; handles %llu created, %llu released; %llu host\n"
         "  waits; host store peak %.2f MiB\n",
         ull(st.evictions), ull(st.ahead), ull(st.abandoned), ull(st.reloads), ull(st.prefetches),
         ull(st.prefetch_hits), ull(st.prefetch_wasted), ull(st.maps), ull(st.unmaps), ull(st.created),
         ull(st.released), ull(st.waits), mib(c.host.peak_in_use));
  if (c.vmm_misuses) printf("  FAIL: %llu misuses of the VMM API (simulated driver)\n", ull(c.vmm_misuses));
  printf("  re-recorded steps identical to the (scaled) recording: %zu of %zu\n", c.matching_steps, c.steps_replayed);
  printf("  content checks: %llu launches verified (%llu words), %llu mismatches%s\n", ull(c.launches_verified),
         ull(c.words_checked), ull(c.mismatches), c.mismatches ? "  <-- FAIL" : "");
  if (c.mismatches) printf("  first mismatch: %s\n", c.first_mismatch.c_str());
  if (!c.refusal.empty()) printf("  FAIL: refused: %s\n", c.refusal.c_str());
}

void print_json(const std::string& path, const StepTrace& rec, const CapReplayOptions& o, const CapReplay& c) {
  const Residency::Stats& st = c.stats;
  auto unscaled = [&](uint64_t b) { return b * c.divisor; };  // the recording's bytes, as offload mode writes
  JsonWriter w;
  w.object().field("version", 1).field("ok", c.ok()).field("file", path);
  w.object("recorded").field("step", rec.step).field("launches", rec.launches.size())
      .field("allocations", rec.allocs.size()).end();
  w.object("cap").field("ok", c.ok()).field("steps", o.repeats).field("budget_fraction", o.budget_fraction)
      .field("size_divisor", c.divisor).field("granularity", c.granularity).field("piece_max", c.piece_max)
      .field("host_chunk", c.host_chunk).field("budget_bytes", unscaled(c.budget))
      .field("recorded_peak_bytes", unscaled(c.recorded_peak));
  w.array("per_step");
  for (size_t i = 0; i < c.steps.size(); ++i) {
    const CapReplayStep& s = c.steps[i];
    w.object().field("step", i).field("held_peak_bytes", unscaled(s.held_peak))
        .field("footprint_peak_bytes", unscaled(s.footprint_peak)).field("device_peak_bytes", unscaled(s.device_peak))
        .field("evictions", s.evictions).field("reloads", s.reloads).field("prefetches", s.prefetches)
        .field("prefetch_hits", s.prefetch_hits).field("maps", s.maps).field("unmaps", s.unmaps)
        .field("created", s.created).field("created_bytes", unscaled(s.created_bytes)).field("released", s.released)
        .field("bytes_out", unscaled(s.bytes_out)).field("bytes_in", unscaled(s.bytes_in))
        .field("waits", s.waits).field("taken_back", s.taken_back).field("prefetch_wasted", s.prefetch_wasted)
        .field("host_mapped_bytes", unscaled(s.host_mapped))
        .field("host_peak_bytes", unscaled(s.host_peak)).end();
  }
  w.end();
  w.field("held_peak_bytes", unscaled(st.held_peak)).field("footprint_peak_bytes", unscaled(st.footprint_peak))
      .field("physical_peak_bytes", unscaled(c.physical_peak)).field("within_budget", c.within());
  w.object("residency").field("evictions", st.evictions).field("ahead", st.ahead).field("abandoned", st.abandoned)
      .field("reloads", st.reloads).field("prefetches", st.prefetches).field("prefetch_hits", st.prefetch_hits)
      .field("prefetch_wasted", st.prefetch_wasted).field("maps", st.maps).field("unmaps", st.unmaps)
      .field("created", st.created).field("released", st.released).field("waits", st.waits)
      .field("waits_room", st.waits_room).field("waits_release", st.waits_release)
      .field("waits_abandon", st.waits_abandon).field("taken_back", st.taken_back)
      .field("taken_back_ahead", st.taken_back_ahead).field("taken_back_near", st.taken_back_near)
      .field("freed_copying", st.freed_copying).field("freed_copying_given", st.freed_copying_given)
      .field("bytes_out", unscaled(st.bytes_out)).field("bytes_in", unscaled(st.bytes_in))
      .field("freed_out", st.freed_out).field("freed_out_bytes", unscaled(st.freed_out_bytes))
      .field("alloc_maps", st.alloc_maps).field("refits", st.refits).field("reused", st.reused).field("allocs", st.allocs)
      .field("pooled", st.pooled).field("pooled_bytes", unscaled(st.pooled_bytes)).field("pooled_long", st.pooled_long).field("pool_shrinks", st.pool_shrinks)
      .field("pool_share_bytes", unscaled(st.pool_share))
      .field("recomputed", st.recomputed).field("recomputed_bytes", unscaled(st.recomputed_bytes))
      .field("recompute_checks", st.recompute_checks).field("recompute_bans", st.recompute_bans)
      .field("dropped", st.dropped).field("dropped_bytes", unscaled(st.dropped_bytes))
      .field("restored_early", st.restored_early).field("probes", st.probes)
      .field("producers", st.producers).field("remake_away", st.remake_away).field("remake_stale", st.remake_stale)
      .field("remake_written", st.remake_written).field("copied_lasting", st.copied_lasting)
      .field("copied_unmade", st.copied_unmade).field("copied_lost", st.copied_lost)
      .field("not_producer_small", st.not_producer_small).field("not_producer_alone", st.not_producer_alone)
      .field("side_kept", st.side_kept).field("gate_grants", st.gate_grants)
      .field("prefetch_no_room", st.prefetch_no_room).field("ahead_ns", st.ahead_ns).field("busy_ns", st.busy_ns)
      .field("period", st.period).end();
  w.field("vmm_misuses", c.vmm_misuses).field("matching_steps", c.matching_steps)
      .field("steps_replayed", c.steps_replayed).field("launches_verified", c.launches_verified)
      .field("words_checked", c.words_checked).field("mismatches", c.mismatches);
  if (c.mismatches) w.field("first_mismatch", c.first_mismatch);
  else w.key("first_mismatch").null();
  if (!c.refusal.empty()) w.field("refusal", c.refusal);
  else w.key("refusal").null();
  w.end().end();
  printf("%s\n", w.str().c_str());
}

}  // namespace

int cmd_replay(const std::string& path, int steps, double offload_fraction, uint32_t divisor, bool json) {
  StepTrace rec;
  if (!load_step_trace(path, &rec)) return 1;
  const Replayed rp = run_replay(path, std::move(rec), steps, offload_fraction, divisor);
  if (json) print_json(rp);
  else print_text(rp);
  return replayed_ok(rp) ? 0 : 1;
}

int cmd_replay_cap(const std::string& path, int steps, double fraction, uint32_t divisor, bool json) {
  StepTrace rec;
  if (!load_step_trace(path, &rec)) return 1;
  CapReplayOptions o;
  // The manager's policy from the environment, as the shim reads it (OFFLOAD_CAP_TILE, _REFIT, ...).
  std::vector<std::string> errors;
  const Settings st = read_settings([](const char* n) { return std::getenv(n); }, &errors);
  for (const std::string& e : errors) fprintf(stderr, "offloadctl replay: %s\n", e.c_str());
  if (!errors.empty()) return 2;
  apply_cap_policy(st, &o.policy);
  o.policy.min_bytes = st.cap_min;  // scaled with the sizes by the replay
  o.repeats = steps ? steps : 6;
  o.budget_fraction = fraction;
  o.size_divisor = divisor;
  const CapReplay c = replay_under_cap(rec, o);
  if (json) print_json(path, rec, o, c);
  else print_text(path, rec, o, c);
  return c.ok() ? 0 : 1;
}

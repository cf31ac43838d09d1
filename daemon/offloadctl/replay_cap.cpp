// offloadctl replay --cap: a recorded step under the residency manager's budget on the
// simulated driver, every launch's data checked (residency/replay_cap.h).
#include <cstdio>
#include <string>

#include "common/json_writer.h"
#include "offloadctl/trace_file.h"
#include "planner/step_trace.h"
#include "residency/replay_cap.h"

using namespace offload;

namespace {

using ull = unsigned long long;

double gib(uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024 * 1024); }
double mib(uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024); }

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
        .field("created", s.created).field("released", s.released).field("waits", s.waits).end();
  }
  w.end();
  w.field("held_peak_bytes", unscaled(st.held_peak)).field("footprint_peak_bytes", unscaled(st.footprint_peak))
      .field("physical_peak_bytes", unscaled(c.physical_peak)).field("within_budget", c.within());
  w.object("residency").field("evictions", st.evictions).field("ahead", st.ahead).field("abandoned", st.abandoned)
      .field("reloads", st.reloads).field("prefetches", st.prefetches).field("prefetch_hits", st.prefetch_hits)
      .field("prefetch_wasted", st.prefetch_wasted).field("maps", st.maps).field("unmaps", st.unmaps)
      .field("created", st.created).field("released", st.released).field("waits", st.waits)
      .field("bytes_out", unscaled(st.bytes_out)).field("bytes_in", unscaled(st.bytes_in))
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

int cmd_replay_cap(const std::string& path, int steps, double fraction, uint32_t divisor, bool json) {
  StepTrace rec;
  if (!load_step_trace(path, &rec)) return 1;
  CapReplayOptions o;
  o.repeats = steps ? steps : 6;
  o.budget_fraction = fraction;
  o.size_divisor = divisor;
  const CapReplay c = replay_under_cap(rec, o);
  if (json) print_json(path, rec, o, c);
  else print_text(path, rec, o, c);
  return c.ok() ? 0 : 1;
}

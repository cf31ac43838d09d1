// OFFLOAD_* settings: parsed once at start, with a clear message for every bad value.
// docs/configuration.md lists the same variables; keep them in step.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace offload {

struct Settings {
  std::string trace_dir;         // OFFLOAD_TRACE: write per-step traces here ("" = off)
  uint32_t trace_steps = 12;     // OFFLOAD_TRACE_STEPS: how many steps to write
  bool trace_lead = false;       // OFFLOAD_TRACE_LEAD=1: each kernel's lead in the traces
  bool telemetry = true;         // OFFLOAD_TELEMETRY=cupti|sampled|off
  bool telemetry_sampled = false;  // OFFLOAD_TELEMETRY=sampled: traced only while needed (TelemetrySampler)
  std::string cupti_lib;         // OFFLOAD_CUPTI_LIB: path of libcupti.so ("" = search)
  std::string log_level = "info";// OFFLOAD_LOG_LEVEL=debug|info|warn|error|off
  bool log_level_set = false;     // OFFLOAD_LOG_LEVEL given
  // The level a process logs at: the one given, else info on a job's rank 0 (or outside a job,
  // rank < 0) and warn on its other ranks, so that a job of eight processes says each step once.
  std::string log_level_for(int rank) const { return log_level_set || rank <= 0 ? log_level : "warn"; }
  bool enabled = true;           // OFFLOAD_DISABLE=1: forward everything, track nothing
  std::string daemon = "auto";   // OFFLOAD_DAEMON=auto|connect|off
  std::string daemon_bin;        // OFFLOAD_DAEMON_BIN: offloadd to start ("" = search)
  uint64_t host_pool_bytes = 4ull << 30;  // OFFLOAD_HOST_POOL: pool of a started daemon / private pool
  bool host_pool_set = false;             // OFFLOAD_HOST_POOL was given
  // OFFLOAD_DEVICE_BUDGET: the device memory the step may use. Bytes ("40GiB"), or a fraction
  // of the GPU's memory ("0.5", "50%"). Unset: observe only, move nothing.
  uint64_t device_budget = 0;
  // OFFLOAD_PLANNER=auto|builtin: the GPU-time planner when the step has GPU times (auto), or
  // always the built-in plan (for comparisons).
  bool builtin_plan = false;
  bool pool_refine = true;       // OFFLOAD_POOL_REFINE=0: no plan made again for the allocator's measured factor
  // OFFLOAD_PERSISTENT_MIN: allocations of at least this size are served from ranges of their
  // own (core/persistent_pool.h), so that they can be moved out later; "off" or unset: none.
  uint64_t persistent_min = 0;
  // OFFLOAD_BLOCK_CACHE: freed blocks kept, by size, for the next allocation of that size on the
  // stream that freed them (core/block_cache.h), at most this many bytes; 0 / "off": none.
  uint64_t block_cache = 0;
  double device_budget_fraction = 0;
  // OFFLOAD_CAP=1|0: with a budget, the hard cap (residency/residency.h): every allocation of
  // at least OFFLOAD_CAP_MIN is ours from birth and the footprint never exceeds the budget
  // (1, the default); 0: the budget is met by a plan made after a traced step.
  bool cap = true;
  uint64_t cap_min = 0;     // OFFLOAD_CAP_MIN: 0 = the VMM granularity (2 MiB on the H200)
  // OFFLOAD_CAP_PIECE: the largest physical handle a range is backed by; 0 = one per range.
  uint64_t cap_piece = 64ull << 20;
  // OFFLOAD_CAP_WHOLE: ranges of at most this size are backed by one handle of their size, never
  // tiled from smaller spares, while handles are quick to make (Residency::Options::whole_max);
  // 0: any range may be tiled. On the H200 four small models' steps took 10-25% less (docs/results.md).
  uint64_t cap_whole = 32ull << 20;
  // OFFLOAD_CAP_EXTRA_PIECES: how many pieces more than the fewest that back it a range may map
  // from spare handles before the rest is made new; "any" (the default): no limit; "auto": as
  // many as making one handle costs in pieces' mappings and unmappings, from the run's own
  // averages (Residency::Options::extra_auto). With no limit a Llama's mappings a step grew
  // from 1,709 to 3,260 over 40 steps on the H200 while the handles it made fell, and its step
  // stayed flat; auto kept the mappings flat but made twice the handles, and on an almost full
  // device (handles at about 1 ms) its steps 21-40 were 5% slower (docs/results.md).
  static constexpr uint64_t kAnyPieces = 1ull << 20;
  static constexpr uint64_t kAutoPieces = kAnyPieces + 1;
  uint64_t cap_extra_pieces = kAnyPieces;
  // OFFLOAD_CAP_TILE=exact|any: spares back a range only where they tile it exactly, else whole
  // pieces and its tail's size (exact); or any spares, the remainder made new (any, the default).
  bool cap_tile_exact = false;
  bool cap_size_classes = false;  // OFFLOAD_CAP_TILE=class: exact, with tails rounded up to size classes
  // OFFLOAD_CAP_REFIT=1|0: a freed range of another size serves an allocation by its own address,
  // its mappings changed only where the sizes differ (1, the default).
  bool cap_refit = true;
  // OFFLOAD_CAP_EVICT_FIRST=1|0: when nothing else makes room without the host waiting, evict a
  // resident range whose handles can back the allocation (a copy out the GPU orders) before
  // releasing a spare whose last work still runs (a host wait). On the recorded steps it took a
  // third to a half of the waits off most workloads and moved 2-44% more bytes out; not measured
  // on the GPU, so off (docs/results.md).
  bool cap_evict_first = false;
  // OFFLOAD_CAP_AHEAD=N%|SIZE: device memory kept free by evicting ahead of need, a share of the
  // budget (12.5%, the default) or a size; 0 evicts only on need.
  double cap_ahead_share = 0.125;
  uint64_t cap_ahead_bytes = 0;  // a size given: this, not the share
  // OFFLOAD_CAP_KEEP_ASKED=1|0: freed ranges are let go for room by when the step asks for their
  // size again, furthest first; 0 (the default): the smallest first. Fewer mappings on the recorded
  // steps, 3.6% more on the H200's large Llama (docs/results.md), so off.
  bool cap_keep_asked = false;
  // OFFLOAD_CAP_POOL_SHORT=N: once the step's length is known, an allocation born where the step
  // before freed one of its size within N launches, never evicted, goes to the allocator's pool
  // (inside its share of the budget) instead of a range of its own; 0 (the default): none.
  uint32_t cap_pool_short = 0;
  double cap_pool_short_share = 0.25;  // OFFLOAD_CAP_POOL_SHORT_SHARE=N%: the pooled bytes live at once, at most
  bool cap_ahead_to_ceiling = false;  // OFFLOAD_CAP_AHEAD_HORIZON=ceiling
  bool cap_grant_apart = false;       // OFFLOAD_CAP_GRANT=apart
  uint64_t cap_gate = 0;              // OFFLOAD_CAP_GATE: a gated chunk's bytes; 0 off
  uint32_t cap_gate_ahead = 32;       // OFFLOAD_CAP_GATE_AHEAD: gated chunks queued before they widen
  // OFFLOAD_CAP_RECOMPUTE=1|0: a range that one launch produced from ranges still resident and
  // unchanged is made again by that launch instead of copied back in (its kernel's first remake
  // checked byte for byte against the saved copy). Off: not yet measured on a GPU.
  bool cap_recompute = false;
  // OFFLOAD_CAP_DROP_FIRST=N (1-1024): with recompute, a range that can be dropped is evicted as if
  // its next use were N times further (1, the default: by next use alone).
  uint32_t cap_drop_first = 1;
  // OFFLOAD_CAP_RECOMPUTE_PROBES=N (3-255): with recompute, the launches of one kernel probed for
  // what they write, at most (12, the default). A position a kernel points from that was seen
  // fewer than three times leaves its launches unlearned: they take all they touch as written.
  uint32_t cap_recompute_probes = 12;
  // OFFLOAD_CAP_RECOMPUTE_UPDATES=1|0: with recompute, a launch that writes a range another
  // launch made (an in-place update) becomes its producer, that launch run again before it (1);
  // or the range's producer is lost to the write (0, the default: not yet measured on a GPU).
  bool cap_recompute_updates = false;
  // OFFLOAD_CAP_PLAN=1|0: under the cap, a plan of arenas made from a traced step places the
  // step's activations (core/executor.h), its handles taken from the cap's own room, while the
  // residency manager keeps every other range (1); or the residency manager alone (0, the
  // default: on the H200 the plan, made from a paged step, was slower; docs/results.md).
  bool cap_plan = false;
  // OFFLOAD_CAP_PREFETCH_MAX: the most launches ahead of a predicted use that a range is reloaded;
  // 0 turns prefetching off. Default (unset): a quarter of the step.
  static constexpr uint64_t kQuarterStep = UINT64_MAX;
  uint64_t cap_prefetch_max = kQuarterStep;
  bool cap_prefetch_grow_unwasted = false;  // OFFLOAD_CAP_PREFETCH_GROW=unwasted (always: the default)
  bool cap_prefetch_nearest = false;        // OFFLOAD_CAP_PREFETCH_ORDER=nearest (slots: the default)
  bool cap_lru_victims = false;             // OFFLOAD_CAP_VICTIMS=lru (next-use: the default)
  bool cap_prefetch_hold = false;           // OFFLOAD_CAP_PREFETCH_HOLD=on
  bool cap_prefetch_room = true;            // OFFLOAD_CAP_PREFETCH_ROOM=on (off: =off)
  uint64_t host_limit = 0;  // OFFLOAD_HOST_LIMIT: host memory for evicted bytes; 0 = 3/4 of MemAvailable
  // OFFLOAD_HOST_AHEAD=auto|off|SIZE: under the cap, once steps are found, host memory for evicted
  // bytes kept made and pinned ahead of need by the shim's worker, off the training thread (auto:
  // a sixteenth of the most bytes held on the host at once); off (the default: on the H200 the
  // worker's making memory slowed the training thread about as much, docs/results.md): made
  // where an eviction needs it.
  static constexpr uint64_t kHostAheadAuto = UINT64_MAX;
  uint64_t host_ahead = 0;
  // OFFLOAD_HOST_PREMAKE=auto|off|SIZE: under the cap, host memory for evicted bytes faulted in by
  // a thread of the shim's own from the first allocation (residency/host_premade.h). auto (the default): as much as the budget and a
  // quarter of the host's available memory among the node's ranks, within OFFLOAD_HOST_LIMIT;
  // off: none, the first steps make it where evictions need it.
  static constexpr uint64_t kHostPremakeAuto = UINT64_MAX;
  uint64_t host_premake = kHostPremakeAuto;
  // OFFLOAD_HOST_PREMAKE_UNTIL=target|eviction: the making goes on to its target while steps
  // evict (the default: in one run each on an H100 the first step of a graph network, an LSTM
  // and a Llama that do not fit took 2.6/3.8, 2.2/2.9 and 1.9/2.2 s against stopping at the first
  // eviction; docs/results.md), or stops at the first eviction.
  bool host_premake_past_eviction = true;
  bool offload() const { return device_budget || device_budget_fraction > 0; }
  // OFFLOAD_OBSERVE=light|full. Full: every launch is scanned for the allocations it touches,
  // and steps are found and timed (CUPTI), as a budget and OFFLOAD_TRACE need. Light: launches
  // are only counted; allocations, frees and the footprint are still tracked. Unset: full with
  // a budget or OFFLOAD_TRACE, else light, so that watching costs next to nothing.
  std::string observe;
  bool observe_full() const { return observe == "full" || (observe.empty() && (offload() || !trace_dir.empty())); }
  // The budget in bytes on a device of `total` bytes (0: none).
  uint64_t budget_bytes(uint64_t total) const {
    return device_budget ? device_budget : static_cast<uint64_t>(device_budget_fraction * static_cast<double>(total));
  }
  // The bytes OFFLOAD_BLOCK_CACHE may keep under a budget of `budget` bytes (0: no budget): at
  // most half of it.
  uint64_t block_cache_under(uint64_t budget) const {
    return budget ? std::min(block_cache, budget / 2) : block_cache;
  }
  // What a plan of activations may fill of the budget: the budget less the blocks the cache may
  // keep, which stay in the device's pool outside every plan (planned to the whole budget, a
  // run with the cache passes it: docs/results.md). A weight
  // plan fills the whole budget: its pool watch counts the kept blocks (preload/plan_controller.cpp).
  uint64_t plan_budget_bytes(uint64_t total) const {
    const uint64_t b = budget_bytes(total);
    return b ? b - block_cache_under(b) : 0;
  }
};

// Parses a byte size: "1048576", "512MiB", "40GiB", "1.5GB", "64k". nullopt if malformed.
std::optional<uint64_t> parse_size(const std::string& s);

// A budget, as the shim, offload-run and offloadctl all read it: a size ("40GiB"); or a share of
// the GPU's memory ("50%", "50%gpu", "0.5"); or, where a recorded step is at hand (offloadctl
// plan), a share of the step's footprint without offload ("50%step"). A share is over 0 and at
// most 1. nullopt: none of these.
struct BudgetSpec {
  enum class Of { Bytes, Gpu, Step };
  Of of = Of::Bytes;
  uint64_t bytes = 0;
  double share = 0;
};
std::optional<BudgetSpec> parse_budget(const std::string& s);

// Reads the settings through `get` (getenv in production). Every malformed value adds a
// message naming the variable, the value and what is accepted.
Settings read_settings(const std::function<const char*(const char*)>& get,
                       std::vector<std::string>* errors);

// The OFFLOAD_* variables of `env` (an environ-style array, NULL-ended) that liboffload does
// not read, each as "NAME" or "NAME (did you mean KNOWN?)" when a known name is close: a typo
// such as OFFLOAD_BUDGET would otherwise be ignored in silence.
std::vector<std::string> unknown_settings(const char* const* env);

// A plain decimal in [lo, hi] (a rank from the environment); nullopt otherwise (empty, sign,
// spaces, overflow).
std::optional<int> env_int(const char* v, int lo, int hi);

}  // namespace offload

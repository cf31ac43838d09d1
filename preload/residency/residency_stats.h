// The residency manager's counters (Residency::Stats): what it moved, held, waited for and made
// again, as offload_stats_json, the first steps' log lines and budget_report.py give them.
#pragma once

#include <cstdint>

namespace offload {

struct ResidencyStats {
  uint64_t ranges = 0, live_bytes = 0;     // live ranges and their rounded bytes
  uint64_t allocs = 0, reused = 0, created = 0, released = 0;
  uint64_t created_bytes = 0;              // of the handles made (making costs about its size)
  uint64_t evictions = 0, abandoned = 0, bytes_out = 0;
  uint64_t reloads = 0, bytes_in = 0;      // demand reloads (page faults)
  uint64_t held = 0, held_peak = 0;        // physical bytes we hold
  uint64_t external = 0, external_peak = 0;  // held by another owner under the budget (DeviceRoom)
  uint64_t external_refused = 0;           // takes that found no room
  uint64_t pool_share = 0, pool_reserved = 0, pool_trims = 0;
  uint64_t pool_over = 0;                  // most the pool was seen holding above its share
  // Options::pool_short: allocations left to the pool as short lives, their bytes, and those of
  // them that lived longer than predicted (their place goes back to ranges).
  uint64_t pooled = 0, pooled_bytes = 0, pooled_long = 0;
  uint64_t pool_shrinks = 0;               // the share taken back down for a launch, a new range or room
  uint64_t footprint_peak = 0;             // held + the larger of the pool's share and holding, at its highest
  uint64_t refused_allocs = 0, refused_launches = 0, host_full = 0;
  uint64_t outside = 0;                    // device memory grown outside us since the first range
  uint64_t waits = 0;                      // host waits for a copy out or a free
  uint64_t wait_ns = 0;                    // the host's time in them
  // Of them, by what waited: making room (a copy out finished for its memory), releasing a spare
  // whose last work still ran (or unmapping where it was given from), a range copying out taken
  // back after its handles were given on; the rest (a pointer query's reload, a freed range
  // released) is waits less these.
  uint64_t waits_room = 0, wait_room_ns = 0;
  uint64_t waits_release = 0, wait_release_ns = 0;
  uint64_t waits_abandon = 0, wait_abandon_ns = 0;
  uint64_t busy_ns = 0;                    // the host's time in the hooks' calls here (waits included)
  uint64_t lock_ns = 0;                    // of it, waiting for the manager's lock (held by the worker's polls)
  uint64_t polls = 0, poll_ns = 0;         // the worker's polls (copies reaped, the pool trimmed) and its time in them
  // Of poll_ns: copies out and frees reaped, copies in and host slots asked about, the device's
  // used memory read, the pool trimmed, room made.
  uint64_t poll_reap_ns = 0, poll_query_ns = 0, poll_outside_ns = 0, poll_pool_ns = 0, poll_room_ns = 0;
  // The driver's virtual-memory calls: how many, and the host's time in them.
  uint64_t maps = 0, unmaps = 0, map_ns = 0, unmap_ns = 0, create_ns = 0, release_ns = 0;
  uint64_t alloc_maps = 0;                 // of the maps, those that back a new allocation (not a reload)
  uint64_t copy_ns = 0;                    // enqueuing the copies out and in
  uint64_t event_ns = 0;                   // in event queries, records, creations and stream waits (the worker's too)
  uint64_t refits = 0;                     // allocations served by a freed range of another size
  uint64_t ahead_ns = 0;                   // in the scans for prefetches and evictions ahead, at launches
  uint64_t handovers = 0;                  // ranges copying out whose handles were given to others
  uint64_t freed_given = 0;                // freed ranges whose handles were given before their free ended
  uint64_t event_waits = 0;                // launches ordered after another stream's reload
  uint64_t ahead = 0, ahead_bytes = 0;     // evictions started ahead of need
  uint64_t prefetches = 0, prefetch_bytes = 0, prefetch_hits = 0;  // reloads ahead of use, and used
  uint64_t prefetch_late = 0;              // used before their copy was known complete
  // Launches from a prefetch to its use, summed over the prefetches used and over the late ones;
  // and for the late ones, from the start of the copy out that put the range on the host to its
  // prefetch: a late one prefetched soon after it went out was evicted too near its use, which
  // no longer lead would help.
  uint64_t prefetch_hit_lead = 0, prefetch_late_lead = 0, prefetch_late_out = 0;
  uint64_t prefetch_wasted = 0;            // evicted again before their use
  uint64_t clean_out = 0, clean_out_bytes = 0;  // evictions with nothing to copy: unused prefetches, whose host copy was kept
  uint64_t clean_handovers = 0;                 // of them, handed on: the taker waits for the copy in alone
  // Ranges touched while copying out after their handles were handed on (the host waits for the
  // copy out, then brings them back); of them, evicted ahead of need, and predicted then to be
  // used within the prefetch lead.
  uint64_t taken_back = 0, taken_back_ahead = 0, taken_back_near = 0;
  // Over the ranges taken back, sums in launches: the next use predicted at their eviction, the
  // launches from their copy out's start to the take-back, and the prefetch lead and out_lag then.
  uint64_t taken_back_next = 0, taken_back_after = 0, taken_back_lead = 0, taken_back_lag = 0;
  uint64_t out_lag = 0;  // launches a copy out lately took to be found done (Residency::out_lag_)
  // Options::grant_apart: grants asked of the Granter, the streams' waits for them on the GPU, the
  // host's waits for them (before an unmapping or a captured launch) and their ns, and the
  // granter thread's ns in grants (not in busy_ns).
  uint64_t grants_apart = 0, grant_stream_waits = 0, grant_waits = 0, grant_wait_ns = 0, grant_ns = 0;
  // Options::copy_gate: grants made with the copies out held, the ns the gate was closed, and
  // the chunks queued behind it.
  uint64_t gate_grants = 0, gate_closed_ns = 0, gate_chunks = 0;
  // Ranges freed while copying out (the copy was for nothing); of them, those whose handles had
  // been handed on, retired once their copy ends, with no wait.
  uint64_t freed_copying = 0, freed_copying_given = 0;
  uint64_t prefetch_lead = 0;              // the lead now, in launches
  uint64_t prefetch_no_room = 0;           // due but skipped: no free room
  uint64_t period = 0;                     // launches per step, once known
  uint64_t periods_refused = 0;            // step lengths that left most live bytes untouched
  uint64_t captured_launches = 0;          // recorded into a CUDA graph: nothing moved for them
  uint64_t captured_touch_new = 0;         // their touches of ranges born during their capture
  uint64_t captured_touch_out = 0;         // their touches of ranges not resident then
  uint64_t graph_held = 0, graph_held_bytes = 0;  // frees of ranges a graph touches, kept live
  uint64_t freed_out = 0, freed_out_bytes = 0;    // ranges freed on the host: copied out, never read back
  uint64_t whole = 0;                      // 1: small ranges are backed whole now (Options::whole_max)
  // Options::recompute: ranges made again by their producing launch instead of copied in, and
  // their bytes; first launches again of a kernel checked against the saved bytes, and kernels
  // banned for a difference; kernels whose writes were learned (probed), and the host's time in that.
  uint64_t recomputed = 0, recomputed_bytes = 0;
  uint64_t recompute_checks = 0, recompute_bans = 0;
  uint64_t probes = 0, probe_ns = 0;
  uint64_t probes_on_gpu = 0;  // of them hashed by the driver, not copied to the host
  // Evictions that copied nothing out (the range is made again when next used), their bytes,
  // and ranges made again early because a launch was about to write, or the program to free, a
  // range they are made from.
  uint64_t dropped = 0, dropped_bytes = 0, restored_early = 0;
  // Kernel launches touching ranges that came without arguments to launch again (a launch with
  // attributes, an `extra` buffer, a layout the driver would not give): never producers.
  uint64_t undescribed = 0;
  // Producers recorded; ranges with one copied back instead of made again because an input was
  // not resident (away) or had changed, or its kernel was banned (stale); described launches that
  // made no producer because they wrote an allocation outside the ranges or touched one at no
  // position seen, an arena or a pointer table (small), or wrote a range besides their new one
  // that cannot be kept (not alone).
  uint64_t producers = 0, remake_away = 0, remake_stale = 0, not_producer_small = 0, not_producer_alone = 0;
  // Of the producers, those made again after the fills that wrote their output or a side first
  // (PyTorch's deterministic mode fills each new tensor; zeros before an accumulation).
  uint64_t producers_filled = 0;
  uint64_t producers_updated = 0;  // producers recorded after another launch made their range (an in-place update)
  // Launches whose writes matter but are not learned (probed, or else all they touch taken as
  // written), and the ones not probed because the kernel's probes were spent, another probe was
  // running, or what it touches was not all backed or too large to copy to the host.
  uint64_t unlearned = 0, probes_spent = 0, probes_busy = 0, probes_unbacked = 0;
  // Ranges made again whose launch also wrote other ranges (kept: saved beside, put back), and those
  // bytes; checks that found a kernel's output read what it also writes (those positions refused).
  uint64_t side_kept = 0, side_kept_bytes = 0, side_refused = 0;
  // Ranges copied in (on demand or ahead) that had no producer to make them again: alive for longer
  // than a step (lasting: weights, optimizer state), none in this life (made by a copy, a graph,
  // an undescribed launch, a launch that wrote outside the ranges), or one lost to a later launch
  // that wrote them; and ranges whose producer was kept but which were written since (a write not
  // learned yet when it ran), counted apart from remake_stale.
  uint64_t copied_lasting = 0, copied_unmade = 0, copied_lost = 0, remake_written = 0;
  uint64_t create_avg_ns = 0, piece_avg_ns = 0;  // the running averages that decide it
  uint64_t extra_pieces = 0;               // the pieces beyond the fewest a range may take now
};

}  // namespace offload

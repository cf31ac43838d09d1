#include <cinttypes>
#include <cstdio>

#include "residency/residency.h"
#include "offload/text.h"

namespace offload {

std::string residency_json(const Residency* r) {
  if (!r) return "null";
  const Residency::Stats s = r->stats();
  const HostStore::Stats h = r->host_stats();
  const std::string esc = json_escape(r->error());
  char buf[12288];  // about 120 fields of at most 45 characters each, with room to grow
  std::snprintf(buf, sizeof buf,
                "{\"budget\":%" PRIu64 ",\"min_bytes\":%" PRIu64 ",\"ranges\":%" PRIu64 ",\"live_bytes\":%" PRIu64
                ",\"allocs\":%" PRIu64 ",\"reused\":%" PRIu64 ",\"created\":%" PRIu64 ",\"created_bytes\":%" PRIu64 ",\"released\":%" PRIu64
                ",\"evictions\":%" PRIu64 ",\"abandoned\":%" PRIu64 ",\"bytes_out\":%" PRIu64 ",\"reloads\":%" PRIu64
                ",\"bytes_in\":%" PRIu64 ",\"held\":%" PRIu64 ",\"held_peak\":%" PRIu64 ",\"pool_share\":%" PRIu64
                ",\"pool_reserved\":%" PRIu64 ",\"pool_trims\":%" PRIu64 ",\"pool_over\":%" PRIu64 ",\"pooled\":%" PRIu64 ",\"pooled_bytes\":%" PRIu64 ",\"pooled_long\":%" PRIu64 ",\"pool_shrinks\":%" PRIu64 ",\"footprint_peak\":%" PRIu64
                ",\"refused_allocs\":%" PRIu64 ",\"refused_launches\":%" PRIu64 ",\"host_full\":%" PRIu64
                ",\"waits\":%" PRIu64 ",\"wait_ns\":%" PRIu64 ",\"waits_room\":%" PRIu64 ",\"wait_room_ns\":%" PRIu64 ",\"waits_release\":%" PRIu64 ",\"wait_release_ns\":%" PRIu64 ",\"waits_abandon\":%" PRIu64 ",\"wait_abandon_ns\":%" PRIu64 ",\"busy_ns\":%" PRIu64 ",\"lock_ns\":%" PRIu64 ",\"polls\":%" PRIu64 ",\"poll_ns\":%" PRIu64 ",\"poll_reap_ns\":%" PRIu64 ",\"poll_query_ns\":%" PRIu64 ",\"poll_outside_ns\":%" PRIu64 ",\"poll_pool_ns\":%" PRIu64 ",\"poll_room_ns\":%" PRIu64 ",\"maps\":%" PRIu64 ",\"alloc_maps\":%" PRIu64 ",\"refits\":%" PRIu64 ",\"unmaps\":%" PRIu64 ",\"map_ns\":%" PRIu64 ",\"unmap_ns\":%" PRIu64 ",\"create_ns\":%" PRIu64 ",\"release_ns\":%" PRIu64 ",\"ahead_ns\":%" PRIu64 ",\"copy_ns\":%" PRIu64 ",\"event_ns\":%" PRIu64 ",\"host_mapped\":%" PRIu64 ",\"host_chunks\":%" PRIu64 ",\"host_lent\":%" PRIu64 ",\"host_pin_ns\":%" PRIu64 ",\"host_pin_lent_ns\":%" PRIu64 ",\"host_in_use\":%" PRIu64 ",\"host_peak_in_use\":%" PRIu64 ",\"host_free_blocks\":%" PRIu64 ",\"host_ahead\":%" PRIu64 ",\"host_ahead_ns\":%" PRIu64 ",\"event_waits\":%" PRIu64 ",\"ahead\":%" PRIu64 ",\"ahead_bytes\":%" PRIu64
                ",\"prefetches\":%" PRIu64 ",\"prefetch_bytes\":%" PRIu64 ",\"prefetch_hits\":%" PRIu64
                ",\"prefetch_late\":%" PRIu64 ",\"prefetch_hit_lead\":%" PRIu64 ",\"prefetch_late_lead\":%" PRIu64 ",\"prefetch_late_out\":%" PRIu64 ",\"prefetch_wasted\":%" PRIu64 ",\"clean_out\":%" PRIu64 ",\"clean_out_bytes\":%" PRIu64 ",\"prefetch_lead\":%" PRIu64 ",\"prefetch_no_room\":%" PRIu64 ",\"handovers\":%" PRIu64 ",\"clean_handovers\":%" PRIu64 ",\"taken_back\":%" PRIu64 ",\"taken_back_ahead\":%" PRIu64 ",\"taken_back_near\":%" PRIu64 ",\"taken_back_next\":%" PRIu64 ",\"taken_back_after\":%" PRIu64 ",\"taken_back_lead\":%" PRIu64 ",\"taken_back_lag\":%" PRIu64 ",\"out_lag\":%" PRIu64 ",\"freed_copying\":%" PRIu64 ",\"freed_copying_given\":%" PRIu64 ",\"freed_given\":%" PRIu64 ",\"period\":%" PRIu64 ",\"outside\":%" PRIu64
                ",\"external\":%" PRIu64 ",\"external_peak\":%" PRIu64 ",\"external_refused\":%" PRIu64 ",\"captured_launches\":%" PRIu64 ",\"captured_touch_new\":%" PRIu64 ",\"captured_touch_out\":%" PRIu64 ",\"graph_held\":%" PRIu64 ",\"graph_held_bytes\":%" PRIu64 ",\"freed_out\":%" PRIu64 ",\"freed_out_bytes\":%" PRIu64 ",\"whole\":%" PRIu64 ",\"create_avg_ns\":%" PRIu64 ",\"piece_avg_ns\":%" PRIu64 ",\"extra_pieces\":%" PRIu64
                ",\"recomputed\":%" PRIu64 ",\"recomputed_bytes\":%" PRIu64 ",\"recompute_checks\":%" PRIu64 ",\"recompute_bans\":%" PRIu64 ",\"probes\":%" PRIu64 ",\"probes_on_gpu\":%" PRIu64 ",\"probe_ns\":%" PRIu64
                ",\"dropped\":%" PRIu64 ",\"dropped_bytes\":%" PRIu64 ",\"restored_early\":%" PRIu64 ",\"undescribed\":%" PRIu64 ",\"producers\":%" PRIu64 ",\"remake_away\":%" PRIu64 ",\"remake_stale\":%" PRIu64 ",\"not_producer_small\":%" PRIu64 ",\"not_producer_alone\":%" PRIu64 ",\"side_kept\":%" PRIu64 ",\"side_kept_bytes\":%" PRIu64 ",\"side_refused\":%" PRIu64
                ",\"copied_lasting\":%" PRIu64 ",\"copied_unmade\":%" PRIu64 ",\"copied_lost\":%" PRIu64 ",\"remake_written\":%" PRIu64 ",\"producers_filled\":%" PRIu64 ",\"producers_updated\":%" PRIu64 ",\"unlearned\":%" PRIu64 ",\"probes_spent\":%" PRIu64 ",\"probes_busy\":%" PRIu64 ",\"probes_unbacked\":%" PRIu64
                ",\"grants_apart\":%" PRIu64 ",\"grant_stream_waits\":%" PRIu64 ",\"grant_waits\":%" PRIu64 ",\"grant_wait_ns\":%" PRIu64 ",\"grant_ns\":%" PRIu64 ",\"gate_grants\":%" PRIu64 ",\"gate_closed_ns\":%" PRIu64 ",\"gate_chunks\":%" PRIu64 ",\"error\":\"",
                r->budget(), r->min_bytes(), s.ranges, s.live_bytes, s.allocs, s.reused, s.created, s.created_bytes, s.released,
                s.evictions, s.abandoned, s.bytes_out, s.reloads, s.bytes_in, s.held, s.held_peak, s.pool_share,
                s.pool_reserved, s.pool_trims, s.pool_over, s.pooled, s.pooled_bytes, s.pooled_long, s.pool_shrinks, s.footprint_peak, s.refused_allocs, s.refused_launches, s.host_full,
                s.waits, s.wait_ns, s.waits_room, s.wait_room_ns, s.waits_release, s.wait_release_ns, s.waits_abandon,
                s.wait_abandon_ns, s.busy_ns, s.lock_ns, s.polls, s.poll_ns, s.poll_reap_ns, s.poll_query_ns, s.poll_outside_ns, s.poll_pool_ns, s.poll_room_ns, s.maps, s.alloc_maps, s.refits, s.unmaps, s.map_ns, s.unmap_ns, s.create_ns, s.release_ns, s.ahead_ns, s.copy_ns, s.event_ns, h.mapped, h.chunks, h.lent, uint64_t(h.pin_ns), uint64_t(h.pin_lent_ns), h.in_use, h.peak_in_use, h.free_blocks, h.ahead, uint64_t(h.ahead_ns), s.event_waits, s.ahead, s.ahead_bytes, s.prefetches, s.prefetch_bytes, s.prefetch_hits,
                s.prefetch_late, s.prefetch_hit_lead, s.prefetch_late_lead, s.prefetch_late_out, s.prefetch_wasted, s.clean_out, s.clean_out_bytes, s.prefetch_lead, s.prefetch_no_room, s.handovers, s.clean_handovers, s.taken_back, s.taken_back_ahead, s.taken_back_near, s.taken_back_next, s.taken_back_after, s.taken_back_lead, s.taken_back_lag, s.out_lag, s.freed_copying, s.freed_copying_given, s.freed_given, s.period, s.outside,
                s.external, s.external_peak, s.external_refused, s.captured_launches, s.captured_touch_new, s.captured_touch_out, s.graph_held, s.graph_held_bytes, s.freed_out, s.freed_out_bytes, s.whole, s.create_avg_ns, s.piece_avg_ns, s.extra_pieces,
                s.recomputed, s.recomputed_bytes, s.recompute_checks, s.recompute_bans, s.probes, s.probes_on_gpu, s.probe_ns,
                s.dropped, s.dropped_bytes, s.restored_early, s.undescribed, s.producers, s.remake_away, s.remake_stale,
                s.not_producer_small, s.not_producer_alone, s.side_kept, s.side_kept_bytes, s.side_refused,
                s.copied_lasting, s.copied_unmade, s.copied_lost, s.remake_written, s.producers_filled, s.producers_updated, s.unlearned, s.probes_spent, s.probes_busy, s.probes_unbacked,
                s.grants_apart, s.grant_stream_waits, s.grant_waits, s.grant_wait_ns, s.grant_ns, s.gate_grants, s.gate_closed_ns, s.gate_chunks);
  return std::string(buf) + esc + "\"}";
}

}  // namespace offload

#include "residency/residency.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <utility>

#include "common/log.h"

namespace offload {
Residency::Residency(Driver& d, HostStore& host, Options o) : d_(d), host_(host), o_(o) {
  gran_ = d_.vmm_granularity();
  if (!gran_) gran_ = 2ull << 20;
  if (!o_.min_bytes) o_.min_bytes = gran_;
  o_.piece_max = round_up(o_.piece_max, gran_);
  pool_share_ = std::min(o_.pool_floor, o_.budget / 2);
  extra_now_ = o_.extra_pieces;
  st_.pool_share = pool_share_;
  if (o_.grant_apart && !o_.recompute && d_.grant_word()) granter_ = std::make_unique<Granter>(d_);
}

void Residency::end_grants() {
  std::lock_guard<std::mutex> lk(mu_);  // the Granter's thread never takes it
  granter_.reset();
}

void Residency::grant_wait(const Range& r) {
  if (grant_pending(r)) grant_wait_for(r.grant_no);
}

void Residency::grant_wait_for(uint64_t grant_no) {
  ++st_.grant_waits;
  st_.grant_wait_ns += granter_->wait(grant_no);
}

Residency::~Residency() {
  std::lock_guard<std::mutex> lk(mu_);
  // The process is ending (or a test's rig): whatever is queued finishes first, then every
  // handle and range goes back.
  for (Range& r : slots_) {
    if (r.copy_event) d_.event_sync(r.copy_event);
    if (r.in_done) d_.event_sync(r.in_done);
    if (r.load_event) d_.event_sync(r.load_event);
    if (r.free_event) d_.event_sync(r.free_event);
  }
  for (auto& [s, ring] : rings_)
    for (uint64_t e : ring.events)
      if (e) d_.event_sync(e);
  // Every mapping goes before any handle: a handle handed over is mapped twice until then.
  for (Range& r : slots_)
    if (r.va) unmap_pieces(r);
  for (Range& r : slots_) {
    if (!r.va) continue;
    if (!r.given)
      for (const Piece& p : r.pieces) d_.release_physical(p.handle);
    d_.unreserve(r.va, r.cap);
    if (r.host_read) {  // a prefetch's copy in may still read the slot
      d_.event_sync(r.host_read);
      d_.destroy_event(r.host_read);
    }
    if (r.host) host_.give(r.host, r.bytes);
    if (r.copy_event) d_.destroy_event(r.copy_event);
    if (r.in_done) d_.destroy_event(r.in_done);
    if (r.load_event) d_.destroy_event(r.load_event);
    if (r.free_event) d_.destroy_event(r.free_event);
  }
  rc_side_release();
  for (auto& [bytes, sp] : spares_) d_.release_physical(sp.handle);
  for (auto& [s, ring] : rings_)
    for (uint64_t e : ring.events)
      if (e) d_.destroy_event(e);
  for (PendingHost& p : pending_host_) {
    d_.event_sync(p.event);
    host_.give(p.host, p.bytes);
    d_.destroy_event(p.event);
  }
  for (uint64_t e : spare_events_) d_.destroy_event(e);
}

namespace {

// Runs `call` and adds the host's time in it to `ns`.
template <class Call>
auto timed(uint64_t& ns, Call call) {
  const int64_t t0 = mono_ns();
  auto result = call();
  ns += static_cast<uint64_t>(mono_ns() - t0);
  return result;
}

}  // namespace

int Residency::query_event(uint64_t e) {
  ensure_recorded(e);
  return timed(st_.event_ns, [&] { return d_.event_query(e); });
}
bool Residency::record_event(uint64_t e, Stream s) { return timed(st_.event_ns, [&] { return d_.record_event(e, s); }); }
bool Residency::order_after(Stream s, uint64_t e) {
  ensure_recorded(e);
  return timed(st_.event_ns, [&] { return d_.stream_wait(s, e); });
}
uint64_t Residency::create_event() { return timed(st_.event_ns, [&] { return d_.create_event(); }); }

void Residency::wait_event(uint64_t e) {
  ensure_recorded(e);
  const uint64_t t0 = mono_now_ns();
  ++st_.waits;
  d_.event_sync(e);
  const uint64_t ns = mono_now_ns() - t0;
  st_.wait_ns += ns;
  switch (wait_site_) {
    case WaitSite::Room: ++st_.waits_room, st_.wait_room_ns += ns; break;
    case WaitSite::Release: ++st_.waits_release, st_.wait_release_ns += ns; break;
    case WaitSite::Abandon: ++st_.waits_abandon, st_.wait_abandon_ns += ns; break;
    case WaitSite::Other: break;
  }
}

uint64_t Residency::new_event() {
  if (!spare_events_.empty()) {
    uint64_t e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }
  return create_event();
}

void Residency::drop_event(uint64_t e) {
  if (e) spare_events_.push_back(e);
}

// ---- Budget ---------------------------------------------------------------------------------

void Residency::refresh_outside() {
  const uint64_t used = d_.device_used_bytes();
  if (!used) return;
  const uint64_t ours = held_ + external_ + d_.pool_reserved_current();
  const uint64_t other = used - std::min(used, ours);
  if (outside_base_ == UINT64_MAX) outside_base_ = other;
  outside_ = other > outside_base_ ? other - outside_base_ : 0;
  st_.outside = outside_;
}

void Residency::note_footprint() {
  st_.held = held_;
  st_.held_peak = std::max(st_.held_peak, held_);
  st_.pool_share = pool_share_;
  st_.footprint_peak = std::max(st_.footprint_peak, held_ + external_ + std::max(pool_share_, pool_seen_));
  st_.external = external_;
  st_.external_peak = std::max(st_.external_peak, external_);
}

bool Residency::take(uint64_t bytes, Want want) {
  const bool force = want == Want::Forced;
  Busy busy(*this);
  if (outside_base_ == UINT64_MAX) refresh_outside();
  // Never the room this manager needs for its own largest launch or allocation: it cannot take
  // back what another owner holds, and would refuse them.
  const uint64_t keep = want == Want::Spare ? largest_need_ : 0;
  if (!force && external_ + bytes + outside_ + o_.headroom + pool_share_ + keep > o_.budget) {
    ++st_.external_refused;
    return false;
  }
  external_ += bytes;
  std::string why;
  if (force || held_ + pool_share_ <= limit() || make_room(0, nullptr, 0, &why)) {
    note_footprint();
    return true;
  }
  external_ -= bytes;
  ++st_.external_refused;
  return false;
}

void Residency::give(uint64_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  external_ -= std::min(external_, bytes);
  st_.external = external_;
}

bool Residency::fits(uint64_t need) const {
  const uint64_t fresh = need - spare_cover(need);
  return held_ + pool_share_ + fresh <= limit();
}

uint64_t Residency::short_of(uint64_t need) {
  const uint64_t want = held_ + pool_share_ + need - spare_cover(need);
  return want - std::min(limit(), want);
}

bool Residency::make_room(uint64_t need, const uint32_t* keep, size_t nkeep, std::string* why) {
  WaitAt site(*this, WaitSite::Room);
  auto fits = [&] { return this->fits(need); };
  auto kept = [&](uint32_t slot) { return std::find(keep, keep + nkeep, slot) != keep + nkeep; };
  reap_copies();
  if (fits()) return true;
  release_spares_for(need, false);  // spare handles of other sizes, without waiting
  // Freed ranges kept for reuse: oldest free first (the multimap keeps insertion order per size).
  while (!fits() && let_go_cached()) {
  }
  // Copies out still running give their handles (the taker's stream waits for them), else the
  // oldest is waited for.
  if (give_copies(need)) return true;
  while (!fits()) {
    auto it = std::find_if(copying_out_.begin(), copying_out_.end(), [&](uint32_t k) { return !slots_[k].given; });
    if (it == copying_out_.end()) break;
    finish_evict(*it);
  }
  if (fits()) return true;
  // The pool's share grown for short lives now freed (Options::pool_short), before live bytes move.
  if (o_.pool_short && shrink_pool_share(pool_share_ - std::min(pool_share_, short_of(need))) && fits()) return true;
  // Resident ranges, the furthest next use (or the least recent use) first.
  std::vector<uint32_t>& victims = victims_;
  pick_victims(&victims, keep, nkeep, launches_seen_);
  // Start as many copies as the shortfall needs, then finish them: the copies queue together.
  uint64_t freeing = 0;
  const uint64_t short_by = short_of(need);
  std::vector<uint32_t> started;
  for (uint32_t v : victims) {
    if (freeing >= short_by) break;
    if (!start_evict(v, why)) break;
    started.push_back(v);
    freeing += slots_[v].bytes;
  }
  if (give_copies(need)) return true;
  for (uint32_t v : started) {
    if (slots_[v].state != State::CopyingOut || slots_[v].given) continue;
    finish_evict(v);
    if (fits()) break;
  }
  if (o_.evict_before_busy_release && !fits() && evict_for_handles(need, keep, nkeep, why)) return true;
  release_spares_for(need, true);  // spares left of other sizes: the budget must hold the new handle
  if (!fits() && rc_side_.va && !rc_.side_held) {  // the buffer recompute keeps sides in goes last: made again when next needed
    rc_side_release();
    release_spares_for(need, true);
  }
  note_footprint();
  if (fits()) return true;
  if (why && why->empty()) {
    uint64_t pinned = 0;
    for (const Range& r : slots_)
      if (r.backed() && (r.inflight || kept(uint32_t(&r - slots_.data())))) pinned += r.bytes;
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "%s more cannot fit the device budget of %.2f GiB: %.2f GiB held, %.2f GiB of it in use by "
                  "launches in flight, %.2f GiB set aside for the allocator's pool",
                  SizeText(need).s, o_.budget / kGiB, held_ / kGiB, pinned / kGiB, pool_share_ / kGiB);
    *why = buf;
  }
  return false;
}

// ---- Allocations ----------------------------------------------------------------------------

DevPtr Residency::alloc(uint64_t bytes, Stream s, uint64_t* tag, bool* refused) {
  *refused = false;
  if (bytes < o_.min_bytes) return 0;
  const uint64_t size = range_size(bytes);
  Busy busy(*this);
  DeferCopies defer(*this);
  decide_costs();
  ++st_.allocs;
  largest_need_ = std::max(largest_need_, size);
  note_ask(size);
  const uint64_t key = birth_key(size);
  tl_pool_key = kNoKey;
  if (pool_short(bytes, key)) return 0;  // the allocator's pool serves it (small_allocated)
  const DevPtr va = alloc_range(size, key, s, tag, refused);
  if (va) slots_[uint32_t(*tag & ~kRangeTag)].asked = bytes;
  return va;
}

DevPtr Residency::alloc_range(uint64_t size, uint64_t key, Stream s, uint64_t* tag, bool* refused) {
  if (const DevPtr va = reuse_cached(size, key, s, tag)) return va;
  std::string why;
  if (outside_base_ == UINT64_MAX) refresh_outside();  // the first range: what is outside now is the base
  if (o_.refit && !cached_.empty()) {
    const uint64_t maps_before = st_.maps;
    bool no_room = false;
    const int32_t slot = refit_cached(size, s, &why, &no_room);
    st_.alloc_maps += st_.maps - maps_before;
    if (slot >= 0) {
      Range& r = slots_[slot];
      r.live = true;
      r.last_use = launches_seen_;
      note_birth(r, key);
      ++st_.refits;
      ++st_.ranges;
      st_.live_bytes += r.bytes;
      *tag = kRangeTag | uint32_t(slot);
      return r.va;
    }
    if (no_room) {
      error_ = why;
      count_refused_alloc();
      *refused = true;
      return 0;
    }
  }
  return new_range(size, key, s, tag, refused, &why);
}

DevPtr Residency::reuse_cached(uint64_t size, uint64_t key, Stream s, uint64_t* tag) {
  // A freed range of the size, on this stream first (stream order makes it usable at once).
  auto [lo, hi] = cached_.equal_range(size);
  auto pick = hi;
  for (auto it = lo; it != hi; ++it)
    if (slots_[it->second].free_stream == s) {
      pick = it;
      break;
    }
  if (pick == hi && lo != hi) pick = lo;
  if (pick == hi) return 0;
  const uint32_t slot = pick->second;
  cached_.erase(pick);
  cached_bytes_ -= size;
  Range& r = slots_[slot];
  if (r.free_stream != s) order_after(s, r.free_event);
  r.live = true;
  r.last_use = launches_seen_;
  note_birth(r, key);
  ++st_.reused;
  ++st_.ranges;
  st_.live_bytes += size;
  *tag = kRangeTag | slot;
  return r.va;
}

DevPtr Residency::new_range(uint64_t size, uint64_t key, Stream s, uint64_t* tag, bool* refused, std::string* why) {
  // The pool's share grown for short lives gives way first (Options::pool_short).
  const bool share_fits = size <= limit() && (size + pool_share_ <= limit() || shrink_pool_share(limit() - size));
  if (!share_fits || !make_room(size, nullptr, 0, why)) {
    if (why->empty()) {
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "an allocation of %s cannot fit the device budget of %.2f GiB (%.2f GiB set aside for "
                    "the allocator's pool)",
                    SizeText(size).s, o_.budget / kGiB, pool_share_ / kGiB);
      *why = buf;
    }
    error_ = *why;
    count_refused_alloc();
    *refused = true;
    return 0;
  }
  Range r;
  r.bytes = size;
  // Room to grow into when it is refitted for a larger allocation later (address space is cheap).
  r.cap = o_.refit ? 2 * size : size;
  r.va = d_.reserve(r.cap);
  const uint64_t maps_before = st_.maps;
  if (!r.va || !back_range(r, s, why)) {
    if (r.va) d_.unreserve(r.va, r.cap);
    error_ = why->empty() ? "reserving address space failed" : *why;
    count_refused_alloc();
    *refused = true;
    return 0;
  }
  st_.alloc_maps += st_.maps - maps_before;
  r.live = true;
  r.last_use = launches_seen_;
  note_birth(r, key);
  uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
    slots_[slot] = r;
  } else {
    slot = static_cast<uint32_t>(slots_.size());
    slots_.push_back(r);
  }
  by_va_[r.va] = slot;
  ++st_.ranges;
  st_.live_bytes += size;
  any_.store(true, std::memory_order_release);
  *tag = kRangeTag | slot;
  return r.va;
}

bool Residency::free(DevPtr p, Stream s) {
  Busy busy(*this);
  auto it = by_va_.find(p);
  if (it == by_va_.end()) return false;
  const uint32_t slot = it->second;
  Range& r = slots_[slot];
  if (!r.live) return true;  // a second free of a freed range: nothing to forward
  // A graph's replays may still touch it (PyTorch's private pool keeps a graph's memory for the
  // graph's life too): it stays live, its address never reused; every replay makes it resident.
  if (r.in_graph) {
    if (!r.graph_freed) {
      r.graph_freed = true;
      ++st_.graph_held;
      st_.graph_held_bytes += r.bytes;
    }
    return true;
  }
  release_clean(r);  // its address serves another allocation next
  if (r.dependents || r.side_of) {
    // Dropped ranges made from it, or writing it besides, are made again first, while its bytes
    // and its address are still there.
    RcWriting writing(*this, true);
    rc_.writes.assign(1, slot);
    std::string why;
    if (!rc_guard(rc_.writes, s, &slot, 1, &why, true)) log().error("recompute: before a free: {}", why);
  }
  if (r.dropped) rc_undrop(r);  // freed before it was needed again: nothing to make
  r.live = false;
  note_death(r);
  if (o_.recompute) rc_new_life(r);
  --st_.ranges;
  st_.live_bytes -= r.bytes;
  if (r.state == State::CopyingOut) {
    ++st_.freed_copying;
    if (r.given) {  // its bytes are dead: nothing waits for its copy out but its unmapping
      retire_copying(slot);
      return true;
    }
    abandon(r);
  }
  if (r.state == State::OnHost) {
    ++st_.freed_out;
    st_.freed_out_bytes += r.bytes;
    if (r.host) host_.give(r.host, r.bytes);
    d_.unreserve(r.va, r.cap);
    by_va_.erase(it);
    drop_event(r.free_event);
    drop_event(r.read_event);
    r = Range{};
    free_slots_.push_back(slot);
    return true;
  }
  // The freeing stream stands for every stream that touched the range: it waits for them, then
  // one event marks the free.
  carry_out(r);
  order_after_touches(s, r.touches);
  if (r.copy_event) order_after(s, r.copy_event);  // a reload, on another stream
  if (r.free_event) order_after(s, r.free_event);  // the previous owner's free
  if (!r.free_event) r.free_event = new_event();
  record_event(r.free_event, s);
  r.free_stream = s;
  r.free_seq = ++frees_recorded_;
  r.touches.clear();
  r.state = State::Resident;
  drop_event(r.copy_event);
  r.copy_event = 0;
  cached_.emplace(r.bytes, slot);
  cached_bytes_ += r.bytes;
  return true;
}

bool Residency::admit_small(uint64_t bytes) {
  Busy busy(*this);
  tl_pool_key = kNoKey;  // small_allocated next is this one's
  return admit_locked(bytes, false);
}

bool Residency::admit_locked(uint64_t bytes, bool quiet) {
  // The pool's memory is counted as the larger of its share and what it holds: it holds more than
  // its live bytes (blocks freed and kept, fragments), and grows by its own chunks.
  const uint64_t live = small_live_ + bytes;
  uint64_t reserved = see_pool();
  if (live <= pool_share_ && reserved + o_.pool_step <= pool_share_) return true;
  if (reserved + o_.pool_step > pool_share_ && reserved > small_live_) {
    ++st_.pool_trims;  // its unused blocks go back before the share grows
    d_.pool_trim(0);
    reserved = see_pool();
  }
  const uint64_t need = std::max(live, reserved + o_.pool_step);
  if (need <= pool_share_) return true;
  // The share grows by a quarter more than it needs, so that a growing pool does not make room
  // one allocation at a time.
  const uint64_t old = pool_share_;
  pool_share_ = std::min(round_up(need + need / 4, gran_), limit());
  std::string why;
  if (need > pool_share_) {
    why = "more than the whole budget";
  } else if (held_ + pool_share_ > limit()) {
    // A short life (quiet) is pooled only where the share grows into room that no live range
    // holds: freed ranges and idle spares go, nothing is evicted or waited for, and the share
    // grows no further than that room. Grown by evicting, it outlived the short lives, and the
    // recorded checkpointed step moved three times the bytes (docs/results.md).
    if (quiet) {
      if (!room_without_waiting(0)) pool_share_ = std::max(round_up(need, gran_), limit() - std::min(limit(), held_));
    } else {
      pool_need_ = need;  // what make_room may take the share back to, not below
      make_room(0, nullptr, 0, &why);
      pool_need_ = 0;
    }
  }
  if (held_ + pool_share_ > limit() || need > pool_share_) {
    pool_share_ = old;
    if (quiet) return false;
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "the allocator's pool needs %.2f GiB for allocations under %.1f MiB (%.2f GiB of them live): ",
                  need / kGiB, o_.min_bytes / double(1 << 20), live / kGiB);
    error_ = buf + why + "; those stay on the device, in PyTorch's pool: a larger budget holds them";
    count_refused_alloc();
    note_footprint();
    return false;
  }
  note_footprint();
  return true;
}

uint64_t Residency::see_pool() {
  const uint64_t reserved = d_.pool_reserved_current();
  pool_seen_ = reserved;
  st_.pool_reserved = reserved;
  if (reserved > pool_share_) st_.pool_over = std::max(st_.pool_over, reserved - pool_share_);
  return reserved;
}

// ---- Host slots ------------------------------------------------------------------------------

bool Residency::give_host_read() {
  bool gave = false;
  for (size_t i = 0; i < pending_host_.size();) {
    if (query_event(pending_host_[i].event) == 1) {
      host_.give(pending_host_[i].host, pending_host_[i].bytes);
      drop_event(pending_host_[i].event);
      pending_host_[i] = pending_host_.back();
      pending_host_.pop_back();
      gave = true;
    } else {
      ++i;
    }
  }
  return gave;
}

void* Residency::take_host(uint64_t bytes) {
  // Room already pinned first, with the slots whose copies have read them given back: the store
  // grows only past that, since growing pins on this thread (about 340 ms/GiB on the H200's host,
  // a quarter of the reference's step at half its peak while it grew; docs/results.md).
  if (void* p = host_.take(bytes, false)) return p;
  if (give_host_read())
    if (void* p = host_.take(bytes, false)) return p;
  // The copies prefetched ranges keep are a cache: they go before the store grows.
  bool dropped = false;
  for (Range& r : slots_) dropped |= release_clean(r);
  if (dropped && give_host_read())
    if (void* p = host_.take(bytes, false)) return p;
  return host_.take(bytes);
}

// ---- Worker ---------------------------------------------------------------------------------

void Residency::poll() {
  std::lock_guard<std::mutex> lk(mu_);
  uint64_t t0 = mono_now_ns();
  const uint64_t start = t0;
  auto part = [&](uint64_t& sum) {
    const uint64_t t = mono_now_ns();
    sum += t - t0;
    t0 = t;
  };
  reap_copies();
  part(st_.poll_reap_ns);
  for (Range& r : slots_)
    if (r.state == State::CopyingIn && query_event(r.copy_event) == 1) copied_in(r);
  give_host_read();
  part(st_.poll_query_ns);
  refresh_outside();
  part(st_.poll_outside_ns);
  // The allocator's pool holds more than its share less a chunk (fragments, frees it has not yet
  // reused): its unused memory goes back; what it still holds after that sets its share.
  if (see_pool() + o_.pool_step > pool_share_) {
    ++st_.pool_trims;
    d_.pool_trim(0);
    const uint64_t now = see_pool();
    if (now + o_.pool_step > pool_share_) pool_share_ = std::min(round_up(now + o_.pool_step, gran_), limit());
  }
  part(st_.poll_pool_ns);
  if (held_ + pool_share_ > limit()) {
    std::string why;
    make_room(0, nullptr, 0, &why);
  }
  part(st_.poll_room_ns);
  // Spare handles stay: they are inside the budget, and the next range of their size maps one
  // without a driver allocation (a create and a release cost 0.1-0.6 ms together on the H200).
  // make_room gives back those of other sizes when the budget needs the room.
  note_footprint();
  ++st_.polls;
  st_.poll_ns += mono_now_ns() - start;
}

Residency::Stats Residency::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  Stats s = st_;
  s.busy_ns = busy_ns_.load(std::memory_order_relaxed);
  s.lock_ns = lock_ns_.load(std::memory_order_relaxed);
  s.prefetch_lead = pf_lead_;
  s.out_lag = out_lag_;
  if (granter_) s.grant_ns = granter_->grant_ns();
  const Driver::GateCounts g = d_.gate_counts();
  s.gate_grants = g.grants, s.gate_closed_ns = g.closed_ns, s.gate_chunks = g.chunks;
  s.held = held_;
  s.pool_share = pool_share_;
  s.whole = o_.whole_max && o_.piece_max && whole_pays();
  s.extra_pieces = extra_now_;
  s.create_avg_ns = create_avg_;
  s.piece_avg_ns = map_avg_ + unmap_avg_;
  return s;
}

std::string Residency::error() const {
  std::lock_guard<std::mutex> lk(mu_);
  return error_;
}

Residency::State Residency::state_of(DevPtr p) const {
  std::lock_guard<std::mutex> lk(mu_);
  const int32_t k = slot_of(p);
  return k < 0 ? State::Resident : slots_[k].state;
}

void apply_cap_policy(const Settings& s, Residency::Options* o) {
  o->evict_before_busy_release = s.cap_evict_first;
  o->recompute = s.cap_recompute;
  o->drop_first = s.cap_drop_first;
  o->kernel_probes = uint8_t(s.cap_recompute_probes);
  o->updates = s.cap_recompute_updates;
  o->piece_max = s.cap_piece;
  o->whole_max = s.cap_whole;
  o->extra_auto = s.cap_extra_pieces == Settings::kAutoPieces;
  o->extra_pieces = o->extra_auto ? Settings::kAnyPieces : s.cap_extra_pieces;  // "any" at 2^20
  o->tile_exact = s.cap_tile_exact;
  o->size_classes = s.cap_size_classes;
  o->refit = s.cap_refit;
  o->keep_asked = s.cap_keep_asked;
  o->pool_short = s.cap_pool_short;
  o->pool_short_share = s.cap_pool_short_share;
  o->ahead_to_ceiling = s.cap_ahead_to_ceiling;
  o->grant_apart = s.cap_grant_apart;
  o->copy_gate = s.cap_gate;
  o->copy_gate_ahead = s.cap_gate_ahead;
  o->low_water = s.cap_ahead_bytes;
  o->low_share = s.cap_ahead_share;
  o->prefetch = s.cap_prefetch_max != 0;
  o->prefetch_lead_max = s.cap_prefetch_max;  // kQuarterStep: no ceiling but the step's quarter
  o->lead_grow_unwasted = s.cap_prefetch_grow_unwasted;
  o->prefetch_nearest = s.cap_prefetch_nearest;
  o->lru_victims = s.cap_lru_victims;
  o->prefetch_hold = s.cap_prefetch_hold;
  o->prefetch_room = s.cap_prefetch_room;
}

}  // namespace offload

#include "residency/residency.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "common/log.h"

namespace offload {
namespace {

constexpr double kGiB = double(1ull << 30);


thread_local bool tl_refused = false;
// Launches ahead of a demand reload's place in the step that its prefetch is issued at.
constexpr uint64_t kPrefetchLead = 24;

}  // namespace

// What before_launch pinned on this thread, until after_launch (the launch is forwarded
// between them): those ranges are in use by a launch in flight and are never victims.
struct Residency::InFlight {
  Residency* owner = nullptr;
  Stream s = 0;
  uint64_t launch = 0;
  uint32_t n = 0;
  uint32_t slots[Tracker::kMaxAccesses];
};
static thread_local Residency::InFlight tl_inflight;

Residency::Residency(Driver& d, HostStore& host, Options o) : d_(d), host_(host), o_(o) {
  gran_ = d_.vmm_granularity();
  if (!gran_) gran_ = 2ull << 20;
  if (!o_.min_bytes) o_.min_bytes = gran_;
  pool_share_ = std::min(o_.pool_floor, o_.budget / 2);
  st_.pool_share = pool_share_;
}

Residency::~Residency() {
  std::lock_guard<std::mutex> lk(mu_);
  // The process is ending (or a test's rig): whatever is queued finishes first, then every
  // handle and range goes back.
  for (Range& r : slots_) {
    if (r.copy_event) d_.event_sync(r.copy_event);
    if (r.free_event) d_.event_sync(r.free_event);
  }
  for (auto& [s, ring] : rings_)
    for (uint64_t e : ring.events)
      if (e) d_.event_sync(e);
  for (Range& r : slots_) {
    if (!r.va) continue;
    if (r.handle) {
      d_.unmap(r.va, r.bytes);
      d_.release_physical(r.handle);
    }
    d_.unreserve(r.va, r.bytes);
    if (r.host) host_.give(r.host, r.bytes);
    if (r.copy_event) d_.destroy_event(r.copy_event);
    if (r.free_event) d_.destroy_event(r.free_event);
  }
  for (auto& [bytes, h] : spares_) d_.release_physical(h);
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

uint64_t Residency::new_event() {
  if (!spare_events_.empty()) {
    uint64_t e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }
  return d_.create_event();
}

void Residency::drop_event(uint64_t e) {
  if (e) spare_events_.push_back(e);
}

bool Residency::take_refusal() {
  const bool r = tl_refused;
  tl_refused = false;
  return r;
}

// ---- Streams: one event per launch that touched a range, recorded once it is forwarded ----

void Residency::after_launch() {
  InFlight& f = tl_inflight;
  if (f.owner != this) return;
  std::lock_guard<std::mutex> lk(mu_);
  close_inflight(f);
}

void Residency::close_inflight(InFlight& f) {
  f.owner = nullptr;
  for (uint32_t i = 0; i < f.n; ++i)
    if (slots_[f.slots[i]].inflight) --slots_[f.slots[i]].inflight;
  StreamRing& ring = rings_[f.s];
  size_t k = ring.next;
  if (!ring.events[k]) ring.events[k] = d_.create_event();
  if (ring.events[k] && d_.record_event(ring.events[k], f.s)) {
    ring.after[k] = f.launch;
    ring.next = (k + 1) % StreamRing::kSize;
  }
}

uint64_t Residency::event_after(Stream s, uint64_t launch) {
  StreamRing& ring = rings_[s];
  uint64_t best = 0, best_after = UINT64_MAX;
  for (size_t i = 0; i < StreamRing::kSize; ++i)
    if (ring.events[i] && ring.after[i] >= launch && ring.after[i] < best_after) {
      best = ring.events[i];
      best_after = ring.after[i];
    }
  if (best) return best;
  // No launch of `s` was recorded after `launch`: it has been forwarded (it is not in flight:
  // ranges in flight are never evicted or freed from under it), so an event recorded now
  // captures it.
  size_t k = ring.next;
  if (!ring.events[k]) ring.events[k] = d_.create_event();
  if (!ring.events[k] || !d_.record_event(ring.events[k], s)) return 0;
  ring.after[k] = launch;
  ring.next = (k + 1) % StreamRing::kSize;
  return ring.events[k];
}

void Residency::add_touch(Range& r, Stream s, uint64_t launch) {
  for (Range::Touch& t : r.touches)
    if (t.s == s) {
      t.launch = std::max(t.launch, launch);
      return;
    }
  r.touches.push_back({s, launch});
}

// ---- Budget ---------------------------------------------------------------------------------

void Residency::reap_copies() {
  for (size_t i = 0; i < copying_out_.size();) {
    const uint32_t slot = copying_out_[i];
    if (d_.event_query(slots_[slot].copy_event) == 1) finish_evict(slot);  // erases it
    else ++i;
  }
}

uint64_t Residency::next_use_distance(const Range& r, uint64_t now) const {
  if (!period_ || !r.nuses) return now - std::min(now, r.last_use);
  uint64_t next = UINT64_MAX;
  for (int i = 0; i < r.nuses; ++i) {
    const uint64_t u = r.uses[i];
    const uint64_t t = u + period_ * ((now >= u ? (now - u) / period_ : 0) + 1);
    next = std::min(next, t);
  }
  return next - now;
}

void Residency::pick_victims(std::vector<uint32_t>* out, const uint32_t* keep, size_t nkeep, uint64_t now) {
  out->clear();
  std::vector<std::pair<uint64_t, uint32_t>> scored;
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    const Range& r = slots_[i];
    if (!r.live || !r.handle || r.inflight || (r.state != State::Resident && r.state != State::CopyingIn)) continue;
    if (std::find(keep, keep + nkeep, i) != keep + nkeep) continue;
    scored.push_back({next_use_distance(r, now), i});
  }
  std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [d, i] : scored) out->push_back(i);
}

void Residency::evict_ahead(const uint32_t* keep, size_t nkeep) {
  const uint64_t low = o_.low_water ? o_.low_water : o_.budget / 8;
  const uint64_t lim = limit();
  // What stays held if every copy out, freed range and spare handle gave its memory back.
  auto projected = [&] {
    const uint64_t going = out_bytes_ + cached_bytes_ + spare_bytes_;
    return held_ - std::min(held_, going) + pool_share_;
  };
  if (projected() + low <= lim) return;
  reap_copies();
  if (projected() + low <= lim) return;
  pick_victims(&victims_, keep, nkeep, launches_seen_);
  for (uint32_t v : victims_) {
    if (projected() + low <= lim) break;
    // Not what the next few launches use: that would come straight back.
    if (period_ && next_use_distance(slots_[v], launches_seen_) < 8) break;
    std::string why;
    if (!start_evict(v, &why)) break;
    ++st_.ahead;
    st_.ahead_bytes += slots_[v].bytes;
  }
}

bool Residency::room_without_waiting(uint64_t need) {
  auto fits = [&] { return this->fits(need); };
  if (fits()) return true;
  reap_copies();
  // Spares of other sizes, then freed ranges whose last work is known done.
  release_spares_for(need);
  for (auto it = cached_.begin(); it != cached_.end() && !fits();) {
    const Range& r = slots_[it->second];
    if ((r.free_event && d_.event_query(r.free_event) != 1) || (r.copy_event && d_.event_query(r.copy_event) != 1)) {
      ++it;
      continue;
    }
    const uint32_t slot = it->second;
    cached_bytes_ -= r.bytes;
    it = cached_.erase(it);
    release_freed(slot);
  }
  return fits();
}

void Residency::prefetch_due(uint64_t launch_no, const uint32_t* keep, size_t nkeep) {
  (void)keep, (void)nkeep;
  if (!period_ || !o_.prefetch || prefetch_at_.empty()) {
    pf_next_ = launch_no + 1;
    return;
  }
  // Every place in the step since the last launch looked at: launches that touch none of our
  // ranges never reach here, and their places must not be skipped.
  uint64_t from = pf_next_;
  if (!from || from > launch_no || launch_no - from >= period_) from = launch_no;
  pf_next_ = launch_no + 1;
  for (uint64_t x = from; x <= launch_no; ++x) {
    auto it = prefetch_at_.find(x % period_);
    if (it == prefetch_at_.end()) continue;
    for (uint32_t k : it->second) {
      if (k >= slots_.size()) continue;
      Range& r = slots_[k];
      if (!r.live || r.state != State::OnHost) continue;
      // Only into room that is free now: a prefetch never waits, nor evicts what is used sooner.
      if (!room_without_waiting(r.bytes)) {
        ++st_.prefetch_no_room;
        continue;
      }
      if (!prefetch_stream_) prefetch_stream_ = d_.create_stream();
      std::string why;
      if (!reload(k, prefetch_stream_, &why)) continue;
      --st_.reloads;
      st_.bytes_in -= r.bytes;
      ++st_.prefetches;
      st_.prefetch_bytes += r.bytes;
      r.prefetched = true;
    }
  }
}

void Residency::schedule_prefetch(uint32_t slot, uint64_t use, uint64_t lead) {
  if (!period_ || !o_.prefetch) return;
  Range& r = slots_[slot];
  lead = std::min<uint64_t>(lead, period_ / 4 + 1);
  if (r.pf_key != UINT64_MAX) {
    if (lead <= r.lead) return;  // already as early
    std::erase(prefetch_at_[r.pf_key], slot);
  }
  r.lead = static_cast<uint32_t>(lead);
  r.pf_key = (use + period_ - lead % period_) % period_;
  prefetch_at_[r.pf_key].push_back(slot);
}

void Residency::set_period(uint64_t launches) {
  std::lock_guard<std::mutex> lk(mu_);
  // A training step touches most of what lives across it (weights, optimizer state): a
  // "step" that leaves most live bytes untouched is a repeating part of one (a recurrent
  // net's time step), and predictions from it would be wrong. Least recently used then.
  if (launches && launches_seen_ >= launches) {
    uint64_t live = 0, touched = 0;
    for (const Range& r : slots_)
      if (r.live) {
        live += r.bytes;
        if (r.last_use + launches > launches_seen_) touched += r.bytes;
      }
    if (live && touched * 2 < live) {
      ++st_.periods_refused;
      launches = 0;
    }
  }
  if (launches == period_) return;
  period_ = launches;
  st_.period = launches;
  prefetch_at_.clear();
  for (Range& r : slots_) r.pf_key = UINT64_MAX;
}

void Residency::refresh_outside() {
  const uint64_t used = d_.device_used_bytes();
  if (!used) return;
  const uint64_t ours = held_ + d_.pool_reserved_current();
  const uint64_t other = used - std::min(used, ours);
  if (outside_base_ == UINT64_MAX) outside_base_ = other;
  outside_ = other > outside_base_ ? other - outside_base_ : 0;
  st_.outside = outside_;
}

void Residency::note_footprint() {
  st_.held = held_;
  st_.held_peak = std::max(st_.held_peak, held_);
  st_.pool_share = pool_share_;
  st_.footprint_peak = std::max(st_.footprint_peak, held_ + pool_share_);
}

bool Residency::fits(uint64_t need) const {
  return spares_.count(need) != 0 || held_ + pool_share_ + need <= limit();
}

void Residency::release_spares_for(uint64_t need) {
  for (auto it = spares_.begin(); it != spares_.end() && !fits(need);) {
    if (it->first == need) {
      ++it;
      continue;
    }
    d_.release_physical(it->second);
    held_ -= it->first;
    spare_bytes_ -= it->first;
    ++st_.released;
    it = spares_.erase(it);
  }
}

bool Residency::make_room(uint64_t need, const uint32_t* keep, size_t nkeep, std::string* why) {
  auto fits = [&] { return this->fits(need); };
  auto kept = [&](uint32_t slot) { return std::find(keep, keep + nkeep, slot) != keep + nkeep; };
  reap_copies();
  if (fits()) return true;
  release_spares_for(need);  // spare handles of other sizes
  // Freed ranges kept for reuse: oldest free first (the multimap keeps insertion order per size).
  while (!fits() && !cached_.empty()) {
    auto it = cached_.begin();
    const uint32_t slot = it->second;
    cached_bytes_ -= slots_[slot].bytes;
    cached_.erase(it);
    release_freed(slot);
  }
  // Copies out still running, oldest first.
  while (!fits() && !copying_out_.empty()) finish_evict(copying_out_.front());
  if (fits()) return true;
  // Resident ranges, the furthest next use (or the least recent use) first.
  std::vector<uint32_t>& victims = victims_;
  pick_victims(&victims, keep, nkeep, launches_seen_);
  // Start as many copies as the shortfall needs, then finish them: the copies queue together.
  uint64_t freeing = 0;
  const uint64_t short_by = held_ + pool_share_ + need - std::min(limit(), held_ + pool_share_ + need);
  std::vector<uint32_t> started;
  for (uint32_t v : victims) {
    if (freeing >= short_by) break;
    if (!start_evict(v, why)) break;
    started.push_back(v);
    freeing += slots_[v].bytes;
  }
  for (uint32_t v : started) {
    finish_evict(v);
    if (fits()) break;
  }
  release_spares_for(need);  // spares left of other sizes: the budget must hold the new handle
  note_footprint();
  if (fits()) return true;
  if (why && why->empty()) {
    uint64_t pinned = 0;
    for (const Range& r : slots_)
      if (r.handle && (r.inflight || kept(uint32_t(&r - slots_.data())))) pinned += r.bytes;
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "%.2f GiB more cannot fit the device budget of %.2f GiB: %.2f GiB held, %.2f GiB of it in use by "
                  "launches in flight, %.2f GiB set aside for the allocator's pool",
                  need / kGiB, o_.budget / kGiB, held_ / kGiB, pinned / kGiB, pool_share_ / kGiB);
    *why = buf;
  }
  return false;
}

bool Residency::start_evict(uint32_t slot, std::string* why) {
  Range& r = slots_[slot];
  void* host = host_.take(r.bytes);
  if (!host) {
    ++st_.host_full;
    if (why) {
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "the host memory for evicted bytes is full (%.2f GiB in use, limit %.2f GiB; "
                    "OFFLOAD_HOST_LIMIT raises it)",
                    host_.stats().in_use / kGiB, host_.limit() / kGiB);
      *why = buf;
    }
    return false;
  }
  if (!copy_stream_) copy_stream_ = d_.create_stream();
  if (o_.fault != Options::Fault::SkipEvictWait) {
    for (const Range::Touch& t : r.touches)
      if (uint64_t e = event_after(t.s, t.launch)) d_.stream_wait(copy_stream_, e);
    if (r.free_event) d_.stream_wait(copy_stream_, r.free_event);
    if (r.copy_event) d_.stream_wait(copy_stream_, r.copy_event);  // a reload still running
  }
  const uint64_t piece = host_.pin_piece();
  auto* dst = static_cast<unsigned char*>(host);
  for (uint64_t off = 0; off < r.bytes; off += piece)
    d_.copy_to_host(dst + off, r.va + off, std::min(piece, r.bytes - off), copy_stream_);
  if (!r.copy_event) r.copy_event = new_event();
  d_.record_event(r.copy_event, copy_stream_);
  r.host = host;
  r.state = State::CopyingOut;
  copying_out_.push_back(slot);
  out_bytes_ += r.bytes;
  return true;
}

void Residency::finish_evict(uint32_t slot) {
  Range& r = slots_[slot];
  std::erase(copying_out_, slot);
  out_bytes_ -= r.bytes;
  if (d_.event_query(r.copy_event) != 1) {
    ++st_.waits;
    d_.event_sync(r.copy_event);
  }
  d_.unmap(r.va, r.bytes);
  spare_bytes_ += r.bytes;
  spares_.emplace(r.bytes, r.handle);  // still counted in held_: the caller takes or releases it
  r.handle = 0;
  r.state = State::OnHost;
  r.touches.clear();
  drop_event(r.copy_event);
  r.copy_event = 0;
  drop_event(r.free_event);
  r.free_event = 0;
  ++st_.evictions;
  st_.bytes_out += r.bytes;
}

void Residency::release_freed(uint32_t slot) {
  Range& r = slots_[slot];
  if (r.free_event && d_.event_query(r.free_event) != 1) {
    ++st_.waits;
    d_.event_sync(r.free_event);
  }
  if (r.copy_event) d_.event_sync(r.copy_event);
  d_.unmap(r.va, r.bytes);
  spare_bytes_ += r.bytes;
  spares_.emplace(r.bytes, r.handle);
  d_.unreserve(r.va, r.bytes);
  by_va_.erase(r.va);
  drop_event(r.free_event);
  drop_event(r.copy_event);
  if (r.pf_key != UINT64_MAX) std::erase(prefetch_at_[r.pf_key], slot);
  r = Range{};
  free_slots_.push_back(slot);
}

bool Residency::back_range(Range& r, std::string* why) {
  uint64_t h = 0;
  if (auto it = spares_.find(r.bytes); it != spares_.end()) {
    h = it->second;
    spares_.erase(it);
    spare_bytes_ -= r.bytes;
  } else {
    h = d_.create_physical(r.bytes);
    if (!h) {
      if (why) {
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "the device refused %.2f GiB with %.2f GiB held under a budget of %.2f GiB: memory outside "
                      "the allocator (the CUDA context, libraries) leaves less than the budget",
                      r.bytes / kGiB, held_ / kGiB, o_.budget / kGiB);
        *why = buf;
      }
      return false;
    }
    held_ += r.bytes;
    ++st_.created;
  }
  if (!d_.map(r.va, r.bytes, h)) {
    spares_.emplace(r.bytes, h);
    spare_bytes_ += r.bytes;
    if (why) *why = "mapping a range failed";
    return false;
  }
  r.handle = h;
  note_footprint();
  return true;
}

// ---- Allocations ----------------------------------------------------------------------------

DevPtr Residency::alloc(uint64_t bytes, Stream s, uint64_t* tag, bool* refused) {
  *refused = false;
  if (bytes < o_.min_bytes) return 0;
  const uint64_t size = round_up(bytes, gran_);
  std::lock_guard<std::mutex> lk(mu_);
  ++st_.allocs;
  // A freed range of the size, on this stream first (stream order makes it usable at once).
  auto [lo, hi] = cached_.equal_range(size);
  auto pick = hi;
  for (auto it = lo; it != hi; ++it)
    if (slots_[it->second].free_stream == s) {
      pick = it;
      break;
    }
  if (pick == hi && lo != hi) pick = lo;
  if (pick != hi) {
    const uint32_t slot = pick->second;
    cached_.erase(pick);
    cached_bytes_ -= size;
    Range& r = slots_[slot];
    if (r.free_stream != s) d_.stream_wait(s, r.free_event);
    r.live = true;
    r.last_use = launches_seen_;
    ++st_.reused;
    ++st_.ranges;
    st_.live_bytes += size;
    *tag = kRangeTag | slot;
    return r.va;
  }
  std::string why;
  if (outside_base_ == UINT64_MAX) refresh_outside();  // the first range: what is outside now is the base
  if (size + pool_share_ > limit() || !make_room(size, nullptr, 0, &why)) {
    if (why.empty()) {
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "an allocation of %.2f GiB cannot fit the device budget of %.2f GiB (%.2f GiB set aside for "
                    "the allocator's pool)",
                    size / kGiB, o_.budget / kGiB, pool_share_ / kGiB);
      why = buf;
    }
    error_ = why;
    ++st_.refused_allocs;
    *refused = true;
    return 0;
  }
  Range r;
  r.bytes = size;
  r.va = d_.reserve(size);
  if (!r.va || !back_range(r, &why)) {
    if (r.va) d_.unreserve(r.va, size);
    error_ = why.empty() ? "reserving address space failed" : why;
    ++st_.refused_allocs;
    *refused = true;
    return 0;
  }
  r.live = true;
  r.last_use = launches_seen_;
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
  std::lock_guard<std::mutex> lk(mu_);
  auto it = by_va_.find(p);
  if (it == by_va_.end()) return false;
  const uint32_t slot = it->second;
  Range& r = slots_[slot];
  if (!r.live) return true;  // a second free of a freed range: nothing to forward
  r.live = false;
  --st_.ranges;
  st_.live_bytes -= r.bytes;
  if (r.state == State::OnHost) {
    host_.give(r.host, r.bytes);
    d_.unreserve(r.va, r.bytes);
    by_va_.erase(it);
    drop_event(r.free_event);
    if (r.pf_key != UINT64_MAX) std::erase(prefetch_at_[r.pf_key], slot);
    r = Range{};
    free_slots_.push_back(slot);
    return true;
  }
  if (r.state == State::CopyingOut) abandon(r);
  // The freeing stream stands for every stream that touched the range: it waits for them, then
  // one event marks the free.
  for (const Range::Touch& t : r.touches)
    if (t.s != s)
      if (uint64_t e = event_after(t.s, t.launch)) d_.stream_wait(s, e);
  if (r.copy_event) d_.stream_wait(s, r.copy_event);  // a reload, on another stream
  if (r.free_event) d_.stream_wait(s, r.free_event);  // the previous owner's free
  if (!r.free_event) r.free_event = new_event();
  d_.record_event(r.free_event, s);
  r.free_stream = s;
  r.touches.clear();
  r.state = State::Resident;
  drop_event(r.copy_event);
  r.copy_event = 0;
  cached_.emplace(r.bytes, slot);
  cached_bytes_ += r.bytes;
  return true;
}

void Residency::abandon(Range& r) {
  // Still mapped: the range stays and its copy out is dropped without waiting. The copy may
  // still be reading while the launch writes (its bytes are thrown away); the host slot goes
  // back once it is done, and the copy stream counts as a stream that touched the range, so
  // that a later eviction or free waits for it.
  ++st_.abandoned;
  std::erase(copying_out_, uint32_t(&r - slots_.data()));
  out_bytes_ -= r.bytes;
  const uint64_t done = new_event();
  d_.record_event(done, copy_stream_);
  pending_host_.push_back({r.host, r.bytes, done});
  r.host = nullptr;
  r.state = State::Resident;
  add_touch(r, copy_stream_, ++copy_touches_);  // its own count: event_after then records afresh
  drop_event(r.copy_event);
  r.copy_event = 0;
}

bool Residency::admit_small(uint64_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  const uint64_t live = small_live_ + bytes;
  if (live <= pool_share_) return true;
  // The pool is about to need more than its share: the share grows first, by a quarter more
  // than the pool then holds, so that a growing pool does not make room one allocation at a time.
  const uint64_t old = pool_share_;
  pool_share_ = std::min(round_up(live + live / 4, gran_), limit());
  std::string why;
  if (live > pool_share_) {
    why = "more than the whole budget";
  } else if (held_ + pool_share_ > limit()) {
    make_room(0, nullptr, 0, &why);
  }
  if (held_ + pool_share_ > limit() || live > pool_share_) {
    pool_share_ = old;
    char buf[160];
    std::snprintf(buf, sizeof buf, "the allocator's pool needs %.2f GiB for allocations under %.1f MiB: ",
                  live / kGiB, o_.min_bytes / double(1 << 20));
    error_ = buf + why;
    ++st_.refused_allocs;
    note_footprint();
    return false;
  }
  note_footprint();
  return true;
}

void Residency::small_allocated(uint64_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  small_live_ += bytes;
}

void Residency::small_freed(uint64_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  small_live_ -= std::min(small_live_, bytes);
}

// ---- Launches: the page-fault handler ------------------------------------------------------

bool Residency::reload(uint32_t slot, Stream s, std::string* why) {
  Range& r = slots_[slot];
  if (!back_range(r, why)) return false;
  const uint64_t piece = host_.pin_piece();
  const auto* src = static_cast<const unsigned char*>(r.host);
  for (uint64_t off = 0; off < r.bytes; off += piece)
    d_.copy_to_device(r.va + off, src + off, std::min(piece, r.bytes - off), s);
  if (!r.copy_event) r.copy_event = new_event();
  d_.record_event(r.copy_event, s);
  // The host slot goes back once the copy has read it.
  const uint64_t done = new_event();
  d_.record_event(done, s);
  pending_host_.push_back({r.host, r.bytes, done});
  r.host = nullptr;
  r.in_stream = s;
  r.state = State::CopyingIn;
  ++st_.reloads;
  st_.bytes_in += r.bytes;
  return true;
}

void Residency::refuse_launch(uint32_t kernel, uint64_t bytes, size_t ranges, const std::string& why) {
  const std::string name = namer_ ? namer_(namer_ctx_, kernel) : std::string("kernel ") + std::to_string(kernel);
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s touches %.2f GiB in %zu ranges, which the device budget of %.2f GiB cannot hold at once (%.2f "
                "GiB set aside for the allocator's pool)%s%s: the launch is refused with out-of-memory",
                name.c_str(), bytes / kGiB, ranges, o_.budget / kGiB, pool_share_ / kGiB, why.empty() ? "" : "; ",
                why.c_str());
  error_ = buf;
  if (st_.refused_launches++ == 0) log().error("{}", error_);
  tl_refused = true;
}

void Residency::before_launch(uint64_t launch_no, EventKind kind, uint32_t kernel, Stream s, const AllocId* acc,
                              size_t n, uint8_t flags) {
  if (!any_.load(std::memory_order_acquire)) return;
  const bool blind = kind == EventKind::Graph || (flags & (kLayoutUnknown | kAccessesTruncated));
  const bool ranges = n && acc[n - 1] >= kRangeIdBit;
  if (!ranges && !blind && !has_tables_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lk(mu_);
  launches_seen_ = launch_no;
  std::vector<uint32_t>& touched = scratch_;
  touched.clear();
  if (blind) {
    for (uint32_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].live) touched.push_back(i);
  } else {
    for (size_t i = n; i-- > 0 && acc[i] >= kRangeIdBit;)
      if (is_range_id(acc[i])) touched.push_back(range_slot(acc[i]));
    if (!tables_.empty())
      for (size_t i = 0; i < n; ++i)
        if (auto t = tables_.find(acc[i]); t != tables_.end())
          for (AllocId id : t->second) touched.push_back(range_slot(id));
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    touched.erase(std::remove_if(touched.begin(), touched.end(),
                                 [&](uint32_t k) { return k >= slots_.size() || !slots_[k].live; }),
                  touched.end());
  }
  if (touched.empty()) return;
  uint64_t total = 0;
  for (uint32_t k : touched) total += slots_[k].bytes;
  if (total + pool_share_ > limit()) {
    refuse_launch(kernel, total, touched.size(), blind ? "a launch we cannot see into needs every range" : "");
    return;
  }
  // Prefetches due at or before this launch go first: one due for a range this launch touches
  // still beats a demand reload, by being on its own stream.
  prefetch_due(launch_no, touched.data(), touched.size());
  for (uint32_t k : touched)
    if (slots_[k].state == State::CopyingOut) abandon(slots_[k]);
  for (uint32_t k : touched) {
    Range& r = slots_[k];
    if (r.state != State::OnHost) continue;
    std::string why;
    if (!make_room(r.bytes, touched.data(), touched.size(), &why) || !reload(k, s, &why)) {
      refuse_launch(kernel, total, touched.size(), why);
      return;
    }
    // Next step, reload it a little ahead of this launch.
    schedule_prefetch(k, launch_no, kPrefetchLead);
  }
  InFlight& f = tl_inflight;
  if (f.owner == this) close_inflight(f);  // the hook did not report the last one forwarded
  f.owner = this;
  f.s = s;
  f.launch = launch_no;
  f.n = 0;
  for (uint32_t k : touched) {
    Range& r = slots_[k];
    if (r.state == State::CopyingIn && r.in_stream != s) {
      if (d_.event_query(r.copy_event) == 1) {
        r.state = State::Resident;
      } else {
        d_.stream_wait(s, r.copy_event);
        ++st_.event_waits;
      }
    }
    add_touch(r, s, launch_no);
    r.last_use = launch_no;
    if (r.prefetched) {
      r.prefetched = false;
      ++st_.prefetch_hits;
      // Still copying when its launch came: next step it starts twice as early.
      if (r.state == State::CopyingIn && d_.event_query(r.copy_event) != 1) {
        ++st_.prefetch_late;
        schedule_prefetch(k, launch_no, 2 * r.lead);
      }
    }
    if (!r.nuses || r.uses[(r.upos + Range::kUses - 1) % Range::kUses] != launch_no) {
      r.uses[r.upos] = launch_no;
      r.upos = (r.upos + 1) % Range::kUses;
      r.nuses = std::min<uint8_t>(r.nuses + 1, Range::kUses);
    }
    if (f.n < Tracker::kMaxAccesses) {
      ++r.inflight;
      f.slots[f.n++] = k;
    }
  }
  evict_ahead(touched.data(), touched.size());
}

void Residency::note_pointer_table(AllocId table, const AllocId* targets, size_t n) {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<AllocId>& v = tables_[table];
  v.clear();
  for (size_t i = 0; i < n; ++i)
    if (is_range_id(targets[i])) v.push_back(targets[i]);
  if (v.empty()) tables_.erase(table);
  has_tables_.store(!tables_.empty(), std::memory_order_release);
}

void Residency::forget_table(AllocId table) {
  if (!has_tables_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lk(mu_);
  tables_.erase(table);
  has_tables_.store(!tables_.empty(), std::memory_order_release);
}

int32_t Residency::slot_of(DevPtr p) const {
  auto it = by_va_.upper_bound(p);
  if (it == by_va_.begin()) return -1;
  --it;
  const Range& r = slots_[it->second];
  return p < r.va + r.bytes ? int32_t(it->second) : -1;
}

void Residency::prepare_access(DevPtr p) {
  if (!any_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lk(mu_);
  const int32_t k = slot_of(p);
  if (k < 0 || !slots_[k].live) return;
  Range& r = slots_[k];
  if (r.state == State::CopyingOut) abandon(r);
  if (r.state != State::OnHost) return;
  const uint32_t keep = uint32_t(k);
  std::string why;
  if (!copy_stream_) copy_stream_ = d_.create_stream();
  if (!make_room(r.bytes, &keep, 1, &why) || !reload(keep, copy_stream_, &why)) {
    error_ = why;
    log().error("reloading a range for a pointer query failed: {}", why);
    return;
  }
  ++st_.waits;
  d_.event_sync(r.copy_event);
  r.state = State::Resident;
}

// ---- Worker ---------------------------------------------------------------------------------

void Residency::poll() {
  std::lock_guard<std::mutex> lk(mu_);
  reap_copies();
  for (Range& r : slots_)
    if (r.state == State::CopyingIn && d_.event_query(r.copy_event) == 1) r.state = State::Resident;
  for (size_t i = 0; i < pending_host_.size();) {
    if (d_.event_query(pending_host_[i].event) == 1) {
      host_.give(pending_host_[i].host, pending_host_[i].bytes);
      drop_event(pending_host_[i].event);
      pending_host_[i] = pending_host_.back();
      pending_host_.pop_back();
    } else {
      ++i;
    }
  }
  refresh_outside();
  // The allocator's pool holds more than its share (fragments, frees it has not yet reused):
  // its unused memory goes back; what it still holds after that becomes its share.
  const uint64_t reserved = d_.pool_reserved_current();
  st_.pool_reserved = reserved;
  if (reserved > pool_share_) {
    ++st_.pool_trims;
    d_.pool_trim(pool_share_);
    const uint64_t now = d_.pool_reserved_current();
    if (now > pool_share_) {
      pool_share_ = std::min(round_up(now, gran_), limit());
    }
  }
  if (held_ + pool_share_ > limit()) {
    std::string why;
    make_room(0, nullptr, 0, &why);
  }
  // Spares nobody took: back to the device.
  for (auto& [bytes, h] : spares_) {
    d_.release_physical(h);
    held_ -= bytes;
    ++st_.released;
  }
  spares_.clear();
  spare_bytes_ = 0;
  note_footprint();
}

Residency::Stats Residency::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  Stats s = st_;
  s.held = held_;
  s.pool_share = pool_share_;
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

std::string residency_json(const Residency* r) {
  if (!r) return "null";
  const Residency::Stats s = r->stats();
  std::string err = r->error(), esc;
  for (char c : err) {
    if (c == '"' || c == '\\') esc += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) esc += c;
  }
  char buf[2048];
  std::snprintf(buf, sizeof buf,
                "{\"budget\":%" PRIu64 ",\"min_bytes\":%" PRIu64 ",\"ranges\":%" PRIu64 ",\"live_bytes\":%" PRIu64
                ",\"allocs\":%" PRIu64 ",\"reused\":%" PRIu64 ",\"created\":%" PRIu64 ",\"released\":%" PRIu64
                ",\"evictions\":%" PRIu64 ",\"abandoned\":%" PRIu64 ",\"bytes_out\":%" PRIu64 ",\"reloads\":%" PRIu64
                ",\"bytes_in\":%" PRIu64 ",\"held\":%" PRIu64 ",\"held_peak\":%" PRIu64 ",\"pool_share\":%" PRIu64
                ",\"pool_reserved\":%" PRIu64 ",\"pool_trims\":%" PRIu64 ",\"footprint_peak\":%" PRIu64
                ",\"refused_allocs\":%" PRIu64 ",\"refused_launches\":%" PRIu64 ",\"host_full\":%" PRIu64
                ",\"waits\":%" PRIu64 ",\"event_waits\":%" PRIu64 ",\"ahead\":%" PRIu64 ",\"ahead_bytes\":%" PRIu64
                ",\"prefetches\":%" PRIu64 ",\"prefetch_bytes\":%" PRIu64 ",\"prefetch_hits\":%" PRIu64
                ",\"prefetch_late\":%" PRIu64 ",\"prefetch_no_room\":%" PRIu64 ",\"period\":%" PRIu64 ",\"outside\":%" PRIu64 ",\"error\":\"",
                r->budget(), r->min_bytes(), s.ranges, s.live_bytes, s.allocs, s.reused, s.created, s.released,
                s.evictions, s.abandoned, s.bytes_out, s.reloads, s.bytes_in, s.held, s.held_peak, s.pool_share,
                s.pool_reserved, s.pool_trims, s.footprint_peak, s.refused_allocs, s.refused_launches, s.host_full,
                s.waits, s.event_waits, s.ahead, s.ahead_bytes, s.prefetches, s.prefetch_bytes, s.prefetch_hits,
                s.prefetch_late, s.prefetch_no_room, s.period, s.outside);
  return std::string(buf) + esc + "\"}";
}

}  // namespace offload

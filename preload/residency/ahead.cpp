// Residency ahead of need: which range to evict (Belady's rule once the step's length is known,
// else the least recently used), evictions started before an allocation needs the room, and
// prefetches of ranges whose next use is near. Next uses are predicted from the step before:
// a range born where one was born a step earlier is used as that one was; a range living across
// steps is used where it was a step earlier. residency.h says why.
#include <algorithm>

#include "residency/residency.h"

namespace offload {

bool Residency::predicted_next_use(const Range& r, uint64_t now, uint64_t* dist) const {
  if (!period_) return false;
  // A range born in this step at a place a range was born at a step earlier: that one's uses.
  if (r.key != kNoKey && now - r.birth < period_ && !r.pred.empty()) {
    const uint64_t age = now - r.birth;
    for (uint32_t off : r.pred)
      if (off > age) {
        *dist = off - age;
        return true;
      }
    // Past the uses remembered of the one born there, if it had more: not known. Predicted
    // unused, such ranges went out just before their next use (docs/results.md, "Ranges copied
    // out for nothing").
    if (r.pred.size() >= kLifeUses) return false;
    *dist = period_;  // no use left before the one born there was freed
    return true;
  }
  // A range living across steps (weights, optimizer state): its uses recur a period later. The
  // earliest use in the last period is the next; a few before it (a range not used every step)
  // recur at their own place. A binary search: this runs for every candidate victim.
  if (!r.nuses || now - r.birth < period_) return false;
  const int n = r.nuses;
  auto at = [&](int i) { return r.uses[(r.upos + Range::kUses - n + i) % Range::kUses]; };  // oldest first
  // Used more often than the uses remembered reach back a period (a mask or a table every layer
  // reads): the uses a period ago are forgotten, and the first remembered one, a period on, was
  // the next use predicted. Such ranges went out and were touched again tens of launches later,
  // waited for on the host (docs/results.md, "Ranges used more often than remembered"). The
  // mean gap between the uses remembered is the next use instead.
  if (n == Range::kUses && at(0) + period_ > now) {
    *dist = std::max<uint64_t>(1, std::min((now - at(0)) / n, at(0) + period_ - now));
    return true;
  }
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (at(mid) + period_ > now) hi = mid;
    else lo = mid + 1;
  }
  uint64_t next = lo < n ? at(lo) + period_ : UINT64_MAX;
  for (int i = std::max(0, lo - 8); i < lo; ++i) {
    const uint64_t u = at(i);
    next = std::min(next, u + period_ * ((now - u) / period_ + 1));  // u + period_ <= now here
  }
  *dist = next - now;
  return true;
}

uint64_t Residency::next_use_distance(const Range& r, uint64_t now) const {
  uint64_t d = 0;
  if (predicted_next_use(r, now, &d)) return d;
  return now - std::min(now, r.last_use);
}

uint64_t Residency::birth_key(uint64_t size) {
  const uint64_t now = last_launch_.load(std::memory_order_relaxed);
  births_there_ = now == birth_launch_ ? births_there_ + 1 : 0;
  birth_launch_ = now;
  if (!period_) return kNoKey;
  return (now % period_) << 32 | std::min<uint64_t>(births_there_, 255) << 24 |
         std::min<uint64_t>(size / gran_, (1u << 24) - 1);
}

void Residency::note_birth(Range& r, uint64_t key) {
  r.birth = last_launch_.load(std::memory_order_relaxed);
  if (o_.recompute) rc_new_life(r);
  r.life.clear();
  r.pred.clear();
  r.pf_hold = r.pf_hold_at = 0;
  r.moved = false;
  r.key = key;
  if (key == kNoKey) return;
  if (auto it = lives_.find(r.key); it != lives_.end()) r.pred.assign(it->second.begin(), it->second.end());
}

void Residency::note_death(const Range& r) {
  if (!period_ || r.key == kNoKey) return;
  const uint64_t span = last_launch_.load(std::memory_order_relaxed) - r.birth;
  note_span(r.key, span, r.moved);
  if (span >= period_) return;
  lives_[r.key].assign(r.life.begin(), r.life.end());
}

void Residency::note_span(uint64_t key, uint64_t span, bool moved) {
  if (period_ && o_.pool_short) spans_[key] = ShortLife{uint32_t(std::min<uint64_t>(span, UINT32_MAX)), moved};
}

void Residency::pick_victims(std::vector<uint32_t>* out, const uint32_t* keep, size_t nkeep, uint64_t now) {
  out->clear();
  std::vector<std::pair<uint64_t, uint32_t>> scored;
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    const Range& r = slots_[i];
    if (!r.live || !r.backed() || r.inflight || (r.state != State::Resident && r.state != State::CopyingIn)) continue;
    if (std::find(keep, keep + nkeep, i) != keep + nkeep) continue;
    uint64_t d = next_use_distance(r, now);
    // A range its producer can make again goes out with no copy either way: its next use counts
    // drop_first times as far (Options::drop_first).
    if (o_.recompute && o_.drop_first > 1 && rc_can_drop(i)) d = d > UINT64_MAX / o_.drop_first ? UINT64_MAX : d * o_.drop_first;
    scored.push_back({d, i});
  }
  std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [d, i] : scored) out->push_back(i);
}

void Residency::evict_ahead(const uint32_t* keep, size_t nkeep) {
  // Under a plan's arenas (external_) the plan made room for what it moves: ranges are evicted on
  // need only, else the ranges it counted resident (weights) would stream every step.
  if (external_) return;
  const uint64_t low = std::min(o_.budget / 2, o_.low_water ? o_.low_water : uint64_t(double(o_.budget) * o_.low_share));
  const uint64_t lim = limit();
  if (projected() + low <= lim) return;
  reap_copies();
  if (projected() + low <= lim) return;
  pick_victims(&victims_, keep, nkeep, launches_seen_);
  for (uint32_t v : victims_) {
    if (projected() + low <= lim) break;
    // Not what is used within the prefetch lead (Options::ahead_to_ceiling: its ceiling): a
    // prefetch would bring it straight back. (The lead shortens as this loop evicts unused
    // prefetches: read it each time.)
    const uint64_t horizon = o_.ahead_to_ceiling ? lead_ceiling() : lead_reach();
    if (period_ && next_use_distance(slots_[v], launches_seen_) <= horizon) break;
    std::string why;
    if (!start_evict(v, &why)) break;
    slots_[v].out_ahead = true;
    ++st_.ahead;
    st_.ahead_bytes += slots_[v].bytes;
  }
}

bool Residency::room_without_waiting(uint64_t need) {
  auto fits = [&] { return this->fits(need); };
  if (fits()) return true;
  reap_copies();
  // Spares that cannot back it, then freed ranges (let go: their last work is waited for on the
  // GPU by whoever maps their handles).
  release_spares_for(need, false);
  while (!fits() && let_go_cached()) {
  }
  return fits();
}

void Residency::note_ask(uint64_t size) {
  if (!period_ || !o_.keep_asked) return;  // only let_go_cached's order under keep_asked reads them
  const uint64_t now = last_launch_.load(std::memory_order_relaxed);
  if (now / period_ != asks_step_) {
    asks_step_ = now / period_;
    asks_prev_ = std::move(asks_now_);  // sizes not asked again are forgotten
    asks_now_.clear();
  }
  asks_now_[size].push_back(uint32_t(now % period_));
}

uint64_t Residency::next_ask(uint64_t size, uint64_t now) const {
  if (!period_) return 0;
  auto it = asks_prev_.find(size);
  if (it == asks_prev_.end() || it->second.empty()) return UINT64_MAX;
  const uint64_t phase = now % period_;
  const std::vector<uint32_t>& at = it->second;  // in launch order
  auto next = std::upper_bound(at.begin(), at.end(), uint32_t(phase));
  return next != at.end() ? *next - phase : at.front() + period_ - phase;
}

bool Residency::let_go_cached() {
  if (cached_.empty()) return false;
  auto pick = cached_.begin();  // without a period: the smallest, the oldest freed of its size first
  if (period_ && o_.keep_asked) {
    // The size asked for again furthest ahead (or never) goes first: a freed range of the size the
    // next allocation asks for serves it with no mapping at all.
    const uint64_t now = last_launch_.load(std::memory_order_relaxed);
    uint64_t far = 0;
    for (auto it = cached_.begin(); it != cached_.end(); it = cached_.upper_bound(it->first)) {
      const uint64_t d = next_ask(it->first, now);
      if (d > far) far = d, pick = it;  // every d is at least 1
      if (d == UINT64_MAX) break;
    }
  }
  const uint32_t slot = pick->second;
  cached_bytes_ -= slots_[slot].bytes;
  cached_.erase(pick);
  let_go_freed(slot);
  return true;
}

void Residency::prefetch_due(uint64_t launch_no) {
  if (!period_ || !o_.prefetch) return;
  if (!pf_lead_) pf_lead_ = std::min(o_.prefetch_lead, lead_ceiling());
  if (o_.prefetch_room) room_.note(launch_no, period_, st_.live_bytes + pooled_live_);
  pf_due_.clear();
  for (uint32_t k = 0; k < slots_.size(); ++k) {
    const Range& r = slots_[k];
    // A dropped range is made again where it is used: made ahead with its inputs, the recorded
    // steps moved more bytes in the replay (docs/results.md).
    if (!r.live || r.state != State::OnHost || r.dropped) continue;
    uint64_t d = 0;
    if (predicted_next_use(r, launch_no, &d) && d <= pf_lead_ && !held(r, launch_no, d)) pf_due_.push_back({d, k});
  }
  // Nearest use first, ties in slot order (the pairs' own order: no buffer, as stable_sort takes).
  if (o_.prefetch_nearest) std::sort(pf_due_.begin(), pf_due_.end());
  for (const auto& [d, k] : pf_due_) {
    if (o_.prefetch_room && !room_ahead(k, d, launch_no)) {
      ++st_.prefetch_no_room;
      continue;
    }
    prefetch_one(k, d, launch_no);
  }
}

bool Residency::room_ahead(uint32_t k, uint64_t d, uint64_t now) const {
  // The range, and what the allocations before its use added to the live bytes a step ago.
  return projected() + slots_[k].bytes + room_.rise(now, d) <= limit();
}

uint64_t Residency::projected() const {
  return held_ - std::min(held_, out_bytes_ + cached_bytes_ + spare_bytes_) + pool_share_;
}

bool Residency::held(const Range& r, uint64_t now, uint64_t d) const {
  if (!o_.prefetch_hold) return false;
  if (now < r.pf_hold) return true;
  // The place it went out at, a whole number of periods on, before the use: held.
  return r.pf_hold_at && (r.pf_hold_at - 1 + period_ - now % period_) % period_ < d;
}

void Residency::prefetch_one(uint32_t k, uint64_t d, uint64_t launch_no) {
  Range& r = slots_[k];
  // A range due earlier in this pass may have been brought back already as this one's input.
  if (!r.live || r.state != State::OnHost || r.dropped) return;
  // A kernel not checked yet is made again, and checked, with its inputs brought back first, as
  // a demand reload does: a range prefetched is never reloaded on demand, and a kernel never
  // made again is never trusted, so nothing it makes is ever dropped.
  // Only into room that is free now: a prefetch never waits, nor evicts what is used sooner.
  // Without room for its inputs as well it waits while its use is further than the next launch
  // (looking, not letting freed ranges go: that unmaps), then takes what room there is, or is
  // copied in as any other.
  bool check = o_.recompute && o_.fault != Options::Fault::RecomputeNoCheckAhead && rc_check_wanted(k);
  if (check && d > 1 && !fits(rc_restore_bytes(k))) {
    ++st_.prefetch_no_room;
    return;
  }
  if (check && d <= 1 && !room_without_waiting(rc_restore_bytes(k))) check = false;
  if (!check && !room_without_waiting(r.bytes)) {
    ++st_.prefetch_no_room;
    return;
  }
  if (!prefetch_stream_) prefetch_stream_ = d_.create_stream();
  std::string why;
  const uint64_t copies = st_.reloads, in = st_.bytes_in;
  if (!(check ? rc_restore(k, prefetch_stream_, nullptr, 0, &why) : reload(k, prefetch_stream_, &why, true))) return;
  // What was copied in (it, its inputs), a prefetch, not a demand reload.
  st_.prefetches += std::max<uint64_t>(st_.reloads - copies, 1);
  st_.prefetch_bytes += std::max(st_.bytes_in - in, r.bytes);
  st_.reloads = copies;
  st_.bytes_in = in;
  r.prefetched = true;
  r.pf_at = launch_no;
}

void Residency::set_period(uint64_t launches) {
  std::lock_guard<std::mutex> lk(mu_);
  if (o_.lru_victims) launches = 0;  // Options::lru_victims: as before a period is found
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
  lives_.clear();
  spans_.clear();
  asks_prev_.clear();
  asks_now_.clear();
  asks_step_ = UINT64_MAX;
  pf_lead_ = 0;
  pf_wasted_at_ = 0;
}

}  // namespace offload

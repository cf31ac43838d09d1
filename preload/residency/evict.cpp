// Residency's evictions: copies out started (queued at once, or held back until the allocation
// or launch that started them has made its mappings), reaped as they end, finished (unmapped, the
// handles spare), and abandoned when their range is touched first. residency.h says why.
#include <algorithm>
#include <cstdio>
#include <utility>

#include "residency/residency.h"

namespace offload {

void Residency::reap_copies() {
  // Frees end on their streams in the order they were recorded there: a free recorded after one
  // found running on its stream is not asked about (retiring_ is in the order the ranges were let
  // go, not that of their frees, so each stream keeps the earliest free found running).
  busy_streams_.clear();
  for (size_t i = 0; i < retiring_.size();) {
    const Range& r = slots_[retiring_[i]];
    auto busy = std::find_if(busy_streams_.begin(), busy_streams_.end(), [&](const auto& b) { return b.first == r.free_stream; });
    if (busy != busy_streams_.end() && r.free_seq > busy->second) {
      ++i;
    } else if (query_event(r.free_event) == 1) {
      retire_done(retiring_[i]);  // erases it
    } else {
      if (busy == busy_streams_.end()) busy_streams_.emplace_back(r.free_stream, r.free_seq);
      else busy->second = r.free_seq;  // earlier than the one found before
      ++i;
    }
  }
  // Copies out run on one stream, in the order of copying_out_: none after one still running is done.
  while (!copying_out_.empty() && query_event(slots_[copying_out_.front()].copy_event) == 1) {
    const uint64_t lag = launches_seen_ - std::min(launches_seen_, slots_[copying_out_.front()].out_at);
    out_lag_ = out_lag_ ? (3 * out_lag_ + lag) / 4 : lag;
    finish_evict(copying_out_.front());  // erases it
  }
}

bool Residency::start_evict(uint32_t slot, std::string* why) {
  Range& r = slots_[slot];
  // A range its producer can make again is dropped: nothing is copied out (recompute.cpp).
  // One prefetched and untouched since has its bytes on the host still: nothing is copied.
  const bool clean = r.host_read != 0;
  const bool drop = !clean && o_.recompute && rc_can_drop(slot);
  void* host = drop ? nullptr : clean ? r.host : take_host(r.bytes);
  if (drop) {
    rc_drop(r);
  } else if (!host) {
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
  r.moved = true;  // not a short life for the pool (Options::pool_short)
  if (r.prefetched) {  // brought in ahead and going out unused: the lead outran the room
    r.prefetched = false;
    ++st_.prefetch_wasted;
    pf_wasted_at_ = launches_seen_ + 1;
    pf_lead_ = std::max<uint64_t>(std::min<uint64_t>(8, lead_ceiling()), pf_lead_ - pf_lead_ / 4);
    uint64_t d = 0;
    if (o_.prefetch_hold && predicted_next_use(r, launches_seen_, &d)) {
      r.pf_hold = launches_seen_ + d / 2;
      r.pf_hold_at = launches_seen_ % period_ + 1;
    }
  }
  if (!copy_stream_) {
    copy_stream_ = d_.create_stream();
    if (o_.copy_gate && copy_stream_) d_.gate_copies_out(copy_stream_, o_.copy_gate, o_.copy_gate_ahead);
  }
  const bool loading = r.state == State::CopyingIn && query_event(r.copy_event) != 1;
  if (loading) r.load_event = std::exchange(r.copy_event, 0);  // the copy out gets an event of its own
  if (!r.copy_event) r.copy_event = new_event();
  if (clean) {
    r.in_done = std::exchange(r.host_read, 0);  // the copy stream orders after the copy in (load_event) too
    r.clean_out = true;
  }
  r.host = host;
  r.state = State::CopyingOut;
  r.out_ahead = false;  // evict_ahead says otherwise
  r.out_next = uint32_t(std::min<uint64_t>(next_use_distance(r, launches_seen_), UINT32_MAX));
  r.out_at = launches_seen_;
  r.out_lead = uint32_t(std::min<uint64_t>(lead_reach(), UINT32_MAX));
  r.out_lag = uint32_t(std::min<uint64_t>(out_lag_, UINT32_MAX));
  copying_out_.push_back(slot);
  out_bytes_ += r.bytes;
  if (defer_copies_) deferred_.push_back(slot);
  else enqueue_copy_out(slot);
  return true;
}

void Residency::carry_out(Range& r) {
  if (!r.carry) return;
  // Its stream waited for free_event, if it had one, before it waited for the spares.
  if (!r.free_event) r.free_event = new_event();
  record_event(r.free_event, r.carry);
  r.carry = 0;
}

void Residency::copied_in(Range& r) {
  r.state = State::Resident;
  if (r.carry == r.in_stream) r.carry = 0;  // its copy in there followed the waits, and is done
}

void Residency::enqueue_copy_out(uint32_t slot) {
  Range& r = slots_[slot];
  if (!r.clean_out) carry_out(r);  // a clean one: its copy in followed those waits
  if (o_.fault != Options::Fault::SkipEvictWait) {
    for (const Range::Touch& t : r.touches)
      if (uint64_t e = event_after(t.s, t.launch)) order_after(copy_stream_, e);
    if (r.free_event) order_after(copy_stream_, r.free_event);
    if (r.load_event) order_after(copy_stream_, r.load_event);  // a reload still running
  }
  // A grant made apart and not yet known made: the host waits for it, as the driver checks a
  // copy's memory when the copy is queued.
  if (!r.clean_out && o_.fault != Options::Fault::SkipGrantWait) grant_wait(r);
  const uint64_t piece = host_.pin_piece();
  auto* dst = static_cast<unsigned char*>(r.host);
  const uint64_t t0 = mono_now_ns();
  for (uint64_t off = 0; dst && !r.clean_out && off < r.bytes; off += piece)
    d_.copy_to_host(dst + off, r.va + off, std::min(piece, r.bytes - off), copy_stream_);
  st_.copy_ns += mono_now_ns() - t0;
  record_event(r.copy_event, copy_stream_);  // dropped: after the range's last work, all the same
}

void Residency::flush_copies() {
  if (deferred_.empty()) return;
  flushing_.swap(deferred_);  // deferred_ is empty while they are queued: their events are not asked about
  for (uint32_t slot : flushing_) enqueue_copy_out(slot);
  flushing_.clear();
}

void Residency::ensure_recorded(uint64_t e) {
  if (deferred_.empty() || !e) return;
  for (uint32_t slot : deferred_)
    if (slots_[slot].copy_event == e) return flush_copies();
}

bool Residency::evict_for_handles(uint64_t need, const uint32_t* keep, size_t nkeep, std::string* why) {
  pick_victims(&victims_, keep, nkeep, launches_seen_);
  for (uint32_t v : victims_) {
    if (!can_back(slots_[v], need)) continue;
    if (!start_evict(v, why)) return false;
    if (give_copies(need)) return true;
  }
  return false;
}

void Residency::finish_evict(uint32_t slot) {
  Range& r = slots_[slot];
  std::erase(copying_out_, slot);
  if (query_event(r.copy_event) != 1) {
    wait_event(r.copy_event);
  }
  unmap_pieces(r);
  if (r.given) {
    no_wait_for(r, handover_event(r));  // the copy is done (and its event is reused)
  } else {
    out_bytes_ -= r.bytes;
    spare_pieces(r);  // still counted in held_: the caller takes or releases them
  }
  r.given = false;
  r.carry = 0;  // a clean one's copy in followed its stream's waits
  drop_event(r.load_event);  // the copy out followed the reload
  r.load_event = 0;
  r.pieces.clear();
  r.state = State::OnHost;
  r.touches.clear();
  drop_event(r.copy_event);
  r.copy_event = 0;
  drop_event(r.free_event);
  r.free_event = 0;
  drop_event(r.in_done);
  r.in_done = 0;
  ++st_.evictions;
  if (r.clean_out) {
    ++st_.clean_out;
    st_.clean_out_bytes += r.bytes;
  } else if (!r.dropped) {
    st_.bytes_out += r.bytes;
  }
  r.clean_out = false;
}

void Residency::give_host_after_copies(Range& r) {
  if (!r.host) return;
  const uint64_t done = new_event();
  record_event(done, copy_stream_);
  give_host_after(r, done);
}

void Residency::retire_copying(uint32_t slot) {
  Range& r = slots_[slot];
  ensure_recorded(r.copy_event);  // a copy held back is queued before it is waited for
  std::erase(copying_out_, slot);
  ++st_.freed_copying_given;
  // The last work on its memory is what a taker of its handles waits for: the copy out, or, with
  // nothing copied, the copy in before it. retire_done unmaps it after that, as a freed range's.
  give_host_after_copies(r);  // the copy stream follows the copy out, and the copy in of a clean one
  drop_event(r.free_event);  // the copy out followed it
  r.free_event = handover_event(r);
  if (r.in_done) drop_event(r.copy_event);  // the empty copy out's: nothing waits for it
  r.copy_event = 0;
  r.in_done = 0;
  drop_event(r.load_event);  // the copy out, or the copy in, followed the reload
  r.load_event = 0;
  r.free_stream = copy_stream_;  // reap_copies only orders its queries by it
  r.free_seq = ++frees_recorded_;
  r.clean_out = false;
  r.touches.clear();
  by_va_.erase(r.va);
  retiring_.push_back(slot);
}

void Residency::abandon(Range& r) {
  WaitAt site(*this, WaitSite::Abandon);
  ensure_recorded(r.copy_event);  // a copy held back is queued before the range's state changes
  if (r.given) {
    // Its memory is another range's now: the copy out is finished (waited for) instead, and the
    // range is on the host, to be reloaded.
    ++st_.taken_back;
    st_.taken_back_ahead += r.out_ahead;
    st_.taken_back_near += period_ && r.out_next <= lead_reach();
    st_.taken_back_next += r.out_next;
    st_.taken_back_after += launches_seen_ - std::min(launches_seen_, r.out_at);
    st_.taken_back_lead += r.out_lead;
    st_.taken_back_lag += r.out_lag;
    finish_evict(uint32_t(&r - slots_.data()));
    return;
  }
  // Still mapped: the range stays and its copy out is dropped without waiting. The copy may
  // still be reading while the launch writes (its bytes are thrown away); the host slot goes
  // back once it is done, and the copy stream counts as a stream that touched the range, so
  // that a later eviction or free waits for it.
  ++st_.abandoned;
  std::erase(copying_out_, uint32_t(&r - slots_.data()));
  out_bytes_ -= r.bytes;
  if (r.clean_out) {
    give_host_after(r, std::exchange(r.in_done, 0));  // the copy stream never read it
  } else {
    give_host_after_copies(r);
    add_touch(r, copy_stream_, ++copy_touches_);  // its own count: event_after then records afresh
  }
  if (r.dropped) rc_undrop(r);  // its bytes never left
  r.host = nullptr;
  r.clean_out = false;
  r.state = State::Resident;
  drop_event(r.copy_event);  // the copy out's: its bytes are thrown away
  r.copy_event = std::exchange(r.load_event, 0);
  if (r.copy_event && o_.fault != Options::Fault::SkipReloadWait) {
    // Its bytes arrive with the reload that was still running when its eviction began: it is
    // copying in again, on the reload's stream, and a launch on another stream waits for it.
    r.state = State::CopyingIn;
    return;
  }
  drop_event(r.copy_event);
  r.copy_event = 0;
}

}  // namespace offload

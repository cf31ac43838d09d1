// Executor: weights streamed out and back between their uses, and their backing handles.
#include "core/executor.h"

#include <x86intrin.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "common/log.h"
#include "core/executor_copy.h"

namespace offload {

// ---- streamed weights ----------------------------------------------------------------------

bool Executor::install_weights(std::string* why) {
  bool same = weights_.size() == plan_.weights.size();
  for (size_t i = 0; same && i < weights_.size(); ++i)
    same = weights_[i].va == plan_.weights[i].va && weights_[i].state != State::Empty;
  if (!same) {
    give_back_weights();
    weights_.clear();
  }
  if (plan_.weights.empty()) return true;
  if (!pool_) {
    *why = "no pool of the shim's own serves large allocations (OFFLOAD_PERSISTENT_MIN)";
    return false;
  }
  if (!same) {
    weights_.resize(plan_.weights.size());
    for (size_t i = 0; i < weights_.size(); ++i) {
      const WeightPlan& wp = plan_.weights[i];
      Weight& w = weights_[i];
      w.state = State::Empty;
      Backing b;
      uint64_t size = 0, room = 0;
      bool ok = wp.va && pool_->lend(wp.va, &b, &size, &room);
      if (ok && size < wp.bytes) {
        pool_->unlend(wp.va, std::move(b));
        ok = false;
      }
      if (ok) {
        w.va = wp.va, w.used = wp.bytes, w.id = wp.id, w.backing = std::move(b), w.size = size;
        w.room = std::max(room, size);
        w.state = State::Resident;
        held_.fetch_add(size);
        weight_mapped_ += size;
        lent_live_.fetch_add(wp.bytes);
        for (uint64_t& e : w.events) ok = ok && (e = driver_.create_event()) != 0;
        ok = ok && (w.ev_d2h = driver_.create_event()) != 0 && (w.ev_h2d = driver_.create_event()) != 0;
      }
      if (!ok) {
        give_back_weights();
        weights_.clear();
        *why = "weight " + std::to_string(wp.ordinal) +
               " of the trace is not a block of the shim's pool, or the driver would not create events";
        return false;
      }
    }
    weight_busy_.reserve(weights_.size());
  }
  // One unit for the weights' new memory (Options::unit_weights, weight_unit): on lora 72 MiB,
  // for the blocks' 216 and 288 MiB weights; the embedding and head (376 MiB) reload on six
  // units mapped past their end (unit_backing). The unit is not the common divisor of every
  // size: that one is small (8 MiB on lora), and a weight of 47 pieces is refused.
  std::vector<uint64_t> sizes;
  uint64_t total = 0;
  for (const Weight& w : weights_) {
    sizes.push_back(w.size);
    total += w.size;
  }
  weight_unit_ = opt_.unit_weights ? weight_unit(sizes, opt_.unit_max_pieces) : 0;
  free_weight_handles_.reserve(weight_unit_ ? total / weight_unit_ + weights_.size() : weights_.size());
  weight_ids_.clear();
  weight_vas_.clear();
  DevPtr lo = ~DevPtr{0}, hi = 0;
  for (size_t i = 0; i < weights_.size(); ++i) {
    weights_[i].host_offset = plan_.weights[i].host_offset;
    // This plan's host memory holds nothing of it yet.
    weights_[i].host_current = false;
    weights_[i].read_only = marked_read_only(weights_[i].va, weights_[i].va + weights_[i].used);
    weight_ids_.emplace_back(weights_[i].id, static_cast<uint32_t>(i));
    weight_vas_.emplace_back(weights_[i].va, static_cast<uint32_t>(i));
    lo = std::min(lo, weights_[i].va);
    hi = std::max(hi, weights_[i].va + weights_[i].size);
  }
  std::sort(weight_ids_.begin(), weight_ids_.end());
  std::sort(weight_vas_.begin(), weight_vas_.end());
  weight_lo_.store(lo);
  weight_hi_.store(hi);
  st_.weight_mapped_peak = std::max(st_.weight_mapped_peak, weight_mapped_);
  return true;
}

bool Executor::give_back_weights() {
  bool all = true;
  for (Weight& w : weights_) {
    if (w.state == State::Empty) continue;
    if (w.state == State::Evicting && w.handed()) settle_handed(w);  // evicted: not given back
    if (w.state == State::Evicting) w.state = State::Resident;  // still mapped: the copy out is let go
    if (w.state != State::Resident && w.state != State::Reloading) {
      all = false;
      continue;
    }
    lend_back(w);
  }
  for (Weight& w : weights_) {
    if (w.state != State::Empty) continue;
    for (uint64_t& e : w.events)
      if (e) driver_.destroy_event(std::exchange(e, 0));
    if (w.ev_d2h) driver_.destroy_event(std::exchange(w.ev_d2h, 0));
    if (w.ev_h2d) driver_.destroy_event(std::exchange(w.ev_h2d, 0));
  }
  for (auto& [size, h] : free_weight_handles_) drop_weight_handle(size, h);
  free_weight_handles_.clear();
  if (all) {
    weight_busy_.clear();
    for (Weight& w : weights_) w.in_busy = false;
    weight_ids_.clear();
    weight_vas_.clear();
    weight_lo_.store(0);
    weight_hi_.store(0);
  }
  return all;
}

int Executor::weight_of(uint64_t id) const {
  auto it = std::lower_bound(weight_ids_.begin(), weight_ids_.end(), std::make_pair(id, uint32_t{0}));
  return it != weight_ids_.end() && it->first == id ? static_cast<int>(it->second) : -1;
}

int Executor::weight_at(DevPtr p) const {
  auto it = std::upper_bound(weight_vas_.begin(), weight_vas_.end(), std::make_pair(p, ~uint32_t{0}));
  if (it == weight_vas_.begin()) return -1;
  --it;
  const Weight& w = weights_[it->second];
  return w.state != State::Empty && p < w.va + w.size ? static_cast<int>(it->second) : -1;
}

void Executor::mark_weight_busy(uint32_t i) {
  if (weights_[i].in_busy) return;
  weights_[i].in_busy = true;
  weight_busy_.push_back(i);
}

void Executor::lend_back(Weight& w) {
  for (const Piece& p : w.backing) unmap_donor_of(p.handle);
  const uint64_t bytes = physical_bytes(w.backing);
  if (pool_) pool_->unlend(w.va, std::move(w.backing));
  held_.fetch_sub(bytes);
  weight_mapped_ -= bytes;
  lent_live_.fetch_sub(w.used);
  w.backing.clear();
  w.state = State::Empty;
}

void Executor::unmap_donor_of(uint64_t handle) {
  for (uint32_t j : weight_busy_) {
    Weight& x = weights_[j];
    if (x.state != State::Evicting || !x.handed()) continue;
    for (const Piece& p : x.backing)
      if (p.given && p.handle == handle) {
        settle_handed(x);
        return;
      }
  }
}

void Executor::drop_weight_handle(uint64_t size, uint64_t handle) {
  unmap_donor_of(handle);
  driver_.release_physical(handle);
  held_.fetch_sub(size);
  weight_mapped_ -= size;
}

void Executor::evict_weight(uint32_t i) {
  Weight& w = weights_[i];
  if (w.state != State::Resident || w.overflow || w.backing.empty()) return;
  // After its last use before the idle stretch: the copy waits for every stream that touched it.
  // A read-only weight whose host copy is current copies nothing: ev_d2h then marks its last
  // use, and everything that waits for a copy out waits for that.
  const bool clean = w.read_only && w.host_current;
  if (!record_all(w)) return;
  if (opt_.fault != Options::Fault::SkipEvictWait)
    for (int k = 0; k < w.nstreams; ++k) driver_.stream_wait(offload_stream_, w.events[k]);
  if ((!clean && !copy(w, true, offload_stream_)) || !driver_.record_event(w.ev_d2h, offload_stream_)) {
    add_stream(w, offload_stream_);
    if (st_.copy_failures++ == 0) log().warn("an eviction copy was refused by the driver: the weight stays resident");
    return;
  }
  w.nstreams = 0;
  add_stream(w, offload_stream_);
  w.h2d_pending = false;  // the copy out is ordered after it; a later use reloads again
  w.state = State::Evicting;
  mark_weight_busy(i);
  ++st_.weight_evictions;
  if (clean) ++st_.weight_clean_evictions;
  else st_.weight_bytes_out += w.used;
}

bool Executor::marked_read_only(DevPtr lo, DevPtr hi) const {
  for (const auto& [a, b] : read_only_)
    if (a <= lo && hi <= b) return true;
  return false;
}

void Executor::mark_read_only(DevPtr p, uint64_t bytes) {
  if (!bytes) return;
  std::lock_guard lock(mu_);
  read_only_.emplace_back(p, p + bytes);
  note_read_only_span();
  for (Weight& w : weights_)
    if (w.state != State::Empty && marked_read_only(w.va, w.va + w.used)) w.read_only = true;
}

bool Executor::read_only(DevPtr p, uint64_t bytes) {
  std::lock_guard lock(mu_);
  return marked_read_only(p, p + bytes);
}

void Executor::note_read_only_span() {
  DevPtr lo = ~DevPtr{0}, hi = 0;
  for (const auto& [a, b] : read_only_) lo = std::min(lo, a), hi = std::max(hi, b);
  read_only_lo_.store(lo, std::memory_order_relaxed);
  read_only_hi_.store(hi, std::memory_order_relaxed);
  any_read_only_.store(!read_only_.empty(), std::memory_order_relaxed);
}

void Executor::forget_read_only(DevPtr p, uint64_t bytes) {
  const DevPtr lo = p, hi = p + bytes;
  // Most frees are of activations, nowhere near a mark: no lock for them (the allocation hook).
  if (hi <= read_only_lo_.load(std::memory_order_relaxed) || read_only_hi_.load(std::memory_order_relaxed) <= lo) return;
  std::lock_guard lock(mu_);
  std::erase_if(read_only_, [&](const auto& r) { return r.first < hi && lo < r.second; });
  note_read_only_span();
  for (Weight& w : weights_)
    if (w.va < hi && lo < w.va + w.size) w.read_only = w.host_current = false;
}

uint64_t Executor::weight_bound() const {
  if (active_ && cur_pos_ >= 0 && static_cast<size_t>(cur_pos_) < plan_.weight_mapped_at.size())
    return plan_.weight_mapped_at[static_cast<size_t>(cur_pos_)];
  return plan_.weight_bytes_mapped;
}

bool Executor::weight_backing(uint64_t size, uint64_t room, Backing* out, std::vector<uint64_t>* after) {
  out->clear();
  after->clear();
  const uint64_t bound = weight_bound() ? weight_bound() : ~uint64_t{0};
  // In units (Options::unit_weights), a weight no larger than unit_max_pieces of them, and at
  // least one; others as before, a handle of their own size or pieces of whole handles.
  if (in_units(size, weight_unit_, opt_.unit_max_pieces)) return unit_backing(size, room, bound, out, after);
  for (;;) {
    poll_locked();
    for (size_t k = 0; k < free_weight_handles_.size(); ++k)
      if (free_weight_handles_[k].first == size) {
        out->push_back(Piece{free_weight_handles_[k].second, size});
        free_weight_handles_.erase(free_weight_handles_.begin() + static_cast<ptrdiff_t>(k));
        return true;
      }
    if (weight_mapped_ + size <= bound) break;
    // Memory of weights on their way out goes to this reload now, which waits for their copies
    // out on the GPU instead of the host waiting for them (the host, far ahead of the GPU,
    // would otherwise stall here, and the GPU behind it). Best a weight of the same size
    // whose memory is one handle: this one is then one handle too.
    for (uint32_t j : weight_busy_) {
      Weight& x = weights_[j];
      if (x.state == State::Evicting && x.backing.size() == 1 && !x.backing[0].given && x.backing[0].bytes == size) {
        take_piece(x, x.backing[0], out, after);
        ++st_.weight_handovers;
        return true;
      }
    }
    if (opt_.split_weights && gather_pieces(size, bound, out, after)) {
      if (!after->empty()) ++st_.weight_handovers;
      ++st_.weight_split;
      return true;
    }
    if (drop_oldest_kept()) continue;  // unmapped handles of other sizes make room first
    const Weight* leaving = nullptr;
    for (uint32_t j : weight_busy_)
      if (weights_[j].state == State::Evicting) {
        leaving = &weights_[j];
        break;
      }
    if (!leaving) {
      over_bound(bound);
      break;
    }
    wait_leaving(*leaving);
  }
  const uint64_t h = new_weight_handle(size);
  if (!h) return false;
  out->push_back(Piece{h, size});
  return true;
}

bool Executor::gather_pieces(uint64_t size, uint64_t bound, Backing* out, std::vector<uint64_t>* after) {
  // Candidates: kept handles (weight -1) and the handles of weights on their way out. The
  // scratch vectors keep their capacity: after the first few, no allocation on the hook path.
  std::vector<PieceCand>& cands = scratch_cands_;
  cands.clear();
  uint64_t total = weight_mapped_ < bound ? bound - weight_mapped_ : 0;
  const uint64_t room = total;
  // The driver maps a handle whole or not at all (CUDA_ERROR_NOT_SUPPORTED for a part of one,
  // scripts/gpu/vmm_probe.cpp on the H200): only handles no larger than the weight are pieces.
  for (size_t k = 0; k < free_weight_handles_.size(); ++k) {
    if (free_weight_handles_[k].first > size) continue;
    cands.push_back(PieceCand{free_weight_handles_[k].first, -1, k});
    total += free_weight_handles_[k].first;
  }
  for (uint32_t j : weight_busy_) {
    const Weight& x = weights_[j];
    if (x.state != State::Evicting) continue;
    for (size_t p = 0; p < x.backing.size(); ++p)
      if (!x.backing[p].given && x.backing[p].bytes <= size) {
        cands.push_back(PieceCand{x.backing[p].bytes, static_cast<int>(j), p});
        total += x.backing[p].bytes;
      }
  }
  if (total < size) return false;
  // Greedy, so that few pieces map it: a candidate of exactly what is missing; else a new
  // handle for it within the room; else the largest candidate smaller than that, and go on.
  // Chosen first, taken once the new handle (if any) exists: when the pieces cannot add up to
  // the size exactly, or the device refuses the new handle, everything stays as it was.
  std::vector<size_t>& chosen = scratch_chosen_;
  chosen.clear();
  std::vector<bool>& taken = scratch_taken_;
  taken.assign(cands.size(), false);
  uint64_t need = size, fresh = 0;
  while (need) {
    size_t exact = cands.size(), largest = cands.size();
    for (size_t c = 0; c < cands.size(); ++c) {
      if (taken[c]) continue;
      const uint64_t b = cands[c].bytes;
      if (b == need && exact == cands.size()) exact = c;
      if (b < need && (largest == cands.size() || b > cands[largest].bytes)) largest = c;
    }
    size_t c = exact;
    if (c == cands.size() && need <= room) {
      fresh = need;
      break;
    }
    if (c == cands.size()) c = largest;
    if (c == cands.size()) return false;
    taken[c] = true;
    chosen.push_back(c);
    need -= cands[c].bytes;
  }
  const uint64_t h = fresh ? new_weight_handle(fresh) : 0;
  if (fresh && !h) return false;
  for (size_t c : chosen) {
    const PieceCand& k = cands[c];
    if (k.weight < 0) {
      out->push_back(Piece{free_weight_handles_[k.index].second, k.bytes});
      continue;
    }
    Weight& x = weights_[static_cast<size_t>(k.weight)];
    take_piece(x, x.backing[k.index], out, after);
  }
  if (fresh) out->push_back(Piece{h, fresh});
  // Kept handles taken leave the list (highest index first).
  for (size_t c = cands.size(); c-- > 0;)
    if (taken[c] && cands[c].weight < 0)
      free_weight_handles_.erase(free_weight_handles_.begin() + static_cast<ptrdiff_t>(cands[c].index));
  return true;
}

bool Executor::unit_backing(uint64_t size, uint64_t room, uint64_t bound, Backing* out, std::vector<uint64_t>* after) {
  const uint64_t unit = weight_unit_;
  // A size that is no multiple of the unit maps whole units past its end when its range has
  // room (the pool reserves it: lora's embedding, 376 MiB, on six units of 72). Else it ends
  // in a tail of its own (five units and 16 MiB), mapped after the units; kept tails of that
  // size serve it, and only they or new memory do (without that, the embedding's reload made
  // the host wait its whole lead every step: docs/results.md).
  const uint64_t whole = round_up(size, unit);
  const bool past_end = room >= whole;
  const uint64_t tail_bytes = past_end ? 0 : size % unit;
  uint64_t need = past_end ? whole : size - tail_bytes, tail = 0;
  bool need_tail = tail_bytes != 0;
  auto fresh = [&] {
    const uint64_t h = new_weight_handle(unit);
    if (h) {
      out->push_back(Piece{h, unit});
      need -= unit;
    }
    return h != 0;
  };
  auto fresh_tail = [&] {
    tail = new_weight_handle(tail_bytes);
    need_tail = tail == 0;
    return tail != 0;
  };
  for (;;) {
    poll_locked();
    // Kept units, oldest first, and a kept tail of the size.
    for (size_t k = 0; k < free_weight_handles_.size() && (need || need_tail);) {
      const uint64_t bytes = free_weight_handles_[k].first;
      if (bytes == unit && need) {
        out->push_back(Piece{free_weight_handles_[k].second, unit});
        need -= unit;
      } else if (bytes == tail_bytes && need_tail) {
        tail = free_weight_handles_[k].second;
        need_tail = false;
      } else {
        ++k;
        continue;
      }
      free_weight_handles_.erase(free_weight_handles_.begin() + static_cast<ptrdiff_t>(k));
    }
    while (need && weight_mapped_ + unit <= bound)
      if (!fresh()) return false;
    if (need_tail && weight_mapped_ + tail_bytes <= bound && !fresh_tail()) return false;
    // Leaving weights' units, the earliest evicted first: the GPU waits for their copies out.
    for (uint32_t j : weight_busy_) {
      if (!need) break;
      Weight& x = weights_[j];
      if (x.state != State::Evicting) continue;
      for (Piece& p : x.backing) {
        if (!need) break;
        if (p.given || p.bytes > need || p.bytes % unit) continue;  // what is missing stays whole units
        take_piece(x, p, out, after);
        need -= p.bytes;
      }
    }
    if (!need && !need_tail) break;
    // Kept handles of other sizes (a tail of another size, or a weight's first memory, lent
    // whole) hold room that is missing: one released, and look again.
    if (drop_oldest_kept()) continue;
    // Short still: a leaving weight with memory not given away (a tail, or a handle larger than
    // what is missing) frees room when its copy out ends. The host waits for the first such one.
    const Weight* leaving = nullptr;
    for (uint32_t j : weight_busy_) {
      const Weight& x = weights_[j];
      if (x.state != State::Evicting) continue;
      for (const Piece& p : x.backing)
        if (!p.given) leaving = &x;
      if (leaving) break;
    }
    if (!leaving) {
      over_bound(bound);
      while (need)  // over the bound: nothing else frees memory
        if (!fresh()) return false;
      if (need_tail && !fresh_tail()) return false;
      break;
    }
    wait_leaving(*leaving);
  }
  if (tail) out->push_back(Piece{tail, tail_bytes});
  if (!after->empty()) ++st_.weight_handovers;
  if (out->size() > 1) ++st_.weight_split;
  return true;
}

void Executor::take_piece(Weight& x, Piece& p, Backing* out, std::vector<uint64_t>* after) {
  p.given = true;
  out->push_back(Piece{p.handle, p.bytes});
  if (std::find(after->begin(), after->end(), x.ev_d2h) == after->end()) after->push_back(x.ev_d2h);
}

bool Executor::drop_oldest_kept() {
  if (free_weight_handles_.empty()) return false;
  drop_weight_handle(free_weight_handles_.front().first, free_weight_handles_.front().second);
  free_weight_handles_.erase(free_weight_handles_.begin());
  return true;
}

void Executor::over_bound(uint64_t bound) {
  if (st_.weight_over_bound++ < 3)
    log().info("a weight's reload at launch {} finds {} mapped (the plan's bound: {}) and none leaving", cur_pos_,
               gib_text(weight_mapped_), gib_text(bound));
}

void Executor::wait_leaving(const Weight& w) {
  ++st_.weight_waits;
  const uint64_t t0 = __rdtsc();
  driver_.event_sync(w.ev_d2h);
  note_wait('w', __rdtsc() - t0);
}

uint64_t Executor::new_weight_handle(uint64_t size) {
  const uint64_t h = driver_.create_physical(size);
  if (!h) return 0;
  weight_mapped_ += size;
  held_.fetch_add(size);
  st_.weight_mapped_peak = std::max(st_.weight_mapped_peak, weight_mapped_);
  st_.held_peak = std::max(st_.held_peak, held_.load());
  update_peak();
  return h;
}

void Executor::remap_weight(Weight& w, Stream s, const char* what) {
  std::vector<uint64_t>& after = scratch_after_;
  if (!weight_backing(w.size, w.room, &w.backing, &after) || !map_backing(driver_, w.va, w.backing)) {
    log().critical("cannot map {} of {} MiB (device memory or driver refused): aborting", what, w.size >> 20);
    std::abort();
  }
  if (opt_.fault == Options::Fault::SkipHandoverWait) return;
  for (uint64_t e : after)
    if (!driver_.stream_wait(s, e)) {
      log().critical("cannot order {} of {} MiB after the memory's last owner: aborting", what, w.size >> 20);
      std::abort();
    }
}

void Executor::unmap_evicted(Weight& w) {
  if (!unmap_backing(driver_, w.va, w.backing)) log().error("unmapping an evicted weight failed");
  // Kept for later reloads while the weights' mapped bytes, kept handles included, stay within
  // the plan's bound; released otherwise (their memory is the point). Handles given away are
  // other weights' now.
  const uint64_t bound = weight_bound();
  for (const Piece& p : w.backing) {
    if (p.given) continue;
    if (bound && weight_mapped_ <= bound) free_weight_handles_.emplace_back(p.bytes, p.handle);  // capacity reserved at install
    else drop_weight_handle(p.bytes, p.handle);
  }
  w.backing.clear();
  w.nstreams = 0;
  w.state = State::Evicted;
  if (w.read_only) w.host_current = true;  // copied out now, or current already
}

void Executor::settle_handed(Weight& w) {
  const bool waits = driver_.event_query(w.ev_d2h) == 0;  // a wait, not only late news
  if (waits) ++st_.weight_settles;
  uint64_t t0 = __rdtsc();
  driver_.event_sync(w.ev_d2h);
  if (waits) note_wait('s', __rdtsc() - t0);
  else wait_cycles_ += __rdtsc() - t0;
  unmap_evicted(w);
}

bool Executor::reload_weight(uint32_t i, bool demand) {
  Weight& w = weights_[i];
  if (w.state == State::Evicting && w.handed()) settle_handed(w);  // some of its memory is another's now
  if (w.state == State::Evicting) {
    w.state = State::Resident;  // the copy out has not finished: the bytes never left
    ++st_.weight_abandoned;
    return true;
  }
  if (w.state != State::Evicted) return false;
  remap_weight(w, prefetch_stream_, "an evicted weight's reload");
  if (!copy(w, false, prefetch_stream_) || !driver_.record_event(w.ev_h2d, prefetch_stream_)) {
    log().critical("cannot reload an evicted weight of {} MiB (the driver refused the copy): aborting", w.size >> 20);
    std::abort();
  }
  reload_queued(w);
  mark_weight_busy(i);
  ++st_.weight_reloads;
  st_.weight_bytes_in += w.used;
  if (demand) {
    ++st_.misses;
    ++st_.weight_misses;
    ++step_misses_;
    if (st_.weight_misses <= 8)
      log().info("miss: weight {} ({} MiB) touched while evicted at launch {} of the step", i, w.used >> 20, cur_pos_);
  }
  return true;
}

void Executor::ensure_weight(uint32_t i, Stream s, bool demand) {
  Weight& w = weights_[i];
  switch (w.state) {
    case State::Evicting:
      if (!w.handed()) {
        w.state = State::Resident;  // the bytes are still on the device: keep them
        ++st_.weight_abandoned;
        break;
      }
      [[fallthrough]];  // its memory is another weight's now: a reload
    case State::Evicted:
      if (!reload_weight(i, demand)) return;
      [[fallthrough]];
    case State::Reloading:
      w.state = State::Resident;
      break;
    case State::Resident:
      break;
    default:
      return;  // given back
  }
  used_on(w, s);
}

}  // namespace offload

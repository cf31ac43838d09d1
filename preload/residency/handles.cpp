// Residency's physical handles: spares picked to back a range, new handles made for the rest,
// and handles given on by ranges still copying out or freed with work still queued (the taker's
// stream waits for that work). residency.h says why ranges are backed by pieces.
#include <algorithm>
#include <cstdio>

#include "residency/residency.h"

namespace offload {

uint64_t Residency::pick_spares(uint64_t need, std::vector<std::multimap<uint64_t, Spare>::const_iterator>* out) const {
  out->clear();
  if (!o_.piece_max || (need <= o_.whole_max && whole_pays())) {  // one handle of its size only
    if (auto it = spares_.find(need); it != spares_.end()) out->push_back(it);
    return out->empty() ? 0 : need;
  }
  // The largest that fit first, but no more pieces than the fewest that back `need` plus
  // extra_pieces (no limit by default): the rest is made new. Each piece costs a mapping and an
  // unmapping every time the range comes back, and a handle made costs about 1.2 ms for 64 MiB on
  // the H200; with a limit of one, the handles made cost more than the mappings saved
  // (docs/results.md, "Where the time goes").
  const uint64_t top = std::max(o_.piece_max, gran_);
  auto fewest = [top](uint64_t bytes) { return (bytes + top - 1) / top; };  // whole pieces, one tail
  const uint64_t most = fewest(need) + extra_now_;
  uint64_t left = need;
  for (auto it = std::make_reverse_iterator(spares_.upper_bound(need)); it != spares_.rend() && left; ++it) {
    if (it->first > left) continue;
    if (out->size() + 1 + fewest(left - it->first) > most) break;  // so would every smaller one
    out->push_back(std::prev(it.base()));
    left -= it->first;
  }
  if (!left || !o_.tile_exact) return need - left;
  // tile_exact, and spares that do not tile it all: only whole pieces and a spare of its tail's
  // exact size, the rest made as whole pieces and one tail. A remainder made at whatever size
  // the small spares left is a handle of a size no range has, and such handles make the handles
  // held smaller and more numerous step after step (docs/results.md, "Where the time goes").
  out->clear();
  left = need;
  auto [lo, hi] = spares_.equal_range(top);
  for (auto it = lo; it != hi && left >= top; ++it) {
    out->push_back(it);
    left -= top;
  }
  if (const uint64_t tail = need % top; tail && left >= tail)
    if (auto it = spares_.find(tail); it != spares_.end()) {
      out->push_back(it);
      left -= tail;
    }
  return need - left;
}

void Residency::release_spares_for(uint64_t need, bool busy_too) {
  if (fits(need)) return;
  // The spares `need` would map stay; the others go, the smallest first: those are what the cap
  // on pieces leaves out, while a larger one backs a later range whole (releasing the largest
  // first made and dropped about 400 handles of 64 MiB a Llama step, at 0.85 ms each to make:
  // docs/results.md). Releasing leaves the pick, and so the bytes still to be made, as they are.
  const uint64_t fresh = need - pick_spares(need, &picks_);
  std::vector<std::multimap<uint64_t, Spare>::const_iterator> others;
  for (auto it = spares_.begin(); it != spares_.end(); ++it)
    if (std::find(picks_.begin(), picks_.end(), it) == picks_.end()) others.push_back(it);
  // Those whose last work (a copy out, a freed range's work) is done go before those still busy,
  // and these only with busy_too: releasing one makes the host wait for that work, which drains
  // the GPU's queue, where letting a freed range go or taking a copy's handles would not. Each
  // spare's work is asked about only when it is next in line: a query costs 2-9 us on the H200
  // (more while copies out run, docs/results.md) and a step holds hundreds of spares.
  auto over = [&] { return held_ + pool_share_ + fresh > limit(); };
  auto release = [&](std::multimap<uint64_t, Spare>::const_iterator it) {
    const uint64_t bytes = it->first, h = it->second.handle;
    WaitAt site(*this, WaitSite::Release);
    settle_given(h);  // a range it was given from, still copying out, unmaps it first
    const uint64_t t0 = mono_now_ns();
    d_.release_physical(h);
    st_.release_ns += mono_now_ns() - t0;
    held_ -= bytes;
    spare_bytes_ -= bytes;
    ++st_.released;
    spares_.erase(it);
  };
  std::vector<std::multimap<uint64_t, Spare>::const_iterator> busy;
  for (auto it : others) {
    if (!over()) return;
    if (o_.busy_spares_last && it->second.event && query_event(it->second.event) != 1) busy.push_back(it);
    else release(it);
  }
  if (!busy_too) return;
  for (auto it : busy) {
    if (!over()) return;
    release(it);
  }
}

void Residency::unmap_pieces(const Range& r) {
  grant_wait(r);  // never unmapped under the Granter's call
  const uint64_t t0 = mono_now_ns();
  uint64_t off = 0;
  for (const Piece& p : r.pieces) {
    d_.unmap(r.va + off, p.bytes);
    off += p.bytes;
  }
  st_.unmaps += r.pieces.size();
  const uint64_t ns = mono_now_ns() - t0;
  st_.unmap_ns += ns;
  if (!r.pieces.empty()) average(&unmap_avg_, ns / r.pieces.size());
}

void Residency::spare_pieces(Range& r) {
  add_spares(r.pieces, 0);
  r.pieces.clear();
}

bool Residency::can_back(const Range& r, uint64_t need) const {
  return o_.piece_max ? std::any_of(r.pieces.begin(), r.pieces.end(), [&](const Piece& p) { return p.bytes <= need; })
                      : r.bytes == need;
}

bool Residency::give_copies(uint64_t need) {
  for (uint32_t slot : copying_out_) {
    if (fits(need)) return true;
    Range& r = slots_[slot];
    if (r.given) continue;
    if (!can_back(r, need)) continue;
    r.given = true;
    out_bytes_ -= r.bytes;  // no longer coming back to us: the taker counts it
    add_spares(r.pieces, handover_event(r));
    ++st_.handovers;
    st_.clean_handovers += r.in_done != 0;
  }
  return fits(need);
}

void Residency::no_wait_for(const Range& r, uint64_t event) {
  for (const Piece& p : r.pieces) {
    auto [lo, hi] = spares_.equal_range(p.bytes);
    for (auto it = lo; it != hi; ++it)
      if (it->second.handle == p.handle && it->second.event == event) it->second.event = 0;
  }
}

void Residency::let_go_freed(uint32_t slot) {
  Range& r = slots_[slot];
  if (!r.free_event || query_event(r.free_event) == 1) {
    release_freed(slot);
    return;
  }
  // Its last work is still queued: the handles are mapped here until it ends, and a range that
  // maps one meanwhile has its stream wait for the free's event (which covers every stream that
  // touched the range: free() made the freeing stream wait for them).
  ++st_.freed_given;
  add_spares(r.pieces, r.free_event);
  r.given = true;
  by_va_.erase(r.va);
  retiring_.push_back(slot);
}

void Residency::retire_done(uint32_t slot) {
  Range& r = slots_[slot];
  std::erase(retiring_, slot);
  if (query_event(r.free_event) != 1) wait_event(r.free_event);
  unmap_pieces(r);
  no_wait_for(r, r.free_event);
  d_.unreserve(r.va, r.cap);
  drop_event(r.free_event);
  drop_event(r.copy_event);
  drop_event(r.read_event);
  r = Range{};
  free_slots_.push_back(slot);
}

void Residency::settle_given(uint64_t handle) {
  auto maps = [&](uint32_t slot) {
    const std::vector<Piece>& ps = slots_[slot].pieces;
    return std::any_of(ps.begin(), ps.end(), [&](const Piece& p) { return p.handle == handle; });
  };
  for (size_t i = 0; i < retiring_.size();) {
    if (maps(retiring_[i]))
      retire_done(retiring_[i]);  // erases it
    else
      ++i;
  }
  // Every range still copying out that maps it (a handle given on, mapped, and given again).
  for (size_t i = 0; i < copying_out_.size();) {
    if (slots_[copying_out_[i]].given && maps(copying_out_[i]))
      finish_evict(copying_out_[i]);  // erases it
    else
      ++i;
  }
}

void Residency::release_freed(uint32_t slot) {
  Range& r = slots_[slot];
  if (r.free_event && query_event(r.free_event) != 1) {
    wait_event(r.free_event);
  }
  if (r.copy_event) d_.event_sync(r.copy_event);
  unmap_pieces(r);
  spare_pieces(r);
  d_.unreserve(r.va, r.cap);
  by_va_.erase(r.va);
  drop_event(r.free_event);
  drop_event(r.copy_event);
  drop_event(r.read_event);
  r = Range{};
  free_slots_.push_back(slot);
}

bool Residency::back_range(Range& r, Stream s, std::string* why, uint64_t from, bool copied_into) {
  std::vector<Piece>& got = r.pieces;
  if (!from) got.clear();
  const size_t first = got.size();  // the pieces mapped before `from` stay
  std::vector<uint64_t> events;  // of the spares taken: given back with them if mapping fails
  // Refused: the handles taken go back to the spares, and `why` says what failed.
  auto refuse = [&](const char* what) {
    for (size_t i = first; i < got.size(); ++i)
      add_spare(got[i].bytes, got[i].handle, i - first < events.size() ? events[i - first] : 0);
    got.resize(first);
    if (why) *why = what;
    return false;
  };
  char buf[256];
  // Spares first (pick_spares); one still being copied out of makes `s` wait for that copy.
  // Then new handles for the rest: whole pieces of piece_max, and one handle for the tail.
  // (Tails in handles of a power of two granules were slower on the H200 and did not stop the
  // handles held from growing step after step: docs/results.md.)
  const uint64_t need = r.bytes - from;
  uint64_t left = need - pick_spares(need, &picks_);
  for (auto it : picks_) {
    got.push_back({it->second.handle, it->first});
    events.push_back(it->second.event);
    spare_bytes_ -= it->first;
    spares_.erase(it);
  }
  picks_.clear();
  const uint64_t top = o_.piece_max ? std::max(o_.piece_max, gran_) : 0;
  while (left) {
    const uint64_t size = top && left >= top ? top : left;
    // The caller made room for these bytes (make_room, fits); a handle past the limit means it
    // did not, and refusing here keeps that mistake from becoming a silent overrun.
    if (held_ + pool_share_ + size > limit()) {
      std::snprintf(buf, sizeof buf,
                    "backing a range of %s would hold %.3f GiB with %.3f GiB for the allocator's pool, over the "
                    "limit of %.3f GiB under the budget: no room was made for it",
                    SizeText(r.bytes).s, (held_ + size) / kGiB, pool_share_ / kGiB, limit() / kGiB);
      return refuse(buf);
    }
    const uint64_t t0 = mono_now_ns();
    const uint64_t h = d_.create_physical(size);
    const uint64_t made_ns = mono_now_ns() - t0;
    st_.create_ns += made_ns;
    average(&create_avg_, made_ns);
    if (!h) {
      std::snprintf(buf, sizeof buf,
                    "the device refused %.2f GiB with %.2f GiB held under a budget of %.2f GiB: memory outside "
                    "the allocator (the CUDA context, libraries) leaves less than the budget",
                    size / kGiB, held_ / kGiB, o_.budget / kGiB);
      return refuse(buf);
    }
    got.push_back({h, size});
    held_ += size;
    left -= size;
    ++st_.created;
    st_.created_bytes += size;
  }
  const uint64_t t0 = mono_now_ns();
  std::vector<uint64_t>& hs = run_handles_;
  std::vector<uint64_t>& sz = run_sizes_;
  hs.clear();
  sz.clear();
  for (size_t i = first; i < got.size(); ++i) hs.push_back(got[i].handle), sz.push_back(got[i].bytes);
  st_.maps += hs.size();
  const bool apart = granter_ && !copied_into;
  const bool mapped = apart ? d_.map_run_ungranted(r.va + from, hs.data(), sz.data(), hs.size())
                            : d_.map_run(r.va + from, hs.data(), sz.data(), hs.size());
  if (!mapped) return refuse("mapping a range failed");
  if (apart && !hs.empty()) {
    // Granted on the Granter's thread: `s` waits for it on the GPU; any other stream, when a
    // launch there touches the range first (before_launch), or the copy out (enqueue_copy_out).
    uint64_t bytes = 0;
    for (uint64_t b : sz) bytes += b;
    r.grant_no = granter_->ask(r.va + from, bytes);
    ++st_.grants_apart;
    // A stream being captured into a graph: the host waits instead (a graph replays long after).
    if (o_.fault == Options::Fault::SkipGrantWait) {
    } else if (d_.stream_capturing(s) == 1 || !d_.stream_wait_word(s, r.grant_no)) {
      grant_wait(r);
    } else {
      ++st_.grant_stream_waits;
    }
  }
  const uint64_t map_ns = mono_now_ns() - t0;
  st_.map_ns += map_ns;
  if (!hs.empty()) average(&map_avg_, map_ns / hs.size());
  // Copies out held back while this range was mapped go now, and `s` waits for the work still
  // reading the spares it took (a copy out, a freed range's work): only after the copies are
  // queued, as their events are recorded with them.
  flush_copies();
  bool waited = false;
  if (o_.fault != Options::Fault::SkipGivenWait)
    for (uint64_t e : events)
      if (e) waited |= order_after(s, e);
  // Whoever its memory goes to next waits for those users too, by way of the range: its first
  // launch on `s`, or else free_event, recorded when it goes out or is freed (carry_out; once
  // per mapping, an event record cost about 0.1 s a step on an H100). Without it, a range given
  // on before any launch touched it let its taker write a handle that a freed range's last
  // launch still read (docs/results.md).
  if (waited && o_.fault != Options::Fault::SkipMapCarry) {
    if (r.carry != s) carry_out(r);
    r.carry = s;
  }
  note_footprint();
  return true;
}


uint64_t Residency::range_size(uint64_t bytes) const {
  const uint64_t size = round_up(bytes, gran_);
  const uint64_t top = std::max(o_.piece_max, gran_);
  if (!o_.size_classes || !o_.piece_max || size % top == 0) return size;
  const uint64_t tail = size % top;
  // Classes of 2^k and 3 * 2^(k-1) granules: each at most 1.5x the one below it.
  uint64_t c = gran_;
  for (uint64_t p = gran_; c < tail; p *= 2) {
    if (p >= tail) c = p;
    else if (p >= 2 * gran_ && p + p / 2 >= tail) c = p + p / 2;
  }
  c = std::min(c, top);
  return (c - tail) * 8 <= size ? size - tail + c : size;
}

bool Residency::refit_plan(const Range& r, uint64_t size, size_t* keep, uint64_t* kept) const {
  if (size > r.cap || r.pieces.empty()) return false;
  uint64_t end = 0;
  size_t i = 0;
  while (i < r.pieces.size() && end + r.pieces[i].bytes <= size) end += r.pieces[i++].bytes;
  // The piece across `size` stays when little of it lies past (held unused until the next free):
  // dropping it would cost an unmapping and a mapping of a tail.
  if (i < r.pieces.size() && end < size && end + r.pieces[i].bytes - size <= std::max(gran_, size / 8))
    end += r.pieces[i++].bytes;
  if (!end) return false;
  *keep = i;
  *kept = end;
  return true;
}

int32_t Residency::refit_cached(uint64_t size, Stream s, std::string* why, bool* refused) {
  *refused = false;
  if (size + pool_share_ > limit()) return -1;  // the new range's path says why
  // The freed range whose refit costs least, if less than a new range: bytes mapped after the
  // pieces kept, and a quarter of those dropped past the new size (an unmapping costs about a
  // third of a mapping on the H200, and a freed range is unmapped sooner or later anyway).
  auto best = cached_.end();
  uint64_t best_cost = size, best_kept = 0;
  size_t best_keep = 0;
  for (auto it = cached_.begin(); it != cached_.end() && best_cost; ++it) {
    const Range& r = slots_[it->second];
    size_t keep = 0;
    uint64_t kept = 0;
    if (!refit_plan(r, size, &keep, &kept)) continue;
    const uint64_t cost = (r.bytes - kept) / 4 + (size > kept ? size - kept : 0);
    if (cost >= best_cost) continue;
    // Pieces are unmapped only once the free is known complete: its work may still use them.
    if (keep < r.pieces.size() && r.free_event && o_.fault != Options::Fault::SkipRefitFreeCheck &&
        query_event(r.free_event) != 1)
      continue;
    best = it, best_cost = cost, best_keep = keep, best_kept = kept;
  }
  if (best == cached_.end()) return -1;
  const uint32_t slot = best->second;
  Range& r = slots_[slot];
  cached_.erase(best);
  cached_bytes_ -= r.bytes;
  if (r.free_stream != s) order_after(s, r.free_event);
  if (best_keep < r.pieces.size()) {
    grant_wait(r);
    const uint64_t t0 = mono_now_ns();
    uint64_t off = best_kept;
    for (size_t i = best_keep; i < r.pieces.size(); ++i) {
      d_.unmap(r.va + off, r.pieces[i].bytes);
      off += r.pieces[i].bytes;
      add_spare(r.pieces[i].bytes, r.pieces[i].handle, 0);
      ++st_.unmaps;
    }
    st_.unmap_ns += mono_now_ns() - t0;
    r.pieces.resize(best_keep);
  }
  r.bytes = best_kept;
  if (size > best_kept) {
    r.bytes = size;
    if (!make_room(size - best_kept, nullptr, 0, why) || !back_range(r, s, why, best_kept)) {
      r.bytes = best_kept;  // freed again, as it was kept
      cached_.emplace(r.bytes, slot);
      cached_bytes_ += r.bytes;
      *refused = true;
      return -1;
    }
  }
  return int32_t(slot);
}

}  // namespace offload

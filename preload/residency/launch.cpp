// Residency at a launch: the page-fault handler (reloads before the launch is forwarded), the
// launches in flight, the per-stream events that order evictions after a range's last use,
// pointer tables, and the refusal of a launch the budget cannot hold. residency.h says why.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "common/log.h"
#include "residency/residency.h"

namespace offload {
namespace {

thread_local bool tl_refused = false;
thread_local bool tl_last_try = false;
thread_local bool tl_captured = false;

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

bool Residency::refusal_pending() { return tl_refused; }
bool Residency::last_launch_captured() { return tl_captured; }
Residency::LastTry::LastTry() { tl_last_try = true; }
Residency::LastTry::~LastTry() { tl_last_try = false; }

void Residency::count_refused_alloc() {
  if (!external_ || tl_last_try) ++st_.refused_allocs;
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
  Busy busy(*this);
  close_inflight(f);
  if (rc_.probe.active) rc_finish_probe();
}

uint64_t StreamRing::captured(uint64_t want, bool ours) const {
  if (ours) return want;  // the manager's own stream: all its work is queued under the lock
  if (unlisted) return 0;  // launches in flight not listed: none is known forwarded
  uint64_t n = std::min(want, closed);
  for (uint32_t i = 0; i < nopen; ++i) n = std::min(n, open[i] - 1);
  return n;
}

void Residency::open_inflight(InFlight& f, Stream s, uint64_t launch_no) {
  if (f.owner == this) close_inflight(f);  // the hook did not report the last one forwarded
  f.owner = this;
  f.s = s;
  f.launch = launch_no;
  f.n = 0;
  StreamRing& ring = rings_[s];
  if (ring.nopen < StreamRing::kOpen) ring.open[ring.nopen++] = launch_no;
  else ++ring.unlisted;
}

void Residency::close_inflight(InFlight& f) {
  f.owner = nullptr;
  for (uint32_t i = 0; i < f.n; ++i)
    if (slots_[f.slots[i]].inflight) --slots_[f.slots[i]].inflight;
  StreamRing& ring = rings_[f.s];
  const auto it = std::find(ring.open, ring.open + ring.nopen, f.launch);
  if (it != ring.open + ring.nopen) *it = ring.open[--ring.nopen];
  else if (ring.unlisted) --ring.unlisted;
  ring.closed = std::max(ring.closed, f.launch);
  size_t k = ring.next;
  if (!ring.events[k]) ring.events[k] = create_event();
  if (ring.events[k] && record_event(ring.events[k], f.s)) {
    ring.after[k] = ring.captured(f.launch, o_.fault == Options::Fault::TagEventsAsAsked);
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
  // No launch of `s` was recorded after `launch`: an event recorded now captures all queued on
  // `s` so far, which is all the caller asks for (ranges in flight are never evicted or freed
  // from under their launch). Later askers may rely on it only as far as it is known forwarded.
  size_t k = ring.next;
  if (!ring.events[k]) ring.events[k] = create_event();
  if (!ring.events[k] || !record_event(ring.events[k], s)) return 0;
  ring.after[k] = ring.captured(launch, s == copy_stream_ || s == prefetch_stream_ ||
                                            o_.fault == Options::Fault::TagEventsAsAsked);
  ring.next = (k + 1) % StreamRing::kSize;
  return ring.events[k];
}

void Residency::note_touch(std::vector<recompute::Touch>& touches, Stream s, uint64_t launch) {
  for (recompute::Touch& t : touches)
    if (t.s == s) {
      t.launch = std::max(t.launch, launch);
      return;
    }
  touches.push_back({s, launch});
}

void Residency::order_after_touches(Stream s, const std::vector<recompute::Touch>& touches) {
  for (const recompute::Touch& t : touches)
    if (t.s != s)
      if (uint64_t e = event_after(t.s, t.launch)) order_after(s, e);
}

// ---- Launches: the page-fault handler ------------------------------------------------------

void Residency::give_host_after(Range& r, uint64_t event) {
  pending_host_.push_back({r.host, r.bytes, event});
  r.host = nullptr;
}

bool Residency::release_clean(Range& r) {
  // host_read is set only while the range is resident or copying in (start_evict takes it).
  if (!r.host_read) return false;
  give_host_after(r, std::exchange(r.host_read, 0));
  return true;
}

void Residency::copying_in(Range& r, Stream s) {
  if (!r.copy_event) r.copy_event = new_event();
  record_event(r.copy_event, s);
  r.in_stream = s;
  r.state = State::CopyingIn;
}

bool Residency::bring_back(uint32_t slot, Stream s, const uint32_t* keep, size_t nkeep, std::string* why) {
  if (slots_[slot].dropped) return rc_restore(slot, s, keep, nkeep, why);
  if (o_.recompute) rc_side_room(slot, s, keep, nkeep);
  return (o_.fault == Options::Fault::SkipReloadRoom || make_room(slots_[slot].bytes, keep, nkeep, why)) &&
         reload(slot, s, why);
}

bool Residency::reload(uint32_t slot, Stream s, std::string* why, bool keep_host) {
  Range& r = slots_[slot];
  if (!back_range(r, s, why, 0, true)) return false;
  if (o_.recompute && r.producer >= 0 && rc_remake(slot, s)) return true;
  if (o_.recompute && r.producer < 0) {
    // Lasting: alive for longer than a step (weights, optimizer state), never made by a launch.
    const uint64_t now = last_launch_.load(std::memory_order_relaxed);
    const bool lasting = period_ && now > r.birth && now - r.birth > period_;
    ++(r.producer_lost ? st_.copied_lost : lasting ? st_.copied_lasting : st_.copied_unmade);
    if (r.producer_lost) rc_count_kept_back(r);
  }
  if (r.dropped) {
    // Its bytes exist nowhere else: the rules that let it be dropped keep this from happening.
    log().error("recompute: a dropped range of {:.1f} MiB could not be made again: its bytes are lost",
                r.bytes / double(1 << 20));
    std::abort();
  }
  // The driver checks a copy's memory when it is queued: back_range granted it where it mapped
  // it, and the pieces kept of a freed range refitted had their grants asked for before.
  if (o_.fault != Options::Fault::SkipGrantWait) grant_wait(r);
  const uint64_t piece = host_.pin_piece();
  const auto* src = static_cast<const unsigned char*>(r.host);
  const uint64_t t0 = mono_now_ns();
  for (uint64_t off = 0; off < r.bytes; off += piece)
    d_.copy_to_device(r.va + off, src + off, std::min(piece, r.bytes - off), s);
  st_.copy_ns += mono_now_ns() - t0;
  copying_in(r, s);
  // The host slot goes back once the copy has read it; a prefetch keeps it until the range is
  // touched, so that going out again unused copies nothing.
  const uint64_t done = new_event();
  record_event(done, s);
  if (keep_host) {
    r.host_read = done;
  } else {
    give_host_after(r, done);
  }
  ++st_.reloads;
  st_.bytes_in += r.bytes;
  return true;
}

void Residency::refuse_launch(uint32_t kernel, uint64_t bytes, size_t ranges, const std::string& why) {
  const std::string name = namer_ ? namer_(namer_ctx_, kernel) : std::string("kernel ") + std::to_string(kernel);
  // What else the budget holds: the pool's share, and memory grown outside the allocator.
  char other[160];
  const int len = std::snprintf(other, sizeof other, "%.2f GiB set aside for the allocator's pool", pool_share_ / kGiB);
  if (outside_ + o_.headroom)
    std::snprintf(other + len, sizeof other - len, ", %.2f GiB used outside the allocator (libraries, kernels)",
                  (outside_ + o_.headroom) / kGiB);
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "%s touches %.2f GiB in %zu ranges, which the device budget of %.2f GiB cannot hold at once (%s)%s%s: "
                "the launch is refused with out-of-memory",
                name.c_str(), bytes / kGiB, ranges, o_.budget / kGiB, other, why.empty() ? "" : "; ", why.c_str());
  error_ = buf;
  tl_refused = true;
  if (external_ && !tl_last_try) return;  // another owner may give its room back first
  if (st_.refused_launches++ == 0) log().error("{}", error_);
}

void Residency::before_launch(uint64_t launch_no, EventKind kind, uint32_t kernel, Stream s, const AllocId* acc,
                              size_t n, uint8_t flags) {
  last_launch_.store(launch_no, std::memory_order_relaxed);
  tl_captured = false;
  if (!any_.load(std::memory_order_acquire)) return;
  const bool blind = blind_launch(kind, flags);
  const bool ranges = n && acc[n - 1] >= kRangeIdBit;
  // A kernel that points at one small allocation and nothing else tracked (a fill) leaves it new
  // for the launch that then writes it, when it is recorded to be launched again before that one.
  const bool small_fill = o_.recompute && !blind && kind == EventKind::Kernel && n == 1 && !ranges &&
                          o_.fault != Options::Fault::RecomputeNoPrelude;
  const AllocId small_floor = o_.recompute ? rc_floor_smalls(blind, acc, small_fill ? 0 : n) : 0;
  if (!ranges && !blind && !small_fill && !has_tables_.load(std::memory_order_acquire) &&
      !rc_small_watch_.load(std::memory_order_acquire))
    return;
  if (o_.fault != Options::Fault::IgnoreCapture && d_.stream_capturing(s) == 1) {
    if (small_fill) rc_floor_smalls(false, acc, n);  // a graph's launch: never launched again from here
    tl_captured = true;
    note_captured(launch_no, s, acc, n);
    return;
  }
  Busy busy(*this);
  DeferCopies defer(*this);
  decide_costs();
  if (capture_open_ && s == capture_stream_) capture_open_ = false;
  launches_seen_ = launch_no;
  rc_.small_floor = small_floor;
  if (small_fill) {
    const LaunchArgs* a = current_launch_args();
    if (tables_.count(acc[0]) || !rc_described(a) || !rc_note_small_fill(kernel, acc[0], a, rc_args_len(*a)))
      rc_floor_smalls(false, acc, n);  // not kept: a launch like any other
  }
  std::vector<uint32_t>& touched = scratch_;
  collect_touched(blind, acc, n, &touched);
  // Small allocations producers read: a launch we cannot see into may write any of them.
  if (touched.empty()) {
    if (o_.recompute) rc_note_smalls_only(blind, acc, n, s, launch_no);
    return;
  }
  if (o_.recompute && blind) rc_bump_smalls(true, acc, n);
  uint64_t total = 0;
  for (uint32_t k : touched) total += slots_[k].bytes;
  largest_need_ = std::max(largest_need_, total);
  if (total + pool_share_ > limit() && !shrink_pool_share(limit() - std::min(limit(), total))) {
    refuse_launch(kernel, total, touched.size(), blind ? "a launch we cannot see into needs every range" : "");
    return;
  }
  // What it may write: no range made from one of those is dropped while it is being made.
  RcWriting writing(*this, o_.recompute);
  if (o_.recompute) {
    rc_.described = rc_may_write(kernel, blind || kind != EventKind::Kernel, touched, acc, n);
    rc_.prepared = true;  // for rc_note_launch, unless the launch is refused first
    rc_.writes = rc_.written;
    rc_small_writes(blind, acc, n);
  }
  // Prefetches due at or before this launch go first: one due for a range this launch touches
  // still beats a demand reload, by being on its own stream.
  uint64_t t0 = mono_now_ns();
  prefetch_due(launch_no);
  st_.ahead_ns += mono_now_ns() - t0;
  for (uint32_t k : touched)
    if (slots_[k].state == State::CopyingOut) abandon(slots_[k]);
  for (uint32_t k : touched) {
    Range& r = slots_[k];
    if (r.state != State::OnHost) continue;
    std::string why;
    // A kernel not checked yet is made again, and checked, even where its inputs must come back
    // first: without a first remake nothing of it is ever dropped.
    const bool back =
        (o_.recompute && rc_check_wanted(k) && rc_restore(k, s, touched.data(), touched.size(), &why)) ||
        bring_back(k, s, touched.data(), touched.size(), &why);
    if (!back) {
      refuse_launch(kernel, total, touched.size(), why);
      return;
    }
  }
  if (o_.recompute) {
    // Dropped ranges made from what this launch may write are made again before it.
    std::string why;
    if (!rc_guard(rc_.writes, s, touched.data(), touched.size(), &why) ||
        !rc_guard_smalls(s, touched.data(), touched.size(), &why)) {
      refuse_launch(kernel, total, touched.size(), why);
      return;
    }
  }
  if (granter_) {  // ranges whose grants are not known made yet: the launch waits for them
    uint64_t last = 0;
    for (uint32_t k : touched)
      if (grant_pending(slots_[k])) last = std::max(last, slots_[k].grant_no);
    if (!last || o_.fault == Options::Fault::SkipGrantWait) {
    } else if (kind == EventKind::Kernel && d_.stream_wait_word(s, last)) {
      ++st_.grant_stream_waits;  // a kernel's memory is looked at only when it runs
    } else {
      // The driver checks a copy's or a memset's device memory when it is called: on an H100 a
      // copy into a range not granted yet failed there with an invalid argument. The host waits.
      grant_wait_for(last);
    }
  }
  InFlight& f = tl_inflight;
  open_inflight(f, s, launch_no);
  for (uint32_t k : touched) mark_touched(k, s, launch_no, f);
  if (o_.recompute) rc_note_launch(kernel, s, launch_no, acc, n, touched, blind || kind != EventKind::Kernel);
  t0 = mono_now_ns();
  evict_ahead(touched.data(), touched.size());
  st_.ahead_ns += mono_now_ns() - t0;
}

void Residency::rc_note_smalls_only(bool blind, const AllocId* acc, size_t n, Stream s, uint64_t launch_no) {
  // A launch touching no range (an optimizer's step on small parameters, a copy into one): every
  // small allocation it touches is taken as written, and ranges dropped from one are made again
  // first.
  RcWriting writing(*this, true);
  rc_.learned = false;
  rc_.smalls.clear();
  rc_small_writes(blind, acc, n);
  std::string why;
  if (!rc_guard_smalls(s, nullptr, 0, &why)) log().error("recompute: before a launch: {}", why);
  rc_bump_smalls(blind, acc, n);
  rc_touch_smalls(blind, acc, n, s, launch_no);
}

void Residency::note_captured(uint64_t launch_no, Stream s, const AllocId* acc, size_t n) {
  std::lock_guard<std::mutex> lk(mu_);
  // A capture begins at its stream's first captured launch since that stream's last launch
  // outside one (as far as the scan sees: launches that touch a range).
  if (!capture_open_ || capture_stream_ != s) {
    capture_open_ = true;
    capture_stream_ = s;
    capture_from_ = launch_no;
  }
  if (!st_.captured_launches++) {
    log().info("a CUDA graph is being captured: nothing is moved for its launches, and each replay makes every "
               "live range resident first ({:.2f} GiB now, device budget {:.2f} GiB)",
               st_.live_bytes / kGiB, o_.budget / kGiB);
  }
  // Ranges a captured launch touches that were born during the capture: a capture's allocation
  // that did not go to the allocator (its stream said it was not capturing).
  for (size_t i = n; i-- > 0 && acc[i] >= kRangeIdBit;)
    if (is_range_id(acc[i]) && range_slot(acc[i]) < slots_.size()) {
      Range& r = slots_[range_slot(acc[i])];
      if (r.live && r.birth >= capture_from_) ++st_.captured_touch_new;
      if (r.live && r.state != State::Resident) ++st_.captured_touch_out;
      r.in_graph = r.live;
    }
}

void Residency::collect_touched(bool blind, const AllocId* acc, size_t n, std::vector<uint32_t>* out) const {
  std::vector<uint32_t>& touched = *out;
  touched.clear();
  if (blind) {
    for (uint32_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].live) touched.push_back(i);
    return;
  }
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

void Residency::mark_touched(uint32_t k, Stream s, uint64_t launch_no, InFlight& f) {
  Range& r = slots_[k];
  const bool copying_in = r.state == State::CopyingIn;
  if (r.state == State::CopyingIn && r.in_stream != s) {
    if (query_event(r.copy_event) == 1) {
      copied_in(r);
    } else {
      order_after(s, r.copy_event);
      ++st_.event_waits;
    }
  }
  // A launch on the stream that waited for its spares' earlier users follows those waits; so
  // does one after its copy in there (waited for above, or on that stream itself).
  if (r.carry && (r.carry == s || (copying_in && r.in_stream == r.carry))) r.carry = 0;
  if (r.read_stream && r.read_stream != s && o_.fault != Options::Fault::RecomputeSkipReadOrder) {
    if (query_event(r.read_event) == 1) r.read_stream = 0;
    else order_after(s, r.read_event);
  }
  add_touch(r, s, launch_no);
  r.last_use = launch_no;
  const uint64_t age = launch_no - r.birth;
  if (r.life.size() < kLifeUses && age <= UINT32_MAX && (r.life.empty() || r.life.back() != age))
    r.life.push_back(static_cast<uint32_t>(age));
  release_clean(r);  // it may be written now
  if (r.prefetched) {
    r.prefetched = false;
    ++st_.prefetch_hits;
    const uint64_t lead = launch_no - std::min(launch_no, r.pf_at);
    st_.prefetch_hit_lead += lead;
    // Still copying when its launch came: prefetches start twice as early from now on, unless
    // (lead_grow_unwasted) one went out unused within the lead's launches before it.
    if (r.state == State::CopyingIn && query_event(r.copy_event) != 1) {
      ++st_.prefetch_late;
      st_.prefetch_late_lead += lead;
      st_.prefetch_late_out += r.pf_at - std::min(r.pf_at, r.out_at);
      const bool wasted_near = o_.lead_grow_unwasted && pf_wasted_at_ && launch_no < pf_wasted_at_ + pf_lead_;
      if (!wasted_near) pf_lead_ = std::min(2 * pf_lead_, lead_ceiling());
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

void Residency::note_pointer_table(AllocId table, const AllocId* targets, size_t n) {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<AllocId>& v = tables_[table];
  v.clear();
  for (size_t i = 0; i < n; ++i)
    if (is_range_id(targets[i])) v.push_back(targets[i]);
  if (v.empty()) tables_.erase(table);
  has_tables_.store(!tables_.empty(), std::memory_order_release);
}

void Residency::forget_table(AllocId table, Stream s) {
  if (!has_tables_.load(std::memory_order_acquire) && !rc_small_watch_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lk(mu_);
  tables_.erase(table);
  has_tables_.store(!tables_.empty(), std::memory_order_release);
  auto it = rc_.small.find(table);
  if (it == rc_.small.end()) return;
  if (it->second.dependents) {  // dropped ranges made from it: made again while its bytes are there
    RcWriting writing(*this, true);
    rc_.small_writes.assign(1, table);
    std::string why;
    if (!rc_guard_smalls(s, nullptr, 0, &why, /*freeing=*/true)) log().error("recompute: before a free: {}", why);
    it = rc_.small.find(table);
  }
  // Freed after a launch made again put it back on another stream (the pool may hand it on).
  if (it->second.put_stream && it->second.put_stream != s && o_.fault != Options::Fault::RecomputeSkipReadOrder)
    order_after(s, it->second.put_event);
  it->second.freed = true;
  it->second.version = ++rc_.clock;
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
  grant_wait(r);      // a pointer query is answered from the mapping's access
  release_clean(r);  // the host may write it through the pointer
  if (r.state == State::CopyingOut) abandon(r);
  if (r.state != State::OnHost) return;
  const uint32_t keep = uint32_t(k);
  std::string why;
  if (!copy_stream_) copy_stream_ = d_.create_stream();
  if (!bring_back(keep, copy_stream_, &keep, 1, &why)) {
    error_ = why;
    log().error("reloading a range for a pointer query failed: {}", why);
    return;
  }
  wait_event(r.copy_event);
  copied_in(r);
}

}  // namespace offload

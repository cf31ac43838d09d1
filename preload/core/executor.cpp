#include "core/executor.h"

#include <x86intrin.h>

#include <algorithm>
#include <numeric>
#include <cstdlib>

#include "common/log.h"
#include "core/executor_copy.h"

namespace offload {

Executor::Executor(Driver& driver, Options o) : driver_(driver), opt_(o) {}

Executor::~Executor() {
  std::lock_guard lock(mu_);
  teardown_locked();
  poll_locked();
  give_back_weights();  // those not resident stay ours: the process is going away
}

void Executor::teardown_locked() {
  installed_.store(false, std::memory_order_release);
  for (Arena& a : arenas_) {
    if (a.handle >= 0) driver_.unmap(a.va, plan_.handle_bytes);
    for (uint64_t e : a.events)
      if (e) driver_.destroy_event(e);
    if (a.ev_d2h) driver_.destroy_event(a.ev_d2h);
    if (a.ev_h2d) driver_.destroy_event(a.ev_h2d);
  }
  arenas_.clear();
  // held_ counts the streamed weights' memory too, which a new install may keep (the same
  // weights): only the arenas' handles go from it.
  for (uint64_t h : handles_)
    if (h) {
      driver_.release_physical(h);
      ++st_.handles_released;
      held_.fetch_sub(plan_.handle_bytes);
      if (room_) room_->give(plan_.handle_bytes);
    }
  handles_.clear();
  free_handles_.clear();
  busy_.clear();
  if (reservation_) driver_.unreserve(reservation_, reservation_bytes_);
  reservation_ = 0;
  reservation_bytes_ = 0;
  va_lo_.store(0);
  va_hi_.store(0);
}

bool Executor::idle() {
  std::lock_guard lock(mu_);
  poll_locked();
  for (const Arena& a : arenas_)
    if (a.state != State::Empty) return false;
  for (const Weight& w : weights_)
    if (w.state != State::Resident && w.state != State::Empty) return false;
  return true;
}

bool Executor::install(Plan plan, uint64_t anchor, HostMemory host, std::string* why) {
  std::lock_guard lock(mu_);
  poll_locked();
  if (!may_install_locked(plan, why)) return false;
  if (!offload_stream_) offload_stream_ = driver_.create_stream();
  if (!prefetch_stream_) prefetch_stream_ = driver_.create_stream();
  if (!offload_stream_ || !prefetch_stream_) {
    *why = "the driver would not create the copy streams";
    return false;
  }
  // Same geometry as before (the same plan again after a deviation): keep the addresses and
  // the handles, so the members land where they did.
  bool same = reservation_ && plan_.handle_bytes == plan.handle_bytes && arenas_.size() == plan.arenas.size();
  if (!same) teardown_locked();
  if (!same && !plan.arenas.empty() && !make_arenas_locked(plan, why)) return false;
  plan_ = std::move(plan);
  std::string weights_why;
  if (!install_weights(&weights_why)) {
    log().warn("weights stay resident: {}", weights_why);
    plan_.windows.clear();
    if (plan_.arenas.empty()) {
      *why = "weights cannot be streamed: " + weights_why;
      return false;
    }
  }
  schedule_locked();
  // Handles of another size are of no use to this plan.
  for (size_t h = 0; h < handles_.size() && !same; ++h) give_handle(static_cast<int>(h));
  anchor_ = anchor;
  host_ = host;
  active_ = false;
  cursor_ = 0;
  pending_reloads_.clear();
  tables_.clear();  // arena numbers of another plan
  step_misses_ = step_late_ = 0;
  step_waits_.clear();
  step_waits_.reserve(kWaitsKept);
  step_wait_count_ = step_drained_ = 0;
  sub_launch_ = ~uint64_t{0};
  deviated_.store(false);
  va_lo_.store(reservation_);
  va_hi_.store(reservation_ + reservation_bytes_);
  ++st_.installs;
  first_step_due_ = true;
  st_.plan = plan_.describe();
  installed_.store(true, std::memory_order_release);
  return true;
}

bool Executor::may_install_locked(const Plan& plan, std::string* why) const {
  for (const Arena& a : arenas_)
    if (a.state != State::Empty) {
      *why = "the previous plan's arenas still hold data";
      return false;
    }
  for (const Weight& w : weights_)
    if (w.state != State::Resident && w.state != State::Empty) {
      *why = "the previous plan's weights are not all back";
      return false;
    }
  if (plan.empty() || plan.step_launches == 0 || (!plan.arenas.empty() && plan.handle_bytes == 0)) {
    *why = "the plan moves nothing";
    return false;
  }
  return true;
}

bool Executor::make_arenas_locked(const Plan& plan, std::string* why) {
  reservation_bytes_ = plan.handle_bytes * plan.arenas.size();
  reservation_ = driver_.reserve(reservation_bytes_);
  if (!reservation_) {
    *why = "the driver would not reserve " + std::to_string(reservation_bytes_ >> 20) + " MiB of address space";
    reservation_bytes_ = 0;
    return false;
  }
  arenas_.resize(plan.arenas.size());
  busy_.reserve(arenas_.size());
  pending_reloads_.reserve(arenas_.size());
  for (size_t i = 0; i < arenas_.size(); ++i) {
    Arena& a = arenas_[i];
    a.va = reservation_ + i * plan.handle_bytes;
    for (uint64_t& e : a.events) e = driver_.create_event();
    a.ev_d2h = driver_.create_event();
    a.ev_h2d = driver_.create_event();
    bool ok = a.ev_d2h && a.ev_h2d;
    for (uint64_t e : a.events) ok = ok && e;
    if (!ok) {
      teardown_locked();
      *why = "the driver would not create events";
      return false;
    }
  }
  return true;
}

void Executor::schedule_locked() {
  actions_.clear();
  for (size_t i = 0; i < arenas_.size(); ++i) {
    Arena& a = arenas_[i];
    const ArenaPlan& ap = plan_.arenas[i];
    a.used = ap.used;
    a.host_offset = ap.host_offset;
    a.members.clear();
    a.filled_step = ~uint64_t{0};
    actions_.push_back(Action{ap.evict_after + 1, static_cast<uint32_t>(i), true, false});
    actions_.push_back(Action{ap.reload_at, static_cast<uint32_t>(i), false, false});
  }
  const auto n = static_cast<int64_t>(plan_.step_launches);
  for (size_t k = 0; k < plan_.windows.size(); ++k) {
    const WeightWindow& w = plan_.windows[k];
    // Evicted at the first launch after its last use; a use at the step's last launch is
    // followed by the next step's first.
    actions_.push_back(Action{(w.evict_after + 1) % n, static_cast<uint32_t>(k), true, true});
    actions_.push_back(Action{w.reload_at, static_cast<uint32_t>(k), false, true});
  }
  for (const MemberPlan& m : plan_.members) arenas_[m.arena].members.push_back(Member{m.offset, m.bytes, false});
  for (Arena& a : arenas_)
    std::sort(a.members.begin(), a.members.end(), [](const Member& x, const Member& y) { return x.offset < y.offset; });
  // By position; at one position evictions first, then arenas' reloads in backward order
  // (held-back reloads are queued in this order), then weights' by their next use.
  auto until_use = [&](const Action& a) { return (plan_.windows[a.index].use - a.pos + n) % n; };
  std::stable_sort(actions_.begin(), actions_.end(), [&](const Action& x, const Action& y) {
    if (x.pos != y.pos) return x.pos < y.pos;
    if (x.evict != y.evict) return x.evict;
    if (x.evict) return false;
    if (x.weight != y.weight) return !x.weight;
    if (x.weight) return until_use(x) < until_use(y);
    return reload_before(plan_.arenas[x.index], x.index, plan_.arenas[y.index], y.index);
  });
}

// ---- hot path ----------------------------------------------------------------------------

DevPtr Executor::place(uint64_t bytes, Stream s, uint64_t next_launch, uint64_t* tag) {
  if (!installed_.load(std::memory_order_acquire)) return 0;
  std::lock_guard lock(mu_);
  if (!active_ || next_launch < anchor_) return 0;
  const uint64_t pos = (next_launch - anchor_) % plan_.step_launches;
  // The step the allocation belongs to: that of the launch it is born before (an allocation
  // made before a step's first launch belongs to that step, not the one ending).
  const uint64_t alloc_step = (next_launch - anchor_) / plan_.step_launches;
  if (sub_launch_ != next_launch) {
    sub_launch_ = next_launch;
    sub_ = 0;
  }
  const uint32_t k = sub_++;
  const MemberPlan* mp = nullptr;
  for (uint32_t j = plan_.member_index[pos]; j < plan_.member_index[pos + 1]; ++j)
    if (plan_.members[j].sub == k) mp = &plan_.members[j];
  if (!mp) return 0;
  if (mp->bytes != bytes) {
    deviate("an allocation's size differs from the plan's");
    return 0;
  }
  Arena& a = arenas_[mp->arena];
  auto member = std::lower_bound(a.members.begin(), a.members.end(), mp->offset,
                                 [](const Member& m, uint64_t off) { return m.offset < off; });
  if (member == a.members.end() || member->offset != mp->offset || member->live) {
    if (st_.arena_busy++ < 3)
      log().info("arena {} busy at launch {} of the step: its slot is still held ({})", mp->arena, pos, describe_handles());
    return 0;
  }
  if (a.state == State::Draining) {
    // Freed last step, its last work perhaps still queued: the new member's stream waits for
    // that work (or, without hand-overs, the host does) and the mapping is kept. A handed
    // arena's memory is another's now: it settles, and takes a handle below.
    poll_locked();
    if (a.state == State::Draining && a.handed) {
      settle_handed(a);
    } else if (a.state == State::Draining && !a.overflow) {
      if (opt_.hand_over) gpu_wait_leaving(a, s);
      else host_wait_leaving(a);
      a.state = State::Resident;
      a.nstreams = 0;
      a.h2d_pending = false;
      a.filled_step = alloc_step;  // a fresh fill, on the memory it already has
    }
  }
  if (a.state == State::Empty) {
    int h = acquire_handle(false, s);
    if (h < 0) {
      ++st_.no_handle;
      return 0;
    }
    if (!driver_.map(a.va, plan_.handle_bytes, handles_[static_cast<size_t>(h)])) {
      give_handle(h);
      ++st_.arena_busy;
      return 0;
    }
    a.handle = h;
    a.state = State::Resident;
    a.nstreams = 0;
    a.overflow = false;
    a.h2d_pending = false;
  } else if (a.state != State::Resident || a.filled_step != alloc_step) {
    if (st_.arena_busy++ < 3)  // last step's members still alive, or being moved
      log().info("arena {} busy at launch {} of the step: {}", mp->arena, pos, describe_handles());
    return 0;
  }
  a.filled_step = alloc_step;
  member->live = true;
  ++a.live;
  member_live_.fetch_add(bytes, std::memory_order_relaxed);
  ++st_.placed;
  *tag = mp->arena + 1;
  return a.va + mp->offset;
}

bool Executor::release(DevPtr p, Stream s) {
  // The weights' span [weight_lo_, weight_hi_) is a quick test, not ownership: the arenas'
  // reservation, or the pool's other blocks, may lie between two weights (the driver places
  // ranges where it likes), so a pointer in it that is no weight goes on to the arenas.
  if (p >= weight_lo_.load(std::memory_order_relaxed) && p < weight_hi_.load(std::memory_order_relaxed)) {
    std::lock_guard lock(mu_);
    int i = weight_at(p);
    if (i >= 0 && weights_[static_cast<size_t>(i)].va == p && weights_[static_cast<size_t>(i)].state != State::Empty) {
      // The application frees a streamed weight: its backing goes back to the pool, which
      // frees it in stream order on `s`; our copies on it are ordered before that.
      Weight& w = weights_[static_cast<size_t>(i)];
      if (w.state == State::Evicting && w.handed()) settle_handed(w);
      if (w.state == State::Evicting) {
        driver_.stream_wait(s, w.ev_d2h);
        w.state = State::Resident;
      } else if (w.state == State::Evicted) {
        remap_weight(w, s, "a freed streamed weight (for the pool)");  // its bytes are dead: mapped, not copied
        w.state = State::Resident;
      }
      if (w.h2d_pending) driver_.stream_wait(s, w.ev_h2d);
      lend_back(w);
      deviate("a streamed weight was freed");
      return false;
    }
  }
  if (p < va_lo_.load(std::memory_order_relaxed) || p >= va_hi_.load(std::memory_order_relaxed)) return false;
  std::lock_guard lock(mu_);
  if (arenas_.empty() || p < reservation_ || p >= reservation_ + reservation_bytes_) return false;
  Arena& a = arenas_[(p - reservation_) / plan_.handle_bytes];
  uint64_t off = p - a.va;
  auto member = std::lower_bound(a.members.begin(), a.members.end(), off,
                                 [](const Member& m, uint64_t o) { return m.offset < o; });
  if (member == a.members.end() || member->offset != off || !member->live) return true;  // not the allocator's either
  member->live = false;
  member_live_.fetch_sub(member->bytes, std::memory_order_relaxed);
  if (--a.live > 0) {
    add_stream(a, s);
    return true;
  }
  switch (a.state) {
    case State::Resident:
    case State::Reloading:
      add_stream(a, s);
      record_all(a);
      a.state = State::Draining;
      mark_busy(static_cast<uint32_t>(&a - arenas_.data()));
      break;
    case State::Evicted:
      a.state = State::Empty;  // nothing of it is on the device
      break;
    default:
      break;  // Evicting: poll finds it dead once the copy is done
  }
  return true;
}

void Executor::prepare_access(DevPtr p) {
  if (p >= weight_lo_.load(std::memory_order_relaxed) && p < weight_hi_.load(std::memory_order_relaxed)) {
    std::lock_guard lock(mu_);
    int i = weight_at(p);
    if (i >= 0) {
      reload_weight(static_cast<uint32_t>(i), true);
      return;
    }
  }
  if (p < va_lo_.load(std::memory_order_relaxed) || p >= va_hi_.load(std::memory_order_relaxed)) return;
  std::lock_guard lock(mu_);
  if (arenas_.empty() || p < reservation_ || p >= reservation_ + reservation_bytes_) return;
  uint32_t i = static_cast<uint32_t>((p - reservation_) / plan_.handle_bytes);
  Arena& a = arenas_[i];
  if (a.live == 0 || (a.state != State::Evicted && a.state != State::Evicting)) return;
  bool late = take_pending(i);
  bool moved = a.state == State::Evicted || a.handed;  // a handed arena's bytes are leaving
  reload(i);
  if (!moved) return;  // the copy out was abandoned: the bytes never left
  // A query just before the launch the reload is planned for (Triton asks before it
  // launches) is that planned reload, a call early.
  int64_t next = active_ ? (cur_pos_ + 1) % static_cast<int64_t>(plan_.step_launches) : -1;
  if (next >= 0 && next >= plan_.arenas[i].reload_at) return;
  count_demand(i, late, "asked about (pointer query)");
}

bool Executor::take_pending(uint32_t i) {
  auto pending = std::find(pending_reloads_.begin(), pending_reloads_.end(), i);
  if (pending == pending_reloads_.end()) return false;
  pending_reloads_.erase(pending);
  return true;
}

void Executor::count_demand(uint32_t i, bool late, const char* how) {
  if (late) {
    ++st_.late_reloads;
    ++step_late_;
    return;
  }
  ++st_.misses;
  ++step_misses_;
  if (st_.misses <= 8)
    log().info("miss: arena {} (evicted after launch {}, reload due at {}) {} at launch {} of the step", i,
               plan_.arenas[i].evict_after, plan_.arenas[i].reload_at, how, cur_pos_);
}

void Executor::note_live(uint64_t live_bytes) {
  last_live_.store(live_bytes, std::memory_order_relaxed);
  if (installed_.load(std::memory_order_relaxed)) update_peak();
}

void Executor::update_peak() {
  uint64_t live = last_live_.load(std::memory_order_relaxed), mem = member_live_.load(std::memory_order_relaxed);
  mem += lent_live_.load(std::memory_order_relaxed);
  uint64_t dev = (live > mem ? live - mem : 0) + held_.load(std::memory_order_relaxed);
  uint64_t peak = device_peak_.load(std::memory_order_relaxed);
  while (dev > peak && !device_peak_.compare_exchange_weak(peak, dev, std::memory_order_relaxed)) {
  }
}

void Executor::before_launch(uint64_t n, EventKind kind, uint32_t kernel, Stream s, const AllocId* acc,
                             size_t count, uint8_t flags) {
  if (!installed_.load(std::memory_order_acquire)) return;
  const uint64_t t0 = __rdtsc();
  std::lock_guard lock(mu_);
  const uint64_t waited_before = wait_cycles_;
  struct Timed {  // host time in the gate, waits for the budget apart
    Executor& x;
    uint64_t t0, waited_before;
    ~Timed() {
      x.gate_cycles_ += __rdtsc() - t0;
      x.gate_wait_cycles_ += x.wait_cycles_ - waited_before;
      ++x.gate_calls_;
    }
  } timed{*this, t0, waited_before};
  // What the launch touches, for a reload that must send an arena out to make room (never one of these).
  cur_acc_ = acc;
  cur_count_ = count;
  cur_blind_ = blind_launch(kind, flags);
  struct Done {  // acc is the caller's: not kept past the gate
    Executor& x;
    ~Done() { x.cur_acc_ = nullptr, x.cur_count_ = 0, x.cur_blind_ = false; }
  } done{*this};
  if (n >= anchor_) {
    const uint64_t pos = (n - anchor_) % plan_.step_launches;
    cur_pos_ = static_cast<int64_t>(pos);
    cur_stream_ = s;
    if (pos == 0) {
      if (active_) finish_step();
      active_ = !deviated_.load(std::memory_order_relaxed);
      if (active_) {
        step_ = (n - anchor_) / plan_.step_launches;
        ++st_.steps_active;
        cursor_ = 0;
        if (first_step_due_) trim_at_first_launch(s);
      }
    }
    if (active_ && plan_.tokens[pos] != launch_token(kind, kernel)) deviate("a launch differs from the plan's");
    if (active_) {
      if (!pending_reloads_.empty()) {
        poll_locked();
        // In place, in order (no allocation on the hook path).
        size_t kept = 0;
        for (size_t r = 0; r < pending_reloads_.size(); ++r) {
          const uint32_t i = pending_reloads_[r];
          State st = arenas_[i].state;
          if (st == State::Evicted || st == State::Evicting) {
            if (st == State::Evicted && !reload_may_start()) pending_reloads_[kept++] = i;
            else reload(i);
          }
        }
        pending_reloads_.resize(kept);
      }
      while (cursor_ < actions_.size() && actions_[cursor_].pos <= static_cast<int64_t>(pos)) {
        const Action& act = actions_[cursor_++];
        if (act.weight) {
          const uint32_t w = plan_.windows[act.index].weight;
          if (act.evict) evict_weight(w);
          else reload_weight(w, false);
          continue;
        }
        if (act.evict) {
          evict(act.index);
          continue;
        }
        State st = arenas_[act.index].state;
        if (st != State::Evicted && st != State::Evicting) continue;
        if (st == State::Evicted && !reload_may_start()) pending_reloads_.push_back(act.index);
        else reload(act.index);
      }
    }
  }
  // What the launch touches must be resident and current before it is queued.
  if (cur_blind_) {
    ++st_.conservative;
    for (uint32_t i = 0; i < arenas_.size(); ++i) ensure_resident(i, s, true);
    for (uint32_t i = 0; i < weights_.size(); ++i) ensure_weight(i, s, true);
  } else {
    for (size_t j = count; j-- > 0 && (acc[j] & kArenaIdBit);) {
      uint64_t i = arena_of(acc[j]);
      if (i < arenas_.size()) ensure_resident(static_cast<uint32_t>(i), s, true);
    }
    // Through a pointer table, a launch touches what the table points to.
    if (!tables_.empty())
      for (size_t j = 0; j < count && !(acc[j] & kArenaIdBit); ++j)
        for (const auto& [table, targets] : tables_)
          if (table == acc[j])
            for (uint32_t i : targets)
              if (i < arenas_.size()) ensure_resident(i, s, true);
    // Streamed weights are named by their ids (they come before the arenas' in the list).
    if (!weight_ids_.empty()) {
      const uint64_t lo = weight_ids_.front().first, hi = weight_ids_.back().first;
      for (size_t j = 0; j < count && !(acc[j] & kArenaIdBit); ++j)
        if (acc[j] >= lo && acc[j] <= hi)
          if (int w = weight_of(acc[j]); w >= 0) ensure_weight(static_cast<uint32_t>(w), s, true);
    }
  }
  if ((n & 15) == 0) poll_locked();
}

bool Executor::reload_may_start() const {
  if (reloads_in_flight() >= reload_cap()) return false;
  // A handle free now, one the plan allows us to create, or one to take over on the GPU: a
  // planned reload never waits for one on the host (the host would stall) nor creates one
  // over the plan's count. It waits in the queue.
  return !free_handles_.empty() || live_handles() < plan_.handles || (opt_.hand_over && donor() >= 0);
}

int Executor::donor() const {
  for (uint32_t i : busy_) {  // oldest first: the first to finish
    const Arena& b = arenas_[i];
    if ((b.state == State::Evicting || b.state == State::Draining) && !b.overflow && !b.handed && b.handle >= 0)
      return static_cast<int>(i);
  }
  return -1;
}

void Executor::settle_handed(Arena& a) {
  host_wait_leaving(a);
  ++st_.budget_waits;
  a.state = a.state == State::Evicting && a.live ? State::Evicted : State::Empty;
  unmap_arena(a, "a handed");
  a.h2d_pending = false;
}

void Executor::gpu_wait_leaving(const Arena& b, Stream s) {
  if (b.state == State::Evicting) {
    driver_.stream_wait(s, b.ev_d2h);
    return;
  }
  for (int k = 0; k < b.nstreams; ++k) driver_.stream_wait(s, b.events[k]);
  if (b.h2d_pending) driver_.stream_wait(s, b.ev_h2d);
}

void Executor::host_wait_leaving(const Arena& b) {
  const uint64_t t0 = __rdtsc();
  if (b.state == State::Evicting) {
    driver_.event_sync(b.ev_d2h);
  } else {
    for (int k = 0; k < b.nstreams; ++k) driver_.event_sync(b.events[k]);
    if (b.h2d_pending) driver_.event_sync(b.ev_h2d);
  }
  note_wait('a', __rdtsc() - t0);
}

void Executor::note_wait(char kind, uint64_t cycles) {
  wait_cycles_ += cycles;
  if (!active_) return;
  ++step_wait_count_;
  // Whether the launch's stream ran dry meanwhile: then the GPU idles until the host launches.
  const int drained = driver_.stream_query(cur_stream_);
  if (drained == 1) ++step_drained_;
  ExecutorStats::HostWait w{cur_pos_, cycles, kind, drained};
  if (step_waits_.size() < kWaitsKept) {
    step_waits_.push_back(w);
    return;
  }
  auto least = std::min_element(step_waits_.begin(), step_waits_.end(),
                                [](const auto& x, const auto& y) { return x.cycles < y.cycles; });
  if (least->cycles < cycles) *least = w;
}

void Executor::unmap_arena(Arena& a, const char* what) {
  if (!driver_.unmap(a.va, plan_.handle_bytes)) log().error("unmapping {} arena failed", what);
  if (!a.handed) give_handle(a.handle);  // a handed one's handle is another arena's now
  a.handed = false;
  a.handle = -1;
  a.nstreams = 0;
}

size_t Executor::live_handles() const {
  return static_cast<size_t>(std::count_if(handles_.begin(), handles_.end(), [](uint64_t h) { return h != 0; }));
}

size_t Executor::reloads_in_flight() const {
  size_t n = 0;
  for (const Arena& a : arenas_) n += a.h2d_pending;
  return n;
}

void Executor::note_pointer_table(AllocId table, const AllocId* targets, size_t n) {
  if (!installed_.load(std::memory_order_acquire)) return;
  std::vector<uint32_t> arenas;
  for (size_t j = 0; j < n; ++j) {
    uint64_t i = arena_of(targets[j]);
    if ((targets[j] & kArenaIdBit) && std::find(arenas.begin(), arenas.end(), i) == arenas.end())
      arenas.push_back(static_cast<uint32_t>(i));
  }
  std::lock_guard lock(mu_);
  std::erase_if(tables_, [&](const auto& t) { return t.first == table; });
  if (tables_.size() == kMaxTables) tables_.erase(tables_.begin());
  tables_.emplace_back(table, std::move(arenas));
  ++st_.pointer_tables;
}

void Executor::ensure_resident(uint32_t i, Stream s, bool demand) {
  Arena& a = arenas_[i];
  switch (a.state) {
    case State::Empty:
    case State::Draining:
      return;  // nothing of it is live: a stale word that looks like a pointer
    case State::Evicting:
      // Every member freed: nothing to keep (a stale word that looks like a pointer).
      if (a.live == 0) return;
      if (!a.handed) {
        // The bytes are still on the device: keep them, let the copy finish unused.
        a.state = State::Resident;
        ++st_.evictions_abandoned;
        break;
      }
      // Its memory is another arena's now: the copy out must finish, then it comes back.
      settle_handed(a);
      [[fallthrough]];
    case State::Evicted: {
      bool late = take_pending(i);
      if (!reload(i)) return;
      if (demand) count_demand(i, late, "touched");
    }
      [[fallthrough]];
    case State::Reloading:
      a.state = State::Resident;
      break;
    case State::Resident:
      break;
  }
  used_on(a, s);
}

}  // namespace offload

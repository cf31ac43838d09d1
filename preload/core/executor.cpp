#include "core/executor.h"

#include <x86intrin.h>

#include <algorithm>
#include <numeric>
#include <cstdlib>

#include "common/log.h"

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
  if (!same && !plan.arenas.empty()) {
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
  }
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
  if (kind == EventKind::Graph || (flags & (kLayoutUnknown | kAccessesTruncated))) {
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
  if (a.h2d_pending && opt_.fault != Options::Fault::SkipReloadWait) driver_.stream_wait(s, a.ev_h2d);
  add_stream(a, s);
}

// ---- moving bytes ------------------------------------------------------------------------

template <class T>
void Executor::add_stream(T& a, Stream s) {
  for (int i = 0; i < a.nstreams; ++i)
    if (a.streams[i] == s) return;
  if (a.nstreams == kMaxStreams) {
    a.overflow = true;
    return;
  }
  a.streams[a.nstreams++] = s;
}

template <class T>
bool Executor::copy(T& a, bool to_host, Stream s) {
  unsigned char* h = host_.ptr + a.host_offset;
  DevPtr d = a.va;
  for (uint64_t left = a.used; left > 0;) {
    uint64_t n = left;
    if (host_.chunk) n = std::min(n, host_.chunk - static_cast<uint64_t>(h - host_.origin) % host_.chunk);
    if (!(to_host ? driver_.copy_to_host(h, d, n, s) : driver_.copy_to_device(d, h, n, s))) return false;
    h += n;
    d += n;
    left -= n;
  }
  return true;
}

template <class T>
bool Executor::record_all(T& a) {
  bool ok = true;
  for (int i = 0; i < a.nstreams; ++i) ok = driver_.record_event(a.events[i], a.streams[i]) && ok;
  return ok;
}

template <class T>
bool Executor::all_done(T& a) {
  for (int i = 0; i < a.nstreams; ++i)
    if (driver_.event_query(a.events[i]) == 0) return false;
  return true;
}

void Executor::evict(uint32_t i) {
  Arena& a = arenas_[i];
  if (a.state != State::Resident || a.filled_step != step_ || a.live == 0 || a.overflow || a.h2d_pending) return;
  // After the last forward use: the copy waits for every stream that touched the arena.
  if (!record_all(a)) return;
  if (opt_.fault != Options::Fault::SkipEvictWait)
    for (int k = 0; k < a.nstreams; ++k) driver_.stream_wait(offload_stream_, a.events[k]);
  if (!copy(a, true, offload_stream_) || !driver_.record_event(a.ev_d2h, offload_stream_)) {
    // Part of the copy may be queued: the offload stream stays listed until it is done.
    add_stream(a, offload_stream_);
    if (st_.copy_failures++ == 0) log().warn("an eviction copy was refused by the driver: the arena stays resident");
    return;
  }
  a.nstreams = 0;
  add_stream(a, offload_stream_);
  a.state = State::Evicting;
  mark_busy(i);
  ++st_.evictions;
  st_.bytes_out += a.used;
}

bool Executor::reload(uint32_t i) {
  Arena& a = arenas_[i];
  if (a.state == State::Evicting && a.handed) settle_handed(a);  // its memory is another's
  if (a.state == State::Evicting) {
    a.state = State::Resident;  // the copy out has not finished: the bytes never left
    ++st_.evictions_abandoned;
    return true;
  }
  if (a.state != State::Evicted) return false;
  int h = acquire_handle(true, prefetch_stream_);
  if (h < 0 || !driver_.map(a.va, plan_.handle_bytes, handles_[static_cast<size_t>(h)]) ||
      !copy(a, false, prefetch_stream_) ||
      !driver_.record_event(a.ev_h2d, prefetch_stream_)) {
    // Evicted bytes that cannot come back: no launch may run on them, and none can be
    // skipped. Fatal, and said so.
    log().critical("cannot reload an evicted arena of {} MiB (device memory or driver refused): aborting",
                   plan_.handle_bytes >> 20);
    std::abort();
  }
  a.handle = h;
  a.h2d_pending = true;
  a.nstreams = 0;
  a.overflow = false;
  add_stream(a, prefetch_stream_);
  a.state = State::Reloading;
  mark_busy(i);
  ++st_.reloads;
  st_.bytes_in += a.used;
  return true;
}

int Executor::acquire_handle(bool for_reload, Stream s) {
  poll_locked();
  auto create = [&]() -> int {
    uint64_t h = driver_.create_physical(plan_.handle_bytes);
    if (!h) return -1;
    auto slot = std::find(handles_.begin(), handles_.end(), uint64_t{0});
    if (slot == handles_.end()) slot = handles_.insert(handles_.end(), h);
    else *slot = h;
    ++st_.handles_created;
    held_.fetch_add(plan_.handle_bytes);
    st_.held_peak = std::max(st_.held_peak, held_.load());
    update_peak();
    return static_cast<int>(slot - handles_.begin());
  };
  for (;;) {
    if (!free_handles_.empty()) {
      int h = free_handles_.back();
      free_handles_.pop_back();
      return h;
    }
    if (live_handles() < plan_.handles) {
      if (int h = create(); h >= 0) return h;
    }
    // Every handle is in use: the oldest arena whose memory is on its way out hands its handle
    // over, `s` waiting for its last work, or the host waits for that work.
    const int wait_for = donor();
    if (wait_for < 0) break;
    Arena& b = arenas_[static_cast<size_t>(wait_for)];
    if (opt_.hand_over) {
      if (opt_.fault != Options::Fault::SkipHandoverWait) gpu_wait_leaving(b, s);
      b.handed = true;
      ++st_.handovers;
      return b.handle;
    }
    ++st_.budget_waits;
    host_wait_leaving(b);
    poll_locked();
  }
  if (!for_reload) return -1;  // the allocator serves it instead
  int h = create();
  if (h >= 0 && st_.over_budget++ < 3) log().info("over budget: a reload at launch {} found every handle held ({})", cur_pos_, describe_handles());
  return h;
}

std::optional<uint64_t> Executor::first_step_keep_locked() {
  // The plan's first evictions create its handles. What the steps before it reserved in the
  // allocator's pool would otherwise stay beside them and pass the budget (convnet:
  // docs/results.md). Plans that stream weights are left alone: their pool is watched and revised.
  if (!first_step_due_) return std::nullopt;
  first_step_due_ = false;
  if (plan_.arenas.empty() || !plan_.weights.empty() || !plan_.budget) return std::nullopt;
  const uint64_t handles = uint64_t{plan_.handles} * plan_.handle_bytes;
  return plan_.budget > handles ? plan_.budget - handles : 0;
}

std::optional<uint64_t> Executor::take_first_step_trim() {
  std::lock_guard lock(mu_);
  if (!installed_.load(std::memory_order_relaxed)) return std::nullopt;
  return first_step_keep_locked();
}

void Executor::trim_at_first_launch(Stream s) {
  // Steps without marks (a marked step's trim was taken at its mark, after the GPU caught up).
  // No wait here: the trim gives back what the pool has seen freed. Nothing while the launch's
  // stream captures a graph (or when that cannot be told): the pool's trim is not a call to
  // make inside a capture.
  const std::optional<uint64_t> keep = first_step_keep_locked();
  if (!keep || driver_.stream_capturing(s) != 0) return;
  const uint64_t before = driver_.pool_reserved_current();
  if (!before || before <= *keep || !driver_.pool_trim(*keep)) return;
  ++st_.first_step_trims;
  log().info("pool trimmed at the plan's first launch: {:.2f} GiB reserved -> {:.2f} GiB (at most {:.2f} GiB kept)",
             static_cast<double>(before) / (1 << 30), static_cast<double>(driver_.pool_reserved_current()) / (1 << 30),
             static_cast<double>(*keep) / (1 << 30));
}

std::string Executor::describe_handles() const {
  static const char* names[] = {"empty", "resident", "evicting", "evicted", "reloading", "draining"};
  std::string s;
  for (size_t i = 0; i < arenas_.size(); ++i)
    if (arenas_[i].handle >= 0)
      s += (s.empty() ? "" : ", ") + std::string("arena ") + std::to_string(i) + " " +
           names[static_cast<int>(arenas_[i].state)] + (arenas_[i].handed ? " (handed over)" : "") + " live " +
           std::to_string(arenas_[i].live) + "/" + std::to_string(arenas_[i].members.size());
  return s;
}

void Executor::give_handle(int h) {
  if (h < 0 || !handles_[static_cast<size_t>(h)]) return;
  // In demand mode nothing is placed in an arena again: a handle that comes free would sit idle
  // beside a pool that now serves the whole step, past plain's footprint (convnet with the
  // block cache: docs/results.md). It goes back to the device; a demand
  // reload, or the next plan, creates what it needs.
  if (live_handles() > plan_.handles || !installed_.load(std::memory_order_relaxed) ||
      deviated_.load(std::memory_order_relaxed)) {
    release_handle(h);
    return;
  }
  free_handles_.push_back(h);
}

void Executor::release_handle(int h) {
  driver_.release_physical(handles_[static_cast<size_t>(h)]);
  handles_[static_cast<size_t>(h)] = 0;
  held_.fetch_sub(plan_.handle_bytes);
  ++st_.handles_released;
}

uint64_t Executor::misses() {
  std::lock_guard lock(mu_);
  return st_.misses + st_.late_reloads;
}

void Executor::poll() {
  if (!installed_.load(std::memory_order_acquire)) return;
  std::lock_guard lock(mu_);
  poll_locked();
}

void Executor::mark_busy(uint32_t i) {
  if (arenas_[i].in_busy) return;
  arenas_[i].in_busy = true;
  busy_.push_back(i);  // capacity reserved at install: no allocation on the hook path
}

void Executor::poll_locked() {
  // Compacted in place: the launch gate calls this, and hooks allocate nothing.
  size_t kept = 0;
  for (size_t r = 0; r < busy_.size(); ++r) {
    const uint32_t i = busy_[r];
    Arena& a = arenas_[i];
    bool keep = false;
    switch (a.state) {
      case State::Evicting:
        if (driver_.event_query(a.ev_d2h) == 0) {
          keep = true;
          break;
        }
        unmap_arena(a, "an evicted");
        a.state = a.live ? State::Evicted : State::Empty;
        break;
      case State::Draining:
        if (a.overflow || !all_done(a) || (a.h2d_pending && driver_.event_query(a.ev_h2d) == 0)) {
          keep = !a.overflow;
          break;
        }
        unmap_arena(a, "a freed");
        a.h2d_pending = false;
        a.state = State::Empty;
        break;
      default:
        if (a.h2d_pending && driver_.event_query(a.ev_h2d) == 0) keep = true;
        else a.h2d_pending = false;
        break;
    }
    if (keep) busy_[kept++] = i;
    else a.in_busy = false;
  }
  busy_.resize(kept);
  kept = 0;
  for (size_t r = 0; r < weight_busy_.size(); ++r) {
    const uint32_t i = weight_busy_[r];
    Weight& w = weights_[i];
    bool keep = false;
    if (w.state == State::Evicting) {
      if (driver_.event_query(w.ev_d2h) == 0) {
        keep = true;
      } else {
        unmap_evicted(w);
      }
    } else if (w.h2d_pending && driver_.event_query(w.ev_h2d) == 0) {
      keep = true;
    } else {
      w.h2d_pending = false;
    }
    if (keep) weight_busy_[kept++] = i;
    else w.in_busy = false;
  }
  weight_busy_.resize(kept);
}

void Executor::finish_step() {
  st_.last_step_waits.assign(step_waits_.begin(), step_waits_.end());
  std::sort(st_.last_step_waits.begin(), st_.last_step_waits.end(),
            [](const auto& x, const auto& y) { return x.cycles > y.cycles; });
  st_.last_step_wait_count = step_wait_count_;
  st_.last_step_drained = step_drained_;
  step_waits_.clear();
  step_wait_count_ = step_drained_ = 0;
  st_.recent_misses.push_back(step_misses_);
  st_.recent_late.push_back(step_late_);
  if (st_.recent_misses.size() > 16) st_.recent_misses.erase(st_.recent_misses.begin());
  if (st_.recent_late.size() > 16) st_.recent_late.erase(st_.recent_late.begin());
  step_misses_ = step_late_ = 0;
}

void Executor::deviate(const char* why) {
  if (!deviated_.exchange(true)) {
    ++st_.deviations;
    log().info("step deviates from the plan ({}): demand mode until re-planned", why);
  }
  active_ = false;
  pending_reloads_.clear();
  // Handles no arena maps go back now (give_handle says why); mapped ones as their arenas drain.
  for (int h : free_handles_) release_handle(h);
  free_handles_.clear();
}

void Executor::retire(const char* why) {
  std::lock_guard lock(mu_);
  deviate(why);
}

void Executor::reset_peak() {
  std::lock_guard lock(mu_);
  device_peak_.store(0);
  st_.held_peak = held_.load();
  st_.weight_mapped_peak = weight_mapped_;
  update_peak();
}

Executor::TrimView Executor::trim_view() {
  std::lock_guard lock(mu_);
  return TrimView{st_.installs,
                  st_.steps_active,
                  st_.held_peak,
                  plan_.budget,
                  plan_.resident_peak,
                  plan_.predicted_peak,
                  uint64_t{plan_.handles} * plan_.handle_bytes,
                  !plan_.arenas.empty() && plan_.weights.empty(),
                  plan_.spare};
}

ExecutorStats Executor::stats() {
  std::lock_guard lock(mu_);
  ExecutorStats s = st_;
  s.gate_calls = gate_calls_;
  s.weight_read_only = static_cast<uint64_t>(
      std::count_if(weights_.begin(), weights_.end(), [](const Weight& w) { return w.read_only; }));
  s.gate_cycles = gate_cycles_;
  s.gate_wait_cycles = gate_wait_cycles_;
  s.wait_cycles = wait_cycles_;
  s.held_bytes = held_.load();
  s.weights = static_cast<uint64_t>(std::count_if(weights_.begin(), weights_.end(), [](const Weight& w) { return w.state != State::Empty; }));
  s.device_peak = device_peak_.load();
  return s;
}

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
  w.h2d_pending = true;
  w.nstreams = 0;
  w.overflow = false;
  add_stream(w, prefetch_stream_);
  w.state = State::Reloading;
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
  if (w.h2d_pending && opt_.fault != Options::Fault::SkipReloadWait) driver_.stream_wait(s, w.ev_h2d);
  add_stream(w, s);
}

}  // namespace offload

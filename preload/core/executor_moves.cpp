// Executor: arenas evicted and reloaded, the physical handles they share, and the worker's poll.
#include "core/executor.h"

#include <x86intrin.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "common/log.h"
#include "core/executor_copy.h"

namespace offload {

// ---- moving bytes ------------------------------------------------------------------------

void Executor::evict(uint32_t i) {
  Arena& a = arenas_[i];
  if (a.state != State::Resident || a.filled_step != step_ || a.live == 0 || a.overflow || a.h2d_pending) return;
  start_evict(i);  // after the last forward use
}

void Executor::start_evict(uint32_t i) {
  Arena& a = arenas_[i];
  // The copy waits for every stream that touched the arena.
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
  reload_queued(a);
  mark_busy(i);
  ++st_.reloads;
  st_.bytes_in += a.used;
  return true;
}

int Executor::acquire_handle(bool for_reload, Stream s) {
  poll_locked();
  using Want = DeviceRoom::Want;
  auto create = [&](Want want) -> int {
    if (room_ && !room_->take(plan_.handle_bytes, want)) return -1;
    uint64_t h = driver_.create_physical(plan_.handle_bytes);
    if (!h) {
      if (room_) room_->give(plan_.handle_bytes);
      return -1;
    }
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
      if (int h = create(for_reload ? Want::Needed : Want::Spare); h >= 0) return h;
    }
    // Every handle is in use: the oldest arena whose memory is on its way out hands its handle
    // over, `s` waiting for its last work, or the host waits for that work.
    const int wait_for = donor();
    if (wait_for < 0 && for_reload && room_) {
      // Under the cap: one handle more where the room can be made, else a resident arena this
      // launch does not touch goes out and hands its handle over (the budget is a promise).
      if (int h = create(Want::Needed); h >= 0) return h;
      if (evict_for_room()) continue;
    }
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
  // A reload nothing can serve: one handle more whatever the budget (an evicted arena must come
  // back to be used).
  int h = create(Want::Forced);
  if (h >= 0 && st_.over_budget++ < 3) log().warn("over budget: a reload at launch {} found every handle held ({})", cur_pos_, describe_handles());
  return h;
}

void Executor::shed(const AllocId* acc, size_t n, bool blind) {
  if (!installed_.load(std::memory_order_acquire)) return;
  std::lock_guard lock(mu_);
  ++st_.sheds;
  cur_acc_ = acc, cur_count_ = n, cur_blind_ = blind;
  for (uint32_t i = 0; i < arenas_.size(); ++i) {
    if (!may_send_out(i)) continue;
    start_evict(i);
    if (arenas_[i].state == State::Evicting) ++st_.room_evictions;
  }
  cur_acc_ = nullptr, cur_count_ = 0, cur_blind_ = false;
  for (uint32_t i : busy_) {
    const Arena& b = arenas_[i];
    if ((b.state == State::Evicting || b.state == State::Draining) && !b.overflow && !b.handed) host_wait_leaving(b);
  }
  poll_locked();
  for (int h : free_handles_) release_handle(h);
  free_handles_.clear();
}

bool Executor::may_send_out(uint32_t i) const {
  const Arena& a = arenas_[i];
  return a.state == State::Resident && a.live && !a.overflow && !a.h2d_pending && a.handle >= 0 && !touched_now(i);
}

bool Executor::touched_now(uint32_t i) const {
  if (cur_blind_) return true;
  for (size_t j = cur_count_; j-- > 0 && (cur_acc_[j] & kArenaIdBit);)
    if (arena_of(cur_acc_[j]) == i) return true;
  for (size_t j = 0; j < cur_count_ && !(cur_acc_[j] & kArenaIdBit); ++j)
    for (const auto& [table, targets] : tables_)
      if (table == cur_acc_[j] && std::find(targets.begin(), targets.end(), i) != targets.end()) return true;
  return false;
}

bool Executor::evict_for_room() {
  // The resident arena whose planned reload is furthest ahead of the launch being gated.
  int best = -1;
  uint64_t best_d = 0;
  const uint64_t n = plan_.step_launches, now = cur_pos_ < 0 ? 0 : static_cast<uint64_t>(cur_pos_);
  for (uint32_t i = 0; i < arenas_.size(); ++i) {
    if (!may_send_out(i)) continue;
    const int64_t at = plan_.arenas[i].reload_at;
    const uint64_t d = at < 0 || n == 0 ? UINT64_MAX : (static_cast<uint64_t>(at) + n - now % n) % n;
    if (best < 0 || d > best_d) best = static_cast<int>(i), best_d = d;
  }
  if (best < 0) return false;
  start_evict(static_cast<uint32_t>(best));
  if (arenas_[static_cast<size_t>(best)].state != State::Evicting) return false;
  ++st_.room_evictions;
  return true;
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
  if (room_) room_->give(plan_.handle_bytes);
  ++st_.handles_released;
}

uint64_t Executor::misses() { return moves().misses; }

Executor::Moves Executor::moves() {
  std::lock_guard lock(mu_);
  return {st_.bytes_out + st_.weight_bytes_out, wait_cycles_, st_.misses + st_.late_reloads};
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

}  // namespace offload

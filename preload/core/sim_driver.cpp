#include "core/sim_driver.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <new>
#include <thread>

namespace offload {

SimDriver::~SimDriver() {
  // Queued ops never run; their captures die with the queues.
  for (auto& [base, bytes] : allocs_) munmap(reinterpret_cast<void*>(base), bytes);
  for (auto& [base, bytes] : reservations_) munmap(reinterpret_cast<void*>(base), bytes);
  for (auto& [h, ph] : physical_) close(ph.fd);
  for (Kernel* k : kernels_) delete k;
}

DevPtr SimDriver::alloc(size_t bytes) {
  size_t len = std::max<size_t>(bytes, 1);
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  std::lock_guard lock(mu_);
  allocs_[reinterpret_cast<DevPtr>(p)] = len;
  return reinterpret_cast<DevPtr>(p);
}

void SimDriver::free(DevPtr p) {
  std::lock_guard lock(mu_);
  auto it = allocs_.find(p);
  if (it == allocs_.end()) return;
  munmap(reinterpret_cast<void*>(p), it->second);
  allocs_.erase(it);
}

uint64_t SimDriver::record_marker(Stream) {
  std::lock_guard lock(mu_);
  uint64_t id = next_marker_++;
  markers_[id] = Marker{clock_ns_, false};
  return id;
}

int64_t SimDriver::marker_elapsed_ns(uint64_t from, uint64_t to) {
  std::lock_guard lock(mu_);
  auto a = markers_.find(from), b = markers_.find(to);
  if (a == markers_.end() || b == markers_.end() || !a->second.reached || !b->second.reached) return -1;
  return b->second.at - a->second.at;
}

void SimDriver::release_marker(uint64_t m) {
  std::lock_guard lock(mu_);
  markers_.erase(m);
}

bool SimDriver::pin_host(void* p, uint64_t bytes) {
  std::lock_guard lock(mu_);
  pinned_.emplace_back(p, bytes);
  return true;
}

std::vector<std::pair<void*, uint64_t>> SimDriver::pinned() const {
  std::lock_guard lock(mu_);
  return pinned_;
}

void SimDriver::advance_clock(int64_t ns) {
  std::lock_guard lock(mu_);
  clock_ns_ += ns;
}

void SimDriver::reach_markers() {
  std::lock_guard lock(mu_);
  for (auto& [id, m] : markers_) m.reached = true;
}

size_t SimDriver::live_markers() const {
  std::lock_guard lock(mu_);
  return markers_.size();
}

// ---- Virtual memory ------------------------------------------------------------------------

namespace {

uint64_t page_size() {
  static const uint64_t p = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return p;
}

void* as_ptr(DevPtr p) { return reinterpret_cast<void*>(p); }

// Puts PROT_NONE address space back over [va, va+bytes), keeping it reserved.
bool protect_none(DevPtr va, uint64_t bytes) {
  void* p = mmap(as_ptr(va), bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  return p != MAP_FAILED;
}

}  // namespace

uint64_t SimDriver::vmm_granularity() {
  std::lock_guard lock(mu_);
  return granularity_;
}

uint64_t SimDriver::device_total_bytes() {
  std::lock_guard lock(mu_);
  return device_total_;
}

void SimDriver::set_pool(uint64_t reserved, uint64_t in_use) {
  std::lock_guard lock(mu_);
  pool_known_ = true;
  pool_reserved_ = reserved;
  pool_in_use_ = std::min(in_use, reserved);
}

uint64_t SimDriver::device_used_bytes() {
  std::lock_guard lock(mu_);
  return outside_known_ ? stats_.physical_bytes + pool_reserved_ + outside_ : 0;
}

void SimDriver::set_outside(uint64_t bytes) {
  std::lock_guard lock(mu_);
  outside_known_ = true;
  outside_ = bytes;
}

uint64_t SimDriver::pool_reserved_current() {
  std::lock_guard lock(mu_);
  return pool_known_ ? pool_reserved_ : 0;
}

bool SimDriver::pool_trim(uint64_t keep) {
  std::lock_guard lock(mu_);
  if (!pool_known_) return false;
  ++pool_trims_.calls;
  pool_trims_.last_keep = keep;
  pool_trims_.physical_at_last = stats_.physical_bytes;
  pool_reserved_ = std::min(pool_reserved_, std::max(keep, pool_in_use_));
  return true;
}

SimDriver::PoolTrims SimDriver::pool_trims() const {
  std::lock_guard lock(mu_);
  return pool_trims_;
}

void SimDriver::set_granularity(uint64_t bytes) {
  if (bytes % page_size() != 0) {
    std::fprintf(stderr, "SimDriver: granularity %" PRIu64 " is not a multiple of the page size\n", bytes);
    std::abort();
  }
  std::lock_guard lock(mu_);
  granularity_ = bytes;
}

void SimDriver::set_device_total_bytes(uint64_t bytes) {
  std::lock_guard lock(mu_);
  device_total_ = bytes;
}

void SimDriver::set_physical_limit(uint64_t bytes) {
  std::lock_guard lock(mu_);
  physical_limit_ = bytes;
}

DevPtr SimDriver::reserve(uint64_t bytes) {
  std::lock_guard lock(mu_);
  const uint64_t g = granularity_;
  if (g == 0 || bytes == 0 || bytes % g != 0) {
    ++stats_.misuses;
    return 0;
  }
  if (!reserve_hints_.empty()) {
    const DevPtr at = reserve_hints_.front();
    reserve_hints_.pop_front();
    void* q = at % g ? MAP_FAILED
                     : mmap(as_ptr(at), bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE,
                            -1, 0);
    if (q != MAP_FAILED && reinterpret_cast<DevPtr>(q) != at) munmap(q, bytes);  // a kernel without NOREPLACE
    if (q == MAP_FAILED || reinterpret_cast<DevPtr>(q) != at) {
      ++stats_.misuses;
      return 0;
    }
    reservations_[at] = bytes;
    return at;
  }
  // Over-reserve by one granule and trim, so that the range starts on a granule.
  const uint64_t len = bytes + g;
  void* p = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return 0;
  const DevPtr base = reinterpret_cast<DevPtr>(p);
  const DevPtr va = (base + g - 1) / g * g;
  if (va > base) munmap(p, va - base);
  if (base + len > va + bytes) munmap(as_ptr(va + bytes), base + len - (va + bytes));
  reservations_[va] = bytes;
  return va;
}

void SimDriver::reserve_at(std::vector<DevPtr> vas) {
  std::lock_guard lock(mu_);
  reserve_hints_.assign(vas.begin(), vas.end());
}

size_t SimDriver::reserve_hints_left() const {
  std::lock_guard lock(mu_);
  return reserve_hints_.size();
}

void SimDriver::unreserve(DevPtr va, uint64_t bytes) {
  std::lock_guard lock(mu_);
  auto it = reservations_.find(va);
  if (it == reservations_.end() || it->second != bytes) {
    ++stats_.misuses;
    return;
  }
  // Mappings left inside are a misuse; they go with the range.
  for (auto m = mapped_.lower_bound(va); m != mapped_.end() && m->first < va + bytes;) {
    ++stats_.misuses;
    stats_.mapped_bytes -= m->second.bytes;
    if (auto ph = physical_.find(m->second.handle); ph != physical_.end()) --ph->second.mapped;
    m = mapped_.erase(m);
  }
  munmap(as_ptr(va), bytes);
  reservations_.erase(it);
}

uint64_t SimDriver::create_physical(uint64_t bytes) {
  if (const uint64_t ns = create_delay_ns_.load(std::memory_order_relaxed))
    std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
  std::lock_guard lock(mu_);
  if (bytes == 0 || granularity_ == 0 || bytes % granularity_ != 0) {
    ++stats_.misuses;
    return 0;
  }
  if (stats_.physical_bytes + bytes > physical_limit_ || stats_.physical_bytes + bytes < bytes) return 0;
  int fd = memfd_create("offload-sim-physical", MFD_CLOEXEC);
  if (fd < 0) return 0;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    close(fd);
    return 0;
  }
  // Garbage, so that a range mapped but never filled by a copy reads wrong. Written, not
  // mapped and set: a mapping's end flushes every CPU's TLB, which a virtual machine makes dear.
  if (copy_bytes_.load(std::memory_order_relaxed)) {
    static const std::vector<unsigned char> garbage(1 << 20, kGarbage);
    for (uint64_t at = 0; at < bytes;) {
      const ssize_t n = pwrite(fd, garbage.data(), std::min<uint64_t>(garbage.size(), bytes - at), static_cast<off_t>(at));
      if (n <= 0) {
        close(fd);
        return 0;
      }
      at += static_cast<uint64_t>(n);
    }
  }
  const uint64_t h = next_handle_++;
  physical_[h] = Physical{fd, bytes};
  ++stats_.creates;
  stats_.physical_bytes += bytes;
  stats_.physical_peak = std::max(stats_.physical_peak, stats_.physical_bytes);
  return h;
}

void SimDriver::release_physical(uint64_t handle) {
  std::lock_guard lock(mu_);
  auto it = physical_.find(handle);
  if (it == physical_.end()) {
    ++stats_.misuses;
    return;
  }
  // Still mapped: a misuse, but the mappings keep their bytes (the kernel holds the memfd).
  if (it->second.mapped > 0) ++stats_.misuses;
  close(it->second.fd);
  ++stats_.releases;
  stats_.physical_bytes -= it->second.bytes;
  physical_.erase(it);
}

bool SimDriver::map(DevPtr va, uint64_t bytes, uint64_t handle) {
  if (const uint64_t ns = map_delay_ns_.load(std::memory_order_relaxed))
    std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
  std::lock_guard lock(mu_);
  return map_locked(va, bytes, handle, true);
}

bool SimDriver::map_locked(DevPtr va, uint64_t bytes, uint64_t handle, bool granted) {
  if (granted && gate_chunk_.load()) gate_grants_.fetch_add(1);
  const uint64_t g = granularity_;
  auto ph = physical_.find(handle);
  bool ok = g != 0 && bytes != 0 && va % g == 0 && bytes % g == 0 && ph != physical_.end() &&
            bytes == ph->second.bytes;
  if (ok) {  // inside one reservation
    auto r = reservations_.upper_bound(va);
    ok = r != reservations_.begin() && (--r, va >= r->first && va + bytes <= r->first + r->second);
  }
  if (ok) {  // over no other mapping
    auto next = mapped_.lower_bound(va);
    if (next != mapped_.end() && next->first < va + bytes) ok = false;
    if (next != mapped_.begin() && std::prev(next)->first + std::prev(next)->second.bytes > va) ok = false;
  }
  if (!ok) {
    ++stats_.misuses;
    return false;
  }
  // Faulted in at once: a page fault each costs more (a third of the time of the randomised
  // residency tests went to faults).
  const int populate = granted && copy_bytes_.load(std::memory_order_relaxed) ? MAP_POPULATE : 0;
  const int prot = granted ? PROT_READ | PROT_WRITE : PROT_NONE;
  void* p = mmap(as_ptr(va), bytes, prot, MAP_SHARED | MAP_FIXED | populate, ph->second.fd, 0);
  if (p == MAP_FAILED) return false;
  mapped_[va] = Mapping{bytes, handle, granted};
  ++ph->second.mapped;
  ++stats_.maps;
  stats_.mapped_bytes += bytes;
  stats_.mapped_peak = std::max(stats_.mapped_peak, stats_.mapped_bytes);
  return true;
}

bool SimDriver::unmap(DevPtr va, uint64_t bytes) {
  std::lock_guard lock(mu_);
  auto it = mapped_.find(va);
  if (it == mapped_.end() || it->second.bytes != bytes) {
    ++stats_.misuses;
    return false;
  }
  if (copy_touches_locked(va, bytes)) ++stats_.misuses;  // unmapped all the same, as CUDA would
  if (!protect_none(va, bytes)) return false;
  if (auto ph = physical_.find(it->second.handle); ph != physical_.end()) --ph->second.mapped;
  ++stats_.unmaps;
  stats_.mapped_bytes -= bytes;
  mapped_.erase(it);
  return true;
}

SimDriver::VmmStats SimDriver::vmm_stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void SimDriver::reset_peaks() {
  std::lock_guard lock(mu_);
  stats_.physical_peak = stats_.physical_bytes;
  stats_.mapped_peak = stats_.mapped_bytes;
}

bool SimDriver::is_mapped(DevPtr p) const {
  std::lock_guard lock(mu_);
  auto it = mapped_.upper_bound(p);
  if (it == mapped_.begin()) return false;
  --it;
  return p < it->first + it->second.bytes;
}

// ---- The simulated GPU ---------------------------------------------------------------------

void SimDriver::enqueue(Stream s, Op op) {
  auto c = capture_.find(s);
  if (c == capture_.end()) {
    queues_[s].ops.push_back(std::move(op));
    return;
  }
  // Recorded into the graph, not run. Within one capturing stream the order is the graph's.
  ++captured_ops_;
  if (op.kind == Op::kKernel || op.kind == Op::kCopy) c->second.push_back(std::move(op.body));
  if (op.kind == Op::kRecord) op.ev->pending.erase(op.gen);  // it never completes outside
}

Stream SimDriver::create_stream() {
  std::lock_guard lock(mu_);
  Stream s = next_stream_++;
  queues_[s];
  return s;
}

uint64_t SimDriver::create_event() {
  std::lock_guard lock(mu_);
  uint64_t e = next_event_++;
  events_[e] = std::make_shared<EventState>();
  return e;
}

void SimDriver::destroy_event(uint64_t e) {
  // Queued records and waits keep the state alive, as a destroyed CUDA event's work does.
  std::lock_guard lock(mu_);
  events_.erase(e);
}

bool SimDriver::record_event(uint64_t e, Stream s) {
  std::lock_guard lock(mu_);
  auto it = events_.find(e);
  if (it == events_.end()) return false;
  EventState& ev = *it->second;
  const uint64_t gen = ++ev.enqueued;
  ev.pending.insert(gen);
  ev.in_capture = capture_.count(s) != 0;
  enqueue(s, Op{Op::kRecord, {}, it->second, gen});
  return true;
}

bool SimDriver::stream_wait(Stream s, uint64_t e) {
  std::lock_guard lock(mu_);
  auto it = events_.find(e);
  if (it == events_.end()) return false;
  if (it->second->enqueued == 0) return true;  // never recorded: nothing to wait for
  if (it->second->in_capture && !capture_.count(s)) {  // CUDA would join `s` to the capture
    ++stats_.misuses;
    return false;
  }
  enqueue(s, Op{Op::kWait, {}, it->second, it->second->enqueued});
  return true;
}

int SimDriver::event_query(uint64_t e) {
  std::lock_guard lock(mu_);
  ++stats_.event_queries;
  auto it = events_.find(e);
  if (it == events_.end()) return -1;
  if (it->second->in_capture) {
    ++stats_.misuses;
    return -1;
  }
  return it->second->done(it->second->enqueued) ? 1 : 0;
}

int SimDriver::stream_query(Stream s) {
  std::lock_guard lock(mu_);
  if (capture_.count(s)) {  // CUDA refuses to query a capturing stream
    ++stats_.misuses;
    return -1;
  }
  auto it = queues_.find(s);
  return it == queues_.end() || (it->second.ops.empty() && !it->second.running) ? 1 : 0;
}

bool SimDriver::event_sync(uint64_t e) {
  std::shared_ptr<EventState> ev;
  uint64_t gen;
  {
    std::lock_guard lock(mu_);
    auto it = events_.find(e);
    if (it == events_.end()) return false;
    ev = it->second;
    gen = ev->enqueued;
    if (ev->in_capture) {
      ++stats_.misuses;
      return false;
    }
  }
  for (;;) {
    {
      std::lock_guard exec(exec_mu_);
      std::unique_lock lock(mu_);
      if (ev->done(gen)) return true;
      Stream s;
      if (pick_locked(Pick::kRoundRobin, nullptr, &s)) {
        execute(lock, s);
        continue;
      }
      if (!word_waits_locked()) deadlock_locked("event_sync");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));  // a grant made apart is on its way
  }
}

void SimDriver::check_host_range_locked(const void* p, uint64_t bytes) {
  // A copy's host side in part of a pinned registration and beyond it: a real driver may take
  // it for pinned memory it is not (or stage it as pageable), so it is a misuse here.
  const auto* a = static_cast<const unsigned char*>(p);
  for (const auto& [base, size] : pinned_) {
    const auto* b = static_cast<const unsigned char*>(base);
    const bool overlaps = a < b + size && b < a + bytes;
    if (overlaps && (a < b || a + bytes > b + size)) {
      ++stats_.misuses;
      return;
    }
  }
}

namespace {
// A copy's body: every byte, or without its bytes (SimDriver::set_copy_bytes) one byte of every
// granule the device side spans and the host side's ends.
void run_copy(void* dst, const void* src, uint64_t bytes, uint64_t granule, bool whole, bool to_device) {
  if (whole) {
    std::memcpy(dst, src, bytes);
    return;
  }
  if (bytes == 0) return;
  auto* d = static_cast<volatile unsigned char*>(dst);
  const auto* s = static_cast<const volatile unsigned char*>(src);
  const uint64_t step = granule ? granule : 4096;
  if (to_device) {
    for (uint64_t o = 0; o < bytes; o += step) d[o] = s[o == 0 ? 0 : bytes - 1];
  } else {
    for (uint64_t o = 0; o < bytes; o += step) d[o == 0 ? 0 : bytes - 1] = s[o];
  }
  d[bytes - 1] = s[bytes - 1];
}
}  // namespace

bool SimDriver::copy_to_host(void* dst, DevPtr src, uint64_t bytes, Stream s) {
  const uint64_t chunk = gate_chunk_.load();
  if (!chunk || !s || s != gate_stream_.load()) return copy_out_one(dst, src, bytes, s);
  for (uint64_t off = 0; off < bytes; off += chunk) {
    if (!copy_out_one(static_cast<unsigned char*>(dst) + off, src + off, std::min(chunk, bytes - off), s)) return false;
    gated_chunks_.fetch_add(1);
  }
  return true;
}

bool SimDriver::copy_out_one(void* dst, DevPtr src, uint64_t bytes, Stream s) {
  if (bytes != 0 && (dst == nullptr || src == 0)) return false;
  std::lock_guard lock(mu_);
  if (ungranted_locked(src, bytes)) return false;
  check_host_range_locked(dst, bytes);
  enqueue(s, Op{Op::kCopy, [dst, src, bytes, g = granularity_, whole = copy_bytes_.load(std::memory_order_relaxed)] {
                  run_copy(dst, as_ptr(src), bytes, g, whole, false);
                }, {}, 0, src, src + bytes});
  return true;
}

bool SimDriver::copy_to_device(DevPtr dst, const void* src, uint64_t bytes, Stream s) {
  if (bytes != 0 && (dst == 0 || src == nullptr)) return false;
  std::lock_guard lock(mu_);
  if (ungranted_locked(dst, bytes)) return false;
  check_host_range_locked(src, bytes);
  enqueue(s, Op{Op::kCopy, [dst, src, bytes, g = granularity_, whole = copy_bytes_.load(std::memory_order_relaxed)] {
                  run_copy(as_ptr(dst), src, bytes, g, whole, true);
                }, {}, 0, dst, dst + bytes});
  return true;
}

bool SimDriver::pick_locked(Pick how, std::mt19937_64* rng, Stream* out) {
  std::vector<Stream> runnable, non_copy;
  for (auto& [s, q] : queues_) {
    if (q.running || q.ops.empty() || std::find(held_.begin(), held_.end(), s) != held_.end()) continue;
    const Op& head = q.ops.front();
    if (head.kind == Op::kWait && !head.ev->done(head.gen)) continue;
    if (head.kind == Op::kWaitWord && grant_word_.load(std::memory_order_acquire) < head.gen) continue;
    runnable.push_back(s);
    if (head.kind != Op::kCopy) non_copy.push_back(s);
  }
  if (runnable.empty()) return false;
  const std::vector<Stream>& from = copy_delay_ && !non_copy.empty() ? non_copy : runnable;
  if (how == Pick::kRandom) {
    *out = from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(*rng)];
  } else {  // the first stream after the last one picked, in stream order
    auto it = rr_started_ ? std::upper_bound(from.begin(), from.end(), rr_last_) : from.begin();
    *out = it == from.end() ? from.front() : *it;
    rr_last_ = *out;
    rr_started_ = true;
  }
  return true;
}

void SimDriver::execute(std::unique_lock<std::mutex>& lock, Stream s) {
  Queue& q = queues_[s];  // std::map: the reference survives other insertions
  Op op = std::move(q.ops.front());
  q.ops.pop_front();
  switch (op.kind) {
    case Op::kWait:
    case Op::kWaitWord:
      break;  // runnable means the awaited capture has completed, or the word holds the value
    case Op::kRecord:
      op.ev->pending.erase(op.gen);
      break;
    case Op::kKernel:
    case Op::kCopy:
      q.running = true;  // later ops of this stream wait for it, as on a GPU
      q.run_dev = op.dev, q.run_dev_end = op.dev_end;
      lock.unlock();
      op.body();
      op.body = nullptr;  // captured state dies outside the lock too
      lock.lock();
      q.running = false;
      q.run_dev = q.run_dev_end = 0;
      break;
  }
}

void SimDriver::deadlock_locked(const char* where) {
  std::fprintf(stderr, "SimDriver: deadlock in %s: no queued op can run\n", where);
  for (auto& [s, q] : queues_) {
    if (q.ops.empty() && !q.running) continue;
    const Op& head = q.ops.front();
    std::fprintf(stderr, "  stream 0x%" PRIx64 ": %zu ops%s, head %s\n", s, q.ops.size(),
                 q.running ? " (one running)" : "",
                 head.kind == Op::kWait       ? "waits for an event capture that never completes"
                 : head.kind == Op::kWaitWord ? "waits for the grant word"
                                              : "is runnable but its stream is busy");
  }
  std::abort();
}

bool SimDriver::step(std::mt19937_64& rng) {
  std::lock_guard exec(exec_mu_);
  std::unique_lock lock(mu_);
  Stream s;
  if (!pick_locked(Pick::kRandom, &rng, &s)) return false;
  execute(lock, s);
  return true;
}

void SimDriver::run_all() {
  for (;;) {
    {
      std::lock_guard exec(exec_mu_);
      std::unique_lock lock(mu_);
      bool empty = std::all_of(queues_.begin(), queues_.end(), [](auto& kv) { return kv.second.ops.empty(); });
      if (empty) return;
      Stream s;
      if (pick_locked(Pick::kRoundRobin, nullptr, &s)) {
        execute(lock, s);
        continue;
      }
      if (!held_.empty()) return;  // what is left waits for a held stream
      if (!word_waits_locked()) deadlock_locked("run_all");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));  // a grant made apart is on its way
  }
}

bool SimDriver::copy_touches_locked(DevPtr va, uint64_t bytes) const {
  auto meets = [&](DevPtr lo, DevPtr hi) { return lo < va + bytes && va < hi; };
  for (const auto& [s, q] : queues_) {
    if (q.running && meets(q.run_dev, q.run_dev_end)) return true;
    for (const Op& op : q.ops)
      if (op.kind == Op::kCopy && meets(op.dev, op.dev_end)) return true;
  }
  return false;
}

void SimDriver::set_copy_delay(bool on) {
  std::lock_guard lock(mu_);
  copy_delay_ = on;
}

void SimDriver::hold(Stream s, bool on) {
  std::lock_guard lock(mu_);
  std::erase(held_, s);
  if (on) held_.push_back(s);
}

size_t SimDriver::pending_ops() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (auto& [s, q] : queues_) n += q.ops.size() + (q.running ? 1 : 0);
  return n;
}

size_t SimDriver::live_events() const {
  std::lock_guard lock(mu_);
  return events_.size();
}

}  // namespace offload

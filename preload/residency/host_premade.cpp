#include "residency/host_premade.h"

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>

#include <algorithm>

#include "common/clock.h"
#include "planner/plan.h"  // round_up

namespace offload {
namespace {

constexpr uint64_t kPage = 4096;

}  // namespace

PremadeHost::PremadeHost(Options o, ChunkSource* first, std::function<bool()> skip)
    : o_(o), first_(first), skip_(std::move(skip)) {
  if (o_.piece < kPage) o_.piece = kPage;
  o_.piece = round_up(o_.piece, kPage);
  const uint64_t bytes = round_up(o_.target, kPage);
  if (!bytes) return;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return;
  // A forked child (a data loader's worker) neither needs these pages nor should copy their tables.
  madvise(p, bytes, MADV_DONTFORK);
  base_ = static_cast<unsigned char*>(p);
  bytes_ = bytes;
}

PremadeHost::~PremadeHost() {
  stop();
  if (base_) munmap(base_, bytes_);
}

void PremadeHost::start() {
  std::lock_guard tl(thread_mu_);
  if (!base_ || thread_.joinable() || stop_.load()) return;
  making_.store(true);
  // The thread takes no signal: they go to the application's threads (it inherits this mask).
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "offload-premake");
    run();
  });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

void PremadeHost::run() {
  while (make_more(o_.piece) != 0) {
  }
  std::lock_guard lk(mu_);
  making_.store(false);
  last_ns_ = mono_ns();
  made_cv_.notify_all();
}

uint64_t PremadeHost::make_more(uint64_t max_bytes) {
  const int64_t t0 = mono_ns();
  uint64_t made = 0;
  while (made < max_bytes && !stop_.load(std::memory_order_acquire) && !(skip_ && skip_())) {
    const uint64_t from = frontier_.load(std::memory_order_relaxed);
    if (from >= bytes_) break;
    const uint64_t n = std::min({max_bytes - made, bytes_ - from, o_.piece});
    // One write a page faults it in; the pages are fresh (zero), so the write changes nothing.
    // A trap a page holds only that mapping's lock: madvise(MADV_POPULATE_WRITE) faulted 1.3-1.6x
    // faster but held the process's mmap lock, and the driver's mappings on another thread then
    // took 16-92 ms each against 0.08 (scripts/gpu/fault_probe.cpp; docs/results.md).
    volatile unsigned char* p = base_ + from;
    for (uint64_t off = 0; off < n; off += kPage) p[off] = 0;
    frontier_.store(from + n, std::memory_order_release);
    made += n;
  }
  if (made) make_ns_.fetch_add(mono_ns() - t0, std::memory_order_relaxed);
  return made;
}

void PremadeHost::end_making() {
  stop_.store(true, std::memory_order_release);
  std::unique_lock lk(mu_);
  made_cv_.wait(lk, [this] { return !making_.load(); });
}

ChunkSource::Lent PremadeHost::lend(uint64_t bytes, bool may_count) {
  if (first_)
    if (const Lent got = first_->lend(bytes, may_count); got.p) return got;
  if (!base_ || !may_count) return {};
  if (!o_.past_first_take) end_making();
  bytes = round_up(std::max<uint64_t>(bytes, 1), kPage);
  std::lock_guard lk(mu_);
  // Only what was faulted in: memory past it costs its user as much as the store's own, and the
  // store counts its own as made where needed (host_making_note).
  if (bytes > frontier_.load(std::memory_order_acquire) - next_) return {};
  void* p = base_ + next_;
  next_ += bytes;
  taken_ += bytes;
  last_ns_ = mono_ns();
  return {p, true};
}

uint64_t PremadeHost::trim_idle(int64_t now_ns) {
  std::lock_guard lk(mu_);
  if (trimmed_ || !base_ || making_.load() || last_ns_ == 0) return 0;
  if (now_ns - last_ns_ < (taken_ ? o_.idle_ns : o_.unused_ns)) return 0;
  trimmed_ = true;
  const uint64_t from = round_up(next_, kPage), to = frontier_.load(std::memory_order_acquire);
  if (to <= from) return 0;
  madvise(base_ + from, to - from, MADV_DONTNEED);
  frontier_.store(from, std::memory_order_release);
  released_ = to - from;
  return released_;
}

void PremadeHost::stop() {
  std::lock_guard tl(thread_mu_);
  stop_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
}

uint64_t premake_target(uint64_t asked, uint64_t budget, uint64_t available, uint64_t limit, int local_ranks) {
  const uint64_t ranks = local_ranks > 1 ? static_cast<uint64_t>(local_ranks) : 1;
  const uint64_t want = asked == UINT64_MAX ? std::min(budget, available / 4 / ranks) : asked;
  return std::min(want, limit);
}

PremadeHost::Stats PremadeHost::stats() const {
  std::lock_guard lk(mu_);
  Stats s;
  s.made = frontier_.load(std::memory_order_acquire) + released_;
  s.taken = taken_;
  s.released = released_;
  s.make_ns = make_ns_.load(std::memory_order_relaxed);
  s.making = making_.load();
  return s;
}

}  // namespace offload

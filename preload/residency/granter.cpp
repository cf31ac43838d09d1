#include "residency/granter.h"

#include "common/clock.h"
#include "common/log.h"

namespace offload {

Granter::Granter(Driver& d) : d_(d), word_(d.grant_word()), asked_(word_->load()) {
  thread_ = std::thread([this] { run(); });
}

Granter::~Granter() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

uint64_t Granter::ask(DevPtr va, uint64_t bytes) {
  uint64_t n;
  {
    std::lock_guard lk(mu_);
    jobs_.push_back({va, bytes});
    n = ++asked_;
  }
  work_cv_.notify_one();
  return n;
}

uint64_t Granter::wait(uint64_t n) {
  if (done() >= n) return 0;
  const int64_t t0 = mono_ns();
  std::unique_lock lk(mu_);
  done_cv_.wait(lk, [&] { return done() >= n; });
  return uint64_t(mono_ns() - t0);
}

void Granter::run() {
  std::unique_lock lk(mu_);
  for (;;) {
    work_cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, every grant asked for made
    const Job j = jobs_.front();
    jobs_.pop_front();
    lk.unlock();
    const int64_t t0 = mono_ns();
    // A mapping left without its grant faults in the first kernel that touches it: try twice,
    // and say so. The word moves on either way, or every stream waiting for it would hang.
    if (!d_.grant(j.va, j.bytes) && !d_.grant(j.va, j.bytes)) {
      log().error("cap: the access grant of {} bytes at {:#x} failed: a kernel that touches them will fault", j.bytes,
                  j.va);
    }
    grant_ns_.fetch_add(uint64_t(mono_ns() - t0), std::memory_order_relaxed);
    lk.lock();
    word_->fetch_add(1, std::memory_order_release);
    done_cv_.notify_all();
  }
}

}  // namespace offload

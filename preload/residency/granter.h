// Granter: access grants made apart from the mappings they are for (Residency::Options::
// grant_apart), on a thread of its own, in the order asked. After each one it writes how many
// are made to the driver's grant word, which a stream that uses a range before its grant is known
// made waits for on the GPU (Driver::stream_wait_word): the thread that maps goes on at once.
// A grant made while a copy to the host runs took about 0.7 ms on the H200 against 0.05 idle
// (docs/results.md, "The driver's calls while copies run").
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>

#include "core/driver.h"

namespace offload {

class Granter {
 public:
  // d.grant_word() must not be null.
  explicit Granter(Driver& d);
  ~Granter();  // makes the grants asked for, then stops
  Granter(const Granter&) = delete;
  Granter& operator=(const Granter&) = delete;

  // A grant of [va, va + bytes), mapped already: its number, made once done() reaches it.
  uint64_t ask(DevPtr va, uint64_t bytes);
  uint64_t done() const { return word_->load(std::memory_order_acquire); }
  // The host waits until grant n is made: the ns it waited (0: made already).
  uint64_t wait(uint64_t n);
  uint64_t grant_ns() const { return grant_ns_.load(std::memory_order_relaxed); }  // the thread's, in grants

 private:
  struct Job {
    DevPtr va;
    uint64_t bytes;
  };
  void run();

  Driver& d_;
  std::atomic<uint64_t>* word_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Job> jobs_;
  uint64_t asked_;
  bool stop_ = false;
  std::atomic<uint64_t> grant_ns_{0};
  std::thread thread_;
};

}  // namespace offload

// Two program threads under one residency manager while a third polls it, as the shim's worker
// does: the threading tests' common frame.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

#include "core/driver.h"
#include "residency/residency.h"

namespace offload {

// Runs loop(a, 1) and loop(b, 2) on two threads, and Residency::poll every 200 us on a third
// until both have returned.
template <class Loop>
void run_two_polled(Residency& res, Stream a, Stream b, Loop loop) {
  std::atomic<int> done{0};
  auto run = [&](Stream s, int seed) {
    loop(s, seed);
    ++done;
  };
  std::thread poller([&] {
    while (done.load() < 2) {
      res.poll();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  std::thread ta(run, a, 1), tb(run, b, 2);
  ta.join();
  tb.join();
  poller.join();
}

}  // namespace offload

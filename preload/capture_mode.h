// Graph captures and the shim's own driver calls. In global mode (torch.cuda.graph's default) a
// capture forbids "potentially unsafe" calls (event queries, pool attributes, ...) on every thread
// of the process, and one such call invalidates the capture (on the H200 every capture under the
// cap then failed at its end: docs/results.md). The shim's calls never touch a capturing stream,
// so once a capture has been seen they are made in relaxed mode, as PyTorch's allocator makes its
// own; the shim's worker thread, which never captures, is relaxed for good.
#pragma once

#include <atomic>

namespace offload {

namespace capture_detail {
inline std::atomic<bool> seen{false};
inline thread_local bool relaxed_for_good = false;
// cuThreadExchangeStreamCaptureMode: false when the driver is not loaded or lacks it.
bool exchange(int* mode);
constexpr int kRelaxed = 2;  // CU_STREAM_CAPTURE_MODE_RELAXED (checked in capture_mode.cpp)
}  // namespace capture_detail

// A stream was found capturing.
inline void note_capture_seen() { capture_detail::seen.store(true, std::memory_order_relaxed); }
// A driver result that says a capture refused the call.
void note_capture_error(int result);
// This thread's calls are relaxed from now on (a thread of the shim's own, which never captures);
// a no-op until libcuda is loaded, so it is called again until it takes.
void relax_capture_checks_for_good();

// For the scope of one of the shim's calls: relaxed capture mode on this thread once a capture
// has been seen, the thread's own mode after.
class RelaxedCapture {
 public:
  RelaxedCapture() {
    if (capture_detail::relaxed_for_good || !capture_detail::seen.load(std::memory_order_relaxed)) return;
    active_ = capture_detail::exchange(&mode_);
  }
  ~RelaxedCapture() {
    if (active_) capture_detail::exchange(&mode_);
  }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  int mode_ = capture_detail::kRelaxed;
  bool active_ = false;
};

}  // namespace offload

// StreamRing: the residency manager's events recorded after each stream's launches (Residency).
#pragma once

#include <cstddef>
#include <cstdint>

namespace offload {

// Per stream: events recorded after its launches, with the launch number they follow. An
// event's number never passes a launch of the stream not yet forwarded (open: before_launch
// done, the launch not reported), nor the last one reported: launches run ahead of their
// forwarding in another thread, or in the same one while before_launch is still queuing.
struct StreamRing {
  static constexpr size_t kSize = 64;
  static constexpr size_t kOpen = 4;
  uint64_t events[kSize] = {};
  uint64_t after[kSize] = {};  // the last launch number the event captures
  size_t next = 0;
  uint64_t closed = 0;          // the highest launch number reported forwarded
  uint64_t open[kOpen] = {};    // launches in flight (a thread each)
  uint32_t nopen = 0, unlisted = 0;  // unlisted: in flight past kOpen (numbers then say nothing)
  uint64_t captured(uint64_t want, bool ours) const;  // the number an event recorded now may carry
};

}  // namespace offload

// The monotonic clock, in nanoseconds and milliseconds: for durations and deadlines, never for
// wall time (unix_ns is). Cheap (vDSO), allocation-free, safe on a hook's path.
#pragma once

#include <time.h>

#include <cstdint>

namespace offload {

inline int64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

inline int64_t mono_ms() { return mono_ns() / 1'000'000; }

// Wall time as Unix nanoseconds: only to place our records beside another tool's.
inline int64_t unix_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace offload

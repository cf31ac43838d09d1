// Executor's copies and event bookkeeping, shared by arenas and streamed weights (the two
// files that move bytes: executor_moves.cpp, executor_weights.cpp).
#pragma once

#include "core/executor.h"

namespace offload {

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
void Executor::reload_queued(T& a) {
  a.h2d_pending = true;
  a.nstreams = 0;
  a.overflow = false;
  add_stream(a, prefetch_stream_);
  a.state = State::Reloading;
}

template <class T>
void Executor::used_on(T& a, Stream s) {
  if (a.h2d_pending && opt_.fault != Options::Fault::SkipReloadWait) driver_.stream_wait(s, a.ev_h2d);
  add_stream(a, s);
}

template <class T>
bool Executor::all_done(T& a) {
  for (int i = 0; i < a.nstreams; ++i)
    if (driver_.event_query(a.events[i]) == 0) return false;
  return true;
}

}  // namespace offload

// Recompute's reads of device bytes on the host (recompute.cpp): a probe's hashes where the GPU
// cannot take them, and the check of a kernel's first launch made again against the saved copy.
#include <algorithm>
#include <cstring>

#include "residency/residency.h"

namespace offload {
namespace {

constexpr uint64_t kStage = 8ull << 20;  // the host staging buffer

// A 64-bit hash of n bytes, a word at a time (the probe hashes everything a launch touches).
uint64_t hash_bytes(uint64_t h, const unsigned char* p, uint64_t n) {
  uint64_t i = 0;
  for (uint64_t w; i + 8 <= n; i += 8) {
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace

template <class Each>
bool Residency::rc_read(DevPtr va, uint64_t bytes, Stream s, Each each) {
  rc_.stage.resize(kStage);
  const uint64_t ev = new_event();
  bool more = true;
  for (uint64_t off = 0; more && off < bytes; off += kStage) {
    const uint64_t n = std::min(kStage, bytes - off);
    d_.copy_to_host(rc_.stage.data(), va + off, n, s);
    record_event(ev, s);
    wait_event(ev);
    more = each(rc_.stage.data(), off, n);
  }
  drop_event(ev);
  return more;
}

uint64_t Residency::rc_hash(DevPtr va, uint64_t bytes, Stream s) {
  uint64_t h = 0xcbf29ce484222325ull;
  rc_read(va, bytes, s, [&](const unsigned char* chunk, uint64_t, uint64_t n) {
    h = hash_bytes(h, chunk, n);
    return true;
  });
  return h;
}

bool Residency::rc_same(DevPtr va, const void* host, uint64_t bytes, Stream s) {
  return rc_read(va, bytes, s, [&](const unsigned char* chunk, uint64_t off, uint64_t n) {
    return std::memcmp(chunk, static_cast<const unsigned char*>(host) + off, n) == 0;
  });
}

}  // namespace offload

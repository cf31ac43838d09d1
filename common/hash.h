// FNV-1a over a C string: the hash the shim and its telemetry use for kernel names, and the
// one that names a daemon's pool segment after its socket path (common/ipc.h).
#pragma once

#include <cstdint>

namespace offload {

inline uint64_t name_hash(const char* s) {
  uint64_t h = 1469598103934665603ull;
  for (; s && *s; ++s) h = (h ^ static_cast<unsigned char>(*s)) * 1099511628211ull;
  return h;
}

}  // namespace offload

// Words of simulated device memory, for the rigs that fill ranges and check them: a range's
// address as 64-bit words, and the mixer that makes a word from a seed and its index.
#pragma once

#include <cstdint>

#include "planner/types.h"

namespace offload::sim_words {

inline uint64_t mix(uint64_t x) {
  x ^= x >> 31;
  x *= 0x9e3779b97f4a7c15ull;
  x ^= x >> 29;
  return x;
}

inline uint64_t* words(DevPtr p) { return reinterpret_cast<uint64_t*>(p); }

}  // namespace offload::sim_words

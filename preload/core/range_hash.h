// The hash of a range of device memory that tells whether a launch wrote it (recompute's probes):
// a sum, modulo 2^64, of every 8-byte word mixed with its index, the last partial word padded with
// zeros. A sum, so that the GPU's threads may add their parts in any order (gpu/range_hash.cu
// computes it on the device, SimDriver and the tests on the host); each word's mix is a bijection
// of the word, so a range with one word changed always hashes differently.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define OFFLOAD_HD __host__ __device__ __forceinline__
#else
#define OFFLOAD_HD inline
#endif

namespace offload::range_hash {

OFFLOAD_HD uint64_t mix(uint64_t w, uint64_t i) {
  uint64_t x = w ^ (i * 0x9e3779b97f4a7c15ull);
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 31;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 29;
  return x;
}

#if !defined(__CUDACC__)
inline uint64_t of(const unsigned char* p, uint64_t bytes) {
  const uint64_t nw = bytes / 8;
  uint64_t h = 0;
  for (uint64_t i = 0; i < nw; ++i) {
    uint64_t w;
    std::memcpy(&w, p + i * 8, 8);
    h += mix(w, i);
  }
  if (bytes & 7) {
    uint64_t w = 0;
    std::memcpy(&w, p + nw * 8, bytes & 7);  // little-endian, as the device reads it
    h += mix(w, nw);
  }
  return h;
}
#endif

}  // namespace offload::range_hash

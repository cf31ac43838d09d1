// The kernel behind CudaDriver::hash_start (core/range_hash.h's hash, on the device). The shim
// carries it as PTX (range_hash_ptx.h, made by scripts/gen_range_hash_ptx.sh) and loads it with
// the driver's JIT, so that building liboffload needs no CUDA compiler.
//
// Each of the grid's kHashBlocks x 256 threads adds the mixed words at its stride, four loads in
// flight; each block writes its sum to partial[block], which the host adds up.
#include "core/range_hash.h"

extern "C" __global__ void __launch_bounds__(256) offload_range_hash(const unsigned long long* p,
                                                                     unsigned long long bytes,
                                                                     unsigned long long* partial) {
  using offload::range_hash::mix;
  const unsigned long long nw = bytes / 8, t = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x, acc = 0;
  for (; i + 3 * t < nw; i += 4 * t) {
    const unsigned long long a = p[i], b = p[i + t], c = p[i + 2 * t], d = p[i + 3 * t];
    acc += mix(a, i) + mix(b, i + t) + mix(c, i + 2 * t) + mix(d, i + 3 * t);
  }
  for (; i < nw; i += t) acc += mix(p[i], i);
  if (blockIdx.x == 0 && threadIdx.x == 0 && (bytes & 7)) {
    const unsigned char* tail = reinterpret_cast<const unsigned char*>(p) + nw * 8;
    unsigned long long w = 0;
    for (unsigned k = 0; k < (bytes & 7); ++k) w |= (unsigned long long)tail[k] << (8 * k);
    acc += mix(w, nw);
  }
  for (int o = 16; o; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
  __shared__ unsigned long long warp_sum[8];
  if ((threadIdx.x & 31) == 0) warp_sum[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long s = 0;
    for (int w = 0; w < 8; ++w) s += warp_sum[w];
    partial[blockIdx.x] = s;
  }
}

/* liboffload's C API: the symbols liboffload.so exports besides the CUDA names it
 * interposes. Callable from C, C++ and Python (ctypes, torch.cuda.memory).
 *
 * Every function is safe to call when the shim is idle, from any thread, and never
 * throws. Functions that return int return 0 (or a length) on success and -1 on error. */
#ifndef OFFLOAD_OFFLOAD_H
#define OFFLOAD_OFFLOAD_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Allocator pair for torch.cuda.memory.CUDAPluggableAllocator (route 2):
 *   CUDAPluggableAllocator("liboffload.so", "offload_malloc", "offload_free")
 * Memory comes from the device's stream-ordered pool (cuMemAllocAsync on `stream`). */
void* offload_malloc(size_t size, int device, void* stream);
void offload_free(void* ptr, size_t size, int device, void* stream);

/* Marks the end of a training step. Once called, automatic step detection is off
 * and every later step boundary comes from this call. */
void offload_mark_step(void);

/* The caller's word that the device bytes [ptr, ptr+bytes) are not written from this call on,
 * while that memory lives: a frozen parameter (requires_grad=False). A streamed weight inside such a range is
 * copied to the host once, and later evictions only unmap it. If the bytes are written all the
 * same, later reloads bring back the old bytes: mark only what nothing writes. The mark ends
 * when the allocation holding the range is freed. Returns 0, or -1 for a null or empty range. */
int offload_mark_read_only(const void* ptr, size_t bytes);

/* Starts a new high-water mark of the device footprint the executor reports
 * ("executor.device_peak" in the stats: live allocations outside arenas plus the physical
 * memory arenas hold). For benchmarks that measure the steady state after warm-up. */
void offload_reset_peak(void);

/* Without a device budget: paused nonzero, every hook forwards and observes nothing (allocations
 * made meanwhile are not tracked, and their frees are counted as unknown) until it is called again
 * with 0. For an A/B of what watching costs inside one process. Returns 0, or -1 with a budget (it
 * needs every allocation and launch) or when the shim is not active. */
int offload_pause_observation(int paused);

/* Writes the shim's counters as one JSON object into buf (NUL-terminated).
 * Returns the length written, or -1 if len is too small. */
int offload_stats_json(char* buf, size_t len);

/* The library's version and the source commit it was built from, e.g. "0.1.0 (commit 1a2b3c4d5e6f)". */
const char* offload_version(void);

#ifdef __cplusplus
}
#endif
#endif

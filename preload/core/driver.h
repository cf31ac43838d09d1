// The Driver seam: the few things the core asks of the GPU driver.
//
// Production binds it to the CUDA driver (preload/cuda_driver.cpp, entry points resolved
// at run time); tests and `offloadctl replay` bind it to SimDriver, which backs "device
// memory" with host pages. Core code receives a Driver& and never names CUDA.
//
// Threading: every method may be called from any thread, concurrently.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/launch_args.h"
#include "planner/types.h"  // DevPtr, Stream, Func

namespace offload {

inline constexpr Stream kPerThreadStream = 0x2;

struct ParamInfo {
  uint32_t offset;  // byte offset of the parameter in the launch's argument buffer
  uint32_t size;    // bytes
};

class Driver {
 public:
  virtual ~Driver() = default;

  // Parameter layout of `f`. Writes up to `cap` entries and returns the parameter count,
  // or -1 if the driver cannot tell (then only the `extra` buffer of a launch is scanned).
  virtual int param_layout(Func f, ParamInfo* out, int cap) = 0;

  // The kernel's (mangled) name, or nullptr. The string lives as long as the module.
  virtual const char* func_name(Func f) = 0;

  // Step-boundary markers, for timing steps on the GPU when CUPTI's records are not to be
  // had (telemetry off, or another CUPTI client took the buffers). record_marker is called
  // from a hook on the launching thread, once per step: it records an event on `s` and
  // returns a handle (0 on failure). The worker asks for the GPU time between two markers
  // (-1 until both have been reached) and releases them.
  virtual uint64_t record_marker(Stream s) = 0;
  // Pins host memory for fast, async copies (cuMemHostRegister, portable). Called from the
  // worker thread, after a launch has shown the driver which context to use. False if
  // the driver refused or no context is known yet.
  virtual bool pin_host(void* p, uint64_t bytes) = 0;
  virtual int64_t marker_elapsed_ns(uint64_t from, uint64_t to) = 0;
  virtual void release_marker(uint64_t m) = 0;

  // ---- What the executor moves bytes with: virtual memory, streams, events, copies. ----
  // Called from hooks (on the launching thread, whose context is current) and from the
  // worker thread (no context current: the binding makes the context of the first launch
  // current around each call). None of them calls back into the shim's hooks.

  // Physical allocation granularity of the device (bytes); 0 if the driver cannot tell.
  virtual uint64_t vmm_granularity() = 0;
  // The device's total memory (bytes); 0 if unknown.
  virtual uint64_t device_total_bytes() = 0;
  // The device's used memory (total less free, cuMemGetInfo): every process's allocations,
  // contexts and loaded modules, ours included; 0 if unknown.
  virtual uint64_t device_used_bytes() { return 0; }
  // A node-unique name of the device (its PCI bus id, "0000:1b:00.0"); "" if unknown.
  virtual std::string gpu_id() { return {}; }
  // The high-water mark of memory reserved by the device's default stream-ordered pool (the
  // one cudaMallocAsync draws from), bytes; 0 if unknown.
  virtual uint64_t pool_reserved_high() { return 0; }
  // What that pool reserves now (PyTorch keeps what it reserved: about the high mark since the
  // last trim); 0 when unknown.
  virtual uint64_t pool_reserved_current() { return 0; }
  // Gives that pool's unused reserved memory back to the device until it reserves at most
  // `keep` bytes (cuMemPoolTrimTo; memory backing live allocations stays). False when the
  // driver cannot.
  virtual bool pool_trim(uint64_t keep) {
    (void)keep;
    return false;
  }
  // Blocks the calling thread until all work queued in the process's context has completed
  // (cuCtxSynchronize), so that the pool has seen its frees complete. Never from a hook's fast
  // path. False when it cannot (or a graph capture is in progress).
  virtual bool synchronize() { return false; }
  // A reserved, unbacked virtual range of `bytes` (a multiple of the granularity); 0 on failure.
  virtual DevPtr reserve(uint64_t bytes) = 0;
  virtual void unreserve(DevPtr va, uint64_t bytes) = 0;
  // Physical device memory of `bytes`; a non-zero handle, or 0 when the device is full.
  virtual uint64_t create_physical(uint64_t bytes) = 0;
  virtual void release_physical(uint64_t handle) = 0;
  // Maps [va, va+bytes) onto the start of `handle` and grants this device read/write.
  virtual bool map(DevPtr va, uint64_t bytes, uint64_t handle) = 0;
  // Maps n whole handles one after another from `va` and grants this device read/write over
  // them all; on failure nothing stays mapped.
  virtual bool map_run(DevPtr va, const uint64_t* handles, const uint64_t* sizes, size_t n) {
    uint64_t off = 0;
    for (size_t i = 0; i < n; off += sizes[i++]) {
      if (map(va + off, sizes[i], handles[i])) continue;
      for (size_t j = 0, o = 0; j < i; o += sizes[j++]) unmap(va + o, sizes[j]);
      return false;
    }
    return true;
  }
  // Unmaps [va, va+bytes); the range stays reserved. The caller has made sure no queued
  // work still touches it.
  virtual bool unmap(DevPtr va, uint64_t bytes) = 0;
  // Grants apart from mappings (Residency::Options::grant_apart): map_run's mappings without
  // their access grant, the grant alone (from any thread, over mappings made that way), and a
  // stream's wait until a word of host memory the GPU reads holds at least `value`. A grant
  // made while a copy to the host runs takes about 0.7 ms (docs/results.md, "The driver's calls
  // while copies run"); made apart, the thread that maps need not wait for it, and the GPU
  // waits only if it gets there first. grant_word() nullptr: not offered.
  virtual bool map_run_ungranted(DevPtr va, const uint64_t* handles, const uint64_t* sizes, size_t n) {
    return map_run(va, handles, sizes, n);
  }
  virtual bool grant(DevPtr, uint64_t) { return true; }
  virtual std::atomic<uint64_t>* grant_word() { return nullptr; }
  virtual bool stream_wait_word(Stream, uint64_t) { return false; }
  // The copy gate (Residency::Options::copy_gate): copies to the host on stream `s` are queued in
  // chunks of `chunk` bytes, each behind a wait on a gate word the host holds closed while it
  // makes an access grant, which then waits only for the chunk already past it. A grant costs
  // about 0.7 ms while a copy to the host runs and about 0.05 ms while none does
  // (docs/results.md). Chunks widen past `ahead` of them queued (GateChunks). False: not
  // offered, copies and grants as without it.
  virtual bool gate_copies_out(Stream s, uint64_t chunk, uint32_t ahead) {
    (void)s, (void)chunk, (void)ahead;
    return false;
  }
  struct GateCounts {
    uint64_t grants = 0;     // grants made with the gate closed
    uint64_t closed_ns = 0;  // the time the gate was closed: copies out could not start
    uint64_t chunks = 0;     // chunks queued behind the gate
  };
  virtual GateCounts gate_counts() { return {}; }

  // A stream that does not synchronise with the legacy default stream; 0 on failure.
  virtual Stream create_stream() = 0;
  // An event without timing; 0 on failure.
  virtual uint64_t create_event() = 0;
  virtual void destroy_event(uint64_t e) = 0;
  // Captures the work queued on `s` so far.
  virtual bool record_event(uint64_t e, Stream s) = 0;
  // Work queued on `s` after this waits for the event's last capture.
  virtual bool stream_wait(Stream s, uint64_t e) = 0;
  // 1: the last capture has completed (or there was none); 0: not yet; -1: error.
  virtual int event_query(uint64_t e) = 0;
  // Blocks the calling thread until the last capture has completed.
  virtual bool event_sync(uint64_t e) = 0;
  // 1: everything queued on `s` has completed; 0: not yet; -1: unknown (diagnostics only).
  virtual int stream_query(Stream) { return -1; }
  // 1: `s` is capturing a graph (or its capture was invalidated); 0: not; -1: cannot tell.
  virtual int stream_capturing(Stream) { return -1; }
  // The calling thread's current context (a device's), as a number; 0: none or cannot tell.
  virtual uint64_t current_context() { return 0; }
  // Asynchronous copies on `s` (host memory pinned for full speed).
  virtual bool copy_to_host(void* dst, DevPtr src, uint64_t bytes, Stream s) = 0;
  virtual bool copy_to_device(DevPtr dst, const void* src, uint64_t bytes, Stream s) = 0;
  // core/range_hash.h's hash of [va, va + bytes), taken on the GPU in stream order: a ticket
  // whose hash_value() is the hash once `s` has passed this point (record an event after it and
  // wait for that). A ticket is reused after kHashTickets more. -1: not here (the caller copies
  // the bytes to the host and hashes them itself).
  static constexpr int64_t kHashTickets = 512;
  virtual int64_t hash_start(DevPtr va, uint64_t bytes, Stream s) {
    (void)va, (void)bytes, (void)s;
    return -1;
  }
  virtual uint64_t hash_value(int64_t ticket) {
    (void)ticket;
    return 0;
  }
  // Device-to-device copies and zeroing on `s`, outside the shim's hooks: a range made again
  // keeps what its launch writes besides it (saved beside, zeroed, put back). device_copies():
  // whether this driver has both; the others are false without it.
  virtual bool device_copies() { return false; }
  virtual bool copy_device(DevPtr dst, DevPtr src, uint64_t bytes, Stream s) {
    (void)dst, (void)src, (void)bytes, (void)s;
    return false;
  }
  virtual bool zero_device(DevPtr dst, uint64_t bytes, Stream s) {
    (void)dst, (void)bytes, (void)s;
    return false;
  }
  // Launches `f` on `s` once more, with `params` as a kernelParams array (one pointer per
  // parameter, to its bytes). Never passes through the shim's hooks. False when it cannot.
  // `extra`: cuLaunchKernel's extra array instead (the arguments packed in one buffer; params null).
  virtual bool launch_kernel(Func f, const LaunchGeom& g, Stream s, void** params, void** extra = nullptr) {
    (void)f, (void)g, (void)s, (void)params, (void)extra;
    return false;
  }
};

}  // namespace offload

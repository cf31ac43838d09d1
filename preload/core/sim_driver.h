// SimDriver: a Driver without a GPU, for tests and for `offloadctl replay`.
//
// Kernels are registered with a name and a parameter layout; "device memory" is host
// memory from mmap, so a device address is a real address and scanning a launch's
// arguments behaves exactly as on the GPU.
//
// The executor's half of the seam is modelled so that its bugs fail loudly instead of
// passing by luck (STYLE.md, practice 3):
//   - Virtual memory. A reservation is PROT_NONE address space; a physical handle is a
//     memfd filled with 0xA5; map() puts the memfd at the address MAP_SHARED, so the same
//     handle at two addresses shows the same bytes, and unmap() puts PROT_NONE back. A
//     kernel touching an evicted range segfaults; one reading a range that was mapped but
//     never reloaded reads 0xA5 garbage. Misuses (mapping outside a reservation, over a
//     mapping, part of a handle (the H200 refuses that too), misaligned; unmapping what is
//     not mapped exactly; releasing a handle still mapped) fail and are counted. So is an
//     unmapping of memory that a copy queued or running still reads or writes (the GPU would
//     fault), whatever its bytes end up being.
//     A copy whose host side lies partly in a pinned registration (pin_host) and partly
//     beyond it is counted as a misuse too: a real driver may take it for pinned memory.
//   - A GPU that runs later. Every stream (any value, 0 and 2 included, all independent:
//     no legacy-stream implicit synchronisation) is a FIFO of ops — kernels (launch()),
//     copies, event records and waits — that runs only when a test calls step(), run_all()
//     or a caller blocks in event_sync(). Copies read and write at execution time, and
//     with set_copy_delay(true) a copy runs only when nothing else can, so a missing
//     stream wait shows up as wrong bytes.
//
// Threading: every method may be called from any thread. One mutex guards the state; op
// bodies run without it (under a separate, recursive execution lock that keeps one op
// running at a time), so a body may call back into the driver.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/driver.h"

namespace offload {

class SimDriver final : public Driver {
 public:
  SimDriver() = default;
  SimDriver(const SimDriver&) = delete;
  SimDriver& operator=(const SimDriver&) = delete;
  ~SimDriver() override;

  Func add_kernel(std::string name, std::vector<ParamInfo> params);
  // A kernel that launch_kernel can run: `body` gets its arguments laid out as the parameter
  // layout says, when the simulated GPU reaches it.
  using Body = std::function<void(const unsigned char* args)>;
  Func add_kernel(std::string name, std::vector<ParamInfo> params, Body body);
  bool launch_kernel(Func f, const LaunchGeom& g, Stream s, void** params, void** extra = nullptr) override;
  size_t kernel_launches() const { return kernel_launches_; }  // through launch_kernel
  // Hashes taken on the simulated GPU in stream order (core/range_hash.h), unless turned off
  // (set_hashing(false): callers then copy bytes back to hash them, as on a GPU without it).
  int64_t hash_start(DevPtr va, uint64_t bytes, Stream s) override;
  uint64_t hash_value(int64_t ticket) override;
  void set_hashing(bool on) { hashing_ = on; }
  size_t hashes() const { return hashes_; }  // taken through hash_start
  // Device-to-device copies and zeroing in stream order, every byte.
  bool device_copies() override { return device_copies_; }
  void set_device_copies(bool on) { device_copies_ = on; }
  bool copy_device(DevPtr dst, DevPtr src, uint64_t bytes, Stream s) override;
  bool zero_device(DevPtr dst, uint64_t bytes, Stream s) override;
  size_t device_copies_made() const { return device_copies_made_; }  // copies and zeroings
  // The attribute bytes the last launch_kernel was given (tests: a launch made again carries them).
  std::vector<unsigned char> last_launch_attrs() const {
    std::lock_guard lock(mu_);
    return last_attrs_;
  }
  // Registers a kernel the driver cannot describe (param_layout returns -1).
  Func add_opaque_kernel(std::string name);

  // Plain host-page "device allocations" (PyTorch's own pool), outside the VMM model.
  DevPtr alloc(size_t bytes);
  void free(DevPtr p);

  int param_layout(Func f, ParamInfo* out, int cap) override;
  const char* func_name(Func f) override;
  // Markers read a simulated GPU clock that tests advance; a marker is "reached" once the
  // clock has been advanced past the moment it was recorded (reach_markers()).
  uint64_t record_marker(Stream s) override;
  int64_t marker_elapsed_ns(uint64_t from, uint64_t to) override;
  void release_marker(uint64_t m) override;
  bool pin_host(void* p, uint64_t bytes) override;
  std::vector<std::pair<void*, uint64_t>> pinned() const;
  void advance_clock(int64_t ns);
  void reach_markers();
  size_t live_markers() const;

  size_t param_queries() const { return param_queries_; }

  // ---- Virtual memory --------------------------------------------------------------------
  static constexpr unsigned char kGarbage = 0xA5;  // what fresh physical memory holds
  uint64_t vmm_granularity() override;
  uint64_t device_total_bytes() override;
  DevPtr reserve(uint64_t bytes) override;
  void unreserve(DevPtr va, uint64_t bytes) override;
  uint64_t create_physical(uint64_t bytes) override;
  void release_physical(uint64_t handle) override;
  bool map(DevPtr va, uint64_t bytes, uint64_t handle) override;
  bool map_run(DevPtr va, const uint64_t* handles, const uint64_t* sizes, size_t n) override {
    if (on_map_run) on_map_run(sizes, n);
    return Driver::map_run(va, handles, sizes, n);
  }
  // Sees the handle sizes of every run mapped (tests: how many pieces back a range).
  std::function<void(const uint64_t* sizes, size_t n)> on_map_run;
  bool unmap(DevPtr va, uint64_t bytes) override;
  // Grants apart: a mapping made ungranted faults on any access (PROT_NONE) until grant()
  // covers it, and a copy queued over it fails (a misuse); a grant over anything not mapped is a
  // misuse. A stream's wait for the
  // word runs once the word holds the value (run_all and event_sync wait for it, as a GPU spins).
  bool map_run_ungranted(DevPtr va, const uint64_t* handles, const uint64_t* sizes, size_t n) override;
  bool grant(DevPtr va, uint64_t bytes) override;
  std::atomic<uint64_t>* grant_word() override { return &grant_word_; }
  bool stream_wait_word(Stream s, uint64_t value) override;
  // Tests: while held, grant() blocks (a grant slowed by copies to the host).
  void hold_grants(bool on);
  // The copy gate, modelled (Residency::Options::copy_gate): copies to the host on the gated
  // stream are queued in chunks of the gate's size, each an operation of its own, and mappings
  // granted while it is set count as gated grants.
  bool gate_copies_out(Stream s, uint64_t chunk, uint32_t ahead) override;
  GateCounts gate_counts() override { return {gate_grants_.load(), 0, gated_chunks_.load()}; }
  uint64_t gated_chunks() const { return gated_chunks_.load(); }  // tests

  // 0 (the driver cannot tell) or a multiple of the page size; default 64 KiB. Aborts
  // otherwise. Set it before reserving.
  void set_granularity(uint64_t bytes);
  void set_device_total_bytes(uint64_t bytes);  // default 16 GiB
  // create_physical returns 0 when the live physical bytes would exceed this; default none.
  void set_physical_limit(uint64_t bytes);
  // Tests: each create_physical, and each map, takes at least this long (the relative costs of a
  // driver's handles and mappings).
  void set_vmm_delays_ns(uint64_t create, uint64_t map) { create_delay_ns_ = create, map_delay_ns_ = map; }
  // Tests whose kernels read no bytes: a copy touches one byte per granule of its device side
  // and both ends of its host side (an unmapped granule still faults) instead of moving every
  // byte, and fresh physical memory is not filled. Bookkeeping and misuse checks are the same.
  void set_copy_bytes(bool on) { copy_bytes_ = on; }
  // Tests: the next reserve() calls place their ranges at these addresses, in order (each a
  // multiple of the granularity, with the range free; a call that cannot is a misuse and
  // returns 0), as a real driver's ranges may interleave.
  void reserve_at(std::vector<DevPtr> vas);
  size_t reserve_hints_left() const;

  // The stream-ordered pool PyTorch's allocations come from, as a trim sees it: `reserved`
  // bytes, of which `in_use` back live allocations (a trim keeps those). Until set, the pool is
  // unknown (pool_reserved_current 0) and pool_trim says the driver cannot.
  void set_pool(uint64_t reserved, uint64_t in_use);
  uint64_t pool_reserved_current() override;
  // Physical bytes, the pool's reservation and what set_outside says the rest of the process
  // holds (modules, libraries); 0 until set_outside is called (unknown, as a driver may say).
  uint64_t device_used_bytes() override;
  void set_outside(uint64_t bytes);
  bool pool_trim(uint64_t keep) override;
  // The simulated streams never capture graphs, unless a test says one does: set_capturing
  // only makes stream_capturing say so (the work still runs); begin_capture captures as CUDA
  // does. Until end_capture, work queued on the stream is recorded into a graph and does not
  // run; an event recorded there belongs to the capture, and waiting for it from a stream that
  // is not capturing, or querying or synchronising it, is a misuse (CUDA would pull that stream
  // into the capture, or fail). launch_graph queues the graph's work, in order, as one op.
  int stream_capturing(Stream s) override;
  void set_capturing(Stream s, bool on);
  void begin_capture(Stream s);
  uint64_t end_capture(Stream s);  // the graph: 1, 2, ...
  void launch_graph(Stream s, uint64_t graph);
  size_t captured_ops() const;     // work recorded into graphs so far
  struct PoolTrims {
    uint64_t calls = 0;  // pool_trim calls on a known pool
    uint64_t last_keep = 0;
    uint64_t physical_at_last = 0;  // VMM physical bytes live at the last call
  };
  PoolTrims pool_trims() const;

  struct VmmStats {
    uint64_t physical_bytes = 0;  // created and not yet released
    uint64_t physical_peak = 0;
    uint64_t mapped_bytes = 0;
    uint64_t mapped_peak = 0;
    uint64_t creates = 0;   // successful create_physical
    uint64_t releases = 0;  // release_physical of a live handle
    uint64_t maps = 0;      // successful map
    uint64_t unmaps = 0;    // successful unmap
    uint64_t misuses = 0;   // calls that broke a rule of the API (see the top of this file)
    uint64_t event_queries = 0;  // event_query calls (each costs the host 2-9 us on the H200)
  };
  VmmStats vmm_stats() const;
  void reset_peaks();  // peaks := current values
  // Whether `p` lies in a mapped range (a VMM mapping, not an alloc()).
  bool is_mapped(DevPtr p) const;

  // ---- Streams, events, copies --------------------------------------------------------------
  Stream create_stream() override;  // 0x1000, 0x1001, ...
  uint64_t create_event() override;
  void destroy_event(uint64_t e) override;
  bool record_event(uint64_t e, Stream s) override;
  bool stream_wait(Stream s, uint64_t e) override;
  int event_query(uint64_t e) override;
  int stream_query(Stream s) override;  // 1 when `s` has nothing queued or running
  // Runs queued ops (in a fixed order) until the event's last capture completes. Aborts
  // with a message if it never can (a deadlock of waits).
  bool event_sync(uint64_t e) override;
  bool copy_to_host(void* dst, DevPtr src, uint64_t bytes, Stream s) override;
  bool copy_to_device(DevPtr dst, const void* src, uint64_t bytes, Stream s) override;

  // Enqueues a "kernel" on `s`: `body` runs when the simulated GPU reaches it and reads
  // and writes device memory directly (an unmapped range segfaults, on purpose).
  void launch(Stream s, std::function<void()> body);
  // Executes one runnable head op (not a wait still blocked) of a randomly chosen stream;
  // false when none is runnable.
  bool step(std::mt19937_64& rng);
  // Runs until every queue is empty, round-robin over streams. Aborts with a message if
  // only blocked waits remain (a deadlock).
  void run_all();
  // When on, step/run_all/event_sync run a copy only when no other op is runnable.
  void set_copy_delay(bool on);
  // A held stream runs nothing (a GPU busy with its work for long): run_all returns with its ops,
  // and those of streams waiting for it, still queued.
  void hold(Stream s, bool on);
  size_t pending_ops() const;  // queued or running, all streams
  size_t live_events() const;

 private:
  struct Kernel {
    std::string name;
    std::vector<ParamInfo> params;
    bool opaque = false;
    Body body;
  };
  const Kernel* kernel_locked(Func f) const;  // the kernel `f` names, nullptr for none (under mu_)
  std::atomic<size_t> kernel_launches_{0};
  std::vector<unsigned char> last_attrs_;  // under mu_
  std::atomic<bool> hashing_{true};
  std::atomic<size_t> hashes_{0};
  std::atomic<bool> device_copies_{true};
  std::atomic<size_t> device_copies_made_{0};
  std::unique_ptr<uint64_t[]> hash_ring_{new uint64_t[kHashTickets]()};  // written by the hash ops
  mutable std::mutex mu_;
  bool pool_known_ = false;
  bool outside_known_ = false;
  uint64_t outside_ = 0;
  std::vector<Stream> capturing_;
  std::map<Stream, std::vector<std::function<void()>>> capture_;  // streams capturing, their work
  std::vector<std::vector<std::function<void()>>> graphs_;
  size_t captured_ops_ = 0;
  uint64_t pool_reserved_ = 0, pool_in_use_ = 0;
  PoolTrims pool_trims_;
  std::vector<Kernel*> kernels_;               // Func = index + 1, times 16
  std::unordered_map<DevPtr, size_t> allocs_;  // alloc(): base -> bytes
  size_t param_queries_ = 0;
  struct Marker {
    int64_t at;
    bool reached;
  };
  int64_t clock_ns_ = 0;
  std::vector<std::pair<void*, uint64_t>> pinned_;
  void check_host_range_locked(const void* p, uint64_t bytes);
  uint64_t next_marker_ = 1;
  std::unordered_map<uint64_t, Marker> markers_;

  // Virtual memory.
  struct Physical {
    int fd;
    uint64_t bytes;
    uint64_t mapped = 0;  // how many mappings use it
  };
  struct Mapping {
    uint64_t bytes;
    uint64_t handle;
    bool granted = true;
  };
  bool map_locked(DevPtr va, uint64_t bytes, uint64_t handle, bool granted);
  bool word_waits_locked() const;  // a stream's head waits for the grant word
  // A copy's device side over a mapping not granted yet: a misuse, and the copy fails, as the
  // driver checks a copy's memory when it is called (CUDA_ERROR_INVALID_VALUE on an H100).
  bool ungranted_locked(DevPtr va, uint64_t bytes);
  uint64_t granularity_ = 64 << 10;
  uint64_t device_total_ = 16ull << 30;
  uint64_t physical_limit_ = UINT64_MAX;
  std::map<DevPtr, uint64_t> reservations_;  // base -> bytes
  std::deque<DevPtr> reserve_hints_;
  std::map<uint64_t, Physical> physical_;    // handle -> memfd
  std::map<DevPtr, Mapping> mapped_;         // base -> mapping
  uint64_t next_handle_ = 1;
  VmmStats stats_;

  // The simulated GPU.
  // Each record_event is a capture with its own generation; a wait or a query concerns the
  // generation that was last at the time it was issued, as with CUDA's re-recorded events.
  struct EventState {
    uint64_t enqueued = 0;            // generation of the last record_event; 0: never recorded
    bool in_capture = false;          // the last record_event was on a capturing stream
    std::set<uint64_t> pending;       // generations recorded and not yet executed
    bool done(uint64_t gen) const { return gen == 0 || !pending.count(gen); }
  };
  struct Op {
    enum Kind { kKernel, kCopy, kRecord, kWait, kWaitWord } kind;
    std::function<void()> body;       // kernel, copy
    std::shared_ptr<EventState> ev;   // record, wait
    uint64_t gen = 0;                 // record: its generation; wait: the one awaited; wait word: its value
    DevPtr dev = 0, dev_end = 0;      // copy: the device memory it reads or writes
  };
  struct Queue {
    std::deque<Op> ops;
    bool running = false;  // its head op has been taken and is executing
    DevPtr run_dev = 0, run_dev_end = 0;  // the running op's device memory, if a copy
  };
  enum class Pick { kRandom, kRoundRobin };
  // Chooses a stream whose head op may run now, or returns false. Under mu_.
  bool pick_locked(Pick how, std::mt19937_64* rng, Stream* out);
  // Pops the head op of `s` and runs it (body without mu_). Caller holds exec_mu_.
  void execute(std::unique_lock<std::mutex>& lock, Stream s);
  [[noreturn]] void deadlock_locked(const char* where);
  void enqueue(Stream s, Op op);
  bool copy_touches_locked(DevPtr va, uint64_t bytes) const;  // a copy queued or running

  std::recursive_mutex exec_mu_;  // one op executes at a time; taken before mu_
  std::map<Stream, Queue> queues_;
  std::unordered_map<uint64_t, std::shared_ptr<EventState>> events_;
  Stream next_stream_ = 0x1000;
  uint64_t next_event_ = 1;
  Stream rr_last_ = 0;
  bool rr_started_ = false;
  bool copy_delay_ = false;
  std::vector<Stream> held_;
  std::atomic<uint64_t> create_delay_ns_{0}, map_delay_ns_{0};
  std::atomic<uint64_t> grant_word_{0};
  std::atomic<Stream> gate_stream_{0};
  std::atomic<uint64_t> gate_chunk_{0}, gated_chunks_{0}, gate_grants_{0};
  bool copy_out_one(void* dst, DevPtr src, uint64_t bytes, Stream s);
  std::mutex grant_hold_mu_;
  std::condition_variable grant_hold_cv_;
  bool grants_held_ = false;
  std::atomic<bool> copy_bytes_{true};
};

}  // namespace offload

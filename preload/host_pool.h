// HostPool: where evicted bytes go. The node-wide pool that offloadd holds (DaemonLink), or
// a private one in this process when no daemon can be reached (PrivatePool). Either may
// refuse a lease (pool full, over this process's share): the caller then keeps the data
// resident and counts the refusal. Used off the launch path only.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/ipc.h"
#include "residency/host_store.h"
#include "offload/pool_layout.h"
#include "common/env.h"

namespace offload {

// What a shim tells offloadd once it knows its GPU (protocol Attach).
struct AttachInfo {
  int gpu = -1;                          // device ordinal in the process
  int rank = -1, local_rank = -1;        // RANK, LOCAL_RANK; -1 unset
  int local_world = 0;                   // LOCAL_WORLD_SIZE; 0 unset
  uint64_t device_budget = 0;            // bytes; 0 none
  std::string gpu_id;                    // node-unique (PCI bus id); at most 31 bytes are sent
};

// What offloadd answers: how many GPUs of the node share its host link, and the link's
// figures for the node as a whole (all GPUs copying at once).
struct NodeShare {
  uint32_t gpus = 1;
  uint64_t fair_share = 0;            // of the host pool, bytes
  double h2d = 0, d2h = 0, both = 0;  // node link, bytes per ns (= GB/s); 0 unknown
};

// AttachInfo from RANK, LOCAL_RANK and LOCAL_WORLD_SIZE (torchrun's names), read through
// `get` (getenv by default). A value that is not a plain decimal in range (rank >= 0,
// 1 <= local world <= proto::kMaxLocalWorld) counts as unset: -1, or 0 for the world size.
// Never throws.
AttachInfo attach_info_from_env(int gpu, uint64_t budget, std::string gpu_id);
AttachInfo attach_info_from_env(int gpu, uint64_t budget, std::string gpu_id,
                                const std::function<const char*(const char*)>& get);

struct Extent {
  unsigned char* host = nullptr;  // in this process's mapping
  uint64_t offset = 0;            // in the pool's data area
  uint64_t bytes = 0;
};

class HostPool {
 public:
  using PinFn = std::function<bool(void*, uint64_t)>;
  virtual ~HostPool() = default;
  // nullopt with *why when refused (the caller keeps the data resident).
  virtual std::optional<Extent> lease(uint64_t bytes, std::string* why) = 0;
  virtual void release(const Extent& e) = 0;
  virtual std::string describe() const = 0;
  // Pins, with `pin(ptr, bytes)`, the chunks of the pool that `e` touches and that are not
  // pinned yet: `chunk` bytes apart from the data area's start (kPinChunk; the same value on
  // every call, as copies are split at those boundaries). True when every chunk `e` touches is
  // pinned; a chunk that failed is tried again on the next call. Only what a plan leases is
  // pinned, once the plan is made: pinning while steps run slowed their kernels 2-3x, which the
  // planner would have measured as the model's compute (docs/results.md).
  bool pin_extent(const Extent& e, const PinFn& pin, uint64_t chunk = kPinChunk);
  uint64_t pinned_bytes() const;

 protected:
  // The data area extents lie in (nullptr before the pool is mapped).
  virtual std::pair<unsigned char*, uint64_t> data_area() = 0;
  std::string pinned_note() const;  // ", N MiB pinned", or nothing

 private:
  // The chunk grid for an area of `bytes`, fixed by the first call; false for another `chunk`.
  bool grid(uint64_t bytes, uint64_t chunk);  // holds pin_mu_
  bool pin_chunk(unsigned char* data, uint64_t bytes, uint64_t c, const PinFn& pin);  // holds pin_mu_

  mutable std::mutex pin_mu_;
  uint64_t pin_chunk_ = 0;
  std::vector<bool> chunk_pinned_;
  uint64_t pinned_bytes_ = 0;
};

// A pool of private memory, for when no daemon is reachable. Not pre-faulted.
class PrivatePool final : public HostPool {
 public:
  explicit PrivatePool(uint64_t bytes);
  ~PrivatePool() override;
  std::optional<Extent> lease(uint64_t bytes, std::string* why) override;
  void release(const Extent& e) override;
  std::string describe() const override;

 private:
  std::pair<unsigned char*, uint64_t> data_area() override;

  std::mutex mu_;
  void* base_ = nullptr;
  uint64_t total_ = 0;
  std::optional<LeaseTable> table_;
};

// The shim's link to offloadd: connects (starting the daemon if allowed), registers, maps
// the shared segment, pushes telemetry, and reconnects after a daemon restart, keeping its
// client id (and so its leases). Driven from the shim's worker thread by poll(). Every
// request holds mu_, so any thread may call lease/release/attach.
class DaemonLink final : public HostPool {
 public:
  DaemonLink(Settings s, std::string command);
  // Connects/reconnects when due. Returns true while connected.
  bool poll(int64_t now_ms);
  void push(const proto::Telemetry& t);
  bool connected() const { return client_.connected(); }
  // Connected at the last poll(): for a thread that must not race the worker for the connection.
  bool up() const { return up_.load(std::memory_order_acquire); }
  // The running daemon's pool is smaller than OFFLOAD_HOST_POOL asked for (it was started
  // earlier with another size); said once, as a warning, when first seen.
  bool pool_short() const { return pool_short_; }
  // False once the link has given up (daemon off, not startable): use a PrivatePool.
  bool usable() const { return usable_; }
  const std::string& failure() const { return failure_; }

  std::optional<Extent> lease(uint64_t bytes, std::string* why) override;
  void release(const Extent& e) override;
  std::string describe() const override;
  // Fork handler, in the child: closes the socket and unmaps the pool, lock-free.
  void drop_in_child();

  // Tells offloadd which GPU, rank and budget this process has; returns how many GPUs share
  // the node's host link. The info is remembered and sent again after every reconnect (a
  // restarted daemon learns it again); calling it again replaces it (and refreshes the
  // answer, which changes as processes come and go). nullopt with *why when not connected
  // (it is sent on connecting), when offloadd is older than protocol 1.1 (nothing is sent:
  // it would drop the connection), or when it refuses; the link stays up in every case.
  std::optional<NodeShare> attach(const AttachInfo& info, std::string* why);
  // The answer to the last Attach sent (by attach() or on a reconnect); nullopt if none was
  // sent or the last one was not answered.
  std::optional<NodeShare> last_share() const;

 private:
  std::pair<unsigned char*, uint64_t> data_area() override;
  bool connect_and_register(std::string* why);
  // How long the first Register waits: a daemon that is starting (ours, or another process's)
  // answers only once it has made its pool, every page allocated.
  int first_register_wait_ms() const;
  bool start_daemon(std::string* why);
  bool poll_locked(int64_t now_ms);  // holds mu_
  std::optional<NodeShare> send_attach(std::string* why);  // holds mu_

  Settings settings_;
  std::string command_;
  Paths paths_;
  DaemonClient client_;
  SharedPoolMapping mapping_;
  uint32_t client_id_ = 0;
  bool usable_ = true;
  bool tried_start_ = false;
  int64_t next_try_ms_ = 0;
  std::string failure_;
  std::optional<AttachInfo> attach_info_;  // sent again on every reconnect
  std::optional<NodeShare> share_;
  bool said_no_attach_ = false;            // logged once that the daemon has no Attach
  bool pool_short_ = false;                // the daemon's pool is smaller than OFFLOAD_HOST_POOL asked (logged once)
  mutable std::mutex mu_;  // one request at a time on the connection
  std::atomic<int> fd_{-1};  // the connection's descriptor, for the fork handler
  std::atomic<bool> up_{false};  // connected at the last poll()
};

// The cap's host store's chunks from offloadd's pool (a lease each, for the rest of the process)
// while the link is up and the pool has room: the daemon faulted its pages in before this process
// needed them, so that only pinning is left to pay here. Says once where evicted bytes go.
class LinkChunks final : public ChunkSource {
 public:
  explicit LinkChunks(DaemonLink& link) : link_(link) {}
  Lent lend(uint64_t bytes, bool may_count) override;  // never counted: the node's pool

 private:
  DaemonLink& link_;
  std::atomic<bool> lent_said_{false}, refused_said_{false};
};

// Where an offloadd binary is: OFFLOAD_DAEMON_BIN, next to liboffload.so, then PATH.
std::string find_daemon_binary(const std::string& configured);

}  // namespace offload

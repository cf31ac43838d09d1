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

#include "client/ipc.h"
#include "client/pool_layout.h"
#include "core/env.h"

namespace offload {

struct Extent {
  unsigned char* host = nullptr;  // in this process's mapping
  uint64_t offset = 0;            // in the pool's data area
  uint64_t bytes = 0;
};

class HostPool {
 public:
  virtual ~HostPool() = default;
  // nullopt with *why when refused (the caller keeps the data resident).
  virtual std::optional<Extent> lease(uint64_t bytes, std::string* why) = 0;
  virtual void release(const Extent& e) = 0;
  virtual std::string describe() const = 0;
  // Pins the whole pool once, in chunks under 2 GiB, with `pin(ptr, bytes)`. True once pinned.
  virtual bool pin(const std::function<bool(void*, uint64_t)>& pin) = 0;
  bool pinned() const { return pinned_; }

 protected:
  bool pinned_ = false;
};

// A pool of private memory, for when no daemon is reachable. Not pre-faulted.
class PrivatePool final : public HostPool {
 public:
  explicit PrivatePool(uint64_t bytes);
  ~PrivatePool() override;
  std::optional<Extent> lease(uint64_t bytes, std::string* why) override;
  void release(const Extent& e) override;
  std::string describe() const override;
  bool pin(const std::function<bool(void*, uint64_t)>& pin) override;

 private:
  std::mutex mu_;
  void* base_ = nullptr;
  uint64_t total_ = 0;
  std::optional<LeaseTable> table_;
};

// The shim's link to offloadd: connects (starting the daemon if allowed), registers, maps
// the shared segment, pushes telemetry, and reconnects after a daemon restart, keeping its
// client id (and so its leases). Driven from the shim's worker thread by poll().
class DaemonLink final : public HostPool {
 public:
  DaemonLink(Settings s, std::string command);
  // Connects/reconnects when due. Returns true while connected.
  bool poll(int64_t now_ms);
  void push(const proto::Telemetry& t);
  bool connected() const { return client_.connected(); }
  // False once the link has given up (daemon off, not startable): use a PrivatePool.
  bool usable() const { return usable_; }
  const std::string& failure() const { return failure_; }

  std::optional<Extent> lease(uint64_t bytes, std::string* why) override;
  void release(const Extent& e) override;
  std::string describe() const override;
  bool pin(const std::function<bool(void*, uint64_t)>& pin) override;
  // Fork handler, in the child: closes the socket and unmaps the pool, lock-free.
  void drop_in_child();

 private:
  bool connect_and_register(std::string* why);
  bool start_daemon(std::string* why);

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
  mutable std::mutex mu_;  // one request at a time on the connection
  std::atomic<int> fd_{-1};  // the connection's descriptor, for the fork handler
};

// Where an offloadd binary is: OFFLOAD_DAEMON_BIN, next to liboffload.so, then PATH.
std::string find_daemon_binary(const std::string& configured);

}  // namespace offload

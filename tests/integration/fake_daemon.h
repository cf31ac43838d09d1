// A stand-in offloadd in the test process, for what the shim (DaemonLink) and offloadctl do
// with a daemon that has no Attach or NodeQuery:
//   - Minor0: speaks protocol 1.0 (its reply headers say so) and, like the real offloadd of
//     1.0, answers a type it does not know with an Error and closes the connection;
//   - RefusesNode: speaks 1.1 but answers Attach and NodeQuery with an Error, keeping the
//     connection.
// Both serve Register (with a real pool segment the client can map), Lease (or a forged
// extent: forge_leases), Release, StatusQuery and Telemetry. One thread, poll() over the listening socket and the
// connections; every frame type it received is recorded.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/ipc.h"
#include "offload/pool_layout.h"
#include "offload/protocol.h"

namespace offload::it {

class FakeDaemon {
 public:
  enum class Mode { Minor0, RefusesNode };

  FakeDaemon() = default;
  FakeDaemon(const FakeDaemon&) = delete;
  FakeDaemon& operator=(const FakeDaemon&) = delete;
  ~FakeDaemon() {
    if (thread_.joinable()) {
      stop_ = true;
      char c = 1;
      ssize_t ignored = ::write(wake_[1], &c, 1);
      (void)ignored;
      thread_.join();
    }
    for (auto& [fd, r] : conns_) ::close(fd);
    for (int fd : {listen_fd_, wake_[0], wake_[1]})
      if (fd >= 0) ::close(fd);
    if (!socket_.empty()) ::unlink(socket_.c_str());
    if (base_) munmap(base_, total_);
    if (!segment_.empty()) shm_unlink(("/" + segment_).c_str());
  }

  // Listens on `socket_path` with a 64 MiB pool of its own.
  bool start(const std::string& socket_path, Mode mode, std::string* why) {
    static std::atomic<int> n{0};
    mode_ = mode;
    segment_ = "offload-it-fake-" + std::to_string(getpid()) + "-" + std::to_string(n++);
    total_ = pool_total_bytes(64ull << 20, 64);
    int shm = shm_open(("/" + segment_).c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (shm < 0 || ftruncate(shm, static_cast<off_t>(total_)) != 0) {
      *why = std::string("shm: ") + strerror(errno);
      if (shm >= 0) ::close(shm);
      return false;
    }
    void* p = mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_SHARED, shm, 0);
    ::close(shm);
    if (p == MAP_FAILED) {
      *why = std::string("mmap: ") + strerror(errno);
      return false;
    }
    base_ = p;
    table_ = LeaseTable::format(p, total_, 64, static_cast<uint32_t>(getpid()));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket_path.c_str());
    listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (!table_ || listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listen_fd_, 8) != 0 || pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
      *why = "cannot listen on " + socket_path + ": " + strerror(errno);
      return false;
    }
    socket_ = socket_path;
    thread_ = std::thread([this] { serve(); });
    return true;
  }

  const std::string& socket() const { return socket_; }
  // Every frame type received, in order.
  std::vector<uint16_t> types_seen() const {
    std::lock_guard lock(mu_);
    return seen_;
  }
  size_t count_of(proto::MsgType t) const {
    size_t k = 0;
    for (uint16_t x : types_seen()) k += x == static_cast<uint16_t>(t);
    return k;
  }
  // From now on, every Lease is answered with this extent (offset, bytes) whatever the pool
  // holds: a daemon that lies. forge_leases(0, 0) goes back to the truth.
  void forge_leases(uint64_t offset, uint64_t bytes) {
    forged_offset_ = offset;
    forged_bytes_ = bytes;
  }
  // Every Register is answered only after `ms`, the loop held meanwhile: a daemon still making its
  // pool, as offloadd is before it serves.
  void delay_register(int ms) { register_delay_ms_ = ms; }
  uint64_t pool_bytes() const { return table_ ? table_->data_bytes() : 0; }
  // Closes every connection (as a daemon restart would), from the serving thread.
  void drop_all() {
    drop_all_ = true;
    char c = 1;
    ssize_t ignored = ::write(wake_[1], &c, 1);
    (void)ignored;
  }

 private:
  uint16_t minor() const { return mode_ == Mode::Minor0 ? 0 : 1; }

  void reply(int fd, proto::MsgType type, uint64_t seq, const void* payload, uint32_t len) {
    auto f = proto::encode_bytes(type, seq, payload, len);
    proto::FrameHeader h;
    std::memcpy(&h, f.data(), sizeof h);
    h.minor = minor();
    std::memcpy(f.data(), &h, sizeof h);
    send_all(fd, f.data(), f.size());
  }
  template <class T>
  void reply(int fd, proto::MsgType type, uint64_t seq, const T& v) {
    reply(fd, type, seq, &v, sizeof v);
  }
  void error(int fd, uint64_t seq, const std::string& msg) {
    proto::Error e{};
    e.status = static_cast<uint32_t>(proto::Status::BadRequest);
    std::snprintf(e.message, sizeof e.message, "%s", msg.c_str());
    reply(fd, proto::MsgType::Error, seq, e);
  }

  // False: close the connection.
  bool handle(int fd, const proto::FrameHeader& h, const std::vector<unsigned char>& p) {
    {
      std::lock_guard lock(mu_);
      seen_.push_back(h.type);
    }
    using proto::MsgType;
    if (mode_ == Mode::Minor0 && h.type > static_cast<uint16_t>(MsgType::Error)) {
      error(fd, 0, "unknown message type " + std::to_string(h.type));
      return false;
    }
    switch (static_cast<MsgType>(h.type)) {
      case MsgType::Register: {
        if (int ms = register_delay_ms_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        proto::RegisterReply r{};
        r.client_id = 1;
        r.pool_bytes = table_->data_bytes();
        r.fair_share = table_->data_bytes();
        std::snprintf(r.segment, sizeof r.segment, "%s", segment_.c_str());
        reply(fd, MsgType::RegisterReply, h.seq, r);
        return true;
      }
      case MsgType::Lease: {
        proto::Lease l{};
        proto::read_payload(p.data(), p.size(), &l);
        proto::LeaseReply r{};
        if (forged_bytes_) {
          r.offset = forged_offset_;
          r.bytes = forged_bytes_;
        } else if (auto off = table_->lease(l.bytes, 1, 1)) {
          r.offset = *off;
          r.bytes = (l.bytes + kLeaseAlign - 1) / kLeaseAlign * kLeaseAlign;
        } else {
          r.status = static_cast<uint32_t>(proto::Status::PoolFull);
        }
        reply(fd, MsgType::LeaseReply, h.seq, r);
        return true;
      }
      case MsgType::Release: {
        proto::Release r{};
        proto::read_payload(p.data(), p.size(), &r);
        bool ok = table_->release(r.offset, 1);
        reply(fd, MsgType::ReleaseReply, h.seq,
              proto::ReleaseReply{static_cast<uint32_t>(ok ? proto::Status::Ok : proto::Status::UnknownLease), 0});
        return true;
      }
      case MsgType::StatusQuery: {
        proto::StatusHead head{table_->data_bytes(), table_->used_bytes(),
                               table_->data_bytes() - table_->used_bytes(), static_cast<uint32_t>(getpid()), 0};
        proto::ClientStatus c{};
        c.pid = 4242;
        c.gpu = 5;
        c.client_id = 1;
        c.connected = 1;
        std::snprintf(c.command, sizeof c.command, "fake-client");
        auto f = proto::encode_status(h.seq, head, {c});
        proto::FrameHeader fh;
        std::memcpy(&fh, f.data(), sizeof fh);
        fh.minor = minor();
        std::memcpy(f.data(), &fh, sizeof fh);
        send_all(fd, f.data(), f.size());
        return true;
      }
      case MsgType::Telemetry:
        return true;
      case MsgType::Attach:
        error(fd, h.seq, "attach refused by the fake");
        return true;
      case MsgType::NodeQuery:
        error(fd, h.seq, "no node here");
        return true;
      default:
        error(fd, h.seq, "not a request");
        return true;
    }
  }

  void serve() {
    for (;;) {
      std::vector<pollfd> fds{{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
      for (auto& [fd, r] : conns_) fds.push_back({fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 1000) < 0 && errno != EINTR) return;
      if (fds[0].revents) {
        char b[16];
        while (::read(wake_[0], b, sizeof b) > 0) {
        }
        if (stop_) return;
        if (drop_all_.exchange(false)) {
          for (auto& [fd, r] : conns_) ::close(fd);
          conns_.clear();
        }
        continue;
      }
      if (fds[1].revents) {
        int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) conns_[fd];
      }
      for (size_t i = 2; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        int fd = fds[i].fd;
        unsigned char b[4096];
        ssize_t n = ::recv(fd, b, sizeof b, 0);
        bool keep = n > 0;
        if (keep) {
          proto::FrameReader& r = conns_[fd];
          r.feed(b, static_cast<size_t>(n));
          proto::FrameHeader h{};
          std::vector<unsigned char> p;
          while (keep && r.next(&h, &p)) keep = handle(fd, h, p);
          keep = keep && !r.failed();
        }
        if (!keep) {
          ::close(fd);
          conns_.erase(fd);
        }
      }
    }
  }

  Mode mode_ = Mode::Minor0;
  std::string socket_, segment_;
  void* base_ = nullptr;
  uint64_t total_ = 0;
  std::optional<LeaseTable> table_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::map<int, proto::FrameReader> conns_;  // the serving thread's only
  std::atomic<bool> drop_all_{false}, stop_{false};
  std::atomic<uint64_t> forged_offset_{0}, forged_bytes_{0};
  std::atomic<int> register_delay_ms_{0};
  mutable std::mutex mu_;
  std::vector<uint16_t> seen_;
  std::thread thread_;
};

}  // namespace offload::it

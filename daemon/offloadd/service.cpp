#include "offloadd/service.h"

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <sstream>

#include "common/clock.h"
#include "common/ipc.h"
#include "common/log.h"
#include "offload/text.h"

namespace offload {
namespace {



std::string gbps(uint64_t bps) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f GB/s", static_cast<double>(bps) / 1e9);
  return b;
}

std::string link_text(const proto::NodeLink& l) {
  if (!l.h2d_bps && !l.d2h_bps && !l.both_bps) return "host link not measured";
  return "host link " + gbps(l.h2d_bps) + " H2D, " + gbps(l.d2h_bps) + " D2H, " + gbps(l.both_bps) + " both ways";
}

std::string bytes_text(uint64_t b) {
  char s[32];
  if (b >= (1ull << 30)) std::snprintf(s, sizeof s, "%.2f GiB", static_cast<double>(b) / static_cast<double>(1ull << 30));
  else std::snprintf(s, sizeof s, "%.1f MiB", static_cast<double>(b) / static_cast<double>(1ull << 20));
  return s;
}

}  // namespace

Service::~Service() {
  if (prefault_.joinable()) prefault_.join();
  for (auto& [fd, c] : conns_) close(fd);
  for (auto& [fd, m] : metrics_conns_) close(fd);
  if (listen_fd_ >= 0) close(listen_fd_);
  if (owns_socket_) unlink(opt_.socket_path.c_str());
  if (metrics_fd_ >= 0) close(metrics_fd_);
  for (int fd : wake_)
    if (fd >= 0) close(fd);
  if (base_) {
    bool empty = table_ && table_->used_bytes() == 0;
    munmap(base_, total_);
    // Leases outlive the daemon (their processes still use the bytes); an empty pool goes.
    if (empty) shm_unlink(("/" + opt_.segment).c_str());
  }
  // The locks go last: the segment's (it is removed while still ours), then the socket's.
  if (seg_fd_ >= 0) close(seg_fd_);
  if (lock_fd_ >= 0) close(lock_fd_);
}

void Service::stop() {
  stopping_ = true;
  char c = 1;
  ssize_t ignored = write(wake_[1], &c, 1);
  (void)ignored;
}

int Service::run() {
  log().info("serving {} ({} pool bytes in /{}){}; {}", opt_.socket_path, table_->data_bytes(), opt_.segment,
             metrics_fd_ >= 0 ? ", metrics on 127.0.0.1:" + std::to_string(metrics_port_) : std::string(),
             link_text(opt_.node_link));
  while (!stopping_) {
    std::vector<pollfd> fds;
    fds.push_back({wake_[0], POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    if (metrics_fd_ >= 0) fds.push_back({metrics_fd_, POLLIN, 0});
    for (auto& [fd, c] : conns_)
      fds.push_back({fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
    for (auto& [fd, m] : metrics_conns_) fds.push_back({fd, static_cast<short>(m.answered ? POLLOUT : POLLIN), 0});
    int n = poll(fds.data(), fds.size(), poll_timeout_ms(mono_ms()));
    if (n < 0 && errno != EINTR) {
      log().error("poll: {}", strerror(errno));
      return 1;
    }
    reap_dead();
    expire_metrics(mono_ms());
    if (n <= 0) continue;
    for (const pollfd& p : fds) {
      if (!p.revents) continue;
      if (p.fd == wake_[0]) {
        char buf[16];
        while (read(wake_[0], buf, sizeof buf) > 0) {
        }
      } else if (p.fd == listen_fd_) {
        accept_client();
      } else if (p.fd == metrics_fd_) {
        accept_metrics();
      } else if (metrics_conns_.count(p.fd)) {
        on_metrics(p.fd, p.revents);
      } else {
        if (p.revents & POLLOUT) on_writable(p.fd);
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) on_readable(p.fd);
      }
    }
  }
  log().info("stopping: {} bytes still leased stay in /{}", table_->used_bytes(), opt_.segment);
  return 0;
}

int Service::poll_timeout_ms(int64_t now) const {
  int64_t t = 250;  // the reaper's period
  for (auto& [fd, m] : metrics_conns_) t = std::min(t, std::max<int64_t>(m.deadline_ms - now, 0));
  return static_cast<int>(t);
}

void Service::accept_client() {
  for (;;) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if ((errno == EMFILE || errno == ENFILE) && refuse_for_descriptors(listen_fd_, true)) continue;
      return;
    }
    ucred cred{};
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != geteuid()) {
      log().warn("refused a connection from uid {} (pid {}): this daemon serves uid {} only", cred.uid, cred.pid,
                 geteuid());
      send_error(fd, 0, proto::Status::Refused, "this offloadd serves another user");
      close(fd);
      continue;
    }
    conns_[fd].pid = static_cast<uint32_t>(cred.pid);
    conns_[fd].pid_start = process_start(conns_[fd].pid);
  }
}

bool Service::refuse_for_descriptors(int listen_fd, bool framed) {
  // Out of descriptors, the waiting peer keeps the listening socket readable: without the
  // spare, poll() returns at once forever and the daemon spins.
  spare_fd_.release();
  int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  bool refused = fd >= 0;
  if (refused) {
    rlimit r{};
    getrlimit(RLIMIT_NOFILE, &r);
    std::string msg = "offloadd is out of file descriptors (" + std::to_string(conns_.size()) +
                      " connections, limit " + std::to_string(r.rlim_cur) + "); try again later";
    if (framed) {
      proto::Error e{};
      e.status = static_cast<uint32_t>(proto::Status::Refused);
      std::snprintf(e.message, sizeof e.message, "%s", msg.c_str());
      auto frame = proto::encode(proto::MsgType::Error, 0, e);
      ssize_t ignored = ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      (void)ignored;
    } else {
      std::string resp = "HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n" +
                         msg + "\n";
      ssize_t ignored = ::send(fd, resp.data(), resp.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      (void)ignored;
    }
    close(fd);
    ++fd_refusals_;
  }
  if (!spare_fd_.take()) refused = false;  // nothing in reserve: wait for the next round
  // Rate-limited: a flood of refusals must not flood the log too.
  int64_t t = mono_ms();
  if (fd_refusals_ && t - fd_warned_ms_ >= 10'000) {
    log().warn("out of file descriptors: refused {} connection(s) since the last warning ({} open)", fd_refusals_,
               conns_.size() + metrics_conns_.size());
    fd_warned_ms_ = t;
    fd_refusals_ = 0;
  }
  return refused;
}

void Service::on_writable(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  if (!it->second.out.flush(fd)) drop(fd);
}

void Service::on_readable(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  unsigned char buf[8192];
  ssize_t n = recv(fd, buf, sizeof buf, 0);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
    drop(fd);
    return;
  }
  if (n < 0) return;
  Conn& conn = it->second;
  conn.reader.feed(buf, static_cast<size_t>(n));
  proto::FrameHeader h{};
  std::vector<unsigned char> payload;
  while (!conn.closing && conns_.count(fd) && conn.reader.next(&h, &payload)) handle(fd, conn, h, payload);
  if (!conns_.count(fd)) return;
  if (!conn.closing && conn.reader.failed()) {
    log().warn("pid {}: {}; closing its connection", conn.pid, conn.reader.error());
    send_error(fd, 0, proto::Status::BadRequest, conn.reader.error());
    conn.closing = true;
  }
  if (conn.closing) drop(fd);
}

uint64_t Service::fair_share() const {
  size_t active = 0;
  for (auto& [id, c] : clients_)
    if (c.fd >= 0 || table_->leased_by(id) > 0) ++active;
  // In whole lease units: leases are rounded up to them, so a share that is not one could
  // not be reached by every client at once.
  return table_->data_bytes() / std::max<size_t>(active, 1) / kLeaseAlign * kLeaseAlign;
}

proto::Status Service::admit(const Client& c, uint64_t bytes) const {
  if (bytes > table_->data_bytes()) return proto::Status::PoolFull;
  bytes = (bytes + kLeaseAlign - 1) / kLeaseAlign * kLeaseAlign;  // what a lease will take
  uint64_t mine = table_->leased_by(c.id);
  if (c.host_limit && mine + bytes > c.host_limit) return proto::Status::OverLimit;
  uint64_t share = fair_share();
  uint64_t free_bytes = table_->data_bytes() - table_->used_bytes();
  if (mine + bytes <= share) return bytes <= free_bytes ? proto::Status::Ok : proto::Status::PoolFull;
  // Past its share: only from what the others do not need to reach theirs.
  uint64_t owed = 0;
  for (auto& [id, other] : clients_) {
    if (id == c.id || (other.fd < 0 && table_->leased_by(id) == 0)) continue;
    uint64_t theirs = table_->leased_by(id);
    if (theirs < share) owed += share - theirs;
  }
  if (bytes + owed > free_bytes) return owed > 0 ? proto::Status::OverLimit : proto::Status::PoolFull;
  return proto::Status::Ok;
}

void Service::handle(int fd, Conn& conn, const proto::FrameHeader& h, const std::vector<unsigned char>& payload) {
  using proto::MsgType;
  const auto type = static_cast<MsgType>(h.type);
  Client* c = conn.client_id ? &clients_[conn.client_id] : nullptr;
  switch (type) {
    case MsgType::Register: {
      proto::Register r{};
      proto::read_payload(payload.data(), payload.size(), &r);
      if (c) return send_error(fd, h.seq, proto::Status::BadRequest, "already registered");
      uint32_t id = 0;
      // A client re-attaching after a daemon restart keeps its id, and so its leases.
      // The same process: the pid (0 names nobody) and, where both are known, its start time.
      if (r.prior_client && conn.pid && clients_.count(r.prior_client) && clients_[r.prior_client].fd < 0 &&
          clients_[r.prior_client].pid == conn.pid &&
          (!clients_[r.prior_client].pid_start || !conn.pid_start || clients_[r.prior_client].pid_start == conn.pid_start))
        id = r.prior_client;
      if (!id) id = next_id_++;
      Client& nc = clients_[id];
      nc.fd = fd;
      nc.id = id;
      nc.pid = conn.pid;  // the kernel's word, not the payload's
      nc.pid_start = conn.pid_start;
      nc.gpu = r.gpu;
      nc.host_limit = r.host_limit;
      nc.command = utf8_clean(r.command);  // another client's bytes: any, cut anywhere
      conn.client_id = id;
      proto::RegisterReply rep{};
      rep.status = static_cast<uint32_t>(proto::Status::Ok);
      rep.client_id = id;
      rep.pool_bytes = table_->data_bytes();
      rep.fair_share = fair_share();
      std::snprintf(rep.segment, sizeof rep.segment, "%s", opt_.segment.c_str());
      log().info("client {} registered: pid {}, gpu {}, '{}'{}", id, nc.pid, nc.gpu, nc.command,
                 id == r.prior_client ? " (re-attached)" : "");
      return send(fd, proto::encode(MsgType::RegisterReply, h.seq, rep));
    }
    case MsgType::StatusQuery: {
      proto::StatusQuery q{};
      proto::read_payload(payload.data(), payload.size(), &q);
      return send(fd, status_frame(h.seq, q.after_client));
    }
    case MsgType::NodeQuery: {
      proto::NodeQuery q{};
      proto::read_payload(payload.data(), payload.size(), &q);
      return send(fd, node_frame(h.seq, q.after_client));
    }
    case MsgType::Shutdown: {
      log().info("shutdown requested by pid {}", conn.pid);
      send(fd, proto::encode(MsgType::ReleaseReply, h.seq, proto::ReleaseReply{0, 0}));
      stop();
      return;
    }
    default:
      break;
  }
  if (!c) return send_error(fd, h.seq, proto::Status::NotRegistered, "register first");
  switch (type) {
    case MsgType::Lease: {
      proto::Lease l{};
      proto::read_payload(payload.data(), payload.size(), &l);
      proto::LeaseReply rep{};
      proto::Status st = l.bytes == 0 ? proto::Status::BadRequest : admit(*c, l.bytes);
      if (st == proto::Status::Ok) {
        if (auto off = table_->lease(l.bytes, c->id, c->pid, c->pid_start)) {
          rep.offset = *off;
          rep.bytes = (l.bytes + kLeaseAlign - 1) / kLeaseAlign * kLeaseAlign;
        } else {
          st = proto::Status::PoolFull;
        }
      }
      rep.status = static_cast<uint32_t>(st);
      return send(fd, proto::encode(MsgType::LeaseReply, h.seq, rep));
    }
    case MsgType::Release: {
      proto::Release r{};
      proto::read_payload(payload.data(), payload.size(), &r);
      bool ok = table_->release(r.offset, c->id);
      proto::ReleaseReply rep{static_cast<uint32_t>(ok ? proto::Status::Ok : proto::Status::UnknownLease), 0};
      return send(fd, proto::encode(MsgType::ReleaseReply, h.seq, rep));
    }
    case MsgType::Telemetry:
      proto::read_payload(payload.data(), payload.size(), &c->last);
      return;  // no reply: telemetry is fire-and-forget
    case MsgType::Attach:
      return on_attach(fd, *c, h, payload);
    default:
      return send_error(fd, h.seq, proto::Status::BadRequest,
                        "message type " + std::to_string(h.type) + " is not a request");
  }
}

void Service::on_attach(int fd, Client& c, const proto::FrameHeader& h, const std::vector<unsigned char>& payload) {
  proto::Attach a{};
  proto::read_payload(payload.data(), payload.size(), &a);
  proto::AttachReply rep{};
  if (a.gpu < -1 || a.rank < -1 || a.local_rank < -1 || a.local_world < 0 || a.local_world > proto::kMaxLocalWorld) {
    // What it said before stands.
    rep.status = static_cast<uint32_t>(proto::Status::BadRequest);
  } else {
    c.attached = true;
    c.gpu = a.gpu;
    c.rank = a.rank;
    c.local_rank = a.local_rank;
    c.local_world = a.local_world;
    c.device_budget = a.device_budget;
    c.gpu_id = a.gpu_id;
    rep.status = static_cast<uint32_t>(proto::Status::Ok);
  }
  rep.gpus = node_gpus();
  rep.fair_share = fair_share();
  rep.link = opt_.node_link;
  if (rep.status == static_cast<uint32_t>(proto::Status::Ok)) {
    std::string who = c.rank >= 0 ? "rank " + std::to_string(c.rank) : std::string("no rank");
    if (c.local_world > 0)
      who += " (local " + (c.local_rank >= 0 ? std::to_string(c.local_rank) : std::string("?")) + " of " +
             std::to_string(c.local_world) + ")";
    log().info("client {} (pid {}): {} on GPU {} (device {}), budget {}; GPUs sharing the host link: {}", c.id, c.pid,
               who, c.gpu_id.empty() ? std::string("of unknown id") : c.gpu_id, c.gpu,
               c.device_budget ? bytes_text(c.device_budget) : std::string("none"), rep.gpus);
    logged_gpus_ = rep.gpus;
  } else {
    log().warn("client {} (pid {}): attach refused (gpu {}, rank {}, local rank {}, local world {})", c.id, c.pid, a.gpu,
               a.rank, a.local_rank, a.local_world);
  }
  send(fd, proto::encode(proto::MsgType::AttachReply, h.seq, rep));
}

uint32_t Service::node_gpus() const {
  std::set<std::string> ids;
  size_t unnamed = 0;  // a client that cannot name its GPU counts as one of its own
  int32_t hint = 0;
  for (auto& [id, c] : clients_) {
    if (!c.attached || c.fd < 0) continue;
    if (c.gpu_id.empty()) ++unnamed;
    else ids.insert(c.gpu_id);
    hint = std::max(hint, c.local_world);
  }
  return static_cast<uint32_t>(std::max(ids.size() + unnamed, static_cast<size_t>(hint)));
}

void Service::note_node_change() {
  uint32_t g = node_gpus();
  if (g == logged_gpus_) return;
  log().info("GPUs sharing the host link: {} now", g);
  logged_gpus_ = g;
}

void Service::send(int fd, const std::vector<unsigned char>& frame) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) {
    // Not a connection of ours (refused at accept): one try, never a wait.
    ssize_t ignored = ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)ignored;
    return;
  }
  Conn& c = it->second;
  if (c.closing) return;
  c.out.append(frame.data(), frame.size());
  if (!c.out.flush(fd)) {
    c.closing = true;  // gone: dropped once its input is handled
  } else if (c.out.size() > opt_.max_output_bytes) {
    // A peer that does not read its replies would hold them here without bound.
    log().warn("pid {}: {} bytes of replies unread (at most {}); dropping its connection", c.pid, c.out.size(),
               opt_.max_output_bytes);
    c.closing = true;
  }
}

void Service::send_error(int fd, uint64_t seq, proto::Status st, const std::string& msg) {
  proto::Error e{};
  e.status = static_cast<uint32_t>(st);
  std::snprintf(e.message, sizeof e.message, "%s", msg.c_str());
  send(fd, proto::encode(proto::MsgType::Error, seq, e));
}

void Service::drop(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  uint32_t id = it->second.client_id;
  close(fd);
  conns_.erase(it);
  if (!id) return;
  // The process closed its connection or died (kill -9 included: the kernel closes it):
  // its leases go back to the pool now.
  uint64_t freed = table_->release_all(id);
  log().info("client {} (pid {}) disconnected; {} bytes back in the pool", id, clients_[id].pid, freed);
  clients_.erase(id);
  note_node_change();
}

void Service::reap_dead() {
  int64_t t = mono_ms();
  if (t - last_reap_ms_ < 250) return;
  last_reap_ms_ = t;
  // Adopted clients have no connection to hang up: watch their processes instead.
  for (auto it = clients_.begin(); it != clients_.end();) {
    if (it->second.fd < 0 && liveness(it->second.pid, it->second.pid_start) == Liveness::Gone) {
      uint64_t freed = table_->release_all(it->first);
      log().info("client {} (pid {}) is gone; {} bytes back in the pool", it->first, it->second.pid, freed);
      it = clients_.erase(it);
    } else {
      ++it;
    }
  }
}

std::vector<unsigned char> Service::status_frame(uint64_t seq, uint32_t after_client) const {
  proto::StatusHead head{};
  head.pool_bytes = table_->data_bytes();
  head.used_bytes = table_->used_bytes();
  head.free_bytes = head.pool_bytes - head.used_bytes;
  head.daemon_pid = static_cast<uint32_t>(getpid());
  std::vector<proto::ClientStatus> cs;
  uint64_t share = fair_share();
  // One page: the clients above after_client, by id, as many as a reply holds.
  uint16_t flags = 0;
  for (auto it = clients_.upper_bound(after_client); it != clients_.end(); ++it) {
    const auto& [id, c] = *it;
    if (cs.size() == proto::kMaxClients) {
      flags = proto::kFlagMoreClients;
      break;
    }
    proto::ClientStatus s{};
    s.pid = c.pid;
    s.gpu = c.gpu;
    s.client_id = id;
    s.connected = c.fd >= 0;
    s.leased_bytes = table_->leased_by(id);
    s.fair_share = share;
    s.last = c.last;
    copy_utf8(s.command, sizeof s.command, c.command);
    cs.push_back(s);
  }
  return proto::encode_status(seq, head, cs, flags);
}

std::vector<unsigned char> Service::node_frame(uint64_t seq, uint32_t after_client) const {
  proto::NodeHead head{};
  head.gpus = node_gpus();
  head.link = opt_.node_link;
  std::vector<proto::ClientNode> cs;
  uint16_t flags = 0;  // paged as status_frame
  for (auto it = clients_.upper_bound(after_client); it != clients_.end(); ++it) {
    const auto& [id, c] = *it;
    if (cs.size() == proto::kMaxClients) {
      flags = proto::kFlagMoreClients;
      break;
    }
    proto::ClientNode n{};
    n.client_id = id;
    n.pid = c.pid;
    n.gpu = c.gpu;
    n.rank = c.rank;
    n.local_rank = c.local_rank;
    n.local_world = c.local_world;
    n.device_budget = c.device_budget;
    std::snprintf(n.gpu_id, sizeof n.gpu_id, "%s", c.gpu_id.c_str());
    cs.push_back(n);
  }
  return proto::encode_node(seq, head, cs, flags);
}

}  // namespace offload

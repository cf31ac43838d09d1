#include "offloadd/service.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <sstream>

#include "common/files.h"
#include "common/ipc.h"
#include "common/log.h"

namespace offload {
namespace {

int64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1'000'000;
}

bool alive(uint32_t pid) { return pid && (kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM); }

void prefault(unsigned char* p, uint64_t bytes) {
#ifdef MADV_POPULATE_WRITE
  if (madvise(p, bytes, MADV_POPULATE_WRITE) == 0) return;
#endif
  const long page = sysconf(_SC_PAGESIZE);
  for (uint64_t off = 0; off < bytes; off += static_cast<uint64_t>(page)) p[off] = 0;
}

std::string label_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o;
}

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

std::unique_ptr<Service> Service::create(const ServiceOptions& o, std::string* why) {
  std::unique_ptr<Service> s(new Service());
  s->opt_ = o;
  // One daemon per socket: an exclusive lock held for the daemon's life, taken before it
  // touches the segment or the socket, so that a second one refused here changes nothing.
  std::string lock_path = o.socket_path + ".lock";
  s->lock_fd_ = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (s->lock_fd_ < 0) {
    *why = "cannot open " + lock_path + ": " + strerror(errno);
    return nullptr;
  }
  if (flock(s->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    *why = "another offloadd is already serving " + o.socket_path;
    return nullptr;
  }
  // The segment: adopt the one a previous daemon left, or create it. Either way it is locked
  // (flock on its fd) for the daemon's life: two daemons on one lease table would free each
  // other's leases and hand out live bytes again.
  const std::string shm_name = "/" + o.segment;
  uint64_t total = pool_total_bytes(o.pool_bytes, o.max_leases);
  bool adopted = false;
  auto lock_segment = [&](int fd) {
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) return true;
    *why = "another offloadd is serving the pool segment " + shm_name +
           " (from another socket?): refusing to share its lease table";
    return false;
  };
  s->seg_fd_ = shm_open(shm_name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0);
  if (s->seg_fd_ >= 0) {
    // Only a segment private to this user is adopted: anyone else who may write to it could
    // rewrite the lease table, or read the data.
    struct stat st;
    if (fstat(s->seg_fd_, &st) != 0) {
      *why = "cannot stat the pool segment " + shm_name + ": " + strerror(errno);
      return nullptr;
    }
    if (!check_owner_and_mode(st, "the existing pool segment " + shm_name, kNoGroupOrOther, why)) return nullptr;
    if (!lock_segment(s->seg_fd_)) return nullptr;
    const auto size = static_cast<uint64_t>(st.st_size);
    void* p = size ? mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, s->seg_fd_, 0) : MAP_FAILED;
    std::string reason = size ? std::string("cannot map it: ") + strerror(errno) : "it is empty";
    auto t = p == MAP_FAILED ? std::nullopt : LeaseTable::open(p, size, &reason);
    if (!t) {
      if (p != MAP_FAILED) munmap(p, size);
      *why = "shared-memory segment " + shm_name + " exists but is not a usable pool (" + reason +
             "); remove it (rm /dev/shm/" + o.segment + ") if no process uses it";
      return nullptr;
    }
    s->base_ = p;
    s->total_ = size;
    s->table_ = t;
    if (uint32_t bad = t->bad_slots())
      log().warn("pool {}: {} lease slots lie outside the data area; they are ignored", shm_name, bad);
    adopted = true;
  } else if (errno != ENOENT) {
    *why = "cannot open the pool segment " + shm_name + ": " + strerror(errno);
    return nullptr;
  }
  if (!adopted) {
    if (o.pool_bytes == 0) {
      *why = "no pool to adopt and no --pool-size given";
      return nullptr;
    }
    s->seg_fd_ = shm_open(shm_name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (s->seg_fd_ < 0) {
      *why = "cannot create shared-memory segment " + shm_name + ": " + strerror(errno);
      return nullptr;
    }
    // Locked before it has a size: a daemon that opens it meanwhile finds it locked or empty.
    if (!lock_segment(s->seg_fd_)) return nullptr;
    auto fail = [&](const std::string& m) {
      shm_unlink(shm_name.c_str());
      *why = m;
      return nullptr;
    };
    if (fchmod(s->seg_fd_, 0600) != 0 || ftruncate(s->seg_fd_, static_cast<off_t>(total)) != 0)
      return fail("cannot size shared-memory segment " + shm_name + ": " + strerror(errno));
    void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, s->seg_fd_, 0);
    if (p == MAP_FAILED)
      return fail(std::string("cannot map a pool of ") + std::to_string(total) + " bytes: " + strerror(errno));
    s->base_ = p;
    s->total_ = total;
    s->table_ = LeaseTable::format(p, total, o.max_leases, static_cast<uint32_t>(getpid()));
    if (!s->table_) return fail("pool too small for its lease table");
    // Fault the pool in behind the service: clients can register and lease meanwhile (a
    // page they touch first is faulted then), and nobody waits seconds for a large pool.
    if (o.prefault) {
      unsigned char* data = s->table_->data();
      uint64_t bytes = s->table_->data_bytes();
      s->prefault_ = std::thread([data, bytes] { prefault(data, bytes); });
    }
  }
  if (adopted) {
    PoolHeader& h = s->table_->header();
    ++h.generation;
    h.owner_pid = static_cast<uint32_t>(getpid());
    // Leases of live processes stay (their data may be in use); the rest is freed.
    for (const LeaseSlot& l : s->table_->leases()) {
      Client& c = s->clients_[l.client_id];
      c.id = l.client_id;
      c.pid = l.pid;
      s->next_id_ = std::max(s->next_id_, l.client_id + 1);
    }
    for (auto it = s->clients_.begin(); it != s->clients_.end();) {
      if (!alive(it->second.pid)) {
        s->table_->release_all(it->first);
        it = s->clients_.erase(it);
      } else {
        ++it;
      }
    }
    log().info("adopted pool /{} ({} data bytes, generation {}): {} clients with live leases", o.segment,
               s->table_->data_bytes(), h.generation, s->clients_.size());
  }

  // The socket, private to this user.
  sockaddr_un addr{};
  if (o.socket_path.size() >= sizeof addr.sun_path) {
    *why = "socket path too long: " + o.socket_path;
    return nullptr;
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, o.socket_path.c_str(), o.socket_path.size() + 1);
  s->listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  // Holding the lock, a socket file left here is a dead daemon's: replace it.
  unlink(o.socket_path.c_str());
  mode_t old = umask(0177);
  int rc = bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  umask(old);
  if (rc == 0) s->owns_socket_ = true;
  if (rc != 0 || chmod(o.socket_path.c_str(), o.socket_mode) != 0 || listen(s->listen_fd_, 64) != 0) {
    *why = "cannot listen on " + o.socket_path + ": " + strerror(errno);
    return nullptr;
  }
  if (o.metrics_port >= 0) {
    s->metrics_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(s->metrics_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in in{};
    in.sin_family = AF_INET;
    in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    in.sin_port = htons(static_cast<uint16_t>(o.metrics_port));
    if (bind(s->metrics_fd_, reinterpret_cast<sockaddr*>(&in), sizeof in) != 0 || listen(s->metrics_fd_, 16) != 0) {
      *why = "cannot serve metrics on 127.0.0.1:" + std::to_string(o.metrics_port) + ": " + strerror(errno);
      return nullptr;
    }
    socklen_t len = sizeof in;
    getsockname(s->metrics_fd_, reinterpret_cast<sockaddr*>(&in), &len);
    s->metrics_port_ = ntohs(in.sin_port);
  }
  if (pipe2(s->wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    *why = std::string("pipe: ") + strerror(errno);
    return nullptr;
  }
  return s;
}

Service::~Service() {
  if (prefault_.joinable()) prefault_.join();
  for (auto& [fd, c] : conns_) close(fd);
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
    for (auto& [fd, c] : conns_) fds.push_back({fd, POLLIN, 0});
    int n = poll(fds.data(), fds.size(), 250);
    if (n < 0 && errno != EINTR) {
      log().error("poll: {}", strerror(errno));
      return 1;
    }
    reap_dead();
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
      } else {
        on_readable(p.fd);
      }
    }
  }
  log().info("stopping: {} bytes still leased stay in /{}", table_->used_bytes(), opt_.segment);
  return 0;
}

void Service::accept_client() {
  for (;;) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
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
  }
}

void Service::accept_metrics() {
  for (;;) {
    int fd = accept4(metrics_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    // One request, one answer; the request itself is not needed (any path serves metrics).
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 200) > 0) {
      char buf[1024];
      ssize_t ignored = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      (void)ignored;
    }
    std::string body = metrics_text();
    std::string resp = "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: " +
                       std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    send_all(fd, resp.data(), resp.size());
    close(fd);
  }
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
  while (conns_.count(fd) && conn.reader.next(&h, &payload)) handle(fd, conn, h, payload);
  if (conns_.count(fd) && conn.reader.failed()) {
    log().warn("pid {}: {}; closing its connection", conn.pid, conn.reader.error());
    send_error(fd, 0, proto::Status::BadRequest, conn.reader.error());
    drop(fd);
  }
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
      if (r.prior_client && clients_.count(r.prior_client) && clients_[r.prior_client].fd < 0 &&
          clients_[r.prior_client].pid == conn.pid)
        id = r.prior_client;
      if (!id) id = next_id_++;
      Client& nc = clients_[id];
      nc.fd = fd;
      nc.id = id;
      nc.pid = conn.pid;  // the kernel's word, not the payload's
      nc.gpu = r.gpu;
      nc.host_limit = r.host_limit;
      nc.command = r.command;
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
    case MsgType::StatusQuery:
      return send(fd, status_frame(h.seq));
    case MsgType::NodeQuery:
      return send(fd, node_frame(h.seq));
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
        if (auto off = table_->lease(l.bytes, c->id, c->pid)) {
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
  // A peer that is gone is dropped when its hang-up is read.
  send_all(fd, frame.data(), frame.size());
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
  int64_t t = now_ms();
  if (t - last_reap_ms_ < 250) return;
  last_reap_ms_ = t;
  // Adopted clients have no connection to hang up: watch their processes instead.
  for (auto it = clients_.begin(); it != clients_.end();) {
    if (it->second.fd < 0 && !alive(it->second.pid)) {
      uint64_t freed = table_->release_all(it->first);
      log().info("client {} (pid {}) is gone; {} bytes back in the pool", it->first, it->second.pid, freed);
      it = clients_.erase(it);
    } else {
      ++it;
    }
  }
}

std::vector<unsigned char> Service::status_frame(uint64_t seq) const {
  proto::StatusHead head{};
  head.pool_bytes = table_->data_bytes();
  head.used_bytes = table_->used_bytes();
  head.free_bytes = head.pool_bytes - head.used_bytes;
  head.daemon_pid = static_cast<uint32_t>(getpid());
  std::vector<proto::ClientStatus> cs;
  uint64_t share = fair_share();
  for (auto& [id, c] : clients_) {
    if (cs.size() == proto::kMaxClients) break;
    proto::ClientStatus s{};
    s.pid = c.pid;
    s.gpu = c.gpu;
    s.client_id = id;
    s.connected = c.fd >= 0;
    s.leased_bytes = table_->leased_by(id);
    s.fair_share = share;
    s.last = c.last;
    std::snprintf(s.command, sizeof s.command, "%s", c.command.c_str());
    cs.push_back(s);
  }
  return proto::encode_status(seq, head, cs);
}

std::vector<unsigned char> Service::node_frame(uint64_t seq) const {
  proto::NodeHead head{};
  head.gpus = node_gpus();
  head.link = opt_.node_link;
  std::vector<proto::ClientNode> cs;
  for (auto& [id, c] : clients_) {
    if (cs.size() == proto::kMaxClients) break;
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
  return proto::encode_node(seq, head, cs);
}

std::string Service::metrics_text() const {
  std::ostringstream m;
  uint64_t used = table_->used_bytes();
  m << "# HELP offload_pool_bytes Size of the node's shared pinned host pool.\n# TYPE offload_pool_bytes gauge\n"
    << "offload_pool_bytes " << table_->data_bytes() << "\n"
    << "# HELP offload_pool_used_bytes Bytes of the pool leased to clients.\n# TYPE offload_pool_used_bytes gauge\n"
    << "offload_pool_used_bytes " << used << "\n"
    << "# HELP offload_clients Registered clients.\n# TYPE offload_clients gauge\n"
    << "offload_clients " << clients_.size() << "\n"
    << "# HELP offload_node_gpus GPUs of the node that share the host link (distinct GPUs of the attached "
       "clients, at least the largest local world size they reported).\n# TYPE offload_node_gpus gauge\n"
    << "offload_node_gpus " << node_gpus() << "\n";
  struct Metric {
    const char* name;
    const char* help;
    const char* type;
  };
  const Metric ms[] = {
      {"offload_client_leased_bytes", "Pool bytes leased by the client.", "gauge"},
      {"offload_client_resident_bytes", "Offloadable bytes resident on the GPU.", "gauge"},
      {"offload_client_evicted_bytes", "Bytes evicted to the pool.", "gauge"},
      {"offload_client_step_seconds", "Last step time.", "gauge"},
      {"offload_client_exposed_stall_seconds", "Transfer time not hidden by compute, last step.", "gauge"},
      {"offload_client_misses_total", "Demand reloads (launches that found data not resident).", "counter"},
  };
  for (const Metric& x : ms) {
    m << "# HELP " << x.name << ' ' << x.help << "\n# TYPE " << x.name << ' ' << x.type << "\n";
    for (auto& [id, c] : clients_) {
      m << x.name << "{client=\"" << id << "\",pid=\"" << c.pid << "\",gpu=\"" << c.gpu << "\",gpu_id=\""
        << label_escape(c.gpu_id) << "\",rank=\"" << (c.rank >= 0 ? std::to_string(c.rank) : std::string())
        << "\",command=\"" << label_escape(c.command) << "\"} ";
      std::string n = x.name;
      if (n == "offload_client_leased_bytes") m << table_->leased_by(id);
      else if (n == "offload_client_resident_bytes") m << c.last.resident_bytes;
      else if (n == "offload_client_evicted_bytes") m << c.last.evicted_bytes;
      else if (n == "offload_client_step_seconds") m << static_cast<double>(c.last.step_ns) / 1e9;
      else if (n == "offload_client_exposed_stall_seconds") m << static_cast<double>(c.last.exposed_stall_ns) / 1e9;
      else m << c.last.misses;
      m << "\n";
    }
  }
  return m.str();
}

}  // namespace offload

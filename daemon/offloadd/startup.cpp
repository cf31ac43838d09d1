// offloadd's start: the socket's lock, the socket and the metrics port, then the pool segment,
// made or adopted from a previous daemon.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/files.h"
#include "common/log.h"
#include "offloadd/service.h"

namespace offload {
namespace {

void prefault(unsigned char* p, uint64_t bytes) {
#ifdef MADV_POPULATE_WRITE
  if (madvise(p, bytes, MADV_POPULATE_WRITE) == 0) return;
#endif
  const long page = sysconf(_SC_PAGESIZE);
  for (uint64_t off = 0; off < bytes; off += static_cast<uint64_t>(page)) p[off] = 0;
}

bool lock_segment(int fd, const std::string& shm_name, std::string* why) {
  if (flock(fd, LOCK_EX | LOCK_NB) == 0) return true;
  *why = "another offloadd is serving the pool segment " + shm_name +
         " (from another socket?): refusing to share its lease table";
  return false;
}

}  // namespace

std::unique_ptr<Service> Service::create(const ServiceOptions& o, std::string* why) {
  std::unique_ptr<Service> s(new Service());
  s->opt_ = o;
  if (!s->lock_socket(why)) return nullptr;
  // The socket and the metrics port before the segment: a port in use is reported at once,
  // not after a large pool was made.
  if (!s->bind_endpoints(why)) return nullptr;
  // The segment: adopt the one a previous daemon left, or create it. Either way it is locked
  // (flock on its fd) for the daemon's life: two daemons on one lease table would free each
  // other's leases and hand out live bytes again.
  const std::string shm_name = "/" + o.segment;
  bool adopted = false;
  if (!s->open_segment(shm_name, &adopted, why)) return nullptr;
  if (!adopted && !s->make_segment(shm_name, why)) return nullptr;
  if (adopted) s->adopt_leases();

  if (pipe2(s->wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    *why = std::string("pipe: ") + strerror(errno);
    return nullptr;
  }
  return s;
}

bool Service::lock_socket(std::string* why) {
  // One daemon per socket: an exclusive lock held for the daemon's life, taken before it
  // touches the segment or the socket, so that a second one refused here changes nothing.
  std::string lock_path = opt_.socket_path + ".lock";
  lock_fd_ = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd_ < 0) {
    *why = "cannot open " + lock_path + ": " + strerror(errno);
    return false;
  }
  if (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    *why = "another offloadd is already serving " + opt_.socket_path;
    return false;
  }
  return true;
}

bool Service::bind_endpoints(std::string* why) {
  // The socket, private to this user.
  sockaddr_un addr{};
  if (opt_.socket_path.size() >= sizeof addr.sun_path) {
    *why = "socket path too long: " + opt_.socket_path;
    return false;
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, opt_.socket_path.c_str(), opt_.socket_path.size() + 1);
  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  // Holding the lock, a socket file left here is a dead daemon's: replace it.
  unlink(opt_.socket_path.c_str());
  mode_t old = umask(0177);
  int rc = bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  umask(old);
  if (rc == 0) owns_socket_ = true;
  if (rc != 0 || chmod(opt_.socket_path.c_str(), opt_.socket_mode) != 0 || listen(listen_fd_, 64) != 0) {
    *why = "cannot listen on " + opt_.socket_path + ": " + strerror(errno);
    return false;
  }
  if (opt_.metrics_port >= 0) {
    metrics_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(metrics_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in in{};
    in.sin_family = AF_INET;
    in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    in.sin_port = htons(static_cast<uint16_t>(opt_.metrics_port));
    if (bind(metrics_fd_, reinterpret_cast<sockaddr*>(&in), sizeof in) != 0 || listen(metrics_fd_, 16) != 0) {
      *why = "cannot serve metrics on 127.0.0.1:" + std::to_string(opt_.metrics_port) + ": " + strerror(errno);
      return false;
    }
    socklen_t len = sizeof in;
    getsockname(metrics_fd_, reinterpret_cast<sockaddr*>(&in), &len);
    metrics_port_ = ntohs(in.sin_port);
  }
  return true;
}

bool Service::open_segment(const std::string& shm_name, bool* adopted, std::string* why) {
  seg_fd_ = shm_open(shm_name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0);
  if (seg_fd_ < 0) {
    if (errno == ENOENT) return true;
    *why = "cannot open the pool segment " + shm_name + ": " + strerror(errno);
    return false;
  }
  // Only a segment private to this user is adopted: anyone else who may write to it could
  // rewrite the lease table, or read the data.
  struct stat st;
  if (fstat(seg_fd_, &st) != 0) {
    *why = "cannot stat the pool segment " + shm_name + ": " + strerror(errno);
    return false;
  }
  if (!check_owner_and_mode(st, "the existing pool segment " + shm_name, kNoGroupOrOther, why)) return false;
  if (!lock_segment(seg_fd_, shm_name, why)) return false;
  const auto size = static_cast<uint64_t>(st.st_size);
  void* p = size ? mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, seg_fd_, 0) : MAP_FAILED;
  std::string reason = size ? std::string("cannot map it: ") + strerror(errno) : "it is empty";
  auto t = p == MAP_FAILED ? std::nullopt : LeaseTable::open(p, size, &reason);
  if (!t) {
    if (p != MAP_FAILED) munmap(p, size);
    *why = "shared-memory segment " + shm_name + " exists but is not a usable pool (" + reason +
           "); remove it (rm /dev/shm/" + opt_.segment + ") if no process uses it";
    return false;
  }
  base_ = p;
  total_ = size;
  table_ = t;
  if (uint32_t bad = t->bad_slots())
    log().warn("pool {}: {} lease slots lie outside the data area; they are ignored", shm_name, bad);
  *adopted = true;
  return true;
}

bool Service::make_segment(const std::string& shm_name, std::string* why) {
  const uint64_t total = pool_total_bytes(opt_.pool_bytes, opt_.max_leases);
  if (opt_.pool_bytes == 0) {
    *why = "no pool to adopt and no --pool-size given";
    return false;
  }
  std::string no_room = pool_room_problem(total, memory_room(opt_.shm_dir), opt_.shm_dir);
  if (!no_room.empty()) {
    *why = no_room;
    return false;
  }
  seg_fd_ = shm_open(shm_name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (seg_fd_ < 0) {
    *why = "cannot create shared-memory segment " + shm_name + ": " + strerror(errno);
    return false;
  }
  // Locked before it has a size: a daemon that opens it meanwhile finds it locked or empty.
  if (!lock_segment(seg_fd_, shm_name, why)) return false;
  auto fail = [&](const std::string& m) {
    shm_unlink(shm_name.c_str());
    *why = m;
    return false;
  };
  if (fchmod(seg_fd_, 0600) != 0 || ftruncate(seg_fd_, static_cast<off_t>(total)) != 0)
    return fail("cannot size shared-memory segment " + shm_name + ": " + strerror(errno));
  // Every page allocated now: a pool that does not fit fails here, not later with SIGBUS in
  // the daemon or in a client writing a granted lease.
  if (int err = posix_fallocate(seg_fd_, 0, static_cast<off_t>(total)); err != 0)
    return fail("cannot allocate a pool of " + std::to_string(total) + " bytes in " + opt_.shm_dir + ": " +
                strerror(err));
  void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, seg_fd_, 0);
  if (p == MAP_FAILED)
    return fail(std::string("cannot map a pool of ") + std::to_string(total) + " bytes: " + strerror(errno));
  base_ = p;
  total_ = total;
  table_ = LeaseTable::format(p, total, opt_.max_leases, static_cast<uint32_t>(getpid()));
  if (!table_) return fail("pool too small for its lease table");
  // Fault the pool in behind the service: clients can register and lease meanwhile (a
  // page they touch first is faulted then), and nobody waits seconds for a large pool.
  if (opt_.prefault) {
    unsigned char* data = table_->data();
    uint64_t bytes = table_->data_bytes();
    prefault_ = std::thread([data, bytes] {
      const auto from = std::chrono::steady_clock::now();
      prefault(data, bytes);
      const auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - from).count();
      // Said, as clients pin a faulted-in pool about 4x faster (docs/results.md, offloadd).
      log().info("pool faulted in: {:.1f} GiB in {:.0f} ms", static_cast<double>(bytes) / (1ull << 30), ms);
    });
  }
  return true;
}

void Service::adopt_leases() {
  PoolHeader& h = table_->header();
  ++h.generation;
  h.owner_pid = static_cast<uint32_t>(getpid());
  // Leases of live processes stay (their data may be in use); the rest is freed.
  for (const LeaseSlot& l : table_->leases()) {
    Client& c = clients_[l.client_id];
    c.id = l.client_id;
    c.pid = l.pid;
    c.pid_start = l.pid_start;
    next_id_ = std::max(next_id_, l.client_id + 1);
  }
  for (auto it = clients_.begin(); it != clients_.end();) {
    const Liveness l = liveness(it->second.pid, it->second.pid_start);
    if (l == Liveness::Unknown)  // it may still use its bytes: they stay (nothing lost)
      log().warn("client {} is in another pid namespace: its leases stay until it re-registers or offloadd "
                 "restarts with a fresh pool",
                 it->first);
    if (l == Liveness::Gone) {
      table_->release_all(it->first);
      it = clients_.erase(it);
    } else {
      ++it;
    }
  }
  log().info("adopted pool /{} ({} data bytes, generation {}): {} clients with live leases", opt_.segment,
             table_->data_bytes(), h.generation, clients_.size());
}

}  // namespace offload

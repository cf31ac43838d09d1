#include "common/ipc.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/files.h"
#include "common/hash.h"

namespace offload {

bool send_all(int fd, const void* p, size_t n, int stall_ms) {
  const auto* c = static_cast<const unsigned char*>(p);
  while (n) {
    ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pf{fd, POLLOUT, 0};
      if (::poll(&pf, 1, stall_ms) > 0) continue;
    }
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

std::string default_segment_name(const std::string& socket) {
  const uint64_t h = name_hash(socket.c_str());
  char tail[9];
  std::snprintf(tail, sizeof tail, "%08x", static_cast<uint32_t>(h ^ (h >> 32)));
  return "offload-pool-" + std::to_string(getuid()) + "-" + tail;
}

Paths paths_from_env(const std::function<const char*(const char*)>& get) {
  Paths p;
  const char* xdg = get("XDG_RUNTIME_DIR");
  p.dir = (xdg && *xdg) ? std::string(xdg) + "/liboffload" : "/tmp/liboffload-" + std::to_string(getuid());
  const char* sock = get("OFFLOAD_SOCKET");
  p.socket = (sock && *sock) ? sock : p.dir + "/offloadd.sock";
  p.segment = default_segment_name(p.socket);
  return p;
}

bool default_paths(Paths* out, std::string* why) {
  *out = paths_from_env([](const char* n) { return getenv(n); });
  if (!ensure_private_dir(out->dir, kNoGroupOrOther, why)) return false;
  const char* sock = getenv("OFFLOAD_SOCKET");
  if (sock && *sock && !check_private_dir(dir_of(sock), kNoGroupOrOtherWrite, why)) {
    *why = "OFFLOAD_SOCKET=" + std::string(sock) + ": " + *why;
    return false;
  }
  return true;
}

Connection::~Connection() { close(); }

Connection& Connection::operator=(Connection&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    seq_ = o.seq_;
    peer_minor_ = o.peer_minor_;
    reader_ = std::move(o.reader_);
    unsent_ = std::move(o.unsent_);
    o.fd_ = -1;
  }
  return *this;
}

void Connection::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  peer_minor_ = -1;
  reader_ = proto::FrameReader{};
  unsent_.clear();
}

bool Connection::connect(const std::string& path, std::string* why, uid_t peer_uid) {
  close();
  sockaddr_un addr{};
  if (path.size() >= sizeof addr.sun_path) {
    *why = "socket path too long: " + path;
    return false;
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *why = std::string("socket: ") + strerror(errno);
    return false;
  }
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    *why = "no offloadd at " + path + " (" + strerror(errno) + ")";
    ::close(fd);
    return false;
  }
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    *why = "cannot tell who listens on " + path + " (SO_PEERCRED: " + strerror(errno) + "): refusing it";
    ::close(fd);
    return false;
  }
  if (cred.uid != peer_uid) {
    *why = "the process listening on " + path + " runs as " + user_text(cred.uid) + ", not as " +
           user_text(peer_uid) + ": refusing it";
    ::close(fd);
    return false;
  }
  fd_ = fd;
  return true;
}

bool Connection::push_unsent() {
  size_t sent = 0;
  while (sent < unsent_.size()) {
    ssize_t w = ::send(fd_, unsent_.data() + sent, unsent_.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (w <= 0) return false;
    sent += static_cast<size_t>(w);
  }
  unsent_.erase(unsent_.begin(), unsent_.begin() + static_cast<std::ptrdiff_t>(sent));
  return true;
}

bool Connection::send_nowait(proto::MsgType type, const void* payload, uint32_t len) {
  if (fd_ < 0) return false;
  if (!push_unsent()) {
    close();
    return false;
  }
  if (!unsent_.empty()) return false;  // the socket is still full
  std::vector<unsigned char> buf = proto::encode_bytes(type, ++seq_, payload, len);
  ssize_t w;
  do w = ::send(fd_, buf.data(), buf.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  while (w < 0 && errno == EINTR);
  if (w == static_cast<ssize_t>(buf.size())) return true;
  if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
  if (w < 0) {
    close();
    return false;
  }
  // Part of it went: the rest goes before any other frame, without waiting here.
  unsent_.assign(buf.begin() + w, buf.end());
  return true;
}

bool Connection::call(proto::MsgType type, const void* payload, uint32_t len, proto::FrameHeader* rh,
                      std::vector<unsigned char>* reply, std::string* why, int timeout_ms) {
  if (fd_ < 0) {
    *why = "not connected to offloadd";
    return false;
  }
  uint64_t seq = ++seq_;
  std::vector<unsigned char> buf = proto::encode_bytes(type, seq, payload, len);
  // A frame begun by send_nowait is finished first.
  buf.insert(buf.begin(), unsent_.begin(), unsent_.end());
  unsent_.clear();
  if (!send_all(fd_, buf.data(), buf.size())) {
    *why = "offloadd closed the connection";
    close();
    return false;
  }
  for (;;) {
    while (reader_.next(rh, reply)) {
      bool to_connection = rh->seq == 0 && static_cast<proto::MsgType>(rh->type) == proto::MsgType::Error;
      if (rh->seq != seq && !to_connection) continue;  // a stale reply
      peer_minor_ = rh->minor;
      if (static_cast<proto::MsgType>(rh->type) == proto::MsgType::Error) {
        proto::Error e{};
        proto::read_payload(reply->data(), reply->size(), &e);
        *why = std::string("offloadd: ") + e.message;
        return false;
      }
      return true;
    }
    if (reader_.failed()) {
      *why = "malformed reply from offloadd: " + reader_.error();
      close();
      return false;
    }
    pollfd p{fd_, POLLIN, 0};
    int r = ::poll(&p, 1, timeout_ms);
    if (r == 0) {
      *why = "offloadd did not answer within " + std::to_string(timeout_ms) + " ms";
      return false;
    }
    if (r < 0 && errno == EINTR) continue;
    unsigned char tmp[4096];
    ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *why = "offloadd closed the connection";
      close();
      return false;
    }
    reader_.feed(tmp, static_cast<size_t>(n));
  }
}

template <class Reply, class Req>
std::optional<Reply> DaemonClient::request(proto::MsgType type, proto::MsgType want, const Req& req, std::string* why,
                                           int timeout_ms) {
  proto::FrameHeader h{};
  std::vector<unsigned char> payload;
  if (!conn_.call(type, &req, sizeof req, &h, &payload, why, timeout_ms)) return std::nullopt;
  Reply r{};
  if (static_cast<proto::MsgType>(h.type) != want || !proto::read_payload(payload.data(), payload.size(), &r)) {
    *why = "unexpected reply type " + std::to_string(h.type) + " from offloadd";
    return std::nullopt;
  }
  return r;
}

std::optional<proto::RegisterReply> DaemonClient::register_client(const proto::Register& r, std::string* why,
                                                                   int timeout_ms) {
  return request<proto::RegisterReply>(proto::MsgType::Register, proto::MsgType::RegisterReply, r, why, timeout_ms);
}

std::optional<proto::LeaseReply> DaemonClient::lease(uint64_t bytes, std::string* why) {
  return request<proto::LeaseReply>(proto::MsgType::Lease, proto::MsgType::LeaseReply, proto::Lease{bytes}, why);
}

std::optional<proto::ReleaseReply> DaemonClient::release(uint64_t offset, uint64_t bytes, std::string* why) {
  return request<proto::ReleaseReply>(proto::MsgType::Release, proto::MsgType::ReleaseReply,
                                      proto::Release{offset, bytes}, why);
}

template <class Query, class Head, class Entry>
bool DaemonClient::list_all(proto::MsgType type, proto::MsgType want, Head* head, std::vector<Entry>* entries,
                            std::string* why, bool* complete) {
  entries->clear();
  if (complete) *complete = true;
  Query q{};
  for (;;) {
    proto::FrameHeader h{};
    std::vector<unsigned char> payload;
    std::vector<Entry> page;
    if (!conn_.call(type, &q, sizeof q, &h, &payload, why)) return false;
    if (static_cast<proto::MsgType>(h.type) != want || !proto::read_list(payload.data(), payload.size(), head, &page)) {
      *why = std::string("malformed ") + (want == proto::MsgType::StatusReply ? "status" : "node") +
             " reply from offloadd";
      return false;
    }
    entries->insert(entries->end(), page.begin(), page.end());
    head->clients = static_cast<uint32_t>(entries->size());
    if (h.minor < proto::kMinorPages) {
      // An older daemon lists one page only: a full one may have been cut.
      if (complete) *complete = page.size() < proto::kMaxClients;
      return true;
    }
    // Ids only grow along the pages: anything else would never end.
    if (!(h.flags & proto::kFlagMoreClients) || page.empty() || page.back().client_id <= q.after_client) return true;
    q.after_client = page.back().client_id;
  }
}

bool DaemonClient::status(proto::StatusHead* head, std::vector<proto::ClientStatus>* clients, std::string* why,
                          bool* complete) {
  return list_all<proto::StatusQuery>(proto::MsgType::StatusQuery, proto::MsgType::StatusReply, head, clients, why,
                                      complete);
}

bool DaemonClient::peer_has(uint16_t minor, const char* what, std::string* why) const {
  int peer = conn_.peer_minor();
  if (peer < 0 || peer >= minor) return true;
  *why = "offloadd speaks protocol " + std::to_string(proto::kMajor) + "." + std::to_string(peer) + ", which has no " +
         what + " (it came with " + std::to_string(proto::kMajor) + "." + std::to_string(minor) +
         "); a newer offloadd knows it";
  return false;
}

std::optional<proto::AttachReply> DaemonClient::attach(const proto::Attach& a, std::string* why) {
  if (!peer_has(proto::kMinorNode, "Attach", why)) return std::nullopt;
  return request<proto::AttachReply>(proto::MsgType::Attach, proto::MsgType::AttachReply, a, why);
}

bool DaemonClient::node(proto::NodeHead* head, std::vector<proto::ClientNode>* clients, std::string* why,
                        bool* complete) {
  if (!peer_has(proto::kMinorNode, "NodeQuery", why)) return false;
  return list_all<proto::NodeQuery>(proto::MsgType::NodeQuery, proto::MsgType::NodeReply, head, clients, why,
                                    complete);
}

bool DaemonClient::shutdown(std::string* why) {
  return request<proto::ReleaseReply>(proto::MsgType::Shutdown, proto::MsgType::ReleaseReply, proto::Shutdown{}, why)
      .has_value();
}

SharedPoolMapping::~SharedPoolMapping() {
  if (addr_) munmap(addr_, size_);
}

void SharedPoolMapping::unmap_in_child() {
  if (addr_) munmap(addr_, size_);
  addr_ = nullptr;
  size_ = 0;
}

bool SharedPoolMapping::open(const std::string& name, std::string* why) {
  std::string path = "/" + name;
  int fd = shm_open(path.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    *why = "cannot open the pool segment " + path + ": " + strerror(errno);
    return false;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    *why = "cannot stat the pool segment " + path + ": " + strerror(errno);
    ::close(fd);
    return false;
  }
  if (!check_owner_and_mode(st, "the pool segment " + path, kNoGroupOrOther, why)) {
    ::close(fd);
    return false;
  }
  void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    *why = std::string("cannot map the pool segment: ") + strerror(errno);
    return false;
  }
  addr_ = p;
  size_ = static_cast<uint64_t>(st.st_size);
  auto table = LeaseTable::open(addr_, size_, why);
  if (!table) {
    munmap(addr_, size_);
    addr_ = nullptr;
    return false;
  }
  data_offset_ = static_cast<uint64_t>(table->data() - base());
  data_bytes_ = table->data_bytes();
  return true;
}

}  // namespace offload

// The client side of the daemon protocol (protocol/offload/protocol.h): where the socket
// lives, a blocking request/reply connection, and the shared pool's mapping.
//
// Used by the shim's worker thread (never by a hook), by offloadctl, and by tests.
// Errors come back as a Result with a message for a person; nothing throws.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "offload/pool_layout.h"
#include "offload/protocol.h"

namespace offload {

// $XDG_RUNTIME_DIR/liboffload if XDG_RUNTIME_DIR is set, else /tmp/liboffload-<uid>; made
// 0700 if missing. Refuses a directory that another user owns or that others may enter.
// OFFLOAD_SOCKET overrides the socket path; its directory must be this user's, writable by
// nobody else (else another user could put a socket of theirs at that name first).
struct Paths {
  std::string dir, socket, segment;
};
bool default_paths(Paths* out, std::string* why);
// The same paths, read through `get` (getenv in production), without making or checking the
// directory: for reporting where they are (offloadctl doctor), never for using them.
Paths paths_from_env(const std::function<const char*(const char*)>& get);

// The POSIX shared-memory name of the pool of the daemon serving `socket`: one per user and
// socket ("offload-pool-<uid>-<hash of the socket path>"). A daemon restarted on the same
// socket adopts its predecessor's segment; daemons on two sockets never share one.
std::string default_segment_name(const std::string& socket);

// Sends all `n` bytes on a stream socket, retrying on EINTR and, for a non-blocking one,
// waiting up to `stall_ms` for room each time it is full. False if the peer is gone.
bool send_all(int fd, const void* p, size_t n, int stall_ms = 1000);

class Connection {
 public:
  Connection() = default;
  ~Connection();
  Connection(Connection&& o) noexcept
      : fd_(o.fd_), seq_(o.seq_), peer_minor_(o.peer_minor_), reader_(std::move(o.reader_)),
        unsent_(std::move(o.unsent_)) {
    o.fd_ = -1;
  }
  Connection& operator=(Connection&& o) noexcept;

  // Connects to the daemon's socket; false with *why if nobody listens there, or if the
  // process listening runs as another uid than `peer_uid` (SO_PEERCRED): another user's
  // daemon could direct our copies anywhere in our memory.
  bool connect(const std::string& socket_path, std::string* why, uid_t peer_uid = getuid());
  bool connected() const { return fd_ >= 0; }
  void close();
  int fd() const { return fd_; }

  // Sends one request and waits (up to timeout_ms) for the reply with the same sequence.
  // The reply's header and payload are returned; false with *why on a broken connection, a
  // timeout, a malformed reply, or an Error frame (its message in *why; an Error of
  // sequence 0 is the daemon's word on the connection itself, a refusal, and ends the wait).
  // The stream stays whole across a timeout: a late reply's bytes are read and skipped by
  // the next call, and a request is never left half sent (the connection closes instead).
  bool call(proto::MsgType type, const void* payload, uint32_t len, proto::FrameHeader* reply_header,
            std::vector<unsigned char>* reply, std::string* why, int timeout_ms = 5000);
  // Sends one frame without waiting for a reply (telemetry), never blocking. A frame the
  // socket takes only in part is finished before the next frame (kept in unsent_), so the
  // stream never carries half a frame; false, with nothing sent, while one is pending or
  // the socket is full.
  bool send_nowait(proto::MsgType type, const void* payload, uint32_t len);

  // The protocol minor of the peer, from the last reply on this connection (an Error
  // included); -1 before the first reply.
  int peer_minor() const { return peer_minor_; }

 private:
  int fd_ = -1;
  uint64_t seq_ = 0;
  int peer_minor_ = -1;
  proto::FrameReader reader_;
  std::vector<unsigned char> unsent_;  // the tail of a frame send_nowait began
  // Sends unsent_ without blocking; false if the peer is gone.
  bool push_unsent();
};

// Typed requests.
class DaemonClient {
 public:
  bool connect(const std::string& socket_path, std::string* why, uid_t peer_uid = getuid()) {
    return conn_.connect(socket_path, why, peer_uid);
  }
  bool connected() const { return conn_.connected(); }
  Connection& connection() { return conn_; }

  // timeout_ms: a daemon just started answers only once its pool is made (DaemonLink waits longer).
  std::optional<proto::RegisterReply> register_client(const proto::Register& r, std::string* why,
                                                      int timeout_ms = 5000);
  std::optional<proto::LeaseReply> lease(uint64_t bytes, std::string* why);
  std::optional<proto::ReleaseReply> release(uint64_t offset, uint64_t bytes, std::string* why);
  bool telemetry(const proto::Telemetry& t) { return conn_.send_nowait(proto::MsgType::Telemetry, &t, sizeof t); }
  // Every client, page by page (protocol minor 2); head->clients is then their number. From
  // an older daemon, which lists at most kMaxClients, *complete (optional) is false when its
  // one page was full: clients may be missing.
  bool status(proto::StatusHead* head, std::vector<proto::ClientStatus>* clients, std::string* why,
              bool* complete = nullptr);
  bool shutdown(std::string* why);
  // Protocol minor 1. Both refuse, without sending, when the daemon's replies say it speaks
  // an older minor (it would take the frame for garbage and close the connection); the
  // connection stays usable then, and after an Error reply too.
  std::optional<proto::AttachReply> attach(const proto::Attach& a, std::string* why);
  // Paged as status().
  bool node(proto::NodeHead* head, std::vector<proto::ClientNode>* clients, std::string* why,
            bool* complete = nullptr);

 private:
  template <class Reply, class Req>
  std::optional<Reply> request(proto::MsgType type, proto::MsgType want, const Req& req, std::string* why,
                               int timeout_ms = 5000);
  // All the pages of a StatusQuery or NodeQuery; false with *why.
  template <class Query, class Head, class Entry>
  bool list_all(proto::MsgType type, proto::MsgType want, Head* head, std::vector<Entry>* entries, std::string* why,
                bool* complete);
  // False with *why when the peer is known to speak a minor older than `minor`.
  bool peer_has(uint16_t minor, const char* what, std::string* why) const;
  Connection conn_;
};

// A mapping of the user's pool segment.
class SharedPoolMapping {
 public:
  SharedPoolMapping() = default;
  ~SharedPoolMapping();
  SharedPoolMapping(const SharedPoolMapping&) = delete;
  SharedPoolMapping& operator=(const SharedPoolMapping&) = delete;

  // Maps an existing segment read-write and checks its header. The data area's place and size
  // are copied then: the header is shared memory, and is not trusted again.
  bool open(const std::string& name, std::string* why);
  // Unmaps without locking (a fork handler's child). The object is empty afterwards.
  void unmap_in_child();
  unsigned char* base() const { return static_cast<unsigned char*>(addr_); }
  uint64_t size() const { return size_; }
  unsigned char* data() const { return addr_ ? base() + data_offset_ : nullptr; }
  uint64_t data_bytes() const { return addr_ ? data_bytes_ : 0; }
  // [offset, offset + bytes) of the data area lies inside the mapping (and is not empty).
  bool holds(uint64_t offset, uint64_t bytes) const {
    return addr_ && bytes && offset <= data_bytes_ && bytes <= data_bytes_ - offset;
  }

 private:
  void* addr_ = nullptr;
  uint64_t size_ = 0;
  uint64_t data_offset_ = 0, data_bytes_ = 0;
};

}  // namespace offload

// offloadd's service: the node's shared pinned host pool and the clients that lease it.
//
// One thread runs everything: a poll() loop over the listening socket, the clients'
// connections, the metrics port and its connections. Nothing in it blocks on a peer: every
// socket is non-blocking, replies wait in a per-connection output buffer (a peer whose
// buffer passes ServiceOptions::max_output_bytes is dropped), and a metrics connection has
// a deadline. The pool's lease table lives in the shared segment
// itself, so it survives the daemon: a restarted daemon re-adopts the segment, keeps the
// leases of processes that are still alive (they may be using the bytes) and frees those of
// processes that are gone.
//
// Arbitration: every active client can always reach its fair share, the pool divided by
// the number of active clients. A client may lease past its share only while the free
// space left still covers what the others lack of theirs. It may never lease past its own
// limit (Register.host_limit). A refusal is an answer, not an error: the shim keeps that
// data resident.
//
// The node: every GPU of the node shares its host link, and every shim attaches (Attach,
// protocol minor 1) with its GPU's node-unique id, its rank and its job's local world size.
// The daemon counts the GPUs that share the link from the live attached clients (distinct
// gpu ids, and at least the largest local world: the ranks of one job attach at slightly
// different times) on every question, so a client that comes or goes counts at once. A
// client without a gpu id counts as a GPU of its own. The link's figures are the operator's
// (--node-link): measured with all GPUs copying at once.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "offload/pool_layout.h"
#include "offload/protocol.h"
#include "offloadd/resources.h"

namespace offload {

struct ServiceOptions {
  std::string socket_path;
  std::string segment;       // POSIX shared-memory name, without the leading '/'
  uint64_t pool_bytes = 0;   // data bytes of a new pool (an adopted one keeps its size)
  uint32_t max_leases = 4096;
  int metrics_port = -1;     // -1: no metrics endpoint
  mode_t socket_mode = 0600;
  bool prefault = true;
  proto::NodeLink node_link{};  // the node's aggregate host link; zeros: not measured
  // Replies a connection has not read yet, at most; past it the connection is dropped.
  size_t max_output_bytes = 4u << 20;
  int metrics_deadline_ms = 2000;  // a metrics connection's whole life, request to answer
  std::string shm_dir = "/dev/shm";  // where POSIX shared memory lives, for the size check
};

class Service {
 public:
  // Binds the socket and the metrics port, then creates the pool (or re-adopts an existing
  // one); nullptr with *why. A new pool is checked against the free shared memory and
  // MemAvailable, and allocated in full before anything is served.
  static std::unique_ptr<Service> create(const ServiceOptions& o, std::string* why);
  ~Service();

  // Serves until a Shutdown request or stop(). Returns the exit status.
  int run();
  // Safe from a signal handler.
  void stop();

  uint16_t metrics_port() const { return metrics_port_; }
  std::string metrics_text() const;
  // GPUs of the node that share the host link, as AttachReply and NodeReply report them.
  uint32_t node_gpus() const;

 private:
  struct Client {
    int fd = -1;  // -1: disconnected (adopted after a restart, or its process is gone)
    uint32_t id = 0;
    uint32_t pid = 0;
    uint32_t pid_start = 0;  // with pid, names the process across restarts (process_start)
    int32_t gpu = -1;
    uint64_t host_limit = 0;
    std::string command;
    proto::Telemetry last{};
    // From its last Attach (protocol minor 1); attached is false until one came.
    bool attached = false;
    int32_t rank = -1, local_rank = -1, local_world = 0;
    uint64_t device_budget = 0;
    std::string gpu_id;
  };
  struct Conn {
    proto::FrameReader reader;
    uint32_t pid = 0;        // from SO_PEERCRED
    uint32_t pid_start = 0;  // its start time's low bits (process_start)
    uint32_t client_id = 0;  // 0 until it registers
    OutBuffer out;           // replies the socket has not taken yet
    bool closing = false;    // gone or over its output cap: dropped once its input is handled
  };
  struct MetricsConn {
    int64_t deadline_ms = 0;
    std::string request;  // read so far
    bool answered = false;
    OutBuffer out;
  };

  Service() = default;
  // create's steps, in this order; false with *why. lock_socket: one daemon per socket.
  // open_segment: the segment a previous daemon left, adopted (*adopted) if there is one;
  // make_segment: else a new one; adopt_leases: an adopted segment's leases of processes
  // still alive kept, the others freed.
  bool lock_socket(std::string* why);
  bool bind_endpoints(std::string* why);
  bool open_segment(const std::string& shm_name, bool* adopted, std::string* why);
  bool make_segment(const std::string& shm_name, std::string* why);
  void adopt_leases();
  void accept_client();
  void accept_metrics();
  // accept4 failed with EMFILE/ENFILE: accepts one waiting peer on the spare descriptor and
  // closes it with an answer. False when none was waiting.
  bool refuse_for_descriptors(int listen_fd, bool framed);
  void on_metrics(int fd, short revents);
  void expire_metrics(int64_t now);
  int poll_timeout_ms(int64_t now) const;
  void on_readable(int fd);
  void on_writable(int fd);
  void handle(int fd, Conn& conn, const proto::FrameHeader& h, const std::vector<unsigned char>& payload);
  void send(int fd, const std::vector<unsigned char>& frame);
  void send_error(int fd, uint64_t seq, proto::Status st, const std::string& msg);
  void drop(int fd);
  void reap_dead();
  uint64_t fair_share() const;
  proto::Status admit(const Client& c, uint64_t bytes) const;
  // One page of clients: those whose id is above after_client (protocol minor 2).
  std::vector<unsigned char> status_frame(uint64_t seq, uint32_t after_client) const;
  std::vector<unsigned char> node_frame(uint64_t seq, uint32_t after_client) const;
  void on_attach(int fd, Client& c, const proto::FrameHeader& h, const std::vector<unsigned char>& payload);
  void note_node_change();

  ServiceOptions opt_;
  void* base_ = nullptr;
  uint64_t total_ = 0;
  std::optional<LeaseTable> table_;
  int lock_fd_ = -1;  // flock: one daemon per socket
  int seg_fd_ = -1;   // the segment, flock'ed: one daemon per segment
  int listen_fd_ = -1, metrics_fd_ = -1;
  bool owns_socket_ = false;
  uint16_t metrics_port_ = 0;
  int wake_[2] = {-1, -1};
  volatile bool stopping_ = false;
  uint32_t next_id_ = 1;
  std::map<int, Conn> conns_;            // open connections (clients and offloadctl)
  std::map<uint32_t, Client> clients_;   // registered or adopted clients, by id
  std::map<int, MetricsConn> metrics_conns_;
  SpareFd spare_fd_;
  uint64_t fd_refusals_ = 0;       // peers refused for want of descriptors since the last warning
  int64_t fd_warned_ms_ = -1'000'000;
  int64_t last_reap_ms_ = 0;
  uint32_t logged_gpus_ = 0;  // the GPU count last logged
  std::thread prefault_;
};

}  // namespace offload

// The wire protocol between liboffload.so, offloadd and offloadctl: one header of
// versioned frames over a Unix stream socket.
//
// Every frame is a FrameHeader followed by `length` payload bytes. Payloads are fixed-width
// POD structs (static_asserts below pin their sizes); StatusReply is a StatusHead followed
// by `clients` ClientStatus entries, NodeReply a NodeHead followed by `clients` ClientNode
// entries (at most kMaxClients of either). A receiver:
//   - reads exactly sizeof(FrameHeader) bytes and calls check_header(), which rejects a bad
//     magic, another major version (with a message naming both versions), an unknown type,
//     and a length that is not the exact size of that type's payload;
//   - only then reads `length` payload bytes and takes them with read_payload(), which
//     checks the size again and NUL-terminates every string field.
// A minor version adds message types and changes no existing payload; a receiver accepts
// any minor of its major. A receiver of an older minor takes a newer type for an unknown
// one: offloadd answers it with an Error and closes the connection (and a closed client
// connection gives that client's leases back). So a sender checks the peer's minor, which
// every reply header carries, before it sends a type the peer may not know.
//
// Minor 1 (node sharing): Attach/AttachReply (a shim says which GPU, rank and local rank
// it is; the daemon answers how many GPUs share the node's host link) and
// NodeQuery/NodeReply (what offloadctl shows about the node).
//
// Minor 2 (pages): a StatusQuery or NodeQuery names the client id to list after
// (after_client, 0 for the first page; the field was reserved, and zero, before), and a
// reply that could not hold every client sets kFlagMoreClients in its header's flags: ask
// again after the last id it listed. A daemon of an older minor lists the first
// kMaxClients and never sets the flag, so a full page from it may be cut.
//
// Header-only; no allocation in decoding; safe on untrusted bytes (fuzzed: tests/fuzz/).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace offload::proto {

inline constexpr uint32_t kMagic = 0x4C46464F;  // "OFFL" little-endian
inline constexpr uint16_t kMajor = 1;
inline constexpr uint16_t kMinor = 2;
inline constexpr uint16_t kMinorNode = 1;       // the first minor with Attach and NodeQuery
inline constexpr uint16_t kMinorPages = 2;      // the first minor that pages status and node replies
inline constexpr uint16_t kFlagMoreClients = 1; // FrameHeader.flags of a reply: more clients follow
inline constexpr uint32_t kMaxClients = 256;     // status entries in one reply

enum class MsgType : uint16_t {
  Register = 1,
  RegisterReply = 2,
  Lease = 3,
  LeaseReply = 4,
  Release = 5,
  ReleaseReply = 6,
  // 7, 8: reserved, once PlanRequest/PlanReply (the planner runs in the shim and in
  // offloadctl, never in the daemon); no later type may reuse them.
  Telemetry = 9,
  StatusQuery = 10,
  StatusReply = 11,
  Shutdown = 12,
  Error = 13,
  // Minor 1.
  Attach = 14,
  AttachReply = 15,
  NodeQuery = 16,
  NodeReply = 17,
};

enum class Status : uint32_t {
  Ok = 0,
  PoolFull = 1,       // the node-wide pool has no room: keep the data resident
  OverLimit = 2,      // past this client's fair share while others may need theirs
  BadRequest = 3,
  NotRegistered = 4,
  UnknownLease = 5,
  Refused = 6,        // another user, or shutting down
};

const char* status_name(Status s);

struct FrameHeader {
  uint32_t magic;
  uint16_t major;
  uint16_t minor;
  uint16_t type;
  uint16_t flags;
  uint32_t length;  // payload bytes that follow
  uint64_t seq;     // request sequence; a reply echoes it
};

struct Register {
  uint32_t pid;
  int32_t gpu;
  uint64_t device_budget;  // bytes; 0 = none given
  uint64_t host_limit;     // most pool bytes this client wants; 0 = no own limit
  uint32_t prior_client;   // reconnecting after a daemon restart: the id it had; else 0
  uint32_t reserved;
  char command[64];
};

struct RegisterReply {
  uint32_t status;
  uint32_t client_id;
  uint64_t pool_bytes;
  uint64_t fair_share;     // bytes this client can always reach
  char segment[64];        // shared-memory object name to map
};

struct Lease {
  uint64_t bytes;
};

struct LeaseReply {
  uint32_t status;
  uint32_t reserved;
  uint64_t offset;  // from the start of the pool's data area
  uint64_t bytes;
};

struct Release {
  uint64_t offset;
  uint64_t bytes;
};

struct ReleaseReply {
  uint32_t status;
  uint32_t reserved;
};

struct Telemetry {
  uint64_t step;
  uint64_t step_ns;
  uint64_t exposed_stall_ns;
  uint64_t misses;
  uint64_t resident_bytes;
  uint64_t evicted_bytes;
  uint64_t launches;
};

struct StatusQuery {
  uint32_t flags;
  uint32_t after_client;  // minor 2: list the clients whose id is above this
};

struct StatusHead {
  uint64_t pool_bytes;
  uint64_t used_bytes;
  uint64_t free_bytes;
  uint32_t daemon_pid;
  uint32_t clients;  // ClientStatus entries that follow
};

struct ClientStatus {
  uint32_t pid;
  int32_t gpu;
  uint32_t client_id;
  uint32_t connected;  // 0: its process is gone or has not reconnected since a restart
  uint64_t leased_bytes;
  uint64_t fair_share;
  Telemetry last;
  char command[64];
};

struct Shutdown {
  uint32_t flags;
  uint32_t reserved;
};

struct Error {
  uint32_t status;
  uint32_t reserved;
  char message[120];
};

// Minor 1: sent by a shim once it knows its GPU (after Register; again after a reconnect).
// A second Attach from the same client replaces what the first said.
struct Attach {
  int32_t gpu;            // device ordinal in the process; -1 unknown
  int32_t rank;           // RANK; -1 unset
  int32_t local_rank;     // LOCAL_RANK; -1 unset
  int32_t local_world;    // LOCAL_WORLD_SIZE: processes of this job on the node; 0 unset
  uint64_t device_budget; // bytes; 0 = none
  char gpu_id[32];        // node-unique id of the GPU (PCI bus id, "0000:1b:00.0"); "" unknown
};

// The node's host link, all its GPUs copying at once: bytes/s summed over them; 0 = not
// measured (offloadd --node-link).
struct NodeLink {
  uint64_t h2d_bps;
  uint64_t d2h_bps;
  uint64_t both_bps;  // both directions at once, the two summed
};

struct AttachReply {
  uint32_t status;
  // GPUs of the node that share the host link, as the daemon counts them: distinct gpu_id
  // among the live attached clients, and at least the largest local_world one of them said.
  uint32_t gpus;
  uint64_t fair_share;  // of the pool, as in RegisterReply
  NodeLink link;
};

struct NodeQuery {
  uint32_t flags;
  uint32_t after_client;  // minor 2: as in StatusQuery
};

struct NodeHead {
  uint32_t gpus;     // as in AttachReply; 0 while no client is attached
  uint32_t clients;  // ClientNode entries that follow
  NodeLink link;
};

struct ClientNode {
  uint32_t client_id;
  uint32_t pid;
  int32_t gpu;
  int32_t rank;         // -1: none (or the client has not attached)
  int32_t local_rank;   // -1: none
  int32_t local_world;  // 0: none
  uint64_t device_budget;
  char gpu_id[32];
};

// Largest local_world an Attach may carry (a larger one is a bad request).
inline constexpr int32_t kMaxLocalWorld = 1024;

static_assert(sizeof(FrameHeader) == 24);
static_assert(sizeof(Register) == 96);
static_assert(sizeof(RegisterReply) == 88);
static_assert(sizeof(Lease) == 8);
static_assert(sizeof(LeaseReply) == 24);
static_assert(sizeof(Release) == 16);
static_assert(sizeof(ReleaseReply) == 8);
static_assert(sizeof(Telemetry) == 56);
static_assert(sizeof(StatusQuery) == 8);
static_assert(sizeof(StatusHead) == 32);
static_assert(sizeof(ClientStatus) == 32 + 56 + 64);
static_assert(sizeof(Shutdown) == 8);
static_assert(sizeof(Error) == 128);
static_assert(sizeof(Attach) == 56);
static_assert(sizeof(NodeLink) == 24);
static_assert(sizeof(AttachReply) == 40);
static_assert(sizeof(NodeQuery) == 8);
static_assert(sizeof(NodeHead) == 32);
static_assert(sizeof(ClientNode) == 64);

template <class T>
inline constexpr bool kPod = std::is_trivially_copyable_v<T> && std::is_standard_layout_v<T>;
static_assert(kPod<FrameHeader> && kPod<Register> && kPod<ClientStatus> && kPod<Error>);
static_assert(kPod<Attach> && kPod<AttachReply> && kPod<NodeQuery> && kPod<NodeHead> && kPod<ClientNode>);

// The payload type of each message, for encode/decode.
template <MsgType> struct PayloadOf;
template <> struct PayloadOf<MsgType::Register> { using type = Register; };
template <> struct PayloadOf<MsgType::RegisterReply> { using type = RegisterReply; };
template <> struct PayloadOf<MsgType::Lease> { using type = Lease; };
template <> struct PayloadOf<MsgType::LeaseReply> { using type = LeaseReply; };
template <> struct PayloadOf<MsgType::Release> { using type = Release; };
template <> struct PayloadOf<MsgType::ReleaseReply> { using type = ReleaseReply; };
template <> struct PayloadOf<MsgType::Telemetry> { using type = Telemetry; };
template <> struct PayloadOf<MsgType::StatusQuery> { using type = StatusQuery; };
template <> struct PayloadOf<MsgType::Shutdown> { using type = Shutdown; };
template <> struct PayloadOf<MsgType::Error> { using type = Error; };
template <> struct PayloadOf<MsgType::Attach> { using type = Attach; };
template <> struct PayloadOf<MsgType::AttachReply> { using type = AttachReply; };
template <> struct PayloadOf<MsgType::NodeQuery> { using type = NodeQuery; };

enum class HeaderError {
  None,
  BadMagic,
  OtherMajor,
  UnknownType,
  BadLength,
};

// Fixed payload size of a type; 0 for StatusReply and NodeReply (variable) and unknown types.
inline size_t payload_size(uint16_t type) {
  switch (static_cast<MsgType>(type)) {
    case MsgType::Register: return sizeof(Register);
    case MsgType::RegisterReply: return sizeof(RegisterReply);
    case MsgType::Lease: return sizeof(Lease);
    case MsgType::LeaseReply: return sizeof(LeaseReply);
    case MsgType::Release: return sizeof(Release);
    case MsgType::ReleaseReply: return sizeof(ReleaseReply);
    case MsgType::Telemetry: return sizeof(Telemetry);
    case MsgType::StatusQuery: return sizeof(StatusQuery);
    case MsgType::Shutdown: return sizeof(Shutdown);
    case MsgType::Error: return sizeof(Error);
    case MsgType::Attach: return sizeof(Attach);
    case MsgType::AttachReply: return sizeof(AttachReply);
    case MsgType::NodeQuery: return sizeof(NodeQuery);
    default: return 0;
  }
}

// The reserved numbers (7, 8) are unknown: a frame of either is refused as any unknown type.
inline bool known_type(uint16_t type) {
  return type >= static_cast<uint16_t>(MsgType::Register) && type <= static_cast<uint16_t>(MsgType::NodeReply) &&
         type != 7 && type != 8;
}

// A variable payload's length: a head and at most kMaxClients whole entries.
template <class Head, class Entry>
inline bool list_length_ok(uint32_t length) {
  return length >= sizeof(Head) && (length - sizeof(Head)) % sizeof(Entry) == 0 &&
         (length - sizeof(Head)) / sizeof(Entry) <= kMaxClients;
}

// Validates a header read off the wire. `why` (optional) gets a message for a person.
inline HeaderError check_header(const FrameHeader& h, std::string* why = nullptr) {
  auto fail = [&](HeaderError e, std::string m) {
    if (why) *why = std::move(m);
    return e;
  };
  if (h.magic != kMagic) return fail(HeaderError::BadMagic, "not a liboffload frame (bad magic)");
  if (h.major != kMajor)
    return fail(HeaderError::OtherMajor, "protocol version " + std::to_string(h.major) + "." +
                                             std::to_string(h.minor) + " is not supported (this side speaks " +
                                             std::to_string(kMajor) + ".x)");
  if (!known_type(h.type)) return fail(HeaderError::UnknownType, "unknown message type " + std::to_string(h.type));
  if (static_cast<MsgType>(h.type) == MsgType::StatusReply) {
    if (!list_length_ok<StatusHead, ClientStatus>(h.length))
      return fail(HeaderError::BadLength, "malformed status reply length " + std::to_string(h.length));
    return HeaderError::None;
  }
  if (static_cast<MsgType>(h.type) == MsgType::NodeReply) {
    if (!list_length_ok<NodeHead, ClientNode>(h.length))
      return fail(HeaderError::BadLength, "malformed node reply length " + std::to_string(h.length));
    return HeaderError::None;
  }
  if (h.length != payload_size(h.type))
    return fail(HeaderError::BadLength, "message type " + std::to_string(h.type) + " with length " +
                                            std::to_string(h.length) + ", expected " +
                                            std::to_string(payload_size(h.type)));
  return HeaderError::None;
}

inline void terminate_strings(Register& r) { r.command[sizeof r.command - 1] = 0; }
inline void terminate_strings(RegisterReply& r) { r.segment[sizeof r.segment - 1] = 0; }
inline void terminate_strings(Error& e) { e.message[sizeof e.message - 1] = 0; }
inline void terminate_strings(ClientStatus& c) { c.command[sizeof c.command - 1] = 0; }
inline void terminate_strings(Attach& a) { a.gpu_id[sizeof a.gpu_id - 1] = 0; }
inline void terminate_strings(ClientNode& c) { c.gpu_id[sizeof c.gpu_id - 1] = 0; }
template <class T>
inline void terminate_strings(T&) {}

// Copies a checked payload into `out`; false if the size is not sizeof(T).
template <class T>
inline bool read_payload(const void* data, size_t len, T* out) {
  static_assert(kPod<T>);
  if (len != sizeof(T)) return false;
  std::memcpy(out, data, sizeof(T));
  terminate_strings(*out);
  return true;
}

// A variable payload (a Head whose `clients` counts the Entry records that follow); false
// if the sizes do not add up.
template <class Head, class Entry>
inline bool read_list(const void* data, size_t len, Head* head, std::vector<Entry>* entries) {
  static_assert(kPod<Head> && kPod<Entry>);
  if (len < sizeof(Head)) return false;
  std::memcpy(head, data, sizeof(Head));
  if (head->clients > kMaxClients || len != sizeof(Head) + size_t{head->clients} * sizeof(Entry)) return false;
  entries->resize(head->clients);
  const auto* p = static_cast<const unsigned char*>(data) + sizeof(Head);
  for (uint32_t i = 0; i < head->clients; ++i) {
    std::memcpy(&(*entries)[i], p + i * sizeof(Entry), sizeof(Entry));
    terminate_strings((*entries)[i]);
  }
  return true;
}

// A status reply: the head and its entries; false if the sizes do not add up.
inline bool read_status(const void* data, size_t len, StatusHead* head, std::vector<ClientStatus>* clients) {
  return read_list(data, len, head, clients);
}

// A node reply: the head and its entries; false if the sizes do not add up.
inline bool read_node(const void* data, size_t len, NodeHead* head, std::vector<ClientNode>* clients) {
  return read_list(data, len, head, clients);
}

inline FrameHeader make_header(MsgType type, uint32_t length, uint64_t seq) {
  return FrameHeader{kMagic, kMajor, kMinor, static_cast<uint16_t>(type), 0, length, seq};
}

// One frame as bytes: header and `len` payload bytes.
inline std::vector<unsigned char> encode_bytes(MsgType type, uint64_t seq, const void* payload, uint32_t len) {
  std::vector<unsigned char> out(sizeof(FrameHeader) + len);
  FrameHeader h = make_header(type, len, seq);
  std::memcpy(out.data(), &h, sizeof h);
  if (len) std::memcpy(out.data() + sizeof h, payload, len);
  return out;
}

template <class T>
inline std::vector<unsigned char> encode(MsgType type, uint64_t seq, const T& payload) {
  static_assert(kPod<T>);
  return encode_bytes(type, seq, &payload, sizeof(T));
}

// A variable payload's frame: the head, its count set to the entries sent (the first
// kMaxClients of them).
template <class Head, class Entry>
inline std::vector<unsigned char> encode_list(MsgType type, uint64_t seq, const Head& head,
                                              const std::vector<Entry>& entries, uint16_t flags = 0) {
  static_assert(kPod<Head> && kPod<Entry>);
  const size_t n = std::min<size_t>(entries.size(), kMaxClients);
  Head h2 = head;
  h2.clients = static_cast<uint32_t>(n);
  uint32_t len = static_cast<uint32_t>(sizeof(Head) + n * sizeof(Entry));
  std::vector<unsigned char> out(sizeof(FrameHeader) + len);
  FrameHeader h = make_header(type, len, seq);
  h.flags = flags;
  std::memcpy(out.data(), &h, sizeof h);
  std::memcpy(out.data() + sizeof h, &h2, sizeof h2);
  if (n) std::memcpy(out.data() + sizeof h + sizeof h2, entries.data(), n * sizeof(Entry));
  return out;
}

inline std::vector<unsigned char> encode_status(uint64_t seq, const StatusHead& head,
                                                const std::vector<ClientStatus>& clients, uint16_t flags = 0) {
  return encode_list(MsgType::StatusReply, seq, head, clients, flags);
}

inline std::vector<unsigned char> encode_node(uint64_t seq, const NodeHead& head,
                                              const std::vector<ClientNode>& clients, uint16_t flags = 0) {
  return encode_list(MsgType::NodeReply, seq, head, clients, flags);
}

inline const char* status_name(Status s) {
  switch (s) {
    case Status::Ok: return "ok";
    case Status::PoolFull: return "pool full";
    case Status::OverLimit: return "over this client's share";
    case Status::BadRequest: return "bad request";
    case Status::NotRegistered: return "not registered";
    case Status::UnknownLease: return "unknown lease";
    case Status::Refused: return "refused";
  }
  return "unknown status";
}

// Incremental reader for a byte stream: feed() what recv() returned, then next() yields
// whole frames. A frame that fails check_header() poisons the stream (the peer is broken
// or hostile: the caller closes the connection after reporting error()).
class FrameReader {
 public:
  void feed(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    buf_.insert(buf_.end(), p, p + n);
  }
  // True with a frame in `h`/`payload` (valid until the next call); false when more bytes
  // are needed or the stream is broken (then failed() is true).
  bool next(FrameHeader* h, std::vector<unsigned char>* payload) {
    if (failed_ || buf_.size() - pos_ < sizeof(FrameHeader)) return compact(), false;
    std::memcpy(h, buf_.data() + pos_, sizeof *h);
    if (check_header(*h, &error_) != HeaderError::None) {
      failed_ = true;
      return false;
    }
    if (buf_.size() - pos_ < sizeof(FrameHeader) + h->length) return compact(), false;
    const unsigned char* p = buf_.data() + pos_ + sizeof(FrameHeader);
    payload->assign(p, p + h->length);
    pos_ += sizeof(FrameHeader) + h->length;
    return true;
  }
  bool failed() const { return failed_; }
  const std::string& error() const { return error_; }

 private:
  void compact() {
    if (pos_ == 0) return;
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(pos_));
    pos_ = 0;
  }
  std::vector<unsigned char> buf_;
  size_t pos_ = 0;
  bool failed_ = false;
  std::string error_;
};

}  // namespace offload::proto

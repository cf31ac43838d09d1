// The wire protocol between liboffload.so, offloadd and offloadctl: one header of
// versioned frames over a Unix stream socket.
//
// Every frame is a FrameHeader followed by `length` payload bytes. Payloads are fixed-width
// POD structs (static_asserts below pin their sizes); StatusReply is a StatusHead followed
// by `clients` ClientStatus entries. A receiver:
//   - reads exactly sizeof(FrameHeader) bytes and calls check_header(), which rejects a bad
//     magic, another major version (with a message naming both versions), an unknown type,
//     and a length that is not the exact size of that type's payload;
//   - only then reads `length` payload bytes and takes them with read_payload(), which
//     checks the size again and NUL-terminates every string field.
// A minor version adds message types or appends nothing to existing payloads; a receiver
// accepts any minor of its major.
//
// Header-only; no allocation in decoding; safe on untrusted bytes (fuzzed: tests/fuzz/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace offload::proto {

inline constexpr uint32_t kMagic = 0x4C46464F;  // "OFFL" little-endian
inline constexpr uint16_t kMajor = 1;
inline constexpr uint16_t kMinor = 0;
inline constexpr uint32_t kMaxClients = 256;     // status entries in one reply

enum class MsgType : uint16_t {
  Register = 1,
  RegisterReply = 2,
  Lease = 3,
  LeaseReply = 4,
  Release = 5,
  ReleaseReply = 6,
  PlanRequest = 7,
  PlanReply = 8,
  Telemetry = 9,
  StatusQuery = 10,
  StatusReply = 11,
  Shutdown = 12,
  Error = 13,
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

struct PlanRequest {
  uint64_t device_budget;
  uint64_t step;
};

struct PlanReply {
  uint32_t status;
  uint32_t kind;  // 0: no plan from the daemon yet: the shim uses its built-in plan
  uint64_t reserved;
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
  uint32_t reserved;
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

static_assert(sizeof(FrameHeader) == 24);
static_assert(sizeof(Register) == 96);
static_assert(sizeof(RegisterReply) == 88);
static_assert(sizeof(Lease) == 8);
static_assert(sizeof(LeaseReply) == 24);
static_assert(sizeof(Release) == 16);
static_assert(sizeof(ReleaseReply) == 8);
static_assert(sizeof(PlanRequest) == 16);
static_assert(sizeof(PlanReply) == 16);
static_assert(sizeof(Telemetry) == 56);
static_assert(sizeof(StatusQuery) == 8);
static_assert(sizeof(StatusHead) == 32);
static_assert(sizeof(ClientStatus) == 32 + 56 + 64);
static_assert(sizeof(Shutdown) == 8);
static_assert(sizeof(Error) == 128);

template <class T>
inline constexpr bool kPod = std::is_trivially_copyable_v<T> && std::is_standard_layout_v<T>;
static_assert(kPod<FrameHeader> && kPod<Register> && kPod<ClientStatus> && kPod<Error>);

// The payload type of each message, for encode/decode.
template <MsgType> struct PayloadOf;
template <> struct PayloadOf<MsgType::Register> { using type = Register; };
template <> struct PayloadOf<MsgType::RegisterReply> { using type = RegisterReply; };
template <> struct PayloadOf<MsgType::Lease> { using type = Lease; };
template <> struct PayloadOf<MsgType::LeaseReply> { using type = LeaseReply; };
template <> struct PayloadOf<MsgType::Release> { using type = Release; };
template <> struct PayloadOf<MsgType::ReleaseReply> { using type = ReleaseReply; };
template <> struct PayloadOf<MsgType::PlanRequest> { using type = PlanRequest; };
template <> struct PayloadOf<MsgType::PlanReply> { using type = PlanReply; };
template <> struct PayloadOf<MsgType::Telemetry> { using type = Telemetry; };
template <> struct PayloadOf<MsgType::StatusQuery> { using type = StatusQuery; };
template <> struct PayloadOf<MsgType::Shutdown> { using type = Shutdown; };
template <> struct PayloadOf<MsgType::Error> { using type = Error; };

enum class HeaderError {
  None,
  BadMagic,
  OtherMajor,
  UnknownType,
  BadLength,
};

// Fixed payload size of a type; 0 for StatusReply (variable) and unknown types.
inline size_t payload_size(uint16_t type) {
  switch (static_cast<MsgType>(type)) {
    case MsgType::Register: return sizeof(Register);
    case MsgType::RegisterReply: return sizeof(RegisterReply);
    case MsgType::Lease: return sizeof(Lease);
    case MsgType::LeaseReply: return sizeof(LeaseReply);
    case MsgType::Release: return sizeof(Release);
    case MsgType::ReleaseReply: return sizeof(ReleaseReply);
    case MsgType::PlanRequest: return sizeof(PlanRequest);
    case MsgType::PlanReply: return sizeof(PlanReply);
    case MsgType::Telemetry: return sizeof(Telemetry);
    case MsgType::StatusQuery: return sizeof(StatusQuery);
    case MsgType::Shutdown: return sizeof(Shutdown);
    case MsgType::Error: return sizeof(Error);
    default: return 0;
  }
}

inline bool known_type(uint16_t type) {
  return type >= static_cast<uint16_t>(MsgType::Register) && type <= static_cast<uint16_t>(MsgType::Error);
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
    if (h.length < sizeof(StatusHead) || (h.length - sizeof(StatusHead)) % sizeof(ClientStatus) != 0 ||
        (h.length - sizeof(StatusHead)) / sizeof(ClientStatus) > kMaxClients)
      return fail(HeaderError::BadLength, "malformed status reply length " + std::to_string(h.length));
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

// A status reply: the head and its entries; false if the sizes do not add up.
inline bool read_status(const void* data, size_t len, StatusHead* head, std::vector<ClientStatus>* clients) {
  if (len < sizeof(StatusHead)) return false;
  std::memcpy(head, data, sizeof(StatusHead));
  if (head->clients > kMaxClients || len != sizeof(StatusHead) + head->clients * sizeof(ClientStatus)) return false;
  clients->resize(head->clients);
  const auto* p = static_cast<const unsigned char*>(data) + sizeof(StatusHead);
  for (uint32_t i = 0; i < head->clients; ++i) {
    std::memcpy(&(*clients)[i], p + i * sizeof(ClientStatus), sizeof(ClientStatus));
    terminate_strings((*clients)[i]);
  }
  return true;
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

inline std::vector<unsigned char> encode_status(uint64_t seq, const StatusHead& head,
                                                const std::vector<ClientStatus>& clients) {
  StatusHead h2 = head;
  h2.clients = static_cast<uint32_t>(clients.size());
  uint32_t len = static_cast<uint32_t>(sizeof(StatusHead) + clients.size() * sizeof(ClientStatus));
  std::vector<unsigned char> out(sizeof(FrameHeader) + len);
  FrameHeader h = make_header(MsgType::StatusReply, len, seq);
  std::memcpy(out.data(), &h, sizeof h);
  std::memcpy(out.data() + sizeof h, &h2, sizeof h2);
  if (!clients.empty())
    std::memcpy(out.data() + sizeof h + sizeof h2, clients.data(), clients.size() * sizeof(ClientStatus));
  return out;
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

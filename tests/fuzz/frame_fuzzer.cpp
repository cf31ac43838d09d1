// libFuzzer target for the wire protocol's decoding side (protocol/offload/protocol.h).
//
// Input: the first byte seeds the chunking, the rest is a byte stream. The stream is fed
// to a proto::FrameReader in chunks of pseudo-random sizes (as recv() would cut it); every
// frame the reader yields is decoded into its own payload type with read_payload (or
// read_status for a StatusReply). Invariants that trap when broken:
//   - a yielded frame passed check_header, and its payload is exactly `length` bytes;
//   - read_payload accepts every fixed-size frame the reader yields, and leaves its
//     strings NUL-terminated; read_status's and read_node's entries match their counts;
//   - once the reader failed, it yields nothing more, and it says why.
// The reader also gets the same stream in one piece: both must yield the same frames.
//
// `offload_frame_fuzzer --write-seeds DIR` writes a seed corpus of valid frames and exits.
// Without libFuzzer (GCC builds), standalone_main.cpp drives the same entry point.
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "offload/protocol.h"

using namespace offload::proto;

namespace {

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "frame_fuzzer: invariant broken: %s\n", what);
  __builtin_trap();
}

template <class T>
void decode(const std::vector<unsigned char>& p) {
  T v;
  if (!read_payload(p.data(), p.size(), &v)) broken("read_payload refused a frame the reader accepted");
  if (read_payload(p.data(), p.size() + 1, &v)) broken("read_payload accepted a wrong size");
}

void terminated(const char* s, size_t n, const char* what) {
  if (std::memchr(s, 0, n) == nullptr) broken(what);
}

struct Seen {
  uint16_t type;
  uint64_t seq;
  uint32_t length;
};

void take(const FrameHeader& h, const std::vector<unsigned char>& p, std::vector<Seen>* seen) {
  if (check_header(h) != HeaderError::None) broken("the reader yielded a frame with a bad header");
  if (p.size() != h.length) broken("payload size differs from the header's length");
  seen->push_back({h.type, h.seq, h.length});
  switch (static_cast<MsgType>(h.type)) {
    case MsgType::Register: {
      decode<Register>(p);
      Register r;
      read_payload(p.data(), p.size(), &r);
      terminated(r.command, sizeof r.command, "Register.command not terminated");
      break;
    }
    case MsgType::RegisterReply: {
      decode<RegisterReply>(p);
      RegisterReply r;
      read_payload(p.data(), p.size(), &r);
      terminated(r.segment, sizeof r.segment, "RegisterReply.segment not terminated");
      break;
    }
    case MsgType::Lease: decode<Lease>(p); break;
    case MsgType::LeaseReply: decode<LeaseReply>(p); break;
    case MsgType::Release: decode<Release>(p); break;
    case MsgType::ReleaseReply: decode<ReleaseReply>(p); break;
    case MsgType::Telemetry: decode<Telemetry>(p); break;
    case MsgType::StatusQuery: decode<StatusQuery>(p); break;
    case MsgType::Shutdown: decode<Shutdown>(p); break;
    case MsgType::Error: {
      decode<Error>(p);
      Error e;
      read_payload(p.data(), p.size(), &e);
      terminated(e.message, sizeof e.message, "Error.message not terminated");
      break;
    }
    case MsgType::Attach: {
      decode<Attach>(p);
      Attach a;
      read_payload(p.data(), p.size(), &a);
      terminated(a.gpu_id, sizeof a.gpu_id, "Attach.gpu_id not terminated");
      break;
    }
    case MsgType::AttachReply: decode<AttachReply>(p); break;
    case MsgType::NodeQuery: decode<NodeQuery>(p); break;
    case MsgType::NodeReply: {
      NodeHead head;
      std::vector<ClientNode> cs;
      if (read_node(p.data(), p.size(), &head, &cs)) {
        if (cs.size() != head.clients || cs.size() > kMaxClients) broken("read_node: entries differ from count");
        if (sizeof(NodeHead) + cs.size() * sizeof(ClientNode) != p.size()) broken("read_node: sizes");
        for (auto& c : cs) terminated(c.gpu_id, sizeof c.gpu_id, "ClientNode.gpu_id not terminated");
      }
      break;
    }
    case MsgType::StatusReply: {
      StatusHead head;
      std::vector<ClientStatus> cs;
      if (read_status(p.data(), p.size(), &head, &cs)) {
        if (cs.size() != head.clients || cs.size() > kMaxClients) broken("read_status: entries differ from count");
        if (sizeof(StatusHead) + cs.size() * sizeof(ClientStatus) != p.size()) broken("read_status: sizes");
        for (auto& c : cs) terminated(c.command, sizeof c.command, "ClientStatus.command not terminated");
      }
      break;
    }
    default:
      broken("the reader yielded an unknown type");
  }
}

// Feeds `data` in chunks whose sizes come from `seed`; the frames it yielded.
std::vector<Seen> run(const uint8_t* data, size_t size, uint32_t seed, bool* failed) {
  FrameReader r;
  FrameHeader h{};
  std::vector<unsigned char> payload;
  std::vector<Seen> seen;
  uint32_t x = seed * 2654435761u + 1;
  size_t at = 0;
  while (at < size) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    size_t n = 1 + x % (seed % 4 == 0 ? 7 : seed % 4 == 1 ? 64 : 4096);
    n = std::min(n, size - at);
    r.feed(data + at, n);
    at += n;
    while (r.next(&h, &payload)) {
      if (r.failed()) broken("a frame from a failed reader");
      take(h, payload, &seen);
    }
    if (r.failed()) {
      if (r.error().empty()) broken("the reader failed without saying why");
      if (r.next(&h, &payload)) broken("a failed reader yielded a frame");
      break;
    }
  }
  *failed = r.failed();
  return seen;
}

template <class T>
std::vector<unsigned char> frame(MsgType t, uint64_t seq, const T& v) {
  return encode(t, seq, v);
}

}  // namespace

// Valid frames of every type, one per seed, plus streams of several; each prefixed with
// its chunking byte. Used by --write-seeds and by the standalone driver.
std::vector<std::vector<unsigned char>> offload_fuzz_seeds() {
  std::vector<std::vector<unsigned char>> frames;
  Register reg{};
  reg.pid = 1234;
  reg.gpu = 1;
  reg.device_budget = 8ull << 30;
  std::snprintf(reg.command, sizeof reg.command, "python train.py");
  frames.push_back(frame(MsgType::Register, 1, reg));
  RegisterReply rr{};
  rr.client_id = 3;
  rr.pool_bytes = 1ull << 30;
  rr.fair_share = 1ull << 29;
  std::snprintf(rr.segment, sizeof rr.segment, "offload-pool-0");
  frames.push_back(frame(MsgType::RegisterReply, 1, rr));
  frames.push_back(frame(MsgType::Lease, 2, Lease{1 << 20}));
  frames.push_back(frame(MsgType::LeaseReply, 2, LeaseReply{0, 0, 65536, 1 << 20}));
  frames.push_back(frame(MsgType::Release, 3, Release{65536, 1 << 20}));
  frames.push_back(frame(MsgType::ReleaseReply, 3, ReleaseReply{0, 0}));
  frames.push_back(frame(MsgType::Telemetry, 5, Telemetry{7, 123000000, 4000000, 2, 5 << 20, 3 << 20, 99}));
  frames.push_back(frame(MsgType::StatusQuery, 6, StatusQuery{}));
  frames.push_back(frame(MsgType::Shutdown, 7, Shutdown{}));
  Error e{};
  e.status = static_cast<uint32_t>(Status::BadRequest);
  std::snprintf(e.message, sizeof e.message, "register first");
  frames.push_back(frame(MsgType::Error, 8, e));
  StatusHead head{1ull << 30, 1 << 20, (1ull << 30) - (1 << 20), 42, 0};
  ClientStatus c{};
  c.pid = 1234;
  c.client_id = 3;
  c.connected = 1;
  c.leased_bytes = 1 << 20;
  std::snprintf(c.command, sizeof c.command, "python train.py");
  frames.push_back(encode_status(9, head, {}));
  frames.push_back(encode_status(9, head, {c, c}));
  // Minor 1: the node messages.
  Attach at{0, 1, 1, 2, 40ull << 30, "0000:1b:00.0"};
  frames.push_back(frame(MsgType::Attach, 10, at));
  frames.push_back(frame(MsgType::AttachReply, 10,
                         AttachReply{0, 2, 1ull << 29, NodeLink{110200000000, 108500000000, 190000000000}}));
  frames.push_back(frame(MsgType::NodeQuery, 11, NodeQuery{}));
  ClientNode cn{3, 1234, 0, 1, 1, 2, 40ull << 30, "0000:1b:00.0"};
  frames.push_back(encode_node(11, NodeHead{2, 0, NodeLink{0, 0, 0}}, {}));
  frames.push_back(encode_node(11, NodeHead{2, 0, NodeLink{1, 2, 3}}, {cn, cn}));

  std::vector<std::vector<unsigned char>> seeds;
  uint8_t chunking = 0;
  for (auto& f : frames) {
    std::vector<unsigned char> s{chunking++};
    s.insert(s.end(), f.begin(), f.end());
    seeds.push_back(s);
  }
  for (uint8_t k = 0; k < 4; ++k) {  // every frame in one stream, cut four ways
    std::vector<unsigned char> s{k};
    for (auto& f : frames) s.insert(s.end(), f.begin(), f.end());
    seeds.push_back(s);
  }
  return seeds;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint32_t seed = data[0];
  bool failed_chunked = false, failed_whole = false;
  std::vector<Seen> chunked = run(data + 1, size - 1, seed, &failed_chunked);
  std::vector<Seen> whole = run(data + 1, size - 1, 2 /* 4096-byte chunks */, &failed_whole);
  // How the stream is cut must not change what it means.
  if (chunked.size() != whole.size()) broken("chunking changed the number of frames");
  for (size_t i = 0; i < chunked.size(); ++i)
    if (chunked[i].type != whole[i].type || chunked[i].seq != whole[i].seq || chunked[i].length != whole[i].length)
      broken("chunking changed a frame");
  if (failed_chunked != failed_whole) broken("chunking changed whether the stream is broken");
  return 0;
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  for (int i = 1; i + 1 < *argc; ++i) {
    if (std::strcmp((*argv)[i], "--write-seeds") != 0) continue;
    const std::string dir = (*argv)[i + 1];
    mkdir(dir.c_str(), 0755);
    int n = 0;
    for (auto& s : offload_fuzz_seeds()) {
      std::string path = dir + "/seed-" + std::to_string(n++);
      FILE* f = std::fopen(path.c_str(), "wb");
      if (!f || std::fwrite(s.data(), 1, s.size(), f) != s.size()) {
        std::fprintf(stderr, "frame_fuzzer: cannot write %s\n", path.c_str());
        std::exit(1);
      }
      std::fclose(f);
    }
    std::printf("frame_fuzzer: wrote %d seeds to %s\n", n, dir.c_str());
    std::exit(0);
  }
  return 0;
}

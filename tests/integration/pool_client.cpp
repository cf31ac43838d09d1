// offload_it_client: a scriptable offloadd client for the integration tests.
//
// The tests start it with posix_spawn (never a bare fork of the test process, so that it
// stays safe under ThreadSanitizer) and drive it over its stdin/stdout: one command per
// line in, one answer per line out. It speaks to the daemon through the same client code
// as the shim (offload::DaemonClient) and maps the pool with offload::SharedPoolMapping.
//
//   options: --socket PATH  [--command NAME] [--gpu N] [--drop-uid UID]
//
//   connect                         -> ok | err MSG
//   register [PRIOR [HOST_LIMIT]]   -> ok ID POOL_BYTES FAIR_SHARE SEGMENT | err MSG
//   map                             -> ok DATA_BYTES | err MSG   (the segment register named)
//   lease BYTES                     -> ok OFFSET BYTES | refused STATUS | err MSG
//   release OFFSET BYTES            -> ok | refused STATUS | err MSG
//   fill OFFSET BYTES TAG           -> ok           writes the pattern of TAG
//   check OFFSET BYTES TAG          -> ok | bad AT  the pattern of TAG is intact
//   clear OFFSET BYTES              -> ok           zeroes the pattern words
//   telemetry STEP STEP_NS MISSES RESIDENT EVICTED -> ok | err
//   status                          -> ok USED POOL CLIENTS | err MSG
//   attach GPU GPU_ID [RANK LOCAL_RANK LOCAL_WORLD [BUDGET]]   (GPU_ID "-": none)
//                                   -> ok GPUS FAIR_SHARE H2D_BPS D2H_BPS BOTH_BPS | refused STATUS | err MSG
//   node                            -> ok GPUS CLIENTS H2D_BPS D2H_BPS BOTH_BPS | err MSG
//   stress ITERS SEED TAG           -> ok LEASES REFUSALS | bad MSG   (see stress())
//   raw-register                    -> registered ID | error STATUS | closed | connect-failed ERRNO
//   pid                             -> ok PID
//   quit                            -> (exits 0)
//
// A pattern word sits every kStride bytes of an extent (every kStressStride bytes in stress,
// which moves gigabytes: a word per page still covers every 64 KiB lease granule 16 times):
// (TAG << 40) ^ absolute offset, so a word written by another lease holder, or for
// another offset, never matches.
#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/ipc.h"
#include "offload/pool_layout.h"
#include "offload/protocol.h"

namespace {

using namespace offload;

constexpr uint64_t kStride = 64;
constexpr uint64_t kStressStride = 4096;

struct State {
  std::string socket, command = "it-client", segment;
  int gpu = 0;
  DaemonClient client;
  std::unique_ptr<SharedPoolMapping> pool;
};

uint64_t pattern(uint64_t tag, uint64_t off) { return (tag << 40) ^ off; }

volatile uint64_t* word(State& s, uint64_t off) {
  return reinterpret_cast<volatile uint64_t*>(s.pool->data() + off);
}

bool in_pool(State& s, uint64_t off, uint64_t bytes) {
  return s.pool && off % 8 == 0 && bytes <= s.pool->data_bytes() && off <= s.pool->data_bytes() - bytes;
}

void fill(State& s, uint64_t off, uint64_t bytes, uint64_t tag, uint64_t stride = kStride) {
  for (uint64_t o = off; o + 8 <= off + bytes; o += stride) *word(s, o) = pattern(tag, o);
}

// The first offset whose word is not the pattern of `tag` (tag 0: not zero), or UINT64_MAX.
uint64_t first_bad(State& s, uint64_t off, uint64_t bytes, uint64_t tag, uint64_t stride = kStride) {
  for (uint64_t o = off; o + 8 <= off + bytes; o += stride) {
    uint64_t want = tag ? pattern(tag, o) : 0;
    if (*word(s, o) != want) return o;
  }
  return UINT64_MAX;
}

void clear(State& s, uint64_t off, uint64_t bytes, uint64_t stride = kStride) {
  for (uint64_t o = off; o + 8 <= off + bytes; o += stride) *word(s, o) = 0;
}

std::string one_line(std::string m) {
  for (char& c : m)
    if (c == '\n' || c == '\r') c = ' ';
  return m;
}

// Leases and releases at random against the daemon, holding up to 8 extents at a time.
// Every extent it is given must be aligned, inside the pool and untouched (zero: nobody else
// holds it); it writes its pattern there and checks it is intact, then clears it, before
// releasing. A double-leased byte shows up as a foreign word on lease or a broken pattern
// on release.
std::string stress(State& s, long iters, unsigned seed, uint64_t tag_base) {
  std::mt19937_64 rng(seed);
  struct Held {
    uint64_t off, bytes, tag;
  };
  std::vector<Held> held;
  uint64_t serial = 0, leases = 0, refusals = 0;
  std::string why;
  auto release_one = [&](size_t i) -> std::string {
    Held h = held[i];
    uint64_t bad = first_bad(s, h.off, h.bytes, h.tag, kStressStride);
    if (bad != UINT64_MAX)
      return "bad pattern of extent " + std::to_string(h.off) + "+" + std::to_string(h.bytes) +
             " broken at " + std::to_string(bad);
    clear(s, h.off, h.bytes, kStressStride);
    auto r = s.client.release(h.off, h.bytes, &why);
    if (!r) return "bad release failed: " + one_line(why);
    if (r->status != 0) return "bad release refused with status " + std::to_string(r->status);
    held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
    return {};
  };
  for (long it = 0; it < iters; ++it) {
    bool want_lease = held.empty() || (held.size() < 8 && rng() % 3 != 0);
    if (want_lease) {
      uint64_t bytes = (rng() % 256 + 1) * kLeaseAlign;
      if (rng() % 2) bytes -= rng() % 1000;  // unaligned requests too
      auto r = s.client.lease(bytes, &why);
      if (!r) return "bad lease failed: " + one_line(why);
      auto st = static_cast<proto::Status>(r->status);
      if (st == proto::Status::PoolFull || st == proto::Status::OverLimit) {
        ++refusals;
        if (!held.empty()) {
          std::string e = release_one(rng() % held.size());
          if (!e.empty()) return e;
        }
        continue;
      }
      if (st != proto::Status::Ok) return "bad lease status " + std::to_string(r->status);
      uint64_t rounded = (bytes + kLeaseAlign - 1) / kLeaseAlign * kLeaseAlign;
      if (r->bytes != rounded || r->offset % kLeaseAlign != 0 || !in_pool(s, r->offset, r->bytes))
        return "bad extent " + std::to_string(r->offset) + "+" + std::to_string(r->bytes) + " for a request of " +
               std::to_string(bytes);
      uint64_t bad = first_bad(s, r->offset, r->bytes, 0, kStressStride);
      if (bad != UINT64_MAX)
        return "bad extent " + std::to_string(r->offset) + "+" + std::to_string(r->bytes) +
               " is in use: foreign word at " + std::to_string(bad);
      uint64_t tag = (tag_base << 20) | (++serial & 0xFFFFF);
      fill(s, r->offset, r->bytes, tag, kStressStride);
      held.push_back({r->offset, r->bytes, tag});
      ++leases;
    } else {
      std::string e = release_one(rng() % held.size());
      if (!e.empty()) return e;
    }
  }
  while (!held.empty()) {
    std::string e = release_one(held.size() - 1);
    if (!e.empty()) return e;
  }
  return "ok " + std::to_string(leases) + " " + std::to_string(refusals);
}

// Connects and registers without the client library, reporting exactly what came back.
std::string raw_register(State& s) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", s.socket.c_str());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::string("connect-failed ") + strerrorname_np(errno);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    std::string e = std::string("connect-failed ") + strerrorname_np(errno);
    ::close(fd);
    return e;
  }
  proto::Register r{};
  r.pid = static_cast<uint32_t>(getpid());
  r.gpu = s.gpu;
  std::snprintf(r.command, sizeof r.command, "%s", s.command.c_str());
  auto frame = proto::encode(proto::MsgType::Register, 1, r);
  offload::send_all(fd, frame.data(), frame.size());  // it may be refused before it reads this
  proto::FrameReader reader;
  proto::FrameHeader h{};
  std::vector<unsigned char> payload;
  std::string result = "closed";
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) {
      result = "timeout";
      break;
    }
    unsigned char buf[4096];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    reader.feed(buf, static_cast<size_t>(n));
    if (reader.next(&h, &payload)) {
      if (h.type == static_cast<uint16_t>(proto::MsgType::RegisterReply)) {
        proto::RegisterReply rep{};
        proto::read_payload(payload.data(), payload.size(), &rep);
        result = "registered " + std::to_string(rep.client_id);
      } else if (h.type == static_cast<uint16_t>(proto::MsgType::Error)) {
        proto::Error e{};
        proto::read_payload(payload.data(), payload.size(), &e);
        result = "error " + std::to_string(e.status);
      } else {
        result = "other " + std::to_string(h.type);
      }
      break;
    }
    if (reader.failed()) {
      result = "malformed";
      break;
    }
  }
  ::close(fd);
  return result;
}

std::string lease_answer(const std::optional<proto::LeaseReply>& r, const std::string& why) {
  if (!r) return "err " + one_line(why);
  if (r->status != 0) return "refused " + std::to_string(r->status);
  return "ok " + std::to_string(r->offset) + " " + std::to_string(r->bytes);
}

std::string run(State& s, const std::string& line) {
  std::istringstream in(line);
  std::string cmd, why;
  in >> cmd;
  if (cmd == "connect") return s.client.connect(s.socket, &why) ? "ok" : "err " + one_line(why);
  if (cmd == "register") {
    uint64_t prior = 0, limit = 0;
    in >> prior >> limit;
    proto::Register r{};
    r.pid = static_cast<uint32_t>(getpid());
    r.gpu = s.gpu;
    r.host_limit = limit;
    r.prior_client = static_cast<uint32_t>(prior);
    std::snprintf(r.command, sizeof r.command, "%s", s.command.c_str());
    auto rep = s.client.register_client(r, &why);
    if (!rep) return "err " + one_line(why);
    if (rep->status != 0) return "refused " + std::to_string(rep->status);
    s.segment = rep->segment;
    return "ok " + std::to_string(rep->client_id) + " " + std::to_string(rep->pool_bytes) + " " +
           std::to_string(rep->fair_share) + " " + s.segment;
  }
  if (cmd == "map") {
    auto m = std::make_unique<SharedPoolMapping>();
    if (!m->open(s.segment, &why)) return "err " + one_line(why);
    s.pool = std::move(m);
    return "ok " + std::to_string(s.pool->data_bytes());
  }
  if (cmd == "lease") {
    uint64_t bytes = 0;
    in >> bytes;
    auto r = s.client.lease(bytes, &why);
    return lease_answer(r, why);
  }
  if (cmd == "release") {
    uint64_t off = 0, bytes = 0;
    in >> off >> bytes;
    auto r = s.client.release(off, bytes, &why);
    if (!r) return "err " + one_line(why);
    return r->status ? "refused " + std::to_string(r->status) : "ok";
  }
  if (cmd == "fill" || cmd == "check" || cmd == "clear") {
    uint64_t off = 0, bytes = 0, tag = 0;
    in >> off >> bytes >> tag;
    if (!in_pool(s, off, bytes)) return "err extent outside the mapped pool";
    if (cmd == "fill") fill(s, off, bytes, tag);
    if (cmd == "clear") clear(s, off, bytes);
    if (cmd == "check") {
      uint64_t bad = first_bad(s, off, bytes, tag);
      if (bad != UINT64_MAX) return "bad " + std::to_string(bad);
    }
    return "ok";
  }
  if (cmd == "telemetry") {
    proto::Telemetry t{};
    in >> t.step >> t.step_ns >> t.misses >> t.resident_bytes >> t.evicted_bytes;
    t.exposed_stall_ns = 4'000'000;
    t.launches = 99;
    return s.client.telemetry(t) ? "ok" : "err telemetry not sent";
  }
  if (cmd == "status") {
    proto::StatusHead h{};
    std::vector<proto::ClientStatus> cs;
    if (!s.client.status(&h, &cs, &why)) return "err " + one_line(why);
    return "ok " + std::to_string(h.used_bytes) + " " + std::to_string(h.pool_bytes) + " " + std::to_string(cs.size());
  }
  if (cmd == "attach") {
    proto::Attach a{};
    std::string id;
    long gpu = -1, rank = -1, local_rank = -1, local_world = 0;
    uint64_t budget = 0;
    in >> gpu >> id >> rank >> local_rank >> local_world >> budget;
    a.gpu = static_cast<int32_t>(gpu);
    a.rank = static_cast<int32_t>(rank);
    a.local_rank = static_cast<int32_t>(local_rank);
    a.local_world = static_cast<int32_t>(local_world);
    a.device_budget = budget;
    std::snprintf(a.gpu_id, sizeof a.gpu_id, "%s", id == "-" ? "" : id.c_str());
    auto r = s.client.attach(a, &why);
    if (!r) return "err " + one_line(why);
    if (r->status != 0) return "refused " + std::to_string(r->status);
    return "ok " + std::to_string(r->gpus) + " " + std::to_string(r->fair_share) + " " +
           std::to_string(r->link.h2d_bps) + " " + std::to_string(r->link.d2h_bps) + " " +
           std::to_string(r->link.both_bps);
  }
  if (cmd == "node") {
    proto::NodeHead h{};
    std::vector<proto::ClientNode> cs;
    if (!s.client.node(&h, &cs, &why)) return "err " + one_line(why);
    return "ok " + std::to_string(h.gpus) + " " + std::to_string(cs.size()) + " " + std::to_string(h.link.h2d_bps) +
           " " + std::to_string(h.link.d2h_bps) + " " + std::to_string(h.link.both_bps);
  }
  if (cmd == "stress") {
    long iters = 0;
    unsigned seed = 0;
    uint64_t tag = 0;
    in >> iters >> seed >> tag;
    if (!s.pool) return "bad no pool mapped";
    return stress(s, iters, seed, tag);
  }
  if (cmd == "raw-register") return raw_register(s);
  if (cmd == "pid") return "ok " + std::to_string(getpid());
  return "err unknown command '" + cmd + "'";
}

}  // namespace

int main(int argc, char** argv) {
  State s;
  long drop_uid = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--socket") s.socket = v;
    else if (k == "--command") s.command = v;
    else if (k == "--gpu") s.gpu = std::atoi(v.c_str());
    else if (k == "--drop-uid") drop_uid = std::atol(v.c_str());
    else {
      std::fprintf(stderr, "offload_it_client: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (drop_uid >= 0) {
    gid_t g = static_cast<gid_t>(drop_uid);
    if (setgroups(1, &g) != 0 || setgid(g) != 0 || setuid(static_cast<uid_t>(drop_uid)) != 0 ||
        getuid() != static_cast<uid_t>(drop_uid)) {
      std::fprintf(stderr, "offload_it_client: cannot become uid %ld: %s\n", drop_uid, strerror(errno));
      return 3;
    }
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line == "quit") return 0;
    std::string answer = run(s, line);
    std::printf("%s\n", answer.c_str());
    std::fflush(stdout);
  }
  return 0;
}

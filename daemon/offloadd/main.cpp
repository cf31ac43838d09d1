// offloadd: the control plane, one per user per node. Holds the shared pinned host pool and
// answers the shims and offloadctl. Runs in the foreground (systemd, or a shim that starts it
// detached); SIGTERM/SIGINT stop it cleanly.
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "common/ipc.h"
#include "common/env.h"
#include "common/log.h"
#include "offloadd/service.h"
#include "offload_version.h"

namespace {

offload::Service* g_service = nullptr;

void usage(FILE* f) {
  fprintf(f,
          "usage: offloadd [options]\n"
          "  --pool-size SIZE     host pool to create, e.g. 64GiB (default 4GiB; an existing pool is\n"
          "                       re-adopted at its own size)\n"
          "  --socket PATH        listen here (default $XDG_RUNTIME_DIR/liboffload/offloadd.sock,\n"
          "                       else /tmp/liboffload-<uid>/offloadd.sock; OFFLOAD_SOCKET overrides)\n"
          "  --segment NAME       POSIX shared-memory name of the pool (default offload-pool-<uid>-<hash of\n"
          "                       the socket path>); one daemon at a time may serve it\n"
          "  --metrics-port N     serve Prometheus metrics on 127.0.0.1:N (0: any free port)\n"
          "  --max-leases N       lease-table entries (default 4096)\n"
          "  --node-link H2D,D2H,BOTH\n"
          "                       the node's host link in GB/s (decimal, e.g. 110.2,108.5,190), measured\n"
          "                       with all its GPUs copying at once: host to device, device to host, and\n"
          "                       both ways at once (the two summed). Told to every shim that attaches;\n"
          "                       default: not measured\n"
          "  --no-prefault        do not fault the pool in at start\n"
          "  --socket-mode OCTAL  socket file mode (default 0600; other users are refused anyway)\n"
          "  --log-level LEVEL    debug, info, warn, error or off (default info)\n"
          "  --version            the version and the source commit\n"
          "  --help\n");
}

int bad(const std::string& msg) {
  fprintf(stderr, "offloadd: %s\n(offloadd --help lists the options)\n", msg.c_str());
  return 2;
}

bool parse_int(const std::string& s, long lo, long hi, long* out, int base = 10) {
  char* end = nullptr;
  errno = 0;
  long v = strtol(s.c_str(), &end, base);
  if (s.empty() || *end || errno || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// One figure of --node-link: a positive decimal number of GB/s ("110.2", "190"), at most
// 100000 GB/s; bytes/s.
std::optional<uint64_t> parse_gbps(const std::string& s) {
  size_t digits = 0, dots = 0;
  for (char c : s) {
    if (c >= '0' && c <= '9') ++digits;
    else if (c == '.') ++dots;
    else return std::nullopt;
  }
  if (!digits || dots > 1 || s.front() == '.' || s.back() == '.') return std::nullopt;
  double v = std::strtod(s.c_str(), nullptr);
  if (!(v > 0) || v > 100000) return std::nullopt;
  uint64_t bps = static_cast<uint64_t>(std::llround(v * 1e9));
  if (bps == 0) return std::nullopt;
  return bps;
}

// --node-link H2D,D2H,BOTH.
std::optional<offload::proto::NodeLink> parse_node_link(const std::string& s) {
  std::vector<uint64_t> v;
  size_t start = 0;
  for (;;) {
    size_t comma = s.find(',', start);
    auto x = parse_gbps(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (!x) return std::nullopt;
    v.push_back(*x);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (v.size() != 3) return std::nullopt;
  return offload::proto::NodeLink{v[0], v[1], v[2]};
}

}  // namespace

int main(int argc, char** argv) {
  // Every peer costs a descriptor: take all the system allows this user.
  offload::raise_open_files_limit();
  offload::ServiceOptions o;
  o.pool_bytes = 4ull << 30;
  std::string why;
  offload::Paths paths;
  std::vector<std::string> a(argv + 1, argv + argc);
  std::string socket, segment, level = "info";
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string& k = a[i];
    auto value = [&](std::string* v) {
      if (i + 1 >= a.size()) return false;
      *v = a[++i];
      return true;
    };
    std::string v;
    long n = 0;
    if (k == "--help" || k == "-h") {
      usage(stdout);
      return 0;
    } else if (k == "--version") {
      printf("offloadd %s (commit %s)\n", OFFLOAD_VERSION, OFFLOAD_COMMIT);
      return 0;
    } else if (k == "--pool-size") {
      if (!value(&v)) return bad("--pool-size needs a size, e.g. 64GiB");
      auto size = offload::parse_size(v);
      if (!size || *size < (64ull << 20)) return bad("--pool-size '" + v + "' is not valid: expected a size of at least 64MiB, e.g. 64GiB");
      o.pool_bytes = *size;
    } else if (k == "--socket") {
      if (!value(&socket) || socket.empty()) return bad("--socket needs a path");
    } else if (k == "--segment") {
      if (!value(&segment) || segment.empty() || segment.find('/') != std::string::npos)
        return bad("--segment needs a name without '/'");
    } else if (k == "--metrics-port") {
      if (!value(&v) || !parse_int(v, 0, 65535, &n)) return bad("--metrics-port '" + v + "' is not valid: expected 0-65535");
      o.metrics_port = static_cast<int>(n);
    } else if (k == "--max-leases") {
      if (!value(&v) || !parse_int(v, 16, 1 << 20, &n)) return bad("--max-leases '" + v + "' is not valid: expected 16-1048576");
      o.max_leases = static_cast<uint32_t>(n);
    } else if (k == "--node-link") {
      if (!value(&v)) return bad("--node-link needs H2D,D2H,BOTH in GB/s, e.g. 110.2,108.5,190");
      auto link = parse_node_link(v);
      if (!link)
        return bad("--node-link '" + v +
                   "' is not valid: expected H2D,D2H,BOTH, three positive decimal numbers of GB/s (at most "
                   "100000), e.g. 110.2,108.5,190");
      o.node_link = *link;
    } else if (k == "--socket-mode") {
      if (!value(&v) || !parse_int(v, 0, 0777, &n, 8)) return bad("--socket-mode '" + v + "' is not valid: expected an octal mode");
      o.socket_mode = static_cast<mode_t>(n);
    } else if (k == "--no-prefault") {
      o.prefault = false;
    } else if (k == "--log-level") {
      if (!value(&level) || (level != "debug" && level != "info" && level != "warn" && level != "error" && level != "off"))
        return bad("--log-level '" + level + "' is not valid: expected debug, info, warn, error or off");
    } else {
      return bad("unknown option '" + k + "'");
    }
  }
  offload::set_log_level(level);
  if (socket.empty()) {
    if (!offload::default_paths(&paths, &why)) return bad(why);
    socket = paths.socket;
  }
  // Named after the socket actually served: daemons on two sockets must never share a pool.
  if (segment.empty()) segment = offload::default_segment_name(socket);
  o.socket_path = socket;
  o.segment = segment;
  auto service = offload::Service::create(o, &why);
  if (!service) {
    fprintf(stderr, "offloadd: %s\n", why.c_str());
    return 1;
  }
  g_service = service.get();
  struct sigaction sa{};
  sa.sa_handler = [](int) {
    if (g_service) g_service->stop();
  };
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  int rc = service->run();
  g_service = nullptr;
  return rc;
}

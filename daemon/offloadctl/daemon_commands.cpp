// offloadctl's daemon commands: status (table, --json, --watch) and stop.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "client/ipc.h"

using namespace offload;

namespace {

std::string human(uint64_t b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int i = 0;
  while (v >= 1024 && i < 4) {
    v /= 1024;
    ++i;
  }
  char s[32];
  snprintf(s, sizeof s, i ? "%.1f %s" : "%.0f %s", v, u[i]);
  return s;
}

std::string json_str(const char* s) {
  std::string o = "\"";
  for (; *s; ++s) {
    if (*s == '"' || *s == '\\') o += '\\';
    if (static_cast<unsigned char>(*s) < 0x20) continue;
    o += *s;
  }
  return o + "\"";
}

bool connect(DaemonClient* c, const std::string& socket) {
  std::string why, path = socket;
  if (path.empty()) {
    Paths p;
    if (!default_paths(&p, &why)) {
      fprintf(stderr, "offloadctl: %s\n", why.c_str());
      return false;
    }
    path = p.socket;
  }
  if (!c->connect(path, &why)) {
    fprintf(stderr, "offloadctl: %s\n", why.c_str());
    return false;
  }
  return true;
}

void print_table(const proto::StatusHead& h, const std::vector<proto::ClientStatus>& cs) {
  printf("pool: %s, used %s, free %s (offloadd pid %u)\n", human(h.pool_bytes).c_str(), human(h.used_bytes).c_str(),
         human(h.free_bytes).c_str(), h.daemon_pid);
  printf("%-8s %-24s %4s %11s %11s %11s %11s %9s %10s %7s\n", "pid", "command", "gpu", "leased", "fair share",
         "resident", "evicted", "step ms", "stall ms", "misses");
  for (const proto::ClientStatus& c : cs) {
    std::string cmd = c.command;
    if (!c.connected) cmd += " (not connected)";
    if (cmd.size() > 24) cmd = cmd.substr(0, 21) + "...";
    printf("%-8u %-24s %4d %11s %11s %11s %11s %9.1f %10.1f %7llu\n", c.pid, cmd.c_str(), c.gpu,
           human(c.leased_bytes).c_str(), human(c.fair_share).c_str(), human(c.last.resident_bytes).c_str(),
           human(c.last.evicted_bytes).c_str(), static_cast<double>(c.last.step_ns) / 1e6,
           static_cast<double>(c.last.exposed_stall_ns) / 1e6, static_cast<unsigned long long>(c.last.misses));
  }
  if (cs.empty()) printf("(no clients)\n");
}

void print_json(const proto::StatusHead& h, const std::vector<proto::ClientStatus>& cs) {
  printf("{\"version\":1,\"daemon_pid\":%u,\"pool_bytes\":%llu,\"used_bytes\":%llu,\"free_bytes\":%llu,\"clients\":[",
         h.daemon_pid, static_cast<unsigned long long>(h.pool_bytes), static_cast<unsigned long long>(h.used_bytes),
         static_cast<unsigned long long>(h.free_bytes));
  for (size_t i = 0; i < cs.size(); ++i) {
    const proto::ClientStatus& c = cs[i];
    printf("%s{\"pid\":%u,\"client_id\":%u,\"command\":%s,\"gpu\":%d,\"connected\":%s,\"leased_bytes\":%llu,"
           "\"fair_share_bytes\":%llu,\"resident_bytes\":%llu,\"evicted_bytes\":%llu,\"step\":%llu,\"step_ns\":%llu,"
           "\"exposed_stall_ns\":%llu,\"misses\":%llu,\"launches\":%llu}",
           i ? "," : "", c.pid, c.client_id, json_str(c.command).c_str(), c.gpu, c.connected ? "true" : "false",
           static_cast<unsigned long long>(c.leased_bytes), static_cast<unsigned long long>(c.fair_share),
           static_cast<unsigned long long>(c.last.resident_bytes), static_cast<unsigned long long>(c.last.evicted_bytes),
           static_cast<unsigned long long>(c.last.step), static_cast<unsigned long long>(c.last.step_ns),
           static_cast<unsigned long long>(c.last.exposed_stall_ns), static_cast<unsigned long long>(c.last.misses),
           static_cast<unsigned long long>(c.last.launches));
  }
  printf("]}\n");
}

}  // namespace

int cmd_status(const std::string& socket, bool json, double watch_s) {
  DaemonClient c;
  if (!connect(&c, socket)) return 1;
  for (;;) {
    proto::StatusHead h{};
    std::vector<proto::ClientStatus> cs;
    std::string why;
    if (!c.status(&h, &cs, &why)) {
      fprintf(stderr, "offloadctl: %s\n", why.c_str());
      return 1;
    }
    if (watch_s > 0 && !json) printf("\033[H\033[2J");
    json ? print_json(h, cs) : print_table(h, cs);
    fflush(stdout);
    if (watch_s <= 0) return 0;
    usleep(static_cast<useconds_t>(watch_s * 1e6));
  }
}

int cmd_stop(const std::string& socket) {
  DaemonClient c;
  if (!connect(&c, socket)) return 1;
  std::string why;
  if (!c.shutdown(&why)) {
    fprintf(stderr, "offloadctl: %s\n", why.c_str());
    return 1;
  }
  printf("offloadd stopping\n");
  return 0;
}

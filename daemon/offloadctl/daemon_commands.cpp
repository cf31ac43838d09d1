// offloadctl's daemon commands: status (table, --json, --watch) and stop.
//
// status asks for the pool (StatusQuery) and then, from a daemon of protocol 1.1 or later,
// for the node (NodeQuery: the GPUs sharing the host link, each client's rank and GPU).
// An older daemon's status is shown without the node's part.
#include <unistd.h>

#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/ipc.h"
#include "offload/text.h"

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

std::string json_str(const char* s) { return "\"" + json_escape(s) + "\""; }

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

// The node's part of the status, when the daemon has one.
struct NodeView {
  proto::NodeHead head{};
  std::map<uint32_t, proto::ClientNode> by_client;
  const proto::ClientNode* of(uint32_t client_id) const {
    auto it = by_client.find(client_id);
    return it == by_client.end() ? nullptr : &it->second;
  }
};

std::string gbps(uint64_t bps) {
  char s[32];
  snprintf(s, sizeof s, "%.1f GB/s", static_cast<double>(bps) / 1e9);
  return s;
}

bool link_measured(const proto::NodeLink& l) { return l.h2d_bps || l.d2h_bps || l.both_bps; }

// "-" for none.
std::string rank_text(int32_t r) { return r >= 0 ? std::to_string(r) : "-"; }

// Said under the table when an older offloadd's one page was full.
std::string cut_text(size_t listed) {
  return "(only the first " + std::to_string(listed) +
         " clients are listed: this offloadd lists no more; a newer one lists them all)";
}

void print_table(const proto::StatusHead& h, const std::vector<proto::ClientStatus>& cs, const NodeView* node,
                 bool complete) {
  printf("pool: %s, used %s, free %s (offloadd pid %u)\n", human(h.pool_bytes).c_str(), human(h.used_bytes).c_str(),
         human(h.free_bytes).c_str(), h.daemon_pid);
  if (node) {
    const proto::NodeLink& l = node->head.link;
    std::string link = link_measured(l) ? "host link " + gbps(l.h2d_bps) + " H2D, " + gbps(l.d2h_bps) + " D2H, " +
                                              gbps(l.both_bps) + " both ways"
                                        : std::string("host link not measured");
    printf("node: %u GPU%s share%s the host link; %s\n", node->head.gpus, node->head.gpus == 1 ? "" : "s",
           node->head.gpus == 1 ? "s" : "", link.c_str());
  }
  printf("%-8s %-24s %4s %11s %11s %11s %11s %9s %10s %7s", "pid", "command", "gpu", "leased", "fair share",
         "resident", "evicted", "step ms", "stall ms", "misses");
  if (node) printf(" %5s %7s  %s", "rank", "local", "gpu id");
  printf("\n");
  for (const proto::ClientStatus& c : cs) {
    std::string cmd = utf8_clean(c.command);
    for (char& ch : cmd)  // a command line may hold newlines or tabs (python3 -c '...'): one row each
      if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = ' ';
    if (!c.connected) cmd += " (not connected)";
    if (cmd.size() > 24) cmd = cmd.substr(0, utf8_prefix(cmd, 21)) + "...";
    printf("%-8u %-24s %4d %11s %11s %11s %11s %9.1f %10.1f %7llu", c.pid, cmd.c_str(), c.gpu,
           human(c.leased_bytes).c_str(), human(c.fair_share).c_str(), human(c.last.resident_bytes).c_str(),
           human(c.last.evicted_bytes).c_str(), static_cast<double>(c.last.step_ns) / 1e6,
           static_cast<double>(c.last.exposed_stall_ns) / 1e6, static_cast<unsigned long long>(c.last.misses));
    if (node) {
      const proto::ClientNode* n = node->of(c.client_id);
      std::string local = "-";
      if (n && (n->local_rank >= 0 || n->local_world > 0))
        local = rank_text(n->local_rank) + "/" + (n->local_world > 0 ? std::to_string(n->local_world) : "-");
      printf(" %5s %7s  %s", rank_text(n ? n->rank : -1).c_str(), local.c_str(),
             n && n->gpu_id[0] ? n->gpu_id : "-");
    }
    printf("\n");
  }
  if (cs.empty()) printf("(no clients)\n");
  if (!complete) printf("%s\n", cut_text(cs.size()).c_str());
}

std::string json_gbps(uint64_t bps) {
  char s[40];
  snprintf(s, sizeof s, "%.10g", static_cast<double>(bps) / 1e9);
  return s;
}

void print_json(const proto::StatusHead& h, const std::vector<proto::ClientStatus>& cs, const NodeView* node,
                bool complete) {
  printf("{\"version\":1,\"daemon_pid\":%u,\"pool_bytes\":%llu,\"used_bytes\":%llu,\"free_bytes\":%llu,\"clients\":[",
         h.daemon_pid, static_cast<unsigned long long>(h.pool_bytes), static_cast<unsigned long long>(h.used_bytes),
         static_cast<unsigned long long>(h.free_bytes));
  for (size_t i = 0; i < cs.size(); ++i) {
    const proto::ClientStatus& c = cs[i];
    printf("%s{\"pid\":%u,\"client_id\":%u,\"command\":%s,\"gpu\":%d,\"connected\":%s,\"leased_bytes\":%llu,"
           "\"fair_share_bytes\":%llu,\"resident_bytes\":%llu,\"evicted_bytes\":%llu,\"step\":%llu,\"step_ns\":%llu,"
           "\"exposed_stall_ns\":%llu,\"misses\":%llu,\"launches\":%llu",
           i ? "," : "", c.pid, c.client_id, json_str(c.command).c_str(), c.gpu, c.connected ? "true" : "false",
           static_cast<unsigned long long>(c.leased_bytes), static_cast<unsigned long long>(c.fair_share),
           static_cast<unsigned long long>(c.last.resident_bytes), static_cast<unsigned long long>(c.last.evicted_bytes),
           static_cast<unsigned long long>(c.last.step), static_cast<unsigned long long>(c.last.step_ns),
           static_cast<unsigned long long>(c.last.exposed_stall_ns), static_cast<unsigned long long>(c.last.misses),
           static_cast<unsigned long long>(c.last.launches));
    if (node) {
      // Present once the daemon has a node (protocol 1.1); -1 / 0 / "" until the client attached.
      const proto::ClientNode* n = node->of(c.client_id);
      proto::ClientNode none{};
      none.rank = none.local_rank = -1;
      if (!n) n = &none;
      printf(",\"rank\":%d,\"local_rank\":%d,\"local_world\":%d,\"gpu_id\":%s,\"device_budget\":%llu", n->rank,
             n->local_rank, n->local_world, json_str(n->gpu_id).c_str(),
             static_cast<unsigned long long>(n->device_budget));
    }
    printf("}");
  }
  // false: an older offloadd listed one full page only, and there may be more clients.
  printf("],\"clients_complete\":%s", complete ? "true" : "false");
  if (node) {
    const proto::NodeLink& l = node->head.link;
    printf(",\"node\":{\"gpus\":%u,\"link\":{\"h2d_gbps\":%s,\"d2h_gbps\":%s,\"both_gbps\":%s}}", node->head.gpus,
           json_gbps(l.h2d_bps).c_str(), json_gbps(l.d2h_bps).c_str(), json_gbps(l.both_bps).c_str());
  }
  printf("}\n");
}

}  // namespace

int cmd_status(const std::string& socket, bool json, double watch_s) {
  DaemonClient c;
  if (!connect(&c, socket)) return 1;
  bool ask_node = true;  // until the daemon shows it has no node to tell of
  bool first = true;
  for (;;) {
    proto::StatusHead h{};
    std::vector<proto::ClientStatus> cs;
    std::string why;
    bool complete = true;
    if (!c.status(&h, &cs, &why, &complete)) {
      fprintf(stderr, "offloadctl: %s\n", why.c_str());
      return 1;
    }
    // An older daemon (protocol 1.0) has no NodeQuery: node() then refuses without asking.
    std::optional<NodeView> node;
    if (ask_node) {
      proto::NodeHead nh{};
      std::vector<proto::ClientNode> ns;
      if (c.node(&nh, &ns, &why)) {
        node.emplace();
        node->head = nh;
        for (const proto::ClientNode& n : ns) node->by_client[n.client_id] = n;
      } else if (!c.connected()) {
        fprintf(stderr, "offloadctl: %s\n", why.c_str());
        return 1;
      } else {
        ask_node = false;
      }
    }
    const NodeView* nv = node ? &*node : nullptr;
    // A terminal is cleared between refreshes; a pipe or a file gets the tables one after
    // another, a blank line apart, with no terminal codes in them.
    if (watch_s > 0 && !json) printf(isatty(STDOUT_FILENO) ? "\033[H\033[2J" : (first ? "" : "\n"));
    first = false;
    json ? print_json(h, cs, nv, complete) : print_table(h, cs, nv, complete);
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

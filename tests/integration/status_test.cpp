// What people and scrapers see: offloadctl status (table and --json) and the Prometheus
// endpoint, end to end from a live client; who may connect; offloadctl stop.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "fake_daemon.h"
#include "it_support.h"
#include "json_mini.h"
#include "offload/text.h"

namespace offload::it {
namespace {

std::string http_get(uint16_t port, const std::string& path, std::string* why) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_port = htons(port);
  in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&in), sizeof in) != 0) {
    *why = std::string("connect: ") + strerror(errno);
    ::close(fd);
    return {};
  }
  std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  send_bytes(fd, req.data(), req.size());
  std::string resp;
  int64_t end = now_ms() + 10000;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    int left = static_cast<int>(end - now_ms());
    if (left <= 0 || ::poll(&p, 1, left) <= 0) {
      *why = "timeout";
      break;
    }
    char b[4096];
    ssize_t n = ::recv(fd, b, sizeof b, 0);
    if (n <= 0) break;
    resp.append(b, static_cast<size_t>(n));
  }
  ::close(fd);
  return resp;
}

// The line of `text` that starts with `prefix` and contains every one of `parts`.
std::string find_line(const std::string& text, const std::string& prefix, const std::vector<std::string>& parts) {
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    if (l.rfind(prefix, 0) != 0) continue;
    bool all = true;
    for (auto& p : parts) all &= l.find(p) != std::string::npos;
    if (all) return l;
  }
  return {};
}

TEST(StatusIntegration, OffloadctlAndMetricsShowALiveClient) {
  Daemon d;
  std::string why;
  // This one faults its pool in at start (the default): the other tests pass --no-prefault.
  ASSERT_TRUE(d.start({"--metrics-port", "0", "--pool-size", "256MiB"}, &why)) << why;
  Proc c;
  ASSERT_TRUE(d.client(&c, &why, "it-client", 3)) << why;
  ASSERT_EQ(c.cmd("connect"), "ok");
  auto w = split(c.cmd("register"));
  ASSERT_TRUE(w.size() == 5 && w[0] == "ok");
  const std::string id = w[1];
  ASSERT_EQ(c.cmd("telemetry 7 123000000 2 " + std::to_string(5 * MiB) + " " + std::to_string(3 * MiB)), "ok");
  w = split(c.cmd("lease " + std::to_string(10 * MiB)));  // after the telemetry, on the same stream
  ASSERT_TRUE(w.size() == 3 && w[0] == "ok");
  const std::string pid = std::to_string(c.pid());

  // --json, parsed.
  RunResult r = d.offloadctl({"status", "--json", "--socket", d.socket()});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  testing::Json j;
  std::string err;
  ASSERT_TRUE(testing::parse_json(r.out, &j, &err)) << err << "\n" << r.out;
  EXPECT_EQ(j["version"].num, 1);
  EXPECT_EQ(static_cast<pid_t>(j["daemon_pid"].num), d.pid());
  EXPECT_EQ(j["pool_bytes"].text, std::to_string(256 * MiB));
  EXPECT_EQ(j["used_bytes"].text, std::to_string(10 * MiB));
  EXPECT_EQ(j["free_bytes"].text, std::to_string(246 * MiB));
  ASSERT_EQ(j["clients"].items.size(), 1u) << r.out;
  const testing::Json& cl = j["clients"].items[0];
  EXPECT_EQ(cl["pid"].text, pid);
  EXPECT_EQ(cl["client_id"].text, id);
  EXPECT_EQ(cl["command"].text, "it-client");
  EXPECT_EQ(cl["gpu"].text, "3");
  EXPECT_TRUE(cl["connected"].b);
  EXPECT_EQ(cl["leased_bytes"].text, std::to_string(10 * MiB));
  EXPECT_EQ(cl["fair_share_bytes"].text, std::to_string(256 * MiB));
  EXPECT_EQ(cl["step"].text, "7");
  EXPECT_EQ(cl["step_ns"].text, "123000000");
  EXPECT_EQ(cl["misses"].text, "2");
  EXPECT_EQ(cl["resident_bytes"].text, std::to_string(5 * MiB));
  EXPECT_EQ(cl["evicted_bytes"].text, std::to_string(3 * MiB));
  EXPECT_EQ(cl["exposed_stall_ns"].text, "4000000");
  EXPECT_EQ(cl["launches"].text, "99");

  // The table for people.
  r = d.offloadctl({"status", "--socket", d.socket()});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_NE(r.out.find("pool: 256.0 MiB, used 10.0 MiB, free 246.0 MiB (offloadd pid " + std::to_string(d.pid())),
            std::string::npos)
      << r.out;
  std::string row = find_line(r.out, pid + " ", {"it-client", "10.0 MiB", "5.0 MiB", "3.0 MiB", "123.0"});
  EXPECT_FALSE(row.empty()) << "no row with the client's pid, command and figures:\n" << r.out;
  EXPECT_NE(row.find(" 3 "), std::string::npos) << row;  // gpu

  // The same without --socket: the default path under XDG_RUNTIME_DIR is not where this
  // daemon listens, and OFFLOAD_SOCKET points there.
  r = run_program({OFFLOADCTL_BIN, "status", "--json"},
                  {{"XDG_RUNTIME_DIR", d.dir() + "/xdg"}, {"OFFLOAD_SOCKET", d.socket()}}, d.dir());
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_NE(r.out.find("\"pid\":" + pid), std::string::npos) << r.out;

  // Prometheus text: the port comes from the daemon's log.
  std::smatch m;
  const std::regex port_re("metrics on 127\\.0\\.0\\.1:([0-9]+)");
  std::string log;
  ASSERT_TRUE(poll_until(
      [&] {
        log = d.log();
        return std::regex_search(log, m, port_re);
      },
      5000))
      << log;
  const uint16_t port = static_cast<uint16_t>(std::stoul(m[1].str()));
  ASSERT_GT(port, 0);
  std::string resp = http_get(port, "/metrics", &why);
  ASSERT_EQ(resp.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << why << "\n" << resp;
  EXPECT_NE(resp.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << resp;
  size_t body_at = resp.find("\r\n\r\n");
  ASSERT_NE(body_at, std::string::npos);
  std::string body = resp.substr(body_at + 4);
  EXPECT_FALSE(find_line(body, "offload_pool_bytes " + std::to_string(256 * MiB), {}).empty()) << body;
  EXPECT_FALSE(find_line(body, "offload_pool_used_bytes " + std::to_string(10 * MiB), {}).empty()) << body;
  EXPECT_FALSE(find_line(body, "offload_clients 1", {}).empty()) << body;
  EXPECT_FALSE(find_line(body, "offload_node_gpus 0", {}).empty()) << "registered, not attached: " << body;
  const std::string labels =
      "{client=\"" + id + "\",pid=\"" + pid + "\",gpu=\"3\",gpu_id=\"\",rank=\"\",command=\"it-client\"}";
  EXPECT_FALSE(find_line(body, "offload_client_leased_bytes" + labels + " " + std::to_string(10 * MiB), {}).empty())
      << body;
  EXPECT_FALSE(find_line(body, "offload_client_misses_total" + labels + " 2", {}).empty()) << body;
  EXPECT_FALSE(find_line(body, "offload_client_step_seconds" + labels + " 0.123", {}).empty()) << body;
  EXPECT_FALSE(find_line(body, "# TYPE offload_client_misses_total counter", {}).empty()) << body;
  // Every sample line is "name{labels} value" or "name value" with a number.
  std::istringstream in(body);
  const std::regex sample(R"(^[a-z_]+(\{[^}]*\})? [0-9.e+-]+$)");
  for (std::string l; std::getline(in, l);) {
    if (!l.empty() && l[0] != '#') {
      EXPECT_TRUE(std::regex_match(l, sample)) << "not a sample: '" << l << "'";
    }
  }

  // Any path serves the metrics; the daemon keeps serving clients meanwhile.
  EXPECT_NE(http_get(port, "/", &why).find("offload_pool_bytes"), std::string::npos);
  EXPECT_EQ(c.cmd("status").rfind("ok ", 0), 0u);
  EXPECT_TRUE(exited_with(d.stop(), 0)) << d.log();
}

// Two ranks of a job, attached on two GPUs, and a third process that never attached.
TEST(StatusIntegration, OffloadctlAndMetricsShowRanksAndGpusOfAttachedClients) {
  Daemon d;
  std::string why;
  ASSERT_TRUE(d.start({"--metrics-port", "0", "--node-link", "110.2,108.5,190"}, &why)) << why;
  Proc r0, r1, other;
  ASSERT_TRUE(d.client(&r0, &why, "train-r0", -1)) << why;
  ASSERT_TRUE(d.client(&r1, &why, "train-r1", -1)) << why;
  ASSERT_TRUE(d.client(&other, &why, "loner", 6)) << why;
  for (Proc* p : {&r0, &r1, &other}) {
    ASSERT_EQ(p->cmd("connect"), "ok");
    ASSERT_EQ(p->cmd("register").rfind("ok ", 0), 0u);
  }
  ASSERT_EQ(r0.cmd("attach 0 0000:1b:00.0 0 0 2 " + std::to_string(40 * MiB)).rfind("ok 2 ", 0), 0u);
  ASSERT_EQ(r1.cmd("attach 1 0000:2c:00.0 1 1 2 " + std::to_string(48 * MiB)).rfind("ok 2 ", 0), 0u);
  const std::string p0 = std::to_string(r0.pid()), p1 = std::to_string(r1.pid()), po = std::to_string(other.pid());

  RunResult r = d.offloadctl({"status", "--json", "--socket", d.socket()});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  testing::Json j;
  std::string err;
  ASSERT_TRUE(testing::parse_json(r.out, &j, &err)) << err << "\n" << r.out;
  ASSERT_TRUE(j.has("node")) << r.out;
  EXPECT_EQ(j["node"]["gpus"].text, "2");
  EXPECT_EQ(j["node"]["link"]["h2d_gbps"].text, "110.2");
  EXPECT_EQ(j["node"]["link"]["d2h_gbps"].text, "108.5");
  EXPECT_EQ(j["node"]["link"]["both_gbps"].text, "190");
  ASSERT_EQ(j["clients"].items.size(), 3u) << r.out;
  std::map<std::string, const testing::Json*> by_pid;
  for (auto& c : j["clients"].items) by_pid[c["pid"].text] = &c;
  ASSERT_TRUE(by_pid.count(p0) && by_pid.count(p1) && by_pid.count(po)) << r.out;
  const testing::Json& c0 = *by_pid[p0];
  const testing::Json& c1 = *by_pid[p1];
  const testing::Json& co = *by_pid[po];
  EXPECT_EQ(c0["rank"].text, "0");
  EXPECT_EQ(c0["local_rank"].text, "0");
  EXPECT_EQ(c0["local_world"].text, "2");
  EXPECT_EQ(c0["gpu_id"].text, "0000:1b:00.0");
  EXPECT_EQ(c0["gpu"].text, "0") << "the attached GPU (Register said -1)";
  EXPECT_EQ(c0["device_budget"].text, std::to_string(40 * MiB));
  EXPECT_EQ(c1["rank"].text, "1");
  EXPECT_EQ(c1["local_rank"].text, "1");
  EXPECT_EQ(c1["gpu_id"].text, "0000:2c:00.0");
  EXPECT_EQ(c1["gpu"].text, "1");
  EXPECT_EQ(c1["device_budget"].text, std::to_string(48 * MiB));
  EXPECT_EQ(co["rank"].text, "-1");
  EXPECT_EQ(co["local_world"].text, "0");
  EXPECT_EQ(co["gpu_id"].text, "");
  EXPECT_EQ(co["gpu"].text, "6");
  // The keys scripts already read are all still there.
  for (const char* k : {"pid", "client_id", "command", "gpu", "connected", "leased_bytes", "fair_share_bytes",
                        "resident_bytes", "evicted_bytes", "step", "step_ns", "exposed_stall_ns", "misses", "launches"})
    EXPECT_TRUE(c0.has(k)) << k;
  for (const char* k : {"version", "daemon_pid", "pool_bytes", "used_bytes", "free_bytes"}) EXPECT_TRUE(j.has(k)) << k;

  r = d.offloadctl({"status", "--socket", d.socket()});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_NE(r.out.find("node: 2 GPUs share the host link; host link 110.2 GB/s H2D, 108.5 GB/s D2H, 190.0 GB/s "
                       "both ways"),
            std::string::npos)
      << r.out;
  EXPECT_NE(find_line(r.out, "pid ", {"rank", "local", "gpu id"}), "") << r.out;
  std::string row0 = find_line(r.out, p0 + " ", {"train-r0", " 0/2 ", "0000:1b:00.0"});
  std::string row1 = find_line(r.out, p1 + " ", {"train-r1", " 1/2 ", "0000:2c:00.0"});
  std::string rowo = find_line(r.out, po + " ", {"loner"});
  EXPECT_FALSE(row0.empty()) << r.out;
  EXPECT_FALSE(row1.empty()) << r.out;
  ASSERT_FALSE(rowo.empty()) << r.out;
  // rank, local and gpu id are the last three columns.
  auto last3 = [](const std::string& row) {
    auto w = split(row);
    return w.size() >= 3 ? w[w.size() - 3] + " " + w[w.size() - 2] + " " + w[w.size() - 1] : std::string();
  };
  EXPECT_EQ(last3(row0), "0 0/2 0000:1b:00.0") << row0;
  EXPECT_EQ(last3(row1), "1 1/2 0000:2c:00.0") << row1;
  EXPECT_EQ(last3(rowo), "- - -") << rowo;

  std::smatch m;
  const std::regex port_re("metrics on 127\\.0\\.0\\.1:([0-9]+)");
  std::string log = d.log();
  ASSERT_TRUE(std::regex_search(log, m, port_re)) << log;
  std::string resp = http_get(static_cast<uint16_t>(std::stoul(m[1].str())), "/metrics", &why);
  EXPECT_FALSE(find_line(resp, "offload_node_gpus 2", {}).empty()) << resp;
  EXPECT_FALSE(find_line(resp, "offload_client_leased_bytes{", {"pid=\"" + p1 + "\"", "gpu=\"1\"",
                                                                "gpu_id=\"0000:2c:00.0\"", "rank=\"1\""})
                   .empty())
      << resp;
  EXPECT_FALSE(find_line(resp, "offload_client_leased_bytes{", {"pid=\"" + po + "\"", "gpu_id=\"\"", "rank=\"\""})
                   .empty())
      << resp;

  // A rank that goes away leaves the hint: still 2 (the job has two).
  r1.kill_and_reap();
  ASSERT_TRUE(poll_until(
      [&] {
        RunResult x = d.offloadctl({"status", "--json", "--socket", d.socket()});
        return x.out.find("\"pid\":" + p1 + ",") == std::string::npos;
      },
      5000));
  r = d.offloadctl({"status", "--json", "--socket", d.socket()});
  j = testing::Json{};
  ASSERT_TRUE(testing::parse_json(r.out, &j, &err)) << err << "\n" << r.out;
  EXPECT_EQ(j["node"]["gpus"].text, "2");
  EXPECT_EQ(j["clients"].items.size(), 2u) << r.out;
  EXPECT_TRUE(exited_with(d.stop(), 0)) << d.log();
}

// offloadctl against a daemon of protocol 1.0 (no NodeQuery: it is not even sent, a 1.0
// daemon would drop the connection) and one that refuses it: the status without the node.
TEST(StatusIntegration, OffloadctlShowsAnOlderDaemonsStatusWithoutTheNode) {
  for (auto mode : {FakeDaemon::Mode::Minor0, FakeDaemon::Mode::RefusesNode}) {
    SCOPED_TRACE(mode == FakeDaemon::Mode::Minor0 ? "1.0" : "refuses NodeQuery");
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    FakeDaemon fake;
    std::string why;
    ASSERT_TRUE(fake.start(dir.path() + "/fake.sock", mode, &why)) << why;
    std::map<std::string, std::string> env = {{"XDG_RUNTIME_DIR", dir.path()}, {"OFFLOAD_SOCKET", ""}};
    RunResult r = run_program({OFFLOADCTL_BIN, "status", "--socket", fake.socket()}, env, dir.path());
    EXPECT_EQ(r.exit_code(), 0) << r.err;
    EXPECT_TRUE(r.err.empty()) << r.err;
    EXPECT_NE(r.out.find("pool: 64.0 MiB"), std::string::npos) << r.out;
    EXPECT_FALSE(find_line(r.out, "4242 ", {"fake-client"}).empty()) << r.out;
    EXPECT_EQ(r.out.find("node:"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("gpu id"), std::string::npos) << r.out;
    r = run_program({OFFLOADCTL_BIN, "status", "--json", "--socket", fake.socket()}, env, dir.path());
    EXPECT_EQ(r.exit_code(), 0) << r.err;
    testing::Json j;
    std::string err;
    ASSERT_TRUE(testing::parse_json(r.out, &j, &err)) << err << "\n" << r.out;
    EXPECT_FALSE(j.has("node")) << r.out;
    ASSERT_EQ(j["clients"].items.size(), 1u);
    EXPECT_FALSE(j["clients"].items[0].has("rank")) << r.out;
    EXPECT_EQ(j["clients"].items[0]["gpu"].text, "5");
    EXPECT_EQ(fake.count_of(proto::MsgType::StatusQuery), 2u);
    EXPECT_EQ(fake.count_of(proto::MsgType::NodeQuery), mode == FakeDaemon::Mode::Minor0 ? 0u : 2u);
  }
}

// A command line may hold newlines and tabs (python3 -c '...'): the table keeps one row a client.
TEST(StatusIntegration, ACommandWithNewlinesStaysOnOneRow) {
  Daemon d;
  std::string why;
  ASSERT_TRUE(d.start({"--no-prefault", "--pool-size", "64MiB"}, &why)) << why;
  Proc c;
  ASSERT_TRUE(d.client(&c, &why, "py\nimport\tx", 3)) << why;
  ASSERT_EQ(c.cmd("connect"), "ok");
  ASSERT_EQ(split(c.cmd("register"))[0], "ok");
  RunResult r = d.offloadctl({"status", "--socket", d.socket()});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  const std::string pid = std::to_string(c.pid());
  size_t rows = 0;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(pid, 0) != 0) continue;
    ++rows;
    EXPECT_NE(line.find("py import x"), std::string::npos) << line;
  }
  EXPECT_EQ(rows, 1u) << r.out;
  EXPECT_EQ(r.out.find("import\tx"), std::string::npos) << r.out;
}

// A command line cut inside a character by its client (a frame's command field holds 63 bytes;
// this client cuts bytes, as an older shim did) reaches the table, --json and the metrics page
// as valid UTF-8: the JSON parses, and promtool accepts the page where it is installed (CI
// installs it and sets LIBOFFLOAD_CI_PROMTOOL).
TEST(StatusIntegration, ACommandCutInsideACharacterStaysValidUtf8) {
  Daemon d;
  std::string why;
  ASSERT_TRUE(d.start({"--no-prefault", "--pool-size", "64MiB", "--metrics-port", "0"}, &why)) << why;
  std::string cmd = "python3 train.py --name ";  // 24 bytes, then 2-byte characters: byte 63 is inside one
  for (int i = 0; i < 30; ++i) cmd += "\xc3\xa9";
  Proc c;
  ASSERT_TRUE(d.client(&c, &why, cmd, 0)) << why;
  ASSERT_EQ(c.cmd("connect"), "ok");
  ASSERT_EQ(split(c.cmd("register"))[0], "ok");
  auto valid = [](const std::string& s) { return utf8_clean(s) == s; };

  RunResult r = d.offloadctl({"status", "--json", "--socket", d.socket()});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(valid(r.out)) << r.out;
  testing::Json j;
  std::string err;
  ASSERT_TRUE(testing::parse_json(r.out, &j, &err)) << err << "\n" << r.out;
  ASSERT_EQ(j["clients"].items.size(), 1u) << r.out;
  const std::string shown = j["clients"].items[0]["command"].text;
  EXPECT_EQ(shown.rfind("python3 train.py --name \xc3\xa9", 0), 0u) << shown;
  EXPECT_TRUE(valid(shown)) << shown;

  r = d.offloadctl({"status", "--socket", d.socket()});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(valid(r.out)) << r.out;

  std::smatch m;
  const std::regex port_re("metrics on 127\\.0\\.0\\.1:([0-9]+)");
  std::string log;
  ASSERT_TRUE(poll_until([&] { return std::regex_search(log = d.log(), m, port_re); }, 5000)) << log;
  std::string resp = http_get(static_cast<uint16_t>(std::stoul(m[1].str())), "/metrics", &why);
  const size_t body_at = resp.find("\r\n\r\n");
  ASSERT_NE(body_at, std::string::npos) << why << resp;
  const std::string body = resp.substr(body_at + 4);
  EXPECT_TRUE(valid(body)) << body;
  EXPECT_NE(body.find("command=\"python3 train.py --name \xc3\xa9"), std::string::npos) << body;

  const std::map<std::string, std::string> path = {{"PATH", getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin"}};
  const bool have = run_program({"/bin/sh", "-c", "command -v promtool"}, path, d.dir()).exit_code() == 0;
  if (!have) {
    EXPECT_EQ(getenv("LIBOFFLOAD_CI_PROMTOOL"), nullptr) << "promtool is required here and not installed";
    return;
  }
  const std::string page = d.dir() + "/metrics.txt";
  {
    std::ofstream f(page, std::ios::binary);
    f << body;
  }
  r = run_program({"/bin/sh", "-c", "promtool check metrics < " + page}, path, d.dir());
  EXPECT_EQ(r.exit_code(), 0) << r.out << r.err;
}

// More clients than one reply holds (256): offloadctl lists them all, table and --json,
// asking for them page by page.
TEST(StatusIntegration, MoreClientsThanOneReplyHoldsAreAllListed) {
  Daemon d;
  std::string why;
  ASSERT_TRUE(d.start({"--no-prefault", "--pool-size", "64MiB"}, &why)) << why;
  constexpr size_t kClients = 300;
  std::vector<DaemonClient> cs(kClients);
  for (size_t i = 0; i < kClients; ++i) {
    ASSERT_TRUE(cs[i].connect(d.socket(), &why)) << why;
    proto::Register r{};
    r.pid = static_cast<uint32_t>(getpid());
    std::snprintf(r.command, sizeof r.command, "many-%zu", i);
    ASSERT_TRUE(cs[i].register_client(r, &why).has_value()) << i << ": " << why;
  }
  StatusView s;
  ASSERT_TRUE(d.status(&s, &why)) << why;
  EXPECT_EQ(s.clients.size(), kClients);
  DaemonClient c;
  ASSERT_TRUE(c.connect(d.socket(), &why)) << why;
  proto::NodeHead nh{};
  std::vector<proto::ClientNode> ns;
  ASSERT_TRUE(c.node(&nh, &ns, &why)) << why;
  EXPECT_EQ(ns.size(), kClients);

  RunResult r = d.offloadctl({"status", "--json", "--socket", d.socket()});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  testing::Json j;
  std::string err;
  ASSERT_TRUE(testing::parse_json(r.out, &j, &err)) << err;
  EXPECT_EQ(j["clients"].items.size(), kClients);
  EXPECT_TRUE(j["clients_complete"].b) << r.out.substr(r.out.size() - 200);
  r = d.offloadctl({"status", "--socket", d.socket()});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_NE(r.out.find("many-299 "), std::string::npos);
  EXPECT_EQ(r.out.find("only the first"), std::string::npos);
}

TEST(StatusIntegration, OffloadctlStopStopsTheDaemon) {
  Daemon d;
  std::string why;
  ASSERT_TRUE(d.start({}, &why)) << why;
  RunResult r = d.offloadctl({"stop", "--socket", d.socket()});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_NE(r.out.find("offloadd stopping"), std::string::npos) << r.out;
  EXPECT_TRUE(exited_with(d.proc().wait(10000), 0)) << d.log();
  EXPECT_NE(access(d.socket().c_str(), F_OK), 0) << "the socket file outlived the daemon";
  EXPECT_NE(access(("/dev/shm/" + d.segment()).c_str(), F_OK), 0) << "an empty pool outlived the daemon";

  // With a lease held, the segment (and the client's data) outlives a stopped daemon.
  ASSERT_TRUE(d.start({}, &why)) << why;
  Proc c;
  ASSERT_TRUE(d.client(&c, &why)) << why;
  ASSERT_EQ(c.cmd("connect"), "ok");
  ASSERT_EQ(c.cmd("register").rfind("ok ", 0), 0u);
  ASSERT_EQ(c.cmd("map").rfind("ok ", 0), 0u);
  auto w = split(c.cmd("lease " + std::to_string(MiB)));
  ASSERT_TRUE(w.size() == 3 && w[0] == "ok");
  ASSERT_EQ(c.cmd("fill " + w[1] + " " + w[2] + " 77"), "ok");
  r = d.offloadctl({"stop", "--socket", d.socket()});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(exited_with(d.proc().wait(10000), 0)) << d.log();
  EXPECT_EQ(access(("/dev/shm/" + d.segment()).c_str(), F_OK), 0);
  EXPECT_EQ(c.cmd("check " + w[1] + " " + w[2] + " 77"), "ok");
}

// A process of another uid must not get in: not with a socket it may open (the daemon
// refuses it by SO_PEERCRED), and not at all with the default socket mode.
TEST(StatusIntegration, AnotherUserIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a client as uid 65534 (nobody); CI runs as root";
  constexpr const char* kNobody = "65534";
  {
    Daemon d;
    std::string why;
    // The socket directory: the other uid may traverse it, not list or write it.
    ASSERT_EQ(chmod(d.dir().c_str(), 0711), 0);
    ASSERT_TRUE(d.start({"--socket-mode", "0666"}, &why)) << why;
    struct stat st;
    ASSERT_EQ(stat(d.socket().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0666u);
    Proc other;
    ASSERT_TRUE(d.client(&other, &why, "intruder", 0, {"--drop-uid", kNobody})) << why;
    std::string raw = other.cmd("raw-register");
    EXPECT_TRUE(raw == "error " + std::to_string(static_cast<uint32_t>(proto::Status::Refused)) || raw == "closed")
        << "a client of uid 65534 got: " << raw;
    // Through the client library too.
    std::string conn = other.cmd("connect");
    if (conn == "ok") {
      std::string reg = other.cmd("register");
      EXPECT_EQ(reg.rfind("err ", 0), 0u) << reg;
    }
    EXPECT_NE(d.log().find("refused a connection from uid 65534"), std::string::npos) << d.log();
    StatusView s;
    ASSERT_TRUE(d.status(&s, &why)) << why;
    EXPECT_TRUE(s.clients.empty());
    // The owner still gets in.
    Proc mine;
    ASSERT_TRUE(d.client(&mine, &why)) << why;
    ASSERT_EQ(mine.cmd("connect"), "ok");
    EXPECT_EQ(mine.cmd("register").rfind("ok ", 0), 0u);
    EXPECT_TRUE(exited_with(d.stop(), 0)) << d.log();
  }
  {
    Daemon d;
    std::string why;
    ASSERT_EQ(chmod(d.dir().c_str(), 0711), 0);
    ASSERT_TRUE(d.start({}, &why)) << why;
    struct stat st;
    ASSERT_EQ(stat(d.socket().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    Proc other;
    ASSERT_TRUE(d.client(&other, &why, "intruder", 0, {"--drop-uid", kNobody})) << why;
    EXPECT_EQ(other.cmd("raw-register"), "connect-failed EACCES");
    EXPECT_TRUE(exited_with(d.stop(), 0)) << d.log();
  }
}

// status --watch into a pipe or a file: the tables one after another, and no terminal codes
// (clearing the screen is for a terminal).
TEST(StatusIntegration, WatchIntoAFileWritesNoTerminalCodes) {
  Daemon d;
  std::string why;
  ASSERT_TRUE(d.start({"--no-prefault", "--pool-size", "64MiB"}, &why)) << why;
  const std::string out = d.dir() + "/watch.txt";
  Proc w;
  Proc::Options o;
  o.argv = {OFFLOADCTL_BIN, "status", "--watch", "0.1", "--socket", d.socket()};
  o.env = d.env();
  o.stdout_file = out;
  o.stderr_file = d.dir() + "/watch.err";
  ASSERT_TRUE(w.start(o, &why)) << why;
  auto tables = [&] {
    std::ifstream is(out);
    std::stringstream ss;
    ss << is.rdbuf();
    return ss.str();
  };
  auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
    return n;
  };
  EXPECT_TRUE(poll_until([&] { return count(tables(), "pool: ") >= 3; }, 10000)) << tables() << read_file(d.dir() + "/watch.err");
  w.kill_and_wait(SIGTERM);
  const std::string text = tables();
  EXPECT_EQ(text.find('\033'), std::string::npos) << "terminal codes in a file";
  EXPECT_GE(count(text, "\n\npool: "), 2u) << "refreshes a blank line apart:\n" << text;
}

}  // namespace
}  // namespace offload::it

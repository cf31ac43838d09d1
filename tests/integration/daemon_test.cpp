// offloadd with real processes: the daemon binary, clients (offload_it_client) that lease,
// write and check patterns in the shared segment, and kill -9 of either side.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <numeric>

#include "common/ipc.h"
#include "offload/pool_layout.h"
#include "it_support.h"
#include "json_mini.h"

namespace offload::it {
namespace {

constexpr auto kPoolFull = static_cast<uint32_t>(proto::Status::PoolFull);
constexpr auto kOverLimit = static_cast<uint32_t>(proto::Status::OverLimit);

// Words of an answer that must start with "ok".
#define ASSERT_OK_ANSWER(answer, words)                                                      \
  do {                                                                                       \
    std::string a_ = (answer);                                                               \
    words = split(a_);                                                                       \
    ASSERT_TRUE(!words.empty() && words[0] == "ok") << "client answered '" << a_ << "'";     \
  } while (0)

struct Extent {
  uint64_t off = 0, bytes = 0;
};

// connect + register (+ map): the client's id and fair share.
void attach(Proc& c, uint32_t* id, uint64_t* fair = nullptr, bool map = true, const std::string& reg = "register") {
  std::vector<std::string> w;
  ASSERT_OK_ANSWER(c.cmd("connect"), w);
  ASSERT_OK_ANSWER(c.cmd(reg), w);
  ASSERT_GE(w.size(), 5u);
  *id = static_cast<uint32_t>(std::stoul(w[1]));
  if (fair) *fair = std::stoull(w[3]);
  if (map) ASSERT_OK_ANSWER(c.cmd("map"), w);
}

void lease(Proc& c, uint64_t bytes, Extent* e) {
  std::vector<std::string> w;
  ASSERT_OK_ANSWER(c.cmd("lease " + std::to_string(bytes)), w);
  ASSERT_EQ(w.size(), 3u);
  e->off = std::stoull(w[1]);
  e->bytes = std::stoull(w[2]);
}

// Leases and writes the pattern of `tag` there.
void lease_fill(Proc& c, uint64_t bytes, uint64_t tag, Extent* e) {
  ASSERT_NO_FATAL_FAILURE(lease(c, bytes, e));
  std::vector<std::string> w;
  ASSERT_OK_ANSWER(c.cmd("fill " + std::to_string(e->off) + " " + std::to_string(e->bytes) + " " + std::to_string(tag)), w);
}

std::string check(Proc& c, const Extent& e, uint64_t tag) {
  return c.cmd("check " + std::to_string(e.off) + " " + std::to_string(e.bytes) + " " + std::to_string(tag));
}

StatusView status_of(const Daemon& d) {
  StatusView s;
  std::string why;
  EXPECT_TRUE(d.status(&s, &why)) << why;
  return s;
}

// Status: used bytes are the sum of the clients' leases and fit in the pool.
::testing::AssertionResult consistent(const StatusView& s) {
  uint64_t sum = 0;
  for (auto& c : s.clients) sum += c.leased_bytes;
  if (s.head.used_bytes > s.head.pool_bytes || s.head.used_bytes + s.head.free_bytes != s.head.pool_bytes ||
      sum != s.head.used_bytes)
    return ::testing::AssertionFailure() << "used " << s.head.used_bytes << ", free " << s.head.free_bytes << ", pool "
                                         << s.head.pool_bytes << ", sum of client leases " << sum;
  return ::testing::AssertionSuccess();
}

TEST(DaemonIntegration, ConcurrentClientsNeverShareAByte) {
  Daemon d;
  std::string why;
  ASSERT_TRUE(d.start({}, &why)) << why;
  constexpr int kClients = 4;
  std::vector<Proc> cs(kClients);
  for (int i = 0; i < kClients; ++i) {
    ASSERT_TRUE(d.client(&cs[i], &why, "stress-" + std::to_string(i))) << why;
    uint32_t id = 0;
    ASSERT_NO_FATAL_FAILURE(attach(cs[i], &id));
  }
  // All at once: each leases, checks the extent is untouched, writes its pattern, and checks
  // it before releasing, with up to 8 extents held (more than its share: refusals happen).
  for (int i = 0; i < kClients; ++i)
    ASSERT_TRUE(cs[i].send_line("stress 300 " + std::to_string(1234 + i) + " " + std::to_string(i + 1)));
  std::vector<std::string> answers(kClients);
  int snapshots = 0, done = 0;
  uint64_t peak = 0;
  int64_t deadline = now_ms() + 60000;
  while (done < kClients && now_ms() < deadline) {
    StatusView s;
    ASSERT_TRUE(d.status(&s, &why)) << why << "; log:\n" << d.log();
    ASSERT_TRUE(consistent(s)) << "snapshot " << snapshots;
    peak = std::max(peak, s.head.used_bytes);
    ++snapshots;
    for (int i = 0; i < kClients; ++i)
      if (answers[i].empty())
        if (auto l = cs[i].try_line()) answers[i] = *l, ++done;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  uint64_t leases = 0, refusals = 0;
  for (int i = 0; i < kClients; ++i) {
    auto w = split(answers[i]);
    ASSERT_TRUE(w.size() == 3 && w[0] == "ok") << "client " << i << ": '" << answers[i] << "'";
    leases += std::stoull(w[1]);
    refusals += std::stoull(w[2]);
  }
  EXPECT_GT(leases, 100u * kClients);
  EXPECT_GT(refusals, 0u) << "the clients never competed for the pool: the test proves little";
  EXPECT_GT(peak, 128 * MiB);
  // Every byte came back.
  StatusView s = status_of(d);
  EXPECT_EQ(s.head.used_bytes, 0u);
  EXPECT_EQ(s.clients.size(), static_cast<size_t>(kClients));
  for (auto& c : cs) c.close_stdin();
  for (auto& c : cs) EXPECT_TRUE(exited_with(c.wait(10000), 0));
  ASSERT_TRUE(poll_until([&] { return status_of(d).clients.empty(); }, 5000));
  EXPECT_TRUE(exited_with(d.stop(), 0)) << d.log();
  RecordProperty("status_snapshots", snapshots);
}

TEST(DaemonIntegration, KilledClientsLeasesAreFreeWithinOneSecond) {
  Daemon d;
  std::string why;
  ASSERT_TRUE(d.start({}, &why)) << why;
  Proc a, b;
  ASSERT_TRUE(d.client(&a, &why, "victim")) << why;
  ASSERT_TRUE(d.client(&b, &why, "survivor")) << why;
  uint32_t ida = 0, idb = 0;
  ASSERT_NO_FATAL_FAILURE(attach(a, &ida));
  ASSERT_NO_FATAL_FAILURE(attach(b, &idb));
  Extent ea[3], eb;
  for (int i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(lease_fill(a, 16 * MiB, 10 + i, &ea[i]));
  ASSERT_NO_FATAL_FAILURE(lease_fill(b, 16 * MiB, 20, &eb));
  StatusView s = status_of(d);
  ASSERT_EQ(s.head.used_bytes, 64 * MiB);
  ASSERT_NE(s.by_pid(a.pid()), nullptr);

  pid_t apid = a.pid();
  int64_t t0 = now_ms();
  ASSERT_EQ(::kill(apid, SIGKILL), 0);
  bool freed = poll_until([&] { return status_of(d).head.used_bytes == 16 * MiB; }, 5000);
  int64_t elapsed = now_ms() - t0;
  ASSERT_TRUE(freed) << "the killed client's 48 MiB were not freed; log:\n" << d.log();
  EXPECT_LT(elapsed, 1000) << "freeing took " << elapsed << " ms";
  RecordProperty("freed_after_ms", static_cast<int>(elapsed));
  s = status_of(d);
  EXPECT_EQ(s.by_pid(apid), nullptr) << "the killed client is still listed";
  EXPECT_TRUE(consistent(s));
  a.kill_and_reap();

  // The survivor's data is untouched, and the freed bytes can be leased again: the whole
  // pool is the survivor's now.
  EXPECT_EQ(check(b, eb, 20), "ok");
  Extent reuse, rest;
  ASSERT_NO_FATAL_FAILURE(lease_fill(b, 48 * MiB, 21, &reuse));
  EXPECT_EQ(reuse.off, ea[0].off) << "first fit reuses the killed client's extents";
  ASSERT_NO_FATAL_FAILURE(lease(b, 192 * MiB, &rest));
  EXPECT_EQ(status_of(d).head.used_bytes, 256 * MiB);
  EXPECT_EQ(check(b, eb, 20), "ok");
  EXPECT_EQ(check(b, reuse, 21), "ok");
  EXPECT_TRUE(exited_with(d.stop(), 0)) << d.log();
}

// The figures of one client in `offloadctl status --json` (nullptr if absent).
const testing::Json* json_client(const testing::Json& j, pid_t pid) {
  for (auto& c : j["clients"].items)
    if (static_cast<pid_t>(c["pid"].num) == pid) return &c;
  return nullptr;
}

void status_json(const Daemon& d, testing::Json* j) {
  RunResult r = d.offloadctl({"status", "--json", "--socket", d.socket()});
  ASSERT_EQ(r.exit_code(), 0) << describe_status(r.status) << "\nstderr: " << r.err;
  *j = testing::Json{};
  std::string err;
  ASSERT_TRUE(testing::parse_json(r.out, j, &err)) << err << "\n" << r.out;
  ASSERT_TRUE(j->has("clients")) << r.out;
}

// A lease names its process by pid and start time. Across a daemon restart, a lease whose pid
// now belongs to a process started at another time (the pid was reused) is freed, even though
// a process with that pid is alive; a lease whose pid is 0 (a client in another pid namespace,
// which the daemon cannot watch) stays, since its process may still use the bytes.
TEST(DaemonIntegration, AReadoptedLeaseNeedsItsProcessNotOnlyItsPid) {
  Daemon d;
  std::string why;
  ASSERT_TRUE(d.start({}, &why)) << why;
  Proc a, b, c;
  ASSERT_TRUE(d.client(&a, &why, "reused")) << why;
  ASSERT_TRUE(d.client(&b, &why, "elsewhere")) << why;
  ASSERT_TRUE(d.client(&c, &why, "same")) << why;
  uint32_t ida = 0, idb = 0, idc = 0;
  ASSERT_NO_FATAL_FAILURE(attach(a, &ida));
  ASSERT_NO_FATAL_FAILURE(attach(b, &idb));
  ASSERT_NO_FATAL_FAILURE(attach(c, &idc));
  Extent a1, b1, c1;
  ASSERT_NO_FATAL_FAILURE(lease_fill(a, 4 * MiB, 11, &a1));
  ASSERT_NO_FATAL_FAILURE(lease_fill(b, 8 * MiB, 12, &b1));
  ASSERT_NO_FATAL_FAILURE(lease_fill(c, 2 * MiB, 13, &c1));
  EXPECT_TRUE(WIFSIGNALED(d.proc().kill_and_wait(SIGKILL).value_or(0)));
  {  // While no daemon runs: A's slot now names a process started at another time, B's pid 0.
    SharedPoolMapping m;
    ASSERT_TRUE(m.open(d.segment(), &why)) << why;
    auto* h = reinterpret_cast<PoolHeader*>(m.base());
    auto* slots = reinterpret_cast<LeaseSlot*>(m.base() + h->table_offset);
    int seen = 0;
    for (uint32_t i = 0; i < h->max_leases; ++i) {
      if (!slots[i].used) continue;
      ++seen;
      EXPECT_NE(slots[i].pid_start, 0u) << "the daemon records the start time";
      if (slots[i].client_id == ida) slots[i].pid_start ^= 0x5a5a;
      if (slots[i].client_id == idb) slots[i].pid = 0;
    }
    EXPECT_EQ(seen, 3);
  }
  ASSERT_TRUE(d.start({}, &why)) << why;
  testing::Json j;
  ASSERT_NO_FATAL_FAILURE(status_json(d, &j));
  EXPECT_EQ(json_client(j, a.pid()), nullptr) << "a reused pid kept a dead client's lease";
  EXPECT_EQ(j["used_bytes"].num, static_cast<double>(10 * MiB)) << "B's and C's leases stay";
  EXPECT_NE(json_client(j, c.pid()), nullptr);
  EXPECT_NE(d.log().find("another pid namespace"), std::string::npos) << d.log();
  EXPECT_EQ(check(b, b1, 12), "ok");
  EXPECT_EQ(check(c, c1, 13), "ok");
  // C, the same process, re-registers with its old id and gets it back.
  std::vector<std::string> w;
  ASSERT_OK_ANSWER(c.cmd("connect"), w);
  ASSERT_OK_ANSWER(c.cmd("register " + std::to_string(idc)), w);
  EXPECT_EQ(std::stoul(w[1]), idc);
  EXPECT_TRUE(exited_with(d.stop(), 0)) << d.log();
}

TEST(DaemonIntegration, KilledDaemonLeavesDataIntactAndANewOneReadoptsIt) {
  Daemon d;
  std::string why;
  ASSERT_TRUE(d.start({}, &why)) << why;
  Proc a, b, c;
  ASSERT_TRUE(d.client(&a, &why, "keeper-a")) << why;
  ASSERT_TRUE(d.client(&b, &why, "keeper-b")) << why;
  ASSERT_TRUE(d.client(&c, &why, "dies-meanwhile")) << why;
  uint32_t ida = 0, idb = 0, idc = 0;
  ASSERT_NO_FATAL_FAILURE(attach(a, &ida));
  ASSERT_NO_FATAL_FAILURE(attach(b, &idb));
  ASSERT_NO_FATAL_FAILURE(attach(c, &idc));
  Extent a1, a2, b1, c1;
  ASSERT_NO_FATAL_FAILURE(lease_fill(a, 16 * MiB, 101, &a1));
  ASSERT_NO_FATAL_FAILURE(lease_fill(a, 20 * MiB, 102, &a2));
  ASSERT_NO_FATAL_FAILURE(lease_fill(b, 8 * MiB, 201, &b1));
  ASSERT_NO_FATAL_FAILURE(lease_fill(c, 4 * MiB, 301, &c1));
  pid_t old_daemon = d.pid();

  EXPECT_TRUE(WIFSIGNALED(d.proc().kill_and_wait(SIGKILL).value_or(0)));
  // The clients keep their mappings: their data is intact without the daemon.
  EXPECT_EQ(check(a, a1, 101), "ok");
  EXPECT_EQ(check(a, a2, 102), "ok");
  EXPECT_EQ(check(b, b1, 201), "ok");
  EXPECT_EQ(check(c, c1, 301), "ok");
  pid_t cpid = c.pid();
  c.kill_and_reap();  // gone while no daemon ran: its lease must not survive adoption

  ASSERT_TRUE(d.start({}, &why)) << why;
  ASSERT_NE(d.pid(), old_daemon);
  testing::Json j;
  ASSERT_NO_FATAL_FAILURE(status_json(d, &j));
  EXPECT_EQ(j["used_bytes"].num, static_cast<double>(44 * MiB));
  EXPECT_EQ(j["pool_bytes"].num, static_cast<double>(256 * MiB));
  EXPECT_EQ(static_cast<pid_t>(j["daemon_pid"].num), d.pid());
  const testing::Json* ja = json_client(j, a.pid());
  const testing::Json* jb = json_client(j, b.pid());
  ASSERT_NE(ja, nullptr) << "client A (pid " << a.pid() << ") not re-adopted; log:\n" << d.log();
  ASSERT_NE(jb, nullptr) << "client B (pid " << b.pid() << ") not re-adopted";
  EXPECT_EQ(json_client(j, cpid), nullptr) << "the dead client's lease was adopted";
  EXPECT_EQ((*ja)["leased_bytes"].num, static_cast<double>(36 * MiB));
  EXPECT_EQ((*jb)["leased_bytes"].num, static_cast<double>(8 * MiB));
  EXPECT_EQ((*ja)["client_id"].num, ida);
  EXPECT_EQ((*jb)["client_id"].num, idb);
  EXPECT_FALSE((*ja)["connected"].b);
  EXPECT_FALSE((*jb)["connected"].b);

  {  // The segment says who adopted it.
    SharedPoolMapping m;
    ASSERT_TRUE(m.open(d.segment(), &why)) << why;
    auto* h = reinterpret_cast<const PoolHeader*>(m.base());
    EXPECT_EQ(h->generation, 2u);
    EXPECT_EQ(h->owner_pid, static_cast<uint32_t>(d.pid()));
  }

  // A re-registers from the same pid with its old id: it gets that id and its leases back.
  std::vector<std::string> w;
  ASSERT_OK_ANSWER(a.cmd("connect"), w);
  ASSERT_OK_ANSWER(a.cmd("register " + std::to_string(ida)), w);
  EXPECT_EQ(std::stoul(w[1]), ida);
  // Another process claiming B's id does not get it (nor B's leases).
  Proc impostor;
  ASSERT_TRUE(d.client(&impostor, &why, "impostor")) << why;
  uint32_t idi = 0;
  ASSERT_NO_FATAL_FAILURE(attach(impostor, &idi, nullptr, false, "register " + std::to_string(idb)));
  EXPECT_NE(idi, idb);
  EXPECT_NE(idi, ida);

  ASSERT_NO_FATAL_FAILURE(status_json(d, &j));
  ja = json_client(j, a.pid());
  jb = json_client(j, b.pid());
  const testing::Json* ji = json_client(j, impostor.pid());
  ASSERT_TRUE(ja && jb && ji);
  EXPECT_TRUE((*ja)["connected"].b);
  EXPECT_EQ((*ja)["client_id"].num, ida);
  EXPECT_EQ((*ja)["leased_bytes"].num, static_cast<double>(36 * MiB));
  EXPECT_EQ((*ja)["command"].text, "keeper-a");
  EXPECT_FALSE((*jb)["connected"].b);
  EXPECT_EQ((*jb)["leased_bytes"].num, static_cast<double>(8 * MiB));
  EXPECT_EQ((*ji)["leased_bytes"].num, 0.0);

  // A owns its old extents under the new daemon: it can release one, and its data is intact.
  EXPECT_EQ(check(a, a1, 101), "ok");
  EXPECT_EQ(check(a, a2, 102), "ok");
  EXPECT_EQ(a.cmd("release " + std::to_string(a2.off) + " " + std::to_string(a2.bytes)), "ok");
  EXPECT_EQ(status_of(d).head.used_bytes, 24 * MiB);
  // The impostor cannot release B's extent.
  EXPECT_EQ(impostor.cmd("release " + std::to_string(b1.off) + " " + std::to_string(b1.bytes)),
            "refused " + std::to_string(static_cast<uint32_t>(proto::Status::UnknownLease)));

  // B never re-registers and exits: the new daemon notices (no connection to hang up).
  pid_t bpid = b.pid();
  b.close_stdin();
  EXPECT_TRUE(exited_with(b.wait(10000), 0));
  EXPECT_TRUE(poll_until([&] { return status_of(d).head.used_bytes == 16 * MiB; }, 3000))
      << "B's adopted lease was not freed after B exited";
  EXPECT_EQ(status_of(d).by_pid(bpid), nullptr);
  EXPECT_EQ(check(a, a1, 101), "ok");
  EXPECT_TRUE(exited_with(d.stop(), 0)) << d.log();
}

TEST(DaemonIntegration, FullPoolIsACleanRefusal) {
  Daemon d;
  std::string why;
  ASSERT_TRUE(d.start({}, &why)) << why;
  Proc a;
  ASSERT_TRUE(d.client(&a, &why)) << why;
  uint32_t id = 0;
  uint64_t fair = 0;
  ASSERT_NO_FATAL_FAILURE(attach(a, &id, &fair));
  EXPECT_EQ(fair, 256 * MiB);
  Extent e1, e2;
  ASSERT_NO_FATAL_FAILURE(lease(a, 200 * MiB, &e1));
  EXPECT_EQ(a.cmd("lease " + std::to_string(100 * MiB)), "refused " + std::to_string(kPoolFull));
  ASSERT_NO_FATAL_FAILURE(lease(a, 56 * MiB, &e2));  // exactly what is left
  EXPECT_EQ(a.cmd("lease 1"), "refused " + std::to_string(kPoolFull));
  EXPECT_EQ(a.cmd("lease 0"), "refused " + std::to_string(static_cast<uint32_t>(proto::Status::BadRequest)));
  std::string huge = a.cmd("lease 18446744073709551615");
  EXPECT_EQ(huge.rfind("refused ", 0), 0u) << huge;
  EXPECT_EQ(a.cmd("release 12345 65536"),
            "refused " + std::to_string(static_cast<uint32_t>(proto::Status::UnknownLease)));
  // Still connected, still registered: the refusals were answers, not errors.
  std::vector<std::string> w;
  ASSERT_OK_ANSWER(a.cmd("status"), w);
  EXPECT_EQ(w[1], std::to_string(256 * MiB));
  EXPECT_EQ(a.cmd("release " + std::to_string(e2.off) + " " + std::to_string(e2.bytes)), "ok");
  ASSERT_NO_FATAL_FAILURE(lease(a, 56 * MiB, &e2));
  EXPECT_TRUE(d.proc().running());
  EXPECT_TRUE(exited_with(d.stop(), 0)) << d.log();
}

TEST(DaemonIntegration, HostLimitIsOverLimit) {
  Daemon d;
  std::string why;
  ASSERT_TRUE(d.start({}, &why)) << why;
  Proc a;
  ASSERT_TRUE(d.client(&a, &why)) << why;
  uint32_t id = 0;
  ASSERT_NO_FATAL_FAILURE(attach(a, &id, nullptr, false, "register 0 " + std::to_string(32 * MiB)));
  Extent e;
  ASSERT_NO_FATAL_FAILURE(lease(a, 16 * MiB, &e));
  EXPECT_EQ(a.cmd("lease " + std::to_string(17 * MiB)), "refused " + std::to_string(kOverLimit));
  ASSERT_NO_FATAL_FAILURE(lease(a, 16 * MiB, &e));
  EXPECT_EQ(a.cmd("lease 1"), "refused " + std::to_string(kOverLimit));
  EXPECT_TRUE(exited_with(d.stop(), 0)) << d.log();
}

// Leases `chunk` at a time until refused; the bytes it got and the refusal's answer.
void lease_until_refused(Proc& c, uint64_t chunk, uint64_t* got, std::string* refusal) {
  *got = 0;
  for (int i = 0; i < 1000; ++i) {
    std::string ans = c.cmd("lease " + std::to_string(chunk));
    auto w = split(ans);
    if (w.empty() || w[0] != "ok") {
      *refusal = ans;
      return;
    }
    *got += std::stoull(w[2]);
  }
  FAIL() << "never refused";
}

TEST(DaemonIntegration, FairShareWithTwoClients) {
  Daemon d;
  std::string why;
  ASSERT_TRUE(d.start({}, &why)) << why;
  Proc a, b;
  ASSERT_TRUE(d.client(&a, &why, "greedy")) << why;
  ASSERT_TRUE(d.client(&b, &why, "modest")) << why;
  uint32_t ida = 0, idb = 0;
  uint64_t fair_b = 0;
  ASSERT_NO_FATAL_FAILURE(attach(a, &ida, nullptr, false));
  ASSERT_NO_FATAL_FAILURE(attach(b, &idb, &fair_b, false));
  EXPECT_EQ(fair_b, 128 * MiB);

  // The whole pool at once is past what B may still need.
  EXPECT_EQ(a.cmd("lease " + std::to_string(256 * MiB)), "refused " + std::to_string(kOverLimit));
  // A alone may take the pool less B's fair share, not a byte more.
  uint64_t got = 0;
  std::string refusal;
  ASSERT_NO_FATAL_FAILURE(lease_until_refused(a, 8 * MiB, &got, &refusal));
  EXPECT_EQ(got, 256 * MiB - fair_b);
  EXPECT_EQ(refusal, "refused " + std::to_string(kOverLimit));
  EXPECT_EQ(a.cmd("lease 1"), "refused " + std::to_string(kOverLimit));
  std::vector<std::string> w;
  ASSERT_OK_ANSWER(a.cmd("status"), w);  // refused, not disconnected

  // B can always reach its share, in any chunks.
  uint64_t b_got = 0;
  Extent e;
  for (uint64_t chunk : {1 * MiB, 7 * MiB, 40 * MiB, 16 * MiB, 64 * MiB}) {
    ASSERT_NO_FATAL_FAILURE(lease(b, chunk, &e));
    b_got += e.bytes;
  }
  EXPECT_EQ(b_got, fair_b);
  std::string past = b.cmd("lease 1");
  EXPECT_EQ(past.rfind("refused ", 0), 0u) << past;

  // B gives back some: A still cannot take what B may need again.
  EXPECT_EQ(b.cmd("release " + std::to_string(e.off) + " " + std::to_string(e.bytes)), "ok");
  EXPECT_EQ(a.cmd("lease " + std::to_string(8 * MiB)), "refused " + std::to_string(kOverLimit));
  ASSERT_NO_FATAL_FAILURE(lease(b, 64 * MiB, &e));

  // B leaves: its share is A's now.
  b.close_stdin();
  ASSERT_TRUE(exited_with(b.wait(10000), 0));
  ASSERT_TRUE(poll_until([&] { return status_of(d).clients.size() == 1; }, 5000));
  ASSERT_NO_FATAL_FAILURE(lease_until_refused(a, 8 * MiB, &got, &refusal));
  EXPECT_EQ(got, fair_b);
  EXPECT_EQ(refusal, "refused " + std::to_string(kPoolFull));
  EXPECT_TRUE(exited_with(d.stop(), 0)) << d.log();
}

// service.h: "every active client can always reach its fair share". With three clients
// the share of a 256 MiB pool is not a multiple of the lease granularity.
TEST(DaemonIntegration, FairShareWithThreeClientsEachCanReachIt) {
  Daemon d;
  std::string why;
  ASSERT_TRUE(d.start({}, &why)) << why;
  Proc cs[3];
  uint32_t ids[3];
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(d.client(&cs[i], &why, "third-" + std::to_string(i))) << why;
    ASSERT_NO_FATAL_FAILURE(attach(cs[i], &ids[i], nullptr, false));
  }
  StatusView s = status_of(d);
  ASSERT_EQ(s.clients.size(), 3u);
  uint64_t share = s.clients[0].fair_share;
  // A third of the pool, in whole lease units (leases are rounded up to them).
  EXPECT_EQ(share, 256 * MiB / 3 / kLeaseAlign * kLeaseAlign);
  // Each asks for exactly its fair share, in one request.
  for (int i = 0; i < 3; ++i) {
    std::string ans = cs[i].cmd("lease " + std::to_string(share));
    EXPECT_EQ(ans.rfind("ok ", 0), 0u) << "client " << i << " could not reach its fair share of " << share
                                      << " bytes: '" << ans << "'; status: used " << status_of(d).head.used_bytes;
  }
  s = status_of(d);
  for (auto& c : s.clients)
    EXPECT_LE(c.leased_bytes, share + kLeaseAlign) << "client " << c.client_id << " holds more than its share";
  EXPECT_TRUE(exited_with(d.stop(), 0)) << d.log();
}

// --- the node: which GPUs share the host link (protocol 1.1) --------------------------------

struct NodeView {
  proto::NodeHead head{};
  std::vector<proto::ClientNode> clients;
  const proto::ClientNode* by_pid(pid_t pid) const {
    for (auto& c : clients)
      if (c.pid == static_cast<uint32_t>(pid)) return &c;
    return nullptr;
  }
};

NodeView node_of(const Daemon& d) {
  NodeView n;
  DaemonClient c;
  std::string why;
  EXPECT_TRUE(c.connect(d.socket(), &why)) << why;
  EXPECT_TRUE(c.node(&n.head, &n.clients, &why)) << why;
  return n;
}

// connect + register a client whose Register names no GPU (as the shim's does).
void start_registered(const Daemon& d, Proc* p, const std::string& command) {
  std::string why;
  ASSERT_TRUE(d.client(p, &why, command, -1)) << why;
  uint32_t id = 0;
  ASSERT_NO_FATAL_FAILURE(attach(*p, &id, nullptr, false));
}

// "attach GPU GPU_ID RANK LOCAL_RANK LOCAL_WORLD [BUDGET]": the GPU count it was answered.
uint32_t attach_gpu(Proc& c, const std::string& args, std::vector<std::string>* words = nullptr) {
  std::vector<std::string> w;
  std::string a = c.cmd("attach " + args);
  w = split(a);
  EXPECT_TRUE(w.size() == 6 && w[0] == "ok") << "attach " << args << ": '" << a << "'";
  if (words) *words = w;
  return w.size() == 6 && w[0] == "ok" ? static_cast<uint32_t>(std::stoul(w[1])) : 0;
}

TEST(NodeIntegration, TwoGpusCountTwoAndAKilledClientDropsOut) {
  Daemon d;
  std::string why;
  ASSERT_TRUE(d.start({}, &why)) << why;
  Proc a, b;
  ASSERT_NO_FATAL_FAILURE(start_registered(d, &a, "rank-0"));
  ASSERT_NO_FATAL_FAILURE(start_registered(d, &b, "rank-1"));
  // Registered, not attached: no GPU counted yet, no rank known.
  NodeView n = node_of(d);
  EXPECT_EQ(n.head.gpus, 0u);
  ASSERT_EQ(n.clients.size(), 2u);
  for (auto& c : n.clients) {
    EXPECT_EQ(c.rank, -1);
    EXPECT_EQ(c.local_world, 0);
    EXPECT_STREQ(c.gpu_id, "");
  }
  EXPECT_EQ(n.head.link.h2d_bps, 0u) << "no --node-link: not measured";

  std::vector<std::string> w;
  EXPECT_EQ(attach_gpu(a, "0 0000:1b:00.0 0 0 0 " + std::to_string(40 * MiB), &w), 1u);
  EXPECT_EQ(w[2], std::to_string(128 * MiB)) << "the pool's fair share of two clients";
  EXPECT_EQ(w[3] + w[4] + w[5], "000") << "link not measured";
  EXPECT_EQ(attach_gpu(b, "1 0000:2c:00.0 1 1 0"), 2u);
  EXPECT_EQ(attach_gpu(a, "0 0000:1b:00.0 0 0 0 " + std::to_string(40 * MiB)), 2u) << "asked again: both GPUs";

  n = node_of(d);
  EXPECT_EQ(n.head.gpus, 2u);
  const proto::ClientNode* na = n.by_pid(a.pid());
  const proto::ClientNode* nb = n.by_pid(b.pid());
  ASSERT_TRUE(na && nb);
  EXPECT_EQ(na->gpu, 0);
  EXPECT_EQ(na->rank, 0);
  EXPECT_EQ(na->local_rank, 0);
  EXPECT_EQ(na->device_budget, 40 * MiB);
  EXPECT_STREQ(na->gpu_id, "0000:1b:00.0");
  EXPECT_EQ(nb->gpu, 1);
  EXPECT_EQ(nb->rank, 1);
  EXPECT_EQ(nb->local_rank, 1);
  EXPECT_STREQ(nb->gpu_id, "0000:2c:00.0");
  // Status shows the attached GPU (Register said -1).
  StatusView s = status_of(d);
  ASSERT_TRUE(s.by_pid(a.pid()) && s.by_pid(b.pid()));
  EXPECT_EQ(s.by_pid(a.pid())->gpu, 0);
  EXPECT_EQ(s.by_pid(b.pid())->gpu, 1);
  EXPECT_NE(d.log().find("client " + std::to_string(na->client_id) + " (pid " + std::to_string(a.pid()) +
                         "): rank 0 on GPU 0000:1b:00.0 (device 0), budget 40.0 MiB"),
            std::string::npos)
      << d.log();

  // kill -9: the count follows at once.
  pid_t bpid = b.pid();
  ASSERT_EQ(::kill(bpid, SIGKILL), 0);
  ASSERT_TRUE(poll_until([&] { return node_of(d).head.gpus == 1; }, 3000)) << d.log();
  n = node_of(d);
  EXPECT_EQ(n.by_pid(bpid), nullptr);
  EXPECT_EQ(n.clients.size(), 1u);
  b.kill_and_reap();
  EXPECT_EQ(attach_gpu(a, "0 0000:1b:00.0 0 0 0"), 1u);
  EXPECT_NE(d.log().find("GPUs sharing the host link: 1 now"), std::string::npos) << d.log();
  EXPECT_TRUE(exited_with(d.stop(), 0)) << d.log();
}

TEST(NodeIntegration, TheSameGpuTwiceCountsOnce) {
  Daemon d;
  std::string why;
  ASSERT_TRUE(d.start({}, &why)) << why;
  Proc a, b;
  ASSERT_NO_FATAL_FAILURE(start_registered(d, &a, "share-a"));
  ASSERT_NO_FATAL_FAILURE(start_registered(d, &b, "share-b"));
  EXPECT_EQ(attach_gpu(a, "0 0000:1b:00.0 -1 -1 0"), 1u);
  EXPECT_EQ(attach_gpu(b, "0 0000:1b:00.0 -1 -1 0"), 1u);
  EXPECT_EQ(node_of(d).head.gpus, 1u);
  // A second Attach replaces the first: b moves to another GPU.
  EXPECT_EQ(attach_gpu(b, "1 0000:2c:00.0 -1 -1 0"), 2u);
  NodeView n = node_of(d);
  EXPECT_EQ(n.head.gpus, 2u);
  ASSERT_NE(n.by_pid(b.pid()), nullptr);
  EXPECT_STREQ(n.by_pid(b.pid())->gpu_id, "0000:2c:00.0");
  EXPECT_EQ(n.by_pid(b.pid())->gpu, 1);
  EXPECT_TRUE(exited_with(d.stop(), 0)) << d.log();
}

TEST(NodeIntegration, LocalWorldIsALowerBoundAndGpusWithoutAnIdCountEach) {
  Daemon d;
  std::string why;
  ASSERT_TRUE(d.start({}, &why)) << why;
  Proc a, b;
  ASSERT_NO_FATAL_FAILURE(start_registered(d, &a, "first-rank"));
  // Rank 0 of a two-process job, before rank 1 attached: 2.
  EXPECT_EQ(attach_gpu(a, "0 0000:1b:00.0 0 0 2"), 2u);
  EXPECT_EQ(node_of(d).head.gpus, 2u);
  // Rank 1 comes, on another GPU: still 2, no double count.
  ASSERT_NO_FATAL_FAILURE(start_registered(d, &b, "second-rank"));
  EXPECT_EQ(attach_gpu(b, "1 0000:2c:00.0 1 1 2"), 2u);
  // Bad values are refused, and what the client said before stands.
  const std::string bad = "refused " + std::to_string(static_cast<uint32_t>(proto::Status::BadRequest));
  EXPECT_EQ(a.cmd("attach 0 0000:1b:00.0 0 0 -3"), bad);
  EXPECT_EQ(a.cmd("attach 0 0000:1b:00.0 0 0 " + std::to_string(proto::kMaxLocalWorld + 1)), bad);
  EXPECT_EQ(a.cmd("attach 0 0000:1b:00.0 -2 0 2"), bad);
  NodeView n = node_of(d);
  EXPECT_EQ(n.head.gpus, 2u);
  ASSERT_NE(n.by_pid(a.pid()), nullptr);
  EXPECT_EQ(n.by_pid(a.pid())->local_world, 2);
  // Without the hint, and without ids: each unnamed GPU counts as one.
  EXPECT_EQ(attach_gpu(a, "0 - -1 -1 0"), 2u);
  EXPECT_EQ(attach_gpu(b, "0 - -1 -1 0"), 2u);
  b.close_stdin();
  ASSERT_TRUE(exited_with(b.wait(10000), 0));
  ASSERT_TRUE(poll_until([&] { return node_of(d).head.gpus == 1; }, 3000));
  EXPECT_TRUE(exited_with(d.stop(), 0)) << d.log();
}

TEST(NodeIntegration, NodeLinkReachesTheAttachReplyAndTheNodeReply) {
  Daemon d;
  std::string why;
  ASSERT_TRUE(d.start({"--node-link", "110.2,108.5,190"}, &why)) << why;
  Proc a;
  ASSERT_NO_FATAL_FAILURE(start_registered(d, &a, "linked"));
  std::vector<std::string> w;
  EXPECT_EQ(attach_gpu(a, "3 0000:9a:00.0 0 0 1", &w), 1u);
  ASSERT_EQ(w.size(), 6u);
  EXPECT_EQ(w[3], "110200000000");
  EXPECT_EQ(w[4], "108500000000");
  EXPECT_EQ(w[5], "190000000000");
  NodeView n = node_of(d);
  EXPECT_EQ(n.head.link.h2d_bps, 110200000000u);
  EXPECT_EQ(n.head.link.d2h_bps, 108500000000u);
  EXPECT_EQ(n.head.link.both_bps, 190000000000u);
  EXPECT_EQ(n.head.gpus, 1u);
  EXPECT_NE(d.log().find("host link 110.2 GB/s H2D, 108.5 GB/s D2H, 190.0 GB/s both ways"), std::string::npos)
      << d.log();
  EXPECT_TRUE(exited_with(d.stop(), 0)) << d.log();
}

}  // namespace
}  // namespace offload::it

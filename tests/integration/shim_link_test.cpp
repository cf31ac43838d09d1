// The shim's side of offloadd (preload/host_pool.*), in-process against a real daemon: a
// refusal is an answer the shim can act on (keep the data resident), a lease is memory it
// can write, and after a daemon restart the shim re-attaches with its old id and leases
// and tells the new daemon its GPU again. Against a stand-in daemon of protocol 1.0 (or
// one that refuses Attach), attach() fails with a reason and the link carries on.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/sim_driver.h"
#include "fake_daemon.h"
#include "host_pool.h"
#include "it_support.h"
#include "residency/host_store.h"
#include "residency/residency.h"
#include "step_telemetry.h"

namespace offload::it {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

struct LinkRig {
  Daemon d;
  std::unique_ptr<DaemonLink> link;
  int64_t now_ms = 0;

  bool connect(std::string* why, Settings s = {}) {
    setenv("XDG_RUNTIME_DIR", d.env().at("XDG_RUNTIME_DIR").c_str(), 1);
    setenv("OFFLOAD_SOCKET", d.socket().c_str(), 1);
    s.daemon = "connect";  // never start one: the test owns the daemon
    link = std::make_unique<DaemonLink>(s, "shim-link-test");
    return reconnect(why);
  }
  bool reconnect(std::string* why) {
    for (int i = 0; i < 50; ++i) {
      if (link->poll(now_ms)) return true;
      now_ms += 1000;  // the link retries once a second
      usleep(20000);
    }
    *why = "not connected: " + link->failure() + " / " + link->describe();
    return false;
  }
};

TEST(ShimLinkIntegration, RefusalsAreAnswersAndLeasesAreWritable) {
  LinkRig r;
  std::string why;
  ASSERT_TRUE(r.d.start({}, &why)) << why;
  ASSERT_TRUE(r.connect(&why)) << why;
  EXPECT_NE(r.link->describe().find("client"), std::string::npos);

  EXPECT_FALSE(r.link->lease(300 * kMiB, &why).has_value()) << "more than the pool";
  EXPECT_NE(why.find("pool full"), std::string::npos) << why;

  auto a = r.link->lease(100 * kMiB, &why);
  ASSERT_TRUE(a.has_value()) << why;
  std::memset(a->host, 0x5a, a->bytes);  // the shared segment, mapped in this process
  EXPECT_EQ(a->host[a->bytes - 1], 0x5a);

  why.clear();
  EXPECT_FALSE(r.link->lease(200 * kMiB, &why).has_value()) << "only 156 MiB are left";
  EXPECT_NE(why.find("pool full"), std::string::npos) << "the reason the shim logs when it keeps data resident: " << why;
  EXPECT_TRUE(r.link->connected()) << "a refusal does not cost the connection";

  r.link->release(*a);
  auto b = r.link->lease(200 * kMiB, &why);
  EXPECT_TRUE(b.has_value()) << "room again after the release: " << why;
}

// Under the cap, the host store's chunks are leases of the daemon's pool (pinned, writable, inside
// its segment, counted as this process's leases) until the pool has no more; then its own memory.
TEST(ShimLinkIntegration, TheCapsHostStoreTakesChunksFromThePoolThenItsOwn) {
  LinkRig r;
  std::string why;
  ASSERT_TRUE(r.d.start({}, &why)) << why;  // a 256 MiB pool
  ASSERT_TRUE(r.connect(&why)) << why;
  SimDriver sim;
  HostStore::Options ho;
  ho.chunk_bytes = 64 * kMiB;
  ho.limit = 1ull << 30;
  LinkChunks chunks(*r.link);
  HostStore host(sim, ho, &chunks);
  std::vector<unsigned char*> got;
  for (int i = 0; i < 5; ++i) {
    auto* p = static_cast<unsigned char*>(host.take(64 * kMiB));
    ASSERT_NE(p, nullptr);
    std::memset(p, i + 1, 64 * kMiB);
    got.push_back(p);
  }
  EXPECT_EQ(host.stats().lent, 256 * kMiB) << "four chunks, the whole pool";
  EXPECT_EQ(host.stats().mapped, 320 * kMiB) << "and one of the store's own";
  EXPECT_EQ(sim.pinned().size(), 5u) << "lent chunks are pinned as the store's own are";
  for (int i = 0; i < 5; ++i) EXPECT_EQ(got[i][64 * kMiB - 1], i + 1) << "chunk " << i;
  StatusView st;
  ASSERT_TRUE(r.d.status(&st, &why)) << why;
  const proto::ClientStatus* me = st.by_pid(getpid());
  ASSERT_NE(me, nullptr);
  EXPECT_EQ(me->leased_bytes, 256 * kMiB) << "the daemon counts the store's chunks as this process's leases";
}

// A daemon started earlier with a smaller pool than this process's OFFLOAD_HOST_POOL asks for
// serves it all the same, and the shim says so (once), naming the way to the larger pool.
TEST(ShimLinkIntegration, ADaemonWithASmallerPoolThanAskedForIsSaid) {
  for (bool asked : {true, false}) {
    SCOPED_TRACE(asked ? "OFFLOAD_HOST_POOL=1GiB" : "OFFLOAD_HOST_POOL unset");
    LinkRig r;
    std::string why;
    ASSERT_TRUE(r.d.start({}, &why)) << why;  // a 256 MiB pool
    Settings s;
    s.host_pool_bytes = 1ull << 30;
    s.host_pool_set = asked;
    ASSERT_TRUE(r.connect(&why, s)) << why;
    EXPECT_EQ(r.link->pool_short(), asked);
    EXPECT_TRUE(r.link->lease(100 * kMiB, &why).has_value()) << "the smaller pool still serves: " << why;
  }
}

// Two daemons of one user on two sockets, each naming its pool itself, with one runtime
// directory (so one default socket): they get a segment each, named after the socket each
// serves. (Named after the default socket, the second adopted the first's segment, and the
// first, stopping with no leases, removed it: the second's clients could not open their pool.)
TEST(ShimLinkIntegration, DaemonsOnTwoSocketsKeepAPoolEach) {
  LinkRig a, b;
  b.d.share_runtime_dir(a.d);
  a.d.use_default_segment();
  b.d.use_default_segment();
  EXPECT_EQ(a.d.env(), b.d.env()) << "one runtime directory";
  EXPECT_NE(a.d.socket(), b.d.socket());
  EXPECT_NE(a.d.segment(), b.d.segment());
  EXPECT_EQ(a.d.segment(), default_segment_name(a.d.socket())) << "the same socket, the same name: a restart adopts it";
  std::string why;
  ASSERT_TRUE(a.d.start({}, &why)) << why;
  ASSERT_TRUE(b.d.start({}, &why)) << why;
  EXPECT_EQ(access(("/dev/shm/" + a.d.segment()).c_str(), F_OK), 0) << a.d.log();
  EXPECT_EQ(access(("/dev/shm/" + b.d.segment()).c_str(), F_OK), 0) << b.d.log();
  ASSERT_EQ(a.d.stop(), 0) << a.d.log();
  ASSERT_TRUE(b.connect(&why)) << why;
  auto lease = b.link->lease(100 * kMiB, &why);
  ASSERT_TRUE(lease.has_value()) << why;
  std::memset(lease->host, 0x3c, lease->bytes);
  EXPECT_EQ(lease->host[lease->bytes - 1], 0x3c);
}

TEST(ShimLinkIntegration, ConnectModeWithoutADaemonGivesUpWithAReason) {
  LinkRig r;  // no daemon started
  std::string why;
  EXPECT_FALSE(r.connect(&why));
  EXPECT_FALSE(r.link->usable()) << "the runtime then uses a private pool";
  EXPECT_NE(r.link->failure().find("no offloadd"), std::string::npos) << r.link->failure();
}

TEST(ShimLinkIntegration, ReattachesWithItsLeasesAfterADaemonRestart) {
  LinkRig r;
  std::string why;
  ASSERT_TRUE(r.d.start({}, &why)) << why;
  ASSERT_TRUE(r.connect(&why)) << why;
  std::string before = r.link->describe();
  auto a = r.link->lease(64 * kMiB, &why);
  ASSERT_TRUE(a.has_value()) << why;
  for (uint64_t i = 0; i < a->bytes; i += 4096) a->host[i] = static_cast<unsigned char>(i / 4096);

  kill(r.d.pid(), SIGKILL);
  r.d.proc().kill_and_reap();
  // The data lives on in the segment while no daemon runs.
  for (uint64_t i = 0; i < a->bytes; i += 4096) ASSERT_EQ(a->host[i], static_cast<unsigned char>(i / 4096));

  ASSERT_TRUE(r.d.start({}, &why)) << why;
  r.link->poll(r.now_ms);  // notices nothing until it talks; a telemetry push finds the hang-up
  r.link->push(proto::Telemetry{});
  ASSERT_TRUE(r.reconnect(&why)) << why;
  EXPECT_EQ(r.link->describe(), before) << "the same client id again";
  StatusView s;
  ASSERT_TRUE(r.d.status(&s, &why)) << why;
  const proto::ClientStatus* me = s.by_pid(getpid());
  ASSERT_NE(me, nullptr);
  EXPECT_TRUE(me->connected);
  EXPECT_EQ(me->leased_bytes, a->bytes) << "its lease survived the restart";
  for (uint64_t i = 0; i < a->bytes; i += 4096) ASSERT_EQ(a->host[i], static_cast<unsigned char>(i / 4096));
  r.link->release(*a);
  ASSERT_TRUE(r.d.status(&s, &why)) << why;
  EXPECT_EQ(s.head.used_bytes, 0u);
}

// What a process under the hard cap pushes after a step reaches offloadctl status and the
// metrics: the bytes its residency manager copied out in that step, the host's waits in it,
// and its demand reloads so far (made here on the simulated driver: allocations past the
// budget evict the least recently used ranges).
TEST(ShimLinkIntegration, AStepsMovesUnderTheCapReachStatus) {
  LinkRig r;
  std::string why;
  ASSERT_TRUE(r.d.start({}, &why)) << why;
  ASSERT_TRUE(r.connect(&why)) << why;
  constexpr uint64_t kGran = 64 << 10;
  SimDriver sim;
  sim.set_granularity(kGran);
  HostStore::Options ho;
  ho.chunk_bytes = 1 << 20;
  ho.limit = 64 << 20;
  HostStore host(sim, ho);
  Residency::Options o;
  o.budget = 4 * kGran;
  o.pool_floor = o.pool_step = 0;
  Residency res(sim, host, o);
  StepTelemetry telemetry;
  std::vector<DevPtr> ranges;
  auto step = [&](uint64_t n, uint64_t no) {
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t tag = 0;
      bool refused = false;
      ranges.push_back(res.alloc(kGran, 0x2000, &tag, &refused));
      ASSERT_NE(ranges.back(), 0u) << res.error();
    }
    sim.run_all();
    res.poll();
    telemetry.cut(move_totals(res.stats()));
    r.link->push(telemetry.make(no, 5'000'000, 10 * no, res.stats().held));
  };
  step(10, 1);
  const Residency::Stats first = res.stats();
  ASSERT_GT(first.bytes_out, 0u) << "nothing was evicted";
  step(3, 2);
  const Residency::Stats second = res.stats();
  ASSERT_GT(second.bytes_out, first.bytes_out);
  StatusView s;
  ASSERT_TRUE(r.d.status(&s, &why)) << why;  // the daemon answers pushes in order
  const proto::ClientStatus* me = s.by_pid(getpid());
  ASSERT_NE(me, nullptr);
  EXPECT_EQ(me->last.step, 2u);
  EXPECT_EQ(me->last.evicted_bytes, second.bytes_out - first.bytes_out) << "the second step's, not the total";
  EXPECT_EQ(me->last.exposed_stall_ns, second.wait_ns - first.wait_ns);
  EXPECT_EQ(me->last.misses, second.reloads);
  EXPECT_EQ(me->last.resident_bytes, second.held);
  EXPECT_LE(me->last.resident_bytes, 4 * kGran);
  for (DevPtr p : ranges) res.free(p, 0x2000);
  sim.run_all();
}

// The node as the daemon sees it, from a fresh connection.
bool node_of(const Daemon& d, proto::NodeHead* head, std::vector<proto::ClientNode>* cs, std::string* why) {
  DaemonClient c;
  return c.connect(d.socket(), why) && c.node(head, cs, why);
}

const proto::ClientNode* mine(const std::vector<proto::ClientNode>& cs) {
  for (auto& c : cs)
    if (c.pid == static_cast<uint32_t>(getpid())) return &c;
  return nullptr;
}

TEST(ShimLinkIntegration, AttachTellsTheGpuAndIsSentAgainAfterADaemonRestart) {
  LinkRig r;
  std::string why;
  ASSERT_TRUE(r.d.start({"--node-link", "55.5,54,90.25"}, &why)) << why;
  Settings s;
  s.daemon = "connect";
  setenv("XDG_RUNTIME_DIR", r.d.env().at("XDG_RUNTIME_DIR").c_str(), 1);
  setenv("OFFLOAD_SOCKET", r.d.socket().c_str(), 1);
  r.link = std::make_unique<DaemonLink>(s, "shim-attach-test");

  AttachInfo info;
  info.gpu = 2;
  info.rank = 5;
  info.local_rank = 1;
  info.local_world = 2;
  info.device_budget = 40 * kMiB;
  info.gpu_id = "0000:3d:00.0";
  // Before the link is up: remembered, and sent when it connects.
  EXPECT_FALSE(r.link->attach(info, &why).has_value());
  EXPECT_NE(why.find("not connected"), std::string::npos) << why;
  EXPECT_FALSE(r.link->last_share().has_value());
  ASSERT_TRUE(r.reconnect(&why)) << why;
  auto share = r.link->last_share();
  ASSERT_TRUE(share.has_value()) << "the attach was not sent on connecting";
  EXPECT_EQ(share->gpus, 2u) << "local world 2: two GPUs, though one process attached so far";
  EXPECT_EQ(share->fair_share, 256 * kMiB);
  EXPECT_DOUBLE_EQ(share->h2d, 55.5);
  EXPECT_DOUBLE_EQ(share->d2h, 54.0);
  EXPECT_DOUBLE_EQ(share->both, 90.25);

  proto::NodeHead head{};
  std::vector<proto::ClientNode> cs;
  ASSERT_TRUE(node_of(r.d, &head, &cs, &why)) << why;
  ASSERT_NE(mine(cs), nullptr);
  EXPECT_EQ(mine(cs)->gpu, 2);
  EXPECT_EQ(mine(cs)->rank, 5);
  EXPECT_EQ(mine(cs)->local_rank, 1);
  EXPECT_EQ(mine(cs)->local_world, 2);
  EXPECT_EQ(mine(cs)->device_budget, 40 * kMiB);
  EXPECT_STREQ(mine(cs)->gpu_id, "0000:3d:00.0");
  StatusView st;
  ASSERT_TRUE(r.d.status(&st, &why)) << why;
  ASSERT_NE(st.by_pid(getpid()), nullptr);
  EXPECT_EQ(st.by_pid(getpid())->gpu, 2) << "status shows the attached GPU";

  // Called again with other figures: replaced, and answered at once.
  info.local_world = 0;
  auto again = r.link->attach(info, &why);
  ASSERT_TRUE(again.has_value()) << why;
  EXPECT_EQ(again->gpus, 1u);
  EXPECT_EQ(r.link->last_share()->gpus, 1u);

  // A restarted daemon knows nothing of us until the link reconnects and attaches again.
  kill(r.d.pid(), SIGKILL);
  r.d.proc().kill_and_reap();
  ASSERT_TRUE(r.d.start({"--node-link", "55.5,54,90.25"}, &why)) << why;
  r.link->push(proto::Telemetry{});  // finds the hang-up
  ASSERT_TRUE(r.reconnect(&why)) << why;
  ASSERT_TRUE(node_of(r.d, &head, &cs, &why)) << why;
  EXPECT_EQ(head.gpus, 1u);
  ASSERT_NE(mine(cs), nullptr);
  EXPECT_EQ(mine(cs)->rank, 5);
  EXPECT_EQ(mine(cs)->local_world, 0);
  EXPECT_STREQ(mine(cs)->gpu_id, "0000:3d:00.0");
  ASSERT_TRUE(r.d.status(&st, &why)) << why;
  ASSERT_NE(st.by_pid(getpid()), nullptr);
  EXPECT_EQ(st.by_pid(getpid())->gpu, 2);
}

struct FakeRig {
  TempDir dir;
  FakeDaemon fake;
  std::unique_ptr<DaemonLink> link;
  int64_t now_ms = 0;

  bool start(FakeDaemon::Mode mode, std::string* why, uint64_t host_pool = 4ull << 30) {
    std::string xdg = dir.path() + "/xdg";
    mkdir(xdg.c_str(), 0700);
    if (!fake.start(dir.path() + "/fake.sock", mode, why)) return false;
    setenv("XDG_RUNTIME_DIR", xdg.c_str(), 1);
    setenv("OFFLOAD_SOCKET", fake.socket().c_str(), 1);
    Settings s;
    s.daemon = "connect";
    s.host_pool_bytes = host_pool;
    link = std::make_unique<DaemonLink>(s, "shim-fake-test");
    return reconnect(why);
  }
  bool reconnect(std::string* why) {
    for (int i = 0; i < 50; ++i) {
      if (link->poll(now_ms)) return true;
      now_ms += 1000;
      usleep(20000);
    }
    *why = "not connected: " + link->failure() + " / " + link->describe();
    return false;
  }
};

AttachInfo some_gpu() {
  AttachInfo info;
  info.gpu = 0;
  info.rank = 0;
  info.local_rank = 0;
  info.local_world = 1;
  info.gpu_id = "0000:1b:00.0";
  return info;
}

TEST(ShimLinkIntegration, AnOlderDaemonIsNotSentAnAttachAndTheLinkCarriesOn) {
  FakeRig r;
  std::string why;
  ASSERT_TRUE(r.start(FakeDaemon::Mode::Minor0, &why)) << why;
  EXPECT_FALSE(r.link->attach(some_gpu(), &why).has_value());
  EXPECT_NE(why.find("offloadd speaks protocol 1.0, which has no Attach"), std::string::npos) << why;
  EXPECT_TRUE(r.link->connected()) << "an attach the daemon cannot take must not cost the connection";
  auto e = r.link->lease(kMiB, &why);
  ASSERT_TRUE(e.has_value()) << "the pool still works: " << why;
  std::memset(e->host, 0x33, e->bytes);
  r.link->release(*e);
  // A reconnect (the daemon restarted) registers again and still sends no Attach.
  r.fake.drop_all();
  ASSERT_TRUE(poll_until(
      [&] {
        r.link->push(proto::Telemetry{});
        return !r.link->connected();
      },
      5000));
  ASSERT_TRUE(r.reconnect(&why)) << why;
  EXPECT_TRUE(r.link->connected());
  EXPECT_EQ(r.fake.count_of(proto::MsgType::Register), 2u);
  EXPECT_EQ(r.fake.count_of(proto::MsgType::Attach), 0u) << "a 1.0 daemon would have closed the connection";
  EXPECT_FALSE(r.link->last_share().has_value());
  EXPECT_TRUE(r.link->lease(kMiB, &why).has_value()) << why;
}

// A daemon answers its first Register only once it has made its pool (offloadd allocates every
// page before it serves; 48 GiB took longer than the usual 5 s on the GPU's host, and the shim
// then pinned a private pool of as much beside it). The first Register waits 1 s per GiB of
// the pool more: with 2 GiB, a 5.6 s answer is taken.
TEST(ShimLinkIntegration, TheFirstRegisterWaitsForADaemonMakingItsPool) {
  FakeRig r;
  r.fake.delay_register(5600);
  std::string why;
  ASSERT_TRUE(r.start(FakeDaemon::Mode::RefusesNode, &why, 2ull << 30)) << why;
  EXPECT_EQ(r.fake.count_of(proto::MsgType::Register), 1u);
  auto e = r.link->lease(kMiB, &why);
  ASSERT_TRUE(e.has_value()) << why;
  r.link->release(*e);
}

// What a plan leases from offloadd's pool is pinned in chunks of the mapped pool's grid, while
// other threads ask the link to describe itself (which reads the pinned bytes under its own lock:
// the two locks are always taken in one order).
TEST(ShimLinkIntegration, ALeaseIsPinnedOnThePoolsGridWhileTheLinkIsDescribed) {
  FakeRig r;
  std::string why;
  ASSERT_TRUE(r.start(FakeDaemon::Mode::RefusesNode, &why)) << why;
  auto e = r.link->lease(3 * kMiB, &why);
  ASSERT_TRUE(e.has_value()) << why;
  unsigned char* data = e->host - e->offset;
  const uint64_t chunk = kMiB;
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done.load()) (void)r.link->describe();
  });
  std::vector<std::pair<unsigned char*, uint64_t>> pins;
  for (int i = 0; i < 200; ++i)
    ASSERT_TRUE(r.link->pin_extent(*e, [&](void* p, uint64_t n) {
      pins.emplace_back(static_cast<unsigned char*>(p), n);
      return true;
    }, chunk));
  done = true;
  reader.join();
  const uint64_t first = e->offset / chunk, last = (e->offset + e->bytes - 1) / chunk;
  ASSERT_EQ(pins.size(), last - first + 1) << "each chunk the lease touches, once";
  for (size_t k = 0; k < pins.size(); ++k) EXPECT_EQ(pins[k], std::make_pair(data + (first + k) * chunk, chunk));
  EXPECT_NE(r.link->describe().find(std::to_string(pins.size()) + " MiB pinned"), std::string::npos)
      << r.link->describe();
  r.link->release(*e);
}

TEST(ShimLinkIntegration, AnAttachAnsweredWithAnErrorLeavesTheLinkUp) {
  FakeRig r;
  std::string why;
  ASSERT_TRUE(r.start(FakeDaemon::Mode::RefusesNode, &why)) << why;
  EXPECT_FALSE(r.link->attach(some_gpu(), &why).has_value());
  EXPECT_NE(why.find("attach refused by the fake"), std::string::npos) << why;
  EXPECT_EQ(r.fake.count_of(proto::MsgType::Attach), 1u);
  EXPECT_TRUE(r.link->connected());
  auto e = r.link->lease(kMiB, &why);
  ASSERT_TRUE(e.has_value()) << "the connection is still in step after the error: " << why;
  r.link->release(*e);
}

// A daemon's lease is memory our copies will write: an extent that is not inside the pool we
// mapped (past its end, wrapping around 2^64, or smaller than asked) is refused, not used.
TEST(ShimLinkIntegration, ALeaseOutsideThePoolIsRefused) {
  FakeRig r;
  std::string why;
  ASSERT_TRUE(r.start(FakeDaemon::Mode::RefusesNode, &why)) << why;
  const uint64_t pool = r.fake.pool_bytes();
  ASSERT_GT(pool, 0u);
  struct Forged {
    const char* what;
    uint64_t offset, bytes;
  };
  for (const Forged& f : {Forged{"past the end", pool - kLeaseAlign, 2 * kLeaseAlign},
                          Forged{"far past the end", uint64_t{1} << 40, kMiB},
                          Forged{"wrapping around", ~uint64_t{0} - kLeaseAlign + 1, 2 * kLeaseAlign},
                          Forged{"smaller than asked", 0, kLeaseAlign}}) {
    SCOPED_TRACE(f.what);
    r.fake.forge_leases(f.offset, f.bytes);
    why.clear();
    auto e = r.link->lease(kMiB, &why);
    EXPECT_FALSE(e.has_value()) << "a forged extent [" << f.offset << ", +" << f.bytes << ") in a pool of " << pool
                                << " bytes became host memory";
    EXPECT_NE(why.find("outside its pool"), std::string::npos) << why;
  }
  r.fake.forge_leases(0, 0);
  auto e = r.link->lease(kMiB, &why);
  ASSERT_TRUE(e.has_value()) << why;
  std::memset(e->host, 0x11, e->bytes);
  r.link->release(*e);
}

// Only a daemon of our own uid is spoken to: another user's could direct our copies. The
// peer's uid comes from the kernel (SO_PEERCRED); a listener of ours stands in for another
// user's by our asking for a uid it does not have.
TEST(ShimLinkIntegration, ADaemonOfAnotherUidIsRefused) {
  TempDir dir;
  FakeDaemon fake;
  std::string why;
  ASSERT_TRUE(fake.start(dir.path() + "/fake.sock", FakeDaemon::Mode::RefusesNode, &why)) << why;
  const uid_t other = getuid() + 1;
  DaemonClient c;
  EXPECT_FALSE(c.connect(fake.socket(), &why, other)) << "a daemon of uid " << getuid() << " taken for uid " << other;
  EXPECT_NE(why.find("runs as"), std::string::npos) << why;
  EXPECT_NE(why.find("uid " + std::to_string(getuid())), std::string::npos) << "names the peer's uid: " << why;
  EXPECT_FALSE(c.connected());
  ASSERT_TRUE(c.connect(fake.socket(), &why)) << why;
  StatusView s;
  EXPECT_TRUE(c.status(&s.head, &s.clients, &why)) << why;
}

// OFFLOAD_SOCKET in a directory others may write to (another user could have put a socket
// there first): refused before anything connects.
TEST(ShimLinkIntegration, ASocketInADirectoryOthersMayWriteIsRefused) {
  TempDir dir;
  const std::string open_dir = dir.path() + "/open";
  ASSERT_EQ(mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(open_dir.c_str(), 0777), 0);
  FakeDaemon fake;
  std::string why;
  ASSERT_TRUE(fake.start(open_dir + "/fake.sock", FakeDaemon::Mode::RefusesNode, &why)) << why;
  const std::string xdg = dir.path() + "/xdg";
  ASSERT_EQ(mkdir(xdg.c_str(), 0700), 0);
  setenv("XDG_RUNTIME_DIR", xdg.c_str(), 1);
  setenv("OFFLOAD_SOCKET", fake.socket().c_str(), 1);
  Paths p;
  EXPECT_FALSE(default_paths(&p, &why));
  EXPECT_NE(why.find("OFFLOAD_SOCKET=" + fake.socket()), std::string::npos) << why;
  EXPECT_NE(why.find("mode 0777"), std::string::npos) << why;
  Settings s;
  s.daemon = "connect";
  DaemonLink link(s, "shim-open-dir-test");
  EXPECT_FALSE(link.poll(0));
  EXPECT_FALSE(link.usable());
  EXPECT_NE(link.failure().find("mode 0777"), std::string::npos) << link.failure();
  EXPECT_EQ(fake.count_of(proto::MsgType::Register), 0u) << "it spoke to the daemon in the open directory";
  // The same directory, private: used.
  ASSERT_EQ(chmod(open_dir.c_str(), 0755), 0);
  EXPECT_TRUE(default_paths(&p, &why)) << why;
  EXPECT_EQ(p.socket, fake.socket());
  chmod(open_dir.c_str(), 0700);
}

}  // namespace
}  // namespace offload::it

#ifdef OFFLOAD_LIB
namespace offload::it {
namespace {

std::string python_path() {
  std::string python;
  if (FILE* f = popen("python3 -c 'import sys; print(sys.executable)' 2>/dev/null", "r")) {
    char b[4096] = {};
    if (fgets(b, sizeof b, f)) python = b;
    pclose(f);
  }
  while (!python.empty() && (python.back() == '\n' || python.back() == ' ')) python.pop_back();
  return python;
}

// Preloading the shim into a process without CUDA changes no lookup: dlsym on the program's
// handle (ctypes' CDLL(None)) finds no CUDA entry point, as without the shim (the shim's own
// exports answered before, and a call through one aborted).
TEST(ShimLinkIntegration, APreloadedProcessWithoutCudaFindsNoCudaSymbol) {
  const std::string python = python_path();
  if (python.empty()) GTEST_SKIP() << "needs python3";
#ifdef OFFLOAD_SANITIZED
  GTEST_SKIP() << "a sanitizer-instrumented liboffload.so cannot be preloaded into an uninstrumented python "
                  "(the plain build runs this test)";
#endif
  TempDir dir;
  const char* script =
      "import ctypes; lib = ctypes.CDLL(None); "
      "print(*(hasattr(lib, n) for n in ('cuLaunchKernel', 'cuMemAlloc_v2', 'cudaMalloc', 'strlen')))";
  std::map<std::string, std::string> env = {{"PATH", getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin"}};
  const RunResult plain = run_program({python, "-c", script}, env, dir.path());
  ASSERT_EQ(plain.exit_code(), 0) << plain.err;
  EXPECT_EQ(plain.out, "False False False True\n") << "this machine's python finds CUDA without the shim";
  env["LD_PRELOAD"] = OFFLOAD_LIB;
  const RunResult shim = run_program({python, "-c", script}, env, dir.path());
  ASSERT_EQ(shim.exit_code(), 0) << shim.err;
  EXPECT_EQ(shim.out, plain.out) << shim.err;
}

// A training process forks (a data-loader worker) and is then killed: the child inherited
// the daemon connection, and had it kept the socket open the daemon would not see the
// parent die. The shim's fork handler closes it in the child, so the leases still come
// back within a second.
TEST(ShimLinkIntegration, AForkedChildDoesNotKeepADeadParentRegistered) {
  // The interpreter itself, not a launcher script (pyenv's shims are shell scripts): the
  // test kills this very process.
  const std::string python = python_path();
  if (python.empty()) GTEST_SKIP() << "needs python3";
#ifdef OFFLOAD_SANITIZED
  GTEST_SKIP() << "a sanitizer-instrumented liboffload.so cannot be preloaded into an uninstrumented python "
                  "(the plain build runs this test)";
#endif
  Daemon d;
  std::string why;
  ASSERT_TRUE(d.start({}, &why)) << why;
  const char* script = R"PY(
import ctypes, json, os, sys, time
shim = ctypes.CDLL(None)
buf = ctypes.create_string_buffer(1 << 16)
for _ in range(200):
    shim.offload_stats_json(buf, len(buf))
    if "offloadd at" in json.loads(buf.value)["host_pool"]:
        break
    time.sleep(0.05)
child = os.fork()
if child == 0:
    time.sleep(60)
    os._exit(0)
print(child, flush=True)
time.sleep(60)
)PY";
  Proc::Options o;
  o.argv = {python, "-c", script};
  o.env = d.env();
  o.env["LD_PRELOAD"] = OFFLOAD_LIB;
  o.env["OFFLOAD_SOCKET"] = d.socket();
  o.env["OFFLOAD_DAEMON"] = "connect";
  o.env["OFFLOAD_TELEMETRY"] = "off";
  o.pipe_stdout = true;
  o.stderr_file = d.dir() + "/python.log";
  Proc parent;
  ASSERT_TRUE(parent.start(o, &why)) << why;
  std::string line = parent.read_line(20000);
  ASSERT_TRUE(!line.empty() && line.find_first_not_of("0123456789\n") == std::string::npos)
      << "no child pid from the script (got '" << line << "'); its log:\n" << read_file(d.dir() + "/python.log");
  pid_t child = static_cast<pid_t>(std::stol(line));
  StatusView s;
  ASSERT_TRUE(d.status(&s, &why)) << why;
  ASSERT_NE(s.by_pid(parent.pid()), nullptr) << "the shim registered the parent";

  kill(parent.pid(), SIGKILL);
  parent.kill_and_reap();
  auto t0 = std::chrono::steady_clock::now();
  bool gone = poll_until([&] { return d.status(&s, &why) && s.by_pid(parent.pid()) == nullptr; }, 5000);
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  kill(child, SIGKILL);
  waitpid(child, nullptr, WNOHANG);
  EXPECT_TRUE(gone) << "the dead parent is still registered while its forked child lives";
  EXPECT_LT(ms, 1000.0);
}

}  // namespace
}  // namespace offload::it
#endif

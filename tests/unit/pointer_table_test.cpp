// Pointer tables: a kernel that reaches an evicted arena only through a table of device
// pointers (written by a small host-to-device copy) must find the arena resident. On the
// simulated driver an evicted range is PROT_NONE, so without the table's detection the kernel
// body would fault; with it, the executor reloads the arena first (a demand reload).
#include <gtest/gtest.h>

#include <random>

#include <cstring>

#include "core/executor.h"
#include "planner/plan.h"
#include "core/sim_driver.h"
#include "core/tracker.h"

namespace offload {
namespace {

constexpr Stream kS = 0x7;

struct TableRig {
  SimDriver sim;
  EventLog log{1 << 12, 1 << 14};
  Tracker tr{sim, log};
  Executor ex{sim, Executor::Options{}};
  std::vector<unsigned char> host = std::vector<unsigned char>(1 << 20);
  Func fill = sim.add_kernel("fill", {{0, 8}});
  Func other = sim.add_kernel("other", {{0, 8}});
  Func via_table = sim.add_kernel("via_table", {{0, 8}, {8, 8}});

  TableRig() { tr.set_gate(&ex); }

  // One step: [0] fill(member) [1] other(x) [2] H2D copy of a table into `table` [3] via_table.
  Plan plan() {
    Plan p;
    p.step_launches = 4;
    p.tokens = {launch_token(EventKind::Kernel, 0), launch_token(EventKind::Kernel, 1),
                launch_token(EventKind::Copy, 0), launch_token(EventKind::Kernel, 2)};
    ArenaPlan a;
    a.capacity = sim.vmm_granularity();
    a.used = 4096;
    a.evict_after = 0;  // evicted at launch 1
    a.reload_at = 0;    // brought back only at the next step's start: launch 3 reaches it
    a.first_use = 0;    // through the table alone
    p.arenas.push_back(a);
    p.members.push_back(MemberPlan{0, 0, 4096, 0, 0});  // born before launch 0
    p.member_index = {0, 1, 1, 1, 1};
    p.handles = 1;
    p.handle_bytes = sim.vmm_granularity();
    return p;
  }

  template <class... A>
  void launch(Func f, A... args) {
    void* params[] = {static_cast<void*>(&args)...};
    tr.on_kernel(f, kS, params, nullptr);
  }
};

TEST(PointerTable, AKernelReachingAnEvictedArenaThroughATableFindsItResident) {
  TableRig r;
  DevPtr x = r.sim.alloc(4096), table = r.sim.alloc(64), out = r.sim.alloc(64);
  r.tr.on_alloc(x, 4096, kS);
  r.tr.on_alloc(table, 64, kS);
  r.tr.on_alloc(out, 64, kS);
  std::string why;
  ASSERT_TRUE(r.ex.install(r.plan(), r.tr.launches(), HostMemory{r.host.data(), r.host.data(), 0}, &why)) << why;

  // The step's first launch activates the plan; the member is born before the second step's
  // first launch, so run one step without it first.
  r.launch(r.fill, x);
  r.sim.launch(kS, [] {});
  r.launch(r.other, x);
  uint64_t host_ptrs[8] = {};
  r.tr.on_copy(table, 0, sizeof host_ptrs, kS, host_ptrs);
  r.launch(r.via_table, table, out);

  // Second step: the member is placed in the arena, filled, evicted after launch 0.
  uint64_t tag = 0;
  DevPtr m = r.ex.place(4096, kS, r.tr.launches(), &tag);
  ASSERT_NE(m, 0u);
  r.tr.on_alloc(m, 4096, kS, tag);
  r.launch(r.fill, m);
  r.sim.launch(kS, [m] { std::memset(reinterpret_cast<void*>(m), 0x5c, 4096); });
  r.launch(r.other, x);  // the eviction is queued before this launch
  r.sim.run_all();
  r.ex.poll();
  ASSERT_FALSE(r.sim.is_mapped(m)) << "the arena should be evicted by now";

  // A table holding the member's address goes to the device; a kernel reads through it.
  host_ptrs[3] = m + 128;  // an interior pointer, as a view would be
  r.tr.on_copy(table, 0, sizeof host_ptrs, kS, host_ptrs);
  r.sim.launch(kS, [table, hp = host_ptrs[3]] { reinterpret_cast<uint64_t*>(table)[3] = hp; });
  r.launch(r.via_table, table, out);
  r.sim.launch(kS, [table, out] {
    auto p = reinterpret_cast<const unsigned char*>(reinterpret_cast<uint64_t*>(table)[3]);
    reinterpret_cast<unsigned char*>(out)[0] = p[0];
  });
  r.sim.run_all();
  EXPECT_EQ(reinterpret_cast<unsigned char*>(out)[0], 0x5c);
  ExecutorStats st = r.ex.stats();
  EXPECT_EQ(st.pointer_tables, 1u);
  EXPECT_EQ(st.misses, 1u);  // the plan did not foresee the use: a demand reload
  EXPECT_EQ(st.evictions, 1u);
  r.tr.on_free(m, kS);
  r.ex.release(m, kS);
  r.sim.run_all();
}

}  // namespace
}  // namespace offload

namespace offload {
namespace {

// An NCCL collective's buffers are not kernel arguments: the interposed API call reports them.
// One that reads an evicted arena must find it reloaded, on the collective's stream.
TEST(Collective, ACollectiveReadingAnEvictedArenaFindsItResident) {
  TableRig r;
  DevPtr x = r.sim.alloc(4096), table = r.sim.alloc(64), out = r.sim.alloc(4096);
  r.tr.on_alloc(x, 4096, kS);
  r.tr.on_alloc(table, 64, kS);
  r.tr.on_alloc(out, 4096, kS);
  std::string why;
  ASSERT_TRUE(r.ex.install(r.plan(), r.tr.launches(), HostMemory{r.host.data(), r.host.data(), 0}, &why)) << why;
  // A step without the member, then one with it: filled, evicted after launch 0.
  r.launch(r.fill, x);
  r.launch(r.other, x);
  r.tr.on_collective(x, out, 4096, kS);
  r.launch(r.via_table, table, out);
  uint64_t tag = 0;
  DevPtr m = r.ex.place(4096, kS, r.tr.launches(), &tag);
  ASSERT_NE(m, 0u);
  r.tr.on_alloc(m, 4096, kS, tag);
  r.launch(r.fill, m);
  r.sim.launch(kS, [m] { std::memset(reinterpret_cast<void*>(m), 0x3d, 4096); });
  r.launch(r.other, x);
  r.sim.run_all();
  r.ex.poll();
  ASSERT_FALSE(r.sim.is_mapped(m));
  // The "collective" (position 2, a copy-like launch) reads the member into `out`.
  constexpr Stream kNccl = 0x9;
  r.tr.on_collective(m, out, 4096, kNccl);
  r.sim.launch(kNccl, [m, out] { std::memcpy(reinterpret_cast<void*>(out), reinterpret_cast<void*>(m), 4096); });
  r.sim.run_all();
  EXPECT_EQ(reinterpret_cast<unsigned char*>(out)[4095], 0x3d);
  EXPECT_EQ(r.ex.stats().misses, 1u);
  EXPECT_EQ(r.tr.counters().collectives.load(), 2u);
  r.tr.on_free(m, kS);
  r.ex.release(m, kS);
  r.sim.run_all();
}

// A collective keeps running after its API call returns (it waits for the other ranks). An
// arena it reads may be evicted only once it is done: the eviction's copy waits on the
// collective's stream too, and the range is unmapped after that copy. Here the GPU runs the
// queued work in a random order each time; an eviction that did not wait would fault in the
// collective's body (the range unmapped) or leave `out` without the member's bytes.
TEST(Collective, AnArenaIsNotEvictedUnderARunningCollective) {
  constexpr Stream kNccl = 0x9;
  for (uint64_t seed = 0; seed < 64; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    TableRig r;
    DevPtr x = r.sim.alloc(4096), out = r.sim.alloc(4096);
    r.tr.on_alloc(x, 4096, kS);
    r.tr.on_alloc(out, 4096, kS);
    // [0] fill(member) [1] collective reading the member (stream kNccl) [2] other(x): the
    // arena is evicted at launch 2, brought back at the next step's start.
    Plan p;
    p.step_launches = 3;
    p.tokens = {launch_token(EventKind::Kernel, 0), launch_token(EventKind::Copy, 0), launch_token(EventKind::Kernel, 1)};
    ArenaPlan a;
    a.capacity = r.sim.vmm_granularity();
    a.used = 4096;
    a.evict_after = 1;
    a.reload_at = 0;
    a.first_use = 0;
    p.arenas.push_back(a);
    p.members.push_back(MemberPlan{0, 0, 4096, 0, 0});
    p.member_index = {0, 1, 1, 1};
    p.handles = 1;
    p.handle_bytes = r.sim.vmm_granularity();
    std::string why;
    ASSERT_TRUE(r.ex.install(p, r.tr.launches(), HostMemory{r.host.data(), r.host.data(), 0}, &why)) << why;
    r.launch(r.fill, x);
    r.tr.on_collective(x, out, 4096, kNccl);
    r.launch(r.other, x);
    r.sim.run_all();
    r.ex.poll();
    uint64_t tag = 0;
    DevPtr m = r.ex.place(4096, kS, r.tr.launches(), &tag);
    ASSERT_NE(m, 0u);
    r.tr.on_alloc(m, 4096, kS, tag);
    r.launch(r.fill, m);
    r.sim.launch(kS, [m] { std::memset(reinterpret_cast<void*>(m), 0x3d, 4096); });
    // As ProcessGroupNCCL does: the collective's stream waits for the compute stream.
    uint64_t ready = r.sim.create_event();
    r.sim.record_event(ready, kS);
    r.sim.stream_wait(kNccl, ready);
    r.tr.on_collective(m, out, 4096, kNccl);
    r.sim.launch(kNccl, [m, out] { std::memcpy(reinterpret_cast<void*>(out), reinterpret_cast<void*>(m), 4096); });
    r.launch(r.other, x);  // the eviction starts here
    std::mt19937_64 rng(seed);
    while (r.sim.step(rng)) r.ex.poll();
    r.sim.run_all();
    r.ex.poll();
    EXPECT_EQ(reinterpret_cast<unsigned char*>(out)[0], 0x3d);
    EXPECT_EQ(reinterpret_cast<unsigned char*>(out)[4095], 0x3d);
    EXPECT_FALSE(r.sim.is_mapped(m)) << "the arena was not evicted";
    EXPECT_EQ(r.ex.stats().evictions, 1u);
    EXPECT_EQ(r.ex.stats().misses, 0u);
    EXPECT_EQ(r.sim.vmm_stats().misuses, 0u);
    r.tr.on_free(m, kS);
    r.ex.release(m, kS);
    r.sim.run_all();
    r.sim.destroy_event(ready);
  }
}

}  // namespace
}  // namespace offload

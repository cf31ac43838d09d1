// The observing pipeline without a GPU: Tracker (hot path) -> EventLog -> StepAssembler
// (worker side) on SimDriver, checked against hand-computed step traces; replay(); and the
// EventLog on its own, single- and multi-threaded.
#include "core/tracker.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "core/event_log.h"
#include "core/replay.h"
#include "core/sim_driver.h"
#include "core/telemetry.h"

namespace offload {
namespace {

constexpr DevPtr kVa = 0x7e0000000000;

StepAssembler::Options no_wait_options() {
  StepAssembler::Options o;
  o.telemetry_wait_ns = 0;
  return o;
}

// One tracker with its log, assembler and simulated driver, as the shim wires them.
struct Rig {
  SimDriver drv;
  EventLog log;
  Tracker tr;
  StepAssembler as;
  std::vector<StepTrace> steps;

  explicit Rig(StepAssembler::Options o = no_wait_options(), size_t cap = 1 << 14, size_t acap = 1 << 16)
      : log(cap, acap), tr(drv, log), as(tr.funcs(), o) {}

  void drain() {
    log.drain([&](const Event& e, const AllocId* acc) { as.consume(e, acc); });
  }
  void pump(bool final = false, int64_t now = 0) {
    drain();
    for (StepTrace& t : as.take_ready(now, final)) steps.push_back(std::move(t));
  }
};

// Launches `f` with kernelParams pointing at each argument, as cuLaunchKernel receives them.
template <class... Args>
uint64_t launch(Tracker& tr, Func f, Stream s, Args... args) {
  void* params[] = {static_cast<void*>(&args)..., nullptr};
  return tr.on_kernel(f, s, params, nullptr);
}

// Light observation: allocations and frees are counted and the footprint kept, but nothing is
// published for the step assembler (no launch is scanned to use them).
TEST(Tracker, LightObservationCountsAllocationsWithoutPublishingThem) {
  Rig full, light;
  light.tr.set_light();
  for (Rig* r : {&full, &light}) {
    r->tr.on_alloc(kVa, 4096, 1);
    r->tr.on_alloc(kVa + 8192, 1 << 20, 1);
    r->tr.on_free(kVa, 1);
  }
  EXPECT_EQ(full.log.appended(), 3u);
  EXPECT_EQ(light.log.appended(), 0u);
  for (Rig* r : {&full, &light}) {
    EXPECT_EQ(r->tr.counters().allocs.load(), 2u);
    EXPECT_EQ(r->tr.counters().frees.load(), 1u);
    EXPECT_EQ(r->tr.allocs().live_bytes(), uint64_t{1} << 20);
  }
  EXPECT_TRUE(light.tr.allocs().find(kVa + 8192).has_value());
  EXPECT_FALSE(light.tr.allocs().find(kVa + 8200).has_value());  // by base alone
  EXPECT_TRUE(full.tr.allocs().find(kVa + 8200).has_value());
}

// A bump allocator of fake device addresses: ascending, page-aligned, never reused.
struct FakeVa {
  DevPtr next = kVa;
  DevPtr get(uint64_t bytes) {
    DevPtr p = next;
    next += (bytes + 0xfff) & ~DevPtr{0xfff};
    next += 0x1000;  // a guard page: one-past-the-end is nobody's
    return p;
  }
};

struct ByValue {  // a struct passed by value, pointers inside
  DevPtr x;
  uint64_t n;
  DevPtr y;
  uint64_t flag;  // no padding: every byte of the struct is defined
};

// --- the hot path, event by event ---------------------------------------------------------

struct Drained {
  Event e;
  std::vector<AllocId> acc;
};

std::vector<Drained> drain_all(EventLog& log) {
  std::vector<Drained> v;
  log.drain([&](const Event& e, const AllocId* acc) { v.push_back({e, std::vector<AllocId>(acc, acc + e.access_count)}); });
  return v;
}

std::set<AllocId> as_set(const std::vector<AllocId>& v) { return {v.begin(), v.end()}; }

TEST(Tracker, ScansParametersInteriorPointersStructsAndTheExtraBuffer) {
  SimDriver drv;
  EventLog log(1 << 10, 1 << 12);
  Tracker tr(drv, log);
  const Func k_ptrs = drv.add_kernel("axpy(float const*, float*, int)", {{0, 8}, {8, 8}, {16, 4}});
  const Func k_struct = drv.add_kernel("by_value(S, float*)", {{0, sizeof(ByValue)}, {sizeof(ByValue), 8}});
  const Func k_packed = drv.add_kernel("packed(float*, long, float*)", {{0, 8}, {8, 8}, {16, 8}});
  const Func k_opaque = drv.add_opaque_kernel("opaque");

  const DevPtr a = drv.alloc(4096), b = drv.alloc(8192), c = drv.alloc(1 << 16), d = drv.alloc(64);
  tr.on_alloc(a, 4096, 0);
  tr.on_alloc(b, 8192, 0);
  tr.on_alloc(c, 1 << 16, 0);
  tr.on_alloc(d, 64, 0);

  std::vector<std::set<DevPtr>> want;  // per launch event, the allocations (by base) touched
  std::vector<uint64_t> seqs;
  seqs.push_back(launch(tr, k_ptrs, 5, a + 100, b, 5));  // interior pointer
  want.push_back({a, b});
  seqs.push_back(launch(tr, k_ptrs, 5, a, a + 8, 4096));  // the same allocation twice; an int
  want.push_back({a});
  seqs.push_back(launch(tr, k_struct, 5, ByValue{c + 4096, 12345, d, 1}, b + 1));
  want.push_back({c, d, b});
  seqs.push_back(launch(tr, k_opaque, 5, a));  // layout unknown: nothing found, flagged
  want.push_back({});
  {
    // The packed argument buffer: extra = {BUFFER_POINTER, buf, BUFFER_SIZE, &size, END}.
    DevPtr buf[3] = {c + 8, 77, a};
    size_t size = sizeof buf;
    void* extra[] = {reinterpret_cast<void*>(1), buf, reinterpret_cast<void*>(2), &size, nullptr};
    seqs.push_back(tr.on_kernel(k_packed, 5, nullptr, extra));
    want.push_back({c, a});
    // An opaque kernel launched through `extra` is still scanned: the buffer is the layout.
    DevPtr buf2[1] = {b + 64};
    size_t size2 = sizeof buf2;
    void* extra2[] = {reinterpret_cast<void*>(1), buf2, reinterpret_cast<void*>(2), &size2, nullptr};
    seqs.push_back(tr.on_kernel(k_opaque, 5, nullptr, extra2));
    want.push_back({b});
  }
  seqs.push_back(launch(tr, k_ptrs, 5, DevPtr{0}, DevPtr{0x1000}, 3));  // no device pointers
  want.push_back({});
  seqs.push_back(tr.on_copy(b + 16, a, 100, 6));
  want.push_back({a, b});
  seqs.push_back(tr.on_copy(c, 0, 5, 6));  // host source
  want.push_back({c});
  seqs.push_back(tr.on_memset(d + 8, 32, 6));
  want.push_back({d});
  seqs.push_back(tr.on_graph(7));
  want.push_back({});

  auto events = drain_all(log);
  std::map<DevPtr, AllocId> id_of;
  std::vector<const Drained*> launches;
  for (const Drained& x : events) {
    if (x.e.kind == EventKind::Alloc) id_of[x.e.ptr] = x.e.a;
    if (is_launch(x.e.kind)) launches.push_back(&x);
  }
  ASSERT_EQ(id_of.size(), 4u);
  ASSERT_EQ(launches.size(), want.size());
  for (size_t i = 0; i < launches.size(); ++i) {
    SCOPED_TRACE("launch " + std::to_string(i));
    const Drained& x = *launches[i];
    std::set<AllocId> ids;
    for (DevPtr p : want[i]) ids.insert(id_of.at(p));
    EXPECT_EQ(as_set(x.acc), ids);
    EXPECT_EQ(x.acc.size(), ids.size()) << "no duplicates";
    EXPECT_EQ(x.e.seq, seqs[i]) << "on_* returns the sequence number it published";
    EXPECT_EQ(x.e.live_bytes, 4096u + 8192 + (1 << 16) + 64);
  }
  // Flags: only the opaque kernel launched with kernelParams is "layout unknown".
  for (size_t i = 0; i < launches.size(); ++i)
    EXPECT_EQ((launches[i]->e.flags & kLayoutUnknown) != 0, i == 3) << "launch " << i;
  EXPECT_EQ(launches[7]->e.kind, EventKind::Copy);
  EXPECT_EQ(launches[7]->e.stream, 6u);
  EXPECT_EQ(launches[7]->e.a, 100u) << "copy bytes";
  EXPECT_EQ(launches[9]->e.kind, EventKind::Memset);
  EXPECT_EQ(launches[10]->e.kind, EventKind::Graph);
  EXPECT_EQ(launches[10]->e.stream, 7u);

  // Kernel ids name the kernels; each kernel's layout was asked of the driver once.
  EXPECT_EQ(tr.funcs().name(launches[0]->e.func), "axpy(float const*, float*, int)");
  EXPECT_EQ(launches[0]->e.func, launches[1]->e.func);
  EXPECT_EQ(tr.funcs().name(launches[2]->e.func), "by_value(S, float*)");
  EXPECT_EQ(tr.funcs().name(launches[3]->e.func), "opaque");
  EXPECT_EQ(drv.param_queries(), 4u);
  EXPECT_EQ(tr.funcs().count(), 4u);

  TrackerCounters& n = tr.counters();
  EXPECT_EQ(n.kernels.load(), 7u);
  EXPECT_EQ(n.copies.load(), 2u);
  EXPECT_EQ(n.memsets.load(), 1u);
  EXPECT_EQ(n.graphs.load(), 1u);
  EXPECT_EQ(n.allocs.load(), 4u);
  EXPECT_EQ(n.opaque_kernels.load(), 1u);
}

// The gate sees a plain launch as the driver would take it again (LaunchArgs) while it looks at
// it, once asked for it, and nothing for a launch the hook could not describe, nor after it.
TEST(Tracker, TheGateSeesAPlainLaunchsArgumentsAndGeometry) {
  struct Gate : LaunchGate {
    std::vector<LaunchArgs> seen;
    std::vector<bool> had;
    void before_launch(uint64_t, EventKind, uint32_t, Stream, const AllocId*, size_t, uint8_t) override {
      const LaunchArgs* a = current_launch_args();
      had.push_back(a != nullptr);
      if (a) seen.push_back(*a);
    }
    void note_pointer_table(AllocId, const AllocId*, size_t) override {}
  } gate;
  Rig r;
  r.tr.set_gate(&gate);
  const Func f = r.drv.add_kernel("k", {{0, 8}, {8, 4}});
  LaunchGeom g0;
  r.tr.on_kernel(f, 0x10, nullptr, nullptr, &g0);  // not asked for: not passed
  r.tr.set_pass_launch_args(true);
  uint64_t p0 = kVa;
  uint32_t p1 = 7;
  void* params[] = {&p0, &p1};
  LaunchGeom g;
  g.grid[0] = 3, g.grid[2] = 2, g.block[1] = 128, g.smem = 4096;
  r.tr.on_kernel(f, 0x10, params, nullptr, &g);
  r.tr.on_kernel(f, 0x10, params, nullptr);
  EXPECT_EQ(current_launch_args(), nullptr);
  ASSERT_EQ(gate.had, (std::vector<bool>{false, true, false}));
  const LaunchArgs& a = gate.seen[0];
  EXPECT_EQ(a.f, f);
  EXPECT_EQ(a.params, params);
  EXPECT_EQ(a.extra, nullptr);
  ASSERT_NE(a.fi, nullptr);
  ASSERT_EQ(a.fi->nparams, 2);
  EXPECT_EQ(a.fi->params[1].offset, 8u);
  EXPECT_EQ(a.geom.grid[0], 3u);
  EXPECT_EQ(a.geom.grid[1], 1u);
  EXPECT_EQ(a.geom.grid[2], 2u);
  EXPECT_EQ(a.geom.block[1], 128u);
  EXPECT_EQ(a.geom.smem, 4096u);
}

TEST(Tracker, ALaunchTouchingMoreThanTheCapIsFlaggedTruncated) {
  SimDriver drv;
  EventLog log(1 << 12, 1 << 14);
  Tracker tr(drv, log);
  const uint32_t n = Tracker::kMaxAccesses + 100;
  std::vector<DevPtr> words(n);
  for (uint32_t i = 0; i < n; ++i) {
    words[i] = kVa + i * 0x1000;
    tr.on_alloc(words[i], 0x100, 0);
  }
  const Func k = drv.add_kernel("multi_tensor_apply", {{0, static_cast<uint32_t>(8 * n)}});
  void* params[] = {words.data()};
  tr.on_kernel(k, 0, params, nullptr);
  auto events = drain_all(log);
  ASSERT_FALSE(events.empty());
  const Drained& last = events.back();
  EXPECT_EQ(last.e.kind, EventKind::Kernel);
  EXPECT_EQ(last.acc.size(), Tracker::kMaxAccesses);
  EXPECT_TRUE(last.e.flags & kAccessesTruncated);
}

TEST(Tracker, FreeOfAnUnknownAddressIsCountedNotLogged) {
  SimDriver drv;
  EventLog log(1 << 10, 1 << 12);
  Tracker tr(drv, log);
  tr.on_free(kVa, 0);
  EXPECT_EQ(tr.counters().unknown_frees.load(), 1u);
  EXPECT_EQ(tr.counters().frees.load(), 0u);
  EXPECT_EQ(log.appended(), 0u);
}

TEST(Tracker, AllocationOverAStaleOneClosesIt) {
  SimDriver drv;
  EventLog log(1 << 10, 1 << 12);
  Tracker tr(drv, log);
  tr.on_alloc(kVa, 0x100, 0);
  tr.on_alloc(kVa, 0x200, 0);  // same base, no free seen
  auto events = drain_all(log);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[1].e.kind, EventKind::Free);
  EXPECT_EQ(events[1].e.a, events[0].e.a) << "the stale allocation is closed";
  EXPECT_EQ(events[1].e.b, 0x100u);
  EXPECT_EQ(events[2].e.kind, EventKind::Alloc);
  EXPECT_EQ(tr.allocs().live_bytes(), 0x200u);
}

// The table drops every stale entry the new range overlaps; each must be closed in the
// event stream, or the step traces keep a phantom allocation alive forever.
TEST(Tracker, AllocationOverTwoStaleOnesClosesBoth) {
  Rig r;
  const Func k = r.drv.add_kernel("k(float*)", {{0, 8}});
  r.tr.on_alloc(kVa, 0x100, 0);          // A
  r.tr.on_alloc(kVa + 0x100, 0x100, 0);  // B, adjacent
  launch(r.tr, k, 0, kVa);
  r.tr.mark_step();
  r.tr.on_alloc(kVa, 0x200, 0);  // C over A and B: both frees went unseen
  launch(r.tr, k, 0, kVa + 0x180);
  r.tr.mark_step();
  r.pump(true);
  ASSERT_EQ(r.steps.size(), 2u);
  const StepTrace& t = r.steps[1];
  ASSERT_EQ(t.launches.size(), 1u);
  int born_before = 0;
  for (const TraceAlloc& a : t.allocs) {
    if (a.alloc_pos >= 0) continue;
    ++born_before;
    EXPECT_EQ(a.free_pos, 0) << "ordinal " << a.ordinal << " (" << a.bytes
                             << " bytes) was replaced by C but never freed in the trace";
  }
  EXPECT_EQ(born_before, 2);
  EXPECT_EQ(r.tr.allocs().size(), 1u);
}

// --- StepAssembler: marked steps ------------------------------------------------------------

// Ordinal -> the allocation's base address, for a trace: born-before ones sorted by
// address (as the format says), then births in event order.
std::vector<DevPtr> ordinal_bases(const StepTrace& t, std::vector<DevPtr> live_before,
                                  const std::vector<DevPtr>& births) {
  std::sort(live_before.begin(), live_before.end());
  live_before.insert(live_before.end(), births.begin(), births.end());
  EXPECT_EQ(live_before.size(), t.allocs.size());
  return live_before;
}

std::set<DevPtr> touched(const StepTrace& t, size_t pos, const std::vector<DevPtr>& base_of) {
  std::set<DevPtr> s;
  for (uint32_t o : t.launches.at(pos).allocs) s.insert(base_of.at(o));
  return s;
}

TEST(StepAssembler, MarkStepCutsExactlyAtMarks) {
  Rig r;
  FakeVa va;
  const Func k_ptrs = r.drv.add_kernel("axpy", {{0, 8}, {8, 8}, {16, 4}});
  const Func k_struct = r.drv.add_kernel("by_value", {{0, sizeof(ByValue)}, {sizeof(ByValue), 8}});
  const DevPtr w = va.get(4096), x = va.get(1024), a = va.get(8192), tail = va.get(1000), b = va.get(8192);

  // Step 0.
  r.tr.on_alloc(w, 4096, 0);
  r.tr.on_alloc(x, 1024, 3);
  r.tr.on_copy(x, 0, 1024, 7);                                    // pos 0
  r.tr.on_alloc(a, 8192, 0);                                      // born before pos 1
  launch(r.tr, k_ptrs, 0, w + 16, a, 5);                          // pos 1
  launch(r.tr, k_struct, 0, ByValue{x + 8, 99, a + 100, 0}, w);   // pos 2
  r.tr.on_free(a, 0);                                             // freed before pos 3
  r.tr.on_alloc(tail, 1000, 0);                                   // after the last launch
  r.tr.mark_step();
  r.pump();
  ASSERT_EQ(r.steps.size(), 1u) << "a mark cuts the step at once";
  // Step 1.
  r.tr.on_alloc(b, 8192, 0);
  launch(r.tr, k_ptrs, 0, w, b, 1);  // pos 0
  r.tr.on_free(x, 3);
  r.tr.on_copy(w, b, 64, 0);  // pos 1
  r.tr.on_free(tail, 0);
  r.tr.mark_step();
  // Step 2.
  r.tr.on_memset(w, 4096, 0);  // pos 0
  r.tr.mark_step();
  r.pump(true);
  ASSERT_EQ(r.steps.size(), 3u);
  EXPECT_TRUE(r.as.marked());

  {
    const StepTrace& t = r.steps[0];
    SCOPED_TRACE("step 0");
    EXPECT_EQ(t.step, 0u);
    auto base = ordinal_bases(t, {}, {w, x, a, tail});
    ASSERT_EQ(t.allocs.size(), 4u);
    // ordinal, bytes, stream, alloc_pos, free_pos
    auto expect_alloc = [&](uint32_t o, uint64_t bytes, Stream s, int64_t ap, int64_t fp) {
      EXPECT_EQ(t.allocs[o].ordinal, o);
      EXPECT_EQ(t.allocs[o].bytes, bytes) << o;
      EXPECT_EQ(t.allocs[o].stream, s) << o;
      EXPECT_EQ(t.allocs[o].alloc_pos, ap) << o;
      EXPECT_EQ(t.allocs[o].free_pos, fp) << o;
    };
    expect_alloc(0, 4096, 0, 0, -1);
    expect_alloc(1, 1024, 3, 0, -1);
    expect_alloc(2, 8192, 0, 1, 3);
    expect_alloc(3, 1000, 0, 3, -1);
    ASSERT_EQ(t.launches.size(), 3u);
    EXPECT_EQ(t.launches[0].kind, EventKind::Copy);
    EXPECT_EQ(t.launches[0].stream, 7u);
    EXPECT_EQ(t.launches[1].kind, EventKind::Kernel);
    EXPECT_EQ(t.launches[2].kind, EventKind::Kernel);
    for (uint32_t p = 0; p < 3; ++p) EXPECT_EQ(t.launches[p].pos, p);
    EXPECT_EQ(touched(t, 0, base), (std::set<DevPtr>{x}));
    EXPECT_EQ(touched(t, 1, base), (std::set<DevPtr>{w, a}));
    EXPECT_EQ(touched(t, 2, base), (std::set<DevPtr>{x, a, w}));
    ASSERT_EQ(t.kernels.size(), 2u);
    EXPECT_EQ(t.kernels.at(t.launches[1].kernel), "axpy");
    EXPECT_EQ(t.kernels.at(t.launches[2].kernel), "by_value");
    EXPECT_EQ(t.kernel_launches(), 2u);
    EXPECT_EQ(t.gpu_busy_ns, -1) << "no GPU records";
    EXPECT_EQ(t.cupti_kernels, -1);
    for (const TraceLaunch& l : t.launches) EXPECT_EQ(l.gpu_ns, -1);
  }
  {
    const StepTrace& t = r.steps[1];
    SCOPED_TRACE("step 1");
    EXPECT_EQ(t.step, 1u);
    auto base = ordinal_bases(t, {w, x, tail}, {b});
    ASSERT_EQ(t.allocs.size(), 4u);
    std::map<DevPtr, const TraceAlloc*> by;
    for (uint32_t o = 0; o < t.allocs.size(); ++o) by[base[o]] = &t.allocs[o];
    EXPECT_EQ(by[w]->alloc_pos, -1);
    EXPECT_EQ(by[w]->free_pos, -1);
    EXPECT_EQ(by[x]->alloc_pos, -1);
    EXPECT_EQ(by[x]->free_pos, 1);
    EXPECT_EQ(by[x]->stream, 3u);
    EXPECT_EQ(by[tail]->free_pos, 2);
    EXPECT_EQ(by[b]->alloc_pos, 0);
    EXPECT_EQ(by[b]->free_pos, -1);
    ASSERT_EQ(t.launches.size(), 2u);
    EXPECT_EQ(touched(t, 0, base), (std::set<DevPtr>{w, b}));
    EXPECT_EQ(touched(t, 1, base), (std::set<DevPtr>{w, b}));
    EXPECT_EQ(t.kernels.size(), 1u);
  }
  {
    const StepTrace& t = r.steps[2];
    SCOPED_TRACE("step 2");
    EXPECT_EQ(t.step, 2u);
    auto base = ordinal_bases(t, {w, b}, {});
    ASSERT_EQ(t.launches.size(), 1u);
    EXPECT_EQ(t.launches[0].kind, EventKind::Memset);
    EXPECT_EQ(touched(t, 0, base), (std::set<DevPtr>{w}));
    EXPECT_TRUE(t.kernels.empty());
  }
}

// --- StepAssembler: automatic detection -----------------------------------------------------

// A small training loop: a warm-up, then steps of: free last step's gradient, copy a batch
// in, 8 forward kernels each saving an activation, 8 backward kernels each releasing one,
// an optimizer kernel. 18 launches; lowest live bytes at the batch copy.
struct Trainer {
  Rig& r;
  FakeVa va;
  Func init[5], fwd[8], bwd[8], opt;
  DevPtr w = 0, in = 0, grad = 0;
  static constexpr uint64_t kW = 1 << 20, kIn = 1 << 16, kGrad = 1 << 20;
  static uint64_t act_bytes(int k) { return 4096u * static_cast<uint64_t>(k); }

  // What one step did, for checking its trace.
  struct Record {
    std::vector<DevPtr> live_before;  // live when the step started
    std::vector<DevPtr> births;       // in order
    std::map<DevPtr, std::pair<int64_t, int64_t>> pos;  // base -> (alloc_pos, free_pos)
    std::vector<std::set<DevPtr>> touched;
  };
  std::vector<Record> records;

  explicit Trainer(Rig& rig) : r(rig) {
    for (int i = 0; i < 5; ++i) init[i] = r.drv.add_kernel("init" + std::to_string(i), {{0, 8}});
    for (int i = 0; i < 8; ++i) fwd[i] = r.drv.add_kernel("fwd" + std::to_string(i), {{0, 8}, {8, 8}, {16, 8}});
    for (int i = 0; i < 8; ++i) bwd[i] = r.drv.add_kernel("bwd" + std::to_string(i), {{0, 8}, {8, 8}});
    opt = r.drv.add_kernel("adam", {{0, 8}, {8, 8}});
  }
  void warmup() {
    w = va.get(kW);
    in = va.get(kIn);
    r.tr.on_alloc(w, kW, 0);
    r.tr.on_alloc(in, kIn, 0);
    for (Func f : init) launch(r.tr, f, 0, w);
  }
  void step() {
    Record rec;
    rec.live_before = {w, in};
    int64_t pos = 0;
    if (grad) {
      rec.live_before.push_back(grad);
      r.tr.on_free(grad, 0);
      rec.pos[grad] = {-1, 0};
      grad = 0;
    }
    rec.pos[w] = {-1, -1};
    rec.pos[in] = {-1, -1};
    r.tr.on_copy(in, 0, kIn, 0);
    rec.touched.push_back({in});
    ++pos;
    DevPtr act[9];
    act[0] = in;
    for (int k = 1; k <= 8; ++k) {
      act[k] = va.get(act_bytes(k));
      r.tr.on_alloc(act[k], act_bytes(k), 0);
      rec.births.push_back(act[k]);
      launch(r.tr, fwd[k - 1], 0, w, act[k - 1] + 64, act[k]);
      rec.touched.push_back({w, act[k - 1], act[k]});
      rec.pos[act[k]] = {pos, -1};
      ++pos;
    }
    grad = va.get(kGrad);
    r.tr.on_alloc(grad, kGrad, 0);
    rec.births.push_back(grad);
    rec.pos[grad] = {pos, -1};
    for (int j = 8; j >= 1; --j) {
      launch(r.tr, bwd[8 - j], 0, act[j], grad);
      rec.touched.push_back({act[j], grad});
      ++pos;
      r.tr.on_free(act[j], 0);
      rec.pos[act[j]].second = pos;
    }
    launch(r.tr, opt, 0, w, grad);
    rec.touched.push_back({w, grad});
    records.push_back(std::move(rec));
  }
  static constexpr size_t kStepLaunches = 18;
};

void expect_step(const StepTrace& t, const Trainer::Record& rec) {
  auto base = ordinal_bases(t, rec.live_before, rec.births);
  ASSERT_EQ(t.launches.size(), Trainer::kStepLaunches);
  EXPECT_EQ(t.launches[0].kind, EventKind::Copy);
  for (size_t p = 1; p < t.launches.size(); ++p) EXPECT_EQ(t.launches[p].kind, EventKind::Kernel);
  for (size_t p = 0; p < t.launches.size(); ++p)
    EXPECT_EQ(touched(t, p, base), rec.touched[p]) << "launch " << p;
  ASSERT_EQ(t.allocs.size(), base.size());
  for (uint32_t o = 0; o < t.allocs.size(); ++o) {
    auto [ap, fp] = rec.pos.at(base[o]);
    EXPECT_EQ(t.allocs[o].alloc_pos, ap) << "ordinal " << o;
    EXPECT_EQ(t.allocs[o].free_pos, fp) << "ordinal " << o;
  }
  EXPECT_EQ(t.kernels.at(t.launches[1].kernel), "fwd0");
  EXPECT_EQ(t.kernels.at(t.launches.back().kernel), "adam");
}

TEST(StepAssembler, AutomaticDetectionCutsAtTheStepStart) {
  Rig r;
  Trainer tr(r);
  tr.warmup();
  const int kSteps = 6;
  for (int s = 0; s < kSteps; ++s) {
    tr.step();
    r.pump();
  }
  EXPECT_TRUE(r.as.detector().locked());
  EXPECT_EQ(r.as.detector().period(), Trainer::kStepLaunches);
  EXPECT_FALSE(r.as.marked());
  r.pump(/*final=*/true);
  // The warm-up, then one trace per step.
  ASSERT_EQ(r.steps.size(), 1u + kSteps);
  EXPECT_EQ(r.steps[0].launches.size(), 5u) << "the warm-up is a step of its own";
  for (int s = 0; s < kSteps; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    EXPECT_EQ(r.steps[1 + s].step, static_cast<uint64_t>(1 + s));
    // The gradient freed just before the batch copy opens the step it was freed in.
    expect_step(r.steps[1 + s], tr.records[s]);
  }
}

// Event timing at step boundaries (the fallback when CUPTI's records are not to be had):
// armed at the detector's next boundary, the marker is recorded by the hook that makes the
// step's first launch, and its launch number is that step's first_launch.
TEST(StepMarkers, RecordedAtTheArmedBoundaryAndMatchTheStepStart) {
  Rig r;
  Trainer tr(r);
  tr.warmup();
  for (int s = 0; s < 4; ++s) {
    tr.step();
    r.pump();
  }
  ASSERT_TRUE(r.as.detector().locked());
  const uint64_t next = r.as.detector().next_boundary();
  EXPECT_EQ(next, r.tr.launches()) << "the worker pumped at a step's end: the next launch starts a step";
  r.tr.arm_marker(next);
  Tracker::Marker m;
  EXPECT_FALSE(r.tr.take_marker(&m)) << "nothing recorded before the boundary launch";
  r.drv.advance_clock(1000);
  tr.step();  // its first launch is the armed one
  ASSERT_TRUE(r.tr.take_marker(&m));
  EXPECT_EQ(m.launch_no, next);
  EXPECT_NE(m.handle, 0u);
  EXPECT_FALSE(r.tr.take_marker(&m)) << "one marker per arming";
  r.pump();  // the worker sees the step go by and arms the next boundary
  EXPECT_EQ(r.as.detector().next_boundary(), next + Trainer::kStepLaunches);
  r.tr.arm_marker(r.as.detector().next_boundary());
  r.drv.advance_clock(250'000);  // the step's GPU time
  tr.step();
  Tracker::Marker m2;
  ASSERT_TRUE(r.tr.take_marker(&m2));
  EXPECT_EQ(m2.launch_no, next + Trainer::kStepLaunches);
  EXPECT_EQ(r.drv.marker_elapsed_ns(m.handle, m2.handle), -1) << "not reached on the GPU yet";
  r.drv.reach_markers();
  EXPECT_EQ(r.drv.marker_elapsed_ns(m.handle, m2.handle), 250'000);
  r.pump(/*final=*/true);
  bool found = false;
  for (const StepTrace& t : r.steps) found |= t.first_launch == next;
  EXPECT_TRUE(found) << "a step trace starts at the marker's launch";
  r.drv.release_marker(m.handle);
  r.drv.release_marker(m2.handle);
  EXPECT_EQ(r.drv.live_markers(), 0u);
}

TEST(StepMarkers, MarkStepRecordsOneWhenAsked) {
  Rig r;
  Tracker::Marker m;
  r.tr.mark_step();
  EXPECT_FALSE(r.tr.take_marker(&m)) << "marks record nothing unless event timing is on";
  r.tr.set_marks_record(true);
  r.tr.mark_step();
  ASSERT_TRUE(r.tr.take_marker(&m));
  EXPECT_EQ(m.launch_no, r.tr.launches());
  r.drv.release_marker(m.handle);
}

TEST(StepAssembler, AutomaticDetectionWithOnePumpAtTheEnd) {
  Rig r;
  Trainer tr(r);
  tr.warmup();
  for (int s = 0; s < 5; ++s) tr.step();
  r.pump();
  r.pump(true);
  ASSERT_EQ(r.steps.size(), 6u);
  for (int s = 0; s < 5; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    expect_step(r.steps[1 + s], tr.records[s]);
  }
}

TEST(StepAssembler, WithoutBoundariesTheFinalCutTakesEverything) {
  Rig r;
  const Func k = r.drv.add_kernel("k", {{0, 8}});
  FakeVa va;
  const DevPtr p = va.get(64);
  r.tr.on_alloc(p, 64, 0);
  for (int i = 0; i < 10; ++i) launch(r.tr, k, 0, p);
  r.pump();
  EXPECT_TRUE(r.steps.empty());
  r.pump(true);
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_EQ(r.steps[0].launches.size(), 10u);
  EXPECT_EQ(r.steps[0].allocs.size(), 1u);
}

TEST(StepAssembler, WithoutBoundariesOldEventsAreFoldedIntoTheLiveSet) {
  StepAssembler::Options o = no_wait_options();
  o.max_pending_events = 100;
  Rig r(o);
  const Func k = r.drv.add_kernel("k", {{0, 8}});
  FakeVa va;
  const DevPtr a = va.get(64), b = va.get(128);
  // 122 events: alloc a, 60 launches on a, alloc b, 60 launches on b. At 101 pending events
  // the older 50 (alloc a and 49 launches) are folded away; a stays live.
  r.tr.on_alloc(a, 64, 0);
  for (int i = 0; i < 60; ++i) launch(r.tr, k, 0, a);
  r.tr.on_alloc(b, 128, 0);
  for (int i = 0; i < 60; ++i) launch(r.tr, k, 0, b);
  r.pump(true);
  ASSERT_EQ(r.steps.size(), 1u);
  const StepTrace& t = r.steps[0];
  ASSERT_EQ(t.launches.size(), 71u);
  ASSERT_EQ(t.allocs.size(), 2u);
  EXPECT_EQ(t.allocs[0].bytes, 64u);
  EXPECT_EQ(t.allocs[0].alloc_pos, -1) << "folded: born before what is left";
  EXPECT_EQ(t.allocs[1].bytes, 128u);
  EXPECT_EQ(t.allocs[1].alloc_pos, 11);
  for (size_t p = 0; p < t.launches.size(); ++p)
    EXPECT_EQ(t.launches[p].allocs, (std::vector<uint32_t>{p < 11 ? 0u : 1u})) << "launch " << p;
}

// --- GPU records ---------------------------------------------------------------------------
//
// Kernel records carry the driver's correlation id (API-call order) and the kernel's name
// hash; the assembler aligns them with our kernel launches by name in that order. A record
// that does not align is a launch we did not see (it counts towards cupti_kernels and the
// busy time of the step whose next seen launch follows it).

constexpr uint64_t kUnseen = 0xabcdef;  // the name hash of a kernel we never saw launched

GpuRecord kernel_record(const char* name, uint64_t corr, uint64_t start, uint64_t end) {
  return GpuRecord{EventKind::Kernel, name_hash(name), corr, start, end};
}
GpuRecord unseen_record(uint64_t corr, uint64_t start, uint64_t end) {
  return GpuRecord{EventKind::Kernel, kUnseen, corr, start, end};
}

struct GpuRig {
  Rig r;
  Func k0, k1, k2;
  uint64_t first_seq = 0, step1_seq = 0;
  explicit GpuRig(StepAssembler::Options o = no_wait_options()) : r(o) {
    k0 = r.drv.add_kernel("k0", {{0, 8}});
    k1 = r.drv.add_kernel("k1", {{0, 8}});
    k2 = r.drv.add_kernel("k2", {{0, 8}});
  }
  // Step 0: k0, k1, a copy. Step 1: k2. Step 2: k0. Each ended by a mark.
  void run_steps() {
    DevPtr p = kVa;
    r.tr.on_alloc(p, 4096, 0);
    first_seq = launch(r.tr, k0, 0, p);
    launch(r.tr, k1, 0, p);
    r.tr.on_copy(p, 0, 64, 0);
    r.tr.mark_step();
    step1_seq = launch(r.tr, k2, 0, p);
    r.tr.mark_step();
    launch(r.tr, k0, 0, p);
    r.tr.mark_step();
  }
  static std::vector<GpuRecord> records() {
    return {
        kernel_record("k0", 10, 1000, 1500),
        unseen_record(11, 1600, 1700),  // between k0 and k1: step 0's
        kernel_record("k1", 12, 1650, 2000),
        {EventKind::Copy, 0, 13, 2100, 2200},  // not aligned to launches: a transfer of step 1's span
        unseen_record(14, 2300, 2400),  // after step 0's last seen launch: goes with k2
        kernel_record("k2", 15, 5000, 5100),
        unseen_record(16, 5200, 5300),
        kernel_record("k0", 17, 9000, 9050),
    };
  }
};

TEST(StepAssembler, GpuRecordsAreAlignedToLaunchesByNameInCallOrder) {
  GpuRig g;
  g.r.as.gpu_times_from(1);  // telemetry on from the start
  g.run_steps();
  g.r.drain();
  auto recs = GpuRig::records();
  std::reverse(recs.begin(), recs.end());  // arrival order does not matter
  g.r.as.add_gpu_records(recs);
  EXPECT_TRUE(recs.empty()) << "records are taken";
  g.r.pump(true);
  ASSERT_EQ(g.r.steps.size(), 3u);

  const StepTrace& t0 = g.r.steps[0];
  ASSERT_EQ(t0.launches.size(), 3u);
  EXPECT_EQ(t0.cupti_kernels, 3) << "k0, the unseen kernel between, k1";
  EXPECT_EQ(t0.gpu_busy_ns, 500 + 400) << "[1000,1500) and [1600,2000)";
  EXPECT_EQ(t0.launches[0].gpu_start_ns, 0);
  EXPECT_EQ(t0.launches[0].gpu_ns, 500);
  EXPECT_EQ(t0.launches[1].gpu_start_ns, 650);
  EXPECT_EQ(t0.launches[1].gpu_ns, 350);
  EXPECT_EQ(t0.launches[2].kind, EventKind::Copy);
  EXPECT_EQ(t0.launches[2].gpu_ns, -1) << "only kernels are timed";

  const StepTrace& t1 = g.r.steps[1];
  EXPECT_EQ(t1.cupti_kernels, 2) << "the unseen 14, then k2";
  EXPECT_EQ(t1.gpu_busy_ns, 200);
  EXPECT_EQ(t1.launches[0].gpu_start_ns, 5000 - 2300) << "from the step's first kernel start";
  EXPECT_EQ(t1.launches[0].gpu_ns, 100);

  const StepTrace& t2 = g.r.steps[2];
  EXPECT_EQ(t2.cupti_kernels, 2);
  EXPECT_EQ(t2.gpu_busy_ns, 150);
  EXPECT_EQ(t2.launches[0].gpu_start_ns, 9000 - 5200);
  EXPECT_EQ(t2.launches[0].gpu_ns, 50);
}

// Copy records (the application's and the shim's own, which no launch of ours matches) become
// the transfers of the step whose last kernel ends after they start, counted from its first
// kernel start; one starting before the last timed step's end came too late and is dropped.
TEST(StepAssembler, CopiesBecomeTheTransfersOfTheStepTheyStartIn) {
  GpuRig g;
  g.r.as.gpu_times_from(1);
  g.run_steps();
  g.r.drain();
  auto recs = GpuRig::records();
  recs.push_back({EventKind::Copy, 0, 30, 1200, 1900, 1 << 20, 1});  // beside k0 and k1: step 0
  recs.push_back({EventKind::Copy, 0, 31, 5050, 6000, 4096, 2});     // beside k2: step 1
  recs.push_back({EventKind::Copy, 0, 32, 0, 0, 8, 1});              // no times: not a transfer
  recs.push_back({EventKind::Copy, 0, 33, 8000, 8100, 64, 8});       // before step 2's kernel
  g.r.as.add_gpu_records(recs);
  g.r.pump(true);
  ASSERT_EQ(g.r.steps.size(), 3u);
  const auto& x0 = g.r.steps[0].transfers;
  ASSERT_EQ(x0.size(), 1u);
  EXPECT_EQ(x0[0].gpu_start_ns, 200) << "from step 0's first kernel start, 1000";
  EXPECT_EQ(x0[0].gpu_ns, 700);
  EXPECT_EQ(x0[0].bytes, 1u << 20);
  EXPECT_EQ(x0[0].copy_kind, 1);
  const auto& x1 = g.r.steps[1].transfers;
  ASSERT_EQ(x1.size(), 2u) << "the copy at 2100 in the gap after step 0's last kernel, and the one beside k2";
  EXPECT_EQ(x1[0].gpu_start_ns, 2100 - 2300) << "before step 1's first kernel (the unseen one at 2300)";
  EXPECT_EQ(x1[1].gpu_start_ns, 5050 - 2300);
  EXPECT_EQ(x1[1].copy_kind, 2);
  const auto& x2 = g.r.steps[2].transfers;
  ASSERT_EQ(x2.size(), 1u);
  EXPECT_EQ(x2[0].gpu_start_ns, 8000 - 5200);
  EXPECT_EQ(x2[0].copy_kind, 8);

  // A record that arrives after its step was finished is not given to a later one.
  std::vector<GpuRecord> late = {{EventKind::Copy, 0, 34, 1300, 1400, 64, 1}};
  g.r.as.add_gpu_records(late);
  const Func k = g.r.drv.add_kernel("k3", {{0, 8}});
  const uint64_t seq = launch(g.r.tr, k, 0, kVa);
  (void)seq;
  g.r.tr.mark_step();
  g.r.drain();
  std::vector<GpuRecord> more = {kernel_record("k3", 40, 20000, 20100)};
  g.r.as.add_gpu_records(more);
  g.r.pump(true);
  ASSERT_EQ(g.r.steps.size(), 4u);
  EXPECT_TRUE(g.r.steps[3].transfers.empty()) << "the copy at 1300 belonged to step 0";
}

TEST(StepAssembler, RepeatedKernelsAlignInOrderAndAMissingRecordLeavesOneLaunchUntimed) {
  Rig r;
  r.as.gpu_times_from(1);
  const Func k = r.drv.add_kernel("gemm", {{0, 8}});
  const Func other = r.drv.add_kernel("softmax", {{0, 8}});
  DevPtr p = kVa;
  r.tr.on_alloc(p, 4096, 0);
  launch(r.tr, k, 0, p);      // corr 1
  launch(r.tr, k, 0, p);      // corr 2
  launch(r.tr, other, 0, p);  // its record never arrives
  launch(r.tr, k, 0, p);      // corr 4
  r.tr.mark_step();
  r.drain();
  std::vector<GpuRecord> recs = {kernel_record("gemm", 4, 400, 450), kernel_record("gemm", 1, 100, 110),
                                 kernel_record("gemm", 2, 200, 230)};
  r.as.add_gpu_records(recs);
  r.pump(true);
  ASSERT_EQ(r.steps.size(), 1u);
  const StepTrace& t = r.steps[0];
  EXPECT_EQ(t.launches[0].gpu_start_ns, 0);
  EXPECT_EQ(t.launches[0].gpu_ns, 10);
  EXPECT_EQ(t.launches[1].gpu_start_ns, 100);
  EXPECT_EQ(t.launches[1].gpu_ns, 30);
  EXPECT_EQ(t.launches[2].gpu_ns, -1);
  EXPECT_EQ(t.launches[3].gpu_start_ns, 300);
  EXPECT_EQ(t.launches[3].gpu_ns, 50);
  EXPECT_EQ(t.cupti_kernels, 3);
  EXPECT_EQ(t.gpu_busy_ns, 10 + 30 + 50);
}

// OFFLOAD_TRACE_LEAD: the tracker reads the lead clock as it forwards each kernel, and a
// kernel's lead is its record's start less that reading.
uint64_t g_fake_now = 0;
uint64_t fake_clock() { return g_fake_now += 100; }

TEST(StepAssembler, AKernelsLeadIsItsGpuStartLessWhenTheHostForwardedIt) {
  Rig r;
  r.as.gpu_times_from(1);
  const Func k = r.drv.add_kernel("gemm", {{0, 8}});
  DevPtr p = kVa;
  r.tr.on_alloc(p, 4096, 0);
  launch(r.tr, k, 0, p);  // before the clock is set: no lead
  g_fake_now = 1000;
  r.tr.set_lead_clock(&fake_clock);
  launch(r.tr, k, 0, p);  // forwarded at 1100
  launch(r.tr, k, 0, p);  // forwarded at 1200
  r.tr.on_copy(p, 0, 64, 0);  // copies get no lead: only kernels have records we align
  r.tr.mark_step();
  r.drain();
  std::vector<GpuRecord> recs = {kernel_record("gemm", 1, 500, 900), kernel_record("gemm", 2, 5100, 5200),
                                 kernel_record("gemm", 3, 1210, 1300)};
  r.as.add_gpu_records(recs);
  r.pump(true);
  ASSERT_EQ(r.steps.size(), 1u);
  const StepTrace& t = r.steps[0];
  EXPECT_FALSE(t.launches[0].lead_ns.has_value());
  EXPECT_EQ(t.launches[1].lead_ns, 5100 - 1100) << "queued behind other work";
  EXPECT_EQ(t.launches[2].lead_ns, 1210 - 1200) << "the GPU waited for the host";
  EXPECT_FALSE(t.launches[3].lead_ns.has_value());
  // And the leads survive the trace file.
  std::stringstream ss;
  t.write(ss);
  StepTrace back;
  std::string err;
  ASSERT_TRUE(StepTrace::read(ss, &back, &err)) << err;
  EXPECT_EQ(back.launches[1].lead_ns, 4000);
  EXPECT_EQ(back.launches[2].lead_ns, 10);
}

TEST(StepAssembler, AStepWaitsForItsRecordsThenAMoment) {
  StepAssembler::Options o;
  o.telemetry_wait_ns = 1'000'000;
  o.telemetry_settle_ns = 1000;
  GpuRig g(o);
  g.r.as.gpu_times_from(1);
  g.run_steps();  // all three cut at time 0 (the assembler has not been given a time yet)
  g.r.drain();
  EXPECT_TRUE(g.r.as.take_ready(5000, false).empty()) << "no record has arrived";
  std::vector<GpuRecord> step0 = {kernel_record("k0", 10, 1000, 1500), kernel_record("k1", 12, 1650, 2000)};
  g.r.as.add_gpu_records(step0);
  auto ready = g.r.as.take_ready(6000, false);
  ASSERT_EQ(ready.size(), 1u) << "step 0's records are in, step 1's are not";
  EXPECT_EQ(ready[0].cupti_kernels, 2);
  EXPECT_EQ(ready[0].launches[1].gpu_ns, 350);
  EXPECT_TRUE(g.r.as.take_ready(7000, false).empty()) << "step 1's record is not in yet";
  std::vector<GpuRecord> rest = {kernel_record("k2", 15, 5000, 5100), kernel_record("k0", 17, 9000, 9050)};
  g.r.as.add_gpu_records(rest);
  ready = g.r.as.take_ready(8000, false);
  ASSERT_EQ(ready.size(), 2u);
  EXPECT_EQ(ready[0].launches[0].gpu_ns, 100);
  EXPECT_EQ(ready[1].launches[0].gpu_ns, 50);
}

TEST(StepAssembler, RecordsNeedAMomentToSettle) {
  StepAssembler::Options o;
  o.telemetry_wait_ns = 1'000'000;
  o.telemetry_settle_ns = 1000;
  GpuRig g(o);
  g.r.as.gpu_times_from(1);
  g.run_steps();
  g.r.drain();
  auto recs = GpuRig::records();
  g.r.as.add_gpu_records(recs);
  EXPECT_TRUE(g.r.as.take_ready(999, false).empty()) << "cut at 0: settles at 1000";
  EXPECT_EQ(g.r.as.take_ready(1000, false).size(), 3u);
}

TEST(StepAssembler, WithoutRecordsAStepIsTakenAfterTheTimeout) {
  StepAssembler::Options o;
  o.telemetry_wait_ns = 1'000'000;
  o.telemetry_settle_ns = 1000;
  GpuRig g(o);
  g.r.as.gpu_times_from(1);
  g.run_steps();
  g.r.drain();
  EXPECT_TRUE(g.r.as.take_ready(999'999, false).empty());
  auto ready = g.r.as.take_ready(1'000'000, false);
  ASSERT_EQ(ready.size(), 3u);
  for (const StepTrace& t : ready) {
    EXPECT_EQ(t.cupti_kernels, -1);
    EXPECT_EQ(t.gpu_busy_ns, -1);
  }
}

// Records of launches we did not see (graph nodes, a library bypassing the hooks) are not
// records of this step's launches: they must not end the wait for them. Here step 0 made
// two launches; two records of unseen kernels arrive first, then step 0's own.
TEST(StepAssembler, RecordsOfUnseenLaunchesDoNotEndTheWaitForOurs) {
  StepAssembler::Options o;
  o.telemetry_wait_ns = 1'000'000;
  o.telemetry_settle_ns = 1000;
  Rig r(o);
  r.as.gpu_times_from(1);
  const Func k = r.drv.add_kernel("k", {{0, 8}});
  DevPtr p = kVa;
  r.tr.on_alloc(p, 4096, 0);
  launch(r.tr, k, 0, p);  // corr 1
  launch(r.tr, k, 0, p);  // corr 3
  r.tr.mark_step();
  r.drain();
  std::vector<GpuRecord> early = {unseen_record(2, 150, 160), unseen_record(4, 300, 310)};
  r.as.add_gpu_records(early);
  auto ready = r.as.take_ready(5000, false);
  EXPECT_TRUE(ready.empty()) << "taken before its own records arrived: launch 0 gpu_ns = "
                             << (ready.empty() ? 0 : ready[0].launches[0].gpu_ns);
  std::vector<GpuRecord> ours = {kernel_record("k", 1, 100, 140), kernel_record("k", 3, 200, 290)};
  r.as.add_gpu_records(ours);
  for (StepTrace& t : r.as.take_ready(6000, false)) ready.push_back(std::move(t));
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].launches[0].gpu_ns, 40);
  EXPECT_EQ(ready[0].launches[1].gpu_ns, 90);
}

TEST(StepAssembler, NoWaitTakesCutStepsWithoutTimes) {
  StepAssembler::Options o;
  o.telemetry_wait_ns = 1'000'000'000;
  GpuRig g(o);
  g.r.as.gpu_times_from(1);
  g.run_steps();
  g.r.drain();
  auto ready = g.r.as.take_ready(1, false, /*no_wait=*/true);
  ASSERT_EQ(ready.size(), 3u);
  for (const StepTrace& t : ready) {
    EXPECT_EQ(t.cupti_kernels, -1);
    EXPECT_EQ(t.gpu_busy_ns, -1);
  }
}

// Another CUPTI client took the records mid-run: the steps that are cut but not finished
// may hold only part of their records, so none of them is counted, nor any later one.
TEST(StepAssembler, AfterTelemetryIsLostNoStepIsCountedOrTimed) {
  GpuRig g;
  g.run_steps();
  g.r.as.gpu_times_from(1);
  g.r.drain();
  auto all = GpuRig::records();
  std::vector<GpuRecord> part(all.begin(), all.begin() + 3);  // only the first records came
  g.r.as.add_gpu_records(part);
  g.r.as.telemetry_lost();
  g.r.pump(true);
  ASSERT_FALSE(g.r.steps.empty());
  for (const StepTrace& t : g.r.steps) {
    SCOPED_TRACE("step " + std::to_string(t.step));
    EXPECT_EQ(t.cupti_kernels, -1);
    EXPECT_EQ(t.gpu_busy_ns, -1);
  }
}

TEST(StepAssembler, StepsBeforeTelemetryStartedGetNoTimes) {
  GpuRig g;
  g.run_steps();
  g.r.as.gpu_times_from(g.step1_seq);  // telemetry started with step 1
  g.r.drain();
  auto all = GpuRig::records();
  std::vector<GpuRecord> recs(all.begin() + 4, all.end());  // from corr 14: none of step 0's
  g.r.as.add_gpu_records(recs);
  g.r.pump(true);
  ASSERT_EQ(g.r.steps.size(), 3u);
  EXPECT_EQ(g.r.steps[0].cupti_kernels, -1);
  EXPECT_EQ(g.r.steps[0].gpu_busy_ns, -1);
  EXPECT_EQ(g.r.steps[0].launches[0].gpu_ns, -1);
  EXPECT_EQ(g.r.steps[1].cupti_kernels, 2);
  EXPECT_EQ(g.r.steps[1].launches[0].gpu_ns, 100);
  EXPECT_EQ(g.r.steps[2].launches[0].gpu_ns, 50);
}

TEST(StepAssembler, WithoutTelemetryNothingIsTimed) {
  GpuRig g;  // gpu_times_from never called: telemetry never started
  g.run_steps();
  g.r.drain();
  auto recs = GpuRig::records();
  g.r.as.add_gpu_records(recs);
  g.r.pump(true);
  ASSERT_EQ(g.r.steps.size(), 3u);
  for (const StepTrace& t : g.r.steps) {
    EXPECT_EQ(t.cupti_kernels, -1);
    for (const TraceLaunch& l : t.launches) EXPECT_EQ(l.gpu_ns, -1);
  }
}

// --- replay ------------------------------------------------------------------------------

// A recorded step as the assembler writes one: weights and the batch buffer born before the
// step; last step's gradient born before and freed at position 0; activations born and
// freed inside; this step's gradient born inside and outliving the step.
StepTrace recorded_step() {
  constexpr uint64_t M = 1 << 20;
  StepTrace t;
  t.step = 9;
  t.kernels = {{0, "fwd"}, {1, "bwd"}, {2, "adam step"}, {3, "fwd_last"}};
  t.allocs.push_back({0, M, 0, -1, -1});         // weights
  t.allocs.push_back({1, M, 0, -1, 0});          // previous gradient
  t.allocs.push_back({2, 64 * 1024, 0, -1, -1}); // batch
  for (uint32_t k = 0; k < 6; ++k)               // activations 3..8, born at 1..6
    t.allocs.push_back({3 + k, 256 * 1024 * (k + 1), 0, 1 + k, 13 - k});  // freed after its bwd
  t.allocs.push_back({9, M, 0, 7, -1});          // gradient
  uint32_t pos = 0;
  auto add = [&](EventKind kind, uint32_t kernel, std::vector<uint32_t> allocs) {
    t.launches.push_back(TraceLaunch{pos++, kind, kernel, 0, -1, -1, std::move(allocs), std::nullopt, 0});
  };
  add(EventKind::Copy, 0, {2});
  add(EventKind::Kernel, 0, {0, 2, 3});
  for (uint32_t k = 1; k < 6; ++k) add(EventKind::Kernel, k == 5 ? 3 : 0, {0, 2 + k, 3 + k});
  for (uint32_t j = 0; j < 6; ++j) add(EventKind::Kernel, 1, {8 - j, 9});  // pos 7..12
  add(EventKind::Memset, 0, {9});
  for (int i = 0; i < 5; ++i) add(EventKind::Kernel, 2, {0, 9});
  add(EventKind::Kernel, 2, {0});
  return t;
}

TEST(Replay, RecordedStepIsReRecordedAndItsPeriodFound) {
  const StepTrace rec = recorded_step();
  ASSERT_EQ(rec.launches.size(), 20u);
  {  // the synthetic step is a valid trace
    std::stringstream ss;
    rec.write(ss);
    StepTrace back;
    std::string err;
    ASSERT_TRUE(StepTrace::read(ss, &back, &err)) << err;
  }
  ReplayOptions o;
  o.repeats = 6;
  ReplayResult res = replay(rec, o);
  EXPECT_EQ(res.period, rec.launches.size());
  ASSERT_EQ(res.steps.size(), 6u);
  // The first replayed step also holds the allocations made before it (born at 0 there, not
  // before the step); every later one must be the recording again.
  EXPECT_EQ(res.matching_steps, 5u) << res.first_mismatch;
  EXPECT_EQ(res.first_mismatch.rfind("step 0:", 0), 0u) << res.first_mismatch;
  for (size_t i = 1; i < res.steps.size(); ++i) {
    std::string why;
    EXPECT_TRUE(same_step(rec, res.steps[i], &why)) << "step " << i << ": " << why;
  }
}

TEST(Replay, MarkedReplayCutsAtMarks) {
  const StepTrace rec = recorded_step();
  ReplayOptions o;
  o.repeats = 4;
  o.mark_steps = true;
  ReplayResult res = replay(rec, o);
  ASSERT_EQ(res.steps.size(), 4u);
  EXPECT_EQ(res.matching_steps, 3u) << res.first_mismatch;
  EXPECT_EQ(res.period, 0u) << "marks turn automatic detection off";
}

TEST(Replay, SameStepNoticesDifferences) {
  const StepTrace a = recorded_step();
  std::string why;
  EXPECT_TRUE(same_step(a, a, &why)) << why;
  StepTrace b = a;
  b.launches[4].allocs = {0, 5};  // touches another activation
  EXPECT_FALSE(same_step(a, b, &why));
  EXPECT_NE(why.find("launch 4"), std::string::npos) << why;
  b = a;
  b.kernels[3] = "other";
  EXPECT_FALSE(same_step(a, b, &why));
  b = a;
  b.allocs[4].free_pos = 10;
  EXPECT_FALSE(same_step(a, b, &why));
  b = a;
  b.launches.pop_back();
  EXPECT_FALSE(same_step(a, b, &why));
}

// --- EventLog ------------------------------------------------------------------------------

Event payload(uint64_t producer, uint64_t index) {
  Event e;
  e.kind = EventKind::Kernel;
  e.a = producer;
  e.b = index;
  return e;
}

TEST(EventLog, DrainsInSequenceOrderWithAccesses) {
  EventLog log(64, 256);
  for (uint64_t i = 0; i < 10; ++i) {
    std::vector<AllocId> acc(i % 4);
    for (size_t k = 0; k < acc.size(); ++k) acc[k] = 100 * i + k;
    EventLog::Claim c = log.claim(static_cast<uint32_t>(acc.size()));
    ASSERT_EQ(c.seq, i + 1);
    log.publish(c, payload(0, i), acc.data(), static_cast<uint32_t>(acc.size()));
  }
  auto v = drain_all(log);
  ASSERT_EQ(v.size(), 10u);
  for (uint64_t i = 0; i < 10; ++i) {
    EXPECT_EQ(v[i].e.seq, i + 1);
    EXPECT_EQ(v[i].e.b, i);
    ASSERT_EQ(v[i].acc.size(), i % 4);
    for (size_t k = 0; k < v[i].acc.size(); ++k) EXPECT_EQ(v[i].acc[k], 100 * i + k);
  }
  EXPECT_TRUE(drain_all(log).empty());
}

TEST(EventLog, StopsAtTheFirstUnpublishedSlot) {
  EventLog log(64, 256);
  EventLog::Claim a = log.claim(0), b = log.claim(0);
  log.publish(b, payload(0, 2), nullptr, 0);
  EXPECT_TRUE(drain_all(log).empty()) << "seq 1 is claimed but not yet published";
  log.publish(a, payload(0, 1), nullptr, 0);
  auto v = drain_all(log);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].e.b, 1u);
  EXPECT_EQ(v[1].e.b, 2u);
}

TEST(EventLog, AFullRingDropsAndCounts) {
  EventLog log(256, 1024);
  uint64_t accepted = 0;
  for (int i = 0; i < 300; ++i)
    if (EventLog::Claim c = log.claim(0); c.seq) {
      log.publish(c, payload(0, static_cast<uint64_t>(i)), nullptr, 0);
      ++accepted;
    }
  EXPECT_EQ(accepted, 256u);
  EXPECT_EQ(log.dropped(), 300u - 256u);
  EXPECT_EQ(drain_all(log).size(), 256u);
  EventLog::Claim c = log.claim(0);
  EXPECT_NE(c.seq, 0u) << "room again once drained";
  log.publish(c, payload(0, 999), nullptr, 0);
  auto v = drain_all(log);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].e.seq, 257u);
}

TEST(EventLog, AccessRingOverflowTruncatesThatEventOnly) {
  EventLog log(64, 16);
  AllocId ten[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  log.publish(log.claim(10), payload(0, 0), ten, 10);
  log.publish(log.claim(10), payload(0, 1), ten, 10);  // does not fit behind the first
  auto v = drain_all(log);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].acc.size(), 10u);
  EXPECT_FALSE(v[0].e.flags & kAccessesTruncated);
  EXPECT_EQ(v[1].acc.size(), 0u);
  EXPECT_TRUE(v[1].e.flags & kAccessesTruncated);
  // The consumer caught up: the access ring is empty, so the next event's accesses fit.
  log.publish(log.claim(10), payload(0, 2), ten, 10);
  v = drain_all(log);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_FALSE(v[0].e.flags & kAccessesTruncated) << "an overflow must not truncate every later event";
  EXPECT_EQ(v[0].acc, std::vector<AllocId>(ten, ten + 10));
}

// Two producers: P1 claims seq 1, P2 claims seq 2 and publishes first. While the consumer
// handles seq 1, a third producer publishes. It must not overwrite seq 2's accesses, which
// are not consumed yet.
TEST(EventLog, AccessesOfAnUnconsumedEventAreNeverOverwritten) {
  EventLog log(64, 8);
  const EventLog::Claim c1 = log.claim(4), c2 = log.claim(4);
  AllocId p2[4] = {21, 22, 23, 24}, p1[4] = {11, 12, 13, 14}, p3[4] = {31, 32, 33, 34};
  log.publish(c2, payload(2, 0), p2, 4);
  log.publish(c1, payload(1, 0), p1, 4);
  std::map<uint64_t, Drained> got;
  log.drain([&](const Event& e, const AllocId* acc) {
    got[e.seq] = Drained{e, std::vector<AllocId>(acc, acc + e.access_count)};
    if (e.seq == c1.seq) {
      std::thread p([&] {
        if (EventLog::Claim c3 = log.claim(4); c3.seq) log.publish(c3, payload(3, 0), p3, 4);
      });
      p.join();
    }
  });
  ASSERT_TRUE(got.count(c2.seq));
  const Drained& d2 = got[c2.seq];
  EXPECT_FALSE(d2.e.flags & kAccessesTruncated);
  EXPECT_EQ(d2.acc, std::vector<AllocId>(p2, p2 + 4)) << "seq 2's accesses were overwritten";
  EXPECT_EQ(got[c1.seq].acc, std::vector<AllocId>(p1, p1 + 4));
}

TEST(EventLog, ManyProducersOneConsumer) {
  constexpr int kProducers = 4;
  constexpr uint64_t kPerProducer = 20000;
  EventLog log(1 << 16, 1 << 20);  // big enough that the accesses never wrap
  std::atomic<int> running{kProducers};
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p)
    producers.emplace_back([&, p] {
      AllocId acc[3];
      for (uint64_t i = 0; i < kPerProducer; ++i) {
        uint32_t n = static_cast<uint32_t>(i % 4);
        for (uint32_t k = 0; k < n; ++k) acc[k] = (static_cast<AllocId>(p) << 40) | (i << 4) | k;
        if (EventLog::Claim c = log.claim(n); c.seq) log.publish(c, payload(static_cast<uint64_t>(p), i), acc, n);
      }
      running.fetch_sub(1);
    });

  std::vector<int64_t> last(kProducers, -1);
  uint64_t received = 0, expected_seq = 1, bad_order = 0, bad_acc = 0;
  auto consume = [&](const Event& e, const AllocId* acc) {
    ++received;
    if (e.seq != expected_seq++) ++bad_order;
    int p = static_cast<int>(e.a);
    if (static_cast<int64_t>(e.b) <= last[p]) ++bad_order;
    last[p] = static_cast<int64_t>(e.b);
    if (e.flags & kAccessesTruncated) return;
    if (e.access_count != e.b % 4) ++bad_acc;
    for (uint32_t k = 0; k < e.access_count; ++k)
      if (acc[k] != ((static_cast<AllocId>(p) << 40) | (e.b << 4) | k)) ++bad_acc;
  };
  while (running.load() > 0) log.drain(consume);
  log.drain(consume);
  for (auto& t : producers) t.join();
  log.drain(consume);

  EXPECT_EQ(bad_order, 0u);
  EXPECT_EQ(bad_acc, 0u);
  EXPECT_EQ(received + log.dropped(), kProducers * kPerProducer);
  EXPECT_EQ(log.appended(), received);
}

// The whole hot path from several threads, with the worker side draining as it goes.
TEST(Tracker, ConcurrentHooksAndAWorker) {
  constexpr int kThreads = 4, kIters = 2000;
  SimDriver drv;
  EventLog log(1 << 16, 1 << 18);
  Tracker tr(drv, log);
  StepAssembler as(tr.funcs(), no_wait_options());
  std::vector<Func> kernels;
  for (int i = 0; i < 8; ++i) {
    // Appended, not "k" + std::to_string(i): GCC 12 at -O3 takes that operator's insert for
    // an overlapping memcpy (-Wrestrict, a false positive of its libstdc++).
    std::string name = "k";
    name += std::to_string(i);
    kernels.push_back(drv.add_kernel(name, {{0, 8}, {8, 4}}));
  }

  std::atomic<int> running{kThreads};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      const DevPtr region = kVa + static_cast<DevPtr>(t) * (1ull << 32);
      for (int i = 0; i < kIters; ++i) {
        DevPtr p = region + static_cast<DevPtr>(i % 16) * 0x10000;
        tr.on_alloc(p, 0x8000, static_cast<Stream>(t));
        launch(tr, kernels[static_cast<size_t>(i + t) % kernels.size()], static_cast<Stream>(t), p + 8, 42);
        tr.on_free(p, static_cast<Stream>(t));
      }
      running.fetch_sub(1);
    });
  std::vector<StepTrace> steps;
  auto pump = [&](bool final) {
    log.drain([&](const Event& e, const AllocId* acc) { as.consume(e, acc); });
    for (StepTrace& s : as.take_ready(0, final)) steps.push_back(std::move(s));
  };
  while (running.load() > 0) pump(false);
  for (auto& th : threads) th.join();
  pump(true);

  EXPECT_EQ(log.dropped(), 0u);
  const uint64_t total = static_cast<uint64_t>(kThreads) * kIters;
  EXPECT_EQ(tr.counters().kernels.load(), total);
  EXPECT_EQ(tr.counters().allocs.load(), total);
  EXPECT_EQ(tr.counters().frees.load(), total);
  EXPECT_EQ(tr.counters().unknown_frees.load(), 0u);
  EXPECT_EQ(tr.allocs().size(), 0u);
  EXPECT_EQ(tr.allocs().live_bytes(), 0u);
  EXPECT_EQ(drv.param_queries(), kernels.size());
  size_t launches = 0;
  for (const StepTrace& s : steps)
    for (const TraceLaunch& l : s.launches) {
      ++launches;
      EXPECT_EQ(l.allocs.size(), 1u) << "each launch touched exactly its thread's live allocation";
    }
  EXPECT_EQ(launches, total);
}

}  // namespace
}  // namespace offload

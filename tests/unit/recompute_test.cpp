// Recompute under the cap (Residency::Options::recompute), on the simulated driver: a range that
// one launch produced is made again by that launch instead of copied back, and only when it is
// safe. Each refusal rule has a test that fails when the rule is switched off (a Fault): an input
// changed after the original launch, a kernel that draws random numbers, a kernel that writes
// outside its output (whose bytes there are kept), a kernel whose remake differs from the saved
// bytes, and the stream orders (after an input's reload; a later writer after the remake; a side
// saved after, and put back before, other streams' work on it).
#include "recompute_rig.h"

namespace offload {
namespace recompute_test {
namespace {

TEST(Recompute, AProducedRangeIsMadeAgainInsteadOfCopiedIn) {
  Rig r(3);
  const DevPtr x = learned_input(r, false);
  const DevPtr y = produce_and_evict(r, x);
  const uint64_t in_before = r.res.stats().bytes_in;
  r.use(y);
  const Residency::Stats st = r.res.stats();
  EXPECT_EQ(st.recomputed, 1u);
  EXPECT_EQ(st.recompute_checks, 1u);  // its first remake, checked against the saved copy
  EXPECT_EQ(st.recompute_bans, 0u);
  EXPECT_EQ(st.bytes_in, in_before);   // nothing copied in for it
  EXPECT_TRUE(r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
  EXPECT_EQ(st.probes, 4u * Residency::kRecomputeProbes);  // fill, read, scale, bump
  // A second remake of the kernel is trusted: not checked again.
  r.evict({y}, {x});
  r.use(y);
  EXPECT_EQ(r.res.stats().recomputed, 2u);
  EXPECT_EQ(r.res.stats().recompute_checks, 1u);
  EXPECT_TRUE(r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
}

// Probes hash what a launch touches on the GPU where the driver can, and copy it to the host where
// it cannot: the same writes are learned either way, and the same range made again.
TEST(Recompute, ProbesHashOnTheGpuOrCopyToTheHostAlike) {
  for (bool on_gpu : {true, false}) {
    SCOPED_TRACE(on_gpu ? "hashed on the GPU" : "copied to the host");
    Rig r(3);
    r.sim.set_hashing(on_gpu);
    const DevPtr x = learned_input(r, false);
    const DevPtr y = produce_and_evict(r, x);
    r.use(y);
    const Residency::Stats st = r.res.stats();
    EXPECT_EQ(st.recomputed, 1u);
    EXPECT_EQ(st.probes, 4u * Residency::kRecomputeProbes);
    EXPECT_EQ(st.probes_on_gpu, on_gpu ? st.probes : 0u);
    if (on_gpu) EXPECT_GE(r.sim.hashes(), 2 * st.probes);  // each range touched, before and after
    else EXPECT_EQ(r.sim.hashes(), 0u);
    EXPECT_TRUE(r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
  }
}

TEST(Recompute, OffMakesNothingAgain) {
  Rig r(3, Fault::None, false);
  const DevPtr x = learned_input(r, false);
  const DevPtr y = produce_and_evict(r, x);
  const uint64_t in_before = r.res.stats().bytes_in;
  r.use(y);
  EXPECT_EQ(r.res.stats().recomputed, 0u);
  EXPECT_EQ(r.res.stats().probes, 0u);
  EXPECT_EQ(r.res.stats().bytes_in, in_before + kGran);
  EXPECT_TRUE(r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
}

// Its input written after the original launch: the remake would read the new bytes. The kernel is
// trusted first (one clean remake), so that no check stands between a wrong remake and the range.
TEST(Recompute, AnInputChangedSinceTheLaunchIsRefused) {
  for (Fault f : {Fault::None, Fault::RecomputeIgnoreVersions}) {
    SCOPED_TRACE(f == Fault::None ? "checked" : "versions ignored");
    Rig r(3, f);
    const DevPtr x = learned_input(r, true);
    r.launch(r.bump, {x});
    // x is 7000 + i + 1 now; y is made from it, then x written again.
    const DevPtr y = r.alloc();
    r.launch(r.scale, {y, x});
    r.launch(r.bump, {x});
    r.evict({y}, {x});
    r.use(y);
    const bool right = r.is(y, [](uint64_t i) { return 3 * (7000 + i + 1) + 1; });
    if (f == Fault::None) {
      EXPECT_TRUE(right);
      EXPECT_EQ(r.res.stats().recomputed, 1u);  // refused: copied in
    } else {
      EXPECT_FALSE(right);  // the rule is what kept the bytes
    }
  }
}

TEST(Recompute, AKernelThatDrawsRandomNumbersIsNeverMadeAgain) {
  for (Fault f : {Fault::None, Fault::RecomputeIgnoreNames}) {
    SCOPED_TRACE(f == Fault::None ? "checked" : "names ignored");
    Rig r(3, f);
    const DevPtr x = learned_input(r, false);
    learn(r, r.rng, 1, {x});
    const DevPtr y = produce_and_evict(r, x, r.rng);
    r.use(y);
    const Residency::Stats st = r.res.stats();
    constexpr uint64_t draw = Residency::kRecomputeProbes + 1;  // its draw after those of the probes
    EXPECT_TRUE(r.is(y, [](uint64_t i) { return (7000 + i) ^ (draw << 32); }));
    if (f == Fault::None) {
      EXPECT_EQ(st.recompute_checks, 0u);  // not even tried
      EXPECT_EQ(st.recomputed, 0u);
    } else {
      EXPECT_EQ(st.recompute_checks, 1u);  // tried: the check caught it
      EXPECT_EQ(st.recompute_bans, 1u);
    }
  }
}

// A kernel that writes a range besides its output (running statistics, a library's workspace):
// made again, it writes that range once more, so its bytes are saved beside it and put back after.
// Where the driver cannot copy on the device, it is never made again.
TEST(Recompute, AKernelThatWritesOutsideItsOutputLeavesThoseBytesAsTheyWere) {
  enum Case { Kept, NotKept, IgnoreWrites, NoDeviceCopies };
  for (Case c : {Kept, NotKept, IgnoreWrites, NoDeviceCopies}) {
    SCOPED_TRACE(c == Kept ? "kept" : c == NotKept ? "not put back" : c == IgnoreWrites ? "writes ignored" : "no device copies");
    Rig r(5, c == NotKept ? Fault::RecomputeSideNotKept : c == IgnoreWrites ? Fault::RecomputeIgnoreWrites : Fault::None);
    r.sim.set_device_copies(c != NoDeviceCopies);
    const DevPtr x = learned_input(r, false);
    const DevPtr stats = r.alloc();
    r.launch(r.fill, {stats, 0});
    learn(r, r.norm, 1, {x, stats});  // writes its output and stats
    const DevPtr y = r.alloc();
    ::testing::internal::CaptureStderr();
    r.launch(r.norm, {y, x, stats});
    const std::string said = ::testing::internal::GetCapturedStderr();
    // The log names the kernel, what else it wrote and whether that is kept: which range a
    // library's workspace is, on a GPU.
    if (c == Kept) {
      EXPECT_NE(said.find("norm_with_stats made a range of 64 KiB and also wrote 0x"), std::string::npos) << said;
      EXPECT_NE(said.find("(64 KiB): kept across its launches made again"), std::string::npos) << said;
    } else if (c == NoDeviceCopies) {
      EXPECT_NE(said.find("never made again: the driver does not copy on the device"), std::string::npos) << said;
    }
    r.evict({y}, {x, stats});
    r.use(y);
    EXPECT_TRUE(r.is(y, [](uint64_t i) { return 2 * (7000 + i); }));
    const uint64_t launches = r.word(stats, 0);
    constexpr uint64_t ran = Residency::kRecomputeProbes + 1;
    const Residency::Stats st = r.res.stats();
    EXPECT_EQ(st.recomputed, c == NoDeviceCopies ? 0u : 1u);
    if (c == Kept) {
      EXPECT_EQ(launches, ran);  // the remake's count was put back
      EXPECT_TRUE(r.is(stats, [&](uint64_t i) { return i ? i : ran; }));
      EXPECT_EQ(st.side_kept, 1u);
      EXPECT_EQ(st.side_kept_bytes, kGran);
      EXPECT_EQ(st.not_producer_alone, 0u);
    } else if (c == NotKept) {
      EXPECT_EQ(launches, 1u);  // zeroed, counted once, left so
    } else if (c == IgnoreWrites) {
      EXPECT_EQ(launches, ran + 1);  // written again by the remake
    } else {
      EXPECT_EQ(launches, ran);
      EXPECT_EQ(st.not_producer_alone, 1u);  // counted, so that a run's log says why
    }
  }
}

// A kernel whose output reads the range it also writes: its side is zeroed for the second launch,
// so the output differs and the check refuses that side (the kernel is not banned: its launches
// that write nothing besides may still be made again); unchecked, the range would be wrong.
TEST(Recompute, AKernelWhoseOutputReadsItsSideIsRefusedAtItsCheck) {
  for (Fault f : {Fault::None, Fault::RecomputeUnchecked}) {
    SCOPED_TRACE(f == Fault::None ? "checked" : "unchecked");
    Rig r(5, f);
    const DevPtr x = learned_input(r, false);
    const DevPtr ctr = r.alloc();
    r.launch(r.zero, {ctr});
    learn(r, r.acc, 1, {x, ctr});
    const DevPtr y = r.alloc();
    r.launch(r.acc, {y, x, ctr});  // y = x + kRecomputeProbes
    r.evict({y}, {x, ctr});
    r.use(y);
    const bool right = r.is(y, [](uint64_t i) { return 7000 + i + Residency::kRecomputeProbes; });
    EXPECT_EQ(r.word(ctr, 0), Residency::kRecomputeProbes + 1u);  // put back either way
    if (f == Fault::None) {
      EXPECT_TRUE(right);
      EXPECT_EQ(r.res.stats().side_refused, 1u);
      EXPECT_EQ(r.res.stats().recompute_bans, 0u);
      // Its later launches that write ctr are no producers: copied back.
      const uint64_t alone = r.res.stats().not_producer_alone;
      const DevPtr z = r.alloc();
      r.launch(r.acc, {z, x, ctr});
      r.evict({z}, {x, ctr});
      r.use(z);
      EXPECT_TRUE(r.is(z, [](uint64_t i) { return 7000 + i + Residency::kRecomputeProbes + 1; }));
      EXPECT_EQ(r.res.stats().recomputed, 0u);
      EXPECT_EQ(r.res.stats().not_producer_alone, alone + 1);
    } else {
      EXPECT_FALSE(right);
    }
  }
}

// A range made again on another stream from a range that a launch made again wrote as its side
// (zeroed, then put back): it waits for the bytes to be put back, which the program never ordered
// it after.
TEST(Recompute, AnInputWrittenAsASideElsewhereIsReadAfterItIsPutBack) {
  for (Fault f : {Fault::None, Fault::RecomputeSkipReadOrder}) {
    SCOPED_TRACE(f == Fault::None ? "ordered" : "not ordered");
    int wrong = 0;
    for (uint64_t seed = 1; seed <= 8; ++seed) {
      Rig r(6, f);
      const DevPtr x = learned_input(r, true);
      const DevPtr ws = r.alloc();
      r.launch(r.fill, {ws, 0});
      const uint64_t ran = trust_norm(r, x, ws) + 1;
      const DevPtr n = r.alloc();
      r.launch(r.norm, {n, x, ws});  // ws[0] = ran
      const DevPtr m = r.alloc();
      r.launch(r.scale, {m, ws});  // m from ws as it is now
      r.evict({n, m}, {x, ws});
      std::vector<uint64_t> na{n}, ma{m};
      std::vector<void*> np{&na[0]}, mp{&ma[0]};
      const LaunchGeom g;
      r.tr.on_kernel(r.read, kA, np.data(), nullptr, &g);  // n made again on kA: ws zeroed, put back
      r.sim.launch_kernel(r.read, g, kA, np.data());
      r.res.after_launch();
      r.tr.on_kernel(r.read, kB, mp.data(), nullptr, &g);  // m made again on kB, from ws
      r.sim.launch_kernel(r.read, g, kB, mp.data());
      r.res.after_launch();
      std::mt19937_64 rng(seed);
      while (r.sim.step(rng)) {
      }
      EXPECT_GE(r.res.stats().recomputed, 3u);  // trust_norm's, n's and m's
      if (!r.is(m, [&](uint64_t i) { return 3 * (i ? i : ran) + 1; })) ++wrong;
    }
    if (f == Fault::None) EXPECT_EQ(wrong, 0);
    else EXPECT_GT(wrong, 0);
  }
}

// An operand a kernel once updated in place (out and a the same range) is taken as written at
// both positions: the probe cannot tell which wrote. Seen unwritten where it is alone at its
// position, it is read there: a launch of that kernel making a new range from it is a producer
// (a residual add, whose kernel autograd also uses to sum gradients in place). A later update in
// place still moves its version.
TEST(Recompute, AnOperandOnceUpdatedInPlaceIsNotTakenAsWrittenWhereItIsAlone) {
  for (Fault f : {Fault::None, Fault::RecomputeAliasedWrites}) {
    SCOPED_TRACE(f == Fault::None ? "told apart where alone" : "written wherever once written");
    Rig r(5, f);
    const DevPtr x = learned_input(r, false);
    const DevPtr v = r.alloc();
    r.launch(r.fill, {v, 2});  // made by a producer: its writes matter, the next launch is watched
    r.launch(r.add2, {v, v, x});  // in place: v += x, both first positions written
    for (uint8_t i = 1; i < Residency::kRecomputeProbes; ++i) {
      const DevPtr t = r.alloc();
      r.launch(r.add2, {t, v, x});  // out of place: v alone at its position, unwritten
      r.free(t);
    }
    const DevPtr c = r.alloc();
    r.launch(r.add2, {c, v, x});  // c = 2000 + 7000 + 2 (7000 + i)
    r.evict({c}, {x, v});
    r.use(c);
    EXPECT_TRUE(r.is(c, [](uint64_t i) { return 2000 + i + 2 * (7000 + i); }));
    EXPECT_TRUE(r.is(v, [](uint64_t i) { return 2000 + i + 7000 + i; }));
    EXPECT_EQ(r.res.stats().side_refused, 0u);
    if (f == Fault::None) {
      EXPECT_EQ(r.res.stats().not_producer_alone, 0u);  // v read there, not written: c has a producer
      EXPECT_EQ(r.res.stats().recomputed, 1u);
    } else {
      EXPECT_EQ(r.res.stats().not_producer_alone, 1u);  // v counts as written there: no producer
      EXPECT_EQ(r.res.stats().recomputed, 0u);
    }
    // An update in place after that still counts as a write of v: a range made from v before is
    // copied back with the bytes it was made with.
    r.free(c);
    const DevPtr d = r.alloc();
    r.launch(r.add2, {d, v, x});
    r.launch(r.add2, {v, v, x});
    r.evict({d}, {x, v});
    const uint64_t stale = r.res.stats().remake_stale;
    r.use(d);
    EXPECT_TRUE(r.is(d, [](uint64_t i) { return 2000 + i + 2 * (7000 + i); }));
    if (f == Fault::None) {
      EXPECT_EQ(r.res.stats().remake_stale, stale + 1);
    }
  }
}

// A split-K workspace's counter must start at zero, as the library's memset before each launch
// leaves it; the launch leaves it set. Its side is zeroed for the second launch, so that launch
// gives the bytes the first gave; not zeroed, the check refuses the side.
TEST(Recompute, ASideIsZeroedForTheSecondLaunch) {
  for (Fault f : {Fault::None, Fault::RecomputeSideNotZeroed}) {
    SCOPED_TRACE(f == Fault::None ? "zeroed" : "not zeroed");
    Rig r(5, f);
    const DevPtr x = learned_input(r, false);
    const DevPtr flag = r.alloc();
    for (uint8_t i = 0; i < Residency::kRecomputeProbes; ++i) {
      const DevPtr t = r.alloc();
      r.launch(r.zero, {flag});
      r.launch(r.sem, {t, x, flag});
      r.free(t);
    }
    const DevPtr y = r.alloc();
    r.launch(r.zero, {flag});
    r.launch(r.sem, {y, x, flag});
    r.evict({y}, {x, flag});
    r.use(y);
    EXPECT_TRUE(r.is(y, [](uint64_t i) { return 5 * (7000 + i); }));
    EXPECT_EQ(r.word(flag, 0), 1u);
    EXPECT_EQ(r.res.stats().recomputed, f == Fault::None ? 1u : 0u);
    EXPECT_EQ(r.res.stats().side_refused, f == Fault::None ? 0u : 1u);
    EXPECT_EQ(r.res.stats().recompute_bans, 0u);
  }
}

// A side is saved after every stream's work on it so far, and a later launch on another stream
// that touches it waits until it is put back: the program ordered neither around a launch it never
// made. Here stats is bumped on kB just before (or just after) y is made again on kA; either way
// the bump must survive.
TEST(Recompute, ASideIsKeptInStreamOrder) {
  for (bool later : {false, true})
    for (Fault f : {Fault::None, later ? Fault::RecomputeSkipReadOrder : Fault::RecomputeSkipSideWait}) {
      SCOPED_TRACE(std::string(later ? "bumped after" : "bumped before") + (f == Fault::None ? ", ordered" : ", not ordered"));
      int wrong = 0;
      for (uint64_t seed = 1; seed <= 8; ++seed) {
        Rig r(5, f);
        const DevPtr x = learned_input(r, false);
        const DevPtr stats = r.alloc();
        r.launch(r.fill, {stats, 0});
        const uint64_t ran = trust_norm(r, x, stats) + 1;
        const DevPtr y = r.alloc();
        r.launch(r.norm, {y, x, stats});
        r.evict({y}, {x, stats});
        std::vector<uint64_t> ya{y}, sa{stats};
        std::vector<void*> yp{&ya[0]}, sp{&sa[0]};
        const LaunchGeom g;
        auto bump_stats = [&] {
          r.tr.on_kernel(r.bump, kB, sp.data(), nullptr, &g);
          r.sim.launch_kernel(r.bump, g, kB, sp.data());
          r.res.after_launch();
        };
        if (!later) bump_stats();
        r.tr.on_kernel(r.read, kA, yp.data(), nullptr, &g);  // y made again on kA
        r.sim.launch_kernel(r.read, g, kA, yp.data());
        r.res.after_launch();
        if (later) bump_stats();
        std::mt19937_64 rng(seed);
        while (r.sim.step(rng)) {
        }
        EXPECT_EQ(r.res.stats().side_kept, 2u);
        EXPECT_TRUE(r.is(y, [](uint64_t i) { return 2 * (7000 + i); }));
        if (!r.is(stats, [&](uint64_t i) { return (i ? i : ran) + 1; })) ++wrong;
      }
      if (f == Fault::None) EXPECT_EQ(wrong, 0);
      else EXPECT_GT(wrong, 0);
    }
}

// A launch that made two new ranges: made again for one, it would write the other too, which may
// have moved on since. Either may be the one moved on. Two rules refuse it (a producer makes one
// new range; the other one counts as an input, whose version moved), so removing either alone
// leaves this test passing.
TEST(Recompute, ALaunchThatMakesTwoNewRangesIsNeverMadeAgain) {
  for (int moved : {0, 1}) {
    SCOPED_TRACE(moved ? "second moved on" : "first moved on");
    Rig r(4);
    const DevPtr x = learned_input(r, false);
    learn(r, r.split, 2, {x});
    const DevPtr a = r.alloc(), b = r.alloc();
    r.launch(r.split, {a, b, x});
    const DevPtr on = moved ? b : a, out = moved ? a : b;
    r.launch(r.bump, {on});
    r.evict({out}, {x, on});
    r.use(out);
    EXPECT_EQ(r.res.stats().recomputed, 0u);
    EXPECT_TRUE(r.is(a, [&](uint64_t i) { return 7000 + i + 5 + (moved ? 0 : 1); }));
    EXPECT_TRUE(r.is(b, [&](uint64_t i) { return 7000 + i + 7 + (moved ? 1 : 0); }));
  }
}

// A kernel whose remake gives other bytes than its launch did: the first remake is compared with
// the saved copy, the difference bans the kernel and the copy goes in.
TEST(Recompute, AKernelWhoseRemakeDiffersIsBanned) {
  for (Fault f : {Fault::None, Fault::RecomputeUnchecked}) {
    SCOPED_TRACE(f == Fault::None ? "checked" : "unchecked");
    Rig r(3, f);
    const DevPtr x = learned_input(r, false);
    learn(r, r.noisy, 1, {x});
    const DevPtr y = produce_and_evict(r, x, r.noisy);
    r.use(y);
    constexpr uint64_t run = Residency::kRecomputeProbes + 1;  // its run after those of the probes
    const bool right = r.is(y, [](uint64_t i) { return 7000 + i + run; });
    if (f == Fault::None) {
      EXPECT_TRUE(right);
      EXPECT_EQ(r.res.stats().recompute_bans, 1u);
      EXPECT_EQ(r.res.stats().recomputed, 0u);
      // Banned: not tried again.
      r.evict({y}, {x});
      r.use(y);
      EXPECT_EQ(r.res.stats().recompute_checks, 1u);
      EXPECT_TRUE(r.is(y, [](uint64_t i) { return 7000 + i + run; }));
    } else {
      EXPECT_FALSE(right);
    }
  }
}

// The remake reads an input reloaded on another stream: it waits for that copy. The kernel is
// trusted first; the copy is held back until nothing else can run, so a remake that does not wait
// for it reads the input before its bytes arrive.
TEST(Recompute, AMakeAgainWaitsForItsInputsReloadOnAnotherStream) {
  for (Fault f : {Fault::None, Fault::RecomputeSkipInputWait}) {
    SCOPED_TRACE(f == Fault::None ? "waits" : "no wait");
    Rig r(3, f);
    const DevPtr x = learned_input(r, true);
    const DevPtr y = r.alloc();
    r.launch(r.scale, {y, x});
    r.evict({x, y}, {});  // both out; x reloaded first, on kB
    r.sim.set_copy_delay(true);
    std::vector<uint64_t> args{x};
    std::vector<void*> p{&args[0]};
    const LaunchGeom g;
    r.tr.on_kernel(r.read, kB, p.data(), nullptr, &g);  // x reloaded on kB (copy queued)
    r.sim.launch_kernel(r.read, g, kB, p.data());
    r.res.after_launch();
    r.use(y, kA);  // y made again on kA from x
    std::mt19937_64 rng(1);
    while (r.sim.step(rng)) {
    }
    const bool right = r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; });
    EXPECT_EQ(r.res.stats().recomputed, 2u);
    if (f == Fault::None) EXPECT_TRUE(right);
    else EXPECT_FALSE(right);
  }
}

// A launch on another stream that writes an input after the remake was queued: it waits for the
// remake, which the application never ordered its work after.
TEST(Recompute, ALaterWriterOnAnotherStreamWaitsForTheRemake) {
  for (Fault f : {Fault::None, Fault::RecomputeSkipReadOrder}) {
    SCOPED_TRACE(f == Fault::None ? "ordered" : "not ordered");
    int wrong = 0;
    for (uint64_t seed = 1; seed <= 8; ++seed) {
      Rig r(3, f);
      const DevPtr x = learned_input(r, false);
      r.launch(r.bump, {x});  // x is 7001 + i
      trust_scale(r, x);
      const DevPtr y = r.alloc();
      r.launch(r.scale, {y, x});
      r.evict({y}, {x});
      // y made again on kA, then x bumped on kB: the program orders kB after nothing of kA's.
      std::vector<uint64_t> ya{y}, xa{x};
      std::vector<void*> yp{&ya[0]}, xp{&xa[0]};
      const LaunchGeom g;
      r.tr.on_kernel(r.read, kA, yp.data(), nullptr, &g);
      r.sim.launch_kernel(r.read, g, kA, yp.data());
      r.res.after_launch();
      r.tr.on_kernel(r.bump, kB, xp.data(), nullptr, &g);
      r.sim.launch_kernel(r.bump, g, kB, xp.data());
      r.res.after_launch();
      std::mt19937_64 rng(seed);
      while (r.sim.step(rng)) {
      }
      EXPECT_EQ(r.res.stats().recomputed, 2u);
      if (!r.is(y, [](uint64_t i) { return 3 * (7000 + i + 1) + 1; })) ++wrong;  // x was 7001+i when y was made
    }
    if (f == Fault::None) EXPECT_EQ(wrong, 0);
    else EXPECT_GT(wrong, 0);
  }
}

// A launch whose range is made again first touches the remake's input, which it does not touch
// itself: another thread's allocation may evict that input before the launch is forwarded, and the
// event it records on the launch's stream then precedes the launch. That event must not stand for
// the launch later: the copy out of what the launch writes waits for the launch, or copies bytes
// the launch had not written yet.
TEST(Recompute, AnEventRecordedBeforeALaunchIsForwardedDoesNotStandForIt) {
  for (Fault f : {Fault::None, Fault::TagEventsAsAsked}) {
    SCOPED_TRACE(f == Fault::None ? "numbered as forwarded" : "numbered as asked");
    int wrong = 0;
    for (uint64_t seed = 1; seed <= 8; ++seed) {
      Rig r(3, f);
      const DevPtr x = learned_input(r, true);
      learn(r, r.rng, 1, {x});  // its launches no longer watched (a probe waits for its launch)
      const DevPtr y = produce_and_evict(r, x);  // dropped: made again from x when read
      const DevPtr out = r.alloc();
      // out = y ^ a draw, on kA: y made again first, reading x at this launch.
      std::vector<uint64_t> args{out, y};
      std::vector<void*> p{&args[0], &args[1]};
      const LaunchGeom g;
      r.tr.on_kernel(r.rng, kA, p.data(), nullptr, &g);
      ASSERT_EQ(r.state(y), Residency::State::CopyingIn);
      // Another thread takes room before the launch is forwarded: x, the one range not in flight.
      const DevPtr z = r.alloc(kB);
      ASSERT_NE(r.state(x), Residency::State::Resident);
      // The program has kA wait for other work first: the GPU may run a copy out that nothing
      // orders after the launch before the launch itself.
      const uint64_t gate = r.sim.create_event();
      for (int i = 0; i < 64; ++i) r.sim.launch(kC, [] {});
      r.sim.record_event(gate, kC);
      r.sim.stream_wait(kA, gate);
      ASSERT_TRUE(r.sim.launch_kernel(r.rng, g, kA, p.data()));
      r.res.after_launch();
      // Then out, the least recently used, goes for the next allocation (the others touched on kB,
      // whose work waits for nothing of kA's since).
      r.launch(r.read, {z}, kB);
      r.launch(r.read, {y}, kB);
      const DevPtr w = r.alloc(kB);
      ASSERT_NE(r.state(out), Residency::State::Resident);
      std::mt19937_64 rng(seed);
      while (r.sim.step(rng)) {
      }
      r.use(out);
      const uint64_t draw = r.draws;  // the last launch's
      if (!r.is(out, [&](uint64_t i) { return (3 * (7000 + i) + 1) ^ (draw << 32); })) ++wrong;
      r.free(w, kB);
      r.free(z, kB);
      r.sim.destroy_event(gate);
    }
    if (f == Fault::None) {
      EXPECT_EQ(wrong, 0);
    } else {
      EXPECT_GT(wrong, 0);
    }
  }
}

// A kernel that writes zeros, watched on new memory that already held zeros (as memory just made
// often does): a new range counts as written whatever its bytes do. Taken for a reader, its later
// launches on an input would leave that input's version alone.
TEST(Recompute, AWriteOfTheBytesANewRangeHeldStillCounts) {
  for (Fault f : {Fault::None, Fault::RecomputeFreshByHash}) {
    SCOPED_TRACE(f == Fault::None ? "new counts as written" : "by its bytes alone");
    Rig r(3, f);
    const DevPtr x = learned_input(r, false);
    for (uint8_t i = 0; i < Residency::kRecomputeProbes; ++i) {
      const DevPtr t = r.alloc();
      r.sim.run_all();
      std::memset(words(t), 0, kGran);  // zeros already, as new memory often is
      r.launch(r.zero, {t});
      r.free(t);
    }
    trust_scale(r, x);
    const DevPtr y = r.alloc();
    r.launch(r.scale, {y, x});
    r.launch(r.zero, {x});
    r.evict({y}, {x});
    r.use(y);
    const bool right = r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; });
    if (f == Fault::None) EXPECT_TRUE(right);
    else EXPECT_FALSE(right);
  }
}

// An in-place kernel whose first watched launch changes nothing (every value already positive):
// its writes are what its first launches wrote together, so a later launch that does change its
// range moves that range's version.
TEST(Recompute, AWriteHiddenInOneWatchedLaunchShowsInAnother) {
  Rig r(4);
  const DevPtr x = learned_input(r, false);
  const DevPtr pos = r.alloc(), neg = r.alloc();
  r.launch(r.fill, {pos, 1});
  r.launch(r.fill, {neg, 1});
  r.launch(r.bump, {neg});
  r.launch(r.relu, {pos});  // changes nothing
  std::vector<int64_t> minus(kWords, -1);
  for (uint8_t i = 1; i < Residency::kRecomputeProbes; ++i) {
    r.sim.run_all();
    std::memcpy(words(neg), minus.data(), kGran);  // the host's own bytes: negative everywhere
    r.launch(r.relu, {neg});                       // changes everything
  }
  r.free(pos);
  r.free(neg);
  trust_scale(r, x);
  // x negative in half its words, y made from it, then x rectified.
  r.sim.run_all();
  for (uint64_t i = 0; i < kWords; i += 2) words(x)[i] = uint64_t(-1);
  const DevPtr y = r.alloc();
  r.launch(r.scale, {y, x});
  r.launch(r.relu, {x});
  r.evict({y}, {x});
  r.use(y);
  EXPECT_TRUE(r.is(y, [](uint64_t i) { return i % 2 ? 3 * (7000 + i) + 1 : 3 * uint64_t(-1) + 1; }));
  EXPECT_EQ(r.res.stats().recomputed, 1u);  // trust_scale's alone
}

// A kernel is watched only where its writes matter: where it makes a new range, or touches one a
// producer was made from. Elsewhere it is taken to write all it touches, at no cost.
TEST(Recompute, OnlyLaunchesWhoseWritesMatterAreWatched) {
  Rig r(4, Fault::RecomputeNoUpdates);
  const DevPtr x = learned_input(r, false);  // the common kernels learned (x stays live)
  const DevPtr z = r.alloc();
  r.launch(r.scale, {z, x});
  r.launch(r.bump, {z});  // written again: no producer makes it now (updates not kept)
  const uint64_t probes = r.res.stats().probes;
  for (int i = 0; i < 3; ++i) r.launch(r.relu, {z});
  EXPECT_EQ(r.res.stats().probes, probes);  // z has no producer and is no producer's input
  const DevPtr t = r.alloc();
  r.launch(r.scale, {t, z});  // now it is
  r.launch(r.relu, {z});
  EXPECT_EQ(r.res.stats().probes, probes + 1);
}

// A launch that also reads an allocation outside the ranges (the allocator's pool, or an arena of a
// plan on top): the manager does not follow that one's versions, so the launch is no producer.
TEST(Recompute, ALaunchReadingAnAllocationOutsideTheRangesIsNoProducer) {
  for (uint64_t tag : {uint64_t{0}, uint64_t{1}}) {  // the pool's; an arena member's
    SCOPED_TRACE(tag ? "arena member" : "pool allocation");
    Rig r(4);
    const DevPtr x = learned_input(r, true);
    const DevPtr other = r.sim.alloc(kGran);
    r.tr.on_alloc(other, kGran, kA, tag);
    const uint64_t checks = r.res.stats().recompute_checks;
    learn(r, r.norm, 1, {x, other});  // norm(out, x, other): other is written, but not a range
    const DevPtr y = r.alloc();
    r.launch(r.norm, {y, x, other});
    r.evict({y}, {x});
    r.use(y);
    EXPECT_EQ(r.res.stats().recomputed, 1u);  // trust_scale's alone
    EXPECT_EQ(r.res.stats().dropped, 0u);
    EXPECT_EQ(r.res.stats().recompute_checks, checks);
    EXPECT_TRUE(r.is(y, [](uint64_t i) { return 2 * (7000 + i); }));
  }
}

// A launch the hook could not describe for launching again is counted, and makes nothing it
// touches a producer: one without geometry (a cooperative launch), and one whose geometry names an
// attribute that forbids a second launch.
TEST(Recompute, ALaunchWithoutItsArgumentsIsCountedAndProducesNothing) {
  for (bool refused_attr : {false, true}) {
    SCOPED_TRACE(refused_attr ? "a refused attribute" : "no geometry");
    Rig r(4);
    const DevPtr x = learned_input(r, true);
    const uint64_t before = r.res.stats().undescribed;
    const DevPtr y = r.alloc();
    std::vector<uint64_t> args{y, x};
    std::vector<void*> p{&args[0], &args[1]};
    LaunchGeom g;
    g.refused_attr = 2;  // CU_LAUNCH_ATTRIBUTE_COOPERATIVE
    r.tr.on_kernel(r.scale, kA, p.data(), nullptr, refused_attr ? &g : nullptr);
    ASSERT_TRUE(r.sim.launch_kernel(r.scale, LaunchGeom{}, kA, p.data()));
    r.res.after_launch();
    EXPECT_EQ(r.res.stats().undescribed, before + 1);
    r.evict({y}, {x});
    r.use(y);
    EXPECT_EQ(r.res.stats().recomputed, 1u);  // trust_scale's alone
    EXPECT_TRUE(r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
  }
}

// A launch whose arguments come packed in one buffer (`extra`, as cuBLAS launches its GEMMs) is
// learned and made a producer like any other, and made again from the manager's copy of that
// buffer: the caller's is reused at once.
TEST(Recompute, ALaunchWithPackedArgumentsIsMadeAgainFromACopy) {
  Rig r(4);
  const DevPtr x = learned_input(r, false);
  const Func gemm = r.sim.add_kernel("gemm_packed", params(2), [](const unsigned char* a) {
    for (uint64_t i = 0; i < kWords; ++i) words(arg(a, 0))[i] = 3 * words(arg(a, 1))[i] + 1;
  });
  auto packed = [&](DevPtr out) {
    std::vector<uint64_t> buf{out, x};
    size_t len = 16;
    void* extra[] = {reinterpret_cast<void*>(1), buf.data(), reinterpret_cast<void*>(2), &len, nullptr};
    const LaunchGeom g;
    r.tr.on_kernel(gemm, kA, nullptr, extra, &g);
    ASSERT_FALSE(Residency::take_refusal()) << r.res.error();
    ASSERT_TRUE(r.sim.launch_kernel(gemm, g, kA, nullptr, extra));
    r.res.after_launch();
    r.sim.run_all();
    std::fill(buf.begin(), buf.end(), 0);
  };
  for (uint8_t i = 0; i < Residency::kRecomputeProbes; ++i) {
    const DevPtr t = r.alloc();
    packed(t);
    r.free(t);
  }
  const uint64_t producers = r.res.stats().producers;
  const DevPtr y = r.alloc();
  packed(y);
  EXPECT_EQ(r.res.stats().producers, producers + 1);
  r.evict({y}, {x});
  const uint64_t in_before = r.res.stats().bytes_in;
  r.use(y);
  EXPECT_EQ(r.res.stats().recomputed, 1u);
  EXPECT_EQ(r.res.stats().recompute_checks, 1u);
  EXPECT_EQ(r.res.stats().recompute_bans, 0u);
  EXPECT_EQ(r.res.stats().bytes_in, in_before);
  EXPECT_TRUE(r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
}

// What a kernel writes is learned per argument position: an elementwise kernel whose operand is a
// range in some launches and not in others (a small tensor, here 0) is learned from both shapes,
// so a launch of it that only reads a producer's input leaves that input's version alone. Learned
// per launch shape, the second shape made it "writes all it touches" for good, and the product
// went back to being copied in.
TEST(Recompute, WritesAreLearnedPerPositionAcrossLaunchShapes) {
  Rig r(5);
  const DevPtr x = learned_input(r, true);
  // add(out, a, b): out = a + b, b a range or nothing
  const Func add = r.sim.add_kernel("add", params(3), [](const unsigned char* a) {
    for (uint64_t i = 0; i < kWords; ++i) words(arg(a, 0))[i] = words(arg(a, 1))[i] + (arg(a, 2) ? words(arg(a, 2))[i] : 0);
  });
  const DevPtr z = r.alloc();
  r.launch(r.fill, {z, 1});
  for (uint64_t b : {uint64_t{0}, z})
    for (uint8_t i = 0; i < Residency::kRecomputeProbes; ++i) {
      const DevPtr t = r.alloc();
      r.launch(add, {t, x, b});
      r.free(t);
    }
  const uint64_t probes = r.res.stats().probes;
  const DevPtr y = r.alloc();
  r.launch(r.scale, {y, x});
  const DevPtr t = r.alloc();
  r.launch(add, {t, x, z});  // reads x: y's input keeps its version
  EXPECT_EQ(r.res.stats().probes, probes);  // learned: not watched again
  r.free(t);
  r.evict({y}, {x, z});
  r.use(y);
  EXPECT_EQ(r.res.stats().recomputed, 2u);  // trust_scale's and this one
  EXPECT_EQ(r.res.stats().remake_stale, 0u);
  EXPECT_TRUE(r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
}

// A launch with attributes (cuLaunchKernelEx's: clusters, priority) is made again with the same
// attributes, from the producer's own copy: the hook's array is gone by then.
TEST(Recompute, ALaunchIsMadeAgainWithItsAttributes) {
  Rig r(4);
  const DevPtr x = learned_input(r, true);
  const DevPtr y = r.alloc();
  std::vector<uint64_t> args{y, x};
  std::vector<void*> p{&args[0], &args[1]};
  std::vector<unsigned char> attrs(144, 0x5a);
  LaunchGeom g;
  g.attrs = attrs.data();
  g.nattrs = 2;
  g.attr_bytes = 144;
  r.tr.on_kernel(r.scale, kA, p.data(), nullptr, &g);
  ASSERT_TRUE(r.sim.launch_kernel(r.scale, g, kA, p.data()));
  r.res.after_launch();
  std::fill(attrs.begin(), attrs.end(), 0);  // the hook's array, reused
  r.evict({y}, {x});
  r.res.prepare_access(y);  // a pointer query brings it back: the remake is the last launch
  EXPECT_EQ(r.res.stats().recomputed, 2u);
  EXPECT_EQ(r.sim.last_launch_attrs(), std::vector<unsigned char>(144, 0x5a));
  EXPECT_TRUE(r.is(y, [](uint64_t i) { return 3 * (7000 + i) + 1; }));
}

}  // namespace
}  // namespace recompute_test
}  // namespace offload

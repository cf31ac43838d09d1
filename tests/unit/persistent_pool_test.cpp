// PersistentPool on the simulated driver: large allocations in ranges of their own, kept and
// handed out again by size, reused across streams only behind the free's event, given back
// when the device is full or the kept bytes pass their cap. The simulated GPU runs queued work
// later and, where a test asks, in a random order: a reuse that does not wait for the free
// shows up as a block written out of order.
#include "core/persistent_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/sim_driver.h"

namespace offload {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr Stream kA = 0x7, kB = 0x8, kC = 0x9;

unsigned char* bytes_at(DevPtr p) { return reinterpret_cast<unsigned char*>(p); }

PersistentPool::Options opts(uint64_t min_bytes, uint64_t cache_bytes = 1ull << 40) {
  PersistentPool::Options o;
  o.min_bytes = min_bytes;
  o.cache_bytes = cache_bytes;
  return o;
}

TEST(PersistentPool, SmallAllocationsAndAnUnsetThresholdAreNotOurs) {
  SimDriver sim;
  PersistentPool off(sim, opts(0));
  EXPECT_EQ(off.alloc(64 * kMiB, kA), 0u);
  PersistentPool pool(sim, opts(4 * kMiB));
  EXPECT_EQ(pool.alloc(4 * kMiB - 1, kA), 0u);
  EXPECT_FALSE(pool.free(0x1234, kA));
  EXPECT_EQ(pool.stats().allocs, 0u);
  EXPECT_EQ(sim.vmm_stats().creates, 0u);
}

TEST(PersistentPool, ABlockIsMappedRoundedAndReusedWithoutDriverCalls) {
  SimDriver sim;
  PersistentPool pool(sim, opts(1 * kMiB));
  const uint64_t g = sim.vmm_granularity();
  DevPtr p = pool.alloc(1 * kMiB + 1, kA);
  ASSERT_NE(p, 0u);
  EXPECT_TRUE(pool.owns(p));
  EXPECT_EQ(pool.block_bytes(p), (1 * kMiB + 1 + g - 1) / g * g);
  EXPECT_TRUE(sim.is_mapped(p));
  EXPECT_TRUE(sim.is_mapped(p + 1 * kMiB));
  sim.launch(kA, [p] { std::memset(bytes_at(p), 0x5a, 1 * kMiB + 1); });
  sim.run_all();
  EXPECT_TRUE(pool.free(p, kA));
  EXPECT_FALSE(pool.owns(p));
  const auto before = sim.vmm_stats();
  DevPtr q = pool.alloc(1 * kMiB + 1, kA);
  EXPECT_EQ(q, p);
  const auto after = sim.vmm_stats();
  EXPECT_EQ(after.creates, before.creates);
  EXPECT_EQ(after.maps, before.maps);
  EXPECT_EQ(bytes_at(q)[1 * kMiB], 0x5a) << "a reused block keeps its bytes, as cudaMallocAsync's do";
  auto st = pool.stats();
  EXPECT_EQ(st.allocs, 2u);
  EXPECT_EQ(st.reused, 1u);
  EXPECT_EQ(st.created, 1u);
  EXPECT_EQ(st.cross_stream, 0u);
  // Another size is another block.
  DevPtr r = pool.alloc(3 * kMiB, kA);
  EXPECT_NE(r, 0u);
  EXPECT_NE(r, q);
  EXPECT_EQ(pool.stats().created, 2u);
  EXPECT_EQ(sim.vmm_stats().misuses, 0u);
}

// Stream A writes the block and frees it; stream B gets it back and writes it. Whatever
// order the GPU picks among runnable work, B's write comes after A's.
TEST(PersistentPool, ReuseOnAnotherStreamWaitsForTheFree) {
  for (uint64_t seed = 0; seed < 64; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    SimDriver sim;
    PersistentPool pool(sim, opts(1 * kMiB));
    DevPtr p = pool.alloc(2 * kMiB, kA);
    ASSERT_NE(p, 0u);
    std::string order;
    sim.launch(kA, [p, &order] {
      std::memset(bytes_at(p), 0x11, 2 * kMiB);
      order += 'A';
    });
    ASSERT_TRUE(pool.free(p, kA));
    DevPtr q = pool.alloc(2 * kMiB, kB);
    ASSERT_EQ(q, p);
    sim.launch(kB, [q, &order] {
      std::memset(bytes_at(q), 0x22, 2 * kMiB);
      order += 'B';
    });
    std::mt19937_64 rng(seed);
    while (sim.step(rng)) {
    }
    sim.run_all();
    EXPECT_EQ(order, "AB");
    EXPECT_EQ(bytes_at(q)[0], 0x22);
    EXPECT_EQ(pool.stats().cross_stream, 1u);
    EXPECT_TRUE(pool.free(q, kB));
  }
}

TEST(PersistentPool, AFullDeviceGivesKeptBlocksBackFirst) {
  SimDriver sim;
  const uint64_t g = sim.vmm_granularity();
  sim.set_physical_limit(8 * g);
  PersistentPool pool(sim, opts(g));
  DevPtr a = pool.alloc(2 * g, kA), b = pool.alloc(2 * g, kA), c = pool.alloc(2 * g, kA);
  ASSERT_TRUE(a && b && c);
  ASSERT_TRUE(pool.free(a, kA));
  ASSERT_TRUE(pool.free(b, kA));
  sim.run_all();  // the frees have completed: the kept blocks may go
  // 4 granules asked, 2 free on the device: the two kept blocks of another size go first.
  DevPtr d = pool.alloc(4 * g, kA);
  EXPECT_NE(d, 0u);
  auto st = pool.stats();
  EXPECT_GE(st.released, 1u);
  EXPECT_EQ(st.refused, 0u);
  // Now the device is full of live blocks: the allocation is not ours (forwarded).
  EXPECT_EQ(pool.alloc(4 * g, kA), 0u);
  EXPECT_EQ(pool.stats().refused, 1u);
  EXPECT_EQ(sim.vmm_stats().misuses, 0u);
}

TEST(PersistentPool, KeptBytesOverTheCapGoBackOnceTheirFreesComplete) {
  SimDriver sim;
  const uint64_t g = sim.vmm_granularity();
  PersistentPool pool(sim, opts(g, 2 * g));
  DevPtr a = pool.alloc(2 * g, kA), b = pool.alloc(2 * g, kA);
  ASSERT_TRUE(a && b);
  sim.launch(kA, [] {});  // work still queued: the frees are not complete
  ASSERT_TRUE(pool.free(a, kA));
  ASSERT_TRUE(pool.free(b, kA));
  EXPECT_EQ(pool.stats().released, 0u) << "a block was given back while the GPU could still use it";
  EXPECT_EQ(pool.stats().cached_bytes, 4 * g);
  sim.run_all();
  DevPtr c = pool.alloc(g, kA);  // another size: no reuse
  ASSERT_NE(c, 0u);
  ASSERT_TRUE(pool.free(c, kA));  // over the cap again: the completed ones go, oldest first
  auto st = pool.stats();
  EXPECT_LE(st.cached_bytes, 2 * g);
  EXPECT_GE(st.released, 1u);
  EXPECT_EQ(sim.vmm_stats().misuses, 0u);
}

TEST(PersistentPool, TheDestructorGivesKeptBlocksBack) {
  SimDriver sim;
  {
    PersistentPool pool(sim, opts(1 * kMiB));
    DevPtr a = pool.alloc(2 * kMiB, kA);
    sim.launch(kA, [a] { std::memset(bytes_at(a), 1, 2 * kMiB); });
    ASSERT_TRUE(pool.free(a, kA));  // its work not run yet: the destructor waits for it
  }
  auto st = sim.vmm_stats();
  EXPECT_EQ(st.physical_bytes, 0u);
  EXPECT_EQ(st.mapped_bytes, 0u);
  EXPECT_EQ(st.misuses, 0u);
}

// Closed when the shim plans: no more allocations served, kept blocks released once their frees
// complete (live ones stay the application's).
TEST(PersistentPool, AClosedPoolServesNothingAndReleasesKeptBlocks) {
  SimDriver sim;
  PersistentPool pool(sim, opts(1 * kMiB));
  DevPtr live = pool.alloc(2 * kMiB, kA), kept = pool.alloc(4 * kMiB, kA);
  ASSERT_TRUE(live && kept);
  sim.launch(kA, [kept] { std::memset(bytes_at(kept), 1, 4 * kMiB); });
  ASSERT_TRUE(pool.free(kept, kA));
  pool.close();  // its free's work has not run: kept for now
  EXPECT_EQ(pool.stats().cached_bytes, 4 * kMiB);
  EXPECT_EQ(pool.alloc(4 * kMiB, kA), 0u) << "a closed pool serves nothing, even a kept size";
  sim.run_all();
  EXPECT_EQ(pool.alloc(8 * kMiB, kA), 0u);
  EXPECT_EQ(pool.stats().cached_bytes, 0u) << "released once its free completed";
  EXPECT_EQ(pool.block_bytes(live), 2 * kMiB);
  ASSERT_TRUE(pool.free(live, kA));
  sim.run_all();
  pool.alloc(2 * kMiB, kA);  // nothing served; the completed free's block goes back
  EXPECT_EQ(sim.vmm_stats().physical_bytes, 0u);
  EXPECT_EQ(sim.vmm_stats().misuses, 0u);
}

// Random allocations and frees of a few sizes on three streams, the GPU running a random
// amount of the queued work between calls. Each block is stamped on its owner's stream at
// birth and checked there before its free: a reuse that did not wait for an earlier owner's
// work would find another stamp.
TEST(PersistentPool, RandomStreamsNeverSeeAnotherOwnersBytes) {
  SimDriver sim;
  const uint64_t g = sim.vmm_granularity();
  sim.set_physical_limit(24 * g);
  PersistentPool pool(sim, opts(g, 6 * g));
  std::mt19937_64 rng(7);
  struct Live {
    DevPtr p;
    uint64_t bytes;
    Stream s;
    unsigned char stamp;
  };
  std::vector<Live> live;
  const Stream streams[] = {kA, kB, kC};
  int bad = 0;
  unsigned char next_stamp = 1;
  uint64_t forwarded = 0;
  for (int op = 0; op < 2000; ++op) {
    if (live.empty() || (live.size() < 8 && rng() % 2)) {
      const uint64_t bytes = (1 + rng() % 3) * g;
      const Stream s = streams[rng() % 3];
      DevPtr p = pool.alloc(bytes, s);
      if (!p) {
        ++forwarded;
      } else {
        unsigned char stamp = next_stamp++;
        if (!next_stamp) next_stamp = 1;
        sim.launch(s, [p, bytes, stamp] { std::memset(bytes_at(p), stamp, bytes); });
        live.push_back({p, bytes, s, stamp});
      }
    } else {
      size_t i = rng() % live.size();
      Live l = live[i];
      live.erase(live.begin() + static_cast<long>(i));
      sim.launch(l.s, [l, &bad] {
        if (bytes_at(l.p)[0] != l.stamp || bytes_at(l.p)[l.bytes - 1] != l.stamp) ++bad;
      });
      ASSERT_TRUE(pool.free(l.p, l.s));
    }
    for (int k = rng() % 4; k > 0 && sim.step(rng); --k) {
    }
  }
  for (const Live& l : live) ASSERT_TRUE(pool.free(l.p, l.s));
  sim.run_all();
  EXPECT_EQ(bad, 0);
  auto st = pool.stats();
  EXPECT_GT(st.reused, 100u);
  EXPECT_GT(st.cross_stream, 10u);
  EXPECT_EQ(st.refused, forwarded);
  EXPECT_EQ(st.live_bytes, 0u);
  EXPECT_EQ(sim.vmm_stats().misuses, 0u);
}

// ---- Lending a block's backing to the executor (weight streaming) ---------------------------

// lend moves the backing out (still mapped at the block), counts the bytes as lent (physical
// bytes the executor holds, not the pool: out of peak_bytes), and only once; unlend puts a
// backing back.
TEST(PersistentPool, LendMovesTheBackingOutAndUnlendPutsItBack) {
  SimDriver sim;
  PersistentPool pool(sim, opts(1 * kMiB));
  DevPtr a = pool.alloc(2 * kMiB, kA), b = pool.alloc(3 * kMiB, kA);
  ASSERT_TRUE(a && b);
  const uint64_t abytes = pool.block_bytes(a), bbytes = pool.block_bytes(b);
  EXPECT_EQ(pool.stats().peak_bytes, abytes + bbytes);
  Backing h, h2;
  uint64_t n = 0, n2 = 0;
  EXPECT_FALSE(pool.lend(a + 4096, &h, &n)) << "not the start of a block";
  EXPECT_FALSE(pool.lend(0x1234, &h, &n));
  ASSERT_TRUE(pool.lend(a, &h, &n));
  ASSERT_EQ(h.size(), 1u);
  EXPECT_NE(h[0].handle, 0u);
  EXPECT_EQ(h[0].bytes, abytes);
  EXPECT_EQ(physical_bytes(h), abytes);
  EXPECT_EQ(n, abytes);
  EXPECT_TRUE(sim.is_mapped(a)) << "lent as it is: mapped at the block";
  EXPECT_TRUE(pool.owns(a)) << "still the application's live block";
  auto st = pool.stats();
  EXPECT_EQ(st.lent_bytes, abytes);
  EXPECT_EQ(st.live_bytes, abytes + bbytes) << "lent bytes are still live";
  EXPECT_FALSE(pool.lend(a, &h2, &n2)) << "a block is lent once";
  EXPECT_EQ(pool.stats().lent_bytes, abytes);
  // The peak counts the pool's physical bytes: lent ones are the executor's.
  pool.reset_peak();
  EXPECT_EQ(pool.stats().peak_bytes, bbytes);
  DevPtr c = pool.alloc(1 * kMiB, kA);
  ASSERT_NE(c, 0u);
  EXPECT_EQ(pool.stats().peak_bytes, bbytes + pool.block_bytes(c));
  // The executor moves the bytes out and back with its own mappings; the block is unchanged.
  sim.launch(kA, [a] { std::memset(bytes_at(a), 0x3c, 2 * kMiB); });
  sim.run_all();
  ASSERT_TRUE(unmap_backing(sim, a, h));
  ASSERT_TRUE(map_backing(sim, a, h));
  EXPECT_FALSE(pool.unlend(a, {})) << "no backing to give back";
  EXPECT_FALSE(pool.unlend(b, h)) << "b was never lent";
  ASSERT_TRUE(pool.unlend(a, h));
  EXPECT_FALSE(pool.unlend(a, h)) << "given back already";
  st = pool.stats();
  EXPECT_EQ(st.lent_bytes, 0u);
  EXPECT_EQ(st.peak_bytes, abytes + bbytes + pool.block_bytes(c)) << "unlend counts the bytes as the pool's again";
  // Back to normal: freed, kept with its bytes, handed out again, lent again.
  ASSERT_TRUE(pool.free(a, kA));
  EXPECT_FALSE(pool.lend(a, &h2, &n2)) << "a kept block is nobody's to lend";
  DevPtr a2 = pool.alloc(2 * kMiB, kA);
  EXPECT_EQ(a2, a);
  EXPECT_EQ(bytes_at(a2)[2 * kMiB - 1], 0x3c);
  ASSERT_TRUE(pool.lend(a2, &h2, &n2));
  EXPECT_EQ(h2[0].handle, h[0].handle);
  ASSERT_TRUE(pool.unlend(a2, h2));
  EXPECT_EQ(sim.vmm_stats().misuses, 0u);
}

// A streamed weight comes back on the handles it was last reloaded into: here two, of
// different sizes. The pool keeps and reuses such a block like any other, and gives it back
// to the driver piece by piece (each mapping unmapped exactly, each handle released).
TEST(PersistentPool, ABlockComesBackOnPiecesAndIsGivenBackPieceByPiece) {
  SimDriver sim;
  const uint64_t g = sim.vmm_granularity();
  PersistentPool pool(sim, opts(1));
  DevPtr a = pool.alloc(3 * g, kA);
  ASSERT_NE(a, 0u);
  Backing lent;
  uint64_t n = 0;
  ASSERT_TRUE(pool.lend(a, &lent, &n));
  ASSERT_EQ(n, 3 * g);
  ASSERT_TRUE(unmap_backing(sim, a, lent));
  release_backing(sim, lent);
  const uint64_t h1 = sim.create_physical(g), h2 = sim.create_physical(2 * g);
  ASSERT_TRUE(h1 && h2);
  const Backing pieces{Piece{h1, g}, Piece{h2, 2 * g}};
  ASSERT_TRUE(map_backing(sim, a, pieces));
  sim.launch(kA, [a, g] { std::memset(bytes_at(a), 0x5d, 3 * g); });
  sim.run_all();
  ASSERT_TRUE(pool.unlend(a, pieces));
  ASSERT_TRUE(pool.free(a, kA));
  DevPtr again = pool.alloc(3 * g, kA);
  ASSERT_EQ(again, a) << "kept and reused";
  EXPECT_EQ(bytes_at(a)[0], 0x5d);
  EXPECT_EQ(bytes_at(a)[3 * g - 1], 0x5d);
  ASSERT_TRUE(pool.free(a, kA));
  sim.run_all();  // the free completes: the kept block may go
  pool.close();
  auto vs = sim.vmm_stats();
  EXPECT_EQ(vs.misuses, 0u);
  EXPECT_EQ(vs.mapped_bytes, 0u);
  EXPECT_EQ(vs.physical_bytes, 0u) << "both handles released";
}

// The application frees a block the executor still holds (it never gave it back): the free
// is the pool's (true), the bytes leave live and lent, and the range is neither kept nor
// given back to the driver: the executor's handle may still be mapped there or copying.
TEST(PersistentPool, FreeingALentBlockLeavesItsRangeReserved) {
  SimDriver sim;
  PersistentPool pool(sim, opts(1 * kMiB));
  DevPtr a = pool.alloc(2 * kMiB, kA), b = pool.alloc(2 * kMiB, kA);
  ASSERT_TRUE(a && b);
  const uint64_t bytes = pool.block_bytes(a);
  Backing h;
  uint64_t n = 0;
  ASSERT_TRUE(pool.lend(a, &h, &n));
  ASSERT_TRUE(unmap_backing(sim, a, h));  // the executor evicted it
  ASSERT_TRUE(pool.free(a, kA));
  EXPECT_FALSE(pool.owns(a));
  auto st = pool.stats();
  EXPECT_EQ(st.live_bytes, bytes) << "b only";
  EXPECT_EQ(st.lent_bytes, 0u);
  EXPECT_EQ(st.cached_bytes, 0u) << "a lent block is not kept for reuse";
  EXPECT_EQ(st.released, 0u);
  EXPECT_FALSE(pool.free(a, kA)) << "freed already";
  EXPECT_FALSE(pool.unlend(a, h)) << "no longer a live block";
  // Not reused: another block of the size is a new one.
  DevPtr c = pool.alloc(2 * kMiB, kA);
  ASSERT_NE(c, 0u);
  EXPECT_NE(c, a);
  // Still reserved: the executor's handle maps there again without breaking a rule.
  const uint64_t misuses = sim.vmm_stats().misuses;
  EXPECT_TRUE(map_backing(sim, a, h));
  EXPECT_EQ(sim.vmm_stats().misuses, misuses);
  EXPECT_TRUE(unmap_backing(sim, a, h));
  release_backing(sim, h);
  EXPECT_EQ(sim.vmm_stats().misuses, 0u);
}

}  // namespace
}  // namespace offload

namespace offload {
namespace {

// weight_unit (core/backing.h): the handle size streamed weights' new memory comes in.
TEST(WeightUnit, LoraBlocksShareAUnitAndTheEmbeddingKeepsItsOwn) {
  std::vector<uint64_t> lora;
  for (int b = 0; b < 44; ++b)
    for (uint64_t mib : {216, 288, 288}) lora.push_back(mib * kMiB);  // qkv, fc1, fc2 (proj resident)
  lora.push_back(376 * kMiB);  // embedding and head, rounded to the 2 MiB granularity
  lora.push_back(376 * kMiB);
  EXPECT_EQ(weight_unit(lora), 72 * kMiB);
  // Every size in: their common divisor is 8 MiB, 47 pieces for the 376 MiB ones, a unit too
  // small to be used at all.
  EXPECT_EQ(weight_unit(lora, 64), 8 * kMiB);
}

TEST(WeightUnit, SizesThatWouldNeedTooManyPiecesAreLeftOut) {
  EXPECT_EQ(weight_unit({}), 0u);
  EXPECT_EQ(weight_unit({256 * kMiB}), 256 * kMiB);  // one size: a handle per weight, as before
  EXPECT_EQ(weight_unit({2 * kMiB, 2 * kMiB, 64 * kMiB, 64 * kMiB, 64 * kMiB}), 64 * kMiB);  // the 2 MiB ones apart
  EXPECT_EQ(weight_unit({256 * kMiB, 384 * kMiB}), 128 * kMiB);
  // Most bytes first: the 96 MiB sizes decide, the 100 MiB one would bring it to 4 MiB.
  const uint64_t u = weight_unit({96 * kMiB, 96 * kMiB, 96 * kMiB, 100 * kMiB});
  EXPECT_EQ(u, 96 * kMiB);
  EXPECT_NE(100 * kMiB % u, 0u);  // that weight keeps a handle of its own size
}

}  // namespace
}  // namespace offload

// HostStore: pinned host memory for evicted bytes (preload/residency/host_store.h), on the
// simulated driver, which records what is pinned and counts a copy across two registrations.
#include "residency/host_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "core/sim_driver.h"

namespace offload {
namespace {

// A device range of `bytes` mapped on the simulated driver, to copy from; unmapped at its end.
struct MappedDevice {
  MappedDevice(SimDriver& s, uint64_t b) : sim(s), bytes(b), va(s.reserve(b)), handle(s.create_physical(b)) {
    mapped = sim.map(va, bytes, handle);
  }
  ~MappedDevice() {
    EXPECT_TRUE(sim.unmap(va, bytes));
    sim.release_physical(handle);
    sim.unreserve(va, bytes);
  }
  SimDriver& sim;
  uint64_t bytes;
  DevPtr va;
  uint64_t handle;
  bool mapped = false;
};

// Chunks of 1 MiB, registrations of at most `pin_piece`, and `limit` bytes at most.
HostStore::Options mib_chunks(uint64_t pin_piece, uint64_t limit) {
  HostStore::Options o;
  o.chunk_bytes = 1 << 20;
  o.pin_piece = pin_piece;
  o.limit = limit;
  return o;
}

TEST(HostStore, ReusesSlotsAndRefusesPastItsLimit) {
  SimDriver sim;
  HostStore::Options o;
  o.chunk_bytes = 1 << 20;
  o.limit = 2 << 20;
  HostStore h(sim, o);
  void* a = h.take(512 << 10);
  void* b = h.take(512 << 10);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(h.stats().chunks, 1u);
  h.give(a, 512 << 10);
  EXPECT_EQ(h.take(512 << 10), a);
  EXPECT_NE(h.take(1 << 20), nullptr);  // a second chunk
  EXPECT_EQ(h.take(1 << 20), nullptr);  // past the limit
  EXPECT_EQ(h.stats().refused, 1u);
  EXPECT_EQ(sim.pinned().size(), 2u);
}

// A source lending a fixed arena (as offloadd's pool does), a chunk at a time, until it is used up.
class ArenaSource final : public ChunkSource {
 public:
  explicit ArenaSource(uint64_t bytes) : arena_(bytes + 4096) {}
  Lent lend(uint64_t bytes, bool) override {
    ++asked;
    if (used_ + bytes > arena_.size() - 4096) return {};
    void* p = base() + used_;
    used_ += bytes;
    return {p, false};
  }
  unsigned char* base() {  // page-aligned, as the pool's extents are
    return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(arena_.data()) + 4095) & ~uintptr_t(4095));
  }
  bool holds(const void* p) {
    auto* c = static_cast<const unsigned char*>(p);
    return c >= base() && c < base() + used_;
  }
  int asked = 0;

 private:
  std::vector<unsigned char> arena_;
  uint64_t used_ = 0;
};

TEST(HostStore, TakesItsChunksFromTheSourceFirstAndPinsThem) {
  SimDriver sim;
  HostStore::Options o;
  o.chunk_bytes = 1 << 20;
  o.limit = 8 << 20;
  ArenaSource pool(2 << 20);  // two chunks' worth
  HostStore h(sim, o, &pool);
  std::vector<void*> got;
  for (int i = 0; i < 4; ++i) got.push_back(h.take(1 << 20));
  for (void* p : got) ASSERT_NE(p, nullptr);
  EXPECT_TRUE(pool.holds(got[0]));
  EXPECT_TRUE(pool.holds(got[1]));
  EXPECT_FALSE(pool.holds(got[2]));  // the source is used up: the store's own memory
  EXPECT_FALSE(pool.holds(got[3]));
  EXPECT_EQ(h.stats().lent, 2u << 20);
  EXPECT_EQ(h.stats().mapped, 4u << 20);
  ASSERT_EQ(sim.pinned().size(), 4u);  // lent chunks are pinned too
  EXPECT_EQ(sim.pinned()[0].first, got[0]);
  static_cast<unsigned char*>(got[1])[0] = 1;  // the memory is the caller's to use
  h.give(got[0], 1 << 20);
  EXPECT_EQ(h.take(1 << 20), got[0]);  // a freed slot is reused before the source is asked again
  EXPECT_EQ(pool.asked, 4);
}

// The limit bounds the memory this process makes: what offloadd's pool lends is the node's,
// sized and shared there, so a pool larger than the limit is used whole before the store's own.
TEST(HostStore, WhatOffloaddLendsIsNotCountedAgainstTheLimit) {
  SimDriver sim;
  ArenaSource pool(6 << 20);
  HostStore h(sim, mib_chunks(1 << 20, 2 << 20), &pool);
  std::vector<void*> got;
  for (int i = 0; i < 8; ++i) {
    got.push_back(h.take(1 << 20));
    ASSERT_NE(got.back(), nullptr) << i;
  }
  EXPECT_TRUE(pool.holds(got[5]));
  EXPECT_FALSE(pool.holds(got[6]));
  EXPECT_EQ(h.take(1 << 20), nullptr) << "2 MiB of its own: the limit";
  const HostStore::Stats s = h.stats();
  EXPECT_EQ(s.lent, 6u << 20);
  EXPECT_EQ(s.counted, 2u << 20);
  EXPECT_EQ(s.mapped, 8u << 20);
  EXPECT_EQ(s.refused, 1u);
}

// Copies split in pieces of pin_piece from a slot's start never span two pinned registrations,
// whatever the sizes taken and given (the simulated driver counts
// such a copy as a misuse: a real one may take it for pinned memory it is not, and on the H200
// training then diverged).
TEST(HostStore, NoCopyIntoTheStoreSpansTwoRegistrations) {
  SimDriver sim;
  HostStore::Options o;
  o.chunk_bytes = 256 << 10;
  o.pin_piece = 1 << 20;
  o.limit = 1ull << 30;
  HostStore h(sim, o);
  MappedDevice dev(sim, 4 << 20);
  ASSERT_TRUE(dev.mapped);
  std::mt19937_64 rng(7);
  std::vector<std::pair<void*, uint64_t>> held;
  for (int i = 0; i < 400; ++i) {
    if (!held.empty() && rng() % 3 == 0) {
      const size_t k = rng() % held.size();
      h.give(held[k].first, held[k].second);
      held.erase(held.begin() + static_cast<long>(k));
      continue;
    }
    // Sizes from 4 KiB to 3.5 MiB: under a chunk, over one, and over pin_piece.
    const uint64_t bytes = 4096 * (1 + rng() % 896);
    auto* p = static_cast<unsigned char*>(h.take(bytes));
    ASSERT_NE(p, nullptr);
    for (uint64_t off = 0; off < bytes; off += o.pin_piece)
      sim.copy_to_host(p + off, dev.va, std::min(o.pin_piece, bytes - off), 0x2000);
    held.push_back({p, bytes});
  }
  sim.run_all();
  EXPECT_EQ(sim.vmm_stats().misuses, 0u);
}

// A step whose mix of sizes out at once changes is served from the room already pinned: freed
// slots merge and are split again, instead of waiting for a slot of their exact size.
TEST(HostStore, FreedSlotsMergeAndServeOtherSizes) {
  SimDriver sim;
  HostStore::Options o;
  o.chunk_bytes = 1 << 20;
  o.limit = 8 << 20;
  HostStore h(sim, o);
  std::vector<void*> quarter;
  for (int i = 0; i < 4; ++i) quarter.push_back(h.take(256 << 10));
  for (void* p : quarter) ASSERT_NE(p, nullptr);
  EXPECT_EQ(h.stats().chunks, 1u);
  // Freed out of order: the four merge into the chunk's whole megabyte.
  for (int i : {2, 0, 3, 1}) h.give(quarter[static_cast<size_t>(i)], 256 << 10);
  EXPECT_EQ(h.stats().free_blocks, 1u);
  EXPECT_EQ(h.take(1 << 20), quarter[0]);
  EXPECT_EQ(h.stats().chunks, 1u);
  h.give(quarter[0], 1 << 20);
  // And split again, smallest fit first: a 768 KiB slot leaves 256 KiB that a later one takes.
  void* big = h.take(768 << 10);
  void* small = h.take(256 << 10);
  EXPECT_EQ(big, quarter[0]);
  EXPECT_EQ(small, quarter[3]);
  EXPECT_EQ(h.stats().chunks, 1u);
  EXPECT_EQ(h.stats().in_use, 1u << 20);
  EXPECT_EQ(h.stats().peak_in_use, 1u << 20);
}

// Free blocks of two chunks that lie side by side in memory (a pool lends its extents in order)
// never merge: a slot across them would put one copy across two pinned registrations.
void two_adjacent_chunks_freed(bool second_first) {
  SimDriver sim;
  HostStore::Options o;
  o.chunk_bytes = 1 << 20;
  o.pin_piece = 4 << 20;
  o.limit = 16 << 20;
  ArenaSource pool(2 << 20);
  HostStore h(sim, o, &pool);
  auto* a = static_cast<unsigned char*>(h.take(1 << 20));
  auto* b = static_cast<unsigned char*>(h.take(1 << 20));
  ASSERT_EQ(b, a + (1 << 20));  // two chunks, adjacent
  h.give(second_first ? b : a, 1 << 20);
  h.give(second_first ? a : b, 1 << 20);
  EXPECT_EQ(h.stats().free_blocks, 2u);
  void* both = h.take(2 << 20);
  ASSERT_NE(both, nullptr);
  EXPECT_NE(both, a);
  EXPECT_EQ(h.stats().chunks, 3u);
  MappedDevice dev(sim, 2 << 20);
  ASSERT_TRUE(dev.mapped);
  sim.copy_to_host(both, dev.va, 2 << 20, 0x2000);
  sim.run_all();
  EXPECT_EQ(sim.vmm_stats().misuses, 0u);
}

TEST(HostStore, FreeBlocksOfTwoChunksNeverMerge) {
  two_adjacent_chunks_freed(false);  // the second merges backwards
  two_adjacent_chunks_freed(true);   // the first merges forwards
}

// Grown ahead (from another thread than the evicting one), the store keeps `reserve` bytes free:
// takes within them pin nothing where they are made, and it grows no further while the room
// suffices, nor past its limit. Its chunks are faulted in first and pinned whole.
TEST(HostStore, GrowsAheadToItsReserveAndTakesPinNothingThen) {
  SimDriver sim;
  HostStore::Options o;
  o.chunk_bytes = 1 << 20;
  o.limit = 5 << 20;
  HostStore h(sim, o);
  EXPECT_EQ(h.grow_ahead(0), 0u) << "no reserve, nothing made";
  EXPECT_EQ(h.grow_ahead(2 << 20), 1u << 20);
  EXPECT_EQ(h.grow_ahead(2 << 20), 1u << 20);
  EXPECT_EQ(h.grow_ahead(2 << 20), 0u) << "two chunks free: the reserve is met";
  HostStore::Stats s = h.stats();
  EXPECT_EQ(s.mapped, 2u << 20);
  EXPECT_EQ(s.ahead, 2u << 20);
  EXPECT_EQ(s.pin_ns, 0) << "no pinning where take() needed memory";
  ASSERT_EQ(sim.pinned().size(), 2u);
  EXPECT_EQ(sim.pinned()[0].second, 1u << 20);

  void* a = h.take(1 << 20);
  void* b = h.take(1 << 20);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(h.stats().chunks, 2u) << "served from the room made ahead";
  EXPECT_EQ(h.stats().pin_ns, 0);
  static_cast<unsigned char*>(b)[(1 << 20) - 1] = 7;  // faulted, mapped memory of the caller's

  // Two chunks more would restore the reserve; the limit (5 MiB) leaves room for three in all.
  EXPECT_EQ(h.grow_ahead(2 << 20), 1u << 20);
  EXPECT_EQ(h.grow_ahead(2 << 20), 1u << 20);
  EXPECT_EQ(h.grow_ahead(8 << 20), 1u << 20);
  EXPECT_EQ(h.grow_ahead(8 << 20), 0u) << "at the limit";
  EXPECT_EQ(h.stats().mapped, 5u << 20);
  EXPECT_EQ(h.take(2 << 20), nullptr) << "no free block holds 2 MiB, and a chunk more would pass the limit";
  h.give(a, 1 << 20);
  h.give(b, 1 << 20);
}

// A slot larger than a chunk gets a chunk of its own, and the free room of smaller chunks cannot
// serve it: grown ahead, the store makes chunks that hold the largest slot asked for, and makes
// one while none of its free blocks holds it, within twice the reserve.
TEST(HostStore, GrowsAheadInChunksThatHoldTheLargestSlotAskedFor) {
  SimDriver sim;
  HostStore h(sim, mib_chunks(4 << 20, 64 << 20));
  void* big = h.take(3 << 20);  // a chunk of its own, made where it was asked for
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(h.grow_ahead(2 << 20), 3u << 20) << "a chunk as large as the largest slot";
  EXPECT_EQ(h.grow_ahead(2 << 20), 0u) << "3 MiB free in one block: the reserve is met";
  void* again = h.take(3 << 20);
  ASSERT_NE(again, nullptr);
  void* small = h.take(1 << 20);  // a chunk of 1 MiB, made where it was asked for
  ASSERT_NE(small, nullptr);
  h.give(small, 1 << 20);
  const int64_t pinned_where_asked = h.stats().pin_ns;
  EXPECT_EQ(h.grow_ahead(1 << 20), 3u << 20) << "the reserve of 1 MiB lies free, but no block holds 3 MiB";
  EXPECT_EQ(h.grow_ahead(1 << 20), 0u) << "one does now";
  void* third = h.take(3 << 20);
  ASSERT_NE(third, nullptr);
  EXPECT_EQ(h.stats().pin_ns, pinned_where_asked) << "served from the chunk made ahead";
  for (void* p : {big, again, third}) h.give(p, 3 << 20);
}

// A slot over pin_piece takes a whole chunk: a freed one of at most twice its size serves it (the
// copies split at pin_piece from its start, which is the chunk's), and grown ahead, the store
// keeps one free as large as the largest such slot asked for.
TEST(HostStore, SlotsOverAPinPieceTakeWholeChunksUpToTwiceTheirSizeAndAreGrownAheadToo) {
  SimDriver sim;
  HostStore::Options o;
  o.chunk_bytes = 1 << 20;
  o.pin_piece = 2 << 20;
  o.limit = 64 << 20;
  HostStore h(sim, o);
  void* a = h.take(5 << 20);  // a chunk of its own, made where it was asked for
  ASSERT_NE(a, nullptr);
  h.give(a, 5 << 20);
  EXPECT_EQ(h.take(6 << 20, false), nullptr) << "no free chunk holds 6 MiB";
  EXPECT_EQ(h.take(4 << 20, false), a) << "a free chunk of 5 MiB serves 4";
  h.give(a, 4 << 20);
  EXPECT_EQ(h.take((2 << 20) + 4096, false), nullptr) << "a chunk of more than twice its size is not taken";
  EXPECT_EQ(h.take(5 << 20, false), a) << "given back whole: 5 MiB again";

  void* b = h.take(1 << 20);  // a chunk of 1 MiB more, made where it was asked for
  ASSERT_NE(b, nullptr);
  h.give(b, 1 << 20);
  const auto pins = sim.pinned().size();
  // 1 MiB free: the reserve of 1 MiB is met, but no free chunk holds the largest slot over
  // pin_piece asked for (6 MiB, asked for above, though not served).
  EXPECT_EQ(h.grow_ahead(1 << 20), 6u << 20);
  EXPECT_EQ(h.grow_ahead(1 << 20), 0u) << "7 MiB free: over twice the reserve";
  ASSERT_EQ(sim.pinned().size(), pins + 3) << "pinned in pieces of pin_piece from its start";
  EXPECT_EQ(sim.pinned().back().second, 2u << 20);
  const int64_t pinned_where_asked = h.stats().pin_ns;
  void* d = h.take(5 << 20, false);
  ASSERT_NE(d, nullptr);
  EXPECT_NE(d, a);
  EXPECT_EQ(h.stats().pin_ns, pinned_where_asked) << "served from the chunk made ahead";
  h.give(a, 5 << 20);
  h.give(d, 5 << 20);
  EXPECT_EQ(h.stats().in_use, 0u);
}

// A slot larger than a chunk gets one of its own, rounded up to whole chunks: slots a little apart
// in size take it in turn (on an H100 a checkpointed Llama's slots of 1,008, 1,010 and 1,024 MiB
// made a chunk each, of their exact sizes), over a pin piece as under it.
TEST(HostStore, SlotsALittleApartInSizeTakeOneChunkInTurn) {
  SimDriver sim;
  HostStore h(sim, mib_chunks(4 << 20, 64 << 20));
  for (uint64_t base : {uint64_t(2) << 20, uint64_t(6) << 20}) {  // under a pin piece, then over one
    const uint64_t mapped = h.stats().mapped;
    for (uint64_t bytes : {base - (16 << 10), base - (8 << 10), base}) {
      void* p = h.take(bytes);
      ASSERT_NE(p, nullptr) << bytes;
      h.give(p, bytes);
    }
    EXPECT_EQ(h.stats().mapped - mapped, base) << "one chunk of " << base << " served all three";
    EXPECT_EQ(h.stats().in_use, 0u);
  }
  EXPECT_EQ(h.stats().chunks, 2u);
  EXPECT_EQ(sim.pinned().size(), 1u + 2u) << "2 MiB in one registration, 6 MiB in pieces of 4 from its start";
}

// A take() that needs a chunk while grow_ahead() makes one on another thread never lets the two
// together pass the limit, and every byte handed out is the caller's alone.
TEST(HostStore, GrowingAheadBesideTakesKeepsToTheLimitAndNeverHandsOutABlockTwice) {
  SimDriver sim;
  HostStore::Options o;
  o.chunk_bytes = 256 << 10;
  o.limit = 8 << 20;
  HostStore h(sim, o);
  std::atomic<bool> done{false};
  std::thread grower([&] {
    while (!done.load()) h.grow_ahead(1 << 20);
  });
  std::mt19937 rng(7);
  std::vector<std::pair<unsigned char*, uint64_t>> held;
  uint64_t taken = 0;
  for (int i = 0; i < 4000; ++i) {
    if (!held.empty() && (rng() % 2 || taken > (6 << 20))) {
      const size_t k = rng() % held.size();
      auto [p, n] = held[k];
      for (uint64_t j = 0; j < n; j += 4096) ASSERT_EQ(p[j], static_cast<unsigned char>(n >> 12)) << "a slot shared";
      h.give(p, n);
      taken -= n;
      held[k] = held.back();
      held.pop_back();
    } else {
      const uint64_t n = (1 + rng() % 48) * 4096;
      auto* p = static_cast<unsigned char*>(h.take(n));
      if (!p) continue;
      for (uint64_t j = 0; j < n; j += 4096) p[j] = static_cast<unsigned char>(n >> 12);
      held.emplace_back(p, n);
      taken += n;
    }
    ASSERT_LE(h.stats().mapped, o.limit);
  }
  done.store(true);
  grower.join();
  EXPECT_GT(h.stats().ahead, 0u);
  for (auto [p, n] : held) h.give(p, n);
  EXPECT_EQ(h.stats().in_use, 0u);
}

// The first steps of a model that does not fit make the host memory their evicted bytes go to,
// which on the H200's host took 0.3-0.5 s a GiB: said once, with the pool that makes it ahead. Not
// said for memory lent by offloadd's pool, for less than a GiB, nor when pinning took under a
// quarter of the step or under half a second.
TEST(HostStore, AStepThatSpentItsTimeMakingHostMemorySaysSo) {
  constexpr uint64_t kG = 1ull << 30;
  HostStore::Stats was, now;
  now.mapped = 17 * kG + kG / 2;
  now.pin_ns = 6'400'000'000;
  const std::string note = host_making_note(1, 7'700'000'000, now, was);
  EXPECT_NE(note.find("step 1 spent 6.4 s of its 7.7 s making 17.50 GiB"), std::string::npos) << note;
  EXPECT_NE(note.find("offloadd --pool-size 22GiB"), std::string::npos) << note;  // 17.5 GiB and a quarter

  HostStore::Stats lent = now;
  lent.lent = now.mapped;  // the daemon's pool made it: nothing to say
  EXPECT_EQ(host_making_note(1, 7'700'000'000, lent, was), "");
  HostStore::Stats small = now;
  small.mapped = kG / 2;
  EXPECT_EQ(host_making_note(1, 7'700'000'000, small, was), "");
  EXPECT_EQ(host_making_note(1, 30'000'000'000, now, was), "") << "a fifth of the step";
  HostStore::Stats quick = now;
  quick.pin_ns = 400'000'000;
  EXPECT_EQ(host_making_note(1, 1'000'000'000, quick, was), "") << "under half a second";
  HostStore::Stats part_lent = now;  // half of it lent and quickly pinned: the time is the own half's
  part_lent.lent = now.mapped / 2;
  part_lent.pin_ns = 5'000'000'000;
  part_lent.pin_lent_ns = 400'000'000;
  const std::string own = host_making_note(1, 7'700'000'000, part_lent, was);
  EXPECT_NE(own.find("step 1 spent 4.6 s of its 7.7 s making 8.75 GiB"), std::string::npos) << own;
  HostStore::Stats ahead = now;
  ahead.ahead = now.mapped;  // made ahead, off the evicting thread: nothing to say
  EXPECT_EQ(host_making_note(1, 7'700'000'000, ahead, was), "");
  // A later step: only what it made counts.
  HostStore::Stats later = now;
  later.mapped += kG / 4;
  later.pin_ns += 900'000'000;
  EXPECT_EQ(host_making_note(2, 1'500'000'000, later, now), "") << "a quarter of a GiB more";
}

}  // namespace
}  // namespace offload

// AllocTable: the interval map that attributes device addresses to allocations.
#include "core/alloc_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <random>
#include <thread>
#include <vector>

namespace offload {
namespace {

constexpr DevPtr kBase = 0x7f0000000000;  // a plausible device VA, far from small scalars

TEST(AllocTable, InteriorPointerResolvesToItsAllocation) {
  AllocTable t(16);
  t.insert(kBase, 4096, 7);
  t.insert(kBase + 8192, 100, 8);
  for (DevPtr off : {DevPtr{0}, DevPtr{1}, DevPtr{8}, DevPtr{2048}, DevPtr{4095}}) {
    auto e = t.find(kBase + off);
    ASSERT_TRUE(e.has_value()) << "offset " << off;
    EXPECT_EQ(e->id, 7u);
    EXPECT_EQ(e->base, kBase);
    EXPECT_EQ(e->size, 4096u);
  }
  auto e = t.find(kBase + 8192 + 50);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->id, 8u);
}

TEST(AllocTable, BoundariesAreHalfOpen) {
  AllocTable t(16);
  const DevPtr b = kBase + 0x10000;
  const uint64_t size = 0x300;
  t.insert(b, size, 1);
  EXPECT_TRUE(t.find(b).has_value());
  EXPECT_TRUE(t.find(b + size - 1).has_value());
  EXPECT_FALSE(t.find(b + size).has_value());
  EXPECT_FALSE(t.find(b - 1).has_value());
  EXPECT_FALSE(t.find(0).has_value());
  EXPECT_FALSE(t.find(~DevPtr{0}).has_value());
}

TEST(AllocTable, AdjacentAllocationsDoNotBleed) {
  AllocTable t(16);
  t.insert(kBase, 0x1000, 1);
  t.insert(kBase + 0x1000, 0x1000, 2);
  EXPECT_EQ(t.find(kBase + 0xfff)->id, 1u);
  EXPECT_EQ(t.find(kBase + 0x1000)->id, 2u);
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(t.live_bytes(), 0x2000u);
}

TEST(AllocTable, EmptyTableFindsNothing) {
  AllocTable t(4);
  EXPECT_FALSE(t.find(kBase).has_value());
  DevPtr w[2] = {kBase, 16};
  AllocId out[4];
  EXPECT_EQ(t.scan(w, 2, out, 0, 4), 0u);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.live_bytes(), 0u);
}

TEST(AllocTable, EraseRemovesOnlyByBase) {
  AllocTable t(16);
  t.insert(kBase, 256, 1);
  t.insert(kBase + 1024, 512, 2);
  EXPECT_EQ(t.live_bytes(), 768u);

  // An interior address is not an allocation start: nothing is erased.
  EXPECT_FALSE(t.erase(kBase + 8).has_value());
  EXPECT_TRUE(t.find(kBase + 8).has_value());

  auto e = t.erase(kBase);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->id, 1u);
  EXPECT_EQ(e->size, 256u);
  EXPECT_FALSE(t.find(kBase).has_value());
  EXPECT_FALSE(t.find(kBase + 255).has_value());
  EXPECT_EQ(t.find(kBase + 1024)->id, 2u);
  EXPECT_EQ(t.live_bytes(), 512u);
  EXPECT_EQ(t.size(), 1u);

  EXPECT_FALSE(t.erase(kBase).has_value()) << "double erase";
  EXPECT_EQ(t.live_bytes(), 512u);
}

TEST(AllocTable, InsertAtAStaleBaseReplacesIt) {
  AllocTable t(16);
  t.insert(kBase, 0x100, 1);
  AllocEntry olds[AllocTable::kMaxReplaced];
  size_t n_old = t.insert(kBase, 0x200, 2, olds);
  std::optional<AllocEntry> old = n_old ? std::optional<AllocEntry>(olds[0]) : std::nullopt;  // the address came back without a free we saw
  ASSERT_TRUE(old.has_value());
  EXPECT_EQ(old->id, 1u);
  EXPECT_EQ(old->base, kBase);
  EXPECT_EQ(old->size, 0x100u);
  EXPECT_EQ(t.find(kBase + 0x150)->id, 2u);
  EXPECT_EQ(t.size(), 1u);
  EXPECT_EQ(t.live_bytes(), 0x200u);
}

TEST(AllocTable, InsertInsideAStaleRangeReplacesIt) {
  AllocTable t(16);
  t.insert(kBase, 0x100, 1);
  AllocEntry olds[AllocTable::kMaxReplaced];
  size_t n_old = t.insert(kBase + 0x80, 0x10, 2, olds);
  std::optional<AllocEntry> old = n_old ? std::optional<AllocEntry>(olds[0]) : std::nullopt;
  ASSERT_TRUE(old.has_value());
  EXPECT_EQ(old->id, 1u);
  EXPECT_FALSE(t.find(kBase).has_value()) << "the stale range must be gone entirely";
  EXPECT_EQ(t.find(kBase + 0x85)->id, 2u);
  EXPECT_EQ(t.live_bytes(), 0x10u);
}

TEST(AllocTable, InsertOverlappingALaterStaleRangeReplacesIt) {
  AllocTable t(16);
  t.insert(kBase + 0x100, 0x100, 1);
  AllocEntry olds[AllocTable::kMaxReplaced];
  size_t n_old = t.insert(kBase + 0x80, 0x100, 2, olds);
  std::optional<AllocEntry> old = n_old ? std::optional<AllocEntry>(olds[0]) : std::nullopt;  // [0x80, 0x180) overlaps [0x100, 0x200)
  ASSERT_TRUE(old.has_value());
  EXPECT_EQ(old->id, 1u);
  EXPECT_EQ(t.find(kBase + 0x17f)->id, 2u);
  EXPECT_FALSE(t.find(kBase + 0x180).has_value());
  EXPECT_EQ(t.size(), 1u);
  EXPECT_EQ(t.live_bytes(), 0x100u);
}

TEST(AllocTable, InsertOverSeveralStaleRangesDropsAllOfThem) {
  AllocTable t(16);
  t.insert(kBase, 0x100, 1);
  t.insert(kBase + 0x100, 0x100, 2);
  t.insert(kBase + 0x200, 0x100, 3);
  t.insert(kBase + 0x400, 0x100, 4);  // untouched neighbour
  AllocEntry olds[AllocTable::kMaxReplaced];
  size_t n_old = t.insert(kBase, 0x300, 5, olds);
  ASSERT_EQ(n_old, 3u) << "every overlapped stale range is reported, so each gets its free";
  std::vector<AllocId> ids;
  for (size_t i = 0; i < n_old; ++i) ids.push_back(olds[i].id);
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<AllocId>{1, 2, 3}));
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(t.live_bytes(), 0x300u + 0x100u);
  for (DevPtr off : {0x0, 0x150, 0x2ff}) EXPECT_EQ(t.find(kBase + off)->id, 5u);
  EXPECT_EQ(t.find(kBase + 0x400)->id, 4u);
}

TEST(AllocTable, NonOverlappingNeighbourIsNotReplaced) {
  AllocTable t(16);
  t.insert(kBase, 0x100, 1);
  EXPECT_EQ(t.insert(kBase + 0x100, 0x100, 2), 0u);
  EXPECT_EQ(t.insert(kBase - 0x100, 0x100, 3), 0u);
  EXPECT_EQ(t.size(), 3u);
  EXPECT_EQ(t.live_bytes(), 0x300u);
}

TEST(AllocTable, ZeroByteAllocationOwnsItsAddress) {
  AllocTable t(4);
  t.insert(kBase, 0, 9);
  ASSERT_TRUE(t.find(kBase).has_value());
  EXPECT_EQ(t.find(kBase)->id, 9u);
  EXPECT_FALSE(t.find(kBase + 1).has_value());
  EXPECT_TRUE(t.erase(kBase).has_value());
  EXPECT_EQ(t.live_bytes(), 0u);
}

TEST(AllocTable, GrowsPastItsReservation) {
  AllocTable t(2);
  for (uint64_t i = 0; i < 1000; ++i) t.insert(kBase + i * 0x1000, 0x800, i + 1);
  EXPECT_EQ(t.size(), 1000u);
  EXPECT_EQ(t.live_bytes(), 1000u * 0x800);
  for (uint64_t i = 0; i < 1000; i += 37) EXPECT_EQ(t.find(kBase + i * 0x1000 + 0x7ff)->id, i + 1);
  EXPECT_FALSE(t.find(kBase + 5 * 0x1000 + 0x800).has_value());
}

// --- scan -------------------------------------------------------------------------------

struct ScanFixture : ::testing::Test {
  AllocTable t{64};
  // Ids deliberately not in address order, so "sorted" means sorted by id.
  const DevPtr a = kBase, b = kBase + 0x10000, c = kBase + 0x20000;
  void SetUp() override {
    t.insert(a, 0x1000, 30);
    t.insert(b, 0x1000, 10);
    t.insert(c, 0x1000, 20);
  }
  std::vector<AllocId> scan(const std::vector<uint64_t>& words, std::vector<AllocId> pre = {},
                            size_t cap = 64) {
    std::vector<AllocId> out(std::max(cap, pre.size()) + 1, 0);
    std::copy(pre.begin(), pre.end(), out.begin());
    size_t n = t.scan(words.data(), words.size(), out.data(), pre.size(), cap);
    EXPECT_LE(n, cap);
    out.resize(n);
    return out;
  }
};

TEST_F(ScanFixture, FindsPointersAmongNonPointerWords) {
  double f = 0.125;
  uint64_t fbits;
  std::memcpy(&fbits, &f, 8);
  std::vector<uint64_t> words = {
      4096,            // a size
      b + 0x10,        // interior pointer into b
      7,               // a scalar
      fbits,           // a double
      a + 0x1000,      // one past a: not a
      c - 1,           // just below c: not c (nor anything)
      0xffffffffffff,  // larger than any allocation end... but below ~0
      c + 0xfff,       // last byte of c
  };
  EXPECT_EQ(scan(words), (std::vector<AllocId>{10, 20}));
}

TEST_F(ScanFixture, DeduplicatesAndSortsById) {
  std::vector<uint64_t> words = {a, b, a + 8, c, b + 16, a, a + 24, c};
  EXPECT_EQ(scan(words), (std::vector<AllocId>{10, 20, 30}));
}

TEST_F(ScanFixture, MergesWithEntriesAlreadyPresent) {
  // out already holds 20 and 25 (from an earlier parameter); the scan adds 30 and 20 again.
  EXPECT_EQ(scan({a, c + 4}, {20, 25}), (std::vector<AllocId>{20, 25, 30}));
}

TEST_F(ScanFixture, RespectsCap) {
  std::vector<uint64_t> words = {a, b, c};
  auto out = scan(words, {}, 2);
  EXPECT_EQ(out.size(), 2u);
  EXPECT_TRUE(std::is_sorted(out.begin(), out.end()));
  for (AllocId id : out) EXPECT_TRUE(id == 10 || id == 20 || id == 30);
  // A full `out` stays as it is.
  EXPECT_EQ(scan(words, {5, 6}, 2), (std::vector<AllocId>{5, 6}));
}

// The contract: every allocation a word points into is reported, up to `cap` entries. With
// cap 3 and three distinct allocations, all three fit. A repeated pointer must not use up
// room that a distinct allocation needs (the caller, Tracker::on_kernel, only flags a
// launch as truncated when the deduplicated count reaches the cap, so a loss here is silent).
TEST_F(ScanFixture, RepeatedPointersDoNotCrowdOutDistinctOnesUnderTheCap) {
  std::vector<uint64_t> words = {a, b, a + 8, c};
  EXPECT_EQ(scan(words, {}, 3), (std::vector<AllocId>{10, 20, 30}));
}

TEST_F(ScanFixture, UnalignedBufferIsReadBytewise) {
  // Kernel argument buffers are 8-byte aligned in practice, but scan() must not rely on it.
  std::vector<unsigned char> buf(8 * 3 + 1);
  uint64_t w[3] = {99, b + 1, 1};
  std::memcpy(buf.data() + 1, w, sizeof w);
  AllocId out[4];
  size_t n = t.scan(buf.data() + 1, 3, out, 0, 4);
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(out[0], 10u);
}

// --- concurrency --------------------------------------------------------------------------

// Writers own disjoint regions and insert/erase fixed slots in them; readers look up and
// scan addresses in every region at the same time. Every answer a reader gets must be an
// allocation some writer could have had live at that address.
TEST(AllocTableConcurrency, WritersAndScannersAgree) {
  constexpr int kWriters = 4, kReaders = 3, kSlots = 64, kOps = 6000;
  constexpr DevPtr kRegion = 1 << 20, kSlotSpan = 4096;
  AllocTable t(16);  // small reservation: the table grows while readers read
  auto region_base = [](int w) { return kBase + static_cast<DevPtr>(w) * kRegion; };
  auto slot_size = [](int s) { return static_cast<uint64_t>(64 * (s + 1)); };
  // id = writer << 48 | slot << 32 | generation
  auto make_id = [](int w, int s, uint32_t gen) {
    return (static_cast<AllocId>(w) << 48) | (static_cast<AllocId>(s) << 32) | gen;
  };

  std::atomic<bool> done{false};
  std::atomic<int> writer_errors{0}, reader_errors{0};
  std::atomic<uint64_t> reader_hits{0};
  std::vector<std::vector<bool>> final_live(kWriters, std::vector<bool>(kSlots, false));

  auto writer = [&](int w) {
    std::mt19937 rng(1234 + w);
    std::vector<AllocId> live(kSlots, 0);
    uint32_t gen = 0;
    for (int op = 0; op < kOps; ++op) {
      int s = static_cast<int>(rng() % kSlots);
      DevPtr base = region_base(w) + static_cast<DevPtr>(s) * kSlotSpan;
      if (live[s]) {
        auto e = t.erase(base);
        if (!e || e->id != live[s] || e->size != slot_size(s)) writer_errors.fetch_add(1);
        live[s] = 0;
      } else {
        AllocId id = make_id(w, s, ++gen);
        if (t.insert(base, slot_size(s), id) != 0) writer_errors.fetch_add(1);
        live[s] = id;
      }
    }
    for (int s = 0; s < kSlots; ++s) final_live[w][s] = live[s] != 0;
  };

  auto check_entry = [&](DevPtr addr, const AllocEntry& e) {
    int w = static_cast<int>(e.id >> 48), s = static_cast<int>((e.id >> 32) & 0xffff);
    bool ok = w < kWriters && s < kSlots &&
              e.base == region_base(w) + static_cast<DevPtr>(s) * kSlotSpan &&
              e.size == slot_size(s) && addr >= e.base && addr - e.base < e.size;
    if (!ok) reader_errors.fetch_add(1);
  };

  auto reader = [&](int r) {
    std::mt19937_64 rng(99 + r);
    std::vector<uint64_t> words(16);
    std::vector<AllocId> out(8);
    while (!done.load(std::memory_order_relaxed)) {
      int w = static_cast<int>(rng() % kWriters);
      DevPtr addr = region_base(w) + rng() % kRegion;
      if (auto e = t.find(addr)) {
        check_entry(addr, *e);
        reader_hits.fetch_add(1, std::memory_order_relaxed);
      }
      for (auto& x : words)
        x = (rng() & 1) ? region_base(static_cast<int>(rng() % kWriters)) + rng() % (kSlots * kSlotSpan)
                        : rng() % 100000;
      size_t n = t.scan(words.data(), words.size(), out.data(), 0, out.size());
      if (n > out.size() || !std::is_sorted(out.begin(), out.begin() + static_cast<ptrdiff_t>(n)) ||
          std::adjacent_find(out.begin(), out.begin() + static_cast<ptrdiff_t>(n)) !=
              out.begin() + static_cast<ptrdiff_t>(n))
        reader_errors.fetch_add(1);
      for (size_t i = 0; i < n; ++i) {
        // Each id must belong to a slot that one of the words points into.
        int w2 = static_cast<int>(out[i] >> 48), s2 = static_cast<int>((out[i] >> 32) & 0xffff);
        DevPtr base = region_base(w2) + static_cast<DevPtr>(s2) * kSlotSpan;
        bool pointed = std::any_of(words.begin(), words.end(),
                                   [&](uint64_t x) { return x >= base && x - base < slot_size(s2); });
        if (!pointed) reader_errors.fetch_add(1);
      }
      // Let writers in: glibc's rwlock prefers readers, and three spinning readers on a
      // small machine would starve them (a launch hook holds the lock far more briefly).
      std::this_thread::yield();
    }
  };

  std::vector<std::thread> readers, writers;
  for (int r = 0; r < kReaders; ++r) readers.emplace_back(reader, r);
  for (int w = 0; w < kWriters; ++w) writers.emplace_back(writer, w);
  for (auto& th : writers) th.join();
  done = true;
  for (auto& th : readers) th.join();

  EXPECT_EQ(writer_errors.load(), 0);
  EXPECT_EQ(reader_errors.load(), 0);
  size_t live_count = 0;
  uint64_t live_bytes = 0;
  for (int w = 0; w < kWriters; ++w)
    for (int s = 0; s < kSlots; ++s)
      if (final_live[w][s]) {
        ++live_count;
        live_bytes += slot_size(s);
        DevPtr base = region_base(w) + static_cast<DevPtr>(s) * kSlotSpan;
        auto e = t.find(base + slot_size(s) - 1);
        ASSERT_TRUE(e.has_value());
        EXPECT_EQ(e->base, base);
      }
  EXPECT_EQ(t.size(), live_count);
  EXPECT_EQ(t.live_bytes(), live_bytes);
}

// Exact mode (light observation): random allocations and frees, many sharing probe runs and
// outgrowing the first table, against a map kept beside it.
TEST(AllocTable, ExactModeMatchesAMapThroughGrowthAndDeletions) {
  AllocTable t(16);
  t.set_exact(true);
  std::map<DevPtr, std::pair<uint64_t, AllocId>> ref;
  std::mt19937_64 r(5);
  uint64_t live = 0;
  AllocId next = 1;
  for (int op = 0; op < 200000; ++op) {
    // Bases 256 bytes apart in a window of 8192: dense clusters and reuse of freed bases.
    const DevPtr base = kBase + 256 * std::uniform_int_distribution<uint64_t>(0, 8191)(r);
    if (std::bernoulli_distribution(op < 100000 ? 0.6 : 0.4)(r)) {
      const uint64_t size = 1 + std::uniform_int_distribution<uint64_t>(0, 1 << 20)(r);
      AllocEntry replaced[AllocTable::kMaxReplaced];
      const size_t n = t.insert(base, size, next, replaced);
      if (auto it = ref.find(base); it != ref.end()) {  // its free went unseen
        ASSERT_EQ(n, 1u);
        EXPECT_EQ(replaced[0].id, it->second.second);
        live -= it->second.first;
      } else {
        ASSERT_EQ(n, 0u);
      }
      ref[base] = {size, next++};
      live += size;
    } else {
      const auto e = t.erase(base);
      const auto it = ref.find(base);
      ASSERT_EQ(e.has_value(), it != ref.end());
      if (e) {
        EXPECT_EQ(e->size, it->second.first);
        EXPECT_EQ(e->id, it->second.second);
        live -= e->size;
        ref.erase(it);
      }
    }
    ASSERT_EQ(t.live_bytes(), live);
    ASSERT_EQ(t.size(), ref.size());
    if (op % 1000 == 0)
      for (const auto& [b, v] : ref) {
        const auto f = t.find(b);
        ASSERT_TRUE(f.has_value());
        EXPECT_EQ(f->id, v.second);
        EXPECT_FALSE(t.find(b + 8).has_value());  // bases alone
      }
  }
  EXPECT_GT(ref.size(), 1024u);  // it grew past its first table
}

}  // namespace
}  // namespace offload

// The pool's layout and lease table (protocol/offload/pool_layout.h): format/open and their
// refusals, first fit, alignment, ownership on release, and a randomised run against a
// model that checks no two live leases ever overlap.
#include "offload/pool_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>

namespace offload {
namespace {

constexpr uint64_t MiB = 1ull << 20;

// Memory for a pool, 8-byte aligned, zeroed.
struct Arena {
  explicit Arena(uint64_t bytes) : words((bytes + 7) / 8), mem(new uint64_t[words]()), size(bytes) {}
  void* base() { return mem.get(); }
  uint64_t words;
  std::unique_ptr<uint64_t[]> mem;
  uint64_t size;
};

TEST(PoolLayout, TotalBytesAndFormat) {
  const uint64_t total = pool_total_bytes(16 * MiB, 64);
  // Header and table fit in the first 2 MiB; the data area is whole lease granules.
  EXPECT_EQ(total, kDataAlign + 16 * MiB);
  EXPECT_EQ(pool_total_bytes(16 * MiB + 1, 64), kDataAlign + 16 * MiB + kLeaseAlign);
  // A table larger than 2 MiB pushes the data area to the next 2 MiB boundary.
  const uint32_t many = static_cast<uint32_t>(kDataAlign / sizeof(LeaseSlot));
  EXPECT_EQ(pool_total_bytes(0, many), 2 * kDataAlign);

  Arena a(total);
  auto t = LeaseTable::format(a.base(), total, 64, 4242);
  ASSERT_TRUE(t);
  const PoolHeader& h = t->header();
  EXPECT_EQ(std::memcmp(h.magic, kPoolMagic, sizeof h.magic), 0);
  EXPECT_EQ(h.layout_version, kPoolLayoutVersion);
  EXPECT_EQ(h.max_leases, 64u);
  EXPECT_EQ(h.table_offset, sizeof(PoolHeader));
  EXPECT_EQ(h.data_offset % kDataAlign, 0u);
  EXPECT_GE(h.data_offset, sizeof(PoolHeader) + 64 * sizeof(LeaseSlot));
  EXPECT_EQ(h.data_bytes, 16 * MiB);
  EXPECT_EQ(h.generation, 1u);
  EXPECT_EQ(h.owner_pid, 4242u);
  EXPECT_EQ(t->data(), static_cast<unsigned char*>(a.base()) + h.data_offset);
  EXPECT_EQ(t->used_bytes(), 0u);
  EXPECT_EQ(t->largest_free(), 16 * MiB);
  EXPECT_TRUE(t->leases().empty());

  // A ragged total: the data area is cut down to whole granules.
  Arena b(total + 1000);
  auto t2 = LeaseTable::format(b.base(), total + 1000, 64, 1);
  ASSERT_TRUE(t2);
  EXPECT_EQ(t2->data_bytes(), 16 * MiB);

  // Refusals: no memory, no slots, no room for data.
  EXPECT_FALSE(LeaseTable::format(nullptr, total, 64, 1));
  EXPECT_FALSE(LeaseTable::format(a.base(), total, 0, 1));
  EXPECT_FALSE(LeaseTable::format(a.base(), kDataAlign, 64, 1));
}

TEST(PoolLayout, OpenChecksMagicVersionAndSize) {
  const uint64_t total = pool_total_bytes(8 * MiB, 32);
  Arena a(total);
  ASSERT_TRUE(LeaseTable::format(a.base(), total, 32, 1));
  std::string why;
  auto t = LeaseTable::open(a.base(), total, &why);
  ASSERT_TRUE(t) << why;
  EXPECT_EQ(t->data_bytes(), 8 * MiB);
  // A larger segment than needed is fine.
  EXPECT_TRUE(LeaseTable::open(a.base(), total + kLeaseAlign, &why));

  auto* h = static_cast<PoolHeader*>(a.base());
  const PoolHeader saved = *h;
  auto expect_refused = [&](const char* what, uint64_t size, const char* message) {
    SCOPED_TRACE(what);
    why.clear();
    EXPECT_FALSE(LeaseTable::open(a.base(), size, &why));
    EXPECT_NE(why.find(message), std::string::npos) << why;
    *h = saved;
  };
  h->magic[7] = 'X';
  expect_refused("bad magic", total, "bad magic");
  h->layout_version = kPoolLayoutVersion + 1;
  expect_refused("bad version", total, "version");
  h->layout_version = 0;
  expect_refused("version 0", total, "version");
  expect_refused("segment smaller than the pool", total - kLeaseAlign, "size");
  expect_refused("segment smaller than a header", sizeof(PoolHeader) - 1, "smaller than a pool header");
  h->data_bytes += kLeaseAlign;
  expect_refused("data area past the segment", total, "size");
  h->table_offset = 0;
  expect_refused("table offset", total, "size");
  h->data_offset += kDataAlign;
  expect_refused("data offset", total, "size");
  h->max_leases = 0;
  expect_refused("no slots", total, "size");
  h->max_leases = 1 << 20;  // a table that would not fit before the data area
  expect_refused("table past the data offset", total, "size");
  EXPECT_FALSE(LeaseTable::open(nullptr, total, &why));
  EXPECT_TRUE(LeaseTable::open(a.base(), total, nullptr));  // `why` is optional
  h->magic[0] = 0;
  EXPECT_FALSE(LeaseTable::open(a.base(), total, nullptr));
}

// A data size so large that data_offset + data_bytes wraps around 2^64 must not pass for a
// small segment: leases would then be handed out far outside the mapping.
TEST(PoolLayout, OpenRejectsADataSizeThatWraps) {
  const uint64_t total = pool_total_bytes(8 * MiB, 32);
  Arena a(total);
  ASSERT_TRUE(LeaseTable::format(a.base(), total, 32, 1));
  auto* h = static_cast<PoolHeader*>(a.base());
  h->data_bytes = ~uint64_t{0} - h->data_offset + 1;  // data_offset + data_bytes == 0 (mod 2^64)
  std::string why;
  auto t = LeaseTable::open(a.base(), total, &why);
  EXPECT_FALSE(t) << "a pool header claiming " << h->data_bytes << " data bytes in a segment of " << total
                  << " bytes was accepted";
  if (t) {
    auto off = t->lease(64 * MiB, 1, 1);
    EXPECT_FALSE(off && *off + 64 * MiB > total) << "and it leased an extent past the segment's end";
  }
}

// Another process of the user may write the shared header at any time: the table keeps the
// geometry it checked when it opened the pool, and never reads past its own slots or area.
TEST(PoolLayout, AHeaderRewrittenAfterOpenChangesNothing) {
  const uint64_t total = pool_total_bytes(8 * MiB, 32);
  Arena a(total);
  ASSERT_TRUE(LeaseTable::format(a.base(), total, 32, 1));
  std::string why;
  auto t = LeaseTable::open(a.base(), total, &why);
  ASSERT_TRUE(t) << why;
  auto x = t->lease(MiB, 7, 70);
  ASSERT_TRUE(x);
  unsigned char* data = t->data();

  auto* h = static_cast<PoolHeader*>(a.base());
  h->max_leases = ~uint32_t{0};         // a table of 128 GiB
  h->table_offset = uint64_t{1} << 40;  // far past the segment's end
  h->data_offset = uint64_t{1} << 41;
  h->data_bytes = ~uint64_t{0} / 2;
  EXPECT_EQ(t->max_leases(), 32u);
  EXPECT_EQ(t->data_bytes(), 8 * MiB);
  EXPECT_EQ(t->data(), data);
  EXPECT_EQ(t->used_bytes(), MiB);
  EXPECT_EQ(t->leased_by(7), MiB);
  EXPECT_EQ(t->largest_free(), 7 * MiB);
  EXPECT_EQ(t->leases().size(), 1u);
  auto y = t->lease(4 * MiB, 8, 80);
  ASSERT_TRUE(y);
  EXPECT_LE(*y + 4 * MiB, 8 * MiB);
  EXPECT_FALSE(t->lease(4 * MiB, 8, 80)) << "only 3 MiB are left in the area it opened";
  EXPECT_TRUE(t->release(*x, 7));
  EXPECT_EQ(t->release_all(8), 4 * MiB);
  EXPECT_EQ(t->used_bytes(), 0u);
  for (int i = 0; i < 32; ++i) EXPECT_TRUE(t->lease(kLeaseAlign, 9, 90)) << i;
  EXPECT_FALSE(t->lease(kLeaseAlign, 9, 90)) << "32 slots, as checked at open";
}

// Slots are shared memory too: one whose extent is not inside the data area (past its end, or
// wrapping around 2^64) is never handed out, never reused, and never counted.
TEST(PoolLayout, ASlotOutsideTheDataAreaIsIgnored) {
  const uint64_t total = pool_total_bytes(8 * MiB, 32);
  Arena a(total);
  auto t = LeaseTable::format(a.base(), total, 32, 1);
  ASSERT_TRUE(t);
  auto* slots = reinterpret_cast<LeaseSlot*>(static_cast<unsigned char*>(a.base()) + sizeof(PoolHeader));
  slots[0] = LeaseSlot{1, 5, 50, 0, 8 * MiB - kLeaseAlign, 4 * kLeaseAlign};  // runs past the end
  slots[1] = LeaseSlot{1, 5, 50, 0, ~uint64_t{0} - kLeaseAlign + 1, 2 * kLeaseAlign};  // wraps to kLeaseAlign
  slots[2] = LeaseSlot{1, 6, 60, 0, 0, 0};  // empty
  EXPECT_EQ(t->bad_slots(), 3u);
  EXPECT_TRUE(t->leases().empty());
  EXPECT_EQ(t->used_bytes(), 0u);
  EXPECT_EQ(t->leased_by(5), 0u);
  EXPECT_EQ(t->largest_free(), 8 * MiB);
  auto x = t->lease(8 * MiB, 1, 10);
  ASSERT_TRUE(x) << "the whole area is free";
  EXPECT_EQ(*x, 0u);
  EXPECT_EQ(slots[0].offset, 8 * MiB - kLeaseAlign) << "a bad slot is not reused";
  EXPECT_EQ(t->release_all(5), 0u) << "frees the bad slots, counting no bytes";
  EXPECT_EQ(t->bad_slots(), 1u);
}

TEST(PoolLayout, FirstFitAndAlignment) {
  const uint64_t total = pool_total_bytes(16 * MiB, 64);
  Arena a(total);
  auto t = LeaseTable::format(a.base(), total, 64, 1);
  ASSERT_TRUE(t);
  // Requests round up to the granule; extents start on granules.
  auto x = t->lease(1, 1, 100);
  ASSERT_TRUE(x);
  EXPECT_EQ(*x, 0u);
  auto y = t->lease(kLeaseAlign + 1, 1, 100);
  ASSERT_TRUE(y);
  EXPECT_EQ(*y, kLeaseAlign);
  auto z = t->lease(MiB, 2, 200);
  ASSERT_TRUE(z);
  EXPECT_EQ(*z, 3 * kLeaseAlign);
  EXPECT_EQ(t->used_bytes(), 3 * kLeaseAlign + MiB);
  EXPECT_EQ(t->leased_by(1), 3 * kLeaseAlign);
  EXPECT_EQ(t->leased_by(2), MiB);
  EXPECT_EQ(t->leased_by(3), 0u);
  for (const LeaseSlot& s : t->leases()) {
    EXPECT_EQ(s.offset % kLeaseAlign, 0u);
    EXPECT_EQ(s.bytes % kLeaseAlign, 0u);
    EXPECT_EQ(s.used, 1u);
  }
  auto pid_of = [&](uint64_t off) {
    for (const LeaseSlot& s : t->leases())
      if (s.offset == off) return s.pid;
    return 0u;
  };
  EXPECT_EQ(pid_of(*z), 200u);

  // Free the 2-granule hole at kLeaseAlign: a small lease fills it first, a larger one does
  // not fit there and goes after the last extent.
  ASSERT_TRUE(t->release(*y, 1));
  auto big = t->lease(3 * kLeaseAlign, 3, 300);
  ASSERT_TRUE(big);
  EXPECT_EQ(*big, 3 * kLeaseAlign + MiB);
  auto small = t->lease(kLeaseAlign, 3, 300);
  ASSERT_TRUE(small);
  EXPECT_EQ(*small, kLeaseAlign);
  auto small2 = t->lease(kLeaseAlign, 3, 300);
  ASSERT_TRUE(small2);
  EXPECT_EQ(*small2, 2 * kLeaseAlign);

  // Zero bytes, more than the pool, and what no hole can hold are refused.
  EXPECT_FALSE(t->lease(0, 1, 1));
  EXPECT_FALSE(t->lease(16 * MiB + 1, 1, 1));
  EXPECT_FALSE(t->lease(~uint64_t{0}, 1, 1));
  EXPECT_FALSE(t->lease(t->largest_free() + 1, 1, 1));
  EXPECT_TRUE(t->lease(t->largest_free(), 1, 1));
  EXPECT_EQ(t->largest_free(), 0u);
  EXPECT_EQ(t->used_bytes(), 16 * MiB);
}

TEST(PoolLayout, ReleaseChecksOwnerAndOffset) {
  const uint64_t total = pool_total_bytes(8 * MiB, 16);
  Arena a(total);
  auto t = LeaseTable::format(a.base(), total, 16, 1);
  ASSERT_TRUE(t);
  auto x = t->lease(MiB, 1, 10);
  ASSERT_TRUE(x);
  EXPECT_FALSE(t->release(*x, 2)) << "released by another client";
  EXPECT_FALSE(t->release(*x + kLeaseAlign, 1)) << "released from inside the extent";
  EXPECT_EQ(t->used_bytes(), MiB);
  EXPECT_TRUE(t->release(*x, 1));
  EXPECT_FALSE(t->release(*x, 1)) << "released twice";
  EXPECT_EQ(t->used_bytes(), 0u);
  // A free slot (all zero) is not client 0's lease at offset 0.
  EXPECT_FALSE(t->release(0, 0));
}

TEST(PoolLayout, ReleaseAllAndSlots) {
  const uint64_t total = pool_total_bytes(8 * MiB, 16);
  Arena a(total);
  auto t = LeaseTable::format(a.base(), total, 16, 1);
  ASSERT_TRUE(t);
  // 16 slots: the 17th lease is refused even with bytes to spare.
  for (int i = 0; i < 16; ++i) ASSERT_TRUE(t->lease(kLeaseAlign, 1 + i % 3, 1)) << i;
  EXPECT_FALSE(t->lease(kLeaseAlign, 1, 1));
  EXPECT_EQ(t->leased_by(1), 6 * kLeaseAlign);
  EXPECT_EQ(t->release_all(1), 6 * kLeaseAlign);
  EXPECT_EQ(t->leased_by(1), 0u);
  EXPECT_EQ(t->leased_by(2), 5 * kLeaseAlign);
  EXPECT_EQ(t->used_bytes(), 10 * kLeaseAlign);
  EXPECT_EQ(t->release_all(1), 0u);
  EXPECT_EQ(t->release_all(99), 0u);
  // Freed slots are reused.
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(t->lease(kLeaseAlign, 4, 1)) << i;
  EXPECT_FALSE(t->lease(kLeaseAlign, 4, 1));
  EXPECT_EQ(t->release_all(2) + t->release_all(3) + t->release_all(4), 16 * kLeaseAlign);
  EXPECT_EQ(t->used_bytes(), 0u);
  EXPECT_EQ(t->largest_free(), 8 * MiB);
}

TEST(PoolLayout, LargestFree) {
  const uint64_t total = pool_total_bytes(4 * MiB, 16);
  Arena a(total);
  auto t = LeaseTable::format(a.base(), total, 16, 1);
  ASSERT_TRUE(t);
  auto x = t->lease(MiB, 1, 1);       // [0, 1M)
  auto y = t->lease(MiB, 1, 1);       // [1M, 2M)
  auto z = t->lease(MiB / 2, 1, 1);   // [2M, 2.5M)
  ASSERT_TRUE(x && y && z);
  EXPECT_EQ(t->largest_free(), 3 * MiB / 2);  // the tail
  ASSERT_TRUE(t->release(*x, 1));
  EXPECT_EQ(t->largest_free(), 3 * MiB / 2);
  ASSERT_TRUE(t->release(*y, 1));
  EXPECT_EQ(t->largest_free(), 2 * MiB);  // the head hole is now the largest
  ASSERT_EQ(t->lease(3 * MiB / 2, 1, 1).value_or(~0ull), 0u);  // [0, 1.5M): the head hole keeps 0.5M
  EXPECT_EQ(t->largest_free(), 3 * MiB / 2);   // the tail
  ASSERT_EQ(t->lease(3 * MiB / 2, 1, 1).value_or(~0ull), 5 * MiB / 2);  // does not fit the hole: the tail
  EXPECT_EQ(t->largest_free(), MiB / 2);
}

// Random leases and releases by several clients against a model: first fit gives the
// model's offset, no two live leases overlap, the sums agree, and a re-opened table (a
// restarted daemon) sees the same leases.
TEST(PoolLayout, RandomisedLeasesNeverOverlap) {
  const uint64_t data = 64 * MiB;
  const uint32_t slots = 96;
  const uint64_t total = pool_total_bytes(data, slots);
  Arena a(total);
  auto t = LeaseTable::format(a.base(), total, slots, 1);
  ASSERT_TRUE(t);
  struct Live {
    uint64_t bytes;
    uint32_t client;
  };
  std::map<uint64_t, Live> model;  // offset -> lease
  auto model_first_fit = [&](uint64_t bytes) -> std::optional<uint64_t> {
    uint64_t at = 0;
    for (auto& [off, l] : model) {
      if (off >= at + bytes) break;
      at = std::max(at, off + l.bytes);
    }
    if (at + bytes > data) return std::nullopt;
    return at;
  };
  std::mt19937_64 rng(20240611);
  uint64_t leases = 0, refusals = 0, releases = 0;
  for (int op = 0; op < 6000; ++op) {
    uint64_t r = rng() % 100;
    if (r < 55) {
      uint64_t bytes = 1 + rng() % (4 * MiB);
      uint32_t client = 1 + static_cast<uint32_t>(rng() % 5);
      uint64_t rounded = (bytes + kLeaseAlign - 1) / kLeaseAlign * kLeaseAlign;
      auto want = model.size() < slots ? model_first_fit(rounded) : std::nullopt;
      auto got = t->lease(bytes, client, 1000 + client);
      ASSERT_EQ(got.has_value(), want.has_value()) << "op " << op << ", " << bytes << " bytes";
      if (got) {
        ASSERT_EQ(*got, *want) << "op " << op << ": not the first fit";
        model[*got] = {rounded, client};
        ++leases;
      } else {
        ++refusals;
      }
    } else if (r < 95 && !model.empty()) {
      auto it = model.begin();
      std::advance(it, static_cast<long>(rng() % model.size()));
      uint32_t wrong = it->second.client % 5 + 1;
      ASSERT_FALSE(t->release(it->first, wrong)) << "op " << op << ": released by client " << wrong;
      ASSERT_TRUE(t->release(it->first, it->second.client)) << "op " << op;
      model.erase(it);
      ++releases;
    } else {
      uint32_t client = 1 + static_cast<uint32_t>(rng() % 5);
      uint64_t want = 0;
      for (auto it = model.begin(); it != model.end();) {
        if (it->second.client == client) {
          want += it->second.bytes;
          it = model.erase(it);
        } else {
          ++it;
        }
      }
      ASSERT_EQ(t->release_all(client), want) << "op " << op;
    }

    // The table agrees with the model, and no two live leases share a byte.
    std::vector<LeaseSlot> live = t->leases();
    ASSERT_EQ(live.size(), model.size()) << "op " << op;
    uint64_t sum = 0;
    std::map<uint32_t, uint64_t> per_client;
    for (size_t i = 0; i < live.size(); ++i) {
      const LeaseSlot& s = live[i];
      ASSERT_EQ(s.offset % kLeaseAlign, 0u);
      ASSERT_EQ(s.bytes % kLeaseAlign, 0u);
      ASSERT_GT(s.bytes, 0u);
      ASSERT_LE(s.offset + s.bytes, data);
      auto m = model.find(s.offset);
      ASSERT_NE(m, model.end()) << "op " << op << ": a lease at " << s.offset << " the model does not have";
      ASSERT_EQ(m->second.bytes, s.bytes);
      ASSERT_EQ(m->second.client, s.client_id);
      ASSERT_EQ(s.pid, 1000 + s.client_id);
      for (size_t j = i + 1; j < live.size(); ++j) {
        const LeaseSlot& o = live[j];
        ASSERT_TRUE(s.offset + s.bytes <= o.offset || o.offset + o.bytes <= s.offset)
            << "op " << op << ": [" << s.offset << ", +" << s.bytes << ") overlaps [" << o.offset << ", +"
            << o.bytes << ")";
      }
      sum += s.bytes;
      per_client[s.client_id] += s.bytes;
    }
    ASSERT_EQ(t->used_bytes(), sum) << "op " << op;
    for (uint32_t c = 1; c <= 5; ++c) ASSERT_EQ(t->leased_by(c), per_client[c]) << "op " << op;
    // largest_free against the model's gaps.
    uint64_t at = 0, best = 0;
    for (auto& [off, l] : model) {
      best = std::max(best, off - at);
      at = off + l.bytes;
    }
    best = std::max(best, data - at);
    ASSERT_EQ(t->largest_free(), best) << "op " << op;

    if (op % 1000 == 999) {  // a restarted daemon re-opens the same memory
      std::string why;
      auto re = LeaseTable::open(a.base(), total, &why);
      ASSERT_TRUE(re) << why;
      ASSERT_EQ(re->used_bytes(), sum);
      ASSERT_EQ(re->leases().size(), model.size());
      t = re;
    }
  }
  EXPECT_GT(leases, 1000u);
  EXPECT_GT(refusals, 10u) << "the pool never filled: the test proves little";
  EXPECT_GT(releases, 1000u);
}

}  // namespace
}  // namespace offload

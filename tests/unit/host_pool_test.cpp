// The shim's host pools without a daemon: the private fallback pool and pinning in chunks.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "client/pool_layout.h"
#include "host_pool.h"

namespace offload {
namespace {

TEST(PinInChunks, CoversTheAreaInChunksUnderTheLimit) {
  std::vector<std::pair<unsigned char*, uint64_t>> calls;
  auto* base = reinterpret_cast<unsigned char*>(0x10000000);
  const uint64_t bytes = 5 * 1000 + 123, chunk = 1000;
  ASSERT_TRUE(pin_in_chunks(base, bytes, [&](void* p, uint64_t n) {
    calls.emplace_back(static_cast<unsigned char*>(p), n);
    return true;
  }, chunk));
  ASSERT_EQ(calls.size(), 6u);
  uint64_t at = 0;
  for (auto [p, n] : calls) {
    EXPECT_EQ(p, base + at) << "chunks are contiguous and in order";
    EXPECT_LE(n, chunk);
    at += n;
  }
  EXPECT_EQ(at, bytes) << "every byte pinned once";
}

TEST(PinInChunks, DefaultChunkStaysUnderTwoGiB) {
  uint64_t largest = 0;
  pin_in_chunks(reinterpret_cast<unsigned char*>(0x10000000), 5ull << 30, [&](void*, uint64_t n) {
    largest = std::max(largest, n);
    return true;
  });
  EXPECT_LT(largest, 2ull << 30);
  EXPECT_GT(largest, 1ull << 30);
}

TEST(PinInChunks, StopsAtTheFirstRefusal) {
  int calls = 0;
  EXPECT_FALSE(pin_in_chunks(reinterpret_cast<unsigned char*>(0x10000000), 10'000, [&](void*, uint64_t) {
    return ++calls < 2;
  }, 1000));
  EXPECT_EQ(calls, 2);
}

TEST(PrivatePool, LeasesDisjointWritableExtentsAndRefusesWhenFull) {
  PrivatePool pool(64ull << 20);
  std::string why;
  std::vector<Extent> got;
  for (;;) {
    auto e = pool.lease(3u << 20, &why);
    if (!e) break;
    std::memset(e->host, static_cast<int>(got.size() + 1), e->bytes);  // the memory is ours to write
    got.push_back(*e);
  }
  EXPECT_EQ(why, "private pool full") << "a full pool is a refusal with a reason, not a crash";
  ASSERT_GE(got.size(), 20u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].host[0], static_cast<unsigned char>(i + 1)) << "extents do not overlap";
    EXPECT_EQ(got[i].host[got[i].bytes - 1], static_cast<unsigned char>(i + 1));
  }
  pool.release(got[3]);
  auto again = pool.lease(3u << 20, &why);
  ASSERT_TRUE(again.has_value()) << "released room is leased again";
  EXPECT_EQ(again->offset, got[3].offset);
  EXPECT_NE(pool.describe().find("private pool"), std::string::npos);
}

TEST(PrivatePool, PinsOnceAndSaysSo) {
  PrivatePool pool(64ull << 20);
  int calls = 0;
  uint64_t pinned = 0;
  auto pin = [&](void*, uint64_t n) {
    ++calls;
    pinned += n;
    return true;
  };
  EXPECT_FALSE(pool.pinned());
  EXPECT_TRUE(pool.pin(pin));
  EXPECT_TRUE(pool.pinned());
  EXPECT_GE(pinned, 64ull << 20);
  int after_first = calls;
  EXPECT_TRUE(pool.pin(pin));
  EXPECT_EQ(calls, after_first) << "pinned once, not again";
  EXPECT_NE(pool.describe().find("pinned"), std::string::npos);
}

TEST(PrivatePool, AFailedPinLeavesItUnpinned) {
  PrivatePool pool(64ull << 20);
  EXPECT_FALSE(pool.pin([](void*, uint64_t) { return false; }));
  EXPECT_FALSE(pool.pinned());
}

}  // namespace
}  // namespace offload

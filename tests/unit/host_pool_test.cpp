// The shim's host pools without a daemon: the private fallback pool and pinning in chunks;
// what the shim tells offloadd about its GPU and rank (attach_info_from_env).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "offload/pool_layout.h"
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

using Env = std::map<std::string, std::string>;

AttachInfo from(const Env& env) {
  return attach_info_from_env(3, 40ull << 30, "0000:1b:00.0", [&](const char* k) -> const char* {
    auto it = env.find(k);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(AttachInfoFromEnv, TorchrunsVariables) {
  AttachInfo a = from({{"RANK", "5"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}, {"WORLD_SIZE", "8"}});
  EXPECT_EQ(a.gpu, 3);
  EXPECT_EQ(a.device_budget, 40ull << 30);
  EXPECT_EQ(a.gpu_id, "0000:1b:00.0");
  EXPECT_EQ(a.rank, 5);
  EXPECT_EQ(a.local_rank, 1);
  EXPECT_EQ(a.local_world, 4);
  a = from({{"RANK", "0"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "1"}});
  EXPECT_EQ(a.rank, 0);
  EXPECT_EQ(a.local_rank, 0);
  EXPECT_EQ(a.local_world, 1);
  a = from({{"LOCAL_WORLD_SIZE", std::to_string(proto::kMaxLocalWorld)}});
  EXPECT_EQ(a.local_world, proto::kMaxLocalWorld);
}

TEST(AttachInfoFromEnv, UnsetMeansNone) {
  AttachInfo a = from({});
  EXPECT_EQ(a.rank, -1);
  EXPECT_EQ(a.local_rank, -1);
  EXPECT_EQ(a.local_world, 0);
  EXPECT_EQ(a.gpu, 3) << "the caller's figures stay";
  EXPECT_EQ(a.gpu_id, "0000:1b:00.0");
}

TEST(AttachInfoFromEnv, BadValuesCountAsUnsetAndNeverThrow) {
  for (const std::string bad : {"", "-1", "abc", "1.5", " 2", "2 ", "+3", "0x10", "1e3", "99999999999",
                                "2147483648", "18446744073709551617", "٣"}) {
    SCOPED_TRACE("'" + bad + "'");
    AttachInfo a;
    ASSERT_NO_THROW(a = from({{"RANK", bad}, {"LOCAL_RANK", bad}, {"LOCAL_WORLD_SIZE", bad}}));
    EXPECT_EQ(a.rank, -1);
    EXPECT_EQ(a.local_rank, -1);
    EXPECT_EQ(a.local_world, 0);
  }
  // A world of none, or of more than the protocol takes.
  EXPECT_EQ(from({{"LOCAL_WORLD_SIZE", "0"}}).local_world, 0);
  EXPECT_EQ(from({{"LOCAL_WORLD_SIZE", std::to_string(proto::kMaxLocalWorld + 1)}}).local_world, 0);
  // The largest rank an int holds is still a rank.
  EXPECT_EQ(from({{"RANK", "2147483647"}}).rank, 2147483647);
  // One bad variable does not spoil the others.
  AttachInfo a = from({{"RANK", "x"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "3"}});
  EXPECT_EQ(a.rank, -1);
  EXPECT_EQ(a.local_rank, 2);
  EXPECT_EQ(a.local_world, 3);
}

TEST(AttachInfoFromEnv, ReadsTheProcessEnvironment) {
  setenv("RANK", "7", 1);
  setenv("LOCAL_RANK", "3", 1);
  setenv("LOCAL_WORLD_SIZE", "8", 1);
  AttachInfo a = attach_info_from_env(1, 0, "0000:2c:00.0");
  unsetenv("RANK");
  unsetenv("LOCAL_RANK");
  unsetenv("LOCAL_WORLD_SIZE");
  EXPECT_EQ(a.gpu, 1);
  EXPECT_EQ(a.rank, 7);
  EXPECT_EQ(a.local_rank, 3);
  EXPECT_EQ(a.local_world, 8);
  EXPECT_EQ(a.gpu_id, "0000:2c:00.0");
  a = attach_info_from_env(1, 0, "");
  EXPECT_EQ(a.rank, -1);
  EXPECT_EQ(a.local_world, 0);
}

}  // namespace
}  // namespace offload

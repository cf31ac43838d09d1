// The shim's host pools without a daemon: the private fallback pool and pinning what it leases;
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

// Records each pin(ptr, bytes) the pool asks for; refuses while `refuse` is set.
struct PinLog {
  std::vector<std::pair<unsigned char*, uint64_t>> calls;
  bool refuse = false;
  HostPool::PinFn fn() {
    return [this](void* p, uint64_t n) {
      if (refuse) return false;
      calls.emplace_back(static_cast<unsigned char*>(p), n);
      return true;
    };
  }
};

TEST(PrivatePool, PinsOnlyTheChunksALeaseTouchesAndEachOnce) {
  constexpr uint64_t kChunk = 8ull << 20;
  PrivatePool pool(64ull << 20);
  std::string why;
  auto a = pool.lease(3u << 20, &why), b = pool.lease(10u << 20, &why);
  ASSERT_TRUE(a && b) << why;
  unsigned char* data = a->host - a->offset;
  PinLog log;
  EXPECT_EQ(pool.pinned_bytes(), 0u) << "nothing is pinned before a lease asks";
  ASSERT_TRUE(pool.pin_extent(*b, log.fn(), kChunk));
  // b lies in [3 MiB, 13 MiB): chunks 0 and 1, each pinned whole, on the chunk grid.
  ASSERT_EQ(log.calls.size(), 2u);
  EXPECT_EQ(log.calls[0], std::make_pair(data, kChunk));
  EXPECT_EQ(log.calls[1], std::make_pair(data + kChunk, kChunk));
  EXPECT_EQ(pool.pinned_bytes(), 2 * kChunk);
  EXPECT_NE(pool.describe().find("16 MiB pinned"), std::string::npos) << pool.describe();
  ASSERT_TRUE(pool.pin_extent(*a, log.fn(), kChunk));
  EXPECT_EQ(log.calls.size(), 2u) << "a lies in chunk 0, pinned already";
  auto c = pool.lease(40u << 20, &why);
  ASSERT_TRUE(c) << why;
  ASSERT_TRUE(pool.pin_extent(*c, log.fn(), kChunk));
  uint64_t first = c->offset / kChunk, last = (c->offset + c->bytes - 1) / kChunk;
  EXPECT_EQ(log.calls.size(), 2u + (last - std::max<uint64_t>(first, 2)) + 1) << "only chunks not pinned before";
  EXPECT_FALSE(pool.pin_extent(*c, log.fn(), kChunk / 2)) << "another grid would overlap the registrations";
}

TEST(PrivatePool, AChunkThatFailedToPinIsTriedAgain) {
  PrivatePool pool(64ull << 20);
  std::string why;
  auto a = pool.lease(1u << 20, &why);
  ASSERT_TRUE(a) << why;
  PinLog log;
  log.refuse = true;
  EXPECT_FALSE(pool.pin_extent(*a, log.fn(), 8ull << 20));
  EXPECT_EQ(pool.pinned_bytes(), 0u);
  EXPECT_EQ(pool.describe().find("pinned"), std::string::npos);
  log.refuse = false;
  EXPECT_TRUE(pool.pin_extent(*a, log.fn(), 8ull << 20));
  EXPECT_EQ(log.calls.size(), 1u);
  EXPECT_EQ(pool.pinned_bytes(), 8ull << 20);
}

TEST(PrivatePool, TheLastChunkIsPinnedUpToTheAreasEnd) {
  PrivatePool pool(20ull << 20);  // chunks of 8 MiB: 8, 8, and the rest
  std::string why;
  auto a = pool.lease(20ull << 20, &why);
  ASSERT_TRUE(a) << why;
  PinLog log;
  ASSERT_TRUE(pool.pin_extent(*a, log.fn(), 8ull << 20));
  ASSERT_EQ(log.calls.size(), 3u);
  uint64_t sum = 0;
  for (auto [p, n] : log.calls) sum += n;
  EXPECT_GE(sum, 20ull << 20);
  EXPECT_LE(log.calls.back().second, 8ull << 20);
  EXPECT_EQ(pool.pinned_bytes(), sum);
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

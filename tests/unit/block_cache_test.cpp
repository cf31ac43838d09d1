// BlockCache (OFFLOAD_BLOCK_CACHE): a freed block comes back only to an allocation of its
// exact size on the stream that freed it, never across a graph capture, and never past the
// bound; a drain hands every kept block back with its stream.
#include "core/block_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace offload {
namespace {

constexpr Stream kA = 0x10, kB = 0x20;
constexpr uint64_t kCtx = 0xc0, kOtherCtx = 0xd0;  // two devices' contexts
constexpr int kNotCapturing = 0, kCapturing = 1, kUnknown = -1;

TEST(BlockCache, OffKeepsNothing) {
  BlockCache c;
  EXPECT_FALSE(c.enabled());
  EXPECT_FALSE(c.keep(0x1000, 4096, kCtx, kA, kNotCapturing));
  EXPECT_EQ(c.take(4096, kCtx, kA, kNotCapturing), 0u);
  EXPECT_EQ(c.stats().kept, 0u);
}

TEST(BlockCache, AFreedBlockServesTheNextAllocationOfItsSizeOnItsStreamLastFreedFirst) {
  BlockCache c(1 << 20);
  ASSERT_TRUE(c.keep(0x1000, 4096, kCtx, kA, kNotCapturing));
  ASSERT_TRUE(c.keep(0x3000, 4096, kCtx, kA, kNotCapturing));
  EXPECT_EQ(c.stats().kept_bytes, 8192u);
  EXPECT_EQ(c.take(4096, kCtx, kA, kNotCapturing), 0x3000u) << "the block freed last";
  EXPECT_EQ(c.take(4096, kCtx, kA, kNotCapturing), 0x1000u);
  EXPECT_EQ(c.take(4096, kCtx, kA, kNotCapturing), 0u) << "none left";
  const BlockCache::Stats s = c.stats();
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.kept_bytes, 0u);
  EXPECT_EQ(s.kept_peak, 8192u);
}

TEST(BlockCache, AnotherStreamOrAnotherSizeIsNotServed) {
  BlockCache c(1 << 20);
  ASSERT_TRUE(c.keep(0x1000, 4096, kCtx, kA, kNotCapturing));
  EXPECT_EQ(c.take(4096, kCtx, kB, kNotCapturing), 0u) << "another stream would need an event";
  EXPECT_EQ(c.take(4097, kCtx, kA, kNotCapturing), 0u) << "exact sizes only";
  EXPECT_EQ(c.take(2048, kCtx, kA, kNotCapturing), 0u);
  EXPECT_EQ(c.take(4096, kCtx, kA, kNotCapturing), 0x1000u) << "still there for its own stream and size";
}

TEST(BlockCache, ThePerThreadDefaultStreamIsNeverServedItsHandleNamesAStreamPerThread) {
  BlockCache c(1 << 20);
  EXPECT_FALSE(c.keep(0x1000, 4096, kCtx, kPerThreadStream, kNotCapturing));
  EXPECT_EQ(c.take(4096, kCtx, kPerThreadStream, kNotCapturing), 0u);
  EXPECT_TRUE(c.keep(0x1000, 4096, kCtx, 0, kNotCapturing)) << "the legacy stream is one stream for every thread";
  EXPECT_EQ(c.take(4096, kCtx, 0, kNotCapturing), 0x1000u);
}

// The legacy stream's handle (0) is the same on every device: blocks are kept per context, and
// a drain on a full device gives back that device's blocks only.
TEST(BlockCache, BlocksStayWithTheirDeviceAndADrainTakesOnlyThatDevicesBlocks) {
  BlockCache c(1 << 20);
  ASSERT_TRUE(c.keep(0x1000, 4096, kCtx, 0, kNotCapturing));
  ASSERT_TRUE(c.keep(0x9000, 4096, kOtherCtx, 0, kNotCapturing));
  EXPECT_FALSE(c.keep(0x5000, 4096, 0, 0, kNotCapturing)) << "no context known: not kept";
  EXPECT_EQ(c.take(4096, 0, 0, kNotCapturing), 0u);
  auto out = c.drain(kOtherCtx);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].first, 0x9000u);
  EXPECT_EQ(c.stats().kept_bytes, 4096u) << "the other device's block stays";
  EXPECT_EQ(c.take(4096, kOtherCtx, 0, kNotCapturing), 0u);
  EXPECT_EQ(c.take(4096, kCtx, 0, kNotCapturing), 0x1000u);
}

TEST(BlockCache, NothingIsTakenOrKeptWhileAStreamCapturesOrWhenThatCannotBeTold) {
  BlockCache c(1 << 20);
  EXPECT_FALSE(c.keep(0x1000, 4096, kCtx, kA, kCapturing));
  EXPECT_FALSE(c.keep(0x2000, 4096, kCtx, kA, kUnknown));
  ASSERT_TRUE(c.keep(0x3000, 4096, kCtx, kA, kNotCapturing));
  EXPECT_EQ(c.take(4096, kCtx, kA, kCapturing), 0u) << "a capture must get graph memory, not ours";
  EXPECT_EQ(c.take(4096, kCtx, kA, kUnknown), 0u);
  EXPECT_EQ(c.take(4096, kCtx, kA, kNotCapturing), 0x3000u);
}

TEST(BlockCache, MemoryACaptureMadeIsNeverKeptEvenWhenFreedOutsideOne) {
  BlockCache c(1 << 20);
  c.note_forwarded(0x5000, kA, kCapturing);
  c.note_forwarded(0x6000, kA, kUnknown);
  c.note_forwarded(0x7000, kA, kNotCapturing);
  EXPECT_EQ(c.stats().captured, 2u);
  EXPECT_FALSE(c.keep(0x5000, 4096, kCtx, kA, kNotCapturing)) << "a graph's memory";
  EXPECT_FALSE(c.keep(0x6000, 4096, kCtx, kA, kNotCapturing)) << "made when capture could not be told";
  EXPECT_TRUE(c.keep(0x7000, 4096, kCtx, kA, kNotCapturing));
  // The mark goes with the free: the same address, allocated again outside a capture, is kept.
  EXPECT_TRUE(c.keep(0x5000, 4096, kCtx, kA, kNotCapturing));
  // And a mark is honoured even after the cache was turned off.
  c.note_forwarded(0x8000, kA, kCapturing);
  c.set_max(0);
  EXPECT_FALSE(c.keep(0x8000, 4096, kCtx, kA, kNotCapturing));
}

TEST(BlockCache, FreesPastTheBoundAreForwarded) {
  BlockCache c(10000);
  ASSERT_TRUE(c.keep(0x1000, 6000, kCtx, kA, kNotCapturing));
  EXPECT_FALSE(c.keep(0x9000, 6000, kCtx, kA, kNotCapturing)) << "12000 bytes would pass 10000";
  EXPECT_TRUE(c.keep(0xa000, 4000, kCtx, kB, kNotCapturing)) << "10000 is within";
  EXPECT_EQ(c.stats().forwarded, 1u);
  EXPECT_EQ(c.take(6000, kCtx, kA, kNotCapturing), 0x1000u);
  EXPECT_TRUE(c.keep(0x9000, 6000, kCtx, kA, kNotCapturing)) << "room again once one was taken";
  EXPECT_FALSE(c.keep(0xb000, 0, kCtx, kA, kNotCapturing)) << "a block of unknown size is forwarded";
}

TEST(BlockCache, ADrainHandsBackEveryKeptBlockWithItsStreamAndEmptiesTheCache) {
  BlockCache c(1 << 20);
  ASSERT_TRUE(c.keep(0x1000, 4096, kCtx, kA, kNotCapturing));
  ASSERT_TRUE(c.keep(0x2000, 8192, kCtx, kA, kNotCapturing));
  ASSERT_TRUE(c.keep(0x3000, 4096, kCtx, kB, kNotCapturing));
  auto out = c.drain(kCtx);
  std::sort(out.begin(), out.end());
  const std::vector<std::pair<DevPtr, Stream>> want = {{0x1000, kA}, {0x2000, kA}, {0x3000, kB}};
  EXPECT_EQ(out, want);
  EXPECT_EQ(c.stats().kept_bytes, 0u);
  EXPECT_EQ(c.take(4096, kCtx, kA, kNotCapturing), 0u) << "nothing kept after a drain";
  EXPECT_EQ(c.stats().drained_blocks, 3u);
}

// Streams on threads of their own, as PyTorch's are: every block comes back exactly once, to
// its own stream, and the bytes add up (ThreadSanitizer checks the locking in its build).
TEST(BlockCache, ThreadsOnTheirOwnStreamsNeverShareABlock) {
  BlockCache c(64 << 20);
  constexpr int kThreads = 4, kRounds = 2000;
  std::atomic<int> wrong{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      const Stream s = 0x100 + static_cast<Stream>(t);
      const DevPtr mine = 0x10000000ull * static_cast<DevPtr>(t + 1);
      DevPtr held = mine;
      for (int i = 0; i < kRounds; ++i) {
        if (!c.keep(held, 1 << 20, kCtx, s, kNotCapturing)) wrong.fetch_add(1);
        held = c.take(1 << 20, kCtx, s, kNotCapturing);
        if (held != mine) wrong.fetch_add(1);
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(wrong.load(), 0);
  const BlockCache::Stats s = c.stats();
  EXPECT_EQ(s.hits, static_cast<uint64_t>(kThreads * kRounds));
  EXPECT_EQ(s.kept_bytes, 0u);
}

}  // namespace
}  // namespace offload

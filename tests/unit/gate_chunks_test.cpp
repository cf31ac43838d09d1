#include "core/gate_chunks.h"

#include <gtest/gtest.h>

#include <vector>

namespace offload {
namespace {

constexpr uint64_t kMiB = 1 << 20;

std::vector<uint64_t> chunks_of(GateChunks& g, uint64_t now, uint64_t bytes) {
  std::vector<uint64_t> out;
  for (uint64_t left = bytes; left > 0; left -= out.back()) out.push_back(g.next(now, left));
  return out;
}

// Queued at once, a copy goes in chunks of the gate's size until kAhead of them are ahead of
// the link, then in chunks that each take a kAhead-th of what is ahead, every one a multiple of
// the gate's size: 8 GiB in 155 chunks, not 2,048, the largest 248 MiB.
TEST(GateChunks, ChunksWidenWithTheBytesQueuedAheadOfTheLink) {
  GateChunks g(4 * kMiB);
  const std::vector<uint64_t> c = chunks_of(g, 1'000, 8192 * kMiB);
  uint64_t sum = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    sum += c[i];
    EXPECT_EQ(c[i] % (4 * kMiB), 0u) << i;
    if (i > 0 && i + 1 < c.size()) {
      EXPECT_GE(c[i], c[i - 1]) << i;  // the last is what is left
    }
  }
  EXPECT_EQ(sum, 8192 * kMiB);
  for (size_t i = 0; i <= GateChunks::kAhead; ++i) EXPECT_EQ(c[i], 4 * kMiB) << i;
  EXPECT_EQ(c[GateChunks::kAhead + 1], 8 * kMiB);
  EXPECT_EQ(c.size(), 155u);
  EXPECT_EQ(c[c.size() - 2], 248 * kMiB);
}

// Copies queued no faster than the link runs them stay in the gate's size; once the estimate
// says the link has caught up, so do the chunks; a copy's last chunk is what is left.
TEST(GateChunks, ChunksGoBackToTheGatesSizeOnceTheLinkCatchesUp) {
  GateChunks g(4 * kMiB);
  const uint64_t per_chunk_ns = 4 * kMiB / GateChunks::kBytesPerNs;
  uint64_t now = 5'000;
  for (int i = 0; i < 1000; ++i, now += per_chunk_ns) ASSERT_EQ(g.next(now, 64 * kMiB), 4 * kMiB) << i;
  const std::vector<uint64_t> burst = chunks_of(g, now, 2048 * kMiB);
  ASSERT_GT(burst.back(), 4 * kMiB);
  const uint64_t later = now + 2048 * kMiB / GateChunks::kBytesPerNs + 1;
  EXPECT_EQ(g.next(later, 64 * kMiB), 4 * kMiB);
  EXPECT_EQ(g.next(later, 3 * kMiB), 3 * kMiB);
}

// OFFLOAD_CAP_GATE_AHEAD: more chunks of the gate's size before they widen, and no chunk wider
// than an `ahead`-th of all that is queued, so that a grant waits for less of a chunk.
TEST(GateChunks, MoreAheadKeepsTheChunksNarrower) {
  for (uint32_t ahead : {8u, 32u, 128u}) {
    GateChunks g(4 * kMiB, ahead);
    const std::vector<uint64_t> c = chunks_of(g, 1'000, 8192 * kMiB);
    uint64_t sum = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      sum += c[i];
      EXPECT_EQ(c[i] % (4 * kMiB), 0u) << ahead << " " << i;
      EXPECT_LE(c[i], 8192 * kMiB / ahead) << ahead << " " << i;  // never more than a share of it all
    }
    EXPECT_EQ(sum, 8192 * kMiB) << ahead;
    for (size_t i = 0; i <= ahead; ++i) EXPECT_EQ(c[i], 4 * kMiB) << ahead << " " << i;
    EXPECT_EQ(c[ahead + 1], 8 * kMiB) << ahead;
    EXPECT_GE(c.size(), size_t{ahead}) << ahead;
  }
  GateChunks narrow(4 * kMiB, 128), wide(4 * kMiB, 32);
  EXPECT_GT(chunks_of(narrow, 1'000, 8192 * kMiB).size(), chunks_of(wide, 1'000, 8192 * kMiB).size());
}

}  // namespace
}  // namespace offload

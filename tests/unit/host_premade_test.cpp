// PremadeHost: host memory faulted in before the first eviction (preload/residency/host_premade.h).
// Whether a page is faulted in is read from the kernel (mincore), not from the class's counters.
#include "residency/host_premade.h"

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "core/sim_driver.h"

namespace offload {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

// How many of the pages of [p, p + bytes) are in memory.
uint64_t resident_pages(const void* p, uint64_t bytes) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> v((bytes + page - 1) / page);
  if (mincore(const_cast<void*>(p), bytes, v.data()) != 0) return UINT64_MAX;
  uint64_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

uint64_t pages(uint64_t bytes) { return bytes / static_cast<uint64_t>(sysconf(_SC_PAGESIZE)); }

// Waits until `done()` holds, for 20 s at most (the caller asserts what it waited for).
template <class Done>
void wait_until(Done done) {
  const int64_t deadline = mono_ns() + 20'000'000'000;
  while (!done() && mono_ns() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

PremadeHost::Options target(uint64_t bytes, uint64_t piece = kMiB) {
  PremadeHost::Options o;
  o.target = bytes;
  o.piece = piece;
  o.past_first_take = false;  // stopped by the first take, unless a test lets it go on (the default)
  return o;
}

// What the store is lent, as it asks when it may still make memory of its own.
void* take(PremadeHost& pm, uint64_t bytes) { return pm.lend(bytes, true).p; }

// Lends one buffer, once.
struct OneChunk : ChunkSource {
  std::vector<unsigned char> buf = std::vector<unsigned char>(4 * kMiB);
  int asked = 0;
  Lent lend(uint64_t bytes, bool) override {
    ++asked;
    if (asked == 1 && bytes <= buf.size()) return {buf.data(), false};
    return {};
  }
};

TEST(PremadeHost, WhatIsFaultedInBeforeTheFirstTakeIsWhatTheStoreIsGiven) {
  PremadeHost pm(target(16 * kMiB));
  EXPECT_EQ(pm.make_more(6 * kMiB), 6 * kMiB);
  auto* a = static_cast<unsigned char*>(take(pm, 4 * kMiB));
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(resident_pages(a, 4 * kMiB), pages(4 * kMiB));  // faulted in before it was asked for
  EXPECT_EQ(resident_pages(a + 6 * kMiB, 2 * kMiB), 0u);     // past what was made: not yet
  EXPECT_EQ(pm.make_more(2 * kMiB), 0u);                     // the first take ended the making
  EXPECT_EQ(take(pm, 4 * kMiB), nullptr);  // 2 MiB of what was made is left: past it, the store makes its own
  auto* b = static_cast<unsigned char*>(take(pm, 2 * kMiB));
  EXPECT_EQ(b, a + 4 * kMiB);  // carved after the first
  EXPECT_EQ(take(pm, kMiB), nullptr);
  const PremadeHost::Stats s = pm.stats();
  EXPECT_EQ(s.made, 6 * kMiB);
  EXPECT_EQ(s.taken, 6 * kMiB);
}

TEST(PremadeHost, TheThreadEndsBeforeTheFirstTakeReturnsAndNeverWritesWhatWasGiven) {
  PremadeHost pm(target(512 * kMiB, kMiB));
  pm.start();
  wait_until([&] { return pm.stats().made >= 8 * kMiB; });
  ASSERT_GE(pm.stats().made, 8 * kMiB);
  auto* a = static_cast<unsigned char*>(take(pm, 8 * kMiB));
  ASSERT_NE(a, nullptr);
  EXPECT_FALSE(pm.stats().making);  // take() waited for the piece being faulted
  const uint64_t made = pm.stats().made;
  ASSERT_LT(made, 512 * kMiB) << "the thread had ended before the take: nothing was checked";
  if (made > 8 * kMiB) {
    ASSERT_EQ(take(pm, made - 8 * kMiB), a + 8 * kMiB);  // all the rest it made
  }
  std::memset(a, 0xA5, made);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(pm.stats().made, made);
  for (uint64_t off = 0; off < made; off += 4096) ASSERT_EQ(a[off], 0xA5) << off;
}

// Past the first take the thread goes on, and the store, lent only what was already faulted, is
// never given a page the thread writes after: the bytes written into every slot survive.
TEST(PremadeHost, MadePastTheFirstTakeTheSlotsLentAreNeverWrittenByTheThread) {
  PremadeHost::Options o = target(256 * kMiB, kMiB);
  o.past_first_take = true;
  PremadeHost pm(o);
  pm.start();
  std::vector<std::pair<unsigned char*, unsigned char>> slots;
  const int64_t deadline = mono_ns() + 20'000'000'000;
  while (slots.size() < 64 && mono_ns() < deadline) {
    auto* p = static_cast<unsigned char*>(take(pm, 2 * kMiB));
    if (!p) {
      std::this_thread::yield();
      continue;
    }
    const auto mark = static_cast<unsigned char>(slots.size() + 1);
    std::memset(p, mark, 2 * kMiB);
    slots.emplace_back(p, mark);
  }
  ASSERT_EQ(slots.size(), 64u);
  EXPECT_GT(pm.stats().made, 2 * kMiB) << "the making went on past the first take";
  pm.stop();
  for (auto [p, mark] : slots)
    for (uint64_t off = 0; off < 2 * kMiB; off += 4096) ASSERT_EQ(p[off], mark) << off;
  EXPECT_LE(pm.stats().taken, pm.stats().made);
}

TEST(PremadeHost, WhatWasNotTakenGoesBackOnceNoTakeCameForTheIdleTime) {
  PremadeHost::Options o = target(16 * kMiB);
  o.idle_ns = 1'000'000'000;
  PremadeHost pm(o);
  ASSERT_EQ(pm.make_more(16 * kMiB), 16 * kMiB);
  auto* a = static_cast<unsigned char*>(take(pm, 4 * kMiB));
  ASSERT_NE(a, nullptr);
  std::memset(a, 0x5A, 4 * kMiB);
  EXPECT_EQ(pm.trim_idle(mono_ns()), 0u);  // a take just came
  EXPECT_EQ(resident_pages(a + 4 * kMiB, 12 * kMiB), pages(12 * kMiB));
  EXPECT_EQ(pm.trim_idle(mono_ns() + o.idle_ns + 1), 12 * kMiB);
  EXPECT_EQ(resident_pages(a + 4 * kMiB, 12 * kMiB), 0u);  // given back to the system
  EXPECT_EQ(resident_pages(a, 4 * kMiB), pages(4 * kMiB));  // the store's stays
  EXPECT_EQ(a[0], 0x5A);
  EXPECT_EQ(pm.trim_idle(mono_ns() + 2 * o.idle_ns), 0u);  // once
  EXPECT_EQ(take(pm, 4 * kMiB), nullptr);  // nothing made is left: the store makes its own
  EXPECT_EQ(pm.stats().released, 12 * kMiB);
}

TEST(PremadeHost, WithNoTakeAtAllTheMemoryGoesBackOnlyAfterTheLongerWait) {
  PremadeHost::Options o = target(8 * kMiB, kMiB);
  o.idle_ns = 1'000'000'000;
  o.unused_ns = 5'000'000'000;
  PremadeHost pm(o);
  pm.start();  // makes all 8 MiB and ends, the end's time noted
  wait_until([&] { return !pm.stats().making; });
  ASSERT_FALSE(pm.stats().making);
  ASSERT_EQ(pm.stats().made, 8 * kMiB);
  const int64_t ended = mono_ns();
  EXPECT_EQ(pm.trim_idle(ended + 2 * o.idle_ns), 0u);  // a late first eviction still finds it made
  EXPECT_EQ(pm.trim_idle(ended + o.unused_ns + 1), 8 * kMiB);
  EXPECT_EQ(pm.stats().released, 8 * kMiB);
}

TEST(PremadeHost, AFirstSourceLendsFirstAndWhileItCanNothingIsMade) {
  OneChunk pool;
  bool pool_up = true;
  PremadeHost pm(target(8 * kMiB), &pool, [&] { return pool_up; });
  EXPECT_EQ(pm.make_more(8 * kMiB), 0u);  // the pool lends: nothing made here
  EXPECT_EQ(take(pm, kMiB), pool.buf.data());
  pool_up = false;
  EXPECT_EQ(pm.make_more(2 * kMiB), 2 * kMiB);
  void* own = take(pm, kMiB);  // the pool refuses: carved here
  ASSERT_NE(own, nullptr);
  EXPECT_NE(own, pool.buf.data());
  EXPECT_EQ(pool.asked, 2);
}

TEST(PremadeHost, NoTargetMakesNothingAndLendsNothing) {
  PremadeHost pm(target(0));
  pm.start();
  EXPECT_EQ(pm.make_more(kMiB), 0u);
  EXPECT_EQ(take(pm, kMiB), nullptr);
  EXPECT_EQ(pm.trim_idle(mono_ns() + 100'000'000'000), 0u);
}

// A store of 1 MiB chunks up to `limit` bytes.
HostStore::Options mib_store(uint64_t limit) {
  HostStore::Options o;
  o.chunk_bytes = kMiB;
  o.limit = limit;
  return o;
}

TEST(PremadeHost, TheHostStoreTakesItsChunksAsLentAndPinsThem) {
  SimDriver sim;
  PremadeHost pm(target(4 * kMiB));
  ASSERT_EQ(pm.make_more(4 * kMiB), 4 * kMiB);
  HostStore h(sim, mib_store(8 * kMiB), &pm);
  std::vector<void*> slots;
  for (int i = 0; i < 6; ++i) slots.push_back(h.take(kMiB));
  for (void* p : slots) ASSERT_NE(p, nullptr);
  const HostStore::Stats s = h.stats();
  EXPECT_EQ(s.lent, 4 * kMiB);  // the four made ahead
  EXPECT_EQ(s.mapped, 6 * kMiB);  // then two of the store's own, past the reservation
  EXPECT_EQ(sim.pinned().size(), 6u);
  EXPECT_EQ(pm.stats().taken, 4 * kMiB);
  EXPECT_EQ(resident_pages(slots[0], 4 * kMiB), pages(4 * kMiB));
}

// Memory made ahead is this process's: it counts against the store's limit as the store's own
// does, so that the two together never pass it.
TEST(PremadeHost, WhatWasMadeAheadCountsAgainstTheStoresLimit) {
  SimDriver sim;
  PremadeHost pm(target(4 * kMiB));
  ASSERT_EQ(pm.make_more(4 * kMiB), 4 * kMiB);
  HostStore h(sim, mib_store(3 * kMiB), &pm);
  for (int i = 0; i < 3; ++i) ASSERT_NE(h.take(kMiB), nullptr) << i;
  EXPECT_EQ(h.take(kMiB), nullptr) << "a fourth made ahead would pass the limit";
  EXPECT_EQ(pm.stats().taken, 3 * kMiB);
  EXPECT_EQ(h.stats().counted, 3 * kMiB);
  EXPECT_EQ(h.stats().lent, 3 * kMiB);
}

// Signals go to the application's threads: the making thread blocks them all.
TEST(PremadeHost, TheMakingThreadTakesNoSignal) {
  PremadeHost::Options o = target(64 * kMiB, kMiB);
  o.past_first_take = true;
  std::atomic<bool> checked{false}, blocked{false};
  PremadeHost pm(o, nullptr, [&] {
    if (!checked.exchange(true)) {
      sigset_t now;
      pthread_sigmask(SIG_BLOCK, nullptr, &now);
      blocked = sigismember(&now, SIGINT) == 1 && sigismember(&now, SIGTERM) == 1;
    }
    return false;
  });
  sigset_t none, old;
  sigemptyset(&none);
  pthread_sigmask(SIG_SETMASK, &none, &old);  // the caller takes every signal
  pm.start();
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  wait_until([&] { return checked.load(); });
  pm.stop();
  ASSERT_TRUE(checked.load());
  EXPECT_TRUE(blocked.load());
}

TEST(PremadeHost, StopEndsTheMakingAndAStartAfterItDoesNothing) {
  PremadeHost pm(target(1024 * kMiB, kMiB));
  pm.start();
  pm.stop();
  EXPECT_FALSE(pm.stats().making);
  const uint64_t made = pm.stats().made;
  pm.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(pm.stats().made, made);
  EXPECT_LT(made, 1024 * kMiB);
}

TEST(PremadeHost, TheTargetIsTheBudgetWithinAQuarterOfTheHostSharedAmongTheNodesRanks) {
  constexpr uint64_t kGiB = 1ull << 30;
  const uint64_t avail = 128 * kGiB, limit = 96 * kGiB;
  EXPECT_EQ(premake_target(UINT64_MAX, 20 * kGiB, avail, limit, 0), 20 * kGiB);   // the budget
  EXPECT_EQ(premake_target(UINT64_MAX, 60 * kGiB, avail, limit, 1), 32 * kGiB);   // a quarter of the host
  EXPECT_EQ(premake_target(UINT64_MAX, 60 * kGiB, avail, limit, 8), 4 * kGiB);    // eight ranks, a quarter among them
  EXPECT_EQ(premake_target(16 * kGiB, 60 * kGiB, avail, limit, 8), 16 * kGiB);    // asked for: as asked
  EXPECT_EQ(premake_target(200 * kGiB, 60 * kGiB, avail, limit, 1), limit);      // never past the store's limit
}

// The store's own limit is shared among the node's ranks as the making is.
TEST(PremadeHost, TheStoresDefaultLimitIsThreeQuartersOfTheHostSharedAmongTheNodesRanks) {
  constexpr uint64_t kGiB = 1ull << 30;
  EXPECT_EQ(HostStore::default_limit(128 * kGiB), 96 * kGiB);
  EXPECT_EQ(HostStore::default_limit(128 * kGiB, 0), 96 * kGiB);  // LOCAL_WORLD_SIZE unset
  EXPECT_EQ(HostStore::default_limit(128 * kGiB, 8), 12 * kGiB);
}

}  // namespace
}  // namespace offload

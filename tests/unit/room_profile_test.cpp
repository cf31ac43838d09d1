// RoomProfile: the step before's live bytes by place, and how far they rise ahead of a place.
#include "residency/room_profile.h"

#include <gtest/gtest.h>

namespace offload {
namespace {

// Steps of 10 launches: live bytes 100 at every place but 300 at places 4 and 5, and 50 at 8.
uint64_t live_at(uint64_t phase) { return phase == 4 || phase == 5 ? 300 : phase == 8 ? 50 : 100; }

TEST(RoomProfile, NothingIsKnownBeforeAWholeStep) {
  RoomProfile p;
  for (uint64_t i = 0; i < 10; ++i) {
    p.note(i, 10, live_at(i));
    EXPECT_FALSE(p.ready());
    EXPECT_EQ(p.rise(i, 5), 0u);
  }
  p.note(10, 10, live_at(0));
  EXPECT_TRUE(p.ready());
}

TEST(RoomProfile, TheRiseIsTheHighestAheadAboveTheLevelHere) {
  RoomProfile p;
  for (uint64_t i = 0; i < 12; ++i) p.note(i, 10, live_at(i % 10));
  EXPECT_EQ(p.rise(12, 1), 0u);    // place 3 only: 100 above 100
  EXPECT_EQ(p.rise(12, 2), 200u);  // places 3-4: 300
  EXPECT_EQ(p.rise(14, 3), 0u);    // from 300, down to 100
  EXPECT_EQ(p.rise(17, 1), 0u);    // place 8 (50) from 100
  // Past the step's end: places 7-9 and 0-5 of the next.
  EXPECT_EQ(p.rise(16, 9), 200u);
  EXPECT_EQ(p.rise(16, 3), 0u);
  // Longer than a step: the whole step but its own place.
  EXPECT_EQ(p.rise(18, 50), 250u);
}

// Places no launch was seen at take the next seen one's bytes; a step no launch was seen in
// ends with the last bytes seen; the profile follows the step just ended.
TEST(RoomProfile, PlacesNotSeenAndLaterStepsFollow) {
  RoomProfile p;
  p.note(0, 10, 100);
  p.note(5, 10, 400);  // places 1-5: 400
  p.note(12, 10, 100);  // places 6-9 of step 0 keep 400
  EXPECT_EQ(p.rise(2, 2), 0u);
  EXPECT_EQ(p.rise(0, 1), 300u);
  EXPECT_EQ(p.rise(9, 1), 0u);  // place 0: 100 below 400
  for (uint64_t i = 13; i < 30; ++i) p.note(i, 10, 100);  // steps 1 and 2 flat
  EXPECT_EQ(p.rise(30, 9), 0u);
  // A new period starts again.
  p.note(31, 7, 100);
  EXPECT_FALSE(p.ready());
}

// A step longer than the places kept is kept in groups: the rise read from them is never less
// than the rise of the places themselves (a prefetch may wait longer, never take room the
// allocations need), and with places enough it is the same.
TEST(RoomProfile, GroupsOfLaunchesNeverUnderstateTheRise) {
  RoomProfile exact, grouped(4), ample(10);
  for (uint64_t i = 0; i < 20; ++i)
    for (RoomProfile* p : {&exact, &grouped, &ample}) p->note(i, 10, live_at(i % 10) + 7 * (i % 3));
  uint64_t above = 0;
  for (uint64_t at = 20; at < 30; ++at)
    for (uint64_t d = 1; d < 12; ++d) {
      EXPECT_GE(grouped.rise(at, d), exact.rise(at, d)) << at << " " << d;
      EXPECT_EQ(ample.rise(at, d), exact.rise(at, d)) << at << " " << d;
      above += grouped.rise(at, d) > exact.rise(at, d);
    }
  EXPECT_GT(above, 0u) << "four groups of three launches are coarser than ten places";
}

}  // namespace
}  // namespace offload

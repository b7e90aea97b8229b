// ReuseTracker: distances, bins, percentiles and the persistent share on hand-built streams.
#include <gtest/gtest.h>

#include <vector>

#include "workload/reuse_distance.h"

namespace ula {
namespace {

TEST(ReuseTracker, DistancesAreStepsSinceTheLastSelection) {
  ReuseTracker t(4);
  const std::vector<std::uint32_t> a{7}, b{7, 9}, none{};
  t.Add(0, 0, a);     // first use of 7
  t.Add(0, 1, a);     // 7 at distance 1
  t.Add(0, 4, b);     // 7 at distance 3, 9 first use
  t.Add(0, 12, b);    // 7 and 9 at distance 8
  t.Add(1, 12, a);    // another stream: a first use
  const ReuseStats s = t.Finish();
  EXPECT_EQ(s.selections, 7u);
  EXPECT_EQ(s.first_uses, 3u);
  EXPECT_EQ(s.reuses, 4u);
  EXPECT_EQ(s.histogram[0], 1u);  // 1
  EXPECT_EQ(s.histogram[2], 1u);  // 3-4
  EXPECT_EQ(s.histogram[3], 2u);  // 5-8
  EXPECT_EQ(s.p50, 3.0);          // sorted 1, 3, 8, 8: rank floor(0.5 * 3) = 1
  EXPECT_EQ(s.p99, 8.0);
  EXPECT_DOUBLE_EQ(s.mean_gap, (3.0 + 8 + 8) / 3);
}

TEST(ReuseTracker, PersistentMeansSelectedInMoreThanHalfOfTheWindow) {
  ReuseTracker t(4);
  const std::vector<std::uint32_t> p{3};
  // Steps 0, 1, 2 then 3: at step 3 the window (steps -1..2 -> 0, 1, 2) holds 3 of 4 > 2.
  for (std::uint32_t step = 0; step < 4; ++step) t.Add(0, step, p);
  ReuseStats s = t.Finish();
  // Step 1: window holds step 0 only (1 of 4): not persistent. Step 2: 2 of 4: not (> half).
  // Step 3: 3 of 4: persistent.
  EXPECT_EQ(s.selections, 4u);
  EXPECT_DOUBLE_EQ(s.persistent_share, 1.0 / 4);
  // A gap longer than the window forgets the history.
  t.Add(0, 20, p);
  s = t.Finish();
  EXPECT_DOUBLE_EQ(s.persistent_share, 1.0 / 5);
}

}  // namespace
}  // namespace ula

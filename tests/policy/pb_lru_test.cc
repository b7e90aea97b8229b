// PB-LRU specifics: bucket ring, fold into cold, victim order, and agreement with exact
// LRU (round stamps) when the ring covers every age.
#include "policy/pb_lru.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <vector>

#include "policy/exact_lru_scan.h"
#include "test_seed.h"

namespace ula::policy {
namespace {

std::vector<std::uint32_t> Claim(ResidencyPolicy& p, std::size_t n) {
  std::vector<SlotId> out(n);
  out.resize(p.ClaimVictims(out));
  std::vector<std::uint32_t> r;
  for (auto s : out) r.push_back(s.value());
  return r;
}

void ExpectOk(const ResidencyPolicy& p) {
  auto st = p.CheckInvariants();
  ASSERT_TRUE(st) << st.error().ToString();
}

// Host shadows: with prefer_shadowed, a bucket's shadowed slots go first (their
// eviction moves no bytes), then its others in slot order; older buckets still go before
// newer ones; without the option the hint changes nothing.
TEST(PbLru, PrefersShadowedVictimsAmongEquallyOldOnlyWhenAsked) {
  for (bool prefer : {false, true}) {
    PbLru p(128, PolicyOptions{.recent_buckets = 2, .prefer_shadowed = prefer});
    for (std::uint32_t s = 0; s < 8; ++s) p.Insert(SlotId(s));  // these go cold
    for (int r = 0; r < 4; ++r) p.AdvanceRound();
    for (std::uint32_t s = 64; s < 68; ++s) p.Insert(SlotId(s));  // age 1 after the next round
    p.AdvanceRound();
    for (std::uint32_t s : {5u, 6u, 65u}) p.SetShadowed(SlotId(s), true);
    p.SetShadowed(SlotId(6), false);  // its shadow went
    ExpectOk(p);
    const std::vector<std::uint32_t> want = prefer ? std::vector<std::uint32_t>{5, 0, 1, 2, 3, 4, 6, 7, 65, 64}
                                                   : std::vector<std::uint32_t>{0, 1, 2, 3, 4, 5, 6, 7, 64, 65};
    EXPECT_EQ(Claim(p, 10), want) << "prefer_shadowed " << prefer;
    ExpectOk(p);
  }
}

TEST(PbLru, SlotAgesThroughTheRingIntoCold) {
  PbLru p(64, PolicyOptions{.recent_buckets = 2});
  p.Insert(SlotId(9));
  EXPECT_EQ(p.AgeOf(SlotId(9)), 0);
  p.AdvanceRound();
  EXPECT_EQ(p.AgeOf(SlotId(9)), 1);
  p.AdvanceRound();
  EXPECT_EQ(p.AgeOf(SlotId(9)), 2);
  p.AdvanceRound();  // the bucket holding 9 is reused: folded into cold
  EXPECT_EQ(p.AgeOf(SlotId(9)), 3);
  p.AdvanceRound();
  EXPECT_EQ(p.AgeOf(SlotId(9)), 3);
  ExpectOk(p);
  const SlotId nine(9);
  p.Touch(std::span(&nine, 1));
  EXPECT_EQ(p.AgeOf(SlotId(9)), 0);
  EXPECT_EQ(p.AgeOf(SlotId(10)), -1);
  ExpectOk(p);
}

TEST(PbLru, VictimsComeFromColdThenOldestRecentBucket) {
  PbLru p(256, PolicyOptions{.recent_buckets = 3});
  // Round r inserts slots [r*10, r*10+10), with higher indices in older rounds for rounds
  // 0..2 so that an index-ordered scan would get the order wrong.
  for (std::uint32_t round = 0; round < 6; ++round) {
    for (std::uint32_t i = 0; i < 10; ++i) p.Insert(SlotId((5 - round) * 10 + i));
    p.AdvanceRound();
  }
  // Now ages: round 5 -> age 1 (slots 0..9), 4 -> 2 (10..19), 3 -> 3 (20..29), older -> cold (30..59).
  const auto victims = Claim(p, 60);
  ASSERT_EQ(victims.size(), 60u);
  for (std::size_t i = 0; i < 30; ++i) EXPECT_GE(victims[i], 30u) << i;          // cold first
  for (std::size_t i = 30; i < 40; ++i) EXPECT_EQ(victims[i] / 10, 2u) << i;    // age 3
  for (std::size_t i = 40; i < 50; ++i) EXPECT_EQ(victims[i] / 10, 1u) << i;    // age 2
  for (std::size_t i = 50; i < 60; ++i) EXPECT_EQ(victims[i] / 10, 0u) << i;    // age 1
  ExpectOk(p);
}

TEST(PbLru, WithoutRecentBucketsEverythingOlderThanThisRoundIsCold) {
  PbLru p(8, PolicyOptions{.recent_buckets = 0});
  p.Insert(SlotId(1));
  p.Insert(SlotId(2));
  EXPECT_TRUE(Claim(p, 2).empty());
  p.AdvanceRound();
  EXPECT_EQ(p.AgeOf(SlotId(1)), 1);  // cold
  const SlotId two(2);
  p.Touch(std::span(&two, 1));
  EXPECT_EQ(Claim(p, 2), std::vector<std::uint32_t>{1});
  ExpectOk(p);
}

TEST(PbLru, ClaimTakesPartOfAWordAndLeavesTheRest) {
  PbLru p(128, PolicyOptions{.recent_buckets = 1});
  for (std::uint32_t s = 0; s < 128; ++s) p.Insert(SlotId(s));
  p.AdvanceRound();
  EXPECT_EQ(Claim(p, 3), (std::vector<std::uint32_t>{0, 1, 2}));
  EXPECT_EQ(Claim(p, 62).back(), 64u);
  EXPECT_EQ(p.NumEvictable(), 128u - 65u);
  ExpectOk(p);
}

// With R larger than the number of rounds, PB-LRU's order is exact LRU at round granularity
// with ties by slot index — the same order as ExactLruScan. Same random ops, same victims.
TEST(PbLru, MatchesExactLruScanWhileTheRingCoversEveryAge) {
  ULA_TEST_SEEDED(seed, 7);
  std::mt19937 rng(seed);
  const std::uint32_t capacity = 500;
  PbLru pb(capacity, PolicyOptions{.recent_buckets = 200});
  ExactLruScan scan(capacity, PolicyOptions{});
  std::vector<char> tracked(capacity, 0);
  for (int round = 0; round < 150; ++round) {
    std::vector<SlotId> touch;
    for (int i = 0; i < 40; ++i) {
      const std::uint32_t s = rng() % capacity;
      if (tracked[s]) {
        touch.push_back(SlotId(s));
      } else if (rng() % 2) {
        pb.Insert(SlotId(s));
        scan.Insert(SlotId(s));
        tracked[s] = 1;
      }
    }
    pb.Touch(touch);
    scan.Touch(touch);
    const std::size_t n = rng() % 30;
    const auto a = Claim(pb, n), b = Claim(scan, n);
    ASSERT_EQ(a, b) << "round " << round;
    pb.AdvanceRound();
    scan.AdvanceRound();
  }
  ExpectOk(pb);
}

// The O(1) age (round stamps) names the bucket a scan of every bucket finds, through random
// inserts, touches (with duplicates), claims, removes and ring advances.
TEST(PbLru, StampAgeAgreesWithTheBucketScan) {
  ULA_TEST_SEEDED(seed, 5);
  std::mt19937 rng(seed);
  const std::uint32_t capacity = 300;
  PbLru p(capacity, PolicyOptions{.recent_buckets = 3});
  std::vector<char> tracked(capacity, 0);
  for (int round = 0; round < 60; ++round) {
    std::vector<SlotId> touch;
    for (int i = 0; i < 50; ++i) {
      const std::uint32_t s = rng() % capacity;
      if (tracked[s]) {
        touch.push_back(SlotId(s));
        if (rng() % 4 == 0) touch.push_back(SlotId(s));  // a duplicate in the batch
      } else if (rng() % 3 == 0) {
        p.Insert(SlotId(s));
        tracked[s] = 1;
      }
    }
    p.Touch(touch);
    if (round % 5 == 4) {
      for (std::uint32_t s = 0; s < capacity; s += 37) {
        if (tracked[s] && !p.UsedInCurrentRound(SlotId(s))) {
          p.Remove(SlotId(s));
          tracked[s] = 0;
        }
      }
    }
    Claim(p, rng() % 10);
    for (std::uint32_t s = 0; s < capacity; ++s) {
      ASSERT_EQ(p.AgeOf(SlotId(s)), p.AgeOfByScan(SlotId(s))) << "slot " << s << " round " << round;
      ASSERT_EQ(p.IsTracked(SlotId(s)), tracked[s] != 0) << "slot " << s << " round " << round;
    }
    ExpectOk(p);
    p.AdvanceRound();
  }
}

TEST(PbLru, OneTouchTakesSlotsFromEveryBucketAndDedups) {
  PbLru p(256, PolicyOptions{.recent_buckets = 2});
  for (std::uint32_t s = 0; s < 4; ++s) {
    p.Insert(SlotId(s * 64 + 1));  // one slot per word, inserted in different rounds
    p.AdvanceRound();
  }
  // Ages now: slot 193 -> 1, 129 -> 2, 65 and 1 -> cold (3).
  EXPECT_EQ(p.AgeOf(SlotId(193)), 1);
  EXPECT_EQ(p.AgeOf(SlotId(129)), 2);
  EXPECT_EQ(p.AgeOf(SlotId(1)), 3);
  const std::vector<SlotId> batch{SlotId(1), SlotId(193), SlotId(129), SlotId(1), SlotId(65), SlotId(193)};
  p.Touch(batch);
  for (std::uint32_t s : {1u, 65u, 129u, 193u}) EXPECT_EQ(p.AgeOf(SlotId(s)), 0) << s;
  EXPECT_EQ(p.NumEvictable(), 0u);
  ExpectOk(p);
}

// After 2^32 rounds the stamps are rebased; ages and victim order do not change.
TEST(PbLru, RoundCounterRebaseKeepsAgesAndVictimOrder) {
  ULA_TEST_SEEDED(seed, 3);
  std::mt19937 rng(seed);
  const std::uint32_t capacity = 200;
  PbLru a(capacity, PolicyOptions{.recent_buckets = 4});
  PbLru b(capacity, PolicyOptions{.recent_buckets = 4});
  for (std::uint32_t s = 0; s < capacity; s += 2) {
    a.Insert(SlotId(s));
    b.Insert(SlotId(s));
    if (s % 20 == 0) {
      a.AdvanceRound();
      b.AdvanceRound();
    }
  }
  b.RebaseRoundsForTesting(~std::uint32_t{0} - 5);  // b's counter wraps within the loop below
  for (int round = 0; round < 12; ++round) {
    std::vector<SlotId> touch;
    for (int i = 0; i < 15; ++i) touch.push_back(SlotId(2 * (rng() % (capacity / 2))));
    a.Touch(touch);
    b.Touch(touch);
    ASSERT_EQ(Claim(a, 7), Claim(b, 7)) << "round " << round;
    for (std::uint32_t s = 0; s < capacity; ++s) ASSERT_EQ(a.AgeOf(SlotId(s)), b.AgeOf(SlotId(s))) << s;
    ExpectOk(b);
    a.AdvanceRound();
    b.AdvanceRound();
  }
}

}  // namespace
}  // namespace ula::policy

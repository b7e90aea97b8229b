#include "core/hier_bitmap.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <set>

#include "test_seed.h"

namespace ula {
namespace {

TEST(HierBitmap, EmptyAndFullBitmapsOfManySizes) {
  for (std::uint64_t n : {0ull, 1ull, 63ull, 64ull, 65ull, 4096ull, 4097ull, 262145ull}) {
    HierBitmap empty(n);
    EXPECT_EQ(empty.Count(), 0u);
    EXPECT_FALSE(empty.FindFirst().has_value());
    ASSERT_TRUE(empty.CheckInvariants()) << n;
    HierBitmap full(n, true);
    EXPECT_EQ(full.Count(), n);
    ASSERT_TRUE(full.CheckInvariants()) << n;
    if (n > 0) {
      EXPECT_EQ(full.FindFirst(), 0u);
      EXPECT_EQ(full.FindNext(n - 1), n - 1);
    }
    EXPECT_FALSE(full.FindNext(n).has_value());
  }
}

TEST(HierBitmap, FindNextSkipsLongEmptyStretches) {
  const std::uint64_t n = std::uint64_t{1} << 24;
  HierBitmap b(n);
  EXPECT_EQ(b.num_levels(), 4);
  b.Set(5);
  b.Set(n - 1);
  EXPECT_EQ(b.FindNext(0), 5u);
  EXPECT_EQ(b.FindNext(6), n - 1);
  b.Clear(n - 1);
  EXPECT_FALSE(b.FindNext(6).has_value());
  ASSERT_TRUE(b.CheckInvariants());
}

TEST(HierBitmap, RandomOperationsMatchAShadowSet) {
  ULA_TEST_SEEDED(seed, 12345);
  std::mt19937_64 rng(seed);
  for (std::uint64_t n : {1ull, 100ull, 5000ull, 300000ull}) {
    HierBitmap b(n), other(n);
    std::set<std::uint64_t> shadow, other_shadow;
    std::uniform_int_distribution<std::uint64_t> pos(0, n - 1);
    for (int op = 0; op < 4000; ++op) {
      const std::uint64_t i = pos(rng);
      switch (rng() % 6) {
        case 0: case 1:
          EXPECT_EQ(b.Set(i), shadow.insert(i).second);
          break;
        case 2:
          EXPECT_EQ(b.Clear(i), shadow.erase(i) == 1);
          break;
        case 3: {
          auto got = b.FindNext(i);
          auto want = shadow.lower_bound(i);
          if (want == shadow.end()) {
            EXPECT_FALSE(got.has_value());
          } else {
            EXPECT_EQ(got, *want);
          }
          break;
        }
        case 4:
          other.Set(i);
          other_shadow.insert(i);
          if (rng() % 8 == 0) {
            b.OrWith(other);
            shadow.insert(other_shadow.begin(), other_shadow.end());
          }
          break;
        case 5:
          if (rng() % 8 == 0) {
            b.AndNotWith(other);
            for (auto x : other_shadow) shadow.erase(x);
          }
          break;
      }
      ASSERT_EQ(b.Count(), shadow.size());
    }
    ASSERT_TRUE(b.CheckInvariants());
    std::set<std::uint64_t> seen;
    b.ForEachSet([&](std::uint64_t i) { seen.insert(i); });
    EXPECT_EQ(seen, shadow);
  }
}

}  // namespace
}  // namespace ula

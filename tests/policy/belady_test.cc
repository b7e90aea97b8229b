// Belady's MIN (policy/belady.h): equal to an exhaustive search for the best eviction
// schedule on small traces, and never below any policy on the same trace.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <set>
#include <vector>

#include "policy/belady.h"
#include "policy/policy_replay.h"
#include "test_seed.h"

namespace ula::policy {
namespace {

// A random trace: batch 1, `context` addresses, each step selects `k` of them (with repeats).
SelectionTrace RandomTrace(std::mt19937_64& rng, std::uint32_t context, std::uint32_t steps, std::uint32_t k) {
  SelectionTrace t;
  t.batch = 1;
  t.context_tokens = context;
  t.steps = steps;
  t.num_addresses = context + steps;
  for (std::uint32_t s = 0; s < steps; ++s) {
    t.step_begin.push_back(t.selections.size());
    for (std::uint32_t i = 0; i < k; ++i) t.selections.push_back(LogicalAddr(static_cast<std::uint32_t>(rng() % context)));
  }
  t.step_begin.push_back(t.selections.size());
  return t;
}

// The most distinct hits any eviction schedule achieves (exhaustive over victim sets).
std::uint64_t BestHits(const SelectionTrace& t, std::uint32_t pool, std::uint32_t warmup) {
  std::uint64_t best = 0;
  std::function<void(std::uint32_t, std::set<std::uint32_t>, std::uint64_t)> go =
      [&](std::uint32_t step, std::set<std::uint32_t> resident, std::uint64_t hits) {
        if (step == t.steps) {
          best = std::max(best, hits);
          return;
        }
        std::set<std::uint32_t> want;
        for (LogicalAddr a : t.Step(step)) {
          want.insert(a.value());
        }
        if (step >= warmup) {
          for (std::uint32_t a : want) hits += resident.count(a);  // distinct hits
        }
        std::vector<std::uint32_t> candidates;
        std::size_t missing = 0;
        for (std::uint32_t a : want) missing += !resident.count(a);
        for (std::uint32_t a : resident) {
          if (!want.count(a)) candidates.push_back(a);
        }
        const std::size_t free = pool - resident.size();
        const std::size_t evict = missing > free ? missing - free : 0;
        // Every subset of `evict` candidates.
        std::vector<bool> pick(candidates.size(), false);
        std::fill(pick.begin(), pick.begin() + static_cast<std::ptrdiff_t>(evict), true);
        std::sort(pick.begin(), pick.end());
        do {
          std::set<std::uint32_t> next = resident;
          for (std::size_t i = 0; i < candidates.size(); ++i) {
            if (pick[i]) next.erase(candidates[i]);
          }
          next.insert(want.begin(), want.end());
          go(step + 1, next, hits);
        } while (std::next_permutation(pick.begin(), pick.end()));
      };
  go(0, {}, 0);
  return best;
}

TEST(Belady, MatchesExhaustiveSearchOnSmallTraces) {
  ULA_TEST_SEEDED(seed, 11);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 40; ++trial) {
    const SelectionTrace t = RandomTrace(rng, 8, 7, 2);
    const double fraction = 4.0 / 8.0;  // 4 slots
    auto b = ReplayBelady(t, fraction, 1);
    ASSERT_TRUE(b) << b.error().ToString();
    ASSERT_EQ(b->pool_slots, 4u);
    EXPECT_EQ(b->distinct_hits, BestHits(t, 4, 1)) << "seed " << seed << " trial " << trial;
  }
}

TEST(Belady, NoPolicyBeatsIt) {
  ULA_TEST_SEEDED(seed, 11);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 10; ++trial) {
    const SelectionTrace t = RandomTrace(rng, 400, 60, 40);
    std::vector<ReplayConfig> configs;
    for (PolicyKind k : {PolicyKind::kPbLru, PolicyKind::kExactLruScan, PolicyKind::kExactLruList, PolicyKind::kClock}) {
      configs.push_back({.policy = k, .options = {}, .pool_fraction = 0.2, .warmup_steps = 5});
    }
    auto results = ReplayTrace(t, configs);
    ASSERT_TRUE(results);
    auto b = ReplayBelady(t, 0.2, 5);
    ASSERT_TRUE(b);
    for (const ReplayResult& r : *results) {
      EXPECT_EQ(r.selections, b->selections);
      EXPECT_EQ(r.distinct, b->distinct);
      EXPECT_LE(r.distinct_hits, b->distinct_hits) << "seed " << seed << " trial " << trial;
    }
    EXPECT_LT((*results)[1].distinct_hits, b->distinct_hits) << "a random trace at pool 0.2 leaves LRU below the optimum";
  }
}

TEST(Belady, RefusesBadInputAndTooSmallPools) {
  std::mt19937_64 rng(1);
  const SelectionTrace t = RandomTrace(rng, 8, 4, 6);
  EXPECT_EQ(ReplayBelady(t, 0.0, 1).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ReplayBelady(t, 0.5, 4).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ReplayBelady(t, 2.0 / 8, 1).error().code(), ErrorCode::kResourceExhausted);  // 6 selections, 2 slots
}

}  // namespace
}  // namespace ula::policy

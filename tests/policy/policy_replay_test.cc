// The replay harness behind `ula bench policy` (every policy hit rate in the docs) against
// an independent LRU model: a trace of one request whose steps each select one address
// (repeated 1-3 times), so that last uses never tie and exact LRU has one answer. Exact LRU
// (list and scan) and PB-LRU (its buckets are exact at these ages) must report the model's
// hits, selections and evictions over the measured steps, warmup excluded.
#include "policy/policy_replay.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <random>
#include "test_seed.h"

namespace ula::policy {
namespace {

TEST(PolicyReplay, HitRatesMatchAnIndependentLruModel) {
  ULA_TEST_SEEDED(seed, 12);
  std::mt19937_64 rng(seed);
  SelectionTrace trace;
  trace.batch = 1;
  trace.context_tokens = 20;
  trace.steps = 300;
  trace.num_addresses = trace.batch * (trace.context_tokens + trace.steps);
  trace.step_begin.push_back(0);
  for (std::uint32_t t = 0; t < trace.steps; ++t) {
    const LogicalAddr a(static_cast<std::uint32_t>(rng() % 20));
    for (std::uint64_t k = 0, n = 1 + rng() % 3; k < n; ++k) trace.selections.push_back(a);
    trace.step_begin.push_back(trace.selections.size());
  }
  ASSERT_TRUE(trace.Validate());

  // The model: 5 slots (pool_fraction 0.25 of 20), free first, then the least recently used.
  const std::uint32_t slots = 5, warmup = 10;
  std::map<std::uint32_t, std::uint32_t> resident;  // address -> step of last use
  std::uint64_t hits = 0, selections = 0, evictions = 0;
  for (std::uint32_t t = 0; t < trace.steps; ++t) {
    const auto sel = trace.Step(t);
    const std::uint32_t a = sel[0].value();
    const bool hit = resident.contains(a);
    std::uint64_t evicted = 0;
    if (!hit && resident.size() == slots) {
      auto lru = resident.begin();
      for (auto it = resident.begin(); it != resident.end(); ++it) {
        if (it->second < lru->second) lru = it;
      }
      resident.erase(lru);
      evicted = 1;
    }
    resident[a] = t;
    if (t >= warmup) {
      selections += sel.size();
      hits += hit ? sel.size() : 0;
      evictions += evicted;
    }
  }

  std::vector<ReplayConfig> configs;
  for (PolicyKind k : {PolicyKind::kExactLruList, PolicyKind::kExactLruScan, PolicyKind::kPbLru}) {
    configs.push_back(ReplayConfig{.policy = k, .options = {}, .pool_fraction = 0.25, .warmup_steps = warmup});
  }
  auto results = ReplayTrace(trace, configs);
  ASSERT_TRUE(results) << results.error().ToString();
  ASSERT_EQ(results->size(), 3u);
  for (std::size_t i = 0; i < results->size(); ++i) {
    const ReplayResult& r = (*results)[i];
    SCOPED_TRACE(PolicyKindName(configs[i].policy));
    EXPECT_EQ(r.pool_slots, slots);
    EXPECT_EQ(r.selections, selections);
    EXPECT_EQ(r.hits, hits);
    EXPECT_EQ(r.evictions, evictions);
    EXPECT_DOUBLE_EQ(r.hit_rate(), double(hits) / double(selections));
  }
  std::printf("model: %llu of %llu selections hit (%.3f), %llu evictions\n", (unsigned long long)hits,
              (unsigned long long)selections, double(hits) / double(selections), (unsigned long long)evictions);
  EXPECT_GT(hits, 0u);
  EXPECT_LT(hits, selections);
}

}  // namespace
}  // namespace ula::policy

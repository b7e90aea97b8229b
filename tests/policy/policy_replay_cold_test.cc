// policy_replay's cold_evictions (src/policy/policy_replay.h): victims last used more than
// R steps before the step that evicts them. A cyclic scan of 8 addresses through 4 slots,
// one selection per step, evicts at every step the address used 4 steps before: all cold
// with R = 3, none with R = 4, for PB-LRU (its cold bucket) and exact LRU alike.
#include <gtest/gtest.h>

#include "policy/policy_replay.h"

namespace ula::policy {
namespace {

TEST(PolicyReplay, CountsVictimsOlderThanRAsCold) {
  SelectionTrace t;
  t.batch = 1;
  t.context_tokens = 8;
  t.steps = 40;
  t.num_addresses = t.context_tokens + t.steps;
  for (std::uint32_t s = 0; s < t.steps; ++s) {
    t.step_begin.push_back(t.selections.size());
    t.selections.push_back(LogicalAddr(s % 8));
  }
  t.step_begin.push_back(t.selections.size());
  for (PolicyKind kind : {PolicyKind::kPbLru, PolicyKind::kExactLruScan}) {
    for (std::uint32_t r : {3u, 4u}) {
      const ReplayConfig c{.policy = kind, .options = {.recent_buckets = r}, .pool_fraction = 0.5, .warmup_steps = 8};
      auto res = ReplayTrace(t, std::span(&c, 1));
      ASSERT_TRUE(res) << res.error().ToString();
      const ReplayResult& x = (*res)[0];
      EXPECT_EQ(x.pool_slots, 4u);
      EXPECT_EQ(x.hits, 0u);
      EXPECT_EQ(x.evictions, 32u);  // every measured step evicts one
      EXPECT_EQ(x.cold_evictions, r == 3 ? 32u : 0u) << PolicyKindName(kind) << " R = " << r;
    }
  }
}

}  // namespace
}  // namespace ula::policy

// The OpenMP paths of Touch (PB-LRU, exact_lru_scan) leave exactly the state the serial
// path leaves. THREADED: runs under ThreadSanitizer too.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdio>
#include <random>
#include <vector>

#include "ula/residency_policy.h"
#include "test_seed.h"

namespace ula {
namespace {

class ParallelTouch : public ::testing::TestWithParam<PolicyKind> {};

TEST_P(ParallelTouch, LargeBatchMatchesTheSerialPath) {
  omp_set_num_threads(4);  // a real team even on a 2-core machine
  const std::uint32_t capacity = 20000;
  ULA_TEST_SEEDED(seed, 11);
  std::mt19937 rng(seed);
  auto parallel = MakePolicy(GetParam(), capacity, PolicyOptions{.recent_buckets = 3, .parallel_min_slots = 1}).value();
  auto serial =
      MakePolicy(GetParam(), capacity, PolicyOptions{.recent_buckets = 3, .parallel_min_slots = ~0u}).value();
  for (std::uint32_t s = 0; s < capacity; ++s) {
    parallel->Insert(SlotId(s));
    serial->Insert(SlotId(s));
  }
  for (int round = 0; round < 12; ++round) {
    parallel->AdvanceRound();
    serial->AdvanceRound();
    std::vector<SlotId> batch(30000);  // many duplicates across threads
    for (auto& s : batch) s = SlotId(rng() % (capacity / (1 + round % 3)));
    parallel->Touch(batch);
    serial->Touch(batch);
    ASSERT_EQ(parallel->NumEvictable(), serial->NumEvictable()) << "round " << round;
    std::vector<SlotId> a(700), b(700);
    a.resize(parallel->ClaimVictims(a));
    b.resize(serial->ClaimVictims(b));
    ASSERT_EQ(a, b) << "round " << round;
    auto st = parallel->CheckInvariants();
    ASSERT_TRUE(st) << st.error().ToString();
  }
  for (std::uint32_t s = 0; s < capacity; ++s) {
    ASSERT_EQ(parallel->UsedInCurrentRound(SlotId(s)), serial->UsedInCurrentRound(SlotId(s))) << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, ParallelTouch, ::testing::Values(PolicyKind::kPbLru, PolicyKind::kExactLruScan),
                         [](const auto& info) { return std::string(PolicyKindName(info.param)); });

}  // namespace
}  // namespace ula

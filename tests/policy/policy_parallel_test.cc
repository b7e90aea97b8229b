// The OpenMP paths of Touch (PB-LRU, exact_lru_scan) and PB-LRU's parallel victim claim
// leave exactly the state the serial path leaves. THREADED: runs under
// ThreadSanitizer too.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdio>
#include <random>
#include <vector>

#include "policy/fork_join.h"
#include "policy/pb_lru.h"
#include "ula/residency_policy.h"
#include "test_seed.h"

namespace ula {
namespace {

class ParallelTouch : public ::testing::TestWithParam<PolicyKind> {};

TEST_P(ParallelTouch, LargeBatchMatchesTheSerialPath) {
  omp_set_num_threads(4);  // a real team even on a 2-core machine
  const std::uint32_t capacity = 20000;
  ULA_TEST_SEEDED(seed, 11);
  // PB-LRU at its edge settings too: R = 0 (no recent bucket: every touch of an older slot
  // is a straggler) and R = 1 (the newest bucket is the only one), besides R = 3.
  // The kernel PB-LRU (its kernels on a team of 4 against a team of one) the same way.
  const bool pb = GetParam() == PolicyKind::kPbLru || GetParam() == PolicyKind::kKernelPbLru;
  const std::vector<std::uint32_t> rs = pb ? std::vector<std::uint32_t>{0, 1, 3} : std::vector<std::uint32_t>{3};
  for (const std::uint32_t r : rs) {
    SCOPED_TRACE("R " + std::to_string(r));
    std::mt19937 rng(static_cast<std::uint32_t>(seed + r));
    auto parallel = MakePolicy(GetParam(), capacity, PolicyOptions{.recent_buckets = r, .parallel_min_slots = 1}).value();
    auto serial =
        MakePolicy(GetParam(), capacity, PolicyOptions{.recent_buckets = r, .parallel_min_slots = ~0u}).value();
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
}

// Twin PB-LRUs receive the same randomized inserts, touches, removes and rounds; one claims
// with ClaimVictims, the other with ClaimVictimsParallel on a team of T = 1..4 lanes. Demands
// are drawn around the bucket boundaries (within the oldest bucket, exactly a bucket, one
// past it, spanning several, everything evictable) and at random; after every claim both
// return the same slots in the same order and have the same DebugDigest. A demand past
// NumEvictable() is refused with kResourceExhausted and changes nothing. Capacities that are
// not multiples of 64, and smaller than T words, leave lanes with partial or empty ranges.
TEST(ParallelClaim, SameVictimsInTheSameOrderAsOneThread) {
  ULA_TEST_SEEDED(seed, 20261216);
  int claims = 0, refused = 0, spanning = 0;
  for (int threads = 1; threads <= 4; ++threads) {
    policy::ForkJoin team(threads);
    for (const std::uint32_t capacity : {70u, 1000u, 9001u}) {
      for (const std::uint32_t r : {0u, 1u, 3u, 9u}) {
        SCOPED_TRACE("T " + std::to_string(threads) + " capacity " + std::to_string(capacity) + " R " + std::to_string(r));
        std::mt19937_64 rng(seed + threads * 1000 + capacity + r);
        const PolicyOptions opt{.recent_buckets = r};
        policy::PbLru serial(capacity, opt), parallel(capacity, opt);
        std::vector<bool> tracked(capacity, false);
        for (int round = 0; round < 10; ++round) {
          // Some free slots become entries, some entries go; then a random touch.
          for (std::uint32_t s = 0; s < capacity; ++s) {
            const auto x = rng() % 16;
            if (!tracked[s] && x < 3) {
              serial.Insert(SlotId(s));
              parallel.Insert(SlotId(s));
              tracked[s] = true;
            } else if (tracked[s] && x == 15 && !serial.UsedInCurrentRound(SlotId(s))) {
              serial.Remove(SlotId(s));
              parallel.Remove(SlotId(s));
              tracked[s] = false;
            }
          }
          std::vector<SlotId> touch;
          const std::uint32_t span = 1 + static_cast<std::uint32_t>(rng() % capacity);
          const std::uint32_t lo = static_cast<std::uint32_t>(rng() % capacity);
          for (std::uint32_t i = 0; i < capacity / 3; ++i) {
            const std::uint32_t s = (lo + static_cast<std::uint32_t>(rng() % span)) % capacity;
            if (tracked[s]) touch.push_back(SlotId(s));
          }
          serial.Touch(touch);
          parallel.Touch(touch);
          // Bucket sizes in victim order (cold first), from the O(1) ages.
          std::vector<std::size_t> by_age(r + 2, 0);
          for (std::uint32_t s = 0; s < capacity; ++s) {
            if (const int a = serial.AgeOf(SlotId(s)); a > 0) ++by_age[static_cast<std::size_t>(a)];
          }
          std::vector<std::size_t> edges;  // cumulative bucket counts, oldest first
          for (std::size_t a = r + 1, sum = 0; a >= 1; --a) {
            if (by_age[a] == 0) continue;
            sum += by_age[a];
            edges.push_back(sum);
          }
          const std::size_t evictable = serial.NumEvictable();
          ASSERT_EQ(evictable, edges.empty() ? 0 : edges.back());
          std::vector<std::size_t> demands = {0, 1, static_cast<std::size_t>(rng() % (evictable + 1))};
          if (!edges.empty()) {
            const std::size_t e = edges[rng() % edges.size()];
            demands.insert(demands.end(), {e, e - 1, std::min(e + 1, evictable)});
          }
          if (rng() % 4 == 0) demands.push_back(evictable);
          for (const std::size_t n : demands) {
            if (n > parallel.NumEvictable()) continue;  // earlier claims of this round shrank it
            spanning += std::count_if(edges.begin(), edges.end(), [&](std::size_t e) { return e < n; }) > 0;
            std::vector<SlotId> a(n, SlotId(~0u)), b(n, SlotId(~0u));
            ASSERT_EQ(serial.ClaimVictims(a), n);
            auto st = parallel.ClaimVictimsParallel(b, team);
            ASSERT_TRUE(st) << st.error().ToString();
            ASSERT_EQ(a, b) << "round " << round << " demand " << n;
            ASSERT_EQ(serial.DebugDigest(), parallel.DebugDigest()) << "round " << round << " demand " << n;
            ++claims;
          }
          // Exactly one past what is evictable, then more: refused, nothing changed (the
          // bound is exact: what is evictable is claimed just below, by the serial twin too).
          const std::uint64_t before = parallel.DebugDigest();
          const std::size_t left = parallel.NumEvictable();
          for (const std::size_t n : {left + 1, left + 2 + static_cast<std::size_t>(rng() % 3)}) {
            std::vector<SlotId> too_many(n);
            auto st = parallel.ClaimVictimsParallel(too_many, team);
            ASSERT_FALSE(st) << "round " << round << ": " << n << " victims of " << left << " evictable";
            EXPECT_EQ(st.error().code(), ErrorCode::kResourceExhausted);
            EXPECT_EQ(before, parallel.DebugDigest());
            ++refused;
          }
          if (round == 9 && left > 0) {  // the last round: every evictable slot is still claimable, alike
            std::vector<SlotId> a(left, SlotId(~0u)), b(left, SlotId(~0u));
            ASSERT_EQ(serial.ClaimVictims(a), left);
            auto st = parallel.ClaimVictimsParallel(b, team);
            ASSERT_TRUE(st) << st.error().ToString();
            ASSERT_EQ(a, b) << "round " << round << ": all " << left << " evictable";
            ASSERT_EQ(serial.DebugDigest(), parallel.DebugDigest());
          }
          auto inv = parallel.CheckInvariants();
          ASSERT_TRUE(inv) << inv.error().ToString();
          serial.AdvanceRound();
          parallel.AdvanceRound();
        }
      }
    }
  }
  std::printf("%d parallel claims identical to the serial ones (%d spanning buckets), %d refused\n", claims, spanning,
              refused);
  EXPECT_GT(spanning, claims / 8);  // demands past the oldest bucket were exercised
}

INSTANTIATE_TEST_SUITE_P(Policies, ParallelTouch, ::testing::Values(PolicyKind::kPbLru, PolicyKind::kExactLruScan,
                                                                     PolicyKind::kKernelPbLru),
                         [](const auto& info) { return std::string(PolicyKindName(info.param)); });

}  // namespace
}  // namespace ula

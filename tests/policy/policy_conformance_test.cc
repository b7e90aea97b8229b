// One typed suite for every residency policy (the contract in ula/residency_policy.h).
// Every operation goes through CheckedPolicy, which runs CheckInvariants() after it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <set>
#include <vector>

#include "ula/residency_policy.h"
#include "backend/slot_pool.h"
#include "test_seed.h"

namespace ula {
namespace {

// Forwards to a policy and checks its invariants after every call.
class CheckedPolicy {
 public:
  CheckedPolicy(PolicyKind kind, std::uint32_t capacity, PolicyOptions options = {}) {
    auto made = MakePolicy(kind, capacity, options);
    EXPECT_TRUE(made) << (made ? "" : made.error().ToString());
    if (made) p_ = std::move(*made);
    Check("create");
  }
  ResidencyPolicy& operator*() { return *p_; }
  ResidencyPolicy* operator->() { return p_.get(); }

  void Insert(std::uint32_t s) { p_->Insert(SlotId(s)), Check("Insert"); }
  void Remove(std::uint32_t s) { p_->Remove(SlotId(s)), Check("Remove"); }
  void Touch(const std::vector<std::uint32_t>& slots) {
    std::vector<SlotId> ids;
    for (auto s : slots) ids.push_back(SlotId(s));
    p_->Touch(ids);
    Check("Touch");
  }
  std::vector<std::uint32_t> Claim(std::size_t n) {
    std::vector<SlotId> out(n);
    out.resize(p_->ClaimVictims(out));
    Check("ClaimVictims");
    std::vector<std::uint32_t> r;
    for (auto s : out) r.push_back(s.value());
    return r;
  }
  void Advance() { p_->AdvanceRound(), Check("AdvanceRound"); }

 private:
  void Check(const char* op) {
    auto st = p_->CheckInvariants();
    EXPECT_TRUE(st) << p_->name() << " after " << op << ": " << (st ? "" : st.error().ToString());
  }
  std::unique_ptr<ResidencyPolicy> p_;
};

template <PolicyKind K>
struct Kind {
  static constexpr PolicyKind kKind = K;
};

template <class T>
class PolicyConformance : public ::testing::Test {
 protected:
  static CheckedPolicy Make(std::uint32_t capacity, PolicyOptions options = {}) {
    return CheckedPolicy(T::kKind, capacity, options);
  }
};

using AllPolicies = ::testing::Types<Kind<PolicyKind::kPbLru>, Kind<PolicyKind::kExactLruScan>,
                                     Kind<PolicyKind::kExactLruList>, Kind<PolicyKind::kClock>,
                                     Kind<PolicyKind::kLfuAged>, Kind<PolicyKind::kKernelPbLru>>;
struct KindName {
  template <class T>
  static std::string GetName(int) {
    return std::string(PolicyKindName(T::kKind));
  }
};
TYPED_TEST_SUITE(PolicyConformance, AllPolicies, KindName);

TYPED_TEST(PolicyConformance, NameMatchesFactoryKind) {
  auto p = this->Make(8);
  EXPECT_EQ(p->name(), PolicyKindName(TypeParam::kKind));
  EXPECT_EQ(p->capacity(), 8u);
  EXPECT_GT(p->MemoryBytes(), 0u);
}

TYPED_TEST(PolicyConformance, EmptyPolicyHasNoVictims) {
  auto p = this->Make(16);
  EXPECT_EQ(p->NumEvictable(), 0u);
  EXPECT_TRUE(p.Claim(4).empty());
  p.Advance();
  EXPECT_TRUE(p.Claim(4).empty());
}

TYPED_TEST(PolicyConformance, InsertedSlotsAreUsedUntilTheRoundEnds) {
  auto p = this->Make(16);
  for (std::uint32_t s : {3u, 7u, 15u}) p.Insert(s);
  EXPECT_TRUE(p->IsTracked(SlotId(7)));
  EXPECT_FALSE(p->IsTracked(SlotId(8)));
  EXPECT_TRUE(p->UsedInCurrentRound(SlotId(7)));
  EXPECT_EQ(p->NumEvictable(), 0u);
  EXPECT_TRUE(p.Claim(3).empty());
  p.Advance();
  EXPECT_FALSE(p->UsedInCurrentRound(SlotId(7)));
  EXPECT_EQ(p->NumEvictable(), 3u);
}

TYPED_TEST(PolicyConformance, NeverEvictsASlotUsedInTheCurrentRound) {
  auto p = this->Make(200);
  for (std::uint32_t s = 0; s < 200; ++s) p.Insert(s);
  p.Advance();
  std::vector<std::uint32_t> touched;
  for (std::uint32_t s = 0; s < 200; s += 3) touched.push_back(s);
  p.Touch(touched);
  const auto victims = p.Claim(1000);
  EXPECT_EQ(victims.size(), 200 - touched.size());
  for (auto v : victims) EXPECT_NE(v % 3, 0u) << "evicted slot " << v << " touched this round";
  EXPECT_EQ(p->NumEvictable(), 0u);
  EXPECT_TRUE(p.Claim(1).empty());
}

TYPED_TEST(PolicyConformance, NeverReturnsASlotTwiceWithinARound) {
  auto p = this->Make(100);
  for (std::uint32_t s = 0; s < 100; ++s) p.Insert(s);
  p.Advance();
  std::set<std::uint32_t> seen;
  for (int call = 0; call < 40; ++call) {
    for (auto v : p.Claim(call % 7)) {
      EXPECT_TRUE(seen.insert(v).second) << "slot " << v << " returned twice";
      EXPECT_TRUE(p->UsedInCurrentRound(SlotId(v)));
    }
  }
  EXPECT_EQ(seen.size(), 100u);
}

TYPED_TEST(PolicyConformance, EvictsOlderRoundsBeforeNewerOnes) {
  // Every policy here is recency-based at round granularity at least for two rounds apart
  // when nothing was touched in between; CLOCK only after the hand cleared reference bits.
  if (TypeParam::kKind == PolicyKind::kClock) GTEST_SKIP() << "CLOCK approximates recency by reference bits";
  auto p = this->Make(64);
  for (std::uint32_t s = 0; s < 32; ++s) p.Insert(s);
  p.Advance();
  for (std::uint32_t s = 32; s < 64; ++s) p.Insert(s);
  p.Advance();
  const auto victims = p.Claim(32);
  ASSERT_EQ(victims.size(), 32u);
  for (auto v : victims) EXPECT_LT(v, 32u);
}

TYPED_TEST(PolicyConformance, RemovedSlotIsUntrackedAndNeverAVictim) {
  auto p = this->Make(10);
  for (std::uint32_t s = 0; s < 10; ++s) p.Insert(s);
  p.Advance();
  p.Remove(4);
  p.Remove(0);
  EXPECT_FALSE(p->IsTracked(SlotId(4)));
  EXPECT_EQ(p->NumEvictable(), 8u);
  const auto victims = p.Claim(10);
  EXPECT_EQ(victims.size(), 8u);
  for (auto v : victims) EXPECT_TRUE(v != 4 && v != 0);
  p.Insert(4);  // a freed slot can be reused
  EXPECT_TRUE(p->UsedInCurrentRound(SlotId(4)));
}

TYPED_TEST(PolicyConformance, TouchWithDuplicatesCountsEachSlotOnce) {
  auto p = this->Make(64);
  for (std::uint32_t s = 0; s < 64; ++s) p.Insert(s);
  p.Advance();
  p.Touch({5, 5, 63, 5, 63, 0});
  EXPECT_EQ(p->NumEvictable(), 61u);
  p.Touch({5});
  EXPECT_EQ(p->NumEvictable(), 61u);
}

// (The planner's rule "free slots first, then victims" is the planners' business, not the
// policies': tested on the planners, tests/step/step_planner_test.cc and
// tests/tp/tp_step_planner_test.cc, MissesFillEveryFreeSlotThenEvict.)

TYPED_TEST(PolicyConformance, PoolOfOneSlot) {
  auto p = this->Make(1);
  EXPECT_TRUE(p.Claim(1).empty());
  p.Insert(0);
  EXPECT_TRUE(p.Claim(1).empty());
  p.Advance();
  EXPECT_EQ(p.Claim(2), std::vector<std::uint32_t>{0});
  EXPECT_TRUE(p.Claim(1).empty());
  p.Advance();
  p.Touch({0, 0});
  EXPECT_TRUE(p.Claim(1).empty());
  p.Advance();
  p.Advance();
  p.Remove(0);
  EXPECT_FALSE(p->IsTracked(SlotId(0)));
  EXPECT_TRUE(p.Claim(1).empty());
}

TYPED_TEST(PolicyConformance, PoolLargerThan2To24Slots) {
  const std::uint32_t capacity = (1u << 24) + 70;
  const std::uint32_t last = capacity - 1, mid = 1u << 24;
  auto p = this->Make(capacity, PolicyOptions{.recent_buckets = 2});
  for (std::uint32_t s : {0u, mid, last}) p.Insert(s);
  p.Advance();
  p.Touch({mid});
  EXPECT_EQ(p->NumEvictable(), 2u);
  auto victims = p.Claim(5);
  std::sort(victims.begin(), victims.end());
  EXPECT_EQ(victims, (std::vector<std::uint32_t>{0, last}));
  p.Advance();
  p.Remove(last);
  EXPECT_TRUE(p->IsTracked(SlotId(mid)));
  EXPECT_FALSE(p->IsTracked(SlotId(last)));
}

// Random operations against a shadow model of the contract (tracked set, used-this-round
// set). Seeds are fixed and printed.
TYPED_TEST(PolicyConformance, RandomOperationsMatchAShadowModel) {
  ULA_TEST_SEEDED(base_seed, 1);
  for (std::uint64_t seed : {base_seed, base_seed + 1, base_seed + 2}) {
    std::mt19937 rng(seed);
    const std::uint32_t capacity = std::vector<std::uint32_t>{1, 7, 64, 65, 130, 1000}[rng() % 6];
    std::printf("[ seed ] %llu (%s, capacity %u)\n", static_cast<unsigned long long>(seed), std::string(PolicyKindName(TypeParam::kKind)).c_str(),
                capacity);
    auto p = this->Make(capacity, PolicyOptions{.recent_buckets = static_cast<std::uint32_t>(rng() % 4)});
    std::vector<char> tracked(capacity, 0), used(capacity, 0);
    auto pick = [&](char want_tracked) -> std::optional<std::uint32_t> {
      for (int tries = 0; tries < 8; ++tries) {
        const std::uint32_t s = rng() % capacity;
        if (tracked[s] == want_tracked) return s;
      }
      return std::nullopt;
    };
    for (int op = 0; op < 1500 && !::testing::Test::HasFailure(); ++op) {
      switch (rng() % 6) {
        case 0:
        case 1:
          if (auto s = pick(0)) {
            p.Insert(*s);
            tracked[*s] = used[*s] = 1;
          }
          break;
        case 2:
          if (auto s = pick(1)) {
            p.Remove(*s);
            tracked[*s] = used[*s] = 0;
          }
          break;
        case 3: {
          std::vector<std::uint32_t> batch;
          for (int i = rng() % 20; i > 0; --i) {
            if (auto s = pick(1)) batch.push_back(*s), batch.push_back(*s);  // with duplicates
          }
          p.Touch(batch);
          for (auto s : batch) used[s] = 1;
          break;
        }
        case 4: {
          const std::size_t n = rng() % 12;
          std::uint64_t evictable = 0;
          for (std::uint32_t s = 0; s < capacity; ++s) evictable += tracked[s] && !used[s];
          const auto victims = p.Claim(n);
          ASSERT_EQ(victims.size(), std::min<std::uint64_t>(n, evictable)) << "seed " << seed << " op " << op;
          for (auto v : victims) {
            ASSERT_TRUE(v < capacity && tracked[v] && !used[v]) << "bad victim " << v << " seed " << seed;
            used[v] = 1;  // also catches a slot returned twice
          }
          break;
        }
        case 5:
          p.Advance();
          std::fill(used.begin(), used.end(), 0);
          break;
      }
      std::uint64_t evictable = 0;
      for (std::uint32_t s = 0; s < capacity; ++s) {
        evictable += tracked[s] && !used[s];
        ASSERT_EQ(p->IsTracked(SlotId(s)), tracked[s] != 0) << "slot " << s << " seed " << seed << " op " << op;
        ASSERT_EQ(p->UsedInCurrentRound(SlotId(s)), used[s] != 0) << "slot " << s << " seed " << seed;
      }
      ASSERT_EQ(p->NumEvictable(), evictable) << "seed " << seed << " op " << op;
    }
  }
}

TEST(PolicyFactory, NamesRoundTripAndDefaultIsPbLru) {
  for (auto kind : {PolicyKind::kPbLru, PolicyKind::kExactLruScan, PolicyKind::kExactLruList, PolicyKind::kClock,
                    PolicyKind::kLfuAged, PolicyKind::kKernelPbLru}) {
    auto parsed = ParsePolicyKind(PolicyKindName(kind));
    ASSERT_TRUE(parsed);
    EXPECT_EQ(*parsed, kind);
  }
  EXPECT_FALSE(ParsePolicyKind("lfu"));
  EXPECT_EQ(DefaultPolicyKind(), PolicyKind::kPbLru);
}

TEST(PolicyFactory, RejectsInvalidOptions) {
  auto too_many = MakePolicy(PolicyKind::kPbLru, 8, PolicyOptions{.recent_buckets = 5000});
  ASSERT_FALSE(too_many);
  EXPECT_EQ(too_many.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(MakePolicy(PolicyKind::kExactLruScan, 8, PolicyOptions{.parallel_min_slots = 0}));
}

}  // namespace
}  // namespace ula

// Shared addresses in TP mode: a shared prefix stays striped a mod P and is
// stored once in the node (never once per rank) under both attention strategies; the
// isolation check accepts adopted addresses; bad sharing calls change nothing.
#include <gtest/gtest.h>

#include <cstring>

#include "tp_fixture.h"
#include "space/space_access.h"
#include "space/tp_state.h"
#include "ula/tp_address_space.h"
#include "ula/tp_step_planner.h"

namespace ula {
namespace {

using testing::SmallTpConfig;
using testing::TpFixture;
using testing::TpPattern;
using testing::TpRuns;

class TpSharing : public ::testing::TestWithParam<TpAttention> {};

// Every rank reads the pattern bytes of each selection it reads (at home: those of its
// own shard; the others are kElsewhere, read by their home).
void ExpectReads(TpFixture& f, const TpStepPlan& plan, std::span<const LogicalAddr> sel) {
  for (std::size_t h = 0; h < plan.ranks.size(); ++h) {
    for (std::size_t j = 0; j < sel.size(); ++j) {
      const TpReadRef ref = plan.refs[h][j];
      if (ref.source == TpReadRef::Source::kElsewhere) {
        EXPECT_NE(f.space->HomeOf(sel[j]), plan.ranks[h]);
        continue;
      }
      const std::byte* p = f.space->RefData(plan.ranks[h], GroupId(0), ref);
      ASSERT_NE(p, nullptr);
      const auto want = TpPattern(sel[j], 0, f.space->config().entry_bytes);
      ASSERT_EQ(std::memcmp(p, want.data(), want.size()), 0) << "rank " << h << " selection " << j;
    }
  }
}

TEST_P(TpSharing, SharedPrefixStaysStripedStoredOnceAndOutlivesItsAllocator) {
  TpConfig c = SmallTpConfig(4, 8, 8, GetParam() == TpAttention::kAtHome ? 0 : 16);
  c.attention = GetParam();
  TpFixture f(c);
  auto a = f.AddFilled(RequestId(1), 12);  // 3 per rank
  const std::vector<LogicalAddr> prefix(a.begin(), a.begin() + 8);
  for (std::uint64_t r = 2; r <= 4; ++r) {
    ASSERT_TRUE(f.space->AddRequest(RequestId(r)));
    f.requests.push_back(RequestId(r));
    ASSERT_TRUE(f.space->ShareInto(RequestId(r), prefix));
    f.Extend(RequestId(r), 4);
  }
  // Stored once: 12 + 3 x 4 own entries, in the node, 6 homed per rank.
  EXPECT_EQ(f.space->num_live_addresses(), 24u);
  std::uint64_t homed = 0, used = 0;
  for (std::uint16_t r = 0; r < 4; ++r) {
    homed += f.space->NumHomed(Rank(r));
    used += f.space->NumUsed(Rank(r), GroupId(0), Tier::kDevice) + f.space->NumUsed(Rank(r), GroupId(0), Tier::kHost);
  }
  EXPECT_EQ(homed, 24u);
  EXPECT_EQ(used, 24u);
  for (LogicalAddr p : prefix) {
    EXPECT_EQ(f.space->RefCount(p), 4u);
    EXPECT_EQ(f.space->Lookup(p, GroupId(0)).value().rank(), f.space->HomeOf(p));  // still striped a mod P
  }
  // Every sharer's selection of the prefix is served in one step, each entry once.
  std::vector<LogicalAddr> sel;
  std::vector<SelectionRun> runs;
  for (std::uint64_t r = 1; r <= 4; ++r) {
    sel.insert(sel.end(), prefix.begin(), prefix.end());
    runs.push_back({RequestId(r), static_cast<std::uint32_t>(prefix.size())});
  }
  auto plan = f.planner.Step(GroupId(0), sel, runs);
  ASSERT_TRUE(plan) << plan.error().ToString();
  ExpectReads(f, *plan, sel);
  for (const auto& st : plan->stats) EXPECT_EQ(st.distinct, 8u);
  // The allocator goes; the other sharers keep the prefix with its location and bytes.
  std::vector<Location> where;
  for (LogicalAddr p : prefix) where.push_back(f.space->Lookup(p, GroupId(0)).value());
  ASSERT_TRUE(f.space->Free(RequestId(1)));
  f.requests.erase(f.requests.begin());
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    EXPECT_EQ(f.space->Lookup(prefix[i], GroupId(0)).value(), where[i]);
    std::vector<std::byte> out(c.entry_bytes);
    ASSERT_TRUE(f.space->Read(prefix[i], GroupId(0), out));
    EXPECT_EQ(out, TpPattern(prefix[i], 0, c.entry_bytes));
  }
  EXPECT_FALSE(f.space->IsLive(a[8]));
  f.space->AdvanceRound();
  std::vector<LogicalAddr> sel2(prefix);
  auto plan2 = f.planner.Step(GroupId(0), sel2, TpRuns(RequestId(3), sel2.size()));
  ASSERT_TRUE(plan2) << plan2.error().ToString();
  ExpectReads(f, *plan2, sel2);
  EXPECT_TRUE(f.space->CheckInvariants());
  for (std::uint64_t r = 2; r <= 4; ++r) ASSERT_TRUE(f.space->Free(RequestId(r)));
  EXPECT_EQ(f.space->num_live_addresses(), 0u);
  EXPECT_TRUE(f.space->CheckInvariants());
}

INSTANTIATE_TEST_SUITE_P(BothAttentions, TpSharing, ::testing::Values(TpAttention::kLocalBuffer, TpAttention::kAtHome));

TEST(TpSharingCalls, BadCallsAreRefusedAndChangeNothingAndIsolationHolds) {
  TpFixture f(SmallTpConfig(2, 8, 8, 8));
  auto a = f.AddFilled(RequestId(1), 4);
  auto gone = f.AddFilled(RequestId(3), 1);
  ASSERT_TRUE(f.space->Free(RequestId(3)));
  f.requests.pop_back();
  ASSERT_TRUE(f.space->AddRequest(RequestId(2)));
  f.requests.push_back(RequestId(2));
  ASSERT_TRUE(f.space->ShareInto(RequestId(2), std::span(a).first(2)));
  ASSERT_TRUE(f.space->Retain(std::span(a).last(1)));
  const auto before = f.Take();
  auto expect = [&](Status s, ErrorCode code, const char* what) {
    ASSERT_FALSE(s) << what;
    EXPECT_EQ(s.error().code(), code) << what << ": " << s.error().ToString();
    EXPECT_EQ(f.Take(), before) << what;
  };
  const std::vector<LogicalAddr> freed{a[2], gone[0]};
  const std::vector<LogicalAddr> twice{a[2], a[2]};
  expect(f.space->ShareInto(RequestId(9), std::span(a).first(1)), ErrorCode::kNotFound, "unknown request");
  expect(f.space->ShareInto(RequestId(2), freed), ErrorCode::kNotFound, "adopting a freed address");
  expect(f.space->ShareInto(RequestId(2), twice), ErrorCode::kInvalidArgument, "listed twice");
  expect(f.space->ShareInto(RequestId(2), std::span(a).first(1)), ErrorCode::kAlreadyExists, "already adopted");
  expect(f.space->Retain(freed), ErrorCode::kNotFound, "retain a freed address");
  expect(f.space->Release(std::span(a).first(1)), ErrorCode::kFailedPrecondition, "release without a reference");
  expect(f.space->Write(a[0], GroupId(0), TpPattern(a[0], 0, 32, 1)), ErrorCode::kFailedPrecondition,
         "write of a shared address");
  // Isolation: the adopter reads the adopted, not the rest.
  const std::vector<LogicalAddr> adopted{a[1], a[0]};
  ASSERT_TRUE(f.planner.Step(GroupId(0), adopted, TpRuns(RequestId(2), 2)));
  f.space->AdvanceRound();
  const auto after = f.Take();
  const std::vector<LogicalAddr> other{a[0], a[3]};
  auto r = f.planner.Step(GroupId(0), other, TpRuns(RequestId(2), 2));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(f.Take(), after);
  // The cache reference keeps a[3] after both requests are gone; releasing it frees it.
  ASSERT_TRUE(f.space->Free(RequestId(1)));
  ASSERT_TRUE(f.space->Free(RequestId(2)));
  EXPECT_EQ(f.space->num_live_addresses(), 1u);
  EXPECT_TRUE(f.space->IsLive(a[3]));
  ASSERT_TRUE(f.space->Release(std::span(a).last(1)));
  EXPECT_EQ(f.space->num_live_addresses(), 0u);
  auto twice_released = f.space->Release(std::span(a).last(1));
  ASSERT_FALSE(twice_released);
  EXPECT_EQ(twice_released.error().code(), ErrorCode::kNotFound);
  EXPECT_TRUE(f.space->CheckInvariants());
}


// The TP directory's owner tags wrap as DP's do: the live requests are renumbered and each
// re-tags only its own allocations, never what it adopted.
TEST(TpSharingCalls, OwnerTagWrapKeepsAdoptedPrefixesAdopted) {
  TpFixture f(SmallTpConfig(2, 8, 8, 8));
  auto a = f.AddFilled(RequestId(1), 6);
  ASSERT_TRUE(f.space->AddRequest(RequestId(2)));
  f.requests.push_back(RequestId(2));
  ASSERT_TRUE(f.space->ShareInto(RequestId(2), std::span(a).first(3)));
  // And the other way round (the adopter registered before its allocator), so that whatever
  // order the renumbering visits the requests in, one adopter comes after its allocator.
  ASSERT_TRUE(f.space->AddRequest(RequestId(8)));
  auto c = f.AddFilled(RequestId(9), 3);
  f.requests.push_back(RequestId(8));
  ASSERT_TRUE(f.space->ShareInto(RequestId(8), std::span(c).first(2)));
  StateOf(*f.space).dir.set_next_tag_for_test(refs::kSharedTag);  // as after 2^32 - 2 requests
  ASSERT_TRUE(f.space->AddRequest(RequestId(3)));  // the wrap
  f.requests.push_back(RequestId(3));
  ASSERT_TRUE(f.space->CheckInvariants()) << f.space->CheckInvariants().error().ToString();
  const std::vector<LogicalAddr> prefix(a.begin(), a.begin() + 3);
  ASSERT_TRUE(f.planner.Step(GroupId(0), prefix, TpRuns(RequestId(2), 3))) << "the adopter";
  f.space->AdvanceRound();
  const auto after = f.Take();
  const std::vector<LogicalAddr> other{a[0], a[4]};
  auto r = f.planner.Step(GroupId(0), other, TpRuns(RequestId(2), 2));
  ASSERT_FALSE(r) << "the adopter may not read what it did not adopt";
  EXPECT_EQ(r.error().code(), ErrorCode::kNotFound);
  r = f.planner.Step(GroupId(0), prefix, TpRuns(RequestId(3), 3));
  ASSERT_FALSE(r) << "a new request holds nothing";
  EXPECT_EQ(f.Take(), after);
  ASSERT_TRUE(f.space->Free(RequestId(1)));
  f.requests.erase(f.requests.begin());
  for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(f.space->IsLive(a[i]), i < 3) << "address " << i;
  ASSERT_TRUE(f.space->CheckInvariants()) << f.space->CheckInvariants().error().ToString();
}
}  // namespace
}  // namespace ula

#include <gtest/gtest.h>

#include <cstring>
#include <tuple>

#include "tp/tp_fixture.h"

namespace ula {
namespace {

using testing::SmallTpConfig;
using testing::TpFixture;
using testing::TpPattern;

// Striping is round robin over the ranks, token by token, and the cursor carries over
// from one request to the next (a % P == home holds by how addresses are minted; what is
// checked here is which rank each token went to).
// page_tokens = 1: the unpaged allocator (tp_address_space.h "Pages"); the paged one is
// tests/tp/tp_engine_step_test.cc's TpPages.
TpConfig Unpaged(TpConfig c) {
  c.page_tokens = 1;
  return c;
}

TEST(TpAddressSpace, TokensAreStripedRoundRobinAcrossRequests) {
  TpFixture f(Unpaged(SmallTpConfig(4, 8, 8, 8)));
  auto first = f.AddFilled(RequestId(1), 10);
  auto second = f.AddFilled(RequestId(2), 5);
  std::vector<std::uint32_t> homes;
  for (LogicalAddr a : first) homes.push_back(f.space->HomeOf(a).value());
  for (LogicalAddr a : second) homes.push_back(f.space->HomeOf(a).value());
  EXPECT_EQ(homes, (std::vector<std::uint32_t>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, /*request 2:*/ 2, 3, 0, 1, 2}));
  for (LogicalAddr a : first) {
    auto loc = f.space->Lookup(a, GroupId(0)).value();
    EXPECT_EQ(loc.rank(), f.space->HomeOf(a));
    EXPECT_EQ(loc.tier(), Tier::kDevice);
  }
  EXPECT_EQ(f.space->NumHomed(Rank(0)), 4u);
  EXPECT_EQ(f.space->NumHomed(Rank(3)), 3u);
  EXPECT_TRUE(f.space->CheckInvariants());
}

// A rank's shard fills its device pool first, then its host pool; a full pool refuses more
// tokens with nothing changed.
TEST(TpAddressSpace, ShardSpillsToHostAndAFullSpaceRefusesWithNothingChanged) {
  TpFixture f(SmallTpConfig(2, 2, 2, 4));
  auto addrs = f.AddFilled(RequestId(1), 8);  // exactly the two shards
  std::vector<int> tiers;
  for (LogicalAddr a : addrs) tiers.push_back(f.space->Lookup(a, GroupId(0))->tier() == Tier::kHost);
  EXPECT_EQ(tiers, (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));  // per rank: 2 on device, then 2 on host
  ASSERT_TRUE(f.space->CheckInvariants());
  // Full: one more token is refused and nothing changes.
  const auto before = f.Take();
  auto more = f.space->Allocate(RequestId(1), 1);
  ASSERT_FALSE(more);
  EXPECT_EQ(more.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(f.Take(), before);
  // Free, reuse: a freed address returns on the same home rank.
  ASSERT_TRUE(f.space->Free(RequestId(1)));
  f.requests.clear();
  auto again = f.AddFilled(RequestId(2), 3);
  for (LogicalAddr a : again) EXPECT_EQ(f.space->Lookup(a, GroupId(0))->rank().value(), a.value() % 2);
  EXPECT_TRUE(f.space->CheckInvariants());
}

// ... and then to the other ranks: round robin skips a rank whose shard is full, and the
// tokens it skips land on the next ranks with room (their freed addresses reused first).
TEST(TpAddressSpace, RoundRobinSkipsAFullRank) {
  TpFixture f(Unpaged(SmallTpConfig(3, 2, 2, 4)));  // 4 entries per rank
  auto r1 = f.AddFilled(RequestId(1), 1);  // rank 0
  f.AddFilled(RequestId(2), 1);            // rank 1
  auto r3 = f.AddFilled(RequestId(3), 1);  // rank 2
  f.AddFilled(RequestId(4), 9);            // 3 more on each: all full, the cursor back at rank 0
  ASSERT_TRUE(f.space->Free(RequestId(1)));
  ASSERT_TRUE(f.space->Free(RequestId(3)));  // ranks 0 and 2 have one free entry, rank 1 none
  auto next = f.AddFilled(RequestId(5), 2);
  ASSERT_EQ(next.size(), 2u);
  EXPECT_EQ(f.space->HomeOf(next[0]), Rank(0));
  EXPECT_EQ(f.space->HomeOf(next[1]), Rank(2)) << "rank 1 is full: its turn goes to rank 2";
  EXPECT_EQ(next[0], r1[0]);  // freed addresses come back on their home
  EXPECT_EQ(next[1], r3[0]);
  const auto before = f.Take();
  EXPECT_FALSE(f.space->Allocate(RequestId(5), 1));
  EXPECT_EQ(f.Take(), before);
  EXPECT_TRUE(f.space->CheckInvariants());
}

TEST(TpAddressSpace, WriteReadRoundTripsAndRewriteDropsBufferCopies) {
  TpFixture f(SmallTpConfig(2, 8, 0, 8, /*groups=*/2));
  auto addrs = f.AddFilled(RequestId(1), 6);
  ASSERT_TRUE(f.planner.Step(GroupId(1), addrs, testing::TpRuns(RequestId(1), addrs.size())));
  // Rank 0 buffers the addresses homed on rank 1.
  const LogicalAddr remote = addrs[1];
  ASSERT_EQ(remote.value() % 2, 1u);
  EXPECT_TRUE(f.space->BufferSlot(Rank(0), remote, GroupId(1)).value().has_value());
  const auto v1 = TpPattern(remote, 1, 32, 1);
  ASSERT_TRUE(f.space->Write(remote, GroupId(1), v1));
  EXPECT_FALSE(f.space->BufferSlot(Rank(0), remote, GroupId(1)).value().has_value());
  std::vector<std::byte> out(32);
  ASSERT_TRUE(f.space->Read(remote, GroupId(1), out));
  EXPECT_EQ(out, v1);
  EXPECT_TRUE(f.space->CheckInvariants());
}

TEST(TpAddressSpace, BadInputIsRefusedAndChangesNothing) {
  TpFixture f(SmallTpConfig(4, 4, 4, 12, 2));
  auto addrs = f.AddFilled(RequestId(1), 12);
  ASSERT_TRUE(f.planner.Step(GroupId(0), addrs, testing::TpRuns(RequestId(1), addrs.size())));
  const auto before = f.Take();
  std::vector<std::byte> buf(32), wrong(31);
  const LogicalAddr unknown(1000000);
  EXPECT_EQ(f.space->AddRequest(RequestId(1)).error().code(), ErrorCode::kAlreadyExists);
  EXPECT_EQ(f.space->Allocate(RequestId(9), 1).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(f.space->Allocate(RequestId(1), 1000).error().code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(f.space->Free(RequestId(9)).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(f.space->Read(unknown, GroupId(0), buf).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(f.space->Write(unknown, GroupId(0), buf).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(f.space->Write(addrs[0], GroupId(2), buf).error().code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(f.space->Write(addrs[0], GroupId(0), wrong).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(f.space->Lookup(addrs[0], GroupId(7)).error().code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(f.space->BufferSlot(Rank(4), addrs[0], GroupId(0)).error().code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(f.space->BufferSlot(Rank(0), unknown, GroupId(0)).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(f.space->RefData(Rank(4), GroupId(0), {}), nullptr);
  std::vector<LogicalAddr> bad_sel{addrs[0], unknown};
  EXPECT_EQ(f.planner.Step(GroupId(0), bad_sel, testing::TpRuns(RequestId(1), bad_sel.size())).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(f.planner.Step(GroupId(2), addrs, testing::TpRuns(RequestId(1), addrs.size())).error().code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(f.Take(), before);
  // Double free, and a freed address in a step.
  ASSERT_TRUE(f.space->Free(RequestId(1)));
  f.requests.clear();
  EXPECT_EQ(f.space->Free(RequestId(1)).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(f.planner.Step(GroupId(0), addrs, testing::TpRuns(RequestId(1), addrs.size())).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(f.space->num_live_addresses(), 0u);
  EXPECT_TRUE(f.space->CheckInvariants());
}

TEST(TpAddressSpace, InvalidConfigIsRefused) {
  auto backend = MakeCpuBackend();
  TpConfig c = testing::SmallTpConfig(2, 4, 4, 4);
  c.num_ranks = 0;
  EXPECT_EQ(TpAddressSpace::Create(c, *backend).error().code(), ErrorCode::kInvalidArgument);
  c = testing::SmallTpConfig(2, 4, 4, 0);
  EXPECT_EQ(TpAddressSpace::Create(c, *backend).error().code(), ErrorCode::kInvalidArgument);
  c = testing::SmallTpConfig(2, 0, 4, 4);
  EXPECT_EQ(TpAddressSpace::Create(c, *backend).error().code(), ErrorCode::kInvalidArgument);
  c = testing::SmallTpConfig(2, 4, 4, 4);
  c.entry_bytes = 0;
  EXPECT_EQ(TpAddressSpace::Create(c, *backend).error().code(), ErrorCode::kInvalidArgument);
  c = testing::SmallTpConfig(2, 4, 4, 4);
  std::vector<Rank> hosted{Rank(2)};
  EXPECT_EQ(TpAddressSpace::Create(c, *backend, hosted).error().code(), ErrorCode::kOutOfRange);
  hosted = {Rank(1), Rank(1)};
  EXPECT_EQ(TpAddressSpace::Create(c, *backend, hosted).error().code(), ErrorCode::kInvalidArgument);
  // Attention at home keeps no local buffer: a buffer size is a config error.
  c = testing::SmallTpConfig(2, 4, 4, 4);
  c.attention = TpAttention::kAtHome;
  EXPECT_EQ(TpAddressSpace::Create(c, *backend).error().code(), ErrorCode::kInvalidArgument);
  c.buffer_bytes_per_rank = 0;
  EXPECT_TRUE(TpAddressSpace::Create(c, *backend));
  c.attention = static_cast<TpAttention>(7);
  EXPECT_EQ(TpAddressSpace::Create(c, *backend).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ParseTpAttention("at_home").value(), TpAttention::kAtHome);
  EXPECT_EQ(ParseTpAttention("local_buffer").value(), TpAttention::kLocalBuffer);
  EXPECT_EQ(ParseTpAttention("buffered").error().code(), ErrorCode::kInvalidArgument);
}

TEST(TpAddressSpace, CountingBackendTracksPlacementWithoutBytes) {
  auto backend = MakeCountingBackend();
  auto space = TpAddressSpace::Create(SmallTpConfig(8, 64, 64, 64, 1, 2624), *backend).value();
  TpStepPlanner planner(*space);
  ASSERT_TRUE(space->AddRequest(RequestId(1)));
  auto addrs = space->Allocate(RequestId(1), 600).value();
  std::vector<std::byte> buf(2624);
  EXPECT_EQ(space->Write(addrs[0], GroupId(0), buf).error().code(), ErrorCode::kUnsupported);
  std::vector<LogicalAddr> sel(addrs.begin(), addrs.begin() + 40);
  auto plan = planner.Step(GroupId(0), sel, testing::TpRuns(RequestId(1), sel.size())).value();
  EXPECT_EQ(plan.Total().remote_fetches, 40u * 7);
  EXPECT_EQ(backend->counters().Bytes(Tier::kDevice, Tier::kDevice, /*cross_rank=*/true), 40u * 7 * 2624);
  EXPECT_TRUE(space->CheckInvariants());
}

// Draft rollback (TpAddressSpace::Truncate, as AddressSpace::Truncate): the freed tail of
// the last kept page comes back to the same positions (so to the same home ranks), a freed
// entry's slots and buffer copies go, shared tokens and bad lengths are refused and change
// nothing; unpaged, the freed addresses join their homes' FIFOs.
TEST(TpAddressSpace, TruncateRollsDraftsBackInPlaceAndRefusesSharedTokens) {
  for (std::uint32_t page : {8u, 1u}) {
    SCOPED_TRACE(page);
    auto backend = MakeCpuBackend();
    TpConfig c = SmallTpConfig(2, 16, 16, 4);
    c.page_tokens = page;
    auto space = TpAddressSpace::Create(c, *backend).value();
    ASSERT_TRUE(space->AddRequest(RequestId(1)));
    ASSERT_TRUE(space->AddRequest(RequestId(2)));
    auto a = space->Allocate(RequestId(1), 11).value();
    for (LogicalAddr x : a) ASSERT_TRUE(space->Write(x, GroupId(0), TpPattern(x, 0, 32)));
    ASSERT_TRUE(space->ShareInto(RequestId(2), std::span(a).first(2)));
    const std::uint64_t before = space->DebugDigest();
    for (auto [r, len, code] : {std::tuple{9u, 0u, ErrorCode::kNotFound}, std::tuple{1u, 12u, ErrorCode::kOutOfRange},
                                std::tuple{1u, 1u, ErrorCode::kFailedPrecondition},
                                std::tuple{2u, 0u, ErrorCode::kFailedPrecondition}}) {
      auto s = space->Truncate(RequestId(r), len);
      ASSERT_FALSE(s) << r << " " << len;
      EXPECT_EQ(s.error().code(), code) << s.error().ToString();
      EXPECT_EQ(space->DebugDigest(), before);
    }
    ASSERT_TRUE(space->Truncate(RequestId(1), 9));
    EXPECT_FALSE(space->IsLive(a[9]));
    EXPECT_FALSE(space->IsLive(a[10]));
    EXPECT_EQ(space->num_live_addresses(), 9u);
    ASSERT_TRUE(space->CheckInvariants());
    auto b = space->Allocate(RequestId(1), 2).value();
    if (page > 1) {
      EXPECT_EQ(b[0], a[9]);
      EXPECT_EQ(b[1], a[10]);
    }
    for (LogicalAddr x : b) {
      EXPECT_TRUE(space->IsLive(x));
      EXPECT_EQ(space->Lookup(x, GroupId(0))->tier(), Tier::kDevice);
    }
    ASSERT_TRUE(space->Truncate(RequestId(1), 2));  // tokens 0, 1 are shared with request 2: kept
    EXPECT_EQ(space->num_live_addresses(), 2u);
    EXPECT_TRUE(space->CheckInvariants());
  }
}

// The rule of Truncate when the last kept token was adopted (ShareInto): the request's next
// token opens a fresh page of its own. It never continues the adopted page, whose owner
// holds (or will take) the next offsets of that page.
TEST(TpAddressSpace, TruncateToAnAdoptedTokenOpensAFreshPage) {
  auto backend = MakeCpuBackend();
  TpConfig c = SmallTpConfig(2, 16, 16, 4);
  c.page_tokens = 8;
  auto space = TpAddressSpace::Create(c, *backend).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1)));
  ASSERT_TRUE(space->AddRequest(RequestId(2)));
  auto a = space->Allocate(RequestId(1), 4).value();  // page 0, offsets 0-3
  for (LogicalAddr x : a) ASSERT_TRUE(space->Write(x, GroupId(0), TpPattern(x, 0, 32)));
  ASSERT_TRUE(space->ShareInto(RequestId(2), a));     // request 2 adopts all four
  auto own = space->Allocate(RequestId(2), 3).value();
  for (LogicalAddr x : own) EXPECT_NE(x.value() / 8, 0u) << "request 2's own tokens never join page 0";
  ASSERT_TRUE(space->Truncate(RequestId(2), 4));      // its last kept token is adopted
  auto next2 = space->Allocate(RequestId(2), 1).value();
  auto next1 = space->Allocate(RequestId(1), 1).value();
  EXPECT_NE(next2[0].value() / 8, 0u) << "request 2's next token continued the adopted page 0 at address "
                                      << next2[0].value();
  EXPECT_EQ(next1[0].value(), 4u) << "request 1 continues its own page";
  EXPECT_NE(next1[0], next2[0]);
  EXPECT_EQ(space->num_live_addresses(), 6u);
  EXPECT_TRUE(space->CheckInvariants());
}

}  // namespace
}  // namespace ula

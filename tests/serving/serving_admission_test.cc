// Placement rules and admission of the systems on hand-sized budgets, and the
// HiSparse per-request buffer (fixed quota, LRU inside it, not lendable).
#include <gtest/gtest.h>

#include <vector>

#include "serving/baselines.h"

namespace ula {
namespace {

// kv 100 B/token, index 10 B/token, device 10000 B, host 20000 B per rank.
PlacementRules Rules(SystemKind s, ParallelMode m, std::uint32_t ranks = 2) {
  PlacementRules r;
  r.system = s;
  r.mode = m;
  r.num_ranks = ranks;
  r.device_bytes_per_rank = 10000;
  r.host_bytes_per_rank = 20000;
  r.kv_bytes_per_token = 100;
  r.index_bytes_per_token = 10;
  r.working_set_entries = 8;
  r.hisparse_buffer_entries = 16;
  r.tp_buffer_entries = 4;
  return r;
}

TEST(Admission, AllGpuDpHoldsEachHistoryOnItsOwnRank) {
  // 10000 / (50 * 110) = 1 request of 50 tokens per rank -> 2 on 2 ranks.
  const std::vector<std::uint32_t> t(10, 50);
  EXPECT_EQ(MaxAdmitted(Rules(SystemKind::kAllGpu, ParallelMode::kDp), t), 2u);
  // 40 tokens: 4400 B -> 2 per rank.
  EXPECT_EQ(MaxAdmitted(Rules(SystemKind::kAllGpu, ParallelMode::kDp), std::vector<std::uint32_t>(10, 40)), 4u);
}

TEST(Admission, AllGpuTpKeepsAFullCopyOnEveryRank) {
  // TP: every rank holds every request, so more ranks do not add capacity.
  const std::vector<std::uint32_t> t(10, 40);
  EXPECT_EQ(MaxAdmitted(Rules(SystemKind::kAllGpu, ParallelMode::kTp, 2), t), 2u);
  EXPECT_EQ(MaxAdmitted(Rules(SystemKind::kAllGpu, ParallelMode::kTp, 8), t), 2u);
  const RankDemand d = DemandOf(Rules(SystemKind::kAllGpu, ParallelMode::kTp, 8), 40);
  EXPECT_DOUBLE_EQ(d.device, 40 * 110.0);
  EXPECT_DOUBLE_EQ(d.host, 0);
}

TEST(Admission, HiSparseReservesAFixedBufferPerRequestAndTheHistoryOnHost) {
  const PlacementRules r = Rules(SystemKind::kHiSparse, ParallelMode::kDp);
  const RankDemand d = DemandOf(r, 50);
  EXPECT_DOUBLE_EQ(d.device, 16 * 100.0 + 50 * 10.0);  // buffer + index keys
  EXPECT_DOUBLE_EQ(d.host, 50 * 100.0);                 // full history
  EXPECT_DOUBLE_EQ(d.either, 0);
  // Host: 20000 / 5000 = 4 per rank; device: 10000 / 2100 = 4 per rank -> 8.
  EXPECT_EQ(MaxAdmitted(r, std::vector<std::uint32_t>(20, 50)), 8u);
  // A short request still takes the whole buffer (the quota is not lent to others).
  const RankDemand small = DemandOf(r, 2);
  EXPECT_DOUBLE_EQ(small.device, 16 * 100.0 + 2 * 10.0);
  EXPECT_EQ(MaxAdmitted(r, std::vector<std::uint32_t>(40, 2)), 12u);  // 10000 / 1620 = 6 per rank
}

TEST(Admission, UlaCacheDpUsesDeviceAndHostTogether) {
  const PlacementRules r = Rules(SystemKind::kUlaCache, ParallelMode::kDp);
  const RankDemand d = DemandOf(r, 50);
  EXPECT_DOUBLE_EQ(d.device, 50 * 10.0 + 8 * 100.0);  // index keys + working set
  EXPECT_DOUBLE_EQ(d.either, 42 * 100.0);
  // (10000 + 20000) / 5500 = 5 per rank -> 10: more than all-GPU (2) and HiSparse (8).
  EXPECT_EQ(MaxAdmitted(r, std::vector<std::uint32_t>(40, 50)), 10u);
}

TEST(Admission, UlaCacheTpStripesTheHistoryOverTheRanks) {
  const PlacementRules r = Rules(SystemKind::kUlaCache, ParallelMode::kTp, 2);
  const RankDemand d = DemandOf(r, 50);
  EXPECT_DOUBLE_EQ(d.device, 25 * 10.0 + 4 * 100.0 + 4 * 100.0);  // stripe keys + ws/2 + buffer
  EXPECT_DOUBLE_EQ(d.either, 21 * 100.0);
  // Per rank 3150 B of 30000 -> 9 requests (TP: all ranks in step), vs all-GPU TP's 1.
  EXPECT_EQ(MaxAdmitted(r, std::vector<std::uint32_t>(40, 50)), 9u);
  EXPECT_EQ(MaxAdmitted(Rules(SystemKind::kAllGpu, ParallelMode::kTp, 2), std::vector<std::uint32_t>(40, 50)), 1u);
}

PlacementRules AtHomeRules(std::uint32_t ranks = 2) {
  PlacementRules r = Rules(SystemKind::kUlaCacheAtHome, ParallelMode::kTp, ranks);
  r.tp_buffer_entries = 0;  // no local buffer
  return r;
}

TEST(Admission, UlaCacheAtHomeIsUlaCacheTpWithoutTheBufferReservation) {
  const PlacementRules r = AtHomeRules();
  ASSERT_TRUE(r.Validate()) << r.Validate().error().ToString();
  const RankDemand d = DemandOf(r, 50);
  EXPECT_DOUBLE_EQ(d.device, 25 * 10.0 + 4 * 100.0);  // stripe keys + ws/2, no buffer
  EXPECT_DOUBLE_EQ(d.either, 21 * 100.0);
  EXPECT_DOUBLE_EQ(d.host, 0);
  const RankDemand u = DemandOf(Rules(SystemKind::kUlaCache, ParallelMode::kTp, 2), 50);
  EXPECT_DOUBLE_EQ(u.device - d.device, 4 * 100.0);  // exactly the 4-entry buffer
  EXPECT_DOUBLE_EQ(u.either, d.either);
  // Per rank 2750 B of 30000 -> 10 requests, one more than ulacache TP's 9.
  EXPECT_EQ(MaxAdmitted(r, std::vector<std::uint32_t>(40, 50)), 10u);
  // Never fewer than ulacache TP, whatever the lengths and rank counts.
  for (std::uint32_t ranks : {1u, 2u, 4u, 8u}) {
    for (std::uint32_t t : {1u, 3u, 8u, 17u, 50u, 64u, 200u}) {
      const std::vector<std::uint32_t> hist(400, t);
      SCOPED_TRACE(testing::Message() << ranks << " ranks, " << t << " tokens");
      EXPECT_GE(MaxAdmitted(AtHomeRules(ranks), hist),
                MaxAdmitted(Rules(SystemKind::kUlaCache, ParallelMode::kTp, ranks), hist));
    }
  }
}

TEST(Admission, UlaCacheAtHomeIsTpOnlyWithoutABufferAndBadRulesChangeNothing) {
  EXPECT_EQ(SystemName(SystemKind::kUlaCacheAtHome), "ulacache_home");
  EXPECT_TRUE(SystemRunsIn(SystemKind::kUlaCacheAtHome, ParallelMode::kTp));
  EXPECT_FALSE(SystemRunsIn(SystemKind::kUlaCacheAtHome, ParallelMode::kDp));
  for (SystemKind s : {SystemKind::kAllGpu, SystemKind::kHiSparse, SystemKind::kUlaCache}) {
    EXPECT_TRUE(SystemRunsIn(s, ParallelMode::kDp));
    EXPECT_TRUE(SystemRunsIn(s, ParallelMode::kTp));
  }
  PlacementRules r = AtHomeRules();
  r.mode = ParallelMode::kDp;
  auto l = AdmissionLedger::Create(r);
  ASSERT_FALSE(l);
  EXPECT_EQ(l.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(l.error().message().find("mode"), std::string::npos);
  EXPECT_EQ(MaxAdmitted(r, std::vector<std::uint32_t>(4, 10)), 0u);
  r = AtHomeRules();
  r.tp_buffer_entries = 4;
  l = AdmissionLedger::Create(r);
  ASSERT_FALSE(l);
  EXPECT_NE(l.error().message().find("tp_buffer_entries"), std::string::npos);
  r = AtHomeRules();
  r.working_set_entries = 0;
  l = AdmissionLedger::Create(r);
  ASSERT_FALSE(l);
  EXPECT_NE(l.error().message().find("working_set_entries"), std::string::npos);
  // A request that does not fit leaves every rank's reservations as they were.
  auto ledger = AdmissionLedger::Create(AtHomeRules());
  ASSERT_TRUE(ledger);
  ASSERT_TRUE(ledger->TryAdmit(50));
  const double dev0 = ledger->device_only(0), dev1 = ledger->device_only(1), eit0 = ledger->either(0);
  EXPECT_FALSE(ledger->TryAdmit(1000000).has_value());
  EXPECT_EQ(ledger->admitted(), 1u);
  EXPECT_DOUBLE_EQ(ledger->device_only(0), dev0);
  EXPECT_DOUBLE_EQ(ledger->device_only(1), dev1);
  EXPECT_DOUBLE_EQ(ledger->either(0), eit0);
}

TEST(Admission, QueueHeadWaitsAndReleaseFreesRoom) {
  auto ledger = AdmissionLedger::Create(Rules(SystemKind::kAllGpu, ParallelMode::kDp, 1));
  ASSERT_TRUE(ledger);
  EXPECT_TRUE(ledger->TryAdmit(40).has_value());
  EXPECT_TRUE(ledger->TryAdmit(40).has_value());
  EXPECT_FALSE(ledger->TryAdmit(40).has_value());  // 3 * 4400 > 10000
  ledger->Release(0, 40);
  EXPECT_TRUE(ledger->TryAdmit(40).has_value());
  // Order matters: a big head blocks smaller ones behind it.
  EXPECT_EQ(MaxAdmitted(Rules(SystemKind::kAllGpu, ParallelMode::kDp, 1), std::vector<std::uint32_t>{40, 100, 1, 1}), 1u);
}

TEST(Admission, DpPlacesOnTheEmptiestRank) {
  auto ledger = AdmissionLedger::Create(Rules(SystemKind::kAllGpu, ParallelMode::kDp, 2));
  ASSERT_TRUE(ledger);
  EXPECT_EQ(ledger->TryAdmit(40), 0u);
  EXPECT_EQ(ledger->TryAdmit(40), 1u);
  EXPECT_EQ(ledger->TryAdmit(40), 0u);
}

TEST(Admission, BadRulesNameTheField) {
  PlacementRules r = Rules(SystemKind::kHiSparse, ParallelMode::kDp);
  r.hisparse_buffer_entries = 0;
  auto l = AdmissionLedger::Create(r);
  ASSERT_FALSE(l);
  EXPECT_NE(l.error().message().find("hisparse_buffer_entries"), std::string::npos);
  r = Rules(SystemKind::kAllGpu, ParallelMode::kDp);
  r.kv_bytes_per_token = 0;
  l = AdmissionLedger::Create(r);
  ASSERT_FALSE(l);
  EXPECT_NE(l.error().message().find("kv_bytes_per_token"), std::string::npos);
}

TEST(HiSparse, PrefillKeepsTheNewestTokensInTheBuffer) {
  auto b = HiSparseBuffers::Create(4);
  ASSERT_TRUE(b);
  ASSERT_TRUE(b->AddRequest(1, 10));
  EXPECT_EQ(*b->NumBuffered(1), 4u);
  b->AdvanceRound();
  const std::vector<std::uint32_t> newest = {6, 7, 8, 9};
  auto st = b->Step(1, newest);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->hits, 4u);
  EXPECT_EQ(st->misses, 0u);
  EXPECT_TRUE(b->CheckInvariants());
}

TEST(HiSparse, EvictsTheLeastRecentlyUsedEntryOfTheSameRequest) {
  auto b = HiSparseBuffers::Create(4);
  ASSERT_TRUE(b);
  ASSERT_TRUE(b->AddRequest(1, 10));  // buffer: 6 7 8 9
  b->AdvanceRound();
  ASSERT_TRUE(b->Step(1, std::vector<std::uint32_t>{6, 7}));  // 6, 7 recent; 8, 9 older
  b->AdvanceRound();
  auto st = b->Step(1, std::vector<std::uint32_t>{0, 1, 6});  // 2 misses evict 8 and 9
  ASSERT_TRUE(st);
  EXPECT_EQ(st->hits, 1u);
  EXPECT_EQ(st->misses, 2u);
  EXPECT_EQ(st->evictions, 2u);
  b->AdvanceRound();
  st = b->Step(1, std::vector<std::uint32_t>{0, 1, 6, 7});  // all resident
  ASSERT_TRUE(st);
  EXPECT_EQ(st->hits, 4u);
  EXPECT_TRUE(b->CheckInvariants());
}

// A refused step changes nothing: a twin that never saw it answers every later step
// identically (hits, misses, evictions: the buffer contents and their LRU stamps agree).
TEST(HiSparse, BufferIsNotLentToOtherRequests) {
  auto make = [] {
    auto b = HiSparseBuffers::Create(4);
    EXPECT_TRUE(b);
    EXPECT_TRUE(b->AddRequest(1, 3));  // uses 3 of its 4 slots
    EXPECT_TRUE(b->AddRequest(2, 20));  // buffer: 16..19
    b->AdvanceRound();
    return std::move(b).value();
  };
  HiSparseBuffers b = make(), twin = make();
  // Request 2 needs 5 distinct entries: its own 4 slots are the limit even though request 1
  // has a free slot. Two of them (16, 17) are buffered hits a careless step would touch.
  auto st = b.Step(2, std::vector<std::uint32_t>{16, 17, 0, 1, 2});
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_TRUE(b.CheckInvariants());
  EXPECT_EQ(*b.NumBuffered(1), 3u);
  EXPECT_EQ(*b.NumBuffered(2), 4u);
  const std::vector<std::vector<std::uint32_t>> later = {{0, 1}, {16, 17, 18}, {18, 19}, {2, 3}, {0, 19}};
  for (const auto& sel : later) {
    auto x = b.Step(2, sel), y = twin.Step(2, sel);
    ASSERT_TRUE(x && y);
    EXPECT_EQ(x->hits, y->hits) << "after the refused step the buffer differs";
    EXPECT_EQ(x->evictions, y->evictions);
    b.AdvanceRound();
    twin.AdvanceRound();
  }
}

TEST(HiSparse, NewTokensGoToTheBufferAndBadInputIsRefused) {
  auto b = HiSparseBuffers::Create(4);
  ASSERT_TRUE(b);
  ASSERT_TRUE(b->AddRequest(1, 10));
  ASSERT_TRUE(b->Append(1, 2));  // 10, 11 displace the oldest
  b->AdvanceRound();
  auto st = b->Step(1, std::vector<std::uint32_t>{10, 11});
  ASSERT_TRUE(st);
  EXPECT_EQ(st->hits, 2u);
  EXPECT_FALSE(b->Step(1, std::vector<std::uint32_t>{12}));  // past the history
  EXPECT_FALSE(b->Step(7, std::vector<std::uint32_t>{0}));   // unknown request
  EXPECT_FALSE(b->AddRequest(1, 5));                        // duplicate
  EXPECT_TRUE(b->Finish(1));
  EXPECT_FALSE(b->Finish(1));
  EXPECT_FALSE(HiSparseBuffers::Create(0));
  EXPECT_TRUE(b->CheckInvariants());
}

}  // namespace
}  // namespace ula

// TP mode over MPI, one process per rank (run by ctest through mpirun -np 2 and -np 4).
//   - the TP consistency verifier with MPI ranks (every rank's reads checked against the
//     shadow; failures reduced over all ranks),
//   - the differential test: the same trace through MPI ranks and in-process ranks gives
//     identical step plans and bit-identical reference-attention outputs on every rank,
//   - the coalesced one-sided fetch reads every entry's exact bytes,
//   - the striped indexer with an MPI all-gather equals the single-rank top-k.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>

#include "tp/fault_fabric.h"
#include "indexer/striped_indexer.h"
#include "ula/tp_step_planner.h"
#include "ula/tp_mpi.h"
#include "verify/tp_verifier.h"
#include "test_seed.h"
#include "tp/c4_keys.h"

namespace ula {
namespace {

TpFabric* g_fabric = nullptr;

TpVerifierConfig MpiConfig(TpAttention attention = TpAttention::kLocalBuffer) {
  TpVerifierConfig c;
  c.seed = ::ula::testing::TestSeed(424242);
  c.ops = 250;
  c.num_ranks = g_fabric->num_ranks();
  c.device_slots_per_group = 96;
  c.buffer_slots_per_group = attention == TpAttention::kAtHome ? 0 : 320;
  c.attention = attention;
  c.record = true;
  return c;
}

// Same records on this rank through MPI ranks and through in-process ranks: plans
// (refs) and attention outputs bit for bit.
bool SameRecords(const TpVerifierReport& mpi, const TpVerifierReport& local) {
  std::vector<const TpStepRecord*> mine;
  for (const TpStepRecord& r : local.records) {
    if (r.rank == g_fabric->local_rank().value()) mine.push_back(&r);
  }
  bool same = mine.size() == mpi.records.size() && !mine.empty();
  for (std::size_t i = 0; same && i < mine.size(); ++i) {
    const TpStepRecord& a = *mine[i];
    const TpStepRecord& b = mpi.records[i];
    same = a.step == b.step && a.group == b.group && a.refs == b.refs && a.attention.size() == b.attention.size() &&
           std::memcmp(a.attention.data(), b.attention.data(), a.attention.size() * sizeof(float)) == 0;
    if (!same) ADD_FAILURE() << "record " << i << " (step " << a.step << " group " << a.group << ") differs";
  }
  std::printf("rank %u: %zu step records compared (plans + attention outputs)\n", g_fabric->local_rank().value(),
              mine.size());
  return same;
}

TEST(TpMpi, VerifierPassesWithMpiRanks) {
  const TpVerifierConfig c = MpiConfig();
  std::printf("rank %u: seed=%llu ranks=%u\n", g_fabric->local_rank().value(), static_cast<unsigned long long>(c.seed),
              c.num_ranks);
  auto report = RunTpVerifier(c, g_fabric);
  ASSERT_TRUE(report) << report.error().ToString();
  for (const auto& f : report->first_failures) ADD_FAILURE() << "rank " << g_fabric->local_rank().value() << ": " << f;
  std::printf("rank %u: steps=%llu refused=%llu swaps=%llu buffer hits=%llu fetches=%llu checked=%llu\n",
              g_fabric->local_rank().value(), (unsigned long long)report->steps, (unsigned long long)report->rejected_steps,
              (unsigned long long)report->home_swaps, (unsigned long long)report->buffer_hits,
              (unsigned long long)report->remote_fetches, (unsigned long long)report->entries_checked);
  EXPECT_TRUE(g_fabric->AllTrue(report->ok())) << "some rank failed the verifier";
  EXPECT_GT(report->steps, 150u);
  EXPECT_GT(report->remote_fetches, 100u);
  EXPECT_GT(report->bad_input_checks, 10u);
}

TEST(TpMpi, DifferentialInProcessAndMpiRanksAgreeBitForBit) {
  const TpVerifierConfig c = MpiConfig();
  auto mpi = RunTpVerifier(c, g_fabric);
  ASSERT_TRUE(mpi) << mpi.error().ToString();
  auto local = RunTpVerifier(c, nullptr);  // every rank in this process
  ASSERT_TRUE(local) << local.error().ToString();
  ASSERT_TRUE(mpi->ok() && local->ok());
  EXPECT_TRUE(g_fabric->AllTrue(SameRecords(*mpi, *local))) << "some rank saw a difference";
}

// Attention at home over MPI: partials exchanged with an all-gather, merged in rank order,
// checked against the reference on every rank; and the same merged outputs and plans as
// with in-process ranks, bit for bit.
TEST(TpMpi, AttentionAtHomeVerifierAndDifferential) {
  const TpVerifierConfig c = MpiConfig(TpAttention::kAtHome);
  auto mpi = RunTpVerifier(c, g_fabric);
  ASSERT_TRUE(mpi) << mpi.error().ToString();
  for (const auto& f : mpi->first_failures) ADD_FAILURE() << "rank " << g_fabric->local_rank().value() << ": " << f;
  std::printf("rank %u: at home steps=%llu swaps=%llu attention checks=%llu max error=%.3g\n",
              g_fabric->local_rank().value(), (unsigned long long)mpi->steps, (unsigned long long)mpi->home_swaps,
              (unsigned long long)mpi->attention_checks, mpi->max_attention_error);
  EXPECT_TRUE(g_fabric->AllTrue(mpi->ok())) << "some rank failed the verifier";
  EXPECT_GT(mpi->steps, 150u);
  EXPECT_GT(mpi->attention_checks, 500u);
  EXPECT_EQ(mpi->remote_fetches, 0u);
  auto local = RunTpVerifier(c, nullptr);
  ASSERT_TRUE(local) << local.error().ToString();
  ASSERT_TRUE(local->ok());
  EXPECT_TRUE(g_fabric->AllTrue(SameRecords(*mpi, *local))) << "some rank saw a difference";
}

// FetchFromHome coalesces each batch into one MPI_Get per run of contiguous remote
// memory: every destination still gets exactly its own entry's bytes, whatever the order
// of the addresses, the layout of the destinations (contiguous, reversed, scattered) and
// the tier of the home (device or host), and with gaps breaking the runs.
TEST(TpMpi, CoalescedFetchReadsEveryEntryExactly) {
  const std::uint32_t p = g_fabric->num_ranks(), me = g_fabric->local_rank().value();
  auto backend = MakeCpuBackend({.copy_threads = 0});
  TpConfig c;
  c.num_ranks = p;
  c.num_groups = 2;
  c.entry_bytes = 44;
  c.device_bytes_per_rank = std::uint64_t{64} * c.entry_bytes * c.num_groups;
  c.host_bytes_per_rank = std::uint64_t{200} * c.entry_bytes * c.num_groups;
  c.buffer_bytes_per_rank = std::uint64_t{16} * c.entry_bytes * c.num_groups;
  const Rank mine = g_fabric->local_rank();
  auto space = TpAddressSpace::Create(c, *backend, std::span(&mine, 1));
  ASSERT_TRUE(space) << space.error().ToString();
  TpAddressSpace& s = **space;
  ASSERT_TRUE(s.AddRequest(RequestId(0)));
  auto addrs = s.Allocate(RequestId(0), 250 * p);
  ASSERT_TRUE(addrs) << addrs.error().ToString();
  auto pattern = [&](LogicalAddr a, std::uint32_t g) {
    std::vector<std::byte> v(c.entry_bytes);
    for (std::uint32_t i = 0; i < c.entry_bytes; ++i) v[i] = std::byte((a.value() * 37 + g * 101 + i * 7) & 0xff);
    return v;
  };
  for (LogicalAddr a : *addrs) {
    for (std::uint32_t g = 0; g < c.num_groups; ++g) ASSERT_TRUE(s.Write(a, GroupId(g), pattern(a, g)));
  }
  ASSERT_TRUE(g_fabric->Expose(s));
  const Rank src(static_cast<std::uint16_t>((me + 1) % p));
  std::vector<LogicalAddr> remote;
  for (LogicalAddr a : *addrs) {
    if (s.HomeOf(a) == src) remote.push_back(a);
  }
  ULA_TEST_SEEDED(seed, 31337);
  std::mt19937_64 rng(seed);  // same stream on every rank (mpirun passes ULA_TEST_SEED on)
  bool ok = remote.size() == 250;
  for (int trial = 0; trial < 12 && ok; ++trial) {
    std::vector<LogicalAddr> pick;
    for (LogicalAddr a : remote) {
      if (trial % 3 == 0 || rng() % 3 != 0) pick.push_back(a);  // trials 1, 2, 4, ...: gaps
    }
    if (trial % 2 == 1) std::shuffle(pick.begin(), pick.end(), rng);
    const std::size_t n = pick.size();
    std::vector<std::byte> buf((2 * n + 1) * c.entry_bytes, std::byte{0});
    std::vector<std::byte*> dst(n);
    for (std::size_t i = 0; i < n; ++i) {
      std::size_t pos = i;                                  // contiguous
      if (trial % 4 == 2) pos = n - 1 - i;                  // reversed
      if (trial % 4 == 3) pos = (i * 7919) % (2 * n + 1);   // scattered over twice the room
      dst[i] = buf.data() + pos * c.entry_bytes;
    }
    if (trial % 4 == 3) {  // scattered positions must be distinct
      std::vector<std::byte*> sorted = dst;
      std::sort(sorted.begin(), sorted.end());
      ASSERT_TRUE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
    }
    const std::uint32_t g = static_cast<std::uint32_t>(trial % 2);
    ASSERT_TRUE(g_fabric->FetchFromHome(src, GroupId(g), pick, dst));
    for (std::size_t i = 0; i < n && ok; ++i) {
      const auto want = pattern(pick[i], g);
      ok = std::memcmp(dst[i], want.data(), want.size()) == 0;
      if (!ok) ADD_FAILURE() << "trial " << trial << " entry " << i << " address " << pick[i].value();
    }
  }
  g_fabric->Unexpose();
  EXPECT_TRUE(g_fabric->AllTrue(ok)) << "some rank read wrong bytes";
}

// A failed one-sided fetch over MPI (injected on rank 0's fabric, whole and partial):
// the step fails on rank 0 with kIo, every other rank's step succeeds, no entry whose
// fetch failed is buffered, and the retry fetches and reads the right bytes.
TEST(TpMpi, FailedFetchIsNotBufferedAndIsFetchedAgain) {
  const std::uint32_t p = g_fabric->num_ranks(), me = g_fabric->local_rank().value();
  for (bool partial : {false, true}) {
    auto backend = MakeCpuBackend({.copy_threads = 0});
    TpConfig c;
    c.num_ranks = p;
    c.num_groups = 1;
    c.entry_bytes = 48;
    c.device_bytes_per_rank = std::uint64_t{16} * c.entry_bytes;
    c.host_bytes_per_rank = std::uint64_t{16} * c.entry_bytes;
    c.buffer_bytes_per_rank = std::uint64_t{64} * c.entry_bytes;
    const Rank mine = g_fabric->local_rank();
    auto space = TpAddressSpace::Create(c, *backend, std::span(&mine, 1));
    ASSERT_TRUE(space) << space.error().ToString();
    TpAddressSpace& s = **space;
    auto faulty = MakeFaultInjectingFabric(*g_fabric, FaultPlan{.seed = 7, .fail_every_nth = 1, .partial = partial}).value();
    faulty->set_armed(me == 0);
    ASSERT_TRUE(s.AddRequest(RequestId(0)));
    const auto addrs = s.Allocate(RequestId(0), 8 * p).value();
    auto pattern = [&](LogicalAddr a) {
      std::vector<std::byte> v(c.entry_bytes);
      for (std::uint32_t i = 0; i < c.entry_bytes; ++i) v[i] = std::byte((a.value() * 53 + i * 3 + 1) & 0xff);
      return v;
    };
    for (LogicalAddr a : addrs) ASSERT_TRUE(s.Write(a, GroupId(0), pattern(a)));
    ASSERT_TRUE(faulty->Expose(s));
    TpStepPlanner planner(s, faulty.get());
    bool ok = true;
    auto first = planner.Step(GroupId(0), addrs, std::vector<SelectionRun>{{RequestId(0), static_cast<std::uint32_t>(addrs.size())}});
    if (me == 0) {
      ok = ok && !first && first.error().code() == ErrorCode::kIo;
      for (LogicalAddr a : addrs) {
        if (s.HomeOf(a) != mine) ok = ok && !s.BufferSlot(mine, a, GroupId(0)).value().has_value();
      }
      ok = ok && s.NumBuffered(mine, GroupId(0)) == 0 && faulty->stats().fetches_failed == p - 1;
    } else {
      ok = ok && first.has_value();
    }
    ok = ok && s.CheckInvariants().has_value();
    faulty->set_armed(false);
    s.AdvanceRound();
    auto second = planner.Step(GroupId(0), addrs, std::vector<SelectionRun>{{RequestId(0), static_cast<std::uint32_t>(addrs.size())}});
    ok = ok && second.has_value();
    for (std::size_t j = 0; ok && j < addrs.size(); ++j) {
      const std::byte* at = s.RefData(mine, GroupId(0), second->refs[0][j]);
      ok = at != nullptr && std::memcmp(at, pattern(addrs[j]).data(), c.entry_bytes) == 0;
    }
    if (!ok) ADD_FAILURE() << "rank " << me << (partial ? " (partial)" : " (whole)") << ": contract broken";
    faulty->Unexpose();
    EXPECT_TRUE(g_fabric->AllTrue(ok)) << "some rank broke the failed-fetch contract";
  }
}

// AllToAllV: rank r sends r + q + 1 bytes of value (r * 16 + q) to rank q; counts that do
// not add up to the buffers are refused before any communication.
TEST(TpMpi, AllToAllVDeliversEveryBlockInRankOrder) {
  const std::uint32_t p = g_fabric->num_ranks(), me = g_fabric->local_rank().value();
  std::vector<std::byte> send, recv;
  std::vector<std::size_t> sc(p), rc(p);
  for (std::uint32_t q = 0; q < p; ++q) {
    sc[q] = me + q + 1;
    rc[q] = q + me + 1;
    send.insert(send.end(), sc[q], std::byte(me * 16 + q));
  }
  std::size_t total = 0;
  for (std::size_t c : rc) total += c;
  recv.assign(total, std::byte{0xff});
  std::vector<std::size_t> wrong = sc;
  wrong[0] += 1;
  EXPECT_EQ(g_fabric->AllToAllV(send, wrong, recv, rc).error().code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(g_fabric->AllToAllV(send, sc, recv, rc));
  bool ok = true;
  std::size_t at = 0;
  for (std::uint32_t q = 0; q < p; ++q) {
    for (std::size_t i = 0; i < rc[q]; ++i) ok = ok && recv[at + i] == std::byte(q * 16 + me);
    at += rc[q];
  }
  EXPECT_TRUE(g_fabric->AllTrue(ok)) << "some rank received wrong blocks";
}

TEST(TpMpi, StripedIndexerGatherEqualsSingleRankTopK) {
  ULA_TEST_SEEDED(seed, 777);
  std::mt19937_64 rng(seed);  // same stream on every rank
  const std::uint32_t p = g_fabric->num_ranks(), me = g_fabric->local_rank().value();
  bool all_equal = true;
  for (int trial = 0; trial < 30; ++trial) {
    const IndexerShape shape{.num_heads = 2, .head_dim = 4, .top_k = 1 + static_cast<std::uint32_t>(rng() % 50)};
    const std::uint32_t n = 1 + static_cast<std::uint32_t>(rng() % 400);
    std::vector<float> keys(n * shape.head_dim), query(shape.num_heads * shape.head_dim), weights(shape.num_heads, 0.25f);
    for (float& v : keys) v = static_cast<float>(static_cast<int>(rng() % 3) - 1);  // many ties
    for (float& v : query) v = static_cast<float>(static_cast<int>(rng() % 3));
    const IndexQuery q{query, weights};
    std::vector<float> scores(n);
    for (std::uint32_t i = 0; i < n; ++i) scores[i] = IndexScore(shape, q, keys.data() + i * shape.head_dim);
    std::vector<std::uint32_t> want, got;
    SelectTopK(scores, shape.top_k, want);
    std::vector<float> local_keys;
    std::vector<std::uint32_t> local_pos;
    for (std::uint32_t i = 0; i < n; ++i) {
      if ((i * 5 + 1) % p != me) continue;  // the key of position i lives on its address's home
      local_pos.push_back(i);
      local_keys.insert(local_keys.end(), keys.begin() + i * shape.head_dim, keys.begin() + (i + 1) * shape.head_dim);
    }
    ASSERT_TRUE(StripedSelect(shape, q, local_keys, local_pos, g_fabric, got));
    all_equal = all_equal && got == want;
  }
  EXPECT_TRUE(all_equal);
}

// DeepSeek-V4's C4 keys at V4-Flash's and V4-Pro's shapes (tp/c4_keys.h: interleaved
// requests of fewer than k, k and 3k C4 entries, planted ties straddling k and the ranks):
// the MPI gather of k x 8 B per rank gives every rank the single-rank top-k.
TEST(TpMpi, StripedIndexerOverV4C4KeysEqualsSingleRankTopK) {
  ULA_TEST_SEEDED(seed, 20261209);
  std::mt19937_64 rng(seed);  // same stream on every rank: the same workload
  const std::uint32_t p = g_fabric->num_ranks(), me = g_fabric->local_rank().value();
  bool all_equal = true;
  for (const char* model : {"deepseek_v4_flash", "deepseek_v4_pro"}) {
    const test::C4Workload w = test::MakeC4Workload(test::IndexerShapeOfModel(model), rng);
    std::vector<float> keys;
    std::vector<std::uint32_t> positions, got;
    for (const test::C4Request& r : w.requests) {
      test::C4LocalKeys(w, r, p, me, keys, positions);
      ASSERT_TRUE(StripedSelect(w.shape, w.q(), keys, positions, g_fabric, got));
      const bool equal = got == test::C4SingleRankTopK(w, r);
      EXPECT_TRUE(equal) << model << ": " << r.entries() << " C4 entries, rank " << me << " of " << p;
      all_equal = all_equal && equal;
    }
  }
  EXPECT_TRUE(g_fabric->AllTrue(all_equal)) << "some rank's striped top-k differs from the single-rank one";
}

}  // namespace
}  // namespace ula

int main(int argc, char** argv) {
  auto session = ula::MpiSession::Init(&argc, &argv);
  if (!session) {
    std::fprintf(stderr, "%s\n", session.error().ToString().c_str());
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  int rc = 0;
  {
    auto fabric = ula::MakeMpiFabric();
    if (!fabric) {
      std::fprintf(stderr, "%s\n", fabric.error().ToString().c_str());
      return 2;
    }
    ula::g_fabric = fabric->get();
    if ((*session)->rank() != 0) {  // one rank prints the gtest report
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
    }
    rc = RUN_ALL_TESTS();
    rc = ula::g_fabric->AllTrue(rc == 0) ? 0 : 1;  // every rank exits with the verdict of all
  }
  return rc;
}

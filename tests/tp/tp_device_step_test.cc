// DeviceStep in TP mode (ula/device_step.h, "TP attention at home"), its OpenMP form: one
// device step per (rank, group) shard of a TP space, each rank's Check, the verdicts reduced
// with MAX (the engine's all-reduce, done here by hand), each rank's Claim and Complete,
// against TpStepPlanner's Plan / Complete (every rank in one process) on the same
// space: per rank the same indices (-1 for another rank's entries), that rank's slice of the
// descriptors, its stats, the same refusals (one rank's refusal refuses every rank), and the
// whole device state equal to a fresh copy of the reference after every step, over
// randomized steps with injected copy failures and bad selections.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "step/device_step_fixture.h"
#include "test_seed.h"
#include "tp/tp_fixture.h"
#include "ula/backend.h"
#include "ula/device_step.h"
#include "ula/tp_step_planner.h"

namespace ula {
namespace {

using testing::DeviceIo;
using testing::ExpectSameState;
using testing::Shape;
using testing::StepInputs;

constexpr std::uint32_t kEntry = 48, kGroups = 2;
constexpr std::uint32_t kMaxBatch = 4, kMaxQ = 2, kMaxTopK = 24;

TpConfig Config(std::uint32_t ranks, std::uint32_t device) {
  TpConfig c = testing::SmallTpConfig(ranks, device, /*host=*/200, /*buffer=*/0, kGroups, kEntry);
  c.attention = TpAttention::kAtHome;
  c.policy = PolicyKind::kKernelPbLru;
  c.policy_options.recent_buckets = 3;
  return testing::TpEngineModes(c);
}

// Requests 1..5 with tokens allocated over several rounds (shards fill, older entries go to
// host), request 6 adopting request 1's first tokens, request 2 freed (an unknown request).
std::unique_ptr<TpAddressSpace> BuildSpace(Backend& backend, std::uint32_t ranks, std::uint32_t device,
                                           std::uint64_t seed) {
  auto space = TpAddressSpace::Create(Config(ranks, device), backend).value();
  std::mt19937_64 rng(seed);
  for (std::uint32_t r = 1; r <= 5; ++r) EXPECT_TRUE(space->AddRequest(RequestId(r)));
  for (int round = 0; round < 6; ++round) {
    for (std::uint32_t r = 1; r <= 5; ++r) {
      EXPECT_TRUE(space->Allocate(RequestId(r), 2 + static_cast<std::uint32_t>(rng() % 7)).has_value());
    }
    space->AdvanceRound();
  }
  const auto base = space->AddressesOf(RequestId(1)).value();
  const std::vector<LogicalAddr> shared(base.begin(), base.begin() + 5);
  EXPECT_TRUE(space->AddRequest(RequestId(6)));
  EXPECT_TRUE(space->ShareInto(RequestId(6), shared));
  EXPECT_TRUE(space->Free(RequestId(2)));
  space->AdvanceRound();
  return space;
}


// Random rows of the live requests' addresses (duplicates, padding), sometimes one bad
// selection: fault 1 a value < -1, 2 not live, 3 another request's, 4 a freed request, 5 a
// value < -1 after a stale address (every value is checked before any address).
StepInputs RandomStep(std::mt19937_64& rng, const TpAddressSpace& space, int fault, bool wide) {
  StepInputs in;
  Shape& s = in.shape;
  s.batch = wide ? kMaxBatch : 1 + static_cast<std::uint32_t>(rng() % kMaxBatch);
  s.q_len = wide ? kMaxQ : 1 + static_cast<std::uint32_t>(rng() % kMaxQ);
  s.top_k = wide ? kMaxTopK : 8 * (1 + static_cast<std::uint32_t>(rng() % 3));
  s.sel_stride = s.top_k + static_cast<std::uint32_t>(rng() % 3);
  s.idx_stride = s.top_k + static_cast<std::uint32_t>(rng() % 2);
  const std::uint32_t live[] = {1, 3, 4, 5, 6};
  for (std::uint32_t b = 0; b < s.batch; ++b) in.requests.push_back(RequestId(live[rng() % 5]));
  in.dense.assign(std::size_t{s.rows()} * s.top_k, -1);
  for (std::uint32_t r = 0; r < s.rows(); ++r) {
    const auto addrs = space.AddressesOf(in.requests[r / s.q_len]).value();
    const std::uint32_t used = wide ? s.top_k : 1 + static_cast<std::uint32_t>(rng() % s.top_k);
    for (std::uint32_t c = 0; c < used; ++c) {
      in.dense[std::size_t{r} * s.top_k + c] = static_cast<std::int32_t>(addrs[rng() % addrs.size()].value());
    }
  }
  const std::size_t at = rng() % in.dense.size();
  const std::size_t row_of_at = at / (std::size_t{s.q_len} * s.top_k);
  switch (fault) {
    case 1: in.dense[at] = -7; break;
    case 2: in.dense[at] = 1 << 20; break;
    case 3:
      in.dense[at] = static_cast<std::int32_t>(space.AddressesOf(RequestId(5)).value()[0].value());
      in.requests[row_of_at] = RequestId(3);
      break;
    case 4:
      in.requests[row_of_at] = RequestId(2);
      in.dense[at] = static_cast<std::int32_t>(space.AddressesOf(RequestId(1)).value()[0].value());
      break;
    case 5:
      in.dense[0] = 1 << 20;
      in.dense.back() = -7;
      break;
    default: break;
  }
  return in;
}

// Every rank's device steps of one space, and the engine's agreement.
struct Ranks {
  std::vector<std::vector<std::unique_ptr<DeviceStep>>> steps;  // [rank][group]
  std::vector<DeviceIo> io;                                       // [rank]
  std::vector<std::uint32_t> verdicts;                          // [rank] of the last Check
  // Check on every rank, the MAX of the verdicts, Claim on every rank with it.
  void Plan(GroupId g, const StepInputs& in, std::uint32_t* agreed) {
    verdicts.assign(steps.size(), 0);
    for (std::size_t r = 0; r < steps.size(); ++r) {
      io[r].Fill(in.shape, in.dense, in.requests, steps[r][g.value()]->max_descriptors());
      ASSERT_TRUE(steps[r][g.value()]->Check(io[r].arrays, nullptr));
      verdicts[r] = *steps[r][g.value()]->verdict();  // valid until Claim
    }
    *agreed = 0;
    for (std::uint32_t v : verdicts) *agreed = std::max(*agreed, v);
    for (auto& s : steps) ASSERT_TRUE(s[g.value()]->Claim(agreed, nullptr));
  }
};

Ranks MakeRanks(const TpAddressSpace& space, const DeviceStepConfig& dc) {
  Ranks k;
  const std::uint32_t p = space.config().num_ranks;
  k.steps.resize(p);
  k.io.resize(p);
  for (std::uint32_t r = 0; r < p; ++r) {
    for (std::uint32_t g = 0; g < kGroups; ++g) k.steps[r].push_back(DeviceStep::Create(space, Rank(r), GroupId(g), dc).value());
  }
  return k;
}

DeviceStepConfig StepConfig(std::uint32_t threads) {
  DeviceStepConfig dc;
  dc.threads = threads;
  dc.max_rows = kMaxBatch * kMaxQ;
  dc.max_batch = kMaxBatch;
  dc.max_top_k = kMaxTopK;
  return dc;
}

void RunDifferential(std::uint32_t ranks, std::uint32_t threads, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto backend = MakeCpuBackend();
  auto ref = BuildSpace(*backend, ranks, 20 + static_cast<std::uint32_t>(rng() % 12), rng());
  const EngineStepConfig ec{.max_batch = kMaxBatch, .max_q_len = kMaxQ, .max_top_k = kMaxTopK};
  auto planner = TpStepPlanner::Create(*ref, ec).value();
  const DeviceStepConfig dc = StepConfig(threads);
  Ranks k = MakeRanks(*ref, dc);
  std::vector<std::int32_t> ref_indices;
  std::vector<CopyDescriptor> ref_desc(planner->max_descriptors());
  int planned = 0, refused = 0, refused_by_agreement = 0, failed_copies = 0, evictions = 0, elsewhere = 0;
  for (int s = 0; s < 60; ++s) {
    const GroupId g(static_cast<std::uint32_t>(rng() % kGroups));
    const int fault = rng() % 5 == 0 ? 1 + static_cast<int>(rng() % 5) : 0;
    const StepInputs in = RandomStep(rng, *ref, fault, /*wide=*/rng() % 6 == 0);
    const std::size_t n = in.dense.size();
    ref_indices.assign(ranks * n, -9);
    auto plan = planner->Plan(g, {in.shape.batch, in.shape.q_len, in.shape.top_k}, in.requests, in.dense, ref_indices,
                              ref_desc);
    std::vector<DeviceStepState> before;
    for (auto& r : k.steps) before.push_back(r[g.value()]->ReadState(nullptr).value());
    std::uint32_t agreed = 0;
    k.Plan(g, in, &agreed);
    const std::string where = "step " + std::to_string(s) + " seed " + std::to_string(seed);
    if (!plan) {
      ++refused;
      ASSERT_NE(agreed, 0u) << plan.error().ToString() << " " << where;
      bool first = true;
      for (std::uint32_t r = 0; r < ranks; ++r) {
        const StepRecord& rec = k.io[r].record;
        ASSERT_GE(rec.done, 1u);
        const std::uint32_t own = k.verdicts[r];
        if (own != 0 && first) {  // the first refusing rank names the reference's error
          EXPECT_EQ(own, 1 + static_cast<std::uint32_t>(plan.error().code())) << plan.error().ToString() << " " << where;
          first = false;
        }
        if (own == 0) ++refused_by_agreement;
        if (plan.error().code() != ErrorCode::kResourceExhausted) {  // the directory is every rank's: all see it
          EXPECT_EQ(own, 1 + static_cast<std::uint32_t>(plan.error().code())) << "rank " << r << " " << where;
        }
        EXPECT_EQ(rec.error, own != 0 ? own : 1 + static_cast<std::uint32_t>(ErrorCode::kFailedPrecondition)) << where;
        std::vector<std::uint8_t> none(k.steps[r][g.value()]->max_descriptors(), 0);
        ASSERT_TRUE(k.steps[r][g.value()]->Complete(none.data(), nullptr));
        for (std::int32_t x : k.io[r].indices) ASSERT_EQ(x, -9) << "a refused step writes no index, " << where;
        ExpectSameState(before[r], k.steps[r][g.value()]->ReadState(nullptr).value(), "a refused step changes nothing, " + where);
      }
      continue;
    }
    ++planned;
    ASSERT_EQ(agreed, 0u) << where;
    std::uint64_t non_pad = 0;
    for (std::int32_t x : in.dense) non_pad += x != -1;
    std::uint32_t first_desc = 0;
    std::vector<std::uint8_t> status(plan->num_descriptors, 0);
    if (rng() % 3 == 0) {
      for (auto& x : status) x = rng() % 3 == 0 ? 1 : 0;
    }
    for (std::uint32_t r = 0; r < ranks; ++r) {
      const StepRecord& rec = k.io[r].record;
      const StepStats& st = plan->stats[r];
      ASSERT_EQ(rec.error, 0u) << where;
      EXPECT_EQ(rec.selections, non_pad) << where;
      EXPECT_EQ(rec.hits, st.hits) << where;
      EXPECT_EQ(rec.misses, st.misses) << where;
      EXPECT_EQ(rec.evictions, st.evictions) << where;
      EXPECT_EQ(rec.distinct, st.hits + st.misses) << where;
      EXPECT_EQ(rec.distinct + st.elsewhere, st.distinct) << where;
      EXPECT_EQ(rec.bytes_moved, st.bytes_moved) << where;
      ASSERT_EQ(rec.num_descriptors, st.misses) << where;
      evictions += static_cast<int>(st.evictions);
      elsewhere += static_cast<int>(st.elsewhere);
      for (std::uint32_t i = 0; i < rec.num_descriptors; ++i) {
        ASSERT_EQ(std::memcmp(&k.io[r].descriptors[i], &ref_desc[first_desc + i], sizeof(CopyDescriptor)), 0)
            << "rank " << r << " descriptor " << i << " " << where;
      }
      for (std::uint32_t row = 0; row < in.shape.rows(); ++row) {
        for (std::uint32_t c = 0; c < in.shape.top_k; ++c) {
          ASSERT_EQ(k.io[r].indices[std::size_t{row} * in.shape.idx_stride + c],
                    ref_indices[r * n + std::size_t{row} * in.shape.top_k + c])
              << "rank " << r << " row " << row << " col " << c << " " << where;
        }
      }
      std::vector<std::uint8_t> mine(k.steps[r][g.value()]->max_descriptors(), 0);
      std::copy_n(status.begin() + first_desc, rec.num_descriptors, mine.begin());
      ASSERT_TRUE(k.steps[r][g.value()]->Complete(mine.data(), nullptr));
      first_desc += rec.num_descriptors;
    }
    ASSERT_EQ(first_desc, plan->num_descriptors) << where;
    const auto report = planner->Complete(plan->fence, status).value();
    failed_copies += static_cast<int>(report.failed);
    std::uint32_t published = 0, failed = 0;
    for (auto& r : k.steps) {
      const DeviceStepState st = r[g.value()]->ReadState(nullptr).value();
      published += st.published;
      failed += st.failed;
    }
    EXPECT_EQ(published, report.published) << where;
    EXPECT_EQ(failed, report.failed) << where;
    if (rng() % 2 == 0) {
      ref->AdvanceRound();
      for (auto& r : k.steps) {
        for (auto& step : r) ASSERT_TRUE(step->AdvanceRound(nullptr));
      }
    }
    ASSERT_TRUE(ref->CheckInvariants()) << where;
    // Every shard's device state equals a fresh copy of the reference's (home table, pools,
    // PB-LRU's stamps, buckets and clock): both groups, the stepped one and the other.
    for (std::uint32_t r = 0; r < ranks; ++r) {
      for (std::uint32_t gg = 0; gg < kGroups; ++gg) {
        auto fresh = DeviceStep::Create(*ref, Rank(r), GroupId(gg), dc).value();
        ExpectSameState(k.steps[r][gg]->ReadState(nullptr).value(), fresh->ReadState(nullptr).value(),
                        "rank " + std::to_string(r) + " group " + std::to_string(gg) + " vs the reference, " + where);
      }
    }
    ASSERT_FALSE(::testing::Test::HasFailure()) << where;
  }
  std::printf("[ tp device step ] %u ranks: %d planned, %d refused (%d rank refusals by agreement), %d failed copies, "
              "%d evictions, %d selections elsewhere\n", ranks, planned, refused, refused_by_agreement, failed_copies,
              evictions, elsewhere);
  EXPECT_GT(planned, 25);
  EXPECT_GT(refused, 6);
  EXPECT_GT(refused_by_agreement, 0) << "no step was refused by one rank and agreed by the others";
  EXPECT_GT(failed_copies, 3);
  EXPECT_GT(evictions, 10);
  EXPECT_GT(elsewhere, 50);
}

TEST(TpDeviceStep, MatchesTpStepPlannerOnTwoRanks) {
  ULA_TEST_SEEDED(seed, 20261202);
  RunDifferential(2, 1, seed);
}

TEST(TpDeviceStep, MatchesTpStepPlannerOnThreeRanksAndTwoThreads) {
  ULA_TEST_SEEDED(seed, 20261203);
  RunDifferential(3, 2, seed);
}

// One rank's shard has no room for its misses, the other's has: the first refuses
// (kResourceExhausted), the other refuses by agreement (kFailedPrecondition); neither moves.
// Claimed with its own verdict instead, the other rank would plan: why the all-reduce is needed.
TEST(TpDeviceStep, OneRanksRoomRefusalRefusesEveryRank) {
  auto backend = MakeCpuBackend();
  auto space = BuildSpace(*backend, 2, 8, 3);
  const GroupId g(0);
  Ranks k = MakeRanks(*space, StepConfig(1));
  // Request 1's addresses homed on rank 0: more than its 8 device slots; one of rank 1's.
  StepInputs in;
  in.shape = {.batch = 1, .q_len = 1, .top_k = 24, .sel_stride = 24, .idx_stride = 24};
  in.requests = {RequestId(1)};
  in.dense.assign(24, -1);
  const auto addrs = space->AddressesOf(RequestId(1)).value();
  std::size_t c = 0;
  std::int32_t theirs = -1;
  for (LogicalAddr a : addrs) {
    if (a.value() % 2 == 0 && c < 23) in.dense[c++] = static_cast<std::int32_t>(a.value());
    if (a.value() % 2 == 1 && theirs < 0) theirs = static_cast<std::int32_t>(a.value());
  }
  ASSERT_GT(c, 9u);
  in.dense[c] = theirs;
  const DeviceStepState before0 = k.steps[0][0]->ReadState(nullptr).value(), before1 = k.steps[1][0]->ReadState(nullptr).value();
  std::uint32_t agreed = 0;
  k.Plan(g, in, &agreed);
  EXPECT_EQ(k.verdicts[0], 1 + static_cast<std::uint32_t>(ErrorCode::kResourceExhausted));
  EXPECT_EQ(k.verdicts[1], 0u) << "rank 1's shard has room";
  EXPECT_EQ(k.io[0].record.error, 1 + static_cast<std::uint32_t>(ErrorCode::kResourceExhausted));
  EXPECT_EQ(k.io[1].record.error, 1 + static_cast<std::uint32_t>(ErrorCode::kFailedPrecondition));
  std::vector<std::uint8_t> none(64, 0);
  for (auto& r : k.steps) ASSERT_TRUE(r[0]->Complete(none.data(), nullptr));
  ExpectSameState(before0, k.steps[0][0]->ReadState(nullptr).value(), "rank 0");
  ExpectSameState(before1, k.steps[1][0]->ReadState(nullptr).value(), "rank 1");
  // The other rank alone, with its own verdict: it would plan.
  ASSERT_TRUE(k.steps[1][0]->Check(k.io[1].arrays, nullptr));
  ASSERT_TRUE(k.steps[1][0]->Claim(k.steps[1][0]->verdict(), nullptr));
  EXPECT_EQ(k.io[1].record.error, 0u);
  ASSERT_TRUE(k.steps[1][0]->Complete(none.data(), nullptr));
  // The reference refuses the step with rank 0's error.
  auto planner = TpStepPlanner::Create(*space, {.max_batch = 1, .max_q_len = 1, .max_top_k = 24}).value();
  std::vector<std::int32_t> idx(48);
  std::vector<CopyDescriptor> desc(planner->max_descriptors());
  auto plan = planner->Plan(g, {1, 1, 24}, in.requests, in.dense, idx, desc);
  ASSERT_FALSE(plan);
  EXPECT_EQ(plan.error().code(), ErrorCode::kResourceExhausted) << plan.error().ToString();
}

// Fewer descriptor rows than this rank's misses: kResourceExhausted (TpStepPlanner's
// refusal of a short descriptor array), nothing changes; every copy failing publishes nothing
// and loses nothing.
TEST(TpDeviceStep, ShortDescriptorArrayAndFailedCopies) {
  auto backend = MakeCpuBackend();
  auto space = BuildSpace(*backend, 2, 24, 5);
  Ranks k = MakeRanks(*space, StepConfig(1));
  StepInputs in;
  in.shape = {.batch = 1, .q_len = 1, .top_k = 24, .sel_stride = 24, .idx_stride = 24};
  in.requests = {RequestId(3)};
  in.dense.assign(24, -1);
  const auto addrs = space->AddressesOf(RequestId(3)).value();
  for (std::size_t i = 0; i < addrs.size() && i < 24; ++i) in.dense[i] = static_cast<std::int32_t>(addrs[i].value());
  DeviceStep& step = *k.steps[0][1];
  DeviceIo& io = k.io[0];
  io.Fill(in.shape, in.dense, in.requests, 1);
  const DeviceStepState before = step.ReadState(nullptr).value();
  ASSERT_TRUE(step.Check(io.arrays, nullptr));
  ASSERT_TRUE(step.Claim(step.verdict(), nullptr));
  EXPECT_EQ(io.record.error, 1 + static_cast<std::uint32_t>(ErrorCode::kResourceExhausted))
      << "the request's entries on rank 0 are partly on host: more than one miss";
  std::vector<std::uint8_t> status(step.max_descriptors(), 1);
  ASSERT_TRUE(step.Complete(status.data(), nullptr));
  ExpectSameState(before, step.ReadState(nullptr).value(), "a short descriptor array changes nothing");
  io.Fill(in.shape, in.dense, in.requests, step.max_descriptors());
  ASSERT_TRUE(step.Check(io.arrays, nullptr));
  ASSERT_TRUE(step.Claim(step.verdict(), nullptr));
  ASSERT_EQ(io.record.error, 0u);
  ASSERT_GT(io.record.misses, 1u);
  ASSERT_TRUE(step.Complete(status.data(), nullptr));  // every copy failed
  const DeviceStepState after = step.ReadState(nullptr).value();
  EXPECT_EQ(after.published, 0u);
  EXPECT_EQ(after.failed, io.record.misses);
  EXPECT_EQ(after.records, before.records) << "a failed copy publishes nothing";
  EXPECT_EQ(after.device_owner, before.device_owner);
  EXPECT_EQ(after.device_free, before.device_free) << "a failed copy's free slot is free again";
  EXPECT_EQ(after.host_free, before.host_free) << "no host slot is freed";
}

TEST(TpDeviceStep, BadArgumentsAreRefused) {
  auto backend = MakeCpuBackend();
  auto space = BuildSpace(*backend, 2, 24, 9);
  const DeviceStepConfig dc = StepConfig(1);
  EXPECT_EQ(DeviceStep::Create(*space, Rank(2), GroupId(0), dc).error().code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(DeviceStep::Create(*space, Rank(0), GroupId(2), dc).error().code(), ErrorCode::kOutOfRange);
  {
    TpConfig c = Config(2, 24);
    c.policy = PolicyKind::kPbLru;
    auto pb = TpAddressSpace::Create(c, *backend).value();
    EXPECT_EQ(DeviceStep::Create(*pb, Rank(0), GroupId(0), dc).error().code(), ErrorCode::kFailedPrecondition);
    TpConfig b = testing::SmallTpConfig(2, 24, 200, 8, kGroups, kEntry);
    b.attention = TpAttention::kLocalBuffer;
    b.policy = PolicyKind::kKernelPbLru;
    auto buffered = TpAddressSpace::Create(b, *backend).value();
    EXPECT_EQ(DeviceStep::Create(*buffered, Rank(0), GroupId(0), dc).error().code(), ErrorCode::kFailedPrecondition);
    auto one = TpAddressSpace::Create(Config(2, 24), *backend, std::vector<Rank>{Rank(1)}).value();
    EXPECT_EQ(DeviceStep::Create(*one, Rank(0), GroupId(0), dc).error().code(), ErrorCode::kFailedPrecondition)
        << "a rank this process does not host";
    ASSERT_TRUE(one->AddRequest(RequestId(1)));
    ASSERT_TRUE(one->Allocate(RequestId(1), 200).has_value());  // rank 1's shard full: new entries on host
    auto pending = DeviceStep::Create(*one, Rank(1), GroupId(0), dc);
    if (!pending) {
      EXPECT_EQ(pending.error().code(), ErrorCode::kFailedPrecondition) << pending.error().ToString();
    }
  }
  auto step = DeviceStep::Create(*space, Rank(1), GroupId(0), dc).value();
  DeviceIo io;
  const std::vector<std::int32_t> dense(8, -1);
  io.Fill({.batch = 1, .q_len = 1, .top_k = 8, .sel_stride = 8, .idx_stride = 8}, dense, {RequestId(1)},
          step->max_descriptors());
  const DeviceStepState before = step->ReadState(nullptr).value();
  EXPECT_EQ(step->Plan(io.arrays, nullptr).error().code(), ErrorCode::kFailedPrecondition)
      << "two ranks: Plan would skip the agreement";
  std::uint32_t zero = 0;
  EXPECT_EQ(step->Claim(&zero, nullptr).error().code(), ErrorCode::kFailedPrecondition) << "no Check pending";
  StepArrays big = io.arrays;
  big.top_k = kMaxTopK + 1;
  EXPECT_EQ(step->Check(big, nullptr).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(io.record.done, 0u) << "a refused call enqueues nothing";
  ASSERT_TRUE(step->Check(io.arrays, nullptr));
  EXPECT_EQ(step->Check(io.arrays, nullptr).error().code(), ErrorCode::kFailedPrecondition) << "a check is pending";
  EXPECT_EQ(step->AdvanceRound(nullptr).error().code(), ErrorCode::kFailedPrecondition);
  std::vector<std::uint8_t> status(step->max_descriptors(), 0);
  EXPECT_EQ(step->Complete(status.data(), nullptr).error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(step->Claim(nullptr, nullptr).error().code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(step->Claim(step->verdict(), nullptr));
  ASSERT_TRUE(step->Complete(status.data(), nullptr));
  EXPECT_EQ(io.record.error, 0u);
  EXPECT_EQ(io.record.distinct, 0u) << "padding only";
  ExpectSameState(before, step->ReadState(nullptr).value(), "refused calls and a padding-only step change nothing");
}

// The CUDA form against the OpenMP form, 2 ranks, on the same steps (scripts/gpu-check.sh runs
// it on a GPU; skipped where MakeCudaBackend finds no device or the build has no CUDA). The
// engine's arrays, the status and the agreed verdict live in the cuda backend's pinned, mapped
// host memory; the verdicts are read back with ReadState (which synchronises) and reduced here,
// where an engine would all-reduce them on the stream.
TEST(TpDeviceStep, CudaFormMatchesOpenMpForm) {
  auto cuda = MakeCudaBackend();
  if (!cuda) GTEST_SKIP() << cuda.error().ToString();
  auto backend = MakeCpuBackend();
  auto space = BuildSpace(*backend, 2, 24, 17);
  DeviceStepConfig dc = StepConfig(1);
  Ranks host = MakeRanks(*space, dc);
  dc.cuda = true;
  std::vector<std::unique_ptr<DeviceStep>> dev;
  for (std::uint32_t r = 0; r < 2; ++r) {
    auto made = DeviceStep::Create(*space, Rank(r), GroupId(0), dc);
    ASSERT_TRUE(made) << made.error().ToString();
    dev.push_back(std::move(*made));
  }
  const std::uint32_t n = kMaxBatch * kMaxQ * (kMaxTopK + 3), nd = dev[0]->max_descriptors();
  const std::uint64_t per_rank = std::uint64_t{n} * 8 + kMaxBatch * 8 + std::uint64_t{nd} * (sizeof(CopyDescriptor) + 1) +
                                 sizeof(StepRecord) + 1024;
  auto arena = (*cuda)->CreateArena(Tier::kHost, Rank(0), 2 * per_rank + 4096).value();
  std::byte* p = arena.data;
  auto carve = [&](std::size_t b) {
    std::byte* at = p;
    p += (b + 63) / 64 * 64;
    return at;
  };
  auto* agreed = reinterpret_cast<std::uint32_t*>(carve(4));
  struct DevIo {
    std::int32_t *sel, *idx;
    std::int64_t* req;
    CopyDescriptor* desc;
    std::uint8_t* status;
    StepRecord* rec;
  };
  std::vector<DevIo> d(2);
  for (auto& x : d) {
    x.sel = reinterpret_cast<std::int32_t*>(carve(std::size_t{n} * 4));
    x.idx = reinterpret_cast<std::int32_t*>(carve(std::size_t{n} * 4));
    x.req = reinterpret_cast<std::int64_t*>(carve(kMaxBatch * 8));
    x.desc = reinterpret_cast<CopyDescriptor*>(carve(std::size_t{nd} * sizeof(CopyDescriptor)));
    x.status = reinterpret_cast<std::uint8_t*>(carve(nd));
    x.rec = reinterpret_cast<StepRecord*>(carve(sizeof(StepRecord)));
  }
  std::mt19937_64 rng(29);
  for (int s = 0; s < 30; ++s) {
    const StepInputs in = RandomStep(rng, *space, s % 5 == 4 ? 1 + s % 5 : 0, /*wide=*/s % 7 == 3);
    std::uint32_t host_agreed = 0;
    host.Plan(GroupId(0), in, &host_agreed);
    std::uint32_t max = 0;
    for (std::uint32_t r = 0; r < 2; ++r) {
      DeviceIo io;
      io.Fill(in.shape, in.dense, in.requests, nd);
      std::memcpy(d[r].sel, io.selections.data(), io.selections.size() * 4);
      std::memcpy(d[r].idx, io.indices.data(), io.indices.size() * 4);
      std::memcpy(d[r].req, io.requests.data(), io.requests.size() * 8);
      *d[r].rec = StepRecord{};
      StepArrays da = io.arrays;
      da.selections = d[r].sel;
      da.requests = d[r].req;
      da.indices = d[r].idx;
      da.descriptors = d[r].desc;
      da.stats = d[r].rec;
      ASSERT_TRUE(dev[r]->Check(da, nullptr));
      max = std::max(max, dev[r]->ReadState(nullptr).value().error);
    }
    ASSERT_EQ(max, host_agreed) << "step " << s;
    *agreed = max;
    std::vector<std::uint8_t> status(nd, 0);
    for (auto& x : status) x = rng() % 7 == 0 ? 1 : 0;
    for (std::uint32_t r = 0; r < 2; ++r) {
      ASSERT_TRUE(dev[r]->Claim(agreed, nullptr));
      std::memcpy(d[r].status, status.data(), nd);
      ASSERT_TRUE(dev[r]->Complete(d[r].status, nullptr));
      ASSERT_TRUE(host.steps[r][0]->Complete(status.data(), nullptr));
      if (s % 3 == 2) {
        ASSERT_TRUE(dev[r]->AdvanceRound(nullptr));
        ASSERT_TRUE(host.steps[r][0]->AdvanceRound(nullptr));
      }
      const DeviceStepState hs = host.steps[r][0]->ReadState(nullptr).value(), ds = dev[r]->ReadState(nullptr).value();  // syncs
      const DeviceIo& io = host.io[r];
      ASSERT_EQ(d[r].rec->error, io.record.error) << "rank " << r << " step " << s;
      ASSERT_EQ(d[r].rec->misses, io.record.misses) << "rank " << r << " step " << s;
      ASSERT_EQ(d[r].rec->hits, io.record.hits) << "rank " << r << " step " << s;
      ASSERT_EQ(d[r].rec->evictions, io.record.evictions) << "rank " << r << " step " << s;
      ASSERT_EQ(std::memcmp(d[r].idx, io.indices.data(), io.indices.size() * 4), 0) << "indices, rank " << r << " step " << s;
      ASSERT_EQ(std::memcmp(d[r].desc, io.descriptors.data(), std::size_t{io.record.num_descriptors} * sizeof(CopyDescriptor)), 0)
          << "descriptors, rank " << r << " step " << s;
      ExpectSameState(hs, ds, "CUDA form vs OpenMP form, rank " + std::to_string(r));
      ASSERT_EQ(hs.published, ds.published);
    }
    ASSERT_FALSE(::testing::Test::HasFailure()) << "step " << s;
  }
  for (auto& x : dev) EXPECT_EQ(x->arena_overflows(), 0u);
  ASSERT_TRUE((*cuda)->DestroyArena(arena.id));
}

}  // namespace
}  // namespace ula

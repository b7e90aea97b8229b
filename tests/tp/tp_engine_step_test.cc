// TpStepPlanner (include/ula/tp_step_planner.h): per-rank FlashMLA index arrays of a
// TP step, checked against TpStepPlanner's refs on a twin space and against the reference
// attention (at home: every rank's partial over its own indices, merged in rank order;
// local buffer: every rank's attention through its indices over the whole selection).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/fault_backend.h"
#include "test_seed.h"
#include "tp/tp_fixture.h"
#include "ula/partial_attention.h"
#include "ula/reference_attention.h"
#include "ula/tp_step_planner.h"

namespace ula {
namespace {

constexpr MlaShape kShape{4, 16, 8, 0.25f};  // entry: 4 * (16 + 8) = 96 bytes

struct Twin {
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  std::unique_ptr<TpAddressSpace> space;
};

Twin MakeTwin(TpAttention attention) {
  TpConfig c = testing::SmallTpConfig(/*ranks=*/2, /*device=*/40, /*host=*/96,
                                      attention == TpAttention::kAtHome ? 0 : 40, /*groups=*/2, kShape.entry_bytes());
  c.attention = attention;
  c.stable_new_entries = true;  // the engine path's mode
  Twin t;
  t.space = TpAddressSpace::Create(c, *t.backend).value();
  return t;
}

std::vector<std::byte> EntryOf(LogicalAddr a, std::uint32_t group) {
  std::mt19937 rng(a.value() * 7919u + group);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(kShape.kv_lora_rank + kShape.rope_dim);
  for (float& x : v) x = d(rng);
  std::vector<std::byte> b(kShape.entry_bytes());
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// The same requests, addresses and bytes in both spaces.
std::vector<std::vector<LogicalAddr>> Fill(TpAddressSpace& s, std::uint32_t requests, std::uint32_t tokens) {
  std::vector<std::vector<LogicalAddr>> addrs;
  for (std::uint32_t r = 0; r < requests; ++r) {
    EXPECT_TRUE(s.AddRequest(RequestId(r)));
    addrs.push_back(s.Allocate(RequestId(r), tokens).value());
    for (LogicalAddr a : addrs.back()) {
      for (std::uint32_t g = 0; g < 2; ++g) EXPECT_TRUE(s.Write(a, GroupId(g), EntryOf(a, g)));
    }
  }
  s.AdvanceRound();
  return addrs;
}

// selections [batch][q_len][top_k]: distinct addresses of the row's request, padding at
// the tail of some queries.
std::vector<std::int32_t> Select(std::mt19937_64& rng, const std::vector<std::vector<LogicalAddr>>& addrs,
                                 const StepShape& shape) {
  std::vector<std::int32_t> sel(shape.size(), kPadIndex);
  for (std::uint32_t b = 0; b < shape.batch; ++b) {
    for (std::uint32_t q = 0; q < shape.q_len; ++q) {
      std::vector<LogicalAddr> pool = addrs[b];
      std::shuffle(pool.begin(), pool.end(), rng);
      const std::uint32_t k = shape.top_k - static_cast<std::uint32_t>(rng() % 3);
      for (std::uint32_t j = 0; j < k; ++j) {
        sel[(std::size_t{b} * shape.q_len + q) * shape.top_k + j] = static_cast<std::int32_t>(pool[j].value());
      }
    }
  }
  return sel;
}

std::vector<float> Query(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> q(kShape.query_values());
  for (float& x : q) x = d(rng);
  return q;
}

class TpEngineStepTest : public ::testing::TestWithParam<TpAttention> {};

TEST_P(TpEngineStepTest, IndicesMatchTheTpPlannerAndAttentionMatchesTheReference) {
  ULA_TEST_SEEDED(seed, 20261201);
  std::mt19937_64 rng(seed);
  const TpAttention attention = GetParam();
  Twin a = MakeTwin(attention), b = MakeTwin(attention);
  const auto addrs = Fill(*a.space, 3, 40);
  ASSERT_EQ(Fill(*b.space, 3, 40), addrs);
  auto engine = TpStepPlanner::Create(*a.space, {3, 2, 8}).value();
  TpStepPlanner twin(*b.space);
  ASSERT_EQ(engine->ranks().size(), 2u);
  const std::uint32_t device = a.space->config().device_slots_per_group();
  ASSERT_EQ(engine->device_slots(), device);
  ASSERT_EQ(engine->index_slots(), attention == TpAttention::kAtHome ? device : 2 * device);
  const StepShape shape{3, 2, 8};
  std::uint64_t elsewhere = 0, buffered = 0;
  for (int step = 0; step < 12; ++step) {
    const GroupId group(static_cast<std::uint16_t>(step % 2));
    const auto sel = Select(rng, addrs, shape);
    std::vector<std::int32_t> indices(2 * shape.size(), 12345);
    auto stats = engine->Step(group, shape, std::vector<RequestId>{RequestId(0), RequestId(1), RequestId(2)}, sel,
                              indices);
    ASSERT_TRUE(stats) << stats.error().message();
    // The twin: the same step as TpStepPlanner's selections and runs (padding dropped).
    std::vector<LogicalAddr> compact;
    std::vector<std::size_t> where;
    std::vector<SelectionRun> runs;
    for (std::uint32_t r = 0; r < shape.batch; ++r) {
      std::uint32_t count = 0;
      for (std::size_t i = r * 16; i < (r + 1) * 16; ++i) {
        if (sel[i] < 0) continue;
        compact.push_back(LogicalAddr(static_cast<std::uint32_t>(sel[i])));
        where.push_back(i);
        ++count;
      }
      runs.push_back({RequestId(r), count});
    }
    auto plan = twin.Step(group, compact, runs);
    ASSERT_TRUE(plan);
    ASSERT_EQ(*stats, plan->stats);
    for (std::size_t rank = 0; rank < 2; ++rank) {
      std::vector<std::int32_t> want(shape.size(), kPadIndex);
      for (std::size_t j = 0; j < compact.size(); ++j) {
        const TpReadRef& ref = plan->refs[rank][j];
        if (ref.source == TpReadRef::Source::kShard) want[where[j]] = static_cast<std::int32_t>(ref.slot.value());
        if (ref.source == TpReadRef::Source::kBuffer) {
          want[where[j]] = static_cast<std::int32_t>(device + ref.slot.value());
          ++buffered;
        }
        if (ref.source == TpReadRef::Source::kElsewhere) ++elsewhere;
      }
      ASSERT_EQ(std::vector<std::int32_t>(indices.begin() + rank * shape.size(),
                                          indices.begin() + (rank + 1) * shape.size()),
                want)
          << "rank " << rank << " step " << step;
    }
    // Attention per query through the index arrays, as FlashMLA would read them.
    auto read = [&](std::size_t rank, std::int32_t index) -> const std::byte* {
      const TpReadRef ref = static_cast<std::uint32_t>(index) < device
                                ? TpReadRef{TpReadRef::Source::kShard, SlotId(static_cast<std::uint32_t>(index)),
                                            Rank(static_cast<std::uint16_t>(rank))}
                                : TpReadRef{TpReadRef::Source::kBuffer,
                                            SlotId(static_cast<std::uint32_t>(index) - device),
                                            Rank(static_cast<std::uint16_t>(rank))};
      return a.space->RefData(Rank(static_cast<std::uint16_t>(rank)), group, ref);
    };
    for (std::size_t row = 0; row < std::size_t{shape.batch} * shape.q_len; ++row) {
      const auto query = Query(seed + step * 100 + row);
      std::vector<std::vector<std::byte>> truth_bytes;
      std::vector<const std::byte*> truth;
      for (std::uint32_t j = 0; j < shape.top_k; ++j) {
        const std::int32_t addr = sel[row * shape.top_k + j];
        if (addr >= 0) truth_bytes.push_back(EntryOf(LogicalAddr(static_cast<std::uint32_t>(addr)), group.value()));
      }
      for (const auto& t : truth_bytes) truth.push_back(t.data());
      std::vector<float> want(kShape.output_values());
      ASSERT_TRUE(SparseMlaAttention(kShape, query, truth, want));
      if (attention == TpAttention::kAtHome) {
        std::vector<float> partials(2 * PartialValues(kShape));
        for (std::size_t rank = 0; rank < 2; ++rank) {
          std::vector<const std::byte*> mine;
          for (std::uint32_t j = 0; j < shape.top_k; ++j) {
            const std::int32_t index = indices[rank * shape.size() + row * shape.top_k + j];
            if (index < 0) continue;
            mine.push_back(read(rank, index));
            ASSERT_NE(mine.back(), nullptr);
          }
          ASSERT_TRUE(PartialMlaAttention(kShape, query, mine,
                                          std::span<float>(partials).subspan(rank * PartialValues(kShape),
                                                                             PartialValues(kShape))));
        }
        std::vector<float> merged(kShape.output_values());
        ASSERT_TRUE(MergeMlaPartials(kShape, partials, merged));
        for (std::size_t v = 0; v < want.size(); ++v) ASSERT_NEAR(merged[v], want[v], 1e-5f) << "value " << v;
      } else {
        for (std::size_t rank = 0; rank < 2; ++rank) {
          std::vector<const std::byte*> all;
          for (std::uint32_t j = 0; j < shape.top_k; ++j) {
            const std::int32_t index = indices[rank * shape.size() + row * shape.top_k + j];
            if (index < 0) continue;
            all.push_back(read(rank, index));
            ASSERT_NE(all.back(), nullptr);
          }
          std::vector<float> got(kShape.output_values());
          ASSERT_TRUE(SparseMlaAttention(kShape, query, all, got));
          ASSERT_EQ(got, want) << "rank " << rank << " row " << row;  // same entries, same order: same bits
        }
      }
    }
    a.space->AdvanceRound();
    b.space->AdvanceRound();
    ASSERT_TRUE(a.space->CheckInvariants());
  }
  if (attention == TpAttention::kAtHome) {
    EXPECT_GT(elsewhere, 0u);
  } else {
    EXPECT_GT(buffered, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Attention, TpEngineStepTest,
                         ::testing::Values(TpAttention::kAtHome, TpAttention::kLocalBuffer),
                         [](const auto& info) { return std::string(TpAttentionName(info.param)); });

TEST(TpEngineStep, RefusalsChangeNothing) {
  Twin t = MakeTwin(TpAttention::kAtHome);
  const auto addrs = Fill(*t.space, 2, 10);
  auto engine = TpStepPlanner::Create(*t.space, {2, 1, 4}).value();
  const std::vector<RequestId> requests{RequestId(0), RequestId(1)};
  const std::vector<RequestId> all{RequestId(0), RequestId(1)};
  const auto before = testing::TakeTp(*t.space, all);
  const StepShape shape{2, 1, 4};
  auto a = [&](int r, int i) { return static_cast<std::int32_t>(addrs[r][i].value()); };
  std::vector<std::int32_t> sel{a(0, 0), a(0, 1), -1, -1, a(1, 0), a(1, 1), a(1, 2), -1};
  std::vector<std::int32_t> indices(16, 777);
  auto refuse = [&](ErrorCode code, auto&& call) {
    auto r = call();
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), code) << r.error().message();
    EXPECT_EQ(indices, std::vector<std::int32_t>(16, 777));
    EXPECT_EQ(testing::TakeTp(*t.space, all), before);
  };
  refuse(ErrorCode::kInvalidArgument, [&] { return engine->Step(GroupId(0), {3, 1, 4}, requests, sel, indices); });
  {  // a shape past the config, with arrays of its size
    std::vector<std::int32_t> wide(10, kPadIndex);
    wide[0] = a(0, 0);
    std::vector<std::int32_t> wide_out(20, 777);
    auto r = engine->Step(GroupId(0), {2, 1, 5}, requests, wide, wide_out);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(wide_out, std::vector<std::int32_t>(20, 777));
    EXPECT_EQ(testing::TakeTp(*t.space, all), before);
  }
  refuse(ErrorCode::kInvalidArgument, [&] {
    return engine->Step(GroupId(0), shape, requests, sel, std::span<std::int32_t>(indices).first(8));
  });
  refuse(ErrorCode::kInvalidArgument,
         [&] { return engine->Step(GroupId(0), shape, std::span<const RequestId>(requests).first(1), sel, indices); });
  auto bad = sel;
  bad[2] = -2;
  refuse(ErrorCode::kInvalidArgument, [&] { return engine->Step(GroupId(0), shape, requests, bad, indices); });
  auto other = sel;
  other[1] = a(1, 5);  // request 1's address in request 0's row
  refuse(ErrorCode::kNotFound, [&] { return engine->Step(GroupId(0), shape, requests, other, indices); });
  refuse(ErrorCode::kOutOfRange, [&] { return engine->Step(GroupId(2), shape, requests, sel, indices); });
  EXPECT_FALSE(TpStepPlanner::Create(*t.space, {0, 1, 4}));
  auto ok = engine->Step(GroupId(0), shape, requests, sel, indices);
  ASSERT_TRUE(ok) << ok.error().message();
  EXPECT_EQ(indices[2], kPadIndex);  // padding
  for (int rank = 0; rank < 2; ++rank) {
    for (int j : {0, 1, 4, 5, 6}) {
      const bool home = t.space->HomeOf(LogicalAddr(static_cast<std::uint32_t>(sel[j]))).value() == rank;
      EXPECT_EQ(indices[rank * 8 + j] >= 0, home) << "rank " << rank << " selection " << j;
    }
  }
}

// The engine path of attention at home (tp_step_planner.h, Plan / Complete): the engine runs
// the descriptors (here ExecuteOnShards, over the space's own backend) and completes them.
// Without faults it is Step, step for step: the same indices, stats and digest as a twin
// driven by Step, under memory pressure (swaps). With injected faults (a fault-injecting
// backend under ExecuteOnShards: statuses are what really happened), a failed descriptor
// publishes nothing and loses nothing: every entry still reads its bytes, every invariant
// holds, and every index of a published selection reads its entry.
std::vector<std::int32_t> SelectFew(std::mt19937_64& rng, const std::vector<std::vector<LogicalAddr>>& addrs,
                                    const StepShape& shape) {
  std::vector<std::int32_t> sel(shape.size(), kPadIndex);
  for (std::uint32_t b = 0; b < shape.batch; ++b) {
    std::vector<LogicalAddr> pool = addrs[b];
    std::shuffle(pool.begin(), pool.end(), rng);
    for (std::uint32_t j = 0; j + 1 < shape.top_k; ++j) {  // the last one padding
      sel[std::size_t{b} * shape.top_k + j] = static_cast<std::int32_t>(pool[j].value());
    }
  }
  return sel;
}

// With the local buffer the plan has two phases (tp_step_planner.h): the remote fetches, read
// from each entry's home where it is now, then the home moves; ExecuteOnShards runs them in
// array order. Its buffer (12 slots per rank and group) is smaller than a step's remote
// misses over a few steps, so fetches evict older copies.
class TpEnginePlanTest : public ::testing::TestWithParam<TpAttention> {};

TEST_P(TpEnginePlanTest, PlanAndCompleteAreStepAndFailuresLoseNothing) {
  ULA_TEST_SEEDED(seed, 20261202);
  const TpAttention attention = GetParam();
  const bool at_home = attention == TpAttention::kAtHome;
  for (bool faults : {false, true}) {
    std::mt19937_64 rng(seed + faults);
    TpConfig c = testing::SmallTpConfig(/*ranks=*/2, /*device=*/16, /*host=*/96, /*buffer=*/at_home ? 0 : 12,
                                        /*groups=*/2, kShape.entry_bytes());
    c.attention = attention;
    c.stable_new_entries = true;  // the engine path's mode
    auto inner_a = MakeCpuBackend();
    auto fb = MakeFaultInjectingBackend(*inner_a, FaultPlan{.seed = seed, .fail_fraction = faults ? 0.25 : 0.0,
                                                            .partial = true})
                  .value();
    auto space = TpAddressSpace::Create(c, *fb).value();
    Twin twin = MakeTwin(attention);
    twin.space = TpAddressSpace::Create(c, *twin.backend).value();
    // A spare request takes device slots first; freed after the first step (before the policy
    // evicts it, its entries being the coldest), its slots make the next misses copies into
    // free slots (the rest are swaps with victims).
    for (TpAddressSpace* s : {space.get(), twin.space.get()}) {
      ASSERT_TRUE(s->AddRequest(RequestId(9)));
      ASSERT_TRUE(s->Allocate(RequestId(9), 16));
    }
    const auto addrs = Fill(*space, 3, 40);
    ASSERT_EQ(Fill(*twin.space, 3, 40), addrs);
    // 15 selections a step: at most 15 of a rank's, within its 16 device slots.
    auto engine = TpStepPlanner::Create(*space, {3, 1, 6}).value();
    auto stepper = TpStepPlanner::Create(*twin.space, {3, 1, 6}).value();
    const std::vector<RequestId> requests{RequestId(0), RequestId(1), RequestId(2)};
    const StepShape shape{3, 1, 6};
    std::vector<CopyDescriptor> descriptors(engine->max_descriptors());
    std::uint64_t swaps = 0, copies = 0, fetches = 0, failed = 0, published = 0;
    for (int step = 0; step < 40; ++step) {
      const GroupId group(static_cast<std::uint16_t>(step % 2));
      if (step == 1) {
        ASSERT_TRUE(space->Free(RequestId(9)));
        ASSERT_TRUE(twin.space->Free(RequestId(9)));
      }
      const auto sel = SelectFew(rng, addrs, shape);
      std::vector<std::int32_t> indices(2 * shape.size(), 777);
      auto planned = engine->Plan(group, shape, requests, sel, indices, descriptors);
      ASSERT_TRUE(planned) << planned.error().message();
      ASSERT_TRUE(engine->has_pending());
      std::vector<std::uint8_t> status(planned->num_descriptors, 9);
      const std::span<const CopyDescriptor> run(descriptors.data(), planned->num_descriptors);
      if (at_home) {
        EXPECT_EQ(planned->first_phase, 0u);
      }
      for (std::size_t i = 0; i < run.size(); ++i) {
        const CopyDescriptor& d = run[i];
        EXPECT_EQ(d.group, group.value());
        EXPECT_EQ(d.bytes, kShape.entry_bytes());
        if (i < planned->first_phase) {  // a remote fetch: another rank's entry into the buffer
          EXPECT_NE(d.src_rank, d.dst_rank);
          EXPECT_EQ(d.src_rank, d.addr % 2);
          EXPECT_GE(d.dst_slot, engine->device_slots());
          EXPECT_LT(d.dst_slot, engine->index_slots());
          EXPECT_EQ(d.op, static_cast<std::uint8_t>(CopyOp::kCopy));
          ++fetches;
          continue;
        }
        EXPECT_EQ(d.src_rank, d.dst_rank);
        EXPECT_LT(d.dst_slot, engine->device_slots());
        swaps += d.op == static_cast<std::uint8_t>(CopyOp::kSwap);
        copies += d.op == static_cast<std::uint8_t>(CopyOp::kCopy);
      }
      engine->ExecuteOnShards(run, status);
      auto report = engine->Complete(planned->fence, status);
      ASSERT_TRUE(report) << report.error().message();
      EXPECT_FALSE(engine->has_pending());
      EXPECT_EQ(report->published + report->failed, planned->num_descriptors);
      EXPECT_EQ(report->failed, static_cast<std::uint32_t>(std::count_if(status.begin(), status.end(),
                                                                          [](std::uint8_t x) { return x != 0; })));
      failed += report->failed;
      published += report->published;
      ASSERT_TRUE(space->CheckInvariants()) << space->CheckInvariants().error().message();
      // Nothing lost: every entry reads its bytes, wherever it is.
      for (const auto& request : addrs) {
        for (LogicalAddr a : request) {
          std::vector<std::byte> got(kShape.entry_bytes());
          ASSERT_TRUE(space->Read(a, group, got));
          ASSERT_EQ(got, EntryOf(a, group.value())) << "address " << a.value() << " step " << step;
        }
      }
      // The failed descriptors' entries are not published: their selections' indices may name
      // slots that are not theirs, so only the published ones are read here.
      std::vector<std::uint32_t> failed_addrs;
      for (std::size_t i = 0; i < status.size(); ++i) {
        if (status[i] != 0) failed_addrs.push_back(run[i].addr);
      }
      for (std::size_t rank = 0; rank < 2; ++rank) {
        for (std::size_t j = 0; j < shape.size(); ++j) {
          const std::int32_t index = indices[rank * shape.size() + j];
          if (index < 0) continue;
          const auto addr = static_cast<std::uint32_t>(sel[j]);
          if (std::find(failed_addrs.begin(), failed_addrs.end(), addr) != failed_addrs.end()) continue;
          const auto u = static_cast<std::uint32_t>(index);
          const bool shard = u < engine->device_slots();
          const std::byte* bytes = space->RefData(Rank(static_cast<std::uint16_t>(rank)), group,
                                                  TpReadRef{shard ? TpReadRef::Source::kShard : TpReadRef::Source::kBuffer,
                                                            SlotId(shard ? u : u - engine->device_slots()),
                                                            Rank(static_cast<std::uint16_t>(rank))});
          ASSERT_NE(bytes, nullptr);
          ASSERT_EQ(std::memcmp(bytes, EntryOf(LogicalAddr(addr), group.value()).data(), kShape.entry_bytes()), 0)
              << "rank " << rank << " selection " << j << " step " << step;
        }
      }
      if (!faults) {  // Step on the twin: the same indices, stats and state
        std::vector<std::int32_t> want(2 * shape.size(), 777);
        auto stats = stepper->Step(group, shape, requests, sel, want);
        ASSERT_TRUE(stats) << stats.error().message();
        EXPECT_EQ(indices, want) << "step " << step;
        EXPECT_EQ(planned->stats, *stats) << "step " << step;
        EXPECT_EQ(space->DebugDigest(), twin.space->DebugDigest()) << "step " << step;
        twin.space->AdvanceRound();
      }
      space->AdvanceRound();
    }
    std::printf("%s faults=%d: %llu descriptors published, %llu failed, %llu copies, %llu swaps, %llu fetches\n",
                std::string(TpAttentionName(attention)).c_str(), faults ? 1 : 0,
                static_cast<unsigned long long>(published), static_cast<unsigned long long>(failed),
                static_cast<unsigned long long>(copies), static_cast<unsigned long long>(swaps),
                static_cast<unsigned long long>(fetches));
    EXPECT_GT(swaps, 20u) << "the run was under memory pressure";
    EXPECT_GT(copies, 4u) << "the freed request's slots took copies";
    EXPECT_GT(published, 40u);
    if (at_home) {
      EXPECT_EQ(fetches, 0u);
    } else {
      EXPECT_GT(fetches, 100u) << "the local buffer fetched";
    }
    if (faults) {
      EXPECT_GT(failed, 5u);
    } else {
      EXPECT_EQ(failed, 0u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Attention, TpEnginePlanTest,
                         ::testing::Values(TpAttention::kAtHome, TpAttention::kLocalBuffer),
                         [](const auto& info) { return std::string(TpAttentionName(info.param)); });

TEST(TpEngineStep, PlanRefusalsChangeNothing) {
  Twin t = MakeTwin(TpAttention::kAtHome);
  const auto addrs = Fill(*t.space, 2, 60);
  auto engine = TpStepPlanner::Create(*t.space, {2, 1, 4}).value();
  const std::vector<RequestId> requests{RequestId(0), RequestId(1)};
  const StepShape shape{2, 1, 4};
  auto a = [&](int r, int i) { return static_cast<std::int32_t>(addrs[r][i].value()); };
  // 60 entries per rank and group over 40 device slots: the last allocated are on host.
  std::vector<std::int32_t> sel{a(0, 0), a(0, 1), a(0, 2), a(0, 3), a(1, 56), a(1, 57), a(1, 58), a(1, 59)};
  std::vector<std::int32_t> indices(16, 777);
  std::vector<CopyDescriptor> descriptors(engine->max_descriptors());
  const auto before = t.space->DebugDigest();
  // Too few descriptor rows: kResourceExhausted, naming the count, nothing changed.
  auto few = engine->Plan(GroupId(0), shape, requests, sel, indices, std::span<CopyDescriptor>(descriptors).first(0));
  ASSERT_FALSE(few);
  EXPECT_EQ(few.error().code(), ErrorCode::kResourceExhausted) << few.error().message();
  EXPECT_NE(few.error().message().find("descriptors"), std::string::npos);
  EXPECT_EQ(t.space->DebugDigest(), before);
  EXPECT_EQ(indices, std::vector<std::int32_t>(16, 777));
  EXPECT_FALSE(engine->has_pending());
  auto planned = engine->Plan(GroupId(0), shape, requests, sel, indices, descriptors);
  ASSERT_TRUE(planned) << planned.error().message();
  ASSERT_GT(planned->num_descriptors, 0u);
  const auto pending = t.space->DebugDigest();
  // While pending: a second Plan and a Step are refused; a wrong fence or status size too.
  std::vector<std::int32_t> other(16, 777);
  auto again = engine->Plan(GroupId(1), shape, requests, sel, other, descriptors);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code(), ErrorCode::kFailedPrecondition);
  auto step = engine->Step(GroupId(1), shape, requests, sel, other);
  ASSERT_FALSE(step);
  EXPECT_EQ(step.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(other, std::vector<std::int32_t>(16, 777));
  std::vector<std::uint8_t> status(planned->num_descriptors, 0);
  auto wrong_fence = engine->Complete(planned->fence + 1, status);
  ASSERT_FALSE(wrong_fence);
  EXPECT_EQ(wrong_fence.error().code(), ErrorCode::kNotFound);
  auto wrong_size = engine->Complete(planned->fence, std::span<const std::uint8_t>(status).first(status.size() - 1));
  ASSERT_FALSE(wrong_size);
  EXPECT_EQ(wrong_size.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(t.space->DebugDigest(), pending);
  EXPECT_TRUE(engine->has_pending());
  engine->ExecuteOnShards(std::span<const CopyDescriptor>(descriptors.data(), planned->num_descriptors), status);
  auto done = engine->Complete(planned->fence, status);
  ASSERT_TRUE(done);
  EXPECT_EQ(done->published, planned->num_descriptors);
  EXPECT_TRUE(t.space->CheckInvariants());
  // The local buffer: its remote fetches count against the descriptor rows as well.
  Twin lb = MakeTwin(TpAttention::kLocalBuffer);
  const auto lb_addrs = Fill(*lb.space, 2, 30);
  auto lb_engine = TpStepPlanner::Create(*lb.space, {2, 1, 4}).value();
  // Two entries of each request, on device at their homes: no home miss, 2 remote fetches.
  std::vector<std::int32_t> lb_sel{static_cast<std::int32_t>(lb_addrs[0][0].value()),
                                   static_cast<std::int32_t>(lb_addrs[0][1].value()), -1, -1,
                                   static_cast<std::int32_t>(lb_addrs[1][0].value()),
                                   static_cast<std::int32_t>(lb_addrs[1][1].value()), -1, -1};
  std::vector<CopyDescriptor> lb_desc(lb_engine->max_descriptors());
  EXPECT_EQ(lb_engine->max_descriptors(), 2u * lb_engine->index_slots());
  const auto lb_before = lb.space->DebugDigest();
  indices.assign(16, 777);
  auto short_rows = lb_engine->Plan(GroupId(0), shape, requests, lb_sel, indices,
                                    std::span<CopyDescriptor>(lb_desc).first(3));
  ASSERT_FALSE(short_rows);
  EXPECT_EQ(short_rows.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(short_rows.error().message().find("4 remote fetches"), std::string::npos) << short_rows.error().message();
  EXPECT_EQ(lb.space->DebugDigest(), lb_before);
  EXPECT_EQ(indices, std::vector<std::int32_t>(16, 777));
  auto lb_planned = lb_engine->Plan(GroupId(0), shape, requests, lb_sel, indices, lb_desc);
  ASSERT_TRUE(lb_planned) << lb_planned.error().message();
  EXPECT_EQ(lb_planned->first_phase, 4u);
  EXPECT_EQ(lb_planned->num_descriptors, 4u);
  std::vector<std::uint8_t> lb_status(4, 1);
  lb_status[0] = 0;  // one fetch done, the other three failed
  lb_engine->ExecuteOnShards(std::span<const CopyDescriptor>(lb_desc).first(1), std::span(lb_status).first(1));
  auto lb_done = lb_engine->Complete(lb_planned->fence, lb_status);
  ASSERT_TRUE(lb_done);
  EXPECT_EQ(lb_done->published, 1u);
  EXPECT_EQ(lb_done->failed, 3u);
  EXPECT_EQ(lb.space->NumBuffered(Rank(lb_desc[0].dst_rank), GroupId(0)), 1u);
  EXPECT_TRUE(lb.space->CheckInvariants());
}

// TP addresses in pages (tp_address_space.h "Pages"): 4 ranks, 64-token pages. Each
// request's tokens are contiguous within 64-aligned pages whatever the interleaving of
// requests and chunks, so SGLang's page_table_1[:, ::64] // 64 names a request's pages; a
// page spans all 4 ranks (token i on rank i mod 4: a mod P); freed pages are reused FIFO;
// a token homed on a full rank is refused and changes nothing.
// The engine path's modes are the space's config: a TP engine step over a space without
// stable new entries is refused with the field to set, and the space is left as it was.
TEST(TpEngineStep, CreateRefusesASpaceWithoutStableNewEntries) {
  auto backend = MakeCpuBackend();
  TpConfig c = testing::SmallTpConfig(2, 8, 16, 0);
  c.attention = TpAttention::kAtHome;
  auto space = TpAddressSpace::Create(c, *backend).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1)));
  ASSERT_TRUE(space->Allocate(RequestId(1), 5));
  const std::uint64_t before = space->DebugDigest();
  auto refused = TpStepPlanner::Create(*space, {1, 1, 4});
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(refused.error().message().find("TpConfig.stable_new_entries"), std::string::npos)
      << refused.error().ToString();
  EXPECT_EQ(space->DebugDigest(), before);
  auto stable = TpAddressSpace::Create(testing::TpEngineModes(c), *backend).value();
  EXPECT_TRUE(TpStepPlanner::Create(*stable, {1, 1, 4}));
}

// A planner made by its constructor has the library path only: the engine path's calls are
// refused (kFailedPrecondition, naming Create) and change nothing; its library step runs.
TEST(TpEngineStep, ConstructedPlannerRefusesTheEnginePath) {
  auto backend = MakeCpuBackend();
  TpConfig c = testing::TpEngineModes(testing::SmallTpConfig(2, 8, 16, 0));
  c.attention = TpAttention::kAtHome;
  auto space = TpAddressSpace::Create(c, *backend).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1)));
  const std::vector<LogicalAddr> addrs = space->Allocate(RequestId(1), 4).value();
  TpStepPlanner planner(*space);
  const std::uint64_t before = space->DebugDigest();
  const std::vector<RequestId> requests = {RequestId(1)};
  const std::vector<std::int32_t> sel = {static_cast<std::int32_t>(addrs[0].value()),
                                         static_cast<std::int32_t>(addrs[1].value())};
  std::vector<std::int32_t> idx(2 * sel.size(), 77);
  std::vector<CopyDescriptor> desc(planner.max_descriptors());
  auto refused = planner.Plan(GroupId(0), {1, 1, 2}, requests, sel, idx, desc);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(refused.error().message().find("TpStepPlanner::Create"), std::string::npos) << refused.error().ToString();
  auto stepped = planner.Step(GroupId(0), {1, 1, 2}, requests, sel, idx);
  ASSERT_FALSE(stepped);
  EXPECT_EQ(stepped.error().code(), ErrorCode::kFailedPrecondition);
  const std::vector<RoundDemand> demands = {{RequestId(1), 1, 2}};
  auto reserved = planner.ReserveRound(demands);
  ASSERT_FALSE(reserved);
  EXPECT_EQ(reserved.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_TRUE(std::all_of(idx.begin(), idx.end(), [](std::int32_t i) { return i == 77; })) << "no index written";
  EXPECT_EQ(space->DebugDigest(), before) << "the refusals change nothing";
  const std::vector<SelectionRun> runs = {{RequestId(1), 2}};
  ASSERT_TRUE(planner.Step(GroupId(0), std::span(addrs).first(2), runs));
}

TEST(TpPages, RequestsGetWholePagesStripedOverAllRanks) {
  constexpr std::uint32_t kT = 64, kRanks = 4;
  auto backend = MakeCpuBackend();
  TpConfig c = testing::SmallTpConfig(kRanks, /*device=*/40, /*host=*/60, /*buffer=*/0);
  c.attention = TpAttention::kAtHome;
  ASSERT_EQ(c.page_tokens, kT);  // the default, as in DP mode
  auto space = TpAddressSpace::Create(c, *backend).value();
  for (std::uint32_t r = 1; r <= 3; ++r) ASSERT_TRUE(space->AddRequest(RequestId(r)));
  // Prefill chunks of 70 and 30, then 40 decode steps of one token each, interleaved.
  ASSERT_TRUE(space->Allocate(RequestId(1), 70));
  ASSERT_TRUE(space->Allocate(RequestId(2), 30));
  ASSERT_TRUE(space->Allocate(RequestId(1), 30));
  for (int step = 0; step < 40; ++step) {
    ASSERT_TRUE(space->Allocate(RequestId(1 + step % 2), 1));
  }
  ASSERT_TRUE(space->CheckInvariants()) << space->CheckInvariants().error().ToString();
  std::vector<std::uint32_t> pages_seen;
  for (std::uint32_t r : {1u, 2u}) {
    const auto addrs = space->AddressesOf(RequestId(r)).value();
    for (std::size_t i = 0; i < addrs.size(); ++i) {
      const std::uint32_t a = addrs[i].value();
      ASSERT_EQ(a % kT, i % kT) << "request " << r << " token " << i;               // offset = position
      ASSERT_EQ(a / kT, addrs[i - i % kT].value() / kT) << "request " << r << " token " << i;  // page_table_1[::64]
      ASSERT_EQ(space->HomeOf(addrs[i]), Rank(static_cast<std::uint16_t>(i % kRanks)));  // the page spans all ranks
    }
    for (std::size_t i = 0; i < addrs.size(); i += kT) pages_seen.push_back(addrs[i].value() / kT);
  }
  std::sort(pages_seen.begin(), pages_seen.end());
  EXPECT_EQ(std::adjacent_find(pages_seen.begin(), pages_seen.end()), pages_seen.end()) << "a page of two requests";
  EXPECT_EQ(pages_seen.size(), 3u);  // request 1: 120 tokens, 2 pages; request 2: 50 tokens, 1 page
  // Freed pages come back first, in the order they were freed.
  const auto first = space->AddressesOf(RequestId(1)).value();
  const std::uint32_t page0 = first[0].value() / kT, page1 = first[kT].value() / kT;
  ASSERT_TRUE(space->Free(RequestId(1)));
  auto fresh = space->Allocate(RequestId(3), kT + 1).value();
  EXPECT_EQ(fresh[0].value() / kT, page0);
  EXPECT_EQ(fresh[kT].value() / kT, page1);
  // A ShareInto ends the open page: the next token opens a fresh page at its position's offset.
  ASSERT_TRUE(space->AddRequest(RequestId(4)));
  const auto own = space->Allocate(RequestId(4), 3).value();  // its open page, offsets 0-2
  ASSERT_TRUE(space->ShareInto(RequestId(4), std::span(fresh).first(10)));
  const auto after_share = space->Allocate(RequestId(4), 1).value();
  EXPECT_EQ(after_share[0].value() % kT, 13u);
  EXPECT_NE(after_share[0].value() / kT, own[0].value() / kT);
  EXPECT_NE(after_share[0].value() / kT, page0);
  ASSERT_TRUE(space->CheckInvariants()) << space->CheckInvariants().error().ToString();
  // Rank 0 holds 100 entries per group: tokens 0, 4, 8, ... of a 400-token request would put
  // more there than fit. Refused, nothing changed.
  ASSERT_TRUE(space->AddRequest(RequestId(5)));
  const std::uint64_t digest = space->DebugDigest();
  auto big = space->Allocate(RequestId(5), 400);
  ASSERT_FALSE(big);
  EXPECT_EQ(big.error().code(), ErrorCode::kResourceExhausted) << big.error().ToString();
  EXPECT_NE(big.error().ToString().find("rank 0"), std::string::npos) << big.error().ToString();
  EXPECT_EQ(space->DebugDigest(), digest);
  ASSERT_TRUE(space->CheckInvariants());
  // The home table holds shard slots x page_tokens entries (each minted page holds a live
  // address): a config past 2^32 of them is refused by Validate, a smaller page accepted.
  TpConfig huge = testing::SmallTpConfig(2, 1 << 10, 1 << 27, 0);  // 2^27 + 2^10 entries per shard
  huge.attention = TpAttention::kAtHome;
  auto refused = huge.Validate();
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().ToString().find("home table"), std::string::npos) << refused.error().ToString();
  huge.page_tokens = 16;
  EXPECT_TRUE(huge.Validate());
}

}  // namespace
}  // namespace ula

// StepPlanner with T threads: the result must not depend on T. Twin
// address spaces receive the same randomized operations (requests added, grown and freed,
// steps of several groups with duplicates across address blocks, under device pressure,
// and bad selections); one is planned with one thread, the other with 2, 3 or 4. After
// every step: the same status (code and message), the same output slots, the same stats,
// the same copy plan (every batch's moves, in order), the same DebugDigest; a refused step
// changes nothing. The device pools are small, so most steps evict: the T-thread planner
// claims its victims on its threads (PbLru::ClaimVictimsParallel, from one victim up for
// T = 2 and 4, from 200 up for T = 3, so both paths run), and the test checks that it did.
// The engine path (StepPlanner::Plan / Complete) runs the same step (src/step/step_planner_impl.h)
// and takes the same options: its indices, descriptors and errors must not depend on T either.
// Labelled `threaded`: it also runs under ThreadSanitizer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "test_seed.h"
#include "ula/address_space.h"
#include "ula/backend.h"
#include "ula/step_planner.h"

namespace ula {
namespace {

// The counting backend, recording every submitted batch.
class RecordingBackend final : public Backend {
 public:
  RecordingBackend() : inner_(MakeCountingBackend()) {}
  Result<Arena> CreateArena(Tier tier, Rank rank, std::uint64_t bytes) override {
    return inner_->CreateArena(tier, rank, bytes);
  }
  Status DestroyArena(ArenaId id) override { return inner_->DestroyArena(id); }
  Result<Arena> GetArena(ArenaId id) const override { return inner_->GetArena(id); }
  bool holds_bytes() const override { return false; }
  Result<Fence> Submit(CopyBatch batch) override {
    std::vector<std::uint64_t> rec{batch.src.value(), batch.dst.value(), batch.swap ? 1u : 0u};
    for (const SlotMove& m : batch.moves) {
      rec.push_back(m.src_offset);
      rec.push_back(m.dst_offset);
    }
    plan.push_back(std::move(rec));
    return inner_->Submit(std::move(batch));
  }
  Status Wait(Fence fence) override { return inner_->Wait(fence); }
  void WaitAll() override { inner_->WaitAll(); }
  TransferCounters counters() const override { return inner_->counters(); }
  void ResetCounters() override { inner_->ResetCounters(); }

  std::vector<std::vector<std::uint64_t>> plan;  // every batch: src, dst, swap, then moves

 private:
  std::unique_ptr<Backend> inner_;
};

struct World {
  RecordingBackend backend;
  std::unique_ptr<AddressSpace> space;
  std::unique_ptr<StepPlanner> planner;
  World(const AddressSpaceConfig& c, std::uint32_t threads, std::uint32_t prefetch_distance,
        std::uint32_t parallel_claim_min_victims = StepPlannerOptions::kDefaultParallelClaimMinVictims) {
    space = AddressSpace::Create(c, backend).value();
    planner = std::make_unique<StepPlanner>(*space);
    EXPECT_TRUE(planner->SetOptions({threads, prefetch_distance, parallel_claim_min_victims}));
  }
  ~World() { planner.reset(); space.reset(); }
};

void ExpectSameStats(const StepStats& a, const StepStats& b) {
  EXPECT_EQ(a.selections, b.selections);
  EXPECT_EQ(a.distinct, b.distinct);
  EXPECT_EQ(a.hits, b.hits);
  EXPECT_EQ(a.misses, b.misses);
  EXPECT_EQ(a.into_free, b.into_free);
  EXPECT_EQ(a.evictions, b.evictions);
  EXPECT_EQ(a.bytes_moved, b.bytes_moved);
}

TEST(StepPlannerThreads, SameSlotsPlanAndErrorsAsOneThread) {
  ULA_TEST_SEEDED(seed, 20261201);
  AddressSpaceConfig c;
  c.num_ranks = 2;
  c.num_groups = 2;
  c.entry_bytes = 64;
  const std::uint32_t device_slots = 6000, host_slots = 60000;
  c.device_bytes_per_rank = std::uint64_t{device_slots} * c.entry_bytes * c.num_groups;
  c.host_bytes_per_rank = std::uint64_t{host_slots} * c.entry_bytes * c.num_groups;
  for (std::uint32_t threads : {2u, 3u, 4u}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    std::mt19937_64 rng(seed + threads);
    // The prefetch distance must not matter either: 16 against 0, 1 or 64.
    World one(c, 1, 16), many(c, threads, threads == 2 ? 0 : threads == 3 ? 1 : 64, threads == 3 ? 200 : 1);
    int ok = 0, refused = 0;
    std::vector<RequestId> live;  // rank of request r: r % 2
    std::vector<LogicalAddr> freed;
    std::uint64_t next_id = 0;
    auto add = [&](std::uint32_t tokens) {
      const RequestId id(next_id++);
      const Rank rank(static_cast<std::uint16_t>(id.value() % 2));
      ASSERT_TRUE(one.space->AddRequest(id, rank));
      ASSERT_TRUE(many.space->AddRequest(id, rank));
      auto a = one.space->Allocate(id, tokens);
      auto b = many.space->Allocate(id, tokens);
      ASSERT_EQ(a.has_value(), b.has_value());
      if (a) {
        ASSERT_EQ(*a, *b);
        live.push_back(id);
      }
    };
    for (int i = 0; i < 12; ++i) add(static_cast<std::uint32_t>(1500 + rng() % 3000));  // > 4 blocks of 4,096
    one.space->AdvanceRound();
    many.space->AdvanceRound();
    for (int step = 0; step < 12; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      if (rng() % 4 == 0 && live.size() > 4) {  // a request ends; a new one reuses addresses
        const std::size_t k = rng() % live.size();
        auto addrs = one.space->AddressesOf(live[k]).value();
        freed.insert(freed.end(), addrs.begin(), addrs.end());
        ASSERT_TRUE(one.space->Free(live[k]));
        ASSERT_TRUE(many.space->Free(live[k]));
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
        add(static_cast<std::uint32_t>(1000 + rng() % 3000));
      }
      for (RequestId id : live) {  // decode: one new token each
        auto a = one.space->Allocate(id, 1);
        auto b = many.space->Allocate(id, 1);
        ASSERT_EQ(a.has_value(), b.has_value());
      }
      const Rank rank(static_cast<std::uint16_t>(rng() % 2));
      for (std::uint16_t g = 0; g < c.num_groups; ++g) {
        std::vector<LogicalAddr> sel;
        std::vector<SelectionRun> runs;
        for (RequestId id : live) {
          if (id.value() % 2 != rank.value() || rng() % 3 == 0) continue;
          auto addrs = one.space->AddressesOf(id).value();
          const auto n = static_cast<std::uint32_t>(100 + rng() % 500);
          for (std::uint32_t i = 0; i < n; ++i) {
            // Recent tokens more often (overlap across steps), duplicates within a step.
            const std::size_t pos = rng() % 2 ? addrs.size() - 1 - rng() % std::min<std::size_t>(addrs.size(), 300)
                                              : rng() % addrs.size();
            sel.push_back(addrs[pos]);
          }
          runs.push_back({id, n});
        }
        // 0-2: bad selections somewhere (up to 3, so that several threads find one: the
        // error must name the first of them)
        const int bad = static_cast<int>(rng() % 10);
        for (int b = bad <= 2 ? 1 + static_cast<int>(rng() % 3) : 0; b > 0 && !sel.empty(); --b) {
          const std::size_t at = rng() % sel.size();
          const int kind = static_cast<int>(rng() % 3);
          if (kind == 0 && !freed.empty()) sel[at] = freed[rng() % freed.size()];        // stale
          if (kind == 1) sel[at] = LogicalAddr((1u << 30) + static_cast<std::uint32_t>(rng() % (1u << 20)));  // never allocated
          if (kind == 2) {                                                                // another rank's
            for (RequestId id : live) {
              if (id.value() % 2 != rank.value()) sel[at] = one.space->AddressesOf(id).value()[rng() % 1000];
            }
          }
        }
        if (!runs.empty() && rng() % 20 == 0) runs[rng() % runs.size()].request = RequestId(1u << 20);  // unknown
        std::vector<SlotId> out_one(sel.size(), SlotId(7)), out_many(sel.size(), SlotId(7));
        const std::uint64_t before_one = one.space->DebugDigest(), before_many = many.space->DebugDigest();
        one.backend.plan.clear();
        many.backend.plan.clear();
        const StepInput in{rank, GroupId(g), sel, runs};
        auto a = one.planner->Step(in, out_one);
        auto b = many.planner->Step(in, out_many);
        ASSERT_EQ(a.has_value(), b.has_value()) << (a ? b.error().ToString() : a.error().ToString());
        (a ? ok : refused)++;
        if (a) {
          ExpectSameStats(*a, *b);
          EXPECT_EQ(out_one, out_many);
          EXPECT_EQ(one.backend.plan, many.backend.plan);
        } else {
          EXPECT_EQ(a.error().code(), b.error().code());
          EXPECT_EQ(a.error().message(), b.error().message());
          EXPECT_EQ(before_one, one.space->DebugDigest()) << "a refused step changed the state";
          EXPECT_EQ(before_many, many.space->DebugDigest()) << "a refused step changed the state";
        }
        ASSERT_EQ(one.space->DebugDigest(), many.space->DebugDigest());
      }
      one.space->AdvanceRound();
      many.space->AdvanceRound();
      ASSERT_TRUE(one.space->CheckInvariants());
      ASSERT_TRUE(many.space->CheckInvariants());
    }
    const StepPlannerCounters& c1 = one.planner->counters();
    const StepPlannerCounters& cn = many.planner->counters();
    std::printf("threads %u: %d steps planned, %d refused, identical to one thread; %llu steps evicted %llu victims, "
                "%llu of them claimed on %u threads\n",
                threads, ok, refused, static_cast<unsigned long long>(cn.claims),
                static_cast<unsigned long long>(cn.victims), static_cast<unsigned long long>(cn.parallel_claims),
                threads);
    EXPECT_GE(ok, 5);  // both paths were exercised
    EXPECT_GE(refused, 3);
    EXPECT_EQ(c1.victims, cn.victims);
    EXPECT_EQ(c1.parallel_claims, 0u);
    EXPECT_GE(cn.parallel_claims, 5u);  // eviction-heavy steps went through the parallel claim
    if (threads == 3) {
      EXPECT_LT(cn.parallel_claims, cn.claims);  // and small ones stayed serial
    }
  }
}

TEST(StepPlannerThreads, OptionsAreValidatedAndABadValueChangesNothing) {
  auto backend = MakeCountingBackend();
  AddressSpaceConfig c;
  c.entry_bytes = 64;
  c.device_bytes_per_rank = 64 * 64;
  c.host_bytes_per_rank = 64 * 64;
  auto space = AddressSpace::Create(c, *backend).value();
  StepPlanner planner(*space);
  EXPECT_EQ(planner.options().threads, 1u);
  ASSERT_TRUE(planner.SetOptions({3, 8}));
  for (const StepPlannerOptions bad : {StepPlannerOptions{0, 8}, StepPlannerOptions{StepPlannerOptions::kMaxThreads + 1, 8},
                                       StepPlannerOptions{2, StepPlannerOptions::kMaxPrefetchDistance + 1},
                                       StepPlannerOptions{2, 8, 0}}) {
    auto s = planner.SetOptions(bad);
    ASSERT_FALSE(s);
    EXPECT_EQ(s.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(planner.options().threads, 3u);
    EXPECT_EQ(planner.options().prefetch_distance, 8u);
  }
  EXPECT_NE(planner.SetOptions({0, 8}).error().message().find("threads = 0"), std::string::npos);
  EXPECT_NE(planner.SetOptions({2, 8, 0}).error().message().find("parallel_claim_min_victims = 0"), std::string::npos);
}

// The engine path over twin spaces, one planner at one thread and one at T: the same
// indices (padding included), the same descriptors, the same errors (code and message, the
// first bad selection's) and the same state after every Complete.
TEST(EngineStepThreads, SameIndicesDescriptorsAndErrorsAsOneThread) {
  ULA_TEST_SEEDED(seed, 20261205);
  AddressSpaceConfig c;
  c.num_ranks = 2;
  c.entry_bytes = 64;
  c.stable_new_entries = true;  // the engine path's mode
  const std::uint32_t device_slots = 3000, host_slots = 40000;
  c.device_bytes_per_rank = std::uint64_t{device_slots} * c.entry_bytes;
  c.host_bytes_per_rank = std::uint64_t{host_slots} * c.entry_bytes;
  constexpr std::uint32_t kBatch = 8, kTopK = 512;
  for (std::uint32_t threads : {2u, 3u}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    std::mt19937_64 rng(seed + threads);
    auto backend_one = MakeCountingBackend(), backend_many = MakeCountingBackend();
    auto space_one = AddressSpace::Create(c, *backend_one).value();
    auto space_many = AddressSpace::Create(c, *backend_many).value();
    const EngineStepConfig ec{.max_batch = kBatch, .max_q_len = 1, .max_top_k = kTopK};
    auto one = StepPlanner::Create(*space_one, ec).value();
    auto many = StepPlanner::Create(*space_many, ec).value();
    ASSERT_TRUE(many->SetOptions({threads, 8, 1}));  // victims claimed on the threads from one up
    EXPECT_EQ(many->options().threads, threads);
    std::vector<RequestId> live;
    std::vector<LogicalAddr> freed;
    std::uint64_t next_id = 0;
    auto add = [&](std::uint32_t tokens) {
      const RequestId id(next_id++);
      const Rank rank(static_cast<std::uint16_t>(id.value() % 2));
      ASSERT_TRUE(space_one->AddRequest(id, rank));
      ASSERT_TRUE(space_many->AddRequest(id, rank));
      auto a = space_one->Allocate(id, tokens);
      auto b = space_many->Allocate(id, tokens);
      ASSERT_EQ(a.has_value(), b.has_value());
      if (a) live.push_back(id);
    };
    for (int i = 0; i < 10; ++i) add(static_cast<std::uint32_t>(2000 + rng() % 3000));  // > 4 blocks of 4,096
    space_one->AdvanceRound();
    space_many->AdvanceRound();
    int ok = 0, refused = 0;
    std::vector<CopyDescriptor> desc_one(one->max_descriptors()), desc_many(many->max_descriptors());
    for (int step = 0; step < 16; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      if (rng() % 4 == 0 && live.size() > 4) {  // a request ends; a new one reuses addresses
        const std::size_t k = rng() % live.size();
        auto addrs = space_one->AddressesOf(live[k]).value();
        freed.insert(freed.end(), addrs.begin(), addrs.end());
        ASSERT_TRUE(space_one->Free(live[k]));
        ASSERT_TRUE(space_many->Free(live[k]));
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
        add(static_cast<std::uint32_t>(2000 + rng() % 3000));
      }
      const Rank rank(static_cast<std::uint16_t>(rng() % 2));
      std::vector<RequestId> rows;
      std::vector<std::int32_t> sel;
      for (RequestId id : live) {
        if (id.value() % 2 != rank.value() || rows.size() == kBatch) continue;
        auto addrs = space_one->AddressesOf(id).value();
        rows.push_back(id);
        for (std::uint32_t k = 0; k < kTopK; ++k) {
          const bool pad = k >= kTopK - rng() % 64;
          sel.push_back(pad ? -1 : static_cast<std::int32_t>(addrs[rng() % addrs.size()].value()));
        }
      }
      // 0-2: bad selections (up to 3, in several threads' blocks: the error names the first).
      const int bad = static_cast<int>(rng() % 10);
      for (int b = bad <= 2 ? 1 + static_cast<int>(rng() % 3) : 0; b > 0 && !sel.empty(); --b) {
        const std::size_t at = rng() % sel.size();
        const int kind = static_cast<int>(rng() % 4);
        if (kind == 0 && !freed.empty()) sel[at] = static_cast<std::int32_t>(freed[rng() % freed.size()].value());
        if (kind == 1) sel[at] = (1 << 30) + static_cast<std::int32_t>(rng() % (1u << 20));  // never allocated
        if (kind == 2) sel[at] = -2 - static_cast<std::int32_t>(rng() % 100);                  // neither
        if (kind == 3) {                                                                      // another rank's
          for (RequestId id : live) {
            if (id.value() % 2 != rank.value()) sel[at] = static_cast<std::int32_t>(space_one->AddressesOf(id).value()[0].value());
          }
        }
      }
      if (!rows.empty() && rng() % 10 == 0) rows[rng() % rows.size()] = RequestId(1u << 20);  // unknown
      const StepShape shape{static_cast<std::uint32_t>(rows.size()), 1, kTopK};
      std::vector<std::int32_t> idx_one(sel.size(), 7), idx_many(sel.size(), 7);
      const std::uint64_t before_one = space_one->DebugDigest(), before_many = space_many->DebugDigest();
      auto a = one->Plan(rank, GroupId(0), shape, rows, sel, idx_one, desc_one);
      auto b = many->Plan(rank, GroupId(0), shape, rows, sel, idx_many, desc_many);
      ASSERT_EQ(a.has_value(), b.has_value()) << (a ? b.error().ToString() : a.error().ToString());
      if (a) {
        ++ok;
        ExpectSameStats(a->stats, b->stats);
        EXPECT_EQ(idx_one, idx_many);
        ASSERT_EQ(a->num_descriptors, b->num_descriptors);
        EXPECT_EQ(std::memcmp(desc_one.data(), desc_many.data(), a->num_descriptors * sizeof(CopyDescriptor)), 0);
        EXPECT_EQ(many->SetOptions({1, 8}).error().code(), ErrorCode::kFailedPrecondition) << "a plan is pending";
        const std::vector<std::uint8_t> status(a->num_descriptors, kDescriptorDone);
        ASSERT_TRUE(one->Complete(a->fence, status));
        ASSERT_TRUE(many->Complete(b->fence, status));
      } else {
        ++refused;
        EXPECT_EQ(a.error().code(), b.error().code());
        EXPECT_EQ(a.error().message(), b.error().message());
        EXPECT_EQ(before_one, space_one->DebugDigest()) << "a refused plan changed the state";
        EXPECT_EQ(before_many, space_many->DebugDigest()) << "a refused plan changed the state";
      }
      ASSERT_EQ(space_one->DebugDigest(), space_many->DebugDigest());
      space_one->AdvanceRound();
      space_many->AdvanceRound();
      ASSERT_TRUE(space_many->CheckInvariants());
    }
    std::printf("engine path, threads %u: %d plans, %d refused, identical to one thread; %llu of %llu claims on the "
                "threads\n", threads, ok, refused, static_cast<unsigned long long>(many->counters().parallel_claims),
                static_cast<unsigned long long>(many->counters().claims));
    EXPECT_GE(ok, 5);
    EXPECT_GE(refused, 2);
    EXPECT_GE(many->counters().parallel_claims, 3u);  // the parallel claim ran in the engine path
    EXPECT_EQ(one->counters().parallel_claims, 0u);
  }
}

}  // namespace
}  // namespace ula

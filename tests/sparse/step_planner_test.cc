#include "ula/step_planner.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "sparse/space_fixture.h"

namespace ula {
namespace {

using testing::Pattern;
using testing::SmallConfig;
using testing::SpaceFixture;

void ExpectSlotsHoldEntries(const SpaceFixture& f, GroupId g, std::span<const LogicalAddr> sel,
                            std::span<const SlotId> slots) {
  const std::uint32_t bytes = f.space->config().entry_bytes;
  for (std::size_t i = 0; i < sel.size(); ++i) {
    const std::byte* got = f.space->DeviceSlotData(Rank(0), g, slots[i]);
    EXPECT_EQ(std::memcmp(got, Pattern(sel[i], g.value(), bytes).data(), bytes), 0) << "selection " << i;
  }
}

TEST(StepPlanner, HitsMoveNothingAndKeepSelectionOrderAndDuplicates) {
  SpaceFixture f(SmallConfig(8, 8));
  auto a = f.AddFilled(RequestId(1), Rank(0), 4);
  std::vector<LogicalAddr> sel{a[3], a[0], a[3], a[2]};
  std::vector<SlotId> slots(sel.size());
  auto stats = f.planner.Step({Rank(0), GroupId(0), sel}, slots);
  ASSERT_TRUE(stats) << stats.error().ToString();
  EXPECT_EQ(stats->distinct, 3u);
  EXPECT_EQ(stats->hits, 3u);
  EXPECT_EQ(stats->bytes_moved, 0u);
  EXPECT_EQ(slots[0], slots[2]);
  ExpectSlotsHoldEntries(f, GroupId(0), sel, slots);
}

TEST(StepPlanner, MissesUseFreeSlotsBeforeEvicting) {
  SpaceFixture f(SmallConfig(4, 8));
  f.AddFilled(RequestId(1), Rank(0), 3);           // device slots 0..2
  auto y = f.AddFilled(RequestId(2), Rank(0), 3);  // device slot 3, then host
  ASSERT_TRUE(f.space->Free(RequestId(1)));        // 3 device slots free
  f.space->AdvanceRound();
  std::vector<LogicalAddr> sel{y[1], y[2]};
  std::vector<SlotId> slots(2);
  auto stats = f.planner.Step({Rank(0), GroupId(0), sel}, slots);
  ASSERT_TRUE(stats);
  EXPECT_EQ(stats->misses, 2u);
  EXPECT_EQ(stats->into_free, 2u);
  EXPECT_EQ(stats->evictions, 0u);
  EXPECT_EQ(f.space->Lookup(y[0], GroupId(0))->tier(), Tier::kDevice);  // nobody was evicted
  EXPECT_EQ(f.space->NumUsed(Rank(0), GroupId(0), Tier::kHost), 0u);
  ExpectSlotsHoldEntries(f, GroupId(0), sel, slots);
}

// Free slots first, then victims: 5 misses with 2 free device slots take both free slots
// and evict exactly 3 (the oldest), and the free pool ends empty.
TEST(StepPlanner, MissesFillEveryFreeSlotThenEvict) {
  SpaceFixture f(SmallConfig(6, 12));
  auto x = f.AddFilled(RequestId(1), Rank(0), 2);  // device slots 0, 1
  auto y = f.AddFilled(RequestId(2), Rank(0), 9);  // device 2..5, then 5 on host
  ASSERT_TRUE(f.space->Free(RequestId(1)));        // 2 device slots free
  f.space->AdvanceRound();
  std::vector<LogicalAddr> sel(y.begin() + 4, y.end());
  std::vector<SlotId> slots(sel.size());
  auto stats = f.planner.Step({Rank(0), GroupId(0), sel}, slots);
  ASSERT_TRUE(stats) << stats.error().ToString();
  EXPECT_EQ(stats->misses, 5u);
  EXPECT_EQ(stats->into_free, 2u);
  EXPECT_EQ(stats->evictions, 3u);
  EXPECT_EQ(f.space->NumFree(Rank(0), GroupId(0), Tier::kDevice), 0u);
  int evicted = 0;
  for (int i = 0; i < 4; ++i) evicted += f.space->Lookup(y[i], GroupId(0))->tier() == Tier::kHost;
  EXPECT_EQ(evicted, 3);
  ExpectSlotsHoldEntries(f, GroupId(0), sel, slots);
  (void)x;
}

TEST(StepPlanner, SwapsAVictimWithTheMissedEntryUnderExclusiveTiers) {
  SpaceFixture f(SmallConfig(2, 2));
  auto a = f.AddFilled(RequestId(1), Rank(0), 4);  // a0,a1 on device; a2,a3 on host; all full
  f.space->AdvanceRound();
  std::vector<LogicalAddr> sel{a[0], a[2]};
  std::vector<SlotId> slots(2);
  auto stats = f.planner.Step({Rank(0), GroupId(0), sel}, slots);
  ASSERT_TRUE(stats) << stats.error().ToString();
  EXPECT_EQ(stats->hits, 1u);
  EXPECT_EQ(stats->evictions, 1u);
  EXPECT_EQ(f.space->Lookup(a[1], GroupId(0))->tier(), Tier::kHost);  // the victim
  EXPECT_EQ(f.space->Lookup(a[2], GroupId(0))->tier(), Tier::kDevice);
  ExpectSlotsHoldEntries(f, GroupId(0), sel, slots);
  std::vector<std::byte> out(32);
  ASSERT_TRUE(f.space->Read(a[1], GroupId(0), out));
  EXPECT_EQ(out, Pattern(a[1], 0, 32));
  EXPECT_TRUE(f.space->CheckInvariants());
}

TEST(StepPlanner, NeverEvictsAnEntryUsedInTheCurrentRound) {
  SpaceFixture f(SmallConfig(2, 4));
  auto a = f.AddFilled(RequestId(1), Rank(0), 4);
  f.space->AdvanceRound();
  std::vector<SlotId> slots(2);
  std::vector<LogicalAddr> first{a[0], a[1]};
  ASSERT_TRUE(f.planner.Step({Rank(0), GroupId(0), first}, slots));
  // Same round: both device slots are in use by this round's attention.
  std::vector<LogicalAddr> second{a[2]};
  std::vector<SlotId> one(1);
  const auto before = f.Take();
  auto refused = f.planner.Step({Rank(0), GroupId(0), second}, one);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(f.Take(), before);
  f.space->AdvanceRound();
  ASSERT_TRUE(f.planner.Step({Rank(0), GroupId(0), second}, one));
}

// Several steps of one group in one round (an engine plans every request's step before
// attention runs): no step may evict an entry that an earlier step of the round placed or
// hit, so at the end of the round every slot any step handed out still holds its entry.
// Random selections, every policy.
TEST(StepPlanner, NoStepEvictsAnEntryUsedEarlierInTheRound) {
  const char* seed_env = std::getenv("ULA_TEST_SEED");
  const std::uint64_t seed = seed_env ? std::strtoull(seed_env, nullptr, 10) : 77;
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (ULA_TEST_SEED reproduces)");
  for (PolicyKind kind : {PolicyKind::kPbLru, PolicyKind::kExactLruScan, PolicyKind::kExactLruList, PolicyKind::kClock}) {
    SCOPED_TRACE(PolicyKindName(kind));
    AddressSpaceConfig c = SmallConfig(24, 80);
    c.policy = kind;
    SpaceFixture f(c);
    auto addrs = f.AddFilled(RequestId(1), Rank(0), 100);
    std::mt19937_64 rng(seed);
    std::uint64_t refused = 0, evictions = 0;
    for (int round = 0; round < 40; ++round) {
      f.space->AdvanceRound();
      std::vector<std::pair<LogicalAddr, SlotId>> used;  // every (entry, slot) handed out this round
      for (int step = 0; step < 4; ++step) {
        std::vector<LogicalAddr> sel;
        for (int i = 0; i < 6; ++i) sel.push_back(addrs[rng() % addrs.size()]);
        std::vector<SlotId> slots(sel.size());
        auto st = f.planner.Step({Rank(0), GroupId(0), sel}, slots);
        if (!st) {
          ASSERT_EQ(st.error().code(), ErrorCode::kResourceExhausted) << st.error().ToString();
          ++refused;
          continue;
        }
        evictions += st->evictions;
        for (std::size_t i = 0; i < sel.size(); ++i) used.emplace_back(sel[i], slots[i]);
      }
      for (const auto& [a, slot] : used) {
        const std::byte* got = f.space->DeviceSlotData(Rank(0), GroupId(0), slot);
        ASSERT_EQ(std::memcmp(got, Pattern(a, 0, 32).data(), 32), 0)
            << "round " << round << ": slot " << slot.value() << " handed out for address " << a.value()
            << " was given to another entry later in the round";
      }
    }
    EXPECT_GT(evictions, 100u);
    std::printf("%s: %llu evictions, %llu refused steps\n", std::string(PolicyKindName(kind)).c_str(),
                (unsigned long long)evictions, (unsigned long long)refused);
  }
}

TEST(StepPlanner, RefusedStepsChangeNothing) {
  SpaceFixture f(SmallConfig(3, 8, 2, 2));
  auto a = f.AddFilled(RequestId(1), Rank(0), 8);
  auto other_rank = f.AddFilled(RequestId(2), Rank(1), 2);
  auto gone = f.AddFilled(RequestId(3), Rank(0), 1);
  ASSERT_TRUE(f.space->Free(RequestId(3)));
  f.space->AdvanceRound();
  const auto before = f.Take();
  std::vector<SlotId> slots(4);
  auto step = [&](std::vector<LogicalAddr> sel, Rank r = Rank(0), GroupId g = GroupId(0)) {
    slots.assign(sel.size(), SlotId());
    return f.planner.Step({r, g, sel}, slots);
  };
  EXPECT_EQ(step({a[0], gone[0]}).error().code(), ErrorCode::kNotFound);             // freed address
  EXPECT_EQ(step({a[0], LogicalAddr(999)}).error().code(), ErrorCode::kNotFound);    // unknown address
  EXPECT_EQ(step({a[0], other_rank[0]}).error().code(), ErrorCode::kInvalidArgument);  // wrong rank
  EXPECT_EQ(step({a[0], a[1], a[2], a[3]}).error().code(), ErrorCode::kResourceExhausted);  // > device
  EXPECT_EQ(step({a[0]}, Rank(2)).error().code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(step({a[0]}, Rank(0), GroupId(2)).error().code(), ErrorCode::kOutOfRange);
  std::vector<LogicalAddr> sel{a[0]};
  std::vector<SlotId> too_small;
  EXPECT_EQ(f.planner.Step({Rank(0), GroupId(0), sel}, too_small).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(f.Take(), before);
  EXPECT_TRUE(f.space->CheckInvariants());
}

// A backend that records, at the moment each batch is submitted and at the moment the
// planner waits, what the location table says: publication must follow the copy.
class SpyBackend final : public Backend {
 public:
  explicit SpyBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::function<void()> on_submit, on_wait;
  Result<Arena> CreateArena(Tier t, Rank r, std::uint64_t b) override { return inner_->CreateArena(t, r, b); }
  Status DestroyArena(ArenaId id) override { return inner_->DestroyArena(id); }
  Result<Arena> GetArena(ArenaId id) const override { return inner_->GetArena(id); }
  bool holds_bytes() const override { return true; }
  Result<Fence> Submit(CopyBatch batch) override {
    if (on_submit) on_submit();
    return inner_->Submit(std::move(batch));
  }
  Status Wait(Fence f) override {
    if (on_wait) on_wait();
    return inner_->Wait(f);
  }
  void WaitAll() override { inner_->WaitAll(); }
  TransferCounters counters() const override { return inner_->counters(); }
  void ResetCounters() override { inner_->ResetCounters(); }

 private:
  std::unique_ptr<Backend> inner_;
};

TEST(StepPlanner, PublishesNewLocationsOnlyAfterTheCopyCompleted) {
  SpyBackend spy(MakeCpuBackend({.copy_threads = 1}));
  auto space = AddressSpace::Create(SmallConfig(2, 4), spy).value();
  StepPlanner planner(*space);
  ASSERT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
  auto a = space->Allocate(RequestId(1), 4).value();
  space->AdvanceRound();
  int submits = 0, waits = 0;
  spy.on_submit = [&] {
    ++submits;
    EXPECT_EQ(space->Lookup(a[2], GroupId(0))->tier(), Tier::kHost);
    EXPECT_EQ(space->Lookup(a[3], GroupId(0))->tier(), Tier::kHost);
  };
  spy.on_wait = [&] {
    ++waits;
    EXPECT_EQ(space->Lookup(a[2], GroupId(0))->tier(), Tier::kHost);
  };
  std::vector<LogicalAddr> sel{a[2], a[3]};
  std::vector<SlotId> slots(2);
  ASSERT_TRUE(planner.Step({Rank(0), GroupId(0), sel}, slots));
  EXPECT_GE(submits, 1);
  EXPECT_EQ(waits, 1);
  EXPECT_EQ(space->Lookup(a[2], GroupId(0))->tier(), Tier::kDevice);
}

}  // namespace
}  // namespace ula

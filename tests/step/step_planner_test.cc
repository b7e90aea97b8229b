#include "ula/step_planner.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "step/space_fixture.h"
#include "test_seed.h"

namespace ula {
namespace {

using testing::Pattern;
using testing::SmallConfig;
using testing::Runs;
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
  auto stats = f.planner.Step({Rank(0), GroupId(0), sel, Runs(RequestId(1), sel.size())}, slots);
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
  auto stats = f.planner.Step({Rank(0), GroupId(0), sel, Runs(RequestId(2), sel.size())}, slots);
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
  auto stats = f.planner.Step({Rank(0), GroupId(0), sel, Runs(RequestId(2), sel.size())}, slots);
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
  auto stats = f.planner.Step({Rank(0), GroupId(0), sel, Runs(RequestId(1), sel.size())}, slots);
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
  ASSERT_TRUE(f.planner.Step({Rank(0), GroupId(0), first, Runs(RequestId(1), first.size())}, slots));
  // Same round: both device slots are in use by this round's attention.
  std::vector<LogicalAddr> second{a[2]};
  std::vector<SlotId> one(1);
  const auto before = f.Take();
  auto refused = f.planner.Step({Rank(0), GroupId(0), second, Runs(RequestId(1), second.size())}, one);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(f.Take(), before);
  f.space->AdvanceRound();
  ASSERT_TRUE(f.planner.Step({Rank(0), GroupId(0), second, Runs(RequestId(1), second.size())}, one));
}

// Several steps of one group in one round (an engine plans every request's step before
// attention runs): no step may evict an entry that an earlier step of the round placed or
// hit, so at the end of the round every slot any step handed out still holds its entry.
// Random selections, every policy.
TEST(StepPlanner, NoStepEvictsAnEntryUsedEarlierInTheRound) {
  ULA_TEST_SEEDED(seed, 77);
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
        auto st = f.planner.Step({Rank(0), GroupId(0), sel, Runs(RequestId(1), sel.size())}, slots);
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
  auto step = [&](std::vector<LogicalAddr> sel, Rank r = Rank(0), GroupId g = GroupId(0),
                  std::vector<SelectionRun> runs = {}) {
    slots.assign(sel.size(), SlotId());
    if (runs.empty()) runs = Runs(RequestId(1), sel.size());
    return f.planner.Step({r, g, sel, runs}, slots);
  };
  EXPECT_EQ(step({a[0], gone[0]}).error().code(), ErrorCode::kNotFound);             // freed address
  EXPECT_EQ(step({a[0], LogicalAddr(999)}).error().code(), ErrorCode::kNotFound);    // unknown address
  EXPECT_EQ(step({a[0], other_rank[0]}, Rank(0), GroupId(0), {{RequestId(1), 1}, {RequestId(2), 1}}).error().code(),
            ErrorCode::kInvalidArgument);  // wrong rank
  EXPECT_EQ(step({a[0], other_rank[0]}).error().code(), ErrorCode::kNotFound);  // another request's address
  EXPECT_EQ(step({a[0], a[1]}, Rank(0), GroupId(0), {{RequestId(1), 1}}).error().code(),
            ErrorCode::kInvalidArgument);  // runs cover 1 of 2 selections
  EXPECT_EQ(step({a[0], a[1]}, Rank(0), GroupId(0), {{RequestId(1), 3}}).error().code(),
            ErrorCode::kInvalidArgument);  // runs cover 3 of 2 selections
  EXPECT_EQ(step({a[0], a[1], a[2], a[3]}).error().code(), ErrorCode::kResourceExhausted);  // > device
  EXPECT_EQ(step({a[0]}, Rank(2)).error().code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(step({a[0]}, Rank(0), GroupId(2)).error().code(), ErrorCode::kOutOfRange);
  std::vector<LogicalAddr> sel{a[0]};
  std::vector<SlotId> too_small;
  EXPECT_EQ(f.planner.Step({Rank(0), GroupId(0), sel, Runs(RequestId(1), sel.size())}, too_small).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(f.Take(), before);
  EXPECT_TRUE(f.space->CheckInvariants());
}

// Isolation: a selection kept from a freed request is refused even after its addresses
// were handed to another request, and nothing changes; the new owner's selection of the
// same addresses is accepted.
TEST(StepPlanner, RefusesAFreedThenReusedAddressWithNothingChanged) {
  SpaceFixture f(SmallConfig(4, 8));
  auto old_addrs = f.AddFilled(RequestId(1), Rank(0), 3);
  std::vector<LogicalAddr> stale{old_addrs[2], old_addrs[0]};  // request 1's selection, kept
  ASSERT_TRUE(f.space->Free(RequestId(1)));
  f.requests.clear();
  auto reused = f.AddFilled(RequestId(2), Rank(0), 3);
  ASSERT_EQ(reused, old_addrs);  // the freed addresses went to the next request
  f.space->AdvanceRound();
  const auto before = f.Take();
  std::vector<SlotId> slots(stale.size(), SlotId());
  auto refused = f.planner.Step({Rank(0), GroupId(0), stale, Runs(RequestId(1), stale.size())}, slots);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kNotFound);
  EXPECT_NE(refused.error().message().find("request 1 of its run is unknown or freed"), std::string::npos)
      << refused.error().ToString();
  EXPECT_EQ(f.Take(), before);
  EXPECT_EQ(slots[0], SlotId());  // no slot was handed out
  // One run of the batch is stale: the whole step is refused.
  f.AddFilled(RequestId(3), Rank(0), 1);
  const auto before3 = f.Take();
  auto mine = f.space->AddressesOf(RequestId(3)).value();
  std::vector<LogicalAddr> mixed{mine[0], stale[0]};
  std::vector<SelectionRun> runs{{RequestId(3), 1}, {RequestId(1), 1}};
  EXPECT_EQ(f.planner.Step({Rank(0), GroupId(0), mixed, runs}, slots).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(f.Take(), before3);
  // A live request's run naming another live request's address.
  auto other = f.planner.Step({Rank(0), GroupId(0), mixed, Runs(RequestId(3), mixed.size())}, slots);
  ASSERT_FALSE(other);
  EXPECT_EQ(other.error().code(), ErrorCode::kNotFound);
  EXPECT_NE(other.error().message().find("belongs to request 2, not to request 3"), std::string::npos)
      << other.error().ToString();
  EXPECT_EQ(f.Take(), before3);
  // The owner's own selection of the same addresses is served, with its bytes.
  auto ok = f.planner.Step({Rank(0), GroupId(0), stale, Runs(RequestId(2), stale.size())}, slots);
  ASSERT_TRUE(ok) << ok.error().ToString();
  ExpectSlotsHoldEntries(f, GroupId(0), stale, slots);
  // Runs of count 0 are skipped; several runs may name one request.
  std::vector<SelectionRun> split{{RequestId(2), 0}, {RequestId(2), 1}, {RequestId(9), 0}, {RequestId(2), 1}};
  EXPECT_TRUE(f.planner.Step({Rank(0), GroupId(0), stale, split}, slots));
  EXPECT_TRUE(f.space->CheckInvariants());
}

// The prefill/decode rule: entries allocated in a round are used in that round (its
// attention reads them) and are not evicted before AdvanceRound(); a round that mixes a
// prefill chunk and decode steps works while its working set fits the device, and the
// error says what to do when it does not.
TEST(StepPlanner, MixedPrefillAndDecodeRoundAndTheErrorThatSaysWhatToDo) {
  SpaceFixture f(SmallConfig(4, 16));
  auto b = f.AddFilled(RequestId(2), Rank(0), 4);  // B's prompt fills the device ...
  f.space->AdvanceRound();                          // ... in its own round
  // Next round: A's prefill chunk (to host: the device is full) and B's decode step.
  auto a = f.AddFilled(RequestId(1), Rank(0), 3);
  EXPECT_EQ(f.space->Lookup(a[0], GroupId(0))->tier(), Tier::kHost);
  auto b_new = f.Extend(RequestId(2), 1);  // B's decode token, to host
  std::vector<LogicalAddr> sel{b[0], b_new[0]};
  std::vector<SlotId> slots(sel.size());
  ASSERT_TRUE(f.planner.Step({Rank(0), GroupId(0), sel, Runs(RequestId(2), sel.size())}, slots));
  ExpectSlotsHoldEntries(f, GroupId(0), sel, slots);
  // A's chunk attention in the same round: 3 misses, 2 evictable slots (b[2], b[3]).
  std::vector<SlotId> three(3);
  const auto before = f.Take();
  auto refused = f.planner.Step({Rank(0), GroupId(0), a, Runs(RequestId(1), a.size())}, three);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(refused.error().message().find("2 entries are used in this round"), std::string::npos)
      << refused.error().ToString();
  EXPECT_NE(refused.error().message().find("call AdvanceRound() after the round's attention"), std::string::npos);
  EXPECT_EQ(f.Take(), before);
  f.space->AdvanceRound();
  EXPECT_TRUE(f.planner.Step({Rank(0), GroupId(0), a, Runs(RequestId(1), a.size())}, three));
  ExpectSlotsHoldEntries(f, GroupId(0), a, three);
}

TEST(StepPlanner, EntriesAllocatedInARoundAreNotEvictedInThatRound) {
  SpaceFixture f(SmallConfig(2, 4));
  auto a = f.AddFilled(RequestId(1), Rank(0), 3);  // a0, a1 on device (this round), a2 on host
  std::vector<LogicalAddr> sel{a[2]};
  std::vector<SlotId> one(1);
  const auto before = f.Take();
  auto refused = f.planner.Step({Rank(0), GroupId(0), sel, Runs(RequestId(1), 1)}, one);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(refused.error().message().find("2 entries are used in this round"), std::string::npos)
      << refused.error().ToString();
  EXPECT_EQ(f.Take(), before);
  f.space->AdvanceRound();  // the prefill's round is over
  ASSERT_TRUE(f.planner.Step({Rank(0), GroupId(0), sel, Runs(RequestId(1), 1)}, one));
  ExpectSlotsHoldEntries(f, GroupId(0), sel, one);
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
  ASSERT_TRUE(planner.Step({Rank(0), GroupId(0), sel, Runs(RequestId(1), sel.size())}, slots));
  EXPECT_GE(submits, 1);
  EXPECT_EQ(waits, 1);
  EXPECT_EQ(space->Lookup(a[2], GroupId(0))->tier(), Tier::kDevice);
}

// The dedup stamps live in 14 bits of each location record (src/core/address_records.h):
// after 2^14 - 1 steps of a group the epoch starts over at 1, and the stamps are cleared
// then, so that an address last seen at epoch 1, 16,383 steps ago, is not taken for a
// duplicate when epoch 1 comes back.
TEST(StepPlanner, DedupStampsSurviveTheEpochWrap) {
  SpaceFixture f(SmallConfig(8, 8));
  auto a = f.AddFilled(RequestId(1), Rank(0), 3);
  std::vector<SlotId> slots(3);
  const std::uint32_t wrap = (1u << 14) - 1;
  for (std::uint32_t step = 1; step <= wrap + 2; ++step) {
    // a[2] only at epochs 1 (the first step and the first after the wrap).
    const bool with_a2 = step == 1 || step == wrap + 1;
    std::vector<LogicalAddr> sel{a[0], a[1], a[0]};
    if (with_a2) sel[2] = a[2];
    auto stats = f.planner.Step({Rank(0), GroupId(0), sel, Runs(RequestId(1), sel.size())}, slots);
    ASSERT_TRUE(stats) << stats.error().ToString();
    ASSERT_EQ(stats->distinct, with_a2 ? 3u : 2u) << "step " << step;
    f.space->AdvanceRound();
  }
  EXPECT_TRUE(f.space->CheckInvariants());
}

}  // namespace
}  // namespace ula

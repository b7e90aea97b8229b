// The SGLang-style decode loop  (item 1, "DP and TP"), in TP with attention at
// home: the engine allocates every running row's new token before the forward and looks up
// its location once (SGLang's out_cache_loc); per layer group it runs Plan, the descriptors
// (ExecuteOnShards) and Complete, then writes the token's KV of each layer at the looked-up
// location, straight into the rank's shard memory (TpAddressSpace::ShardMemory), and every
// rank gathers through its own indices, per layer, as FlashMLA's sparse decode reads a
// k_cache view of the shard's device pool (index = block * 64 + offset = slot). Every
// gathered row is compared with a dense reference.
//
// Before TP new tokens were placed on device (TpConfig::stable_new_entries, turned on by
// TpStepPlanner::Create), a new token went to its rank's host pool once the device
// pool was full, the same round's Plan swapped it in, its victim moved into the token's old
// host slot, and the KV write at the looked-up location corrupted the victim.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "backend/fault_backend.h"
#include "test_seed.h"
#include "tp/tp_fixture.h"
#include "ula/tp_step_planner.h"

namespace ula {
namespace {

constexpr std::uint32_t kRanks = 2;
constexpr std::uint32_t kGroups = 2;
constexpr std::uint32_t kLayers = 2;     // per group, side by side in a TP entry
constexpr std::uint32_t kRowBytes = 96;  // one layer's row
constexpr std::uint32_t kEntryBytes = kLayers * kRowBytes;
constexpr std::uint32_t kPage = 64;

void FillRow(std::byte* out, LogicalAddr a, std::uint32_t g, std::uint32_t l) {
  for (std::uint32_t i = 0; i < kRowBytes; ++i) out[i] = std::byte((a.value() * 131 + g * 17 + l * 29 + i) & 0xff);
}
bool RowMatches(const std::byte* row, LogicalAddr a, std::uint32_t g, std::uint32_t l) {
  std::byte want[kRowBytes];
  FillRow(want, a, g, l);
  return std::memcmp(row, want, kRowBytes) == 0;
}
std::vector<std::byte> EntryOf(LogicalAddr a, std::uint32_t g) {
  std::vector<std::byte> e(kEntryBytes);
  for (std::uint32_t l = 0; l < kLayers; ++l) FillRow(e.data() + l * kRowBytes, a, g, l);
  return e;
}

// The engine's KV write of one (token, group): every layer's row at `loc`, in the shard
// memory of the token's home rank.
void WriteKv(const TpAddressSpace& space, LogicalAddr a, std::uint32_t g, Location loc) {
  const TpShardMemory mem = space.ShardMemory(loc.rank(), GroupId(static_cast<std::uint16_t>(g)));
  std::byte* base = (loc.tier() == Tier::kDevice ? mem.device : mem.host).data;
  ASSERT_NE(base, nullptr);
  for (std::uint32_t l = 0; l < kLayers; ++l) {
    FillRow(base + std::size_t{loc.slot().value()} * kEntryBytes + l * kRowBytes, a, g, l);
  }
}

// FlashMLA's read of layer l through one rank's index: k_cache = device pool viewed as
// (num_blocks, 64, 1, entry), row index / 64, index % 64, the layer's sub-range.
const std::byte* Gather(const TpAddressSpace& space, Rank rank, std::uint32_t g, std::uint32_t l, std::int32_t index) {
  const TpShardMemory mem = space.ShardMemory(rank, GroupId(static_cast<std::uint16_t>(g)));
  const std::size_t block = static_cast<std::size_t>(index) / kPage, offset = static_cast<std::size_t>(index) % kPage;
  return mem.device.data + (block * kPage + offset) * kEntryBytes + l * kRowBytes;
}

struct LoopResult {
  std::uint64_t new_entries = 0;  // (token, group) entries of decode steps
  std::uint64_t new_on_host = 0;  // of them, looked up on host
  std::uint64_t new_moved = 0;    // of them, moved by the round's Plan / Complete
  std::uint64_t rows_gathered = 0;
  std::uint64_t rows_wrong = 0;
  std::uint64_t misses = 0;       // home misses the plans brought onto device
};

LoopResult RunLoop(std::uint32_t device_slots, std::uint32_t host_slots, std::uint32_t rows, std::uint32_t prompt,
                   std::uint32_t top_k, std::uint32_t steps, std::uint64_t seed) {
  auto backend = MakeCpuBackend();
  TpConfig c = testing::SmallTpConfig(kRanks, device_slots, host_slots, 0, kGroups, kEntryBytes);
  c.attention = TpAttention::kAtHome;
  c.page_tokens = kPage;
  c.stable_new_entries = true;  // the engine path's mode (step/engine_modes.h)
  auto space = TpAddressSpace::Create(c, *backend).value();
  auto engine = TpStepPlanner::Create(*space, {.max_batch = rows, .max_q_len = 1, .max_top_k = top_k}).value();
  std::vector<RequestId> requests;
  for (std::uint32_t b = 0; b < rows; ++b) {
    requests.push_back(RequestId(b + 1));
    EXPECT_TRUE(space->AddRequest(requests.back()));
    auto addrs = space->Allocate(requests.back(), prompt);  // prefill: its own round
    EXPECT_TRUE(addrs) << addrs.error().ToString();
    for (LogicalAddr a : *addrs) {
      for (std::uint32_t g = 0; g < kGroups; ++g) WriteKv(*space, a, g, space->Lookup(a, GroupId(g)).value());
    }
    space->AdvanceRound();
  }
  std::mt19937_64 rng(seed);
  const StepShape shape{rows, 1, top_k};
  std::vector<std::int32_t> sel(shape.size()), idx(kRanks * shape.size());
  std::vector<CopyDescriptor> desc(engine->max_descriptors());
  std::vector<std::uint8_t> status(desc.size());
  LoopResult out;
  for (std::uint32_t step = 0; step < steps; ++step) {
    std::vector<LogicalAddr> fresh(rows);
    std::vector<Location> out_cache_loc(std::size_t{rows} * kGroups);
    for (std::uint32_t b = 0; b < rows; ++b) {
      auto a = space->Allocate(requests[b], 1);
      EXPECT_TRUE(a) << a.error().ToString();
      if (!a) return out;
      fresh[b] = (*a)[0];
      for (std::uint32_t g = 0; g < kGroups; ++g) {
        out_cache_loc[b * kGroups + g] = space->Lookup(fresh[b], GroupId(g)).value();
        ++out.new_entries;
        out.new_on_host += out_cache_loc[b * kGroups + g].tier() == Tier::kHost;
      }
    }
    for (std::uint32_t g = 0; g < kGroups; ++g) {
      // The group's indexer: the new token first, then top_k - 1 other tokens of the row.
      for (std::uint32_t b = 0; b < rows; ++b) {
        auto list = space->AddressesOf(requests[b]).value();
        std::vector<LogicalAddr> pool(list.begin(), list.end() - 1);
        std::shuffle(pool.begin(), pool.end(), rng);
        sel[b * top_k] = static_cast<std::int32_t>(fresh[b].value());
        for (std::uint32_t k = 1; k < top_k; ++k) sel[b * top_k + k] = static_cast<std::int32_t>(pool[k - 1].value());
      }
      auto plan = engine->Plan(GroupId(g), shape, requests, sel, idx, desc);
      EXPECT_TRUE(plan) << plan.error().ToString();
      if (!plan) return out;
      out.misses += plan->num_descriptors;
      auto st = std::span(status).first(plan->num_descriptors);
      engine->ExecuteOnShards(std::span(desc).first(plan->num_descriptors), st);
      auto done = engine->Complete(plan->fence, st);
      EXPECT_TRUE(done && done->failed == 0);
      // The group's layers: KV write at out_cache_loc, then every rank's partial attention
      // gathers its own shard's rows.
      for (std::uint32_t b = 0; b < rows; ++b) {
        out.new_moved += space->Lookup(fresh[b], GroupId(g)).value() != out_cache_loc[b * kGroups + g];
        WriteKv(*space, fresh[b], g, out_cache_loc[b * kGroups + g]);
      }
      for (std::uint32_t r = 0; r < kRanks; ++r) {
        const Rank rank(static_cast<std::uint16_t>(r));
        for (std::size_t j = 0; j < shape.size(); ++j) {
          const LogicalAddr a(static_cast<std::uint32_t>(sel[j]));
          const std::int32_t index = idx[r * shape.size() + j];
          if (space->HomeOf(a) != rank) {
            EXPECT_EQ(index, kPadIndex) << "rank " << r << " indexes address " << a.value() << " homed elsewhere";
            continue;
          }
          EXPECT_GE(index, 0);
          if (index < 0) continue;
          for (std::uint32_t l = 0; l < kLayers; ++l) {
            ++out.rows_gathered;
            out.rows_wrong += !RowMatches(Gather(*space, rank, g, l, index), a, g, l);
          }
        }
      }
    }
    space->AdvanceRound();  // after the step's attention
    EXPECT_TRUE(space->CheckInvariants());
  }
  return out;
}

// 4 rows of 200 prompt tokens (400 per rank and group) over 128 device and 512 host slots
// per rank and group, top-k 32: the device pools are full before the first decode step, so
// every new token takes a victim's slot; every selection's home misses come in by swaps.
TEST(TpEngineLoop, NewTokensWriteWhereLookedUpAndEveryGatheredRowMatches) {
  ULA_TEST_SEEDED(seed, 20261203);
  const LoopResult r = RunLoop(/*device=*/128, /*host=*/512, /*rows=*/4, /*prompt=*/200, /*top_k=*/32, /*steps=*/6, seed);
  EXPECT_EQ(r.new_entries, 6u * 4 * kGroups);
  EXPECT_EQ(r.new_on_host, 0u) << "new entries placed on host";
  EXPECT_EQ(r.new_moved, 0u) << "new entries moved by the round that allocated them";
  EXPECT_EQ(r.rows_wrong, 0u) << "of " << r.rows_gathered << " gathered rows";
  EXPECT_EQ(r.rows_gathered, 6u * kGroups * 4 * 32 * kLayers);
  EXPECT_GT(r.misses, 100u);  // the selections do bring prompt entries in from host
  std::printf("tp engine loop: %llu new entries, %llu rows gathered, %llu wrong, %llu home misses\n",
              static_cast<unsigned long long>(r.new_entries), static_cast<unsigned long long>(r.rows_gathered),
              static_cast<unsigned long long>(r.rows_wrong), static_cast<unsigned long long>(r.misses));
}

std::vector<std::uint64_t> Lookups(const TpAddressSpace& s, std::span<const LogicalAddr> addrs) {
  std::vector<std::uint64_t> v;
  for (LogicalAddr a : addrs) {
    for (std::uint32_t g = 0; g < kGroups; ++g) v.push_back(s.Lookup(a, GroupId(g))->bits());
  }
  return v;
}

void ExpectBytes(const TpAddressSpace& s, std::span<const LogicalAddr> addrs) {
  std::vector<std::byte> got(kEntryBytes);
  for (LogicalAddr a : addrs) {
    for (std::uint32_t g = 0; g < kGroups; ++g) {
      ASSERT_TRUE(s.Read(a, GroupId(g), got));
      EXPECT_EQ(got, EntryOf(a, g)) << "address " << a.value() << " group " << g;
    }
  }
}

// A prefill chunk larger than the device pools: what does not fit next to this round's
// entries goes to host, pinned for the round (NumNewOnHost); a step of the round that must
// move one is refused on every rank and changes nothing; after AdvanceRound it runs.
TEST(TpEngineLoop, NewEntriesPinnedOnHostStayThereForTheirRound) {
  auto backend = MakeCpuBackend();
  TpConfig c = testing::TpEngineModes(testing::SmallTpConfig(kRanks, /*device=*/4, /*host=*/32, 0, kGroups, kEntryBytes));
  c.attention = TpAttention::kAtHome;
  auto space = TpAddressSpace::Create(c, *backend).value();
  auto engine = TpStepPlanner::Create(*space, {.max_batch = 1, .max_q_len = 1, .max_top_k = 4}).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1)));
  const auto addrs = space->Allocate(RequestId(1), 12).value();  // 6 per rank: 4 on device, 2 pinned
  for (LogicalAddr a : addrs) {
    for (std::uint32_t g = 0; g < kGroups; ++g) ASSERT_TRUE(space->Write(a, GroupId(g), EntryOf(a, g)));
  }
  for (std::uint32_t r = 0; r < kRanks; ++r) {
    for (std::uint32_t g = 0; g < kGroups; ++g) {
      EXPECT_EQ(space->NumNewOnHost(Rank(static_cast<std::uint16_t>(r)), GroupId(g)), 2u) << "rank " << r;
    }
  }
  ASSERT_EQ(space->Lookup(addrs[11], GroupId(0))->tier(), Tier::kHost);
  ASSERT_TRUE(space->CheckInvariants());
  const std::vector<RequestId> rows{RequestId(1)};
  const std::vector<std::int32_t> sel{static_cast<std::int32_t>(addrs[11].value()), kPadIndex, kPadIndex, kPadIndex};
  std::vector<std::int32_t> idx(kRanks * 4, 777);
  std::vector<CopyDescriptor> desc(engine->max_descriptors());
  const std::uint64_t before = space->DebugDigest();
  for (bool plan : {true, false}) {
    std::optional<Error> refused;
    if (plan) {
      if (auto r = engine->Plan(GroupId(0), {1, 1, 4}, rows, sel, idx, desc); !r) refused = r.error();
    } else {
      if (auto r = engine->Step(GroupId(0), {1, 1, 4}, rows, sel, idx); !r) refused = r.error();
    }
    ASSERT_TRUE(refused.has_value()) << (plan ? "Plan" : "Step");
    EXPECT_EQ(refused->code(), ErrorCode::kResourceExhausted);
    EXPECT_NE(refused->message().find("placed on host by this round's Allocate"), std::string::npos)
        << refused->ToString();
    EXPECT_EQ(space->DebugDigest(), before);
    EXPECT_EQ(idx, std::vector<std::int32_t>(kRanks * 4, 777));
  }
  space->AdvanceRound();
  EXPECT_EQ(space->NumNewOnHost(Rank(1), GroupId(0)), 0u);
  auto ok = engine->Step(GroupId(0), {1, 1, 4}, rows, sel, idx);
  ASSERT_TRUE(ok) << ok.error().ToString();
  const Rank home = space->HomeOf(addrs[11]);
  ASSERT_GE(idx[home.value() * 4], 0);
  EXPECT_TRUE(RowMatches(Gather(*space, home, 0, 1, idx[home.value() * 4]), addrs[11], 0, 1));
  ExpectBytes(*space, addrs);
  EXPECT_TRUE(space->CheckInvariants());
}

// A victim batch that fails (every copy of the backend refused): Allocate still succeeds,
// as the replicated directory requires; the victims keep their device slots, homes and
// bytes; the new tokens of that batch sit on host, pinned for the round, so a step that
// selects one is refused; the next round evicts the victims normally.
TEST(TpEngineLoop, FailedVictimMovesPinTheNewTokensAndLoseNothing) {
  auto inner = MakeCpuBackend();
  auto faults = MakeFaultInjectingBackend(*inner, FaultPlan{.fail_fraction = 1.0, .partial = true}).value();
  faults->set_armed(false);
  TpConfig c = testing::TpEngineModes(testing::SmallTpConfig(kRanks, /*device=*/4, /*host=*/32, 0, kGroups, kEntryBytes));
  c.attention = TpAttention::kAtHome;
  auto space = TpAddressSpace::Create(c, *faults).value();
  auto engine = TpStepPlanner::Create(*space, {.max_batch = 1, .max_q_len = 1, .max_top_k = 4}).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1)));
  const auto old = space->Allocate(RequestId(1), 8).value();  // fills both ranks' device pools
  for (LogicalAddr a : old) {
    for (std::uint32_t g = 0; g < kGroups; ++g) ASSERT_TRUE(space->Write(a, GroupId(g), EntryOf(a, g)));
  }
  space->AdvanceRound();
  const auto before = Lookups(*space, old);
  faults->set_armed(true);
  auto fresh = space->Allocate(RequestId(1), 2);  // one token per rank, each needing a victim
  faults->set_armed(false);
  ASSERT_TRUE(fresh) << fresh.error().ToString();
  EXPECT_EQ(Lookups(*space, old), before) << "a victim moved although its batch failed";
  for (LogicalAddr a : *fresh) {
    for (std::uint32_t g = 0; g < kGroups; ++g) {
      EXPECT_EQ(space->Lookup(a, GroupId(g))->tier(), Tier::kHost);
      EXPECT_EQ(space->NumNewOnHost(space->HomeOf(a), GroupId(g)), 1u);
      ASSERT_TRUE(space->Write(a, GroupId(g), EntryOf(a, g)));
    }
  }
  ExpectBytes(*space, old);
  ASSERT_TRUE(space->CheckInvariants());
  const std::vector<RequestId> rows{RequestId(1)};
  const std::vector<std::int32_t> sel{static_cast<std::int32_t>((*fresh)[0].value()), kPadIndex, kPadIndex, kPadIndex};
  std::vector<std::int32_t> idx(kRanks * 4);
  auto refused = engine->Step(GroupId(1), {1, 1, 4}, rows, sel, idx);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kResourceExhausted) << refused.error().ToString();
  // The next round: the failed victims were used in the last one only.
  space->AdvanceRound();
  auto next = space->Allocate(RequestId(1), 2);
  ASSERT_TRUE(next) << next.error().ToString();
  for (LogicalAddr a : *next) {
    for (std::uint32_t g = 0; g < kGroups; ++g) {
      EXPECT_EQ(space->Lookup(a, GroupId(g))->tier(), Tier::kDevice);
      ASSERT_TRUE(space->Write(a, GroupId(g), EntryOf(a, g)));
    }
  }
  ExpectBytes(*space, old);
  ExpectBytes(*space, *fresh);
  ExpectBytes(*space, *next);
  auto ok = engine->Step(GroupId(1), {1, 1, 4}, rows, sel, idx);
  ASSERT_TRUE(ok) << ok.error().ToString();
  EXPECT_TRUE(space->CheckInvariants());
}

// The library path keeps its behaviour: without stable_new_entries a new token goes to host
// once the device is full, and the round's step may move it (Write then follows it).
TEST(TpEngineLoop, WithoutStableNewEntriesANewTokenGoesToHost) {
  auto backend = MakeCpuBackend();
  TpConfig c = testing::SmallTpConfig(kRanks, /*device=*/4, /*host=*/32, 0, kGroups, kEntryBytes);
  c.attention = TpAttention::kAtHome;
  auto space = TpAddressSpace::Create(c, *backend).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1)));
  ASSERT_TRUE(space->Allocate(RequestId(1), 8));
  space->AdvanceRound();
  const auto a = space->Allocate(RequestId(1), 2).value();
  EXPECT_EQ(space->Lookup(a[0], GroupId(0))->tier(), Tier::kHost);
  EXPECT_EQ(space->NumNewOnHost(space->HomeOf(a[0]), GroupId(0)), 0u);
  c.stable_new_entries = true;
  auto stable = TpAddressSpace::Create(c, *backend).value();
  ASSERT_TRUE(stable->AddRequest(RequestId(1)));
  ASSERT_TRUE(stable->Allocate(RequestId(1), 8));
  stable->AdvanceRound();
  const auto b = stable->Allocate(RequestId(1), 2).value();
  EXPECT_EQ(stable->Lookup(b[0], GroupId(0))->tier(), Tier::kDevice);
  EXPECT_TRUE(space->CheckInvariants());
  EXPECT_TRUE(stable->CheckInvariants());
}

}  // namespace
}  // namespace ula

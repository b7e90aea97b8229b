// The SGLang-style decode loop  (items 1 and 3), in C++: the engine allocates
// every running row's new token before the forward and looks up its location once (SGLang's
// out_cache_loc, computed at schedule time); per layer group it runs plan, the descriptors
// and complete, then writes the token's KV of each layer at the looked-up location and
// gathers through the returned indices per layer as FlashMLA's sparse decode does
// (k_cache = layer.view(num_blocks, 64, 1, 656), index = block * 64 + offset = slot). Every
// gathered row is compared with a dense reference (the bytes each (token, group, layer)
// was written with).
//
// The measured case: 2 groups of 2 layers, 656-byte rows, top-k 2048, 13,900 prompt
// tokens per group over 8,448 device and 20,480 host slots, so that the device pool has no
// free slot for a step's new tokens. Before new tokens were placed on device (,
// item 1) each new entry went to host, the same step's plan swapped it in, its victim moved
// into the token's old host slot, and the KV write at the looked-up location corrupted the
// victim (and left the token's device row unwritten).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/fault_backend.h"
#include "step/space_fixture.h"
#include "test_seed.h"
#include "ula/address_space.h"
#include "ula/step_planner.h"

namespace ula {
namespace {

constexpr std::uint32_t kRowBytes = 656;  // GLM-5's FP8 MLA entry of one layer
constexpr std::uint32_t kLayers = 2;      // per group
constexpr std::uint32_t kGroups = 2;
constexpr std::uint32_t kPage = 64;       // FlashMLA's page_block_size, SGLang's page size

// The bytes (token, group, layer) is written with: the dense reference.
void Fill(std::byte* out, LogicalAddr a, std::uint32_t g, std::uint32_t l) {
  for (std::uint32_t i = 0; i < kRowBytes; ++i) out[i] = std::byte((a.value() * 131 + g * 17 + l * 29 + i) & 0xff);
}
bool Matches(const std::byte* row, LogicalAddr a, std::uint32_t g, std::uint32_t l) {
  std::byte want[kRowBytes];
  Fill(want, a, g, l);
  return std::memcmp(row, want, kRowBytes) == 0;
}

// Engine memory of one (tier, group): [layers][slots][656], each layer a FlashMLA k_cache.
struct LayerPools {
  std::uint32_t slots = 0;
  std::vector<std::byte> bytes;
  std::byte* Row(std::uint32_t layer, std::uint32_t slot) {
    return bytes.data() + (std::size_t{layer} * slots + slot) * kRowBytes;
  }
  // FlashMLA's read: k_cache[layer].view(num_blocks, 64, 1, 656)[index / 64][index % 64][0].
  const std::byte* Gather(std::uint32_t layer, std::int32_t index) {
    const std::uint32_t block = static_cast<std::uint32_t>(index) / kPage, offset = static_cast<std::uint32_t>(index) % kPage;
    return bytes.data() + ((std::size_t{layer} * (slots / kPage) + block) * kPage + offset) * kRowBytes;
  }
  EngineRegion Region() {
    return EngineRegion{reinterpret_cast<std::uintptr_t>(bytes.data()), std::uint64_t{slots} * kRowBytes, kRowBytes,
                        kLayers, slots};
  }
};

struct LoopResult {
  std::uint64_t new_entries = 0;         // (token, group) entries allocated by decode steps
  std::uint64_t new_on_host = 0;         // of them, placed on host
  std::uint64_t new_moved = 0;           // of them, moved by the same step's plan
  std::uint64_t rows_gathered = 0;
  std::uint64_t rows_wrong = 0;          // gathered rows that differ from the reference
  std::uint64_t misses = 0;
};

// Runs prefill of `prompts` tokens per request, then `steps` decode steps of one new token
// per running row, and checks every gathered row.
LoopResult RunLoop(std::uint32_t device_slots, std::uint32_t host_slots, std::vector<std::uint32_t> prompts,
                   std::uint32_t top_k, std::uint32_t steps, std::uint64_t seed) {
  auto backend = MakeCountingBackend();  // the engine owns the bytes
  AddressSpaceConfig cfg;
  cfg.num_groups = kGroups;
  cfg.entry_bytes = kLayers * kRowBytes;
  cfg.row_bytes = kRowBytes;  // two layers of 656-byte rows, as the engine memory registers them
  cfg.device_bytes_per_rank = std::uint64_t{device_slots} * cfg.entry_bytes * kGroups;
  cfg.host_bytes_per_rank = std::uint64_t{host_slots} * cfg.entry_bytes * kGroups;
  cfg.page_tokens = kPage;
  cfg.stable_new_entries = true;  // the engine path's mode (step/engine_modes.h)
  auto space = AddressSpace::Create(cfg, *backend).value();
  const std::uint32_t batch = static_cast<std::uint32_t>(prompts.size());
  auto planner = StepPlanner::Create(*space, {.max_batch = batch, .max_q_len = 1, .max_top_k = top_k}).value();
  LayerPools mem[kNumTiers][kGroups];
  for (std::uint32_t g = 0; g < kGroups; ++g) {
    mem[0][g] = {device_slots, std::vector<std::byte>(std::size_t{kLayers} * device_slots * kRowBytes)};
    mem[1][g] = {host_slots, std::vector<std::byte>(std::size_t{kLayers} * host_slots * kRowBytes)};
    EXPECT_TRUE(planner->RegisterEngineMemory(Tier::kDevice, Rank(0), GroupId(g), mem[0][g].Region()));
    EXPECT_TRUE(planner->RegisterEngineMemory(Tier::kHost, Rank(0), GroupId(g), mem[1][g].Region()));
  }
  // The KV write of a token: every layer of every group at the location looked up for it.
  auto write_kv = [&](LogicalAddr a, std::uint32_t g, Location loc) {
    for (std::uint32_t l = 0; l < kLayers; ++l) Fill(mem[static_cast<int>(loc.tier())][g].Row(l, loc.slot().value()), a, g, l);
  };
  std::vector<RequestId> requests;
  for (std::uint32_t b = 0; b < batch; ++b) {
    const RequestId r(b + 1);
    requests.push_back(r);
    EXPECT_TRUE(space->AddRequest(r, Rank(0)));
    auto addrs = space->Allocate(r, prompts[b]);  // prefill: its own round
    EXPECT_TRUE(addrs) << addrs.error().ToString();
    for (LogicalAddr a : *addrs) {
      for (std::uint32_t g = 0; g < kGroups; ++g) write_kv(a, g, space->Lookup(a, GroupId(g)).value());
    }
    space->AdvanceRound();
  }
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> sel(std::size_t{batch} * top_k), idx(sel.size());
  std::vector<CopyDescriptor> desc(planner->max_descriptors());
  std::vector<std::uint8_t> status(desc.size());
  LoopResult out;
  for (std::uint32_t step = 0; step < steps; ++step) {
    // Schedule: one new token per running row, its location looked up once (out_cache_loc).
    std::vector<LogicalAddr> fresh(batch);
    std::vector<Location> out_cache_loc(std::size_t{batch} * kGroups);
    for (std::uint32_t b = 0; b < batch; ++b) {
      auto a = space->Allocate(requests[b], 1);
      EXPECT_TRUE(a) << a.error().ToString();
      fresh[b] = (*a)[0];
      for (std::uint32_t g = 0; g < kGroups; ++g) {
        out_cache_loc[b * kGroups + g] = space->Lookup(fresh[b], GroupId(g)).value();
        ++out.new_entries;
        out.new_on_host += out_cache_loc[b * kGroups + g].tier() == Tier::kHost;
      }
    }
    for (std::uint32_t g = 0; g < kGroups; ++g) {
      // The group's indexer: the new token and top_k - 1 other tokens of the row's request.
      for (std::uint32_t b = 0; b < batch; ++b) {
        std::vector<LogicalAddr> pool(space->AddressesOf(requests[b]).value().begin(),
                                      space->AddressesOf(requests[b]).value().end());
        pool.pop_back();  // the new token, placed first
        for (std::uint32_t k = 0; k + 1 < top_k && k < pool.size(); ++k) {
          std::swap(pool[k], pool[k + rng() % (pool.size() - k)]);
        }
        sel[b * top_k] = static_cast<std::int32_t>(fresh[b].value());
        for (std::uint32_t k = 1; k < top_k; ++k) {
          sel[b * top_k + k] = k - 1 < pool.size() ? static_cast<std::int32_t>(pool[k - 1].value()) : kPadIndex;
        }
      }
      auto plan = planner->Plan(Rank(0), GroupId(g), {batch, 1, top_k}, requests, sel, idx, desc);
      EXPECT_TRUE(plan) << plan.error().ToString();
      if (!plan) return out;
      out.misses += plan->num_descriptors;
      auto st = std::span(status).first(plan->num_descriptors);
      planner->ExecuteOnEngineMemory(std::span(desc).first(plan->num_descriptors), st);
      auto done = planner->Complete(plan->fence, st);
      EXPECT_TRUE(done && done->failed == 0);
      // The forward of the group's layers: KV write at out_cache_loc, then attention.
      for (std::uint32_t b = 0; b < batch; ++b) {
        const Location now = space->Lookup(fresh[b], GroupId(g)).value();
        out.new_moved += now != out_cache_loc[b * kGroups + g];
        write_kv(fresh[b], g, out_cache_loc[b * kGroups + g]);
      }
      for (std::uint32_t b = 0; b < batch; ++b) {
        for (std::uint32_t k = 0; k < top_k; ++k) {
          const std::int32_t v = sel[b * top_k + k];
          if (v == kPadIndex) continue;
          for (std::uint32_t l = 0; l < kLayers; ++l) {
            ++out.rows_gathered;
            out.rows_wrong += !Matches(mem[0][g].Gather(l, idx[b * top_k + k]), LogicalAddr(static_cast<std::uint32_t>(v)), g, l);
          }
        }
      }
    }
    space->AdvanceRound();  // after the step's attention
  }
  EXPECT_TRUE(space->CheckInvariants());
  return out;
}

// The case: 4 rows of 3,475 prompt tokens (13,900 per group) over 8,448 device and
// 20,480 host slots, top-k 2048 (4 x 2048 = 8,192 selections fit the device), 7 decode
// steps (56 new (token, group) entries). Every new entry is placed on device and stays
// where it was looked up; every gathered row matches the reference.
TEST(EngineLoop, NewTokensWriteWhereLookedUpAndEveryGatheredRowMatches) {
  ULA_TEST_SEEDED(seed, 20261201);
  const LoopResult r = RunLoop(8448, 20480, {3475, 3475, 3475, 3475}, 2048, 7, seed);
  EXPECT_EQ(r.new_entries, 56u);
  EXPECT_EQ(r.new_on_host, 0u) << "new entries placed on host";
  EXPECT_EQ(r.new_moved, 0u) << "new entries moved by the step that allocated them";
  EXPECT_EQ(r.rows_wrong, 0u) << "of " << r.rows_gathered << " gathered rows";
  EXPECT_EQ(r.rows_gathered, 7u * kGroups * 4 * 2048 * kLayers);
  EXPECT_GT(r.misses, 1000u);  // the selections do bring prompt entries in from host
}

// Rows of unequal length, prompts that end inside a page, a request's pages: token i of a
// request at offset i % 64 of its page, so page_table_1[:, ::64] // 64 names its pages.
TEST(EngineLoop, RequestsHoldWholePagesOfAddresses) {
  auto backend = MakeCountingBackend();
  AddressSpaceConfig cfg;
  cfg.entry_bytes = kRowBytes;
  cfg.device_bytes_per_rank = std::uint64_t{256} * kRowBytes;
  cfg.host_bytes_per_rank = std::uint64_t{1024} * kRowBytes;
  auto space = AddressSpace::Create(cfg, *backend).value();
  const std::uint32_t lengths[3] = {100, 64, 1};
  for (std::uint32_t b = 0; b < 3; ++b) ASSERT_TRUE(space->AddRequest(RequestId(b), Rank(0)));
  // Prefill, then decode steps interleaving the requests' new tokens.
  for (std::uint32_t b = 0; b < 3; ++b) ASSERT_TRUE(space->Allocate(RequestId(b), lengths[b]));
  for (int step = 0; step < 70; ++step) {
    for (std::uint32_t b = 0; b < 3; ++b) ASSERT_TRUE(space->Allocate(RequestId(b), 1));
    space->AdvanceRound();
  }
  std::vector<std::uint32_t> pages_seen;
  for (std::uint32_t b = 0; b < 3; ++b) {
    auto list = space->AddressesOf(RequestId(b)).value();
    for (std::size_t i = 0; i < list.size(); ++i) {
      const LogicalAddr page_start = list[i / kPage * kPage];  // page_table_1[:, ::64]
      ASSERT_EQ(list[i].value() % kPage, i % kPage) << "request " << b << " token " << i;
      ASSERT_EQ(list[i].value() / kPage, page_start.value() / kPage) << "request " << b << " token " << i;
      if (i % kPage == 0) pages_seen.push_back(page_start.value() / kPage);
    }
  }
  std::sort(pages_seen.begin(), pages_seen.end());
  EXPECT_EQ(std::adjacent_find(pages_seen.begin(), pages_seen.end()), pages_seen.end()) << "a page in two requests";
  // A freed request's pages come back first in first-out order, whole.
  const std::uint32_t first_page_of_0 = space->AddressesOf(RequestId(0)).value()[0].value() / kPage;
  ASSERT_TRUE(space->Free(RequestId(0)));
  ASSERT_TRUE(space->AddRequest(RequestId(9), Rank(0)));
  auto again = space->Allocate(RequestId(9), 3).value();
  EXPECT_EQ(again[0].value(), first_page_of_0 * kPage);
  EXPECT_EQ(again[2].value(), first_page_of_0 * kPage + 2);
  EXPECT_TRUE(space->CheckInvariants());
}

// Allocate's victims move to host before the new tokens take their slots; when a move
// fails (the backend's batch, or an engine's executor), nothing is allocated, every entry
// keeps its location and its bytes, and the next round's Allocate succeeds.
TEST(EngineLoop, AllocateWhoseVictimMovesFailAllocatesNothing) {
  auto inner = MakeCpuBackend();
  auto faults = MakeFaultInjectingBackend(*inner, FaultPlan{.fail_fraction = 1.0, .partial = true}).value();
  AddressSpaceConfig config = testing::SmallConfig(4, 16, 1, 2);
  config.stable_new_entries = true;
  auto space = AddressSpace::Create(config, *faults).value();
  faults->set_armed(false);
  ASSERT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
  auto old = space->Allocate(RequestId(1), 4).value();  // fills the device
  for (LogicalAddr a : old) {
    for (std::uint32_t g = 0; g < 2; ++g) ASSERT_TRUE(space->Write(a, GroupId(g), testing::Pattern(a, g, 32)));
  }
  space->AdvanceRound();
  auto lookups = [&] {
    std::vector<std::uint64_t> v;
    for (LogicalAddr a : old)
      for (std::uint32_t g = 0; g < 2; ++g) v.push_back(space->Lookup(a, GroupId(g))->bits());
    return v;
  };
  const auto before = lookups();
  faults->set_armed(true);
  auto failed = space->Allocate(RequestId(1), 2);
  faults->set_armed(false);
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code(), ErrorCode::kIo) << failed.error().ToString();
  EXPECT_EQ(space->AddressesOf(RequestId(1))->size(), 4u);
  EXPECT_EQ(lookups(), before);
  EXPECT_EQ(space->NumUsed(Rank(0), GroupId(0), Tier::kHost), 0u);
  ASSERT_TRUE(space->CheckInvariants());
  // An engine executor that fails (next round: the failed victims were used in this one).
  space->AdvanceRound();
  space->SetMoveExecutor([](std::span<const CopyDescriptor>) -> Status { return MakeError(ErrorCode::kIo, "copy engine"); });
  ASSERT_FALSE(space->Allocate(RequestId(1), 1));
  EXPECT_EQ(lookups(), before);
  space->SetMoveExecutor(nullptr);
  // The failed victims count as used in this round; the next round evicts them normally.
  space->AdvanceRound();
  auto fresh = space->Allocate(RequestId(1), 2);
  ASSERT_TRUE(fresh) << fresh.error().ToString();
  for (LogicalAddr a : *fresh) EXPECT_EQ(space->Lookup(a, GroupId(1))->tier(), Tier::kDevice);
  std::vector<std::byte> bytes(32);
  for (LogicalAddr a : old) {
    for (std::uint32_t g = 0; g < 2; ++g) {
      ASSERT_TRUE(space->Read(a, GroupId(g), bytes));
      EXPECT_EQ(bytes, testing::Pattern(a, g, 32)) << "address " << a.value() << " group " << g;
    }
  }
  EXPECT_EQ(space->NumUsed(Rank(0), GroupId(0), Tier::kHost), 2u);
  EXPECT_TRUE(space->CheckInvariants());
}

// The same rule when Allocate reuses freed pages out of address order (page 1 freed before
// page 0): the round's host-placed entries are found by every step of the round whatever the
// order their pages were handed out in, so none of them is moved to a device slot that frees
// up later in the round.
TEST(EngineLoop, NewEntriesOnHostStayFindableWhenPagesAreReusedOutOfOrder) {
  auto backend = MakeCpuBackend();
  AddressSpaceConfig c = testing::EngineModes(testing::SmallConfig(4, 16));
  c.page_tokens = 2;
  auto space = AddressSpace::Create(c, *backend).value();
  auto planner = StepPlanner::Create(*space, {.max_batch = 1, .max_q_len = 1, .max_top_k = 4}).value();
  for (std::uint64_t r = 1; r <= 4; ++r) ASSERT_TRUE(space->AddRequest(RequestId(r), Rank(0)));
  ASSERT_TRUE(space->Allocate(RequestId(2), 2));  // page 0
  ASSERT_TRUE(space->Allocate(RequestId(3), 2));  // page 1: the device (4 slots) is full
  space->AdvanceRound();
  ASSERT_TRUE(space->Allocate(RequestId(1), 4));  // pages 2, 3 on the device; requests 2, 3 to host
  ASSERT_TRUE(space->Free(RequestId(3)));         // page 1 freed first,
  ASSERT_TRUE(space->Free(RequestId(2)));         // then page 0
  auto a = space->Allocate(RequestId(4), 4).value();
  ASSERT_EQ(a, (std::vector<LogicalAddr>{LogicalAddr(2), LogicalAddr(3), LogicalAddr(0), LogicalAddr(1)}))
      << "pages are reused in the order they were freed";
  for (LogicalAddr x : a) {
    ASSERT_EQ(space->Lookup(x, GroupId(0))->tier(), Tier::kHost) << "the device held only this round's entries";
    ASSERT_TRUE(space->Write(x, GroupId(0), testing::Pattern(x, 0, 32)));
  }
  ASSERT_TRUE(space->Free(RequestId(1)));  // four device slots free up in the same round
  const std::vector<RequestId> rows{RequestId(4)};
  std::vector<std::int32_t> idx(1);
  for (LogicalAddr x : a) {
    SCOPED_TRACE(x.value());
    const Location where = *space->Lookup(x, GroupId(0));
    const std::uint64_t before = space->DebugDigest();
    const std::vector<std::int32_t> sel{static_cast<std::int32_t>(x.value())};
    auto refused = planner->Step(Rank(0), GroupId(0), {1, 1, 1}, rows, sel, idx);
    ASSERT_FALSE(refused) << "a step moved address " << x.value() << " in the round that placed it on host";
    EXPECT_NE(refused.error().message().find("placed on host by this round's Allocate"), std::string::npos)
        << refused.error().ToString();
    EXPECT_EQ(space->DebugDigest(), before);
    EXPECT_EQ(*space->Lookup(x, GroupId(0)), where);
  }
  EXPECT_TRUE(space->CheckInvariants());
}

// A new entry Allocate had to put on host (the device held only this round's entries) is
// written at that host slot: even when device slots free up later in the round, no step of
// the round moves it (it would leave the engine's write behind); the next round may.
TEST(EngineLoop, NewEntryPlacedOnHostStaysThereForItsRound) {
  auto backend = MakeCpuBackend();
  auto space = AddressSpace::Create(testing::EngineModes(testing::SmallConfig(4, 16)), *backend).value();
  auto planner = StepPlanner::Create(*space, {.max_batch = 1, .max_q_len = 1, .max_top_k = 2}).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
  ASSERT_TRUE(space->AddRequest(RequestId(2), Rank(0)));
  ASSERT_TRUE(space->Allocate(RequestId(2), 2));
  auto a = space->Allocate(RequestId(1), 4).value();  // 2 to free device slots, 2 to host
  ASSERT_EQ(space->Lookup(a[3], GroupId(0))->tier(), Tier::kHost);
  for (LogicalAddr x : a) ASSERT_TRUE(space->Write(x, GroupId(0), testing::Pattern(x, 0, 32)));
  ASSERT_TRUE(space->Free(RequestId(2)));  // two device slots free up in the same round
  const std::vector<std::int32_t> sel{static_cast<std::int32_t>(a[2].value()), static_cast<std::int32_t>(a[3].value())};
  std::vector<std::int32_t> idx(2);
  const std::vector<RequestId> rows{RequestId(1)};
  const std::uint64_t before = space->DebugDigest();
  auto refused = planner->Step(Rank(0), GroupId(0), {1, 1, 2}, rows, sel, idx);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(refused.error().message().find("placed on host by this round's Allocate"), std::string::npos)
      << refused.error().ToString();
  EXPECT_EQ(space->DebugDigest(), before);
  space->AdvanceRound();
  auto ok = planner->Step(Rank(0), GroupId(0), {1, 1, 2}, rows, sel, idx);
  ASSERT_TRUE(ok) << ok.error().ToString();
  for (std::size_t k = 0; k < 2; ++k) {
    const std::byte* p = space->DeviceSlotData(Rank(0), GroupId(0), SlotId(static_cast<std::uint32_t>(idx[k])));
    const auto want = testing::Pattern(LogicalAddr(static_cast<std::uint32_t>(sel[k])), 0, 32);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(std::memcmp(p, want.data(), 32), 0);
  }
  EXPECT_TRUE(space->CheckInvariants());
}

}  // namespace
}  // namespace ula

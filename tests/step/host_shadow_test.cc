// Host shadows (sparse/host_shadows.h): a fetched entry's host slot stays as a
// clean copy, counted free; evicting the entry then moves no bytes; a write drops it; host
// allocations reclaim the oldest before they fail; every entry always reads its own bytes.
#include <gtest/gtest.h>

#include <random>

#include "backend/fault_backend.h"
#include "step/space_fixture.h"
#include "test_seed.h"
#include "ula/device_step.h"

namespace ula {
namespace {

using testing::Pattern;
using testing::Runs;
using testing::SmallConfig;

constexpr std::uint32_t kBytes = 32;

AddressSpaceConfig ShadowConfig(std::uint32_t device, std::uint32_t host, std::uint32_t ranks = 1,
                                std::uint32_t groups = 1) {
  AddressSpaceConfig c = SmallConfig(device, host, ranks, groups, kBytes);
  c.host_shadows = true;
  return c;
}

void ExpectBytes(const AddressSpace& space, std::span<const LogicalAddr> addrs, std::uint32_t groups = 1) {
  std::vector<std::byte> got(kBytes);
  for (LogicalAddr a : addrs) {
    for (std::uint32_t g = 0; g < groups; ++g) {
      ASSERT_TRUE(space.Read(a, GroupId(static_cast<std::uint16_t>(g)), got));
      EXPECT_EQ(got, Pattern(a, g, kBytes)) << "address " << a.value() << " group " << g;
    }
  }
}

Result<StepStats> StepOn(StepPlanner& planner, RequestId r, std::span<const LogicalAddr> sel) {
  std::vector<SlotId> out(sel.size());
  const auto runs = Runs(r, sel.size());
  return planner.Step({Rank(0), GroupId(0), sel, runs}, out);
}

// 4 device slots, 16 host: 16 entries, 4 on device (written there, no shadow), 12 on host.
struct Fixture {
  explicit Fixture(std::uint32_t host = 16, Backend* b = nullptr)
      : backend(MakeCpuBackend({.copy_threads = 1})),
        space(AddressSpace::Create(ShadowConfig(4, host), b != nullptr ? *b : *backend).value()),
        planner(*space) {
    EXPECT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
    addrs = space->Allocate(RequestId(1), 16).value();
    for (LogicalAddr a : addrs) EXPECT_TRUE(space->Write(a, GroupId(0), Pattern(a, 0, kBytes)));
    space->AdvanceRound();
  }
  std::span<const LogicalAddr> Slice(std::size_t from, std::size_t n) const { return std::span(addrs).subspan(from, n); }
  std::unique_ptr<Backend> backend;
  std::unique_ptr<AddressSpace> space;
  StepPlanner planner;
  std::vector<LogicalAddr> addrs;
};

TEST(HostShadows, FetchKeepsTheHostSlotAndTheNextEvictionMovesNoBytes) {
  Fixture f;
  const std::uint64_t entry = kBytes;
  // Victims written on device have no shadow: copied to free host slots, then filled.
  auto first = StepOn(f.planner, RequestId(1), f.Slice(4, 4));
  ASSERT_TRUE(first) << first.error().ToString();
  EXPECT_EQ(first->evictions, 4u);
  EXPECT_EQ(first->evict_copies, 4u);
  EXPECT_EQ(first->shadow_evictions, 0u);
  EXPECT_EQ(first->bytes_moved, 8 * entry);
  EXPECT_EQ(f.space->NumHostShadows(Rank(0), GroupId(0)), 4u);
  // A shadow is free capacity: 12 entries on host, 4 shadows, 0 plain free slots.
  EXPECT_EQ(f.space->NumUsed(Rank(0), GroupId(0), Tier::kHost), 12u);
  EXPECT_EQ(f.space->NumFree(Rank(0), GroupId(0), Tier::kHost), 4u);
  EXPECT_TRUE(f.space->CheckInvariants());
  f.space->AdvanceRound();
  // The fetched entries are the victims now: each goes back to its shadow, no bytes.
  auto second = StepOn(f.planner, RequestId(1), f.Slice(8, 4));
  ASSERT_TRUE(second) << second.error().ToString();
  EXPECT_EQ(second->shadow_evictions, 4u);
  EXPECT_EQ(second->evict_copies, 0u);
  EXPECT_EQ(second->bytes_moved, 4 * entry) << "only the wanted entries' host->device copies";
  for (LogicalAddr a : f.Slice(4, 4)) EXPECT_EQ(f.space->Lookup(a, GroupId(0))->tier(), Tier::kHost);
  EXPECT_EQ(f.space->NumHostShadows(Rank(0), GroupId(0)), 4u);
  EXPECT_TRUE(f.space->CheckInvariants());
  ExpectBytes(*f.space, f.addrs);
}

TEST(HostShadows, AWriteDropsTheShadowSoTheEvictionCopiesTheNewBytes) {
  Fixture f;
  ASSERT_TRUE(StepOn(f.planner, RequestId(1), f.Slice(4, 4)));
  f.space->AdvanceRound();
  const LogicalAddr rewritten = f.addrs[5];
  const auto fresh = Pattern(rewritten, 0, kBytes, /*version=*/9);
  ASSERT_TRUE(f.space->Write(rewritten, GroupId(0), fresh));
  EXPECT_EQ(f.space->NumHostShadows(Rank(0), GroupId(0)), 3u);
  EXPECT_EQ(f.space->NumFree(Rank(0), GroupId(0), Tier::kHost), 4u) << "the dropped shadow is a free slot now";
  EXPECT_TRUE(f.space->CheckInvariants());
  auto s = StepOn(f.planner, RequestId(1), f.Slice(8, 4));
  ASSERT_TRUE(s) << s.error().ToString();
  EXPECT_EQ(s->shadow_evictions, 3u);
  EXPECT_EQ(s->evict_copies, 1u);
  std::vector<std::byte> got(kBytes);
  ASSERT_TRUE(f.space->Read(rewritten, GroupId(0), got));
  EXPECT_EQ(got, fresh) << "the eviction published the stale shadow";
  EXPECT_TRUE(f.space->CheckInvariants());
}

TEST(HostShadows, HostAllocationsReclaimTheOldestShadowFirstAndCountShadowsFree) {
  Fixture f;
  ASSERT_TRUE(StepOn(f.planner, RequestId(1), f.Slice(4, 2)));  // shadows of 4, 5 (older)
  f.space->AdvanceRound();
  ASSERT_TRUE(StepOn(f.planner, RequestId(1), f.Slice(6, 2)));  // shadows of 6, 7
  f.space->AdvanceRound();
  ASSERT_EQ(f.space->NumHostShadows(Rank(0), GroupId(0)), 4u);
  // The rank holds 4 + 16 = 20 entries, 16 live: room for 4 more, all of it in shadows.
  ASSERT_TRUE(f.space->AddRequest(RequestId(2), Rank(0)));
  EXPECT_EQ(f.space->Allocate(RequestId(2), 5).error().code(), ErrorCode::kResourceExhausted);
  auto two = f.space->Allocate(RequestId(2), 2);
  ASSERT_TRUE(two) << two.error().ToString();  // to host (the library path): two shadows reclaimed
  for (LogicalAddr a : *two) ASSERT_TRUE(f.space->Write(a, GroupId(0), Pattern(a, 0, kBytes)));
  EXPECT_EQ(f.space->NumHostShadows(Rank(0), GroupId(0)), 2u);
  EXPECT_TRUE(f.space->CheckInvariants());
  f.space->AdvanceRound();
  // 4 and 5 lost their shadows (the oldest); 6 and 7 kept theirs.
  auto s = StepOn(f.planner, RequestId(1), f.Slice(8, 4));
  ASSERT_TRUE(s) << s.error().ToString();
  EXPECT_EQ(s->shadow_evictions, 2u);
  EXPECT_EQ(s->evict_copies + (s->evictions - s->shadow_evictions - s->evict_copies), 2u);
  auto more = f.space->Allocate(RequestId(2), 2);
  ASSERT_TRUE(more) << more.error().ToString();
  for (LogicalAddr a : *more) ASSERT_TRUE(f.space->Write(a, GroupId(0), Pattern(a, 0, kBytes)));
  EXPECT_EQ(f.space->Allocate(RequestId(2), 1).error().code(), ErrorCode::kResourceExhausted);
  EXPECT_TRUE(f.space->CheckInvariants());
  ExpectBytes(*f.space, f.addrs);
  ExpectBytes(*f.space, *two);
  ExpectBytes(*f.space, *more);
}

TEST(HostShadows, AFullHostSwapsAsWithoutShadows) {
  Fixture f(/*host=*/12);  // 12 host slots, all entries: no free slot, no shadow
  auto s = StepOn(f.planner, RequestId(1), f.Slice(4, 4));
  ASSERT_TRUE(s) << s.error().ToString();
  EXPECT_EQ(s->evict_copies, 0u);
  EXPECT_EQ(s->shadow_evictions, 0u);
  EXPECT_EQ(s->bytes_moved, 8u * kBytes);
  EXPECT_EQ(f.space->NumHostShadows(Rank(0), GroupId(0)), 0u) << "a swapped entry's host slot holds its victim";
  EXPECT_TRUE(f.space->CheckInvariants());
  ExpectBytes(*f.space, f.addrs);
}

TEST(HostShadows, StableAllocateEvictsShadowedVictimsWithoutCopies) {
  auto backend = MakeCpuBackend({.copy_threads = 1});
  AddressSpaceConfig c = ShadowConfig(4, 16);
  c.stable_new_entries = true;
  auto space = AddressSpace::Create(c, *backend).value();
  StepPlanner planner(*space);
  ASSERT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
  std::vector<LogicalAddr> addrs;
  for (int i = 0; i < 4; ++i) {  // one round each: every allocation lands on device
    auto a = space->Allocate(RequestId(1), 4).value();
    for (LogicalAddr x : a) ASSERT_TRUE(space->Write(x, GroupId(0), Pattern(x, 0, kBytes)));
    addrs.insert(addrs.end(), a.begin(), a.end());
    space->AdvanceRound();
  }
  ASSERT_TRUE(StepOn(planner, RequestId(1), std::span(addrs).subspan(0, 4)));  // 4 fetched: 4 shadows
  space->AdvanceRound();
  ASSERT_EQ(space->NumHostShadows(Rank(0), GroupId(0)), 4u);
  std::vector<CopyDescriptor> seen;
  space->SetMoveExecutor([&](std::span<const CopyDescriptor> moves) {
    seen.insert(seen.end(), moves.begin(), moves.end());
    return Status(Ok());
  });
  auto fresh = space->Allocate(RequestId(1), 4);
  ASSERT_TRUE(fresh) << fresh.error().ToString();
  EXPECT_TRUE(seen.empty()) << seen.size() << " victims copied although each had a live shadow";
  for (LogicalAddr a : *fresh) EXPECT_EQ(space->Lookup(a, GroupId(0))->tier(), Tier::kDevice);
  space->SetMoveExecutor(nullptr);
  for (LogicalAddr x : *fresh) ASSERT_TRUE(space->Write(x, GroupId(0), Pattern(x, 0, kBytes)));
  EXPECT_TRUE(space->CheckInvariants());
  ExpectBytes(*space, addrs);
  ExpectBytes(*space, *fresh);
}

// 4 device slots under PB-LRU with R = 0 (PolicyOptions::prefer_shadowed as given), 16 entries
// written; one step hits 0, 1 and misses 4, 5, fetched into slots 2, 3 (evicting entries 2, 3)
// with host shadows; then the round ends, so every device entry is cold.
struct ColdShadows {
  explicit ColdShadows(bool prefer) {
    AddressSpaceConfig c = ShadowConfig(4, 16);
    c.policy_options.recent_buckets = 0;
    c.policy_options.prefer_shadowed = prefer;
    space = AddressSpace::Create(c, *backend).value();
    planner = std::make_unique<StepPlanner>(*space);
    EXPECT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
    addrs = space->Allocate(RequestId(1), 16).value();
    for (LogicalAddr a : addrs) EXPECT_TRUE(space->Write(a, GroupId(0), Pattern(a, 0, kBytes)));
    space->AdvanceRound();
    EXPECT_TRUE(StepOn(*planner, RequestId(1), std::vector<LogicalAddr>{addrs[0], addrs[1], addrs[4], addrs[5]}));
    space->AdvanceRound();
  }
  std::unique_ptr<Backend> backend = MakeCpuBackend({.copy_threads = 1});
  std::unique_ptr<AddressSpace> space;
  std::unique_ptr<StepPlanner> planner;
  std::vector<LogicalAddr> addrs;
};

// PolicyOptions::prefer_shadowed: among equally old victims (PB-LRU's cold bucket, R = 0)
// the shadowed ones go first, so the eviction moves no bytes; without it, slot order.
TEST(HostShadows, PreferringShadowedVictimsSavesTheirCopies) {
  for (bool prefer : {false, true}) {
    ColdShadows f(prefer);  // entries 4 and 5 cold on device with shadows, 0 and 1 without
    auto s = StepOn(*f.planner, RequestId(1), std::span(f.addrs).subspan(6, 2));
    ASSERT_TRUE(s) << s.error().ToString();
    EXPECT_EQ(s->shadow_evictions, prefer ? 2u : 0u) << "prefer_shadowed " << prefer;
    EXPECT_EQ(s->bytes_moved, (prefer ? 2u : 4u) * kBytes) << "prefer_shadowed " << prefer;
    EXPECT_TRUE(f.space->CheckInvariants());
    ExpectBytes(*f.space, f.addrs);
  }
}

// The preference forgets a shadow the moment it goes: a Write that drops an entry's shadow
// tells the policy at once, so the next eviction prefers the entry whose shadow survives
// (no copy) over the rewritten one, which would be evicted first by slot order and copied
// as if its eviction were free.
TEST(HostShadows, AWriteMakesThePolicyForgetTheDroppedShadowAtOnce) {
  ColdShadows f(/*prefer=*/true);
  auto& space = f.space;
  auto& planner = *f.planner;
  const auto& addrs = f.addrs;
  const auto fresh = Pattern(addrs[4], 0, kBytes, /*version=*/3);
  ASSERT_TRUE(space->Write(addrs[4], GroupId(0), fresh));  // drops 4's shadow (slot 2, the first by slot order)
  ASSERT_EQ(space->NumHostShadows(Rank(0), GroupId(0)), 1u);
  auto s = StepOn(planner, RequestId(1), std::span(addrs).subspan(6, 1));
  ASSERT_TRUE(s) << s.error().ToString();
  EXPECT_EQ(s->shadow_evictions, 1u) << "the victim was the rewritten entry: the policy still preferred its dropped shadow";
  EXPECT_EQ(s->evict_copies, 0u);
  EXPECT_EQ(s->bytes_moved, 1u * kBytes) << "one fetch, no eviction copy";
  EXPECT_EQ(space->Lookup(addrs[4], GroupId(0))->tier(), Tier::kDevice);
  EXPECT_EQ(space->Lookup(addrs[5], GroupId(0))->tier(), Tier::kHost);
  std::vector<std::byte> got(kBytes);
  ASSERT_TRUE(space->Read(addrs[4], GroupId(0), got));
  EXPECT_EQ(got, fresh);
  EXPECT_TRUE(space->CheckInvariants());
}

TEST(HostShadows, FreeReleasesTheShadowsAndEveryCapacityFigureAgrees) {
  Fixture f;
  ASSERT_TRUE(StepOn(f.planner, RequestId(1), f.Slice(4, 4)));
  ASSERT_TRUE(f.space->Free(RequestId(1)));
  EXPECT_EQ(f.space->NumHostShadows(Rank(0), GroupId(0)), 0u);
  EXPECT_EQ(f.space->NumFree(Rank(0), GroupId(0), Tier::kHost), 16u);
  EXPECT_EQ(f.space->NumFree(Rank(0), GroupId(0), Tier::kDevice), 4u);
  EXPECT_TRUE(f.space->CheckInvariants());
}

// The DP engine step keeps shadows (engine_step_test.cc); the device step moves exclusive
// entries only and refuses them at Create.
TEST(HostShadows, TheDeviceStepRefusesThemAndChangesNothing) {
  Fixture f;
  ASSERT_TRUE(StepOn(f.planner, RequestId(1), f.Slice(4, 4)));
  ASSERT_EQ(f.space->NumHostShadows(Rank(0), GroupId(0)), 4u);
  const std::uint64_t before = f.space->DebugDigest();
  auto device = DeviceStep::Create(*f.space, Rank(0), GroupId(0), DeviceStepConfig{.max_rows = 1, .max_batch = 1, .max_top_k = 8});
  ASSERT_FALSE(device) << "the device step keeps no host shadows";
  EXPECT_EQ(device.error().code(), ErrorCode::kUnsupported);
  EXPECT_NE(device.error().message().find("AddressSpaceConfig.host_shadows"), std::string::npos) << device.error().ToString();
  EXPECT_EQ(f.space->DebugDigest(), before) << "the refusal changes nothing";
  EXPECT_EQ(f.space->NumHostShadows(Rank(0), GroupId(0)), 4u) << "no shadow dropped behind the space's back";
  EXPECT_TRUE(f.space->CheckInvariants());
  ExpectBytes(*f.space, f.addrs);
}

// Random steps, rewrites, arrivals and frees over two ranks and two groups, shadows on,
// with and without injected faults: every entry reads its reference bytes after every call.
TEST(HostShadows, RandomStepsAndFaultsLoseNothing) {
  ULA_TEST_SEEDED(seed, 300030);
  for (double fail : {0.0, 0.2}) {
    auto inner = MakeCpuBackend({.copy_threads = 1});
    auto fb = MakeFaultInjectingBackend(*inner, FaultPlan{.seed = seed, .fail_fraction = fail, .partial = true}).value();
    // Host nearly full: free slots run out, so evictions reclaim shadows and sometimes swap.
    auto space = AddressSpace::Create(ShadowConfig(12, 40, 2, 2), *fb).value();
    StepPlanner planner(*space);
    std::mt19937_64 rng(seed + static_cast<std::uint64_t>(fail * 10));
    std::map<std::uint64_t, std::vector<LogicalAddr>> live;  // request -> its addresses
    std::map<std::uint32_t, std::uint32_t> version;          // address -> its bytes' version
    std::uint64_t next = 1, shadow_evictions = 0, evict_copies = 0, failed = 0;
    auto bytes = [&](LogicalAddr a, std::uint32_t g) { return Pattern(a, g, kBytes, version[a.value()]); };
    auto check_all = [&] {
      std::vector<std::byte> got(kBytes);
      for (const auto& [r, as] : live) {
        for (LogicalAddr a : as) {
          for (std::uint16_t g = 0; g < 2; ++g) {
            ASSERT_TRUE(space->Read(a, GroupId(g), got));
            ASSERT_EQ(got, bytes(a, g)) << "address " << a.value() << " group " << g << " lost its bytes";
          }
        }
      }
      ASSERT_TRUE(space->CheckInvariants()) << space->CheckInvariants().error().ToString();
    };
    for (int op = 0; op < 600; ++op) {
      fb->set_armed(false);
      const int kind = static_cast<int>(rng() % 10);
      if (kind == 0 || live.size() < 2) {
        const std::uint64_t id = next++;
        const Rank rank(static_cast<std::uint16_t>(id % 2));
        ASSERT_TRUE(space->AddRequest(RequestId(id), rank));
        auto a = space->Allocate(RequestId(id), 4 + static_cast<std::uint32_t>(rng() % 10));
        if (!a) {
          ASSERT_EQ(a.error().code(), ErrorCode::kResourceExhausted);
          ASSERT_TRUE(space->Free(RequestId(id)));
          if (!live.empty()) {  // make room
            ASSERT_TRUE(space->Free(RequestId(live.begin()->first)));
            live.erase(live.begin());
          }
          continue;
        }
        for (LogicalAddr x : *a) {
          version[x.value()] = static_cast<std::uint32_t>(rng() % 100);
          for (std::uint16_t g = 0; g < 2; ++g) ASSERT_TRUE(space->Write(x, GroupId(g), bytes(x, g)));
        }
        live[id] = *a;
      } else if (kind == 1) {
        auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
        ASSERT_TRUE(space->Free(RequestId(it->first)));
        live.erase(it);
      } else if (kind == 2) {  // a rewrite: the shadow must go
        auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
        const LogicalAddr a = it->second[rng() % it->second.size()];
        version[a.value()] += 1;
        for (std::uint16_t g = 0; g < 2; ++g) ASSERT_TRUE(space->Write(a, GroupId(g), bytes(a, g)));
      } else {
        auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
        const Rank rank(static_cast<std::uint16_t>(it->first % 2));
        std::vector<LogicalAddr> sel;
        for (LogicalAddr a : it->second) {
          if (rng() % 2 == 0) sel.push_back(a);
        }
        if (sel.size() > 10) sel.resize(10);
        std::vector<SlotId> out(sel.size());
        const auto runs = Runs(RequestId(it->first), sel.size());
        const auto g = GroupId(static_cast<std::uint16_t>(rng() % 2));
        fb->set_armed(true);
        auto s = planner.Step({rank, g, sel, runs}, out);
        fb->set_armed(false);
        if (s) {
          shadow_evictions += s->shadow_evictions;
          evict_copies += s->evict_copies;
          for (std::size_t i = 0; i < sel.size(); ++i) {
            const std::byte* d = space->DeviceSlotData(rank, g, out[i]);
            ASSERT_NE(d, nullptr);
            ASSERT_EQ(std::vector<std::byte>(d, d + kBytes), bytes(sel[i], g.value()));
          }
        } else if (s.error().code() == ErrorCode::kIo) {
          ++failed;
        } else {
          ASSERT_EQ(s.error().code(), ErrorCode::kResourceExhausted) << s.error().ToString();
        }
        if (rng() % 2 == 0) space->AdvanceRound();
      }
      check_all();
      if (::testing::Test::HasFatalFailure()) return;
    }
    EXPECT_GT(shadow_evictions, 20u) << "fail " << fail;
    EXPECT_GT(evict_copies, 20u) << "fail " << fail;
    if (fail > 0) {
      EXPECT_GT(failed, 5u);
    }
  }
}

}  // namespace
}  // namespace ula

// StepPlanner's engine path: FlashMLA-layout indices, the engine-executed path (a failed
// descriptor publishes nothing and loses no bytes), bad input changes nothing, and no
// allocation per step (a counting global operator new, this binary only).
#include "ula/step_planner.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "step/space_fixture.h"
#include "test_seed.h"

namespace {
std::atomic<std::uint64_t> g_allocations{0};
}  // namespace

#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace ula {
namespace {

// The sanitizer trees run whole-structure invariant checks after every step; those
// allocate by design, so only the release tree counts allocations (the steps still run).
#ifdef ULA_EXPENSIVE_CHECKS
constexpr bool kCountAllocations = false;
#else
constexpr bool kCountAllocations = true;
#endif

using testing::Pattern;
using testing::SmallConfig;


constexpr std::uint32_t kLayers = 2;
constexpr std::uint32_t kLayerBytes = 16;
constexpr std::uint32_t kEntry = kLayers * kLayerBytes;

// Engine-owned memory of one (tier, group): [layer][slot][layer_bytes].
struct EngineMemory {
  std::vector<std::byte> bytes;
  std::uint32_t slots = 0;
  std::byte* At(std::uint32_t layer, std::uint32_t slot) {
    return bytes.data() + (std::size_t{layer} * slots + slot) * kLayerBytes;
  }
  EngineRegion Region() {
    return EngineRegion{reinterpret_cast<std::uintptr_t>(bytes.data()), std::uint64_t{slots} * kLayerBytes, kLayerBytes,
                        kLayers, slots};
  }
};

// A space on the counting backend whose bytes the "engine" owns: one rank, one group.
struct EngineFixture {
  std::unique_ptr<Backend> backend = MakeCountingBackend();
  std::unique_ptr<AddressSpace> space;
  std::unique_ptr<StepPlanner> planner;
  EngineMemory mem[kNumTiers];

  EngineFixture(std::uint32_t dev, std::uint32_t host, const EngineStepConfig& ec, bool shadows = false) {
    AddressSpaceConfig cfg = testing::EngineModes(SmallConfig(dev, host, 1, 1, kEntry));
    cfg.host_shadows = shadows;
    cfg.row_bytes = kLayerBytes;  // kLayers layers of kLayerBytes, as the engine memory registers them
    space = AddressSpace::Create(cfg, *backend).value();
    planner = StepPlanner::Create(*space, ec).value();
    mem[0] = {std::vector<std::byte>(std::size_t{dev} * kEntry), dev};
    mem[1] = {std::vector<std::byte>(std::size_t{host} * kEntry), host};
    EXPECT_TRUE(planner->RegisterEngineMemory(Tier::kDevice, Rank(0), GroupId(0), mem[0].Region()));
    EXPECT_TRUE(planner->RegisterEngineMemory(Tier::kHost, Rank(0), GroupId(0), mem[1].Region()));
  }
  // The engine's KV write of a new entry, at the location UlaCache gave it.
  void WriteEntry(LogicalAddr a) {
    const Location loc = space->Lookup(a, GroupId(0)).value();
    const auto p = Pattern(a, 0, kEntry);
    for (std::uint32_t l = 0; l < kLayers; ++l) {
      std::memcpy(mem[static_cast<int>(loc.tier())].At(l, loc.slot().value()), p.data() + l * kLayerBytes, kLayerBytes);
    }
  }
  bool EntryIntact(LogicalAddr a) {
    const Location loc = space->Lookup(a, GroupId(0)).value();
    const auto p = Pattern(a, 0, kEntry);
    for (std::uint32_t l = 0; l < kLayers; ++l) {
      if (std::memcmp(mem[static_cast<int>(loc.tier())].At(l, loc.slot().value()), p.data() + l * kLayerBytes,
                      kLayerBytes) != 0) {
        return false;
      }
    }
    return true;
  }
  std::vector<LogicalAddr> Add(RequestId r, std::uint32_t n) {
    EXPECT_TRUE(space->AddRequest(r, Rank(0)));
    auto addrs = space->Allocate(r, n).value();
    for (LogicalAddr a : addrs) WriteEntry(a);
    space->AdvanceRound();  // the new entries are evictable from now on
    return addrs;
  }
};

// sel.size() distinct addresses of addrs, drawn at random.
void RandomSelection(std::span<const LogicalAddr> addrs, std::mt19937& rng, std::span<std::int32_t> sel) {
  std::vector<std::uint32_t> perm(addrs.size());
  for (std::uint32_t i = 0; i < perm.size(); ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  for (std::size_t i = 0; i < sel.size(); ++i) sel[i] = static_cast<std::int32_t>(addrs[perm[i]].value());
}

TEST(EngineStep, LibraryStepWritesFlashMlaIndices) {
  auto backend = MakeCpuBackend();
  auto space = AddressSpace::Create(testing::EngineModes(SmallConfig(8, 32, 1, 2, 32)), *backend).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
  auto addrs = space->Allocate(RequestId(1), 24).value();
  for (LogicalAddr a : addrs) {
    for (std::uint32_t g = 0; g < 2; ++g) ASSERT_TRUE(space->Write(a, GroupId(g), Pattern(a, g, 32)));
  }
  space->AdvanceRound();  // the new entries are evictable from now on
  auto planner = StepPlanner::Create(*space, {.max_batch = 2, .max_q_len = 2, .max_top_k = 3}).value();
  // [batch 2][q_len 2][top_k 3]: the last query of request 1 has one entry, then padding.
  const std::vector<std::int32_t> sel = {20, 21, 2, 3, 20, 22, 23, 5, 6, 2, -1, -1};
  std::vector<std::int32_t> idx(sel.size(), 12345);
  const std::vector<RequestId> rows{RequestId(1), RequestId(1)};  // both rows read request 1
  for (std::uint32_t g = 0; g < 2; ++g) {
    auto stats = planner->Step(Rank(0), GroupId(g), {2, 2, 3}, rows, sel, idx);
    ASSERT_TRUE(stats) << stats.error().ToString();
    EXPECT_EQ(stats->distinct, 8u);
    EXPECT_GT(stats->misses, 0u);  // 20..23 start on host (8 device slots)
    for (std::size_t i = 0; i < sel.size(); ++i) {
      if (sel[i] == -1) {
        EXPECT_EQ(idx[i], -1) << i;
        continue;
      }
      const LogicalAddr a(static_cast<std::uint32_t>(sel[i]));
      const Location loc = space->Lookup(a, GroupId(g)).value();
      ASSERT_EQ(loc.tier(), Tier::kDevice);
      EXPECT_EQ(idx[i], static_cast<std::int32_t>(loc.slot().value())) << i;
      // What the kernel reads through the index is the entry's bytes.
      const std::byte* p = space->DeviceSlotData(Rank(0), GroupId(g), SlotId(static_cast<std::uint32_t>(idx[i])));
      EXPECT_EQ(std::memcmp(p, Pattern(a, g, 32).data(), 32), 0) << i;
    }
  }
  ASSERT_TRUE(space->CheckInvariants());
}

TEST(EngineStep, FailedDescriptorPublishesNothingAndLosesNoBytes) {
  ULA_TEST_SEEDED(seed, 20261201);
  std::mt19937 rng(static_cast<std::uint32_t>(seed));
  EngineFixture f(8, 40, {.max_batch = 1, .max_q_len = 1, .max_top_k = 8});
  const auto addrs = f.Add(RequestId(1), 40);
  std::vector<std::int32_t> sel(8), idx(8);
  const std::vector<RequestId> one{RequestId(1)};
  std::vector<CopyDescriptor> desc(f.planner->max_descriptors());
  std::vector<std::uint8_t> status(desc.size());
  std::uint64_t failures = 0;
  for (int step = 0; step < 60; ++step) {
    RandomSelection(addrs, rng, sel);
    auto plan = f.planner->Plan(Rank(0), GroupId(0), {1, 1, 8}, one, sel, idx, desc);
    ASSERT_TRUE(plan) << plan.error().ToString();
    const std::uint32_t n = plan->num_descriptors;
    // Where everything was before the engine ran anything.
    std::vector<Location> before;
    for (LogicalAddr a : addrs) before.push_back(f.space->Lookup(a, GroupId(0)).value());
    // The engine runs the descriptors; some fail (and do nothing: a failed swap must
    // leave both ranges, a failed copy targets a free slot).
    std::vector<std::uint8_t> fail(n);
    for (std::uint32_t i = 0; i < n; ++i) fail[i] = (rng() % 3 == 0) ? 7 : 0;
    for (std::uint32_t i = 0; i < n; ++i) {
      if (fail[i] == 0) {
        std::uint8_t st = 9;
        f.planner->ExecuteOnEngineMemory(std::span(desc).subspan(i, 1), std::span(&st, 1));
        ASSERT_EQ(st, 0);
      } else if (desc[i].op == static_cast<std::uint8_t>(CopyOp::kCopy)) {
        std::memset(f.mem[0].At(0, desc[i].dst_slot), 0xEE, kLayerBytes);  // a half-done copy into a free slot
      }
    }
    auto report = f.planner->Complete(plan->fence, std::span(fail));
    ASSERT_TRUE(report) << report.error().ToString();
    std::uint32_t n_fail = 0;
    for (auto x : fail) n_fail += x != 0;
    EXPECT_EQ(report->failed, n_fail);
    EXPECT_EQ(report->published, n - n_fail);
    failures += n_fail;
    for (std::uint32_t i = 0; i < n; ++i) {
      const LogicalAddr a(desc[i].addr);
      const Location now = f.space->Lookup(a, GroupId(0)).value();
      if (fail[i] != 0) {
        // Nothing published: the entry is where it was, and so is the victim.
        EXPECT_EQ(now.tier(), Tier::kHost);
        EXPECT_EQ(now.slot().value(), desc[i].src_slot);
      } else {
        EXPECT_EQ(now, Location::Make(Tier::kDevice, Rank(0), SlotId(desc[i].dst_slot)));
      }
    }
    for (std::size_t j = 0; j < addrs.size(); ++j) {
      ASSERT_TRUE(f.EntryIntact(addrs[j])) << "address " << addrs[j].value() << " lost its bytes at step " << step;
      const Location now = f.space->Lookup(addrs[j], GroupId(0)).value();
      bool moved_by_success = false;
      for (std::uint32_t i = 0; i < n; ++i) {
        if (fail[i] != 0) continue;
        moved_by_success |= desc[i].addr == addrs[j].value();
        moved_by_success |= desc[i].op == static_cast<std::uint8_t>(CopyOp::kSwap) && before[j].tier() == Tier::kDevice &&
                            before[j].slot().value() == desc[i].dst_slot;
      }
      if (!moved_by_success) {
        EXPECT_EQ(now, before[j]) << "address " << addrs[j].value() << " moved at step " << step;
      }
    }
    ASSERT_TRUE(f.space->CheckInvariants());
    // Re-plan the same selection in the next step: only the failed entries need copies.
    // (A failed swap's victim stays on device as used in this round, so the retry waits
    // for the round to end, as an engine retries a failed load in its next step.)
    f.space->AdvanceRound();
    if (n_fail > 0) {
      auto retry = f.planner->Plan(Rank(0), GroupId(0), {1, 1, 8}, one, sel, idx, desc);
      ASSERT_TRUE(retry);
      EXPECT_EQ(retry->num_descriptors, n_fail);
      std::vector<std::uint8_t> st(retry->num_descriptors);
      f.planner->ExecuteOnEngineMemory(std::span(desc).first(st.size()), st);
      ASSERT_TRUE(f.planner->Complete(retry->fence, st));
      f.space->AdvanceRound();
    }
    for (int i = 0; i < 8; ++i) {
      const std::byte* p = f.mem[0].At(1, static_cast<std::uint32_t>(idx[i]));
      EXPECT_EQ(std::memcmp(p, Pattern(LogicalAddr(sel[i]), 0, kEntry).data() + kLayerBytes, kLayerBytes), 0);
    }
  }
  EXPECT_GT(failures, 10u);
}

// Host shadows in the engine path (step_planner.h, "Host shadows"): a victim without a
// shadow is evicted to a host slot of its own (kEvict: its row out, then the fill), so the
// fetched entry keeps its host slot as a shadow; the next time it is a victim its slot is
// filled by a plain copy and it is published at its shadow, with no bytes moved for it.
TEST(EngineStep, HostShadowsTurnTheNextEvictionsIntoPlainCopies) {
  EngineFixture f(4, 16, {.max_batch = 1, .max_q_len = 1, .max_top_k = 4}, /*shadows=*/true);
  const auto addrs = f.Add(RequestId(1), 16);  // 4 on device (written there: no shadow), 12 on host
  const std::vector<RequestId> one{RequestId(1)};
  std::vector<CopyDescriptor> desc(f.planner->max_descriptors());
  std::vector<std::int32_t> idx(4);
  auto run = [&](std::size_t from, CopyOp want_op) -> StepStats {
    std::vector<std::int32_t> sel;
    for (std::size_t i = from; i < from + 4; ++i) sel.push_back(static_cast<std::int32_t>(addrs[i].value()));
    auto plan = f.planner->Plan(Rank(0), GroupId(0), {1, 1, 4}, one, sel, idx, desc);
    EXPECT_TRUE(plan) << plan.error().ToString();
    EXPECT_EQ(plan->num_descriptors, 4u);
    for (std::uint32_t i = 0; i < plan->num_descriptors; ++i) {
      EXPECT_EQ(desc[i].op, static_cast<std::uint8_t>(want_op)) << i;
    }
    std::vector<std::uint8_t> st(plan->num_descriptors, 9);
    f.planner->ExecuteOnEngineMemory(std::span(desc).first(st.size()), st);
    auto report = f.planner->Complete(plan->fence, st);
    EXPECT_TRUE(report && report->published == 4u);
    f.space->AdvanceRound();
    return plan->stats;
  };
  const StepStats first = run(4, CopyOp::kEvict);
  EXPECT_EQ(first.evict_copies, 4u);
  EXPECT_EQ(first.shadow_evictions, 0u);
  EXPECT_EQ(first.bytes_moved, 8u * kEntry) << "each victim's row out, each wanted row in";
  EXPECT_EQ(f.space->NumHostShadows(Rank(0), GroupId(0)), 4u) << "every fetched entry keeps its host slot";
  ASSERT_TRUE(f.space->CheckInvariants());
  const StepStats second = run(8, CopyOp::kCopy);
  EXPECT_EQ(second.shadow_evictions, 4u);
  EXPECT_EQ(second.evict_copies, 0u);
  EXPECT_EQ(second.bytes_moved, 4u * kEntry) << "the victims go back to their shadows: one copy per miss";
  for (std::size_t i = 4; i < 8; ++i) EXPECT_EQ(f.space->Lookup(addrs[i], GroupId(0))->tier(), Tier::kHost);
  ASSERT_TRUE(f.space->CheckInvariants());
  for (LogicalAddr a : addrs) EXPECT_TRUE(f.EntryIntact(a)) << "address " << a.value();
  for (std::size_t i = 0; i < 4; ++i) {  // attention reads the wanted entries through the indices
    EXPECT_EQ(std::memcmp(f.mem[0].At(0, static_cast<std::uint32_t>(idx[i])), Pattern(addrs[8 + i], 0, kEntry).data(),
                          kLayerBytes), 0) << i;
  }
}

// An engine whose descriptors fail, with shadows on: a failed eviction (status 1: nothing
// written to the device row) leaves its victim on device; one whose victim row landed
// (kEvictLanded) publishes the victim on host and frees the slot; a failed copy into a
// shadowed victim's slot (garbage left there) still publishes the victim at its shadow.
// Every entry reads its bytes wherever the table puts it, after every step.
TEST(EngineStep, FailedDescriptorsWithShadowsLoseNoBytes) {
  ULA_TEST_SEEDED(seed, 20261205);
  std::mt19937 rng(static_cast<std::uint32_t>(seed));
  for (std::uint32_t host : {44u, 32u}) {  // host room for evictions; a host of entries only (swaps)
    EngineFixture f(8, host, {.max_batch = 1, .max_q_len = 1, .max_top_k = 8}, /*shadows=*/true);
    const auto addrs = f.Add(RequestId(1), 40);
    std::vector<std::int32_t> sel(8), idx(8);
    const std::vector<RequestId> one{RequestId(1)};
    std::vector<CopyDescriptor> desc(f.planner->max_descriptors());
    std::uint64_t ops[3] = {0, 0, 0}, failures = 0, landed_only = 0;
    for (int step = 0; step < 80; ++step) {
      RandomSelection(addrs, rng, sel);
      auto plan = f.planner->Plan(Rank(0), GroupId(0), {1, 1, 8}, one, sel, idx, desc);
      ASSERT_TRUE(plan) << plan.error().ToString();
      const std::uint32_t n = plan->num_descriptors;
      std::vector<std::uint8_t> status(n, kDescriptorDone);
      std::vector<Location> victim_was(n);
      for (std::uint32_t i = 0; i < n; ++i) {
        const CopyDescriptor& d = desc[i];
        ++ops[d.op];
        const bool fail = rng() % 3 == 0;
        std::uint8_t one_status = 9;
        if (!fail) {
          f.planner->ExecuteOnEngineMemory(std::span(desc).subspan(i, 1), std::span(&one_status, 1));
          ASSERT_EQ(one_status, 0);
          continue;
        }
        ++failures;
        status[i] = kDescriptorFailed;
        if (d.op == static_cast<std::uint8_t>(CopyOp::kEvict) && rng() % 2 == 0) {
          for (std::uint32_t l = 0; l < kLayers; ++l) {  // the victim's row landed; the fill left garbage
            std::memcpy(f.mem[1].At(l, d.evict_slot), f.mem[0].At(l, d.dst_slot), kLayerBytes);
            std::memset(f.mem[0].At(l, d.dst_slot), 0xEE, kLayerBytes);
          }
          status[i] = kEvictLanded;
          ++landed_only;
        } else if (d.op == static_cast<std::uint8_t>(CopyOp::kCopy)) {
          std::memset(f.mem[0].At(0, d.dst_slot), 0xEE, kLayerBytes);  // a half-done copy
        }
      }
      auto report = f.planner->Complete(plan->fence, status);
      ASSERT_TRUE(report) << report.error().ToString();
      std::uint32_t n_fail = 0;
      for (auto x : status) n_fail += x != kDescriptorDone;
      EXPECT_EQ(report->failed, n_fail);
      for (std::uint32_t i = 0; i < n; ++i) {
        const Location now = f.space->Lookup(LogicalAddr(desc[i].addr), GroupId(0)).value();
        if (status[i] == kDescriptorDone) EXPECT_EQ(now, Location::Make(Tier::kDevice, Rank(0), SlotId(desc[i].dst_slot)));
        else EXPECT_EQ(now, Location::Make(Tier::kHost, Rank(0), SlotId(desc[i].src_slot))) << "nothing published";
      }
      for (LogicalAddr a : addrs) ASSERT_TRUE(f.EntryIntact(a)) << "address " << a.value() << " lost its bytes at step " << step;
      ASSERT_TRUE(f.space->CheckInvariants());
      f.space->AdvanceRound();
    }
    EXPECT_GT(failures, 20u);
    if (host == 44) {
      EXPECT_GT(ops[static_cast<int>(CopyOp::kCopy)], 0u) << "victims with shadows";
      EXPECT_GT(ops[static_cast<int>(CopyOp::kEvict)], 0u);
      EXPECT_GT(landed_only, 0u);
    } else {
      EXPECT_EQ(ops[static_cast<int>(CopyOp::kSwap)], ops[0] + ops[1] + ops[2]) << "a host of entries only swaps";
    }
  }
}

// An engine loop at steady state (docs/BENCHMARKS.md, "Host shadows"): requests select an
// eighth of their history each round and add one token; the device holds under a sixth of
// the history (the round's selections and a little more), the host has room. The host link carries the descriptors' entries: a copy
// is one, an eviction or a swap two. With shadows a miss costs at most 1.01 entries,
// without exactly 2.00.
double EntriesPerMiss(bool shadows) {
  constexpr std::uint32_t kRequests = 2, kHistory = 2048, kTopK = 256, kRounds = 40, kWarmup = 10;
  EngineFixture f(640, kRequests * (kHistory + kRounds) + 64, {.max_batch = kRequests, .max_q_len = 1, .max_top_k = kTopK},
                  shadows);
  std::vector<std::vector<LogicalAddr>> hist(kRequests);
  std::vector<RequestId> rows;
  for (std::uint32_t r = 0; r < kRequests; ++r) {
    hist[r] = f.Add(RequestId(r + 1), kHistory);
    rows.push_back(RequestId(r + 1));
  }
  std::mt19937 rng(7);
  std::vector<std::int32_t> sel(kRequests * kTopK), idx(sel.size());
  std::vector<CopyDescriptor> desc(f.planner->max_descriptors());
  std::uint64_t misses = 0, entries = 0;
  for (std::uint32_t round = 0; round < kRounds; ++round) {
    for (std::uint32_t r = 0; r < kRequests; ++r) {
      std::vector<LogicalAddr> pick = hist[r];
      std::shuffle(pick.begin(), pick.end(), rng);
      for (std::uint32_t k = 0; k < kTopK; ++k) sel[r * kTopK + k] = static_cast<std::int32_t>(pick[k].value());
    }
    auto plan = f.planner->Plan(Rank(0), GroupId(0), {kRequests, 1, kTopK}, rows, sel, idx, desc);
    EXPECT_TRUE(plan) << plan.error().ToString();
    if (!plan) return 0;
    std::vector<std::uint8_t> st(plan->num_descriptors, 0);
    EXPECT_TRUE(f.planner->Complete(plan->fence, st));
    if (round >= kWarmup) {
      misses += plan->num_descriptors;
      for (std::uint32_t i = 0; i < plan->num_descriptors; ++i) entries += desc[i].op == 0 ? 1 : 2;
    }
    for (std::uint32_t r = 0; r < kRequests; ++r) {  // decode: one new token per request
      auto a = f.space->Allocate(RequestId(r + 1), 1);
      EXPECT_TRUE(a);
      if (a) hist[r].push_back((*a)[0]);
    }
    f.space->AdvanceRound();
  }
  EXPECT_TRUE(f.space->CheckInvariants());
  return static_cast<double>(entries) / static_cast<double>(misses);
}

TEST(EngineStep, ShadowsHalveTheHostLinkEntriesPerMiss) {
  const double with = EntriesPerMiss(true), without = EntriesPerMiss(false);
  EXPECT_LE(with, 1.01);
  EXPECT_DOUBLE_EQ(without, 2.0);
  std::printf("engine loop: %.4f host-link entries per miss with shadows, %.4f without\n", with, without);
}

// The engine path's modes are the space's config, fixed at its Create: an engine step over a
// space without stable new entries is refused with the field to set, and the space's modes
// are left as they were (no planner turns a mode on behind the space's back).
TEST(EngineStep, CreateRefusesASpaceWithoutStableNewEntries) {
  auto backend = MakeCountingBackend();
  auto space = AddressSpace::Create(SmallConfig(4, 16), *backend).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
  ASSERT_TRUE(space->Allocate(RequestId(1), 3));
  const std::uint64_t before = space->DebugDigest();
  auto refused = StepPlanner::Create(*space, {});
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(refused.error().message().find("AddressSpaceConfig.stable_new_entries"), std::string::npos)
      << refused.error().ToString();
  EXPECT_EQ(space->DebugDigest(), before) << "the refusal changes nothing";
  EXPECT_FALSE(space->config().stable_new_entries);
  // With the mode set at the space's Create, the same call succeeds.
  auto stable = AddressSpace::Create(testing::EngineModes(SmallConfig(4, 16)), *backend).value();
  EXPECT_TRUE(StepPlanner::Create(*stable, {}));
}

// A planner made by its constructor has the library path only: the engine path's calls are
// refused (kFailedPrecondition, naming Create) and change nothing, even over a space with the
// engine's modes; the library path runs on it, over any space.
TEST(EngineStep, ConstructedPlannerRefusesTheEnginePath) {
  auto backend = MakeCountingBackend();
  auto space = AddressSpace::Create(testing::EngineModes(SmallConfig(4, 16)), *backend).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
  const std::vector<LogicalAddr> addrs = space->Allocate(RequestId(1), 3).value();
  StepPlanner planner(*space);
  EXPECT_EQ(planner.max_descriptors(), 0u);
  const std::uint64_t before = space->DebugDigest();
  const std::vector<RequestId> requests = {RequestId(1)};
  const std::vector<std::int32_t> sel = {static_cast<std::int32_t>(addrs[0].value())};
  std::vector<std::int32_t> idx(1, 77);
  std::vector<CopyDescriptor> desc(4);
  auto refused = planner.Plan(Rank(0), GroupId(0), {1, 1, 1}, requests, sel, idx, desc);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(refused.error().message().find("StepPlanner::Create"), std::string::npos) << refused.error().ToString();
  auto stepped = planner.Step(Rank(0), GroupId(0), {1, 1, 1}, requests, sel, idx);
  ASSERT_FALSE(stepped);
  EXPECT_EQ(stepped.error().code(), ErrorCode::kFailedPrecondition);
  const std::vector<RoundDemand> demands = {{RequestId(1), 1, 1}};
  auto reserved = planner.ReserveRound(Rank(0), demands);
  ASSERT_FALSE(reserved);
  EXPECT_EQ(reserved.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(idx[0], 77) << "a refused plan writes no index";
  EXPECT_EQ(space->DebugDigest(), before) << "the refusals change nothing";
  std::vector<SlotId> out(1);
  const std::vector<SelectionRun> runs = {{RequestId(1), 1}};
  ASSERT_TRUE(planner.Step(StepInput{Rank(0), GroupId(0), std::span(addrs).first(1), runs}, out));
  EXPECT_EQ(out[0], space->Lookup(addrs[0], GroupId(0)).value().slot());
}

TEST(EngineStep, BadInputChangesNothing) {
  EngineFixture f(4, 16, {.max_batch = 1, .max_q_len = 1, .max_top_k = 4});
  const auto addrs = f.Add(RequestId(1), 10);
  const auto gone = f.Add(RequestId(2), 2);
  ASSERT_TRUE(f.space->Free(RequestId(2)));
  auto snapshot = [&] {
    std::vector<std::uint64_t> s;
    for (LogicalAddr a : addrs) s.push_back(f.space->Lookup(a, GroupId(0)).value().bits());
    s.push_back(f.space->NumFree(Rank(0), GroupId(0), Tier::kDevice));
    s.push_back(f.space->NumFree(Rank(0), GroupId(0), Tier::kHost));
    return s;
  };
  const auto other = f.Add(RequestId(3), 2);  // another live request
  const auto before = snapshot();
  std::vector<std::int32_t> idx(4, 77);
  std::vector<CopyDescriptor> desc(f.planner->max_descriptors());
  std::vector<RequestId> rows{RequestId(1)};
  auto plan = [&](std::vector<std::int32_t> sel, StepShape shape, std::size_t n_desc) {
    return f.planner->Plan(Rank(0), GroupId(0), shape, rows, sel,
                           std::span(idx).first(shape.size() <= 4 ? shape.size() : 4), std::span(desc).first(n_desc));
  };
  // Isolation: another request's address, a freed request, a wrong number of rows.
  EXPECT_EQ(plan({6, 7, 8, static_cast<std::int32_t>(other[0].value())}, {1, 1, 4}, 4).error().code(),
            ErrorCode::kNotFound);
  rows = {RequestId(2)};
  EXPECT_EQ(plan({6, 7, 8, 9}, {1, 1, 4}, 4).error().code(), ErrorCode::kNotFound);
  rows = {RequestId(1), RequestId(1)};
  EXPECT_EQ(plan({6, 7, 8, 9}, {1, 1, 4}, 4).error().code(), ErrorCode::kInvalidArgument);
  rows = {RequestId(1)};
  EXPECT_EQ(snapshot(), before);
  EXPECT_EQ(plan({6, 7, 8, -2}, {1, 1, 4}, 4).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(plan({6, 7, 8, static_cast<std::int32_t>(gone[0].value())}, {1, 1, 4}, 4).error().code(),
            ErrorCode::kNotFound);
  {  // too few descriptor rows for this step's 4 misses: the step's state, not a malformed call
    auto r = plan({6, 7, 8, 9}, {1, 1, 4}, 1);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), ErrorCode::kResourceExhausted) << r.error().ToString();
    EXPECT_NE(r.error().ToString().find("needs 4 descriptors"), std::string::npos) << r.error().ToString();
  }
  EXPECT_EQ(plan({6, 7, 8}, {1, 1, 4}, 4).error().code(), ErrorCode::kInvalidArgument);     // wrong size
  EXPECT_EQ(plan({6, 7, 8, 9, 1}, {1, 1, 5}, 4).error().code(), ErrorCode::kInvalidArgument);  // past the max
  EXPECT_EQ(f.planner->Complete(1, {}).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(snapshot(), before);
  EXPECT_EQ(idx, std::vector<std::int32_t>(4, 77));
  EXPECT_FALSE(f.planner->has_pending());
  // Engine memory that is too small or malformed is refused.
  EngineRegion small = f.mem[0].Region();
  small.slots = 3;
  EXPECT_EQ(f.planner->RegisterEngineMemory(Tier::kDevice, Rank(0), GroupId(0), small).error().code(),
            ErrorCode::kInvalidArgument);
  EngineRegion overlap = f.mem[1].Region();
  overlap.layer_stride = kLayerBytes;
  EXPECT_FALSE(f.planner->RegisterEngineMemory(Tier::kHost, Rank(0), GroupId(0), overlap));
  EngineRegion wrong = f.mem[1].Region();
  wrong.layer_bytes = 8;
  EXPECT_FALSE(f.planner->RegisterEngineMemory(Tier::kHost, Rank(0), GroupId(0), wrong));
  {  // One base per layer: overlapping layers (either order) and a null base are refused.
    const auto base = reinterpret_cast<std::uintptr_t>(f.mem[1].bytes.data());
    const std::uintptr_t overlapping[] = {base + kLayerBytes * 15, base};  // 16 host slots: layer 0 ends at 16 rows
    auto r = f.planner->RegisterEngineMemory(Tier::kHost, Rank(0), GroupId(0), overlapping, kLayerBytes, 16);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().ToString().find("overlap"), std::string::npos) << r.error().ToString();
    const std::uintptr_t null_base[] = {base, 0};
    EXPECT_EQ(f.planner->RegisterEngineMemory(Tier::kHost, Rank(0), GroupId(0), null_base, kLayerBytes, 16)
                  .error().code(), ErrorCode::kInvalidArgument);
    const std::uintptr_t three[] = {base, base + 1000, base + 2000};  // 3 x 16 != the 32-byte entry
    EXPECT_FALSE(f.planner->RegisterEngineMemory(Tier::kHost, Rank(0), GroupId(0), three, kLayerBytes, 16));
  }
  // With a plan pending: another plan and a wrong fence or status count are refused.
  auto p = plan({6, 7, 8, 9}, {1, 1, 4}, 4);
  ASSERT_TRUE(p);
  ASSERT_EQ(p->num_descriptors, 4u);
  EXPECT_EQ(plan({0, 1, 2, 3}, {1, 1, 4}, 4).error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(f.planner->Complete(p->fence + 1, std::vector<std::uint8_t>(4)).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(f.planner->Complete(p->fence, std::vector<std::uint8_t>(3)).error().code(), ErrorCode::kInvalidArgument);
  // Every descriptor failed: back to exactly where it started.
  ASSERT_TRUE(f.planner->Complete(p->fence, std::vector<std::uint8_t>(4, 1)));
  EXPECT_EQ(snapshot(), before);
  ASSERT_TRUE(f.space->CheckInvariants());
}

// A library Step whose misses exceed max_descriptors() (the device pool: 4 slots, 6 misses)
// is refused with kResourceExhausted, names the descriptors it needed, and changes nothing.
TEST(EngineStep, LibraryStepPastMaxDescriptorsIsResourceExhausted) {
  EngineFixture f(4, 16, {.max_batch = 1, .max_q_len = 1, .max_top_k = 6});
  const auto addrs = f.Add(RequestId(1), 12);  // 0-3 on device, 4-11 on host
  ASSERT_EQ(f.planner->max_descriptors(), 4u);
  const std::vector<RequestId> rows{RequestId(1)};
  std::vector<std::int32_t> sel, idx(6, 77);
  for (int i = 4; i < 10; ++i) sel.push_back(static_cast<std::int32_t>(addrs[i].value()));
  const std::uint64_t digest = f.space->DebugDigest();
  auto r = f.planner->Step(Rank(0), GroupId(0), {1, 1, 6}, rows, sel, idx);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kResourceExhausted) << r.error().ToString();
  EXPECT_NE(r.error().ToString().find("6 descriptors"), std::string::npos) << r.error().ToString();
  EXPECT_EQ(f.space->DebugDigest(), digest);
  EXPECT_EQ(idx, std::vector<std::int32_t>(6, 77));
  EXPECT_FALSE(f.planner->has_pending());
  sel.resize(4);  // 4 misses fit
  auto ok = f.planner->Step(Rank(0), GroupId(0), {1, 1, 4}, rows, sel, std::span(idx).first(4));
  ASSERT_TRUE(ok) << ok.error().ToString();
  EXPECT_EQ(ok->misses, 4u);
  EXPECT_TRUE(f.space->CheckInvariants());
}

// The room check counts a hit that is new to this round as used: 8 device slots all hold
// entries, a step selects 4 of them and 5 host entries. The 4 hits leave 4 evictable slots,
// too few for 5 misses: refused, nothing changed; 4 misses fit.
TEST(EngineStep, HitsNewToTheRoundAreNotEvictable) {
  EngineFixture f(8, 40, {.max_batch = 1, .max_q_len = 1, .max_top_k = 9});
  const auto addrs = f.Add(RequestId(1), 48);  // 0-7 on device, 8-47 on host
  ASSERT_EQ(f.space->Lookup(addrs[0], GroupId(0)).value().tier(), Tier::kDevice);
  ASSERT_EQ(f.space->Lookup(addrs[8], GroupId(0)).value().tier(), Tier::kHost);
  const std::vector<RequestId> rows{RequestId(1)};
  std::vector<std::int32_t> idx(9, 77);
  std::vector<CopyDescriptor> desc(f.planner->max_descriptors());
  std::vector<std::int32_t> sel;
  for (int i : {0, 1, 2, 3, 8, 9, 10, 11, 12}) sel.push_back(static_cast<std::int32_t>(addrs[i].value()));
  const std::uint64_t digest = f.space->DebugDigest();
  auto refused = f.planner->Plan(Rank(0), GroupId(0), {1, 1, 9}, rows, sel, idx, desc);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kResourceExhausted) << refused.error().ToString();
  EXPECT_EQ(f.space->DebugDigest(), digest);
  EXPECT_FALSE(f.planner->has_pending());
  sel[8] = kPadIndex;  // 4 misses: they fit
  auto p = f.planner->Plan(Rank(0), GroupId(0), {1, 1, 9}, rows, sel, idx, desc);
  ASSERT_TRUE(p) << p.error().ToString();
  EXPECT_EQ(p->num_descriptors, 4u);
  std::vector<std::uint8_t> status(4);
  f.planner->ExecuteOnEngineMemory(std::span(desc).first(4), status);
  ASSERT_TRUE(f.planner->Complete(p->fence, status));
  for (LogicalAddr a : addrs) ASSERT_TRUE(f.EntryIntact(a));
  EXPECT_TRUE(f.space->CheckInvariants());
}

TEST(EngineStep, NoAllocationPerStep) {
  constexpr std::uint32_t kBatch = 4, kTopK = 16;
  EngineFixture f(96, 256, {.max_batch = kBatch, .max_q_len = 1, .max_top_k = kTopK});
  std::vector<std::vector<LogicalAddr>> reqs;
  for (std::uint32_t r = 0; r < kBatch; ++r) reqs.push_back(f.Add(RequestId(r), 80));
  // Every buffer the loop uses is sized once, before counting.
  std::vector<std::int32_t> sel(kBatch * kTopK), idx(sel.size());
  std::vector<RequestId> rows;
  for (std::uint32_t r = 0; r < kBatch; ++r) rows.push_back(RequestId(r));
  std::vector<CopyDescriptor> desc(f.planner->max_descriptors());
  std::vector<std::uint8_t> status(desc.size());
  ULA_TEST_SEEDED(seed, 20261201);
  std::mt19937 rng(static_cast<std::uint32_t>(seed));
  StepStats total;
  auto one_step = [&] {  // the engine path
    for (std::uint32_t b = 0; b < kBatch; ++b) {
      for (std::uint32_t k = 0; k < kTopK; ++k) {
        sel[b * kTopK + k] = (k + 3 > kTopK) ? -1 : static_cast<std::int32_t>(reqs[b][rng() % 80].value());
      }
    }
    auto plan = f.planner->Plan(Rank(0), GroupId(0), {kBatch, 1, kTopK}, rows, sel, idx, desc);
    ASSERT_TRUE(plan);
    auto st = std::span(status).first(plan->num_descriptors);
    f.planner->ExecuteOnEngineMemory(std::span(desc).first(plan->num_descriptors), st);
    ASSERT_TRUE(f.planner->Complete(plan->fence, st));
    total += plan->stats;
    f.space->AdvanceRound();
  };
  for (int i = 0; i < 20; ++i) one_step();  // warm-up: the policy's lazily sized state
  const std::uint64_t before = g_allocations.load();
  for (int i = 0; i < 200; ++i) one_step();
  if (kCountAllocations) {
    EXPECT_EQ(g_allocations.load() - before, 0u) << "the engine path allocated";
  }
  EXPECT_GT(total.misses, 1000u);
  EXPECT_GT(total.evictions, 100u);
  // The library path without misses: the same selection again. One warm-up step: PB-LRU
  // grows its touch scratch to the largest touch seen (52 hits here, more than any step
  // above touched), a high-water mark.
  ASSERT_TRUE(f.planner->Step(Rank(0), GroupId(0), {kBatch, 1, kTopK}, rows, sel, idx));
  const std::uint64_t before_hits = g_allocations.load();
  for (int i = 0; i < 50; ++i) {
    auto st = f.planner->Step(Rank(0), GroupId(0), {kBatch, 1, kTopK}, rows, sel, idx);
    ASSERT_TRUE(st);
    ASSERT_EQ(st->misses, 0u);
  }
  if (kCountAllocations) {
    EXPECT_EQ(g_allocations.load() - before_hits, 0u) << "a step without misses allocated";
  }
  for (std::uint32_t b = 0; b < kBatch; ++b) {
    for (LogicalAddr a : reqs[b]) ASSERT_TRUE(f.EntryIntact(a));
  }
  // The library Step with misses, on a fixture of its own (its copies run on the library's
  // backend, not over the engine memory the first fixture checks): it allocates only the
  // backend's CopyBatch vectors (host->device fetch and swap: step_planner.h), never more.
  {
    EngineFixture g(96, 256, {.max_batch = kBatch, .max_q_len = 1, .max_top_k = kTopK});
    std::vector<std::vector<LogicalAddr>> greqs;
    for (std::uint32_t r = 0; r < kBatch; ++r) greqs.push_back(g.Add(RequestId(r), 80));
    std::uint64_t steps_with_misses = 0;
    for (int i = 0; i < 120; ++i) {
      for (std::uint32_t b = 0; b < kBatch; ++b) {
        for (std::uint32_t k = 0; k < kTopK; ++k) {
          sel[b * kTopK + k] = (k + 3 > kTopK) ? -1 : static_cast<std::int32_t>(greqs[b][rng() % 80].value());
        }
      }
      const std::uint64_t at = g_allocations.load();
      auto st = g.planner->Step(Rank(0), GroupId(0), {kBatch, 1, kTopK}, rows, sel, idx);
      const std::uint64_t n = g_allocations.load() - at;
      ASSERT_TRUE(st) << st.error().ToString();
      g.space->AdvanceRound();
      if (i < 20 || st->misses == 0) continue;  // warm-up
      ++steps_with_misses;
      // One vector per non-empty batch: the fetch into free slots, the swap with victims.
      const std::uint64_t batches = (st->into_free > 0 ? 1 : 0) + (st->evictions > 0 ? 1 : 0);
      if (kCountAllocations) {
        EXPECT_LE(n, batches) << "library step " << i << " with " << st->misses << " misses (" << st->into_free
                              << " into free slots) allocated " << n << " times (only its CopyBatch vectors may)";
      }
    }
    EXPECT_GT(steps_with_misses, 50u);
  }
}

}  // namespace
}  // namespace ula

// The steps over a DeepSeek-V4-Flash space (SpaceConfigOfModel; docs/ARCHITECTURE.md,
// "Kinds"): the indexer's top-k of C4 entries goes through the one DP step as any selection
// does. A decode loop with drafts over a device pool smaller than the C4 history,
// through StepPlanner's library path and its engine path (plan, the descriptors on
// engine memory, complete): every selection's slot holds its entry's bytes, the descriptors
// name C4 entries' slots only, no step changes any kind's page table (KindPagesOf), and a
// selection that is not a live C4 entry of its request is refused with nothing changed. The
// device step's OpenMP form (DeviceStep) over the same loop on a twin space, with requests
// finishing and coming between its rounds (StoreInto, the space's bookkeeping, Reload), makes
// the engine path's decisions and refuses the same bad selections.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "config/model_kinds.h"
#include "step/device_step_fixture.h"
#include "step/engine_pools.h"
#include "test_seed.h"
#include "v4_flash.h"
#include "ula/address_space.h"
#include "ula/backend.h"
#include "ula/device_step.h"
#include "ula/step_planner.h"

namespace ula {
namespace {

constexpr std::uint32_t kDrafts = 3;
constexpr std::uint32_t kRow = test::kFlashC4Row;  // one CSA layer per group
constexpr std::uint32_t kDeviceEntries = 64;    // per group: far below the requests' C4 history
constexpr std::uint32_t kHostEntries = 1024;
constexpr std::uint32_t kTopK = 12;
constexpr std::uint32_t kRequests = 3;
constexpr std::uint32_t kPrompt = 240;          // 60 C4 entries per request
// The ASan tree checks every invariant inside each call: two thirds of the rounds there
// (every floor below still holds with room).
#if defined(ULA_EXPENSIVE_CHECKS)
constexpr int kRounds = 80;
#else
constexpr int kRounds = 120;
#endif

AddressSpaceConfig FlashConfig() { return test::FlashSpaceConfig(kDeviceEntries, kHostEntries, kDrafts); }

// The bytes of (address, version, group) in its group's one layer.
void Fill(std::byte* out, LogicalAddr a, std::uint32_t version, std::uint32_t g) {
  for (std::uint32_t i = 0; i < kRow; ++i) out[i] = std::byte((a.value() * 131 + version * 61 + g * 17 + i * 7) & 0xff);
}
bool Holds(const std::byte* row, LogicalAddr a, std::uint32_t version, std::uint32_t g) {
  std::byte want[kRow];
  Fill(want, a, version, g);
  return row != nullptr && std::memcmp(row, want, kRow) == 0;
}

// Every request's page table of every kind: what no step may change.
std::vector<KindPages> AllKindPages(const AddressSpace& s, std::span<const RequestId> requests) {
  std::vector<KindPages> out;
  for (RequestId r : requests) {
    for (std::uint32_t k = 0; k < s.config().kinds.size(); ++k) {
      auto p = s.KindPagesOf(r, k);
      EXPECT_TRUE(p) << p.error().ToString();
      out.push_back(p ? *p : KindPages{});
    }
  }
  return out;
}

// The scheduler's side of the loop: tokens per request, the version of each C4 entry's bytes.
struct Decode {
  AddressSpace& space;
  AddressSpace* twin = nullptr;  // made to do the same, where a test runs two forms side by side
  std::mt19937_64 rng;
  std::vector<RequestId> requests;
  std::vector<std::uint32_t> tokens;
  std::unordered_map<std::uint32_t, std::uint32_t> version;  // address -> its current bytes' version
  std::uint32_t next_version = 1;

  Decode(AddressSpace& s, std::uint64_t seed, AddressSpace* t = nullptr) : space(s), twin(t), rng(seed) {
    for (std::uint32_t b = 0; b < kRequests; ++b) {
      requests.push_back(RequestId(b + 1));
      tokens.push_back(0);
      EXPECT_TRUE(space.AddRequest(requests[b], Rank(0)));
      if (twin != nullptr) {
        EXPECT_TRUE(twin->AddRequest(requests[b], Rank(0)));
      }
    }
  }
  // Allocates n tokens of request b: the C4 entries they complete, each with a new version.
  std::vector<LogicalAddr> Allocate(std::uint32_t b, std::uint32_t n) {
    auto a = space.Allocate(requests[b], n);
    EXPECT_TRUE(a) << a.error().ToString();
    if (!a) return {};
    if (twin != nullptr) {
      auto t = twin->Allocate(requests[b], n);
      EXPECT_TRUE(t && *t == *a) << "the twin allocated other addresses";
    }
    EXPECT_EQ(a->size(), (tokens[b] + n) / 4 - tokens[b] / 4);  // one per completed 4-token block
    tokens[b] += n;
    for (LogicalAddr x : *a) version[x.value()] = next_version++;
    return std::move(*a);
  }
  // The indexer of one group: a random top-k of request b's C4 entries, nothing else.
  std::vector<LogicalAddr> TopK(std::uint32_t b) {
    auto list = space.AddressesOf(requests[b]).value();
    std::vector<LogicalAddr> pool(list.begin(), list.end());
    const std::size_t k = std::min<std::size_t>(kTopK, pool.size());
    for (std::size_t i = 0; i < k; ++i) std::swap(pool[i], pool[i + rng() % (pool.size() - i)]);
    pool.resize(k);
    return pool;
  }
  // Verification: of the round's 1 + kDrafts tokens of each request, 1..1 + kDrafts are
  // accepted; the rejected drafts are truncated (with their C4 entries).
  void Accept() {
    for (std::uint32_t b = 0; b < kRequests; ++b) {
      const std::uint32_t rejected = static_cast<std::uint32_t>(rng() % (kDrafts + 1));
      if (rejected == 0) continue;
      tokens[b] -= rejected;
      ASSERT_TRUE(space.Truncate(requests[b], tokens[b]));
      if (twin != nullptr) {
        ASSERT_TRUE(twin->Truncate(requests[b], tokens[b]));
      }
    }
  }
  // Request b finishes (every kind's entries freed) and a new one takes its place.
  void Replace(std::uint32_t b, RequestId next) {
    ASSERT_TRUE(space.Free(requests[b]));
    ASSERT_TRUE(space.AddRequest(next, Rank(0)));
    if (twin != nullptr) {
      ASSERT_TRUE(twin->Free(requests[b]));
      ASSERT_TRUE(twin->AddRequest(next, Rank(0)));
    }
    requests[b] = next;
    tokens[b] = 0;
  }
};

// The library path: Write each new C4 entry, Step every group with each request's top-k,
// read every selection back through its slot.
TEST(KindStep, HostStepOverC4EntriesReadsEverySelectionsBytes) {
  ULA_TEST_SEEDED(seed, 20261207);
  auto backend = MakeCpuBackend({.copy_threads = 1});
  auto space = AddressSpace::Create(FlashConfig(), *backend);
  ASSERT_TRUE(space) << space.error().ToString();
  AddressSpace& s = **space;
  Decode d(s, seed);
  std::vector<std::byte> row(kRow);
  auto write = [&](std::span<const LogicalAddr> fresh) {
    for (LogicalAddr a : fresh) {
      for (std::uint32_t g = 0; g < s.config().num_groups; ++g) {
        Fill(row.data(), a, d.version[a.value()], g);
        ASSERT_TRUE(s.Write(a, GroupId(g), row));
      }
    }
  };
  for (std::uint32_t b = 0; b < kRequests; ++b) {  // prefill, a round each
    write(d.Allocate(b, kPrompt));
    s.AdvanceRound();
  }
  StepPlanner planner(s);
  StepStats total;
  for (int round = 0; round < kRounds; ++round) {
    for (std::uint32_t b = 0; b < kRequests; ++b) write(d.Allocate(b, 1 + kDrafts));
    for (std::uint32_t g = 0; g < s.config().num_groups; ++g) {
      std::vector<LogicalAddr> sel;
      std::vector<SelectionRun> runs;
      for (std::uint32_t b = 0; b < kRequests; ++b) {
        const auto top = d.TopK(b);
        sel.insert(sel.end(), top.begin(), top.end());
        runs.push_back({d.requests[b], static_cast<std::uint32_t>(top.size())});
      }
      const auto kinds_before = AllKindPages(s, d.requests);
      std::vector<SlotId> slots(sel.size());
      auto stats = planner.Step({Rank(0), GroupId(g), sel, runs}, slots);
      ASSERT_TRUE(stats) << "round " << round << " group " << g << ": " << stats.error().ToString();
      total.misses += stats->misses;
      total.evictions += stats->evictions;
      ASSERT_EQ(AllKindPages(s, d.requests), kinds_before) << "round " << round << " group " << g;
      for (std::size_t i = 0; i < sel.size(); ++i) {
        ASSERT_TRUE(Holds(s.DeviceSlotData(Rank(0), GroupId(g), slots[i]), sel[i], d.version[sel[i].value()], g))
            << "round " << round << " group " << g << " selection " << i << " (address " << sel[i].value() << ")";
      }
      ASSERT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
    }
    d.Accept();
    s.AdvanceRound();
    ASSERT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
  }
  // The entries moved: the device pool holds a fraction of the C4 history.
  EXPECT_GT(total.misses, 1000u);
  EXPECT_GT(total.evictions, 1000u);
  EXPECT_GT(s.num_live_addresses(), 4u * kDeviceEntries);
}

// The engine path: the engine writes each new C4 entry at its looked-up location, plans each
// group, runs the descriptors on its memory, completes, and reads through the indices. Every
// descriptor brings a selected C4 entry from its host slot into a free device slot or one of a
// C4 entry (every used device slot holds one): no other kind's block is ever a source or a
// destination, and no kind's page table changes.
TEST(KindStep, EnginePlanMovesOnlyC4EntriesAndKeepsEveryKindsPages) {
  ULA_TEST_SEEDED(seed, 20261208);
  auto backend = MakeCountingBackend();  // the engine owns the bytes
  auto space = AddressSpace::Create(FlashConfig(), *backend);
  ASSERT_TRUE(space) << space.error().ToString();
  AddressSpace& s = **space;
  const std::uint32_t groups = s.config().num_groups;
  auto created = StepPlanner::Create(s, {.max_batch = kRequests, .max_q_len = 1, .max_top_k = kTopK});
  ASSERT_TRUE(created) << created.error().ToString();
  StepPlanner& planner = **created;
  testing::EngineMemory mem;
  for (std::uint32_t g = 0; g < groups; ++g) {
    mem[0].emplace_back(s.config().device_slots_per_group(), kRow);
    mem[1].emplace_back(s.config().host_slots_per_group(), kRow);
    for (int t = 0; t < kNumTiers; ++t) {
      ASSERT_TRUE(planner.RegisterEngineMemory(static_cast<Tier>(t), Rank(0), GroupId(g), mem[t][g].Region()));
    }
  }
  Decode d(s, seed);
  auto write_kv = [&](std::span<const LogicalAddr> fresh) {
    for (LogicalAddr a : fresh) {
      for (std::uint32_t g = 0; g < groups; ++g) {
        const Location loc = s.Lookup(a, GroupId(g)).value();
        Fill(mem[static_cast<int>(loc.tier())][g].Row(loc.slot().value()), a, d.version[a.value()], g);
      }
    }
  };
  for (std::uint32_t b = 0; b < kRequests; ++b) {
    write_kv(d.Allocate(b, kPrompt));
    s.AdvanceRound();
  }
  std::vector<std::int32_t> sel(std::size_t{kRequests} * kTopK), idx(sel.size());
  std::vector<CopyDescriptor> desc(planner.max_descriptors());
  std::vector<std::uint8_t> status(desc.size());
  std::uint64_t moved = 0, swaps = 0;
  for (int round = 0; round < kRounds; ++round) {
    for (std::uint32_t b = 0; b < kRequests; ++b) write_kv(d.Allocate(b, 1 + kDrafts));
    for (std::uint32_t g = 0; g < groups; ++g) {
      std::fill(sel.begin(), sel.end(), -1);
      for (std::uint32_t b = 0; b < kRequests; ++b) {
        const auto top = d.TopK(b);
        for (std::size_t k = 0; k < top.size(); ++k) sel[b * kTopK + k] = static_cast<std::int32_t>(top[k].value());
      }
      // Where every C4 entry of the group is before the plan; every used device slot is one's.
      std::map<std::uint32_t, Location> where;
      std::map<std::uint32_t, std::uint32_t> device_owner;  // device slot -> C4 address
      for (RequestId r : d.requests) {
        const std::span<const LogicalAddr> list = s.AddressesOf(r).value();
        for (LogicalAddr a : list) {
          const Location loc = s.Lookup(a, GroupId(g)).value();
          where[a.value()] = loc;
          if (loc.tier() == Tier::kDevice) device_owner[loc.slot().value()] = a.value();
        }
      }
      ASSERT_EQ(device_owner.size(), s.NumUsed(Rank(0), GroupId(g), Tier::kDevice));
      const auto kinds_before = AllKindPages(s, d.requests);
      auto plan = planner.Plan(Rank(0), GroupId(g), {kRequests, 1, kTopK}, d.requests, sel, idx, desc);
      ASSERT_TRUE(plan) << "round " << round << " group " << g << ": " << plan.error().ToString();
      for (std::uint32_t i = 0; i < plan->num_descriptors; ++i) {
        const CopyDescriptor& c = desc[i];
        ASSERT_EQ(c.group, g);
        ASSERT_TRUE(std::count(sel.begin(), sel.end(), static_cast<std::int32_t>(c.addr)) > 0) << c.addr;
        const Location from = where.at(c.addr);  // a live C4 entry of a request
        ASSERT_EQ(from.tier(), Tier::kHost);
        ASSERT_EQ(c.src_tier, static_cast<std::uint8_t>(Tier::kHost));
        ASSERT_EQ(c.src_slot, from.slot().value());
        ASSERT_EQ(c.dst_tier, static_cast<std::uint8_t>(Tier::kDevice));
        ASSERT_EQ(c.bytes, kRow);
        ASSERT_EQ(c.num_layers, 1u);
        if (c.op == static_cast<std::uint8_t>(CopyOp::kSwap)) {
          ASSERT_TRUE(device_owner.contains(c.dst_slot)) << "a swap with a slot that holds no C4 entry";
          ++swaps;
        }
      }
      moved += plan->num_descriptors;
      auto st = std::span(status).first(plan->num_descriptors);
      planner.ExecuteOnEngineMemory(std::span(desc).first(plan->num_descriptors), st);
      auto report = planner.Complete(plan->fence, st);
      ASSERT_TRUE(report) << report.error().ToString();
      ASSERT_EQ(report->failed, 0u);
      ASSERT_EQ(AllKindPages(s, d.requests), kinds_before) << "round " << round << " group " << g;
      for (std::size_t i = 0; i < sel.size(); ++i) {
        if (sel[i] == -1) continue;
        const LogicalAddr a(static_cast<std::uint32_t>(sel[i]));
        ASSERT_GE(idx[i], 0);
        ASSERT_TRUE(Holds(mem[0][g].Row(static_cast<std::uint32_t>(idx[i])), a, d.version[a.value()], g))
            << "round " << round << " group " << g << " selection " << i << " (address " << a.value() << ")";
      }
      ASSERT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
    }
    d.Accept();
    s.AdvanceRound();
    ASSERT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
  }
  EXPECT_GT(moved, 1000u);
  EXPECT_GT(swaps, 1000u);
}

DeviceStepConfig FlashDeviceStepConfig() {
  return {.max_rows = kRequests, .max_batch = kRequests, .max_top_k = kTopK, .max_addresses = 1u << 14,
          .max_requests = 256, .max_adopted = 16};
}

// The device step's OpenMP form over the same seeded decode loop as the engine path, on a twin
// space: requests allocate tokens (C4 entries), drafts are truncated, requests finish and new
// ones come, between the steps (StoreInto, the space's bookkeeping, Reload). Each group's step
// makes the engine path's decisions (descriptors, indices, hits, misses, evictions), its
// descriptors run on the twin's engine memory bring every selection's bytes, the twin's
// invariants hold after every step, no step changes a kind's page table, and the two spaces
// agree after every round.
TEST(KindStep, DeviceStepMakesTheEnginePathsDecisionsOverC4Entries) {
  ULA_TEST_SEEDED(seed, 20261210);
  auto backend = MakeCountingBackend();  // the engine owns the bytes
  AddressSpaceConfig config = FlashConfig();
  config.policy = PolicyKind::kKernelPbLru;  // the device step holds PB-LRU as flat bitmaps
  auto ref_space = AddressSpace::Create(config, *backend);
  auto twin_space = AddressSpace::Create(config, *backend);
  ASSERT_TRUE(ref_space && twin_space);
  AddressSpace& ref = **ref_space;
  AddressSpace& twin = **twin_space;
  const std::uint32_t groups = config.num_groups;
  auto created = StepPlanner::Create(ref, {.max_batch = kRequests, .max_q_len = 1, .max_top_k = kTopK});
  ASSERT_TRUE(created) << created.error().ToString();
  StepPlanner& planner = **created;
  testing::EngineMemory mem_ref, mem_twin;
  for (std::uint32_t g = 0; g < groups; ++g) {
    const std::uint32_t slots[kNumTiers] = {config.device_slots_per_group(), config.host_slots_per_group()};
    for (int t = 0; t < kNumTiers; ++t) {
      mem_ref[t].emplace_back(slots[t], kRow);
      mem_twin[t].emplace_back(slots[t], kRow);
      ASSERT_TRUE(planner.RegisterEngineMemory(static_cast<Tier>(t), Rank(0), GroupId(g), mem_ref[t][g].Region()));
    }
  }
  // Allocate's victims move in the twin's engine memory, as the planner's registered memory does
  // for the reference.
  twin.SetMoveExecutor(testing::MovesOnEngineMemory(mem_twin));
  Decode d(ref, seed, &twin);
  auto write_kv = [&](std::span<const LogicalAddr> fresh) {
    for (LogicalAddr a : fresh) {
      for (std::uint32_t g = 0; g < groups; ++g) {
        const Location r = ref.Lookup(a, GroupId(g)).value();
        const Location t = twin.Lookup(a, GroupId(g)).value();
        Fill(mem_ref[static_cast<int>(r.tier())][g].Row(r.slot().value()), a, d.version[a.value()], g);
        Fill(mem_twin[static_cast<int>(t.tier())][g].Row(t.slot().value()), a, d.version[a.value()], g);
      }
    }
  };
  for (std::uint32_t b = 0; b < kRequests; ++b) {
    write_kv(d.Allocate(b, kPrompt));
    ref.AdvanceRound();
    twin.AdvanceRound();
  }
  std::vector<std::unique_ptr<DeviceStep>> steps;
  for (std::uint32_t g = 0; g < groups; ++g) {
    auto step = DeviceStep::Create(twin, Rank(0), GroupId(g), FlashDeviceStepConfig());
    ASSERT_TRUE(step) << step.error().ToString();
    steps.push_back(std::move(*step));
  }
  testing::Shape shape{.batch = kRequests, .q_len = 1, .top_k = kTopK, .sel_stride = kTopK, .idx_stride = kTopK};
  std::vector<std::int32_t> sel(std::size_t{kRequests} * kTopK), idx(sel.size());
  std::vector<CopyDescriptor> desc(planner.max_descriptors());
  std::vector<std::uint8_t> status(std::max(desc.size(), std::size_t{steps[0]->max_descriptors()}), 0);
  std::uint64_t hits = 0, misses = 0, evictions = 0, replaced = 0;
  std::uint32_t next_id = kRequests + 1;
  for (int round = 0; round < kRounds; ++round) {
    if (round > 0 && d.rng() % 8 == 0) {
      const std::uint32_t b = static_cast<std::uint32_t>(d.rng() % kRequests);
      d.Replace(b, RequestId(next_id++));
      write_kv(d.Allocate(b, kPrompt));  // its prefill, a round of its own (the steps are stored)
      ref.AdvanceRound();
      twin.AdvanceRound();
      ++replaced;
    }
    for (std::uint32_t b = 0; b < kRequests; ++b) write_kv(d.Allocate(b, 1 + kDrafts));
    const auto kinds_before = AllKindPages(twin, d.requests);
    for (std::uint32_t g = 0; g < groups; ++g) {
      const std::string where = "round " + std::to_string(round) + " group " + std::to_string(g);
      DeviceStep& step = *steps[g];
      ASSERT_TRUE(step.Reload(twin, nullptr)) << where;
      std::fill(sel.begin(), sel.end(), -1);
      for (std::uint32_t b = 0; b < kRequests; ++b) {
        const auto top = d.TopK(b);
        for (std::size_t k = 0; k < top.size(); ++k) sel[b * kTopK + k] = static_cast<std::int32_t>(top[k].value());
      }
      auto plan = planner.Plan(Rank(0), GroupId(g), {kRequests, 1, kTopK}, d.requests, sel, idx, desc);
      ASSERT_TRUE(plan) << where << ": " << plan.error().ToString();
      const auto ref_desc = std::span(desc).first(plan->num_descriptors);
      auto st = std::span(status).first(plan->num_descriptors);
      planner.ExecuteOnEngineMemory(ref_desc, st);
      ASSERT_TRUE(planner.Complete(plan->fence, st)) << where;
      testing::DeviceIo io;
      io.Fill(shape, sel, d.requests, step.max_descriptors());
      ASSERT_TRUE(step.Plan(io.arrays, nullptr)) << where;
      ASSERT_EQ(io.record.error, 0u) << where;
      ASSERT_EQ(io.record.num_descriptors, plan->num_descriptors) << where;
      EXPECT_EQ(io.record.hits, plan->stats.hits) << where;
      EXPECT_EQ(io.record.misses, plan->stats.misses) << where;
      EXPECT_EQ(io.record.evictions, plan->stats.evictions) << where;
      for (std::uint32_t i = 0; i < plan->num_descriptors; ++i) {
        ASSERT_EQ(std::memcmp(&io.descriptors[i], &ref_desc[i], sizeof(CopyDescriptor)), 0) << where << " descriptor " << i;
      }
      for (std::size_t i = 0; i < sel.size(); ++i) ASSERT_EQ(io.indices[i], idx[i]) << where << " selection " << i;
      testing::RunOnEngineMemory(std::span(io.descriptors).first(io.record.num_descriptors), mem_twin);
      std::fill(status.begin(), status.end(), 0);
      ASSERT_TRUE(step.Complete(status.data(), nullptr)) << where;
      ASSERT_TRUE(step.StoreInto(twin, nullptr)) << where;
      hits += io.record.hits;
      misses += io.record.misses;
      evictions += io.record.evictions;
      for (std::size_t i = 0; i < sel.size(); ++i) {
        if (sel[i] == -1) continue;
        const LogicalAddr a(static_cast<std::uint32_t>(sel[i]));
        ASSERT_GE(io.indices[i], 0) << where;
        ASSERT_TRUE(Holds(mem_ref[0][g].Row(static_cast<std::uint32_t>(idx[i])), a, d.version[a.value()], g))
            << where << " selection " << i << " (address " << a.value() << "), the engine path";
        ASSERT_TRUE(Holds(mem_twin[0][g].Row(static_cast<std::uint32_t>(io.indices[i])), a, d.version[a.value()], g))
            << where << " selection " << i << " (address " << a.value() << ")";
      }
      const Status inv = twin.CheckInvariants();
      ASSERT_TRUE(inv) << where << ": " << inv.error().ToString();
      ASSERT_EQ(AllKindPages(twin, d.requests), kinds_before) << where;
    }
    ASSERT_EQ(twin.DebugDigest(), ref.DebugDigest()) << "round " << round;
    d.Accept();
    ref.AdvanceRound();
    twin.AdvanceRound();
    const Status inv = twin.CheckInvariants();
    ASSERT_TRUE(inv) << "round " << round << ": " << inv.error().ToString();
  }
  EXPECT_GT(hits, 1000u);
  EXPECT_GT(misses, 1000u);
  EXPECT_GT(evictions, 1000u);
  EXPECT_GT(replaced, 5u);
  std::printf("device step over C4: %llu hits, %llu misses, %llu evictions, %llu requests replaced\n",
              static_cast<unsigned long long>(hits), static_cast<unsigned long long>(misses),
              static_cast<unsigned long long>(evictions), static_cast<unsigned long long>(replaced));
}

// Two requests of 101 tokens (25 C4 entries each, one token filling); request 1's drafts,
// tokens [101, 105), complete one C4 entry and are all rejected. The selections the bad-input
// tests use: the entry that Truncate freed, request 1's live entries, request 2's first.
struct BadSelections {
  LogicalAddr freed, other;
  std::vector<LogicalAddr> own;
};
void MakeBadSelections(AddressSpace& s, const std::vector<RequestId>& rs, BadSelections& out) {
  for (RequestId r : rs) {
    ASSERT_TRUE(s.AddRequest(r, Rank(0)));
    ASSERT_TRUE(s.Allocate(r, 101));
    s.AdvanceRound();
  }
  auto drafted = s.Allocate(rs[0], 4);
  ASSERT_TRUE(drafted);
  ASSERT_EQ(drafted->size(), 1u);
  out.freed = (*drafted)[0];
  ASSERT_TRUE(s.Truncate(rs[0], 101));
  ASSERT_FALSE(s.IsLive(out.freed));
  s.AdvanceRound();
  const auto own = s.AddressesOf(rs[0]).value();
  out.own.assign(own.begin(), own.end());
  out.other = s.AddressesOf(rs[1]).value().front();
}

// The device step refuses a selection that is not a live C4 entry of its request (one a
// Truncate freed, another request's, one never made) with kNotFound in its record, and
// nothing changes: the step stores back the space it loaded, every kind's page table as it was.
TEST(KindStep, DeviceStepRefusesABadSelectionAndChangesNothing) {
  auto backend = MakeCpuBackend({.copy_threads = 1});
  AddressSpaceConfig config = FlashConfig();
  config.policy = PolicyKind::kKernelPbLru;
  auto space = AddressSpace::Create(config, *backend);
  ASSERT_TRUE(space) << space.error().ToString();
  AddressSpace& s = **space;
  const std::vector<RequestId> rs{RequestId(1), RequestId(2)};
  BadSelections bad;
  ASSERT_NO_FATAL_FAILURE(MakeBadSelections(s, rs, bad));
  const LogicalAddr freed = bad.freed, other = bad.other;
  const std::vector<LogicalAddr>& own = bad.own;
  auto step = DeviceStep::Create(s, Rank(0), GroupId(5), FlashDeviceStepConfig());
  ASSERT_TRUE(step) << step.error().ToString();
  const std::uint64_t digest = s.DebugDigest();
  const auto kinds = AllKindPages(s, rs);
  const auto before = (*step)->ReadState(nullptr).value();
  const testing::Shape shape{.batch = 1, .q_len = 1, .top_k = 2, .sel_stride = 2, .idx_stride = 2};
  std::vector<std::uint8_t> status((*step)->max_descriptors(), 0);
  for (const LogicalAddr bad : {freed, other, LogicalAddr(1u << 20)}) {
    SCOPED_TRACE(bad.value());
    const std::vector<std::int32_t> sel{static_cast<std::int32_t>(own[3].value()), static_cast<std::int32_t>(bad.value())};
    testing::DeviceIo io;
    io.Fill(shape, sel, {rs[0]}, (*step)->max_descriptors());
    ASSERT_TRUE((*step)->Plan(io.arrays, nullptr));
    EXPECT_EQ(io.record.error, 1 + static_cast<std::uint32_t>(ErrorCode::kNotFound));
    EXPECT_EQ(io.record.num_descriptors, 0u);
    ASSERT_TRUE((*step)->Complete(status.data(), nullptr));
    testing::ExpectSameState(before, (*step)->ReadState(nullptr).value(), "a refused step changes nothing");
    ASSERT_TRUE((*step)->StoreInto(s, nullptr));
    EXPECT_EQ(s.DebugDigest(), digest);
    EXPECT_EQ(AllKindPages(s, rs), kinds);
    EXPECT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
  }
}

// A selection that is not a live C4 entry of its request (one a Truncate freed, another
// request's, one never made) is refused by both forms with kNotFound, and nothing changes:
// the digest (tables, pools, policies, the kinds' entries) and every kind's page table.
// While an engine plan is pending, a Truncate is refused and changes no kind either.
TEST(KindStep, BadSelectionIsRefusedAndChangesNothing) {
  auto backend = MakeCpuBackend({.copy_threads = 1});
  auto space = AddressSpace::Create(FlashConfig(), *backend);
  ASSERT_TRUE(space) << space.error().ToString();
  AddressSpace& s = **space;
  const std::vector<RequestId> rs{RequestId(1), RequestId(2)};
  BadSelections bad;
  ASSERT_NO_FATAL_FAILURE(MakeBadSelections(s, rs, bad));
  const LogicalAddr freed = bad.freed, other = bad.other;
  const std::vector<LogicalAddr>& own = bad.own;
  auto engine = StepPlanner::Create(s, {.max_batch = 1, .max_q_len = 1, .max_top_k = 2});
  ASSERT_TRUE(engine) << engine.error().ToString();
  StepPlanner host(s);
  const std::uint64_t digest = s.DebugDigest();
  const auto kinds = AllKindPages(s, rs);
  const std::vector<SelectionRun> runs{{rs[0], 2}};
  for (const LogicalAddr bad : {freed, other, LogicalAddr(1u << 20)}) {
    SCOPED_TRACE(bad.value());
    const std::vector<LogicalAddr> sel{own[3], bad};  // a good selection first
    std::vector<SlotId> slots(2);
    auto stepped = host.Step({Rank(0), GroupId(5), sel, runs}, slots);
    ASSERT_FALSE(stepped);
    EXPECT_EQ(stepped.error().code(), ErrorCode::kNotFound) << stepped.error().ToString();
    EXPECT_NE(stepped.error().message().find("selection 1"), std::string::npos) << stepped.error().message();
    const std::vector<std::int32_t> isel{static_cast<std::int32_t>(own[3].value()), static_cast<std::int32_t>(bad.value())};
    std::vector<std::int32_t> idx(2);
    auto planned = (*engine)->Step(Rank(0), GroupId(5), {1, 1, 2}, std::span(rs).first(1), isel, idx);
    ASSERT_FALSE(planned);
    EXPECT_EQ(planned.error().code(), ErrorCode::kNotFound) << planned.error().ToString();
    EXPECT_EQ(s.DebugDigest(), digest);
    EXPECT_EQ(AllKindPages(s, rs), kinds);
  }
  // A pending plan (one device-resident selection: no descriptor) holds off a rollback.
  const std::vector<std::int32_t> newest{static_cast<std::int32_t>(own.back().value()), -1};
  std::vector<std::int32_t> idx(2);
  std::vector<CopyDescriptor> desc((*engine)->max_descriptors());
  auto plan = (*engine)->Plan(Rank(0), GroupId(0), {1, 1, 2}, std::span(rs).first(1), newest, idx, desc);
  ASSERT_TRUE(plan) << plan.error().ToString();
  const std::uint64_t pending = s.DebugDigest();
  const Status rollback = s.Truncate(rs[0], 99);  // two tokens back: the 25th C4 entry would go
  ASSERT_FALSE(rollback);
  EXPECT_EQ(rollback.error().code(), ErrorCode::kFailedPrecondition) << rollback.error().ToString();
  EXPECT_EQ(s.DebugDigest(), pending);
  EXPECT_EQ(AllKindPages(s, rs), kinds);
  std::vector<std::uint8_t> st(plan->num_descriptors);
  ASSERT_TRUE((*engine)->Complete(plan->fence, st));
  EXPECT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
  ASSERT_TRUE(s.Truncate(rs[0], 99));  // now it runs: one C4 entry fewer
  EXPECT_EQ(s.AddressesOf(rs[0]).value().size(), 24u);
  EXPECT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
}

}  // namespace
}  // namespace ula

// Draft rollback (AddressSpace::Truncate, docs/ARCHITECTURE.md "Draft rollback and the
// engine step's contract with the scheduler"): an MTP loop on the engine path. Every round
// each running request (some skip a round) gets 1 + kDrafts new tokens (its next token and
// the drafts, q_len 1 + kDrafts), looks their locations up once (out_cache_loc), runs
// plan / the descriptors / complete per group, writes the tokens' KV at the looked-up
// locations and gathers every selection through the returned indices, as FlashMLA's sparse
// decode reads its k_cache. Verification then accepts a random number of drafts and
// truncates the rest, as SGLang frees a verify's rejected out_cache_loc and vLLM rolls
// num_computed_tokens back. The KV of a token depends on the round that computed it, so a
// row read from a rolled-back draft's slot would differ from the dense reference.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <unordered_map>
#include <vector>

#include "step/space_fixture.h"
#include "test_seed.h"
#include "ula/address_space.h"
#include "ula/step_planner.h"

namespace ula {
namespace {

constexpr std::uint32_t kRow = 64;     // bytes of one layer's row
constexpr std::uint32_t kLayers = 2;   // per group
constexpr std::uint32_t kGroups = 2;
constexpr std::uint32_t kPage = 64;
constexpr std::uint32_t kDrafts = 2;   // MTP drafts per round: q_len 3

// The bytes of (token version v, group, layer): the dense reference.
void Fill(std::byte* out, std::uint64_t v, std::uint32_t g, std::uint32_t l) {
  for (std::uint32_t i = 0; i < kRow; ++i) out[i] = std::byte((v * 2654435761u + g * 17 + l * 29 + i * 7) >> 3 & 0xff);
}

struct Pools {  // engine memory of one (tier, group): [layers][slots][kRow]
  std::uint32_t slots = 0;
  std::vector<std::byte> bytes;
  std::byte* Row(std::uint32_t l, std::uint32_t s) { return bytes.data() + (std::size_t{l} * slots + s) * kRow; }
  EngineRegion Region() {
    return EngineRegion{reinterpret_cast<std::uintptr_t>(bytes.data()), std::uint64_t{slots} * kRow, kRow, kLayers, slots};
  }
};

struct MtpResult {
  std::uint64_t rounds = 0, drafts_rejected = 0, reused_in_place = 0, rows = 0, rows_wrong = 0, moved = 0, misses = 0;
};

MtpResult RunMtp(std::uint64_t seed, std::uint32_t device_slots, std::uint32_t rounds) {
  auto backend = MakeCountingBackend();  // the engine owns the bytes
  AddressSpaceConfig cfg;
  cfg.num_groups = kGroups;
  cfg.entry_bytes = kLayers * kRow;
  cfg.row_bytes = kRow;
  const std::uint32_t host_slots = 4096;
  cfg.device_bytes_per_rank = std::uint64_t{device_slots} * cfg.entry_bytes * kGroups;
  cfg.host_bytes_per_rank = std::uint64_t{host_slots} * cfg.entry_bytes * kGroups;
  cfg.page_tokens = kPage;
  cfg.stable_new_entries = true;
  auto space = AddressSpace::Create(cfg, *backend).value();
  constexpr std::uint32_t kBatch = 4, kTopK = 16, kQ = 1 + kDrafts;
  auto planner = StepPlanner::Create(*space, {.max_batch = kBatch, .max_q_len = kQ, .max_top_k = kTopK}).value();
  Pools mem[kNumTiers][kGroups];
  for (std::uint32_t g = 0; g < kGroups; ++g) {
    mem[0][g] = {device_slots, std::vector<std::byte>(std::size_t{kLayers} * device_slots * kRow)};
    mem[1][g] = {host_slots, std::vector<std::byte>(std::size_t{kLayers} * host_slots * kRow)};
    EXPECT_TRUE(planner->RegisterEngineMemory(Tier::kDevice, Rank(0), GroupId(g), mem[0][g].Region()));
    EXPECT_TRUE(planner->RegisterEngineMemory(Tier::kHost, Rank(0), GroupId(g), mem[1][g].Region()));
  }
  std::unordered_map<std::uint32_t, std::uint64_t> version;  // live address -> the version its KV holds
  std::uint64_t next_version = 1;
  auto write_kv = [&](LogicalAddr a, std::uint32_t g, Location loc, std::uint64_t v) {
    for (std::uint32_t l = 0; l < kLayers; ++l) Fill(mem[static_cast<int>(loc.tier())][g].Row(l, loc.slot().value()), v, g, l);
  };
  std::mt19937_64 rng(seed);
  std::vector<RequestId> all;
  for (std::uint32_t b = 0; b < kBatch; ++b) {  // prefill, each its own round
    const RequestId r(b + 1);
    all.push_back(r);
    EXPECT_TRUE(space->AddRequest(r, Rank(0)));
    auto addrs = space->Allocate(r, 100 + 37 * b).value();
    for (LogicalAddr a : addrs) {
      version[a.value()] = next_version++;
      for (std::uint32_t g = 0; g < kGroups; ++g) write_kv(a, g, space->Lookup(a, GroupId(g)).value(), version[a.value()]);
    }
    space->AdvanceRound();
  }
  std::vector<CopyDescriptor> desc(planner->max_descriptors());
  std::vector<std::uint8_t> status(desc.size());
  std::vector<std::uint32_t> freed_tail(kBatch + 1, 0xffffffffu);  // per request: the address its next token should get
  MtpResult out;
  for (std::uint32_t round = 0; round < rounds; ++round) {
    std::vector<RequestId> rows;
    for (RequestId r : all) {
      if (rng() % 5 != 0) rows.push_back(r);  // a request skips a round now and then
    }
    if (rows.empty()) rows.push_back(all[0]);
    const auto batch = static_cast<std::uint32_t>(rows.size());
    // Schedule: the tokens of the round, their locations looked up once.
    std::vector<LogicalAddr> fresh(std::size_t{batch} * kQ);
    std::vector<Location> looked(fresh.size() * kGroups);
    for (std::uint32_t b = 0; b < batch; ++b) {
      auto a = space->Allocate(rows[b], kQ);
      EXPECT_TRUE(a) << a.error().ToString();
      if (!a) return out;
      if (std::uint32_t& want = freed_tail[rows[b].value()]; want != 0xffffffffu) {
        EXPECT_EQ((*a)[0].value(), want) << "the next token did not reuse the rolled-back address of its page";
        out.reused_in_place += (*a)[0].value() == want;
        want = 0xffffffffu;
      }
      for (std::uint32_t q = 0; q < kQ; ++q) {
        fresh[b * kQ + q] = (*a)[q];
        version[(*a)[q].value()] = next_version++;
        for (std::uint32_t g = 0; g < kGroups; ++g) looked[(b * kQ + q) * kGroups + g] = space->Lookup((*a)[q], GroupId(g)).value();
      }
    }
    for (std::uint32_t g = 0; g < kGroups; ++g) {
      std::vector<std::int32_t> sel(std::size_t{batch} * kQ * kTopK, kPadIndex), idx(sel.size());
      for (std::uint32_t b = 0; b < batch; ++b) {
        auto list = space->AddressesOf(rows[b]).value();
        for (std::uint32_t q = 0; q < kQ; ++q) {
          std::int32_t* row = sel.data() + (std::size_t{b} * kQ + q) * kTopK;
          const std::size_t visible = list.size() - kQ + q + 1;  // causal: up to its own token
          row[0] = static_cast<std::int32_t>(list[visible - 1].value());
          std::vector<std::uint32_t> picked;
          for (std::uint32_t k = 1; k < kTopK && k < visible; ++k) {
            const std::uint32_t a = list[rng() % (visible - 1)].value();
            if (std::find(picked.begin(), picked.end(), a) != picked.end()) continue;
            picked.push_back(a);
            row[k] = static_cast<std::int32_t>(a);
          }
        }
      }
      auto plan = planner->Plan(Rank(0), GroupId(g), {batch, kQ, kTopK}, rows, sel, idx, desc);
      EXPECT_TRUE(plan) << plan.error().ToString();
      if (!plan) return out;
      out.misses += plan->num_descriptors;
      auto st = std::span(status).first(plan->num_descriptors);
      planner->ExecuteOnEngineMemory(std::span(desc).first(plan->num_descriptors), st);
      EXPECT_TRUE(planner->Complete(plan->fence, st));
      // The forward: the round's tokens' KV at out_cache_loc, then attention by index.
      for (std::size_t t = 0; t < fresh.size(); ++t) {
        const Location loc = looked[t * kGroups + g];
        out.moved += space->Lookup(fresh[t], GroupId(g)).value() != loc;
        write_kv(fresh[t], g, loc, version[fresh[t].value()]);
      }
      for (std::size_t i = 0; i < sel.size(); ++i) {
        if (sel[i] == kPadIndex) continue;
        std::byte want[kRow];
        for (std::uint32_t l = 0; l < kLayers; ++l) {
          Fill(want, version.at(static_cast<std::uint32_t>(sel[i])), g, l);
          ++out.rows;
          out.rows_wrong += std::memcmp(mem[0][g].Row(l, static_cast<std::uint32_t>(idx[i])), want, kRow) != 0;
        }
      }
    }
    // Verification: accept 0..kDrafts drafts, roll the rest back (same iteration).
    for (std::uint32_t b = 0; b < batch; ++b) {
      const std::uint32_t rejected = static_cast<std::uint32_t>(rng() % (kDrafts + 1));
      if (rejected == 0) continue;
      const auto size = static_cast<std::uint32_t>(space->AddressesOf(rows[b]).value().size());
      const LogicalAddr first_rejected = space->AddressesOf(rows[b]).value()[size - rejected];
      const LogicalAddr last_kept = space->AddressesOf(rows[b]).value()[size - rejected - 1];
      EXPECT_TRUE(space->Truncate(rows[b], size - rejected));
      for (std::uint32_t q = kQ - rejected; q < kQ; ++q) version.erase(fresh[b * kQ + q].value());
      // The next token (position size - rejected) lands where the first rejected one was
      // when that was in the last kept token's page.
      if (first_rejected.value() / kPage == last_kept.value() / kPage) freed_tail[rows[b].value()] = first_rejected.value();
      out.drafts_rejected += rejected;
    }
    space->AdvanceRound();
    ++out.rounds;
  }
  for (RequestId r : all) {
    auto list = space->AddressesOf(r).value();
    for (std::size_t i = 0; i < list.size(); ++i) EXPECT_EQ(list[i].value() % kPage, i % kPage) << "token " << i;
  }
  EXPECT_EQ(space->num_live_addresses(), version.size());
  EXPECT_TRUE(space->CheckInvariants());
  return out;
}

// 256 device slots per group for 4 requests of 100-211 prompt tokens plus 3 tokens each per
// round: the device holds a fraction of the history, so plans evict and swap every round.
TEST(DraftRollback, MtpLoopWithRandomAcceptanceMatchesTheDenseReference) {
  ULA_TEST_SEEDED(seed, 20261243);
  const MtpResult r = RunMtp(seed, 256, 60);
  EXPECT_EQ(r.rounds, 60u);
  EXPECT_GT(r.drafts_rejected, 60u);
  EXPECT_GT(r.reused_in_place, 30u);
  EXPECT_GT(r.misses, 100u);
  EXPECT_EQ(r.moved, 0u) << "a new token's slot moved after it was looked up";
  EXPECT_EQ(r.rows_wrong, 0u) << "of " << r.rows << " gathered rows";
}

TEST(DraftRollback, FreedTailIsReusedAtTheSameOffsetsAndWholePagesGoBack) {
  auto backend = MakeCpuBackend();
  AddressSpaceConfig cfg = testing::SmallConfig(256, 256);
  cfg.page_tokens = 8;
  auto space = AddressSpace::Create(cfg, *backend).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
  auto a = space->Allocate(RequestId(1), 19).value();  // pages p0 [0, 8), p1 [8, 16), p2 [16, 19)
  ASSERT_TRUE(space->Truncate(RequestId(1), 10));     // p2 is whole free; p1 keeps 8, 9
  EXPECT_EQ(space->AddressesOf(RequestId(1))->size(), 10u);
  EXPECT_FALSE(space->IsLive(a[10]));
  EXPECT_FALSE(space->IsLive(a[16]));
  EXPECT_EQ(space->num_live_addresses(), 10u);
  auto b = space->Allocate(RequestId(1), 7).value();  // positions 10..16
  for (std::uint32_t i = 0; i < 6; ++i) EXPECT_EQ(b[i], a[10 + i]) << "position " << 10 + i;
  EXPECT_EQ(b[6].value() % 8, 0u);  // position 16 opens a page (p2 came back to the FIFO)
  ASSERT_TRUE(space->Truncate(RequestId(1), 0));
  EXPECT_EQ(space->num_live_addresses(), 0u);
  auto c = space->Allocate(RequestId(1), 1).value();
  EXPECT_EQ(c[0].value() % 8, 0u);
  EXPECT_TRUE(space->CheckInvariants());
}

TEST(DraftRollback, SharedOrAdoptedTokensAndBadLengthsAreRefusedAndChangeNothing) {
  auto backend = MakeCpuBackend();
  auto space = AddressSpace::Create(testing::SmallConfig(16, 16), *backend).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
  ASSERT_TRUE(space->AddRequest(RequestId(2), Rank(0)));
  auto a = space->Allocate(RequestId(1), 4).value();
  ASSERT_TRUE(space->ShareInto(RequestId(2), std::span(a).first(2)));  // 2 adopts tokens 0, 1
  ASSERT_TRUE(space->Allocate(RequestId(2), 2));
  ASSERT_TRUE(space->Retain(std::span(a).subspan(3, 1)));  // a cache reference on token 3 of 1
  const std::uint64_t before = space->DebugDigest();
  auto expect_refused = [&](Status s, ErrorCode code, const char* says) {
    ASSERT_FALSE(s);
    EXPECT_EQ(s.error().code(), code) << s.error().ToString();
    EXPECT_NE(s.error().message().find(says), std::string::npos) << s.error().ToString();
    EXPECT_EQ(space->DebugDigest(), before);
  };
  expect_refused(space->Truncate(RequestId(9), 0), ErrorCode::kNotFound, "unknown");
  expect_refused(space->Truncate(RequestId(1), 5), ErrorCode::kOutOfRange, "holds 4 tokens");
  expect_refused(space->Truncate(RequestId(1), 3), ErrorCode::kFailedPrecondition, "held by 2 holders");
  expect_refused(space->Truncate(RequestId(2), 1), ErrorCode::kFailedPrecondition, "adopted");
  expect_refused(space->Truncate(RequestId(1), 1), ErrorCode::kFailedPrecondition, "held by 2 holders");
  ASSERT_TRUE(space->Truncate(RequestId(1), 4));  // nothing to free
  EXPECT_EQ(space->DebugDigest(), before);
  ASSERT_TRUE(space->Truncate(RequestId(2), 2));  // its own tail; the adopted prefix stays
  EXPECT_EQ(space->RefCount(a[0]), 2u);
  auto again = space->Allocate(RequestId(2), 1).value();  // after an adopted token: a fresh page
  EXPECT_EQ(again[0].value() % 64, 2u);
  EXPECT_TRUE(space->CheckInvariants());
}

}  // namespace
}  // namespace ula

// The host step with attention at home over a TP space holding DeepSeek-V4-Flash's kinds
// (docs/ARCHITECTURE.md, "Kinds under TP"): a group's selections are the indexer's top-k of a
// request's C4 entries, each read on its home a mod P as in a TP space without kinds. A
// seeded decode loop with drafts (rejected drafts rolled back by Truncate) at P = 2 and 4,
// through TpStepPlanner's library path (Step) and engine path (Plan, the descriptors on the
// shards, Complete), each rank's device pool smaller than the C4 history homed on it, so that
// entries move: after every step each selected C4 entry is read on its home rank alone, from
// a device slot that holds its bytes (a shadow of every entry's version), no step changes any
// kind's page table on any rank (KindPagesOf), and CheckInvariants holds. A selection that
// is not a live C4 entry of its request is refused with nothing changed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "test_seed.h"
#include "v4_flash.h"
#include "ula/backend.h"
#include "ula/tp_address_space.h"
#include "ula/tp_step_planner.h"

namespace ula {
namespace {

constexpr std::uint32_t kDrafts = 3;
constexpr std::uint32_t kRow = test::kFlashC4Row;  // one CSA layer per group
constexpr std::uint32_t kTopK = 12;
constexpr std::uint32_t kRequests = 3;
constexpr std::uint32_t kPrompt = 240;  // 60 C4 entries per request
// Per rank and group: the most a step selects on one rank (3 x 12), below the C4 history
// homed on a rank at P = 4 (45 entries of the prompts alone, more as they decode).
constexpr std::uint32_t kDeviceEntries = kRequests * kTopK;
constexpr std::uint32_t kHostEntries = 1024;
// The sanitizer trees check the whole space inside every call (ULA_EXPENSIVE_CHECKS).
#if defined(ULA_EXPENSIVE_CHECKS)
constexpr int kRounds = 24;
constexpr std::uint32_t kGroupsPerRound = 3;
#else
constexpr int kRounds = 90;
constexpr std::uint32_t kGroupsPerRound = test::kFlashGroups;
#endif

enum class Form { kLibrary, kEngine };

TpConfig FlashTpConfig(std::uint32_t ranks) {
  return test::FlashTpConfig(ranks, kDeviceEntries, kHostEntries, kDrafts);
}

// The bytes of (address, version, group) in its group's one layer.
std::vector<std::byte> Bytes(LogicalAddr a, std::uint32_t version, std::uint32_t g) {
  std::vector<std::byte> out(kRow);
  for (std::uint32_t i = 0; i < kRow; ++i) out[i] = std::byte((a.value() * 131 + version * 61 + g * 17 + i * 7) & 0xff);
  return out;
}

// Every request's page table of every kind on every rank: what no step may change.
std::vector<KindPages> AllKindPages(const TpAddressSpace& s, std::span<const RequestId> requests) {
  std::vector<KindPages> out;
  for (RequestId r : requests) {
    for (std::uint32_t k = 0; k < s.config().kinds.size(); ++k) {
      for (std::uint32_t q = 0; q < s.config().num_ranks; ++q) {
        auto p = s.KindPagesOf(r, k, Rank(static_cast<std::uint16_t>(q)));
        EXPECT_TRUE(p) << p.error().ToString();
        out.push_back(p ? *p : KindPages{});
      }
    }
  }
  return out;
}

// The scheduler's side of the loop: tokens per request, the version of each C4 entry's bytes.
struct Decode {
  TpAddressSpace& space;
  std::mt19937_64 rng;
  std::vector<RequestId> requests;
  std::vector<std::uint32_t> tokens;
  std::unordered_map<std::uint32_t, std::uint32_t> version;  // address -> its current bytes' version
  std::uint32_t next_version = 1;
  std::uint32_t next_request = 1;

  Decode(TpAddressSpace& s, std::uint64_t seed) : space(s), rng(seed) {
    for (std::uint32_t b = 0; b < kRequests; ++b) {
      requests.push_back(RequestId(next_request++));
      tokens.push_back(0);
      EXPECT_TRUE(space.AddRequest(requests[b]));
    }
  }
  // Allocates n tokens of request b and writes every group's bytes of the C4 entries they
  // complete, each with a new version.
  void Allocate(std::uint32_t b, std::uint32_t n) {
    auto a = space.Allocate(requests[b], n);
    ASSERT_TRUE(a) << a.error().ToString();
    ASSERT_EQ(a->size(), (tokens[b] + n) / 4 - tokens[b] / 4);  // one per completed 4-token block
    tokens[b] += n;
    for (LogicalAddr x : *a) {
      version[x.value()] = next_version++;
      for (std::uint32_t g = 0; g < space.config().num_groups; ++g) {
        ASSERT_TRUE(space.Write(x, GroupId(g), Bytes(x, version[x.value()], g)));
      }
    }
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
  // Verification: of the round's 1 + kDrafts tokens, 1..1 + kDrafts are accepted; the
  // rejected drafts are truncated (with their C4 entries).
  void Accept() {
    for (std::uint32_t b = 0; b < kRequests; ++b) {
      const std::uint32_t rejected = static_cast<std::uint32_t>(rng() % (kDrafts + 1));
      if (rejected == 0) continue;
      tokens[b] -= rejected;
      ASSERT_TRUE(space.Truncate(requests[b], tokens[b]));
    }
  }
  // Request b finishes (every kind's entries freed on every rank) and a new one is prefilled.
  void Replace(std::uint32_t b) {
    ASSERT_TRUE(space.Free(requests[b]));
    requests[b] = RequestId(next_request++);
    tokens[b] = 0;
    ASSERT_TRUE(space.AddRequest(requests[b]));
    Allocate(b, kPrompt);
  }
};

// The bytes a rank reads at a shard ref: the entry's current version, on its home only.
void ExpectHomeBytes(const TpAddressSpace& s, const Decode& d, Rank rank, GroupId g, LogicalAddr a, TpReadRef ref) {
  const std::uint32_t p = s.config().num_ranks;
  if (a.value() % p != rank.value()) {
    EXPECT_EQ(ref.source, TpReadRef::Source::kElsewhere) << "address " << a.value() << " read on rank "
                                                         << rank.value() << ", not its home";
    return;
  }
  ASSERT_EQ(ref.source, TpReadRef::Source::kShard) << "address " << a.value() << " on its home " << rank.value();
  auto loc = s.Lookup(a, g);
  ASSERT_TRUE(loc);
  EXPECT_EQ(loc->tier(), Tier::kDevice);
  EXPECT_EQ(loc->rank(), rank);
  EXPECT_EQ(loc->slot(), ref.slot);
  const std::byte* row = s.RefData(rank, g, ref);
  ASSERT_NE(row, nullptr);
  const auto want = Bytes(a, d.version.at(a.value()), g.value());
  EXPECT_EQ(std::memcmp(row, want.data(), kRow), 0) << "address " << a.value() << " group " << g.value();
}

struct LoopCounts {
  std::uint64_t steps = 0, selections = 0, moves = 0;
};

// One step of group g over every request's top-k, through the form; checks every selection.
void StepAndCheck(Form form, TpAddressSpace& s, TpStepPlanner& library, TpStepPlanner* engine, Decode& d, GroupId g,
                  LoopCounts& counts) {
  std::vector<LogicalAddr> sel;
  std::vector<SelectionRun> runs;
  for (std::uint32_t b = 0; b < kRequests; ++b) {
    const auto top = d.TopK(b);
    sel.insert(sel.end(), top.begin(), top.end());
    runs.push_back({d.requests[b], static_cast<std::uint32_t>(top.size())});
  }
  const auto pages = AllKindPages(s, d.requests);
  if (form == Form::kLibrary) {
    auto plan = library.Step(g, sel, runs);
    ASSERT_TRUE(plan) << plan.error().ToString();
    for (std::size_t h = 0; h < plan->ranks.size(); ++h) {
      counts.moves += plan->stats[h].misses;
      for (std::size_t i = 0; i < sel.size(); ++i) ExpectHomeBytes(s, d, plan->ranks[h], g, sel[i], plan->refs[h][i]);
    }
  } else {
    const StepShape shape{.batch = kRequests, .q_len = 1, .top_k = kTopK};
    std::vector<std::int32_t> flat(shape.size(), -1);
    for (std::size_t i = 0; i < sel.size(); ++i) flat[i] = static_cast<std::int32_t>(sel[i].value());
    const std::uint32_t p = s.config().num_ranks;
    std::vector<std::int32_t> indices(std::size_t{p} * shape.size(), -7);
    std::vector<CopyDescriptor> descriptors(engine->max_descriptors());
    auto planned = engine->Plan(g, shape, d.requests, flat, indices, descriptors);
    ASSERT_TRUE(planned) << planned.error().ToString();
    counts.moves += planned->num_descriptors;
    std::vector<std::uint8_t> status(planned->num_descriptors, 1);
    engine->ExecuteOnShards(std::span(descriptors).first(planned->num_descriptors), status);
    auto done = engine->Complete(planned->fence, status);
    ASSERT_TRUE(done) << done.error().ToString();
    for (std::uint32_t r = 0; r < p; ++r) {
      const Rank rank(static_cast<std::uint16_t>(r));
      for (std::size_t i = 0; i < sel.size(); ++i) {
        const std::int32_t idx = indices[r * shape.size() + i];
        const TpReadRef ref = idx < 0 ? TpReadRef{TpReadRef::Source::kElsewhere, SlotId(0), rank}
                                      : TpReadRef{TpReadRef::Source::kShard, SlotId(std::uint32_t(idx)), rank};
        ExpectHomeBytes(s, d, rank, g, sel[i], ref);
      }
    }
  }
  EXPECT_EQ(AllKindPages(s, d.requests), pages) << "a step changed a kind's page table";
  const Status ok = s.CheckInvariants();
  ASSERT_TRUE(ok) << ok.error().ToString();
  ++counts.steps;
  counts.selections += sel.size();
}

void RunLoop(std::uint32_t p, Form form, std::uint64_t seed) {
  SCOPED_TRACE("P = " + std::to_string(p) + (form == Form::kLibrary ? ", library path" : ", engine path"));
  auto backend = MakeCpuBackend({.copy_threads = 1});
  auto space = TpAddressSpace::Create(FlashTpConfig(p), *backend);
  ASSERT_TRUE(space) << space.error().ToString();
  TpAddressSpace& s = **space;
  TpStepPlanner library(s);
  std::unique_ptr<TpStepPlanner> engine;
  if (form == Form::kEngine) {
    auto made = TpStepPlanner::Create(s, {.max_batch = kRequests, .max_q_len = 1, .max_top_k = kTopK});
    ASSERT_TRUE(made) << made.error().ToString();
    engine = std::move(*made);
  }
  Decode d(s, seed);
  for (std::uint32_t b = 0; b < kRequests; ++b) d.Allocate(b, kPrompt);
  s.AdvanceRound();
  // Each rank's C4 history per group is past its device pool: the steps move entries.
  for (std::uint32_t r = 0; r < p; ++r) ASSERT_GT(s.NumHomed(Rank(static_cast<std::uint16_t>(r))), kDeviceEntries);
  LoopCounts counts;
  std::vector<std::uint32_t> groups(s.config().num_groups);
  for (std::uint32_t g = 0; g < groups.size(); ++g) groups[g] = g;
  for (int round = 0; round < kRounds; ++round) {
    for (std::uint32_t b = 0; b < kRequests; ++b) d.Allocate(b, 1 + kDrafts);
    std::shuffle(groups.begin(), groups.end(), d.rng);
    for (std::uint32_t k = 0; k < kGroupsPerRound; ++k) {
      StepAndCheck(form, s, library, engine.get(), d, GroupId(groups[k]), counts);
      if (::testing::Test::HasFatalFailure()) return;
    }
    d.Accept();
    if (round % 30 == 29) d.Replace(static_cast<std::uint32_t>(d.rng() % kRequests));
    s.AdvanceRound();
    const Status ok = s.CheckInvariants();
    ASSERT_TRUE(ok) << ok.error().ToString();
  }
  std::printf("[ tp_kind_step ] P = %u %s: %llu steps, %llu selections, %llu entries moved home to device\n", p,
              form == Form::kLibrary ? "library" : "engine", static_cast<unsigned long long>(counts.steps),
              static_cast<unsigned long long>(counts.selections), static_cast<unsigned long long>(counts.moves));
  EXPECT_GT(counts.moves, 0u) << "the device pools held every selection: nothing moved";
}

TEST(TpKindStep, LibraryPathReadsEveryC4SelectionOnItsHome) {
  ULA_TEST_SEEDED(seed, 20261206);
  for (const std::uint32_t p : {2u, 4u}) RunLoop(p, Form::kLibrary, seed + p);
}

TEST(TpKindStep, EnginePathReadsEveryC4SelectionOnItsHome) {
  ULA_TEST_SEEDED(seed, 20261207);
  for (const std::uint32_t p : {2u, 4u}) RunLoop(p, Form::kEngine, seed + p);
}

// A selection that is not a live C4 entry of its request (one a Truncate freed, another
// request's, one never made) is refused by both paths with nothing changed.
TEST(TpKindStep, ASelectionNotALiveC4EntryOfItsRequestIsRefusedWithNothingChanged) {
  auto backend = MakeCpuBackend({.copy_threads = 1});
  auto space = TpAddressSpace::Create(FlashTpConfig(2), *backend);
  ASSERT_TRUE(space) << space.error().ToString();
  TpAddressSpace& s = **space;
  TpStepPlanner library(s);
  auto engine = TpStepPlanner::Create(s, {.max_batch = 1, .max_q_len = 1, .max_top_k = 4});
  ASSERT_TRUE(engine) << engine.error().ToString();
  ASSERT_TRUE(s.AddRequest(RequestId(1)));
  ASSERT_TRUE(s.AddRequest(RequestId(2)));
  auto mine = s.Allocate(RequestId(1), 64).value();  // 16 C4 entries
  auto other = s.Allocate(RequestId(2), 64).value();
  const LogicalAddr freed = mine.back();
  ASSERT_TRUE(s.Truncate(RequestId(1), 60));  // frees the last C4 entry
  ASSERT_FALSE(s.IsLive(freed));
  const std::vector<RequestId> requests = {RequestId(1), RequestId(2)};
  const auto pages = AllKindPages(s, requests);
  const std::uint64_t digest = s.DebugDigest();
  for (const LogicalAddr bad : {freed, other.front(), LogicalAddr(100000)}) {
    SCOPED_TRACE("address " + std::to_string(bad.value()));
    const std::vector<LogicalAddr> sel = {mine[0], bad, mine[1]};
    const SelectionRun run{RequestId(1), 3};
    auto step = library.Step(GroupId(0), sel, {&run, 1});
    ASSERT_FALSE(step);
    EXPECT_EQ(step.error().code(), ErrorCode::kNotFound) << step.error().ToString();
    const RequestId one(1);
    std::vector<std::int32_t> flat = {std::int32_t(mine[0].value()), std::int32_t(bad.value()), -1, -1};
    std::vector<std::int32_t> indices(2 * flat.size(), -7);
    std::vector<CopyDescriptor> descriptors((*engine)->max_descriptors());
    auto planned = (*engine)->Plan(GroupId(0), {.batch = 1, .q_len = 1, .top_k = 4}, {&one, 1}, flat, indices,
                                   descriptors);
    ASSERT_FALSE(planned);
    EXPECT_EQ(planned.error().code(), ErrorCode::kNotFound) << planned.error().ToString();
    EXPECT_FALSE((*engine)->has_pending());
    EXPECT_TRUE(std::all_of(indices.begin(), indices.end(), [](std::int32_t i) { return i == -7; }));
    EXPECT_EQ(s.DebugDigest(), digest);
    EXPECT_EQ(AllKindPages(s, requests), pages);
    ASSERT_TRUE(s.CheckInvariants());
  }
}

}  // namespace
}  // namespace ula

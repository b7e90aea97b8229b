// A V4-shaped engine loop over a TP space with kinds (docs/ARCHITECTURE.md, "Kinds under TP"),
// the TP half of tests/step/v4_engine_loop_test.cc: the same tiny model runs through the TP
// engine step at home (TpStepPlanner's ReserveRound / Plan / ExecuteOnShards / Complete) at
// P = 2 and 4 for many rounds, and every row each rank's attention reads is bit-identical to
// the same row of the same model over a dense store.
//
// The model: kLayers layers, each with a sliding window of kWindow tokens; CSA layers add the
// top-k of their C4 entries (one per 4 tokens, selected through the step), HCA layers every
// C128 entry (one per 128 tokens), one layer is window-only. Two CSA layers form one group
// that shares one selection (V4.1's reuse layers), and so do the other two (a TP space has one
// entry size for every group: two layers each, where the DP loop's second group has one). MTP at
// q_len 2 with the draft rejected at random (Truncate); prefill chunks beside the decodes
// (flat token rows) admitted by ReserveRound; requests finish and new ones arrive; each rank's
// device shard holds fewer C4 entries than its share of the history, so the step moves them.
//
// Where each row is read (every entry on exactly one rank): a selected C4 entry a on its home
// a mod P, at the index the plan gives that rank (every other rank's index is padding); the
// window's rows on the request's window home only, through its ring's page table there; C128
// entry j on rank j mod P, local entry j / P of that rank's page table. C4 bytes live in the
// space's shard pools (Write; the step's descriptors run on them); the window and C128 rows
// in the engine's paged store of each rank, indexed by that rank's KindPagesOf block ids.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "test_seed.h"
#include "v4_loop_rows.h"
#include "ula/backend.h"
#include "ula/tp_address_space.h"
#include "ula/tp_step_planner.h"

namespace ula {
namespace {

constexpr std::uint32_t kRow = test::kV4Row;  // bytes of one row of every kind
constexpr std::uint32_t kWindow = 24;  // the sliding window
constexpr std::uint32_t kDraft = 1;    // MTP: one draft token, q_len 2
constexpr std::uint32_t kQLen = 1 + kDraft;
constexpr std::uint32_t kTopK = 8;
constexpr std::uint32_t kChunk = 48;       // prefill chunk (one query row per token)
constexpr std::uint32_t kBatch = 5;        // running requests
constexpr std::uint32_t kDeviceC4 = 384;   // C4 slots per group over all ranks: below the C4 history
constexpr std::uint32_t kHostC4 = 4096;    // per rank
#if defined(ULA_EXPENSIVE_CHECKS)
constexpr int kRounds = 120;  // the sanitizer trees check every invariant inside each call
#else
constexpr int kRounds = 700;
#endif

constexpr std::uint32_t kLayers = 7;
constexpr std::array<std::uint32_t, 4> kCsaLayers = {1, 3, 4, 6};
constexpr std::array<std::uint32_t, 2> kGroupLayers = {2, 2};  // sparse layers per group
constexpr std::array<std::uint32_t, 2> kGroupFirst = {0, 2};   // the group's first sparse layer
constexpr std::array<std::uint32_t, 2> kHcaLayers = {2, 5};
constexpr std::uint32_t kEntryBytes = 2 * kRow;  // a group's entry: its two layers
enum Kind : std::uint32_t { kWindowKind = 0, kC4 = 1, kC4Key = 2, kC128 = 3, kC4State = 4, kC128State = 5 };

TpConfig V4TpConfig(std::uint32_t ranks) {
  TpConfig c;
  c.num_ranks = ranks;
  c.num_groups = 2;
  c.entry_bytes = kEntryBytes;
  c.attention = TpAttention::kAtHome;
  c.device_bytes_per_rank = std::uint64_t{kDeviceC4 / ranks} * c.num_groups * kEntryBytes;
  c.host_bytes_per_rank = std::uint64_t{kHostC4} * c.num_groups * kEntryBytes;
  c.page_tokens = 64;
  c.stable_new_entries = true;
  c.kinds = {
      {.name = "window", .tokens_per_entry = 1, .lifetime = KindLifetime::kRing, .ring_tokens = kWindow + kDraft,
       .ring_draft_tokens = kDraft, .layers = kLayers, .row_bytes = kRow},
      {.name = "c4", .tokens_per_entry = 4, .lifetime = KindLifetime::kAppend, .layers = 4, .row_bytes = kRow,
       .placement = KindPlacement::kSparse},
      {.name = "c4_index_key", .tokens_per_entry = 4, .lifetime = KindLifetime::kAppend, .layers = 4,
       .row_bytes = 16, .companion_of = kC4},
      {.name = "c128", .tokens_per_entry = 128, .lifetime = KindLifetime::kAppend, .layers = 2, .row_bytes = kRow},
      {.name = "c4_state", .tokens_per_entry = 4, .lifetime = KindLifetime::kPerRequest, .state_rows = 8,
       .layers = 4, .row_bytes = kRow},
      {.name = "c128_state", .tokens_per_entry = 128, .lifetime = KindLifetime::kPerRequest, .state_rows = 128,
       .layers = 2, .row_bytes = kRow},
  };
  return c;
}

using test::DenseKind;
using test::EntryRow;
using test::FillRow;
using test::PagedKind;
using test::PageRow;
using test::RingRow;

struct Running {
  RequestId id;
  Rank home;                 // the window's home
  std::uint32_t prompt = 0;  // tokens to prefill
  std::uint32_t target = 0;  // tokens at which it finishes
  std::uint32_t tokens = 0;
  std::uint32_t rows = 0;    // query rows this round (0: waits)
  DenseKind window{kLayers}, c4{kCsaLayers.size()}, c128{kHcaLayers.size()};
  bool prefilling() const { return tokens < prompt; }
};

struct Counts {
  std::uint64_t rounds = 0, prefill_chunks = 0, decodes = 0, rollbacks = 0, c4_rolled_back = 0, finished = 0;
  std::uint64_t waits = 0, descriptors = 0, shapes_q2 = 0, shapes_flat = 0;
  std::uint64_t window_rows = 0, c4_rows = 0, c128_rows = 0;
  std::vector<std::uint64_t> c4_rows_on, window_homes;  // [P]
};

void RunLoop(std::uint32_t p, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto backend = MakeCpuBackend({.copy_threads = 1});
  const TpConfig config = V4TpConfig(p);
  auto created_space = TpAddressSpace::Create(config, *backend);
  ASSERT_TRUE(created_space) << created_space.error().ToString();
  TpAddressSpace& space = **created_space;
  ASSERT_EQ(space.config().device_slots_per_group(), kDeviceC4 / p);
  constexpr std::uint32_t kMaxRows = kBatch * kChunk;
  auto created = TpStepPlanner::Create(space, {.max_batch = kMaxRows, .max_q_len = kChunk, .max_top_k = kTopK,
                                               .max_rows = kMaxRows});
  ASSERT_TRUE(created) << created.error().ToString();
  TpStepPlanner& planner = **created;
  ASSERT_EQ(planner.ranks().size(), p);
  std::vector<PagedKind> window_mem(p, PagedKind{kLayers, {}});
  std::vector<PagedKind> c128_mem(p, PagedKind{static_cast<std::uint32_t>(kHcaLayers.size()), {}});
  auto rank = [](std::uint32_t r) { return Rank(static_cast<std::uint16_t>(r)); };

  std::vector<std::unique_ptr<Running>> running;
  std::uint32_t next_id = 1, next_version = 1;
  Counts n;
  n.c4_rows_on.assign(p, 0);
  n.window_homes.assign(p, 0);
  auto arrive = [&]() {
    auto r = std::make_unique<Running>();
    r->id = RequestId(next_id++);
    r->prompt = 200 + static_cast<std::uint32_t>(rng() % 500);
    r->target = r->prompt + 30 + static_cast<std::uint32_t>(rng() % 90);
    ASSERT_TRUE(space.AddRequest(r->id));
    r->home = *space.WindowHomeOf(r->id);
    ++n.window_homes[r->home.value()];
    running.push_back(std::move(r));
  };
  // Allocate, then the engine's KV write: every kind's new rows on their rank, and dense.
  auto allocate = [&](Running& r, std::uint32_t count) {
    auto fresh = space.Allocate(r.id, count);
    ASSERT_TRUE(fresh) << fresh.error().ToString();
    const std::uint32_t from = r.tokens;
    r.tokens += count;
    ASSERT_EQ(fresh->size(), r.tokens / 4 - from / 4);
    const KindPages wp = *space.KindPagesOf(r.id, kWindowKind, r.home);
    std::vector<KindPages> cp;
    for (std::uint32_t q = 0; q < p; ++q) cp.push_back(*space.KindPagesOf(r.id, kC128, rank(q)));
    const std::uint32_t first = wp.tokens - wp.entries;
    std::vector<std::byte> entry(kEntryBytes);
    for (std::uint32_t t = from; t < r.tokens; ++t) {
      const std::uint32_t v = next_version++;
      for (std::uint32_t l = 0; l < kLayers; ++l) {
        FillRow(r.window.Append(l), r.id.value(), t, kWindowKind, l, v);
        ASSERT_GE(t, first) << "the ring freed a token of this round's chunk";
        const PageRow at = RingRow(wp, t);
        FillRow(window_mem[r.home.value()].Row(at.block, l, at.offset), r.id.value(), t, kWindowKind, l, v);
      }
      if ((t + 1) % 4 == 0) {  // the token completing a C4 entry: written on its home
        const std::uint32_t e = (t + 1) / 4 - 1;
        const LogicalAddr a = (*fresh)[e - from / 4];
        for (std::uint32_t g = 0; g < config.num_groups; ++g) {
          for (std::uint32_t j = 0; j < kGroupLayers[g]; ++j) {
            const std::uint32_t sl = kGroupFirst[g] + j;
            std::byte* row = r.c4.Append(sl);
            FillRow(row, r.id.value(), e, kC4, kCsaLayers[sl], v);
            std::memcpy(entry.data() + j * kRow, row, kRow);
          }
          ASSERT_TRUE(space.Write(a, GroupId(g), entry));
        }
      }
      if ((t + 1) % 128 == 0) {  // the token completing a C128 entry: entry e on rank e mod P
        const std::uint32_t e = (t + 1) / 128 - 1;
        const std::uint32_t q = e % p;
        const PageRow at = EntryRow(cp[q], e / p);
        for (std::uint32_t h = 0; h < kHcaLayers.size(); ++h) {
          FillRow(r.c128.Append(h), r.id.value(), e, kC128, kHcaLayers[h], v);
          FillRow(c128_mem[q].Row(at.block, h, at.offset), r.id.value(), e, kC128, kHcaLayers[h], v);
        }
      }
    }
  };
  // Every rank's page tables hold exactly the dense model's entries: the window on its home
  // only, C128 entry j on rank j mod P.
  auto check_counts = [&](const Running& r) {
    std::uint32_t c128_entries = 0;
    for (std::uint32_t q = 0; q < p; ++q) {
      const KindPages wp = *space.KindPagesOf(r.id, kWindowKind, rank(q));
      if (rank(q) == r.home) {
        ASSERT_EQ(wp.tokens, r.tokens);
        ASSERT_GE(wp.entries, std::min(r.tokens, kWindow));
        ASSERT_LE(wp.entries, kWindow + kDraft + kChunk - 1);  // the ring plus a round's other tokens
      } else {
        ASSERT_EQ(wp.entries, 0u) << "rank " << q << " holds window rows of request " << r.id.value();
      }
      const KindPages cp = *space.KindPagesOf(r.id, kC128, rank(q));
      ASSERT_EQ(cp.entries, r.tokens / 128 / p + (r.tokens / 128 % p > q ? 1 : 0)) << "rank " << q;
      c128_entries += cp.entries;
    }
    ASSERT_EQ(r.window.size(), r.tokens);
    ASSERT_EQ(space.AddressesOf(r.id)->size(), r.c4.size());
    ASSERT_EQ(r.c4.size(), r.tokens / 4);
    ASSERT_EQ(c128_entries, r.c128.size());
    ASSERT_EQ(r.c128.size(), r.tokens / 128);
  };

  for (std::uint32_t b = 0; b < kBatch; ++b) arrive();
  const std::uint32_t max_size = kMaxRows * kTopK;
  std::vector<std::int32_t> sel[2], idx[2];
  std::vector<std::uint32_t> chosen[2];  // the C4 entry of each selection (kNoEntry: padding)
  constexpr std::uint32_t kNoEntry = ~0u;
  std::vector<CopyDescriptor> desc(planner.max_descriptors());
  std::vector<std::uint8_t> status(desc.size());
  for (int round = 0; round < kRounds; ++round) {
    const std::string where = "P " + std::to_string(p) + " round " + std::to_string(round);
    // Admission: every decode, then each prefill chunk the reservation still holds.
    std::vector<RoundDemand> demands;
    auto demand = [](const Running& r, std::uint32_t rows) {
      const std::uint32_t count = r.prefilling() ? rows : kQLen;
      return RoundDemand{r.id, (r.tokens + count) / 4 - r.tokens / 4, rows * kTopK};
    };
    for (auto& r : running) {
      r->rows = r->prefilling() ? 0 : kQLen;
      if (r->rows != 0) demands.push_back(demand(*r, r->rows));
    }
    auto reserved = planner.ReserveRound(demands);
    ASSERT_TRUE(reserved) << where << ": the decodes alone: " << reserved.error().ToString();
    for (auto& r : running) {
      if (!r->prefilling()) continue;
      const std::uint32_t rows = std::min(kChunk, r->prompt - r->tokens);
      demands.push_back(demand(*r, rows));
      if (planner.ReserveRound(demands)) {
        r->rows = rows;
      } else {
        demands.pop_back();
        ++n.waits;
      }
    }
    bool flat = false;
    std::vector<RequestId> row_request, batch_request;
    std::vector<std::uint32_t> row_position;
    std::vector<Running*> row_owner;
    for (auto& r : running) {
      if (r->rows == 0) continue;
      flat = flat || r->prefilling();
      r->prefilling() ? ++n.prefill_chunks : ++n.decodes;
      const std::uint32_t from = r->tokens;
      allocate(*r, r->rows);
      if (::testing::Test::HasFatalFailure()) return;
      batch_request.push_back(r->id);
      for (std::uint32_t q = from; q < r->tokens; ++q) {
        row_request.push_back(r->id);
        row_position.push_back(q);
        row_owner.push_back(r.get());
      }
    }
    const std::uint32_t rows = static_cast<std::uint32_t>(row_request.size());
    ASSERT_GT(rows, 0u) << where;
    ASSERT_LE(rows * kTopK, max_size) << where;
    const StepShape shape = flat ? StepShape{rows, 1, kTopK} : StepShape{rows / kQLen, kQLen, kTopK};
    const std::span<const RequestId> requests =
        flat ? std::span<const RequestId>(row_request) : std::span<const RequestId>(batch_request);
    flat ? ++n.shapes_flat : ++n.shapes_q2;
    // Each group's indexer: the causal top-k of the C4 entries each row may see, one
    // selection for the group's layers; the engine step at home on every rank.
    for (std::uint32_t g = 0; g < config.num_groups; ++g) {
      sel[g].assign(std::size_t{rows} * kTopK, -1);
      idx[g].assign(std::size_t{p} * sel[g].size(), -2);
      chosen[g].assign(sel[g].size(), kNoEntry);
      std::vector<std::uint32_t> pool;
      for (std::uint32_t i = 0; i < rows; ++i) {
        const std::uint32_t visible = (row_position[i] + 1) / 4;
        const auto addrs = *space.AddressesOf(row_request[i]);
        pool.resize(visible);
        for (std::uint32_t e = 0; e < visible; ++e) pool[e] = e;
        const std::uint32_t k = std::min(kTopK, visible);
        for (std::uint32_t s = 0; s < k; ++s) {
          std::swap(pool[s], pool[s + rng() % (visible - s)]);
          chosen[g][std::size_t{i} * kTopK + s] = pool[s];
          sel[g][std::size_t{i} * kTopK + s] = static_cast<std::int32_t>(addrs[pool[s]].value());
        }
      }
      auto plan = planner.Plan(GroupId(g), shape, requests, sel[g], idx[g], desc);
      ASSERT_TRUE(plan) << where << " group " << g << ": " << plan.error().ToString();
      auto st = std::span(status).first(plan->num_descriptors);
      planner.ExecuteOnShards(std::span(desc).first(plan->num_descriptors), st);
      ASSERT_TRUE(std::all_of(st.begin(), st.end(), [](std::uint8_t s) { return s == 0; })) << where;
      auto done = planner.Complete(plan->fence, st);
      ASSERT_TRUE(done && done->failed == 0) << where;
      n.descriptors += plan->num_descriptors;
    }
    // Attention on every rank: every row it reads, against the dense model.
    const std::size_t size = std::size_t{rows} * kTopK;
    for (std::uint32_t i = 0; i < rows; ++i) {
      const Running& r = *row_owner[i];
      const std::uint32_t q = row_position[i];
      const std::string at = where + " request " + std::to_string(r.id.value()) + " position " + std::to_string(q);
      // The window: on its home, through the ring's page table there.
      const KindPages wp = *space.KindPagesOf(r.id, kWindowKind, r.home);
      const std::uint32_t first = wp.tokens - wp.entries;
      for (std::uint32_t t = q + 1 > kWindow ? q + 1 - kWindow : 0; t <= q; ++t) {
        ASSERT_GE(t, first) << at << ": the row's window left the ring at " << t;
        const PageRow pr = RingRow(wp, t);
        for (std::uint32_t l = 0; l < kLayers; ++l) {
          ASSERT_EQ(std::memcmp(window_mem[r.home.value()].Row(pr.block, l, pr.offset), r.window.Row(l, t), kRow), 0)
              << at << ": window row of position " << t << " layer " << l;
          ++n.window_rows;
        }
      }
      // C4: each selection on its home at that rank's index; padding on every other rank.
      for (std::uint32_t g = 0; g < config.num_groups; ++g) {
        for (std::uint32_t s = 0; s < kTopK; ++s) {
          const std::size_t k = std::size_t{i} * kTopK + s;
          const std::uint32_t home = chosen[g][k] == kNoEntry ? p : static_cast<std::uint32_t>(sel[g][k]) % p;
          for (std::uint32_t h = 0; h < p; ++h) {
            const std::int32_t index = idx[g][h * size + k];
            if (h != home) {
              ASSERT_EQ(index, -1) << at << ": rank " << h << " reads selection " << s << " of group " << g
                                   << " homed on rank " << home;
              continue;
            }
            ASSERT_GE(index, 0) << at;
            ASSERT_LT(static_cast<std::uint32_t>(index), planner.device_slots()) << at;
            const std::byte* entry =
                space.RefData(rank(h), GroupId(g), {TpReadRef::Source::kShard, SlotId(std::uint32_t(index)), rank(h)});
            ASSERT_NE(entry, nullptr) << at;
            for (std::uint32_t j = 0; j < kGroupLayers[g]; ++j) {
              ASSERT_EQ(std::memcmp(entry + j * kRow, r.c4.Row(kGroupFirst[g] + j, chosen[g][k]), kRow), 0)
                  << at << ": C4 entry " << chosen[g][k] << " group " << g << " layer "
                  << kCsaLayers[kGroupFirst[g] + j] << " on rank " << h << " slot " << index;
              ++n.c4_rows;
              ++n.c4_rows_on[h];
            }
          }
        }
      }
      // C128: entry e on rank e mod P, its local entry e / P there.
      for (std::uint32_t e = 0; e < (q + 1) / 128; ++e) {
        const std::uint32_t owner = e % p;
        const PageRow pr = EntryRow(*space.KindPagesOf(r.id, kC128, rank(owner)), e / p);
        for (std::uint32_t h = 0; h < kHcaLayers.size(); ++h) {
          ASSERT_EQ(std::memcmp(c128_mem[owner].Row(pr.block, h, pr.offset), r.c128.Row(h, e), kRow), 0)
              << at << ": C128 entry " << e << " layer " << kHcaLayers[h] << " on rank " << owner;
          ++n.c128_rows;
        }
      }
    }
    // Verification: a decode's draft is rejected half the time and rolled back.
    for (auto& r : running) {
      if (r->rows == 0 || r->tokens - r->rows < r->prompt) continue;  // not a decode
      if (rng() % 2 == 0) continue;
      const std::uint32_t keep = r->tokens - kDraft;
      n.c4_rolled_back += r->tokens / 4 - keep / 4;
      ASSERT_TRUE(space.Truncate(r->id, keep)) << where;
      r->tokens = keep;
      r->window.Truncate(keep);
      r->c4.Truncate(keep / 4);
      r->c128.Truncate(keep / 128);
      ++n.rollbacks;
    }
    for (auto& r : running) {
      check_counts(*r);
      if (::testing::Test::HasFatalFailure()) return;
    }
    for (std::size_t b = 0; b < running.size();) {
      if (running[b]->tokens < running[b]->target) {
        ++b;
        continue;
      }
      ASSERT_TRUE(space.Free(running[b]->id)) << where;
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(b));
      ++n.finished;
    }
    while (running.size() < kBatch) arrive();
    space.AdvanceRound();
    ++n.rounds;
    const Status inv = space.CheckInvariants();
    ASSERT_TRUE(inv) << where << ": " << inv.error().ToString();
  }
  std::printf("TP V4 engine loop, P = %u: %llu rounds (%llu at q_len 2, %llu flat), %llu prefill chunks (%llu waited), "
              "%llu decodes, %llu drafts rejected (%llu C4 entries rolled back), %llu requests finished; "
              "%llu descriptors; rows equal to the dense model: window %llu, C4 %llu, C128 %llu\n",
              p, (unsigned long long)n.rounds, (unsigned long long)n.shapes_q2, (unsigned long long)n.shapes_flat,
              (unsigned long long)n.prefill_chunks, (unsigned long long)n.waits, (unsigned long long)n.decodes,
              (unsigned long long)n.rollbacks, (unsigned long long)n.c4_rolled_back, (unsigned long long)n.finished,
              (unsigned long long)n.descriptors, (unsigned long long)n.window_rows, (unsigned long long)n.c4_rows,
              (unsigned long long)n.c128_rows);
  // The loop did what it names: entries moved, drafts rolled back, requests came and went,
  // both shapes ran, every kind's rows were read, and every rank read C4 rows and homed windows.
  EXPECT_GT(n.descriptors, 200u);
  EXPECT_GT(n.rollbacks, 30u);
  EXPECT_GT(n.c4_rolled_back, 5u);
  EXPECT_GE(n.finished, kBatch);
  EXPECT_GT(n.shapes_q2, 0u);
  EXPECT_GT(n.shapes_flat, 0u);
  EXPECT_GT(n.c4_rows, 1000u);
  EXPECT_GT(n.c128_rows, 100u);
  EXPECT_GT(n.window_rows, 1000u);
  for (std::uint32_t h = 0; h < p; ++h) {
    EXPECT_GT(n.c4_rows_on[h], 100u) << "rank " << h;
    EXPECT_GT(n.window_homes[h], 0u) << "rank " << h;
  }
}

TEST(TpV4EngineLoop, EveryRowEachRankReadsMatchesTheDenseModel) {
  ULA_TEST_SEEDED(seed, 20261207);
  for (const std::uint32_t p : {2u, 4u}) {
    SCOPED_TRACE("P = " + std::to_string(p));
    RunLoop(p, seed + p);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace ula

// A V4-shaped engine loop (docs/ARCHITECTURE.md, "Kinds"; docs/INTEGRATION.md, DeepSeek-V4):
// a tiny model with DeepSeek-V4's layer kinds runs through the engine step (StepPlanner's
// Plan / Complete) for many rounds, and every row its attention reads is bit-identical to the
// same row of the same model over a dense store.
//
// The model: kLayers layers, each with a sliding window of kWindow tokens; CSA layers add the
// top-k of their C4 entries (one per 4 tokens, selected through the step), HCA layers every
// C128 entry (one per 128 tokens), and one layer is window-only. Two CSA layers form one
// group that shares one selection (V4.1's reuse layers), the third CSA layer a group of its
// own. Decode is MTP at q_len 2 (one draft per round) and the draft is rejected at random
// (Truncate); new requests prefill in chunks beside the decodes (flat token rows), admitted
// by ReserveRound; requests finish and new ones arrive; the device holds fewer C4 entries
// than the history, so the step moves entries between device and host.
//
// The engine's memory is the test's: the C4 pools (engine_pools.h, registered with the
// planner, which runs Allocate's moves and the step's descriptors on them) and a paged store
// per resident kind indexed by KindPagesOf's block ids. The engine writes each new token's
// window rows, each new C4 entry's rows at the slot Lookup gives and each new C128 entry's
// rows at its page, and the same rows to a dense store per request ([layer][position or
// entry]). Each round every row the attention reads — the window through its page table, the
// selected C4 rows at the indices the plan gives, every C128 row through its page table —
// must equal the dense row. A row names its request, position or entry, kind, layer and
// version (a counter bumped by every token written), so a stale, moved-away, rolled-back or
// another request's row cannot match.
//
// The device step's OpenMP form (DeviceStep) runs the same loop on a twin space with engine
// memory of its own: every step returns the engine path's descriptors, indices, hits and
// misses, its descriptors run on the twin's memory bring the same rows, and the two spaces'
// digests agree after every round.
//
// The window ring is the model's own: the window plus the drafts (ring_draft_tokens = kDraft),
// with prefill chunks far longer than the drafts. Allocate frees the ring by the round's first
// token (docs/ARCHITECTURE.md, "Kinds"), so a chunk's first row still finds the kWindow - 1
// tokens before the chunk, and the chunk's tokens stay until the request's next Allocate.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "step/device_step_fixture.h"
#include "step/engine_pools.h"
#include "test_seed.h"
#include "v4_loop_rows.h"
#include "ula/address_space.h"
#include "ula/backend.h"
#include "ula/device_step.h"
#include "ula/step_planner.h"

namespace ula {
namespace {

constexpr std::uint32_t kRow = test::kV4Row;  // bytes of one row of every kind
constexpr std::uint32_t kWindow = 24;      // the sliding window
constexpr std::uint32_t kDraft = 1;        // MTP: one draft token, q_len 2
constexpr std::uint32_t kQLen = 1 + kDraft;
constexpr std::uint32_t kTopK = 8;
constexpr std::uint32_t kChunk = 48;       // prefill chunk (one query row per token)
constexpr std::uint32_t kBatch = 5;        // running requests
constexpr std::uint32_t kDeviceC4 = 320;   // C4 slots per group: far below the C4 history
constexpr std::uint32_t kHostC4 = 4096;
#if defined(ULA_EXPENSIVE_CHECKS)
constexpr int kRounds = 250;  // the sanitizer trees check every invariant inside each call
#else
constexpr int kRounds = 1500;
#endif

// The model's layers. CSA layers, in the order of the sparse kind's layers: 1 and 3 share
// group 0's selection, 4 is group 1. HCA layers: 2 and 5. Layer 0 is window-only.
constexpr std::uint32_t kLayers = 6;
constexpr std::array<std::uint32_t, 3> kCsaLayers = {1, 3, 4};
constexpr std::array<std::uint32_t, 2> kGroupLayers = {2, 1};  // sparse layers per group
constexpr std::array<std::uint32_t, 2> kGroupFirst = {0, 2};   // the group's first sparse layer
constexpr std::array<std::uint32_t, 2> kHcaLayers = {2, 5};
enum Kind : std::uint32_t { kWindowKind = 0, kC4 = 1, kC4Key = 2, kC128 = 3, kC4State = 4, kC128State = 5 };

AddressSpaceConfig V4Config() {
  AddressSpaceConfig c;
  c.num_groups = 2;
  c.row_bytes = kRow;
  c.entry_bytes = 2 * kRow;  // the largest group's entry
  c.group_layers = {kGroupLayers[0], kGroupLayers[1]};
  c.page_tokens = 64;
  c.stable_new_entries = true;
  c.policy = PolicyKind::kKernelPbLru;  // the device step holds PB-LRU as flat bitmaps
  c.device_bytes_per_rank = std::uint64_t{kDeviceC4} * kCsaLayers.size() * kRow;
  c.host_bytes_per_rank = std::uint64_t{kHostC4} * kCsaLayers.size() * kRow;
  c.kinds = {
      {.name = "window", .tokens_per_entry = 1, .lifetime = KindLifetime::kRing, .ring_tokens = kWindow + kDraft,
       .ring_draft_tokens = kDraft, .layers = kLayers, .row_bytes = kRow},
      {.name = "c4", .tokens_per_entry = 4, .lifetime = KindLifetime::kAppend, .layers = 3, .row_bytes = kRow,
       .placement = KindPlacement::kSparse},
      {.name = "c4_index_key", .tokens_per_entry = 4, .lifetime = KindLifetime::kAppend, .layers = 3,
       .row_bytes = 16, .companion_of = kC4},
      {.name = "c128", .tokens_per_entry = 128, .lifetime = KindLifetime::kAppend, .layers = 2, .row_bytes = kRow},
      {.name = "c4_state", .tokens_per_entry = 4, .lifetime = KindLifetime::kPerRequest, .state_rows = 8,
       .layers = 3, .row_bytes = kRow},
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
  std::uint32_t prompt = 0;  // tokens to prefill
  std::uint32_t target = 0;  // tokens at which it finishes
  std::uint32_t tokens = 0;
  std::uint32_t rows = 0;    // query rows this round (0: waits)
  DenseKind window{kLayers}, c4{kCsaLayers.size()}, c128{kHcaLayers.size()};
  bool prefilling() const { return tokens < prompt; }
};

struct Counts {
  std::uint64_t rounds = 0, prefill_chunks = 0, decodes = 0, rollbacks = 0, c4_rolled_back = 0, finished = 0;
  std::uint64_t waits = 0, hits = 0, misses = 0, evictions = 0, shapes_q2 = 0, shapes_flat = 0;
  std::uint64_t window_rows = 0, c4_rows = 0, c128_rows = 0;
};

TEST(V4EngineLoop, EveryGatheredRowMatchesTheDenseModel) {
  ULA_TEST_SEEDED(seed, 20261206);
  std::mt19937_64 rng(seed);
  auto backend = MakeCountingBackend();  // the engine owns the bytes
  const AddressSpaceConfig config = V4Config();
  auto created_space = AddressSpace::Create(config, *backend);
  auto twin_space = AddressSpace::Create(config, *backend);
  ASSERT_TRUE(created_space) << created_space.error().ToString();
  ASSERT_TRUE(twin_space) << twin_space.error().ToString();
  AddressSpace& space = **created_space;
  AddressSpace& twin = **twin_space;
  ASSERT_EQ(config.device_slots_per_group(), kDeviceC4);
  constexpr std::uint32_t kMaxRows = kBatch * kChunk;
  // Flat token rows come as batch = rows, q_len 1; a prefill chunk is reserved as one
  // request's q_len x top_k.
  auto created = StepPlanner::Create(space, {.max_batch = kMaxRows, .max_q_len = kChunk, .max_top_k = kTopK,
                                             .max_rows = kMaxRows});
  ASSERT_TRUE(created) << created.error().ToString();
  StepPlanner& planner = **created;
  testing::EngineMemory c4_mem, twin_mem;
  for (std::uint32_t g = 0; g < config.num_groups; ++g) {
    const std::uint32_t slots[kNumTiers] = {config.device_slots_per_group(), config.host_slots_per_group()};
    for (int t = 0; t < kNumTiers; ++t) {
      c4_mem[t].emplace_back(slots[t], kRow, kGroupLayers[g]);
      twin_mem[t].emplace_back(slots[t], kRow, kGroupLayers[g]);
      ASSERT_TRUE(planner.RegisterEngineMemory(static_cast<Tier>(t), Rank(0), GroupId(g), c4_mem[t][g].Region()));
    }
  }
  twin.SetMoveExecutor(testing::MovesOnEngineMemory(twin_mem));
  std::vector<std::unique_ptr<DeviceStep>> steps;
  for (std::uint32_t g = 0; g < config.num_groups; ++g) {
    auto step = DeviceStep::Create(twin, Rank(0), GroupId(g),
                                   {.max_rows = kMaxRows, .max_batch = kMaxRows, .max_top_k = kTopK,
                                    .max_addresses = 1u << 14, .max_requests = 1u << 12, .max_adopted = 16});
    ASSERT_TRUE(step) << step.error().ToString();
    steps.push_back(std::move(*step));
  }
  PagedKind window_mem{kLayers, {}}, c128_mem{static_cast<std::uint32_t>(kHcaLayers.size()), {}};

  std::vector<std::unique_ptr<Running>> running;
  std::uint32_t next_id = 1, next_version = 1;
  Counts n;
  auto arrive = [&]() {
    auto r = std::make_unique<Running>();
    r->id = RequestId(next_id++);
    r->prompt = 200 + static_cast<std::uint32_t>(rng() % 500);
    r->target = r->prompt + 30 + static_cast<std::uint32_t>(rng() % 90);
    ASSERT_TRUE(space.AddRequest(r->id, Rank(0)) && twin.AddRequest(r->id, Rank(0)));
    running.push_back(std::move(r));
  };
  // Allocate, then the engine's KV write: every kind's new rows, in the cache and dense.
  auto allocate = [&](Running& r, std::uint32_t count) {
    auto fresh = space.Allocate(r.id, count);
    ASSERT_TRUE(fresh) << fresh.error().ToString();
    auto twin_fresh = twin.Allocate(r.id, count);
    ASSERT_TRUE(twin_fresh && *twin_fresh == *fresh);
    const std::uint32_t from = r.tokens;
    r.tokens += count;
    ASSERT_EQ(fresh->size(), r.tokens / 4 - from / 4);
    const KindPages wp = *space.KindPagesOf(r.id, kWindowKind), cp = *space.KindPagesOf(r.id, kC128);
    const std::uint32_t first = wp.tokens - wp.entries;
    for (std::uint32_t p = from; p < r.tokens; ++p) {
      const std::uint32_t v = next_version++;
      for (std::uint32_t l = 0; l < kLayers; ++l) {
        FillRow(r.window.Append(l), r.id.value(), p, kWindowKind, l, v);
        ASSERT_GE(p, first) << "the ring freed a token of this round's chunk";
        const PageRow at = RingRow(wp, p);
        FillRow(window_mem.Row(at.block, l, at.offset), r.id.value(), p, kWindowKind, l, v);
      }
      if ((p + 1) % 4 == 0) {  // the token completing a C4 entry
        const std::uint32_t e = (p + 1) / 4 - 1;
        const LogicalAddr a = (*fresh)[e - from / 4];
        for (std::uint32_t g = 0; g < config.num_groups; ++g) {
          const Location loc = *space.Lookup(a, GroupId(g)), twin_loc = *twin.Lookup(a, GroupId(g));
          for (std::uint32_t j = 0; j < kGroupLayers[g]; ++j) {
            const std::uint32_t sl = kGroupFirst[g] + j;
            std::byte* row = r.c4.Append(sl);
            FillRow(row, r.id.value(), e, kC4, kCsaLayers[sl], v);
            std::memcpy(c4_mem[static_cast<int>(loc.tier())][g].Row(loc.slot().value(), j), row, kRow);
            std::memcpy(twin_mem[static_cast<int>(twin_loc.tier())][g].Row(twin_loc.slot().value(), j), row, kRow);
          }
        }
      }
      if ((p + 1) % 128 == 0) {  // the token completing a C128 entry
        const std::uint32_t e = (p + 1) / 128 - 1;
        const PageRow at = EntryRow(cp, e);
        for (std::uint32_t h = 0; h < kHcaLayers.size(); ++h) {
          FillRow(r.c128.Append(h), r.id.value(), e, kC128, kHcaLayers[h], v);
          FillRow(c128_mem.Row(at.block, h, at.offset), r.id.value(), e, kC128, kHcaLayers[h], v);
        }
      }
    }
  };
  // The request's page tables hold exactly the dense model's entries, the twin's the same.
  auto check_counts = [&](const Running& r) {
    const KindPages wp = *space.KindPagesOf(r.id, kWindowKind), cp = *space.KindPagesOf(r.id, kC128);
    ASSERT_EQ(*twin.KindPagesOf(r.id, kWindowKind), wp);
    ASSERT_EQ(*twin.KindPagesOf(r.id, kC128), cp);
    ASSERT_EQ(wp.tokens, r.tokens);
    ASSERT_EQ(r.window.size(), r.tokens);
    ASSERT_GE(wp.entries, std::min(r.tokens, kWindow));
    ASSERT_LE(wp.entries, kWindow + kDraft + kChunk - 1);  // the ring plus a round's other tokens
    ASSERT_EQ(space.AddressesOf(r.id)->size(), r.c4.size());
    ASSERT_EQ(r.c4.size(), r.tokens / 4);
    ASSERT_EQ(cp.entries, r.c128.size());
    ASSERT_EQ(r.c128.size(), r.tokens / 128);
  };

  for (std::uint32_t b = 0; b < kBatch; ++b) arrive();
  std::vector<std::int32_t> sel[2], idx[2];
  std::vector<std::uint32_t> chosen[2];  // the C4 entry of each selection (kNoEntry: padding)
  constexpr std::uint32_t kNoEntry = ~0u;
  std::vector<CopyDescriptor> desc(planner.max_descriptors());
  std::vector<std::uint8_t> status(desc.size());
  for (int round = 0; round < kRounds; ++round) {
    const std::string where = "round " + std::to_string(round);
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
    auto reserved = planner.ReserveRound(Rank(0), demands);
    ASSERT_TRUE(reserved) << where << ": the decodes alone: " << reserved.error().ToString();
    for (auto& r : running) {
      if (!r->prefilling()) continue;
      const std::uint32_t rows = std::min(kChunk, r->prompt - r->tokens);
      demands.push_back(demand(*r, rows));
      if (planner.ReserveRound(Rank(0), demands)) {
        r->rows = rows;
      } else {
        demands.pop_back();
        ++n.waits;
      }
    }
    // Allocate and write the round's tokens.
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
      if (HasFatalFailure()) return;
      batch_request.push_back(r->id);
      for (std::uint32_t q = from; q < r->tokens; ++q) {
        row_request.push_back(r->id);
        row_position.push_back(q);
        row_owner.push_back(r.get());
      }
    }
    const std::uint32_t rows = static_cast<std::uint32_t>(row_request.size());
    ASSERT_GT(rows, 0u) << where;
    // Decodes only: the MTP shape [batch][2][top_k]; with a prefill chunk, flat token rows.
    const StepShape shape = flat ? StepShape{rows, 1, kTopK} : StepShape{rows / kQLen, kQLen, kTopK};
    const std::span<const RequestId> requests =
        flat ? std::span<const RequestId>(row_request) : std::span<const RequestId>(batch_request);
    flat ? ++n.shapes_flat : ++n.shapes_q2;
    // Each group's indexer: the top-k of the C4 entries its row may see (causal: completed
    // by a token at or before the row's position), one selection for the group's layers.
    for (std::uint32_t g = 0; g < config.num_groups; ++g) {
      sel[g].assign(std::size_t{rows} * kTopK, -1);
      idx[g].assign(sel[g].size(), -2);
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
      auto plan = planner.Plan(Rank(0), GroupId(g), shape, requests, sel[g], idx[g], desc);
      ASSERT_TRUE(plan) << where << " group " << g << ": " << plan.error().ToString();
      auto st = std::span(status).first(plan->num_descriptors);
      planner.ExecuteOnEngineMemory(std::span(desc).first(plan->num_descriptors), st);
      ASSERT_TRUE(std::all_of(st.begin(), st.end(), [](std::uint8_t s) { return s == 0; })) << where;
      auto done = planner.Complete(plan->fence, st);
      ASSERT_TRUE(done && done->failed == 0) << where;
      // The device step on the twin: the same decisions, its descriptors on the twin's memory.
      DeviceStep& step = *steps[g];
      ASSERT_TRUE(step.Reload(twin, nullptr)) << where;
      testing::DeviceIo io;
      io.Fill({.batch = shape.batch, .q_len = shape.q_len, .top_k = kTopK, .sel_stride = kTopK, .idx_stride = kTopK},
              sel[g], flat ? row_request : batch_request, step.max_descriptors());
      ASSERT_TRUE(step.Plan(io.arrays, nullptr)) << where;
      ASSERT_EQ(io.record.error, 0u) << where << " group " << g;
      ASSERT_EQ(io.record.num_descriptors, plan->num_descriptors) << where << " group " << g;
      ASSERT_EQ(io.record.hits, plan->stats.hits) << where;
      ASSERT_EQ(io.record.misses, plan->stats.misses) << where;
      for (std::uint32_t i = 0; i < plan->num_descriptors; ++i) {
        ASSERT_EQ(std::memcmp(&io.descriptors[i], &desc[i], sizeof(CopyDescriptor)), 0) << where << " descriptor " << i;
      }
      ASSERT_EQ(io.indices, idx[g]) << where << " group " << g;
      testing::RunOnEngineMemory(std::span(io.descriptors).first(io.record.num_descriptors), twin_mem);
      std::vector<std::uint8_t> twin_status(step.max_descriptors(), 0);
      const Status completed = step.Complete(twin_status.data(), nullptr);
      ASSERT_TRUE(completed) << where << ": " << completed.error().ToString();
      ASSERT_TRUE(step.StoreInto(twin, nullptr)) << where;
      n.hits += plan->stats.hits;
      n.misses += plan->stats.misses;
      n.evictions += plan->stats.evictions;
    }
    // Attention: every row it reads, from the cache, against the dense model.
    for (std::uint32_t i = 0; i < rows; ++i) {
      const Running& r = *row_owner[i];
      const std::uint32_t q = row_position[i];
      const std::string at = where + " request " + std::to_string(r.id.value()) + " position " + std::to_string(q);
      const KindPages wp = *space.KindPagesOf(r.id, kWindowKind), cp = *space.KindPagesOf(r.id, kC128);
      const std::uint32_t first = wp.tokens - wp.entries;
      for (std::uint32_t p = q + 1 > kWindow ? q + 1 - kWindow : 0; p <= q; ++p) {
        ASSERT_GE(p, first) << at << ": the row's window left the ring at " << p;
        const PageRow pr = RingRow(wp, p);
        for (std::uint32_t l = 0; l < kLayers; ++l) {
          ASSERT_EQ(std::memcmp(window_mem.Row(pr.block, l, pr.offset), r.window.Row(l, p), kRow), 0)
              << at << ": window row of position " << p << " layer " << l;
          ++n.window_rows;
        }
      }
      for (std::uint32_t g = 0; g < config.num_groups; ++g) {
        for (std::uint32_t s = 0; s < kTopK; ++s) {
          const std::size_t k = std::size_t{i} * kTopK + s;
          if (chosen[g][k] == kNoEntry) {
            ASSERT_EQ(idx[g][k], -1) << at;
            continue;
          }
          ASSERT_GE(idx[g][k], 0) << at;
          ASSERT_LT(static_cast<std::uint32_t>(idx[g][k]), kDeviceC4) << at;
          for (std::uint32_t j = 0; j < kGroupLayers[g]; ++j) {
            const std::byte* want = r.c4.Row(kGroupFirst[g] + j, chosen[g][k]);
            ASSERT_EQ(std::memcmp(twin_mem[0][g].Row(static_cast<std::uint32_t>(idx[g][k]), j), want, kRow), 0)
                << at << ": the twin's C4 entry " << chosen[g][k] << " group " << g;
            ASSERT_EQ(std::memcmp(c4_mem[0][g].Row(static_cast<std::uint32_t>(idx[g][k]), j), want, kRow), 0)
                << at << ": C4 entry " << chosen[g][k] << " group " << g << " layer " << kCsaLayers[kGroupFirst[g] + j]
                << " at slot " << idx[g][k];
            ++n.c4_rows;
          }
        }
      }
      for (std::uint32_t e = 0; e < (q + 1) / 128; ++e) {
        const PageRow pr = EntryRow(cp, e);
        for (std::uint32_t h = 0; h < kHcaLayers.size(); ++h) {
          ASSERT_EQ(std::memcmp(c128_mem.Row(pr.block, h, pr.offset), r.c128.Row(h, e), kRow), 0)
              << at << ": C128 entry " << e << " layer " << kHcaLayers[h];
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
      ASSERT_TRUE(space.Truncate(r->id, keep) && twin.Truncate(r->id, keep)) << where;
      r->tokens = keep;
      r->window.Truncate(keep);
      r->c4.Truncate(keep / 4);
      r->c128.Truncate(keep / 128);
      ++n.rollbacks;
    }
    for (auto& r : running) {
      check_counts(*r);
      if (HasFatalFailure()) return;
    }
    // Requests that reached their length finish; new ones arrive.
    for (std::size_t b = 0; b < running.size();) {
      if (running[b]->tokens < running[b]->target) {
        ++b;
        continue;
      }
      ASSERT_TRUE(space.Free(running[b]->id) && twin.Free(running[b]->id));
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(b));
      ++n.finished;
    }
    while (running.size() < kBatch) arrive();
    space.AdvanceRound();
    twin.AdvanceRound();
    ASSERT_EQ(twin.DebugDigest(), space.DebugDigest()) << where;
    ++n.rounds;
    const Status inv = space.CheckInvariants();
    ASSERT_TRUE(inv) << where << ": " << inv.error().ToString();
  }
  std::printf("V4 engine loop: %llu rounds (%llu at q_len 2, %llu flat), %llu prefill chunks (%llu waited), %llu "
              "decodes, %llu drafts rejected (%llu C4 entries rolled back), %llu requests finished\n"
              "step: %llu hits, %llu misses, %llu evictions; rows equal to the dense model: window %llu, C4 %llu, "
              "C128 %llu\n",
              (unsigned long long)n.rounds, (unsigned long long)n.shapes_q2, (unsigned long long)n.shapes_flat,
              (unsigned long long)n.prefill_chunks, (unsigned long long)n.waits, (unsigned long long)n.decodes,
              (unsigned long long)n.rollbacks, (unsigned long long)n.c4_rolled_back, (unsigned long long)n.finished,
              (unsigned long long)n.hits, (unsigned long long)n.misses, (unsigned long long)n.evictions,
              (unsigned long long)n.window_rows, (unsigned long long)n.c4_rows,
              (unsigned long long)n.c128_rows);
  // The loop did what it names: entries moved, drafts rolled back, requests came and went,
  // both shapes ran, every kind's rows were read.
  EXPECT_GT(n.misses, 200u);
  EXPECT_GT(n.evictions, 100u);
  EXPECT_GT(n.rollbacks, 50u);
  EXPECT_GT(n.c4_rolled_back, 5u);
  EXPECT_GE(n.finished, kBatch);
  EXPECT_GT(n.shapes_q2, 0u);
  EXPECT_GT(n.shapes_flat, 0u);
  EXPECT_GT(n.c4_rows, 1000u);
  EXPECT_GT(n.c128_rows, 100u);
  EXPECT_GT(n.window_rows, 1000u);
}

}  // namespace
}  // namespace ula

// Shared prefixes in the serving comparison (src/serving/shared_admission.h):
// the lengths-only stream is GenerateSharedWorkload's; the shared ledger charges a prefix
// once per holder (TP baselines: a copy per GPU; UlaCache TP: a 1/P stripe), evicts idle
// prefixes LRU for room (the next sharer recomputes); the end-to-end comparison counts the
// prefill it skips exactly; a workload without sharing keeps the default path.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "config/model_config.h"
#include "serving/serving_systems.h"
#include "serving/shared_admission.h"
#include "serving/serving_sim.h"
#include "workload/shared_workload.h"

namespace ula {
namespace {

using serving_internal::MaxAdmittedShared;
using serving_internal::SharedItem;
using serving_internal::SharedLedger;
using serving_internal::SharedStream;

// The test configs (tests/serving/configs), found beside the clone's configs/ at run time.
const std::filesystem::path kTestConfigs = DefaultConfigDir().parent_path() / "tests" / "serving" / "configs";
const std::filesystem::path kRepoConfigs = kTestConfigs.parent_path().parent_path().parent_path() / "configs";

TEST(SharedStream, LengthsAreTheGeneratorsForEveryKind) {
  for (const auto& [dir, name] : {std::pair{kTestConfigs, "tiny_shared_docs"}, std::pair{kTestConfigs, "tiny_sessions"},
                                  std::pair{kRepoConfigs, "lexsum_summaries"}, std::pair{kRepoConfigs, "shared_system_prompt"},
                                  std::pair{kRepoConfigs, "multi_turn_sessions"}}) {
    SCOPED_TRACE(name);
    auto wl = LoadSharedWorkloadConfigByName(name, dir);
    ASSERT_TRUE(wl) << wl.error().ToString();
    auto reqs = GenerateSharedWorkload(*wl);
    ASSERT_TRUE(reqs);
    const std::vector<SharedItem> items = serving_internal::SharedLengths(*wl);
    ASSERT_EQ(items.size(), reqs->size());
    for (std::size_t i = 0; i < items.size(); ++i) {
      const SharedRequest& r = (*reqs)[i];
      ASSERT_EQ(items[i].id, r.id.value());
      ASSERT_EQ(items[i].group, r.group) << i;
      ASSERT_EQ(items[i].input, r.tokens.size()) << i;
      ASSERT_EQ(items[i].output, r.output_tokens) << i;
      ASSERT_EQ(items[i].shared, r.shared_tokens) << i;
    }
  }
}

// P = 4 GPUs, 1 B per token of KV, no index keys, device 2000 B per GPU, no host. One
// document of 1000 tokens asked k times with 100 own tokens each (outputs 0).
PlacementRules Tiny(SystemKind s, ParallelMode mode) {
  PlacementRules r;
  r.system = s;
  r.mode = mode;
  r.num_ranks = 4;
  r.device_bytes_per_rank = 2000;
  r.host_bytes_per_rank = 0;
  r.kv_bytes_per_token = 1;
  r.index_bytes_per_token = 0;
  r.working_set_entries = 4;
  r.hisparse_buffer_entries = 1;
  r.tp_buffer_entries = s == SystemKind::kUlaCache ? 1 : 0;
  return r;
}

// shares = false: the same lengths with nothing shared.
SharedStream OneDocument(std::uint32_t k, bool shares = true) {
  const std::uint32_t prefix = shares ? 1000 : 0;
  SharedStream s;
  for (std::uint32_t i = 0; i < k; ++i) {
    SharedItem it;
    it.id = i;
    it.turn = i;
    it.input = 1100;
    it.prefix = prefix;
    it.shared = i == 0 ? 0 : prefix;
    s.items.push_back(it);
    s.arrivals.push_back(i);
  }
  return s;
}

TEST(SharedLedger, APrefixIsChargedOncePerHolderCopiesPerGpuForTheBaselinesAStripeForUlaCacheTp) {
  const SharedStream doc = OneDocument(200);
  auto admitted = [&](SystemKind s, ParallelMode m, const SharedStream& st) {
    auto lim = MaxAdmittedShared(Tiny(s, m), st);
    EXPECT_TRUE(lim) << lim.error().ToString();
    return lim ? lim->admitted : 0u;
  };
  // all_gpu TP: every GPU holds the document (1000) once, then 100 per request:
  // 1 + floor((2000 - 1100) / 100) = 10. Without sharing 1100 each: 1.
  EXPECT_EQ(admitted(SystemKind::kAllGpu, ParallelMode::kTp, doc), 10u);
  EXPECT_EQ(admitted(SystemKind::kAllGpu, ParallelMode::kTp, OneDocument(200, false)), 1u);
  // UlaCache TP: the document striped once over the node, ceil(1000/4) = 250 per GPU; own
  // ceil(100/4) = 25 and the local buffer 1 per request (the working set moves 1 of the
  // request's bytes to device, no more): first 276, then 26: 1 + floor((2000 - 276) / 26) = 67.
  EXPECT_EQ(admitted(SystemKind::kUlaCache, ParallelMode::kTp, doc), 67u);
  // Without sharing every request pays 250 + 25 + 1 = 276: 7.
  EXPECT_EQ(admitted(SystemKind::kUlaCache, ParallelMode::kTp, OneDocument(200, false)), 7u);
  // DP all_gpu: the router sends every sharer to the rank that holds the document, which
  // fits 10 of them as one TP GPU did; the 11th waits there (the queue head), though three
  // ranks are empty.
  auto dp = MaxAdmittedShared(Tiny(SystemKind::kAllGpu, ParallelMode::kDp), doc);
  ASSERT_TRUE(dp);
  EXPECT_EQ(dp->admitted, 10u);
  EXPECT_EQ(dp->max_load, 10u);
  // Prefill skipped: the 9 sharers after the first match the 1000-token document.
  EXPECT_EQ(dp->prefill_saved, 9u * 1000u);
  EXPECT_EQ(dp->stored_tokens, 1000u + 10u * 100u);
  EXPECT_EQ(dp->named_tokens, 10u * 1100u);
}

// UlaCache DP must hold each request's working set (W = 500 entries here) on device, but on
// a rank the working sets cannot need more than the entries it stores: sharers overlap.
TEST(SharedLedger, UlaCacheWorkingSetsOnDeviceAreCappedByTheEntriesStored) {
  PlacementRules r = Tiny(SystemKind::kUlaCache, ParallelMode::kDp);
  r.working_set_entries = 500;
  r.host_bytes_per_rank = 100000;
  // Without sharing: 500 on device per request, 4 x 500 = 2000 (the rest on host).
  auto alone = MaxAdmittedShared(r, OneDocument(200, false));
  ASSERT_TRUE(alone);
  EXPECT_EQ(alone->admitted, 4u * 4u);  // 4 per rank, the router spreads them over the 4 ranks
  // Sharing one document on one rank: min(500 n, 1000 + 100 n) <= 2000: n = 10.
  auto shared = MaxAdmittedShared(r, OneDocument(200));
  ASSERT_TRUE(shared);
  EXPECT_EQ(shared->admitted, 10u);
}

TEST(SharedLedger, AnIdlePrefixIsEvictedForRoomAndItsNextSharerRecomputesIt) {
  // all_gpu TP (per GPU: 2000 B): document A (1000) with two sharers, then document B.
  SharedStream s;
  for (std::uint32_t i = 0; i < 4; ++i) {
    SharedItem it;
    it.id = i;
    it.group = i == 2 ? 1 : 0;  // A, A, B, A
    it.input = 1100;
    it.prefix = 1000;
    s.items.push_back(it);
  }
  auto ledger = SharedLedger::Create(Tiny(SystemKind::kAllGpu, ParallelMode::kTp), s.items);
  ASSERT_TRUE(ledger);
  auto a0 = ledger->TryAdmit(s.items[0]);
  ASSERT_TRUE(a0 && a0->admitted);
  EXPECT_EQ(a0->matched, 0u);
  EXPECT_EQ(a0->cached, 1000u);
  auto a1 = ledger->TryAdmit(s.items[1]);
  ASSERT_TRUE(a1 && a1->admitted);
  EXPECT_EQ(a1->matched, 1000u);
  // B does not fit beside A's two requests (1200 + 1100 > 2000) and A is not idle: it waits.
  auto b = ledger->TryAdmit(s.items[2]);
  ASSERT_TRUE(b);
  EXPECT_FALSE(b->admitted);
  EXPECT_TRUE(b->evicted.empty());
  ASSERT_TRUE(ledger->Release(s.items[0]));
  ASSERT_TRUE(ledger->Release(s.items[1]));
  EXPECT_EQ(ledger->stored_tokens(0), 1000u);  // A stays cached, idle
  // Now B fits only once A's idle prefix goes.
  b = ledger->TryAdmit(s.items[2]);
  ASSERT_TRUE(b && b->admitted);
  EXPECT_EQ(b->evicted, std::vector<std::uint32_t>{0});
  EXPECT_EQ(ledger->evictions(), 1u);
  // The next sharer of A finds nothing and computes (and caches) it again.
  ASSERT_TRUE(ledger->Release(s.items[2]));
  auto a3 = ledger->TryAdmit(s.items[3]);
  ASSERT_TRUE(a3 && a3->admitted);
  EXPECT_EQ(a3->matched, 0u);
  EXPECT_EQ(a3->cached, 1000u);
  EXPECT_EQ(a3->evicted, std::vector<std::uint32_t>{1});
}

// The UlaCache adapters adopt a cached prefix: two sharers that select the same prefix
// position read one entry (the planner dedups the shared address), the same own position
// two; an evicted prefix is released once.
TEST(ServingSystemsShared, SharersSelectingOnePrefixPositionReadOneEntry) {
  for (ParallelMode mode : {ParallelMode::kTp, ParallelMode::kDp}) {
    SCOPED_TRACE(std::string(ParallelModeName(mode)));
    serving_internal::SimSystemConfig cfg;
    cfg.rules = Tiny(SystemKind::kUlaCache, mode);
    cfg.rules.num_ranks = mode == ParallelMode::kTp ? 2 : 1;
    cfg.rules.device_bytes_per_rank = cfg.rules.host_bytes_per_rank = 1e30;  // the shared ledger decides
    cfg.group_entry_bytes = 64;
    cfg.device_tokens = 2000;
    cfg.host_tokens = 2000;
    cfg.buffer_tokens = mode == ParallelMode::kTp ? 100 : 0;
    auto sys = serving_internal::MakeSimSystem(cfg);
    ASSERT_TRUE(sys) << sys.error().ToString();
    auto a = (*sys)->AdmitShared(1, 500, 510, /*group=*/0, /*matched=*/0, /*cache=*/400);
    ASSERT_TRUE(a && *a);
    auto b = (*sys)->AdmitShared(2, 500, 510, 0, 400, 0);
    ASSERT_TRUE(b && *b);
    const std::uint64_t ids[] = {1, 2};
    auto distinct = [&](std::uint32_t pos) {
      const std::vector<std::uint32_t> sel[] = {{pos}, {pos}};
      serving_internal::SimCounters c;
      EXPECT_TRUE((*sys)->Step(ids, sel, c));
      return mode == ParallelMode::kTp ? c.batch_distinct : c.distinct;
    };
    EXPECT_EQ(distinct(5), 1);    // in the shared prefix
    EXPECT_EQ(distinct(450), 2);  // each request's own
    // A third sharer longer than the cached prefix is refused (nothing cached that long).
    auto c = (*sys)->AdmitShared(3, 500, 510, 0, 401, 0);
    EXPECT_FALSE(c);
    ASSERT_TRUE((*sys)->FinishShared(1, 0, false));
    ASSERT_TRUE((*sys)->FinishShared(2, 0, false));
    EXPECT_TRUE((*sys)->EvictPrefix(0));
    EXPECT_FALSE((*sys)->EvictPrefix(0));
  }
}

std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ComparisonResult RunScenario(const std::string& json) {
  auto sc = ParseScenarioConfig(json, "tiny_shared.json");
  EXPECT_TRUE(sc) << sc.error().ToString();
  CompareOptions o;
  o.config_dir = kTestConfigs;
  auto r = RunComparison(*sc, o);
  EXPECT_TRUE(r) << r.error().ToString();
  return r ? *r : ComparisonResult{};
}

// Tiny documents with ample memory: every request of the stream is admitted in the
// simulation and nothing is evicted, so TP skips exactly the prefill of every sharer's
// prefix (the sum of the generator's shared_tokens); in DP a sharer routed off its
// document's rank recomputes it: saved + recomputed is that sum.
TEST(ServingShared, PrefillSavedIsExactlyTheSharersPrefixesAndUlaCacheTpAdmitsMore) {
  auto wl = LoadSharedWorkloadConfigByName("tiny_shared_docs", kTestConfigs);
  ASSERT_TRUE(wl);
  auto reqs = GenerateSharedWorkload(*wl);
  ASSERT_TRUE(reqs);
  std::uint64_t shared = 0, inputs = 0;
  for (const SharedRequest& r : *reqs) shared += r.shared_tokens, inputs += r.tokens.size();

  const ComparisonResult r = RunScenario(ReadFile(kTestConfigs / "scenarios" / "tiny_shared.json"));
  ASSERT_EQ(r.configs.size(), 4u);
  for (const ConfigResult& c : r.configs) {
    for (const SystemResult& s : c.systems) {
      SCOPED_TRACE(std::string(SystemName(s.system)) + " " + std::string(ParallelModeName(c.entry.mode)) +
                   (c.entry.mtp ? " mtp" : ""));
      ASSERT_TRUE(s.sharing.on);
      ASSERT_GT(s.admitted, 0u) << s.note;
      ASSERT_FALSE(s.curve.empty()) << s.note;
      EXPECT_EQ(s.sharing.prefill_saved + s.sharing.prefill_computed, inputs);
      EXPECT_EQ(s.sharing.evictions, 0u);
      if (c.entry.mode == ParallelMode::kTp) {
        EXPECT_EQ(s.sharing.prefill_saved, shared);
        EXPECT_EQ(s.sharing.recomputed, 0u);
        // A copy per GPU for all-GPU, SGLang HiSparse and TensorRT-LLM's offload (host history
        // per rank; P = 2); one for the striped systems and vLLM's host pool shared by the TP ranks.
        const bool per_gpu = s.system == SystemKind::kAllGpu || s.system == SystemKind::kHiSparse ||
                             s.system == SystemKind::kTrtllmOffload;
        EXPECT_EQ(s.sharing.copies_per_node, per_gpu ? r.configs.size() / 2 : 1u);
      } else {
        EXPECT_EQ(s.sharing.prefill_saved + s.sharing.recomputed, shared);
      }
    }
  }
  // The tiny GPU fits fewer of these requests than the stream has with a copy per GPU.
  const SystemResult* all = r.configs[0].Find(SystemKind::kAllGpu);
  const SystemResult* ula = r.configs[0].Find(SystemKind::kUlaCache);
  ASSERT_TRUE(all && ula);
  EXPECT_GE(ula->admitted, all->admitted);
}

TEST(ServingShared, MultiTurnSessionsReuseTheirFinishedTurns) {
  nlohmann::json j = nlohmann::json::parse(ReadFile(kTestConfigs / "scenarios" / "tiny_shared.json"));
  j["workload"] = "tiny_sessions";
  j["sampling"]["max_requests"] = 4;  // sessions
  const ComparisonResult r = RunScenario(j.dump());
  ASSERT_EQ(r.configs.size(), 4u);
  for (const ConfigResult& c : r.configs) {
    for (const SystemResult& s : c.systems) {
      SCOPED_TRACE(std::string(SystemName(s.system)) + " " + std::string(ParallelModeName(c.entry.mode)));
      ASSERT_FALSE(s.curve.empty()) << s.note;
      // Entry turns match their previous turn (cached before the window), the turns after
      // them the finished turn: only the new user tokens are prefilled.
      EXPECT_GT(s.sharing.prefill_saved_at_limit, 0u);
      EXPECT_GT(s.sharing.prefill_saved, s.sharing.prefill_saved_at_limit);
      EXPECT_GT(s.sharing.prefill_saved, 3 * s.sharing.prefill_computed);
    }
  }
}

TEST(ServingShared, AWorkloadWithoutSharingKeepsTheDefaultPath) {
  const ComparisonResult r = RunScenario(ReadFile(kTestConfigs / "scenarios" / "tiny.json"));
  ASSERT_EQ(r.configs.size(), 4u);
  for (const ConfigResult& c : r.configs) {
    for (const SystemResult& s : c.systems) EXPECT_FALSE(s.sharing.on);
  }
  // With no prefix, the shared ledger charges DemandOf itself: in TP the same limit as MaxAdmitted.
  for (SystemKind k : {SystemKind::kAllGpu, SystemKind::kHiSparse, SystemKind::kUlaCache}) {
    PlacementRules rules = Tiny(k, ParallelMode::kTp);
    rules.host_bytes_per_rank = 5000;  // hisparse keeps the histories on host
    const SharedStream st = OneDocument(50, false);
    std::vector<std::uint32_t> finals(50, 1100);
    auto lim = MaxAdmittedShared(rules, st);
    ASSERT_TRUE(lim);
    EXPECT_EQ(lim->admitted, MaxAdmitted(rules, finals)) << SystemName(k);
  }
}

}  // namespace
}  // namespace ula

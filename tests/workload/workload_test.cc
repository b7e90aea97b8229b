// Workload generator determinism, selection-model statistics, and trace files that replay
// byte for byte and refuse truncated or corrupt input.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "workload/calibration.h"
#include "config/model_config.h"
#include "workload/selection_fit.h"
#include "workload/selection_model.h"
#include "workload/trace_file.h"
#include "workload/workload.h"
#include "test_seed.h"

namespace ula {
namespace {

// ULA_TEST_SEED replaces it (tests/test_seed.h); printed when the test program starts.
const std::uint64_t kSeed = ::ula::testing::TestSeed(4242);

WorkloadConfig Summarization() {
  auto w = LoadWorkloadConfigByName("long_doc_summarization", DefaultConfigDir());
  EXPECT_TRUE(w) << (w ? "" : w.error().ToString());
  return w ? *w : WorkloadConfig{};
}

TEST(Workload, SameSeedSameRequestsDifferentSeedDifferent) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  WorkloadConfig cfg = Summarization();
  cfg.seed = kSeed;
  auto a = GenerateWorkload(cfg);
  auto b = GenerateWorkload(cfg);
  ASSERT_TRUE(a && b);
  ASSERT_EQ(a->size(), cfg.num_requests);
  bool same = true;
  for (std::size_t i = 0; i < a->size(); ++i) {
    const RequestSpec &x = (*a)[i], &y = (*b)[i];
    same &= x.id == y.id && x.input_tokens == y.input_tokens && x.output_tokens == y.output_tokens &&
            x.arrival_s == y.arrival_s;
    EXPECT_EQ(x.id, RequestId(i));
    EXPECT_GE(x.input_tokens, 65536u);
    EXPECT_LE(x.input_tokens, 131072u);
    EXPECT_GE(x.output_tokens, cfg.min_output_tokens);
    EXPECT_LE(x.output_tokens, cfg.max_output_tokens);
    if (i > 0) {
      EXPECT_GE(x.arrival_s, (*a)[i - 1].arrival_s);
    }
  }
  EXPECT_TRUE(same);
  EXPECT_EQ((*a)[0].arrival_s, 0.0);
  cfg.seed = kSeed + 1;
  auto c = GenerateWorkload(cfg);
  ASSERT_TRUE(c);
  int differ = 0;
  for (std::size_t i = 0; i < a->size(); ++i) differ += (*a)[i].input_tokens != (*c)[i].input_tokens;
  EXPECT_GT(differ, 0);
}

TEST(Workload, RejectsBadFields) {
  WorkloadConfig cfg = Summarization();
  cfg.max_input_tokens = cfg.min_input_tokens - 1;
  auto r = GenerateWorkload(cfg);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("max_input_tokens"), std::string::npos);
  EXPECT_FALSE(ParseWorkloadConfig("{\"name\": \"x\"}", "w"));
}

SelectionModelParams Params(double keep) {
  SelectionModelParams p;
  p.top_k = 64;
  p.sink_tokens = 4;
  p.recent_tokens = 8;
  p.keep_mean = keep;
  p.keep_stddev = 0;
  p.draft_keep = 0.5;
  p.seed = kSeed;
  return p;
}

TEST(SelectionModel, SelectionsAreDistinctInRangeWithSinksAndNewest) {
  auto model = SelectionModel::Create(Params(0.8));
  ASSERT_TRUE(model);
  std::vector<std::vector<std::uint32_t>> out;
  for (std::uint32_t n = 2000; n < 2050; ++n) {
    ASSERT_TRUE(model->Step(7, n, 3, out));
    ASSERT_EQ(out.size(), 3u);
    for (const auto& sel : out) {
      ASSERT_EQ(sel.size(), 64u);
      std::set<std::uint32_t> s(sel.begin(), sel.end());
      EXPECT_EQ(s.size(), sel.size());
      EXPECT_LT(*s.rbegin(), n);
      for (std::uint32_t p = 0; p < 4; ++p) EXPECT_TRUE(s.contains(p));
      for (std::uint32_t r = 1; r <= 8; ++r) EXPECT_TRUE(s.contains(n - r));
    }
  }
  // A short history: everything is selected.
  ASSERT_TRUE(model->Step(8, 10, 1, out));
  EXPECT_EQ(out[0].size(), 10u);
  EXPECT_FALSE(model->Step(9, 0, 1, out));
  EXPECT_FALSE(model->Step(9, 10, 0, out));
}

TEST(SelectionModel, OverlapFollowsKeepAndIsSweepable) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  DecodeSimConfig schedule;
  schedule.num_requests = 4;
  schedule.prompt_tokens = 4096;
  schedule.decode_steps = 60;
  schedule.draft_tokens = 2;
  double last = -1;
  for (double keep : {0.0, 0.25, 0.5, 0.75, 1.0}) {
    auto run = RunSelectionModel(Params(keep), schedule, false);
    ASSERT_TRUE(run);
    // Sinks (4) and the 7 newest positions that stay newest carry over; `keep` of the
    // remaining 53 previous selections is kept; fresh draws avoid the previous step.
    const double expected = (4 + 7 + keep * 53) / 64.0;
    EXPECT_NEAR(run->overlap.mean, expected, 0.02) << "keep " << keep;
    EXPECT_GT(run->overlap.mean, last);
    last = run->overlap.mean;
  }
  // Fitting to a target overlap hits it.
  for (double target : {0.4, 0.7, 0.95}) {
    auto p = FitKeepForOverlap(Params(0), schedule, target);
    ASSERT_TRUE(p);
    auto run = RunSelectionModel(*p, schedule, false);
    ASSERT_TRUE(run);
    EXPECT_NEAR(run->overlap.mean, target, 0.01);
  }
}

// The selection model's schedule of the reuse tests: 2 requests x 4096 tokens, 80 steps,
// no drafts.
DecodeSimConfig ModelSchedule() {
  DecodeSimConfig schedule;
  schedule.num_requests = 2;
  schedule.prompt_tokens = 4096;
  schedule.decode_steps = 80;
  schedule.draft_tokens = 0;
  return schedule;
}

// The real indexer's schedule of the calibration tests: 2 requests x 2048 tokens, 2 drafts,
// slowly drifting queries and 4 sinks (no heavy hitters).
DecodeSimConfig IndexerSchedule(std::uint32_t steps) {
  DecodeSimConfig schedule;
  schedule.seed = kSeed;
  schedule.num_requests = 2;
  schedule.prompt_tokens = 2048;
  schedule.decode_steps = steps;
  schedule.draft_tokens = 2;
  schedule.query_keep = 1.0;
  schedule.query_noise = 0.25;
  schedule.query_newest = 0.15;
  schedule.sink_tokens = 4;
  schedule.sink_boost = 3.0;
  schedule.sink_align = 1.0;
  return schedule;
}

// Fresh draws follow the persistent weights: over many steps the positions of the largest
// weights are drawn far more often than uniform draws would; with heavy_skew 0 they are not.
TEST(SelectionModel, HeavySkewMakesAFewPositionsReturnAgainAndAgain) {
  const DecodeSimConfig schedule = ModelSchedule();
  SelectionModelParams p = Params(0.5);
  auto uniform = RunSelectionModel(p, schedule, false);
  p.heavy_skew = 1.5;
  auto heavy = RunSelectionModel(p, schedule, false);
  ASSERT_TRUE(uniform && heavy);
  // Same overlap (keep is unchanged)...
  EXPECT_NEAR(heavy->overlap.mean, uniform->overlap.mean, 0.03);
  // ...but dropped positions come back: more reuses, shorter gaps, more persistent entries.
  EXPECT_GT(heavy->reuse.reuses, uniform->reuse.reuses + uniform->reuse.reuses / 8);
  EXPECT_LT(heavy->reuse.mean_gap, 0.75 * uniform->reuse.mean_gap);
  EXPECT_GT(heavy->reuse.persistent_share, uniform->reuse.persistent_share + 0.05);
}

// Returns draw from query 0's drops of the last return_window steps: gaps of at most the
// window become the common case.
TEST(SelectionModel, ReturnsBringBackRecentlyDroppedPositions) {
  const DecodeSimConfig schedule = ModelSchedule();
  SelectionModelParams p = Params(0.5);
  p.return_window = 4;
  auto none = RunSelectionModel(p, schedule, false);
  p.return_fraction = 0.8;
  auto back = RunSelectionModel(p, schedule, false);
  ASSERT_TRUE(none && back);
  auto short_share = [](const ReuseStats& s) {  // reuses at distance 2..4 (window 4 + 1 step)
    return static_cast<double>(s.histogram[1] + s.histogram[2]) / static_cast<double>(s.reuses);
  };
  EXPECT_GT(short_share(back->reuse), 3 * short_share(none->reuse));
  EXPECT_LT(back->reuse.p99, none->reuse.p99);
  // Bad values are refused.
  p.return_window = 0;
  EXPECT_FALSE(SelectionModel::Create(p));
  p.return_window = 4;
  p.heavy_skew = 4.5;
  EXPECT_FALSE(SelectionModel::Create(p));
}

// drafts form a chain. Draft j keeps draft_keep of draft j-1's selection
// (beyond sinks and recent tokens), so draft 2 overlaps draft 1 by about draft_keep and query 0
// by about draft_keep^2; unchained, both drafts would overlap query 0 alike.
TEST(SelectionModel, DraftsAreChained) {
  DecodeSimConfig schedule = ModelSchedule();
  schedule.draft_tokens = 2;
  SelectionModelParams p = Params(0.8);  // 4 sinks + 8 recent of 64; draft_keep 0.5
  auto model = SelectionModel::Create(p);
  ASSERT_TRUE(model);
  std::vector<std::vector<std::uint32_t>> out;
  double d1_q0 = 0, d2_q0 = 0, d2_d1 = 0;
  constexpr int kSteps = 200;
  for (int step = 0; step < kSteps; ++step) {
    const std::uint32_t n = 4096 + static_cast<std::uint32_t>(step);
    ASSERT_TRUE(model->Step(3, n, 3, out));
    d1_q0 += SelectionOverlap(out[0], out[1], n) / kSteps;
    d2_q0 += SelectionOverlap(out[0], out[2], n) / kSteps;
    d2_d1 += SelectionOverlap(out[1], out[2], n) / kSteps;
  }
  const double fixed = 12.0 / 64, rest = 52.0 / 64;
  EXPECT_NEAR(d1_q0, fixed + 0.5 * rest, 0.02);
  EXPECT_NEAR(d2_d1, fixed + 0.5 * rest, 0.02);
  EXPECT_NEAR(d2_q0, fixed + 0.25 * rest, 0.02);
  // The calibration statistic of the chain is the same measure.
  auto run = RunSelectionModel(p, schedule, false);
  ASSERT_TRUE(run);
  EXPECT_NEAR(run->draft_chain_overlap.mean, fixed + 0.5 * rest, 0.02);
  EXPECT_NEAR(run->draft_overlap.mean, fixed + 0.375 * rest, 0.02);  // mean of drafts 1 and 2 vs query 0
}

TEST(SelectionModel, StreamsAreIndependentOfInterleaving) {
  auto a = SelectionModel::Create(Params(0.7));
  auto b = SelectionModel::Create(Params(0.7));
  ASSERT_TRUE(a && b);
  std::vector<std::vector<std::uint32_t>> x, y, z;
  for (std::uint32_t n = 500; n < 520; ++n) {
    ASSERT_TRUE(a->Step(1, n, 2, x));
    ASSERT_TRUE(b->Step(2, n, 2, z));  // another stream in between
    ASSERT_TRUE(b->Step(1, n, 2, y));
    EXPECT_EQ(x, y);
  }
}

TEST(SelectionModel, CalibrationMatchesTheRealIndexerOverlap) {
  const DecodeSimConfig schedule = IndexerSchedule(40);
  auto cal = CalibrateSelectionModel({4, 16, 64}, schedule);
  ASSERT_TRUE(cal) << cal.error().ToString();
  EXPECT_GT(cal->real.overlap.mean, 0.3);
  std::printf("in sample: overlap real %.4f synthetic %.4f\n", cal->real.overlap.mean, cal->synthetic.overlap.mean);
  // In-sample: keep_mean is fitted before the reuse fit, which moves the overlap a little
  // (calibration.cc); 0.02 covers it.
  EXPECT_NEAR(cal->synthetic.overlap.mean, cal->real.overlap.mean, 0.02);
  // draft_keep is fitted to the chain (draft vs previous draft); the overlap with query 0
  // and the union of the step's queries follow from the chain, not from a fit.
  EXPECT_NEAR(cal->synthetic.draft_chain_overlap.mean, cal->real.draft_chain_overlap.mean, 0.01);
  EXPECT_NEAR(cal->synthetic.draft_overlap.mean, cal->real.draft_overlap.mean, 0.02);
  EXPECT_NEAR(cal->synthetic.union_per_top_k, cal->real.union_per_top_k, 0.03);
  EXPECT_EQ(cal->fitted.sink_tokens, 4u);  // the boosted keys are found as sinks
  EXPECT_EQ(cal->real.trace.steps.size(), 40u);
  // The overlaps above are the fit's own targets (bisection makes them agree in-sample,
  // within 0.01). Held out: the fitted model against the real indexer on another draw of the
  // same process (other seed and twice the requests: other keys, queries and context
  // lengths), which no fit has seen; the model must reproduce it within 5 % of the overlap
  // (the in-sample fit's 0.01 plus the spread between two draws of 2 requests, 0.02-0.03).
  DecodeSimConfig held_out = schedule;
  held_out.seed = kSeed + 1;
  held_out.num_requests = 4;
  auto real = RunRealIndexer({4, 16, 64}, held_out, false);
  auto synthetic = RunSelectionModel(cal->fitted, held_out, false);
  ASSERT_TRUE(real && synthetic);
  std::printf("held out: overlap real %.3f synthetic %.3f, draft overlap %.3f / %.3f, union %.3f / %.3f\n",
              real->overlap.mean, synthetic->overlap.mean, real->draft_overlap.mean, synthetic->draft_overlap.mean,
              real->union_per_top_k, synthetic->union_per_top_k);
  EXPECT_NEAR(synthetic->overlap.mean, real->overlap.mean, 0.05 * real->overlap.mean);
  EXPECT_NEAR(synthetic->draft_overlap.mean, real->draft_overlap.mean, 0.05 * real->draft_overlap.mean);
  EXPECT_NEAR(synthetic->union_per_top_k, real->union_per_top_k, 0.05 * real->union_per_top_k);
}

// With heavy hitters in the real indexer, the fitted model's reuse distances match the
// indexer's: mean gap and persistent share within 10 %; p99 within 10 % or two steps (this
// schedule is small: its p99 rests on a few dozen reuses; `ula bench trace` checks the
// full calibration schedule, docs/WORKLOADS.md).
TEST(SelectionModel, CalibrationMatchesTheRealIndexerReuseDistances) {
  DecodeSimConfig schedule = IndexerSchedule(64);
  schedule.heavy_alpha = 1.5;
  schedule.heavy_boost = 0.02;
  schedule.heavy_align = 1.0;
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  auto cal = CalibrateSelectionModel({4, 16, 64}, schedule);
  ASSERT_TRUE(cal) << cal.error().ToString();
  const ReuseStats &r = cal->real.reuse, &s = cal->synthetic.reuse;
  ASSERT_GT(r.reuses, 1000u);
  EXPECT_NEAR(s.mean_gap, r.mean_gap, 0.1 * r.mean_gap);
  EXPECT_NEAR(s.persistent_share, r.persistent_share, 0.1 * r.persistent_share);
  EXPECT_NEAR(s.p99, r.p99, std::max(2.0, 0.1 * r.p99));
  EXPECT_NEAR(cal->synthetic.overlap.mean, cal->real.overlap.mean, 0.01);
}

// configs/selection/<name>.json: the one fitted parameter set (selection_fit.h).
TEST(SelectionFit, ConfigLoadsAndRoundTrips) {
  auto fit = LoadSelectionFitByName("indexer_fit", DefaultConfigDir());
  ASSERT_TRUE(fit) << fit.error().ToString();
  EXPECT_NE(fit->source.find("ula bench trace"), std::string::npos) << "the source names the command that fitted it";
  auto back = ParseSelectionFit(SelectionFitJson(*fit), "round trip");
  ASSERT_TRUE(back) << back.error().ToString();
  EXPECT_EQ(back->name, fit->name);
  EXPECT_EQ(back->source, fit->source);
  const SelectionModelParams &a = fit->params, &b = back->params;
  EXPECT_EQ(std::tie(a.top_k, a.sink_tokens, a.recent_tokens, a.return_window, a.seed),
            std::tie(b.top_k, b.sink_tokens, b.recent_tokens, b.return_window, b.seed));
  EXPECT_EQ(std::tie(a.keep_mean, a.keep_stddev, a.draft_keep, a.heavy_skew, a.return_fraction),
            std::tie(b.keep_mean, b.keep_stddev, b.draft_keep, b.heavy_skew, b.return_fraction));
}

TEST(SelectionFit, BadFilesAreRefusedWithTheFieldNamed) {
  auto fit = LoadSelectionFitByName("indexer_fit", DefaultConfigDir());
  ASSERT_TRUE(fit);
  const nlohmann::json good = nlohmann::json::parse(SelectionFitJson(*fit));
  auto error_with = [&](const std::string& field, const nlohmann::json& value) {
    nlohmann::json j = good;
    if (value.is_null()) {
      j.erase(field);
    } else {
      j[field] = value;
    }
    auto r = ParseSelectionFit(j.dump(), "bad.json");
    return r ? std::string("accepted") : r.error().message();
  };
  EXPECT_NE(error_with("keep_mean", 1.5).find("keep_mean"), std::string::npos);
  EXPECT_NE(error_with("draft_keep", nullptr).find("draft_keep"), std::string::npos);
  EXPECT_NE(error_with("return_window", 0).find("return_window"), std::string::npos);
  EXPECT_NE(error_with("heavy_skew", "high").find("heavy_skew"), std::string::npos);
  EXPECT_NE(error_with("recent_tokens", 1u << 19).find("recent_tokens"), std::string::npos);  // sinks + recent > top_k
  EXPECT_NE(error_with("bogus", 1).find("bogus"), std::string::npos);
  EXPECT_NE(error_with("source", nullptr).find("source"), std::string::npos);
  EXPECT_EQ(error_with("keep_mean", 0.5), "accepted");
  EXPECT_FALSE(LoadSelectionFitByName("no_such_fit", DefaultConfigDir()));
}

Trace SmallTrace() {
  Trace t;
  t.kind = TraceValueKind::kPosition;
  t.num_groups = 2;
  t.queries_per_step = 3;
  t.steps.resize(3);
  std::uint32_t v = 1;
  for (std::size_t s = 0; s < 3; ++s) {
    for (std::uint64_t r = 0; r < 2; ++r) {
      for (std::uint32_t q = 0; q < 3; ++q) {
        TraceRecord rec{r * 1000 + 5, static_cast<std::uint32_t>(s % 2), q, 5000, {}};
        for (int i = 0; i < 20; ++i) rec.values.push_back((v = v * 2654435761u % 4999));
        t.steps[s].records.push_back(rec);
      }
    }
  }
  return t;
}

TEST(TraceFile, WriteReadWriteIsByteIdentical) {
  const Trace t = SmallTrace();
  const auto path = std::filesystem::temp_directory_path() / ("ula_trace_test_" + std::to_string(::getpid()));
  ASSERT_TRUE(WriteTraceFile(path, t));
  auto back = ReadTraceFile(path);
  ASSERT_TRUE(back) << back.error().ToString();
  EXPECT_EQ(*back, t);
  auto a = EncodeTrace(t);
  auto b = EncodeTrace(*back);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(std::filesystem::file_size(path), a->size());
  std::filesystem::remove(path);
}

TEST(TraceFile, RealAndSyntheticTracesReplayByteForByte) {
  DecodeSimConfig schedule;
  schedule.num_requests = 2;
  schedule.prompt_tokens = 1024;
  schedule.decode_steps = 8;
  schedule.draft_tokens = 2;
  schedule.query_keep = 1.0;
  schedule.query_noise = 0.3;
  auto real = RunRealIndexer({4, 16, 32}, schedule);
  auto syn = RunSelectionModel(Params(0.8), schedule);
  ASSERT_TRUE(real && syn);
  for (const Trace* t : {&real->trace, &syn->trace}) {
    auto a = EncodeTrace(*t);
    ASSERT_TRUE(a);
    auto back = DecodeTrace(*a);
    ASSERT_TRUE(back);
    EXPECT_EQ(*back, *t);
    EXPECT_EQ(*EncodeTrace(*back), *a);
  }
}

TEST(TraceFile, TruncatedOrCorruptInputIsAnError) {
  auto bytes = EncodeTrace(SmallTrace());
  ASSERT_TRUE(bytes);
  for (std::size_t len = 0; len < bytes->size(); ++len) {
    auto r = DecodeTrace(std::span<const std::byte>(*bytes).first(len));
    EXPECT_FALSE(r) << "truncated to " << len;
  }
  for (std::size_t i = 0; i < bytes->size(); ++i) {  // every single-byte corruption
    auto copy = *bytes;
    copy[i] ^= std::byte{0x5a};
    EXPECT_FALSE(DecodeTrace(copy)) << "byte " << i;
  }
  auto longer = *bytes;
  longer.push_back(std::byte{0});
  EXPECT_FALSE(DecodeTrace(longer));
  EXPECT_FALSE(ReadTraceFile("no/such/trace.bin"));
}

TEST(TraceFile, RejectsInvalidTraceOnWrite) {
  Trace t = SmallTrace();
  t.steps[0].records[0].values.push_back(6000);  // >= context_len
  EXPECT_FALSE(EncodeTrace(t));
  t = SmallTrace();
  t.steps[1].records[0].group = 2;
  EXPECT_FALSE(EncodeTrace(t));
}

}  // namespace
}  // namespace ula

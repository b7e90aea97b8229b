// The C4 indexer (indexer_decode.h, tokens_per_entry > 1): DeepSeek-V4's lightning indexer
// over compressed entries, real top-k over synthetic keys, its selection statistics and
// traces.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>

#include "config/model_config.h"
#include "test_seed.h"
#include "workload/calibration.h"
#include "workload/indexer_decode.h"
#include "workload/trace_file.h"

namespace ula {
namespace {

DecodeSimConfig SmallC4(std::uint64_t seed) {
  DecodeSimConfig c;
  c.model = "test";
  c.seed = seed;
  c.num_requests = 2;
  c.prompt_tokens = 30;  // 7 entries and 2 tokens of compressor state
  c.decode_steps = 16;
  c.draft_tokens = 1;
  c.tokens_per_entry = 4;
  c.query_keep = 1.0;
  c.query_noise = 0.25;
  c.query_newest = 0.15;
  c.sink_tokens = 1;
  c.sink_boost = 3.0;
  c.sink_align = 1.0;
  return c;
}

const IndexerShape kSmall{.num_heads = 4, .head_dim = 16, .top_k = 8};

TEST(C4Indexer, ConfigsLoadTheirTokensPerEntry) {
  auto v4 = LoadDecodeSimConfigByName("v4_flash_c4_indexer", DefaultConfigDir());
  ASSERT_TRUE(v4) << v4.error().ToString();
  EXPECT_EQ(v4->tokens_per_entry, 4u);
  EXPECT_EQ(v4->prompt_entries(), 2048u);
  EXPECT_EQ(v4->model, "deepseek_v4_flash");
  auto per_token = LoadDecodeSimConfigByName("indexer_calibration", DefaultConfigDir());
  ASSERT_TRUE(per_token) << per_token.error().ToString();
  EXPECT_EQ(per_token->tokens_per_entry, 1u);  // absent: the per-token indexer
}

TEST(C4Indexer, RejectsBadTokensPerEntryByName) {
  auto base = LoadDecodeSimConfigByName("v4_flash_c4_indexer", DefaultConfigDir());
  ASSERT_TRUE(base);
  const std::string text = R"({"name": "x", "source": "s", "model": "m", "seed": 1, "num_requests": 1,
    "prompt_tokens": PROMPT, "decode_steps": 2, "draft_tokens": 0, "query_keep": 1, "query_noise": 0,
    "query_newest": 0, "sink_tokens": SINKS, "sink_boost": 0, "sink_align": 0, "heavy_alpha": 1,
    "heavy_boost": 0, "heavy_align": 0, "tokens_per_entry": TPE})";
  auto make = [&](const char* prompt, const char* sinks, const char* tpe) {
    std::string t = text;
    t.replace(t.find("PROMPT"), 6, prompt);
    t.replace(t.find("SINKS"), 5, sinks);
    t.replace(t.find("TPE"), 3, tpe);
    return t;
  };
  ASSERT_TRUE(ParseDecodeSimConfig(make("16", "4", "4")));
  const struct {
    const char *prompt, *sinks, *tpe, *field;
  } bad[] = {
      {"16", "0", "0", "tokens_per_entry"},    {"16", "0", "2000", "tokens_per_entry"},
      {"16", "0", "\"4\"", "tokens_per_entry"}, {"3", "0", "4", "prompt_tokens"},
      {"16", "5", "4", "sink_tokens"},          // 16 tokens are 4 entries
  };
  for (const auto& b : bad) {
    auto c = ParseDecodeSimConfig(make(b.prompt, b.sinks, b.tpe), "t.json");
    ASSERT_FALSE(c) << b.field;
    EXPECT_EQ(c.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(c.error().message().find(b.field), std::string::npos) << c.error().message();
  }
  // A config built in code is held to the same rules, and creating a simulation refuses it.
  DecodeSimConfig c = SmallC4(1);
  c.tokens_per_entry = 0;
  EXPECT_FALSE(c.Validate());
  EXPECT_FALSE(IndexerDecodeSim::Create(kSmall, c));
}

TEST(C4Indexer, AnEntryArrivesWithEveryFourthToken) {
  ULA_TEST_SEEDED(seed, 20261203);
  auto sim = IndexerDecodeSim::Create(kSmall, SmallC4(seed));
  ASSERT_TRUE(sim) << sim.error().ToString();
  EXPECT_EQ((*sim)->context_len(0), 7u);
  for (std::uint32_t step = 1; step <= 16; ++step) {
    ASSERT_TRUE((*sim)->Step());
    const std::uint64_t tokens = 30 + step;
    for (std::uint32_t r = 0; r < 2; ++r) {
      ASSERT_EQ((*sim)->tokens(r), tokens);
      ASSERT_EQ((*sim)->context_len(r), tokens / 4) << "step " << step;
      const auto sel = (*sim)->Selections(r);
      ASSERT_EQ(sel.size(), 2u);  // the token and its draft
      for (const auto& q : sel) {
        ASSERT_EQ(q.size(), std::min<std::size_t>(8, tokens / 4));
        const std::set<std::uint32_t> distinct(q.begin(), q.end());
        EXPECT_EQ(distinct.size(), q.size());
        EXPECT_LT(*std::max_element(q.begin(), q.end()), tokens / 4);
      }
    }
  }
}

TEST(C4Indexer, OneTokenPerEntryIsThePerTokenIndexer) {
  ULA_TEST_SEEDED(seed, 20261204);
  DecodeSimConfig a = SmallC4(seed);
  a.tokens_per_entry = 1;
  auto per_token = IndexerDecodeSim::Create(kSmall, a);
  ASSERT_TRUE(per_token);
  for (std::uint32_t step = 1; step <= 8; ++step) {
    ASSERT_TRUE((*per_token)->Step());
    EXPECT_EQ((*per_token)->context_len(0), 30u + step);
  }
  // The same stream with four tokens per entry draws a quarter of the keys: different picks.
  auto c4 = IndexerDecodeSim::Create(kSmall, SmallC4(seed));
  ASSERT_TRUE(c4);
  for (std::uint32_t step = 1; step <= 8; ++step) ASSERT_TRUE((*c4)->Step());
  EXPECT_EQ((*c4)->context_len(0), 38u / 4);
}

TEST(C4Indexer, FlashIndexerStatisticsAndTrace) {
  ULA_TEST_SEEDED(seed, 20261203);
  auto model = LoadModelConfigByName("deepseek_v4_flash", DefaultConfigDir());
  ASSERT_TRUE(model);
  auto schedule = LoadDecodeSimConfigByName("v4_flash_c4_indexer", DefaultConfigDir());
  ASSERT_TRUE(schedule);
  schedule->seed = seed;
  schedule->decode_steps = 12;
  const IndexerShape shape = model->indexer_shape();
  double overlap_at_keep[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    DecodeSimConfig s = *schedule;
    s.query_keep = i == 0 ? 1.0 : 0.3;  // the drift sensitivity: faster drift, less overlap
    auto run = RunRealIndexer(shape, s);
    ASSERT_TRUE(run) << run.error().ToString();
    overlap_at_keep[i] = run->overlap.mean;
    std::printf("[ c4 ] query_keep %.1f: overlap mean %.4f p10 %.4f, draft overlap %.4f, distinct per step %.1f "
                "(union / top-k %.4f)\n",
                s.query_keep, run->overlap.mean, run->overlap.p10, run->draft_overlap.mean,
                run->union_per_top_k * shape.top_k, run->union_per_top_k);
    EXPECT_EQ(run->overlap.count, 2u * 11u);
    EXPECT_GE(run->union_per_top_k, 1.0);
    EXPECT_LE(run->union_per_top_k, 2.0);
    // The trace: one group, the token and its draft, positions are C4 entries.
    ASSERT_TRUE(run->trace.Validate());
    EXPECT_EQ(run->trace.queries_per_step, 2u);
    ASSERT_EQ(run->trace.steps.size(), 12u);
    EXPECT_EQ(run->trace.steps[0].records[0].context_len, 2048u);
    EXPECT_EQ(run->trace.steps[11].records[0].context_len, (8192u + 12u) / 4);
    EXPECT_EQ(run->trace.steps[0].records[0].values.size(), 512u);
    auto bytes = EncodeTrace(run->trace);
    ASSERT_TRUE(bytes);
    auto back = DecodeTrace(*bytes);
    ASSERT_TRUE(back);
    EXPECT_EQ(*back, run->trace);
  }
  EXPECT_GT(overlap_at_keep[0], overlap_at_keep[1]);
  EXPECT_GT(overlap_at_keep[0], 0.5);
  // The selection model draws per-token positions: it refuses a C4 schedule.
  SelectionModelParams params;
  auto synthetic = RunSelectionModel(params, *schedule);
  ASSERT_FALSE(synthetic);
  EXPECT_EQ(synthetic.error().code(), ErrorCode::kUnsupported);
}

}  // namespace
}  // namespace ula

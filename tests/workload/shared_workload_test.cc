// Sharing workloads: the shipped configs load with their sources, the generator
// builds the prefixes each kind defines, and MeasureSharing counts distinct tokens exactly.
#include "workload/shared_workload.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "config/model_config.h"

namespace ula {
namespace {

SharedWorkloadConfig Small(SharingKind kind) {
  SharedWorkloadConfig c;
  c.name = "small";
  c.kind = kind;
  c.groups = 2;
  c.requests_per_group = 3;
  c.min_shared_tokens = c.max_shared_tokens = 10;
  c.min_own_tokens = c.max_own_tokens = 4;
  c.min_output_tokens = c.max_output_tokens = 2;
  return c;
}

TEST(SharedWorkload, ShippedConfigsLoadAndAreShared) {
  for (const char* name : {"lexsum_summaries", "shared_system_prompt", "multi_turn_sessions"}) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(IsSharedWorkload(name, DefaultConfigDir()).value());
    auto c = LoadSharedWorkloadConfigByName(name, DefaultConfigDir());
    ASSERT_TRUE(c) << c.error().ToString();
    auto reqs = GenerateSharedWorkload(*c).value();
    ASSERT_EQ(reqs.size(), std::size_t{c->groups} * c->requests_per_group);
    const auto stats = MeasureSharing(reqs);
    EXPECT_GT(stats.shared_fraction(), 0.5);  // every kind shares most of its input
    EXPECT_LT(stats.distinct_tokens, stats.input_tokens);
  }
  EXPECT_FALSE(IsSharedWorkload("long_doc_summarization", DefaultConfigDir()).value());
  EXPECT_EQ(LoadSharedWorkloadConfigByName("lexsum_summaries", DefaultConfigDir())->requests_per_group, 3u);
}

TEST(SharedWorkload, SummariesShareTheDocumentExactly) {
  auto reqs = GenerateSharedWorkload(Small(SharingKind::kSummariesPerDocument)).value();
  ASSERT_EQ(reqs.size(), 6u);
  for (const auto& r : reqs) {
    ASSERT_EQ(r.tokens.size(), 14u);
    const auto& first = reqs[r.group * 3];
    EXPECT_TRUE(std::equal(first.tokens.begin(), first.tokens.begin() + 10, r.tokens.begin()));
    EXPECT_EQ(r.shared_tokens, r.id.value() % 3 == 0 ? 0u : 10u);
  }
  EXPECT_NE(reqs[0].tokens[0], reqs[3].tokens[0]);  // documents differ
  EXPECT_NE(reqs[0].tokens[10], reqs[1].tokens[10]);  // instructions differ
  const auto s = MeasureSharing(reqs);
  EXPECT_EQ(s.input_tokens, 6u * 14);
  EXPECT_EQ(s.distinct_tokens, 2u * (10 + 3 * 4));  // each document once + every instruction
}

TEST(SharedWorkload, MultiTurnResendsTheWholeHistory) {
  auto reqs = GenerateSharedWorkload(Small(SharingKind::kMultiTurn)).value();
  ASSERT_EQ(reqs.size(), 6u);
  // Turn 0: 10 tokens; turn 1: 10 + 2 output + 4 new = 16; turn 2: 16 + 2 + 4 = 22.
  EXPECT_EQ(reqs[0].tokens.size(), 10u);
  EXPECT_EQ(reqs[1].tokens.size(), 16u);
  EXPECT_EQ(reqs[2].tokens.size(), 22u);
  EXPECT_EQ(reqs[1].shared_tokens, 12u);
  EXPECT_EQ(reqs[2].shared_tokens, 18u);
  EXPECT_TRUE(std::equal(reqs[1].tokens.begin(), reqs[1].tokens.end(), reqs[2].tokens.begin()));
  const auto s = MeasureSharing(reqs);
  EXPECT_EQ(s.input_tokens, 2u * (10 + 16 + 22));
  EXPECT_EQ(s.distinct_tokens, 2u * 22);  // the last turn contains every earlier one
  // Determinism.
  auto again = GenerateSharedWorkload(Small(SharingKind::kMultiTurn)).value();
  for (std::size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(again[i].tokens, reqs[i].tokens);
}

TEST(SharedWorkload, BadConfigsAreRefusedNamingTheField) {
  auto c = Small(SharingKind::kSharedSystemPrompt);
  c.max_own_tokens = 3;
  EXPECT_NE(c.Validate().error().message().find("max_own_tokens"), std::string::npos);
  EXPECT_FALSE(GenerateSharedWorkload(c));
  const char* unsourced = R"({"name": "x", "sharing": "multi_turn", "source": "s", "seed": 1, "groups": 2,
      "requests_per_group": {"value": 2, "source": "s"}})";
  auto r = ParseSharedWorkloadConfig(unsourced);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("groups"), std::string::npos) << r.error().ToString();
  const char* kind = R"({"name": "x", "sharing": "chat", "source": "s", "seed": 1})";
  r = ParseSharedWorkloadConfig(kind);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("sharing"), std::string::npos) << r.error().ToString();
}

}  // namespace
}  // namespace ula

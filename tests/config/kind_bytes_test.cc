// Per-kind accounting (config/kind_bytes.h) held to SGLang's DSV4 pool configurator
// (python/sglang/srt/model_executor/pool_configurator.py, DSV4PoolConfigurator): its page of
// 256 full tokens holds 64 C4 and 2 C128 entries, its C4 / C128 pools hold full / 4 and
// full / 128 entries, and its compressed per-full-token coefficient for V4-Flash is
// 584 / 4 * 21 + 584 / 128 * 20 + 132 / 4 * 21 = 3850.25 B.
#include <gtest/gtest.h>

#include "config/kind_bytes.h"
#include "config/model_config.h"
#include "v4_flash.h"

namespace ula {
namespace {

ModelConfig Flash() { return test::FlashModel(); }

TEST(KindBytes, PageHoldsSglangsCompressedEntryCounts) {
  // DSV4PoolConfigurator asserts page_size % 128 == 0; the unified pool's K_PER_BLOCK is
  // {4: 32, 128: 1} for a 128-token block; HiSparse's C4 page of a 256-token page is 64.
  EXPECT_EQ(EntriesPerPage(256, 4).value(), 64u);
  EXPECT_EQ(EntriesPerPage(256, 128).value(), 2u);
  EXPECT_EQ(EntriesPerPage(128, 4).value(), 32u);
  EXPECT_EQ(EntriesPerPage(128, 128).value(), 1u);
  EXPECT_EQ(EntriesPerPage(64, 1).value(), 64u);
  for (auto [page, ratio] : {std::pair{100u, 128u}, {256u, 0u}, {0u, 4u}, {258u, 4u}}) {
    auto e = EntriesPerPage(page, ratio);
    ASSERT_FALSE(e) << page << " / " << ratio;
    EXPECT_EQ(e.error().code(), ErrorCode::kInvalidArgument);
  }
}

TEST(KindBytes, CompressedPoolsHoldSglangsShares) {
  // _compute_dsv4_sizes(full_token = 4096): c4 = 4096 // 4 = 1024, c128 = 4096 // 128 = 32
  // entries per layer of the kind.
  const ModelConfig m = Flash();
  auto c = CountKindEntries(m, 4096);
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_EQ(c->csa_entries, 21u * 1024u);
  EXPECT_EQ(c->hca_entries, 20u * 32u);
  EXPECT_EQ(c->index_keys, 21u * 1024u);
  EXPECT_EQ(c->window_entries, 44u * 128u);  // every layer, MTP included, keeps its window
}

TEST(KindBytes, CompressedBytesPerTokenMatchSglangsCoefficient) {
  const ModelConfig m = Flash();
  for (std::uint64_t tokens : {128ull * 1024, 1ull << 20, 128ull * 7}) {
    auto b = BytesPerKind(m, tokens, KvStorageFormat::kFp8Packed, IndexKeyFormat::kFp8);
    ASSERT_TRUE(b) << b.error().ToString();
    const double compressed = static_cast<double>(b->csa_kv + b->hca_kv + b->index_keys);
    EXPECT_DOUBLE_EQ(compressed / static_cast<double>(tokens), 3850.25) << tokens;
    EXPECT_EQ(b->window_kv, 44u * 128u * 584u);
  }
  // 128K tokens, exactly: 21 x 32768 C4 entries and keys, 20 x 1024 C128 entries.
  auto b = BytesPerKind(m, 131072, KvStorageFormat::kFp8Packed, IndexKeyFormat::kFp8);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->csa_kv, 401'866'752u);
  EXPECT_EQ(b->hca_kv, 11'960'320u);
  EXPECT_EQ(b->index_keys, 90'832'896u);
  EXPECT_EQ(b->total(), 504'659'968u + 44u * 128u * 584u);
}

TEST(KindBytes, FormatsChangeEntryAndKeyBytes) {
  const ModelConfig m = Flash();
  auto fp8 = BytesPerKind(m, 4096, KvStorageFormat::kFp8Packed, IndexKeyFormat::kFp8);
  auto bf16 = BytesPerKind(m, 4096, KvStorageFormat::kBf16, IndexKeyFormat::kFp4);
  auto uni = BytesPerKind(m, 4096, KvStorageFormat::kFp8Uniform, IndexKeyFormat::kFp4);
  ASSERT_TRUE(fp8 && bf16 && uni);
  EXPECT_EQ(bf16->csa_kv, 21u * 1024u * 1024u);
  EXPECT_EQ(uni->csa_kv, 21u * 1024u * 512u);
  EXPECT_EQ(fp8->index_keys, 21u * 1024u * 132u);
  EXPECT_EQ(bf16->index_keys, 21u * 1024u * 68u);
}

TEST(KindBytes, ShortRequestsHoldPartialWindowsAndNoUnfinishedBlocks) {
  const ModelConfig m = Flash();
  auto c = CountKindEntries(m, 130);  // 32 full C4 blocks + 2 tokens of compressor state, one C128 block
  ASSERT_TRUE(c);
  EXPECT_EQ(c->window_entries, 44u * 128u);
  EXPECT_EQ(c->csa_entries, 21u * 32u);
  EXPECT_EQ(c->hca_entries, 20u * 1u);
  auto s = CountKindEntries(m, 3);  // no block complete yet
  ASSERT_TRUE(s);
  EXPECT_EQ(*s, (KindCounts{.window_entries = 44u * 3u, .csa_entries = 0, .hca_entries = 0, .index_keys = 0}));
  auto z = CountKindEntries(m, 0);
  ASSERT_TRUE(z);
  EXPECT_EQ(*z, KindCounts{});
}

TEST(KindBytes, ProCountsItsThirtyCsaLayers) {
  auto m = LoadModelConfigByName("deepseek_v4_pro", DefaultConfigDir());
  ASSERT_TRUE(m);
  auto c = CountKindEntries(*m, 1024);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->csa_entries, 30u * 256u);
  EXPECT_EQ(c->hca_entries, 31u * 8u);
  EXPECT_EQ(c->window_entries, 62u * 128u);
}

TEST(KindBytes, RefusesSingleKindModelsAndHugeRequests) {
  auto glm = LoadModelConfigByName("glm5", DefaultConfigDir());
  ASSERT_TRUE(glm);
  auto c = CountKindEntries(*glm, 100);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code(), ErrorCode::kFailedPrecondition);
  const ModelConfig m = Flash();
  EXPECT_TRUE(CountKindEntries(m, kMaxKindTokens));
  auto huge = BytesPerKind(m, kMaxKindTokens + 1, KvStorageFormat::kFp8Packed, IndexKeyFormat::kFp8);
  ASSERT_FALSE(huge);
  EXPECT_EQ(huge.error().code(), ErrorCode::kInvalidArgument);
  ModelConfig broken = m;
  broken.compress_ratios.pop_back();
  auto bad = CountKindEntries(broken, 100);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace ula

// Partial attention over disjoint parts of a selection, merged by log-sum-exp, equals the
// reference attention over the whole selection (up to float rounding), whatever the split.
#include "ula/partial_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "test_seed.h"

namespace ula {
namespace {

struct Case {
  MlaShape shape{.num_heads = 3, .kv_lora_rank = 12, .rope_dim = 4, .softmax_scale = 0.3f};
  std::vector<float> query;
  std::vector<std::vector<float>> entries;
  std::vector<const std::byte*> Pointers(const std::vector<std::size_t>& idx) const {
    std::vector<const std::byte*> p;
    for (std::size_t i : idx) p.push_back(reinterpret_cast<const std::byte*>(entries[i].data()));
    return p;
  }
};

Case MakeCase(std::mt19937_64& rng, std::size_t n, float spread) {
  Case c;
  std::uniform_real_distribution<float> v(-spread, spread);
  c.query.resize(c.shape.query_values());
  for (float& x : c.query) x = v(rng);
  c.entries.assign(n, std::vector<float>(c.shape.kv_lora_rank + c.shape.rope_dim));
  for (auto& e : c.entries) {
    for (float& x : e) x = v(rng);
  }
  return c;
}

TEST(PartialAttention, AnySplitMergesToTheReference) {
  ULA_TEST_SEEDED(seed, 99);
  std::mt19937_64 rng(seed);
  double worst = 0.0;
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t n = 1 + rng() % 300;
    const std::uint32_t parts = 1 + static_cast<std::uint32_t>(rng() % 9);
    Case c = MakeCase(rng, n, trial % 2 == 0 ? 1.0f : 6.0f);  // large logits: the max shift matters
    std::vector<std::size_t> all(n);
    for (std::size_t i = 0; i < n; ++i) all[i] = i;
    std::vector<float> want(c.shape.output_values()), got(c.shape.output_values());
    ASSERT_TRUE(SparseMlaAttention(c.shape, c.query, c.Pointers(all), want));
    // Split by i mod parts (as TP homes do); some parts may be empty when n < parts.
    const std::size_t pv = PartialValues(c.shape);
    std::vector<float> partials(parts * pv);
    for (std::uint32_t k = 0; k < parts; ++k) {
      std::vector<std::size_t> idx;
      for (std::size_t i = k; i < n; i += parts) idx.push_back(i);
      ASSERT_TRUE(PartialMlaAttention(c.shape, c.query, c.Pointers(idx), std::span(partials).subspan(k * pv, pv)));
    }
    ASSERT_TRUE(MergeMlaPartials(c.shape, partials, got));
    for (std::size_t d = 0; d < got.size(); ++d) {
      const double err = std::abs(double{got[d]} - double{want[d]}) / (1.0 + std::abs(double{want[d]}));
      worst = std::max(worst, err);
      ASSERT_LE(err, 1e-5) << "trial " << trial << " value " << d;
    }
  }
  std::printf("largest relative difference from the reference: %.3g\n", worst);
}

// Each head's parts are shifted by that head's own maximum logit. Heads whose maxima differ
// by far more than exp's float range (about 88) must each merge exactly: a shift by another
// head's maximum (or by the maximum over all heads) underflows every weight of the smaller
// head to 0 and its output to 0 / 0. Partial records are written directly: head 0's parts
// have maxima near 0, head 1's near 500, head 2's near -400.
TEST(PartialAttention, HeadsWhoseMaximaDifferBeyondExpRangeMergeExactly) {
  const MlaShape shape{.num_heads = 3, .kv_lora_rank = 2, .rope_dim = 0, .softmax_scale = 1.0f};
  const std::size_t pv = PartialValues(shape);
  const std::uint32_t l = shape.kv_lora_rank, record = l + 2;
  const float base[3] = {0.0f, 500.0f, -400.0f};
  // Two parts per head: maxima base and base - 1, sums 2 and 3, accumulators per part.
  std::vector<float> partials(2 * pv);
  for (std::uint32_t k = 0; k < 2; ++k) {
    for (std::uint32_t h = 0; h < 3; ++h) {
      float* r = partials.data() + k * pv + h * record;
      r[0] = 1.0f + k;         // acc[0]
      r[1] = 2.0f * (k + 1);   // acc[1]
      r[l] = base[h] - k;      // m_k
      r[l + 1] = 2.0f + k;     // s_k
    }
  }
  std::vector<float> out(shape.output_values());
  ASSERT_TRUE(MergeMlaPartials(shape, partials, out));
  // Per head: w_0 = 1, w_1 = exp(-1); out[d] = (acc_0[d] + w_1 acc_1[d]) / (2 + 3 w_1).
  const double w1 = std::exp(-1.0);
  const double want0 = (1.0 + w1 * 2.0) / (2.0 + 3.0 * w1);
  const double want1 = (2.0 + w1 * 4.0) / (2.0 + 3.0 * w1);
  for (std::uint32_t h = 0; h < 3; ++h) {
    ASSERT_TRUE(std::isfinite(out[h * l])) << "head " << h << " (max logit " << base[h] << ")";
    EXPECT_NEAR(out[h * l], want0, 1e-6) << "head " << h;
    EXPECT_NEAR(out[h * l + 1], want1, 1e-6) << "head " << h;
  }
}

// The merge sums the parts in index order (the header's contract: bit-identical outputs on
// every process). Records chosen so that float addition order shows: with m = 0 and s = 1
// for every part, out = (acc_0 + acc_1 + acc_2) / 3 summed left to right. acc = {1, 1e8,
// -1e8}: in index order 1 + 1e8 rounds to 1e8 and the sum is exactly 0; in any order that
// adds the two large values first it is 1 (out 1/3). A second layout checks the weights:
// parts with different maxima get w_k = exp(m_k - M) against a double evaluation of the
// formula.
TEST(PartialAttention, MergeSumsThePartsInIndexOrder) {
  MlaShape shape{.num_heads = 1, .kv_lora_rank = 2, .rope_dim = 1, .softmax_scale = 1.0f};
  const std::size_t pv = PartialValues(shape);
  ASSERT_EQ(pv, 4u);
  auto record = [](std::vector<float>& p, float acc0, float acc1, float m, float s) {
    p.insert(p.end(), {acc0, acc1, m, s});
  };
  std::vector<float> partials;
  record(partials, 1.0f, 2.0f, 0.0f, 1.0f);
  record(partials, 1e8f, 2.0f, 0.0f, 1.0f);
  record(partials, -1e8f, 2.0f, 0.0f, 1.0f);
  std::vector<float> out(shape.output_values());
  ASSERT_TRUE(MergeMlaPartials(shape, partials, out));
  EXPECT_EQ(out[0], 0.0f) << "the parts were not summed in index order";
  EXPECT_EQ(out[1], 2.0f);
  // The same records in another order give another (also index-order) result.
  std::vector<float> reordered;
  record(reordered, 1e8f, 2.0f, 0.0f, 1.0f);
  record(reordered, -1e8f, 2.0f, 0.0f, 1.0f);
  record(reordered, 1.0f, 2.0f, 0.0f, 1.0f);
  ASSERT_TRUE(MergeMlaPartials(shape, reordered, out));
  EXPECT_EQ(out[0], 1.0f / 3.0f);

  std::vector<float> weighted;
  record(weighted, 3.0f, -1.0f, 0.5f, 2.0f);
  record(weighted, -2.0f, 4.0f, 2.0f, 1.5f);
  record(weighted, 0.0f, 0.0f, -INFINITY, 0.0f);  // an empty part: neutral
  record(weighted, 1.0f, 1.0f, -1.0f, 0.25f);
  ASSERT_TRUE(MergeMlaPartials(shape, weighted, out));
  const double big = 2.0, w0 = std::exp(0.5 - big), w1 = 1.0, w3 = std::exp(-1.0 - big);
  const double denom = w0 * 2.0 + w1 * 1.5 + w3 * 0.25;
  EXPECT_NEAR(out[0], (w0 * 3.0 + w1 * -2.0 + w3 * 1.0) / denom, 1e-6);
  EXPECT_NEAR(out[1], (w0 * -1.0 + w1 * 4.0 + w3 * 1.0) / denom, 1e-6);

  // A pure function of its input: merging a copy gives the same bits.
  std::vector<float> again(out.size());
  const std::vector<float> copy = weighted;
  ASSERT_TRUE(MergeMlaPartials(shape, copy, again));
  EXPECT_EQ(std::memcmp(out.data(), again.data(), out.size() * sizeof(float)), 0);
}

TEST(PartialAttention, EmptyPartIsNeutralAndAllEmptyIsRefused) {
  ULA_TEST_SEEDED(seed, 6);
  std::mt19937_64 rng(seed);
  Case c = MakeCase(rng, 10, 1.0f);
  const std::size_t pv = PartialValues(c.shape);
  std::vector<float> partials(2 * pv);
  std::vector<std::size_t> all{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  ASSERT_TRUE(PartialMlaAttention(c.shape, c.query, {}, std::span(partials).subspan(0, pv)));
  EXPECT_EQ(partials[c.shape.kv_lora_rank], -INFINITY);
  EXPECT_EQ(partials[c.shape.kv_lora_rank + 1], 0.0f);
  ASSERT_TRUE(PartialMlaAttention(c.shape, c.query, c.Pointers(all), std::span(partials).subspan(pv, pv)));
  std::vector<float> merged(c.shape.output_values()), alone(c.shape.output_values());
  ASSERT_TRUE(MergeMlaPartials(c.shape, partials, merged));
  ASSERT_TRUE(MergeMlaPartials(c.shape, std::span(partials).subspan(pv, pv), alone));
  EXPECT_EQ(std::memcmp(merged.data(), alone.data(), merged.size() * sizeof(float)), 0);

  // Every part empty, wrong sizes, null entries: refused, out untouched.
  std::vector<float> out(c.shape.output_values(), 42.0f);
  const std::vector<float> before = out;
  EXPECT_EQ(MergeMlaPartials(c.shape, std::span(partials).subspan(0, pv), out).error().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(MergeMlaPartials(c.shape, std::span(partials).subspan(0, pv - 1), out).error().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(MergeMlaPartials(c.shape, {}, out).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(out, before);
  std::vector<float> partial(pv, 7.0f);
  const std::vector<float> partial_before = partial;
  std::vector<const std::byte*> with_null{nullptr};
  EXPECT_EQ(PartialMlaAttention(c.shape, c.query, with_null, partial).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(PartialMlaAttention(c.shape, std::span(c.query).subspan(1), {}, partial).error().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(partial, partial_before);
  MlaShape bad = c.shape;
  bad.num_heads = 0;
  EXPECT_EQ(PartialMlaAttention(bad, c.query, {}, partial).error().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace ula

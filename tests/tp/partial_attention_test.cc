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

TEST(PartialAttention, MergeIsAPureFunctionOfThePartialsInOrder) {
  ULA_TEST_SEEDED(seed, 5);
  std::mt19937_64 rng(seed);
  Case c = MakeCase(rng, 40, 2.0f);
  const std::size_t pv = PartialValues(c.shape);
  std::vector<float> partials(4 * pv);
  for (std::uint32_t k = 0; k < 4; ++k) {
    std::vector<std::size_t> idx;
    for (std::size_t i = k; i < 40; i += 4) idx.push_back(i);
    ASSERT_TRUE(PartialMlaAttention(c.shape, c.query, c.Pointers(idx), std::span(partials).subspan(k * pv, pv)));
  }
  std::vector<float> a(c.shape.output_values()), b(c.shape.output_values());
  ASSERT_TRUE(MergeMlaPartials(c.shape, partials, a));
  const std::vector<float> copy = partials;
  ASSERT_TRUE(MergeMlaPartials(c.shape, copy, b));
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
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

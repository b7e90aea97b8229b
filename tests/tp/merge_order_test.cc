// MergeMlaPartials combines the parts in index (rank) order (include/ula/partial_attention.h),
// so every rank and the in-process and MPI engines get the same bits. Float addition is
// not associative: with accumulators 1, 1e8 and -1e8 the rank-order sum is (1 + 1e8) - 1e8
// = 0 in float, any order that adds the last two first gives 1.
#include <gtest/gtest.h>

#include <vector>

#include "ula/partial_attention.h"

namespace ula {
namespace {

TEST(MergeMlaPartials, AddsThePartsInRankOrder) {
  const MlaShape shape{.num_heads = 1, .kv_lora_rank = 4, .rope_dim = 4, .softmax_scale = 1.0f};
  const std::uint32_t l = shape.kv_lora_rank, per = PartialValues(shape);
  const float acc[3] = {1.0f, 1e8f, -1e8f};
  std::vector<float> partials(3 * per, 0.0f);
  for (std::uint32_t k = 0; k < 3; ++k) {
    float* r = partials.data() + k * per;
    for (std::uint32_t d = 0; d < l; ++d) r[d] = acc[k];
    r[l] = 0.0f;      // the same running max: every part weighs exp(0) = 1
    r[l + 1] = 1.0f;  // softmax denominator of the part
  }
  std::vector<float> out(shape.output_values());
  ASSERT_TRUE(MergeMlaPartials(shape, partials, out));
  for (std::uint32_t d = 0; d < l; ++d) EXPECT_EQ(out[d], 0.0f) << "dimension " << d << ": not merged in rank order";
}

}  // namespace
}  // namespace ula

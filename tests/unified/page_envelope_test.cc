#include "unified/page_envelope.h"

#include <gtest/gtest.h>

#include <cstring>

#include "ula/unified_buffer.h"

namespace ula {
namespace {

TEST(PageEnvelope, WritesThroughLayerViewsReadBackThroughTheEnvelope) {
  // K and V of different sizes; 3 layers; 4 tokens per page.
  const PageEnvelopeLayout layout{.page_tokens = 4, .num_layers = 3, .k_bytes_per_token = 24, .v_bytes_per_token = 40};
  ASSERT_TRUE(layout.Validate());
  EXPECT_EQ(layout.layer_stride(), 4u * 64u);
  EXPECT_EQ(layout.envelope_bytes(), 3u * 256u);
  UnifiedBufferConfig c;
  c.alignment = 64;
  c.kinds = {{"state", 64, BufferEnd::kLow}, {"kv", layout.AlignedEnvelopeBytes(64), BufferEnd::kHigh}};
  c.capacity_bytes = 8 * c.kinds[1].block_bytes;
  c.padding_kind = BlockKind(1);
  c.padding_blocks = 1;
  auto buffer = UnifiedBuffer::Create(c).value();
  std::vector<BlockId> pages;
  for (int p = 0; p < 3; ++p) pages.push_back(buffer->Allocate(BlockKind(1)).value());
  auto tag = [](int page, int layer, int token, int kv, int byte) {
    return std::byte(static_cast<unsigned char>(page * 61 + layer * 29 + token * 7 + kv * 3 + byte));
  };
  for (int p = 0; p < 3; ++p) {
    std::byte* base = buffer->Bytes(pages[p]).value().data();
    for (std::uint32_t l = 0; l < layout.num_layers; ++l) {
      LayerView view = ViewLayer(layout, base, l);
      for (std::uint32_t t = 0; t < layout.page_tokens; ++t) {
        for (int i = 0; i < 24; ++i) view.K(t)[i] = tag(p, l, t, 0, i);
        for (int i = 0; i < 40; ++i) view.V(t)[i] = tag(p, l, t, 1, i);
      }
    }
  }
  // Free the middle page and compact so that one envelope moves, then read every byte back
  // from the envelope using the documented formula.
  ASSERT_TRUE(buffer->Free(pages[0]));
  buffer->Compact();
  for (int p = 1; p < 3; ++p) {
    const std::byte* base = buffer->Bytes(pages[p]).value().data();
    for (std::uint32_t l = 0; l < layout.num_layers; ++l) {
      for (std::uint32_t t = 0; t < layout.page_tokens; ++t) {
        const std::byte* k = base + l * layout.layer_stride() + t * 24;
        const std::byte* v = base + l * layout.layer_stride() + layout.page_tokens * 24 + t * 40;
        for (int i = 0; i < 24; ++i) ASSERT_EQ(k[i], tag(p, l, t, 0, i));
        for (int i = 0; i < 40; ++i) ASSERT_EQ(v[i], tag(p, l, t, 1, i));
      }
    }
  }
  EXPECT_EQ(buffer->Stats().blocks_moved, 1u);
}

TEST(PageEnvelope, ValidateNamesTheBadField) {
  PageEnvelopeLayout layout{.page_tokens = 0, .num_layers = 1, .k_bytes_per_token = 1, .v_bytes_per_token = 1};
  EXPECT_NE(layout.Validate().error().message().find("page_tokens"), std::string::npos);
  layout.page_tokens = 1;
  layout.v_bytes_per_token = 0;
  EXPECT_NE(layout.Validate().error().message().find("v_bytes_per_token"), std::string::npos);
}

}  // namespace
}  // namespace ula

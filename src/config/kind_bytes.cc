// Per-kind entry and byte accounting (kind_bytes.h).
#include "config/kind_bytes.h"

#include <fmt/format.h>

#include <algorithm>

namespace ula {

std::uint32_t KvEntryBytes(const ModelConfig& model, KvStorageFormat format) {
  switch (format) {
    case KvStorageFormat::kFp8Uniform: return model.kv_entry_bytes_fp8_uniform;
    case KvStorageFormat::kBf16: return model.kv_entry_bytes_bf16;
    case KvStorageFormat::kFp8Packed: break;
  }
  return model.kv_entry_bytes_per_layer;
}

std::uint32_t IndexKeyBytes(const ModelConfig& model, IndexKeyFormat format) {
  return format == IndexKeyFormat::kFp4 ? model.index_key_bytes_fp4 : model.index_key_bytes_per_layer;
}

Result<KindCounts> CountKindEntries(const ModelConfig& model, std::uint64_t tokens) {
  if (!model.has_layer_kinds()) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("model '{}' has no layer kinds (no compress_ratios)", model.name));
  }
  if (tokens > kMaxKindTokens) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("tokens: must be <= 2^40, got {}", tokens));
  }
  ULA_RETURN_IF_ERROR(model.Validate());
  KindCounts c;
  const std::uint64_t window = std::min<std::uint64_t>(tokens, model.sliding_window);
  for (std::uint32_t l = 0; l < model.compress_ratios.size(); ++l) {
    c.window_entries += window;
    switch (model.layer_kind(l)) {
      case AttentionLayerType::kCompressedSparse:
        c.csa_entries += tokens / model.compress_rate_csa;
        c.index_keys += tokens / model.compress_rate_csa;
        break;
      case AttentionLayerType::kHeavilyCompressed: c.hca_entries += tokens / model.compress_rate_hca; break;
      case AttentionLayerType::kSlidingWindow: break;
    }
  }
  return c;
}

Result<KindBytes> BytesPerKind(const ModelConfig& model, std::uint64_t tokens, KvStorageFormat kv_format,
                               IndexKeyFormat index_format) {
  auto counts = CountKindEntries(model, tokens);
  if (!counts) return std::unexpected(counts.error());
  const std::uint64_t entry = KvEntryBytes(model, kv_format);
  return KindBytes{.window_kv = counts->window_entries * entry,
                   .csa_kv = counts->csa_entries * entry,
                   .hca_kv = counts->hca_entries * entry,
                   .index_keys = counts->index_keys * IndexKeyBytes(model, index_format)};
}

Result<std::uint32_t> EntriesPerPage(std::uint32_t page_tokens, std::uint32_t ratio) {
  if (ratio < 1) return MakeError(ErrorCode::kInvalidArgument, "ratio: must be >= 1");
  if (page_tokens == 0 || page_tokens % ratio != 0) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("page_tokens: must be a positive multiple of ratio {}, got {}", ratio, page_tokens));
  }
  return page_tokens / ratio;
}

}  // namespace ula

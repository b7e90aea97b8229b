#include "config/model_kinds.h"

#include <fmt/format.h>

namespace ula {

namespace {

KvKind Kind(std::string name, std::uint32_t tokens, KindLifetime lifetime, std::uint32_t layers, std::uint64_t row,
            KindPlacement placement) {
  return KvKind{.name = std::move(name), .tokens_per_entry = tokens, .lifetime = lifetime, .layers = layers,
                .row_bytes = static_cast<std::uint32_t>(row), .placement = placement};
}

// A compressor's state kind: ratio * (1 + overlap) rows of 2 * (1 + overlap) * width values.
KvKind State(std::string name, std::uint32_t ratio, bool overlap, std::uint32_t width, std::uint32_t layers,
             std::uint32_t value_bytes) {
  const std::uint32_t coff = overlap ? 2 : 1;
  KvKind k = Kind(std::move(name), ratio, KindLifetime::kPerRequest, layers,
                  std::uint64_t{2} * coff * width * value_bytes, KindPlacement::kResident);
  k.state_rows = ratio * coff;
  return k;
}

}  // namespace

Result<std::vector<KvKind>> KindsOfModel(const ModelConfig& model, const ModelKindsOptions& options) {
  if (!model.has_layer_kinds()) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("model '{}' has no layer kinds (no compress_ratios): its space has one kind",
                                 model.name));
  }
  ULA_RETURN_IF_ERROR(model.Validate());
  const std::uint64_t ring = std::uint64_t{model.sliding_window} + options.max_draft_tokens;
  if (ring > (std::uint64_t{1} << 31)) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("max_draft_tokens = {}: the window ring would keep {} tokens, more than 2^31",
                                 options.max_draft_tokens, ring));
  }
  const std::uint32_t csa = model.num_layers_of_kind(AttentionLayerType::kCompressedSparse);
  const std::uint32_t hca = model.num_layers_of_kind(AttentionLayerType::kHeavilyCompressed);
  const std::uint32_t all = model.num_layers + model.mtp_layers;
  const std::uint32_t kv = KvEntryBytes(model, options.kv_format);
  const std::uint32_t width = model.kv_lora_rank + model.qk_rope_head_dim;  // the latent KV's values
  const std::uint32_t sb = model.compressor_state_bytes_per_value;
  std::vector<KvKind> kinds;
  KvKind window = Kind("window", 1, KindLifetime::kRing, all, kv, KindPlacement::kResident);
  window.ring_tokens = static_cast<std::uint32_t>(ring);
  window.ring_draft_tokens = options.max_draft_tokens;
  kinds.push_back(window);
  if (csa > 0) {
    kinds.push_back(Kind("c4", model.compress_rate_csa, KindLifetime::kAppend, csa, kv, KindPlacement::kSparse));
    KvKind key = Kind("c4_index_key", model.compress_rate_csa, KindLifetime::kAppend, csa,
                      IndexKeyBytes(model, options.index_format), KindPlacement::kResident);
    key.companion_of = static_cast<std::uint32_t>(kinds.size() - 1);
    kinds.push_back(key);
  }
  if (hca > 0) {
    kinds.push_back(Kind("c128", model.compress_rate_hca, KindLifetime::kAppend, hca, kv, KindPlacement::kResident));
  }
  if (csa > 0) {
    kinds.push_back(State("c4_state", model.compress_rate_csa, true, width, csa, sb));
    kinds.push_back(State("c4_index_state", model.compress_rate_csa, true, model.index_head_dim, csa, sb));
  }
  if (hca > 0) kinds.push_back(State("c128_state", model.compress_rate_hca, false, width, hca, sb));
  ULA_RETURN_IF_ERROR(ValidateKinds(kinds));
  return kinds;
}

Result<AddressSpaceConfig> SpaceConfigOfModel(const ModelConfig& model, const ModelKindsOptions& options,
                                              const AddressSpaceConfig& base) {
  auto kinds = KindsOfModel(model, options);
  if (!kinds) return std::unexpected(kinds.error());
  const std::size_t s = SparseKindIndex(*kinds);
  if (s == kinds->size()) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("model '{}' has no compressed-sparse layers: no kind for the step to select", model.name));
  }
  // The groups: main CSA layers layers_per_group to a group, in order; an MTP CSA layer alone.
  std::vector<std::uint32_t> groups;
  std::uint32_t open = 0;
  for (std::uint32_t l = 0; l < model.num_layers; ++l) {
    if (model.layer_kind(l) != AttentionLayerType::kCompressedSparse) continue;
    if (++open == model.layers_per_group) groups.push_back(open), open = 0;
  }
  if (open > 0) groups.push_back(open);
  for (std::uint32_t l = model.num_layers; l < model.num_layers + model.mtp_layers; ++l) {
    if (model.layer_kind(l) == AttentionLayerType::kCompressedSparse) groups.push_back(1);
  }
  AddressSpaceConfig c = base;
  c.num_groups = static_cast<std::uint32_t>(groups.size());
  c.row_bytes = (*kinds)[s].row_bytes;
  std::uint32_t widest = 0;
  for (std::uint32_t g : groups) widest = std::max(widest, g);
  c.entry_bytes = widest * c.row_bytes;
  c.group_layers = std::move(groups);
  c.kinds = std::move(*kinds);
  ULA_RETURN_IF_ERROR(c.Validate());
  return c;
}

}  // namespace ula

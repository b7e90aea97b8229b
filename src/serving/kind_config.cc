// Loader of configs/kinds/<model>.json (kind_config.h).
#include "serving/kind_config.h"

#include <fmt/format.h>

#include <algorithm>

#include "config/json_fields.h"

namespace ula {
namespace {

using config_internal::JsonFields;

// Reads a sourced integer field into `out`.
Status UIntField(JsonFields& f, const char* name, std::uint32_t& out, double min = 1, double max = 1e9) {
  auto v = f.SourcedDouble(name, min, max);
  if (!v) return std::unexpected(v.error());
  if (*v != static_cast<double>(static_cast<std::uint64_t>(*v))) {
    return std::unexpected(f.FieldError(name, fmt::format("must be an integer, got {}", *v)));
  }
  out = static_cast<std::uint32_t>(*v);
  return Ok();
}

Status DoubleField(JsonFields& f, const char* name, double& out, double min, double max) {
  auto v = f.SourcedDouble(name, min, max);
  if (!v) return std::unexpected(v.error());
  out = *v;
  return Ok();
}

}  // namespace

Status KindCompareConfig::Validate() const {
  const auto bad = [](std::string_view field, std::string_view why) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("field '{}': {}", field, why));
  };
  if (model.empty()) return bad("model", "must not be empty");
  if (scenario.empty()) return bad("scenario", "must not be empty");
  if (hidden_size == 0 || q_lora_rank == 0 || o_lora_rank == 0 || o_groups == 0 || head_dim == 0) {
    return bad("hidden_size", "the attention shapes must be >= 1");
  }
  if (routed_experts == 0 || experts_per_token == 0 || experts_per_token > routed_experts) {
    return bad("experts_per_token", "must be in [1, routed_experts]");
  }
  if (sglang_page_size % 128 != 0 || sglang_page_size == 0) return bad("sglang_page_size", "must be a positive multiple of 128");
  if (vllm_block_tokens % 128 != 0 || vllm_block_tokens == 0) return bad("vllm_block_tokens", "must be a positive multiple of 128");
  if (!(sglang_swa_full_tokens_ratio > 0 && sglang_swa_full_tokens_ratio <= 1)) {
    return bad("sglang_swa_full_tokens_ratio", "must be in (0, 1]");
  }
  if (selection_workload.empty()) return bad("selection_workload", "must name a C4 indexer workload");
  if (!(selection_sensitivity_query_keep > 0 && selection_sensitivity_query_keep <= 10)) {
    return bad("selection_sensitivity_query_keep", "must be in (0, 10]");
  }
  if (starvation_contexts.empty() || !std::is_sorted(starvation_contexts.begin(), starvation_contexts.end())) {
    return bad("starvation_contexts", "must be non-empty and ascending");
  }
  return Ok();
}

Result<KindCompareConfig> ParseKindCompareConfig(std::string_view json_text, std::string_view origin) {
  auto f = JsonFields::Parse(json_text, std::string(origin));
  if (!f) return std::unexpected(f.error());
  KindCompareConfig c;
  auto name = f->String("name");
  if (!name) return std::unexpected(name.error());
  c.name = *name;
  if (auto s = f->String("source"); !s) return std::unexpected(s.error());
  auto model = f->String("model");
  if (!model) return std::unexpected(model.error());
  c.model = *model;
  auto scenario = f->String("scenario");
  if (!scenario) return std::unexpected(scenario.error());
  c.scenario = *scenario;
  ULA_RETURN_IF_ERROR(UIntField(*f, "hidden_size", c.hidden_size));
  ULA_RETURN_IF_ERROR(UIntField(*f, "q_lora_rank", c.q_lora_rank));
  ULA_RETURN_IF_ERROR(UIntField(*f, "o_lora_rank", c.o_lora_rank));
  ULA_RETURN_IF_ERROR(UIntField(*f, "o_groups", c.o_groups));
  ULA_RETURN_IF_ERROR(UIntField(*f, "head_dim", c.head_dim));
  ULA_RETURN_IF_ERROR(UIntField(*f, "routed_experts", c.routed_experts));
  ULA_RETURN_IF_ERROR(UIntField(*f, "shared_experts", c.shared_experts, 0));
  ULA_RETURN_IF_ERROR(UIntField(*f, "experts_per_token", c.experts_per_token));
  ULA_RETURN_IF_ERROR(UIntField(*f, "moe_intermediate_size", c.moe_intermediate_size));
  ULA_RETURN_IF_ERROR(UIntField(*f, "vocab_size", c.vocab_size));
  ULA_RETURN_IF_ERROR(DoubleField(*f, "expert_bytes_per_param", c.expert_bytes_per_param, 0.1, 4));
  ULA_RETURN_IF_ERROR(DoubleField(*f, "linear_bytes_per_param", c.linear_bytes_per_param, 0.1, 4));
  ULA_RETURN_IF_ERROR(DoubleField(*f, "embedding_bytes_per_param", c.embedding_bytes_per_param, 0.1, 4));
  ULA_RETURN_IF_ERROR(DoubleField(*f, "compressor_params_per_compressed_layer", c.compressor_params_per_compressed_layer, 0, 1e10));
  ULA_RETURN_IF_ERROR(UIntField(*f, "sglang_page_size", c.sglang_page_size));
  ULA_RETURN_IF_ERROR(DoubleField(*f, "sglang_swa_full_tokens_ratio", c.sglang_swa_full_tokens_ratio, 1e-6, 1));
  ULA_RETURN_IF_ERROR(UIntField(*f, "sglang_c4_state_ring", c.sglang_c4_state_ring));
  ULA_RETURN_IF_ERROR(UIntField(*f, "sglang_c4_state_ring_mtp", c.sglang_c4_state_ring_mtp));
  ULA_RETURN_IF_ERROR(UIntField(*f, "sglang_c128_state_ring", c.sglang_c128_state_ring));
  ULA_RETURN_IF_ERROR(UIntField(*f, "sglang_c128_state_ring_mtp", c.sglang_c128_state_ring_mtp));
  ULA_RETURN_IF_ERROR(UIntField(*f, "sglang_state_dtype_bytes", c.sglang_state_dtype_bytes, 1, 8));
  ULA_RETURN_IF_ERROR(UIntField(*f, "sglang_max_running_requests", c.sglang_max_running_requests));
  ULA_RETURN_IF_ERROR(UIntField(*f, "vllm_block_tokens", c.vllm_block_tokens));
  ULA_RETURN_IF_ERROR(UIntField(*f, "vllm_page_alignment", c.vllm_page_alignment));
  ULA_RETURN_IF_ERROR(UIntField(*f, "vllm_window_blocks_extra", c.vllm_window_blocks_extra, 0, 16));
  auto workload = f->Object("selection_workload");
  if (!workload) return std::unexpected(workload.error());
  if (auto s = workload->String("source"); !s) return std::unexpected(s.error());
  auto workload_name = workload->String("value");
  if (!workload_name) return std::unexpected(workload_name.error());
  c.selection_workload = *workload_name;
  ULA_RETURN_IF_ERROR(workload->CheckNoUnknownFields());
  ULA_RETURN_IF_ERROR(DoubleField(*f, "selection_sensitivity_query_keep", c.selection_sensitivity_query_keep, 1e-6, 10));
  ULA_RETURN_IF_ERROR(UIntField(*f, "starvation_requests", c.starvation_requests, 1, 1 << 20));
  auto ctx = f->Object("starvation_contexts");
  if (!ctx) return std::unexpected(ctx.error());
  if (auto s = ctx->String("source"); !s) return std::unexpected(s.error());
  auto lens = ctx->UIntArray("value", 1, std::uint64_t{1} << 30);
  if (!lens) return std::unexpected(lens.error());
  for (std::uint64_t v : *lens) c.starvation_contexts.push_back(static_cast<std::uint32_t>(v));
  ULA_RETURN_IF_ERROR(ctx->CheckNoUnknownFields());
  ULA_RETURN_IF_ERROR(f->CheckNoUnknownFields());
  if (auto s = c.Validate(); !s) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("{}: {}", origin, s.error().message()));
  }
  return c;
}

Result<KindCompareConfig> LoadKindCompareConfigByName(std::string_view model, const std::filesystem::path& config_dir) {
  const std::filesystem::path path = config_dir / "kinds" / (std::string(model) + ".json");
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    std::string have;
    for (const auto& e : std::filesystem::directory_iterator(config_dir / "kinds", ec)) {
      if (e.path().extension() == ".json") have += (have.empty() ? "" : ", ") + e.path().stem().string();
    }
    return MakeError(ErrorCode::kNotFound, fmt::format("model '{}' has no per-kind comparison config ({}); models with one: {}",
                                                       model, path.string(), have.empty() ? "none" : have));
  }
  auto text = config_internal::ReadTextFile(path.string());
  if (!text) return std::unexpected(text.error());
  return ParseKindCompareConfig(*text, path.string());
}

}  // namespace ula

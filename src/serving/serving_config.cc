// Loading and validation of the serving-comparison configs (serving_config.h). Each loader
// reads fields through JsonFields so that a missing, mistyped, out-of-range or unknown field
// is an error naming the origin and the field; nested objects and arrays name their path
// ("configs[2].mode", "sampling.batch_grid[3]").
#include "serving/serving_config.h"

#include "workload/selection_fit.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "config/json_fields.h"

namespace ula {
namespace {

Status FieldError(std::string_view field, std::string_view problem) {
  return MakeError(ErrorCode::kInvalidArgument, fmt::format("field '{}': {}", field, problem));
}

Error Prefixed(std::string_view origin, const Error& e) {
  return Error(e.code(), fmt::format("{}: {}", origin, e.message()));
}

constexpr double kBig = 1e18;

// Reads a sourced positive integer into *out.
Status SourcedUInt(config_internal::JsonFields& f, const char* field, std::uint64_t min, std::uint64_t max,
                   std::uint32_t* out) {
  auto v = f.SourcedDouble(field, static_cast<double>(min), static_cast<double>(max));
  if (!v) return std::unexpected(v.error());
  if (*v != static_cast<double>(static_cast<std::uint64_t>(*v))) {
    return std::unexpected(f.FieldError(field, fmt::format("must be an integer, got {}", *v)));
  }
  *out = static_cast<std::uint32_t>(*v);
  return Ok();
}

}  // namespace

std::string_view ParallelModeName(ParallelMode mode) { return mode == ParallelMode::kTp ? "tp" : "dp"; }

Status ModelCostConfig::Validate() const {
  if (name.empty()) return FieldError("name", "must not be empty");
  if (hidden_size == 0) return FieldError("hidden_size", "must be >= 1");
  if (q_lora_rank == 0) return FieldError("q_lora_rank", "must be >= 1");
  if (qk_nope_head_dim == 0) return FieldError("qk_nope_head_dim", "must be >= 1");
  if (v_head_dim == 0) return FieldError("v_head_dim", "must be >= 1");
  if (vocab_size == 0) return FieldError("vocab_size", "must be >= 1");
  if (moe_intermediate_size == 0) return FieldError("moe_intermediate_size", "must be >= 1");
  if (routed_experts == 0) return FieldError("routed_experts", "must be >= 1");
  if (experts_per_token == 0 || experts_per_token > routed_experts) {
    return FieldError("experts_per_token", "must be in [1, routed_experts]");
  }
  if (!(weight_bytes_per_param > 0)) return FieldError("weight_bytes_per_param", "must be > 0");
  if (!(embedding_bytes_per_param > 0)) return FieldError("embedding_bytes_per_param", "must be > 0");
  return Ok();
}

Status ComputeRates::Validate() const {
  if (name.empty()) return FieldError("name", "must not be empty");
  if (!(dense_bf16_flops > 0)) return FieldError("dense_bf16_flops", "must be > 0");
  if (!(dense_fp8_flops > 0)) return FieldError("dense_fp8_flops", "must be > 0");
  if (!(sparse_decode_flops > 0)) return FieldError("sparse_decode_flops", "must be > 0");
  if (sparse_decode_head_multiple == 0) return FieldError("sparse_decode_head_multiple", "must be >= 1");
  if (!(host_link_scattered_bytes_per_s > 0)) return FieldError("host_link_scattered_bytes_per_s", "must be > 0");
  if (!(collective_base_latency_s >= 0)) return FieldError("collective_base_latency_s", "must be >= 0");
  if (!(collective_hop_latency_s >= 0)) return FieldError("collective_hop_latency_s", "must be >= 0");
  if (!(kernel_launch_s >= 0)) return FieldError("kernel_launch_s", "must be >= 0");
  if (!(planner_s_per_selection >= 0)) return FieldError("planner_s_per_selection", "must be >= 0");
  if (!(gemm_hbm_efficiency > 0 && gemm_hbm_efficiency <= 1)) return FieldError("gemm_hbm_efficiency", "must be in (0, 1]");
  if (!(grouped_gemm_flops >= 0)) return FieldError("grouped_gemm_flops", "must be >= 0");
  return Ok();
}

Status ScenarioConfig::Validate() const {
  if (name.empty()) return FieldError("name", "must not be empty");
  if (model.empty()) return FieldError("model", "must not be empty");
  if (model_costs.empty()) return FieldError("model_costs", "must not be empty");
  if (workload.empty()) return FieldError("workload", "must not be empty");
  if (selection_fit.empty()) return FieldError("selection.fit", "must not be empty");
  if (num_ranks == 0 || num_ranks > 64) return FieldError("num_ranks", "must be in [1, 64]");
  if (configs.empty()) return FieldError("configs", "must list at least one config");
  for (std::size_t i = 0; i < configs.size(); ++i) {
    if (configs[i].hardware.empty()) return FieldError(fmt::format("configs[{}].hardware", i), "must not be empty");
  }
  if (!(activation_reserve_fraction >= 0 && activation_reserve_fraction < 1)) {
    return FieldError("activation_reserve_fraction", "must be in [0, 1)");
  }
  if (!(mtp_acceptance_rate >= 0 && mtp_acceptance_rate <= 1)) return FieldError("mtp_acceptance_rate", "must be in [0, 1]");
  if (!(kernel_overhead_s_per_layer >= 0)) return FieldError("kernel_overhead_s_per_layer", "must be >= 0");
  if (planner_kernels_per_call == 0) return FieldError("planner_kernels_per_call", "must be >= 1");
  if (candidate_bytes == 0) return FieldError("candidate_bytes", "must be >= 1");
  if (hisparse_buffer_entries == 0) return FieldError("hisparse_buffer_entries", "must be >= 1");
  if (!(hisparse_host_to_device_ratio >= 1)) return FieldError("hisparse_host_to_device_ratio", "must be >= 1");
  if (helix_tokens_per_block == 0) return FieldError("helix_tokens_per_block", "must be >= 1");
  if (tp_buffer_entries_per_request == 0) return FieldError("tp_buffer_entries_per_request", "must be >= 1");
  if (tp_buffer_entries_per_request_mtp == 0) return FieldError("tp_buffer_entries_per_request_mtp", "must be >= 1");
  if (sampling.measure_steps == 0) return FieldError("sampling.measure_steps", "must be >= 1");
  if (sampling.batch_grid.empty()) return FieldError("sampling.batch_grid", "must not be empty");
  for (std::size_t i = 0; i < sampling.batch_grid.size(); ++i) {
    if (sampling.batch_grid[i] == 0) return FieldError(fmt::format("sampling.batch_grid[{}]", i), "must be >= 1");
    if (i > 0 && sampling.batch_grid[i] <= sampling.batch_grid[i - 1]) {
      return FieldError(fmt::format("sampling.batch_grid[{}]", i), "must be strictly ascending");
    }
  }
  if (sampling.max_requests == 0) return FieldError("sampling.max_requests", "must be >= 1");
  return Ok();
}

Result<ScenarioConfig> ParseScenarioConfig(std::string_view json_text, std::string_view origin_view) {
  const std::string origin(origin_view);
  auto fields = config_internal::JsonFields::Parse(json_text, origin);
  if (!fields) return std::unexpected(fields.error());
  config_internal::JsonFields& f = *fields;
  ScenarioConfig s;
  auto str = [&](const char* field, std::string* out) -> Status {
    auto v = f.String(field);
    if (!v) return std::unexpected(v.error());
    *out = *v;
    return Ok();
  };
  ULA_RETURN_IF_ERROR(str("name", &s.name));
  std::string source;
  ULA_RETURN_IF_ERROR(str("source", &source));
  ULA_RETURN_IF_ERROR(str("model", &s.model));
  ULA_RETURN_IF_ERROR(str("model_costs", &s.model_costs));
  ULA_RETURN_IF_ERROR(str("workload", &s.workload));
  auto ranks = f.UInt("num_ranks", 1, 64);
  if (!ranks) return std::unexpected(ranks.error());
  s.num_ranks = static_cast<std::uint32_t>(*ranks);

  // configs: an array of {hardware, mode, mtp}.
  auto parsed = nlohmann::json::parse(json_text, nullptr, false);  // already known to parse
  const nlohmann::json* list = parsed.contains("configs") ? &parsed["configs"] : nullptr;
  (void)f.String("configs", true);  // marks the field used (its type is checked below)
  if (list == nullptr || !list->is_array()) {
    return std::unexpected(f.FieldError("configs", "must be an array of {\"hardware\", \"mode\", \"mtp\"}"));
  }
  for (std::size_t i = 0; i < list->size(); ++i) {
    const std::string path = fmt::format("configs[{}]", i);
    const nlohmann::json& e = (*list)[i];
    if (!e.is_object()) return std::unexpected(f.FieldError(path, "must be an object"));
    ScenarioEntry entry;
    for (auto it = e.begin(); it != e.end(); ++it) {
      if (it.key() != "hardware" && it.key() != "mode" && it.key() != "mtp") {
        return std::unexpected(f.FieldError(path + "." + it.key(), "unknown field"));
      }
    }
    if (!e.contains("hardware") || !e["hardware"].is_string() || e["hardware"].get<std::string>().empty()) {
      return std::unexpected(f.FieldError(path + ".hardware", "must be a non-empty string"));
    }
    entry.hardware = e["hardware"].get<std::string>();
    const std::string mode = e.contains("mode") && e["mode"].is_string() ? e["mode"].get<std::string>() : "";
    if (mode == "tp") {
      entry.mode = ParallelMode::kTp;
    } else if (mode == "dp") {
      entry.mode = ParallelMode::kDp;
    } else {
      return std::unexpected(f.FieldError(path + ".mode", "must be \"tp\" or \"dp\""));
    }
    if (!e.contains("mtp") || !e["mtp"].is_boolean()) {
      return std::unexpected(f.FieldError(path + ".mtp", "must be true or false"));
    }
    entry.mtp = e["mtp"].get<bool>();
    s.configs.push_back(entry);
  }

  auto sourced = [&](const char* field, double min, double max, double* out) -> Status {
    auto v = f.SourcedDouble(field, min, max);
    if (!v) return std::unexpected(v.error());
    *out = *v;
    return Ok();
  };
  ULA_RETURN_IF_ERROR(sourced("activation_reserve_fraction", 0, 0.99, &s.activation_reserve_fraction));
  ULA_RETURN_IF_ERROR(sourced("mtp_acceptance_rate", 0, 1, &s.mtp_acceptance_rate));
  ULA_RETURN_IF_ERROR(sourced("kernel_overhead_s_per_layer", 0, 1, &s.kernel_overhead_s_per_layer));
  ULA_RETURN_IF_ERROR(SourcedUInt(f, "planner_kernels_per_call", 1, 64, &s.planner_kernels_per_call));
  ULA_RETURN_IF_ERROR(SourcedUInt(f, "candidate_bytes", 1, 64, &s.candidate_bytes));
  ULA_RETURN_IF_ERROR(SourcedUInt(f, "indexer_logit_bytes", 0, 8, &s.indexer_logit_bytes));
  auto uint = [&](const char* field, std::uint64_t min, std::uint64_t max, std::uint32_t* out) -> Status {
    auto v = f.UInt(field, min, max);
    if (!v) return std::unexpected(v.error());
    *out = static_cast<std::uint32_t>(*v);
    return Ok();
  };
  ULA_RETURN_IF_ERROR(uint("hisparse_buffer_entries", 1, 1u << 24, &s.hisparse_buffer_entries));
  ULA_RETURN_IF_ERROR(sourced("hisparse_host_to_device_ratio", 1, 1e6, &s.hisparse_host_to_device_ratio));
  {
    std::uint32_t match = 0;
    ULA_RETURN_IF_ERROR(SourcedUInt(f, "hisparse_match_host_budget", 0, 1, &match));
    s.hisparse_match_host_budget = match == 1;
  }
  {
    std::uint32_t prefetch = 0;
    ULA_RETURN_IF_ERROR(SourcedUInt(f, "hisparse_shared_index_prefetch", 0, 1, &prefetch));
    s.hisparse_shared_index_prefetch = prefetch == 1;
  }
  ULA_RETURN_IF_ERROR(SourcedUInt(f, "helix_tokens_per_block", 1, 1u << 16, &s.helix_tokens_per_block));
  ULA_RETURN_IF_ERROR(SourcedUInt(f, "vllm_hisparse_tail_entries", 0, 1u << 20, &s.vllm_hisparse_tail_entries));
  ULA_RETURN_IF_ERROR(SourcedUInt(f, "vllm_max_num_batched_tokens", 0, 1u << 20, &s.vllm_max_num_batched_tokens));
  ULA_RETURN_IF_ERROR(SourcedUInt(f, "vllm_max_concurrent_batches", 1, 16, &s.vllm_max_concurrent_batches));
  ULA_RETURN_IF_ERROR(SourcedUInt(f, "cuda_graph_max_batch", 0, 1u << 20, &s.cuda_graph_max_batch));
  ULA_RETURN_IF_ERROR(sourced("trtllm_offload_gpu_cache_factor", 1, 1e3, &s.trtllm_offload_gpu_cache_factor));
  ULA_RETURN_IF_ERROR(SourcedUInt(f, "trtllm_offload_tokens_per_page", 1, 1u << 16, &s.trtllm_offload_tokens_per_page));
  ULA_RETURN_IF_ERROR(uint("tp_buffer_entries_per_request", 1, 1u << 24, &s.tp_buffer_entries_per_request));
  ULA_RETURN_IF_ERROR(uint("tp_buffer_entries_per_request_mtp", 1, 1u << 24, &s.tp_buffer_entries_per_request_mtp));

  // selection: {fit, seed}: the fitted parameter set configs/selection/<fit>.json
  // (selection_fit.h; loaded by ResolveScenarioSelection, never copied into a scenario) and
  // the seed of this scenario's selection draws.
  (void)f.String("selection", true);
  if (!parsed.contains("selection") || !parsed["selection"].is_object()) {
    return std::unexpected(f.FieldError("selection", "must be an object {\"fit\": NAME, \"seed\": S}"));
  }
  {
    auto sel = config_internal::JsonFields::FromObject(parsed["selection"], origin + ": field 'selection'");
    if (!sel) return std::unexpected(sel.error());
    auto fit = sel->String("fit");
    if (!fit) return std::unexpected(fit.error());
    auto seed = sel->UInt("seed", 0, ~std::uint64_t{0});
    if (!seed) return std::unexpected(seed.error());
    ULA_RETURN_IF_ERROR(sel->CheckNoUnknownFields());
    s.selection_fit = *fit;
    s.selection_seed = *seed;
  }
  // sampling: {warmup_steps, measure_steps, batch_grid, max_requests, seed}
  (void)f.String("sampling", true);
  if (!parsed.contains("sampling") || !parsed["sampling"].is_object()) {
    return std::unexpected(f.FieldError("sampling", "must be an object"));
  }
  {
    const nlohmann::json& obj = parsed["sampling"];
    auto sm = config_internal::JsonFields::FromObject(obj, origin + ": field 'sampling'");
    if (!sm) return std::unexpected(sm.error());
    auto warm = sm->UInt("warmup_steps", 0, 1000);
    if (!warm) return std::unexpected(warm.error());
    auto meas = sm->UInt("measure_steps", 1, 1000);
    if (!meas) return std::unexpected(meas.error());
    auto maxr = sm->UInt("max_requests", 1, 1u << 20);
    if (!maxr) return std::unexpected(maxr.error());
    auto seed = sm->UInt("seed", 0, ~std::uint64_t{0});
    if (!seed) return std::unexpected(seed.error());
    (void)sm->String("batch_grid", true);
    ULA_RETURN_IF_ERROR(sm->CheckNoUnknownFields());
    if (!obj.contains("batch_grid") || !obj["batch_grid"].is_array()) {
      return std::unexpected(f.FieldError("sampling.batch_grid", "must be an array of batch sizes"));
    }
    for (std::size_t i = 0; i < obj["batch_grid"].size(); ++i) {
      const nlohmann::json& b = obj["batch_grid"][i];
      if (!b.is_number_unsigned() || b.get<std::uint64_t>() == 0 || b.get<std::uint64_t>() > (1u << 20)) {
        return std::unexpected(f.FieldError(fmt::format("sampling.batch_grid[{}]", i), "must be an integer in [1, 2^20]"));
      }
      s.sampling.batch_grid.push_back(static_cast<std::uint32_t>(b.get<std::uint64_t>()));
    }
    s.sampling.warmup_steps = static_cast<std::uint32_t>(*warm);
    s.sampling.measure_steps = static_cast<std::uint32_t>(*meas);
    s.sampling.max_requests = static_cast<std::uint32_t>(*maxr);
    s.sampling.seed = *seed;
  }
  ULA_RETURN_IF_ERROR(f.CheckNoUnknownFields());
  if (auto st = s.Validate(); !st) return std::unexpected(Prefixed(origin, st.error()));
  return s;
}

Status ResolveScenarioSelection(ScenarioConfig& scenario, const std::filesystem::path& config_dir) {
  auto fit = LoadSelectionFitByName(scenario.selection_fit, config_dir);
  if (!fit) return std::unexpected(fit.error());
  scenario.selection = fit->params;
  scenario.selection.seed = scenario.selection_seed;
  if (scenario.selection_adjust) {
    scenario.selection_adjust(scenario.selection);
    ULA_RETURN_IF_ERROR(scenario.selection.Validate());
  }
  return Ok();
}

Result<ScenarioConfig> LoadScenarioConfig(const std::filesystem::path& path, const std::filesystem::path& config_dir) {
  auto text = config_internal::ReadTextFile(path.string());
  if (!text) return std::unexpected(text.error());
  auto s = ParseScenarioConfig(*text, path.string());
  if (!s) return s;
  ULA_RETURN_IF_ERROR(ResolveScenarioSelection(*s, config_dir));
  return s;
}

Result<ModelCostConfig> ParseModelCostConfig(std::string_view json_text, std::string_view origin_view) {
  const std::string origin(origin_view);
  auto fields = config_internal::JsonFields::Parse(json_text, origin);
  if (!fields) return std::unexpected(fields.error());
  config_internal::JsonFields& f = *fields;
  ModelCostConfig m;
  auto name = f.String("name");
  if (!name) return std::unexpected(name.error());
  m.name = *name;
  auto source = f.String("source");
  if (!source) return std::unexpected(source.error());
  struct U {
    const char* field;
    std::uint32_t* out;
    std::uint64_t min;
  };
  const U ints[] = {
      {"hidden_size", &m.hidden_size, 1},
      {"q_lora_rank", &m.q_lora_rank, 1},
      {"qk_nope_head_dim", &m.qk_nope_head_dim, 1},
      {"v_head_dim", &m.v_head_dim, 1},
      {"vocab_size", &m.vocab_size, 1},
      {"dense_intermediate_size", &m.dense_intermediate_size, 0},
      {"first_dense_layers", &m.first_dense_layers, 0},
      {"moe_intermediate_size", &m.moe_intermediate_size, 1},
      {"routed_experts", &m.routed_experts, 1},
      {"shared_experts", &m.shared_experts, 0},
      {"experts_per_token", &m.experts_per_token, 1},
  };
  for (const U& u : ints) ULA_RETURN_IF_ERROR(SourcedUInt(f, u.field, u.min, 1u << 24, u.out));
  auto wb = f.SourcedDouble("weight_bytes_per_param", 0.125, 8);
  if (!wb) return std::unexpected(wb.error());
  m.weight_bytes_per_param = *wb;
  auto eb = f.SourcedDouble("embedding_bytes_per_param", 0.125, 8);
  if (!eb) return std::unexpected(eb.error());
  m.embedding_bytes_per_param = *eb;
  ULA_RETURN_IF_ERROR(f.CheckNoUnknownFields());
  if (auto st = m.Validate(); !st) return std::unexpected(Prefixed(origin, st.error()));
  return m;
}

Result<ModelCostConfig> LoadModelCostConfigByName(std::string_view name, const std::filesystem::path& config_dir) {
  const auto path = config_dir / "costs" / (std::string(name) + ".json");
  auto text = config_internal::ReadTextFile(path.string());
  if (!text) return std::unexpected(text.error());
  return ParseModelCostConfig(*text, path.string());
}

Result<ComputeRates> ParseComputeRates(std::string_view json_text, std::string_view origin_view) {
  const std::string origin(origin_view);
  auto fields = config_internal::JsonFields::Parse(json_text, origin);
  if (!fields) return std::unexpected(fields.error());
  config_internal::JsonFields& f = *fields;
  ComputeRates r;
  auto name = f.String("name");
  if (!name) return std::unexpected(name.error());
  r.name = *name;
  auto bf16 = f.SourcedDouble("dense_bf16_flops", 1, kBig);
  if (!bf16) return std::unexpected(bf16.error());
  auto fp8 = f.SourcedDouble("dense_fp8_flops", 1, kBig);
  if (!fp8) return std::unexpected(fp8.error());
  r.dense_bf16_flops = *bf16;
  r.dense_fp8_flops = *fp8;
  struct D {
    const char* field;
    double min, max;
    double* out;
  };
  const D doubles[] = {
      {"sparse_decode_flops", 1, kBig, &r.sparse_decode_flops},
      {"host_link_scattered_bytes_per_s", 1, kBig, &r.host_link_scattered_bytes_per_s},
      {"collective_base_latency_s", 0, 1, &r.collective_base_latency_s},
      {"collective_hop_latency_s", 0, 1, &r.collective_hop_latency_s},
      {"kernel_launch_s", 0, 1, &r.kernel_launch_s},
      {"planner_s_per_selection", 0, 1, &r.planner_s_per_selection},
      {"gemm_hbm_efficiency", 1e-3, 1, &r.gemm_hbm_efficiency},
      {"grouped_gemm_flops", 1, kBig, &r.grouped_gemm_flops},
  };
  for (const D& d : doubles) {
    auto v = f.SourcedDouble(d.field, d.min, d.max);
    if (!v) return std::unexpected(v.error());
    *d.out = *v;
  }
  ULA_RETURN_IF_ERROR(SourcedUInt(f, "sparse_decode_head_multiple", 1, 1024, &r.sparse_decode_head_multiple));
  ULA_RETURN_IF_ERROR(
      SourcedUInt(f, "vllm_max_cudagraph_capture_size", 0, 1u << 20, &r.vllm_max_cudagraph_capture_size));
  ULA_RETURN_IF_ERROR(f.CheckNoUnknownFields());
  if (auto st = r.Validate(); !st) return std::unexpected(Prefixed(origin, st.error()));
  return r;
}

Result<ComputeRates> LoadComputeRatesByName(std::string_view name, const std::filesystem::path& config_dir) {
  const auto path = config_dir / "costs" / (std::string(name) + ".json");
  auto text = config_internal::ReadTextFile(path.string());
  if (!text) return std::unexpected(text.error());
  return ParseComputeRates(*text, path.string());
}

}  // namespace ula

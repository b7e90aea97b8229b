// Workload config loading and the seeded request-stream generator (workload.h).
#include "workload/workload.h"

#include <fmt/format.h>

#include "config/json_fields.h"
#include "workload/rng.h"

namespace ula {
namespace {

Status FieldError(std::string_view field, std::string_view problem) {
  return MakeError(ErrorCode::kInvalidArgument, fmt::format("field '{}': {}", field, problem));
}

}  // namespace

Status WorkloadConfig::Validate() const {
  if (name.empty()) return FieldError("name", "must not be empty");
  if (num_requests == 0) return FieldError("num_requests", "must be >= 1");
  if (min_input_tokens == 0) return FieldError("min_input_tokens", "must be >= 1");
  if (max_input_tokens < min_input_tokens) return FieldError("max_input_tokens", "must be >= min_input_tokens");
  if (min_output_tokens == 0) return FieldError("min_output_tokens", "must be >= 1");
  if (max_output_tokens < min_output_tokens) return FieldError("max_output_tokens", "must be >= min_output_tokens");
  if (std::uint64_t{max_input_tokens} + max_output_tokens > 0xffffffffull) {
    return FieldError("max_output_tokens", "input + output tokens must fit in 32 bits");
  }
  if (!(arrival_rate_per_s >= 0) || !std::isfinite(arrival_rate_per_s)) {
    return FieldError("arrival_rate_per_s", "must be finite and >= 0");
  }
  if (draft_tokens > 16) return FieldError("draft_tokens", "must be <= 16");
  return Ok();
}

Result<WorkloadConfig> ParseWorkloadConfig(std::string_view json_text, std::string_view origin) {
  auto fields = config_internal::JsonFields::Parse(json_text, std::string(origin));
  if (!fields) return std::unexpected(fields.error());
  WorkloadConfig w;
  auto name = fields->String("name");
  if (!name) return std::unexpected(name.error());
  w.name = *name;
  if (auto source = fields->String("source"); !source) return std::unexpected(source.error());
  auto seed = fields->UInt("seed", 0, ~std::uint64_t{0});
  if (!seed) return std::unexpected(seed.error());
  w.seed = *seed;
  struct U32Field {
    const char* name;
    std::uint32_t* out;
    std::uint64_t min, max;
  };
  const U32Field u32_fields[] = {
      {"num_requests", &w.num_requests, 1, 0xffffffffu},
      {"min_input_tokens", &w.min_input_tokens, 1, 0xffffffffu},
      {"max_input_tokens", &w.max_input_tokens, 1, 0xffffffffu},
      {"min_output_tokens", &w.min_output_tokens, 1, 0xffffffffu},
      {"max_output_tokens", &w.max_output_tokens, 1, 0xffffffffu},
      {"draft_tokens", &w.draft_tokens, 0, 16},
  };
  for (const U32Field& f : u32_fields) {
    auto v = fields->UInt(f.name, f.min, f.max);
    if (!v) return std::unexpected(v.error());
    *f.out = static_cast<std::uint32_t>(*v);
  }
  auto rate = fields->Double("arrival_rate_per_s", 0, 1e12);
  if (!rate) return std::unexpected(rate.error());
  w.arrival_rate_per_s = *rate;
  ULA_RETURN_IF_ERROR(fields->CheckNoUnknownFields());
  if (auto st = w.Validate(); !st) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("{}: {}", origin, st.error().message()));
  }
  return w;
}

Result<WorkloadConfig> LoadWorkloadConfig(const std::filesystem::path& path) {
  auto text = config_internal::ReadTextFile(path.string());
  if (!text) return std::unexpected(text.error());
  return ParseWorkloadConfig(*text, path.string());
}

Result<WorkloadConfig> LoadWorkloadConfigByName(std::string_view name, const std::filesystem::path& config_dir) {
  return LoadWorkloadConfig(config_dir / "workloads" / (std::string(name) + ".json"));
}

Result<std::vector<RequestSpec>> GenerateWorkload(const WorkloadConfig& config) {
  ULA_RETURN_IF_ERROR(config.Validate());
  workload_internal::Rng rng(config.seed);
  std::vector<RequestSpec> out(config.num_requests);
  double t = 0;
  for (std::uint32_t i = 0; i < config.num_requests; ++i) {
    if (i > 0 && config.arrival_rate_per_s > 0) t += rng.Exponential(config.arrival_rate_per_s);
    out[i].id = RequestId(i);
    out[i].arrival_s = t;
    out[i].input_tokens = static_cast<std::uint32_t>(rng.Between(config.min_input_tokens, config.max_input_tokens));
    out[i].output_tokens =
        static_cast<std::uint32_t>(rng.Between(config.min_output_tokens, config.max_output_tokens));
  }
  return out;
}

}  // namespace ula

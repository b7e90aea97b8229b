// configs/selection/<name>.json (selection_fit.h).
#include "workload/selection_fit.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "config/json_fields.h"

namespace ula {

Result<SelectionFit> ParseSelectionFit(std::string_view json_text, std::string_view origin_view) {
  const std::string origin(origin_view);
  auto fields = config_internal::JsonFields::Parse(json_text, origin);
  if (!fields) return std::unexpected(fields.error());
  config_internal::JsonFields& f = *fields;
  SelectionFit fit;
  auto name = f.String("name");
  if (!name) return std::unexpected(name.error());
  fit.name = *name;
  auto source = f.String("source");
  if (!source) return std::unexpected(source.error());
  fit.source = *source;
  SelectionModelParams& p = fit.params;
  struct U {
    const char* field;
    std::uint32_t* out;
    std::uint64_t min, max;
  };
  const U ints[] = {{"top_k", &p.top_k, 1, 1u << 24},
                    {"sink_tokens", &p.sink_tokens, 0, 1u << 20},
                    {"recent_tokens", &p.recent_tokens, 0, 1u << 20},
                    {"return_window", &p.return_window, 1, 64}};
  for (const U& u : ints) {
    auto v = f.UInt(u.field, u.min, u.max);
    if (!v) return std::unexpected(v.error());
    *u.out = static_cast<std::uint32_t>(*v);
  }
  struct D {
    const char* field;
    double* out;
    double min, max;
  };
  const D doubles[] = {{"keep_mean", &p.keep_mean, 0, 1},        {"keep_stddev", &p.keep_stddev, 0, 1},
                       {"draft_keep", &p.draft_keep, 0, 1},      {"heavy_skew", &p.heavy_skew, 0, 4},
                       {"return_fraction", &p.return_fraction, 0, 1}};
  for (const D& d : doubles) {
    auto v = f.Double(d.field, d.min, d.max);
    if (!v) return std::unexpected(v.error());
    *d.out = *v;
  }
  auto seed = f.UInt("seed", 0, ~std::uint64_t{0});
  if (!seed) return std::unexpected(seed.error());
  p.seed = *seed;
  ULA_RETURN_IF_ERROR(f.CheckNoUnknownFields());
  if (auto st = p.Validate(); !st) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("{}: {}", origin, st.error().message()));
  }
  return fit;
}

Result<SelectionFit> LoadSelectionFit(const std::filesystem::path& path) {
  auto text = config_internal::ReadTextFile(path.string());
  if (!text) return std::unexpected(text.error());
  return ParseSelectionFit(*text, path.string());
}

Result<SelectionFit> LoadSelectionFitByName(std::string_view name, const std::filesystem::path& config_dir) {
  return LoadSelectionFit(config_dir / "selection" / (std::string(name) + ".json"));
}

std::string SelectionFitJson(const SelectionFit& fit) {
  const SelectionModelParams& p = fit.params;
  nlohmann::ordered_json j;
  j["name"] = fit.name;
  j["source"] = fit.source;
  j["top_k"] = p.top_k;
  j["sink_tokens"] = p.sink_tokens;
  j["recent_tokens"] = p.recent_tokens;
  j["keep_mean"] = p.keep_mean;
  j["keep_stddev"] = p.keep_stddev;
  j["draft_keep"] = p.draft_keep;
  j["heavy_skew"] = p.heavy_skew;
  j["return_fraction"] = p.return_fraction;
  j["return_window"] = p.return_window;
  j["seed"] = p.seed;
  return j.dump(2) + "\n";
}

}  // namespace ula

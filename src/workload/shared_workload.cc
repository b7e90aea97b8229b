// Sharing workloads: config loading, the seeded generator and the sharing measure
// (shared_workload.h).
#include "workload/shared_workload.h"

#include <fmt/format.h>

#include <cmath>
#include <unordered_set>

#include "config/json_fields.h"
#include "workload/rng.h"

namespace ula {
namespace {

Status FieldError(std::string_view field, std::string_view problem) {
  return MakeError(ErrorCode::kInvalidArgument, fmt::format("field '{}': {}", field, problem));
}

// Token id streams: group g's shared tokens and request r's own / output tokens.
std::uint32_t TokenId(std::uint64_t seed, std::uint64_t stream, std::uint64_t i) {
  std::uint64_t s = workload_internal::StreamSeed(seed, stream) ^ (i * 0x9e3779b97f4a7c15ull);
  return static_cast<std::uint32_t>(workload_internal::SplitMix64(s));
}
constexpr std::uint64_t kGroupStream = 1ull << 40, kOwnStream = 2ull << 40, kOutputStream = 3ull << 40;

}  // namespace

const char* SharingKindName(SharingKind kind) {
  switch (kind) {
    case SharingKind::kSummariesPerDocument: return "summaries_per_document";
    case SharingKind::kSharedSystemPrompt: return "shared_system_prompt";
    case SharingKind::kMultiTurn: return "multi_turn";
  }
  return "?";
}

Status SharedWorkloadConfig::Validate() const {
  if (name.empty()) return FieldError("name", "must not be empty");
  if (groups == 0) return FieldError("groups", "must be >= 1");
  if (requests_per_group == 0) return FieldError("requests_per_group", "must be >= 1");
  if (std::uint64_t{groups} * requests_per_group > (1u << 24)) return FieldError("requests_per_group", "groups x requests_per_group must be <= 2^24");
  if (min_shared_tokens == 0) return FieldError("min_shared_tokens", "must be >= 1");
  if (max_shared_tokens < min_shared_tokens) return FieldError("max_shared_tokens", "must be >= min_shared_tokens");
  if (min_own_tokens == 0) return FieldError("min_own_tokens", "must be >= 1");
  if (max_own_tokens < min_own_tokens) return FieldError("max_own_tokens", "must be >= min_own_tokens");
  if (min_output_tokens == 0) return FieldError("min_output_tokens", "must be >= 1");
  if (max_output_tokens < min_output_tokens) return FieldError("max_output_tokens", "must be >= min_output_tokens");
  if (draft_tokens > 16) return FieldError("draft_tokens", "must be <= 16");
  // The longest input: a multi-turn session's last turn.
  const std::uint64_t per_turn = std::uint64_t{max_own_tokens} + max_output_tokens;
  const std::uint64_t longest = kind == SharingKind::kMultiTurn
                                    ? max_shared_tokens + per_turn * requests_per_group
                                    : std::uint64_t{max_shared_tokens} + max_own_tokens + max_output_tokens;
  if (longest > (1u << 24)) return FieldError("max_shared_tokens", "a request's tokens must be <= 2^24");
  return Ok();
}

Result<SharedWorkloadConfig> ParseSharedWorkloadConfig(std::string_view json_text, std::string_view origin) {
  auto fields = config_internal::JsonFields::Parse(json_text, std::string(origin));
  if (!fields) return std::unexpected(fields.error());
  SharedWorkloadConfig w;
  auto name = fields->String("name");
  if (!name) return std::unexpected(name.error());
  w.name = *name;
  if (auto source = fields->String("source"); !source) return std::unexpected(source.error());
  auto kind = fields->String("sharing");
  if (!kind) return std::unexpected(kind.error());
  if (*kind == "summaries_per_document") {
    w.kind = SharingKind::kSummariesPerDocument;
  } else if (*kind == "shared_system_prompt") {
    w.kind = SharingKind::kSharedSystemPrompt;
  } else if (*kind == "multi_turn") {
    w.kind = SharingKind::kMultiTurn;
  } else {
    return std::unexpected(fields->FieldError(
        "sharing", fmt::format("'{}' is not summaries_per_document, shared_system_prompt or multi_turn", *kind)));
  }
  auto seed = fields->UInt("seed", 0, ~std::uint64_t{0});
  if (!seed) return std::unexpected(seed.error());
  w.seed = *seed;
  struct U32Field {
    const char* name;
    std::uint32_t* out;
    double min, max;
  };
  const U32Field u32_fields[] = {
      {"groups", &w.groups, 1, 1 << 24},
      {"requests_per_group", &w.requests_per_group, 1, 1 << 24},
      {"min_shared_tokens", &w.min_shared_tokens, 1, 1 << 24},
      {"max_shared_tokens", &w.max_shared_tokens, 1, 1 << 24},
      {"min_own_tokens", &w.min_own_tokens, 1, 1 << 24},
      {"max_own_tokens", &w.max_own_tokens, 1, 1 << 24},
      {"min_output_tokens", &w.min_output_tokens, 1, 1 << 24},
      {"max_output_tokens", &w.max_output_tokens, 1, 1 << 24},
      {"draft_tokens", &w.draft_tokens, 0, 16},
  };
  for (const U32Field& f : u32_fields) {
    auto v = fields->SourcedDouble(f.name, f.min, f.max);  // every statistic names its source
    if (!v) return std::unexpected(v.error());
    if (*v != std::floor(*v)) return std::unexpected(fields->FieldError(f.name, fmt::format("{} is not an integer", *v)));
    *f.out = static_cast<std::uint32_t>(*v);
  }
  ULA_RETURN_IF_ERROR(fields->CheckNoUnknownFields());
  if (auto st = w.Validate(); !st) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("{}: {}", origin, st.error().message()));
  }
  return w;
}

Result<bool> IsSharedWorkload(std::string_view name, const std::filesystem::path& config_dir) {
  auto text = config_internal::ReadTextFile((config_dir / "workloads" / (std::string(name) + ".json")).string());
  if (!text) return std::unexpected(text.error());
  try {
    const auto j = nlohmann::json::parse(*text);
    return j.is_object() && j.contains("sharing");
  } catch (const nlohmann::json::exception& e) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("workload {}: {}", name, e.what()));
  }
}

Result<SharedWorkloadConfig> LoadSharedWorkloadConfigByName(std::string_view name, const std::filesystem::path& config_dir) {
  const auto path = config_dir / "workloads" / (std::string(name) + ".json");
  auto text = config_internal::ReadTextFile(path.string());
  if (!text) return std::unexpected(text.error());
  return ParseSharedWorkloadConfig(*text, path.string());
}

Result<std::vector<SharedRequest>> GenerateSharedWorkload(const SharedWorkloadConfig& config) {
  ULA_RETURN_IF_ERROR(config.Validate());
  workload_internal::Rng rng(config.seed);
  std::vector<SharedRequest> out;
  out.reserve(std::size_t{config.groups} * config.requests_per_group);
  for (std::uint32_t g = 0; g < config.groups; ++g) {
    const std::uint32_t shared = static_cast<std::uint32_t>(rng.Between(config.min_shared_tokens, config.max_shared_tokens));
    std::vector<std::uint32_t> history;  // multi-turn: the session so far (inputs and outputs)
    for (std::uint32_t i = 0; i < shared; ++i) history.push_back(TokenId(config.seed, kGroupStream + g, i));
    for (std::uint32_t k = 0; k < config.requests_per_group; ++k) {
      SharedRequest r;
      r.id = RequestId(out.size());
      r.group = g;
      const std::uint64_t stream = r.id.value();
      const std::uint32_t own = static_cast<std::uint32_t>(rng.Between(config.min_own_tokens, config.max_own_tokens));
      r.output_tokens = static_cast<std::uint32_t>(rng.Between(config.min_output_tokens, config.max_output_tokens));
      if (config.kind == SharingKind::kMultiTurn) {
        // Turn 0 is the first user message itself (its shared part has no earlier sharer);
        // turn k > 0 re-sends the whole session so far, then adds its new user tokens.
        r.shared_tokens = k == 0 ? 0 : static_cast<std::uint32_t>(history.size());
        r.tokens = history;
        if (k > 0) {
          for (std::uint32_t i = 0; i < own; ++i) r.tokens.push_back(TokenId(config.seed, kOwnStream + stream, i));
        }
        history = r.tokens;
        for (std::uint32_t i = 0; i < r.output_tokens; ++i) history.push_back(TokenId(config.seed, kOutputStream + stream, i));
      } else {
        r.shared_tokens = k == 0 ? 0 : shared;
        r.tokens.assign(history.begin(), history.begin() + shared);
        for (std::uint32_t i = 0; i < own; ++i) r.tokens.push_back(TokenId(config.seed, kOwnStream + stream, i));
      }
      out.push_back(std::move(r));
    }
  }
  return out;
}

SharingStats MeasureSharing(std::span<const SharedRequest> requests) {
  SharingStats s;
  std::unordered_set<std::uint64_t> prefixes;  // one hash per distinct prefix (trie position)
  for (const SharedRequest& r : requests) {
    ++s.requests;
    s.input_tokens += r.tokens.size();
    std::uint64_t h = 0x51ed270b27a5f1d3ull;
    for (std::uint32_t t : r.tokens) {
      std::uint64_t state = h ^ (std::uint64_t{t} * 0xff51afd7ed558ccdull);
      h = workload_internal::SplitMix64(state);
      prefixes.insert(h);
    }
  }
  s.distinct_tokens = prefixes.size();
  return s;
}

}  // namespace ula

// SharedWorkload: seeded request streams whose token prefixes are shared, with
// the token ids themselves, so that a prefix cache can match them. Three kinds:
//   summaries_per_document  groups = documents; each document is asked requests_per_group
//                           times (Multi-LexSum: a long, a short and a tiny summary per
//                           case); request = the document + its own instruction;
//   shared_system_prompt    groups = system prompts; request = the prompt + its own user
//                           turn;
//   multi_turn              groups = sessions; turn t's input = turn t-1's input + turn
//                           t-1's output + the new user tokens (agents re-send history).
// Parameters live in configs/workloads/<name>.json with "sharing": "<kind>"; every
// statistic is {"value": x, "source": "..."} (JsonFields::SourcedDouble), naming where the
// number comes from.
//
// Token ids. Group g's shared tokens and request r's own tokens are distinct streams of a
// seeded hash (never equal across groups or requests except by the hash's own collisions,
// 2^-32 per pair), so the only shared prefixes are the ones the kind defines.
//
// Determinism: a pure function of the config (workload/rng.h), as GenerateWorkload.
// Invariants of the output: ids 0..n-1 in group-major order (group 0's requests first);
// every request's shared part is a prefix of its tokens; lengths inside their ranges.
// Thread-safety: reentrant.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ula/error.h"
#include "ula/ids.h"

namespace ula {

enum class SharingKind : std::uint8_t { kSummariesPerDocument, kSharedSystemPrompt, kMultiTurn };
const char* SharingKindName(SharingKind kind);

struct SharedWorkloadConfig {
  std::string name = "shared";
  SharingKind kind = SharingKind::kSummariesPerDocument;
  std::uint64_t seed = 1;
  std::uint32_t groups = 0;              // documents / system prompts / sessions
  std::uint32_t requests_per_group = 0;  // summaries / users / turns
  std::uint32_t min_shared_tokens = 0, max_shared_tokens = 0;  // document / prompt / first turn
  std::uint32_t min_own_tokens = 0, max_own_tokens = 0;        // instruction / user turn / new turn tokens
  std::uint32_t min_output_tokens = 0, max_output_tokens = 0;
  std::uint32_t draft_tokens = 0;

  // Names the first bad field.
  Status Validate() const;
  std::uint32_t queries_per_step() const { return 1 + draft_tokens; }
};

struct SharedRequest {
  RequestId id;
  std::uint32_t group = 0;
  std::uint32_t shared_tokens = 0;     // the prefix it shares with the group's earlier requests
  std::vector<std::uint32_t> tokens;   // its whole input
  std::uint32_t output_tokens = 0;
};

// Tokens of all inputs vs. distinct tokens (positions of the union trie of the inputs):
// what a perfect prefix cache stores once.
struct SharingStats {
  std::uint64_t requests = 0;
  std::uint64_t input_tokens = 0;
  std::uint64_t distinct_tokens = 0;
  double shared_fraction() const { return input_tokens ? 1.0 - double(distinct_tokens) / double(input_tokens) : 0; }
};

Result<SharedWorkloadConfig> ParseSharedWorkloadConfig(std::string_view json_text, std::string_view origin = "workload config");
// Ok(true) when configs/workloads/<name>.json has a "sharing" field.
Result<bool> IsSharedWorkload(std::string_view name, const std::filesystem::path& config_dir);
Result<SharedWorkloadConfig> LoadSharedWorkloadConfigByName(std::string_view name, const std::filesystem::path& config_dir);

Result<std::vector<SharedRequest>> GenerateSharedWorkload(const SharedWorkloadConfig& config);
// Over the first n requests (all when n exceeds them). O(total tokens).
SharingStats MeasureSharing(std::span<const SharedRequest> requests);

}  // namespace ula

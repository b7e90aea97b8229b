// Workload: a seeded long-document-summarization request stream (docs/WORKLOADS.md: 64K-128K
// input tokens, a few hundred output tokens, speculative decoding with 2 draft tokens on
// and off). Parameters live in configs/workloads/<name>.json.
//
// Determinism: GenerateWorkload is a pure function of the config (its own generator, no
// std:: distributions), so a seed names the same requests on every platform.
// Invariants of the output: ids 0..n-1 in arrival order; arrivals non-decreasing, the first
// at 0; every length inside its configured range.
//
// Thread-safety: reentrant.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "ula/error.h"
#include "ula/ids.h"

namespace ula {

struct WorkloadConfig {
  std::string name = "workload";
  std::uint64_t seed = 1;
  std::uint32_t num_requests = 0;
  std::uint32_t min_input_tokens = 0;
  std::uint32_t max_input_tokens = 0;
  std::uint32_t min_output_tokens = 0;
  std::uint32_t max_output_tokens = 0;
  double arrival_rate_per_s = 0;  // Poisson arrivals; 0 = every request arrives at 0
  std::uint32_t draft_tokens = 0; // speculative decoding: 1 + draft_tokens queries per step

  // Names the first bad field.
  Status Validate() const;
  std::uint32_t queries_per_step() const { return 1 + draft_tokens; }
};

struct RequestSpec {
  RequestId id;
  std::uint32_t input_tokens = 0;
  std::uint32_t output_tokens = 0;
  double arrival_s = 0;
};

Result<WorkloadConfig> ParseWorkloadConfig(std::string_view json_text, std::string_view origin = "workload config");
Result<WorkloadConfig> LoadWorkloadConfig(const std::filesystem::path& path);
// LoadWorkloadConfig(config_dir / "workloads" / (name + ".json")).
Result<WorkloadConfig> LoadWorkloadConfigByName(std::string_view name, const std::filesystem::path& config_dir);

// Input and output lengths uniform in their ranges; inter-arrival times exponential.
Result<std::vector<RequestSpec>> GenerateWorkload(const WorkloadConfig& config);

}  // namespace ula

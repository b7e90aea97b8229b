// What each engine ships (configs/systems/availability.json; docs/COST_MODEL.md "What each
// engine ships"): for every system of the serving comparison, the engine that runs it, the
// hardware, parallel modes and model family it runs on, and whether it decodes with
// speculative (MTP) drafts, each entry with its public source. A system that does not ship
// for a config is still simulated, but `ula compare` shows it as hypothetical and leaves it
// out of that config's ranking (the best engine of a config is the best shipping one).
// UlaCache's own systems are "proposed": never hypothetical, never an engine.
//
// The file names every system once (RunComparison checks the names against SystemName); an
// unknown field, a missing one or an empty source is an error naming the field.
//
// Thread-safety: plain values; loaders are reentrant.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "serving/serving_config.h"
#include "ula/error.h"

namespace ula {

struct SystemAvailability {
  std::string system;                 // SystemName
  std::string engine;                 // who ships it ("TensorRT-LLM"; "this library" when proposed)
  bool proposed = false;              // UlaCache's systems: the subject, not an engine
  std::vector<std::string> hardware;  // configs/hardware names it runs on
  std::vector<ParallelMode> modes;    // tp, dp
  bool sparse_attention = false;      // runs DSA models (indexer + top-k: GLM-5, DeepSeek-V3.2)
  bool mtp = false;                   // decodes with MTP drafts
  std::string source;
};

struct AvailabilityConfig {
  std::vector<SystemAvailability> systems;
  // The entry of `system`, or nullptr.
  const SystemAvailability* Find(std::string_view system) const;
};

// Empty when `a` ships for this config; otherwise why not ("hardware b300 only; not for DSA
// models"). A proposed system always ships.
std::string WhyNotShipped(const SystemAvailability& a, const ScenarioEntry& e);

Result<AvailabilityConfig> ParseAvailabilityConfig(std::string_view json_text, std::string_view origin = "availability");
// config_dir/systems/availability.json
Result<AvailabilityConfig> LoadAvailabilityConfig(const std::filesystem::path& config_dir);
// kInvalidArgument unless the file names every SystemKind once and nothing else.
Status CheckEverySystemListed(const AvailabilityConfig& a);

}  // namespace ula

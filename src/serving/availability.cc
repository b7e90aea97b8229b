// Loading of configs/systems/availability.json and the shipping test (availability.h).
#include "serving/availability.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "config/json_fields.h"
#include "serving/baselines.h"

namespace ula {
namespace {

Error Bad(std::string_view origin, std::string_view field, std::string_view problem) {
  return Error(ErrorCode::kInvalidArgument, fmt::format("{}: field '{}': {}", origin, field, problem));
}

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

const SystemAvailability* AvailabilityConfig::Find(std::string_view system) const {
  for (const SystemAvailability& a : systems) {
    if (a.system == system) return &a;
  }
  return nullptr;
}

std::string WhyNotShipped(const SystemAvailability& a, const ScenarioEntry& e) {
  if (a.proposed) return "";
  std::vector<std::string> why;
  if (std::find(a.hardware.begin(), a.hardware.end(), e.hardware) == a.hardware.end()) {
    why.push_back(a.hardware.empty() ? "no hardware" : fmt::format("hardware {} only", Join(a.hardware)));
  }
  if (std::find(a.modes.begin(), a.modes.end(), e.mode) == a.modes.end()) {
    why.push_back(fmt::format("not in {} mode", ParallelModeName(e.mode)));
  }
  // Every model of the comparison is a DSA model (ModelConfig requires top_k >= 1).
  if (!a.sparse_attention) why.push_back("not for DSA models");
  if (e.mtp && !a.mtp) why.push_back("not with MTP drafts");
  std::string s;
  for (const std::string& w : why) s += (s.empty() ? "" : "; ") + w;
  return s;
}

Result<AvailabilityConfig> ParseAvailabilityConfig(std::string_view json_text, std::string_view origin) {
  const nlohmann::json j = nlohmann::json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return std::unexpected(Error(ErrorCode::kInvalidArgument, fmt::format("{}: not a JSON object", origin)));
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() != "name" && it.key() != "source" && it.key() != "systems") {
      return std::unexpected(Bad(origin, it.key(), "unknown field"));
    }
  }
  if (!j.contains("systems") || !j["systems"].is_object() || j["systems"].empty()) {
    return std::unexpected(Bad(origin, "systems", "must be a non-empty object of system name -> entry"));
  }
  AvailabilityConfig out;
  for (auto it = j["systems"].begin(); it != j["systems"].end(); ++it) {
    const std::string path = "systems." + it.key();
    const nlohmann::json& e = it.value();
    if (!e.is_object()) return std::unexpected(Bad(origin, path, "must be an object"));
    static constexpr const char* kFields[] = {"engine", "proposed", "hardware", "modes", "dsa", "mtp", "source"};
    for (auto f = e.begin(); f != e.end(); ++f) {
      if (std::find_if(std::begin(kFields), std::end(kFields), [&](const char* k) { return f.key() == k; }) ==
          std::end(kFields)) {
        return std::unexpected(Bad(origin, path + "." + f.key(), "unknown field"));
      }
    }
    SystemAvailability a;
    a.system = it.key();
    for (const char* s : {"engine", "source"}) {
      if (!e.contains(s) || !e[s].is_string() || e[s].get<std::string>().empty()) {
        return std::unexpected(Bad(origin, path + "." + s, "must be a non-empty string"));
      }
    }
    a.engine = e["engine"].get<std::string>();
    a.source = e["source"].get<std::string>();
    for (const char* b : {"proposed", "dsa", "mtp"}) {
      if (!e.contains(b) || !e[b].is_boolean()) return std::unexpected(Bad(origin, path + "." + b, "must be true or false"));
    }
    a.proposed = e["proposed"].get<bool>();
    a.sparse_attention = e["dsa"].get<bool>();
    a.mtp = e["mtp"].get<bool>();
    if (!e.contains("hardware") || !e["hardware"].is_array()) {
      return std::unexpected(Bad(origin, path + ".hardware", "must be an array of hardware names"));
    }
    for (const nlohmann::json& h : e["hardware"]) {
      if (!h.is_string() || h.get<std::string>().empty()) {
        return std::unexpected(Bad(origin, path + ".hardware", "must hold non-empty strings"));
      }
      a.hardware.push_back(h.get<std::string>());
    }
    if (!e.contains("modes") || !e["modes"].is_array()) {
      return std::unexpected(Bad(origin, path + ".modes", "must be an array of \"tp\" / \"dp\""));
    }
    for (const nlohmann::json& m : e["modes"]) {
      const std::string s = m.is_string() ? m.get<std::string>() : "";
      if (s == "tp") {
        a.modes.push_back(ParallelMode::kTp);
      } else if (s == "dp") {
        a.modes.push_back(ParallelMode::kDp);
      } else {
        return std::unexpected(Bad(origin, path + ".modes", "must hold \"tp\" or \"dp\""));
      }
    }
    out.systems.push_back(std::move(a));
  }
  return out;
}

Result<AvailabilityConfig> LoadAvailabilityConfig(const std::filesystem::path& config_dir) {
  const auto path = config_dir / "systems" / "availability.json";
  auto text = config_internal::ReadTextFile(path.string());
  if (!text) return std::unexpected(text.error());
  return ParseAvailabilityConfig(*text, path.string());
}

Status CheckEverySystemListed(const AvailabilityConfig& a) {
  for (SystemKind s : kAllSystems) {
    if (a.Find(SystemName(s)) == nullptr) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("systems/availability.json: no entry for system '{}'", SystemName(s)));
    }
  }
  for (const SystemAvailability& e : a.systems) {
    if (std::none_of(std::begin(kAllSystems), std::end(kAllSystems), [&](SystemKind s) { return SystemName(s) == e.system; })) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("systems/availability.json: field 'systems.{}': unknown system", e.system));
    }
  }
  return Ok();
}

}  // namespace ula

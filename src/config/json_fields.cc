// JsonFields: see json_fields.h. nlohmann exceptions never leave this file.
#include "config/json_fields.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <sstream>

namespace ula::config_internal {

Result<JsonFields> JsonFields::Parse(std::string_view text, std::string origin) {
  nlohmann::json parsed;
  try {
    parsed = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("{}: not valid JSON: {}", origin, e.what()));
  }
  return FromObject(parsed, std::move(origin));
}

Result<JsonFields> JsonFields::FromObject(const nlohmann::json& object, std::string origin) {
  if (!object.is_object()) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("{}: top level must be a JSON object", origin));
  }
  return JsonFields(object, std::move(origin));
}

Error JsonFields::FieldError(std::string_view field, std::string_view problem) const {
  return Error(ErrorCode::kInvalidArgument, fmt::format("{}: field '{}': {}", origin_, field, problem));
}

Result<const nlohmann::json*> JsonFields::Find(const char* field) {
  used_.insert(field);
  auto it = object_.find(field);
  if (it == object_.end()) return std::unexpected(FieldError(field, "missing"));
  return &*it;
}

Result<double> JsonFields::NumberOf(const nlohmann::json& value, std::string_view field) const {
  if (!value.is_number() || value.is_boolean()) {
    return std::unexpected(FieldError(field, fmt::format("must be a number, got {}", value.type_name())));
  }
  const double d = value.get<double>();
  if (!std::isfinite(d)) return std::unexpected(FieldError(field, "must be finite"));
  return d;
}

Result<std::string> JsonFields::String(const char* field, bool allow_empty) {
  auto found = Find(field);
  if (!found) return std::unexpected(found.error());
  const nlohmann::json& v = **found;
  if (!v.is_string()) {
    return std::unexpected(FieldError(field, fmt::format("must be a string, got {}", v.type_name())));
  }
  std::string s = v.get<std::string>();
  if (s.empty() && !allow_empty) return std::unexpected(FieldError(field, "must not be empty"));
  return s;
}

Result<std::uint64_t> JsonFields::UInt(const char* field, std::uint64_t min, std::uint64_t max) {
  auto found = Find(field);
  if (!found) return std::unexpected(found.error());
  const nlohmann::json& v = **found;
  if (v.is_number_unsigned()) {
    const std::uint64_t u = v.get<std::uint64_t>();
    if (u < min) return std::unexpected(FieldError(field, fmt::format("must be >= {}, got {}", min, u)));
    if (u > max) return std::unexpected(FieldError(field, fmt::format("must be <= {}, got {}", max, u)));
    return u;
  }
  if (v.is_number_integer()) {  // signed: negative here
    return std::unexpected(FieldError(field, fmt::format("must be >= {}, got {}", min, v.get<std::int64_t>())));
  }
  auto d = NumberOf(v, field);
  if (!d) return std::unexpected(d.error());
  if (*d != std::floor(*d)) {
    return std::unexpected(FieldError(field, fmt::format("must be an integer, got {}", *d)));
  }
  if (*d < static_cast<double>(min)) {
    return std::unexpected(FieldError(field, fmt::format("must be >= {}, got {}", min, *d)));
  }
  if (*d > static_cast<double>(max)) {
    return std::unexpected(FieldError(field, fmt::format("must be <= {}, got {}", max, *d)));
  }
  return static_cast<std::uint64_t>(*d);
}

Result<double> JsonFields::Double(const char* field, double min, double max) {
  auto found = Find(field);
  if (!found) return std::unexpected(found.error());
  auto d = NumberOf(**found, field);
  if (!d) return d;
  if (*d < min) return std::unexpected(FieldError(field, fmt::format("must be >= {}, got {}", min, *d)));
  if (*d > max) return std::unexpected(FieldError(field, fmt::format("must be <= {}, got {}", max, *d)));
  return d;
}

Result<double> JsonFields::SourcedDouble(const char* field, double min, double max) {
  auto found = Find(field);
  if (!found) return std::unexpected(found.error());
  const nlohmann::json& v = **found;
  if (!v.is_object()) {
    return std::unexpected(FieldError(field, "must be an object {\"value\": number, \"source\": text}"));
  }
  auto inner = FromObject(v, fmt::format("{}: field '{}'", origin_, field));
  if (!inner) return std::unexpected(inner.error());
  auto value = inner->Double("value", min, max);
  if (!value) return value;
  auto source = inner->String("source");
  if (!source) return std::unexpected(source.error());
  ULA_RETURN_IF_ERROR(inner->CheckNoUnknownFields());
  return value;
}

Result<std::vector<std::uint64_t>> JsonFields::UIntArray(const char* field, std::uint64_t min, std::uint64_t max) {
  auto found = Find(field);
  if (!found) return std::unexpected(found.error());
  const nlohmann::json& v = **found;
  if (!v.is_array()) {
    return std::unexpected(FieldError(field, fmt::format("must be an array of integers, got {}", v.type_name())));
  }
  if (v.empty()) return std::unexpected(FieldError(field, "must not be empty"));
  std::vector<std::uint64_t> out;
  out.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const nlohmann::json& e = v[i];
    if (!e.is_number_unsigned()) {
      return std::unexpected(FieldError(field, fmt::format("[{}] must be an integer >= {}, got {}", i, min, e.dump())));
    }
    const std::uint64_t u = e.get<std::uint64_t>();
    if (u < min || u > max) {
      return std::unexpected(FieldError(field, fmt::format("[{}] must be in [{}, {}], got {}", i, min, max, u)));
    }
    out.push_back(u);
  }
  return out;
}

Result<JsonFields> JsonFields::Object(const char* field) {
  auto found = Find(field);
  if (!found) return std::unexpected(found.error());
  if (!(*found)->is_object()) {
    return std::unexpected(FieldError(field, fmt::format("must be an object, got {}", (*found)->type_name())));
  }
  return FromObject(**found, fmt::format("{}: field '{}'", origin_, field));
}

Status JsonFields::CheckNoUnknownFields() const {
  for (auto it = object_.begin(); it != object_.end(); ++it) {
    if (!used_.contains(it.key())) return std::unexpected(FieldError(it.key(), "unknown field"));
  }
  return Ok();
}

Result<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return MakeError(ErrorCode::kIo, fmt::format("cannot open '{}'", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return MakeError(ErrorCode::kIo, fmt::format("cannot read '{}'", path));
  return ss.str();
}

}  // namespace ula::config_internal

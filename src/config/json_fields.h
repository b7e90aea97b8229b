// JsonFields: reads one flat JSON object field by field for the config loaders, turning
// every nlohmann exception and every out-of-range value into an Error that names the
// origin and the field ("configs/models/x.json: field 'top_k': must be >= 1, got 0").
// Each getter marks its field as used; CheckNoUnknownFields() then rejects any field no
// getter asked for (a misspelt key is an error, not a silent default).
//
// Thread-safety: none; one loader uses one instance.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ula/error.h"

namespace ula::config_internal {

class JsonFields {
 public:
  // Parses `text`; the top level must be an object.
  static Result<JsonFields> Parse(std::string_view text, std::string origin);
  // Wraps an already parsed object (a nested object of another config).
  static Result<JsonFields> FromObject(const nlohmann::json& object, std::string origin);

  Result<std::string> String(const char* field, bool allow_empty = false);
  // An integer in [min, max]; a float with an integral value is accepted (141e9).
  Result<std::uint64_t> UInt(const char* field, std::uint64_t min, std::uint64_t max);
  Result<double> Double(const char* field, double min, double max);
  // {"value": number, "source": "non-empty text"}: returns value, requires the source.
  Result<double> SourcedDouble(const char* field, double min, double max);
  // A non-empty array of integers, each in [min, max]; an error names the field and index.
  Result<std::vector<std::uint64_t>> UIntArray(const char* field, std::uint64_t min, std::uint64_t max);
  // A nested object, its errors prefixed with this object's origin and the field.
  Result<JsonFields> Object(const char* field);
  // Whether the object has `field` (does not mark it used: an optional field's getter does).
  bool Has(const char* field) const { return object_.contains(field); }

  // An error naming the first field no getter asked for.
  Status CheckNoUnknownFields() const;
  // An Error for `field` with this object's origin.
  Error FieldError(std::string_view field, std::string_view problem) const;

 private:
  JsonFields(nlohmann::json object, std::string origin)
      : object_(std::move(object)), origin_(std::move(origin)) {}
  Result<const nlohmann::json*> Find(const char* field);
  Result<double> NumberOf(const nlohmann::json& value, std::string_view field) const;

  nlohmann::json object_;
  std::string origin_;
  std::set<std::string, std::less<>> used_;
};

// Reads a whole file; kIo naming the path on failure.
Result<std::string> ReadTextFile(const std::string& path);

}  // namespace ula::config_internal

#include <array>
#include <string>

#include "policy/exact_lru_list.h"
#include "ula/residency_policy.h"

namespace ula {
namespace {
constexpr std::array<std::pair<PolicyKind, std::string_view>, 4> kNames{{
    {PolicyKind::kPbLru, "pb_lru"},
    {PolicyKind::kExactLruScan, "exact_lru_scan"},
    {PolicyKind::kExactLruList, "exact_lru_list"},
    {PolicyKind::kClock, "clock"},
}};
}  // namespace

std::string_view PolicyKindName(PolicyKind kind) {
  for (auto [k, name] : kNames) {
    if (k == kind) return name;
  }
  return "unknown";
}

Result<PolicyKind> ParsePolicyKind(std::string_view name) {
  for (auto [k, n] : kNames) {
    if (n == name) return k;
  }
  return MakeError(ErrorCode::kInvalidArgument,
                   "unknown policy '" + std::string(name) + "' (pb_lru, exact_lru_scan, exact_lru_list, clock)");
}

PolicyKind DefaultPolicyKind() { return PolicyKind::kExactLruList; }

Result<std::unique_ptr<ResidencyPolicy>> MakePolicy(PolicyKind kind, std::uint32_t capacity,
                                                    const PolicyOptions& options) {
  switch (kind) {
    case PolicyKind::kExactLruList:
      return std::make_unique<policy::ExactLruList>(capacity);
    default:
      return MakeError(ErrorCode::kUnsupported,
                       "policy '" + std::string(PolicyKindName(kind)) + "' is not implemented yet");
  }
}

}  // namespace ula

#include <array>
#include <string>

#include "policy/clock.h"
#include "policy/exact_lru_list.h"
#include "policy/exact_lru_scan.h"
#include "policy/kernel_pb_lru.h"
#include "policy/lfu_aged.h"
#include "policy/pb_lru.h"
#include "ula/residency_policy.h"

namespace ula {
namespace {
constexpr std::array<std::pair<PolicyKind, std::string_view>, 6> kNames{{
    {PolicyKind::kPbLru, "pb_lru"},
    {PolicyKind::kExactLruScan, "exact_lru_scan"},
    {PolicyKind::kExactLruList, "exact_lru_list"},
    {PolicyKind::kClock, "clock"},
    {PolicyKind::kLfuAged, "lfu_aged"},
    {PolicyKind::kKernelPbLru, "kernel_pb_lru"},
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
                   "unknown policy '" + std::string(name) + "' (pb_lru, exact_lru_scan, exact_lru_list, clock, lfu_aged, kernel_pb_lru)");
}

Status PolicyOptions::Validate() const {
  if (recent_buckets > kMaxRecentBuckets) {
    return MakeError(ErrorCode::kInvalidArgument, "PolicyOptions.recent_buckets = " + std::to_string(recent_buckets) +
                                                      " exceeds " + std::to_string(kMaxRecentBuckets));
  }
  if (parallel_min_slots == 0) {
    return MakeError(ErrorCode::kInvalidArgument, "PolicyOptions.parallel_min_slots must be >= 1");
  }
  return Ok();
}

// PB-LRU passes the conformance suite (tests/policy) and is the planner's default.
PolicyKind DefaultPolicyKind() { return PolicyKind::kPbLru; }

Result<std::unique_ptr<ResidencyPolicy>> MakePolicy(PolicyKind kind, std::uint32_t capacity,
                                                    const PolicyOptions& options) {
  ULA_RETURN_IF_ERROR(options.Validate());
  switch (kind) {
    case PolicyKind::kPbLru:
      return std::make_unique<policy::PbLru>(capacity, options);
    case PolicyKind::kExactLruScan:
      return std::make_unique<policy::ExactLruScan>(capacity, options);
    case PolicyKind::kExactLruList:
      return std::make_unique<policy::ExactLruList>(capacity);
    case PolicyKind::kClock:
      return std::make_unique<policy::Clock>(capacity);
    case PolicyKind::kLfuAged:
      return std::make_unique<policy::LfuAged>(capacity, options);
    case PolicyKind::kKernelPbLru:
      return std::make_unique<policy::KernelPbLru>(capacity, options);
  }
  return MakeError(ErrorCode::kInvalidArgument, "unknown policy kind " + std::to_string(static_cast<int>(kind)));
}

}  // namespace ula

// RouteByPrefix (DP mode): cache-aware routing of a request to a rank. In DP a
// prefix lives on one rank (its addresses are that rank's), so a request can reuse a
// cached prefix only where the prefix is. The rule is that of SGLang's model gateway
// (SMG, formerly sgl-router, policy `cache_aware`; defaults from its docs,
// docs/getting-started/load-balancing.md):
//   1. imbalance first: if max load - min load > balance_abs_threshold and max load >
//      balance_rel_threshold x min load, go to the least loaded rank;
//   2. else the rank whose cache holds the longest prefix of the request, when that match
//      covers more than cache_threshold of the request's tokens;
//   3. else the rank whose cache holds the fewest tokens (the most room for a new prefix).
// Ties go to the lower load, then the lower rank. The probe is SparsePrefixCache::PeekLength
// on every rank: O(ranks x matched tokens), no tree is touched.
//
// Errors: kInvalidArgument when caches and loads differ in size, are empty, or a cache is
// null. Pure: nothing changes. Thread-safety: as the caches (read-only calls).
#pragma once

#include <cstdint>
#include <span>

#include "ula/error.h"
#include "ula/ids.h"
#include "ula/sparse_prefix_cache.h"

namespace ula {

struct PrefixRouterOptions {
  double cache_threshold = 0.3;              // SMG --cache-threshold default
  std::uint64_t balance_abs_threshold = 64;  // SMG --balance-abs-threshold default
  double balance_rel_threshold = 1.5;        // SMG --balance-rel-threshold default
};

struct RouteDecision {
  enum class Why : std::uint8_t { kImbalance, kPrefix, kRoom };
  Rank rank;
  std::uint32_t matched = 0;  // cached tokens of the request on that rank
  Why why = Why::kPrefix;
};

Result<RouteDecision> RouteByPrefix(std::span<const SparsePrefixCache* const> caches,
                                    std::span<const std::uint64_t> loads, std::span<const std::uint32_t> tokens,
                                    const PrefixRouterOptions& options = {});

}  // namespace ula

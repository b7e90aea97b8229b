#include "prefix/prefix_router.h"

#include <fmt/format.h>

#include <algorithm>

namespace ula {

Result<RouteDecision> RouteByPrefix(std::span<const SparsePrefixCache* const> caches,
                                    std::span<const std::uint64_t> loads, std::span<const std::uint32_t> tokens,
                                    const PrefixRouterOptions& options) {
  if (caches.empty() || caches.size() != loads.size() || caches.size() > Rank::kInvalidValue) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("RouteByPrefix: {} caches and {} loads (one each per rank, at least one)",
                                 caches.size(), loads.size()));
  }
  if (std::find(caches.begin(), caches.end(), nullptr) != caches.end()) {
    return MakeError(ErrorCode::kInvalidArgument, "RouteByPrefix: a null cache");
  }
  const std::size_t n = caches.size();
  auto rank = [](std::size_t r) { return Rank(static_cast<std::uint16_t>(r)); };
  const auto [lo, hi] = std::minmax_element(loads.begin(), loads.end());
  if (*hi - *lo > options.balance_abs_threshold && double(*hi) > options.balance_rel_threshold * double(*lo)) {
    const std::size_t r = static_cast<std::size_t>(lo - loads.begin());
    return RouteDecision{rank(r), caches[r]->PeekLength(tokens), RouteDecision::Why::kImbalance};
  }
  std::size_t best = 0;
  std::uint32_t best_len = 0;
  for (std::size_t r = 0; r < n; ++r) {
    const std::uint32_t len = caches[r]->PeekLength(tokens);
    if (len > best_len || (len == best_len && loads[r] < loads[best])) {
      best = r;
      best_len = len;
    }
  }
  if (!tokens.empty() && double(best_len) > options.cache_threshold * double(tokens.size())) {
    return RouteDecision{rank(best), best_len, RouteDecision::Why::kPrefix};
  }
  std::size_t roomiest = 0;
  for (std::size_t r = 1; r < n; ++r) {
    const std::uint64_t a = caches[r]->cached_tokens(), b = caches[roomiest]->cached_tokens();
    if (a < b || (a == b && loads[r] < loads[roomiest])) roomiest = r;
  }
  return RouteDecision{rank(roomiest), caches[roomiest]->PeekLength(tokens), RouteDecision::Why::kRoom};
}

}  // namespace ula

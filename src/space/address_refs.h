// Shared addresses (DP and TP address spaces, same component): the packed reference count
// of one logical address and the isolation rule "request R holds address a".
//
// Data. Per address, next to its owner tag (the allocating request's tag while that request
// holds it, kSharedTag once only adopters and cache references hold it, 0 when free), one
// 32-bit count: bits [23:0] the requests that list it, bits [31:24] the cache references
// (a prefix cache node's, Retain/Release) on it. 0 = free. Per request, `adopted`: the
// sorted addresses it adopted (ShareInto) rather than allocated.
// Invariants (checked by the spaces' CheckInvariants): count == 0 iff owner == 0; the
// request part equals the number of request lists naming the address; for every address a
// request lists, exactly one of "owner == its tag" and "a in its adopted" holds.
// Thread-safety: plain data of the space, under its one driver thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ula/ids.h"

namespace ula::refs {

// Owner tag of a live address its allocator no longer holds. Never a request's tag.
inline constexpr std::uint32_t kSharedTag = UINT32_MAX;
inline constexpr std::uint32_t kRequestRef = 1, kCacheRef = 1u << 24;
inline constexpr std::uint32_t kMaxRequestRefs = kCacheRef - 1, kMaxCacheRefs = 255;

inline std::uint32_t RequestRefs(std::uint32_t count) { return count & kMaxRequestRefs; }
inline std::uint32_t CacheRefs(std::uint32_t count) { return count >> 24; }
inline std::uint32_t Holders(std::uint32_t count) { return RequestRefs(count) + CacheRefs(count); }

// The isolation check: whether the request with `tag` and sorted `adopted` holds an
// address whose owner tag is `owner`. O(1) for its own allocation, O(log adopted) else.
inline bool Holds(std::uint32_t owner, std::uint32_t tag, const std::vector<LogicalAddr>& adopted, LogicalAddr a) {
  if (owner == tag) return true;
  return owner != 0 && std::binary_search(adopted.begin(), adopted.end(), a);
}

// Appends `more` (distinct, none in `adopted`) to the sorted `adopted`.
template <class Span>
void MergeAdopted(std::vector<LogicalAddr>& adopted, const Span& more) {
  const auto old = static_cast<std::ptrdiff_t>(adopted.size());
  adopted.insert(adopted.end(), more.begin(), more.end());
  std::sort(adopted.begin() + old, adopted.end());
  std::inplace_merge(adopted.begin(), adopted.begin() + old, adopted.end());
}

}  // namespace ula::refs

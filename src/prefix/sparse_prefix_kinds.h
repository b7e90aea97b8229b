// The kinds mode of SparsePrefixCache (ula/sparse_prefix_cache.h, "Kinds mode"): the space
// with kinds behind the cache, its config, the event group of each kind and the counters.
// Internal to src/prefix (sparse_prefix_cache.cc, sparse_prefix_kinds.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "ula/address_space.h"
#include "ula/prefix_events.h"
#include "ula/sparse_prefix_cache.h"

namespace ula {

struct SparsePrefixCache::Kinds {
  Kinds(AddressSpace& s, Rank r, const SparsePrefixCacheConfig& c) : space(s), rank(r), config(c) {}
  AddressSpace& space;
  Rank rank;
  SparsePrefixCacheConfig config;
  std::uint32_t unit = 0;    // the share unit A (KindEntries::ShareUnit)
  std::uint32_t sparse = 0;  // the sparse kind
  std::uint32_t ring = 0;    // the window kind (kRing)
  std::vector<std::int32_t> group;  // [num_kinds] the kind's event group (-1: none: companions, states)
  std::vector<std::uint64_t> evicted;  // [num_kinds] freed by every eviction (entries or blocks)
  std::vector<CacheEvent> events;      // since the last TakeEvents

  std::uint32_t num_kinds() const { return static_cast<std::uint32_t>(space.config().kinds.size()); }
  RequestId HolderOf(std::uint32_t node) const { return RequestId(config.first_holder.value() + node); }
};

}  // namespace ula

// Small helpers shared by the prefix cache's sources (internal).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "ula/prefix_events.h"

namespace ula::internal {

inline std::uint32_t CeilDiv(std::uint32_t a, std::uint32_t b) { return (a + b - 1) / b; }

// Node ids from the root's child down to `node` (root excluded).
template <class Nodes>
std::vector<std::uint32_t> PathTo(std::uint32_t node, const Nodes& nodes) {
  std::vector<std::uint32_t> path;
  for (std::uint32_t id = node; id != 0; id = nodes[id].parent) path.push_back(id);
  std::reverse(path.begin(), path.end());
  return path;
}

// Chained page hashes of a token sequence (pages of P tokens, the last maybe partial), as
// the bits of each page's event hash (ula/prefix_events.h says how each kind is computed).
std::vector<std::uint64_t> PageHashes(std::span<const std::uint32_t> tokens, std::uint32_t P, EventHash hash);

}  // namespace ula::internal

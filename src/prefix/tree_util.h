// Small helpers shared by the prefix cache's sources (internal).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

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

}  // namespace ula::internal

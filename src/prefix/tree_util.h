// Small helpers shared by the prefix cache's sources (internal).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "core/digest.h"

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

// Chained page hashes of a token sequence (pages of P tokens, the last maybe partial): page
// i's hash covers its tokens and page i - 1's hash (page 0: 0), so equal prefixes hash equal.
inline std::vector<std::uint64_t> PageHashes(std::span<const std::uint32_t> tokens, std::uint32_t P) {
  std::vector<std::uint64_t> hashes;
  std::uint64_t parent = 0;
  for (std::size_t i = 0; i < tokens.size(); i += P) {
    StateDigest d;
    d.Add(parent);
    d.AddAll(tokens.subspan(i, std::min<std::size_t>(P, tokens.size() - i)));
    parent = d.value();
    hashes.push_back(parent);
  }
  return hashes;
}

}  // namespace ula::internal

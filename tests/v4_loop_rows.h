// The row model of the V4-shaped engine loops (tests/step/v4_engine_loop_test.cc and
// tests/tp/tp_v4_engine_loop_test.cc): a row's bytes, the dense store the loops check against,
// the engine's paged store of a resident kind, and where a ring position or an entry sits in
// its page table.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ula/kv_kinds.h"

namespace ula::test {

inline constexpr std::uint32_t kV4Row = 32;  // bytes of one row of every kind

// A row's contents: its request, position (window) or entry (C4, C128), kind, model layer
// and version, then a mix of them.
inline void FillRow(std::byte* out, std::uint32_t request, std::uint32_t index, std::uint32_t kind, std::uint32_t layer,
             std::uint32_t version) {
  std::uint32_t w[kV4Row / 4] = {request, index, kind, layer, version};
  std::uint64_t h = (std::uint64_t{request} << 40) ^ (std::uint64_t{index} << 20) ^ (kind * 977u + layer * 131u) ^
                    (std::uint64_t{version} << 7);
  for (std::uint32_t i = 5; i < kV4Row / 4; ++i) {
    h = (h ^ (h >> 31)) * 0x9e3779b97f4a7c15ull + i;
    w[i] = static_cast<std::uint32_t>(h >> 16);
  }
  std::memcpy(out, w, kV4Row);
}

// The same model over a dense store: a request's rows of one kind, [layers][index][kV4Row].
struct DenseKind {
  std::vector<std::vector<std::byte>> layers;
  explicit DenseKind(std::size_t n) : layers(n) {}
  std::uint32_t size() const { return static_cast<std::uint32_t>(layers[0].size() / kV4Row); }
  std::byte* Append(std::uint32_t l) {
    layers[l].resize(layers[l].size() + kV4Row);
    return layers[l].data() + layers[l].size() - kV4Row;
  }
  const std::byte* Row(std::uint32_t l, std::uint32_t i) const { return layers[l].data() + std::size_t{i} * kV4Row; }
  void Truncate(std::uint32_t n) {
    for (auto& v : layers) v.resize(std::min<std::size_t>(v.size(), std::size_t{n} * kV4Row));
  }
};

// The engine's store of a resident kind: [block][layer][kKindBlockEntries][kV4Row], indexed by
// the block ids of KindPagesOf (grown as the ids come).
struct PagedKind {
  std::uint32_t layers;
  std::vector<std::byte> bytes;
  std::byte* Row(std::uint32_t block, std::uint32_t layer, std::uint32_t offset) {
    const std::size_t at = ((std::size_t{block} * layers + layer) * kKindBlockEntries + offset) * kV4Row;
    if (at + kV4Row > bytes.size()) bytes.resize(std::size_t{block + 1} * layers * kKindBlockEntries * kV4Row);
    return bytes.data() + at;
  }
};

// Where a ring's position p (a live token) or an append kind's entry e sits in its page table.
struct PageRow {
  std::uint32_t block, offset;
};
inline PageRow RingRow(const KindPages& pages, std::uint32_t p) {
  const std::uint32_t first = pages.tokens - pages.entries;
  const std::uint32_t i = pages.first_offset + (p - first);
  return {pages.blocks.at(i / pages.entries_per_block), i % pages.entries_per_block};
}
inline PageRow EntryRow(const KindPages& pages, std::uint32_t e) {
  return {pages.blocks.at(e / pages.entries_per_block), e % pages.entries_per_block};
}

}  // namespace ula::test

// Strong index types. Each id is a distinct type over a small integer so that a slot can
// never be passed where a logical address is expected. All are trivially copyable and
// have the size of their representation, so spans of them are plain integer arrays.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <limits>

#include "ula/tier.h"

namespace ula {

template <class Tag, class Rep>
class StrongId {
 public:
  using rep_type = Rep;
  static constexpr Rep kInvalidValue = std::numeric_limits<Rep>::max();

  constexpr StrongId() = default;
  constexpr explicit StrongId(Rep value) : value_(value) {}

  static constexpr StrongId Invalid() { return StrongId(); }
  constexpr Rep value() const { return value_; }
  constexpr bool valid() const { return value_ != kInvalidValue; }

  constexpr auto operator<=>(const StrongId&) const = default;

 private:
  Rep value_ = kInvalidValue;
};

// The stable name of one token's entry (all layer groups share the address; each group
// has its own location for it). What the engine's request-to-token table holds.
using LogicalAddr = StrongId<struct LogicalAddrTag, std::uint32_t>;
// A cell of one slot pool.
using SlotId = StrongId<struct SlotIdTag, std::uint32_t>;
// One GPU of the serving group.
using Rank = StrongId<struct RankTag, std::uint16_t>;
// A layer group: consecutive layers that share one top-k selection.
using GroupId = StrongId<struct GroupIdTag, std::uint16_t>;
// The engine's request.
using RequestId = StrongId<struct RequestIdTag, std::uint64_t>;
// A variable-size block of the unified buffer (hybrid models).
using BlockId = StrongId<struct BlockIdTag, std::uint32_t>;

}  // namespace ula

template <class Tag, class Rep>
struct std::hash<ula::StrongId<Tag, Rep>> {
  std::size_t operator()(ula::StrongId<Tag, Rep> id) const noexcept {
    return std::hash<Rep>()(id.value());
  }
};

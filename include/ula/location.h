// Location: where one entry is now, (tier, rank, slot), packed in 64 bits.
//   bits [31:0]  slot      bits [47:32] rank      bits [55:48] tier code (0 = none)
// The all-zero value is "no location" (a free or never-used logical address).
#pragma once

#include <cstdint>

#include "ula/ids.h"

namespace ula {

class Location {
 public:
  constexpr Location() = default;
  static constexpr Location None() { return Location(); }
  static constexpr Location Make(Tier tier, Rank rank, SlotId slot) {
    return Location((std::uint64_t{static_cast<std::uint8_t>(tier)} + 1) << 48 |
                    std::uint64_t{rank.value()} << 32 | slot.value());
  }
  static constexpr Location FromBits(std::uint64_t bits) { return Location(bits); }

  constexpr bool is_none() const { return bits_ == 0; }
  constexpr Tier tier() const { return static_cast<Tier>((bits_ >> 48) - 1); }
  constexpr Rank rank() const { return Rank(static_cast<std::uint16_t>(bits_ >> 32)); }
  constexpr SlotId slot() const { return SlotId(static_cast<std::uint32_t>(bits_)); }
  constexpr std::uint64_t bits() const { return bits_; }

  constexpr bool operator==(const Location&) const = default;

 private:
  constexpr explicit Location(std::uint64_t bits) : bits_(bits) {}
  std::uint64_t bits_ = 0;
};
static_assert(sizeof(Location) == 8);

}  // namespace ula

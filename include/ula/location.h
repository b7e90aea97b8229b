// Location: where one entry is now, (tier, rank, slot), packed in 64 bits by the one layout
// of ula/location_bits.h (device code uses those functions directly). The all-zero value is
// "no location" (a free or never-used logical address).
#pragma once

#include <cstdint>

#include "ula/ids.h"
#include "ula/location_bits.h"

namespace ula {

class Location {
 public:
  constexpr Location() = default;
  static constexpr Location None() { return Location(); }
  static constexpr Location Make(Tier tier, Rank rank, SlotId slot) {
    return Location(location_bits::Pack(tier, rank.value(), slot.value()));
  }
  // REQUIRES: bits holds a location or none (no bit above location_bits::kMask).
  static constexpr Location FromBits(std::uint64_t bits) { return Location(bits); }

  constexpr bool is_none() const { return location_bits::IsNone(bits_); }
  constexpr Tier tier() const { return location_bits::TierOf(bits_); }
  constexpr Rank rank() const { return Rank(static_cast<std::uint16_t>(location_bits::RankOf(bits_))); }
  constexpr SlotId slot() const { return SlotId(location_bits::SlotOf(bits_)); }
  constexpr std::uint64_t bits() const { return bits_; }

  constexpr bool operator==(const Location&) const = default;

 private:
  constexpr explicit Location(std::uint64_t bits) : bits_(bits) {}
  std::uint64_t bits_ = 0;
};
static_assert(sizeof(Location) == 8);

}  // namespace ula

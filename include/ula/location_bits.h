// The bit layout of a location, the one definition (the Location class, ula/location.h, the
// location tables, src/core/address_records.h, and the step's kernels, src/kernels, all read
// and write it through these functions; docs/ARCHITECTURE.md, "Invariants"):
//
//   bits [31:0]  slot in the pool of (tier, rank, group)
//   bits [47:32] rank
//   bit  48      tier: Tier's value (ula/tier.h), 0 device, 1 host
//   bit  49      present: 1 for every location; the all-zero word is "no location"
//   bits [63:50] not part of a location: free for the word's owner (the location table keeps
//                its dedup stamp there, src/core/address_records.h)
//
// C++17 and device-callable (ula/host_device.h), so the CUDA kernels use this header as the
// host code does.
#pragma once

#include <cstdint>

#include "ula/host_device.h"
#include "ula/tier.h"

namespace ula::location_bits {

inline constexpr unsigned kRankShift = 32;
inline constexpr unsigned kTierShift = 48;
inline constexpr unsigned kPresentShift = 49;
inline constexpr unsigned kUsedBits = 50;  // bits [63:50] are the word owner's
inline constexpr std::uint64_t kMask = (std::uint64_t{1} << kUsedBits) - 1;
inline constexpr std::uint64_t kPresent = std::uint64_t{1} << kPresentShift;

ULA_HD constexpr std::uint64_t Pack(Tier tier, std::uint32_t rank, std::uint32_t slot) {
  return kPresent | std::uint64_t{static_cast<std::uint8_t>(tier)} << kTierShift |
         std::uint64_t{rank & 0xffffu} << kRankShift | slot;
}
// The location bits of a word that may carry an owner's bits above them.
ULA_HD constexpr std::uint64_t Of(std::uint64_t word) { return word & kMask; }
ULA_HD constexpr bool IsNone(std::uint64_t word) { return (word & kPresent) == 0; }
ULA_HD constexpr Tier TierOf(std::uint64_t word) { return static_cast<Tier>((word >> kTierShift) & 1u); }
ULA_HD constexpr bool OnDevice(std::uint64_t word) { return !IsNone(word) && TierOf(word) == Tier::kDevice; }
ULA_HD constexpr std::uint32_t RankOf(std::uint64_t word) { return static_cast<std::uint32_t>((word >> kRankShift) & 0xffffu); }
ULA_HD constexpr std::uint32_t SlotOf(std::uint64_t word) { return static_cast<std::uint32_t>(word); }

static_assert(Pack(Tier::kDevice, 0, 0) != 0, "a location is never the all-zero word");
static_assert(Pack(Tier::kHost, 0xffffu, 0xffffffffu) == kMask, "a location fills exactly the low 50 bits");
static_assert(TierOf(Pack(Tier::kHost, 3, 7)) == Tier::kHost && RankOf(Pack(Tier::kHost, 3, 7)) == 3 &&
              SlotOf(Pack(Tier::kHost, 3, 7)) == 7);

}  // namespace ula::location_bits

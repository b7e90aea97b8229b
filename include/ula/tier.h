// Tier: where bytes sit. One encoding everywhere (docs/ARCHITECTURE.md, "Invariants"): the
// enum's value is the tier field of a location (ula/location_bits.h) and of a copy
// descriptor (ula/step_arrays.h), 0 for device and 1 for host; "no location" is a separate
// present bit, never a third tier value. C++17 and device-callable (ula/host_device.h).
#pragma once

#include <cstdint>

#include "ula/host_device.h"

namespace ula {

enum class Tier : std::uint8_t {
  kDevice = 0,  // GPU HBM of one rank (a host buffer standing in for it on the CPU backend)
  kHost = 1,    // pinned CPU memory attached to one rank
};
inline constexpr int kNumTiers = 2;
ULA_HD constexpr const char* TierName(Tier t) { return t == Tier::kDevice ? "device" : "host"; }

}  // namespace ula

// SpaceAccess: the one way code of src/ reaches a space's private state.
//
// AddressSpace and TpAddressSpace keep their tables, pools and policies in an opaque
// State (src/space/address_space_state.h, src/space/tp_state.h). The step's forms, in
// src/step, read and change that state directly: it is the space core they share
// (docs/ARCHITECTURE.md, "Layers"). Instead of naming each of them a friend in a public
// header (an internal class in the installed API), each space befriends this one struct in
// namespace `internal`, and the step reaches the state through the free functions below.
//
// REQUIRES: the caller keeps the space's own invariants (CheckInvariants() holds after its
// call returns) and its thread-safety rules (a space is not thread-safe: one caller at a
// time). Nothing here is part of the installed API.
#pragma once

#include "ula/address_space.h"
#include "ula/tp_address_space.h"

namespace ula::internal {

struct SpaceAccess {
  static AddressSpace::State& State(AddressSpace& space) { return *space.state_; }
  static const AddressSpace::State& State(const AddressSpace& space) { return *space.state_; }
  static TpAddressSpace::State& State(TpAddressSpace& space) { return *space.state_; }
  static const TpAddressSpace::State& State(const TpAddressSpace& space) { return *space.state_; }
};

}  // namespace ula::internal

namespace ula {

// The state of a space, for the step's forms (see above).
inline AddressSpace::State& StateOf(AddressSpace& space) { return internal::SpaceAccess::State(space); }
inline const AddressSpace::State& StateOf(const AddressSpace& space) { return internal::SpaceAccess::State(space); }
inline TpAddressSpace::State& StateOf(TpAddressSpace& space) { return internal::SpaceAccess::State(space); }
inline const TpAddressSpace::State& StateOf(const TpAddressSpace& space) { return internal::SpaceAccess::State(space); }

}  // namespace ula

// The space modes the engine path needs, checked where an engine step is created.
//
// The engine path (StepPlanner::Plan, TpStepPlanner::Plan and the device step) hands the
// engine descriptors to run on its own streams and write slots to put new tokens' KV in.
// Two of a space's modes decide whether that can be right, and both are fields of the
// space's config, fixed at the space's Create: no step changes them behind the space's back.
//   - stable_new_entries must be on (every engine form): the engine writes a new token's KV
//     at the location Lookup gave right after Allocate, so that slot must not move within
//     its round.
//   - host_shadows: the DP and TP engine steps keep them (ula/step_planner.h, "Host shadows":
//     a victim with a clean host copy is published there, its slot filled by a plain copy;
//     one plan for both, step/miss_fills.h). The device step refuses them: its descriptors
//     move exclusive entries only.
//   - device_placement (DP): Allocate leaves new addresses unplaced for the device step to
//     place (DeviceStep::Place); the host step refuses such a space (RefuseDevicePlacement).
#pragma once

#include <string_view>

#include <fmt/format.h>

#include "ula/error.h"
#include "ula/tp_address_space.h"

namespace ula {

// Ok, or the refusal that names the config field to change. `config_name` is the space's
// config type ("AddressSpaceConfig", "TpConfig").
inline Status RefuseUnstableNewEntries(bool stable_new_entries, std::string_view config_name) {
  if (!stable_new_entries) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("{}.stable_new_entries is off: the engine path writes a new token's KV at the "
                                 "location Lookup gives right after Allocate, which only stable new entries keep "
                                 "for the round; create the space with stable_new_entries = true",
                                 config_name));
  }
  return Ok();
}

// Ok, or the refusal of an engine-path call (`what`) on a planner of class `planner` made by
// its constructor, which has the library path only.
inline Status RefuseWithoutEngineConfig(bool has_engine_config, std::string_view planner, std::string_view what) {
  if (!has_engine_config) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("{}: this {} has no engine config (made by its constructor, the library path "
                                 "only): make it with {}::Create(space, config)", what, planner, planner));
  }
  return Ok();
}

// Ok, or the refusal of a TP step form (`form`) over a space with kinds (TpConfig::kinds)
// where that form is not built. Built: the host step with attention at home (TpStepPlanner,
// its selections a request's C4 entries on their homes, a mod P). Not built: the device step
// (DeviceStep over a TP space) and the local buffer (refused by the space's Create); callers
// pass `refused` true for those (docs/ARCHITECTURE.md, "Kinds under TP").
inline Status RefuseTpKinds(bool refused, std::string_view form) {
  if (!refused) return Ok();
  return MakeError(ErrorCode::kUnsupported,
                   fmt::format("{}: the TP step over a space with kinds (TpConfig::kinds) is built for the host step "
                               "with attention at home only (TpStepPlanner over TpAttention::kAtHome): this form has "
                               "no step over it yet (docs/ARCHITECTURE.md, \"Kinds under TP\"); step it with "
                               "TpStepPlanner, or a DP space with kinds", form));
}

// Whether a TP space has kinds but not attention at home: the host step over kinds is built at
// home only (the space's Create refuses the local buffer with kinds, so this holds there too).
inline bool KindsWithoutHome(const TpConfig& config) {
  return !config.kinds.empty() && config.attention != TpAttention::kAtHome;
}

// Ok, or the refusal of a form that places new entries on the host (`form`, e.g.
// "StepPlanner::Create") over a space whose entries the device places
// (AddressSpaceConfig::device_placement): its Allocate leaves them unplaced, so only the
// device step, which applies the space's placement journal (DeviceStep::Place), steps it.
inline Status RefuseDevicePlacement(bool device_placement, std::string_view form) {
  if (!device_placement) return Ok();
  return MakeError(
      ErrorCode::kUnsupported,
      fmt::format("{}: AddressSpaceConfig.device_placement is on: Allocate hands out addresses that the device "
                  "step places (DeviceStep::Place), so this form, which reads locations the host placed, cannot "
                  "step the space; step it with DeviceStep or create the space with device_placement = false",
                  form));
}

// The form that moves exclusive entries only (the device step): both modes above, shadows
// first.
inline Status RefuseEngineModes(bool stable_new_entries, bool host_shadows, std::string_view config_name) {
  if (host_shadows) {
    return MakeError(ErrorCode::kUnsupported,
                     fmt::format("{}.host_shadows is on: the device step moves exclusive entries and keeps no "
                                 "host shadows (on a GPU the evictions a shadow saves cross the host link in the "
                                 "direction it has to spare: docs/ARCHITECTURE.md, \"Which form runs which mode\"); "
                                 "create the space with host_shadows = false (the host steps keep them)",
                                 config_name));
  }
  return RefuseUnstableNewEntries(stable_new_entries, config_name);
}

}  // namespace ula

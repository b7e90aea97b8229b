// PlannerForm: which form of the step a verifier drives (docs/ARCHITECTURE.md, "The step's
// forms today"). Every form gets the same workload and the same checks (VerifierConfig,
// TpVerifierConfig); a form that cannot run a configuration is refused with the reason.
#pragma once

#include <cstdint>
#include <string_view>

#include "ula/error.h"

namespace ula {

enum class PlannerForm : std::uint8_t {
  kHost,    // the serial host step, the reference: StepPlanner (DP), TpStepPlanner (TP)
  kEngine,  // StepPlanner's Plan, the copies, Complete (TP: TpStepPlanner)
  kDevice,  // DeviceStep's OpenMP form, bracketed by Reload and StoreInto (TP: one per rank)
};
const char* PlannerFormName(PlannerForm form);
// "host", "engine", "device"; kInvalidArgument otherwise, naming the choices.
Result<PlannerForm> ParsePlannerForm(std::string_view name);

}  // namespace ula

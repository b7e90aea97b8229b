// PlannerForm: which form of the step a verifier drives (docs/ARCHITECTURE.md, "The step's
// forms today"). Every form gets the same workload and the same checks (VerifierConfig,
// TpVerifierConfig); a form that cannot run a configuration is refused with the reason.
#pragma once

#include <cstdint>
#include <string_view>

#include "ula/error.h"

namespace ula {

enum class PlannerForm : std::uint8_t {
  kCpu,      // the CPU reference: StepPlanner (DP), TpStepPlanner (TP)
  kKernels,  // the step's kernels in their OpenMP form: KernelStepPlanner, TpKernelStepPlanner
  kEngine,   // DP: EngineStepPlanner's Plan, the copies, Complete
  kDevice,   // DP: DeviceStep's OpenMP form, bracketed by Reload and StoreInto
};
const char* PlannerFormName(PlannerForm form);
// "cpu", "kernels", "engine", "device"; kInvalidArgument otherwise, naming the choices.
Result<PlannerForm> ParsePlannerForm(std::string_view name);

}  // namespace ula

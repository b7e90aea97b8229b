#include "verify/planner_form.h"

#include <fmt/format.h>

namespace ula {

const char* PlannerFormName(PlannerForm form) {
  switch (form) {
    case PlannerForm::kCpu: return "cpu";
    case PlannerForm::kKernels: return "kernels";
    case PlannerForm::kEngine: return "engine";
    case PlannerForm::kDevice: return "device";
  }
  return "?";
}

Result<PlannerForm> ParsePlannerForm(std::string_view name) {
  for (PlannerForm f : {PlannerForm::kCpu, PlannerForm::kKernels, PlannerForm::kEngine, PlannerForm::kDevice}) {
    if (name == PlannerFormName(f)) return f;
  }
  return MakeError(ErrorCode::kInvalidArgument, fmt::format("planner form '{}': one of cpu, kernels, engine, device", name));
}

}  // namespace ula

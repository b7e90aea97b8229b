#include "verify/planner_form.h"

#include <fmt/format.h>

namespace ula {

const char* PlannerFormName(PlannerForm form) {
  switch (form) {
    case PlannerForm::kHost: return "host";
    case PlannerForm::kEngine: return "engine";
    case PlannerForm::kDevice: return "device";
  }
  return "?";
}

Result<PlannerForm> ParsePlannerForm(std::string_view name) {
  for (PlannerForm f : {PlannerForm::kHost, PlannerForm::kEngine, PlannerForm::kDevice}) {
    if (name == PlannerFormName(f)) return f;
  }
  return MakeError(ErrorCode::kInvalidArgument, fmt::format("planner form '{}': one of host, engine, device", name));
}

}  // namespace ula

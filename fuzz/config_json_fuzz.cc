// Every JSON config loader from arbitrary text: the first byte picks the loader (hardware,
// model, workload, decode schedule, scenario, model costs, compute rates), the rest is the
// JSON text. Properties: no crash, no exception escapes, no unbounded allocation; a
// refusal is an error value with a message naming what was wrong.
#include <string>
#include <string_view>

#include "fuzz_input.h"
#include "config/hardware_config.h"
#include "workload/indexer_decode.h"
#include "config/model_config.h"
#include "serving/serving_config.h"
#include "workload/workload.h"

namespace {

template <typename R>
void Expect(const R& r) {
  if (!r) FUZZ_CHECK(!r.error().ToString().empty(), "a refusal without a message");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ula;
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 7) {
    case 0: Expect(ParseHardwareConfig(text)); break;
    case 1: Expect(ParseModelConfig(text)); break;
    case 2: Expect(ParseWorkloadConfig(text)); break;
    case 3: Expect(ParseDecodeSimConfig(text)); break;
    case 4: Expect(ParseScenarioConfig(text)); break;
    case 5: Expect(ParseModelCostConfig(text)); break;
    default: Expect(ParseComputeRates(text)); break;
  }
  return 0;
}

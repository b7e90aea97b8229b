// Attention through UlaCache vs a dense reference (docs/ARCHITECTURE.md invariant 4, end to end).
//
// RunAttentionCheck drives decode steps on an existing DP AddressSpace: per step, every
// request appends one token (Allocate + Write of its entry in every group); per group, a
// real indexer (one IndexerDecodeSim per group, as each group has its own indexer) selects
// the top-k of 1 + draft queries per request; the StepPlanner makes the union resident and
// returns device slots; then, for every request, query, group and layer of the group, the
// reference sparse MLA attention runs twice on the same query and selection order — once
// reading AddressSpace::DeviceSlotData at the returned slots, once reading a dense store
// that never moves — and the two outputs are compared bit for bit (one check each). The
// entry bytes read at each slot are compared with the dense copy as well.
//
// Entries are float32 (a ModelConfig with is_float32(): group entry = layers side by side,
// layer = [kv_lora_rank | rope]). The space's config must match the model:
// num_groups == model.num_groups() and entry_bytes == model.group_entry_bytes().
// Requests get ids first_request_id.. on ranks round-robin and are freed at the end.
//
// Thread-safety: as AddressSpace (one driver thread).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ula/address_space.h"
#include "ula/error.h"
#include "config/model_config.h"
#include "ula/residency_policy.h"
#include "ula/step_planner.h"

namespace ula {

struct AttentionCheckOptions {
  ModelConfig model;                 // float32 test model, e.g. configs/models/tiny_glm.json
  std::uint32_t num_requests = 4;
  std::uint32_t prompt_tokens = 512;
  std::uint32_t decode_steps = 16;
  std::uint32_t draft_tokens = 2;
  std::uint64_t seed = 1;
  std::uint64_t first_request_id = 1'000'000;

  Status Validate() const;  // names the first bad field
};

struct AttentionCheckReport {
  std::uint64_t steps = 0;
  std::uint64_t checks = 0;            // attention outputs compared
  std::uint64_t mismatches = 0;        // outputs that differ in any bit
  std::uint64_t entries_checked = 0;   // entry reads compared with the dense store
  std::uint64_t entry_mismatches = 0;
  std::uint64_t steps_with_swaps = 0;  // (step, rank, group) planner calls that evicted
  std::uint64_t planner_calls = 0;
  StepStats planner;                   // summed over all planner calls
  std::vector<std::string> first_failures;  // at most 8
  bool ok() const { return mismatches == 0 && entry_mismatches == 0; }
};

Result<AttentionCheckReport> RunAttentionCheck(AddressSpace& space, const AttentionCheckOptions& options);

// Builds a CPU backend and a DP address space (`num_ranks`) whose device pool holds
// `device_fraction` of the live entries of each rank (memory pressure: swaps every step),
// with a host pool for the rest, and runs RunAttentionCheck on it.
Result<AttentionCheckReport> RunAttentionCheckUnderPressure(const AttentionCheckOptions& options,
                                                            double device_fraction = 0.5,
                                                            std::uint32_t num_ranks = 1,
                                                            PolicyKind policy = DefaultPolicyKind());

}  // namespace ula

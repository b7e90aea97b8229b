// KindSpaceAdmission: UlaCache's admission of a model with layer kinds (DeepSeek-V4) from a
// run of its address space, not from accounting (docs/COST_MODEL.md "Kinds").
//
// Per GPU, the admission core of one DP space over kind frames (AddressSpaceConfig::
// kind_frame_bytes = kKindFrameBytes; src/space/frame_share.h): KindEntries over one rank's
// KindFrames (space/kind_entries.h), what AddressSpace::Allocate admits by, without the C4
// entries' directory and pools (kind_space_admission_test runs the whole space beside it:
// the same admission and budgets). Every kind of
// the model (SpaceConfigOfModel; the MTP layer's window only with MTP on, the ring's drafts
// the workload's) carved from the GPU's device KV budget, its host tier the GPU's host
// budget in C4 entries. The CSA layers are one group of their 21 layers: a C4 entry's place
// is the same in every group of a space over frames (KindBudget::c4_on_device), so one group
// admits what 21 do, at 1/21 of the work. Requests arrive in order and are prefilled as an
// engine does, in chunks of prefill_chunk_tokens (AddRequest, then CheckAppend, Append and
// EndRound per chunk, as Allocate and AdvanceRound do: a chunk's round holds its whole window,
// ARCHITECTURE "Kinds"); the first request whose Allocate is refused is freed and stops
// admission: it is not counted, and every later request waits behind it.
//
//   DP: request i runs on rank i mod P, each rank its own space (one budget per GPU).
//   TP: every rank holds 1/P of each request (striped); the ranks are alike, so one space
//       runs, each request there its ceil(L / P) tokens. The window ring is then held whole
//       on that rank (the TP space with kinds keeps it whole on one rank per request; this
//       core models no TP space yet, ARCHITECTURE "Kinds under TP"), which overstates the window by 7/8 of 128 tokens a request.
//
// Thread-safety: reentrant (each call owns its spaces). Determinism: a pure function of
// its arguments.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "serving/serving_config.h"
#include "ula/address_space.h"
#include "ula/error.h"

namespace ula {

struct KindSpaceSetup {
  ParallelMode mode = ParallelMode::kDp;
  std::uint32_t num_ranks = 8;
  bool mtp = false;
  std::uint32_t draft_tokens = 0;  // with MTP: the most a round rolls back (the window ring's slack)
  double device_bytes = 0;         // per GPU: KV budget, cut into whole frames
  double host_bytes = 0;           // per GPU: the C4 host tier
  std::uint32_t prefill_chunk_tokens = 8192;
};

struct KindSpaceRun {
  std::uint32_t admitted = 0;
  // "" if every request fit; "device" when the refused request's resident kinds found no
  // free frame, "space" when its C4 entries passed the device share plus the host tier,
  // "round" when the frames it needed held only entries of its own chunk.
  std::string binds;
  std::string refusal;                // the space's error for the refused request
  std::vector<KindBudget> ranks;      // [ranks run] each space's budget after the admitted requests
  std::vector<std::string> kinds;     // [kinds] the space's kind names (KindBudget::frames_of_kind)
  // [admitted + 1]: of the C4 entries the first b admitted requests hold (all ranks), the
  // share on host; [0] = 0.
  std::vector<double> host_share_csa;
  // [admitted + 1]: the C4 entries the first b admitted requests hold (all ranks run).
  std::vector<std::uint64_t> c4_entries_csa;
  std::uint32_t frames_per_rank = 0;
  std::uint64_t c4_entry_bytes = 0;   // one C4 entry over every CSA layer
};

// kInvalidArgument for a bad setup (no frame fits the budget, no ranks), kFailedPrecondition
// for a model without layer kinds; a space error other than a refusal is returned as is.
Result<KindSpaceRun> RunKindSpace(const ModelConfig& model, const KindSpaceSetup& setup,
                                  std::span<const std::uint32_t> final_tokens);

}  // namespace ula

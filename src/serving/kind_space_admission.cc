// UlaCache's V4 admission from a run of the space (kind_space_admission.h).
#include "serving/kind_space_admission.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "config/model_kinds.h"
#include "space/frame_share.h"
#include "ula/backend.h"

namespace ula {
namespace {

// The model as the run holds it: without MTP its MTP layers are not served.
ModelConfig ServedModel(const ModelConfig& model, bool mtp) {
  ModelConfig m = model;
  if (!mtp && m.mtp_layers > 0) {
    m.mtp_layers = 0;
    m.compress_ratios.resize(m.num_layers);
  }
  // One group of every CSA layer (the header: a C4 entry's place is the same in every group).
  m.layers_per_group = std::max<std::uint32_t>(1, m.num_layers);
  return m;
}

// The space's admission core: KindEntries over one rank's KindFrames, the classes
// AddressSpace::Allocate admits by (space/kind_entries.h), without the C4 entries' directory
// and pools, whose per-entry work changes no admission (kind_space_admission_test runs the
// whole space beside it: the same count and budgets).
struct AdmissionCore {
  std::unique_ptr<KindFrames> frames;
  std::unique_ptr<KindEntries> entries;
  KindBudget Budget() const { return BudgetOf(*frames, *entries); }  // new entries fill the device share first
};

// One rank's run over its requests (their lengths, in order), stopping at its first refusal:
// each admitted request's budget after it. The core starts empty and is left empty (every
// request freed), so the next rank's run reuses it.
struct RankRun {
  std::vector<KindBudget> after;  // [admitted here]
  bool refused = false;
  std::string refusal;
  KindBudget start;
};

Result<RankRun> RunOneSpace(AdmissionCore& core, const KindSpaceSetup& setup, std::span<const std::uint32_t> tokens) {
  RankRun run;
  run.start = core.Budget();
  KindEntries& e = *core.entries;
  std::size_t added = 0;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const RequestId r(static_cast<std::uint32_t>(i + 1));
    ULA_RETURN_IF_ERROR(e.AddRequest(r));
    ++added;
    Status refused = Ok();
    for (std::uint32_t done = 0; done < tokens[i];) {  // prefill in chunks, a round each
      const std::uint32_t chunk = std::min(setup.prefill_chunk_tokens, tokens[i] - done);
      auto made = e.CheckAppend(r, chunk);
      if (!made) {
        if (made.error().code() != ErrorCode::kResourceExhausted) return std::unexpected(made.error());
        refused = std::unexpected(made.error());
        break;
      }
      e.Append(r, chunk);
      e.EndRound();  // the chunk's round ends: the window ring keeps what later rounds read
      done += chunk;
    }
    if (!refused) {
      run.refused = true;
      run.refusal = refused.error().message();
      break;  // the refused request is not counted (the engine aborts it; its space goes with it)
    }
    run.after.push_back(core.Budget());
  }
  for (std::size_t i = 0; i < added; ++i) ULA_RETURN_IF_ERROR(e.Free(RequestId(static_cast<std::uint32_t>(i + 1))));
  return run;
}

std::string BindsOf(const std::string& refusal) {
  if (refusal.find("resident kinds' new blocks") != std::string::npos) return "device";
  if (refusal.find("used in this round") != std::string::npos) return "round";
  return "space";
}

}  // namespace

Result<KindSpaceRun> RunKindSpace(const ModelConfig& model, const KindSpaceSetup& setup,
                                  std::span<const std::uint32_t> final_tokens) {
  if (setup.num_ranks == 0 || setup.prefill_chunk_tokens == 0 || !(setup.device_bytes >= 0) || !(setup.host_bytes >= 0)) {
    return MakeError(ErrorCode::kInvalidArgument, "kind space setup: num_ranks and prefill_chunk_tokens must be > 0");
  }
  const std::uint64_t frames = static_cast<std::uint64_t>(setup.device_bytes / double(kKindFrameBytes));
  if (frames == 0) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("kind space setup: device_bytes {:.0f} holds no frame of {} B", setup.device_bytes, kKindFrameBytes));
  }
  const ModelConfig served = ServedModel(model, setup.mtp);
  AddressSpaceConfig base;
  base.device_bytes_per_rank = frames * kKindFrameBytes;
  // New entries to free device slots, then host (the library path): an admission run writes
  // no token, so no write slot can go stale, and the device share fills the same.
  base.stable_new_entries = false;
  base.kind_frame_bytes = kKindFrameBytes;
  auto config = SpaceConfigOfModel(served, {.max_draft_tokens = setup.mtp ? setup.draft_tokens : 0}, base);
  if (!config) return std::unexpected(config.error());
  const std::uint64_t c4_entry_bytes = config->bytes_per_address();
  config->host_bytes_per_rank = static_cast<std::uint64_t>(setup.host_bytes / double(c4_entry_bytes)) * c4_entry_bytes;

  // TP: one space, each request's 1/P share; DP: rank k's requests k, k + P, ...
  const bool tp = setup.mode == ParallelMode::kTp;
  const std::uint32_t P = tp ? 1 : setup.num_ranks;
  const std::size_t n = final_tokens.size();
  std::size_t first_refused = n;  // global index of the first refused request
  ULA_RETURN_IF_ERROR(config->Validate());
  auto frames_made = KindFrames::Create({config->kinds, config->device_bytes_per_rank, config->kind_frame_bytes,
                                         /*take_from_top=*/true});
  if (!frames_made) return std::unexpected(frames_made.error());
  AdmissionCore space;  // every rank's run in turn, emptied between them
  space.frames = std::make_unique<KindFrames>(std::move(*frames_made));
  space.entries = std::make_unique<KindEntries>(config->kinds, space.frames.get(), config->host_slots_per_group());
  std::vector<RankRun> ranks(P);
  std::vector<std::vector<std::uint32_t>> seqs(P);
  std::vector<std::string> refusal(P);
  for (std::uint32_t k = 0; k < P; ++k) {
    // Only the requests before the first refusal found so far matter (arrival order).
    for (std::size_t i = k; i < first_refused; i += P) {
      seqs[k].push_back(tp ? (final_tokens[i] + setup.num_ranks - 1) / setup.num_ranks : final_tokens[i]);
    }
    // A rank whose requests are another's (the same lengths) admits the same: run once.
    std::uint32_t same = k;
    for (std::uint32_t o = 0; o < k && same == k; ++o) {
      if (seqs[o].size() >= seqs[k].size() && std::equal(seqs[k].begin(), seqs[k].end(), seqs[o].begin()) &&
          (ranks[o].refused || seqs[o].size() == seqs[k].size())) {
        same = o;
      }
    }
    if (same != k) {
      ranks[k] = ranks[same];
      if (ranks[k].after.size() > seqs[k].size()) ranks[k].after.resize(seqs[k].size()), ranks[k].refused = false;
    } else {
      auto run = RunOneSpace(space, setup, seqs[k]);
      if (!run) return std::unexpected(run.error());
      ranks[k] = std::move(*run);
    }
    if (ranks[k].refused) {
      const std::size_t g = k + ranks[k].after.size() * P;
      if (g < first_refused) first_refused = g;
    }
  }

  KindSpaceRun out;
  out.admitted = static_cast<std::uint32_t>(first_refused);
  out.frames_per_rank = static_cast<std::uint32_t>(frames);
  out.c4_entry_bytes = c4_entry_bytes;
  for (const KvKind& kind : config->kinds) out.kinds.push_back(kind.name);
  if (first_refused < n) {
    out.refusal = ranks[first_refused % P].refusal;
    out.binds = BindsOf(out.refusal);
  }
  // Each rank's budget after its requests before the first refusal; the host share of every
  // prefix of the admitted requests.
  out.host_share_csa.assign(1, 0.0);
  out.c4_entries_csa.assign(1, 0);
  std::vector<const KindBudget*> at(P);
  for (std::uint32_t k = 0; k < P; ++k) at[k] = &ranks[k].start;
  std::uint64_t c4 = 0, on_device = 0;
  for (std::size_t i = 0; i < first_refused; ++i) {
    const std::uint32_t k = static_cast<std::uint32_t>(i % P);
    const KindBudget& next = ranks[k].after[i / P];
    c4 += next.c4_entries - at[k]->c4_entries;
    on_device = on_device + next.c4_on_device - at[k]->c4_on_device;
    at[k] = &next;
    out.host_share_csa.push_back(c4 > 0 ? double(c4 - on_device) / double(c4) : 0.0);
    out.c4_entries_csa.push_back(c4);
  }
  for (std::uint32_t k = 0; k < P; ++k) out.ranks.push_back(*at[k]);
  return out;
}

}  // namespace ula

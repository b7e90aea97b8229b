// Placement rules and admission of the systems (baselines.h). The ledger only counts
// bytes; the decode simulation (serving_sim.cc) also runs each system's real placement.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "serving/baselines.h"

namespace ula {
namespace {

Status FieldError(std::string_view field, std::string_view problem) {
  return MakeError(ErrorCode::kInvalidArgument, fmt::format("field '{}': {}", field, problem));
}

}  // namespace

std::string_view SystemName(SystemKind s) {
  switch (s) {
    case SystemKind::kAllGpu: return "all_gpu";
    case SystemKind::kHiSparse: return "hisparse";
    case SystemKind::kUlaCache: return "ulacache";
    case SystemKind::kUlaCacheAtHome: return "ulacache_home";
    case SystemKind::kDcp: return "dcp";
    case SystemKind::kDcpSglang: return "dcp_sglang";
    case SystemKind::kHelix: return "helix";
    case SystemKind::kVllmHiSparse: return "vllm_hisparse";
    case SystemKind::kTrtllmOffload: return "trtllm_offload";
  }
  return "?";
}

bool SystemRunsIn(SystemKind s, ParallelMode mode) {
  const bool tp_only = s == SystemKind::kUlaCacheAtHome || IsContextParallel(s);
  return !tp_only || mode == ParallelMode::kTp;
}

Status PlacementRules::Validate() const {
  if (num_ranks == 0) return FieldError("num_ranks", "must be >= 1");
  if (!(device_bytes_per_rank >= 0)) return FieldError("device_bytes_per_rank", "must be >= 0");
  if (!(host_bytes_per_rank >= 0)) return FieldError("host_bytes_per_rank", "must be >= 0");
  if (!(kv_bytes_per_token > 0)) return FieldError("kv_bytes_per_token", "must be > 0");
  if (!(index_bytes_per_token >= 0)) return FieldError("index_bytes_per_token", "must be >= 0");
  if ((system == SystemKind::kHiSparse || system == SystemKind::kVllmHiSparse || system == SystemKind::kTrtllmOffload) &&
      hisparse_buffer_entries == 0) {
    return FieldError("hisparse_buffer_entries", "must be >= 1");
  }
  if (IsUlaCache(system) && working_set_entries == 0) return FieldError("working_set_entries", "must be >= 1");
  if (system == SystemKind::kUlaCache && mode == ParallelMode::kTp && tp_buffer_entries == 0) {
    return FieldError("tp_buffer_entries", "must be >= 1");
  }
  if (IsContextParallel(system) && mode != ParallelMode::kTp) {
    return FieldError("mode", fmt::format("{} is TP only (it stripes the KV over the TP ranks)", SystemName(system)));
  }
  if (system == SystemKind::kHelix && helix_tokens_per_block == 0) return FieldError("helix_tokens_per_block", "must be >= 1");
  if (system == SystemKind::kUlaCacheAtHome) {
    if (mode != ParallelMode::kTp) {
      return FieldError("mode", "ulacache_home is TP only (in DP mode attention is already where the entries live)");
    }
    if (tp_buffer_entries != 0) return FieldError("tp_buffer_entries", "must be 0 for ulacache_home (no local buffer)");
  }
  return Ok();
}

double HiSparseHostPoolBytes(const PlacementRules& r, double ratio) {
  const double kv = r.kv_bytes_per_token, ix = r.index_bytes_per_token, dev = r.device_bytes_per_rank;
  double pool = 0;
  if (std::isinf(ratio)) {
    pool = ix > 0 ? dev * kv / ix : ratio;
  } else {
    pool = ratio * dev * kv / (kv + ratio * ix);
  }
  return std::min(r.host_bytes_per_rank, pool);
}

double HiSparseMatchedRatio(const PlacementRules& r) {
  const double kv = r.kv_bytes_per_token, ix = r.index_bytes_per_token;
  const double denom = r.device_bytes_per_rank * kv - r.host_bytes_per_rank * ix;
  if (!(denom > 0)) return std::numeric_limits<double>::infinity();
  return std::max(1.0, r.host_bytes_per_rank * kv / denom);
}

double FillOf(const PlacementRules& r, double stored_tokens, double host_budget_bytes) {
  const double memory = r.num_ranks * (r.device_bytes_per_rank + host_budget_bytes);
  return memory > 0 ? stored_tokens * (r.kv_bytes_per_token + r.index_bytes_per_token) / memory : 0;
}

double HelixRankTokens(std::uint32_t t, std::uint32_t block, std::uint32_t ranks) {
  const double blocks = std::ceil(t / double(block));
  return std::min<double>(t, std::ceil(blocks / ranks) * block);
}

RankDemand DemandOf(const PlacementRules& r, std::uint32_t t) {
  const double kv = r.kv_bytes_per_token, ix = r.index_bytes_per_token;
  RankDemand d;
  switch (r.system) {
    case SystemKind::kAllGpu:
      d.device = t * (kv + ix);
      break;
    case SystemKind::kTrtllmOffload:  // its GPU cache in the buffer's place
    case SystemKind::kHiSparse:
      d.device = r.hisparse_buffer_entries * kv + t * ix;
      d.host = t * kv;
      break;
    case SystemKind::kDcp:
      d.device = std::ceil(t / double(r.num_ranks)) * (kv + ix);
      break;
    case SystemKind::kDcpSglang:
      d.device = std::ceil(t / double(r.num_ranks)) * kv + t * ix;
      break;
    case SystemKind::kHelix:
      d.device = HelixRankTokens(t, r.helix_tokens_per_block, r.num_ranks) * (kv + ix);
      break;
    case SystemKind::kVllmHiSparse:
      d.device = t * ix + double(r.hisparse_buffer_entries + r.tail_entries) * kv;
      d.host = r.mode == ParallelMode::kTp ? t * kv / r.num_ranks : t * kv;  // TP: one host pool for the node
      // The pages admission reserves in the window beyond the tail (the tail is reserved above).
      d.device_transient = std::max(0.0, std::min<double>(t, r.admission_window_entries) - r.tail_entries) * kv;
      break;
    case SystemKind::kUlaCache:
    case SystemKind::kUlaCacheAtHome: {
      // ulacache_home is TP only and has tp_buffer_entries == 0 (Validate): the TP branch
      // below without the local buffer.
      const double w = std::min<double>(t, r.working_set_entries);
      if (r.mode == ParallelMode::kDp) {
        d.device = t * ix + w * kv;
        d.either = (t - w) * kv;
      } else {
        const double p = r.num_ranks;
        const double shard = std::ceil(t / p), ws = std::ceil(w / p);
        d.device = shard * ix + ws * kv + r.tp_buffer_entries * kv;
        d.either = (shard - ws) * kv;
      }
      break;
    }
  }
  return d;
}

AdmissionLedger::AdmissionLedger(const PlacementRules& rules)
    : rules_(rules), device_(rules.num_ranks, 0.0), host_(rules.num_ranks, 0.0), either_(rules.num_ranks, 0.0) {}

Result<AdmissionLedger> AdmissionLedger::Create(const PlacementRules& rules) {
  if (auto s = rules.Validate(); !s) return std::unexpected(s.error());
  return AdmissionLedger(rules);
}

bool AdmissionLedger::FitsOn(std::uint32_t rank, std::uint32_t t) const {
  const RankDemand d = DemandOf(rules_, t);
  const double dev = rules_.device_bytes_per_rank, host = rules_.host_bytes_per_rank;
  // Flexible bytes can sit on either tier, so three sums decide.
  auto fits = [&](std::uint32_t r) {
    return device_[r] + d.device + d.device_transient <= dev && host_[r] + d.host <= host &&
           device_[r] + host_[r] + either_[r] + d.device + d.device_transient + d.host + d.either <= dev + host;
  };
  if (rules_.mode == ParallelMode::kTp) {
    for (std::uint32_t r = 0; r < rules_.num_ranks; ++r) {
      if (!fits(r)) return false;
    }
    return true;
  }
  return fits(rank);
}

void AdmissionLedger::Add(std::uint32_t rank, const RankDemand& d, double sign) {
  auto add_one = [&](std::uint32_t r) {
    device_[r] += sign * d.device;
    host_[r] += sign * d.host;
    either_[r] += sign * d.either;
  };
  if (rules_.mode == ParallelMode::kTp) {
    for (std::uint32_t r = 0; r < rules_.num_ranks; ++r) add_one(r);
  } else {
    add_one(rank);
  }
}

std::optional<std::uint32_t> AdmissionLedger::TryAdmit(std::uint32_t t) {
  std::uint32_t best = 0;
  if (rules_.mode == ParallelMode::kDp) {
    double best_free = -1;
    for (std::uint32_t r = 0; r < rules_.num_ranks; ++r) {
      const double free = rules_.device_bytes_per_rank + rules_.host_bytes_per_rank - device_[r] - host_[r] - either_[r];
      if (FitsOn(r, t) && free > best_free) {
        best = r;
        best_free = free;
      }
    }
    if (best_free < 0) return std::nullopt;
  } else if (!FitsOn(0, t)) {
    return std::nullopt;
  }
  Add(best, DemandOf(rules_, t), +1);
  ++admitted_;
  return best;
}

void AdmissionLedger::Release(std::uint32_t rank, std::uint32_t t) {
  Add(rank, DemandOf(rules_, t), -1);
  --admitted_;
}

std::uint32_t MaxAdmitted(const PlacementRules& rules, std::span<const std::uint32_t> history_tokens) {
  auto ledger = AdmissionLedger::Create(rules);
  if (!ledger) return 0;
  for (std::uint32_t t : history_tokens) {
    if (!ledger->TryAdmit(t)) break;
  }
  return ledger->admitted();
}

}  // namespace ula

// RunAttentionCheck (attention_check.h).
#include "verify/attention_check.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "workload/rng.h"
#include "ula/backend.h"
#include "workload/indexer_decode.h"
#include "ula/reference_attention.h"

namespace ula {
namespace {

struct RequestState {
  RequestId id;
  Rank rank;
  std::vector<LogicalAddr> addrs;  // by position
  // Dense reference store: [group][position * group_entry_bytes], never moves.
  std::vector<std::vector<std::byte>> dense;
};

void Fail(AttentionCheckReport& report, std::string what) {
  if (report.first_failures.size() < 8) report.first_failures.push_back(std::move(what));
}

}  // namespace

Status AttentionCheckOptions::Validate() const {
  auto bad = [](const char* f, std::string_view why) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("field '{}': {}", f, why));
  };
  ULA_RETURN_IF_ERROR(model.Validate());
  if (!model.is_float32()) return bad("model", "the reference attention needs a float32 model (no scales)");
  if (num_requests == 0) return bad("num_requests", "must be >= 1");
  if (prompt_tokens == 0) return bad("prompt_tokens", "must be >= 1");
  if (decode_steps < 2) return bad("decode_steps", "must be >= 2");
  if (draft_tokens > 16) return bad("draft_tokens", "must be <= 16");
  return Ok();
}

Result<AttentionCheckReport> RunAttentionCheck(AddressSpace& space, const AttentionCheckOptions& options) {
  ULA_RETURN_IF_ERROR(options.Validate());
  const ModelConfig& m = options.model;
  const AddressSpaceConfig& sc = space.config();
  if (sc.num_groups != m.num_groups() || sc.entry_bytes != m.group_entry_bytes()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("address space has {} groups of {} B entries; model {} needs {} groups of {} B",
                                 sc.num_groups, sc.entry_bytes, m.name, m.num_groups(), m.group_entry_bytes()));
  }
  if (!space.backend().holds_bytes()) {
    return MakeError(ErrorCode::kUnsupported, "attention check needs a backend that holds bytes");
  }
  const std::uint32_t groups = m.num_groups();
  const std::uint32_t entry_bytes = m.group_entry_bytes();
  const std::uint32_t layer_bytes = m.kv_entry_bytes_per_layer;
  const MlaShape shape{m.attention_heads, m.kv_lora_rank, m.qk_rope_head_dim,
                       1.0f / std::sqrt(static_cast<float>(m.kv_lora_rank + m.qk_rope_head_dim))};
  const IndexerShape ishape = m.indexer_shape();
  DecodeSimConfig sim_cfg;
  sim_cfg.model = m.name;
  sim_cfg.seed = options.seed;
  sim_cfg.num_requests = options.num_requests;
  sim_cfg.prompt_tokens = options.prompt_tokens;
  sim_cfg.decode_steps = options.decode_steps;
  sim_cfg.draft_tokens = options.draft_tokens;
  sim_cfg.query_keep = 1.0;
  sim_cfg.query_noise = 0.4;
  sim_cfg.query_newest = 0.2;
  sim_cfg.sink_tokens = std::min(options.prompt_tokens, 2u);
  sim_cfg.sink_boost = 2.0;
  sim_cfg.sink_align = 1.0;
  std::vector<std::unique_ptr<IndexerDecodeSim>> indexers;
  for (std::uint32_t g = 0; g < groups; ++g) {
    auto sim = IndexerDecodeSim::Create(ishape, sim_cfg, g);
    if (!sim) return std::unexpected(sim.error());
    indexers.push_back(std::move(*sim));
  }

  workload_internal::Rng rng(workload_internal::StreamSeed(options.seed, 0xa77e));
  std::vector<float> values(entry_bytes / 4);
  auto append_tokens = [&](RequestState& req, std::uint32_t n) -> Status {
    auto addrs = space.Allocate(req.id, n);
    if (!addrs) return std::unexpected(addrs.error());
    for (LogicalAddr a : *addrs) {
      req.addrs.push_back(a);
      for (std::uint32_t g = 0; g < groups; ++g) {
        for (float& v : values) v = static_cast<float>(rng.Normal());
        const auto bytes = std::as_bytes(std::span<const float>(values));
        ULA_RETURN_IF_ERROR(space.Write(a, GroupId(static_cast<std::uint16_t>(g)), bytes));
        req.dense[g].insert(req.dense[g].end(), bytes.begin(), bytes.end());
      }
    }
    return Ok();
  };

  std::vector<RequestState> reqs(options.num_requests);
  auto cleanup = [&]() {
    for (const RequestState& r : reqs) {
      if (r.id.valid()) (void)space.Free(r.id);
    }
  };
  for (std::uint32_t i = 0; i < options.num_requests; ++i) {
    RequestState& r = reqs[i];
    const RequestId id(options.first_request_id + i);
    if (auto st = space.AddRequest(id, Rank(static_cast<std::uint16_t>(i % sc.num_ranks))); !st) {
      cleanup();
      return std::unexpected(st.error());
    }
    r.id = id;
    r.rank = Rank(static_cast<std::uint16_t>(i % sc.num_ranks));
    r.dense.resize(groups);
    if (auto st = append_tokens(r, options.prompt_tokens); !st) {
      cleanup();
      return std::unexpected(st.error());
    }
  }

  space.AdvanceRound();  // prefill was its own round: its entries may be evicted now
  AttentionCheckReport report;
  StepPlanner planner(space);
  const std::uint32_t queries = 1 + options.draft_tokens;
  std::vector<LogicalAddr> sel;
  std::vector<SelectionRun> sel_runs;
  std::vector<SlotId> slots;
  std::vector<std::pair<std::uint32_t, std::size_t>> spans;  // (request, offset into sel) per query
  std::vector<const std::byte*> via_slots, via_dense;
  std::vector<float> query(shape.query_values()), out_a(shape.output_values()), out_b(shape.output_values());
  auto run = [&]() -> Status {
    for (std::uint32_t step = 0; step < options.decode_steps; ++step) {
      for (RequestState& r : reqs) ULA_RETURN_IF_ERROR(append_tokens(r, 1));
      for (std::uint32_t g = 0; g < groups; ++g) {
        ULA_RETURN_IF_ERROR(indexers[g]->Step());
        const GroupId gid(static_cast<std::uint16_t>(g));
        for (std::uint32_t rank = 0; rank < sc.num_ranks; ++rank) {
          sel.clear();
          sel_runs.clear();
          spans.clear();
          for (std::uint32_t i = rank; i < reqs.size(); i += sc.num_ranks) {
            const std::size_t first = sel.size();
            for (const auto& q : indexers[g]->Selections(i)) {
              spans.emplace_back(i, sel.size());
              for (std::uint32_t p : q) sel.push_back(reqs[i].addrs.at(p));
            }
            sel_runs.push_back(SelectionRun{reqs[i].id, static_cast<std::uint32_t>(sel.size() - first)});
          }
          if (sel.empty()) continue;
          slots.assign(sel.size(), SlotId());
          auto stats = planner.Step({Rank(static_cast<std::uint16_t>(rank)), gid, sel, sel_runs}, slots);
          if (!stats) return std::unexpected(stats.error());
          report.planner += *stats;
          ++report.planner_calls;
          if (stats->evictions > 0) ++report.steps_with_swaps;
          for (std::size_t qi = 0; qi < spans.size(); ++qi) {
            const auto [i, begin] = spans[qi];
            const std::size_t end = qi + 1 < spans.size() ? spans[qi + 1].second : sel.size();
            const RequestState& r = reqs[i];
            const auto& positions = indexers[g]->Selections(i)[qi % queries];
            for (std::uint32_t layer = 0; layer < m.GroupLayers(g); ++layer) {
              via_slots.clear();
              via_dense.clear();
              for (std::size_t k = begin; k < end; ++k) {
                const std::byte* dev = space.DeviceSlotData(r.rank, gid, slots[k]);
                const std::byte* ref = r.dense[g].data() + std::size_t{positions[k - begin]} * entry_bytes;
                if (dev == nullptr) return MakeError(ErrorCode::kInternal, "DeviceSlotData returned null");
                via_slots.push_back(dev + std::size_t{layer} * layer_bytes);
                via_dense.push_back(ref + std::size_t{layer} * layer_bytes);
                if (layer == 0) {
                  ++report.entries_checked;
                  if (std::memcmp(dev, ref, entry_bytes) != 0) {
                    ++report.entry_mismatches;
                    Fail(report, fmt::format("step {} group {} request {} position {}: slot {} bytes differ", step, g,
                                             i, positions[k - begin], slots[k].value()));
                  }
                }
              }
              for (float& v : query) v = static_cast<float>(rng.Normal());
              ULA_RETURN_IF_ERROR(SparseMlaAttention(shape, query, via_slots, out_a));
              ULA_RETURN_IF_ERROR(SparseMlaAttention(shape, query, via_dense, out_b));
              ++report.checks;
              if (std::memcmp(out_a.data(), out_b.data(), out_a.size() * sizeof(float)) != 0) {
                ++report.mismatches;
                Fail(report, fmt::format("step {} group {} layer {} request {} query {}: attention output differs",
                                         step, g, layer, i, qi % queries));
              }
            }
          }
        }
      }
      space.AdvanceRound();
      ++report.steps;
    }
    return Ok();
  };
  Status st = run();
  cleanup();
  if (!st) return std::unexpected(st.error());
  return report;
}

Result<AttentionCheckReport> RunAttentionCheckUnderPressure(const AttentionCheckOptions& options,
                                                            double device_fraction, std::uint32_t num_ranks,
                                                            PolicyKind policy) {
  ULA_RETURN_IF_ERROR(options.Validate());
  if (!(device_fraction > 0 && device_fraction <= 1)) {
    return MakeError(ErrorCode::kInvalidArgument, "field 'device_fraction': must be in (0, 1]");
  }
  if (num_ranks == 0) return MakeError(ErrorCode::kInvalidArgument, "field 'num_ranks': must be >= 1");
  const ModelConfig& m = options.model;
  const std::uint64_t per_rank_requests = (options.num_requests + num_ranks - 1) / num_ranks;
  const std::uint64_t live = per_rank_requests * (std::uint64_t{options.prompt_tokens} + options.decode_steps);
  // The device pool must still hold one step's distinct selections.
  const std::uint64_t step_max = per_rank_requests * (1 + options.draft_tokens) * m.top_k;
  const std::uint64_t device_slots =
      std::max<std::uint64_t>(static_cast<std::uint64_t>(std::ceil(device_fraction * static_cast<double>(live))),
                              step_max + 1);
  AddressSpaceConfig cfg;
  cfg.num_ranks = num_ranks;
  cfg.num_groups = m.num_groups();
  cfg.entry_bytes = m.group_entry_bytes();
  cfg.device_bytes_per_rank = device_slots * cfg.entry_bytes * cfg.num_groups;
  cfg.host_bytes_per_rank = (live + 1) * cfg.entry_bytes * cfg.num_groups;
  cfg.policy = policy;
  auto backend = MakeCpuBackend();
  auto space = AddressSpace::Create(cfg, *backend);
  if (!space) return std::unexpected(space.error());
  return RunAttentionCheck(**space, options);
}

}  // namespace ula

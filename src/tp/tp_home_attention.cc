// Attention at home: partial -> exchange by head owner -> merge (tp_home_attention.h).
#include "ula/tp_home_attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace ula {

HeadRange OwnedHeads(std::uint32_t num_heads, std::uint32_t num_ranks, Rank rank) {
  const std::uint64_t r = rank.value();
  return HeadRange{static_cast<std::uint32_t>(r * num_heads / num_ranks),
                   static_cast<std::uint32_t>((r + 1) * num_heads / num_ranks)};
}

namespace {

Status Validate(const TpAddressSpace& space, const TpStepPlan& plan, GroupId group, const MlaShape& shape,
                std::span<const float> queries, std::span<const std::size_t> bounds, TpFabric* fabric,
                std::uint32_t layer_offset) {
  const TpConfig& cfg = space.config();
  if (cfg.attention != TpAttention::kAtHome) {
    return MakeError(ErrorCode::kFailedPrecondition, "attention at home needs TpConfig::attention = kAtHome");
  }
  if (group.value() >= cfg.num_groups) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("group {} is out of range", group.value()));
  }
  const auto hosted = space.hosted_ranks();
  if (!std::equal(plan.ranks.begin(), plan.ranks.end(), hosted.begin(), hosted.end()) ||
      plan.refs.size() != hosted.size()) {
    return MakeError(ErrorCode::kFailedPrecondition, "the plan's ranks are not the space's hosted ranks");
  }
  if (fabric == nullptr ? hosted.size() != cfg.num_ranks
                        : (hosted.size() != 1 || hosted[0] != fabric->local_rank() || fabric->num_ranks() != cfg.num_ranks)) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     "without a fabric every rank must be hosted; with one, exactly the fabric's local rank");
  }
  ULA_RETURN_IF_ERROR(shape.Validate());
  if (std::uint64_t{layer_offset} + shape.entry_bytes() > cfg.entry_bytes) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("layer at offset {} of {} B overruns the {} B entry",
                                                              layer_offset, shape.entry_bytes(), cfg.entry_bytes));
  }
  if (bounds.size() < 2 || bounds.front() != 0) {
    return MakeError(ErrorCode::kInvalidArgument, "bounds must hold n_queries + 1 >= 2 offsets starting at 0");
  }
  for (std::size_t j = 0; j + 1 < bounds.size(); ++j) {
    if (bounds[j + 1] <= bounds[j]) {
      return MakeError(ErrorCode::kInvalidArgument, fmt::format("query {} selects nothing (bounds not increasing)", j));
    }
  }
  for (const auto& refs : plan.refs) {
    if (refs.size() != bounds.back()) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("bounds end at {} but the plan has {} selections", bounds.back(), refs.size()));
    }
  }
  if (queries.size() != (bounds.size() - 1) * std::size_t{shape.query_values()}) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("{} query values for {} queries of {}", queries.size(),
                                                              bounds.size() - 1, shape.query_values()));
  }
  return Ok();
}

}  // namespace

Result<TpHomeAttention> AttendAtHome(const TpAddressSpace& space, const TpStepPlan& plan, GroupId group,
                                     const MlaShape& shape, std::span<const float> queries,
                                     std::span<const std::size_t> bounds, TpFabric* fabric, std::uint32_t layer_offset) {
  ULA_RETURN_IF_ERROR(Validate(space, plan, group, shape, queries, bounds, fabric, layer_offset));
  const std::uint32_t p = space.config().num_ranks;
  const std::size_t n_queries = bounds.size() - 1;
  const std::uint32_t record = shape.kv_lora_rank + 2;
  const std::size_t pv = PartialValues(shape);
  const std::size_t qv = shape.query_values();
  std::vector<HeadRange> owned(p);
  for (std::uint32_t q = 0; q < p; ++q) owned[q] = OwnedHeads(shape.num_heads, p, Rank(static_cast<std::uint16_t>(q)));

  TpHomeAttention result;
  result.ranks = plan.ranks;
  // 1. Partials: [hosted][query][head][record].
  std::vector<std::vector<float>> partials(plan.ranks.size(), std::vector<float>(n_queries * pv));
  std::vector<const std::byte*> entries;
  for (std::size_t h = 0; h < plan.ranks.size(); ++h) {
    for (std::size_t j = 0; j < n_queries; ++j) {
      entries.clear();
      for (std::size_t i = bounds[j]; i < bounds[j + 1]; ++i) {
        const TpReadRef ref = plan.refs[h][i];
        if (ref.source == TpReadRef::Source::kElsewhere) continue;
        const std::byte* data = space.RefData(plan.ranks[h], group, ref);
        if (data == nullptr) {
          return MakeError(ErrorCode::kFailedPrecondition,
                           fmt::format("rank {} selection {}: no bytes at its ref (counting backend, or a stale plan)",
                                       plan.ranks[h].value(), i));
        }
        entries.push_back(data + layer_offset);
      }
      result.entries_read += entries.size();
      ULA_RETURN_IF_ERROR(PartialMlaAttention(shape, queries.subspan(j * qv, qv), entries,
                                              std::span(partials[h]).subspan(j * pv, pv)));
    }
  }
  // 2. Exchange: the records of owner q's heads, for every query, in (query, head) order.
  auto block_of = [&](const std::vector<float>& mine, std::uint32_t q, std::vector<float>& out) {
    for (std::size_t j = 0; j < n_queries; ++j) {
      const float* first = mine.data() + j * pv + std::size_t{owned[q].begin} * record;
      out.insert(out.end(), first, first + std::size_t{owned[q].count()} * record);
    }
  };
  // received[hosted][source rank][query][owned head][record]
  std::vector<std::vector<float>> received(plan.ranks.size());
  for (std::size_t h = 0; h < plan.ranks.size(); ++h) {
    const std::uint32_t me = plan.ranks[h].value();
    for (std::uint32_t q = 0; q < p; ++q) {
      if (q != me) result.bytes_sent += n_queries * std::uint64_t{owned[q].count()} * record * sizeof(float);
    }
  }
  if (fabric == nullptr) {  // every rank hosted here
    std::vector<std::size_t> hosted_index(p);
    for (std::size_t h = 0; h < plan.ranks.size(); ++h) hosted_index[plan.ranks[h].value()] = h;
    for (std::size_t h = 0; h < plan.ranks.size(); ++h) {
      const std::uint32_t me = plan.ranks[h].value();
      for (std::uint32_t src = 0; src < p; ++src) block_of(partials[hosted_index[src]], me, received[h]);
    }
  } else {
    const std::uint32_t me = fabric->local_rank().value();
    std::vector<float> send;
    std::vector<std::size_t> send_counts(p), recv_counts(p);
    for (std::uint32_t q = 0; q < p; ++q) {
      const std::size_t before = send.size();
      block_of(partials[0], q, send);
      send_counts[q] = (send.size() - before) * sizeof(float);
      recv_counts[q] = n_queries * std::size_t{owned[me].count()} * record * sizeof(float);
    }
    received[0].resize(std::size_t{p} * n_queries * owned[me].count() * record);
    ULA_RETURN_IF_ERROR(fabric->AllToAllV(std::as_bytes(std::span(send)), send_counts,
                                          std::as_writable_bytes(std::span(received[0])), recv_counts));
  }
  // 3. Merge per owned head and query, records in rank order.
  const MlaShape one_head{.num_heads = 1, .kv_lora_rank = shape.kv_lora_rank, .rope_dim = shape.rope_dim,
                          .softmax_scale = shape.softmax_scale};
  std::vector<float> per_head(std::size_t{p} * record);
  for (std::size_t h = 0; h < plan.ranks.size(); ++h) {
    const HeadRange mine = owned[plan.ranks[h].value()];
    result.heads.push_back(mine);
    std::vector<float>& out = result.outputs.emplace_back(n_queries * std::size_t{mine.count()} * shape.kv_lora_rank);
    const std::size_t per_source = n_queries * std::size_t{mine.count()} * record;
    for (std::size_t j = 0; j < n_queries; ++j) {
      for (std::uint32_t k = 0; k < mine.count(); ++k) {
        for (std::uint32_t src = 0; src < p; ++src) {
          const float* rec = received[h].data() + src * per_source + (j * mine.count() + k) * record;
          std::copy_n(rec, record, per_head.begin() + std::ptrdiff_t(std::size_t{src} * record));
        }
        ULA_RETURN_IF_ERROR(MergeMlaPartials(
            one_head, per_head,
            std::span(out).subspan((j * mine.count() + k) * shape.kv_lora_rank, shape.kv_lora_rank)));
      }
    }
  }
  return result;
}

}  // namespace ula

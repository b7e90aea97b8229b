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

// Appends hosted rank h's entries of query j's selections (its shard refs, in selection
// order) to `entries`, each at the layer's offset.
Status AppendShardEntries(const TpAddressSpace& space, const TpStepPlan& plan, std::size_t h, GroupId group,
                          std::span<const std::size_t> bounds, std::size_t j, std::uint32_t layer_offset,
                          std::vector<const std::byte*>& entries) {
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
  return Ok();
}

// Steps 2 and 3 of attention at home, the one exchange and merge of every form: partials
// [hosted][query][head][record] of result.ranks, each hosted rank's owned heads gathered from
// every rank and merged per head and query in rank order (MergeMlaPartials). Fills
// result.heads, result.outputs and result.bytes_sent.
Status ExchangeAndMerge(const MlaShape& shape, std::uint32_t p, std::size_t n_queries,
                        const std::vector<std::vector<float>>& partials, TpFabric* fabric, TpHomeAttention& result) {
  const std::uint32_t record = shape.kv_lora_rank + 2;
  const std::size_t pv = PartialValues(shape);
  const std::vector<Rank>& ranks = result.ranks;
  std::vector<HeadRange> owned(p);
  for (std::uint32_t q = 0; q < p; ++q) owned[q] = OwnedHeads(shape.num_heads, p, Rank(static_cast<std::uint16_t>(q)));
  // 2. Exchange: the records of owner q's heads, for every query, in (query, head) order.
  auto block_of = [&](const std::vector<float>& mine, std::uint32_t q, std::vector<float>& out) {
    for (std::size_t j = 0; j < n_queries; ++j) {
      const float* first = mine.data() + j * pv + std::size_t{owned[q].begin} * record;
      out.insert(out.end(), first, first + std::size_t{owned[q].count()} * record);
    }
  };
  // received[hosted][source rank][query][owned head][record]
  std::vector<std::vector<float>> received(ranks.size());
  for (std::size_t h = 0; h < ranks.size(); ++h) {
    const std::uint32_t me = ranks[h].value();
    for (std::uint32_t q = 0; q < p; ++q) {
      if (q != me) result.bytes_sent += n_queries * std::uint64_t{owned[q].count()} * record * sizeof(float);
    }
  }
  if (fabric == nullptr) {  // every rank hosted here
    std::vector<std::size_t> hosted_index(p);
    for (std::size_t h = 0; h < ranks.size(); ++h) hosted_index[ranks[h].value()] = h;
    for (std::size_t h = 0; h < ranks.size(); ++h) {
      const std::uint32_t me = ranks[h].value();
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
  for (std::size_t h = 0; h < ranks.size(); ++h) {
    const HeadRange mine = owned[ranks[h].value()];
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
  return Ok();
}

}  // namespace

Result<TpHomeAttention> AttendAtHome(const TpAddressSpace& space, const TpStepPlan& plan, GroupId group,
                                     const MlaShape& shape, std::span<const float> queries,
                                     std::span<const std::size_t> bounds, TpFabric* fabric, std::uint32_t layer_offset) {
  ULA_RETURN_IF_ERROR(Validate(space, plan, group, shape, queries, bounds, fabric, layer_offset));
  const std::uint32_t p = space.config().num_ranks;
  const std::size_t n_queries = bounds.size() - 1;
  const std::size_t pv = PartialValues(shape);
  const std::size_t qv = shape.query_values();
  TpHomeAttention result;
  result.ranks = plan.ranks;
  // 1. Partials: [hosted][query][head][record].
  std::vector<std::vector<float>> partials(plan.ranks.size(), std::vector<float>(n_queries * pv));
  std::vector<const std::byte*> entries;
  for (std::size_t h = 0; h < plan.ranks.size(); ++h) {
    for (std::size_t j = 0; j < n_queries; ++j) {
      entries.clear();
      ULA_RETURN_IF_ERROR(AppendShardEntries(space, plan, h, group, bounds, j, layer_offset, entries));
      result.entries_read += entries.size();
      ULA_RETURN_IF_ERROR(PartialMlaAttention(shape, queries.subspan(j * qv, qv), entries,
                                              std::span(partials[h]).subspan(j * pv, pv)));
    }
  }
  ULA_RETURN_IF_ERROR(ExchangeAndMerge(shape, p, n_queries, partials, fabric, result));
  return result;
}

namespace {

// The kinds a layer reads beside C4: the window ring and the dense compressed kind (C128).
struct LayerKinds {
  std::uint32_t window = kNoCompanion, dense = kNoCompanion;
  std::uint32_t window_tokens = 0;  // the ring's tokens less its drafts
};

Result<LayerKinds> KindsOf(const TpConfig& cfg) {
  LayerKinds k;
  for (std::uint32_t i = 0; i < cfg.kinds.size(); ++i) {
    const KvKind& kind = cfg.kinds[i];
    if (kind.lifetime == KindLifetime::kRing) {
      k.window = i;
      k.window_tokens = kind.ring_tokens - kind.ring_draft_tokens;
    } else if (kind.lifetime == KindLifetime::kAppend && kind.placement == KindPlacement::kResident &&
               kind.companion_of == kNoCompanion) {
      k.dense = i;
    }
  }
  if (k.window == kNoCompanion) {
    return MakeError(ErrorCode::kFailedPrecondition, "the space's kinds have no window ring");
  }
  return k;
}

// Appends entries [from, to) of `pages`, rank `rank`'s page table of `request`'s kind `kind`,
// in order, from the engine's view.
Status AppendKindRows(const TpAddressSpace& space, const KindPages& pages, RequestId request, std::uint32_t kind,
                      Rank rank, std::uint32_t from, std::uint32_t to, const MlaShape& shape, const KindRowBytes& rows,
                      std::vector<const std::byte*>& entries) {
  if (shape.entry_bytes() > space.config().kinds[kind].row_bytes) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("a layer of {} B is wider than kind {}'s {}-byte row", shape.entry_bytes(),
                                 space.config().kinds[kind].name, space.config().kinds[kind].row_bytes));
  }
  for (std::uint32_t i = from; i < to; ++i) {
    const std::uint32_t pos = pages.first_offset + i;
    const std::uint32_t block = pages.blocks[pos / pages.entries_per_block];
    const std::uint32_t row = pos % pages.entries_per_block;
    const std::byte* data = rows ? rows(rank, kind, block, row) : nullptr;
    if (data == nullptr) {
      return MakeError(ErrorCode::kFailedPrecondition,
                       fmt::format("request {}: the engine holds no row of kind {} at block {} row {} on rank {}",
                                   request.value(), space.config().kinds[kind].name, block, row, rank.value()));
    }
    entries.push_back(data);
  }
  return Ok();
}

// Where query j sits: its request's window home and ring, and its token position.
struct QueryAt {
  Rank home;
  KindPages ring;            // the home's page table of the window
  std::uint32_t position;    // the query's token (< ring.tokens)
  std::uint32_t window_lo;   // its first window token: position + 1 - min(window, position + 1)
};

// Each query's place, every position checked before anything is read.
Result<std::vector<QueryAt>> PlaceQueries(const TpAddressSpace& space, const KindLayerInput& in,
                                          const LayerKinds& kinds) {
  if (!in.positions.empty() && in.positions.size() != in.requests.size()) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("{} positions for {} queries", in.positions.size(),
                                                              in.requests.size()));
  }
  std::vector<QueryAt> out(in.requests.size());
  for (std::size_t j = 0; j < in.requests.size(); ++j) {
    const RequestId request = in.requests[j];
    const Result<Rank> home = space.WindowHomeOf(request);
    if (!home) return std::unexpected(home.error());
    auto ring = space.KindPagesOf(request, kinds.window, *home);
    if (!ring) return std::unexpected(ring.error());
    QueryAt& q = out[j];
    q.home = *home;
    q.ring = std::move(*ring);
    const std::uint32_t tokens = q.ring.tokens;
    if (in.positions.empty()) {
      q.position = tokens == 0 ? 0 : tokens - 1;
    } else {
      q.position = in.positions[j];
      if (q.position >= tokens) {
        return MakeError(ErrorCode::kOutOfRange, fmt::format("query {} at position {}: request {} has {} tokens", j,
                                                             q.position, request.value(), tokens));
      }
    }
    const std::uint32_t upto = tokens == 0 ? 0 : q.position + 1;
    q.window_lo = upto - std::min(kinds.window_tokens, upto);
    const std::uint32_t ring_first = tokens - q.ring.entries;
    if (q.window_lo < ring_first) {
      return MakeError(ErrorCode::kOutOfRange,
                       fmt::format("query {} at position {}: its window starts at token {}, the ring of request {} "
                                   "holds tokens from {}",
                                   j, q.position, q.window_lo, request.value(), ring_first));
    }
  }
  return out;
}

}  // namespace

Result<TpHomeAttention> AttendKindsAtHome(const TpAddressSpace& space, const KindLayerInput& in, const MlaShape& shape,
                                          std::span<const float> queries, const KindRowBytes& rows, TpFabric* fabric) {
  const TpConfig& cfg = space.config();
  if (cfg.kinds.empty()) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     "attention per layer kind needs a space with kinds (TpConfig::kinds)");
  }
  const bool csa = in.layer == KindLayer::kCsa;
  if (csa) {
    if (in.plan == nullptr) return MakeError(ErrorCode::kInvalidArgument, "a CSA layer needs its group's step plan");
    ULA_RETURN_IF_ERROR(Validate(space, *in.plan, in.group, shape, queries, in.bounds, fabric, in.layer_offset));
    if (in.requests.size() + 1 != in.bounds.size()) {
      return MakeError(ErrorCode::kInvalidArgument, fmt::format("{} requests for {} queries' bounds",
                                                                in.requests.size(), in.bounds.size() - 1));
    }
  } else {
    if (in.plan != nullptr || !in.bounds.empty()) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "a window-only or HCA layer reads no C4 entries: no plan, no bounds");
    }
    if (cfg.attention != TpAttention::kAtHome) {
      return MakeError(ErrorCode::kFailedPrecondition, "attention at home needs TpConfig::attention = kAtHome");
    }
    const auto hosted = space.hosted_ranks();
    if (fabric == nullptr ? hosted.size() != cfg.num_ranks
                          : (hosted.size() != 1 || hosted[0] != fabric->local_rank() ||
                             fabric->num_ranks() != cfg.num_ranks)) {
      return MakeError(ErrorCode::kFailedPrecondition,
                       "without a fabric every rank must be hosted; with one, exactly the fabric's local rank");
    }
    ULA_RETURN_IF_ERROR(shape.Validate());
    if (in.requests.empty() || queries.size() != in.requests.size() * std::size_t{shape.query_values()}) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("{} query values for {} queries of {}", queries.size(), in.requests.size(),
                                   shape.query_values()));
    }
  }
  const Result<LayerKinds> found = KindsOf(cfg);
  if (!found) return std::unexpected(found.error());
  const LayerKinds& kinds = *found;
  if (in.layer == KindLayer::kHca && kinds.dense == kNoCompanion) {
    return MakeError(ErrorCode::kFailedPrecondition, "an HCA layer needs a dense compressed kind in the space");
  }
  const std::uint32_t p = cfg.num_ranks;
  const std::size_t n_queries = in.requests.size();
  const std::size_t pv = PartialValues(shape);
  const std::size_t qv = shape.query_values();
  TpHomeAttention result;
  result.ranks.assign(space.hosted_ranks().begin(), space.hosted_ranks().end());
  // 1. Partials: [hosted][query][head][record], each over the rank's own entries of the layer.
  std::vector<std::vector<float>> partials(result.ranks.size(), std::vector<float>(n_queries * pv));
  std::vector<const std::byte*> entries;
  const Result<std::vector<QueryAt>> placed = PlaceQueries(space, in, kinds);
  if (!placed) return std::unexpected(placed.error());
  for (std::size_t h = 0; h < result.ranks.size(); ++h) {
    const Rank rank = result.ranks[h];
    for (std::size_t j = 0; j < n_queries; ++j) {
      const RequestId request = in.requests[j];
      const QueryAt& q = (*placed)[j];
      const std::uint32_t upto = q.ring.tokens == 0 ? 0 : q.position + 1;  // the tokens the query sees
      entries.clear();
      if (csa) {
        ULA_RETURN_IF_ERROR(AppendShardEntries(space, *in.plan, h, in.group, in.bounds, j, in.layer_offset, entries));
      }
      if (in.layer == KindLayer::kHca) {  // entry e (complete by token upto - 1) on rank e mod P, local e / P
        auto pages = space.KindPagesOf(request, kinds.dense, rank);
        if (!pages) return std::unexpected(pages.error());
        const std::uint32_t complete = upto / cfg.kinds[kinds.dense].tokens_per_entry;
        const std::uint32_t r = rank.value();
        const std::uint32_t mine = std::min(pages->entries, complete > r ? (complete - r + p - 1) / p : 0u);
        ULA_RETURN_IF_ERROR(AppendKindRows(space, *pages, request, kinds.dense, rank, 0, mine, shape, rows, entries));
      }
      if (rank == q.home) {  // the window, whole on its home (docs/ARCHITECTURE.md, "Kinds under TP")
        const std::uint32_t first = q.ring.tokens - q.ring.entries;
        ULA_RETURN_IF_ERROR(AppendKindRows(space, q.ring, request, kinds.window, rank, q.window_lo - first,
                                           upto - first, shape, rows, entries));
      }
      result.entries_read += entries.size();
      ULA_RETURN_IF_ERROR(PartialMlaAttention(shape, queries.subspan(j * qv, qv), entries,
                                              std::span(partials[h]).subspan(j * pv, pv)));
    }
  }
  // 2-3. The one exchange and merge in rank order.
  ULA_RETURN_IF_ERROR(ExchangeAndMerge(shape, p, n_queries, partials, fabric, result));
  return result;
}

}  // namespace ula

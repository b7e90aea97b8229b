#include "ula/unified_buffer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "ula/check.h"
#include "unified/block_table.h"
#include "unified/end_layout.h"

namespace ula {

using internal::BlockTable;
using internal::EndLayout;

namespace {
constexpr int kLow = 0;
constexpr int kHigh = 1;
int EndIndex(BufferEnd end) { return end == BufferEnd::kLow ? kLow : kHigh; }
}  // namespace

Status UnifiedBufferConfig::Validate() const {
  if (alignment == 0) return MakeError(ErrorCode::kInvalidArgument, "unified buffer config: alignment must be > 0");
  if (capacity_bytes == 0) return MakeError(ErrorCode::kInvalidArgument, "unified buffer config: capacity_bytes must be > 0");
  if (kinds.empty()) return MakeError(ErrorCode::kInvalidArgument, "unified buffer config: kinds must not be empty");
  if (kinds.size() >= BlockKind::kInvalidValue) {
    return MakeError(ErrorCode::kInvalidArgument, "unified buffer config: too many kinds");
  }
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    if (kinds[i].block_bytes == 0 || kinds[i].block_bytes % alignment != 0) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("unified buffer config: kinds[{}].block_bytes ({}) must be a positive multiple of "
                                   "alignment ({})",
                                   i, kinds[i].block_bytes, alignment));
    }
  }
  if (!padding_kind.valid() || padding_kind.value() >= kinds.size()) {
    return MakeError(ErrorCode::kInvalidArgument, "unified buffer config: padding_kind is not a configured kind");
  }
  const std::uint64_t padding = std::uint64_t{padding_blocks} * kinds[padding_kind.value()].block_bytes;
  if (padding >= capacity_bytes) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("unified buffer config: padding_blocks ({} B) leave no usable space in capacity_bytes ({})",
                                 padding, capacity_bytes));
  }
  return Ok();
}

UnifiedBuffer::UnifiedBuffer(const UnifiedBufferConfig& config)
    : config_(config),
      usable_(config.capacity_bytes - std::uint64_t{config.padding_blocks} *
                                          config.kinds[config.padding_kind.value()].block_bytes),
      table_(std::make_unique<BlockTable>()) {
  ends_[kLow] = std::make_unique<EndLayout>();
  ends_[kHigh] = std::make_unique<EndLayout>();
}

UnifiedBuffer::~UnifiedBuffer() = default;

Result<std::unique_ptr<UnifiedBuffer>> UnifiedBuffer::Create(const UnifiedBufferConfig& config) {
  ULA_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<UnifiedBuffer> buffer(new UnifiedBuffer(config));
  if (config.hold_bytes) {
    buffer->bytes_ = std::make_unique<std::byte[]>(config.capacity_bytes);  // zero-filled
  }
  return buffer;
}

std::uint64_t UnifiedBuffer::PhysicalOffset(int end, std::uint64_t pos, std::uint64_t size) const {
  return end == kLow ? pos : usable_ - pos - size;
}

Status UnifiedBuffer::ValidateDemand(const Demand& demand) const {
  if (demand.blocks.size() != config_.kinds.size()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("demand names {} kinds but the buffer has {}", demand.blocks.size(), config_.kinds.size()));
  }
  return Ok();
}

namespace {

// Places the demand's blocks of one end, largest kind first; hole first, then the middle.
// Returns false when the middle runs out. `place` receives (kind, pos) for each block.
template <class PlaceFn>
bool PlaceEnd(EndLayout& end, int end_index, const UnifiedBufferConfig& config, const Demand& demand,
              std::uint64_t& middle, PlaceFn&& place) {
  std::vector<std::size_t> order;
  for (std::size_t k = 0; k < config.kinds.size(); ++k) {
    if (EndIndex(config.kinds[k].end) == end_index && demand.blocks[k] > 0) order.push_back(k);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return config.kinds[a].block_bytes > config.kinds[b].block_bytes; });
  for (std::size_t k : order) {
    const std::uint64_t size = config.kinds[k].block_bytes;
    for (std::uint32_t n = 0; n < demand.blocks[k]; ++n) {
      auto pos = end.PlaceInHole(BlockId::Invalid(), size);
      if (!pos) {
        if (middle < size) return false;
        middle -= size;
        pos = end.PlaceAtTop(BlockId::Invalid(), size);
      }
      place(k, *pos);
    }
  }
  return true;
}

}  // namespace

UnifiedBuffer::Plan UnifiedBuffer::PlanDemand(const Demand& demand) const {
  std::uint64_t total = 0;
  for (std::size_t k = 0; k < config_.kinds.size(); ++k) total += demand.blocks[k] * config_.kinds[k].block_bytes;
  const std::uint64_t middle = usable_ - ends_[kLow]->top() - ends_[kHigh]->top();
  if (total <= middle) return Plan::kFits;  // holes only add room
  const std::uint64_t holes = ends_[kLow]->hole_bytes() + ends_[kHigh]->hole_bytes();
  if (total > middle + holes) return Plan::kNoFit;  // compaction creates no bytes
  for (bool compact : {false, true}) {
    std::array<EndLayout, 2> ends = {*ends_[kLow], *ends_[kHigh]};
    if (compact) {
      ends[kLow].Compact({});
      ends[kHigh].Compact({});
    }
    std::uint64_t left = usable_ - ends[kLow].top() - ends[kHigh].top();
    auto ignore = [](std::size_t, std::uint64_t) {};
    if (PlaceEnd(ends[kLow], kLow, config_, demand, left, ignore) &&
        PlaceEnd(ends[kHigh], kHigh, config_, demand, left, ignore)) {
      return compact ? Plan::kFitsAfterCompaction : Plan::kFits;
    }
  }
  return Plan::kNoFit;
}

bool UnifiedBuffer::CanAllocate(const Demand& demand) const {
  if (!ValidateDemand(demand)) return false;
  return PlanDemand(demand) != Plan::kNoFit;
}

Result<std::vector<BlockId>> UnifiedBuffer::AllocateDemand(const Demand& demand) {
  ULA_RETURN_IF_ERROR(ValidateDemand(demand));
  const Plan plan = PlanDemand(demand);
  if (plan == Plan::kNoFit) {
    std::uint64_t total = 0;
    for (std::size_t k = 0; k < config_.kinds.size(); ++k) total += demand.blocks[k] * config_.kinds[k].block_bytes;
    const auto stats = Stats();
    return MakeError(ErrorCode::kResourceExhausted,
                     fmt::format("unified buffer: demand of {} B does not fit (middle {} B, holes {} B, usable {} B)",
                                 total, stats.middle_bytes, stats.hole_bytes, usable_));
  }
  if (plan == Plan::kFitsAfterCompaction) Compact();
  // Placement per kind in kind order of the result: collect per kind, then concatenate.
  std::vector<std::vector<BlockId>> per_kind(config_.kinds.size());
  std::uint64_t middle = usable_ - ends_[kLow]->top() - ends_[kHigh]->top();
  for (int e : {kLow, kHigh}) {
    EndLayout& end = *ends_[e];
    const bool ok = PlaceEnd(end, e, config_, demand, middle, [&](std::size_t k, std::uint64_t pos) {
      const BlockId id = table_->Add(BlockKind(static_cast<std::uint8_t>(k)), pos);
      per_kind[k].push_back(id);
      end.SetId(pos, id);  // PlaceEnd inserted a placeholder id
    });
    ULA_CHECK(ok);
  }
  std::vector<BlockId> ids;
  for (auto& v : per_kind) ids.insert(ids.end(), v.begin(), v.end());
  ULA_EXPENSIVE_CHECK(*this);
  return ids;
}

std::uint64_t UnifiedBuffer::CompactEnd(int e) {
  return ends_[e]->Compact([&](BlockId id, std::uint64_t from, std::uint64_t to, std::uint64_t size) {
    if (bytes_) {
      std::memcpy(bytes_.get() + PhysicalOffset(e, to, size), bytes_.get() + PhysicalOffset(e, from, size), size);
    }
    table_->at(id).pos = to;  // the only metadata a move changes
    bytes_moved_ += size;
    ++blocks_moved_;
  });
}

std::uint64_t UnifiedBuffer::Compact() {
  const std::uint64_t moved = CompactEnd(kLow) + CompactEnd(kHigh);
  ULA_EXPENSIVE_CHECK(*this);
  return moved;
}

Status UnifiedBuffer::Free(BlockId id) {
  auto found = table_->Find(id);
  if (!found) return std::unexpected(std::move(found).error());
  const BlockTable::Entry& entry = **found;
  if (entry.pins > 0) {
    return MakeError(ErrorCode::kFailedPrecondition, fmt::format("block {} is pinned ({} pins) and cannot be freed",
                                                                 id.value(), entry.pins));
  }
  const int e = EndIndex(config_.kinds[entry.kind.value()].end);
  ends_[e]->Release(entry.pos);
  bytes_freed_ += config_.kinds[entry.kind.value()].block_bytes;
  table_->Remove(id);
  if (config_.compaction == CompactionMode::kEager) CompactEnd(e);
  ULA_EXPENSIVE_CHECK(*this);
  return Ok();
}

Status UnifiedBuffer::Pin(BlockId id) {
  auto found = table_->Find(id);
  if (!found) return std::unexpected(std::move(found).error());
  BlockTable::Entry& entry = table_->at(id);
  if (entry.pins == UINT32_MAX) return MakeError(ErrorCode::kFailedPrecondition, "pin count overflow");
  if (entry.pins++ == 0) ends_[EndIndex(config_.kinds[entry.kind.value()].end)]->SetPinned(entry.pos, true);
  return Ok();
}

Status UnifiedBuffer::Unpin(BlockId id) {
  auto found = table_->Find(id);
  if (!found) return std::unexpected(std::move(found).error());
  BlockTable::Entry& entry = table_->at(id);
  if (entry.pins == 0) {
    return MakeError(ErrorCode::kFailedPrecondition, fmt::format("unpin of block {} which is not pinned", id.value()));
  }
  if (--entry.pins == 0) {
    const int e = EndIndex(config_.kinds[entry.kind.value()].end);
    ends_[e]->SetPinned(entry.pos, false);
    if (config_.compaction == CompactionMode::kEager) CompactEnd(e);
  }
  ULA_EXPENSIVE_CHECK(*this);
  return Ok();
}

Result<BlockKind> UnifiedBuffer::KindOf(BlockId id) const {
  auto found = table_->Find(id);
  if (!found) return std::unexpected(std::move(found).error());
  return (*found)->kind;
}

Result<std::uint64_t> UnifiedBuffer::Offset(BlockId id) const {
  auto found = table_->Find(id);
  if (!found) return std::unexpected(std::move(found).error());
  const KindConfig& k = config_.kinds[(*found)->kind.value()];
  return PhysicalOffset(EndIndex(k.end), (*found)->pos, k.block_bytes);
}

Status UnifiedBuffer::Translate(std::span<const BlockId> ids, std::span<std::uint64_t> offsets) const {
  if (ids.size() != offsets.size()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("translate: {} ids but {} output offsets", ids.size(), offsets.size()));
  }
  const auto& entries = table_->entries();
  for (BlockId id : ids) {
    if (!id.valid() || id.value() >= entries.size() || !entries[id.value()].live) {
      auto found = table_->Find(id);
      return std::unexpected(std::move(found).error());
    }
  }
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto& e = entries[ids[i].value()];
    const KindConfig& k = config_.kinds[e.kind.value()];
    offsets[i] = PhysicalOffset(EndIndex(k.end), e.pos, k.block_bytes);
  }
  return Ok();
}

AllocatorStats UnifiedBuffer::Stats() const {
  AllocatorStats s;
  s.capacity_bytes = config_.capacity_bytes;
  s.reserved_bytes = config_.capacity_bytes - usable_;
  s.hole_bytes = ends_[kLow]->hole_bytes() + ends_[kHigh]->hole_bytes();
  s.middle_bytes = usable_ - ends_[kLow]->top() - ends_[kHigh]->top();
  s.live_bytes = ends_[kLow]->top() + ends_[kHigh]->top() - s.hole_bytes;
  s.live_blocks_per_kind.assign(config_.kinds.size(), 0);
  for (const auto& e : table_->entries()) {
    if (e.live) ++s.live_blocks_per_kind[e.kind.value()];
  }
  s.bytes_freed = bytes_freed_;
  s.bytes_moved = bytes_moved_;
  s.blocks_moved = blocks_moved_;
  return s;
}

std::vector<BlockInfo> UnifiedBuffer::LiveBlocks() const {
  std::vector<BlockInfo> out;
  const auto& entries = table_->entries();
  for (std::uint32_t i = 0; i < entries.size(); ++i) {
    if (!entries[i].live) continue;
    out.push_back(BlockInfo{BlockId(i), entries[i].kind, *Offset(BlockId(i)), entries[i].pins});
  }
  return out;
}

Status UnifiedBuffer::CheckInvariants() const {
  ULA_RETURN_IF_ERROR(table_->CheckInvariants());
  for (int e : {kLow, kHigh}) ULA_RETURN_IF_ERROR(ends_[e]->CheckInvariants());
  if (ends_[kLow]->top() + ends_[kHigh]->top() > usable_) {
    return MakeError(ErrorCode::kInternal, "unified buffer: the two ends overlap");
  }
  std::size_t in_ends = ends_[kLow]->live().size() + ends_[kHigh]->live().size();
  if (in_ends != table_->num_live()) {
    return MakeError(ErrorCode::kInternal, fmt::format("unified buffer: {} blocks in the ends but {} live in the table",
                                                       in_ends, table_->num_live()));
  }
  const auto& entries = table_->entries();
  for (std::uint32_t i = 0; i < entries.size(); ++i) {
    const auto& entry = entries[i];
    if (!entry.live) continue;
    const KindConfig& k = config_.kinds[entry.kind.value()];
    const auto& live = ends_[EndIndex(k.end)]->live();
    auto it = live.find(entry.pos);
    if (it == live.end() || it->second.id != BlockId(i) || it->second.size != k.block_bytes) {
      return MakeError(ErrorCode::kInternal, fmt::format("unified buffer: block {} is not where the table says", i));
    }
    if (it->second.pinned != (entry.pins > 0)) {
      return MakeError(ErrorCode::kInternal, fmt::format("unified buffer: block {} pin flag disagrees with its count", i));
    }
  }
  return Ok();
}

}  // namespace ula

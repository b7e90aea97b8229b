#include "ula/unified_buffer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "ula/check.h"
#include "core/digest.h"
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
  if (!config.hold_bytes) return Create(config, Arena{});
  auto backend = MakeCpuBackend(CpuBackendOptions{.copy_threads = 0});
  auto arena = backend->CreateArena(Tier::kDevice, Rank(0), config.capacity_bytes);  // zero-filled
  if (!arena) return std::unexpected(std::move(arena).error());
  auto buffer = Create(config, *arena);
  if (buffer) (*buffer)->owned_backend_ = std::move(backend);
  return buffer;
}

Result<std::unique_ptr<UnifiedBuffer>> UnifiedBuffer::Create(const UnifiedBufferConfig& config, const Arena& arena,
                                                             Backend& mover) {
  if (arena.data != nullptr) {
    auto owned = mover.GetArena(arena.id);
    if (!owned || owned->data != arena.data) {
      return MakeError(ErrorCode::kInvalidArgument, fmt::format("unified buffer: arena {} is not the mover's", arena.id.value()));
    }
  }
  auto buffer = Create(config, arena);
  if (buffer && arena.data != nullptr) (*buffer)->mover_ = &mover;
  return buffer;
}

Result<std::unique_ptr<UnifiedBuffer>> UnifiedBuffer::Create(const UnifiedBufferConfig& config, const Arena& arena) {
  ULA_RETURN_IF_ERROR(config.Validate());
  if (arena.data != nullptr && arena.bytes < config.capacity_bytes) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("unified buffer: the arena holds {} B but capacity_bytes is {}", arena.bytes,
                                 config.capacity_bytes));
  }
  std::unique_ptr<UnifiedBuffer> buffer(new UnifiedBuffer(config));
  buffer->arena_ = arena;
  buffer->bytes_ = arena.data;
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
// Returns false when the middle runs out. `new_id(kind)` names each block before it is
// placed (BlockId::Invalid() in a simulation); `place` receives (kind, id, pos) after.
template <class IdFn, class PlaceFn>
bool PlaceEnd(EndLayout& end, int end_index, const UnifiedBufferConfig& config, const Demand& demand,
              std::uint64_t& middle, IdFn&& new_id, PlaceFn&& place) {
  // Kinds of this end with blocks wanted, largest first (stable): an insertion sort on the
  // stack, so that the common single-block demand touches no heap.
  std::array<std::uint8_t, BlockKind::kInvalidValue> order;
  std::size_t num = 0;
  for (std::size_t k = 0; k < config.kinds.size(); ++k) {
    if (EndIndex(config.kinds[k].end) != end_index || demand.blocks[k] == 0) continue;
    std::size_t i = num++;
    for (; i > 0 && config.kinds[order[i - 1]].block_bytes < config.kinds[k].block_bytes; --i) order[i] = order[i - 1];
    order[i] = static_cast<std::uint8_t>(k);
  }
  for (std::size_t o = 0; o < num; ++o) {
    const std::size_t k = order[o];
    const std::uint64_t size = config.kinds[k].block_bytes;
    for (std::uint32_t n = 0; n < demand.blocks[k]; ++n) {
      const BlockId id = new_id(k);
      auto pos = end.PlaceInHole(id, size);
      if (!pos) {
        if (middle < size) return false;  // only in a simulation: a real placement was planned
        middle -= size;
        pos = end.PlaceAtTop(id, size);
      }
      place(k, id, *pos);
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
    auto no_id = [](std::size_t) { return BlockId::Invalid(); };
    auto ignore = [](std::size_t, BlockId, std::uint64_t) {};
    if (PlaceEnd(ends[kLow], kLow, config_, demand, left, no_id, ignore) &&
        PlaceEnd(ends[kHigh], kHigh, config_, demand, left, no_id, ignore)) {
      return compact ? Plan::kFitsAfterCompaction : Plan::kFits;
    }
  }
  return Plan::kNoFit;
}

bool UnifiedBuffer::CanAllocate(const Demand& demand) const {
  if (!ValidateDemand(demand)) return false;
  std::uint64_t num_blocks = 0;
  for (std::uint32_t n : demand.blocks) num_blocks += n;
  return table_->CanAdd(num_blocks) && PlanDemand(demand) != Plan::kNoFit;
}

Result<std::vector<BlockId>> UnifiedBuffer::AllocateDemand(const Demand& demand) {
  ULA_RETURN_IF_ERROR(ValidateDemand(demand));
  std::uint64_t num_blocks = 0;
  for (std::uint32_t n : demand.blocks) num_blocks += n;
  if (!table_->CanAdd(num_blocks)) {
    return MakeError(ErrorCode::kResourceExhausted,
                     fmt::format("unified buffer: no block ids left for {} more blocks", num_blocks));
  }
  const Plan plan = PlanDemand(demand);
  if (plan == Plan::kNoFit) {
    std::uint64_t total = 0;
    for (std::size_t k = 0; k < config_.kinds.size(); ++k) total += demand.blocks[k] * config_.kinds[k].block_bytes;
    const auto stats = Stats();
    return MakeError(ErrorCode::kResourceExhausted,
                     fmt::format("unified buffer: demand of {} B does not fit (middle {} B, holes {} B, usable {} B)",
                                 total, stats.middle_bytes, stats.hole_bytes, usable_));
  }
  if (plan == Plan::kFitsAfterCompaction) {
    compaction_error_.clear();
    Compact();
    if (!compaction_error_.empty() && PlanDemand(demand) != Plan::kFits) {
      return MakeError(ErrorCode::kIo, fmt::format("unified buffer: the demand needs compaction, and {}; nothing allocated",
                                                   compaction_error_));
    }
  }
  // The result is grouped by kind in kind order: next[k] is where kind k's next id goes.
  std::array<std::uint32_t, BlockKind::kInvalidValue> next;
  std::uint32_t total = 0;
  for (std::size_t k = 0; k < config_.kinds.size(); ++k) {
    next[k] = total;
    total += demand.blocks[k];
  }
  std::vector<BlockId> ids(total);
  std::uint64_t middle = usable_ - ends_[kLow]->top() - ends_[kHigh]->top();
  for (int e : {kLow, kHigh}) {
    EndLayout& end = *ends_[e];
    const bool ok = PlaceEnd(
        end, e, config_, demand, middle,
        [&](std::size_t k) { return table_->Add(BlockKind(static_cast<std::uint8_t>(k)), 0); },
        [&](std::size_t k, BlockId id, std::uint64_t pos) {
          table_->at(id).pos = pos;
          ids[next[k]++] = id;
        });
    ULA_CHECK(ok);
  }
  ULA_EXPENSIVE_CHECK(*this);
  return ids;
}

std::uint64_t UnifiedBuffer::CompactEnd(int e) {
  return ends_[e]->Compact([&](BlockId id, std::uint64_t from, std::uint64_t to, std::uint64_t size) {
    const std::uint64_t src = PhysicalOffset(e, from, size), dst = PhysicalOffset(e, to, size);
    if (mover_ != nullptr) {  // copy first (into the hole: free space), wait, then publish
      Status moved = Ok();
      if (size > UINT32_MAX) {
        moved = MakeError(ErrorCode::kUnsupported, fmt::format("a {} B block is too large for one copy move", size));
      } else if (auto fence = mover_->Submit(CopyBatch{arena_.id, arena_.id, static_cast<std::uint32_t>(size), false,
                                                       {SlotMove{src, dst}}});
                 !fence) {
        moved = std::unexpected(fence.error());
      } else {
        moved = mover_->Wait(*fence);
      }
      if (!moved) {
        compaction_error_ = fmt::format("compaction move of block {} ({} B, offset {} -> {}) failed: {}", id.value(), size,
                                        src, dst, moved.error().message());
        return false;
      }
    } else if (bytes_ != nullptr) {
      std::memcpy(bytes_ + dst, bytes_ + src, size);
    }
    table_->at(id).pos = to;  // the only metadata a move changes
    bytes_moved_ += size;
    ++blocks_moved_;
    return true;
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
  ULA_EXPENSIVE_CHECK(*this);
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
  for (BlockId id : ids) {
    if (table_->FindLive(id) == nullptr) {
      auto found = table_->Find(id);
      return std::unexpected(std::move(found).error());
    }
  }
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto& e = *table_->FindLive(ids[i]);
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
    const BlockId id = table_->IdAt(i);
    out.push_back(BlockInfo{id, entries[i].kind, *Offset(id), entries[i].pins});
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
    if (it == live.end() || it->second.id != table_->IdAt(i) || it->second.size != k.block_bytes) {
      return MakeError(ErrorCode::kInternal, fmt::format("unified buffer: block {} is not where the table says", i));
    }
    if (it->second.pinned != (entry.pins > 0)) {
      return MakeError(ErrorCode::kInternal, fmt::format("unified buffer: block {} pin flag disagrees with its count", i));
    }
  }
  return Ok();
}


std::uint64_t UnifiedBuffer::DebugDigest() const {
  StateDigest d;
  for (const BlockTable::Entry& e : table_->entries()) {
    for (std::uint64_t v : {e.pos, std::uint64_t{e.kind.value()}, std::uint64_t{e.generation}, std::uint64_t{e.pins},
                            std::uint64_t{e.live}}) {
      d.Add(v);
    }
  }
  for (std::uint32_t i : table_->free_ids()) d.Add(i);
  for (const auto& end : ends_) {
    d.Add(end->top());
    for (const auto& [pos, item] : end->live()) {
      for (std::uint64_t v : {pos, std::uint64_t{item.id.value()}, item.size, std::uint64_t{item.pinned}}) d.Add(v);
    }
    for (const auto& [pos, size] : end->holes()) d.Add(StateDigest::Mix(pos, size));
  }
  for (std::uint64_t v : {bytes_freed_, bytes_moved_, blocks_moved_}) d.Add(v);
  return d.value();
}

}  // namespace ula

#include "unified/fixed_split_allocator.h"

#include <fmt/format.h>

#include <cmath>

#include "ula/check.h"
#include "unified/block_table.h"

namespace ula {

using internal::BlockTable;

Status FixedSplitConfig::Validate() const {
  if (capacity_bytes == 0) return MakeError(ErrorCode::kInvalidArgument, "fixed split config: capacity_bytes must be > 0");
  if (kinds.empty()) return MakeError(ErrorCode::kInvalidArgument, "fixed split config: kinds must not be empty");
  if (fractions.size() != kinds.size()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("fixed split config: fractions has {} entries for {} kinds", fractions.size(), kinds.size()));
  }
  double sum = 0;
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    if (kinds[i].block_bytes == 0) {
      return MakeError(ErrorCode::kInvalidArgument, fmt::format("fixed split config: kinds[{}].block_bytes must be > 0", i));
    }
    if (!(fractions[i] >= 0.0) || fractions[i] > 1.0) {
      return MakeError(ErrorCode::kInvalidArgument, fmt::format("fixed split config: fractions[{}] must be in [0, 1]", i));
    }
    sum += fractions[i];
  }
  if (sum > 1.0 + 1e-9) return MakeError(ErrorCode::kInvalidArgument, "fixed split config: fractions sum to more than 1");
  if (!padding_kind.valid() || padding_kind.value() >= kinds.size()) {
    return MakeError(ErrorCode::kInvalidArgument, "fixed split config: padding_kind is not a configured kind");
  }
  const auto& pk = kinds[padding_kind.value()];
  const auto pad_pool = static_cast<std::uint64_t>(std::floor(fractions[padding_kind.value()] * capacity_bytes / pk.block_bytes + 1e-9));
  if (padding_blocks > pad_pool) {
    return MakeError(ErrorCode::kInvalidArgument, "fixed split config: padding_blocks exceed the padding kind's pool");
  }
  return Ok();
}

FixedSplitAllocator::FixedSplitAllocator(const FixedSplitConfig& config)
    : config_(config), table_(std::make_unique<BlockTable>()) {
  std::uint64_t base = 0;
  for (std::size_t k = 0; k < config.kinds.size(); ++k) {
    Pool pool;
    pool.base = base;
    pool.slots = static_cast<std::uint32_t>(std::floor(config.fractions[k] * config.capacity_bytes / config.kinds[k].block_bytes + 1e-9));
    pool.reserved = k == config.padding_kind.value() ? config.padding_blocks : 0;
    for (std::uint32_t s = pool.slots; s-- > pool.reserved;) pool.free_slots.push_back(s);
    base += std::uint64_t{pool.slots} * config.kinds[k].block_bytes;
    pools_.push_back(std::move(pool));
  }
  ULA_CHECK(base <= config.capacity_bytes);
}

FixedSplitAllocator::~FixedSplitAllocator() = default;

Result<std::unique_ptr<FixedSplitAllocator>> FixedSplitAllocator::Create(const FixedSplitConfig& config) {
  ULA_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<FixedSplitAllocator> a(new FixedSplitAllocator(config));
  if (config.hold_bytes) a->bytes_ = std::make_unique<std::byte[]>(config.capacity_bytes);
  return a;
}

std::uint32_t FixedSplitAllocator::pool_blocks(BlockKind kind) const {
  const Pool& p = pools_.at(kind.value());
  return p.slots - p.reserved;
}

bool FixedSplitAllocator::CanAllocate(const Demand& demand) const {
  if (demand.blocks.size() != pools_.size()) return false;
  std::uint64_t num_blocks = 0;
  for (std::size_t k = 0; k < pools_.size(); ++k) {
    if (demand.blocks[k] > pools_[k].free_slots.size()) return false;
    num_blocks += demand.blocks[k];
  }
  return table_->CanAdd(num_blocks);
}

Result<std::vector<BlockId>> FixedSplitAllocator::AllocateDemand(const Demand& demand) {
  if (demand.blocks.size() != pools_.size()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("demand names {} kinds but the allocator has {}", demand.blocks.size(), pools_.size()));
  }
  for (std::size_t k = 0; k < pools_.size(); ++k) {
    if (demand.blocks[k] > pools_[k].free_slots.size()) {
      return MakeError(ErrorCode::kResourceExhausted,
                       fmt::format("fixed split: pool '{}' has {} free blocks, demand wants {}", config_.kinds[k].name,
                                   pools_[k].free_slots.size(), demand.blocks[k]));
    }
  }
  std::uint64_t num_blocks = 0;
  for (std::uint32_t n : demand.blocks) num_blocks += n;
  if (!table_->CanAdd(num_blocks)) {
    return MakeError(ErrorCode::kResourceExhausted, fmt::format("fixed split: no block ids left for {} more blocks", num_blocks));
  }
  std::vector<BlockId> ids;
  for (std::size_t k = 0; k < pools_.size(); ++k) {
    for (std::uint32_t n = 0; n < demand.blocks[k]; ++n) {
      const std::uint32_t slot = pools_[k].free_slots.back();
      pools_[k].free_slots.pop_back();
      ids.push_back(table_->Add(BlockKind(static_cast<std::uint8_t>(k)), slot));
    }
  }
  ULA_EXPENSIVE_CHECK(*this);
  return ids;
}

Status FixedSplitAllocator::Free(BlockId id) {
  auto found = table_->Find(id);
  if (!found) return std::unexpected(std::move(found).error());
  if ((*found)->pins > 0) {
    return MakeError(ErrorCode::kFailedPrecondition, fmt::format("block {} is pinned and cannot be freed", id.value()));
  }
  const std::size_t k = (*found)->kind.value();
  pools_[k].free_slots.push_back(static_cast<std::uint32_t>((*found)->pos));
  bytes_freed_ += config_.kinds[k].block_bytes;
  table_->Remove(id);
  ULA_EXPENSIVE_CHECK(*this);
  return Ok();
}

Status FixedSplitAllocator::Pin(BlockId id) {
  auto found = table_->Find(id);
  if (!found) return std::unexpected(std::move(found).error());
  if ((*found)->pins == UINT32_MAX) return MakeError(ErrorCode::kFailedPrecondition, "pin count overflow");
  ++table_->at(id).pins;
  return Ok();
}

Status FixedSplitAllocator::Unpin(BlockId id) {
  auto found = table_->Find(id);
  if (!found) return std::unexpected(std::move(found).error());
  if ((*found)->pins == 0) {
    return MakeError(ErrorCode::kFailedPrecondition, fmt::format("unpin of block {} which is not pinned", id.value()));
  }
  --table_->at(id).pins;
  return Ok();
}

Result<BlockKind> FixedSplitAllocator::KindOf(BlockId id) const {
  auto found = table_->Find(id);
  if (!found) return std::unexpected(std::move(found).error());
  return (*found)->kind;
}

Result<std::uint64_t> FixedSplitAllocator::Offset(BlockId id) const {
  auto found = table_->Find(id);
  if (!found) return std::unexpected(std::move(found).error());
  const std::size_t k = (*found)->kind.value();
  return pools_[k].base + (*found)->pos * config_.kinds[k].block_bytes;
}

Status FixedSplitAllocator::Translate(std::span<const BlockId> ids, std::span<std::uint64_t> offsets) const {
  if (ids.size() != offsets.size()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("translate: {} ids but {} output offsets", ids.size(), offsets.size()));
  }
  for (BlockId id : ids) {
    if (auto found = table_->Find(id); !found) return std::unexpected(std::move(found).error());
  }
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto& e = *table_->FindLive(ids[i]);
    offsets[i] = pools_[e.kind.value()].base + e.pos * config_.kinds[e.kind.value()].block_bytes;
  }
  return Ok();
}

AllocatorStats FixedSplitAllocator::Stats() const {
  AllocatorStats s;
  s.capacity_bytes = config_.capacity_bytes;
  s.reserved_bytes = std::uint64_t{config_.padding_blocks} * config_.kinds[config_.padding_kind.value()].block_bytes;
  s.live_blocks_per_kind.assign(config_.kinds.size(), 0);
  for (const auto& e : table_->entries()) {
    if (!e.live) continue;
    ++s.live_blocks_per_kind[e.kind.value()];
    s.live_bytes += config_.kinds[e.kind.value()].block_bytes;
  }
  s.bytes_freed = bytes_freed_;
  return s;
}

std::vector<BlockInfo> FixedSplitAllocator::LiveBlocks() const {
  std::vector<BlockInfo> out;
  const auto& entries = table_->entries();
  for (std::uint32_t i = 0; i < entries.size(); ++i) {
    if (entries[i].live) {
      const BlockId id = table_->IdAt(i);
      out.push_back(BlockInfo{id, entries[i].kind, *Offset(id), entries[i].pins});
    }
  }
  return out;
}

Status FixedSplitAllocator::CheckInvariants() const {
  ULA_RETURN_IF_ERROR(table_->CheckInvariants());
  for (std::size_t k = 0; k < pools_.size(); ++k) {
    const Pool& p = pools_[k];
    std::vector<int> seen(p.slots, 0);
    for (std::uint32_t s = 0; s < p.reserved; ++s) ++seen[s];
    for (auto s : p.free_slots) {
      if (s >= p.slots) return MakeError(ErrorCode::kInternal, "fixed split: free slot out of range");
      ++seen[s];
    }
    for (const auto& e : table_->entries()) {
      if (e.live && e.kind.value() == k) ++seen[e.pos];
    }
    for (std::uint32_t s = 0; s < p.slots; ++s) {
      if (seen[s] != 1) {
        return MakeError(ErrorCode::kInternal,
                         fmt::format("fixed split: slot {} of pool '{}' is accounted {} times", s, config_.kinds[k].name, seen[s]));
      }
    }
  }
  return Ok();
}

}  // namespace ula

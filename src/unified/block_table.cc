#include "unified/block_table.h"

#include <fmt/format.h>

#include "ula/check.h"

namespace ula::internal {

BlockId BlockTable::Add(BlockKind kind, std::uint64_t pos) {
  std::uint32_t index;
  if (!free_ids_.empty()) {
    index = free_ids_.back();
    free_ids_.pop_back();
  } else {
    ULA_CHECK(entries_.size() < BlockId::kInvalidValue);
    index = static_cast<std::uint32_t>(entries_.size());
    entries_.emplace_back();
  }
  entries_[index] = Entry{pos, kind, 0, true};
  ++num_live_;
  return BlockId(index);
}

void BlockTable::Remove(BlockId id) {
  Entry& e = entries_.at(id.value());
  ULA_CHECK(e.live && e.pins == 0);
  e.live = false;
  free_ids_.push_back(id.value());
  --num_live_;
}

Result<const BlockTable::Entry*> BlockTable::Find(BlockId id) const {
  if (!id.valid() || id.value() >= entries_.size()) {
    return MakeError(ErrorCode::kNotFound, fmt::format("block {} is unknown", id.valid() ? std::int64_t{id.value()} : -1));
  }
  const Entry& e = entries_[id.value()];
  if (!e.live) return MakeError(ErrorCode::kNotFound, fmt::format("block {} is not live (freed)", id.value()));
  return &e;
}

Status BlockTable::CheckInvariants() const {
  std::size_t live = 0;
  for (const auto& e : entries_) live += e.live ? 1 : 0;
  if (live != num_live_) return MakeError(ErrorCode::kInternal, "block table: live count is stale");
  if (live + free_ids_.size() != entries_.size()) {
    return MakeError(ErrorCode::kInternal, "block table: free list does not cover the dead entries");
  }
  for (auto id : free_ids_) {
    if (entries_[id].live) return MakeError(ErrorCode::kInternal, fmt::format("block table: live id {} on the free list", id));
  }
  return Ok();
}

}  // namespace ula::internal

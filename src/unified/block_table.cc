#include "unified/block_table.h"

#include <fmt/format.h>

#include "ula/check.h"

namespace ula::internal {

BlockId BlockTable::Add(BlockKind kind, std::uint64_t pos) {
  std::uint32_t index;
  if (!free_ids_.empty()) {
    index = free_ids_.front();
    free_ids_.pop_front();
  } else {
    ULA_CHECK(entries_.size() < kMaxEntries);
    index = static_cast<std::uint32_t>(entries_.size());
    entries_.emplace_back();
  }
  Entry& e = entries_[index];
  e = Entry{pos, kind, e.generation, 0, true};
  ++num_live_;
  return IdAt(index);
}

void BlockTable::Remove(BlockId id) {
  ULA_CHECK(FindLive(id) != nullptr);
  Entry& e = entries_[IndexOf(id)];
  ULA_CHECK(e.pins == 0);
  e.live = false;
  e.generation = static_cast<std::uint16_t>((e.generation + 1) & kGenerationMask);
  free_ids_.push_back(IndexOf(id));
  --num_live_;
}

Result<const BlockTable::Entry*> BlockTable::Find(BlockId id) const {
  if (const Entry* e = FindLive(id)) return e;
  if (!id.valid()) return MakeError(ErrorCode::kNotFound, "block -1 (invalid id) is unknown");
  const std::uint32_t index = IndexOf(id);
  if (index >= entries_.size()) {
    return MakeError(ErrorCode::kNotFound, fmt::format("block {} (index {}) is unknown", id.value(), index));
  }
  if (!entries_[index].live) {
    return MakeError(ErrorCode::kNotFound, fmt::format("block {} (index {}) is not live (freed)", id.value(), index));
  }
  return MakeError(ErrorCode::kNotFound,
                   fmt::format("block {} is stale: index {} was freed and reused (generation {}, now {})", id.value(),
                               index, GenerationOf(id), entries_[index].generation));
}

Status BlockTable::CheckInvariants() const {
  std::size_t live = 0;
  for (const auto& e : entries_) {
    live += e.live ? 1 : 0;
    if (e.generation > kGenerationMask) return MakeError(ErrorCode::kInternal, "block table: generation out of range");
  }
  if (live != num_live_) return MakeError(ErrorCode::kInternal, "block table: live count is stale");
  if (live + free_ids_.size() != entries_.size()) {
    return MakeError(ErrorCode::kInternal, "block table: free list does not cover the dead entries");
  }
  for (auto id : free_ids_) {
    if (id >= entries_.size() || entries_[id].live) {
      return MakeError(ErrorCode::kInternal, fmt::format("block table: live or unknown index {} on the free list", id));
    }
  }
  return Ok();
}

}  // namespace ula::internal

#include "unified/end_layout.h"

#include <fmt/format.h>

#include "ula/check.h"

namespace ula::internal {

namespace {
constexpr std::size_t kMaxSpare = 64;
}  // namespace

void EndLayout::EraseLive(LiveMap::iterator it) {
  if (spare_live_.size() < kMaxSpare) {
    spare_live_.push_back(live_.extract(it));
  } else {
    live_.erase(it);
  }
}

void EndLayout::InsertLive(std::uint64_t pos, const Item& item) {
  if (spare_live_.empty()) {
    live_.emplace(pos, item);
    return;
  }
  LiveMap::node_type node = std::move(spare_live_.back());
  spare_live_.pop_back();
  node.key() = pos;
  node.mapped() = item;
  live_.insert(std::move(node));
}

void EndLayout::EraseHole(HoleMap::iterator it) {
  if (spare_holes_.size() < kMaxSpare) {
    spare_holes_.push_back(holes_.extract(it));
  } else {
    holes_.erase(it);
  }
}

void EndLayout::InsertHole(std::uint64_t pos, std::uint64_t size) {
  if (spare_holes_.empty()) {
    holes_.emplace(pos, size);
    return;
  }
  HoleMap::node_type node = std::move(spare_holes_.back());
  spare_holes_.pop_back();
  node.key() = pos;
  node.mapped() = size;
  holes_.insert(std::move(node));
}

std::optional<std::uint64_t> EndLayout::PlaceInHole(BlockId id, std::uint64_t size) {
  for (auto it = holes_.begin(); it != holes_.end(); ++it) {
    if (it->second >= size) {
      const std::uint64_t pos = it->first;
      TakeFromHole(it, size);
      InsertLive(pos, Item{id, size, false});
      return pos;
    }
  }
  return std::nullopt;
}

std::uint64_t EndLayout::PlaceAtTop(BlockId id, std::uint64_t size) {
  const std::uint64_t pos = top_;
  InsertLive(pos, Item{id, size, false});
  top_ += size;
  return pos;
}

void EndLayout::TakeFromHole(std::map<std::uint64_t, std::uint64_t>::iterator hole, std::uint64_t size) {
  const std::uint64_t pos = hole->first;
  const std::uint64_t hole_size = hole->second;
  ULA_DCHECK(hole_size >= size);
  hole_bytes_ -= size;
  // A remainder keeps a live block above it (the hole never touched top), so it stays a hole.
  if (hole_size > size) {
    // Same order in the map: reuse the node in place.
    auto node = holes_.extract(hole);
    node.key() = pos + size;
    node.mapped() = hole_size - size;
    holes_.insert(std::move(node));
  } else {
    EraseHole(hole);
  }
}

void EndLayout::Release(std::uint64_t pos) {
  auto it = live_.find(pos);
  ULA_CHECK(it != live_.end());
  const std::uint64_t size = it->second.size;
  EraseLive(it);
  AddHole(pos, size);
}

void EndLayout::SetId(std::uint64_t pos, BlockId id) {
  auto it = live_.find(pos);
  ULA_CHECK(it != live_.end());
  it->second.id = id;
}

void EndLayout::SetPinned(std::uint64_t pos, bool pinned) {
  auto it = live_.find(pos);
  ULA_CHECK(it != live_.end());
  it->second.pinned = pinned;
}

void EndLayout::AddHole(std::uint64_t pos, std::uint64_t size) {
  hole_bytes_ += size;
  auto next = holes_.lower_bound(pos);
  if (next != holes_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == pos) {
      pos = prev->first;
      size += prev->second;
      EraseHole(prev);
    }
  }
  if (next != holes_.end() && next->first == pos + size) {
    size += next->second;
    EraseHole(next);
  }
  if (pos + size == top_) {  // touches the middle: give it back
    top_ = pos;
    hole_bytes_ -= size;
    return;
  }
  InsertHole(pos, size);
}

std::uint64_t EndLayout::Compact(const MoveFn& on_move) {
  std::uint64_t moved = 0;
  while (!holes_.empty()) {
    bool did_move = false;
    const std::uint64_t lowest_hole = holes_.begin()->first;
    // Only blocks above the outermost pinned block can move: moving one below it would
    // cost bytes without returning anything to the middle.
    for (auto it = live_.rbegin(); it != live_.rend() && it->first > lowest_hole; ++it) {
      if (it->second.pinned) break;
      const std::uint64_t from = it->first;
      const Item item = it->second;
      auto hole = holes_.begin();
      while (hole != holes_.end() && hole->first < from && hole->second < item.size) ++hole;
      if (hole == holes_.end() || hole->first >= from) continue;
      const std::uint64_t to = hole->first;
      if (on_move && !on_move(item.id, from, to, item.size)) return moved;  // copy failed: stays put
      EraseLive(std::prev(it.base()));
      TakeFromHole(hole, item.size);
      InsertLive(to, item);
      AddHole(from, item.size);
      moved += item.size;
      did_move = true;
      break;
    }
    if (!did_move) break;
  }
  return moved;
}

Status EndLayout::CheckInvariants() const {
  std::uint64_t cursor = 0;
  std::uint64_t holes = 0;
  auto l = live_.begin();
  auto h = holes_.begin();
  bool last_was_hole = false;
  while (l != live_.end() || h != holes_.end()) {
    if (h != holes_.end() && h->first == cursor) {
      if (last_was_hole) return MakeError(ErrorCode::kInternal, fmt::format("buffer end: adjacent holes at {}", cursor));
      if (h->second == 0) return MakeError(ErrorCode::kInternal, "buffer end: empty hole");
      cursor += h->second;
      holes += h->second;
      last_was_hole = true;
      ++h;
    } else if (l != live_.end() && l->first == cursor) {
      if (l->second.size == 0) return MakeError(ErrorCode::kInternal, "buffer end: empty block");
      cursor += l->second.size;
      last_was_hole = false;
      ++l;
    } else {
      return MakeError(ErrorCode::kInternal, fmt::format("buffer end: gap or overlap at position {}", cursor));
    }
  }
  if (cursor != top_) return MakeError(ErrorCode::kInternal, fmt::format("buffer end: tiles end at {} but top is {}", cursor, top_));
  if (last_was_hole) return MakeError(ErrorCode::kInternal, "buffer end: a hole touches the top");
  if (holes != hole_bytes_) return MakeError(ErrorCode::kInternal, "buffer end: hole byte count is stale");
  return Ok();
}

}  // namespace ula::internal

// EndLayout: the metadata of one end of the unified buffer, in positions measured from that
// end's edge (pos 0 = the buffer edge, growing toward the middle), so that the low and the
// high end share one implementation. Holds no bytes; copies of it are cheap enough to
// simulate a placement (CanAllocate). Erased map nodes are kept (at most kMaxSpare per map)
// and reused by the next insert, so steady alloc/free does not call the heap.
//
// Invariants: live blocks and holes tile [0, top) exactly, without overlap; holes are
// coalesced (no two adjacent) and none ends at top; hole_bytes == sum of hole sizes.
// Thread-safety: none.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "ula/error.h"
#include "ula/ids.h"

namespace ula::internal {

class EndLayout {
 public:
  struct Item {
    BlockId id;
    std::uint64_t size = 0;
    bool pinned = false;
  };
  // Called for each compaction move, before the metadata changes: it copies the bytes
  // (into the hole at to_pos, free space) and returns whether they arrived. On false the
  // block stays at from_pos and the compaction stops there.
  using MoveFn = std::function<bool(BlockId id, std::uint64_t from_pos, std::uint64_t to_pos, std::uint64_t size)>;

  EndLayout() = default;
  // Copies the layout, not the spare nodes (a simulation copy allocates what it needs).
  EndLayout(const EndLayout& other)
      : live_(other.live_), holes_(other.holes_), top_(other.top_), hole_bytes_(other.hole_bytes_) {}
  EndLayout& operator=(const EndLayout&) = delete;

  std::uint64_t top() const { return top_; }
  std::uint64_t hole_bytes() const { return hole_bytes_; }
  const std::map<std::uint64_t, Item>& live() const { return live_; }
  const std::map<std::uint64_t, std::uint64_t>& holes() const { return holes_; }

  // First fit (nearest the edge) into a hole; the position, or nullopt if no hole fits.
  std::optional<std::uint64_t> PlaceInHole(BlockId id, std::uint64_t size);
  // Places at top (the caller has checked the middle); returns the position.
  std::uint64_t PlaceAtTop(BlockId id, std::uint64_t size);
  // REQUIRES: a live block at pos.
  void Release(std::uint64_t pos);
  // REQUIRES: a live block at pos.
  void SetId(std::uint64_t pos, BlockId id);
  // REQUIRES: a live block at pos.
  void SetPinned(std::uint64_t pos, bool pinned);
  // Moves unpinned blocks above the outermost pinned block into holes nearer the edge
  // (first fit, outermost block first) until no move is possible. Returns the bytes moved.
  // on_move may be empty (simulation).
  std::uint64_t Compact(const MoveFn& on_move);

  Status CheckInvariants() const;

 private:
  using LiveMap = std::map<std::uint64_t, Item>;
  using HoleMap = std::map<std::uint64_t, std::uint64_t>;
  // Node recycling: erasing keeps the map node for the next insert, so the steady state of
  // alloc/free (a hole opened and filled, a block placed and released) allocates no memory.
  void EraseLive(LiveMap::iterator it);
  void InsertLive(std::uint64_t pos, const Item& item);
  void EraseHole(HoleMap::iterator it);
  void InsertHole(std::uint64_t pos, std::uint64_t size);

  void AddHole(std::uint64_t pos, std::uint64_t size);
  void TakeFromHole(std::map<std::uint64_t, std::uint64_t>::iterator hole, std::uint64_t size);

  std::map<std::uint64_t, Item> live_;             // pos -> block
  std::map<std::uint64_t, std::uint64_t> holes_;  // pos -> size
  std::uint64_t top_ = 0;
  std::uint64_t hole_bytes_ = 0;
  std::vector<LiveMap::node_type> spare_live_;  // detached nodes, reused by InsertLive
  std::vector<HoleMap::node_type> spare_holes_;
};

}  // namespace ula::internal

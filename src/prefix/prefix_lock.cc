// PrefixCache: locks (KV, state and window locks of a match, with their pins) and
// MatchCopyOnWrite with its checkpoint copy (see include/ula/prefix_cache.h).
#include "ula/prefix_cache.h"

#include <fmt/format.h>

#include <cstring>
#include <utility>
#include <vector>

#include "prefix/prefix_cache_update.h"
#include "prefix/tree_util.h"
#include "ula/check.h"

namespace ula {

using internal::PathTo;

Result<std::uint32_t> PrefixCache::LockedNode(const PrefixMatch& match, bool locking) const {
  if (match.length == 0) return 0u;
  const std::uint32_t id = match.path.empty() ? 0 : match.path.back();
  if (id == 0 || id >= nodes_.size() || !nodes_[id].live || nodes_[id].end != match.length ||
      nodes_[id].checkpoint.state != match.checkpoint.state) {
    return MakeError(locking ? ErrorCode::kNotFound : ErrorCode::kFailedPrecondition,
                     fmt::format("prefix cache: the matched node {} is gone", id));
  }
  if (!locking) {
    if (nodes_[id].state_locks == 0) {
      return MakeError(ErrorCode::kFailedPrecondition, fmt::format("prefix cache: node {} of the match is not locked", id));
    }
    for (std::uint32_t a = id; a != 0; a = nodes_[a].parent) {
      if (nodes_[a].kv_locks == 0) {
        return MakeError(ErrorCode::kFailedPrecondition, fmt::format("prefix cache: node {} of the match is not locked", a));
      }
    }
  } else if (nodes_[id].state_locks == UINT32_MAX) {
    return MakeError(ErrorCode::kFailedPrecondition, "prefix cache: lock count overflow");
  }
  return id;
}

void PrefixCache::PinMatch(std::uint32_t node, bool pin) {
  const Node& d = nodes_[node];
  std::vector<BlockId> blocks = PagesOfPath(PathTo(node, nodes_), d.end);
  for (BlockId b : {d.checkpoint.state, d.checkpoint.window}) {
    if (b.valid()) blocks.push_back(b);  // no state without a recurrent kind
  }
  for (BlockId b : blocks) ULA_CHECK((pin ? allocator_->Pin(b) : allocator_->Unpin(b)).has_value());
}

Status PrefixCache::Lock(const PrefixMatch& match) {
  auto id = LockedNode(match, true);
  if (!id) return std::unexpected(std::move(id).error());
  if (*id == 0) return Ok();
  for (BlockId b : match.window_pages) {  // present, on the path
    if (b.valid() && WindowOwner(*id, b) == 0) {
      return MakeError(ErrorCode::kNotFound, fmt::format("prefix cache: window page {} of the match is gone", b.value()));
    }
  }
  LockWindow(match, *id, true);
  PinMatch(*id, true);
  Update(*id, [&] { ++nodes_[*id].state_locks; });
  for (std::uint32_t a = *id; a != 0; a = nodes_[a].parent) Update(a, [&] { ++nodes_[a].kv_locks; });
  return Ok();
}

Status PrefixCache::Unlock(const PrefixMatch& match) {
  auto id = LockedNode(match, false);
  if (!id) return std::unexpected(std::move(id).error());
  if (*id == 0) return Ok();
  ULA_RETURN_IF_ERROR(CheckWindowLocked(match, *id));
  LockWindow(match, *id, false);
  PinMatch(*id, false);
  Update(*id, [&] { --nodes_[*id].state_locks; });
  for (std::uint32_t a = *id; a != 0; a = nodes_[a].parent) Update(a, [&] { --nodes_[a].kv_locks; });
  // A tombstoned leaf (or window tombstone) that only the lock kept is useless now.
  if (Useless(*id)) {
    EvictionStats ignored;
    RemoveLeaf(*id, ignored);
  }
  ULA_EXPENSIVE_CHECK(*this);
  return Ok();
}

Result<PrefixMatch> PrefixCache::MatchCopyOnWrite(std::span<const std::uint32_t> tokens, std::uint32_t max_length,
                                                  EvictionRule rule) {
  PrefixMatch m = Match(tokens, max_length);
  // A deeper checkpoint on the host tier: bring it back. When that fails (no room, a failed
  // copy), the request starts from the device match (host_length still says what it missed).
  if (m.host_length > m.length && LoadBack(NodeAt(tokens, m.host_length), rule)) m = Match(tokens, max_length);
  if (m.length == 0) return m;
  ULA_RETURN_IF_ERROR(Lock(m));
  if (stateless()) return m;  // no state to copy
  Demand d = Demand::Of(allocator_->num_kinds()).Add(config_.state_kind, 1);
  if (m.checkpoint.window.valid()) d.Add(config_.window_kind, 1);
  if (!allocator_->CanAllocate(d)) {
    if (auto s = MakeRoom(d, rule); !s) {
      ULA_CHECK(Unlock(m).has_value());
      return std::unexpected(std::move(s).error());
    }
  }
  auto ids = allocator_->AllocateDemand(d);
  if (!ids) {
    ULA_CHECK(Unlock(m).has_value());
    return std::unexpected(std::move(ids).error());
  }
  for (BlockId id : *ids) (allocator_->KindOf(id) == config_.state_kind ? m.copy.state : m.copy.window) = id;
  if (Status copied = CopyCheckpoint(m.checkpoint, m.copy); !copied) {
    for (BlockId id : *ids) ULA_CHECK(allocator_->Free(id).has_value());
    ULA_CHECK(Unlock(m).has_value());
    return std::unexpected(Error(copied.error().code(),
                                 "prefix cache: copy-on-write of the checkpoint failed: " + copied.error().message()));
  }
  return m;
}

Status PrefixCache::AttachCopyBackend(Backend* backend, ArenaId device_arena) {
  if (mover_ != nullptr) return MakeError(ErrorCode::kFailedPrecondition, "prefix cache: a copy backend is attached already");
  if (backend == nullptr || !backend->GetArena(device_arena)) {
    return MakeError(ErrorCode::kInvalidArgument, "prefix cache copy backend: needs a backend that holds the device arena");
  }
  mover_ = backend;
  mover_arena_ = device_arena;
  return Ok();
}

Status PrefixCache::CopyCheckpoint(const Checkpoint& from, const Checkpoint& to) {
  const std::pair<BlockId, BlockId> parts[] = {{from.state, to.state}, {from.window, to.window}};
  if (mover_ == nullptr) {
    for (auto [src_id, dst_id] : parts) {
      if (!src_id.valid()) continue;
      auto src = allocator_->Bytes(src_id);
      auto dst = allocator_->Bytes(dst_id);
      ULA_CHECK(src.has_value() && dst.has_value() && src->size() == dst->size());
      if (!src->empty()) std::memcpy(dst->data(), src->data(), src->size());
    }
    return Ok();
  }
  // Both ends pinned (no move while copied), one batch per block, every fence waited on.
  std::vector<BlockId> pinned;
  std::vector<Fence> fences;
  Status status = Ok();
  for (auto [src_id, dst_id] : parts) {
    if (!src_id.valid()) continue;
    for (BlockId b : {src_id, dst_id}) {
      ULA_CHECK(allocator_->Pin(b).has_value());
      pinned.push_back(b);
    }
    CopyBatch b;
    b.src = b.dst = mover_arena_;
    b.bytes_per_move = static_cast<std::uint32_t>(allocator_->kind_config(*allocator_->KindOf(src_id)).block_bytes);
    b.moves = {SlotMove{*allocator_->Offset(src_id), *allocator_->Offset(dst_id)}};
    auto fence = mover_->Submit(std::move(b));
    if (!fence) {
      status = std::unexpected(std::move(fence).error());
      break;
    }
    fences.push_back(*fence);
  }
  for (Fence f : fences) {
    if (auto w = mover_->Wait(f); !w && status) status = std::unexpected(std::move(w).error());
  }
  for (BlockId b : pinned) ULA_CHECK(allocator_->Unpin(b).has_value());
  return status;
}

}  // namespace ula

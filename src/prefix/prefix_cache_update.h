// PrefixCache::Update, shared by the prefix cache's sources (internal): removes a node from
// every LRU set, runs the change, and puts it back into the sets it now belongs to, with its
// current key (include/ula/prefix_cache.h says which node belongs to which set).
#pragma once

#include <algorithm>

#include "ula/prefix_cache.h"

namespace ula {

template <class F>
void PrefixCache::Update(std::uint32_t id, F&& f) {
  if (id == 0) {
    f();
    return;
  }
  const LruKey old = KeyOf(id);
  kv_lru_.erase(old);
  state_lru_.erase(old);
  host_lru_.erase(old);
  window_lru_.erase(WindowKeyOf(id));
  host_kv_lru_.erase(old);
  f();
  const Node& n = nodes_[id];
  if (!n.live) return;
  if (!n.kv_on_host && n.kv_locks == 0 && !HasDeviceChild(n)) kv_lru_.insert(KeyOf(id));
  if (n.kv_on_host && n.kv_locks == 0 && n.children.empty()) host_kv_lru_.insert(KeyOf(id));
  if (n.checkpoint.valid() && n.state_locks == 0) state_lru_.insert(KeyOf(id));
  if (n.host != kNoSlot && id != loading_) host_lru_.insert(KeyOf(id));
  const bool any_window = n.whead.valid() || std::any_of(n.wpages.begin(), n.wpages.end(), [](BlockId b) { return b.valid(); });
  if (any_window && n.window_locks == 0) window_lru_.insert(WindowKeyOf(id));
}

}  // namespace ula

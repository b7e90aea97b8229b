// EventHashes (prefix tests): replays a PrefixCache's events and checks each block hash.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ula/prefix_cache.h"

namespace ula {

// Replays a cache's events and checks every block hash against what it must be: a store's
// hash is SGLang's hash of its path (its parent's path, which an earlier store gave, and its
// own tokens: BlockHashes recomputes the chain), and a removal carries the hash its store
// did (device blocks by id, host pages by hash). Returns the first problem ("" when none).
class EventHashes {
 public:
  std::string Take(PrefixCache& cache) { return Replay(cache.TakeEvents(), cache.config().page_tokens); }
  std::string Replay(const std::vector<CacheEvent>& events, std::uint32_t P) {
    for (const CacheEvent& e : events) {
      if (e.state() || e.type == CacheEvent::Type::kAllCleared) continue;
      const int kind = e.window() ? 1 : 0;
      if (e.stored()) {
        std::vector<std::uint32_t> path;
        if (e.parent_hash) {
          auto it = paths_.find(*e.parent_hash);
          if (it == paths_.end()) return "a store whose parent was never stored";
          path = it->second;
        }
        if (path.size() != e.position) return "a store whose parent's path does not end at its position";
        path.insert(path.end(), e.tokens.begin(), e.tokens.end());
        if (BlockHashes(path, P).back() != e.hash) return "a store whose hash is not its path's";
        paths_[e.hash] = path;
        if (e.medium == EventMedium::kDevice) stored_[{kind, e.block}] = e.hash;
        ++checked_;
      } else if (e.medium == EventMedium::kDevice) {
        auto it = stored_.find({kind, e.block});
        if (it == stored_.end()) return "a removal of a block never stored";
        if (it->second != e.hash) return "a removal whose hash is not its store's";
        stored_.erase(it);
        ++checked_;
      }
    }
    return "";
  }
  int checked() const { return checked_; }

 private:
  std::map<std::int64_t, std::vector<std::uint32_t>> paths_;                     // hash -> the tokens of its path
  std::map<std::pair<int, BlockId>, std::int64_t> stored_;  // (window?, device block) -> hash
  int checked_ = 0;
};

}  // namespace ula

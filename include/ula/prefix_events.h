// The prefix cache's events: what KV-aware routers read (SGLang's and vLLM's BlockStored /
// BlockRemoved / AllBlocksCleared, which SGLang's model gateway, vLLM's routers and Dynamo
// consume), in process. KvEventPublisher (ula/kv_event_publisher.h) sends them over the wire.
//
// A block's hash is SGLang's by default (EventHash::kSglang, SGLang's get_hash_str and
// hash_str_to_int64): SHA-256 over the parent page's 32-byte digest (none for the first page)
// followed by each token as 4 bytes little-endian; the event hash is the digest's first 8
// bytes read big-endian as a signed int64. Page i chains onto page i - 1 along the path, so
// equal prefixes hash equal in every cache and agree with SGLang's HiCache storage keys. A
// partial last page hashes the tokens it held when stored and keeps that hash. kDebug is the
// project's 64-bit StateDigest chain (cheaper; keys agree only with another ula cache).
//
// Kinds (Type) never mix: a window page's event has the hash of the KV page at its index (the
// same tokens) but is a window event, which the publisher sends in its own group (vLLM's
// group_idx 1, "sliding_window"), so no adapter mistakes it for the KV block's store or
// removal; state (checkpoint) events carry no hash and are not sent as blocks.
// The kinds cache (ula/sparse_prefix_cache.h, kinds mode) names each event's kind by its group
// (CacheEvent::group, spec_kind): a C4 page and a C128 block are "mla_attention" (vLLM's kind for
// DeepSeek's MLA layers), a window block "sliding_window_mla", each kind its own group_idx.
// Medium: where the block lives (the device, or the host tier's slots). A move to the host is
// a device removal and a host store; a load back the reverse; dropping a host copy a host
// removal. kAllCleared (PrefixCache::Reset) says every block of every medium is gone.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ula/hybrid_allocator.h"

namespace ula {

enum class EventHash : std::uint8_t { kSglang, kDebug };
enum class EventMedium : std::uint8_t { kDevice, kHost };
// vLLM's and SGLang's medium strings: "GPU" (the device), "CPU" (the host tier).
const char* EventMediumName(EventMedium medium);

struct CacheEvent {
  enum class Type : std::uint8_t {
    kPageStored, kPageRemoved, kStateStored, kStateRemoved, kWindowStored, kWindowRemoved, kAllCleared
  };
  Type type = Type::kPageStored;
  BlockId block = BlockId::Invalid();  // the device block (invalid on the host medium and for kAllCleared)
  std::uint32_t position = 0;       // page: index * page_tokens; state: its position
  std::int64_t hash = 0;            // pages and window pages: the block hash (states: 0)
  std::optional<std::int64_t> parent_hash = std::nullopt;  // stored pages: the previous page's hash (none: page 0)
  std::vector<std::uint32_t> tokens = {};  // stored pages: the page's tokens (a partial page: those it holds)
  EventMedium medium = EventMedium::kDevice;
  // The kinds cache's events (SparsePrefixCache over a space with kinds): the block's KV cache
  // group, as vLLM's BlockStored / BlockRemoved name it: group_idx and kv_cache_spec_kind (a
  // value of vLLM's KVCacheSpecKind, vllm/v1/kv_cache_interface.py get_kv_cache_spec_kind;
  // the fields of vllm/distributed/kv_events.py), and a sliding-window kind's window
  // (kv_cache_spec_sliding_window). group < 0: none (the hybrid cache's events, whose window
  // pages are group 1, "sliding_window").
  std::int32_t group = -1;
  std::string spec_kind = {};
  std::uint32_t spec_window = 0;

  bool stored() const { return type == Type::kPageStored || type == Type::kStateStored || type == Type::kWindowStored; }
  bool kv() const { return type == Type::kPageStored || type == Type::kPageRemoved; }
  bool window() const { return type == Type::kWindowStored || type == Type::kWindowRemoved; }
  bool state() const { return type == Type::kStateStored || type == Type::kStateRemoved; }
};

// The event hash of each page of `tokens` (pages of page_tokens, the last maybe partial),
// chained from the root: what a cache that stores these tokens reports. REQUIRES: page_tokens > 0.
std::vector<std::int64_t> BlockHashes(std::span<const std::uint32_t> tokens, std::uint32_t page_tokens,
                                      EventHash hash = EventHash::kSglang);

}  // namespace ula

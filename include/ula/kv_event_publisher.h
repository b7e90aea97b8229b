// KvEventPublisher: sends the prefix cache's events (ula/prefix_events.h) as KVEventBatch
// messages, the schema SGLang's and vLLM's ZmqEventPublisher publish and KV-aware routers
// (SGLang's model gateway, vLLM's routers, Dynamo) subscribe to: msgpack over a ZeroMQ PUB
// socket, each message three frames [topic, sequence number as 8 bytes big-endian, payload].
//
// Payload (msgspec's array_like, tagged encoding of SGLang's / vLLM's structs):
//   KVEventBatch      [ts (float64), [event...], data_parallel_rank (only when set)]
//   BlockStored       ["BlockStored", [hash...], parent_hash | nil, [token...], block_size,
//                      lora_id = nil, medium, lora_name = nil
//                      (window pages also: extra_keys = nil, group_idx = 1,
//                       kv_cache_spec_kind = "sliding_window", kv_cache_spec_sliding_window = W;
//                       an event with a group (the kinds cache's: CacheEvent::group) the same
//                       four with its group_idx, spec_kind and spec_window (nil when 0))]
//   BlockRemoved      ["BlockRemoved", [hash...], medium (, group_idx = 1 for window pages,
//                      the event's group for a grouped one)]
//   AllBlocksCleared  ["AllBlocksCleared"]
// medium is "GPU" or "CPU" (EventMediumName). Consecutive stores of one kind and medium that
// chain (each onto the previous, which was a full block) become one BlockStored (one group too), as SGLang
// emits one per inserted node; consecutive removals of one kind and medium one BlockRemoved.
// Window pages are their own group (vLLM's group_idx for a hybrid model's sliding-window
// group), so a router keyed by (group, hash) never takes a window removal for the KV
// block's. Checkpoint (state) events are not sent: they carry no block hash.
//
// The socket is bound (the publisher is the server, as SGLang's default tcp://*:5557): an
// endpoint "tcp://127.0.0.1:*" takes a free port, which endpoint() reports. Publish sends
// synchronously in the caller's thread (ZeroMQ queues up to the high-water mark; beyond it a
// PUB socket drops, as SGLang's). Thread-safety: none; one caller at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "ula/error.h"
#include "ula/prefix_events.h"

namespace ula {

struct KvEventPublisherConfig {
  std::string endpoint = "tcp://127.0.0.1:5557";  // tcp://, ipc:// or inproc://, bound
  std::string topic = {};                         // the first frame of every message
  std::uint32_t block_size = 16;                  // tokens per block: the cache's page_tokens
  std::uint32_t sliding_window = 0;               // the cache's sliding_window (window pages' group spec)
  std::optional<std::int32_t> data_parallel_rank = std::nullopt;  // KVEventBatch.data_parallel_rank (none: omitted)
  int send_high_water_mark = 100000;              // ZeroMQ's ZMQ_SNDHWM (SGLang's hwm)

  Status Validate() const;
};

class KvEventPublisher {
 public:
  // kInvalidArgument for a bad config, kIo when the socket cannot be bound.
  static Result<std::unique_ptr<KvEventPublisher>> Create(const KvEventPublisherConfig& config);
  ~KvEventPublisher();
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // The endpoint bound (the port chosen when the config asked for "*").
  const std::string& endpoint() const;
  // Sends the events as one KVEventBatch stamped ts (seconds); returns its sequence number
  // (0, 1, ... per publisher). An empty span is a batch with no events (a heartbeat).
  // kIo when ZeroMQ refuses the message (nothing is counted then).
  Result<std::uint64_t> Publish(std::span<const CacheEvent> events, double ts);
  // The payload Publish sends (for tests and other transports).
  std::string Encode(std::span<const CacheEvent> events, double ts) const;

 private:
  struct Impl;
  explicit KvEventPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ula

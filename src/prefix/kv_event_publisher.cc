// KvEventPublisher: KVEventBatch messages, msgpack over a ZeroMQ PUB socket (see
// include/ula/kv_event_publisher.h for the schema).
#include "ula/kv_event_publisher.h"

#include <fmt/format.h>

#include <msgpack.hpp>
#include <zmq.hpp>

#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

namespace ula {

Status KvEventPublisherConfig::Validate() const {
  const bool scheme = endpoint.starts_with("tcp://") || endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://");
  if (!scheme) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("kv event publisher: endpoint '{}' is not tcp://, ipc:// or inproc://", endpoint));
  }
  if (block_size == 0) return MakeError(ErrorCode::kInvalidArgument, "kv event publisher: block_size must be > 0");
  if (send_high_water_mark < 0) return MakeError(ErrorCode::kInvalidArgument, "kv event publisher: a negative high-water mark");
  return Ok();
}

struct KvEventPublisher::Impl {
  KvEventPublisherConfig config;
  zmq::context_t context{1};
  zmq::socket_t socket{context, zmq::socket_type::pub};
  std::string endpoint;
  std::uint64_t next_seq = 0;
};

KvEventPublisher::KvEventPublisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvEventPublisher::~KvEventPublisher() = default;

Result<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Create(const KvEventPublisherConfig& config) {
  ULA_RETURN_IF_ERROR(config.Validate());
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  try {
    impl->socket.set(zmq::sockopt::sndhwm, config.send_high_water_mark);
    impl->socket.set(zmq::sockopt::linger, 0);
    impl->socket.bind(config.endpoint);
    impl->endpoint = impl->socket.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return MakeError(ErrorCode::kIo, fmt::format("kv event publisher: cannot bind '{}': {}", config.endpoint, e.what()));
  }
  return std::unique_ptr<KvEventPublisher>(new KvEventPublisher(std::move(impl)));
}

const std::string& KvEventPublisher::endpoint() const { return impl_->endpoint; }

namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

// msgpack's float 64 (0xcb, 8 bytes big-endian) always: msgpack-cxx's pack_double writes an
// integral value as an integer, where the schema's ts is a float.
void PackFloat64(msgpack::sbuffer& buffer, double v) {
  std::uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  char bytes[9];
  bytes[0] = static_cast<char>(0xcb);
  for (int k = 0; k < 8; ++k) bytes[1 + k] = static_cast<char>(bits >> (8 * (7 - k)));
  buffer.write(bytes, sizeof(bytes));
}

void PackString(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<std::uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<std::uint32_t>(s.size()));
}

// A run of events that becomes one wire event: [first, last) of `events`, all of one type
// and medium (stores chained, each onto the previous full block).
struct Run {
  std::size_t first, last;
};

std::vector<Run> Runs(std::span<const CacheEvent> events, std::uint32_t block_size) {
  std::vector<Run> runs;
  for (std::size_t i = 0; i < events.size(); ++i) {
    const CacheEvent& e = events[i];
    if (e.state()) continue;  // no block hash: not a block event
    if (!runs.empty() && runs.back().last == i && e.type != CacheEvent::Type::kAllCleared) {
      const CacheEvent& prev = events[i - 1];
      const bool same = prev.type == e.type && prev.medium == e.medium && prev.group == e.group;
      const bool chained = !e.stored() || (e.parent_hash == prev.hash && prev.tokens.size() == block_size);
      if (same && chained) {
        runs.back().last = i + 1;
        continue;
      }
    }
    runs.push_back({i, i + 1});
  }
  return runs;
}

}  // namespace

std::string KvEventPublisher::Encode(std::span<const CacheEvent> events, double ts) const {
  const KvEventPublisherConfig& c = impl_->config;
  msgpack::sbuffer buffer;
  Packer pk(&buffer);
  pk.pack_array(c.data_parallel_rank ? 3 : 2);
  PackFloat64(buffer, ts);
  const std::vector<Run> runs = Runs(events, c.block_size);
  pk.pack_array(static_cast<std::uint32_t>(runs.size()));
  for (const Run& r : runs) {
    const CacheEvent& head = events[r.first];
    if (head.type == CacheEvent::Type::kAllCleared) {
      pk.pack_array(1);
      PackString(pk, "AllBlocksCleared");
      continue;
    }
    // A group: the kinds cache's (its own group_idx and spec kind) or a window page's (group 1).
    const bool window = head.window() || head.group >= 0;
    if (head.stored()) {
      pk.pack_array(window ? 12 : 8);
      PackString(pk, "BlockStored");
    } else {
      pk.pack_array(window ? 4 : 3);
      PackString(pk, "BlockRemoved");
    }
    pk.pack_array(static_cast<std::uint32_t>(r.last - r.first));
    for (std::size_t i = r.first; i < r.last; ++i) pk.pack(events[i].hash);
    if (head.stored()) {
      if (head.parent_hash) {
        pk.pack(*head.parent_hash);
      } else {
        pk.pack_nil();
      }
      std::size_t tokens = 0;
      for (std::size_t i = r.first; i < r.last; ++i) tokens += events[i].tokens.size();
      pk.pack_array(static_cast<std::uint32_t>(tokens));
      for (std::size_t i = r.first; i < r.last; ++i) {
        for (std::uint32_t t : events[i].tokens) pk.pack(t);
      }
      pk.pack(c.block_size);
      pk.pack_nil();  // lora_id
      PackString(pk, EventMediumName(head.medium));
      pk.pack_nil();  // lora_name
      if (head.group >= 0) {
        pk.pack_nil();         // extra_keys
        pk.pack(head.group);   // group_idx
        PackString(pk, head.spec_kind);
        if (head.spec_window > 0) {
          pk.pack(head.spec_window);
        } else {
          pk.pack_nil();
        }
      } else if (window) {
        pk.pack_nil();  // extra_keys
        pk.pack(1);     // group_idx
        PackString(pk, "sliding_window");
        pk.pack(c.sliding_window);
      }
    } else {
      PackString(pk, EventMediumName(head.medium));
      if (head.group >= 0) {
        pk.pack(head.group);  // group_idx
      } else if (window) {
        pk.pack(1);  // group_idx
      }
    }
  }
  if (c.data_parallel_rank) pk.pack(*c.data_parallel_rank);
  return std::string(buffer.data(), buffer.size());
}

Result<std::uint64_t> KvEventPublisher::Publish(std::span<const CacheEvent> events, double ts) {
  const std::string payload = Encode(events, ts);
  const std::uint64_t seq = impl_->next_seq;
  char seq_bytes[8];
  for (int k = 0; k < 8; ++k) seq_bytes[k] = static_cast<char>(seq >> (8 * (7 - k)));  // big-endian
  try {
    const std::string& topic = impl_->config.topic;
    impl_->socket.send(zmq::buffer(topic), zmq::send_flags::sndmore);
    impl_->socket.send(zmq::buffer(seq_bytes, sizeof(seq_bytes)), zmq::send_flags::sndmore);
    impl_->socket.send(zmq::buffer(payload), zmq::send_flags::none);
  } catch (const zmq::error_t& e) {
    return MakeError(ErrorCode::kIo, fmt::format("kv event publisher: send failed: {}", e.what()));
  }
  ++impl_->next_seq;
  return seq;
}

}  // namespace ula

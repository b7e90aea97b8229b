// Hybrid models: the unified buffer (virtual block ids over one arena) and the radix prefix
// cache over it.
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <unordered_map>

#include "bind_common.h"
#include "ula/backend.h"
#include "ula/kv_event_publisher.h"
#include "ula/prefix_cache.h"
#include "ula/unified_buffer.h"

namespace ulapy {
namespace {

ula::Demand ToDemand(const ula::HybridAllocator& a, const std::vector<std::uint32_t>& blocks) {
  if (blocks.size() != a.num_kinds()) {
    Throw(ula::ErrorCode::kInvalidArgument, "demand: one count per kind (" + std::to_string(a.num_kinds()) +
                                                " kinds), got " + std::to_string(blocks.size()));
  }
  return ula::Demand{blocks};
}

ula::BufferEnd ParseEnd(const std::string& e) {
  if (e == "low") return ula::BufferEnd::kLow;
  if (e == "high") return ula::BufferEnd::kHigh;
  Throw(ula::ErrorCode::kInvalidArgument, "end must be 'low' or 'high', got '" + e + "'");
  return ula::BufferEnd::kLow;
}

ula::EvictionRule ParseRule(const std::string& rule) {
  if (rule != "allocation_aware" && rule != "naive") {
    Throw(ula::ErrorCode::kInvalidArgument, "rule must be 'allocation_aware' or 'naive'");
  }
  return rule == "naive" ? ula::EvictionRule::kNaive : ula::EvictionRule::kAllocationAware;
}

py::object OptionalId(ula::BlockId b) { return b.valid() ? py::object(py::int_(b.value())) : py::none(); }

const char* EventTypeName(ula::CacheEvent::Type t) {
  switch (t) {
    case ula::CacheEvent::Type::kPageStored: return "page_stored";
    case ula::CacheEvent::Type::kPageRemoved: return "page_removed";
    case ula::CacheEvent::Type::kStateStored: return "state_stored";
    case ula::CacheEvent::Type::kStateRemoved: return "state_removed";
    case ula::CacheEvent::Type::kWindowStored: return "window_stored";
    case ula::CacheEvent::Type::kWindowRemoved: return "window_removed";
    case ula::CacheEvent::Type::kAllCleared: return "all_cleared";
  }
  return "unknown";
}

// (position, state block, window ring block or -1)
using PyCheckpoint = std::tuple<std::uint32_t, std::uint32_t, std::int64_t>;

std::vector<ula::PositionedCheckpoint> ToCheckpoints(const std::vector<PyCheckpoint>& checkpoints) {
  std::vector<ula::PositionedCheckpoint> cps;
  for (const auto& [pos, state, window] : checkpoints) {
    cps.push_back({pos, {ula::BlockId(state), window < 0 ? ula::BlockId::Invalid()
                                                         : ula::BlockId(static_cast<std::uint32_t>(window))}});
  }
  return cps;
}

// Window pages from Python: int64, -1 where released (none: no window pages).
std::vector<ula::BlockId> ToWindowPages(const std::optional<py::array>& window_pages) {
  std::vector<ula::BlockId> w;
  if (!window_pages) return w;
  for (std::int64_t b : View<const std::int64_t>(*window_pages, "window_pages", 1)) {
    if (b > std::int64_t{UINT32_MAX} - 1) Throw(ula::ErrorCode::kInvalidArgument, "window_pages: a block id out of range");
    w.push_back(b < 0 ? ula::BlockId::Invalid() : ula::BlockId(static_cast<std::uint32_t>(b)));
  }
  return w;
}

// A Python UnifiedBuffer lives on a CPU backend it owns (one device arena), so that a prefix
// cache over it can put a host tier and its checkpoint copies on the same backend.
struct BufferOwner {
  std::unique_ptr<ula::Backend> backend;
  std::unique_ptr<ula::UnifiedBuffer> buffer;
  ~BufferOwner();
};
std::unordered_map<const ula::UnifiedBuffer*, BufferOwner*>& Owners() {  // under the GIL
  static auto* owners = new std::unordered_map<const ula::UnifiedBuffer*, BufferOwner*>();
  return *owners;
}
BufferOwner::~BufferOwner() {
  Owners().erase(buffer.get());
  buffer.reset();  // before its backend
}
BufferOwner& OwnerOf(const ula::UnifiedBuffer& b) {
  auto it = Owners().find(&b);
  if (it == Owners().end()) Throw(ula::ErrorCode::kInvalidArgument, "buffer: not a ulacache.UnifiedBuffer");
  return *it->second;
}

std::shared_ptr<ula::UnifiedBuffer> NewBuffer(const ula::UnifiedBufferConfig& c) {
  auto owner = std::make_shared<BufferOwner>();
  owner->backend = ula::MakeCpuBackend(ula::CpuBackendOptions{.copy_threads = 0});
  const ula::Arena arena = Unwrap(owner->backend->CreateArena(ula::Tier::kDevice, ula::Rank(0), std::max<std::uint64_t>(1, c.capacity_bytes)));
  owner->buffer = Unwrap(ula::UnifiedBuffer::Create(c, arena));
  Owners()[owner->buffer.get()] = owner.get();
  return std::shared_ptr<ula::UnifiedBuffer>(owner, owner->buffer.get());  // owns the owner
}

}  // namespace

void BindHybrid(py::module_& m) {
  py::class_<ula::UnifiedBufferConfig>(m, "UnifiedBufferConfig", R"doc(
One arena for every block kind of a hybrid model (include/ula/unified_buffer.h). kinds: list of
(name, block_bytes, 'low'|'high'); low-end kinds (states, window rings) grow up from 0,
high-end kinds (KV pages) grow down from the top.)doc")
      .def(py::init([](std::uint64_t capacity_bytes, const std::vector<std::tuple<std::string, std::uint64_t, std::string>>& kinds,
                       std::uint64_t alignment, std::uint8_t padding_kind, std::uint32_t padding_blocks,
                       const std::string& compaction) {
             ula::UnifiedBufferConfig c;
             c.capacity_bytes = capacity_bytes;
             c.alignment = alignment;
             for (const auto& [name, bytes, end] : kinds) c.kinds.push_back({name, bytes, ParseEnd(end)});
             c.padding_kind = ula::BlockKind(padding_kind);
             c.padding_blocks = padding_blocks;
             if (compaction != "lazy" && compaction != "eager") {
               Throw(ula::ErrorCode::kInvalidArgument, "compaction must be 'lazy' or 'eager'");
             }
             c.compaction = compaction == "lazy" ? ula::CompactionMode::kLazy : ula::CompactionMode::kEager;
             return c;
           }),
           py::arg("capacity_bytes"), py::arg("kinds"), py::arg("alignment") = 64, py::arg("padding_kind") = 0,
           py::arg("padding_blocks") = 0, py::arg("compaction") = "lazy")
      .def_readonly("capacity_bytes", &ula::UnifiedBufferConfig::capacity_bytes)
      .def("validate", [](const ula::UnifiedBufferConfig& c) { Unwrap(c.Validate()); });

  py::class_<ula::AllocatorStats>(m, "AllocatorStats")
      .def_readonly("capacity_bytes", &ula::AllocatorStats::capacity_bytes)
      .def_readonly("reserved_bytes", &ula::AllocatorStats::reserved_bytes)
      .def_readonly("live_bytes", &ula::AllocatorStats::live_bytes)
      .def_readonly("hole_bytes", &ula::AllocatorStats::hole_bytes)
      .def_readonly("middle_bytes", &ula::AllocatorStats::middle_bytes)
      .def_readonly("live_blocks_per_kind", &ula::AllocatorStats::live_blocks_per_kind)
      .def_readonly("bytes_moved", &ula::AllocatorStats::bytes_moved)
      .def_readonly("bytes_freed", &ula::AllocatorStats::bytes_freed)
      .def_readonly("blocks_moved", &ula::AllocatorStats::blocks_moved);

  py::class_<ula::UnifiedBuffer, std::shared_ptr<ula::UnifiedBuffer>>(m, "UnifiedBuffer", R"doc(
Virtual block ids (uint32) over one arena; compaction never moves a pinned block.)doc")
      .def(py::init(&NewBuffer), py::arg("config"))
      .def(
          "allocate",
          [](ula::UnifiedBuffer& b, const std::vector<std::uint32_t>& demand) {
            auto d = ToDemand(b, demand);
            std::vector<ula::BlockId> ids;
            {
              py::gil_scoped_release nogil;  // may compact (moves bytes)
              ids = Unwrap(b.AllocateDemand(d));
            }
            return ToNumpy<std::uint32_t>(std::move(ids));
          },
          py::arg("demand"),
          "demand[k] blocks of kind k, all or nothing -> virtual ids (uint32), grouped by kind. "
          "ResourceExhaustedError when they do not fit.")
      .def(
          "can_allocate", [](ula::UnifiedBuffer& b, const std::vector<std::uint32_t>& d) { return b.CanAllocate(ToDemand(b, d)); },
          py::arg("demand"))
      .def("free", [](ula::UnifiedBuffer& b, std::uint32_t id) { Unwrap(b.Free(ula::BlockId(id))); }, py::arg("id"))
      .def("pin", [](ula::UnifiedBuffer& b, std::uint32_t id) { Unwrap(b.Pin(ula::BlockId(id))); }, py::arg("id"))
      .def("unpin", [](ula::UnifiedBuffer& b, std::uint32_t id) { Unwrap(b.Unpin(ula::BlockId(id))); }, py::arg("id"))
      .def("kind_of", [](ula::UnifiedBuffer& b, std::uint32_t id) { return Unwrap(b.KindOf(ula::BlockId(id))).value(); },
           py::arg("id"))
      .def("offset", [](ula::UnifiedBuffer& b, std::uint32_t id) { return Unwrap(b.Offset(ula::BlockId(id))); },
           py::arg("id"))
      .def(
          "translate",
          [](ula::UnifiedBuffer& b, const py::array& ids, const py::array& offsets) {
            auto in = AsIds<ula::BlockId>(View<const std::uint32_t>(ids, "ids", 1));
            auto out = ViewOut<std::uint64_t>(offsets, "offsets", 1);
            py::gil_scoped_release nogil;
            Unwrap(b.Translate(in, out));
          },
          py::arg("ids"), py::arg("offsets"),
          "offsets[i] = byte offset of ids[i] (uint32 -> uint64, caller's array); all or nothing.")
      .def(
          "compact",
          [](ula::UnifiedBuffer& b) {
            py::gil_scoped_release nogil;
            return b.Compact();
          },
          "Compacts both ends now; returns bytes moved.")
      .def("stats", &ula::UnifiedBuffer::Stats)
      .def_property_readonly("padding_offset", &ula::UnifiedBuffer::padding_offset)
      .def("check_invariants", [](ula::UnifiedBuffer& b) { Unwrap(b.CheckInvariants()); });

  py::class_<ula::PrefixCacheConfig>(m, "PrefixCacheConfig", R"doc(
Radix prefix cache config (include/ula/prefix_cache.h). window_kind -1: no window kind;
state_kind -1: no recurrent kind (window pages only: matches end at any node boundary).
window_recency "cushion" (SGLang's window LRU) or "path". sliding_window W > 0 keeps the window layers' KV as window pages, W counting the token itself
(SGLang's sliding_window_size W - 1); 0 keeps it as a ring in each checkpoint. record_events
queues a CacheEvent for every page and state stored or removed (take_events); event_hash
"sglang" (SGLang's SHA-256 block hash) or "debug" (a 64-bit digest chain). unaligned_tail
"keep" (a finished sequence's partial last page stays cached) or "drop" (SGLang's
cache_finished_req with page_size > 1: only page-aligned KV and checkpoints are kept).)doc")
      .def(py::init([](std::uint32_t page_tokens, std::uint8_t kv_kind, int state_kind, int window_kind,
                       std::uint32_t sliding_window, bool record_events, const std::string& event_hash,
                       const std::string& window_recency, const std::string& unaligned_tail) {
             if (event_hash != "sglang" && event_hash != "debug") {
               throw py::value_error("PrefixCacheConfig: event_hash must be 'sglang' or 'debug'");
             }
             if (window_recency != "cushion" && window_recency != "path") {
               throw py::value_error("PrefixCacheConfig: window_recency must be 'cushion' or 'path'");
             }
             if (unaligned_tail != "keep" && unaligned_tail != "drop") {
               throw py::value_error("PrefixCacheConfig: unaligned_tail must be 'keep' or 'drop'");
             }
             ula::PrefixCacheConfig c;
             c.page_tokens = page_tokens;
             c.kv_kind = ula::BlockKind(kv_kind);
             c.state_kind = state_kind < 0 ? ula::BlockKind::Invalid() : ula::BlockKind(static_cast<std::uint8_t>(state_kind));
             c.window_kind = window_kind < 0 ? ula::BlockKind::Invalid() : ula::BlockKind(static_cast<std::uint8_t>(window_kind));
             c.sliding_window = sliding_window;
             c.record_events = record_events;
             c.event_hash = event_hash == "debug" ? ula::EventHash::kDebug : ula::EventHash::kSglang;
             c.window_recency = window_recency == "path" ? ula::WindowRecency::kPath : ula::WindowRecency::kCushion;
             c.unaligned_tail = unaligned_tail == "drop" ? ula::UnalignedTail::kDrop : ula::UnalignedTail::kKeep;
             return c;
           }),
           py::arg("page_tokens") = 16, py::arg("kv_kind") = 1, py::arg("state_kind") = 0, py::arg("window_kind") = -1,
           py::arg("sliding_window") = 0, py::arg("record_events") = false, py::arg("event_hash") = "sglang",
           py::arg("window_recency") = "cushion", py::arg("unaligned_tail") = "keep")
      .def_readonly("page_tokens", &ula::PrefixCacheConfig::page_tokens)
      .def_property_readonly("kv_kind", [](const ula::PrefixCacheConfig& c) { return c.kv_kind.value(); })
      .def_property_readonly("state_kind",
                             [](const ula::PrefixCacheConfig& c) { return c.state_kind.valid() ? int{c.state_kind.value()} : -1; })
      .def_property_readonly("window_kind",
                             [](const ula::PrefixCacheConfig& c) { return c.window_kind.valid() ? int{c.window_kind.value()} : -1; })
      .def_readonly("sliding_window", &ula::PrefixCacheConfig::sliding_window)
      .def_readonly("record_events", &ula::PrefixCacheConfig::record_events)
      .def_property_readonly("event_hash", [](const ula::PrefixCacheConfig& c) {
        return c.event_hash == ula::EventHash::kDebug ? "debug" : "sglang";
      })
      .def_property_readonly("window_recency", [](const ula::PrefixCacheConfig& c) {
        return c.window_recency == ula::WindowRecency::kPath ? "path" : "cushion";
      })
      .def_property_readonly("unaligned_tail", [](const ula::PrefixCacheConfig& c) {
        return c.unaligned_tail == ula::UnalignedTail::kDrop ? "drop" : "keep";
      })
      .def("validate", [](const ula::PrefixCacheConfig& c) { Unwrap(c.Validate()); });

  py::class_<ula::PrefixMatch>(m, "PrefixMatch", R"doc(
A match (include/ula/prefix_cache.h): length (reusable tokens), pages (uint32) covering them,
the checkpoint there, kv_length (tokens whose KV the tree holds), branch (where to save a
checkpoint, 0: none), host_length (the deepest checkpoint counting the host tier's), path (node
ids, for lock/unlock), copy (match_copy_on_write: the request's own copy, the caller's blocks),
window_pages (int64, -1 outside the window or released; empty after release_window).)doc")
      .def_readonly("length", &ula::PrefixMatch::length)
      .def_property_readonly("pages",
                             [](const ula::PrefixMatch& pm) {
                               return ToNumpy<std::uint32_t>(std::vector<ula::BlockId>(pm.pages.begin(), pm.pages.end()));
                             })
      .def_property_readonly("checkpoint_state", [](const ula::PrefixMatch& pm) { return OptionalId(pm.checkpoint.state); })
      .def_property_readonly("checkpoint_window", [](const ula::PrefixMatch& pm) { return OptionalId(pm.checkpoint.window); })
      .def_readonly("kv_length", &ula::PrefixMatch::kv_length)
      .def_readonly("branch", &ula::PrefixMatch::branch)
      .def_readonly("host_length", &ula::PrefixMatch::host_length)
      .def_property_readonly("path", [](const ula::PrefixMatch& pm) { return ToNumpy<std::uint32_t>(std::vector(pm.path)); })
      .def_property_readonly("copy_state", [](const ula::PrefixMatch& pm) { return OptionalId(pm.copy.state); })
      .def_property_readonly("copy_window", [](const ula::PrefixMatch& pm) { return OptionalId(pm.copy.window); })
      .def_property_readonly("window_pages", [](const ula::PrefixMatch& pm) {
        std::vector<std::int64_t> w;
        for (ula::BlockId b : pm.window_pages) w.push_back(b.valid() ? std::int64_t{b.value()} : -1);
        return ToNumpy<std::int64_t>(std::move(w));
      });

  py::class_<ula::EvictionStats>(m, "EvictionStats", "What one make_room or evict freed (include/ula/prefix_cache.h).")
      .def_readonly("nodes", &ula::EvictionStats::nodes)
      .def_readonly("pages", &ula::EvictionStats::pages)
      .def_readonly("checkpoints", &ula::EvictionStats::checkpoints)
      .def_readonly("tombstones", &ula::EvictionStats::tombstones)
      .def_readonly("tokens", &ula::EvictionStats::tokens)
      .def_readonly("offloaded", &ula::EvictionStats::offloaded)
      .def_readonly("window_pages", &ula::EvictionStats::window_pages)
      .def_readonly("offloaded_pages", &ula::EvictionStats::offloaded_pages);

  py::class_<ula::CacheEvent>(m, "CacheEvent", R"doc(
A block entering or leaving the tree (include/ula/prefix_events.h): type, block (None on the
host medium), position, medium ("GPU" or "CPU"); for pages and window pages what KV-aware
routers read (SGLang's BlockStored / BlockRemoved): hash (SGLang's signed 64-bit block hash by
default), parent_hash (stored pages: the previous page's, None for the first page) and tokens
(stored pages: uint32); group, spec_kind, spec_window (the kinds cache's events: vLLM's
group_idx, kv_cache_spec_kind and sliding window; group -1: none). stored / kv / window / state
classify the type.)doc")
      .def_property_readonly("type", [](const ula::CacheEvent& e) { return EventTypeName(e.type); })
      .def_property_readonly("block", [](const ula::CacheEvent& e) { return OptionalId(e.block); })
      .def_readonly("position", &ula::CacheEvent::position)
      .def_readonly("hash", &ula::CacheEvent::hash)
      .def_property_readonly("parent_hash",
                             [](const ula::CacheEvent& e) { return e.parent_hash ? py::object(py::int_(*e.parent_hash)) : py::none(); })
      .def_property_readonly("tokens", [](const ula::CacheEvent& e) { return ToNumpy<std::uint32_t>(std::vector(e.tokens)); })
      .def_property_readonly("medium", [](const ula::CacheEvent& e) { return ula::EventMediumName(e.medium); })
      .def_readonly("group", &ula::CacheEvent::group)
      .def_readonly("spec_kind", &ula::CacheEvent::spec_kind)
      .def_readonly("spec_window", &ula::CacheEvent::spec_window)
      .def_property_readonly("stored", &ula::CacheEvent::stored)
      .def_property_readonly("kv", &ula::CacheEvent::kv)
      .def_property_readonly("window", &ula::CacheEvent::window)
      .def_property_readonly("state", &ula::CacheEvent::state);

  py::class_<ula::KvEventPublisherConfig>(m, "KvEventPublisherConfig", R"doc(
The KV event publisher's config (include/ula/kv_event_publisher.h): endpoint (bound; port "*"
takes a free one), topic (the first frame), block_size (the cache's page_tokens),
sliding_window (the cache's, for window pages' group spec), data_parallel_rank (None: left
out of each KVEventBatch), send_high_water_mark (ZeroMQ's ZMQ_SNDHWM).)doc")
      .def(py::init([](const std::string& endpoint, const std::string& topic, std::uint32_t block_size,
                       std::uint32_t sliding_window, std::optional<std::int32_t> data_parallel_rank, int hwm) {
             return ula::KvEventPublisherConfig{endpoint, topic, block_size, sliding_window, data_parallel_rank, hwm};
           }),
           py::arg("endpoint") = "tcp://127.0.0.1:5557", py::arg("topic") = "", py::arg("block_size") = 16,
           py::arg("sliding_window") = 0, py::arg("data_parallel_rank") = py::none(),
           py::arg("send_high_water_mark") = 100000)
      .def_readonly("endpoint", &ula::KvEventPublisherConfig::endpoint)
      .def_readonly("topic", &ula::KvEventPublisherConfig::topic)
      .def_readonly("block_size", &ula::KvEventPublisherConfig::block_size)
      .def_readonly("sliding_window", &ula::KvEventPublisherConfig::sliding_window)
      .def_readonly("data_parallel_rank", &ula::KvEventPublisherConfig::data_parallel_rank)
      .def_readonly("send_high_water_mark", &ula::KvEventPublisherConfig::send_high_water_mark)
      .def("validate", [](const ula::KvEventPublisherConfig& c) { Unwrap(c.Validate()); });

  py::class_<ula::KvEventPublisher>(m, "KvEventPublisher", R"doc(
Sends a prefix cache's events (PrefixCache.take_events) to KV-aware routers as SGLang's and
vLLM's KVEventBatch: msgpack over a bound ZeroMQ PUB socket, three frames per message [topic,
sequence number (8 bytes big-endian), payload] (include/ula/kv_event_publisher.h).
publish(events, ts) sends one batch and returns its sequence number; encode gives the payload.
InvalidArgumentError for a bad config, IoError when the socket cannot be bound.)doc")
      .def(py::init([](const ula::KvEventPublisherConfig& c) { return Unwrap(ula::KvEventPublisher::Create(c)); }),
           py::arg("config"))
      .def_property_readonly("endpoint", &ula::KvEventPublisher::endpoint)
      .def(
          "publish",
          [](ula::KvEventPublisher& p, const std::vector<ula::CacheEvent>& events, double ts) {
            return Unwrap(p.Publish(events, ts));
          },
          py::arg("events"), py::arg("ts"))
      .def(
          "encode",
          [](const ula::KvEventPublisher& p, const std::vector<ula::CacheEvent>& events, double ts) {
            return py::bytes(p.Encode(events, ts));
          },
          py::arg("events"), py::arg("ts"));

  py::class_<ula::KindBytes>(m, "KindBytes", "Bytes of one kind the tree holds: evictable now, or protected (locked).")
      .def_readonly("evictable", &ula::KindBytes::evictable)
      .def_readonly("protected_bytes", &ula::KindBytes::protected_bytes);

  py::class_<ula::PrefixCacheMetrics>(m, "PrefixCacheMetrics", "PrefixCache.metrics(): bytes per kind and counts.")
      .def_readonly("kv", &ula::PrefixCacheMetrics::kv)
      .def_readonly("state", &ula::PrefixCacheMetrics::state)
      .def_readonly("window", &ula::PrefixCacheMetrics::window)
      .def_readonly("nodes", &ula::PrefixCacheMetrics::nodes)
      .def_readonly("checkpoints", &ula::PrefixCacheMetrics::checkpoints)
      .def_readonly("tombstones", &ula::PrefixCacheMetrics::tombstones)
      .def_readonly("host_checkpoints", &ula::PrefixCacheMetrics::host_checkpoints)
      .def_readonly("host_hits", &ula::PrefixCacheMetrics::host_hits)
      .def_readonly("host_pages", &ula::PrefixCacheMetrics::host_pages)
      .def_readonly("host_page_hits", &ula::PrefixCacheMetrics::host_page_hits);

  py::class_<ula::PrefixCache>(m, "PrefixCache", R"doc(
Radix prefix cache over a UnifiedBuffer (kept alive by the cache): match, lock, insert and
evict on uint32 token arrays; eviction stops as soon as the pending demand fits. Checkpoints
are (position, state block, window ring block or -1); window_pages (sliding_window > 0) one
per page, -1 where the request released it.)doc")
      .def(py::init([](const ula::PrefixCacheConfig& c, ula::UnifiedBuffer& b) {
             return Unwrap(ula::PrefixCache::Create(c, &b));
           }),
           py::arg("config"), py::arg("buffer"), py::keep_alive<1, 3>())
      .def(
          "match",
          [](ula::PrefixCache& pc, const py::array& tokens, std::uint32_t max_length) {
            return pc.Match(View<const std::uint32_t>(tokens, "tokens", 1), max_length);
          },
          py::arg("tokens"), py::arg("max_length"))
      .def(
          "match_copy_on_write",
          [](ula::PrefixCache& pc, const py::array& tokens, std::uint32_t max_length, const std::string& rule) {
            auto t = View<const std::uint32_t>(tokens, "tokens", 1);
            const ula::EvictionRule r = ParseRule(rule);
            py::gil_scoped_release nogil;  // may evict, compact and copy
            return Unwrap(pc.MatchCopyOnWrite(t, max_length, r));
          },
          py::arg("tokens"), py::arg("max_length"), py::arg("rule") = "allocation_aware",
          "match + lock + the request's own copy of the checkpoint (match.copy_state / copy_window, "
          "the caller's blocks), evicting by `rule` if it must; a deeper host checkpoint is brought back first.")
      .def("lock", [](ula::PrefixCache& pc, const ula::PrefixMatch& pm) { Unwrap(pc.Lock(pm)); }, py::arg("match"))
      .def("unlock", [](ula::PrefixCache& pc, const ula::PrefixMatch& pm) { Unwrap(pc.Unlock(pm)); }, py::arg("match"))
      .def(
          "release_window", [](ula::PrefixCache& pc, ula::PrefixMatch& pm) { Unwrap(pc.ReleaseWindow(pm)); },
          py::arg("match"),
          "Gives the window lock of a locked match back early (its window_pages become evictable; "
          "KV and state stay locked) and clears match.window_pages.")
      .def(
          "insert",
          [](ula::PrefixCache& pc, const py::array& tokens, const py::array& pages, const std::vector<PyCheckpoint>& checkpoints,
             const std::optional<py::array>& window_pages) {
            auto t = View<const std::uint32_t>(tokens, "tokens", 1);
            auto p = AsIds<ula::BlockId>(View<const std::uint32_t>(pages, "pages", 1));
            const auto cps = ToCheckpoints(checkpoints);
            const auto w = ToWindowPages(window_pages);
            return Unwrap(pc.Insert(t, p, cps, w));
          },
          py::arg("tokens"), py::arg("pages"), py::arg("checkpoints") = std::vector<PyCheckpoint>{},
          py::arg("window_pages") = py::none(),
          "Hands a finished sequence's pages (and checkpoints, and window pages) to the cache; returns "
          "the prefix length the tree held already (the caller's duplicates there were freed).")
      .def(
          "insert_chunk",
          [](ula::PrefixCache& pc, const py::array& tokens, const py::array& pages, const std::vector<PyCheckpoint>& checkpoints,
             const ula::PrefixMatch& held, const std::optional<py::array>& window_pages) {
            auto t = View<const std::uint32_t>(tokens, "tokens", 1);
            auto p = AsIds<ula::BlockId>(View<const std::uint32_t>(pages, "pages", 1));
            const auto cps = ToCheckpoints(checkpoints);
            const auto w = ToWindowPages(window_pages);
            return Unwrap(pc.InsertChunk(t, p, cps, held, w));
          },
          py::arg("tokens"), py::arg("pages"), py::arg("checkpoints"), py::arg("held"), py::arg("window_pages") = py::none(),
          "Chunked prefill: inserts the chunks so far (a checkpoint at the chunk's end), releases `held` "
          "(the previous lock, or an unlocked empty match) and returns the new match, locked.")
      .def(
          "make_room",
          [](ula::PrefixCache& pc, ula::UnifiedBuffer& b, const std::vector<std::uint32_t>& demand,
             const std::string& rule) {
            auto d = ToDemand(b, demand);
            const ula::EvictionRule r = ParseRule(rule);
            py::gil_scoped_release nogil;
            return Unwrap(pc.MakeRoom(d, r));
          },
          py::arg("buffer"), py::arg("demand"), py::arg("rule") = "allocation_aware",
          "Evicts LRU unlocked leaves and checkpoints until demand fits in buffer; EvictionStats.")
      .def(
          "evict",
          [](ula::PrefixCache& pc, std::uint64_t kv_tokens, std::uint32_t states, std::uint64_t window_tokens) {
            py::gil_scoped_release nogil;
            return pc.Evict(kv_tokens, states, window_tokens);
          },
          py::arg("kv_tokens"), py::arg("states") = 0, py::arg("window_tokens") = 0,
          "Evicts by count: LRU leaves until kv_tokens tokens are freed, then LRU checkpoints until "
          "`states` more are freed, then window pages until window_tokens tokens of them are freed in all.")
      .def(
          "holds", [](ula::PrefixCache& pc, const py::array& t) { return pc.Holds(View<const std::uint32_t>(t, "tokens", 1)); },
          py::arg("tokens"))
      .def(
          "holds_on_host",
          [](ula::PrefixCache& pc, const py::array& t) { return pc.HoldsOnHost(View<const std::uint32_t>(t, "tokens", 1)); },
          py::arg("tokens"), "Whether the checkpoint at exactly these tokens is on the host tier.")
      .def(
          "kv_on_host",
          [](ula::PrefixCache& pc, const py::array& t) { return pc.KvOnHost(View<const std::uint32_t>(t, "tokens", 1)); },
          py::arg("tokens"), "Whether the node ending at exactly these tokens has its KV on the host tier.")
      .def(
          "attach_host_tier",
          [](ula::PrefixCache& pc, ula::UnifiedBuffer& b, std::uint32_t slots, std::uint32_t page_slots) {
            BufferOwner& owner = OwnerOf(b);
            const ula::PrefixCacheConfig& c = pc.config();
            const std::uint64_t state = c.state_kind.valid() ? b.kind_config(c.state_kind).block_bytes : 0;  // none: refused below
            const std::uint64_t window = c.window_kind.valid() ? b.kind_config(c.window_kind).block_bytes : 0;
            const std::uint64_t page = b.kind_config(c.kv_kind).block_bytes;
            const std::uint64_t bytes = std::max<std::uint64_t>(1, slots * (state + window) + std::uint64_t{page_slots} * page);
            const ula::Arena host = Unwrap(owner.backend->CreateArena(ula::Tier::kHost, ula::Rank(0), bytes));
            Unwrap(pc.AttachHostTier({owner.backend.get(), b.arena().id, host, slots, page_slots}));
          },
          py::arg("buffer"), py::arg("slots"), py::arg("page_slots") = 0,
          "A host tier on the buffer's backend (buffer: the cache's own): `slots` checkpoints and "
          "`page_slots` KV pages; evicted checkpoints (and, under allocation_aware, leaves' KV) go there.")
      .def(
          "attach_copy_backend",
          [](ula::PrefixCache& pc, ula::UnifiedBuffer& b) {
            BufferOwner& owner = OwnerOf(b);
            Unwrap(pc.AttachCopyBackend(owner.backend.get(), b.arena().id));
          },
          py::arg("buffer"), "Checkpoint copies as copy batches of the buffer's backend (else memcpy).")
      .def("metrics", &ula::PrefixCache::Metrics)
      .def("take_events", &ula::PrefixCache::TakeEvents, "The queued CacheEvents (record_events), drained.")
      .def("stored_blocks", &ula::PrefixCache::StoredBlocks,
           "The store events that rebuild the blocks the tree holds now (record_events), root side first.")
      .def("reset", [](ula::PrefixCache& pc) { Unwrap(pc.Reset()); },
           "Frees every block and empties the tree (one all_cleared event); refused while a match is locked.")
      .def_property_readonly("num_nodes", &ula::PrefixCache::num_nodes)
      .def_property_readonly("num_checkpoints", &ula::PrefixCache::num_checkpoints)
      .def("debug_digest", &ula::PrefixCache::DebugDigest, "A hash of the whole state: equal before and after a refused call.")
      .def("check_invariants", [](ula::PrefixCache& pc) { Unwrap(pc.CheckInvariants()); });
}

}  // namespace ulapy

// Hybrid models: the unified buffer (virtual block ids over one arena) and the radix prefix
// cache over it.
#include <pybind11/stl.h>

#include "bind_common.h"
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
      .def_readonly("blocks_moved", &ula::AllocatorStats::blocks_moved);

  py::class_<ula::UnifiedBuffer>(m, "UnifiedBuffer", R"doc(
Virtual block ids (uint32) over one arena; compaction never moves a pinned block.)doc")
      .def(py::init([](const ula::UnifiedBufferConfig& c) { return Unwrap(ula::UnifiedBuffer::Create(c)); }),
           py::arg("config"))
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

  py::class_<ula::PrefixCacheConfig>(m, "PrefixCacheConfig", "Radix prefix cache config (include/ula/prefix_cache.h).")
      .def(py::init([](std::uint32_t page_tokens, std::uint8_t kv_kind, std::uint8_t state_kind, int window_kind) {
             ula::PrefixCacheConfig c;
             c.page_tokens = page_tokens;
             c.kv_kind = ula::BlockKind(kv_kind);
             c.state_kind = ula::BlockKind(state_kind);
             c.window_kind = window_kind < 0 ? ula::BlockKind::Invalid() : ula::BlockKind(static_cast<std::uint8_t>(window_kind));
             return c;
           }),
           py::arg("page_tokens") = 16, py::arg("kv_kind") = 1, py::arg("state_kind") = 0, py::arg("window_kind") = -1)
      .def_readonly("page_tokens", &ula::PrefixCacheConfig::page_tokens);

  py::class_<ula::PrefixMatch>(m, "PrefixMatch", "The longest reusable prefix: length, pages (uint32), checkpoint.")
      .def_readonly("length", &ula::PrefixMatch::length)
      .def_property_readonly("pages",
                             [](const ula::PrefixMatch& pm) {
                               return ToNumpy<std::uint32_t>(std::vector<ula::BlockId>(pm.pages.begin(), pm.pages.end()));
                             })
      .def_property_readonly("checkpoint_state",
                             [](const ula::PrefixMatch& pm) -> py::object {
                               if (!pm.checkpoint.state.valid()) return py::none();
                               return py::int_(pm.checkpoint.state.value());
                             })
      .def_property_readonly("checkpoint_window", [](const ula::PrefixMatch& pm) -> py::object {
        if (!pm.checkpoint.window.valid()) return py::none();
        return py::int_(pm.checkpoint.window.value());
      });

  py::class_<ula::EvictionStats>(m, "EvictionStats")
      .def_readonly("nodes", &ula::EvictionStats::nodes)
      .def_readonly("pages", &ula::EvictionStats::pages)
      .def_readonly("checkpoints", &ula::EvictionStats::checkpoints);

  py::class_<ula::PrefixCache>(m, "PrefixCache", R"doc(
Radix prefix cache over a UnifiedBuffer (kept alive by the cache): match, lock, insert and
evict on uint32 token arrays; eviction stops as soon as the pending demand fits.)doc")
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
      .def("lock", [](ula::PrefixCache& pc, const ula::PrefixMatch& pm) { Unwrap(pc.Lock(pm)); }, py::arg("match"))
      .def("unlock", [](ula::PrefixCache& pc, const ula::PrefixMatch& pm) { Unwrap(pc.Unlock(pm)); }, py::arg("match"))
      .def(
          "insert",
          [](ula::PrefixCache& pc, const py::array& tokens, const py::array& pages,
             const std::vector<std::tuple<std::uint32_t, std::uint32_t, std::int64_t>>& checkpoints) {
            auto t = View<const std::uint32_t>(tokens, "tokens", 1);
            auto p = AsIds<ula::BlockId>(View<const std::uint32_t>(pages, "pages", 1));
            std::vector<ula::PositionedCheckpoint> cps;
            for (const auto& [pos, state, window] : checkpoints) {
              cps.push_back({pos, {ula::BlockId(state), window < 0 ? ula::BlockId::Invalid()
                                                                   : ula::BlockId(static_cast<std::uint32_t>(window))}});
            }
            Unwrap(pc.Insert(t, p, cps));
          },
          py::arg("tokens"), py::arg("pages"), py::arg("checkpoints") = std::vector<std::tuple<std::uint32_t, std::uint32_t, std::int64_t>>{},
          "Hands a finished sequence's pages (and (position, state, window or -1) checkpoints) to the cache.")
      .def(
          "make_room",
          [](ula::PrefixCache& pc, ula::UnifiedBuffer& b, const std::vector<std::uint32_t>& demand,
             const std::string& rule) {
            if (rule != "allocation_aware" && rule != "naive") {
              Throw(ula::ErrorCode::kInvalidArgument, "rule must be 'allocation_aware' or 'naive'");
            }
            auto d = ToDemand(b, demand);
            py::gil_scoped_release nogil;
            return Unwrap(pc.MakeRoom(d, rule == "naive" ? ula::EvictionRule::kNaive : ula::EvictionRule::kAllocationAware));
          },
          py::arg("buffer"), py::arg("demand"), py::arg("rule") = "allocation_aware",
          "Evicts LRU unlocked leaves until demand fits in buffer; EvictionStats.")
      .def(
          "holds", [](ula::PrefixCache& pc, const py::array& t) { return pc.Holds(View<const std::uint32_t>(t, "tokens", 1)); },
          py::arg("tokens"))
      .def_property_readonly("num_nodes", &ula::PrefixCache::num_nodes)
      .def_property_readonly("num_checkpoints", &ula::PrefixCache::num_checkpoints)
      .def("check_invariants", [](ula::PrefixCache& pc) { Unwrap(pc.CheckInvariants()); });
}

}  // namespace ulapy

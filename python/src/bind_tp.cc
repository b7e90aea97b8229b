// TP address space (one space striped over the ranks) and its step planner.
#include <pybind11/stl.h>

#include <cstring>
#include <optional>

#include "bind_common.h"
#include "ula/tp_address_space.h"
#include "ula/tp_step_planner.h"

namespace ulapy {

ula::PolicyKind ParsePolicy(const std::string& name);
ula::Tier ParseTier(const std::string& t);

namespace {
struct TpSpace {
  OwnedBackend backend;
  std::unique_ptr<ula::TpAddressSpace> space;
};
}  // namespace

namespace {
// indices of a TP engine step: [ranks, *selections.shape].
void CheckRankIndices(const ula::TpStepPlanner& p, const py::array& sel_a, const py::array& idx_a) {
  bool same = idx_a.ndim() == sel_a.ndim() + 1 && idx_a.ndim() >= 1 &&
              idx_a.shape(0) == static_cast<py::ssize_t>(p.ranks().size());
  for (py::ssize_t d = 0; same && d < sel_a.ndim(); ++d) same = idx_a.shape(d + 1) == sel_a.shape(d);
  if (!same) Throw(ula::ErrorCode::kInvalidArgument, "indices: must be [ranks, *selections.shape]");
}
}  // namespace

namespace {
// A view of one hosted rank's shard pool (no copy; keeps the space alive).
py::array_t<std::uint8_t> ShardPoolView(py::object self, std::uint16_t rank, std::uint16_t group, ula::Tier tier,
                                        bool writable) {
  TpSpace& s = self.cast<TpSpace&>();
  const auto& c = s.space->config();
  if (rank >= c.num_ranks || group >= c.num_groups) Throw(ula::ErrorCode::kOutOfRange, "rank or group out of range");
  if (!s.space->Hosts(ula::Rank(rank))) Throw(ula::ErrorCode::kUnsupported, "the rank is not hosted here");
  const ula::TpShardMemory mem = s.space->ShardMemory(ula::Rank(rank), ula::GroupId(group));
  const bool device = tier == ula::Tier::kDevice;
  std::byte* data = device ? mem.device.data : mem.host.data;
  if (data == nullptr) Throw(ula::ErrorCode::kUnsupported, "the counting backend holds no bytes");
  const std::uint32_t slots = device ? c.device_slots_per_group() : c.host_slots_per_group();
  py::array_t<std::uint8_t> view({static_cast<py::ssize_t>(slots), static_cast<py::ssize_t>(c.entry_bytes)},
                                 reinterpret_cast<const std::uint8_t*>(data), self);
  if (!writable) py::detail::array_proxy(view.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return view;
}
}  // namespace

void BindTp(py::module_& m) {
  py::class_<ula::TpConfig>(m, "TpConfig", "TP address space config (include/ula/tp_address_space.h).")
      .def(py::init([](std::uint32_t num_ranks, std::uint32_t num_groups, std::uint32_t entry_bytes,
                       const std::string& attention, std::uint64_t device_bytes_per_rank,
                       std::uint64_t host_bytes_per_rank, std::uint64_t buffer_bytes_per_rank, const std::string& policy,
                       std::uint32_t page_tokens, bool stable_new_entries, bool host_shadows) {
             ula::TpConfig c;
             c.stable_new_entries = stable_new_entries;
             c.host_shadows = host_shadows;
             c.num_ranks = num_ranks;
             c.num_groups = num_groups;
             c.entry_bytes = entry_bytes;
             c.attention = Unwrap(ula::ParseTpAttention(attention));
             c.device_bytes_per_rank = device_bytes_per_rank;
             c.host_bytes_per_rank = host_bytes_per_rank;
             c.buffer_bytes_per_rank = buffer_bytes_per_rank;
             c.policy = c.buffer_policy = ParsePolicy(policy);
             c.page_tokens = page_tokens;
             return c;
           }),
           py::arg("num_ranks") = 2, py::arg("num_groups") = 1, py::arg("entry_bytes") = 656,
           py::arg("attention") = "local_buffer", py::arg("device_bytes_per_rank") = 0,
           py::arg("host_bytes_per_rank") = 0, py::arg("buffer_bytes_per_rank") = 0, py::arg("policy") = "pb_lru",
           py::arg("page_tokens") = ula::TpConfig{}.page_tokens, py::arg("stable_new_entries") = false,
           py::arg("host_shadows") = false)
      .def_readwrite("num_ranks", &ula::TpConfig::num_ranks)
      .def_readwrite("num_groups", &ula::TpConfig::num_groups)
      .def_readwrite("entry_bytes", &ula::TpConfig::entry_bytes)
      .def_readwrite("device_bytes_per_rank", &ula::TpConfig::device_bytes_per_rank)
      .def_readwrite("host_bytes_per_rank", &ula::TpConfig::host_bytes_per_rank)
      .def_readwrite("buffer_bytes_per_rank", &ula::TpConfig::buffer_bytes_per_rank)
      .def_readwrite("page_tokens", &ula::TpConfig::page_tokens)
      .def_readwrite("stable_new_entries", &ula::TpConfig::stable_new_entries,
                     "New entries are placed on device and keep their slot for their round (TpStepPlanner::Create "
                     "requires it: the engine writes KV where it looked it up).")
      .def_readwrite("host_shadows", &ula::TpConfig::host_shadows,
                     "Each shard's fetched entries keep their host slot as a clean copy, counted free, so that their "
                     "later eviction moves no bytes (src/space/host_shadows.h). Off by default; TpStepPlanner keeps them in "
                     "both paths, DeviceStep refuses a space with it on.")
      .def_readwrite("kinds", &ula::TpConfig::kinds,
                     "The kinds of KV the space holds (a list of KvKind, as AddressSpaceConfig.kinds; empty: one "
                     "kind). With kinds, attention must be 'at_home'. Assign a whole list: the getter returns a copy.")
      .def_property(
          "policy", [](const ula::TpConfig& c) { return std::string(ula::PolicyKindName(c.policy)); },
          [](ula::TpConfig& c, const std::string& name) { c.policy = ParsePolicy(name); },
          "The shard device pools' residency policy by name.")
      .def_property(
          "buffer_policy", [](const ula::TpConfig& c) { return std::string(ula::PolicyKindName(c.buffer_policy)); },
          [](ula::TpConfig& c, const std::string& name) { c.buffer_policy = ParsePolicy(name); },
          "The local buffers' residency policy by name.")
      .def_property_readonly("device_slots_per_group", &ula::TpConfig::device_slots_per_group)
      .def_property_readonly("host_slots_per_group", &ula::TpConfig::host_slots_per_group)
      .def_property_readonly("buffer_slots_per_group", &ula::TpConfig::buffer_slots_per_group)
      .def_property_readonly("shard_slots_per_group", &ula::TpConfig::shard_slots_per_group,
                             "Entries one rank's shard holds per group (device + host).")
      .def_property_readonly("attention", [](const ula::TpConfig& c) { return std::string(ula::TpAttentionName(c.attention)); })
      .def("validate", [](const ula::TpConfig& c) { Unwrap(c.Validate()); });

  // StepStats (one rank's share of a TP step) is bound once, in bind_sparse.cc.

  py::class_<TpSpace>(m, "TpAddressSpace", R"doc(
TP mode: one address space striped over the ranks (address a lives on rank a mod P), every
rank hosted in this process. Owns its backend ('cpu' or 'counting').)doc")
      .def(py::init([](const ula::TpConfig& c, const std::string& backend, py::object faults) {
             TpSpace s{MakeBackend(backend, faults), nullptr};
             s.space = Unwrap(ula::TpAddressSpace::Create(c, s.backend.get()));
             return s;
           }),
           py::arg("config"), py::arg("backend") = "cpu", py::arg("faults") = py::none())
      .def("add_request", [](TpSpace& s, std::uint64_t r) { Unwrap(s.space->AddRequest(ula::RequestId(r))); },
           py::arg("request"))
      .def(
          "allocate",
          [](TpSpace& s, std::uint64_t r, std::uint32_t n) {
            return ToNumpy<std::uint32_t>(Unwrap(s.space->Allocate(ula::RequestId(r), n)));
          },
          py::arg("request"), py::arg("n_tokens"), "n_tokens new addresses striped over the ranks (uint32).")
      .def("free", [](TpSpace& s, std::uint64_t r) { Unwrap(s.space->Free(ula::RequestId(r))); }, py::arg("request"))
      .def("truncate", [](TpSpace& s, std::uint64_t r, std::uint32_t length) {
            Unwrap(s.space->Truncate(ula::RequestId(r), length));
          }, py::arg("request"), py::arg("length"), "Frees the request's tokens past `length` (rejected drafts).")
      .def(
          "write",
          [](TpSpace& s, std::uint32_t addr, std::uint16_t group, py::object data) {
            auto bytes = View<const std::uint8_t>(ToArray(data, "data"), "data");
            py::gil_scoped_release nogil;
            Unwrap(s.space->Write(ula::LogicalAddr(addr), ula::GroupId(group), std::as_bytes(bytes)));
          },
          py::arg("addr"), py::arg("group"), py::arg("data"))
      .def(
          "read",
          [](TpSpace& s, std::uint32_t addr, std::uint16_t group, py::object out) {
            auto bytes = ViewOut<std::uint8_t>(ToArray(out, "out"), "out");
            py::gil_scoped_release nogil;
            Unwrap(s.space->Read(ula::LogicalAddr(addr), ula::GroupId(group), std::as_writable_bytes(bytes)));
          },
          py::arg("addr"), py::arg("group"), py::arg("out"))
      .def("home_of", [](TpSpace& s, std::uint32_t a) { return s.space->HomeOf(ula::LogicalAddr(a)).value(); },
           py::arg("addr"))
      .def("is_live", [](TpSpace& s, std::uint32_t a) { return s.space->IsLive(ula::LogicalAddr(a)); }, py::arg("addr"))
      .def("advance_round", [](TpSpace& s) { s.space->AdvanceRound(); })
      .def_property_readonly("num_live_addresses", [](TpSpace& s) { return s.space->num_live_addresses(); })
      .def("check_invariants", [](TpSpace& s) { Unwrap(s.space->CheckInvariants()); })
      .def_property_readonly("config", [](TpSpace& s) { return s.space->config(); }, "A copy of the space's TpConfig.")
      .def_property_readonly("num_requests", [](TpSpace& s) { return s.space->num_requests(); })
      .def_property_readonly("hosted_ranks", [](TpSpace& s) {
             std::vector<std::uint16_t> r;
             for (ula::Rank x : s.space->hosted_ranks()) r.push_back(x.value());
             return r;
           }, "The ranks this object hosts (all of them in-process).")
      .def("hosts", [](TpSpace& s, std::uint16_t r) { return s.space->Hosts(ula::Rank(r)); }, py::arg("rank"))
      .def(
          "addresses_of",
          [](TpSpace& s, std::uint64_t request) {
            auto span = Unwrap(s.space->AddressesOf(ula::RequestId(request)));
            return ToNumpy<std::uint32_t>(std::vector<ula::LogicalAddr>(span.begin(), span.end()));
          },
          py::arg("request"), "A snapshot of the request's addresses (uint32).")
      .def(
          "kind_pages_of",
          [](TpSpace& s, std::uint64_t request, std::uint32_t kind, std::uint16_t rank) {
            return Unwrap(s.space->KindPagesOf(ula::RequestId(request), kind, ula::Rank(rank)));
          },
          py::arg("request"), py::arg("kind"), py::arg("rank"),
          "A space with kinds: rank `rank`'s page table of the request's entries of kind `kind` (KindPages; the "
          "window and compressor states on the request's window home only, C128 striped j mod P, C4 and index keys "
          "by address). FailedPreconditionError (no kinds), NotFoundError, OutOfRangeError (kind, rank).")
      .def(
          "window_home_of",
          [](TpSpace& s, std::uint64_t request) { return Unwrap(s.space->WindowHomeOf(ula::RequestId(request))).value(); },
          py::arg("request"),
          "A space with kinds: the rank holding the request's window and compressor states. "
          "FailedPreconditionError (no kinds), NotFoundError.")
      .def(
          "lookup",
          [](TpSpace& s, std::uint32_t addr, std::uint16_t group) {
            const ula::Location loc = Unwrap(s.space->Lookup(ula::LogicalAddr(addr), ula::GroupId(group)));
            return py::make_tuple(std::string(ula::TierName(loc.tier())), loc.rank().value(), loc.slot().value());
          },
          py::arg("addr"), py::arg("group"), "(tier, rank, slot) of a live address's home.")
      .def(
          "buffer_slot",
          [](TpSpace& s, std::uint16_t rank, std::uint32_t addr, std::uint16_t group) -> py::object {
            auto slot = Unwrap(s.space->BufferSlot(ula::Rank(rank), ula::LogicalAddr(addr), ula::GroupId(group)));
            return slot ? py::cast(slot->value()) : py::none();
          },
          py::arg("rank"), py::arg("addr"), py::arg("group"), "The buffer slot of rank's copy of addr, or None.")
      .def(
          "num_used",
          [](TpSpace& s, std::uint16_t rank, std::uint16_t group, const std::string& tier) {
            return s.space->NumUsed(ula::Rank(rank), ula::GroupId(group), ParseTier(tier));
          },
          py::arg("rank"), py::arg("group"), py::arg("tier"), "Occupied slots of a hosted rank's shard pool.")
      .def(
          "num_free",
          [](TpSpace& s, std::uint16_t rank, std::uint16_t group, const std::string& tier) {
            return s.space->NumFree(ula::Rank(rank), ula::GroupId(group), ParseTier(tier));
          },
          py::arg("rank"), py::arg("group"), py::arg("tier"), "Free slots of a hosted rank's shard pool.")
      .def("num_new_on_host", [](TpSpace& s, std::uint16_t rank, std::uint16_t group) {
             return s.space->NumNewOnHost(ula::Rank(rank), ula::GroupId(group));
           }, py::arg("rank"), py::arg("group"),
           "New entries of this round pinned on the rank's host pool (stable_new_entries).")
      .def("num_host_shadows", [](TpSpace& s, std::uint16_t rank, std::uint16_t group) {
             return s.space->NumHostShadows(ula::Rank(rank), ula::GroupId(group));
           }, py::arg("rank"), py::arg("group"),
           "Host shadows of the rank's shard (host_shadows; num_free counts them free).")
      .def("num_buffered", [](TpSpace& s, std::uint16_t rank, std::uint16_t group) {
             return s.space->NumBuffered(ula::Rank(rank), ula::GroupId(group));
           }, py::arg("rank"), py::arg("group"), "Entries in a rank's local buffer.")
      .def("num_homed", [](TpSpace& s, std::uint16_t rank) { return s.space->NumHomed(ula::Rank(rank)); },
           py::arg("rank"), "Live addresses homed on a rank.")
      .def(
          "share_into",
          [](TpSpace& s, std::uint64_t request, py::object addrs) {
            auto a = AsIds<ula::LogicalAddr>(View<const std::uint32_t>(ToArray(addrs, "addrs"), "addrs", 1));
            Unwrap(s.space->ShareInto(ula::RequestId(request), a));
          },
          py::arg("request"), py::arg("addrs"), "The request adopts live addresses uint32 [n] without a copy.")
      .def(
          "retain",
          [](TpSpace& s, py::object addrs) {
            Unwrap(s.space->Retain(AsIds<ula::LogicalAddr>(View<const std::uint32_t>(ToArray(addrs, "addrs"), "addrs", 1))));
          },
          py::arg("addrs"), "Adds a cache reference to each address.")
      .def(
          "release",
          [](TpSpace& s, py::object addrs) {
            Unwrap(s.space->Release(AsIds<ula::LogicalAddr>(View<const std::uint32_t>(ToArray(addrs, "addrs"), "addrs", 1))));
          },
          py::arg("addrs"), "Drops one cache reference of each address; the last holder's release frees it.")
      .def("ref_count", [](TpSpace& s, std::uint32_t a) { return s.space->RefCount(ula::LogicalAddr(a)); },
           py::arg("addr"))
      .def("holds", [](TpSpace& s, std::uint64_t r, std::uint32_t a) {
             return s.space->Holds(ula::RequestId(r), ula::LogicalAddr(a));
           }, py::arg("request"), py::arg("addr"))
      .def("debug_digest", [](TpSpace& s) { return s.space->DebugDigest(); },
           "A hash of the whole state of the hosted ranks: equal before and after a refused call (for tests).")
      .def(
          "shard_device_pool",
          [](py::object self, std::uint16_t rank, std::uint16_t group, bool writable) {
            return ShardPoolView(self, rank, group, ula::Tier::kDevice, writable);
          },
          py::arg("rank"), py::arg("group"), py::arg("writable") = false,
          "uint8 [device slots, entry_bytes] view of a rank's shard device pool (what at-home attention reads "
          "through TpStepPlanner's indices; no copy). Read-only unless writable: the engine's KV write of a "
          "new token at the slot lookup gave right after allocate (stable_new_entries); never write an entry "
          "with more than one holder.")
      .def(
          "shard_host_pool",
          [](py::object self, std::uint16_t rank, std::uint16_t group, bool writable) {
            return ShardPoolView(self, rank, group, ula::Tier::kHost, writable);
          },
          py::arg("rank"), py::arg("group"), py::arg("writable") = false,
          "uint8 [host slots, entry_bytes] view of a rank's shard host pool, as shard_device_pool (a new token "
          "pinned on host is written there).")
      .def(
          "buffer_entry",
          [](TpSpace& s, std::uint16_t rank, std::uint16_t group, std::uint32_t slot, py::object out) {
            auto bytes = ViewOut<std::uint8_t>(ToArray(out, "out"), "out");
            const auto& c = s.space->config();
            if (bytes.size() != c.entry_bytes) Throw(ula::ErrorCode::kInvalidArgument, "out: must be [entry_bytes]");
            const std::byte* p = s.space->RefData(ula::Rank(rank), ula::GroupId(group),
                                                  {ula::TpReadRef::Source::kBuffer, ula::SlotId(slot), ula::Rank(rank)});
            if (p == nullptr) Throw(ula::ErrorCode::kNotFound, "no buffered entry at that rank, group and slot");
            std::memcpy(bytes.data(), p, bytes.size());
          },
          py::arg("rank"), py::arg("group"), py::arg("slot"), py::arg("out"),
          "Copies the local-buffer entry at a buffer slot of a rank into uint8 [entry_bytes] (a test's reader).");

  py::class_<ula::TpStepPlanner>(m, "TpStepPlanner", R"doc(
The TP host step (include/ula/tp_step_planner.h). The engine layout: selections int32
[batch, q_len, top_k] or [batch * q_len, top_k] (-1 = padding) and requests uint64/int64
[batch] -> indices int32 [ranks, *selections.shape], one FlashMLA index array per rank.
At home: the rank's shard device slot, -1 for padding and for entries homed elsewhere
(each rank's attention is a partial, float [batch * q_len, heads, kv_lora_rank + 2],
merged over ranks in rank order). Local buffer: shard slot s, or device_slots + b for
buffer slot b. `step` lets the library's backend move the bytes, `plan` + `complete` the
engine. `step_runs` is the library layout's step (uint32 selections cut into runs).)doc")
      .def(py::init([](TpSpace& s, std::optional<std::uint32_t> max_batch, std::optional<std::uint32_t> max_q_len,
                       std::optional<std::uint32_t> max_top_k, std::uint32_t max_rows, const std::string& reserve,
                       double reserve_quantile, std::uint32_t reserve_window) {
             if (!max_batch && !max_q_len && !max_top_k) return std::make_unique<ula::TpStepPlanner>(*s.space);
             ula::EngineStepConfig c;
             c.max_batch = max_batch.value_or(c.max_batch);
             c.max_q_len = max_q_len.value_or(c.max_q_len);
             c.max_top_k = max_top_k.value_or(c.max_top_k);
             c.max_rows = max_rows;
             SetReserveMode(c, reserve, reserve_quantile, reserve_window);
             return Unwrap(ula::TpStepPlanner::Create(*s.space, c));
           }),
           py::arg("space"), py::arg("max_batch") = py::none(), py::arg("max_q_len") = py::none(),
           py::arg("max_top_k") = py::none(), py::arg("max_rows") = 0, py::arg("reserve") = "guaranteed",
           py::arg("reserve_quantile") = 0.99, py::arg("reserve_window") = 4096, py::keep_alive<1, 2>(),
           "TpStepPlanner(space): the library path only (step_runs, check). With any of max_batch, max_q_len, "
           "max_top_k (EngineStepConfig's defaults for the others): the engine path too (step, plan, complete, "
           "...), refused for a space without stable_new_entries. reserve, reserve_quantile, reserve_window: "
           "reserve_round's mode, as StepPlanner's.")
      .def_property_readonly("num_ranks", [](const ula::TpStepPlanner& p) { return p.ranks().size(); })
      .def_property_readonly("ranks", [](const ula::TpStepPlanner& p) {
             std::vector<std::uint16_t> r;
             for (ula::Rank x : p.ranks()) r.push_back(x.value());
             return r;
           }, "The hosted ranks, in the order of the index arrays' first axis.")
      .def_property_readonly("device_slots", &ula::TpStepPlanner::device_slots)
      .def_property_readonly("index_slots", &ula::TpStepPlanner::index_slots)
      .def(
          "reserve_round",
          [](const ula::TpStepPlanner& p, py::object requests, py::object new_tokens, py::object max_selections) {
            const py::array req_a = ToArray(requests, "requests");
            std::vector<ula::RequestId> widened;
            auto req = RequestsView(req_a, "requests", widened);
            auto fresh = View<const std::uint32_t>(ToArray(new_tokens, "new_tokens"), "new_tokens", 1);
            auto sel = View<const std::uint32_t>(ToArray(max_selections, "max_selections"), "max_selections", 1);
            if (fresh.size() != req.size() || sel.size() != req.size()) {
              Throw(ula::ErrorCode::kInvalidArgument, "reserve_round: requests, new_tokens and max_selections differ in length");
            }
            std::vector<ula::RoundDemand> demands(req.size());
            for (std::size_t i = 0; i < req.size(); ++i) demands[i] = {req[i], fresh[i], sel[i]};
            auto r = Unwrap(p.ReserveRound(demands));
            return std::make_tuple(r.device_needed, r.device_room);
          },
          py::arg("requests"), py::arg("new_tokens"), py::arg("max_selections"),
          "Admission that guarantees the round on every hosted rank: (device_needed, device_room) of the tightest "
          "(rank, group), or ResourceExhaustedError with the numbers. new_tokens, max_selections: uint32 [n].")
      .def(
          "step",
          [](ula::TpStepPlanner& p, std::uint16_t group, py::object selections, py::object indices,
             py::object requests) {
            const py::array sel_a = ToArray(selections, "selections"), idx_a = ToArray(indices, "indices");
            const py::array req_a = ToArray(requests, "requests");
            std::vector<ula::RequestId> widened;
            auto req = RequestsView(req_a, "requests", widened);
            const ula::StepShape shape = ShapeOf(sel_a, req.size());
            CheckRankIndices(p, sel_a, idx_a);
            auto sel = View<const std::int32_t>(sel_a, "selections");
            auto idx = ViewOut<std::int32_t>(idx_a, "indices");
            std::vector<ula::StepStats> stats;
            {
              py::gil_scoped_release nogil;
              stats = Unwrap(p.Step(ula::GroupId(group), shape, req, sel, idx));
            }
            return stats;
          },
          py::arg("group"), py::arg("selections"), py::arg("indices"), py::arg("requests"),
          "One TP step of a group: writes indices; returns [StepStats per rank].")
      .def_property_readonly("max_descriptors", &ula::TpStepPlanner::max_descriptors)
      .def_property_readonly("has_pending", &ula::TpStepPlanner::has_pending)
      .def(
          "plan",
          [](ula::TpStepPlanner& p, std::uint16_t group, py::object selections, py::object indices,
             py::object descriptors, py::object requests) {
            const py::array sel_a = ToArray(selections, "selections"), idx_a = ToArray(indices, "indices");
            const py::array req_a = ToArray(requests, "requests");
            // The binding's scratch, grown to the largest call and reused (one call at a time
            // per thread): widened request ids.
            thread_local std::vector<ula::RequestId> widened;
            auto req = RequestsView(req_a, "requests", widened);
            const ula::StepShape shape = ShapeOf(sel_a, req.size());
            CheckRankIndices(p, sel_a, idx_a);
            auto sel = View<const std::int32_t>(sel_a, "selections");
            auto idx = ViewOut<std::int32_t>(idx_a, "indices");
            const DescriptorArg desc(descriptors);
            ula::TpPlannedStep planned;
            {
              py::gil_scoped_release nogil;
              planned = Unwrap(p.Plan(ula::GroupId(group), shape, req, sel, idx, desc.sink()));
            }
            return std::make_tuple(planned.fence, planned.num_descriptors, planned.stats, planned.first_phase);
          },
          py::arg("group"), py::arg("selections"), py::arg("indices"), py::arg("descriptors"), py::arg("requests"),
          "Engine path, part 1: (fence, n, [StepStats per rank], first_phase); descriptors[:first_phase] are "
          "the local buffer's remote fetches (0 at home), descriptors[first_phase:n] every rank's home moves (src_rank "
          "== dst_rank), whole group entries; every fetch must complete before any home move starts.")
      .def(
          "complete",
          [](ula::TpStepPlanner& p, std::uint64_t fence, py::object status) {
            auto st = View<const std::uint8_t>(ToArray(status, "status"), "status", 1);
            ula::CompleteReport r;
            {
              py::gil_scoped_release nogil;
              r = Unwrap(p.Complete(fence, st));
            }
            return std::make_tuple(r.published, r.failed);
          },
          py::arg("fence"), py::arg("status"),
          "Engine path, part 2: status uint8 [n], 0 = done. Publishes the done ones; (published, failed).")
      .def(
          "execute_on_shards",
          [](ula::TpStepPlanner& p, py::object descriptors, py::object status) {
            std::vector<ula::CopyDescriptor> gathered;
            const DescriptorArg arg(descriptors, gathered);
            const std::span<const ula::CopyDescriptor> desc = arg.records();
            auto st = ViewOut<std::uint8_t>(ToArray(status, "status"), "status", 1);
            if (st.size() != desc.size()) Throw(ula::ErrorCode::kInvalidArgument, "status and descriptors differ in length");
            py::gil_scoped_release nogil;
            p.ExecuteOnShards(desc, st);
          },
          py::arg("descriptors"), py::arg("status"),
          "Runs descriptors over the space's shard pools on its backend (CPU reference executor); status[i] = 0 "
          "if done.")
      .def(
          "step_runs",
          [](ula::TpStepPlanner& p, std::uint16_t group, py::object selections,
             const std::vector<std::pair<std::uint64_t, std::uint32_t>>& runs) {
            auto sel = AsIds<ula::LogicalAddr>(View<const std::uint32_t>(ToArray(selections, "selections"), "selections", 1));
            const auto r = ToRuns(runs);
            ula::TpStepPlan plan;
            {
              py::gil_scoped_release nogil;
              plan = Unwrap(p.Step(ula::GroupId(group), sel, r));
            }
            const auto ranks = static_cast<py::ssize_t>(plan.refs.size());
            const auto n = static_cast<py::ssize_t>(sel.size());
            py::array_t<std::uint8_t> source({ranks, n});
            py::array_t<std::uint32_t> slot({ranks, n});
            auto src = source.mutable_unchecked<2>();
            auto sl = slot.mutable_unchecked<2>();
            for (py::ssize_t r = 0; r < ranks; ++r) {
              for (py::ssize_t i = 0; i < n; ++i) {
                src(r, i) = static_cast<std::uint8_t>(plan.refs[r][i].source);
                sl(r, i) = plan.refs[r][i].slot.value();
              }
            }
            return std::make_tuple(source, slot, plan.stats);
          },
          py::arg("group"), py::arg("selections"), py::arg("runs"),
          "The library layout's step: selections uint32 [n], runs [(request, count), ...] -> (source uint8 "
          "[ranks, n] (0 shard, 1 buffer, 2 elsewhere), slot uint32 [ranks, n], [StepStats per rank]).")
      .def(
          "check",
          [](ula::TpStepPlanner& p, std::uint16_t group, py::object selections,
             const std::vector<std::pair<std::uint64_t, std::uint32_t>>& runs) {
            auto sel = AsIds<ula::LogicalAddr>(View<const std::uint32_t>(ToArray(selections, "selections"), "selections", 1));
            const auto r = ToRuns(runs);
            Unwrap(p.Check(ula::GroupId(group), sel, r));
          },
          py::arg("group"), py::arg("selections"), py::arg("runs"),
          "The refusals of step without running it (raises as step would; changes nothing).");
}

}  // namespace ulapy

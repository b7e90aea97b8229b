// DP address space, its planners (per-call StepPlanner and the engine step API), stats.
#include <pybind11/stl.h>

#include <chrono>
#include <optional>
#include <tuple>

#include "bind_common.h"
#include "ula/address_space.h"
#include "ula/step_planner.h"

namespace ulapy {
namespace {

// The DP host step (StepPlanner), the engine-owned arrays registered with it (kept alive) and the
// binding's own scratch (widened request ids, per-row requests of a flat batch): grown to the
// largest call, then reused.
struct EnginePlanner {
  std::unique_ptr<ula::StepPlanner> planner;
  DpSpace* space = nullptr;
  std::vector<py::object> registered;
  std::vector<ula::RequestId> ids, row_ids;
  // Where the last plan call's time went, in nanoseconds (bench/plan_cost.py reads it):
  // taking the arguments (views, checks, per-row requests), inside StepPlanner::Plan,
  // and writing the outputs (the result; the planner wrote the descriptors).
  std::int64_t args_ns = 0, planner_ns = 0, outputs_ns = 0;
};

inline std::int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Engine-owned memory of one pool: one array [num_layers, <layer>], or the layers' own
// arrays [<layer>] at any addresses, as a list (SGLang's pools) or a dict in layer order
// (vLLM's register_kv_caches). A <layer> is its rows in any shape whose last dimensions make
// one row of the config's row() bytes: [slots, row_bytes] (SGLang), [num_blocks,
// block_size, row_bytes] (vLLM), [num_blocks, block_size, 1, row_bytes] (FlashMLA), in any
// dtype taken as bytes (uint8, bf16, fp8: ToArray's DtypeUse::kBytes); slots = its bytes /
// row(). A layer whose last dimensions make no row is read as [slots, ...] by its first
// dimension, and RegisterEngineMemory refuses it with both layouts named. Each layer's base
// goes to RegisterEngineMemory's layer_bases form; `keep` holds the arrays alive.
struct EngineMemoryArg {
  std::vector<std::uintptr_t> bases;  // [num_layers]
  std::uint32_t layer_bytes = 0;
  std::uint32_t slots = 0;
  std::vector<py::object> keep;
};

// Whether dimensions [first, ndim) of `a` hold whole rows of `row` bytes: some trailing
// dimensions (from `first` + 1 on, at least the last) multiply to exactly one row.
bool RowsAreTrailing(const py::array& a, py::ssize_t first, std::uint64_t row) {
  std::uint64_t tail = static_cast<std::uint64_t>(a.itemsize());
  for (py::ssize_t d = a.ndim() - 1; d > first; --d) {
    tail *= static_cast<std::uint64_t>(a.shape(d));
    if (tail == row) return true;
    if (tail > row) return false;
  }
  return false;
}

// One layer's rows: (layer_bytes, slots) from its bytes and shape (dimensions from `first`).
std::pair<std::uint32_t, std::uint32_t> LayerRows(const py::array& a, py::ssize_t first, std::uint64_t layer_nbytes,
                                                  std::uint64_t row) {
  if (row != 0 && RowsAreTrailing(a, first, row)) {
    return {static_cast<std::uint32_t>(row), static_cast<std::uint32_t>(layer_nbytes / row)};
  }
  const auto slots = static_cast<std::uint64_t>(a.shape(first));
  return {static_cast<std::uint32_t>(layer_nbytes / (slots == 0 ? 1 : slots)), static_cast<std::uint32_t>(slots)};
}

EngineMemoryArg ToEngineMemory(py::handle memory, std::uint64_t row) {
  EngineMemoryArg out;
  std::vector<py::array> layers;
  if (py::isinstance<py::dict>(memory)) {
    for (auto item : py::reinterpret_borrow<py::dict>(memory)) {
      layers.push_back(ToArray(item.second, "memory[layer]", DtypeUse::kBytes));
    }
  } else if (py::isinstance<py::list>(memory) || py::isinstance<py::tuple>(memory)) {
    for (auto item : memory) layers.push_back(ToArray(item, "memory[layer]", DtypeUse::kBytes));
  } else {
    py::array a = ToArray(memory, "memory", DtypeUse::kBytes);
    CheckLayout(a, "memory", /*writable=*/true);
    if (a.ndim() < 2) Throw(ula::ErrorCode::kInvalidArgument, "memory: must be [num_layers, slots, ...]");
    const auto layer_stride = static_cast<std::uint64_t>(a.strides(0));
    for (py::ssize_t l = 0; l < a.shape(0); ++l) {
      out.bases.push_back(reinterpret_cast<std::uintptr_t>(a.data()) + static_cast<std::uint64_t>(l) * layer_stride);
    }
    std::tie(out.layer_bytes, out.slots) = LayerRows(a, 1, layer_stride, row);
    out.keep.push_back(a);
    return out;
  }
  if (layers.empty()) Throw(ula::ErrorCode::kInvalidArgument, "memory: no layer tensors");
  const py::array& first = layers[0];
  for (const py::array& a : layers) {
    CheckLayout(a, "memory[layer]", /*writable=*/true);
    if (a.ndim() < 1 || a.shape(0) != first.shape(0) || a.nbytes() != first.nbytes()) {
      Throw(ula::ErrorCode::kInvalidArgument, "memory[layer]: every layer must be [slots, ...] of the same size");
    }
    out.bases.push_back(reinterpret_cast<std::uintptr_t>(a.data()));
    out.keep.push_back(a);
  }
  std::tie(out.layer_bytes, out.slots) = LayerRows(first, 0, static_cast<std::uint64_t>(first.nbytes()), row);
  return out;
}

}  // namespace

ula::FaultPlan* FaultPlanOf(py::handle faults) {
  return faults.is_none() ? nullptr : &faults.cast<ula::FaultPlan&>();
}

OwnedBackend MakeBackend(const std::string& name, py::handle faults) {
  OwnedBackend b;
  if (name == "cpu") {
    b.inner = ula::MakeCpuBackend();
  } else if (name == "counting") {
    b.inner = ula::MakeCountingBackend();
  } else {
    Throw(ula::ErrorCode::kInvalidArgument, "backend must be 'cpu' or 'counting', got '" + name + "'");
  }
  if (const ula::FaultPlan* plan = FaultPlanOf(faults)) b.faults = Unwrap(ula::MakeFaultInjectingBackend(*b.inner, *plan));
  return b;
}

ula::Tier ParseTier(const std::string& t) {
  if (t == "device") return ula::Tier::kDevice;
  if (t == "host") return ula::Tier::kHost;
  Throw(ula::ErrorCode::kInvalidArgument, "tier must be 'device' or 'host', got '" + t + "'");
  return ula::Tier::kDevice;
}

ula::PolicyKind ParsePolicy(const std::string& name) { return Unwrap(ula::ParsePolicyKind(name)); }

void BindStats(py::module_& m) {
  py::class_<ula::StepStats>(m, "StepStats", "What one step of one group did on one rank, DP or TP (include/ula/step_stats.h).")
      .def_readonly("selections", &ula::StepStats::selections)
      .def_readonly("distinct", &ula::StepStats::distinct)
      .def_readonly("hits", &ula::StepStats::hits)
      .def_readonly("misses", &ula::StepStats::misses)
      .def_readonly("into_free", &ula::StepStats::into_free)
      .def_readonly("evictions", &ula::StepStats::evictions)
      .def_readonly("bytes_moved", &ula::StepStats::bytes_moved)
      .def_readonly("shadow_evictions", &ula::StepStats::shadow_evictions)
      .def_readonly("evict_copies", &ula::StepStats::evict_copies)
      .def_readonly("buffer_hits", &ula::StepStats::buffer_hits)
      .def_readonly("remote_fetches", &ula::StepStats::remote_fetches)
      .def_readonly("buffer_evictions", &ula::StepStats::buffer_evictions)
      .def_readonly("remote_bytes", &ula::StepStats::remote_bytes)
      .def_readonly("elsewhere", &ula::StepStats::elsewhere)
      .def_readonly("source_batches", &ula::StepStats::source_batches)
      .def("__repr__", [](const ula::StepStats& s) {
        return "StepStats(selections=" + std::to_string(s.selections) + ", distinct=" + std::to_string(s.distinct) +
               ", hits=" + std::to_string(s.hits) + ", misses=" + std::to_string(s.misses) +
               ", evictions=" + std::to_string(s.evictions) + ", bytes_moved=" + std::to_string(s.bytes_moved) + ")";
      });
}

void BindFaults(py::module_& m) {
  py::class_<ula::FaultPlan>(m, "FaultPlan", R"doc(
Fault injection for a space's backend (src/backend/fault_backend.h): every eligible copy or
swap batch fails when it is the n-th (fail_every_nth) or when a seeded draw falls below
fail_fraction; a failure reports at Submit or at the batch's wait (at_submit / at_wait),
with `partial` a failed copy batch lands a prefix first. Same seed, same faults.)doc")
      .def(py::init([](std::uint64_t seed, std::uint64_t fail_every_nth, double fail_fraction, bool partial, bool copies,
                       bool swaps, bool at_submit, bool at_wait, double delay_us) {
             ula::FaultPlan f;
             f.delay = std::chrono::microseconds(static_cast<std::int64_t>(delay_us));
             f.seed = seed;
             f.fail_every_nth = fail_every_nth;
             f.fail_fraction = fail_fraction;
             f.partial = partial;
             f.copies = copies;
             f.swaps = swaps;
             f.at_submit = at_submit;
             f.at_wait = at_wait;
             Unwrap(f.Validate());
             return f;
           }),
           py::arg("seed") = 1, py::arg("fail_every_nth") = 0, py::arg("fail_fraction") = 0.0, py::arg("partial") = false,
           py::arg("copies") = true, py::arg("swaps") = true, py::arg("at_submit") = true, py::arg("at_wait") = true,
           py::arg("delay_us") = 0.0)
      .def_readonly("seed", &ula::FaultPlan::seed)
      .def_readonly("fail_every_nth", &ula::FaultPlan::fail_every_nth)
      .def_readonly("fail_fraction", &ula::FaultPlan::fail_fraction)
      .def_readonly("partial", &ula::FaultPlan::partial)
      .def_property_readonly("delay", [](const ula::FaultPlan& f) { return static_cast<double>(f.delay.count()); },
                             "Microseconds every eligible batch is held back before it reports (delay_us).");
  py::class_<ula::FaultStats>(m, "FaultStats", "What a space's fault injection did (src/backend/fault_backend.h).")
      .def_readonly("operations", &ula::FaultStats::operations)
      .def_readonly("injected", &ula::FaultStats::injected)
      .def_readonly("copies_failed", &ula::FaultStats::copies_failed)
      .def_readonly("swaps_failed", &ula::FaultStats::swaps_failed)
      .def_readonly("waits_failed", &ula::FaultStats::waits_failed)
      .def_readonly("partial", &ula::FaultStats::partial)
      .def_readonly("delayed", &ula::FaultStats::delayed)
      .def_readonly("fetches_failed", &ula::FaultStats::fetches_failed)
      .def_readonly("moves_landed_before_failure", &ula::FaultStats::moves_landed_before_failure);
}

namespace {

// The descriptor dtype and the constants of its fields.
void BindDescriptorDtype(py::module_& m) {
  PYBIND11_NUMPY_DTYPE(ula::CopyDescriptor, src_offset, dst_offset, src_slot, dst_slot, bytes, addr, src_rank,
                       dst_rank, group, src_tier, dst_tier, op, num_layers, evict_slot);
  m.attr("DESCRIPTOR_DTYPE") = py::dtype::of<ula::CopyDescriptor>();
  m.attr("COPY") = static_cast<int>(ula::CopyOp::kCopy);
  m.attr("SWAP") = static_cast<int>(ula::CopyOp::kSwap);
  m.attr("EVICT") = static_cast<int>(ula::CopyOp::kEvict);
  m.attr("EVICT_LANDED") = static_cast<int>(ula::kEvictLanded);
  m.attr("DEVICE") = static_cast<int>(ula::Tier::kDevice);
  m.attr("HOST") = static_cast<int>(ula::Tier::kHost);
}

// AddressSpaceConfig: the DP config with its defaults and validate().
void BindAddressSpaceConfig(py::module_& m) {
  py::class_<ula::AddressSpaceConfig>(m, "AddressSpaceConfig", "DP address space config (include/ula/address_space.h).")
      .def(py::init([](std::uint32_t num_ranks, std::uint32_t num_groups, std::uint32_t entry_bytes,
                       std::uint64_t device_bytes_per_rank, std::uint64_t host_bytes_per_rank, const std::string& policy,
                       std::uint32_t page_tokens, std::uint32_t row_bytes, const std::vector<std::uint32_t>& group_layers,
                       bool stable_new_entries, bool host_shadows, bool device_placement) {
             ula::AddressSpaceConfig c;
             c.stable_new_entries = stable_new_entries;
             c.device_placement = device_placement;
             c.host_shadows = host_shadows;
             c.page_tokens = page_tokens;
             c.row_bytes = row_bytes;
             c.group_layers = group_layers;
             c.num_ranks = num_ranks;
             c.num_groups = num_groups;
             c.entry_bytes = entry_bytes;
             c.device_bytes_per_rank = device_bytes_per_rank;
             c.host_bytes_per_rank = host_bytes_per_rank;
             c.policy = ParsePolicy(policy);
             return c;
           }),
           py::arg("num_ranks") = 1, py::arg("num_groups") = 1, py::arg("entry_bytes") = 656,
           py::arg("device_bytes_per_rank") = 0, py::arg("host_bytes_per_rank") = 0, py::arg("policy") = "pb_lru",
           py::arg("page_tokens") = 64, py::arg("row_bytes") = 0, py::arg("group_layers") = std::vector<std::uint32_t>{},
           py::arg("stable_new_entries") = false, py::arg("host_shadows") = false, py::arg("device_placement") = false)
      .def_readwrite("num_ranks", &ula::AddressSpaceConfig::num_ranks)
      .def_readwrite("row_bytes", &ula::AddressSpaceConfig::row_bytes)
      .def_readwrite("group_layers", &ula::AddressSpaceConfig::group_layers)
      .def("layers_of", [](const ula::AddressSpaceConfig& c, std::uint16_t g) {
             if (g >= c.num_groups) Throw(ula::ErrorCode::kOutOfRange, "group out of range");
             return c.layers_of(ula::GroupId(g));
           }, py::arg("group"))
      .def("entry_bytes_of", [](const ula::AddressSpaceConfig& c, std::uint16_t g) {
             if (g >= c.num_groups) Throw(ula::ErrorCode::kOutOfRange, "group out of range");
             return c.entry_bytes_of(ula::GroupId(g));
           }, py::arg("group"), "Bytes of one entry of group g: layers_of(g) rows of row().")
      .def("row", &ula::AddressSpaceConfig::row, "One layer's row in bytes (row_bytes, or entry_bytes when 0).")
      .def_property(
          "policy", [](const ula::AddressSpaceConfig& c) { return std::string(ula::PolicyKindName(c.policy)); },
          [](ula::AddressSpaceConfig& c, const std::string& name) { c.policy = ParsePolicy(name); },
          "The device pools' residency policy by name (residency_policy.h).")
      .def_readwrite("stable_new_entries", &ula::AddressSpaceConfig::stable_new_entries,
                     "New entries are placed on device and keep their slot for their round (StepPlanner's engine path "
                     "requires it: the engine writes KV where it looked it up).")
      .def_readwrite("host_shadows", &ula::AddressSpaceConfig::host_shadows,
                     "Fetched entries keep their host slot as a clean, reclaimable copy: evicting them "
                     "moves no bytes (src/space/host_shadows.h). Off by default; StepPlanner's engine path keeps them (its plans then hold EVICT descriptors); the device step refuses them.")
      .def_readwrite("device_placement", &ula::AddressSpaceConfig::device_placement,
                     "Addresses on the host, slots on the device: allocate hands out addresses without placing "
                     "them and take_placement() returns what the device step's Place must apply (needs "
                     "stable_new_entries; no host shadows, no kinds; the host step refuses the mode).")
      .def_readwrite("page_tokens", &ula::AddressSpaceConfig::page_tokens)
      .def_readwrite("num_groups", &ula::AddressSpaceConfig::num_groups)
      .def_readwrite("entry_bytes", &ula::AddressSpaceConfig::entry_bytes)
      .def_readwrite("device_bytes_per_rank", &ula::AddressSpaceConfig::device_bytes_per_rank)
      .def_readwrite("host_bytes_per_rank", &ula::AddressSpaceConfig::host_bytes_per_rank)
      .def_property_readonly("device_slots_per_group", &ula::AddressSpaceConfig::device_slots_per_group)
      .def_property_readonly("host_slots_per_group", &ula::AddressSpaceConfig::host_slots_per_group)
      .def("validate", [](const ula::AddressSpaceConfig& c) { Unwrap(c.Validate()); });
}

// AddressSpace: the space and the backend it owns (requests, addresses, bytes, pools).
void BindAddressSpace(py::module_& m) {
  py::class_<DpSpace>(m, "AddressSpace", R"doc(
DP mode: stable logical addresses (uint32) over exclusive device/host pools per (rank, group).
Owns its backend: 'cpu' (real bytes, a copy thread) or 'counting' (no bytes: the engine owns
the memory and runs the copies). A refused call raises a ulacache.Error and changes nothing.
One thread at a time drives a space and its planners (as in C++); different spaces may be
driven from different threads at once (the GIL is released while planning).)doc")
      .def(py::init([](const ula::AddressSpaceConfig& c, const std::string& backend, py::object faults) {
             DpSpace s{MakeBackend(backend, faults), nullptr};
             s.space = Unwrap(ula::AddressSpace::Create(c, s.backend.get()));
             return s;
           }),
           py::arg("config"), py::arg("backend") = "cpu", py::arg("faults") = py::none(),
           "faults: a FaultPlan makes the backend's transfers fail as it says (FaultInjectingBackend).")
      .def(
          "fault_stats",
          [](DpSpace& s) {
            if (!s.backend.faults) Throw(ula::ErrorCode::kFailedPrecondition, "the space was made without faults=");
            return s.backend.faults->stats();
          },
          "What the fault injection did so far (FaultStats).")
      .def(
          "set_faults_armed",
          [](DpSpace& s, bool armed) {
            if (!s.backend.faults) Throw(ula::ErrorCode::kFailedPrecondition, "the space was made without faults=");
            s.backend.faults->set_armed(armed);
          },
          py::arg("armed"), "While disarmed no transfer fails (set-up and checking phases).")
      .def_property_readonly("holds_bytes", [](DpSpace& s) { return s.backend.get().holds_bytes(); },
                             "Whether the backend holds the pools' bytes ('cpu'); False for 'counting'.")
      .def(
          "add_request",
          [](DpSpace& s, std::uint64_t request, std::uint16_t rank) {
            Unwrap(s.space->AddRequest(ula::RequestId(request), ula::Rank(rank)));
          },
          py::arg("request"), py::arg("rank") = 0, "Registers a request served by `rank`.")
      .def(
          "allocate",
          [](DpSpace& s, std::uint64_t request, std::uint32_t n_tokens) {
            auto addrs = Unwrap(s.space->Allocate(ula::RequestId(request), n_tokens));
            return ToNumpy<std::uint32_t>(std::move(addrs));
          },
          py::arg("request"), py::arg("n_tokens"), "n_tokens new logical addresses (uint32 array, no copy).")
      .def(
          "take_placement",
          [](DpSpace& s) {
            const ula::PlacementJournal j = Unwrap(s.space->TakePlacement());
            py::list admitted, retired, seated, released;
            for (const auto& r : j.new_requests) admitted.append(py::make_tuple(r.id.value(), r.tag, r.rank.value()));
            for (ula::RequestId r : j.retired) retired.append(r.value());
            for (const auto& rank : j.seated) {
              py::list seats;
              for (const auto& seat : rank) seats.append(py::make_tuple(seat.addr.value(), seat.tag));
              seated.append(seats);
            }
            for (const auto& rank : j.released) {
              std::vector<std::uint32_t> addrs;
              for (ula::LogicalAddr a : rank) addrs.push_back(a.value());
              released.append(ToNumpy<std::uint32_t>(std::move(addrs)));
            }
            py::dict d;
            d["new_requests"] = admitted;
            d["retired"] = retired;
            d["seated"] = seated;
            d["released"] = released;
            return d;
          },
          "device_placement only: what the device step's Place must apply since the last call, as a dict: "
          "new_requests [(id, owner tag, rank)], retired [ids], seated [per rank: [(address, owner tag)] in "
          "allocate order], released [per rank: uint32 addresses]. FailedPreconditionError outside the mode.")
      .def(
          "free", [](DpSpace& s, std::uint64_t request) { Unwrap(s.space->Free(ula::RequestId(request))); },
          py::arg("request"), "Frees every address of the request; NotFoundError the second time.")
      .def(
          "truncate",
          [](DpSpace& s, std::uint64_t request, std::uint32_t length) {
            Unwrap(s.space->Truncate(ula::RequestId(request), length));
          },
          py::arg("request"), py::arg("length"),
          "Frees the request's tokens past `length` (rejected drafts); its next tokens reuse them in place.")
      .def(
          "write",
          [](DpSpace& s, std::uint32_t addr, std::uint16_t group, py::object data) {
            auto bytes = View<const std::uint8_t>(ToArray(data, "data"), "data");
            py::gil_scoped_release nogil;
            Unwrap(s.space->Write(ula::LogicalAddr(addr), ula::GroupId(group), std::as_bytes(bytes)));
          },
          py::arg("addr"), py::arg("group"), py::arg("data"), "The engine's KV write: uint8 [entry_bytes].")
      .def(
          "read",
          [](DpSpace& s, std::uint32_t addr, std::uint16_t group, py::object out) {
            auto bytes = ViewOut<std::uint8_t>(ToArray(out, "out"), "out");
            py::gil_scoped_release nogil;
            Unwrap(s.space->Read(ula::LogicalAddr(addr), ula::GroupId(group), std::as_writable_bytes(bytes)));
          },
          py::arg("addr"), py::arg("group"), py::arg("out"), "Reads an entry into uint8 [entry_bytes].")
      .def(
          "lookup",
          [](DpSpace& s, std::uint32_t addr, std::uint16_t group) {
            const ula::Location loc = Unwrap(s.space->Lookup(ula::LogicalAddr(addr), ula::GroupId(group)));
            return py::make_tuple(std::string(ula::TierName(loc.tier())), loc.rank().value(), loc.slot().value());
          },
          py::arg("addr"), py::arg("group"), "(tier, rank, slot) of a live address.")
      .def(
          "slot_mapping",
          [](DpSpace& s, py::object addrs, py::object out, std::uint16_t rank) {
            const py::array a_arr = ToArray(addrs, "addrs"), o_arr = ToArray(out, "out");
            const auto& c = s.space->config();
            if (rank >= c.num_ranks) Throw(ula::ErrorCode::kOutOfRange, "rank out of range");
            // addrs: uint32 (allocate's), or int32 / int64 with -1 for padding rows.
            IntColumn col;
            std::span<const std::uint32_t> u32;
            if (py::detail::npy_api::get().PyArray_EquivTypes_(a_arr.dtype().ptr(),
                                                               py::dtype::of<std::uint32_t>().ptr())) {
              u32 = View<const std::uint32_t>(a_arr, "addrs", 1);
            } else {
              col = IntColumnView(a_arr, "addrs");
            }
            const std::size_t n = u32.empty() ? col.size : u32.size();
            auto addr_at = [&](std::size_t i) { return u32.empty() ? col[i] : std::int64_t{u32[i]}; };
            const std::size_t groups = c.num_groups;
            const bool flat = o_arr.ndim() == 1 && groups == 1;
            if (!flat && !(o_arr.ndim() == 2 && static_cast<std::size_t>(o_arr.shape(0)) == groups &&
                           static_cast<std::size_t>(o_arr.shape(1)) == n)) {
              Throw(ula::ErrorCode::kInvalidArgument, "out: must be int64 [num_groups = " + std::to_string(groups) +
                                                          ", len(addrs) = " + std::to_string(n) + "]");
            }
            auto o = ViewOut<std::int64_t>(o_arr, "out");
            if (flat && o.size() != n) Throw(ula::ErrorCode::kInvalidArgument, "out: must have len(addrs) entries");
            // Every (address, group) checked before anything is written: a refusal leaves out as it was.
            for (int pass = 0; pass < 2; ++pass) {
              for (std::size_t g = 0; g < groups; ++g) {
                for (std::size_t i = 0; i < n; ++i) {
                  const std::int64_t v = addr_at(i);
                  if (v == -1) {
                    if (pass == 1) o[g * n + i] = -1;
                    continue;
                  }
                  if (v < 0 || v > std::int64_t{UINT32_MAX}) {
                    Throw(ula::ErrorCode::kInvalidArgument,
                          "addrs[" + std::to_string(i) + "] = " + std::to_string(v) + ": neither an address nor -1");
                  }
                  const ula::Location loc = Unwrap(s.space->Lookup(ula::LogicalAddr(static_cast<std::uint32_t>(v)),
                                                                   ula::GroupId(static_cast<std::uint16_t>(g))));
                  if (pass == 1) {
                    o[g * n + i] = loc.slot().value();
                    continue;
                  }
                  if (loc.tier() != ula::Tier::kDevice || loc.rank().value() != rank) {
                    Throw(ula::ErrorCode::kFailedPrecondition,
                          "address " + std::to_string(v) + " of group " + std::to_string(g) + " is on " +
                              std::string(ula::TierName(loc.tier())) + " of rank " + std::to_string(loc.rank().value()) +
                              ", not on rank " + std::to_string(rank) +
                              "'s device: slot_mapping names device slots (a space with stable_new_entries puts "
                              "new tokens there; write others with write())");
                  }
                }
              }
            }
          },
          py::arg("addrs"), py::arg("out"), py::arg("rank") = 0,
          "vLLM's slot_mapping for every group in one call: out int64 [num_groups, n] (or [n] with one group) "
          "gets the device slot of each address (uint32, or int32 / int64 with -1 for padding, written -1), the "
          "row the KV write goes to in each layer of the group (FlashMLA's block * 64 + offset). An address not "
          "live (NotFoundError) or not on this rank's device (FailedPreconditionError) is refused, out unchanged.")
      .def(
          "addresses_of",
          [](DpSpace& s, std::uint64_t request) {
            auto span = Unwrap(s.space->AddressesOf(ula::RequestId(request)));
            return ToNumpy<std::uint32_t>(std::vector<ula::LogicalAddr>(span.begin(), span.end()));
          },
          py::arg("request"), "A snapshot of the request's addresses (uint32).")
      .def("is_live", [](DpSpace& s, std::uint32_t a) { return s.space->IsLive(ula::LogicalAddr(a)); }, py::arg("addr"))
      .def("advance_round", [](DpSpace& s) { s.space->AdvanceRound(); }, "Ends the round (once per decode step).")
      .def_property_readonly("config", [](DpSpace& s) { return s.space->config(); })
      .def_property_readonly("num_live_addresses", [](DpSpace& s) { return s.space->num_live_addresses(); })
      .def_property_readonly("num_requests", [](DpSpace& s) { return s.space->num_requests(); })
      .def(
          "num_used",
          [](DpSpace& s, std::uint16_t rank, std::uint16_t group, const std::string& tier) {
            const auto& c = s.space->config();
            if (rank >= c.num_ranks || group >= c.num_groups) Throw(ula::ErrorCode::kOutOfRange, "rank or group out of range");
            return s.space->NumUsed(ula::Rank(rank), ula::GroupId(group), ParseTier(tier));
          },
          py::arg("rank"), py::arg("group"), py::arg("tier"))
      .def(
          "num_host_shadows",
          [](DpSpace& s, std::uint16_t rank, std::uint16_t group) {
            const auto& c = s.space->config();
            if (rank >= c.num_ranks || group >= c.num_groups) Throw(ula::ErrorCode::kOutOfRange, "rank or group out of range");
            return s.space->NumHostShadows(ula::Rank(rank), ula::GroupId(group));
          },
          py::arg("rank"), py::arg("group"), "Host slots of (rank, group) holding a clean host shadow (counted free).")
      .def(
          "num_free",
          [](DpSpace& s, std::uint16_t rank, std::uint16_t group, const std::string& tier) {
            const auto& c = s.space->config();
            if (rank >= c.num_ranks || group >= c.num_groups) Throw(ula::ErrorCode::kOutOfRange, "rank or group out of range");
            return s.space->NumFree(ula::Rank(rank), ula::GroupId(group), ParseTier(tier));
          },
          py::arg("rank"), py::arg("group"), py::arg("tier"))
      .def(
          "device_pool",
          [](py::object self, std::uint16_t rank, std::uint16_t group) {
            DpSpace& s = self.cast<DpSpace&>();
            const auto& c = s.space->config();
            if (rank >= c.num_ranks || group >= c.num_groups) Throw(ula::ErrorCode::kOutOfRange, "rank or group out of range");
            const auto pool = s.space->DevicePoolBytes(ula::Rank(rank), ula::GroupId(group));
            if (pool.empty()) Throw(ula::ErrorCode::kUnsupported, "the counting backend holds no bytes");
            const std::byte* p = pool.data();
            py::array_t<std::uint8_t> view({static_cast<py::ssize_t>(c.device_slots_per_group()),
                                            static_cast<py::ssize_t>(c.entry_bytes)},
                                           reinterpret_cast<const std::uint8_t*>(p), self);
            py::detail::array_proxy(view.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
            return view;
          },
          py::arg("rank"), py::arg("group"),
          "Read-only uint8 [device slots, entry_bytes] view of a device pool: what attention reads "
          "through the index array (no copy; keeps the space alive).")
      .def(
          "device_layer",
          [](py::object self, std::uint16_t rank, std::uint16_t group, std::uint32_t layer) {
            DpSpace& s = self.cast<DpSpace&>();
            const auto& c = s.space->config();
            if (rank >= c.num_ranks || group >= c.num_groups || layer >= c.layers_of(ula::GroupId(group))) {
              Throw(ula::ErrorCode::kOutOfRange, "rank, group or layer out of range");
            }
            const auto region = s.space->DeviceLayerBytes(ula::Rank(rank), ula::GroupId(group), layer);
            if (region.empty()) Throw(ula::ErrorCode::kUnsupported, "the counting backend holds no bytes");
            const auto row = static_cast<py::ssize_t>(c.row());
            py::array_t<std::uint8_t> view({static_cast<py::ssize_t>(region.size()) / row, row},
                                           reinterpret_cast<const std::uint8_t*>(region.data()), self);
            py::detail::array_proxy(view.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
            return view;
          },
          py::arg("rank"), py::arg("group"), py::arg("layer"),
          "Read-only uint8 [slots rounded up to 64, row_bytes] view of one layer's device region: FlashMLA's "
          "k_cache of that layer (view it as [blocks, 64, 1, row_bytes]), indexed by the step's indices.")
      .def(
          "transfer_bytes", [](DpSpace& s) { return s.backend.get().counters().TotalBytes(); },
          "Bytes the backend moved so far (both directions).")
      .def("check_invariants", [](DpSpace& s) { Unwrap(s.space->CheckInvariants()); })
      .def(
          "share_into",
          [](DpSpace& s, std::uint64_t request, py::object addrs) {
            auto a = AsIds<ula::LogicalAddr>(View<const std::uint32_t>(ToArray(addrs, "addrs"), "addrs", 1));
            Unwrap(s.space->ShareInto(ula::RequestId(request), a));
          },
          py::arg("request"), py::arg("addrs"),
          "The request adopts live addresses uint32 [n] (a cached prefix) without a copy (address_space.h, Sharing).")
      .def(
          "retain",
          [](DpSpace& s, py::object addrs) {
            Unwrap(s.space->Retain(AsIds<ula::LogicalAddr>(View<const std::uint32_t>(ToArray(addrs, "addrs"), "addrs", 1))));
          },
          py::arg("addrs"), "Adds a cache reference to each address (a prefix cache keeps them live).")
      .def(
          "release",
          [](DpSpace& s, py::object addrs) {
            Unwrap(s.space->Release(AsIds<ula::LogicalAddr>(View<const std::uint32_t>(ToArray(addrs, "addrs"), "addrs", 1))));
          },
          py::arg("addrs"), "Drops one cache reference of each address; the last holder's release frees it.")
      .def("ref_count", [](DpSpace& s, std::uint32_t a) { return s.space->RefCount(ula::LogicalAddr(a)); },
           py::arg("addr"), "Holders of an address: requests that list it plus cache references (0: not live).")
      .def("holds", [](DpSpace& s, std::uint64_t r, std::uint32_t a) {
             return s.space->Holds(ula::RequestId(r), ula::LogicalAddr(a));
           }, py::arg("request"), py::arg("addr"), "Whether the address is live for the request (the isolation check).")
      .def("rank_of", [](DpSpace& s, std::uint64_t r) { return Unwrap(s.space->RankOf(ula::RequestId(r))).value(); },
           py::arg("request"), "The rank a request was added on (NotFoundError if unknown).")
      .def("debug_digest", [](DpSpace& s) { return s.space->DebugDigest(); },
           "A hash of the whole state: equal before and after a refused call (for tests).");
}

// The arguments of one engine step as the planner takes them.
struct StepInput {
  ula::StepShape shape;
  std::span<const ula::RequestId> requests;
  std::span<const std::int32_t> selections;
  std::span<std::int32_t> indices;
};

// A step's arrays: selections and indices of one shape; requests one per batch row, or with
// query_start_loc one per request and the rows cut by it (RowRequests).
StepInput StepInputOf(EnginePlanner& p, const py::array& sel_a, const py::array& idx_a, py::handle requests,
                           py::handle query_start_loc) {
  const py::array req_a = ToArray(requests, "requests");
  StepInput in;
  in.requests = RequestsView(req_a, "requests", p.ids);
  if (query_start_loc.is_none()) {
    in.shape = ShapeOf(sel_a, in.requests.size());
  } else {
    if (sel_a.ndim() != 2) {
      Throw(ula::ErrorCode::kInvalidArgument, "selections: with query_start_loc must be [tokens, top_k], got " +
                                                  std::to_string(sel_a.ndim()) + " dimensions");
    }
    const py::array qsl_a = ToArray(query_start_loc, "query_start_loc");
    const auto rows = static_cast<std::size_t>(sel_a.shape(0));
    RowRequests(in.requests, IntColumnView(qsl_a, "query_start_loc"), rows, p.row_ids);
    in.requests = {p.row_ids.data(), rows};
    in.shape = {static_cast<std::uint32_t>(rows), 1, static_cast<std::uint32_t>(sel_a.shape(1))};
  }
  CheckSameShape(sel_a, idx_a);
  in.selections = View<const std::int32_t>(sel_a, "selections");
  in.indices = ViewOut<std::int32_t>(idx_a, "indices");
  return in;
}

// StepPlanner: the DP host step (library step, plan / complete, engine memory).
void BindStepPlanner(py::module_& m) {
  py::class_<EnginePlanner>(m, "StepPlanner", R"doc(
The DP host step (include/ula/step_planner.h): selections int32 [batch, q_len, top_k]
(-1 = padding) -> indices int32 [batch, q_len, top_k] in the sparse MLA kernels' layout
(FlashMLA sparse decode: the device slot, -1 for padding), and the copy plan as a
DESCRIPTOR_DTYPE array with a fence. `step` runs the copies on the library's backend;
`plan` + `complete(fence, status)` let the engine run them. Nothing allocates per step.
`step_runs` is the library layout's step: uint32 selections cut into runs of one request
each, uint32 out_slots.)doc")
      .def(py::init([](DpSpace& s, std::optional<std::uint32_t> max_batch, std::optional<std::uint32_t> max_q_len,
                       std::optional<std::uint32_t> max_top_k, std::uint32_t top_k_multiple, std::uint32_t max_rows,
                       const std::string& reserve, double reserve_quantile, std::uint32_t reserve_window) {
             EnginePlanner p{nullptr, &s, {}, {}, {}, 0, 0, 0};
             if (!max_batch && !max_q_len && !max_top_k) {  // the library path only
               p.planner = std::make_unique<ula::StepPlanner>(*s.space);
               return p;
             }
             ula::EngineStepConfig c;
             c.max_batch = max_batch.value_or(c.max_batch);
             c.max_q_len = max_q_len.value_or(c.max_q_len);
             c.max_top_k = max_top_k.value_or(c.max_top_k);
             c.top_k_multiple = top_k_multiple;
             c.max_rows = max_rows;
             SetReserveMode(c, reserve, reserve_quantile, reserve_window);
             p.planner = Unwrap(ula::StepPlanner::Create(*s.space, c));
             return p;
           }),
           py::arg("space"), py::arg("max_batch") = py::none(), py::arg("max_q_len") = py::none(),
           py::arg("max_top_k") = py::none(), py::arg("top_k_multiple") = 1, py::arg("max_rows") = 0,
           py::arg("reserve") = "guaranteed", py::arg("reserve_quantile") = 0.99, py::arg("reserve_window") = 4096,
           py::keep_alive<1, 2>(),
           "StepPlanner(space): the library path only (step_runs). With any of max_batch, max_q_len, max_top_k "
           "(EngineStepConfig's defaults for the others): the engine path too (step, plan, complete, ...), "
           "refused for a space without stable_new_entries. top_k_multiple=64 refuses any top_k that FlashMLA's "
           "SM90 sparse kernels cannot take. max_rows: the most selection rows of one step (0: max_batch x "
           "max_q_len); a token-budget scheduler sets it to the budget and max_q_len to its largest chunk. reserve: "
           "what reserve_round sets aside per request, 'guaranteed' (the bound: no plan of the round refused for "
           "room) or 'quantile' (reserve_quantile, in (0, 1], of the shares of the bound measured over the last "
           "reserve_window request group steps: fewer slots; a plan may then be refused for room).")
      .def_property_readonly("max_descriptors", [](EnginePlanner& p) { return p.planner->max_descriptors(); })
      .def_property_readonly("has_pending", [](EnginePlanner& p) { return p.planner->has_pending(); })
      .def(
          "set_options",
          [](EnginePlanner& p, std::uint32_t threads, std::uint32_t prefetch_distance,
             std::uint32_t parallel_claim_min_victims) {
            Unwrap(p.planner->SetOptions({threads, prefetch_distance, parallel_claim_min_victims}));
          },
          py::arg("threads") = 1, py::arg("prefetch_distance") = 16,
          py::arg("parallel_claim_min_victims") = ula::StepPlannerOptions::kDefaultParallelClaimMinVictims,
          "Threads of steps 1-3 and their knobs (step_planner.h); InvalidArgumentError keeps the old options, "
          "FailedPreconditionError while a plan is pending.")
      .def_property_readonly("options", [](EnginePlanner& p) {
             const auto& o = p.planner->options();
             return py::dict(py::arg("threads") = o.threads, py::arg("prefetch_distance") = o.prefetch_distance,
                             py::arg("parallel_claim_min_victims") = o.parallel_claim_min_victims);
           }, "The options as a dict (set_options' arguments).")
      .def_property_readonly("counters", [](EnginePlanner& p) {
             const auto& c = p.planner->counters();
             return py::dict(py::arg("claims") = c.claims, py::arg("parallel_claims") = c.parallel_claims,
                             py::arg("victims") = c.victims, py::arg("claim_ns") = c.claim_ns);
           }, "What the planner did besides its results (victim claims), as a dict.")
      .def_property_readonly("last_plan_timing", [](const EnginePlanner& p) {
             return py::dict(py::arg("args_ns") = p.args_ns, py::arg("planner_ns") = p.planner_ns,
                             py::arg("outputs_ns") = p.outputs_ns);
           }, "Where the last successful plan call's time went, in ns: args_ns (views and checks of the arguments), "
              "planner_ns (StepPlanner::Plan, the GIL released, writing the descriptors, records or columns), "
              "outputs_ns (the result). "
              "For measurement (bench/plan_cost.py); a refused call leaves it as it was.")
      .def(
          "step_runs",
          [](EnginePlanner& p, std::uint16_t rank, std::uint16_t group, py::object selections,
             py::object out_slots, const std::vector<std::pair<std::uint64_t, std::uint32_t>>& runs) {
            auto sel = AsIds<ula::LogicalAddr>(View<const std::uint32_t>(ToArray(selections, "selections"), "selections", 1));
            auto out = AsIdsOut<ula::SlotId>(ViewOut<std::uint32_t>(ToArray(out_slots, "out_slots"), "out_slots", 1));
            const auto r = ToRuns(runs);
            py::gil_scoped_release nogil;
            return Unwrap(p.planner->Step({ula::Rank(rank), ula::GroupId(group), sel, r}, out));
          },
          py::arg("rank"), py::arg("group"), py::arg("selections"), py::arg("out_slots"), py::arg("runs"),
          "The library layout: selections uint32 [n] -> out_slots uint32 [n] (device slots), runs the copies; "
          "StepStats. runs: [(request, count), ...] cut the selections into consecutive pieces of one request "
          "each; an address not live for its run's request (freed, reused, another request's) is refused "
          "(NotFoundError).")
      .def(
          "step",
          [](EnginePlanner& p, std::uint16_t rank, std::uint16_t group, py::object selections, py::object indices,
             py::object requests, py::object query_start_loc) {
            const py::array sel_a = ToArray(selections, "selections"), idx_a = ToArray(indices, "indices");
            const StepInput in = StepInputOf(p, sel_a, idx_a, requests, query_start_loc);
            py::gil_scoped_release nogil;
            return Unwrap(p.planner->Step(ula::Rank(rank), ula::GroupId(group), in.shape, in.requests, in.selections,
                                          in.indices));
          },
          py::arg("rank"), py::arg("group"), py::arg("selections"), py::arg("indices"), py::arg("requests"),
          py::arg("query_start_loc") = py::none(),
          "The engine layout on the library path: plan, copy on the backend, publish, write indices. Returns "
          "StepStats. selections "
          "int32 [batch, q_len, top_k] or [batch * q_len, top_k] (SGLang's page_table_1); indices the same "
          "shape; requests int32, uint32, int64 or uint64 [batch] (or one per token row: vLLM's "
          "req_id_per_token). query_start_loc int32 or int64 [batch + 1] (vLLM's): request b owns the rows "
          "[qsl[b], qsl[b+1]) of [tokens, top_k] selections, any q_len each; the rows count against max_batch. "
          "numpy arrays or CPU torch tensors (DLPack).")
      .def(
          "plan",
          [](EnginePlanner& p, std::uint16_t rank, std::uint16_t group, py::object selections, py::object indices,
             py::object descriptors, py::object requests, py::object query_start_loc) {
            const std::int64_t t0 = NowNs();
            const py::array sel_a = ToArray(selections, "selections"), idx_a = ToArray(indices, "indices");
            const StepInput in = StepInputOf(p, sel_a, idx_a, requests, query_start_loc);
            const DescriptorArg desc(descriptors);
            ula::PlannedStep planned;
            const std::int64_t t1 = NowNs();
            std::int64_t t2 = 0;
            {
              py::gil_scoped_release nogil;
              planned = Unwrap(p.planner->Plan(ula::Rank(rank), ula::GroupId(group), in.shape, in.requests,
                                               in.selections, in.indices, desc.sink()));
              t2 = NowNs();
            }
            auto result = std::make_tuple(planned.fence, planned.num_descriptors, planned.stats);
            p.args_ns = t1 - t0;
            p.planner_ns = t2 - t1;
            p.outputs_ns = NowNs() - t2;
            return result;
          },
          py::arg("rank"), py::arg("group"), py::arg("selections"), py::arg("indices"), py::arg("descriptors"),
          py::arg("requests"), py::arg("query_start_loc") = py::none(),
          "Engine path, part 1: (fence, n, StepStats); descriptors[:n] are the copies to run. Shapes, requests "
          "and query_start_loc as step (an address not live for its row's request: NotFoundError). descriptors: "
          "a DESCRIPTOR_DTYPE array, or a dict of columns {field: int32 or int64 [rows]} (offsets int64; "
          "descriptor_columns() makes one) whose first n entries the plan writes.")
      .def(
          "reserve_round",
          [](EnginePlanner& p, std::uint16_t rank, py::object requests, py::object new_tokens,
             py::object max_selections) {
            const py::array req_a = ToArray(requests, "requests");
            auto req = RequestsView(req_a, "requests", p.ids);
            auto fresh = View<const std::uint32_t>(ToArray(new_tokens, "new_tokens"), "new_tokens", 1);
            auto sel = View<const std::uint32_t>(ToArray(max_selections, "max_selections"), "max_selections", 1);
            if (fresh.size() != req.size() || sel.size() != req.size()) {
              Throw(ula::ErrorCode::kInvalidArgument, "reserve_round: requests, new_tokens and max_selections differ in length");
            }
            std::vector<ula::RoundDemand> demands(req.size());
            for (std::size_t i = 0; i < req.size(); ++i) demands[i] = {req[i], fresh[i], sel[i]};
            auto r = Unwrap(p.planner->ReserveRound(ula::Rank(rank), demands));
            return std::make_tuple(r.device_needed, r.device_room);
          },
          py::arg("rank"), py::arg("requests"), py::arg("new_tokens"), py::arg("max_selections"),
          "Admission that guarantees the round: (device_needed, device_room) of the largest group, or "
          "ResourceExhaustedError with the numbers (schedule fewer requests). new_tokens, max_selections: uint32 [n]. "
          "Over kind frames new_tokens are the round's tokens, and the frames their other kinds take are counted.")
      .def(
          "complete",
          [](EnginePlanner& p, std::uint64_t fence, py::object status) {
            auto st = View<const std::uint8_t>(ToArray(status, "status"), "status", 1);
            py::gil_scoped_release nogil;
            auto r = Unwrap(p.planner->Complete(fence, st));
            return std::make_tuple(r.published, r.failed);
          },
          py::arg("fence"), py::arg("status"),
          "Engine path, part 2: status uint8 [n], 0 = done. Publishes the done ones; (published, failed).")
      .def(
          "register_engine_memory",
          [](EnginePlanner& p, const std::string& tier, std::uint16_t rank, std::uint16_t group, py::object memory) {
            // The bytes of a space whose backend holds them ('cpu') live in the backend's pools:
            // engine memory would be a second, stale copy that read() and device_pool() ignore.
            if (p.space->backend.get().holds_bytes()) {
              Throw(ula::ErrorCode::kFailedPrecondition,
                    "register_engine_memory: this space's backend holds the bytes ('cpu'); engine-owned memory needs "
                    "a space made with backend='counting' (it keeps metadata only)");
            }
            EngineMemoryArg mem = ToEngineMemory(memory, p.space->space->config().row());
            Unwrap(p.planner->RegisterEngineMemory(ParseTier(tier), ula::Rank(rank), ula::GroupId(group), mem.bases,
                                                   mem.layer_bytes, mem.slots));
            for (auto& k : mem.keep) p.registered.push_back(std::move(k));
          },
          py::arg("tier"), py::arg("rank"), py::arg("group"), py::arg("memory"),
          "Registers engine-owned memory of a pool on a 'counting' space: one C-contiguous array [num_layers, "
          "<layer>], or the group's per-layer arrays <layer> as a list (SGLang) or a dict in layer order "
          "(vLLM's register_kv_caches), each allocated on its own (any addresses). A <layer> is [slots, row_bytes] "
          "(SGLang), [num_blocks, block_size, row_bytes] (vLLM) or any shape whose last dimensions make one row "
          "of row() bytes, in any dtype taken as bytes (uint8, bf16, fp8). numpy or CPU torch. Kept alive by the "
          "planner.")
      .def(
          "execute_on_engine_memory",
          [](EnginePlanner& p, py::object descriptors, py::object status) {
            std::vector<ula::CopyDescriptor> gathered;
            const DescriptorArg arg(descriptors, gathered);
            const std::span<const ula::CopyDescriptor> desc = arg.records();
            auto st = ViewOut<std::uint8_t>(ToArray(status, "status"), "status", 1);
            if (st.size() != desc.size()) Throw(ula::ErrorCode::kInvalidArgument, "status and descriptors differ in length");
            py::gil_scoped_release nogil;
            p.planner->ExecuteOnEngineMemory(desc, st);
          },
          py::arg("descriptors"), py::arg("status"),
          "Runs descriptors (records, or a dict of columns of equal length) over the registered memory (CPU "
          "reference executor); status[i] = 0 if done.");
}

}  // namespace

void BindSparse(py::module_& m) {
  BindFaults(m);
  BindStats(m);
  BindDescriptorDtype(m);
  BindAddressSpaceConfig(m);
  BindAddressSpace(m);
  BindStepPlanner(m);
}

}  // namespace ulapy

// The kinds of KV a DP space holds (DeepSeek-V4: include/ula/kv_kinds.h; docs/ARCHITECTURE.md,
// "Kinds"): KvKind and its enums, a request's page table of one kind (KindPages, its block ids
// a read-only int32 view), the budget over frames (KindBudget), the kinds' fields of
// AddressSpaceConfig and calls of AddressSpace, and the V4 kinds and space config of a model
// config (src/config/model_kinds.h). Thin: every call converts, calls one C++ function and
// raises the library's error.
#include <pybind11/operators.h>
#include <pybind11/stl.h>

#include <optional>

#include "bind_common.h"
#include "config/kind_bytes.h"
#include "config/model_kinds.h"
#include "space/kind_frames.h"
#include "ula/address_space.h"
#include "ula/kv_kinds.h"

namespace ulapy {
namespace {

ula::KvStorageFormat ParseKvFormat(const std::string& name) {
  if (name == "fp8_packed") return ula::KvStorageFormat::kFp8Packed;
  if (name == "fp8_uniform") return ula::KvStorageFormat::kFp8Uniform;
  if (name == "bf16") return ula::KvStorageFormat::kBf16;
  Throw(ula::ErrorCode::kInvalidArgument, "kv_format: '" + name + "' is not 'fp8_packed', 'fp8_uniform' or 'bf16'");
  return ula::KvStorageFormat::kFp8Packed;
}

ula::IndexKeyFormat ParseIndexFormat(const std::string& name) {
  if (name == "fp8") return ula::IndexKeyFormat::kFp8;
  if (name == "fp4") return ula::IndexKeyFormat::kFp4;
  Throw(ula::ErrorCode::kInvalidArgument, "index_format: '" + name + "' is not 'fp8' or 'fp4'");
  return ula::IndexKeyFormat::kFp8;
}

ula::ModelKindsOptions KindsOptions(const std::string& kv_format, const std::string& index_format,
                                    std::uint32_t max_draft_tokens) {
  return {.kv_format = ParseKvFormat(kv_format), .index_format = ParseIndexFormat(index_format),
          .max_draft_tokens = max_draft_tokens};
}

void BindKindTypes(py::module_& m) {
  py::enum_<ula::KindLifetime>(m, "KindLifetime", "How long a kind's entries live (ula/kv_kinds.h).")
      .value("ring", ula::KindLifetime::kRing)
      .value("append", ula::KindLifetime::kAppend)
      .value("per_request", ula::KindLifetime::kPerRequest);
  py::enum_<ula::KindPlacement>(m, "KindPlacement", "Where a kind's entries sit (ula/kv_kinds.h).")
      .value("sparse", ula::KindPlacement::kSparse)
      .value("resident", ula::KindPlacement::kResident);

  py::class_<ula::KvKind>(m, "KvKind", R"doc(
One kind of KV a space holds (include/ula/kv_kinds.h): tokens per entry, lifetime (a ring of
the window plus the draft tokens a round may roll back, append, or per-request state rows),
layers and row bytes, the kind it accompanies (companion_of: None or an earlier kind's index)
and placement. AddressSpaceConfig.validate() (or validate_kinds) refuses an inconsistent list,
naming the field.)doc")
      .def(py::init([](std::string name, std::uint32_t tokens_per_entry, ula::KindLifetime lifetime,
                       std::uint32_t ring_tokens, std::uint32_t ring_draft_tokens, std::uint32_t state_rows,
                       std::uint32_t layers, std::uint32_t row_bytes, std::optional<std::uint32_t> companion_of,
                       ula::KindPlacement placement) {
             return ula::KvKind{.name = std::move(name), .tokens_per_entry = tokens_per_entry, .lifetime = lifetime,
                                .ring_tokens = ring_tokens, .ring_draft_tokens = ring_draft_tokens,
                                .state_rows = state_rows, .layers = layers, .row_bytes = row_bytes,
                                .companion_of = companion_of.value_or(ula::kNoCompanion), .placement = placement};
           }),
           py::arg("name"), py::arg("tokens_per_entry") = 1, py::arg("lifetime") = ula::KindLifetime::kAppend,
           py::arg("ring_tokens") = 0, py::arg("ring_draft_tokens") = 0, py::arg("state_rows") = 0,
           py::arg("layers") = 0, py::arg("row_bytes") = 0, py::arg("companion_of") = py::none(),
           py::arg("placement") = ula::KindPlacement::kResident)
      .def_readwrite("name", &ula::KvKind::name)
      .def_readwrite("tokens_per_entry", &ula::KvKind::tokens_per_entry)
      .def_readwrite("lifetime", &ula::KvKind::lifetime)
      .def_readwrite("ring_tokens", &ula::KvKind::ring_tokens)
      .def_readwrite("ring_draft_tokens", &ula::KvKind::ring_draft_tokens)
      .def_readwrite("state_rows", &ula::KvKind::state_rows)
      .def_readwrite("layers", &ula::KvKind::layers)
      .def_readwrite("row_bytes", &ula::KvKind::row_bytes)
      .def_property(
          "companion_of",
          [](const ula::KvKind& k) -> std::optional<std::uint32_t> {
            if (k.companion_of == ula::kNoCompanion) return std::nullopt;
            return k.companion_of;
          },
          [](ula::KvKind& k, std::optional<std::uint32_t> c) { k.companion_of = c.value_or(ula::kNoCompanion); },
          "The index of the kind this one accompanies, or None.")
      .def_readwrite("placement", &ula::KvKind::placement)
      .def("entry_bytes", &ula::KvKind::entry_bytes, "Bytes of one entry over the kind's layers (per_request: of one state row).")
      .def(py::self == py::self)
      .def("__repr__", [](const ula::KvKind& k) {
        return "KvKind(name='" + k.name + "', tokens_per_entry=" + std::to_string(k.tokens_per_entry) + ", lifetime=" +
               std::string(ula::ToString(k.lifetime)) + ", layers=" + std::to_string(k.layers) +
               ", row_bytes=" + std::to_string(k.row_bytes) + ", placement=" + std::string(ula::ToString(k.placement)) +
               ")";
      });

  py::class_<ula::KindPages>(m, "KindPages", R"doc(
A request's entries of one kind as an engine indexes them (AddressSpace.kind_pages_of): its
tokens, live entries, entries_per_block, a ring's first live offset in blocks[0], the tokens
in no entry yet (filling_tokens), and blocks: the block ids in order, a read-only int32 view.)doc")
      .def_readonly("tokens", &ula::KindPages::tokens)
      .def_readonly("entries", &ula::KindPages::entries)
      .def_readonly("entries_per_block", &ula::KindPages::entries_per_block)
      .def_readonly("first_offset", &ula::KindPages::first_offset)
      .def_readonly("filling_tokens", &ula::KindPages::filling_tokens)
      .def_property_readonly(
          "blocks",
          [](py::object self) {
            const auto& blocks = self.cast<const ula::KindPages&>().blocks;
            py::array_t<std::int32_t> view({static_cast<py::ssize_t>(blocks.size())},
                                           reinterpret_cast<const std::int32_t*>(blocks.data()), self);
            py::detail::array_proxy(view.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
            return view;
          },
          "int32 [ceil((first_offset + entries) / entries_per_block)] block ids (no copy; keeps the pages alive).")
      .def(py::self == py::self)
      .def("__repr__", [](const ula::KindPages& p) {
        return "KindPages(tokens=" + std::to_string(p.tokens) + ", entries=" + std::to_string(p.entries) +
               ", entries_per_block=" + std::to_string(p.entries_per_block) + ", first_offset=" +
               std::to_string(p.first_offset) + ", filling_tokens=" + std::to_string(p.filling_tokens) +
               ", blocks=" + std::to_string(p.blocks.size()) + ")";
      });

  py::class_<ula::KindBlockCopy>(m, "KindBlockCopy", R"doc(
A copy a shared prefix needs (AddressSpace.share_prefix): entries [0, entries) of kind `kind`'s
block src_block to the same offsets of dst_block, on every layer of the kind.)doc")
      .def_readonly("kind", &ula::KindBlockCopy::kind)
      .def_readonly("src_block", &ula::KindBlockCopy::src_block)
      .def_readonly("dst_block", &ula::KindBlockCopy::dst_block)
      .def_readonly("entries", &ula::KindBlockCopy::entries)
      .def(py::self == py::self);

  py::class_<ula::PrefixShare>(m, "PrefixShare", R"doc(
A prefix adopted in whole blocks of every kind (AddressSpace.share_prefix): resume_from, the
token the request's next allocate starts at, and copies, the engine's copies to run first.)doc")
      .def_readonly("resume_from", &ula::PrefixShare::resume_from)
      .def_readonly("copies", &ula::PrefixShare::copies);

  py::class_<ula::KindBudget>(m, "KindBudget", "How one rank's budget of kind frames is shared now (AddressSpace.kind_budget_of).")
      .def_readonly("frames", &ula::KindBudget::frames)
      .def_readonly("free_frames", &ula::KindBudget::free_frames, "Frames no kind holds: the C4 share.")
      .def_readonly("frames_of_kind", &ula::KindBudget::frames_of_kind, "[kinds] (the sparse kind's: 0)")
      .def_readonly("c4_device_slots", &ula::KindBudget::c4_device_slots, "Per group: the free frames' C4 slots.")
      .def_readonly("c4_entries", &ula::KindBudget::c4_entries, "C4 entries of every request.")
      .def_readonly("c4_on_device", &ula::KindBudget::c4_on_device, "Of them on device (the same in every group).");
}

namespace {
// A LayerView as a read-only strided numpy array that keeps `owner` (the space) alive.
py::array_t<std::uint8_t> LayerArray(const ula::LayerView& v, py::object owner) {
  if (v.base == nullptr) Throw(ula::ErrorCode::kUnsupported, "the backend holds no bytes");
  py::array_t<std::uint8_t> view({static_cast<py::ssize_t>(v.blocks), static_cast<py::ssize_t>(v.rows),
                                  static_cast<py::ssize_t>(v.row_bytes)},
                                 {static_cast<py::ssize_t>(v.block_stride), static_cast<py::ssize_t>(v.row_bytes),
                                  py::ssize_t{1}},
                                 reinterpret_cast<const std::uint8_t*>(v.base), owner);
  py::detail::array_proxy(view.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return view;
}
}  // namespace

void BindKindCalls(py::module_& m) {
  auto config = py::reinterpret_borrow<py::class_<ula::AddressSpaceConfig>>(m.attr("AddressSpaceConfig"));
  config
      .def_readwrite("kinds", &ula::AddressSpaceConfig::kinds,
                     "The kinds of KV the space holds (a list of KvKind; empty: one kind). Assign a whole list: "
                     "the getter returns a copy.")
      .def_readwrite("kind_frame_bytes", &ula::AddressSpaceConfig::kind_frame_bytes,
                     "With kinds: 0 keeps the kinds other than the sparse one as logical block ids; otherwise every "
                     "kind is carved from device_bytes_per_rank in frames of this size (KIND_FRAME_BYTES suits V4-Flash).");

  auto space = py::reinterpret_borrow<py::class_<DpSpace>>(m.attr("AddressSpace"));
  space
      .def(
          "kind_pages_of",
          [](DpSpace& s, std::uint64_t request, std::uint32_t kind) {
            return Unwrap(s.space->KindPagesOf(ula::RequestId(request), kind));
          },
          py::arg("request"), py::arg("kind"),
          "A space with kinds: the request's page table of kind `kind` (KindPages). FailedPreconditionError (no "
          "kinds), NotFoundError (request), OutOfRangeError (kind).")
      .def(
          "share_prefix",
          [](DpSpace& s, std::uint64_t request, std::uint64_t source, std::uint32_t tokens) {
            return Unwrap(s.space->SharePrefix(ula::RequestId(request), ula::RequestId(source), tokens));
          },
          py::arg("request"), py::arg("source"), py::arg("tokens"),
          "A space with kinds: the new request adopts the source's prefix of `tokens` tokens in whole blocks of "
          "every kind (PrefixShare: it resumes from resume_from; docs/ARCHITECTURE.md, \"Kinds\"). "
          "FailedPreconditionError, NotFoundError, InvalidArgumentError, OutOfRangeError, UnsupportedError.")
      .def(
          "kind_budget_of", [](DpSpace& s) { return Unwrap(s.space->KindBudgetOf()); },
          "A space with kind frames: how its budget is shared now (KindBudget). FailedPreconditionError without.")
      .def(
          "device_layer_view",
          [](py::object self, std::uint32_t rank, std::uint32_t group, std::uint32_t layer) {
            DpSpace& s = self.cast<DpSpace&>();
            return LayerArray(Unwrap(s.space->DeviceLayerView(ula::Rank(static_cast<std::uint16_t>(rank)),
                                                              ula::GroupId(static_cast<std::uint16_t>(group)), layer)),
                              self);
          },
          py::arg("rank"), py::arg("group"), py::arg("layer"),
          "Read-only uint8 [blocks, 64, row_bytes] strided view of one layer of (rank, group)'s device slots: slot s "
          "is [s // 64, s % 64], the step's indices as FlashMLA reads them; in a space with kind frames the C4 "
          "blocks among the other kinds' in the budget's buffer. OutOfRangeError; UnsupportedError on a backend "
          "without bytes.")
      .def(
          "kind_layer_view",
          [](py::object self, std::uint32_t kind, std::uint32_t layer) {
            DpSpace& s = self.cast<DpSpace&>();
            return LayerArray(Unwrap(s.space->KindLayerView(kind, layer)), self);
          },
          py::arg("kind"), py::arg("layer"),
          "A space with kind frames: read-only uint8 [blocks, rows, row_bytes] strided view of layer `layer` of a "
          "resident kind, indexed by kind_pages_of's block ids. FailedPreconditionError (no frames), "
          "OutOfRangeError, InvalidArgumentError (the sparse kind: device_layer_view); UnsupportedError without bytes.")
      .def(
          "compact_kind",
          [](DpSpace& s, std::uint32_t kind) {
            py::gil_scoped_release nogil;
            return Unwrap(s.space->CompactKind(kind));
          },
          py::arg("kind"),
          "Empties kind `kind`'s sparsest frames into its others and returns them to the budget; the frames "
          "returned. FailedPreconditionError (no kind frames, a plan pending), OutOfRangeError, InvalidArgumentError "
          "(the sparse kind).");

  m.attr("KIND_BLOCK_ENTRIES") = ula::kKindBlockEntries;
  m.attr("KIND_FRAME_BYTES") = ula::kKindFrameBytes;
  m.def(
      "validate_kinds", [](const std::vector<ula::KvKind>& kinds) { Unwrap(ula::ValidateKinds(kinds)); },
      py::arg("kinds"), "InvalidArgumentError naming the first bad field ('kinds[2].companion_of') and the rule.");
  m.def(
      "kinds_of_model",
      [](const ula::ModelConfig& model, const std::string& kv_format, const std::string& index_format,
         std::uint32_t max_draft_tokens) {
        return Unwrap(ula::KindsOfModel(model, KindsOptions(kv_format, index_format, max_draft_tokens)));
      },
      py::arg("model"), py::arg("kv_format") = "fp8_packed", py::arg("index_format") = "fp8",
      py::arg("max_draft_tokens") = 0,
      "The kinds of a layer-kind model (DeepSeek-V4: window, c4, c4_index_key, c128, c4_state, c4_index_state, "
      "c128_state) in the storage formats named. FailedPreconditionError for a model without layer kinds.");
  m.def(
      "space_config_of_model",
      [](const ula::ModelConfig& model, const ula::AddressSpaceConfig& base, const std::string& kv_format,
         const std::string& index_format, std::uint32_t max_draft_tokens) {
        return Unwrap(ula::SpaceConfigOfModel(model, KindsOptions(kv_format, index_format, max_draft_tokens), base));
      },
      py::arg("model"), py::arg("base") = ula::AddressSpaceConfig{}, py::arg("kv_format") = "fp8_packed",
      py::arg("index_format") = "fp8", py::arg("max_draft_tokens") = 0,
      "A DP space config holding the model's kinds: one group per compressed-sparse layer, row_bytes the c4 row; "
      "ranks, budgets, kind_frame_bytes and modes from `base`.");
}

}  // namespace

void BindKinds(py::module_& m) {
  BindKindTypes(m);
  BindKindCalls(m);
}

}  // namespace ulapy

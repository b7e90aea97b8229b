// Shared helpers of the `ulacache` bindings. The bindings are thin: they convert arguments
// (numpy arrays and DLPack tensors such as torch's are viewed, never copied or cast),
// release the GIL around calls that plan or move bytes, call one C++ function, and turn a
// ula::Error into a ulacache.Error subclass (defined in python/ulacache/__init__.py)
// carrying the code and the message.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "ula/selection_run.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <string>
#include <utility>
#include <vector>

#include "backend/fault_backend.h"
#include "ula/descriptor_sink.h"
#include "ula/step_planner.h"
#include "ula/error.h"
#include "ula/ids.h"

namespace ulapy {

namespace py = pybind11;

// Thrown by Unwrap; the module's translator raises the matching ulacache exception.
struct UlaException {
  ula::Error error;
};

inline void Throw(ula::ErrorCode code, std::string message) { throw UlaException{ula::Error(code, std::move(message))}; }

template <class T>
T Unwrap(ula::Result<T>&& r) {
  if (!r) throw UlaException{std::move(r).error()};
  if constexpr (!std::is_void_v<T>) return std::move(*r);
}

// EngineStepConfig's reservation fields from the planners' keyword arguments (validated by
// Create: a bad quantile or window is refused there, naming the field).
inline void SetReserveMode(ula::EngineStepConfig& c, const std::string& reserve, double quantile, std::uint32_t window) {
  if (reserve == "guaranteed") {
    c.reserve = ula::ReserveMode::kGuaranteed;
  } else if (reserve == "quantile") {
    c.reserve = ula::ReserveMode::kQuantile;
  } else {
    Throw(ula::ErrorCode::kInvalidArgument,
          "EngineStepConfig.reserve: '" + reserve + "' is not 'guaranteed' or 'quantile'");
  }
  c.reserve_quantile = quantile;
  c.reserve_window = window;
}

// Raises InvalidArgumentError unless `a` is C-contiguous (and writable if asked).
inline void CheckLayout(const py::array& a, const char* what, bool writable) {
  if (!(a.flags() & py::array::c_style)) {
    Throw(ula::ErrorCode::kInvalidArgument, std::string(what) + ": must be C-contiguous");
  }
  if (writable && !a.writeable()) Throw(ula::ErrorCode::kInvalidArgument, std::string(what) + ": must be writable");
}

// A C-contiguous view of `a` as T elements (dtype must be exactly T's), with `ndim`
// dimensions (-1: any). Bad input raises InvalidArgumentError naming `what`.
template <class T>
std::span<T> View(const py::array& a, const char* what, int ndim = -1, bool writable = false) {
  // Equivalent dtypes (numpy's PyArray_EquivTypes, what pybind11's array_t uses), not only
  // the identical dtype object: an unpickled int32 is a new object that equals int32.
  if (!py::detail::npy_api::get().PyArray_EquivTypes_(a.dtype().ptr(), py::dtype::of<std::remove_const_t<T>>().ptr())) {
    Throw(ula::ErrorCode::kInvalidArgument, std::string(what) + ": dtype must be " +
                                                std::string(py::str(py::dtype::of<std::remove_const_t<T>>())) + ", got " +
                                                std::string(py::str(a.dtype())));
  }
  if (ndim >= 0 && a.ndim() != ndim) {
    Throw(ula::ErrorCode::kInvalidArgument,
          std::string(what) + ": must have " + std::to_string(ndim) + " dimensions, got " + std::to_string(a.ndim()));
  }
  CheckLayout(a, what, writable);
  auto* p = writable ? static_cast<T*>(const_cast<py::array&>(a).mutable_data()) : const_cast<T*>(static_cast<const T*>(a.data()));
  return std::span<T>(p, static_cast<std::size_t>(a.size()));
}
template <class T>
std::span<T> ViewOut(const py::array& a, const char* what, int ndim = -1) {
  return View<T>(a, what, ndim, /*writable=*/true);
}

// The DLPack ABI (dmlc/dlpack, v0.x "dltensor" capsules, what torch 1.10+ and numpy
// 1.22+ export through __dlpack__): the fields this module reads.
struct DLDeviceAbi {
  std::int32_t device_type;  // 1 CPU, 2 CUDA, 3 CUDA host (pinned)
  std::int32_t device_id;
};
struct DLDataTypeAbi {
  std::uint8_t code;  // 0 int, 1 uint, 2 float
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct DLTensorAbi {
  void* data;
  DLDeviceAbi device;
  std::int32_t ndim;
  DLDataTypeAbi dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // in elements; null: C-contiguous
  std::uint64_t byte_offset;
};
struct DLManagedTensorAbi {
  DLTensorAbi dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorAbi*);
};

// The numpy dtype string of a DLPack dtype ("i4", "f2", "?"), or "" where numpy has none
// (bfloat16: code 4; the float8 and smaller kinds: codes 7 and up; opaque handles).
inline std::string NumpyKindOf(const DLDataTypeAbi& d) {
  const unsigned bytes = d.bits / 8u;
  switch (d.code) {
    case 0:
    case 1:
      if (d.bits % 8 == 0 && (bytes == 1 || bytes == 2 || bytes == 4 || bytes == 8)) {
        return std::string(d.code == 0 ? "i" : "u") + std::to_string(bytes);
      }
      return "";
    case 2: return (d.bits == 16 || d.bits == 32 || d.bits == 64) ? "f" + std::to_string(bytes) : "";
    case 5: return (d.bits == 64 || d.bits == 128) ? "c" + std::to_string(bytes) : "";
    case 6: return d.bits == 8 ? "?" : "";
    default: return "";
  }
}

inline const char* DlDeviceName(std::int32_t type) {
  switch (type) {
    case 1: return "cpu";
    case 2: return "cuda";
    case 3: return "cuda_host";
    case 10: return "rocm";
    default: return "another device";
  }
}

// How ToArray treats a DLPack dtype that numpy has no equivalent of (bfloat16, the float8
// kinds): refused (kExact, for arrays whose values are read) or viewed as its bytes
// (kBytes: uint8 with one more trailing dimension of the element's size, for memory whose
// bytes only are moved: engine-owned KV caches).
enum class DtypeUse { kExact, kBytes };

// Why a CUDA tensor is refused: every binding reads and writes its arrays on the host (the
// planners read selections and write indices on the CPU; registered engine memory is written
// by the CPU reference executor and by Allocate's moves). The device step (device_step.h)
// is what takes device memory, and Python does not bind it.
inline std::string CudaRefusal(const std::string& what, const std::string& where) {
  return what + ": " + where + "; the Python planners read and write their arrays on the host (selections, "
                "indices, descriptors, and registered engine memory, which Allocate's moves copy with the CPU) "
                "and no space this module makes holds device memory: pass a CPU tensor";
}

// Whether obj is a torch.Tensor, where torch is imported already (this never imports it).
inline bool IsTorchTensor(py::handle obj) {
  PyObject* torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");  // borrowed
  if (torch == nullptr) return false;
  PyObject* tensor = PyObject_GetAttrString(torch, "Tensor");
  if (tensor == nullptr) {
    PyErr_Clear();
    return false;
  }
  const int is = PyObject_IsInstance(obj.ptr(), tensor);
  Py_DECREF(tensor);
  if (is < 0) PyErr_Clear();
  return is == 1;
}

// A numpy view of `obj`, never a copy: a numpy array as it is; a tensor exporting
// __dlpack__ (torch, CPU or pinned host memory) as an array over the same memory that
// keeps the producer's buffer alive. Device memory (a __cuda_array_interface__ or a
// DLPack CUDA device) raises UnsupportedError (CudaRefusal). Anything else raises
// InvalidArgumentError.
inline py::array ToArray(py::handle obj, const char* what, DtypeUse use = DtypeUse::kExact) {
  if (py::isinstance<py::array>(obj)) return py::reinterpret_borrow<py::array>(obj);
  // A torch tensor on the CPU: Tensor.numpy() is one C call over the same memory (it never
  // copies: it raises instead), where __dlpack__ and __dlpack_device__ are Python functions
  // of torch's, several microseconds per argument. What it refuses (a CUDA tensor, bfloat16,
  // one that requires grad) goes the DLPack way below, which views it or says why not.
  if (IsTorchTensor(obj)) {
    PyObject* view = PyObject_CallMethod(obj.ptr(), "numpy", nullptr);
    if (view != nullptr && py::isinstance<py::array>(view)) return py::reinterpret_steal<py::array>(view);
    Py_XDECREF(view);
    PyErr_Clear();
  }
  const std::string name(what);
  if (py::hasattr(obj, "__cuda_array_interface__")) {
    Throw(ula::ErrorCode::kUnsupported, CudaRefusal(name, "a CUDA array (__cuda_array_interface__)"));
  }
  if (!py::hasattr(obj, "__dlpack__")) {
    Throw(ula::ErrorCode::kInvalidArgument, name + ": expected a numpy array or a tensor with __dlpack__ (torch), got " +
                                                std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
  }
  if (py::hasattr(obj, "__dlpack_device__")) {
    const auto dev = obj.attr("__dlpack_device__")().cast<py::tuple>();
    const auto type = dev[0].cast<std::int32_t>();
    if (type != 1 && type != 3) {
      Throw(ula::ErrorCode::kUnsupported, CudaRefusal(name, std::string("a tensor on ") + DlDeviceName(type) + " memory"));
    }
  }
  py::object cap = obj.attr("__dlpack__")();
  if (!PyCapsule_IsValid(cap.ptr(), "dltensor")) {
    Throw(ula::ErrorCode::kInvalidArgument, name + ": __dlpack__ did not return an unused 'dltensor' capsule");
  }
  auto* managed = static_cast<DLManagedTensorAbi*>(PyCapsule_GetPointer(cap.ptr(), "dltensor"));
  // From here this view owns the managed tensor (the DLPack consumer's duty): the capsule
  // is marked used so that its own destructor does not free it.
  PyCapsule_SetName(cap.ptr(), "used_dltensor");
  py::capsule owner(managed, [](void* p) {
    auto* m = static_cast<DLManagedTensorAbi*>(p);
    if (m->deleter != nullptr) m->deleter(m);
  });
  const DLTensorAbi& t = managed->dl_tensor;
  const std::string numpy_kind = NumpyKindOf(t.dtype);
  const bool as_bytes = numpy_kind.empty();
  if (t.dtype.lanes != 1 || t.dtype.bits == 0 || t.dtype.bits % 8 != 0 || (as_bytes && use != DtypeUse::kBytes)) {
    Throw(ula::ErrorCode::kInvalidArgument,
          name + ": DLPack dtype (code " + std::to_string(t.dtype.code) + ", " + std::to_string(t.dtype.bits) +
              " bits, " + std::to_string(t.dtype.lanes) + " lanes) has no numpy equivalent" +
              (use == DtypeUse::kBytes ? " and is not whole bytes" : ", and this argument's values are read"));
  }
  const py::ssize_t item = t.dtype.bits / 8;
  std::vector<py::ssize_t> shape(t.shape, t.shape + t.ndim);
  std::vector<py::ssize_t> strides(static_cast<std::size_t>(t.ndim));
  py::ssize_t contiguous = item;
  for (int d = t.ndim - 1; d >= 0; --d) {
    strides[d] = t.strides != nullptr ? static_cast<py::ssize_t>(t.strides[d]) * item : contiguous;
    contiguous *= shape[d];
  }
  if (as_bytes) {  // bfloat16, float8, ...: the same memory as uint8 [..., item]
    shape.push_back(item);
    strides.push_back(1);
  }
  auto* data = static_cast<char*>(t.data) + t.byte_offset;
  return py::array(as_bytes ? py::dtype("u1") : py::dtype(numpy_kind), shape, strides, data, owner);
}

// Request ids of a step, any integer width: uint64 or int64 [batch] (torch's
// req_pool_indices) are viewed as they are; int32 or uint32 (vLLM's req_id_per_token) are
// widened into `scratch` (a negative id is refused). The span is valid while `a` and
// `scratch` are.
inline std::span<const ula::RequestId> RequestsView(const py::array& a, const char* what,
                                                    std::vector<ula::RequestId>& scratch) {
  static_assert(sizeof(ula::RequestId) == sizeof(std::uint64_t));
  const auto* api = &py::detail::npy_api::get();
  auto is = [&](py::dtype d) { return api->PyArray_EquivTypes_(a.dtype().ptr(), d.ptr()); };
  const bool wide = is(py::dtype::of<std::int64_t>()) || is(py::dtype::of<std::uint64_t>());
  const bool narrow_signed = is(py::dtype::of<std::int32_t>());
  if (!wide && !narrow_signed && !is(py::dtype::of<std::uint32_t>())) {
    Throw(ula::ErrorCode::kInvalidArgument, std::string(what) + ": dtype must be int32, uint32, int64 or uint64, got " +
                                                std::string(py::str(a.dtype())));
  }
  if (a.ndim() != 1) Throw(ula::ErrorCode::kInvalidArgument, std::string(what) + ": must have 1 dimensions");
  CheckLayout(a, what, false);
  const auto n = static_cast<std::size_t>(a.size());
  if (wide) return {static_cast<const ula::RequestId*>(a.data()), n};
  scratch.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t v = 0;
    if (narrow_signed) {
      const std::int32_t x = static_cast<const std::int32_t*>(a.data())[i];
      if (x < 0) Throw(ula::ErrorCode::kInvalidArgument, std::string(what) + "[" + std::to_string(i) + "] = " +
                                                              std::to_string(x) + ": request ids are non-negative");
      v = static_cast<std::uint64_t>(x);
    } else {
      v = static_cast<const std::uint32_t*>(a.data())[i];
    }
    scratch[i] = ula::RequestId(v);
  }
  return {scratch.data(), n};
}

// One int32 or int64 1-D array as int64 values (query_start_loc, addresses), read by index.
struct IntColumn {
  const void* data = nullptr;
  std::size_t size = 0;
  bool is64 = false;
  std::int64_t operator[](std::size_t i) const {
    return is64 ? static_cast<const std::int64_t*>(data)[i] : std::int64_t{static_cast<const std::int32_t*>(data)[i]};
  }
};
inline IntColumn IntColumnView(const py::array& a, const char* what) {
  const auto* api = &py::detail::npy_api::get();
  const bool is64 = api->PyArray_EquivTypes_(a.dtype().ptr(), py::dtype::of<std::int64_t>().ptr());
  if (!is64 && !api->PyArray_EquivTypes_(a.dtype().ptr(), py::dtype::of<std::int32_t>().ptr())) {
    Throw(ula::ErrorCode::kInvalidArgument,
          std::string(what) + ": dtype must be int32 or int64, got " + std::string(py::str(a.dtype())));
  }
  if (a.ndim() != 1) Throw(ula::ErrorCode::kInvalidArgument, std::string(what) + ": must have 1 dimensions");
  CheckLayout(a, what, false);
  return {a.data(), static_cast<std::size_t>(a.size()), is64};
}

// vLLM's flat batch: selections [tokens, top_k] whose request b owns the rows
// [query_start_loc[b], query_start_loc[b + 1]) (any q_len per request: prefill chunks
// beside decodes). The planner's row is its batch row (StepArrays::row_batch's meaning,
// step_arrays.h), so each token row gets its request in `out` and the step's shape is
// [tokens, 1, top_k]: the rows count against the planner's max_batch.
inline void RowRequests(std::span<const ula::RequestId> requests, const IntColumn& qsl, std::size_t rows,
                        std::vector<ula::RequestId>& out) {
  if (qsl.size != requests.size() + 1) {
    Throw(ula::ErrorCode::kInvalidArgument, "query_start_loc: needs len(requests) + 1 = " +
                                                std::to_string(requests.size() + 1) + " entries, got " +
                                                std::to_string(qsl.size));
  }
  if (qsl[0] != 0 || qsl[qsl.size - 1] != static_cast<std::int64_t>(rows)) {
    Throw(ula::ErrorCode::kInvalidArgument, "query_start_loc: must start at 0 and end at the selections' rows (" +
                                                std::to_string(rows) + "), got " + std::to_string(qsl[0]) + " .. " +
                                                std::to_string(qsl[qsl.size - 1]));
  }
  out.resize(rows);
  for (std::size_t b = 0; b < requests.size(); ++b) {
    const std::int64_t lo = qsl[b], hi = qsl[b + 1];
    if (hi < lo) {
      Throw(ula::ErrorCode::kInvalidArgument, "query_start_loc: decreases at " + std::to_string(b + 1) + " (" +
                                                  std::to_string(lo) + " then " + std::to_string(hi) + ")");
    }
    for (std::int64_t r = lo; r < hi; ++r) out[static_cast<std::size_t>(r)] = requests[b];
  }
}

// The StepShape of selections [batch, q_len, top_k], or of SGLang's flat page_table_1
// [tokens, top_k] with tokens = batch * q_len (batch = len(requests), rows of one request
// consecutive).
inline ula::StepShape ShapeOf(const py::array& sel, std::size_t batch) {
  if (sel.ndim() == 3) {
    return {static_cast<std::uint32_t>(sel.shape(0)), static_cast<std::uint32_t>(sel.shape(1)),
            static_cast<std::uint32_t>(sel.shape(2))};
  }
  if (sel.ndim() != 2) {
    Throw(ula::ErrorCode::kInvalidArgument, "selections: must be [batch, q_len, top_k] or [tokens, top_k], got " +
                                                std::to_string(sel.ndim()) + " dimensions");
  }
  const auto tokens = static_cast<std::size_t>(sel.shape(0));
  if (batch == 0 || tokens % batch != 0) {
    Throw(ula::ErrorCode::kInvalidArgument, "selections: [tokens, top_k] needs tokens (" + std::to_string(tokens) +
                                                ") to be a multiple of len(requests) (" + std::to_string(batch) +
                                                "): q_len rows per request");
  }
  return {static_cast<std::uint32_t>(batch), static_cast<std::uint32_t>(tokens / batch),
          static_cast<std::uint32_t>(sel.shape(1))};
}

inline void CheckSameShape(const py::array& sel, const py::array& idx) {
  bool same = sel.ndim() == idx.ndim();
  for (py::ssize_t d = 0; same && d < sel.ndim(); ++d) same = sel.shape(d) == idx.shape(d);
  if (!same) Throw(ula::ErrorCode::kInvalidArgument, "indices: must have the shape of selections");
}

// Copy descriptors as a structure of arrays: a dict {field name: 1-D integer array}, each
// column a numpy array or a CPU tensor (what a torch or CUDA copy kernel indexes), beside
// the DESCRIPTOR_DTYPE records. Offsets are int64 (a pool's byte offset passes 2^31 at
// 3.3 M rows of 656 bytes); every other field int32 or int64. A plan writes the columns
// itself (ula::DescriptorColumns, ula/descriptor_sink.h); an executor's columns are read
// into records.
struct DescriptorField {
  const char* name;
  bool needs_int64;
  void (*set)(ula::CopyDescriptor&, std::int64_t);
  ula::DescriptorColumn ula::DescriptorColumns::*column;
};
#define ULAPY_DESCRIPTOR_FIELD(f, wide) \
  DescriptorField { #f, wide, [](ula::CopyDescriptor& d, std::int64_t v) { d.f = static_cast<decltype(d.f)>(v); }, \
                    &ula::DescriptorColumns::f }
inline std::span<const DescriptorField> DescriptorFields() {
  static const DescriptorField fields[] = {
      ULAPY_DESCRIPTOR_FIELD(src_offset, true), ULAPY_DESCRIPTOR_FIELD(dst_offset, true),
      ULAPY_DESCRIPTOR_FIELD(src_slot, false),  ULAPY_DESCRIPTOR_FIELD(dst_slot, false),
      ULAPY_DESCRIPTOR_FIELD(bytes, false),     ULAPY_DESCRIPTOR_FIELD(addr, false),
      ULAPY_DESCRIPTOR_FIELD(src_rank, false),  ULAPY_DESCRIPTOR_FIELD(dst_rank, false),
      ULAPY_DESCRIPTOR_FIELD(group, false),     ULAPY_DESCRIPTOR_FIELD(src_tier, false),
      ULAPY_DESCRIPTOR_FIELD(dst_tier, false),  ULAPY_DESCRIPTOR_FIELD(op, false),
      ULAPY_DESCRIPTOR_FIELD(num_layers, false), ULAPY_DESCRIPTOR_FIELD(evict_slot, false)};
  return fields;
}
#undef ULAPY_DESCRIPTOR_FIELD

// The descriptors argument of a plan (its output: records viewed, or columns, both written
// by the planner through sink()) or of an executor (its input: records viewed, or columns
// read into `scratch`).
class DescriptorArg {
 public:
  // A plan's output.
  explicit DescriptorArg(py::handle obj) {
    if (!py::isinstance<py::dict>(obj)) {
      py::array a = ToArray(obj, "descriptors");
      records_ = ViewOut<ula::CopyDescriptor>(a, "descriptors", 1);
      keep_.push_back(a);
      return;
    }
    columns_ = ula::DescriptorColumns{};
    ForEachColumn(obj, /*writable=*/true, [&](const DescriptorField& f, py::array& a, const IntColumn& c) {
      void* data = a.mutable_data();
      columns_.value().*f.column =
          c.is64 ? ula::DescriptorColumn(std::span(static_cast<std::int64_t*>(data), c.size))
                 : ula::DescriptorColumn(std::span(static_cast<std::int32_t*>(data), c.size));
    });
  }
  // An executor's input: columns need every field but addr, of one length.
  DescriptorArg(py::handle obj, std::vector<ula::CopyDescriptor>& scratch) {
    if (!py::isinstance<py::dict>(obj)) {
      py::array a = ToArray(obj, "descriptors");
      auto v = View<const ula::CopyDescriptor>(a, "descriptors", 1);
      records_ = {const_cast<ula::CopyDescriptor*>(v.data()), v.size()};
      keep_.push_back(a);
      return;
    }
    std::vector<std::pair<const DescriptorField*, IntColumn>> cols;
    ForEachColumn(obj, /*writable=*/false,
                  [&](const DescriptorField& f, py::array&, const IntColumn& c) { cols.emplace_back(&f, c); });
    for (const auto& f : DescriptorFields()) {
      bool have = std::string(f.name) == "addr";
      for (const auto& col : cols) have = have || col.first == &f;
      if (!have) Throw(ula::ErrorCode::kInvalidArgument, std::string("descriptors: the executor needs column '") +
                                                                f.name + "'");
    }
    const std::size_t n = cols.front().second.size;
    for (const auto& col : cols) {
      if (col.second.size != n) Throw(ula::ErrorCode::kInvalidArgument, "descriptors: the columns differ in length");
    }
    scratch.assign(n, ula::CopyDescriptor{});
    for (const auto& [f, c] : cols) {
      for (std::size_t i = 0; i < n; ++i) f->set(scratch[i], c[i]);
    }
    records_ = {scratch.data(), n};
  }
  // The records an executor reads.
  std::span<ula::CopyDescriptor> records() const { return records_; }
  // Where a plan writes (the arrays are held by this object: usable with the GIL released).
  ula::DescriptorSink sink() const {
    if (columns_) return ula::DescriptorSink(*columns_);
    return ula::DescriptorSink(records_);
  }

 private:
  // f(field, array, view) for each column of the dict, checked: a descriptor field, int32 or
  // int64 (offsets int64), 1-D, contiguous (and writable for a plan's output).
  template <class F>
  void ForEachColumn(py::handle obj, bool writable, F&& f) {
    const auto fields = DescriptorFields();
    for (auto item : py::reinterpret_borrow<py::dict>(obj)) {
      const std::string key = py::str(item.first);
      const DescriptorField* field = nullptr;
      for (const auto& cand : fields) field = key == cand.name ? &cand : field;
      if (field == nullptr) {
        std::string names;
        for (const auto& cand : fields) names += std::string(names.empty() ? "" : ", ") + cand.name;
        Throw(ula::ErrorCode::kInvalidArgument, "descriptors['" + key + "']: not a descriptor field (" + names + ")");
      }
      const std::string what = "descriptors['" + key + "']";
      py::array a = ToArray(item.second, what.c_str());
      const IntColumn c = IntColumnView(a, what.c_str());
      if (writable) CheckLayout(a, what.c_str(), true);
      if (field->needs_int64 && !c.is64) {
        Throw(ula::ErrorCode::kInvalidArgument, what + ": must be int64 (byte offsets pass 2^31 in large pools)");
      }
      keep_.push_back(a);
      f(*field, a, c);
    }
    if (keep_.empty()) Throw(ula::ErrorCode::kInvalidArgument, "descriptors: an empty dict (no columns)");
  }

  std::span<ula::CopyDescriptor> records_;
  std::optional<ula::DescriptorColumns> columns_;
  std::vector<py::array> keep_;
};

// A 1-D numpy array of Rep that takes ownership of the vector's buffer (no copy). T is Rep
// or a strong id over Rep (ula/ids.h: spans of ids are plain integer arrays).
template <class Rep, class T>
py::array_t<Rep> ToNumpy(std::vector<T>&& v) {
  static_assert(sizeof(T) == sizeof(Rep) && std::is_trivially_copyable_v<T>);
  auto* heap = new std::vector<T>(std::move(v));
  py::capsule owner(heap, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<Rep>({static_cast<py::ssize_t>(heap->size())}, {static_cast<py::ssize_t>(sizeof(T))},
                          reinterpret_cast<const Rep*>(heap->data()), owner);
}
// The same bytes as a span of strong ids.
template <class Id>
std::span<const Id> AsIds(std::span<const typename Id::rep_type> s) {
  static_assert(sizeof(Id) == sizeof(typename Id::rep_type));
  return {reinterpret_cast<const Id*>(s.data()), s.size()};
}
template <class Id>
std::span<Id> AsIdsOut(std::span<typename Id::rep_type> s) {
  return {reinterpret_cast<Id*>(s.data()), s.size()};
}

// Selection runs from Python: a sequence of (request id, count) pairs (selection_run.h).
inline std::vector<ula::SelectionRun> ToRuns(const std::vector<std::pair<std::uint64_t, std::uint32_t>>& runs) {
  std::vector<ula::SelectionRun> out;
  out.reserve(runs.size());
  for (const auto& [request, count] : runs) out.push_back(ula::SelectionRun{ula::RequestId(request), count});
  return out;
}

// A space's backend: 'cpu' or 'counting', optionally wrapped in fault injection
// (FaultInjectingBackend, src/backend/fault_backend.h). Members destroyed in reverse order:
// the decorator before the backend it wraps.
struct OwnedBackend {
  std::unique_ptr<ula::Backend> inner;
  std::unique_ptr<ula::FaultInjectingBackend> faults;
  ula::Backend& get() { return faults ? static_cast<ula::Backend&>(*faults) : *inner; }
};
// A DP address space with the backend it owns (the backend outlives the space): the
// Python AddressSpace (bind_sparse.cc binds it, bind_kinds.cc adds the kinds' calls).
struct DpSpace {
  OwnedBackend backend;
  std::unique_ptr<ula::AddressSpace> space;
};

// faults: None or a ulacache.FaultPlan.
OwnedBackend MakeBackend(const std::string& name, py::handle faults);
void BindFaults(py::module_& m);

void BindSparse(py::module_& m);
void BindTp(py::module_& m);
void BindHybrid(py::module_& m);
void BindConfig(py::module_& m);
void BindKinds(py::module_& m);  // after BindSparse: it adds to AddressSpace(Config)

}  // namespace ulapy

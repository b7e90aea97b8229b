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

#include <cstring>
#include <memory>
#include <span>
#include <type_traits>
#include <string>
#include <utility>
#include <vector>

#include "backend/fault_backend.h"
#include "ula/engine_step.h"
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

inline const char* DlDeviceName(std::int32_t type) {
  switch (type) {
    case 1: return "cpu";
    case 2: return "cuda";
    case 3: return "cuda_host";
    case 10: return "rocm";
    default: return "another device";
  }
}

// A numpy view of `obj`, never a copy: a numpy array as it is; a tensor exporting
// __dlpack__ (torch, CPU or pinned host memory) as an array over the same memory that
// keeps the producer's buffer alive. Device memory (a __cuda_array_interface__ or a
// DLPack CUDA device) raises UnsupportedError: this build's backends ('cpu', 'counting',
// 'fault') read and write host memory only. Anything else raises InvalidArgumentError.
inline py::array ToArray(py::handle obj, const char* what) {
  if (py::isinstance<py::array>(obj)) return py::reinterpret_borrow<py::array>(obj);
  const std::string name(what);
  if (py::hasattr(obj, "__cuda_array_interface__")) {
    Throw(ula::ErrorCode::kUnsupported,
          name + ": a CUDA array (__cuda_array_interface__); this build's backends ('cpu', 'counting', 'fault') "
                 "read host memory, and no CUDA backend is built: pass a CPU tensor");
  }
  if (!py::hasattr(obj, "__dlpack__")) {
    Throw(ula::ErrorCode::kInvalidArgument, name + ": expected a numpy array or a tensor with __dlpack__ (torch), got " +
                                                std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
  }
  if (py::hasattr(obj, "__dlpack_device__")) {
    const auto dev = obj.attr("__dlpack_device__")().cast<py::tuple>();
    const auto type = dev[0].cast<std::int32_t>();
    if (type != 1 && type != 3) {
      Throw(ula::ErrorCode::kUnsupported,
            name + ": a tensor on " + DlDeviceName(type) +
                " memory; this build's backends ('cpu', 'counting', 'fault') read host memory, and no CUDA backend "
                "is built: pass a CPU tensor");
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
  const char kinds[] = {'i', 'u', 'f'};
  if (t.dtype.code > 2 || t.dtype.lanes != 1 || t.dtype.bits % 8 != 0) {
    Throw(ula::ErrorCode::kInvalidArgument, name + ": DLPack dtype (code " + std::to_string(t.dtype.code) + ", " +
                                                std::to_string(t.dtype.bits) + " bits) has no numpy equivalent here");
  }
  const py::dtype dt(std::string(1, kinds[t.dtype.code]) + std::to_string(t.dtype.bits / 8));
  std::vector<py::ssize_t> shape(t.shape, t.shape + t.ndim);
  std::vector<py::ssize_t> strides(static_cast<std::size_t>(t.ndim));
  py::ssize_t contiguous = t.dtype.bits / 8;
  for (int d = t.ndim - 1; d >= 0; --d) {
    strides[d] = t.strides != nullptr ? static_cast<py::ssize_t>(t.strides[d]) * (t.dtype.bits / 8) : contiguous;
    contiguous *= shape[d];
  }
  auto* data = static_cast<char*>(t.data) + t.byte_offset;
  return py::array(dt, shape, strides, data, owner);
}

// Request ids of a step: uint64 [batch], or int64 [batch] (torch's req_pool_indices dtype,
// the same bytes: ids are non-negative).
inline std::span<const ula::RequestId> RequestsView(const py::array& a, const char* what) {
  static_assert(sizeof(ula::RequestId) == sizeof(std::uint64_t));
  const auto* api = &py::detail::npy_api::get();
  if (api->PyArray_EquivTypes_(a.dtype().ptr(), py::dtype::of<std::int64_t>().ptr())) {
    if (a.ndim() != 1) Throw(ula::ErrorCode::kInvalidArgument, std::string(what) + ": must have 1 dimensions");
    CheckLayout(a, what, false);
    return {static_cast<const ula::RequestId*>(a.data()), static_cast<std::size_t>(a.size())};
  }
  auto s = View<const std::uint64_t>(a, what, 1);
  return {reinterpret_cast<const ula::RequestId*>(s.data()), s.size()};
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
// faults: None or a ulacache.FaultPlan.
OwnedBackend MakeBackend(const std::string& name, py::handle faults);
void BindFaults(py::module_& m);

void BindSparse(py::module_& m);
void BindTp(py::module_& m);
void BindHybrid(py::module_& m);
void BindConfig(py::module_& m);

}  // namespace ulapy

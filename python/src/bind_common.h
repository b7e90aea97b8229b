// Shared helpers of the `ulacache` bindings. The bindings are thin: they convert arguments
// (numpy arrays are viewed, never copied or cast), release the GIL around calls that plan
// or move bytes, call one C++ function, and turn a ula::Error into a ulacache.Error
// subclass (defined in python/ulacache/__init__.py) carrying the code and the message.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <span>
#include <type_traits>
#include <string>
#include <utility>
#include <vector>

#include "ula/error.h"

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

void BindSparse(py::module_& m);
void BindTp(py::module_& m);
void BindHybrid(py::module_& m);
void BindConfig(py::module_& m);

}  // namespace ulapy

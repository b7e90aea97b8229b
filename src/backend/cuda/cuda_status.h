// CUDA runtime errors as ula::Status values, and a scoped current-device guard.
//
// Contract (checked by scripts/check_cuda_calls.py for every file under src/): the result of
// each CUDA runtime call is consumed by one of
//   ULA_CUDA_RETURN_IF_ERROR(call)   returns kIo "<what>: <CUDA's message> (<code>)" on failure;
//   CudaStatus(call, what)           the same as a Status value;
//   CudaDiscard(call)                teardown only (destructors), where no caller can take an
//                                    error: the error is dropped on purpose and said so;
// or is assigned to a cudaError_t that is compared with a cudaError value or passed to one of
// them, or is returned as a cudaError_t. Nothing here throws or aborts.
#pragma once

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <utility>

#include "ula/error.h"

namespace ula::cuda_backend {

// kIo with CUDA's name and message for `e`; REQUIRES: e != cudaSuccess.
inline Error CudaError(cudaError_t e, const char* what) {
  return Error(ErrorCode::kIo, fmt::format("cuda backend: {}: {} ({}, {})", what, cudaGetErrorString(e),
                                           cudaGetErrorName(e), static_cast<int>(e)));
}

// Ok for cudaSuccess, else CudaError(e, what).
inline Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Ok();
  return std::unexpected(CudaError(e, what));
}

// Teardown only: the error of a call in a destructor, which has no caller to report to.
inline void CudaDiscard(cudaError_t) {}

// Makes `device` current for the scope and restores the caller's current device when the
// scope ends, so that no backend call changes the device the calling thread works on.
// Enter fails (and changes nothing) when either device cannot be read or set.
class ScopedDevice {
 public:
  static Result<ScopedDevice> Enter(int device) {
    int saved = 0;
    if (const cudaError_t e = cudaGetDevice(&saved); e != cudaSuccess) {
      return std::unexpected(CudaError(e, "cudaGetDevice"));
    }
    if (saved != device) {
      if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
        return std::unexpected(CudaError(e, "cudaSetDevice"));
      }
    }
    return ScopedDevice(saved, saved != device);
  }
  ScopedDevice(ScopedDevice&& o) noexcept : saved_(o.saved_), restore_(std::exchange(o.restore_, false)) {}
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  ScopedDevice& operator=(ScopedDevice&&) = delete;
  // Setting back a device that was current a moment ago fails only on a broken context,
  // which the next checked call reports.
  ~ScopedDevice() {
    if (restore_) CudaDiscard(cudaSetDevice(saved_));
  }

 private:
  ScopedDevice(int saved, bool restore) : saved_(saved), restore_(restore) {}
  int saved_ = 0;
  bool restore_ = false;
};

}  // namespace ula::cuda_backend

// Returns a kIo Status from the enclosing function when the CUDA call fails; the message
// names the call's source text.
#define ULA_CUDA_RETURN_IF_ERROR(call)                                                      \
  do {                                                                                      \
    if (const cudaError_t ula_cuda_error_ = (call); ula_cuda_error_ != cudaSuccess) {       \
      return std::unexpected<::ula::Error>(::ula::cuda_backend::CudaError(ula_cuda_error_, #call)); \
    }                                                                                       \
  } while (0)

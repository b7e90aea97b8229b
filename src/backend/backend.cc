// Backend's destructor: the lifetime check of include/ula/backend.h.
#include "ula/backend.h"

#include <fmt/format.h>

#include <string>

#include "ula/check.h"

namespace ula {

Backend::~Backend() {
  if (const std::uint32_t n = num_holders(); n != 0) [[unlikely]] {
    const std::string what = fmt::format(
        "a Backend is destroyed while {} address space(s) still hold arenas on it: destroy every AddressSpace / "
        "TpAddressSpace created on a backend before the backend (the backend must outlive them)", n);
    internal::CheckFailed(what.c_str(), __FILE__, __LINE__);
  }
}

#if !defined(ULA_WITH_CUDA_BACKEND)
// Built without CUDA: src/backend/cuda defines the real one where ULA_WITH_CUDA is on.
Result<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions&) {
  return MakeError(ErrorCode::kUnsupported,
                   "cuda backend: this build has no CUDA (configure with -DULA_WITH_CUDA=ON or AUTO where nvcc is found)");
}
#endif

}  // namespace ula

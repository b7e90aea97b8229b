// OmpTeam: the calling thread's OpenMP team size for the kernels of one call (the kernels'
// OpenMP form), restored when it goes out of scope. Used by DeviceStep and KernelPbLru.
// Thread-safety: per calling thread (omp_set_num_threads sets the caller's ICV only).
#pragma once

#include <omp.h>

#include <cstdint>

namespace ula {

class OmpTeam {
 public:
  explicit OmpTeam(std::uint32_t threads) : saved_(omp_get_max_threads()) {
    omp_set_num_threads(static_cast<int>(threads));
  }
  ~OmpTeam() { omp_set_num_threads(saved_); }
  OmpTeam(const OmpTeam&) = delete;
  OmpTeam& operator=(const OmpTeam&) = delete;

 private:
  int saved_;
};

}  // namespace ula

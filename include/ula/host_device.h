// ULA_HD: marks a function callable from host and device code. Under nvcc it is
// __host__ __device__; every other compiler sees nothing. The headers that use it
// (ula/tier.h, ula/location_bits.h, ula/step_arrays.h) are C++17 and include no
// C++20 header, so the CUDA form of the step's kernels (src/kernels, compiled as C++17)
// reads the same definitions as the host code (docs/ARCHITECTURE.md, "Layers").
#pragma once

#if defined(__CUDACC__)
#define ULA_HD __host__ __device__
#else
#define ULA_HD
#endif

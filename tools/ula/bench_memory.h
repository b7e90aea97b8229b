// Memory figures shared by the `ula bench` commands: the machine's cost of an independent
// random 8-byte read from an array of a given size (the unit of `bench planner`'s ratio,
// also printed by `bench gather`), the CPU model, and how much of the process's anonymous
// memory sits in transparent huge pages.
// Thread-safety: call from one thread (RandomReadNs allocates and times its own array).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ula::cli {

// ns per independent random 8-byte read from an array of `bytes` bytes (at least 8 KiB):
// a prefetch-free loop over 2^22 precomputed random indices, best of three. The array is
// a plain std::vector (4 KiB pages unless the kernel's THP mode is "always").
double RandomReadNs(std::size_t bytes, std::uint64_t seed);
// "model name" of the first CPU in /proc/cpuinfo; "unknown" when absent.
std::string CpuModel();
// AnonHugePages of /proc/self/smaps_rollup in KiB; -1 when it cannot be read.
std::int64_t AnonHugePagesKiB();

}  // namespace ula::cli

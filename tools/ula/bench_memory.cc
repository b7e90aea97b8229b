#include "bench_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <random>
#include <vector>

namespace ula::cli {

double RandomReadNs(std::size_t bytes, std::uint64_t seed) {
  const std::size_t n = std::max<std::size_t>(bytes / 8, 1024);
  std::vector<std::uint64_t> table(n);
  for (std::size_t i = 0; i < n; ++i) table[i] = i * 0x9e3779b97f4a7c15ull;
  constexpr std::size_t kReads = 1 << 22;
  std::vector<std::uint32_t> idx(kReads);
  std::mt19937_64 rng(seed);
  for (auto& i : idx) i = static_cast<std::uint32_t>(rng() % n);
  double best = 1e30;
  std::uint64_t sink = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    std::uint64_t sum = 0;
    for (std::uint32_t i : idx) sum += table[i];
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    sink += sum;
    best = std::min(best, ns / kReads);
  }
  if (sink == 42) fmt::print("");  // keep the sums alive
  return best;
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "unknown";
}

std::int64_t AnonHugePagesKiB() {
  std::ifstream in("/proc/self/smaps_rollup");
  std::string key;
  while (in >> key) {
    if (key == "AnonHugePages:") {
      std::int64_t kib = -1;
      in >> kib;
      return kib;
    }
  }
  return -1;
}

}  // namespace ula::cli

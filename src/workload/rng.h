// Rng: a small seeded generator (xoshiro256**, seeded through splitmix64) with
// distributions implemented here, so that a seed gives the same workload and the same
// selections on every standard library (std:: distributions are implementation-defined).
//
// Thread-safety: none; one Rng per thread or per stream.
#pragma once

#include <cmath>
#include <cstdint>

namespace ula::workload_internal {

constexpr std::uint64_t SplitMix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A seed derived from a base seed and a stream id (e.g. a request), independent of the
// order in which streams are used.
constexpr std::uint64_t StreamSeed(std::uint64_t seed, std::uint64_t stream) {
  std::uint64_t s = seed ^ (stream * 0xd1342543de82ef95ull + 0x632be59bd9b4e019ull);
  return SplitMix64(s);
}

class Rng {
 public:
  explicit Rng(std::uint64_t seed) {
    for (auto& w : s_) w = SplitMix64(seed);
  }

  std::uint64_t Next() {
    const std::uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1), 53 bits.
  double Uniform01() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Uniform in [0, n), unbiased (rejection). REQUIRES: n > 0.
  std::uint64_t Below(std::uint64_t n) {
    const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % n);
    std::uint64_t x;
    do {
      x = Next();
    } while (x >= limit);
    return x % n;
  }
  // Uniform integer in [lo, hi]. REQUIRES: lo <= hi.
  std::uint64_t Between(std::uint64_t lo, std::uint64_t hi) { return lo + Below(hi - lo + 1); }
  // Standard normal (Box-Muller, one value per call: no hidden cached state).
  double Normal() {
    const double u1 = 1.0 - Uniform01();  // (0, 1]
    const double u2 = Uniform01();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  double Exponential(double rate) { return -std::log(1.0 - Uniform01()) / rate; }

 private:
  static constexpr std::uint64_t Rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4];
};

}  // namespace ula::workload_internal

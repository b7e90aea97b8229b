// StateDigest: a 64-bit, order-sensitive hash of a structure's whole state, behind the
// DebugDigest() hooks of the address spaces and residency policies. Tests compare digests
// before and after a refused call ("a refused call changes nothing", including what no
// accessor shows: policy stamps and buckets, round counters, free lists and their order).
// Not for production paths (it reads everything: O(state)).
#pragma once

#include <cstdint>
#include <span>

namespace ula {

class HierBitmap;

class StateDigest {
 public:
  void Add(std::uint64_t v) {
    h_ ^= v + 0x9e3779b97f4a7c15ULL + (h_ << 6) + (h_ >> 2);
    h_ *= 0xff51afd7ed558ccdULL;
    h_ ^= h_ >> 33;
  }
  template <class T>
  void AddAll(std::span<const T> values) {
    Add(values.size());
    for (const T& v : values) Add(static_cast<std::uint64_t>(v));
  }
  // Every bit, in order.
  void Add(const HierBitmap& bitmap);
  std::uint64_t value() const { return h_; }

  // For unordered containers: a hash of one element, to be summed (order-free).
  static std::uint64_t Mix(std::uint64_t a, std::uint64_t b) {
    StateDigest d;
    d.Add(a);
    d.Add(b);
    return d.value();
  }

 private:
  std::uint64_t h_ = 0x243f6a8885a308d3ULL;
};

}  // namespace ula

// Shared by the fuzz harnesses (fuzz/README.md): reads operation codes and operands from
// the fuzzer's bytes (0 once they run out), and stops the process loudly when a property
// fails, so that libFuzzer records the input and the corpus replay fails under ctest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ula/error.h"

namespace ula::fuzz {

class FuzzInput {
 public:
  FuzzInput(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  std::size_t remaining() const { return empty() ? 0 : size_ - pos_; }
  std::uint32_t Byte() { return empty() ? 0 : data_[pos_++]; }
  std::uint32_t U16() { return Byte() | (Byte() << 8); }
  // Uniform-ish in [lo, hi] (lo <= hi <= lo + 65535).
  std::uint32_t In(std::uint32_t lo, std::uint32_t hi) {
    const std::uint32_t span = hi - lo + 1;
    return lo + (span <= 256 ? Byte() % span : U16() % span);
  }
  bool Bool() { return Byte() & 1; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

[[noreturn]] inline void Fail(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "%s:%d: fuzz property failed: %s\n", file, line, what.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace ula::fuzz

#define FUZZ_CHECK(cond, what)                                                            \
  do {                                                                                    \
    if (!(cond)) ::ula::fuzz::Fail(__FILE__, __LINE__, std::string(#cond " -- ") + (what)); \
  } while (0)

// A Status / Result that must be ok (an invariant check).
#define FUZZ_OK(expr)                                                            \
  do {                                                                           \
    const auto& fuzz_ok_ = (expr);                                              \
    if (!fuzz_ok_) ::ula::fuzz::Fail(__FILE__, __LINE__, fuzz_ok_.error().ToString()); \
  } while (0)

// Shared by the fuzz harnesses (fuzz/README.md): reads operation codes and operands from
// the fuzzer's bytes (0 once they run out), and stops the process loudly when a property
// fails, so that libFuzzer records the input and the corpus replay fails under ctest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "ula/error.h"
#include "ula/ids.h"
#include "ula/selection_run.h"

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

// The selection runs of `sel` (selection_run.h) for a DP or TP address space: one run per
// selection, naming the request (ids 0..7) that holds the address, or request 0 for an
// address no request holds (the step must then refuse it).
template <class Space>
std::vector<SelectionRun> RunsOf(const Space& space, const std::vector<LogicalAddr>& sel) {
  std::map<std::uint32_t, std::uint64_t> owner;
  for (std::uint64_t r = 0; r < 8; ++r) {
    if (auto addrs = space.AddressesOf(RequestId(r))) {
      for (LogicalAddr a : *addrs) owner[a.value()] = r;
    }
  }
  std::vector<SelectionRun> runs;
  for (LogicalAddr a : sel) {
    auto it = owner.find(a.value());
    runs.push_back(SelectionRun{RequestId(it == owner.end() ? 0 : it->second), 1});
  }
  return runs;
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

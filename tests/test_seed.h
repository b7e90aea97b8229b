// Seeds of the randomized tests (issue 13, item 8).
//
//   ULA_TEST_SEEDED(seed, 20261129);   // in a TEST body
//   std::mt19937_64 rng(seed);
//
// declares `const std::uint64_t seed`: the environment variable ULA_TEST_SEED when set
// (decimal, to reproduce a failure or try another stream), else the test's fixed default.
// It prints "[ seed ] N" when the test runs and adds "seed N (rerun with ULA_TEST_SEED=N)"
// to the message of every assertion that fails in the enclosing scope (a SCOPED_TRACE).
// A test that needs several streams derives them from this one (seed + 1, ...), so one
// variable moves them all. A malformed ULA_TEST_SEED fails the test instead of being ignored.
#pragma once

#include <gtest/gtest.h>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace ula::testing {

inline std::uint64_t TestSeed(std::uint64_t default_seed) {
  const char* env = std::getenv("ULA_TEST_SEED");
  std::uint64_t seed = default_seed;
  bool from_env = false;
  if (env != nullptr && *env != '\0') {
    const std::string_view text(env);
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), seed);
    if (ec != std::errc() || p != text.data() + text.size()) {
      if (::testing::UnitTest::GetInstance()->current_test_info() == nullptr) {  // a namespace-scope seed
        std::fprintf(stderr, "ULA_TEST_SEED=%s is not a decimal 64-bit unsigned integer\n", env);
        std::abort();
      }
      ADD_FAILURE() << "ULA_TEST_SEED=" << text << " is not a decimal 64-bit unsigned integer";
      seed = default_seed;
    } else {
      from_env = true;
    }
  }
  std::printf("[ seed ] %llu%s\n", static_cast<unsigned long long>(seed),
              from_env ? " (from ULA_TEST_SEED)" : "");
  return seed;
}

inline std::string SeedMessage(std::uint64_t seed) {
  return "seed " + std::to_string(seed) + " (rerun with ULA_TEST_SEED=" + std::to_string(seed) + ")";
}

}  // namespace ula::testing

#define ULA_TEST_SEEDED(var, default_seed)                          \
  const std::uint64_t var = ::ula::testing::TestSeed(default_seed); \
  SCOPED_TRACE(::ula::testing::SeedMessage(var))

// Seeds of the randomized tests.
//
//   ULA_TEST_SEEDED(seed, 20261129);   // in a TEST body
//   std::mt19937_64 rng(seed);
//
// declares `const std::uint64_t seed`: the environment variable ULA_TEST_SEED when set
// (decimal, to reproduce a failure or try another stream), else the test's fixed default.
// It prints "[ seed ] N" when the test runs and adds "seed N (rerun with ULA_TEST_SEED=N)"
// to the message of every assertion that fails in the enclosing scope (a SCOPED_TRACE).
// A test that needs several streams derives them from this one (seed + 1, ...), so one
// variable moves them all. A malformed ULA_TEST_SEED ("42x", "abc", "-1") fails the test
// at once instead of being ignored (the test ends with an exception; a seed drawn at
// namespace scope aborts the program). The ctests test_seed_refuses_malformed_<program>
// check that for every test program that includes this header
// (scripts/check_seed_refusal.py); no test parses ULA_TEST_SEED itself (ctest
// test_seed_single_helper).
#pragma once

#include <gtest/gtest.h>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
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
      // The test fails at once: the exception ends it (gtest reports it as a failure too),
      // so that a malformed seed costs no run of the test with some other seed.
      ADD_FAILURE() << "ULA_TEST_SEED=" << text << " is not a decimal 64-bit unsigned integer";
      ::testing::Test::RecordProperty("ula_seed", "malformed");
      throw std::invalid_argument("ULA_TEST_SEED=" + std::string(text) + " is not a decimal 64-bit unsigned integer");
    } else {
      from_env = true;
    }
  }
  std::printf("[ seed ] %llu%s\n", static_cast<unsigned long long>(seed),
              from_env ? " (from ULA_TEST_SEED)" : "");
  // The test that drew a seed says so in its --gtest_output report (property ula_seed):
  // scripts/check_seed_refusal.py requires each such test to fail on a malformed seed.
  if (::testing::UnitTest::GetInstance()->current_test_info() != nullptr) {
    ::testing::Test::RecordProperty("ula_seed", std::to_string(seed));
  }
  return seed;
}

inline std::string SeedMessage(std::uint64_t seed) {
  return "seed " + std::to_string(seed) + " (rerun with ULA_TEST_SEED=" + std::to_string(seed) + ")";
}

}  // namespace ula::testing

#define ULA_TEST_SEEDED(var, default_seed)                          \
  const std::uint64_t var = ::ula::testing::TestSeed(default_seed); \
  SCOPED_TRACE(::ula::testing::SeedMessage(var))

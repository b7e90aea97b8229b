// Checks on the numeric options of every `ula` subcommand (one helper for all of them).
//
// CLI11 converts the text of an unsigned option with strtoull, which turns "-5" into
// 2^64 - 5 without complaint, and a real option takes any double. So every numeric option
// carries one of these validators: they read the option's text before the conversion and
// refuse a negative, zero-where-invalid, non-integer or out-of-range value with a message
// that names the option and the accepted range. main.cc turns every parse or validation
// error into exit status 2 (`ula verify --ops -5` -> "--ops: -5 is not an integer in
// [1, 1000000000]", status 2).
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include <fmt/format.h>

namespace ula::cli {

// An integer written in decimal, lo <= value <= hi.
inline CLI::Validator IntIn(std::int64_t lo, std::uint64_t hi) {
  const std::string range = fmt::format("[{}, {}]", lo, hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        const char* first = text.data();
        const char* last = text.data() + text.size();
        bool ok = !text.empty();
        if (ok && text[0] == '-') {
          std::int64_t v = 0;
          auto [p, ec] = std::from_chars(first, last, v);
          ok = ec == std::errc() && p == last && v >= lo;
        } else if (ok) {
          std::uint64_t v = 0;
          auto [p, ec] = std::from_chars(first, last, v);
          ok = ec == std::errc() && p == last && v <= hi && (lo <= 0 || v >= static_cast<std::uint64_t>(lo));
        }
        return ok ? std::string() : fmt::format("{} is not an integer in {}", text, range);
      },
      "INT in " + range);
}

// An integer >= lo that fits the option's type T.
template <typename T>
CLI::Validator AtLeast(std::int64_t lo) {
  return IntIn(lo, static_cast<std::uint64_t>(std::numeric_limits<T>::max()));
}

// A finite real number in the interval from lo to hi; each end closed unless *_open.
inline CLI::Validator RealIn(double lo, double hi, bool lo_open = false, bool hi_open = false) {
  const std::string range = fmt::format("{}{}, {}{}", lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']');
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double v = 0;
        const char* last = text.data() + text.size();
        auto [p, ec] = std::from_chars(text.data(), last, v);
        const bool ok = !text.empty() && ec == std::errc() && p == last && std::isfinite(v) &&
                        (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
        return ok ? std::string() : fmt::format("{} is not a number in {}", text, range);
      },
      "REAL in " + range);
}

// A fraction strictly between 0 and 1 (target overlaps, kept fractions).
inline CLI::Validator OpenFraction() { return RealIn(0.0, 1.0, true, true); }

// A seed: any 64-bit unsigned integer, but not a negative one.
inline CLI::Validator Seed() { return IntIn(0, std::numeric_limits<std::uint64_t>::max()); }

}  // namespace ula::cli

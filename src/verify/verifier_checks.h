// Checks shared by the consistency verifiers (DP and TP). A Report is any struct with the
// counters invariant_failures, bad_input_checks, bad_input_failures and a vector<string>
// first_failures (the first kMaxRecorded descriptions are kept).
// Thread-safety: none; a verifier is single-threaded.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <utility>

#include "ula/error.h"

namespace ula::verify_internal {

inline constexpr std::size_t kMaxRecorded = 10;

template <class Report>
void RecordFailure(Report& report, std::uint64_t& counter, std::string what) {
  ++counter;
  if (report.first_failures.size() < kMaxRecorded) report.first_failures.push_back(std::move(what));
}

// Records an invariant failure if `status` is an error.
template <class Report>
void RecordInvariants(Report& report, const Status& status, const char* after) {
  if (!status) RecordFailure(report, report.invariant_failures, fmt::format("after {}: {}", after, status.error().message()));
}

// Runs a call that must be refused with `code` and must change nothing: the placement
// fingerprint is the same after the call and every byte still matches the shadow.
template <class Report, class Fingerprint, class BytesMatch, class Call>
void ExpectRefused(Report& report, const char* what, ErrorCode code, Fingerprint&& fingerprint,
                   BytesMatch&& bytes_match, Call&& call) {
  const std::uint64_t before = fingerprint();
  auto result = call();
  ++report.bad_input_checks;
  if (result.has_value()) {
    RecordFailure(report, report.bad_input_failures, fmt::format("{}: accepted", what));
  } else if (result.error().code() != code) {
    RecordFailure(report, report.bad_input_failures, fmt::format("{}: wrong error {}", what, result.error().ToString()));
  } else if (fingerprint() != before || !bytes_match()) {
    RecordFailure(report, report.bad_input_failures, fmt::format("{}: refused but changed state", what));
  }
}

}  // namespace ula::verify_internal

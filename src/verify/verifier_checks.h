// Checks shared by the consistency verifiers (DP and TP). A Report is any struct with the
// counters invariant_failures, bad_input_checks, bad_input_failures and a vector<string>
// first_failures (the first kMaxRecorded descriptions are kept).
// Thread-safety: none; a verifier is single-threaded.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <span>
#include <unordered_set>
#include <vector>
#include <string>
#include <utility>

#include "ula/error.h"
#include "ula/ids.h"

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

// The next selection of one query of a request with history `addrs`: the 4 attention
// sinks, the 4 newest tokens, each entry of the previous selection `prev` that `keep`
// accepts with probability 3/4, then fresh positions, up to min(top_k, history) distinct
// entries in random order. Replaces `prev` and appends to `out`.
template <class Keep>
void NextSelection(std::mt19937_64& rng, std::span<const LogicalAddr> addrs, std::uint32_t top_k, Keep&& keep,
                   std::vector<LogicalAddr>& prev, std::vector<LogicalAddr>& out) {
  const std::size_t k = std::min<std::size_t>(top_k, addrs.size());
  std::unordered_set<std::uint32_t> chosen;
  std::vector<LogicalAddr> next;
  auto take = [&](LogicalAddr a) {
    if (next.size() < k && chosen.insert(a.value()).second) next.push_back(a);
  };
  for (std::size_t i = 0; i < std::min<std::size_t>(4, addrs.size()); ++i) take(addrs[i]);
  for (std::size_t i = 0; i < std::min<std::size_t>(4, addrs.size()); ++i) take(addrs[addrs.size() - 1 - i]);
  for (LogicalAddr a : prev) {
    if (keep(a) && rng() % 100 < 75) take(a);
  }
  while (next.size() < k) take(addrs[rng() % addrs.size()]);
  std::shuffle(next.begin(), next.end(), rng);
  prev = next;
  out.insert(out.end(), next.begin(), next.end());
}

}  // namespace ula::verify_internal

// VerifierCore: the randomized workload shared by the consistency verifiers (DP, TP, and
// later prefix sharing). It owns what every verifier needs and the skeleton of its ops:
//
//   * the seeded generator (one std::mt19937_64: every draw in a fixed order, so that the
//     processes of an MPI run draw the same numbers and agree on every call);
//   * the live requests: id, placement rank (DP only), addresses, and each (group, query)
//     previous selection;
//   * the shadow: the bytes last written to every (address, group) — what any read must
//     return, whatever moved in between (DESIGN.md invariant 4);
//   * the op loop: arrive (allocate a prefill and write it), decode (append tokens),
//     rewrite (the engine overwrites entries), step (the strategy's planner steps),
//     finish (free; a double free and a step with the freed address are refused with
//     nothing changed) and bad input (the strategy's refused calls);
//   * ExpectRefused: a refused call must fail with the expected code and leave the
//     strategy's fingerprint and every byte unchanged.
//
// A strategy derives from VerifierCore<Strategy, Config, Report> (CRTP) and provides:
//
//   static constexpr OpMix kOpMix;                       // cumulative percentages of the ops
//   Rank PickRank();                                     // a new request's rank (may draw)
//   Status AddRequest(RequestId, Rank);
//   Result<std::vector<LogicalAddr>> Allocate(RequestId, std::uint32_t n);
//   void RandomBytes(std::span<std::byte> entry);        // the engine's next bytes for one entry
//   Status Write(LogicalAddr, GroupId, std::span<const std::byte>);
//   Status Free(RequestId);
//   bool KeepInSelection(LogicalAddr);                   // may a previous selection keep it
//   std::uint64_t Fingerprint();                         // placement and occupancy
//   bool Readable(LogicalAddr);                          // can this process read it (its shards)
//   Status Read(LogicalAddr, GroupId, std::span<std::byte>);
//   Status CheckSpaceInvariants();
//   auto StepWithFreedAddress(const Request&, LogicalAddr);  // r's step naming a freed address: kNotFound
//   void Step();  void BadInput();
//
// Config has seed, ops, num_groups, entry_bytes, top_k, queries_per_request (and optionally
// initial_requests: requests that arrive before the first op); Report has the
// counters of verifier_checks.h plus ops, seed and entries_checked.
//
// Thread-safety: none; a verifier is driven by one thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ula/error.h"
#include "ula/ids.h"
#include "verify/verifier_checks.h"

namespace ula::verify_internal {

// Cumulative thresholds of a roll in [0, 100): arrive below `arrive` (or when no request
// lives), decode below `decode`, and so on; bad input above `finish`.
struct OpMix {
  unsigned arrive, decode, rewrite, step, finish;
};

inline constexpr std::size_t kMaxLiveRequests = 24;

template <class Strategy, class Config, class Report>
class VerifierCore {
 public:
  struct Request {
    RequestId id;
    Rank rank;
    std::vector<LogicalAddr> addrs;
    std::vector<std::vector<LogicalAddr>> selection;  // [groups * queries] previous selection
  };

  Report Run() {
    constexpr OpMix mix = Strategy::kOpMix;
    // A config with initial_requests starts with that many requests (capped at
    // kMaxLiveRequests): a short run then begins with a full workload whatever the seed.
    if constexpr (requires { cfg_.initial_requests; }) {
      for (std::uint32_t i = 0; i < cfg_.initial_requests; ++i) Arrive();
    }
    for (std::uint64_t op = 0; op < cfg_.ops; ++op) {
      const unsigned roll = rng_() % 100;
      if (roll < mix.arrive || requests_.empty()) {
        Arrive();
      } else if (roll < mix.decode) {
        Decode();
      } else if (roll < mix.rewrite) {
        Rewrite();
      } else if (roll < mix.step) {
        self().Step();
      } else if (roll < mix.finish) {
        Finish();
      } else {
        self().BadInput();
      }
      ++report_.ops;
    }
    return std::move(report_);
  }

 protected:
  explicit VerifierCore(const Config& cfg) : cfg_(cfg), rng_(cfg.seed) { report_.seed = cfg.seed; }

  Strategy& self() { return static_cast<Strategy&>(*this); }

  void Fail(std::uint64_t& counter, std::string what) { RecordFailure(report_, counter, std::move(what)); }

  void CheckInvariants(const char* after) { RecordInvariants(report_, self().CheckSpaceInvariants(), after); }

  // The shadow of (a, g): grows with the largest address seen.
  std::byte* Shadow(LogicalAddr a, std::uint32_t g) {
    const std::size_t need = (std::size_t{a.value()} + 1) * cfg_.num_groups * cfg_.entry_bytes;
    if (shadow_.size() < need) shadow_.resize(std::max(need, shadow_.size() * 2));
    return shadow_.data() + (std::size_t{a.value()} * cfg_.num_groups + g) * cfg_.entry_bytes;
  }

  // New bytes for every group of `a`, written through the strategy and kept in the shadow.
  void Fill(LogicalAddr a) {
    for (std::uint32_t g = 0; g < cfg_.num_groups; ++g) {
      std::byte* s = Shadow(a, g);
      self().RandomBytes({s, cfg_.entry_bytes});
      if (auto w = self().Write(a, GroupId(static_cast<std::uint16_t>(g)), {s, cfg_.entry_bytes}); !w) {
        Fail(report_.invariant_failures, "write failed: " + w.error().ToString());
      }
    }
  }

  // A call that must be refused with `code` and change nothing.
  template <class F>
  void ExpectRefused(const char* what, ErrorCode code, F&& call) {
    verify_internal::ExpectRefused(
        report_, what, code, [&] { return self().Fingerprint(); }, [&] { return BytesMatchShadow(); },
        std::forward<F>(call));
  }

  // Every live entry this process can read returns its shadow bytes.
  bool BytesMatchShadow() {
    std::vector<std::byte> buf(cfg_.entry_bytes);
    for (const Request& r : requests_) {
      for (LogicalAddr a : r.addrs) {
        if (!self().Readable(a)) continue;
        for (std::uint32_t g = 0; g < cfg_.num_groups; ++g) {
          ++report_.entries_checked;
          if (!self().Read(a, GroupId(static_cast<std::uint16_t>(g)), buf) ||
              std::memcmp(buf.data(), Shadow(a, g), cfg_.entry_bytes) != 0) {
            return false;
          }
        }
      }
    }
    return true;
  }

  // The next selection of query `slot` of `r` (NextSelection), appended to `out`.
  void Select(Request& r, std::uint32_t slot, std::vector<LogicalAddr>& out) {
    NextSelection(rng_, r.addrs, cfg_.top_k, [&](LogicalAddr a) { return self().KeepInSelection(a); },
                  r.selection[slot], out);
  }

  const Config cfg_;
  std::mt19937_64 rng_;
  std::vector<Request> requests_;
  Report report_;

 private:
  void Arrive() {
    if (requests_.size() >= kMaxLiveRequests) return;
    const RequestId id(next_request_++);
    const Rank rank = self().PickRank();
    const std::uint32_t n = cfg_.top_k / 2 + static_cast<std::uint32_t>(rng_() % (6 * cfg_.top_k));
    if (auto s = self().AddRequest(id, rank); !s) {
      Fail(report_.invariant_failures, "AddRequest: " + s.error().ToString());
      return;
    }
    Request req{id, rank, {}, std::vector<std::vector<LogicalAddr>>(cfg_.num_groups * cfg_.queries_per_request)};
    if (auto addrs = self().Allocate(id, n)) {
      req.addrs = std::move(*addrs);
      for (LogicalAddr a : req.addrs) Fill(a);
    } else if (addrs.error().code() != ErrorCode::kResourceExhausted) {
      // A full space is a legitimate refusal; the empty request still counts.
      Fail(report_.invariant_failures, "Allocate: " + addrs.error().ToString());
    }
    requests_.push_back(std::move(req));
    CheckInvariants("arrive");
  }

  void Decode() {
    Request& r = requests_[rng_() % requests_.size()];
    auto addrs = self().Allocate(r.id, 1 + static_cast<std::uint32_t>(rng_() % 3));
    if (!addrs) return;  // full
    for (LogicalAddr a : *addrs) {
      Fill(a);
      r.addrs.push_back(a);
    }
  }

  void Rewrite() {
    Request& r = requests_[rng_() % requests_.size()];
    if (r.addrs.empty()) return;
    for (int i = 0; i < 4; ++i) Fill(r.addrs[rng_() % r.addrs.size()]);
  }

  void Finish() {
    const std::size_t i = rng_() % requests_.size();
    const Request r = requests_[i];
    requests_.erase(requests_.begin() + static_cast<std::ptrdiff_t>(i));
    if (auto s = self().Free(r.id); !s) Fail(report_.invariant_failures, "Free: " + s.error().ToString());
    CheckInvariants("finish");
    ExpectRefused("double free", ErrorCode::kNotFound, [&] { return self().Free(r.id); });
    if (!r.addrs.empty()) {
      // Refused whether or not the address is live again for another request (isolation).
      const LogicalAddr freed = r.addrs[rng_() % r.addrs.size()];
      ExpectRefused("step with a freed address", ErrorCode::kNotFound,
                    [&] { return self().StepWithFreedAddress(r, freed); });
    }
  }

  std::vector<std::byte> shadow_;  // [addresses][groups][entry_bytes]
  std::uint64_t next_request_ = 0;
};

}  // namespace ula::verify_internal

// Fault injection: decorators that make the transfers under the movers fail on purpose, so
// that tests and `ula verify --fault-rate` can check the movers' failure contracts ("a
// failed move publishes nothing it did not copy, and loses no entry's bytes").
//
// FaultInjectingBackend wraps any Backend (FaultInjectingFabric, sparse/fault_fabric.h, wraps
// a TpFabric). Every *eligible operation* — a copy batch, a swap batch, a remote fetch, of
// the kinds the plan enables — is counted, and fails when
//   - fail_every_nth > 0 and it is the n-th, 2n-th, ... eligible operation, or
//   - a draw of the plan's seeded generator falls below fail_fraction.
// A failed batch reports at Submit or at the Wait on its fence (a seeded choice among the
// points the plan enables):
//   at Submit    Submit returns kIo; nothing applied.
//   at its wait  Submit returns a fence and Wait(fence) returns kIo. A copy batch has landed
//                whole, or with `partial` only its first k moves (0 < k < n, seeded); a
//                swap batch has exchanged nothing (a swap batch is all or nothing, the
//                Backend contract in ula/backend.h).
//   remote fetch FetchFromHome returns kIo; with `partial` the first k entries landed.
// With delay > 0 every batch is held back and runs only when a Wait reaches its fence (after
// sleeping `delay`), so a caller that reads a destination before waiting on the right fence
// reads the old bytes; remote fetches sleep `delay` before they return.
// Every error message starts with "injected fault:" and names the operation.
//
// Arena creation, counters and the fabric's collectives are never failed.
// Thread-safety: as the wrapped object (the decorator's own state is locked). With one
// driving thread the faults are a deterministic function of the seed.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>

#include "ula/backend.h"
#include "ula/error.h"

namespace ula {

struct FaultPlan {
  std::uint64_t seed = 1;
  std::uint64_t fail_every_nth = 0;  // 0: off
  double fail_fraction = 0.0;        // in [0, 1]
  bool partial = false;              // failed copy batches / fetches land a prefix first
  std::chrono::microseconds delay{0};
  // Which operations are eligible.
  bool copies = true;
  bool swaps = true;
  bool fetches = true;
  // Where a failed batch reports (at least one must be enabled).
  bool at_submit = true;
  bool at_wait = true;

  // kInvalidArgument naming the bad field, or Ok.
  Status Validate() const;
};

struct FaultStats {
  std::uint64_t operations = 0;       // eligible operations seen
  std::uint64_t injected = 0;         // faults injected, all kinds
  std::uint64_t copies_failed = 0;    // copy batches failed at Submit or at their wait
  std::uint64_t swaps_failed = 0;     // swap batches failed at Submit or at their wait
  std::uint64_t waits_failed = 0;     // of those, the ones reported by Wait
  std::uint64_t fetches_failed = 0;   // remote fetches failed
  std::uint64_t partial = 0;          // failures that landed some moves / entries first
  std::uint64_t moves_landed_before_failure = 0;
  std::uint64_t delayed = 0;          // completions delayed
  FaultStats& operator+=(const FaultStats& o);
};

// The seeded dice and the counters shared by the decorators. Thread-safe.
class FaultInjector {
 public:
  enum class Kind : std::uint8_t { kCopy, kSwap, kFetch };

  explicit FaultInjector(const FaultPlan& plan);

  const FaultPlan& plan() const { return plan_; }
  // Whether this eligible operation fails (counts it). Never fails a kind the plan excludes
  // or while disarmed.
  bool Roll(Kind kind);
  // For a failed batch: whether it reports at its wait (else at Submit); counts it.
  bool FailsAtWait(Kind kind);
  // How many of n moves land before a partial failure: 0 when !plan.partial or n < 2,
  // else in [1, n); counts a partial failure when > 0.
  std::size_t PartialPrefix(std::size_t n);
  void RecordDelay();
  FaultStats stats() const;
  // While disarmed no operation fails (set-up and checking phases of a test).
  void set_armed(bool armed);
  bool armed() const;

 private:
  std::uint64_t Next();  // REQUIRES: mu_ held

  FaultPlan plan_;
  mutable std::mutex mu_;
  std::uint64_t rng_;
  bool armed_ = true;
  FaultStats stats_;
};

// A Backend whose transfers fail as its plan says. Arenas, holds_bytes and counters are the
// inner backend's (counters count what reached the inner backend).
class FaultInjectingBackend : public Backend {
 public:
  virtual FaultStats stats() const = 0;
  virtual void set_armed(bool armed) = 0;
  virtual Backend& inner() = 0;
};

// REQUIRES: inner outlives the result. kInvalidArgument for a plan that fails Validate.
Result<std::unique_ptr<FaultInjectingBackend>> MakeFaultInjectingBackend(Backend& inner, const FaultPlan& plan);

}  // namespace ula

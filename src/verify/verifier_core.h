// VerifierCore: the randomized workload shared by the consistency verifiers (DP, TP, and
// later prefix sharing). It owns what every verifier needs and the skeleton of its ops:
//
//   * the seeded generator (one std::mt19937_64: every draw in a fixed order, so that the
//     processes of an MPI run draw the same numbers and agree on every call);
//   * the live requests: id, placement rank (DP only), addresses, and each (group, query)
//     previous selection;
//   * the shadow: the bytes last written to every (address, group) — what any read must
//     return, whatever moved in between (docs/ARCHITECTURE.md invariant 4);
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
// Drafts and rounds (optional Config fields; off, they draw nothing). draft_reject_percent:
// that share of the decodes first rolls back 1..3 of the request's last tokens (Truncate),
// as a verification that rejected drafts some steps already selected; the strategy adds
// Status Truncate(RequestId, std::uint32_t length). reserve_rounds: a decode allocates only
// after the strategy's Result<RoundReservation> ReserveRound(Rank, std::span<const
// RoundDemand>) admitted the round's batch (kResourceExhausted defers it). Report counts draft_rollbacks, reservations
// and reservations_refused.
//
// Kinds (optional strategy verbs; without them nothing changes). void AfterOp() runs after
// every op (the DP strategy checks every kind's page tables there); where bool
// CountsTokens() says the space has kinds, std::optional<std::uint32_t>
// RollBackTokens(RequestId, std::uint32_t drafts) replaces the rollback's Truncate: a space
// with kinds counts tokens, not addresses (the strategy returns the addresses kept, nullopt
// when nothing was rolled back), and std::uint32_t TokensPerAddress() scales the arrivals' and
// decodes' tokens so that they make as many addresses as in a single-kind space. The verbs a
// space with kinds needs are implemented here once for every strategy (DP and TP), over its
// space_, its kinds_ (verify/kind_model.h) and its CheckKindsOf: AllocateTokens (prefill
// chunks), RollBackTokens, CheckEveryKind, KindsDigest and KindsBadInput (below).
//
// Sharing (only when cfg_.share_percent > 0, so that runs without it draw the
// same numbers as before). Requests carry token ids. That share of the arrivals adopts a
// prefix of a live request instead: the donor is cached in the rank's SparsePrefixCache
// (cache_unfinished_req), the new request's tokens are a cut of the donor's plus its own,
// its match is locked and adopted (ShareInto) and must read back the prefix's bytes; then
// it allocates the rest. Rewrites skip shared entries (immutable). A finishing request may
// be cached, unlocks its match, and is freed: every address another holder still has must
// keep its location and its bytes (freeing one sharer never frees or moves what another
// reads); adopting an address that was freed is refused with nothing changed. After some
// finishes the cache evicts (by count or allocation-aware MakeRoom): no locked match may
// lose a token, its entries keep their bytes. The strategy adds:
//   Status ShareInto(RequestId, std::span<const LogicalAddr>);
//   std::uint32_t RefCount(LogicalAddr);   std::uint64_t Where(LogicalAddr);  // a location's bits
//   SparsePrefixCache& CacheFor(Rank);
// and Config / Report the fields share_percent, shares, sharer_checks, cache_evictions,
// locked_checks, sharing_failures (an entry a sharer's free or an eviction lost or moved).
//
// Thread-safety: none; a verifier is driven by one thread.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ula/error.h"
#include "ula/ids.h"
#include "ula/sparse_prefix_cache.h"
#include "ula/step_planner.h"
#include "verify/kind_model.h"
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
    std::vector<std::uint32_t> tokens = {};           // sharing: [addrs] the token of each address
    SparsePrefixMatch lock = {};                      // sharing: its locked match (if locked)
    bool locked = false;
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
      if constexpr (requires { self().AfterOp(); }) self().AfterOp();
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

  // --- a space with kinds: one implementation for every strategy ("Kinds" above). They use
  // the strategy's space_ (Allocate, Truncate, ShareInto take the model's tokens) and kinds_
  // (verify/kind_model.h), and its CheckKindsOf(RequestId, std::span<const LogicalAddr>),
  // which compares every kind's page tables (on every rank) with the model.

  // Allocate of n tokens; the addresses are the C4 entries they complete. A prefill goes in
  // chunks of kPrefillChunk tokens (a chunked prefill: the window ring frees its front blocks
  // between them), every kind checked after each. A chunk past the first that the space
  // cannot hold ends the prefill there (the tokens so far stay allocated).
  static constexpr std::uint32_t kPrefillChunk = 256;
  Result<std::vector<LogicalAddr>> AllocateTokens(RequestId id, std::uint32_t n) {
    auto& kinds = *self().kinds_;
    const bool arriving =
        std::none_of(requests_.begin(), requests_.end(), [&](const Request& r) { return r.id == id; });
    std::vector<LogicalAddr> made;
    for (std::uint32_t done = 0; done < n;) {
      const std::uint32_t chunk = std::min(n - done, kPrefillChunk);
      auto addrs = self().space_->Allocate(id, chunk);
      if (!addrs && done > 0 && addrs.error().code() == ErrorCode::kResourceExhausted) break;
      if (!addrs) return addrs;
      if (auto wrong = kinds.Appended(id, chunk, addrs->size())) Fail(report_.kind_failures, *wrong);
      made.insert(made.end(), addrs->begin(), addrs->end());
      done += chunk;
      if (arriving && done < n) self().CheckKindsOf(id, made);
    }
    return made;
  }
  // Rolls back `drafts` of the request's tokens; a rollback the window ring no longer holds
  // must be refused with nothing changed. Returns the C4 entries kept.
  std::optional<std::uint32_t> RollBackTokens(RequestId id, std::uint32_t drafts) {
    auto& kinds = *self().kinds_;
    const std::uint32_t tokens = kinds.TokensOf(id);
    if (drafts > tokens) return std::nullopt;
    const std::uint32_t length = tokens - drafts;
    if (!kinds.RollbackAllowed(id, length)) {
      ExpectRefused("rollback past the window ring", ErrorCode::kFailedPrecondition,
                    [&] { return self().space_->Truncate(id, length); });
      ++kinds.counts().rollbacks_refused;
      return std::nullopt;
    }
    if (auto s = self().space_->Truncate(id, length); !s) {
      Fail(report_.invariant_failures, "Truncate: " + s.error().ToString());
      return std::nullopt;
    }
    kinds.Truncated(id, length);
    const std::uint32_t kept = kinds.AddressesAt(length);
    // At once: the next Allocate of this op may take the freed blocks back under new ids.
    for (const Request& r : requests_) {
      if (r.id == id) self().CheckKindsOf(id, std::span(r.addrs).first(std::min<std::size_t>(kept, r.addrs.size())));
    }
    return kept;
  }
  // Every request's kinds against the model (after every op).
  void CheckEveryKind() {
    for (const Request& r : requests_) self().CheckKindsOf(r.id, r.addrs);
  }
  // A digest of every live request's page tables of every kind (no step may change it).
  std::uint64_t KindsDigest() {
    std::vector<RequestId> ids;
    for (const Request& r : requests_) ids.push_back(r.id);
    return KindModel::PagesDigest(*self().space_, ids);
  }
  // The space's refusals of a space with kinds (`which` in [0, 2)): ShareInto (kUnsupported),
  // a Truncate past the request's tokens (kOutOfRange).
  void KindsBadInput(std::uint64_t which) {
    const Request& r = requests_.front();
    if (which == 0) {
      const Request& donor = requests_.back();
      if (donor.addrs.empty() || donor.id == r.id) return;
      const std::vector<LogicalAddr> prefix{donor.addrs.front()};
      ExpectRefused("ShareInto on a space with kinds", ErrorCode::kUnsupported,
                    [&] { return self().space_->ShareInto(r.id, prefix); });
    } else {
      ExpectRefused("Truncate past the request's tokens", ErrorCode::kOutOfRange,
                    [&] { return self().space_->Truncate(r.id, self().kinds_->TokensOf(r.id) + 1); });
    }
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
  bool Sharing() const { return cfg_.share_percent > 0; }
  // Tokens per address: 1, or the strategy's (a space with kinds: the C4 kind's 4), so that
  // arrivals and decodes make as many addresses as in a single-kind space.
  std::uint32_t TokensPerAddress() {
    if constexpr (requires { self().CountsTokens(); }) {
      if (self().CountsTokens()) return self().TokensPerAddress();
    }
    return 1;
  }
  std::uint32_t NextToken() { return static_cast<std::uint32_t>(rng_()); }

  void Arrive() {
    if (requests_.size() >= kMaxLiveRequests) return;
    if (Sharing() && !requests_.empty() && rng_() % 100 < cfg_.share_percent) {
      ShareArrive();
      return;
    }
    const RequestId id(next_request_++);
    const Rank rank = self().PickRank();
    const std::uint32_t t = TokensPerAddress();
    const std::uint32_t n = cfg_.top_k / 2 * t + static_cast<std::uint32_t>(rng_() % (6 * cfg_.top_k * t));
    if (auto s = self().AddRequest(id, rank); !s) {
      Fail(report_.invariant_failures, "AddRequest: " + s.error().ToString());
      return;
    }
    Request req{id, rank, {}, std::vector<std::vector<LogicalAddr>>(cfg_.num_groups * cfg_.queries_per_request)};
    if (auto addrs = self().Allocate(id, n)) {
      req.addrs = std::move(*addrs);
      for (LogicalAddr a : req.addrs) Fill(a);
      if (Sharing()) {
        for (std::size_t i = 0; i < req.addrs.size(); ++i) req.tokens.push_back(NextToken());
      }
    } else if (addrs.error().code() != ErrorCode::kResourceExhausted) {
      // A full space is a legitimate refusal; the empty request still counts.
      Fail(report_.invariant_failures, "Allocate: " + addrs.error().ToString());
    }
    requests_.push_back(std::move(req));
    CheckInvariants("arrive");
  }

  void Decode() {
    Request& r = requests_[rng_() % requests_.size()];
    if constexpr (requires { cfg_.draft_reject_percent; }) {
      if (cfg_.draft_reject_percent > 0 && rng_() % 100 < cfg_.draft_reject_percent) RollBackDrafts(r);
    }
    const std::uint32_t n = 1 + static_cast<std::uint32_t>(rng_() % (3 * TokensPerAddress()));
    if constexpr (requires { cfg_.reserve_rounds; }) {
      if (cfg_.reserve_rounds && !Reserved(r, n)) return;
    }
    auto addrs = self().Allocate(r.id, n);
    if (!addrs) return;  // full
    for (LogicalAddr a : *addrs) {
      Fill(a);
      r.addrs.push_back(a);
      if (Sharing()) r.tokens.push_back(NextToken());
    }
  }

  // Drafts rolled back: the verification rejected 1..3 of r's last tokens (Truncate), which
  // steps may have selected and moved. Shared entries are immutable (Truncate refuses them),
  // so only r's own tail is rolled back. The truncated addresses leave r's selections.
  void RollBackDrafts(Request& r) {
    const std::uint32_t drafts = 1 + static_cast<std::uint32_t>(rng_() % 3);
    const std::optional<std::uint32_t> kept = RollBack(r, drafts);
    if (!kept) return;
    const std::uint32_t length = *kept;  // the addresses r keeps
    const std::vector<LogicalAddr> gone(r.addrs.begin() + length, r.addrs.end());
    r.addrs.resize(length);
    if (Sharing()) r.tokens.resize(length);
    for (auto& sel : r.selection) {
      std::erase_if(sel, [&](LogicalAddr a) { return std::find(gone.begin(), gone.end(), a) != gone.end(); });
    }
    ++report_.draft_rollbacks;
    CheckInvariants("draft rollback");
  }

  // Rolls back r's last `drafts` tokens; the addresses r keeps, nullopt when nothing was
  // rolled back. A space with kinds counts tokens: the strategy rolls them back (or checks
  // that a rollback past the window ring is refused) and returns the C4 entries kept.
  // Otherwise one address a token, only r's own tail when sharing.
  std::optional<std::uint32_t> RollBack(const Request& r, std::uint32_t drafts) {
    if constexpr (requires { self().CountsTokens(); }) {
      if (self().CountsTokens()) return self().RollBackTokens(r.id, drafts);
    }
    std::size_t k = std::min<std::size_t>(drafts, r.addrs.size());
    if (Sharing()) {
      std::size_t own = 0;
      while (own < k && self().RefCount(r.addrs[r.addrs.size() - 1 - own]) == 1) ++own;
      k = own;
    }
    if (k == 0) return std::nullopt;
    const auto length = static_cast<std::uint32_t>(r.addrs.size() - k);
    if (auto s = self().Truncate(r.id, length); !s) {
      Fail(report_.invariant_failures, "Truncate: " + s.error().ToString());
      return std::nullopt;
    }
    return length;
  }

  // Round reservations: the decode's n tokens are admitted only when the engine path's
  // ReserveRound (the strategy's) says a round fits that steps r with its n new tokens and
  // the batch's other requests (the first live ones on r's rank, up to max_batch), each
  // selecting top_k per query; kResourceExhausted defers them.
  bool Reserved(const Request& r, std::uint32_t n) {
    const std::uint32_t selections = cfg_.top_k * cfg_.queries_per_request;
    std::vector<RoundDemand> demands{{r.id, n, selections}};
    for (const Request& other : requests_) {
      if (demands.size() >= cfg_.max_batch) break;
      if (other.id != r.id && other.rank == r.rank) demands.push_back({other.id, 0, selections});
    }
    auto reserved = self().ReserveRound(r.rank, demands);
    if (reserved) {
      ++report_.reservations;
      return true;
    }
    if (reserved.error().code() != ErrorCode::kResourceExhausted) {
      Fail(report_.invariant_failures, "ReserveRound: " + reserved.error().ToString());
    }
    ++report_.reservations_refused;
    return false;
  }

  void Rewrite() {
    Request& r = requests_[rng_() % requests_.size()];
    if (r.addrs.empty()) return;
    for (int i = 0; i < 4; ++i) {
      const LogicalAddr a = r.addrs[rng_() % r.addrs.size()];
      if (Sharing() && self().RefCount(a) > 1) continue;  // a shared entry is immutable
      Fill(a);
    }
  }

  void Finish() {
    const std::size_t i = rng_() % requests_.size();
    const Request r = requests_[i];
    requests_.erase(requests_.begin() + static_cast<std::ptrdiff_t>(i));
    std::vector<std::pair<LogicalAddr, std::uint64_t>> kept;  // sharing: held by others, and where
    if (Sharing()) kept = BeforeSharerFree(r);
    if (auto s = self().Free(r.id); !s) Fail(report_.invariant_failures, "Free: " + s.error().ToString());
    CheckInvariants("finish");
    if (Sharing()) AfterSharerFree(r, kept);
    ExpectRefused("double free", ErrorCode::kNotFound, [&] { return self().Free(r.id); });
    if (!r.addrs.empty()) {
      // Refused whether or not the address is live again for another request (isolation).
      const LogicalAddr freed = r.addrs[rng_() % r.addrs.size()];
      ExpectRefused("step with a freed address", ErrorCode::kNotFound,
                    [&] { return self().StepWithFreedAddress(r, freed); });
    }
  }

  // --- Sharing (see the header comment) ---
  void Check(std::uint64_t& counter, const Status& s, const char* what) {
    if (!s) Fail(counter, std::string(what) + ": " + s.error().ToString());
  }

  // Every group of `a` reads its shadow bytes (where this process can read it).
  bool ReadsShadow(LogicalAddr a) {
    if (!self().Readable(a)) return true;
    std::vector<std::byte> buf(cfg_.entry_bytes);
    for (std::uint32_t g = 0; g < cfg_.num_groups; ++g) {
      ++report_.entries_checked;
      if (!self().Read(a, GroupId(static_cast<std::uint16_t>(g)), buf) ||
          std::memcmp(buf.data(), Shadow(a, g), cfg_.entry_bytes) != 0) {
        return false;
      }
    }
    return true;
  }

  void ShareArrive() {
    const Request& donor = requests_[rng_() % requests_.size()];
    if (donor.addrs.empty()) return;
    SparsePrefixCache& cache = self().CacheFor(donor.rank);
    if (auto ins = cache.Insert(donor.tokens, donor.addrs); !ins) {
      Fail(report_.invariant_failures, "cache Insert of a live request: " + ins.error().ToString());
      return;
    }
    const std::size_t cut = 1 + rng_() % donor.addrs.size();
    std::vector<std::uint32_t> tokens(donor.tokens.begin(), donor.tokens.begin() + static_cast<std::ptrdiff_t>(cut));
    const std::uint32_t own = static_cast<std::uint32_t>(rng_() % (2 * cfg_.top_k));
    for (std::uint32_t k = 0; k < own; ++k) tokens.push_back(NextToken());
    const Rank rank = donor.rank;
    SparsePrefixMatch m = cache.Match(tokens);
    if (m.length < cut) {
      Fail(report_.invariant_failures, "the cached donor's prefix was not matched");
      return;
    }
    Check(report_.invariant_failures, cache.Lock(m), "Lock");
    const RequestId id(next_request_++);
    Check(report_.invariant_failures, self().AddRequest(id, rank), "AddRequest");
    Check(report_.invariant_failures, self().ShareInto(id, m.addrs), "ShareInto");
    ++report_.shares;
    for (LogicalAddr a : m.addrs) {  // every sharer reads back the prefix's bytes
      ++report_.sharer_checks;
      if (!ReadsShadow(a)) Fail(report_.mismatches, "an adopted prefix entry does not read its bytes");
    }
    Request req{id, rank, m.addrs, std::vector<std::vector<LogicalAddr>>(cfg_.num_groups * cfg_.queries_per_request)};
    req.tokens.assign(tokens.begin(), tokens.begin() + m.length);
    req.lock = m;
    req.locked = true;
    if (auto addrs = self().Allocate(id, static_cast<std::uint32_t>(tokens.size() - m.length))) {
      for (LogicalAddr a : *addrs) Fill(a);
      req.addrs.insert(req.addrs.end(), addrs->begin(), addrs->end());
      req.tokens.insert(req.tokens.end(), tokens.begin() + m.length, tokens.end());
    } else if (addrs.error().code() != ErrorCode::kResourceExhausted) {
      Fail(report_.invariant_failures, "Allocate: " + addrs.error().ToString());
    }
    requests_.push_back(std::move(req));
    CheckInvariants("share");
    Check(report_.invariant_failures, cache.CheckInvariants(), "cache invariants");
  }

  // Before r's Free: maybe cache it (a finished request), unlock its match, and note the
  // addresses someone else holds, with their locations.
  std::vector<std::pair<LogicalAddr, std::uint64_t>> BeforeSharerFree(const Request& r) {
    SparsePrefixCache& cache = self().CacheFor(r.rank);
    if (!r.addrs.empty() && rng_() % 2 == 0) {
      if (auto ins = cache.Insert(r.tokens, r.addrs); !ins) {
        Fail(report_.invariant_failures, "cache Insert of a finished request: " + ins.error().ToString());
      }
    }
    if (r.locked) Check(report_.invariant_failures, cache.Unlock(r.lock), "Unlock");
    std::vector<std::pair<LogicalAddr, std::uint64_t>> kept;
    for (LogicalAddr a : r.addrs) {
      if (self().RefCount(a) > 1) kept.emplace_back(a, self().Where(a));
    }
    return kept;
  }

  void AfterSharerFree(const Request& r, const std::vector<std::pair<LogicalAddr, std::uint64_t>>& kept) {
    for (const auto& [a, where] : kept) {  // freeing one sharer never frees or moves another's entry
      ++report_.sharer_checks;
      if (self().RefCount(a) == 0) {
        Fail(report_.sharing_failures, fmt::format("address {} was freed with one of its sharers", a.value()));
      } else if (self().Where(a) != where || !ReadsShadow(a)) {
        Fail(report_.sharing_failures, fmt::format("address {} moved or changed when a sharer was freed", a.value()));
      }
    }
    // Adopting an address that was freed is refused, nothing changed.
    for (LogicalAddr a : r.addrs) {
      if (self().RefCount(a) != 0) continue;
      for (const Request& other : requests_) {
        if (other.rank != r.rank) continue;
        const std::vector<LogicalAddr> freed{a};
        ExpectRefused("adopting a freed address", ErrorCode::kNotFound, [&] { return self().ShareInto(other.id, freed); });
        break;
      }
      break;
    }
    if (rng_() % 3 == 0) CacheEvict(r.rank);
  }

  // Evicts from a rank's cache; no locked match may lose a token or its bytes.
  void CacheEvict(Rank rank) {
    SparsePrefixCache& cache = self().CacheFor(rank);
    if (rng_() % 2 == 0) {
      (void)cache.Evict(1 + rng_() % (4 * cfg_.top_k));
    } else {
      const std::uint64_t want = cache.Room() + 1 + rng_() % (4 * cfg_.top_k);
      auto made = cache.MakeRoom(want);
      if (made && cache.Room() < want) Fail(report_.invariant_failures, "MakeRoom succeeded without the room");
      if (!made && made.error().code() != ErrorCode::kResourceExhausted) {
        Fail(report_.invariant_failures, "MakeRoom: " + made.error().ToString());
      }
    }
    ++report_.cache_evictions;
    for (const Request& r : requests_) {
      if (!r.locked || &self().CacheFor(r.rank) != &cache) continue;
      ++report_.locked_checks;
      const std::span<const std::uint32_t> prefix(r.tokens.data(), r.lock.length);
      if (cache.PeekLength(prefix) < r.lock.length) {
        Fail(report_.invariant_failures, fmt::format("eviction dropped a locked prefix of request {}", r.id.value()));
      }
      for (std::size_t k = 0; k < r.lock.length; ++k) {
        if (!ReadsShadow(r.addrs[k])) Fail(report_.sharing_failures, "a locked prefix entry lost its bytes");
      }
    }
    Check(report_.invariant_failures, cache.CheckInvariants(), "cache invariants");
    CheckInvariants("cache eviction");
  }

  std::vector<std::byte> shadow_;  // [addresses][groups][entry_bytes]
  std::uint64_t next_request_ = 0;
};

}  // namespace ula::verify_internal

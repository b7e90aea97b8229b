// Shared-prefix admission for the serving comparison: the request stream
// of a sharing workload (lengths only), and a ledger that charges a shared prefix once per
// holder instead of once per request, with an LRU radix-cache eviction of idle prefixes and
// (DP) cache-aware routing by RouteByPrefix.
//
// Stream (SharedStream). The lengths that GenerateSharedWorkload draws, in its draw order
// (the same Rng, the same calls), without the token ids (a stream of thousands of 100K-token
// requests would hold gigabytes of them); tests pin it to GenerateSharedWorkload. The
// workload is scaled to `n` requests keeping its sharing structure: summaries_per_document
// and multi_turn add groups (documents / sessions), shared_system_prompt adds users per
// prompt. Order of arrival: documents one after the other (a document's summaries arrive
// together); system-prompt users interleaved over the prompts; multi-turn: one turn per
// session at a time, each session entering at a seeded turn (warm: its earlier turns were
// served before the simulated window and the radix cache holds the previous one, which its
// entry turn matches), its next turn at the head of the queue when a turn finishes (an
// agent calls again as soon as it has the answer).
//
// Prefix of a request: `prefix` = tokens of its input that its group shares (summaries /
// system prompt: the document / the prompt, for every request of the group including the
// first, which computes it; multi-turn: the previous turn's whole sequence, 0 for turn 0).
// `extends`: multi-turn, its whole final sequence becomes its session's cached prefix when
// it finishes (SGLang's cache_finished_req; the next turn re-sends it).
//
// Ledger (SharedLedger). Holders: TP one (the node; every rank holds the same bytes, so one
// rank's sums stand for all), DP one per rank. DemandOf(rules, T) (baselines.h) splits into
// a per-token part TokenPart(t) (all_gpu: t(kv+ix) device; hisparse: t ix device, t kv host;
// ulacache DP: t ix device, t kv either; TP: ceil(t/P) of both: striped) and the rest,
// per request (hisparse's buffer C kv; the UlaCache TP local buffer B kv), and UlaCache's
// working set ws = W kv (TP ceil(W/P) kv), bytes of the request's tokens that must be on
// device. On a holder the working sets on device are min(sum of ws, the KV bytes it stores):
// the distinct selections of a step cannot exceed the entries stored, and sharers' overlap
// in their prefix (without sharing ws <= each request's own bytes, so this is DemandOf's
// rule exactly). A request of final length T whose holder has its
// group's prefix cached (L tokens) pays RequestPart(T) + TokenPart(T - min(L, prefix)); the
// first of its group pays TokenPart(prefix) once more, as the new cached prefix, and the
// rest as own tokens. A request with no prefix pays exactly DemandOf(T). So all_gpu and
// hisparse in TP pay a prefix on every GPU (a copy per GPU), UlaCache TP a 1/P stripe on
// each (once per node), every system in DP once on the rank the router picked.
// A cached prefix with no request left (refs 0) stays charged until a request on its
// holder does not fit: then idle prefixes are evicted, least recently used first, until it
// fits (the next sharer recomputes it). Routing (DP): once per request, when it first
// reaches the head of the queue, by RouteByPrefix over router trees at 256-token block
// granularity (SMG's cache_aware router keeps its own approximate tree per worker; here it
// never evicts) with the loads = requests resident per rank; a request that does not fit
// on its rank waits there.
//
// Errors: TryAdmit of an id already admitted, Release of one not admitted: kInvalidArgument
// / kNotFound, nothing changes. Thread-safety: none; one driver thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "ula/backend.h"
#include "serving/baselines.h"
#include "ula/error.h"
#include "prefix/prefix_router.h"
#include "workload/shared_workload.h"

namespace ula::serving_internal {

struct SharedItem {
  std::uint64_t id = 0;           // index in the stream
  std::uint32_t group = 0;        // document / prompt / session
  std::uint32_t turn = 0;         // index of the request in its group
  std::uint32_t input = 0;        // input tokens
  std::uint32_t output = 0;       // output tokens
  std::uint32_t shared = 0;       // GenerateSharedWorkload's shared_tokens
  std::uint32_t prefix = 0;       // tokens of its input its group shares (see above)
  bool extends = false;           // multi-turn: caches its final sequence when it finishes
  std::int64_t next = -1;         // multi-turn: the stream index of its next turn
  std::uint32_t final_tokens() const { return input + output; }
};

struct SharedStream {
  SharingKind kind = SharingKind::kSummariesPerDocument;
  std::vector<SharedItem> items;       // every request of the scaled workload, generator order
  std::vector<std::uint64_t> arrivals;  // the initial queue (multi-turn: entry turns only)
};

// Exactly the lengths (and groups) of GenerateSharedWorkload(config), config unscaled.
std::vector<SharedItem> SharedLengths(const SharedWorkloadConfig& config);
// The workload scaled to at least n requests and its arrival order (see above); `seed` draws
// the multi-turn entry turns.
Result<SharedStream> MakeSharedStream(const SharedWorkloadConfig& config, std::uint32_t n, std::uint64_t seed);

// The parts of DemandOf: per token, per request, and UlaCache's working set (bytes moved
// from either tier to device): DemandOf(t) = TokenPart(t) + RequestPart(t) + {device +ws,
// either -ws} with ws = WorkingSet(t).
RankDemand TokenPart(const PlacementRules& rules, std::uint32_t tokens);
RankDemand RequestPart(const PlacementRules& rules, std::uint32_t final_tokens);
double WorkingSet(const PlacementRules& rules, std::uint32_t final_tokens);

struct SharedAdmission {
  bool admitted = false;
  std::uint32_t holder = 0;     // DP: the rank; TP: 0
  std::uint32_t matched = 0;    // prefix tokens found cached (prefill skipped)
  std::uint32_t cached = 0;     // prefix tokens this request starts caching (0: none)
  // A multi-turn entry turn: its prefix (`cached` tokens) counts as matched, cached before
  // the simulated window (the system allocates and caches it; no prefill).
  bool warm = false;
  std::uint32_t saved() const { return matched + (warm ? cached : 0); }  // prefill skipped
  std::vector<std::uint32_t> evicted;  // groups whose idle prefix was evicted on the holder
};

class SharedLedger {
 public:
  // rules.num_ranks = P of the config; rules.mode picks the holders.
  static Result<SharedLedger> Create(const PlacementRules& rules, std::span<const SharedItem> items);

  // Places the request if it fits on its holder (evicting idle prefixes there as needed).
  Result<SharedAdmission> TryAdmit(const SharedItem& item);
  // The request finished: its own tokens go; an `extends` request's final sequence becomes
  // its group's cached prefix (replacing the one it matched). kNotFound.
  Status Release(const SharedItem& item);
  // Undoes a TryAdmit that admitted (the system behind the ledger refused it after all): a
  // prefix it started caching goes with it. Evictions stay done. kNotFound.
  Status Cancel(const SharedItem& item);

  std::uint32_t admitted() const { return admitted_; }
  std::uint32_t holders() const { return static_cast<std::uint32_t>(holders_.size()); }
  // Requests resident on a holder.
  std::uint64_t load(std::uint32_t holder) const { return loads_[holder]; }
  // Token entries stored on a holder (own tokens + cached prefixes): per rank in DP, per
  // node in TP (each GPU's copy of a prefix counted once).
  std::uint64_t stored_tokens(std::uint32_t holder) const { return holders_[holder].stored; }
  // Sum of the final lengths of the resident requests (the entries their histories name).
  std::uint64_t named_tokens() const { return named_; }
  std::uint64_t evictions() const { return evictions_; }

 private:
  struct Prefix {
    std::uint32_t tokens = 0;
    std::uint32_t refs = 0;
    std::uint64_t last_use = 0;
  };
  struct Holder {
    double device = 0, host = 0, either = 0;
    double ws = 0;  // UlaCache: the resident requests' working sets (bytes that must be on device)
    std::uint64_t stored = 0;
    std::map<std::uint32_t, Prefix> prefixes;  // group -> its cached prefix
  };
  struct Resident {
    std::uint32_t holder = 0, matched = 0, own = 0;  // own: tokens charged as the request's
    bool holds_prefix = false;                        // a reference on its group's prefix
    bool created = false;                             // it started that prefix
  };
  SharedLedger(const PlacementRules& rules, std::uint32_t holders);
  bool Fits(const Holder& h, const RankDemand& d, double ws) const;
  void Add(Holder& h, const RankDemand& d, double ws, double sign);
  Result<std::uint32_t> Route(const SharedItem& item);
  // Release and Cancel, what they share: the request leaves, its own charges and counts go;
  // its group's prefix is left to the caller. kNotFound if it is not resident.
  Result<Resident> Remove(const SharedItem& item);

  PlacementRules rules_;
  std::vector<Holder> holders_;
  std::vector<std::uint64_t> loads_;
  std::unordered_map<std::uint64_t, Resident> resident_;
  std::unordered_map<std::uint64_t, std::uint32_t> routed_;  // DP: the rank a request was sent to
  std::uint32_t admitted_ = 0;
  std::uint64_t named_ = 0, clock_ = 0, evictions_ = 0;
  // DP router trees (RouteByPrefix): one per rank over a side address space of blocks.
  struct Router;
  std::shared_ptr<Router> router_;
};

// The largest number of requests decoding at once, admitting the arrivals in order until the
// first that does not fit (nothing finishes), and the ledger in that state.
struct SharedAdmissionLimit {
  std::uint32_t admitted = 0;
  std::uint64_t prefill_saved = 0;     // matched tokens of the admitted requests
  std::uint64_t input_tokens = 0;      // their input tokens
  std::uint64_t stored_tokens = 0;     // all holders
  std::uint64_t max_holder_stored = 0; // the fullest holder
  std::uint64_t named_tokens = 0;
  std::uint64_t max_load = 0;          // requests on the fullest rank (DP)
};
Result<SharedAdmissionLimit> MaxAdmittedShared(const PlacementRules& rules, const SharedStream& stream);

}  // namespace ula::serving_internal

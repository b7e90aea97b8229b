// `ula bench dup` on a sharing workload (bench_dup_shared.h).
//
// Serving model, the same for every UlaCache run: requests are taken turn-major (every
// group's first request, then every group's second, ...), up to --requests. Each request
// matches the cache, adopts the matched addresses (ShareInto), allocates the rest of its
// input and caches its input at once (SGLang's cache_unfinished_req), so later requests of
// its group share it while it runs. A multi-turn turn whose next turn is also taken has
// finished by then: it allocates its output tokens, caches input + output, and is freed
// (the cache keeps its KV where it is). The requests left are resident and decode --steps
// steps (one token each), with the selection model's selections over their whole token
// lists (adopted prefix included) through the planners.
//
// Counts. physical = entries the pools hold (+ TP local buffers); distinct = positions of
// the union trie of the resident requests' sequences (MeasureSharing, + their decode
// tokens): what a perfect prefix cache stores once. DP is run with one layer group and its
// counts multiplied by the model's groups (every address has one entry in every group and
// DP allocation does not depend on the group); TP runs every group (its local buffers
// depend on the per-group selections).
// Baselines, by definition (docs/COST_MODEL.md, a radix cache per GPU pool as SGLang
// runs them): all-GPU TP stores every distinct entry on every GPU (P x distinct); HiSparse
// adds its per-request device buffer (hisparse_buffer slots per resident request, copies
// of host entries), per GPU under TP; no_cache: every request its own copy of its prefix.
#include "bench_dup_shared.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "ula/address_space.h"
#include "config/model_config.h"
#include "prefix/prefix_router.h"
#include "workload/selection_model.h"
#include "serving/serving_config.h"
#include "workload/shared_workload.h"
#include "ula/sparse_prefix_cache.h"
#include "ula/tp_address_space.h"
#include "ula/tp_step_planner.h"

namespace ula::cli {
namespace {

template <class T>
T Must(Result<T> r, const char* what) {
  if (!r) {
    fmt::print(stderr, "ula bench dup: {}: {}\n", what, r.error().ToString());
    std::exit(2);
  }
  return std::move(*r);
}
void Must(Status s, const char* what) {
  if (!s) {
    fmt::print(stderr, "ula bench dup: {}: {}\n", what, s.error().ToString());
    std::exit(2);
  }
}

struct Plan {
  std::vector<const SharedRequest*> order;  // taken, turn-major
  std::vector<bool> finishes;               // [order] multi-turn: its next turn is taken too
  std::vector<const SharedRequest*> next;   // [order] that next turn
  std::vector<const SharedRequest*> resident;
  std::uint64_t distinct = 0;               // per group, decode tokens included
  std::uint64_t input_tokens = 0;           // of the taken requests
  std::uint64_t resident_tokens = 0;        // inputs of the resident requests (no cache: each its own)
  std::uint64_t capacity = 0;               // entries per group one rank (DP) or all ranks (TP) may need
};

Plan MakePlan(const SharedWorkloadConfig& wl, const std::vector<SharedRequest>& reqs, std::uint32_t limit,
              std::uint32_t steps) {
  Plan p;
  const std::uint32_t g = wl.groups, k = wl.requests_per_group;
  std::vector<std::int64_t> taken_at(reqs.size(), -1);
  for (std::uint32_t turn = 0; turn < k && (limit == 0 || p.order.size() < limit); ++turn) {
    for (std::uint32_t grp = 0; grp < g && (limit == 0 || p.order.size() < limit); ++grp) {
      const SharedRequest& r = reqs[std::size_t{grp} * k + turn];
      taken_at[r.id.value()] = static_cast<std::int64_t>(p.order.size());
      p.order.push_back(&r);
    }
  }
  p.finishes.assign(p.order.size(), false);
  p.next.assign(p.order.size(), nullptr);
  for (std::size_t i = 0; i < p.order.size(); ++i) {
    const SharedRequest& r = *p.order[i];
    p.input_tokens += r.tokens.size();
    const std::size_t succ = r.id.value() + 1;
    if (wl.kind == SharingKind::kMultiTurn && succ < reqs.size() && reqs[succ].group == r.group &&
        taken_at[succ] >= 0) {
      p.finishes[i] = true;
      p.next[i] = &reqs[succ];
    } else {
      p.resident.push_back(&r);
      p.resident_tokens += r.tokens.size();
    }
  }
  std::vector<SharedRequest> res, all;
  for (const SharedRequest* r : p.resident) res.push_back(*r);
  p.distinct = MeasureSharing(res).distinct_tokens + std::uint64_t{steps} * p.resident.size();
  // Capacity: every distinct input token, the finished turns' outputs, the decode tokens;
  // round-robin DP may place copies of one prefix on several ranks: at most every input
  // routed to the rank holding the most.
  std::uint64_t outputs = 0;
  for (std::size_t i = 0; i < p.order.size(); ++i) {
    all.push_back(*p.order[i]);
    if (p.finishes[i]) outputs += p.next[i]->shared_tokens - p.order[i]->tokens.size();
  }
  p.capacity = MeasureSharing(all).distinct_tokens + outputs + std::uint64_t{steps} * p.order.size() + 1024;
  return p;
}

// The output token ids of a finished turn: its next turn's tokens after its own input.
std::span<const std::uint32_t> OutputIds(const SharedRequest& r, const SharedRequest& next) {
  return std::span(next.tokens).subspan(r.tokens.size(), next.shared_tokens - r.tokens.size());
}

struct DpRun {
  std::uint64_t physical = 0, live = 0, prefill = 0, reused = 0, max_rank = 0;
  double mean_rank = 0, route_us = 0;
  std::uint64_t routed_by_prefix = 0, routed_by_room = 0, routed_by_imbalance = 0;
};

// DP: one group (counts x groups by the caller); per-rank caches; routing cache-aware or
// round robin.
DpRun RunDp(const Plan& plan, std::uint32_t p, std::uint32_t steps, bool cache_aware, Backend& counting) {
  AddressSpaceConfig dc;
  dc.num_ranks = p;
  dc.num_groups = 1;
  dc.entry_bytes = 64;
  // Every rank can hold the whole taken set deduplicated, or every input routed round
  // robin to it (the counting backend holds no bytes; pools cost metadata only).
  std::vector<std::uint64_t> rr(p, 0);
  for (std::size_t i = 0; i < plan.order.size(); ++i) rr[i % p] += plan.order[i]->tokens.size() + plan.order[i]->output_tokens + steps;
  const std::uint64_t cap = std::max(plan.capacity, *std::max_element(rr.begin(), rr.end()) + 1024);
  dc.device_bytes_per_rank = cap / 2 * dc.entry_bytes;
  dc.host_bytes_per_rank = (cap - cap / 2) * dc.entry_bytes;
  auto dp = Must(AddressSpace::Create(dc, counting), "DP space");
  std::vector<std::unique_ptr<SparsePrefixCache>> caches;
  std::vector<const SparsePrefixCache*> view;
  for (std::uint32_t r = 0; r < p; ++r) {
    caches.push_back(Must(SparsePrefixCache::Create(*dp, Rank(static_cast<std::uint16_t>(r))), "DP cache"));
    view.push_back(caches.back().get());
  }
  std::vector<std::uint64_t> load(p, 0);  // resident requests per rank (the router's load)
  DpRun run;
  std::chrono::nanoseconds routing{0};
  std::vector<Rank> rank_of(plan.order.size());
  for (std::size_t i = 0; i < plan.order.size(); ++i) {
    const SharedRequest& r = *plan.order[i];
    Rank rank(static_cast<std::uint16_t>(i % p));
    if (cache_aware) {
      const auto t0 = std::chrono::steady_clock::now();
      const RouteDecision d = Must(RouteByPrefix(view, load, r.tokens), "route");
      routing += std::chrono::steady_clock::now() - t0;
      rank = d.rank;
      run.routed_by_prefix += d.why == RouteDecision::Why::kPrefix;
      run.routed_by_room += d.why == RouteDecision::Why::kRoom;
      run.routed_by_imbalance += d.why == RouteDecision::Why::kImbalance;
    }
    rank_of[i] = rank;
    SparsePrefixCache& cache = *caches[rank.value()];
    const RequestId id(r.id.value());
    Must(dp->AddRequest(id, rank), "DP add");
    const SparsePrefixMatch m = cache.Match(r.tokens);
    Must(dp->ShareInto(id, m.addrs), "DP share");
    const auto own = static_cast<std::uint32_t>(r.tokens.size() - m.length);
    Must(dp->Allocate(id, own), "DP allocate");
    run.prefill += own;
    run.reused += m.length;
    Must(cache.Insert(r.tokens, Must(dp->AddressesOf(id), "DP addrs")), "DP insert");
    ++load[rank.value()];
    if (plan.finishes[i]) {
      const auto out = OutputIds(r, *plan.next[i]);
      Must(dp->Allocate(id, static_cast<std::uint32_t>(out.size())), "DP output");
      std::vector<std::uint32_t> seq(r.tokens);
      seq.insert(seq.end(), out.begin(), out.end());
      Must(cache.Insert(seq, Must(dp->AddressesOf(id), "DP addrs")), "DP insert output");
      Must(dp->Free(id), "DP free");
      --load[rank.value()];
    }
  }
  for (std::uint32_t s = 0; s < steps; ++s) {
    for (std::size_t i = 0; i < plan.order.size(); ++i) {
      if (!plan.finishes[i]) Must(dp->Allocate(RequestId(plan.order[i]->id.value()), 1), "DP decode");
    }
  }
  std::uint64_t sum = 0;
  for (std::uint32_t r = 0; r < p; ++r) {
    const std::uint64_t used = dp->NumUsed(Rank(static_cast<std::uint16_t>(r)), GroupId(0), Tier::kDevice) +
                               dp->NumUsed(Rank(static_cast<std::uint16_t>(r)), GroupId(0), Tier::kHost);
    run.physical += used;
    sum += used;
    run.max_rank = std::max(run.max_rank, used);
  }
  run.mean_rank = double(sum) / p;
  run.live = dp->num_live_addresses();
  run.route_us = plan.order.empty() ? 0 : routing.count() / 1e3 / double(plan.order.size());
  Must(dp->CheckInvariants(), "DP invariants");
  for (const auto& c : caches) Must(c->CheckInvariants(), "DP cache invariants");
  return run;
}

struct TpRunShared {
  std::uint64_t physical = 0, buffered = 0, live = 0, prefill = 0, selections = 0, distinct_selected = 0;
  std::uint64_t remote_fetches = 0;
};

TpRunShared RunTpShared(const Plan& plan, const ModelConfig& model, const SharedWorkloadConfig& wl,
                        const SelectionModelParams& sp, std::uint32_t p, std::uint32_t steps, double buffer_factor,
                        TpAttention attention, Backend& counting) {
  const std::uint32_t groups = model.num_groups(), entry = model.group_entry_bytes(), queries = wl.queries_per_step();
  const std::uint64_t cap = plan.capacity;  // TP stores every distinct entry once
  TpConfig tc;
  tc.num_ranks = p;
  tc.num_groups = groups;
  tc.entry_bytes = entry;
  tc.attention = attention;
  tc.device_bytes_per_rank = ((cap + p - 1) / p + 1024) * entry * groups;
  const std::uint64_t remote = std::uint64_t{static_cast<std::uint32_t>(plan.resident.size())} * model.top_k * queries * (p - 1) / p;
  tc.buffer_bytes_per_rank =
      attention == TpAttention::kAtHome ? 0 : static_cast<std::uint64_t>(buffer_factor * remote) * entry * groups;
  auto tp = Must(TpAddressSpace::Create(tc, counting), "TP space");
  auto cache = Must(SparsePrefixCache::Create(*tp), "TP cache");
  TpRunShared run;
  for (std::size_t i = 0; i < plan.order.size(); ++i) {
    const SharedRequest& r = *plan.order[i];
    const RequestId id(r.id.value());
    Must(tp->AddRequest(id), "TP add");
    const SparsePrefixMatch m = cache->Match(r.tokens);
    Must(tp->ShareInto(id, m.addrs), "TP share");
    const auto own = static_cast<std::uint32_t>(r.tokens.size() - m.length);
    Must(tp->Allocate(id, own), "TP allocate");
    run.prefill += own;
    Must(cache->Insert(r.tokens, Must(tp->AddressesOf(id), "TP addrs")), "TP insert");
    if (plan.finishes[i]) {
      const auto out = OutputIds(r, *plan.next[i]);
      Must(tp->Allocate(id, static_cast<std::uint32_t>(out.size())), "TP output");
      std::vector<std::uint32_t> seq(r.tokens);
      seq.insert(seq.end(), out.begin(), out.end());
      Must(cache->Insert(seq, Must(tp->AddressesOf(id), "TP addrs")), "TP insert output");
      Must(tp->Free(id), "TP free");
    }
  }
  tp->AdvanceRound();
  auto selector = Must(SelectionModel::Create(sp), "selection model");
  TpStepPlanner planner(*tp, nullptr, {.parallel_ranks = false});
  std::vector<std::vector<std::uint32_t>> per_query;
  std::vector<LogicalAddr> sel;
  std::vector<SelectionRun> runs;
  for (std::uint32_t s = 0; s < steps; ++s) {
    for (std::uint32_t g = 0; g < groups; ++g) {
      sel.clear();
      runs.clear();
      for (const SharedRequest* r : plan.resident) {
        const auto addrs = Must(tp->AddressesOf(RequestId(r->id.value())), "TP addrs");
        Must(selector.Step(r->id.value() * groups + g, static_cast<std::uint32_t>(addrs.size()), queries, per_query),
             "selections");
        const std::size_t first = sel.size();
        for (const auto& q : per_query) {
          for (std::uint32_t pos : q) sel.push_back(addrs[pos]);
        }
        runs.push_back(SelectionRun{RequestId(r->id.value()), static_cast<std::uint32_t>(sel.size() - first)});
      }
      const TpStepPlan step = Must(planner.Step(GroupId(static_cast<std::uint16_t>(g)), sel, runs), "TP step");
      const StepStats t = step.Total();
      run.selections += sel.size();
      run.distinct_selected += t.distinct / p;
      run.remote_fetches += t.remote_fetches;
    }
    tp->AdvanceRound();
    for (const SharedRequest* r : plan.resident) Must(tp->Allocate(RequestId(r->id.value()), 1), "TP decode");
  }
  const TpStoredEntries stored = CountTpStoredEntries(*tp);
  run.physical = stored.physical();
  run.buffered = stored.buffered;
  run.live = tp->num_live_addresses() * groups;
  Must(tp->CheckInvariants(), "TP invariants");
  Must(cache->CheckInvariants(), "TP cache invariants");
  return run;
}

}  // namespace

TpStoredEntries CountTpStoredEntries(const TpAddressSpace& tp) {
  TpStoredEntries n;
  for (std::uint32_t r = 0; r < tp.config().num_ranks; ++r) {
    for (std::uint32_t g = 0; g < tp.config().num_groups; ++g) {
      const Rank rank(static_cast<std::uint16_t>(r));
      const GroupId gid(static_cast<std::uint16_t>(g));
      n.pooled += tp.NumUsed(rank, gid, Tier::kDevice) + tp.NumUsed(rank, gid, Tier::kHost);
      n.buffered += tp.NumBuffered(rank, gid);
    }
  }
  return n;
}

int RunDupShared(const SharedDupOptions& o) {
  const std::filesystem::path dir = o.config_dir.empty() ? DefaultConfigDir() : std::filesystem::path(o.config_dir);
  const ModelConfig model = Must(LoadModelConfigByName(o.model, dir), "model");
  const SharedWorkloadConfig wl = Must(LoadSharedWorkloadConfigByName(o.workload, dir), "workload");
  const auto reqs = Must(GenerateSharedWorkload(wl), "workload");
  SelectionModelParams sp = Must(LoadScenarioConfig(dir / "scenarios" / "default.json", dir), "scenario").selection;
  sp.top_k = model.top_k;
  sp.seed = wl.seed;
  const Plan plan = MakePlan(wl, reqs, o.requests, o.steps);
  const std::uint32_t p = o.ranks, groups = model.num_groups();
  auto counting = MakeCountingBackend();
  const TpRunShared home = RunTpShared(plan, model, wl, sp, p, o.steps, o.buffer_factor, TpAttention::kAtHome, *counting);
  const TpRunShared buffered =
      RunTpShared(plan, model, wl, sp, p, o.steps, o.buffer_factor, TpAttention::kLocalBuffer, *counting);
  const DpRun aware = RunDp(plan, p, o.steps, /*cache_aware=*/true, *counting);
  const DpRun rr = RunDp(plan, p, o.steps, /*cache_aware=*/false, *counting);

  const std::uint64_t n_res = plan.resident.size();
  const std::uint64_t d = plan.distinct * groups;  // distinct entries, all groups
  const std::uint64_t hs = n_res * o.hisparse_buffer * groups;
  const std::uint64_t no_cache = (plan.resident_tokens + o.steps * n_res) * groups;
  struct Row {
    std::string system, mode, note;
    std::uint64_t physical;
  };
  const std::vector<Row> rows = {
      {"no_cache", "tp", "every request its own prefix, on every GPU", p * no_cache},
      {"all_gpu", "tp", "radix cache per GPU: every GPU stores every prefix", p * d},
      {"hisparse", "tp", "radix cache per GPU + per-request device buffers", p * (d + hs)},
      {"ulacache", "tp", "shared addresses, local buffers", buffered.physical},
      {"ulacache_home", "tp", "shared addresses, attention at home", home.physical},
      {"no_cache", "dp", "every request its own prefix", no_cache},
      {"all_gpu", "dp", "radix cache per rank, cache-aware routing", aware.live * groups},
      {"hisparse", "dp", "radix cache per rank + per-request device buffers", aware.live * groups + hs},
      {"ulacache", "dp", "shared addresses, cache-aware routing", aware.physical * groups},
      {"ulacache_rr", "dp", "shared addresses, round-robin routing", rr.physical * groups},
  };
  const SharingStats taken_stats = [&] {
    std::vector<SharedRequest> t;
    for (const SharedRequest* r : plan.order) t.push_back(*r);
    return MeasureSharing(t);
  }();
  if (o.json) {
    nlohmann::json j;
    j["systems"] = nlohmann::json::array();
    for (const Row& r : rows) {
      j["systems"].push_back({{"system", r.system}, {"mode", r.mode}, {"ranks", p}, {"physical_entries", r.physical},
                              {"distinct_entries", d}, {"copies", r.physical - std::min(r.physical, d)},
                              {"distinct_fraction", r.physical ? double(d) / double(r.physical) : 0.0}});
    }
    j["scenario"] = {{"model", model.name}, {"workload", wl.name}, {"sharing", SharingKindName(wl.kind)},
                     {"requests", plan.order.size()}, {"resident", n_res}, {"groups", groups}, {"steps", o.steps},
                     {"input_tokens", taken_stats.input_tokens}, {"distinct_input_tokens", taken_stats.distinct_tokens},
                     {"shared_fraction", taken_stats.shared_fraction()}};
    j["dp_routing"] = {{"cache_aware", {{"prefill_tokens", aware.prefill}, {"reused_tokens", aware.reused},
                                        {"max_rank_entries", aware.max_rank}, {"mean_rank_entries", aware.mean_rank},
                                        {"route_us_per_request", aware.route_us},
                                        {"by_prefix", aware.routed_by_prefix}, {"by_room", aware.routed_by_room},
                                        {"by_imbalance", aware.routed_by_imbalance}}},
                       {"round_robin", {{"prefill_tokens", rr.prefill}, {"reused_tokens", rr.reused},
                                        {"max_rank_entries", rr.max_rank}, {"mean_rank_entries", rr.mean_rank}}}};
    j["prefill_tokens_saved"] = {{"tp", taken_stats.input_tokens - home.prefill},
                                 {"dp_cache_aware", taken_stats.input_tokens - aware.prefill},
                                 {"dp_round_robin", taken_stats.input_tokens - rr.prefill}};
    j["tp"] = {{"prefill_tokens", home.prefill}, {"home_live_entries", home.live},
               {"local_buffer_entries", buffered.buffered}, {"selections", buffered.selections},
               {"remote_fetches", buffered.remote_fetches}};
    fmt::print("{}\n", j.dump());
    return 0;
  }
  fmt::print("ula bench dup: model {} workload {} ({}): {} requests taken, {} resident, {} groups, {} ranks, {} steps\n",
             model.name, wl.name, SharingKindName(wl.kind), plan.order.size(), n_res, groups, p, o.steps);
  fmt::print("input tokens {}, distinct {} (shared fraction {:.4f})\n", taken_stats.input_tokens,
             taken_stats.distinct_tokens, taken_stats.shared_fraction());
  fmt::print("{:<14} {:<4} {:>16} {:>16} {:>16} {:>9}  {}\n", "system", "mode", "physical", "distinct", "copies",
             "fraction", "");
  for (const Row& r : rows) {
    fmt::print("{:<14} {:<4} {:>16} {:>16} {:>16} {:>9.4f}  {}\n", r.system, r.mode, r.physical, d,
               r.physical - std::min(r.physical, d), double(d) / double(r.physical), r.note);
  }
  fmt::print("DP routing (per group): cache-aware: prefill {} tokens, reused {}, rank entries max {} mean {:.0f}, "
             "{:.2f} us per decision (by prefix {}, by room {}, by imbalance {}); round robin: prefill {}, reused {}, "
             "max {} mean {:.0f}\n",
             aware.prefill, aware.reused, aware.max_rank, aware.mean_rank, aware.route_us, aware.routed_by_prefix,
             aware.routed_by_room, aware.routed_by_imbalance, rr.prefill, rr.reused, rr.max_rank, rr.mean_rank);
  fmt::print("TP: prefill {} tokens; local buffers hold {} copies; {} selections, {} remote fetches\n", home.prefill,
             buffered.buffered, buffered.selections, buffered.remote_fetches);
  fmt::print("prefill tokens saved (of {} input tokens): TP {}, DP cache-aware {}, DP round robin {}\n",
             taken_stats.input_tokens, taken_stats.input_tokens - home.prefill, taken_stats.input_tokens - aware.prefill,
             taken_stats.input_tokens - rr.prefill);
  return 0;
}

}  // namespace ula::cli

// The SimSystem adapters (serving_systems.h). Each keeps its own request table: request id
// -> admitted length (ledger release) and, for UlaCache, the logical addresses that the
// address space handed out, so that a selected position p of a request is addrs[p].
#include "serving/serving_systems.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "ula/address_space.h"
#include "ula/backend.h"
#include "ula/step_planner.h"
#include "ula/tp_address_space.h"
#include "ula/tp_fabric.h"
#include "ula/tp_step_planner.h"

namespace ula::serving_internal {
namespace {

struct Admitted {
  std::uint32_t rank = 0;
  std::uint32_t final_tokens = 0;
};

// Ledger bookkeeping shared by every adapter.
class LedgerSystem : public SimSystem {
 public:
  explicit LedgerSystem(AdmissionLedger ledger) : ledger_(std::move(ledger)) {}

 protected:
  // Ledger part of Admit; nullopt if it does not fit.
  std::optional<std::uint32_t> Reserve(std::uint64_t id, std::uint32_t final_tokens) {
    auto rank = ledger_.TryAdmit(final_tokens);
    if (rank) admitted_[id] = {*rank, final_tokens};
    return rank;
  }
  void Unreserve(std::uint64_t id) {
    auto it = admitted_.find(id);
    if (it == admitted_.end()) return;
    ledger_.Release(it->second.rank, it->second.final_tokens);
    admitted_.erase(it);
  }
  Status ReleaseOrError(std::uint64_t id) {
    if (!admitted_.contains(id)) return MakeError(ErrorCode::kNotFound, fmt::format("request {} not admitted", id));
    Unreserve(id);
    return Ok();
  }

  AdmissionLedger ledger_;
  std::unordered_map<std::uint64_t, Admitted> admitted_;
};

class AllGpuSystem final : public LedgerSystem {
 public:
  using LedgerSystem::LedgerSystem;
  Result<bool> Admit(std::uint64_t id, std::uint32_t, std::uint32_t final_tokens) override {
    return Reserve(id, final_tokens).has_value();
  }
  Status Finish(std::uint64_t id) override { return ReleaseOrError(id); }
  Status Step(std::span<const std::uint64_t> ids, std::span<const std::vector<std::uint32_t>> sel,
              SimCounters& c) override {
    for (std::size_t i = 0; i < ids.size(); ++i) {
      // Every entry is on device: each distinct selection is a hit.
      seen_.clear();
      for (std::uint32_t p : sel[i]) seen_.insert(p);
      c.distinct += seen_.size();
      c.hits += seen_.size();
    }
    return Ok();
  }
  Status Append(std::uint64_t, std::uint32_t, std::uint32_t, SimCounters&) override { return Ok(); }

 private:
  std::unordered_set<std::uint32_t> seen_;
};

class HiSparseSystem final : public LedgerSystem {
 public:
  HiSparseSystem(AdmissionLedger ledger, HiSparseBuffers buffers)
      : LedgerSystem(std::move(ledger)), buffers_(std::move(buffers)) {}
  Result<bool> Admit(std::uint64_t id, std::uint32_t history, std::uint32_t final_tokens) override {
    if (!Reserve(id, final_tokens)) return false;
    if (auto s = buffers_.AddRequest(id, history); !s) {
      Unreserve(id);
      return std::unexpected(s.error());
    }
    return true;
  }
  Status Finish(std::uint64_t id) override {
    ULA_RETURN_IF_ERROR(buffers_.Finish(id));
    return ReleaseOrError(id);
  }
  Status Step(std::span<const std::uint64_t> ids, std::span<const std::vector<std::uint32_t>> sel,
              SimCounters& c) override {
    for (std::size_t i = 0; i < ids.size(); ++i) {
      auto st = buffers_.Step(ids[i], sel[i]);
      if (!st) return std::unexpected(st.error());
      c.distinct += st->distinct;
      c.hits += st->hits;
      c.h2d += st->misses;  // fetched from the host copy; evicted copies are dropped
    }
    buffers_.AdvanceRound();
    return Ok();
  }
  Status Append(std::uint64_t id, std::uint32_t, std::uint32_t n, SimCounters& c) override {
    ULA_RETURN_IF_ERROR(buffers_.Append(id, n));
    c.d2h += n;  // every new token is backed up to host
    return Ok();
  }

 private:
  HiSparseBuffers buffers_;
};

// dcp, dcp_sglang, helix: the context-parallel systems. Every entry lives on its home rank's
// device; the step counts the distinct selections homed on the rank whose attention sets the
// step time.
class ContextParallelSystem final : public LedgerSystem {
 public:
  ContextParallelSystem(AdmissionLedger ledger, SystemKind kind)
      : LedgerSystem(std::move(ledger)), kind_(kind), per_rank_(ledger_.rules().num_ranks, 0.0) {}
  Result<bool> Admit(std::uint64_t id, std::uint32_t, std::uint32_t final_tokens) override {
    return Reserve(id, final_tokens).has_value();
  }
  Status Finish(std::uint64_t id) override { return ReleaseOrError(id); }
  bool striped_indexer() const override { return kind_ != SystemKind::kDcpSglang; }  // SGLang replicates the keys
  bool attention_at_home() const override { return true; }
  Status Step(std::span<const std::uint64_t> ids, std::span<const std::vector<std::uint32_t>> sel,
              SimCounters& c) override {
    const std::uint32_t p = ledger_.rules().num_ranks;
    const std::uint32_t block = kind_ == SystemKind::kHelix ? ledger_.rules().helix_tokens_per_block : 1;
    std::fill(per_rank_.begin(), per_rank_.end(), 0.0);
    double total = 0;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      seen_.clear();
      for (std::uint32_t pos : sel[i]) seen_.insert(pos);
      for (std::uint32_t pos : seen_) per_rank_[(pos / block) % p] += 1;
      total += double(seen_.size());
    }
    // helix: the busiest rank; dcp: rank 0 (token striping is symmetric, as ulacache_home's).
    const double home = kind_ == SystemKind::kHelix ? *std::max_element(per_rank_.begin(), per_rank_.end()) : per_rank_[0];
    c.distinct += home;
    c.hits += home;
    c.home += home;
    c.batch_distinct += total;
    return Ok();
  }
  Status Append(std::uint64_t, std::uint32_t, std::uint32_t, SimCounters&) override { return Ok(); }

 private:
  SystemKind kind_;
  std::vector<double> per_rank_;
  std::unordered_set<std::uint32_t> seen_;
};

// vllm_hisparse (serving_systems.h): resident pages as a fraction of the device room, hot
// buffers for the rest, host mirror of every new token.
class VllmHiSparseSystem final : public LedgerSystem {
 public:
  static constexpr std::uint32_t kPageTokens = 64;
  VllmHiSparseSystem(AdmissionLedger ledger, HiSparseBuffers hot, double resident_device_bytes)
      : LedgerSystem(std::move(ledger)), hot_(std::move(hot)), room_bytes_(resident_device_bytes) {}
  Result<bool> Admit(std::uint64_t id, std::uint32_t history, std::uint32_t final_tokens) override {
    if (!Reserve(id, final_tokens)) return false;
    if (auto s = hot_.AddRequest(id, history); !s) {
      Unreserve(id);
      return std::unexpected(s.error());
    }
    history_[id] = history;
    return true;
  }
  Status Finish(std::uint64_t id) override {
    ULA_RETURN_IF_ERROR(hot_.Finish(id));
    history_.erase(id);
    return ReleaseOrError(id);
  }
  Status Step(std::span<const std::uint64_t> ids, std::span<const std::vector<std::uint32_t>> sel,
              SimCounters& c) override {
    const double f = ResidentFraction(ids);
    const std::uint32_t tail = ledger_.rules().tail_entries;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const std::uint32_t h = history_.at(ids[i]);
      seen_.clear();
      cold_.clear();
      double resident = 0;
      for (std::uint32_t pos : sel[i]) {
        if (!seen_.insert(pos).second) continue;
        if (pos + tail >= h || PageResident(ids[i], pos / kPageTokens, f)) {
          resident += 1;  // short-circuit: read where it lives, no hot-buffer slot
        } else {
          cold_.push_back(pos);
        }
      }
      auto st = hot_.Step(ids[i], cold_);
      if (!st) return std::unexpected(st.error());
      c.distinct += resident + double(st->distinct);
      c.hits += resident + double(st->hits);
      c.h2d += double(st->misses);
    }
    hot_.AdvanceRound();
    return Ok();
  }
  Status Append(std::uint64_t id, std::uint32_t, std::uint32_t n, SimCounters& c) override {
    ULA_RETURN_IF_ERROR(hot_.Append(id, n));
    history_.at(id) += n;
    c.d2h += n;  // eager_host_mirror: decode-written rows are mirrored to the host pool
    return Ok();
  }

 private:
  // Device room left beside the ledger's reservations, over the running histories' KV.
  double ResidentFraction(std::span<const std::uint64_t> ids) const {
    const PlacementRules& r = ledger_.rules();
    double histories = 0;
    for (std::uint64_t id : ids) histories += history_.at(id);
    const double room = std::max(0.0, room_bytes_ - ledger_.device_only(0)) / r.kv_bytes_per_token;
    return histories > 0 ? std::min(1.0, room / histories) : 1.0;
  }
  // A seeded hash of (request, page) in [0, 1) below f.
  static bool PageResident(std::uint64_t id, std::uint32_t page, double f) {
    if (f >= 1) return true;
    std::uint64_t x = id * 0x9E3779B97F4A7C15ull + page + 1;
    x ^= x >> 30, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 27, x *= 0x94D049BB133111EBull, x ^= x >> 31;
    return double(x >> 11) * 0x1.0p-53 < f;
  }

  HiSparseBuffers hot_;
  double room_bytes_;
  std::unordered_map<std::uint64_t, std::uint32_t> history_;
  std::unordered_set<std::uint32_t> seen_;
  std::vector<std::uint32_t> cold_;
};

// The UlaCache adapters (DP and TP) share admission, finish and the flattening of a step's
// selections: a request's whole history is allocated in the address space when it is
// admitted. The backend is declared before the space so that it outlives it.
template <class Space>
class SpaceSystem : public LedgerSystem {
 public:
  SpaceSystem(AdmissionLedger ledger, std::unique_ptr<Backend> backend, std::unique_ptr<Space> space)
      : LedgerSystem(std::move(ledger)), backend_(std::move(backend)), space_(std::move(space)) {}

  Result<bool> Admit(std::uint64_t id, std::uint32_t, std::uint32_t final_tokens) override {
    if (!Reserve(id, final_tokens)) return false;
    const RequestId req(id);
    if (auto s = AddToSpace(req); !s) {
      Unreserve(id);
      return std::unexpected(s.error());
    }
    auto addrs = space_->Allocate(req, final_tokens);
    if (!addrs) {
      (void)space_->Free(req);
      Unreserve(id);
      if (addrs.error().code() == ErrorCode::kResourceExhausted) return false;
      return std::unexpected(addrs.error());
    }
    addrs_[id] = std::move(*addrs);
    return true;
  }
  Status Finish(std::uint64_t id) override {
    ULA_RETURN_IF_ERROR(space_->Free(RequestId(id)));
    addrs_.erase(id);
    return ReleaseOrError(id);
  }

  Result<bool> AdmitShared(std::uint64_t id, std::uint32_t, std::uint32_t final_tokens, std::uint32_t group,
                           std::uint32_t matched, std::uint32_t cache) override {
    if (matched > final_tokens || cache > final_tokens) {
      return MakeError(ErrorCode::kInvalidArgument, fmt::format("request {}: prefix longer than its history", id));
    }
    std::span<const LogicalAddr> share;
    if (matched > 0) {
      auto it = prefixes_.find(group);
      if (it == prefixes_.end() || it->second.size() < matched) {
        return MakeError(ErrorCode::kNotFound, fmt::format("group {}: no cached prefix of {} tokens", group, matched));
      }
      share = std::span<const LogicalAddr>(it->second).first(matched);
    }
    if (!Reserve(id, final_tokens)) return false;
    const RequestId req(id);
    auto undo = [&] {
      (void)space_->Free(req);
      Unreserve(id);
    };
    if (auto s = AddToSpace(req); !s) {
      Unreserve(id);
      return std::unexpected(s.error());
    }
    if (auto s = space_->ShareInto(req, share); !s) {
      undo();
      return std::unexpected(s.error());
    }
    auto own = space_->Allocate(req, final_tokens - matched);
    if (!own) {
      undo();
      if (own.error().code() == ErrorCode::kResourceExhausted) return false;
      return std::unexpected(own.error());
    }
    std::vector<LogicalAddr> addrs(share.begin(), share.end());
    addrs.insert(addrs.end(), own->begin(), own->end());
    if (cache > 0) {
      std::vector<LogicalAddr> cached(addrs.begin(), addrs.begin() + cache);
      if (auto s = space_->Retain(cached); !s) {
        undo();
        return std::unexpected(s.error());
      }
      if (auto old = prefixes_.find(group); old != prefixes_.end()) ULA_RETURN_IF_ERROR(space_->Release(old->second));
      prefixes_[group] = std::move(cached);
    }
    addrs_[id] = std::move(addrs);
    return true;
  }
  Status FinishShared(std::uint64_t id, std::uint32_t group, bool extends) override {
    if (extends) {
      auto it = addrs_.find(id);
      if (it == addrs_.end()) return MakeError(ErrorCode::kNotFound, fmt::format("request {} not admitted", id));
      ULA_RETURN_IF_ERROR(space_->Retain(it->second));  // before the old one goes: it is a prefix of this
      if (auto old = prefixes_.find(group); old != prefixes_.end()) ULA_RETURN_IF_ERROR(space_->Release(old->second));
      prefixes_[group] = it->second;
    }
    return Finish(id);
  }
  Status EvictPrefix(std::uint32_t group) override {
    auto it = prefixes_.find(group);
    if (it == prefixes_.end()) return MakeError(ErrorCode::kNotFound, fmt::format("group {}: no cached prefix", group));
    ULA_RETURN_IF_ERROR(space_->Release(it->second));
    prefixes_.erase(it);
    return Ok();
  }

 protected:
  virtual Status AddToSpace(RequestId req) = 0;
  // flat_ = the logical addresses of every request's selected positions, in batch order;
  // runs_ = one run per request.
  void Flatten(std::span<const std::uint64_t> ids, std::span<const std::vector<std::uint32_t>> sel) {
    flat_.clear();
    runs_.clear();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const std::vector<LogicalAddr>& a = addrs_.at(ids[i]);
      for (std::uint32_t p : sel[i]) flat_.push_back(a[p]);
      runs_.push_back(SelectionRun{RequestId(ids[i]), static_cast<std::uint32_t>(sel[i].size())});
    }
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Space> space_;
  std::unordered_map<std::uint64_t, std::vector<LogicalAddr>> addrs_;  // [request] its whole history
  // Sharing: group -> the addresses of its cached prefix, each with one cache reference.
  std::unordered_map<std::uint32_t, std::vector<LogicalAddr>> prefixes_;
  std::vector<LogicalAddr> flat_;
  std::vector<SelectionRun> runs_;
};

class UlaDpSystem final : public SpaceSystem<AddressSpace> {
 public:
  UlaDpSystem(AdmissionLedger ledger, std::unique_ptr<Backend> backend, std::unique_ptr<AddressSpace> space)
      : SpaceSystem(std::move(ledger), std::move(backend), std::move(space)), planner_(*space_) {}

  Status Step(std::span<const std::uint64_t> ids, std::span<const std::vector<std::uint32_t>> sel,
              SimCounters& c) override {
    Flatten(ids, sel);
    slots_.resize(flat_.size());
    auto st = planner_.Step(StepInput{Rank(0), GroupId(0), flat_, runs_}, slots_);
    if (!st) return std::unexpected(st.error());
    space_->AdvanceRound();
    c.distinct += st->distinct;
    c.hits += st->hits;
    c.h2d += st->misses;
    c.d2h += st->evictions - st->shadow_evictions;  // a swap or a copy sends the victim to host; a shadow does not
    return Ok();
  }
  Status Append(std::uint64_t id, std::uint32_t history, std::uint32_t n, SimCounters& c) override {
    // The addresses exist since admission; a new token whose entry sits on host is written
    // there over the host link.
    const std::vector<LogicalAddr>& a = addrs_.at(id);
    for (std::uint32_t i = 0; i < n && history + i < a.size(); ++i) {
      auto loc = space_->Lookup(a[history + i], GroupId(0));
      if (!loc) return std::unexpected(loc.error());
      if (loc->tier() == Tier::kHost) c.d2h += 1;
    }
    return Ok();
  }

 private:
  Status AddToSpace(RequestId req) override { return space_->AddRequest(req, Rank(0)); }

  StepPlanner planner_;
  std::vector<SlotId> slots_;
};

// The fabric of a TP space that hosts only rank 0 in counting mode: there are no bytes to
// fetch and no other processes to agree with (every rank sees the same symmetric load).
class CountingFabric final : public TpFabric {
 public:
  explicit CountingFabric(std::uint32_t p) : p_(p) {}
  std::uint32_t num_ranks() const override { return p_; }
  Rank local_rank() const override { return Rank(0); }
  Status Expose(const TpAddressSpace&) override { return Ok(); }
  void Unexpose() override {}
  bool AllTrue(bool mine) override { return mine; }
  void Barrier() override {}
  Status FetchFromHome(Rank, GroupId, std::span<const LogicalAddr>, std::span<std::byte* const>) override { return Ok(); }
  Status AllGather(std::span<const std::byte>, std::span<std::byte>) override { return Ok(); }

 private:
  std::uint32_t p_;
};

class UlaTpSystem final : public SpaceSystem<TpAddressSpace> {
 public:
  UlaTpSystem(AdmissionLedger ledger, std::unique_ptr<Backend> backend, std::unique_ptr<CountingFabric> fabric,
              std::unique_ptr<TpAddressSpace> space)
      : SpaceSystem(std::move(ledger), std::move(backend), std::move(space)),
        fabric_(std::move(fabric)),
        planner_(*space_, fabric_.get(), TpPlannerOptions{.parallel_ranks = false}) {}

  bool striped_indexer() const override { return true; }
  bool attention_at_home() const override { return space_->config().attention == TpAttention::kAtHome; }
  Status Step(std::span<const std::uint64_t> ids, std::span<const std::vector<std::uint32_t>> sel,
              SimCounters& c) override {
    Flatten(ids, sel);
    auto plan = planner_.Step(GroupId(0), flat_, runs_);
    if (!plan) return std::unexpected(plan.error());
    space_->AdvanceRound();
    const StepStats& s = plan->stats[0];  // rank 0, the simulated one
    const double home = double(s.hits) + double(s.misses);
    // At home rank 0 reads only its own shard's selections (the rest are kElsewhere, left to
    // their homes); with the local buffer it reads the whole union.
    c.distinct += attention_at_home() ? home : double(s.distinct);
    c.hits += s.hits + s.buffer_hits;
    c.h2d += s.misses;
    c.d2h += s.evictions - s.shadow_evictions;  // an eviction to its shadow sends nothing
    c.nvlink += s.remote_fetches;  // 0 at home
    c.batch_distinct += s.distinct;
    c.home += home;
    return Ok();
  }
  Status Append(std::uint64_t id, std::uint32_t history, std::uint32_t n, SimCounters& c) override {
    const std::vector<LogicalAddr>& a = addrs_.at(id);
    for (std::uint32_t i = 0; i < n && history + i < a.size(); ++i) {
      const LogicalAddr addr = a[history + i];
      if (!space_->Hosts(space_->HomeOf(addr))) continue;  // another rank's write
      auto loc = space_->Lookup(addr, GroupId(0));
      if (!loc) return std::unexpected(loc.error());
      if (loc->tier() == Tier::kHost) c.d2h += 1;
    }
    return Ok();
  }

 private:
  Status AddToSpace(RequestId req) override { return space_->AddRequest(req); }

  std::unique_ptr<CountingFabric> fabric_;
  TpStepPlanner planner_;
};

}  // namespace

Result<std::unique_ptr<SimSystem>> MakeSimSystem(const SimSystemConfig& cfg) {
  auto ledger = AdmissionLedger::Create(cfg.rules);
  if (!ledger) return std::unexpected(ledger.error());
  switch (cfg.rules.system) {
    case SystemKind::kAllGpu:
      return std::unique_ptr<SimSystem>(new AllGpuSystem(std::move(*ledger)));
    case SystemKind::kHiSparse:
    case SystemKind::kTrtllmOffload: {  // its per-request GPU cache: the same LRU buffer
      auto buffers = HiSparseBuffers::Create(cfg.rules.hisparse_buffer_entries);
      if (!buffers) return std::unexpected(buffers.error());
      return std::unique_ptr<SimSystem>(new HiSparseSystem(std::move(*ledger), std::move(*buffers)));
    }
    case SystemKind::kDcp:
    case SystemKind::kDcpSglang:
    case SystemKind::kHelix:  // TP only: the ledger's rules refused them in DP mode
      return std::unique_ptr<SimSystem>(new ContextParallelSystem(std::move(*ledger), cfg.rules.system));
    case SystemKind::kVllmHiSparse: {
      auto hot = HiSparseBuffers::Create(cfg.rules.hisparse_buffer_entries);
      if (!hot) return std::unexpected(hot.error());
      return std::unique_ptr<SimSystem>(
          new VllmHiSparseSystem(std::move(*ledger), std::move(*hot), cfg.resident_device_bytes));
    }
    case SystemKind::kUlaCache:
    case SystemKind::kUlaCacheAtHome:  // TP only: the ledger's rules refused it in DP mode
      break;
  }
  const std::uint64_t e = cfg.group_entry_bytes;
  auto backend = MakeCountingBackend();
  if (cfg.rules.mode == ParallelMode::kDp) {
    AddressSpaceConfig ac;
    ac.num_ranks = 1;
    ac.num_groups = 1;
    ac.entry_bytes = cfg.group_entry_bytes;
    ac.device_bytes_per_rank = cfg.device_tokens * e;
    ac.host_bytes_per_rank = cfg.host_tokens * e;
    ac.host_shadows = cfg.host_shadows;
    auto space = AddressSpace::Create(ac, *backend);
    if (!space) return std::unexpected(space.error());
    return std::unique_ptr<SimSystem>(new UlaDpSystem(std::move(*ledger), std::move(backend), std::move(*space)));
  }
  TpConfig tc;
  tc.num_ranks = cfg.rules.num_ranks;
  tc.num_groups = 1;
  tc.entry_bytes = cfg.group_entry_bytes;
  tc.device_bytes_per_rank = cfg.device_tokens * e;
  tc.host_bytes_per_rank = cfg.host_tokens * e;
  tc.buffer_bytes_per_rank = cfg.buffer_tokens * e;  // TpConfig::Validate refuses a buffer at home
  tc.attention = cfg.rules.system == SystemKind::kUlaCacheAtHome ? TpAttention::kAtHome : TpAttention::kLocalBuffer;
  tc.host_shadows = cfg.host_shadows;
  const Rank hosted[] = {Rank(0)};
  auto space = TpAddressSpace::Create(tc, *backend, hosted);
  if (!space) return std::unexpected(space.error());
  auto fabric = std::make_unique<CountingFabric>(tc.num_ranks);
  return std::unique_ptr<SimSystem>(
      new UlaTpSystem(std::move(*ledger), std::move(backend), std::move(fabric), std::move(*space)));
}

}  // namespace ula::serving_internal

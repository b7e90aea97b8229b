#include "policy/policy_replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>

#include "backend/slot_pool.h"

namespace ula::policy {
namespace {

constexpr std::uint32_t kNone = ~std::uint32_t{0};
constexpr std::uint32_t kSlotBytes = 656;  // a GLM-5 FP8 entry of one layer; nothing is copied
constexpr std::size_t kPrefetchAhead = 16;   // lookup: selections between a prefetch and its use

}  // namespace

Status SelectionTrace::Validate() const {
  auto bad = [](const std::string& what) { return MakeError(ErrorCode::kInvalidArgument, "trace: " + what); };
  if (batch == 0 || steps == 0 || context_tokens == 0) return bad("batch, steps and context_tokens must be >= 1");
  if (num_addresses != std::uint64_t{batch} * (std::uint64_t{context_tokens} + steps)) {
    return bad("num_addresses must be batch * (context_tokens + steps)");
  }
  if (num_addresses > kNone) return bad("batch * (context + steps) exceeds 2^32 - 1");
  if (step_begin.size() != std::size_t{steps} + 1 || step_begin.front() != 0 ||
      step_begin.back() != selections.size() || !std::is_sorted(step_begin.begin(), step_begin.end())) {
    return bad("step_begin must be [steps + 1] non-decreasing offsets from 0 to selections.size()");
  }
  for (LogicalAddr a : selections) {
    if (a.value() >= num_addresses) return bad("address " + std::to_string(a.value()) + " out of range");
  }
  return Ok();
}

namespace {

// One policy's replay state: the device pool, the address <-> slot maps, the policy.
class Replayer {
 public:
  static Result<std::unique_ptr<Replayer>> Create(const SelectionTrace& trace, const ReplayConfig& config) {
    ULA_RETURN_IF_ERROR(trace.Validate());
    const SelectionTrace& tc = trace;
    if (!(config.pool_fraction > 0 && config.pool_fraction <= 1)) {
      return MakeError(ErrorCode::kInvalidArgument, "replay: pool_fraction must be in (0, 1]");
    }
    if (config.warmup_steps >= tc.steps) {
      return MakeError(ErrorCode::kInvalidArgument, "replay: warmup_steps must be < the trace's steps");
    }
    const auto slots = static_cast<std::uint32_t>(
        std::min<double>(kNone - 1, std::floor(config.pool_fraction * tc.batch * tc.context_tokens)));
    auto pool = SlotPool::Create(Arena{ArenaId(0), Tier::kDevice, Rank(0), std::uint64_t{slots} * kSlotBytes, nullptr},
                                 kSlotBytes, slots);
    if (!pool) return std::unexpected(pool.error());
    auto policy = MakePolicy(config.policy, slots, config.options);
    if (!policy) return std::unexpected(policy.error());
    return std::unique_ptr<Replayer>(new Replayer(trace, config, std::move(*pool), std::move(*policy)));
  }

  // Replays step t (steps must come in order); `distinct` is the step's number of distinct
  // selections (a property of the trace, counted outside the timed region by the caller).
  // kResourceExhausted if the misses do not fit.
  Status Step(std::uint32_t t, std::uint64_t distinct) {
    const auto sel = trace_.Step(t);
    const auto start = std::chrono::steady_clock::now();
    // Lookup: one tight pass over the selections, prefetching the address -> slot entries a
    // few iterations ahead (the table is batch * span entries, far larger than the caches at
    // large batch). Hit detection, and dedup of the misses.
    // Hits are appended branch-free (most selections hit); misses are the rare branch.
    const LogicalAddr* addrs = sel.data();
    const std::size_t n = sel.size();
    const std::uint32_t* addr_slot = addr_slot_.data();
    hits_.resize(n);
    misses_.clear();
    SlotId* hits = hits_.data();
    std::size_t num_hits = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (i + kPrefetchAhead < n) __builtin_prefetch(addr_slot + addrs[i + kPrefetchAhead].value());
      const std::uint32_t a = addrs[i].value();
      const std::uint32_t slot = addr_slot[a];
      hits[num_hits] = SlotId(slot);
      num_hits += slot != kNone;
      if (slot == kNone && miss_step_[a] != t + 1) {
        miss_step_[a] = t + 1;
        misses_.push_back(a);
      }
    }
    hits_.resize(num_hits);
    policy_->Touch(hits_);
    // Misses: free slots first, then victims.
    std::size_t placed = 0;
    for (; placed < misses_.size() && pool_.num_free() > 0; ++placed) {
      const SlotId slot = pool_.Allocate().value();
      policy_->Insert(slot);
      Bind(misses_[placed], slot.value());
    }
    std::size_t evicted = 0;
    if (placed < misses_.size()) {
      victims_.resize(misses_.size() - placed);
      evicted = policy_->ClaimVictims(victims_);
      if (evicted < victims_.size()) {
        return MakeError(ErrorCode::kResourceExhausted,
                         "replay: step " + std::to_string(t) + " needs " + std::to_string(victims_.size()) +
                             " victims, " + std::string(policy_->name()) + " has " + std::to_string(evicted) +
                             " (pool of " + std::to_string(result_.pool_slots) + " slots too small)");
      }
      for (std::size_t i = 0; i < evicted; ++i) {
        addr_slot_[slot_addr_[victims_[i].value()]] = kNone;  // the victim's entry goes to host
        Bind(misses_[placed + i], victims_[i].value());
      }
    }
    policy_->AdvanceRound();
    const auto end = std::chrono::steady_clock::now();
    // Ages of the victims (untimed): last_use_ is the step + 1 of each slot's last use.
    const std::uint32_t r = config_.options.recent_buckets;
    if (t >= config_.warmup_steps) {
      for (std::size_t i = 0; i < evicted; ++i) result_.cold_evictions += t + 1 - last_use_[victims_[i].value()] > r;
    }
    for (SlotId s : hits_) last_use_[s.value()] = t + 1;
    for (std::uint32_t a : misses_) last_use_[addr_slot_[a]] = t + 1;
    if (t >= config_.warmup_steps) {
      step_ns_.push_back(std::chrono::duration<double, std::nano>(end - start).count());
      result_.selections += sel.size();
      result_.hits += hits_.size();
      result_.distinct += distinct;
      result_.distinct_hits += distinct - misses_.size();
      result_.evictions += evicted;
    }
    return Ok();
  }

  ReplayResult Finish() {
    const auto mid = step_ns_.begin() + static_cast<std::ptrdiff_t>(step_ns_.size() / 2);
    std::nth_element(step_ns_.begin(), mid, step_ns_.end());
    result_.step_ns_median = *mid;
    if (step_ns_.size() % 2 == 0) result_.step_ns_median = (*mid + *std::max_element(step_ns_.begin(), mid)) / 2;
    return result_;
  }

 private:
  Replayer(const SelectionTrace& trace, const ReplayConfig& config, SlotPool pool,
           std::unique_ptr<ResidencyPolicy> policy)
      : trace_(trace),
        config_(config),
        pool_(std::move(pool)),
        policy_(std::move(policy)),
        addr_slot_(trace.num_addresses, kNone),
        slot_addr_(pool_.capacity(), kNone),
        last_use_(pool_.capacity(), 0),
        miss_step_(trace.num_addresses, 0) {
    result_.pool_slots = pool_.capacity();
  }

  void Bind(std::uint32_t addr, std::uint32_t slot) {
    addr_slot_[addr] = slot;
    slot_addr_[slot] = addr;
  }

  const SelectionTrace& trace_;
  ReplayConfig config_;
  SlotPool pool_;
  std::unique_ptr<ResidencyPolicy> policy_;
  std::vector<std::uint32_t> addr_slot_;  // [addresses] device slot, kNone on host
  std::vector<std::uint32_t> slot_addr_;  // [pool slots] address held, kNone if free
  std::vector<std::uint32_t> last_use_;  // [slots] t + 1 of the step that last used the slot
  std::vector<std::uint32_t> miss_step_;  // [addresses] t + 1 once counted as a miss of step t
  std::vector<SlotId> hits_, victims_;
  std::vector<std::uint32_t> misses_;
  std::vector<double> step_ns_;  // [measured steps]
  ReplayResult result_;
};

}  // namespace

Result<std::vector<ReplayResult>> ReplayTrace(const SelectionTrace& trace, std::span<const ReplayConfig> configs) {
  std::vector<std::unique_ptr<Replayer>> replayers;
  for (const ReplayConfig& c : configs) {
    auto r = Replayer::Create(trace, c);
    if (!r) return std::unexpected(r.error());
    replayers.push_back(std::move(*r));
  }
  const std::size_t n = replayers.size();
  std::vector<std::uint32_t> stamp(trace.num_addresses, 0);
  for (std::uint32_t t = 0; t < trace.steps; ++t) {
    std::uint64_t distinct = 0;
    for (LogicalAddr a : trace.Step(t)) {
      if (stamp[a.value()] != t + 1) {
        stamp[a.value()] = t + 1;
        ++distinct;
      }
    }
    for (std::size_t i = 0; i < n; ++i) ULA_RETURN_IF_ERROR(replayers[(i + t) % n]->Step(t, distinct));
  }
  std::vector<ReplayResult> results;
  for (auto& r : replayers) results.push_back(r->Finish());
  return results;
}

}  // namespace ula::policy

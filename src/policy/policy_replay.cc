#include "policy/policy_replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>

#include "ula/slot_pool.h"

namespace ula::policy {
namespace {

class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t Next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n). REQUIRES: n > 0.
  std::uint32_t Below(std::uint32_t n) { return static_cast<std::uint32_t>((Next() >> 32) * n >> 32); }
  double Unit() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  std::uint64_t state_;
};

constexpr std::uint32_t kNone = ~std::uint32_t{0};
constexpr std::uint32_t kSlotBytes = 656;  // a GLM-5 FP8 entry of one layer; nothing is copied

}  // namespace

Status SelectionTraceConfig::Validate() const {
  auto bad = [](const std::string& what) { return MakeError(ErrorCode::kInvalidArgument, "trace: " + what); };
  if (batch == 0) return bad("batch must be >= 1");
  if (top_k == 0 || top_k > context_tokens) return bad("top_k must be in [1, context_tokens]");
  if (steps == 0) return bad("steps must be >= 1");
  if (!(overlap >= 0 && overlap <= 1)) return bad("overlap must be in [0, 1]");
  if (!(recent_share >= 0 && recent_share <= 1)) return bad("recent_share must be in [0, 1]");
  if (recent_window == 0) return bad("recent_window must be >= 1");
  if (sinks >= top_k) return bad("sinks must be < top_k");
  if (std::uint64_t{batch} * (context_tokens + steps) > kNone) return bad("batch * (context + steps) exceeds 2^32 - 1");
  return Ok();
}

Result<SelectionTrace> GenerateSelectionTrace(const SelectionTraceConfig& config) {
  ULA_RETURN_IF_ERROR(config.Validate());
  SelectionTrace trace;
  trace.config = config;
  const std::uint32_t span = config.context_tokens + config.steps;
  trace.num_addresses = std::uint64_t{config.batch} * span;
  trace.selections.reserve(std::uint64_t{config.batch} * config.top_k * config.steps);
  trace.step_begin.reserve(config.steps + 1);
  SplitMix64 rng(config.seed);
  const auto keep = static_cast<std::uint32_t>(std::lround(config.overlap * config.top_k));
  std::vector<std::vector<std::uint32_t>> prev(config.batch);  // [batch] previous top-k positions
  std::vector<std::uint32_t> mark(span, 0);                    // dedup stamps of one request's step
  std::uint32_t stamp = 0;
  std::vector<std::uint32_t> sel;
  for (std::uint32_t t = 0; t < config.steps; ++t) {
    trace.step_begin.push_back(trace.selections.size());
    const std::uint32_t len = config.context_tokens + t + 1;
    for (std::uint32_t r = 0; r < config.batch; ++r) {
      ++stamp;
      sel.clear();
      auto add = [&](std::uint32_t pos) {
        if (sel.size() < config.top_k && mark[pos] != stamp) {
          mark[pos] = stamp;
          sel.push_back(pos);
        }
      };
      add(len - 1);
      for (std::uint32_t i = 0; i < config.sinks; ++i) add(i);
      auto& p = prev[r];
      for (std::uint32_t i = 0; i < std::min<std::size_t>(keep, p.size()); ++i) {
        std::swap(p[i], p[i + rng.Below(static_cast<std::uint32_t>(p.size() - i))]);
        add(p[i]);
      }
      const std::uint32_t window = std::min(config.recent_window, len);
      while (sel.size() < config.top_k) {
        add(rng.Unit() < config.recent_share ? len - 1 - rng.Below(window) : rng.Below(len));
      }
      p = sel;
      for (std::uint32_t pos : sel) trace.selections.push_back(LogicalAddr(r * span + pos));
    }
  }
  trace.step_begin.push_back(trace.selections.size());
  return trace;
}

namespace {

// One policy's replay state: the device pool, the address <-> slot maps, the policy.
class Replayer {
 public:
  static Result<std::unique_ptr<Replayer>> Create(const SelectionTrace& trace, const ReplayConfig& config) {
    const SelectionTraceConfig& tc = trace.config;
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

  // Replays step t (steps must come in order). kResourceExhausted if the misses do not fit.
  Status Step(std::uint32_t t) {
    const auto sel = trace_.Step(t);
    const auto start = std::chrono::steady_clock::now();
    // Lookup: hit detection, and dedup of the misses.
    hits_.clear();
    misses_.clear();
    for (LogicalAddr a : sel) {
      const std::uint32_t slot = addr_slot_[a.value()];
      if (slot != kNone) {
        hits_.push_back(SlotId(slot));
      } else if (miss_step_[a.value()] != t + 1) {
        miss_step_[a.value()] = t + 1;
        misses_.push_back(a.value());
      }
    }
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
    if (t >= config_.warmup_steps) {
      step_ns_.push_back(std::chrono::duration<double, std::nano>(end - start).count());
      result_.selections += sel.size();
      result_.hits += hits_.size();
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
  for (std::uint32_t t = 0; t < trace.config.steps; ++t) {
    for (std::size_t i = 0; i < n; ++i) ULA_RETURN_IF_ERROR(replayers[(i + t) % n]->Step(t));
  }
  std::vector<ReplayResult> results;
  for (auto& r : replayers) results.push_back(r->Finish());
  return results;
}

}  // namespace ula::policy

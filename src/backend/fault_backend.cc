// FaultInjectingBackend: see src/backend/fault_backend.h.
#include "backend/fault_backend.h"

#include <fmt/format.h>

#include <cmath>
#include <deque>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace ula {

FaultStats& FaultStats::operator+=(const FaultStats& o) {
  operations += o.operations;
  injected += o.injected;
  copies_failed += o.copies_failed;
  swaps_failed += o.swaps_failed;
  waits_failed += o.waits_failed;
  fetches_failed += o.fetches_failed;
  partial += o.partial;
  moves_landed_before_failure += o.moves_landed_before_failure;
  delayed += o.delayed;
  return *this;
}

Status FaultPlan::Validate() const {
  if (!(fail_fraction >= 0.0 && fail_fraction <= 1.0)) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("fault plan: fail_fraction {} is not in [0, 1]", fail_fraction));
  }
  if (delay.count() < 0) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("fault plan: delay {} us is negative", delay.count()));
  }
  if (!at_submit && !at_wait) {
    return MakeError(ErrorCode::kInvalidArgument, "fault plan: neither at_submit nor at_wait is enabled");
  }
  return Ok();
}

FaultInjector::FaultInjector(const FaultPlan& plan) : plan_(plan), rng_(plan.seed) {}

std::uint64_t FaultInjector::Next() {  // splitmix64
  std::uint64_t z = (rng_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

bool FaultInjector::Roll(Kind kind) {
  std::lock_guard lock(mu_);
  const bool eligible = kind == Kind::kCopy ? plan_.copies : kind == Kind::kSwap ? plan_.swaps : plan_.fetches;
  if (!armed_ || !eligible) return false;
  ++stats_.operations;
  bool fail = plan_.fail_every_nth > 0 && stats_.operations % plan_.fail_every_nth == 0;
  if (plan_.fail_fraction > 0.0) {
    const double u = static_cast<double>(Next() >> 11) * 0x1.0p-53;
    fail = fail || u < plan_.fail_fraction;
  }
  if (!fail) return false;
  ++stats_.injected;
  if (kind == Kind::kCopy) ++stats_.copies_failed;
  if (kind == Kind::kSwap) ++stats_.swaps_failed;
  if (kind == Kind::kFetch) ++stats_.fetches_failed;
  return true;
}

bool FaultInjector::FailsAtWait(Kind kind) {
  (void)kind;
  std::lock_guard lock(mu_);
  bool at_wait = plan_.at_wait;
  if (plan_.at_wait && plan_.at_submit) at_wait = (Next() & 1) != 0;
  stats_.waits_failed += at_wait;
  return at_wait;
}

std::size_t FaultInjector::PartialPrefix(std::size_t n) {
  std::lock_guard lock(mu_);
  if (!plan_.partial || n < 2) return 0;
  const std::size_t k = 1 + static_cast<std::size_t>(Next() % (n - 1));
  ++stats_.partial;
  stats_.moves_landed_before_failure += k;
  return k;
}

void FaultInjector::RecordDelay() {
  std::lock_guard lock(mu_);
  ++stats_.delayed;
}

FaultStats FaultInjector::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void FaultInjector::set_armed(bool armed) {
  std::lock_guard lock(mu_);
  armed_ = armed;
}

bool FaultInjector::armed() const {
  std::lock_guard lock(mu_);
  return armed_;
}

namespace {

class FaultBackendImpl final : public FaultInjectingBackend {
 public:
  FaultBackendImpl(Backend& inner, const FaultPlan& plan) : inner_(inner), dice_(plan) {}

  Result<Arena> CreateArena(Tier tier, Rank rank, std::uint64_t bytes) override {
    return inner_.CreateArena(tier, rank, bytes);
  }
  Status DestroyArena(ArenaId id) override { return inner_.DestroyArena(id); }
  Result<Arena> GetArena(ArenaId id) const override { return inner_.GetArena(id); }
  bool holds_bytes() const override { return inner_.holds_bytes(); }
  TransferCounters counters() const override { return inner_.counters(); }
  void ResetCounters() override { inner_.ResetCounters(); }
  FaultStats stats() const override { return dice_.stats(); }
  void set_armed(bool armed) override { dice_.set_armed(armed); }
  Backend& inner() override { return inner_; }

  Result<Fence> Submit(CopyBatch batch) override {
    ULA_RETURN_IF_ERROR(CheckBounds(batch));
    const auto kind = batch.swap ? FaultInjector::Kind::kSwap : FaultInjector::Kind::kCopy;
    const char* what = batch.swap ? "swap" : "copy";
    const std::size_t n = batch.moves.size();
    std::string failure;
    bool forward = true;
    if (dice_.Roll(kind)) {
      if (!dice_.FailsAtWait(kind)) {
        return MakeError(ErrorCode::kIo, fmt::format("injected fault: {} batch of {} moves (arena {} -> {}) failed at "
                                                     "submit; nothing applied", what, n, batch.src.value(), batch.dst.value()));
      }
      if (batch.swap) {
        forward = false;
        failure = fmt::format("injected fault: swap batch of {} moves (arena {} <-> {}) failed; nothing exchanged", n,
                              batch.src.value(), batch.dst.value());
      } else {
        const std::size_t k = dice_.PartialPrefix(n);
        const std::size_t landed = k > 0 ? k : n;
        batch.moves.resize(landed);
        failure = fmt::format("injected fault: copy batch of {} moves (arena {} -> {}) failed after {} moves landed", n,
                              batch.src.value(), batch.dst.value(), landed);
      }
    }
    std::lock_guard lock(mu_);
    const Fence fence = ++submitted_;
    if (!failure.empty()) failed_.emplace(fence, std::move(failure));
    if (dice_.plan().delay.count() > 0) {
      inner_of_.push_back(0);
      if (forward) pending_.push_back({fence, std::move(batch)});
      return fence;
    }
    if (forward) {
      auto inner = inner_.Submit(std::move(batch));
      if (!inner) {  // CheckBounds passed: only a broken inner backend gets here
        --submitted_;
        failed_.erase(fence);
        return std::unexpected(inner.error());
      }
      last_inner_ = *inner;
    }
    inner_of_.push_back(last_inner_);
    return fence;
  }

  Status Wait(Fence fence) override {
    if (dice_.plan().delay.count() > 0) {
      std::this_thread::sleep_for(dice_.plan().delay);
      dice_.RecordDelay();
      std::lock_guard lock(mu_);
      ULA_RETURN_IF_ERROR(ForwardPending(fence));
    }
    Fence inner_fence = 0;
    {
      std::lock_guard lock(mu_);
      if (fence == 0 || fence > submitted_) {
        return MakeError(ErrorCode::kInvalidArgument, fmt::format("wait on fence {}, never returned by Submit", fence));
      }
      inner_fence = inner_of_[fence - 1];
    }
    if (inner_fence > 0) ULA_RETURN_IF_ERROR(inner_.Wait(inner_fence));
    std::lock_guard lock(mu_);
    if (auto it = failed_.find(fence); it != failed_.end()) return MakeError(ErrorCode::kIo, it->second);
    return Ok();
  }

  void WaitAll() override {
    {
      std::lock_guard lock(mu_);
      (void)ForwardPending(submitted_);
    }
    inner_.WaitAll();
  }

 private:
  struct Pending {
    Fence fence;
    CopyBatch batch;
  };

  // The inner backend validates too, but a held-back batch must be refused at Submit.
  Status CheckBounds(const CopyBatch& batch) const {
    auto src = inner_.GetArena(batch.src);
    if (!src) return std::unexpected(src.error());
    auto dst = inner_.GetArena(batch.dst);
    if (!dst) return std::unexpected(dst.error());
    const std::uint64_t b = batch.bytes_per_move;
    for (const SlotMove& m : batch.moves) {
      if (b == 0 || m.src_offset > src->bytes || src->bytes - m.src_offset < b || m.dst_offset > dst->bytes ||
          dst->bytes - m.dst_offset < b) {
        return MakeError(ErrorCode::kOutOfRange, fmt::format("move {}->{} of {} bytes lies outside arena {} or {}",
                                                             m.src_offset, m.dst_offset, b, src->id.value(), dst->id.value()));
      }
    }
    return Ok();
  }

  // Submits the held-back batches up to `upto` in order. REQUIRES: mu_ held.
  Status ForwardPending(Fence upto) {
    while (!pending_.empty() && pending_.front().fence <= upto) {
      Pending p = std::move(pending_.front());
      pending_.pop_front();
      auto inner = inner_.Submit(std::move(p.batch));
      if (!inner) {
        failed_.emplace(p.fence, inner.error().message());
        continue;
      }
      last_inner_ = *inner;
      inner_of_[p.fence - 1] = *inner;
    }
    // Fences whose batch was dropped (failed swaps) wait for everything forwarded before.
    for (Fence f = forwarded_upto_ + 1; f <= upto && f <= submitted_; ++f) {
      if (inner_of_[f - 1] == 0) inner_of_[f - 1] = last_inner_;
    }
    forwarded_upto_ = std::max(forwarded_upto_, std::min(upto, submitted_));
    return Ok();
  }

  Backend& inner_;
  FaultInjector dice_;
  std::mutex mu_;
  Fence submitted_ = 0;
  Fence last_inner_ = 0;
  Fence forwarded_upto_ = 0;
  std::vector<Fence> inner_of_;  // [own fence - 1] -> the inner fence that covers it
  std::unordered_map<Fence, std::string> failed_;
  std::deque<Pending> pending_;
};

}  // namespace

Result<std::unique_ptr<FaultInjectingBackend>> MakeFaultInjectingBackend(Backend& inner, const FaultPlan& plan) {
  ULA_RETURN_IF_ERROR(plan.Validate());
  return std::unique_ptr<FaultInjectingBackend>(std::make_unique<FaultBackendImpl>(inner, plan));
}

}  // namespace ula

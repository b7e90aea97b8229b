#include "ula/step_planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "sparse/address_space_state.h"
#include "ula/check.h"

namespace ula {

StepStats& StepStats::operator+=(const StepStats& o) {
  selections += o.selections;
  distinct += o.distinct;
  hits += o.hits;
  misses += o.misses;
  into_free += o.into_free;
  evictions += o.evictions;
  bytes_moved += o.bytes_moved;
  return *this;
}

StepPlanner::StepPlanner(AddressSpace& space) : space_(space) {}

namespace {
// The error path of the isolation check: names both requests (a scan of the requests).
std::string StaleSelectionMessage(const AddressSpace::State& st, std::size_t i, LogicalAddr a, std::uint32_t tag) {
  std::uint64_t holder = 0, wanted = 0;
  for (const auto& [id, req] : st.requests) {
    if (req.tag == st.owner[a.value()]) holder = id.value();
    if (req.tag == tag) wanted = id.value();
  }
  return fmt::format("selection {}: logical address {} belongs to request {}, not to request {} (a stale address, "
                     "freed and reused?): refused", i, a.value(), holder, wanted);
}
}  // namespace

Result<StepStats> StepPlanner::Step(const StepInput& input, std::span<SlotId> out_slots) {
  AddressSpace::State& st = *space_.state_;
  const AddressSpaceConfig& cfg = space_.config();
  if (input.rank.value() >= cfg.num_ranks) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("rank {} is out of range ({} ranks)", input.rank.value(), cfg.num_ranks));
  }
  if (input.group.value() >= cfg.num_groups) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("group {} is out of range ({} groups)", input.group.value(), cfg.num_groups));
  }
  if (out_slots.size() != input.selections.size()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("{} output slots for {} selections", out_slots.size(), input.selections.size()));
  }
  LocationTable& table = st.tables[input.group.value()];
  GroupPools& gp = st.at(input.rank, input.group);

  // 1-3. Validate, dedup, classify. Nothing is modified until every check has passed.
  if (seen_epoch_.size() < table.size()) seen_epoch_.resize(table.size(), 0);
  if (++epoch_ == 0) {
    std::fill(seen_epoch_.begin(), seen_epoch_.end(), 0);
    epoch_ = 1;
  }
  distinct_.clear();
  missed_.clear();
  hit_slots_.clear();
  ULA_RETURN_IF_ERROR(CheckSelectionRuns(input.runs, input.selections.size()));
  std::size_t next_run = 0, run_end = 0;
  const RequestState* holder = nullptr;  // selection i's run's request
  for (std::size_t i = 0; i < input.selections.size(); ++i) {
    while (i == run_end) {  // skips runs of count 0; the runs cover every selection
      const SelectionRun& run = input.runs[next_run++];
      run_end += run.count;
      if (run.count == 0) continue;
      auto req = st.requests.find(run.request);
      if (req == st.requests.end()) {
        return MakeError(ErrorCode::kNotFound,
                         fmt::format("selection {}: request {} of its run is unknown or freed (a stale selection?): "
                                     "refused", i, run.request.value()));
      }
      holder = &req->second;
    }
    const LogicalAddr a = input.selections[i];
    const Location loc = table.Get(a);
    if (loc.is_none()) {
      return MakeError(ErrorCode::kNotFound,
                       fmt::format("selection {}: logical address {} is not live (freed, or never allocated)", i,
                                   a.value()));
    }
    if (!st.Holds(*holder, a)) {
      return MakeError(ErrorCode::kNotFound, StaleSelectionMessage(st, i, a, holder->tag));
    }
    if (loc.rank() != input.rank) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("selection {}: address {} lives on rank {}, not rank {}", i, a.value(),
                                   loc.rank().value(), input.rank.value()));
    }
    if (seen_epoch_[a.value()] == epoch_) continue;
    seen_epoch_[a.value()] = epoch_;
    distinct_.push_back(a);
    if (loc.tier() == Tier::kDevice) {
      hit_slots_.push_back(loc.slot());
    } else {
      missed_.push_back(a);
    }
  }
  std::uint64_t newly_used = 0;
  for (SlotId s : hit_slots_) newly_used += !gp.policy->UsedInCurrentRound(s);
  const std::uint64_t evictable = gp.policy->NumEvictable() - newly_used;
  if (missed_.size() > gp.device.num_free() + evictable) {
    return MakeError(ErrorCode::kResourceExhausted,
                     fmt::format("step needs {} distinct entries on device ({} missing) but only {} free and {} "
                                 "evictable slots remain of {} in rank {} group {}: {} entries are used in this "
                                 "round (allocated or selected since the last AdvanceRound(), this step's hits "
                                 "included) and cannot be evicted: call AdvanceRound() after the round's "
                                 "attention, or select fewer entries per round",
                                 distinct_.size(), missed_.size(), gp.device.num_free(), evictable,
                                 gp.device.capacity(), input.rank.value(), input.group.value(),
                                 gp.device.num_used() - evictable));
  }

  // 4. Device slots for the misses: free slots first, then victims.
  gp.policy->Touch(hit_slots_);
  const std::size_t n_miss = missed_.size();
  const std::size_t n_free = std::min<std::size_t>(n_miss, gp.device.num_free());
  target_slots_.resize(n_miss);
  for (std::size_t i = 0; i < n_free; ++i) target_slots_[i] = *gp.device.Allocate();
  const std::size_t claimed = gp.policy->ClaimVictims(std::span(target_slots_).subspan(n_free));
  ULA_CHECK(claimed == n_miss - n_free);

  // 5. Copy, wait, then publish.
  StepStats stats;
  stats.selections = input.selections.size();
  stats.distinct = distinct_.size();
  stats.hits = hit_slots_.size();
  stats.misses = n_miss;
  stats.into_free = n_free;
  stats.evictions = n_miss - n_free;
  if (n_miss > 0) {
    CopyBatch fetch{gp.host.arena().id, gp.device.arena().id, cfg.entry_bytes, /*swap=*/false, {}};
    CopyBatch swap{gp.host.arena().id, gp.device.arena().id, cfg.entry_bytes, /*swap=*/true, {}};
    fetch.moves.reserve(n_free);
    swap.moves.reserve(n_miss - n_free);
    for (std::size_t i = 0; i < n_miss; ++i) {
      const SlotMove move{gp.host.offset(table.Get(missed_[i]).slot()), gp.device.offset(target_slots_[i])};
      (i < n_free ? fetch : swap).moves.push_back(move);
    }
    stats.bytes_moved = (fetch.moves.size() + 2 * swap.moves.size()) * std::uint64_t{cfg.entry_bytes};
    // Each batch is waited on its own fence: a failed batch publishes nothing of its own,
    // a completed one is published (its bytes have arrived) — see the header's contract.
    CopyBatch* batches[2] = {&fetch, &swap};
    Fence fences[2] = {0, 0};
    std::string failed[2];
    for (int k = 0; k < 2; ++k) {
      if (batches[k]->moves.empty()) continue;
      auto fence = space_.backend().Submit(std::move(*batches[k]));
      if (fence) {
        fences[k] = *fence;
      } else {
        failed[k] = fence.error().message();
      }
    }
    for (int k = 0; k < 2; ++k) {
      if (fences[k] == 0) continue;
      if (auto w = space_.backend().Wait(fences[k]); !w) failed[k] = w.error().message();
    }
    // Bytes have arrived: publish.
    for (std::size_t i = 0; i < n_miss; ++i) {
      const LogicalAddr wanted = missed_[i];
      const SlotId device_slot = target_slots_[i];
      const SlotId host_slot = table.Get(wanted).slot();
      if (!failed[i < n_free ? 0 : 1].empty()) {
        // Not copied: the entry stays on host; a free slot goes back (a victim stays put).
        if (i < n_free) ULA_CHECK(gp.device.Free(device_slot).has_value());
        continue;
      }
      if (i < n_free) {
        ULA_CHECK(gp.host.Free(host_slot).has_value());
        gp.policy->Insert(device_slot);
      } else {
        const LogicalAddr victim = gp.device_owner[device_slot.value()];
        table.Set(victim, Location::Make(Tier::kHost, input.rank, host_slot));
      }
      table.Set(wanted, Location::Make(Tier::kDevice, input.rank, device_slot));
      gp.device_owner[device_slot.value()] = wanted;
    }
    if (!failed[0].empty() || !failed[1].empty()) {
      ULA_EXPENSIVE_CHECK(space_);
      const bool both = !failed[0].empty() && !failed[1].empty();
      return MakeError(ErrorCode::kIo,
                       fmt::format("rank {} group {}: {}{}{}", input.rank.value(), input.group.value(),
                                   failed[0].empty() ? "" : fmt::format("host->device copy of {} entries failed ({})", n_free, failed[0]),
                                   both ? "; " : "",
                                   failed[1].empty() ? "" : fmt::format("host<->device swap of {} entries failed ({})", n_miss - n_free, failed[1])));
    }
  }

  // 6. Physical slots in selection order.
  for (std::size_t i = 0; i < input.selections.size(); ++i) out_slots[i] = table.Get(input.selections[i]).slot();
  ULA_EXPENSIVE_CHECK(space_);
  return stats;
}

}  // namespace ula

#include "step/kernel_step_planner.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <limits>
#include <string>

#include "backend/copy_publish.h"
#include "kernels/step_kernels.h"
#include "space/space_access.h"
#include "space/address_space_state.h"
#include "step/kernel_runs.h"
#include "step/kernel_targets.h"
#include "ula/check.h"
#include "kernels/omp_team.h"

namespace ula {

static_assert(sizeof(LogicalAddr) == sizeof(std::uint32_t) && sizeof(SlotId) == sizeof(std::uint32_t));
static_assert(AddressRecords::kStampShift == kernels::kStampShift);

Status KernelStepPlannerOptions::Validate() const {
  if (threads < 1 || threads > kMaxThreads) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("KernelStepPlannerOptions.threads = {}: must be in [1, {}]",
                                                              threads, kMaxThreads));
  }
  return Ok();
}

KernelStepPlanner::KernelStepPlanner(AddressSpace& space) : space_(space) {}

Status KernelStepPlanner::SetOptions(const KernelStepPlannerOptions& options) {
  ULA_RETURN_IF_ERROR(options.Validate());
  options_ = options;
  return Ok();
}

namespace {

const std::uint32_t* Raw(std::span<const LogicalAddr> s) { return reinterpret_cast<const std::uint32_t*>(s.data()); }
std::span<const SlotId> Slots(const std::vector<std::uint32_t>& v, std::size_t begin = 0) {
  return {reinterpret_cast<const SlotId*>(v.data()) + begin, v.size() - begin};
}
}  // namespace

Result<StepStats> KernelStepPlanner::Step(const StepInput& input, std::span<SlotId> out_slots) {
  descriptors_.clear();
  AddressSpace::State& st = StateOf(space_);
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
  if (st.host_shadows) {  // the kernels keep no host shadows
    return MakeError(ErrorCode::kUnsupported, "KernelStepPlanner does not implement host shadows: create the space "
                                              "with AddressSpaceConfig::host_shadows = false (--shadows off)");
  }
  if (input.selections.size() >= std::numeric_limits<std::uint32_t>::max()) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("{} selections: at most 2^32 - 2 per step",
                                                              input.selections.size()));
  }
  AddressRecords& table = st.tables[input.group.value()];
  GroupPools& gp = st.at(input.rank, input.group);
  ULA_CHECK(table.size() == st.owner.size());
  ULA_RETURN_IF_ERROR(CheckSelectionRuns(input.runs, input.selections.size()));

  // The runs as arrays (kernel_runs.h).
  runs_.Build(input.runs, input.selections.size(), [&](RequestId id) -> const RequestState* {
    auto it = st.requests.find(id);
    return it == st.requests.end() ? nullptr : &it->second;
  });
  const std::size_t end = runs_.end;
  const auto n = static_cast<std::uint32_t>(end);
  if (first_.size() < table.size()) first_.resize(table.size());
  kind_.resize(n);
  hit_first_.resize(n);
  miss_first_.resize(n);
  pos_.resize(n);
  OmpTeam team(options_.threads);

  // 1-3. Validate, dedup, classify; compact the distinct hits and misses.
  kernels::ClassifyArgs args;
  args.selections = Raw(input.selections);
  args.n = n;
  runs_.FillRuns(args);
  args.records = table.data();
  args.table_size = table.size();
  args.owner = st.owner.data();
  args.first = first_.data();
  args.epoch = table.NextEpoch();
  args.rank = input.rank.value();
  args.kind = kind_.data();
  args.slots = reinterpret_cast<std::int32_t*>(out_slots.data());
  args.hit_first = hit_first_.data();
  args.miss_first = miss_first_.data();
  if (const std::uint32_t bad = kernels::omp::Classify(0, args); bad != kernels::kNoSelection) {
    return std::unexpected(SelectionError(st, table, bad, input.selections[bad], *runs_.holders[kernels::omp::RunOfForHost(runs_.starts.data(), args.num_runs, bad)], input.rank));
  }
  if (end != input.selections.size()) {
    return MakeError(ErrorCode::kNotFound,
                     fmt::format("selection {}: request {} of its run is unknown or freed (a stale selection?): "
                                 "refused", end, input.runs[runs_.bad_run].request.value()));
  }
  hits_.resize(n);
  missed_.resize(n);
  hits_.resize(kernels::omp::Compact(0, hit_first_.data(), pos_.data(), n,
                                     reinterpret_cast<const std::uint32_t*>(out_slots.data()), hits_.data()));
  missed_.resize(kernels::omp::Compact(0, miss_first_.data(), pos_.data(), n, args.selections, missed_.data()));
  const std::size_t n_distinct = hits_.size() + missed_.size();
  ULA_RETURN_IF_ERROR(gp.RefuseMovingNewOnHost(missed_));  // a new entry's write slot never moves in its round

  // Room, as the CPU planner decides it.
  std::uint64_t evictable = gp.policy->NumEvictable();
  const bool fits_anyway =
      evictable >= hits_.size() && missed_.size() <= gp.device.num_free() + (evictable - hits_.size());
  std::uint64_t newly_used = 0;
  if (!fits_anyway) {
    for (SlotId s : Slots(hits_)) newly_used += !gp.policy->UsedInCurrentRound(s);
  }
  evictable -= newly_used;
  if (!fits_anyway && missed_.size() > gp.device.num_free() + evictable) {
    return MakeError(ErrorCode::kResourceExhausted,
                     fmt::format("step needs {} distinct entries on device ({} missing) but only {} free and {} "
                                 "evictable slots remain of {} in rank {} group {}: {} entries are used in this "
                                 "round (allocated or selected since the last AdvanceRound(), this step's hits "
                                 "included) and cannot be evicted: call AdvanceRound() after the round's "
                                 "attention, or select fewer entries per round",
                                 n_distinct, missed_.size(), gp.device.num_free(), evictable,
                                 gp.device.capacity(), input.rank.value(), input.group.value(),
                                 gp.device.num_used() - evictable));
  }
  gp.policy->Touch(Slots(hits_));

  // 4. Device slots: the lowest free slots, then PB-LRU's victims, as bit ranks.
  const auto n_miss = static_cast<std::uint32_t>(missed_.size());
  const std::uint32_t n_free = TakeTargets(gp.device, *gp.policy, n_miss, target_scratch_, targets_);

  // 5. Descriptors, copies, then the publish of what arrived.
  StepStats stats;
  stats.selections = input.selections.size();
  stats.distinct = n_distinct;
  stats.hits = hits_.size();
  stats.misses = n_miss;
  stats.into_free = n_free;
  stats.evictions = n_miss - n_free;
  if (n_miss > 0) {
    descriptors_.resize(n_miss);
    kernels::DescriptorArgs d;
    d.missed = missed_.data();
    d.targets = targets_.data();
    d.records = table.data();
    d.n_miss = n_miss;
    d.n_free = n_free;
    d.row_bytes = cfg.row();
    d.num_layers = static_cast<std::uint16_t>(gp.num_layers);
    d.rank = input.rank.value();
    d.group = input.group.value();
    d.out = descriptors_.data();
    kernels::omp::MakeDescriptors(0, d);
    // The copies through the one copy -> wait primitive (backend/copy_publish.h), one row
    // per layer of each entry; the publish below runs as a kernel over what arrived.
    CopyPublish cp(gp.host.arena().id, gp.device.arena().id, cfg.row(), n_free, n_miss - n_free, gp.num_layers);
    for (std::uint32_t i = 0; i < n_miss; ++i) {
      const CopyDescriptor& c = descriptors_[i];
      cp.AddEntry([&](std::vector<SlotMove>& rows) {
        gp.AppendMoves(Tier::kHost, SlotId(c.src_slot), SlotId(c.dst_slot), rows);
      });
    }
    stats.bytes_moved = cp.bytes_moved();
    cp.Run(space_.backend());
    // Bytes have arrived (or not): publish the batches that completed.
    kernels::PublishArgs p;
    p.descriptors = descriptors_.data();
    p.n = n_miss;
    p.n_free = n_free;
    p.copies_ok = cp.copies_arrived();
    p.swaps_ok = cp.swaps_arrived();
    p.records = table.data();
    p.device_owner = reinterpret_cast<std::uint32_t*>(gp.device_owner.data());
    kernels::omp::Publish(0, p);
    for (std::uint32_t i = 0; i < n_free; ++i) {
      const CopyDescriptor& c = descriptors_[i];
      if (!p.copies_ok) {
        ULA_CHECK(gp.device.Free(SlotId(c.dst_slot)).has_value());  // not copied: the free slot goes back
        continue;
      }
      ULA_CHECK(gp.host.Free(SlotId(c.src_slot)).has_value());
      gp.policy->Insert(SlotId(c.dst_slot));
    }
    if (!cp.all_arrived()) {
      ULA_EXPENSIVE_CHECK(space_);
      return std::unexpected(cp.Failure(fmt::format("rank {} group {}", input.rank.value(), input.group.value())));
    }
  }

  // 6. The misses' selections read their published slots.
  kernels::IndexArgs ix;
  ix.selections = args.selections;
  ix.kind = kind_.data();
  ix.records = table.data();
  ix.n = n;
  ix.slots = args.slots;
  kernels::omp::WriteIndices(0, ix);
  ULA_EXPENSIVE_CHECK(space_);
  return stats;
}

}  // namespace ula

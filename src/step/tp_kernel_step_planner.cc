#include "step/tp_kernel_step_planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "backend/copy_publish.h"
#include "kernels/step_kernels.h"
#include "kernels/omp_team.h"
#include "space/space_access.h"
#include "space/tp_state.h"
#include "ula/check.h"

namespace ula {

TpKernelStepPlanner::TpKernelStepPlanner(TpAddressSpace& space) : space_(space) {}

Status TpKernelStepPlanner::SetOptions(const KernelStepPlannerOptions& options) {
  ULA_RETURN_IF_ERROR(options.Validate());
  options_ = options;
  return Ok();
}

std::span<const CopyDescriptor> TpKernelStepPlanner::descriptors(std::size_t h) const {
  return h < ranks_.size() ? std::span<const CopyDescriptor>(ranks_[h].descriptors) : std::span<const CopyDescriptor>();
}

namespace {

// TpStepPlanner's refusal of an invalid selection (DedupSelections' words).
std::unexpected<Error> SelectionRefusal(const TpAddressSpace::State& st, std::size_t i, LogicalAddr a,
                       const TpAddressSpace::State::Holder& holder) {
  if (!st.IsLive(a)) {
    return MakeError(ErrorCode::kNotFound,
                     fmt::format("selection {}: logical address {} is not live (freed, or never allocated)", i, a.value()));
  }
  std::uint64_t owner = 0, wanted = 0;
  for (const auto& [id, t] : st.tags) {
    if (t.tag == st.owner[a.value()]) owner = id.value();
    if (t.tag == holder.tag) wanted = id.value();
  }
  return MakeError(ErrorCode::kNotFound,
                   fmt::format("selection {}: logical address {} belongs to request {}, not to request {} (a stale "
                               "address, freed and reused?): refused", i, a.value(), owner, wanted));
}

}  // namespace

Result<TpStepPlan> TpKernelStepPlanner::Step(GroupId group, std::span<const LogicalAddr> selections,
                                             std::span<const SelectionRun> runs) {
  for (RankScratch& r : ranks_) r.descriptors.clear();
  TpAddressSpace::State& st = StateOf(space_);
  const TpConfig& cfg = space_.config();
  const std::uint32_t p = cfg.num_ranks;
  if (group.value() >= cfg.num_groups) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("group {} is out of range ({} groups)", group.value(), cfg.num_groups));
  }
  if (st.host_shadows) {  // the kernels keep no host shadows
    return MakeError(ErrorCode::kUnsupported, "TpKernelStepPlanner does not implement host shadows: create the space "
                                              "with TpConfig::host_shadows = false (--shadows off)");
  }
  if (cfg.attention != TpAttention::kAtHome) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     "the TP kernel planner covers attention at home (the local buffer's remote phase is not a kernel "
                     "yet): use TpStepPlanner");
  }
  const auto hosted = space_.hosted_ranks();
  if (hosted.size() != p) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("the TP kernel planner needs every rank in this process; the space hosts {} of {}",
                                 hosted.size(), p));
  }
  if (selections.size() >= std::numeric_limits<std::uint32_t>::max()) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("{} selections: at most 2^32 - 2 per step", selections.size()));
  }
  ULA_RETURN_IF_ERROR(CheckSelectionRuns(runs, selections.size()));

  // The runs as arrays (kernel_runs.h).
  runs_.Build(runs, selections.size(), [&](RequestId id) -> const TpAddressSpace::State::Holder* {
    auto it = st.tags.find(id);
    return it == st.tags.end() ? nullptr : &it->second;
  });
  const std::size_t end = runs_.end;
  const auto n = static_cast<std::uint32_t>(end);
  const auto* raw = reinterpret_cast<const std::uint32_t*>(selections.data());
  ranks_.resize(hosted.size());
  stamps_.resize(std::size_t{p} * cfg.num_groups);
  // Home entries an address handed out so far can index (addresses < live.size()).
  const auto entries = static_cast<std::uint32_t>(st.live.size() / p + 1);
  OmpTeam team(options_.threads);

  // A. Classify every rank; refuse before anything changes.
  for (std::size_t h = 0; h < hosted.size(); ++h) {
    RankScratch& w = ranks_[h];
    const Rank rank = hosted[h];
    TpGroupShard& sh = st.at(rank, group);
    Stamps& stamps = stamps_[std::size_t{rank.value()} * cfg.num_groups + group.value()];
    if (stamps.stamp.size() < entries) {
      stamps.stamp.resize(entries, 0);
      stamps.first.resize(entries, 0);
    }
    if (++stamps.epoch == 0) {  // wrapped: no stamp may carry the fresh epoch
      std::fill(stamps.stamp.begin(), stamps.stamp.end(), 0);
      stamps.epoch = 1;
    }
    w.kind.resize(n);
    w.slots.assign(n, kPadIndex);
    w.hit_first.resize(n);
    w.miss_first.resize(n);
    w.pos.resize(n);
    kernels::ClassifyArgs args;
    args.selections = raw;
    args.n = n;
    runs_.FillRuns(args);
    args.records = const_cast<std::uint64_t*>(reinterpret_cast<const std::uint64_t*>(sh.home.data()));
    args.table_size = static_cast<std::uint32_t>(std::min<std::size_t>(entries, sh.home.size()));
    args.owner = st.owner.data();
    args.owner_size = static_cast<std::uint32_t>(st.owner.size());
    args.first = stamps.first.data();
    args.epoch = stamps.epoch;
    args.rank = rank.value();
    args.num_ranks = p;
    args.stamps = stamps.stamp.data();
    args.kind = w.kind.data();
    args.slots = w.slots.data();
    args.hit_first = w.hit_first.data();
    args.miss_first = w.miss_first.data();
    if (const std::uint32_t bad = kernels::omp::Classify(0, args); bad != kernels::kNoSelection) {
      return SelectionRefusal(st, bad, selections[bad],
                              *runs_.holders[kernels::omp::RunOfForHost(runs_.starts.data(), args.num_runs, bad)]);
    }
    if (end != selections.size()) {
      return MakeError(ErrorCode::kNotFound,
                       fmt::format("selection {}: request {} of its run is unknown or freed (a stale selection?): "
                                   "refused", end, runs[runs_.bad_run].request.value()));
    }
    w.hits.resize(n);
    w.missed.resize(n);
    w.hits.resize(kernels::omp::Compact(0, w.hit_first.data(), w.pos.data(), n,
                                        reinterpret_cast<const std::uint32_t*>(w.slots.data()), w.hits.data()));
    w.missed.resize(kernels::omp::Compact(0, w.miss_first.data(), w.pos.data(), n, raw, w.missed.data()));
  }
  for (std::size_t h = 0; h < hosted.size(); ++h) {  // TpStepPlanner's ClassifyRank refusals, in its order
    const RankScratch& w = ranks_[h];
    const TpGroupShard& sh = st.at(hosted[h], group);
    ULA_RETURN_IF_ERROR(sh.RefuseMovingNewOnHost(hosted[h], group, w.missed));
    ULA_RETURN_IF_ERROR(sh.RefuseHomeMisses(hosted[h], group, w.missed.size(), sh.HomeRoom(w.hits)));
  }

  // B. Each rank's home phase, as kernels.
  TpStepPlan plan;
  plan.refs.resize(hosted.size());
  plan.stats.resize(hosted.size());
  std::uint64_t distinct = 0;
  for (const RankScratch& w : ranks_) distinct += w.hits.size() + w.missed.size();
  Status failure = Ok();
  for (std::size_t h = 0; h < hosted.size(); ++h) {
    RankScratch& w = ranks_[h];
    const Rank rank = hosted[h];
    TpGroupShard& sh = st.at(rank, group);
    sh.policy->Touch(std::span(reinterpret_cast<const SlotId*>(w.hits.data()), w.hits.size()));
    const auto n_miss = static_cast<std::uint32_t>(w.missed.size());
    w.n_free = TakeTargets(sh.device, *sh.policy, n_miss, w.target_scratch, w.targets);
    StepStats& stats = plan.stats[h];
    stats.distinct = distinct;
    stats.hits = w.hits.size();
    stats.misses = n_miss;
    stats.evictions = n_miss - w.n_free;
    stats.elsewhere = distinct - w.hits.size() - n_miss;
    if (n_miss > 0) {
      w.descriptors.resize(n_miss);
      kernels::DescriptorArgs d;
      d.missed = w.missed.data();
      d.targets = w.targets.data();
      d.records = reinterpret_cast<const std::uint64_t*>(sh.home.data());
      d.n_miss = n_miss;
      d.n_free = w.n_free;
      d.row_bytes = cfg.entry_bytes;  // a TP entry moves whole
      d.num_layers = 1;
      d.rank = rank.value();
      d.group = group.value();
      d.num_ranks = p;
      d.out = w.descriptors.data();
      kernels::omp::MakeDescriptors(0, d);
      CopyPublish cp(sh.host.arena().id, sh.device.arena().id, cfg.entry_bytes, w.n_free, n_miss - w.n_free);
      for (const CopyDescriptor& c : w.descriptors) cp.Add({c.src_offset, c.dst_offset});
      stats.bytes_moved = cp.bytes_moved();
      cp.Run(space_.backend());
      kernels::PublishArgs pub;
      pub.descriptors = w.descriptors.data();
      pub.n = n_miss;
      pub.n_free = w.n_free;
      pub.copies_ok = cp.copies_arrived();
      pub.swaps_ok = cp.swaps_arrived();
      pub.records = reinterpret_cast<std::uint64_t*>(&sh.home[0]);
      pub.device_owner = reinterpret_cast<std::uint32_t*>(sh.device_owner.data());
      pub.num_ranks = p;
      kernels::omp::Publish(0, pub);
      for (std::uint32_t i = 0; i < w.n_free; ++i) {
        const CopyDescriptor& c = w.descriptors[i];
        if (!pub.copies_ok) {
          ULA_CHECK(sh.device.Free(SlotId(c.dst_slot)).has_value());  // not copied: the free slot goes back
          continue;
        }
        ULA_CHECK(sh.host.Free(SlotId(c.src_slot)).has_value());
        sh.policy->Insert(SlotId(c.dst_slot));
      }
      if (!cp.all_arrived() && failure) {
        failure = std::unexpected(cp.Failure(fmt::format("rank {} group {}: home phase", rank.value(), group.value())));
      }
    }
    kernels::IndexArgs ix;
    ix.selections = raw;
    ix.kind = w.kind.data();
    ix.records = reinterpret_cast<const std::uint64_t*>(sh.home.data());
    ix.n = n;
    ix.slots = w.slots.data();
    ix.num_ranks = p;
    kernels::omp::WriteIndices(0, ix);
    plan.ranks.push_back(rank);
    auto& refs = plan.refs[h];
    refs.resize(n);
    for (std::uint32_t j = 0; j < n; ++j) {
      refs[j] = w.kind[j] == kernels::kKindElsewhere
                    ? TpReadRef{TpReadRef::Source::kElsewhere, SlotId::Invalid(), rank}
                    : TpReadRef{TpReadRef::Source::kShard, SlotId(static_cast<std::uint32_t>(w.slots[j])), rank};
    }
  }
  ULA_EXPENSIVE_CHECK(space_);
  ULA_RETURN_IF_ERROR(failure);
  return plan;
}

}  // namespace ula

// `ula verify --mode tp [--mpi]` (tools/ula/tp_verify_cli.h).
#include "tp_verify_cli.h"

#include <fmt/format.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "ula/tp_fabric.h"
#include "verify/tp_verifier.h"
#ifdef ULA_HAVE_MPI
#include "ula/tp_mpi.h"
#endif

namespace ula::cli {

int RunTpVerify(const TpVerifyArgs& a) {
  TpVerifierConfig c;
  c.seed = a.seed;
  c.ops = a.ops;
  c.num_ranks = a.ranks;
  c.num_groups = a.groups;
  c.device_slots_per_group = a.device_slots;
  c.host_slots_per_group = a.host_slots;
  c.top_k = a.top_k;
  c.fault_rate = a.fault_rate;
  c.share_percent = a.share_percent;
  c.form = a.form;
  c.stable_new_entries = a.stable_new_entries;
  c.host_shadows = a.host_shadows;
  c.draft_reject_percent = a.draft_reject_percent;
  c.reserve_rounds = a.reserve_rounds;
  c.cuda = a.cuda;
  c.entry_bytes = a.entry_bytes;
  c.model = a.model;
  if (!a.policy.empty()) {
    auto kind = ParsePolicyKind(a.policy);
    if (!kind) {
      fmt::print(stderr, "ula verify: {}\n", kind.error().ToString());
      return 2;
    }
    c.policy = *kind;
  }
  auto attention = ParseTpAttention(a.attention);
  if (!attention) {
    fmt::print(stderr, "ula verify: {}\n", attention.error().ToString());
    return 2;
  }
  c.attention = *attention;
  TpFabric* fabric = nullptr;
#ifdef ULA_HAVE_MPI
  std::unique_ptr<MpiSession> session;
  std::unique_ptr<TpFabric> mpi_fabric;
  if (a.mpi) {
    auto s = MpiSession::Init(nullptr, nullptr);
    auto f = s ? MakeMpiFabric() : Result<std::unique_ptr<TpFabric>>(std::unexpected(s.error()));
    if (!f) {
      fmt::print(stderr, "ula verify: {}\n", f.error().ToString());
      return 2;
    }
    session = std::move(*s);
    mpi_fabric = std::move(*f);
    fabric = mpi_fabric.get();
    c.num_ranks = fabric->num_ranks();
  }
#else
  if (a.mpi) {
    fmt::print(stderr, "ula verify: this `ula` was built without MPI (see src/tp/mpi)\n");
    return 2;
  }
#endif
  const auto start = std::chrono::steady_clock::now();
  auto report = RunTpVerifier(c, fabric);
  if (!report) {
    fmt::print(stderr, "ula verify: {}\n", report.error().ToString());
    return 2;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const TpVerifierReport& r = *report;
  const bool all_ok = fabric ? fabric->AllTrue(r.ok()) : r.ok();
  const std::uint32_t me = fabric ? fabric->local_rank().value() : 0;
  if (a.json) {
    nlohmann::json j{{"mode", "tp"}, {"engine", fabric ? "mpi" : "in_process"}, {"rank", me}, {"ranks", c.num_ranks},
                     {"seed", r.seed}, {"ops", r.ops}, {"steps", r.steps}, {"rejected_steps", r.rejected_steps},
                     {"entries_checked", r.entries_checked}, {"mismatches", r.mismatches},
                     {"invariant_failures", r.invariant_failures}, {"bad_input_checks", r.bad_input_checks},
                     {"bad_input_failures", r.bad_input_failures}, {"home_swaps", r.home_swaps},
                     {"shadows", a.host_shadows ? "on" : "off"}, {"home_shadow_evictions", r.home_shadow_evictions},
                     {"home_misses", r.home_misses},
                     {"host_bytes", r.host_bytes},
                     {"buffer_hits", r.buffer_hits}, {"remote_fetches", r.remote_fetches},
                     {"buffer_evictions", r.buffer_evictions}, {"tp_attention", a.attention},
                     {"left_to_home", r.left_to_home}, {"attention_checks", r.attention_checks},
                     {"attention_mismatches", r.attention_mismatches}, {"max_attention_error", r.max_attention_error},
                     {"planner", PlannerFormName(a.form)}, {"cuda", a.cuda}, {"fault_rate", a.fault_rate}, {"faults_injected", r.faults_injected},
                     {"failed_calls", r.failed_calls}, {"entries_lost", r.entries_lost},
                     {"early_publishes", r.early_publishes},
                     {"all_ranks_ok", all_ok}, {"seconds", seconds},
                     {"share_percent", c.share_percent}, {"shares", r.shares}, {"sharer_checks", r.sharer_checks},
                     {"cache_evictions", r.cache_evictions}, {"locked_checks", r.locked_checks},
                     {"sharing_failures", r.sharing_failures},
                     {"draft_reject_percent", c.draft_reject_percent}, {"draft_rollbacks", r.draft_rollbacks},
                     {"reserve_rounds", c.reserve_rounds}, {"reservations", r.reservations},
                     {"reservations_refused", r.reservations_refused},
                     {"model", a.model ? a.model->name : ""}, {"kind_failures", r.kind_failures},
                     {"kind_pages_checked", r.kind_pages_checked}, {"c4_made", r.c4_made}, {"c4_freed", r.c4_freed},
                     {"c128_made", r.c128_made}, {"ring_blocks_freed", r.ring_blocks_freed},
                     {"rollbacks_refused", r.rollbacks_refused},
                     {"failures", r.first_failures}};
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("ula verify --mode tp ({}, rank {} of {}, attention {}, planner {}{}): seed {}, {} operations in {:.1f} s\n",
               fabric ? "MPI" : "in-process", me, c.num_ranks, a.attention, PlannerFormName(a.form), a.cuda ? " (CUDA form)" : "",
               r.seed, r.ops, seconds);
    fmt::print("  steps {} (+{} refused, checked unchanged); home swaps {}; buffer hits {} / fetches {} / evictions {}\n",
               r.steps, r.rejected_steps, r.home_swaps, r.buffer_hits, r.remote_fetches, r.buffer_evictions);
    fmt::print("  host link: {} bytes in the home phases, {:.3f} entries per home miss ({} misses); host shadows {}: {} "
               "home evictions moved no bytes\n", r.host_bytes,
               r.home_misses == 0 ? 0.0 : static_cast<double>(r.host_bytes) / c.entry_bytes / static_cast<double>(r.home_misses),
               r.home_misses, a.host_shadows ? "on" : "off", r.home_shadow_evictions);
    if (c.attention == TpAttention::kAtHome) {
      fmt::print("  attention at home: {} selections left to their home rank; {} merged outputs vs the reference, "
                 "{} outside tolerance, largest relative difference {:.3g}\n",
                 r.left_to_home, r.attention_checks, r.attention_mismatches, r.max_attention_error);
    }
    fmt::print("  entries checked {}; mismatches {}; invariant failures {}; bad input refused {} ({} not cleanly)\n",
               r.entries_checked, r.mismatches, r.invariant_failures, r.bad_input_checks, r.bad_input_failures);
    if (a.fault_rate > 0) {
      fmt::print("  faults (rate {}): {} injected, {} steps failed, {} entries lost, {} early publishes\n", a.fault_rate,
                 r.faults_injected, r.failed_calls, r.entries_lost, r.early_publishes);
    }
    if (c.share_percent > 0) {
      fmt::print("  sharing: {} adopted prefixes, {} shared entries checked, {} cache evictions, {} locked matches "
                 "checked, {} failures\n", r.shares, r.sharer_checks, r.cache_evictions, r.locked_checks,
                 r.sharing_failures);
    }
    if (c.draft_reject_percent > 0) {
      fmt::print("  drafts ({}% of decodes): {} rolled back\n", c.draft_reject_percent, r.draft_rollbacks);
    }
    if (a.model) {
      fmt::print("  kinds of {}: {} C4 entries made, {} freed; {} C128 made; {} window blocks freed; {} rollbacks "
                 "refused past the ring; {} page tables checked on {} ranks, {} differ from the model\n",
                 a.model->name, r.c4_made, r.c4_freed, r.c128_made, r.ring_blocks_freed, r.rollbacks_refused,
                 r.kind_pages_checked, c.num_ranks, r.kind_failures);
    }
    if (c.reserve_rounds) {
      fmt::print("  round reservations: {} decodes admitted, {} deferred\n", r.reservations, r.reservations_refused);
    }
    for (const auto& f : r.first_failures) fmt::print("  FAIL: {}\n", f);
    fmt::print("{}\n", all_ok ? "OK: every rank read back the last written bytes" : "FAILED");
  }
  return all_ok ? 0 : 1;
}

}  // namespace ula::cli

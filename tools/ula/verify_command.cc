// `ula verify`: the randomized consistency verifier (docs/ARCHITECTURE.md invariant 4).
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "cli_checks.h"
#include "command_registry.h"
#include "tp_verify_cli.h"
#include "step/device_io.h"
#include "verify/attention_check.h"
#include "verify/consistency_verifier.h"
#include "config/model_config.h"

namespace ula::cli {
namespace {

// The verifier over a model's kinds (--model): what it was asked besides.
struct ModelRequest {
  std::string name;
  std::string mode;
  bool groups_given = false, group_layers_given = false;
  std::string tp_attention;  // --mode tp: --tp-attention
  std::string planner;       // --planner
};

// The model names under configs/models/, sorted: those with layer kinds, then all.
std::string KnownModels() {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(DefaultConfigDir() / "models", ec)) {
    if (e.path().extension() == ".json") names.insert(e.path().stem().string());
  }
  std::string kinds, all;
  for (const std::string& n : names) {
    all += (all.empty() ? "" : ", ") + n;
    auto m = LoadModelConfigByName(n, DefaultConfigDir());
    if (m && m->has_layer_kinds()) kinds += (kinds.empty() ? "" : ", ") + n;
  }
  return fmt::format("with layer kinds: {}; all: {}", kinds.empty() ? "none" : kinds, all);
}

// Loads --model into cfg (its kinds' space shape, rollbacks on); the reason it is refused
// otherwise, naming the option: nothing runs then.
std::optional<std::string> ApplyModelOption(const ModelRequest& m, VerifierConfig& cfg) {
  if (m.mode == "tp" && m.tp_attention != "at_home") {
    return fmt::format("--model with --mode tp needs --tp-attention at_home (got {}): a TP space with kinds runs "
                       "attention at home only, the local buffer would copy C4 entries onto other ranks "
                       "(docs/ARCHITECTURE.md, \"Kinds under TP\")", m.tp_attention);
  }
  if (m.mode == "tp" && m.planner == "device") {
    return "--model with --mode tp and --planner device: the device step over a TP space with kinds is not built "
           "(docs/ARCHITECTURE.md, \"Kinds under TP\"); use --planner host or engine";
  }
  if (cfg.share_percent > 0) {
    return fmt::format("--model with --share-percent {}: a space with kinds refuses ShareInto (kUnsupported: "
                       "adopted C4 entries would come without their tokens' window, C128 entries and compressor "
                       "state); use --share-percent 0", cfg.share_percent);
  }
  auto model = LoadModelConfigByName(m.name, DefaultConfigDir());
  if (!model) {
    return fmt::format("--model {}: no such model config ({}); known models {}", m.name, model.error().message(),
                       KnownModels());
  }
  VerifierConfig shaped = cfg;
  if (auto applied = ApplyModel(shaped, *model); !applied) {
    return fmt::format("--model {}: {}", m.name, applied.error().message());
  }
  if (m.groups_given && shaped.num_groups != cfg.num_groups) {
    return fmt::format("--groups {} does not match --model {}: its space has {} groups (one per compressed-sparse "
                       "layer); leave --groups out", cfg.num_groups, m.name, shaped.num_groups);
  }
  if (m.group_layers_given && shaped.group_layers != cfg.group_layers) {
    return fmt::format("--group-layers {} does not match --model {}: its groups hold {} layer(s) each; leave "
                       "--group-layers out", cfg.group_layers, m.name, shaped.group_layers);
  }
  if (m.mode == "tp" && shaped.group_layers != 1) {
    return fmt::format("--model {} with --mode tp: its groups hold {} layers; the TP verifier's entries are one row",
                       m.name, shaped.group_layers);
  }
  if (shaped.draft_reject_percent == 0) shaped.draft_reject_percent = 50;  // half the rounds reject a draft (V4's MTP)
  cfg = std::move(shaped);
  return std::nullopt;
}

Action SetupVerify(CLI::App& app) {
  auto cfg = std::make_shared<VerifierConfig>();
  auto json = std::make_shared<bool>(false);
  auto policy = std::make_shared<std::string>(std::string(PolicyKindName(DefaultPolicyKind())));
  app.add_option("--seed", cfg->seed, "random seed")->capture_default_str()->check(Seed());
  app.add_option("--ops", cfg->ops, "number of operations")->capture_default_str()->check(IntIn(1, 1000000000));
  app.add_option("--ranks", cfg->num_ranks, "ranks (DP)")->capture_default_str()->check(IntIn(1, 1024));
  auto groups_opt =
      app.add_option("--groups", cfg->num_groups, "layer groups")->capture_default_str()->check(IntIn(1, 1024));
  app.add_option("--device-slots", cfg->device_slots_per_group, "device slots per rank per group")
      ->capture_default_str()
      ->check(IntIn(1, 1 << 30));
  app.add_option("--host-slots", cfg->host_slots_per_group, "host slots per rank per group")->capture_default_str()
      ->check(IntIn(0, 1 << 30));
  app.add_option("--top-k", cfg->top_k, "selections per query")->capture_default_str()->check(IntIn(1, 1 << 20));
  app.add_option("--fault-rate", cfg->fault_rate,
                 "fail this fraction of the planner's copy and swap batches (fault_backend.h; tp: and, with --mpi, "
                 "its remote fetches, fault_fabric.h) and check that a failed step loses no entry and publishes "
                 "nothing early")
      ->capture_default_str()
      ->check(RealIn(0, 1));
  app.add_option("--share-percent", cfg->share_percent,
                 "percent of the arrivals that adopt a cached prefix of a live request (shared addresses, a "
                 "SparsePrefixCache; dp and tp)")
      ->capture_default_str()
      ->check(IntIn(0, 100));
  app.add_option("--draft-reject-percent", cfg->draft_reject_percent,
                 "percent of the decodes that first roll back 1..3 of the request's last tokens (Truncate: drafts "
                 "the verification rejected; dp and tp)")
      ->capture_default_str()
      ->check(IntIn(0, 100));
  app.add_flag("--reserve-rounds", cfg->reserve_rounds,
               "a decode allocates only once the step planner's ReserveRound admitted its tokens (dp and tp "
               "in-process; needs --stable-new-entries)");
  app.add_option("--policy", *policy, "residency policy")->capture_default_str();
  app.add_flag("--json", *json, "print one JSON object");
  auto planner = std::make_shared<std::string>("host");
  app.add_option("--planner", *planner,
                 "the step's form: host (the serial host step, the reference: StepPlanner / TpStepPlanner), engine (StepPlanner / TpStepPlanner's engine path: Plan, copies, Complete) or device "
                 "(DeviceStep's OpenMP form, one per rank: Reload / Plan / copies / Complete / StoreInto; tp: at "
                 "home, in-process, the ranks' verdicts agreed). The engine forms need --stable-new-entries, "
                 "device also --shadows off and --policy kernel_pb_lru (tp engine: --shadows off)")
      ->check(CLI::IsMember({"host", "engine", "device"}))->capture_default_str();
  auto cuda = std::make_shared<bool>(false);
  app.add_flag("--cuda", *cuda,
               "--planner device: the device step's CUDA form on the GPU (dp and tp at home; a build with CUDA and a "
               "GPU, refused with the reason otherwise)");
  app.add_flag("--stable-new-entries", cfg->stable_new_entries,
               "a new token's slot never moves in its round (stable_new_entries of the space's config; the "
               "engine forms need it)");
  auto group_layers_opt = app.add_option("--group-layers", cfg->group_layers,
                 "dp: layers per group (an entry is this many rows, one per layer region; divides the entry bytes)")
      ->capture_default_str()->check(IntIn(1, 64));
  auto model = std::make_shared<std::string>();
  app.add_option("--model", *model,
                 "a model with layer kinds (deepseek_v4_flash): the space holds its kinds, Allocate takes its "
                 "tokens and every step selects among C4 entries; every kind's page tables (tp: on every rank) are "
                 "checked against the verifier's model after every op, and half of the decodes roll back drafts "
                 "(docs/ARCHITECTURE.md, \"Kinds\" and \"Kinds under TP\"). dp: every planner form; tp: "
                 "--tp-attention at_home, --planner host or engine, ranks dividing 64 (in-process or --mpi). No "
                 "sharing; --groups and --group-layers are the model's");
  auto shadows = std::make_shared<std::string>("off");
  app.add_option("--shadows", *shadows, "clean host shadows (AddressSpaceConfig::host_shadows, TpConfig::host_shadows): on or off")
      ->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  auto attention_model = std::make_shared<std::string>("tiny_glm");
  auto attention_steps = std::make_shared<std::uint32_t>(16);
  app.add_option("--attention-model", *attention_model, "float32 model config for the attention check")
      ->capture_default_str();
  app.add_option("--attention-steps", *attention_steps, "decode steps of the attention check (0: skip)")
      ->capture_default_str()->check(IntIn(0, 100000));
  auto mode = std::make_shared<std::string>("dp");
  auto mpi = std::make_shared<bool>(false);
  app.add_option("--mode", *mode, "dp or tp (TP mode)")
      ->check(CLI::IsMember({"dp", "tp"}))->capture_default_str();
  app.add_flag("--mpi", *mpi, "tp only: one process per rank (run under mpirun)");
  auto tp_attention = std::make_shared<std::string>("local_buffer");
  app.add_option("--tp-attention", *tp_attention,
                 "tp: local_buffer (fetch remote entries into per-rank buffers) or at_home (partial attention on "
                 "each shard, merged by log-sum-exp)")
      ->check(CLI::IsMember({"local_buffer", "at_home"}))
      ->capture_default_str();
  return [cfg, json, policy, mode, mpi, attention_model, attention_steps, tp_attention, planner, shadows, model, groups_opt,
          group_layers_opt, cuda]() -> int {
    if (*cuda && *planner != "device") {
      fmt::print(stderr, "ula verify: --cuda runs the device step's CUDA form: it needs --planner device (got {})\n",
                 *planner);
      return 2;
    }
    if (*cuda) {  // a build without CUDA, or a machine without a GPU, says so before any work
      if (auto io = DeviceIo::Create(true, DeviceIoShape{}); !io) {
        fmt::print(stderr, "ula verify: --cuda: {}\n", io.error().ToString());
        return 2;
      }
    }
    cfg->cuda = *cuda;
    if (*mpi && *mode != "tp") {
      fmt::print(stderr, "ula verify: --mpi needs --mode tp (the DP verifier has no MPI mode: its ranks share one "
                         "process)\n");
      return 2;
    }
    if (cfg->reserve_rounds && !cfg->stable_new_entries) {
      fmt::print(stderr, "ula verify: --reserve-rounds needs --stable-new-entries (ReserveRound is the engine "
                         "path's: a planner made by Create)\n");
      return 2;
    }
    if (cfg->reserve_rounds && *mpi) {
      fmt::print(stderr, "ula verify: --reserve-rounds with --mpi: each process would admit by its own planner; "
                         "use in-process ranks\n");
      return 2;
    }
    cfg->form = ParsePlannerForm(*planner).value();
    cfg->host_shadows = *shadows == "on";
    if (!model->empty()) {
      const ModelRequest m{.name = *model, .mode = *mode,
                           .groups_given = groups_opt->count() > 0, .group_layers_given = group_layers_opt->count() > 0,
                           .tp_attention = *tp_attention, .planner = *planner};
      if (auto refused = ApplyModelOption(m, *cfg)) {
        fmt::print(stderr, "ula verify: {}\n", *refused);
        return 2;
      }
    }
    if (*mode == "tp") {
      return RunTpVerify({.seed = cfg->seed, .ops = cfg->ops, .ranks = cfg->num_ranks, .groups = cfg->num_groups,
                          .device_slots = cfg->device_slots_per_group, .host_slots = cfg->host_slots_per_group,
                          .top_k = cfg->top_k, .policy = *policy, .attention = *tp_attention, .mpi = *mpi,
                          .json = *json, .fault_rate = cfg->fault_rate, .share_percent = cfg->share_percent,
                          .form = cfg->form, .stable_new_entries = cfg->stable_new_entries,
                          .host_shadows = cfg->host_shadows, .draft_reject_percent = cfg->draft_reject_percent,
                          .reserve_rounds = cfg->reserve_rounds, .cuda = *cuda, .entry_bytes = cfg->entry_bytes,
                          .model = cfg->model});
    }
    auto kind = ParsePolicyKind(*policy);
    if (!kind) {
      fmt::print(stderr, "ula verify: {}\n", kind.error().ToString());
      return 2;
    }
    cfg->policy = *kind;
    const auto start = std::chrono::steady_clock::now();
    auto report = RunConsistencyVerifier(*cfg);
    if (!report) {
      fmt::print(stderr, "ula verify: {}\n", report.error().ToString());
      return 2;
    }
    // Attention end to end: the real indexer selects, the planner moves entries under
    // pressure, and the reference attention through UlaCache must equal the dense one.
    AttentionCheckReport att;
    if (*attention_steps > 0) {
      auto model = LoadModelConfigByName(*attention_model, DefaultConfigDir());
      if (!model) {
        fmt::print(stderr, "ula verify: {}\n", model.error().ToString());
        return 2;
      }
      AttentionCheckOptions options;
      options.model = *model;
      options.decode_steps = *attention_steps;
      options.seed = cfg->seed;
      auto a = RunAttentionCheckUnderPressure(options, 0.5, 1, cfg->policy);
      if (!a) {
        fmt::print(stderr, "ula verify: attention check: {}\n", a.error().ToString());
        return 2;
      }
      att = std::move(*a);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const VerifierReport& r = *report;
    const bool ok = r.ok() && att.ok();
    if (*json) {
      nlohmann::json j{{"seed", r.seed},
                       {"ops", r.ops},
                       {"steps", r.steps},
                       {"rejected_steps", r.rejected_steps},
                       {"entries_checked", r.entries_checked},
                       {"mismatches", r.mismatches},
                       {"invariant_failures", r.invariant_failures},
                       {"bad_input_checks", r.bad_input_checks},
                       {"bad_input_failures", r.bad_input_failures},
                       {"hits", r.hits},
                       {"fetches", r.fetches},
                       {"swaps", r.swaps},
                       {"shadows", *shadows},
                       {"shadow_evictions", r.shadow_evictions},
                       {"fault_rate", cfg->fault_rate},
                       {"faults_injected", r.faults_injected},
                       {"failed_calls", r.failed_calls},
                       {"entries_lost", r.entries_lost},
                       {"early_publishes", r.early_publishes},
                       {"share_percent", cfg->share_percent},
                       {"shares", r.shares},
                       {"sharer_checks", r.sharer_checks},
                       {"cache_evictions", r.cache_evictions},
                       {"locked_checks", r.locked_checks},
                       {"sharing_failures", r.sharing_failures},
                       {"model", *model},
                       {"kind_failures", r.kind_failures},
                       {"kind_pages_checked", r.kind_pages_checked},
                       {"c4_made", r.c4_made},
                       {"c4_freed", r.c4_freed},
                       {"c128_made", r.c128_made},
                       {"ring_blocks_freed", r.ring_blocks_freed},
                       {"draft_rollbacks", r.draft_rollbacks},
                       {"rollbacks_refused", r.rollbacks_refused},
                       {"draft_reject_percent", cfg->draft_reject_percent},
                       {"reserve_rounds", cfg->reserve_rounds},
                       {"reservations", r.reservations},
                       {"reservations_refused", r.reservations_refused},
                       {"policy", *policy},
                       {"planner", *planner},
                       {"cuda", *cuda},
                       {"seconds", seconds},
                       {"failures", r.first_failures},
                       {"attention_model", *attention_model},
                       {"attention_checks", att.checks},
                       {"attention_mismatches", att.mismatches},
                       {"attention_entry_mismatches", att.entry_mismatches},
                       {"attention_steps_with_swaps", att.steps_with_swaps},
                       {"attention_failures", att.first_failures}};
      fmt::print("{}\n", j.dump());
    } else {
      fmt::print("ula verify: seed {} policy {} planner {}{}, {} operations in {:.1f} s\n", r.seed, *policy, *planner,
                 *cuda ? " (CUDA form)" : "", r.ops, seconds);

      fmt::print("  steps              {:>12}  (+{} refused for lack of device room, checked unchanged)\n", r.steps,
                 r.rejected_steps);
      fmt::print("  hits / fetches / swaps  {} / {} / {}\n", r.hits, r.fetches, r.swaps);
      if (cfg->host_shadows) fmt::print("  host shadows on: {} of the evictions moved no bytes\n", r.shadow_evictions);
      fmt::print("  entries checked    {:>12}\n", r.entries_checked);
      fmt::print("  mismatches         {:>12}\n", r.mismatches);
      fmt::print("  invariant failures {:>12}\n", r.invariant_failures);
      fmt::print("  bad input refused  {:>12}  ({} not refused cleanly)\n", r.bad_input_checks, r.bad_input_failures);
      if (cfg->fault_rate > 0) {
        fmt::print("  faults (rate {}): {} injected, {} steps failed, {} entries lost, {} early publishes\n",
                   cfg->fault_rate, r.faults_injected, r.failed_calls, r.entries_lost, r.early_publishes);
      }
      if (cfg->share_percent > 0) {
        fmt::print("  sharing ({}% of arrivals): {} adopted prefixes, {} shared entries checked, {} cache evictions, "
                   "{} locked matches checked, {} failures\n", cfg->share_percent, r.shares, r.sharer_checks,
                   r.cache_evictions, r.locked_checks, r.sharing_failures);
      }
      if (cfg->draft_reject_percent > 0 && model->empty()) {
        fmt::print("  drafts ({}% of decodes): {} rolled back\n", cfg->draft_reject_percent, r.draft_rollbacks);
      }
      if (cfg->reserve_rounds) {
        fmt::print("  round reservations: {} decodes admitted, {} deferred\n", r.reservations, r.reservations_refused);
      }
      if (!model->empty()) {
        fmt::print("  kinds ({}): C4 entries made / freed {} / {}, C128 made {}, ring blocks freed {}, rollbacks {} "
                   "(+{} past the ring, refused unchanged); {} page tables checked, {} differ from the model\n",
                   *model, r.c4_made, r.c4_freed, r.c128_made, r.ring_blocks_freed, r.draft_rollbacks,
                   r.rollbacks_refused, r.kind_pages_checked, r.kind_failures);
      }
      fmt::print("  attention ({}): {} outputs compared with the dense reference, {} differ; {} of {} planner "
                 "calls swapped\n",
                 *attention_model, att.checks, att.mismatches, att.steps_with_swaps, att.planner_calls);
      for (const auto& f : r.first_failures) fmt::print("  FAIL: {}\n", f);
      for (const auto& f : att.first_failures) fmt::print("  FAIL (attention): {}\n", f);
      fmt::print("{}\n", ok ? "OK: every selected entry read back its last written bytes; attention is bit-identical"
                             : "FAILED: see above");
    }
    return ok ? 0 : 1;
  };
}

ULA_REGISTER_COMMAND(verify, "", "verify", "randomized consistency check: no movement changes what attention reads",
                     SetupVerify);

}  // namespace
}  // namespace ula::cli

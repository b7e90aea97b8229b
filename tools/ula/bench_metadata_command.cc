// `ula bench metadata`: bytes of metadata per entry per layer group of the DP address
// space (location table, device owner map, residency policy, free bitmaps, request lists)
// for a configuration, on the counting backend (no entry bytes are allocated).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cli_checks.h"
#include "command_registry.h"
#include "ula/address_space.h"
#include "ula/backend.h"

namespace ula::cli {
namespace {

struct MetadataOptions {
  std::uint32_t groups = 20;             // GLM-5: 78 layers / 4 + MTP
  std::uint32_t entry_bytes = 4 * 656;   // one group entry
  double device_gib = 100;               // KV bytes on device per rank
  double host_gib = 128;                 // host bytes per rank
  std::string policy = std::string(PolicyKindName(DefaultPolicyKind()));
  bool json = false;
};

int RunMetadata(const MetadataOptions& o) {
  auto kind = ParsePolicyKind(o.policy);
  if (!kind) {
    fmt::print(stderr, "ula bench metadata: {}\n", kind.error().ToString());
    return 2;
  }
  auto backend = MakeCountingBackend();
  AddressSpaceConfig c;
  c.num_groups = o.groups;
  c.entry_bytes = o.entry_bytes;
  c.device_bytes_per_rank = static_cast<std::uint64_t>(o.device_gib * (1ull << 30));
  c.host_bytes_per_rank = static_cast<std::uint64_t>(o.host_gib * (1ull << 30));
  c.policy = *kind;
  auto space = AddressSpace::Create(c, *backend);
  if (!space) {
    fmt::print(stderr, "ula bench metadata: {}\n", space.error().ToString());
    return 2;
  }
  const MetadataReport m = (*space)->Metadata();
  if (o.json) {
    nlohmann::json j{{"policy", o.policy},          {"groups", o.groups},
                     {"entry_bytes", o.entry_bytes}, {"device_slots_per_group", c.device_slots_per_group()},
                     {"host_slots_per_group", c.host_slots_per_group()},
                     {"location_table", m.location_table}, {"device_owner", m.device_owner},
                     {"policy_bytes", m.policy},      {"free_bitmaps", m.free_bitmaps},
                     {"request_lists", m.request_lists}, {"total_bytes_per_entry_per_group", m.total()}};
    fmt::print("{}\n", j.dump());
    return 0;
  }
  fmt::print("metadata per entry per group ({} policy; {} groups of {} B; {} device + {} host slots per group)\n",
             o.policy, o.groups, o.entry_bytes, c.device_slots_per_group(), c.host_slots_per_group());
  fmt::print("  location table  {:6.2f} B\n  device owner    {:6.2f} B\n  policy          {:6.2f} B\n"
             "  free bitmaps    {:6.2f} B\n  request lists   {:6.2f} B\n  total           {:6.2f} B\n",
             m.location_table, m.device_owner, m.policy, m.free_bitmaps, m.request_lists, m.total());
  return 0;
}

Action SetupMetadata(CLI::App& app) {
  auto o = std::make_shared<MetadataOptions>();
  app.add_option("--groups", o->groups, "layer groups")->capture_default_str()->check(IntIn(1, 4096));
  app.add_option("--entry-bytes", o->entry_bytes, "bytes of one group entry")->capture_default_str()
      ->check(IntIn(1, 1 << 24));
  app.add_option("--device-gib", o->device_gib, "KV GiB on device per rank")->capture_default_str()
      ->check(RealIn(0, 1 << 20, true));
  app.add_option("--host-gib", o->host_gib, "GiB on host per rank")->capture_default_str()->check(RealIn(0, 1 << 20));
  app.add_option("--policy", o->policy, "residency policy")->capture_default_str();
  app.add_flag("--json", o->json, "print one JSON object");
  return [o] { return RunMetadata(*o); };
}

ULA_REGISTER_COMMAND(bench_metadata, "bench", "metadata", "metadata bytes per entry per group", SetupMetadata);

}  // namespace
}  // namespace ula::cli

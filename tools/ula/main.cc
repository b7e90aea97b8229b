// `ula`: the UlaCache command-line program. Subcommands live in their own files.
#include <fmt/format.h>

#include <map>
#include <memory>

#include "command_registry.h"

namespace ula::cli {
std::vector<Command>& Registry() {
  static std::vector<Command> commands;
  return commands;
}
}  // namespace ula::cli

int main(int argc, char** argv) {
  CLI::App app{"ula: the UlaCache KV-cache memory manager — verification, benchmarks, comparisons"};
  app.require_subcommand(1);
  std::map<std::string, CLI::App*> parents;
  std::vector<std::pair<CLI::App*, ula::cli::Action>> actions;
  auto& commands = ula::cli::Registry();
  for (const auto& c : commands) {
    if (c.parent.empty() || parents.contains(c.parent)) continue;
    parents[c.parent] = app.add_subcommand(c.parent, c.parent + " commands");
    parents[c.parent]->require_subcommand(1);
  }
  actions.reserve(commands.size());
  for (const auto& c : commands) {
    CLI::App* parent = c.parent.empty() ? &app : parents[c.parent];
    CLI::App* sub = parent->add_subcommand(c.name, c.help);
    actions.emplace_back(sub, c.setup(*sub));
  }
  // Every parse or validation error (a negative count, an out-of-range fraction, an unknown
  // option: tools/ula/cli_checks.h) exits with status 2 and CLI11's message on stderr.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  for (auto& [sub, action] : actions) {
    if (sub->parsed()) return action();
  }
  return 1;
}

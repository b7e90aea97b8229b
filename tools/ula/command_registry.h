// Subcommands of the `ula` program register themselves here, one file per command, so
// that adding a command never edits main.cc:
//
//   ULA_REGISTER_COMMAND(verify, "", "Randomized consistency check", SetupVerify);
//   ULA_REGISTER_COMMAND(bench_gather, "bench", "gather vs memcpy", SetupGather);
//
// A setup function adds the options to its CLI11 subcommand and returns the action, which
// returns the process exit code. Give it a descriptive name (SetupVerify, SetupGather):
// a function named plain `Setup` inside namespace ula::cli collides with the type
// ula::cli::Setup used by the macro. Put the macro inside an anonymous namespace.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace ula::cli {

using Action = std::function<int()>;
using Setup = std::function<Action(CLI::App&)>;

struct Command {
  std::string name;    // e.g. "gather"
  std::string parent;  // "" for a top-level command, or e.g. "bench"
  std::string help;
  Setup setup;
};

std::vector<Command>& Registry();

struct Registrar {
  explicit Registrar(Command c) { Registry().push_back(std::move(c)); }
};

}  // namespace ula::cli

#define ULA_REGISTER_COMMAND(id, parent, name, help, setup) \
  static ::ula::cli::Registrar ula_registrar_##id(::ula::cli::Command{name, parent, help, setup})

// `ula verify --mode tp`: the TP consistency verifier from the command line, in-process
// ranks by default or one process per rank with --mpi (under mpirun). Kept out of
// verify_command.cc so that file only forwards to it.
#pragma once

#include "config/model_config.h"
#include "verify/planner_form.h"

#include <cstdint>
#include <optional>
#include <string>

namespace ula::cli {

struct TpVerifyArgs {
  std::uint64_t seed = 1;
  std::uint64_t ops = 3000;
  std::uint32_t ranks = 4;  // ignored with --mpi (the mpirun size)
  std::uint32_t groups = 2;
  std::uint32_t device_slots = 192;
  std::uint32_t host_slots = 1024;
  std::uint32_t top_k = 32;
  std::string policy;
  std::string attention = "local_buffer";  // or "at_home"
  bool mpi = false;
  bool json = false;
  double fault_rate = 0;  // in [0, 1]: TpVerifierConfig::fault_rate
  std::uint32_t share_percent = 0;  // arrivals that adopt a cached prefix
  PlannerForm form = PlannerForm::kHost;  // --planner: the step's form (verify/planner_form.h)
  bool stable_new_entries = false;       // --stable-new-entries (the engine forms need it)
  bool host_shadows = false;        // --shadows on: TpConfig::host_shadows
  std::uint32_t draft_reject_percent = 0;  // --draft-reject-percent: TpVerifierConfig's
  bool reserve_rounds = false;             // --reserve-rounds: TpVerifierConfig's
  bool cuda = false;                       // --cuda: the device step's CUDA form (TpVerifierConfig::cuda)
  std::uint32_t entry_bytes = 64;          // TpVerifierConfig::entry_bytes (--model: the model's)
  std::optional<ModelConfig> model;        // --model: TpVerifierConfig::model
};

// Returns the process exit code (0 ok, 1 verification failed, 2 bad arguments / no MPI).
int RunTpVerify(const TpVerifyArgs& args);

}  // namespace ula::cli

// TP mode over MPI: one process per rank (mpirun -np P tp_mpi). Every process makes the
// same scheduler calls (AddRequest, Allocate, Write, Step, AdvanceRound, Free); each one
// hosts only its own rank's shard, exposed to the others as RMA windows, and the planner
// fetches entries homed elsewhere with one-sided gets.
#include <cstdio>
#include <vector>

#include "ula/backend.h"
#include "ula/tp_address_space.h"
#include "ula/tp_mpi.h"
#include "ula/tp_step_planner.h"

int Fail(const ula::Error& e) {
  std::fprintf(stderr, "tp_mpi: %s\n", e.ToString().c_str());
  return 1;
}

int main(int argc, char** argv) {
  auto session = ula::MpiSession::Init(&argc, &argv);  // MPI_Finalize when it is destroyed
  if (!session) return Fail(session.error());
  auto fabric = ula::MakeMpiFabric();
  if (!fabric) return Fail(fabric.error());
  auto backend = ula::MakeCpuBackend();
  ula::TpConfig config;
  config.num_ranks = (*fabric)->num_ranks();
  config.num_groups = 1;
  config.entry_bytes = 64;
  config.device_bytes_per_rank = 16 * 64;
  config.host_bytes_per_rank = 32 * 64;
  config.buffer_bytes_per_rank = 16 * 64;
  const ula::Rank me = (*fabric)->local_rank();
  auto space = ula::TpAddressSpace::Create(config, *backend, {&me, 1});  // this rank only
  if (!space) return Fail(space.error());
  ula::TpAddressSpace& kv = **space;
  if (auto s = (*fabric)->Expose(kv); !s) return Fail(s.error());
  ula::TpStepPlanner planner(kv, fabric->get());

  const ula::RequestId req(1);
  if (auto s = kv.AddRequest(req); !s) return Fail(s.error());
  auto tokens = kv.Allocate(req, 10 * config.num_ranks);
  if (!tokens) return Fail(tokens.error());
  for (ula::LogicalAddr a : *tokens) {  // writes the entries homed here, on every process
    std::vector<std::byte> entry(config.entry_bytes, std::byte(a.value()));
    if (auto s = kv.Write(a, ula::GroupId(0), entry); !s) return Fail(s.error());
  }
  kv.AdvanceRound();

  std::vector<ula::LogicalAddr> selected(tokens->end() - 6, tokens->end());
  const std::vector<ula::SelectionRun> runs{{req, 6}};
  auto plan = planner.Step(ula::GroupId(0), selected, runs);  // collective
  if (!plan) return Fail(plan.error());
  for (std::size_t i = 0; i < selected.size(); ++i) {  // plan.ranks == {me}
    const std::byte* entry = kv.RefData(me, ula::GroupId(0), plan->refs[0][i]);
    if (entry == nullptr || *entry != std::byte(selected[i].value())) return 1;
  }
  kv.AdvanceRound();
  (*fabric)->Unexpose();  // collective; before the space is destroyed
  std::printf("tp_mpi: rank %u of %u read its 6 selected entries\n", me.value(), config.num_ranks);
  return 0;
}

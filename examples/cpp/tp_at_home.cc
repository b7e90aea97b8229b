// TP mode with attention at home, every rank in this process: no local buffer, no entry
// stored twice. Each rank computes all heads' partial attention over the selected entries
// of its own shard; the partials are merged per head (AttendAtHome does both on the CPU,
// the reference of what an engine's kernels and collectives do).
#include <cstdio>
#include <cstring>
#include <vector>

#include "ula/backend.h"
#include "ula/tp_address_space.h"
#include "ula/tp_home_attention.h"
#include "ula/tp_step_planner.h"

int Fail(const ula::Error& e) {
  std::fprintf(stderr, "tp_at_home: %s\n", e.ToString().c_str());
  return 1;
}

int main() {
  const ula::MlaShape shape{.num_heads = 4, .kv_lora_rank = 8, .rope_dim = 4, .softmax_scale = 0.25f};
  auto backend = ula::MakeCpuBackend();
  ula::TpConfig config;
  config.num_ranks = 4;
  config.num_groups = 1;                   // one layer per group here
  config.entry_bytes = shape.entry_bytes();  // float32 [latent | rope]
  config.attention = ula::TpAttention::kAtHome;
  config.device_bytes_per_rank = 16 * config.entry_bytes;
  config.host_bytes_per_rank = 32 * config.entry_bytes;
  config.buffer_bytes_per_rank = 0;  // at home: no local buffer
  auto space = ula::TpAddressSpace::Create(config, *backend);
  if (!space) return Fail(space.error());
  ula::TpAddressSpace& kv = **space;
  ula::TpStepPlanner planner(kv);

  const ula::RequestId req(1);
  if (auto s = kv.AddRequest(req); !s) return Fail(s.error());
  auto prompt = kv.Allocate(req, 64);  // prefill: 16 tokens homed on each rank
  if (!prompt) return Fail(prompt.error());
  for (ula::LogicalAddr a : *prompt) {
    std::vector<float> entry(shape.kv_lora_rank + shape.rope_dim, 0.01f * float(a.value() % 7));
    std::vector<std::byte> bytes(config.entry_bytes);
    std::memcpy(bytes.data(), entry.data(), bytes.size());
    if (auto s = kv.Write(a, ula::GroupId(0), bytes); !s) return Fail(s.error());
  }
  kv.AdvanceRound();

  // One decode query selecting 12 of the prompt's tokens, spread over the 4 ranks.
  std::vector<ula::LogicalAddr> selected(prompt->begin() + 20, prompt->begin() + 32);
  const std::vector<ula::SelectionRun> runs{{req, 12}};
  auto plan = planner.Step(ula::GroupId(0), selected, runs);
  if (!plan) return Fail(plan.error());
  std::vector<float> query(shape.query_values(), 0.5f);
  const std::vector<std::size_t> bounds{0, selected.size()};  // query 0 selected all 12
  auto out = ula::AttendAtHome(kv, *plan, ula::GroupId(0), shape, query, bounds);
  if (!out) return Fail(out.error());
  kv.AdvanceRound();
  // Rank r holds the merged output of the heads it owns: [queries][owned heads][latent].
  std::printf("tp_at_home: rank 0 owns heads [%u, %u), output[0] = %.4f\n", out->heads[0].begin,
              out->heads[0].end, out->outputs[0][0]);
  return 0;
}

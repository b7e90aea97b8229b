// IndexerDecodeSim: decoding at small scale with the real CPU indexer (indexer.h), the
// ground truth the selection model is calibrated against.
//
// Each request starts with prompt_tokens random index keys (unit-norm Gaussian in
// head_dim); the first sink_tokens keys get sink_boost * u added, u a fixed unit direction.
// Each step appends one new key per request and evolves its per-head query state
//
//   q_t[h] = normalize(query_keep * q_{t-1}[h] + query_noise * noise + query_newest * k_new)
//
// (draft query j >= 1 evolves once more from query j-1, without a new key); the indexer
// scores with q[h] + sink_align * u and fixed per-request head weights in [0.5, 1.5).
// query_keep sets how slowly attention drifts (step-to-step overlap), query_newest the
// pull towards the newest tokens (recency), sink_boost/sink_align the attention sinks.
//
// Heavy hitters (persistent affinity): every key t also gets heavy_boost * s_t * v added,
// v a fixed unit direction and s_t >= 0 a Lomax (Pareto II) salience with tail index
// heavy_alpha, drawn once per key from a hash of (seed, request, t); the indexer scores
// with q[h] + sink_align * u + heavy_align * v. A few keys of large salience then score high
// at every step whatever the query drifts to — the power-law attention mass of H2O (Zhang
// et al., NeurIPS 2023) and the persistence of importance of Scissorhands (Liu et al.,
// NeurIPS 2023). heavy_boost = 0 turns it off (the keys are then as without it).
// Sinks follow StreamingLLM (Xiao et al., ICLR 2024); the recency pull, H2O's recent window.
// The parameters live in configs/workloads/<name>.json with the model they use.
//
// Compressed entries (DeepSeek-V4's compressed sparse attention, docs/ARCHITECTURE.md
// "kinds"): with tokens_per_entry = m > 1 the indexer scores one key per m tokens, the C4
// entries. The prompt's tokens make floor(prompt_tokens / m) entries; each step decodes one
// token, whose queries are evolved and scored every step, and a new entry (its key) arrives
// only at the step that completes a block of m tokens (the tokens before are compressor
// state). The recency pull is towards the newest entry's key. Positions, context_len and
// sink_tokens then count entries. tokens_per_entry = 1 (the JSON default) is the per-token
// indexer above, draw for draw.
//
// Determinism: a pure function of (shape, config); request r draws from its own stream.
// Thread-safety: none; one thread drives a simulation.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ula/error.h"
#include "indexer/indexer.h"

namespace ula {

struct DecodeSimConfig {
  std::string model;               // model config name (its indexer shape and top-k)
  std::uint64_t seed = 1;
  std::uint32_t num_requests = 0;
  std::uint32_t prompt_tokens = 0;
  std::uint32_t decode_steps = 0;
  std::uint32_t draft_tokens = 0;  // 1 + draft_tokens queries per step
  double query_keep = 0;
  double query_noise = 0;
  double query_newest = 0;
  std::uint32_t sink_tokens = 0;
  double sink_boost = 0;
  double sink_align = 0;
  double heavy_alpha = 1;   // (0, 100]: Lomax tail index of the per-key salience
  double heavy_boost = 0;   // [0, 100]: 0 = no heavy hitters
  double heavy_align = 0;   // [0, 100]
  std::uint32_t tokens_per_entry = 1;  // [1, 1024]: 4 for a C4 indexer; optional in JSON

  Status Validate() const;  // names the first bad field
  std::uint32_t queries_per_step() const { return 1 + draft_tokens; }
  std::uint32_t prompt_entries() const { return prompt_tokens / tokens_per_entry; }
};

Result<DecodeSimConfig> ParseDecodeSimConfig(std::string_view json_text, std::string_view origin = "decode config");
// config_dir / "workloads" / (name + ".json").
Result<DecodeSimConfig> LoadDecodeSimConfigByName(std::string_view name, const std::filesystem::path& config_dir);

class IndexerDecodeSim {
 public:
  // `salt` gives an independent simulation with the same config (e.g. one per layer group).
  static Result<std::unique_ptr<IndexerDecodeSim>> Create(const IndexerShape& shape, const DecodeSimConfig& config,
                                                          std::uint64_t salt = 0);
  ~IndexerDecodeSim();

  // Appends one token to every request (and its entry when it completes one), evolves its
  // queries and runs the indexer: afterwards Selections(r)[j] is query j's top-k over the
  // context_len(r) entries.
  Status Step();

  std::uint32_t num_requests() const;
  // Entries (keys) of the request: its tokens when tokens_per_entry = 1.
  std::uint32_t context_len(std::uint32_t request) const;
  // Tokens of the request (prompt and decoded).
  std::uint64_t tokens(std::uint32_t request) const;
  std::span<const std::vector<std::uint32_t>> Selections(std::uint32_t request) const;
  // The union of the step's queries (first-appearance order).
  std::span<const std::uint32_t> UnionSelection(std::uint32_t request) const;

 private:
  struct State;
  explicit IndexerDecodeSim(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace ula

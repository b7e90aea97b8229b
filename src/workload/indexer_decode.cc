// IndexerDecodeSim (indexer_decode.h).
#include "workload/indexer_decode.h"

#include <fmt/format.h>

#include <cmath>

#include "config/json_fields.h"
#include "workload/rng.h"

namespace ula {
namespace {

void Normalize(std::span<float> v) {
  double norm = 0;
  for (float x : v) norm += double{x} * x;
  norm = std::sqrt(norm);
  if (norm > 0) {
    for (float& x : v) x = static_cast<float>(x / norm);
  }
}

void RandomUnit(workload_internal::Rng& rng, std::span<float> v) {
  for (float& x : v) x = static_cast<float>(rng.Normal());
  Normalize(v);
}

// The heavy-hitter salience of key t of a request: Lomax with tail index alpha,
// (1 - u)^(-1/alpha) - 1, u from a hash so that it draws nothing from the request's stream.
double Salience(std::uint64_t request_seed, std::uint64_t t, double alpha) {
  std::uint64_t h = request_seed ^ (t * 0x9e3779b97f4a7c15ull + 0x6a09e667f3bcc909ull);
  const double u = static_cast<double>(workload_internal::SplitMix64(h) >> 11) * 0x1.0p-53;
  return std::pow(1.0 - u, -1.0 / alpha) - 1.0;
}

}  // namespace

Status DecodeSimConfig::Validate() const {
  auto bad = [](const char* f, std::string_view why) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("field '{}': {}", f, why));
  };
  if (num_requests == 0) return bad("num_requests", "must be >= 1");
  if (prompt_tokens == 0) return bad("prompt_tokens", "must be >= 1");
  if (decode_steps < 2) return bad("decode_steps", "must be >= 2 (overlap needs two steps)");
  if (draft_tokens > 16) return bad("draft_tokens", "must be <= 16");
  if (!(query_keep >= 0 && query_keep <= 10)) return bad("query_keep", "must be in [0, 10]");
  if (!(query_noise >= 0 && query_noise <= 10)) return bad("query_noise", "must be in [0, 10]");
  if (!(query_newest >= 0 && query_newest <= 10)) return bad("query_newest", "must be in [0, 10]");
  if (query_keep + query_noise + query_newest <= 0) return bad("query_keep", "query_keep + query_noise + query_newest must be > 0");
  if (tokens_per_entry < 1 || tokens_per_entry > 1024) return bad("tokens_per_entry", "must be in [1, 1024]");
  if (prompt_tokens < tokens_per_entry) return bad("prompt_tokens", "must be >= tokens_per_entry (one entry at least)");
  if (sink_tokens > prompt_entries()) return bad("sink_tokens", "must be <= prompt_tokens / tokens_per_entry");
  if (!(sink_boost >= 0 && sink_boost <= 100)) return bad("sink_boost", "must be in [0, 100]");
  if (!(sink_align >= 0 && sink_align <= 100)) return bad("sink_align", "must be in [0, 100]");
  if (!(heavy_alpha > 0 && heavy_alpha <= 100)) return bad("heavy_alpha", "must be in (0, 100]");
  if (!(heavy_boost >= 0 && heavy_boost <= 100)) return bad("heavy_boost", "must be in [0, 100]");
  if (!(heavy_align >= 0 && heavy_align <= 100)) return bad("heavy_align", "must be in [0, 100]");
  return Ok();
}

Result<DecodeSimConfig> ParseDecodeSimConfig(std::string_view json_text, std::string_view origin) {
  auto f = config_internal::JsonFields::Parse(json_text, std::string(origin));
  if (!f) return std::unexpected(f.error());
  DecodeSimConfig c;
  auto str = [&](const char* name, std::string* out) -> Status {
    auto v = f->String(name);
    if (!v) return std::unexpected(v.error());
    if (out != nullptr) *out = *v;
    return Ok();
  };
  auto uint = [&](const char* name, std::uint32_t* out, std::uint64_t min, std::uint64_t max) -> Status {
    auto v = f->UInt(name, min, max);
    if (!v) return std::unexpected(v.error());
    *out = static_cast<std::uint32_t>(*v);
    return Ok();
  };
  auto real = [&](const char* name, double* out, double max) -> Status {
    auto v = f->Double(name, 0, max);
    if (!v) return std::unexpected(v.error());
    *out = *v;
    return Ok();
  };
  ULA_RETURN_IF_ERROR(str("name", nullptr));
  ULA_RETURN_IF_ERROR(str("source", nullptr));
  ULA_RETURN_IF_ERROR(str("model", &c.model));
  auto seed = f->UInt("seed", 0, ~std::uint64_t{0});
  if (!seed) return std::unexpected(seed.error());
  c.seed = *seed;
  ULA_RETURN_IF_ERROR(uint("num_requests", &c.num_requests, 1, 1u << 20));
  ULA_RETURN_IF_ERROR(uint("prompt_tokens", &c.prompt_tokens, 1, 1u << 30));
  ULA_RETURN_IF_ERROR(uint("decode_steps", &c.decode_steps, 2, 1u << 20));
  ULA_RETURN_IF_ERROR(uint("draft_tokens", &c.draft_tokens, 0, 16));
  ULA_RETURN_IF_ERROR(real("query_keep", &c.query_keep, 10));
  ULA_RETURN_IF_ERROR(real("query_noise", &c.query_noise, 10));
  ULA_RETURN_IF_ERROR(real("query_newest", &c.query_newest, 10));
  ULA_RETURN_IF_ERROR(uint("sink_tokens", &c.sink_tokens, 0, 1u << 30));
  ULA_RETURN_IF_ERROR(real("sink_boost", &c.sink_boost, 100));
  ULA_RETURN_IF_ERROR(real("sink_align", &c.sink_align, 100));
  ULA_RETURN_IF_ERROR(real("heavy_alpha", &c.heavy_alpha, 100));
  ULA_RETURN_IF_ERROR(real("heavy_boost", &c.heavy_boost, 100));
  ULA_RETURN_IF_ERROR(real("heavy_align", &c.heavy_align, 100));
  if (f->Has("tokens_per_entry")) ULA_RETURN_IF_ERROR(uint("tokens_per_entry", &c.tokens_per_entry, 1, 1024));
  ULA_RETURN_IF_ERROR(f->CheckNoUnknownFields());
  if (auto st = c.Validate(); !st) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("{}: {}", origin, st.error().message()));
  }
  return c;
}

Result<DecodeSimConfig> LoadDecodeSimConfigByName(std::string_view name, const std::filesystem::path& config_dir) {
  const auto path = config_dir / "workloads" / (std::string(name) + ".json");
  auto text = config_internal::ReadTextFile(path.string());
  if (!text) return std::unexpected(text.error());
  return ParseDecodeSimConfig(*text, path.string());
}

struct IndexerDecodeSim::State {
  struct Request {
    explicit Request(std::uint64_t seed) : rng(seed), salience_seed(seed) {}
    workload_internal::Rng rng;
    std::uint64_t salience_seed;
    std::vector<float> keys;     // [context_len * head_dim]: one key per entry
    std::vector<float> newest;   // [head_dim] the newest entry's key before its salience
    std::uint64_t tokens = 0;    // prompt and decoded tokens
    std::vector<float> q_state;  // [num_heads * head_dim], the evolving query of token t
    std::vector<float> weights;  // [num_heads]
    std::vector<std::vector<std::uint32_t>> selections;  // [queries][top_k]
    std::vector<std::uint32_t> union_sel;
  };
  IndexerShape shape;
  DecodeSimConfig config;
  Indexer indexer;
  std::vector<float> sink_dir;   // [head_dim] u
  std::vector<float> heavy_dir;  // [head_dim] v
  std::vector<Request> requests;
  std::vector<float> noise, scored_query, q_chain;  // scratch

  // Key t of `req` gets its heavy-hitter component (none when heavy_boost is 0).
  void AddSalience(const Request& req, std::uint64_t t, std::span<float> k) const {
    if (config.heavy_boost <= 0) return;
    const auto a = static_cast<float>(config.heavy_boost * Salience(req.salience_seed, t, config.heavy_alpha));
    for (std::size_t d = 0; d < k.size(); ++d) k[d] += a * heavy_dir[d];
  }
};

IndexerDecodeSim::IndexerDecodeSim(std::unique_ptr<State> state) : state_(std::move(state)) {}
IndexerDecodeSim::~IndexerDecodeSim() = default;

Result<std::unique_ptr<IndexerDecodeSim>> IndexerDecodeSim::Create(const IndexerShape& shape,
                                                                   const DecodeSimConfig& config, std::uint64_t salt) {
  ULA_RETURN_IF_ERROR(config.Validate());
  auto indexer = Indexer::Create(shape);
  if (!indexer) return std::unexpected(indexer.error());
  auto st = std::unique_ptr<State>(new State{shape, config, std::move(*indexer), {}, {}, {}, {}, {}, {}});
  const std::uint32_t dim = shape.head_dim;
  const std::uint64_t base = workload_internal::StreamSeed(config.seed, 0x5eed0000ull + salt);
  workload_internal::Rng global(base);
  st->sink_dir.resize(dim);
  RandomUnit(global, st->sink_dir);
  st->heavy_dir.resize(dim);
  RandomUnit(global, st->heavy_dir);  // drawn after u: the sinks are as without heavy hitters
  for (std::uint32_t r = 0; r < config.num_requests; ++r) {
    State::Request req(workload_internal::StreamSeed(base, r));
    req.tokens = config.prompt_tokens;
    req.keys.resize(std::size_t{config.prompt_entries()} * dim);
    for (std::uint32_t t = 0; t < config.prompt_entries(); ++t) {
      std::span<float> k(req.keys.data() + std::size_t{t} * dim, dim);
      RandomUnit(req.rng, k);
      if (t + 1 == config.prompt_entries()) req.newest.assign(k.begin(), k.end());
      if (t < config.sink_tokens) {
        for (std::uint32_t d = 0; d < dim; ++d) k[d] += static_cast<float>(config.sink_boost) * st->sink_dir[d];
      }
      st->AddSalience(req, t, k);
    }
    req.q_state.resize(std::size_t{shape.num_heads} * dim);
    for (std::uint32_t h = 0; h < shape.num_heads; ++h) {
      RandomUnit(req.rng, std::span<float>(req.q_state.data() + std::size_t{h} * dim, dim));
    }
    req.weights.resize(shape.num_heads);
    for (float& w : req.weights) w = static_cast<float>(0.5 + req.rng.Uniform01());
    st->requests.push_back(std::move(req));
  }
  return std::unique_ptr<IndexerDecodeSim>(new IndexerDecodeSim(std::move(st)));
}

Status IndexerDecodeSim::Step() {
  State& s = *state_;
  const std::uint32_t dim = s.shape.head_dim, heads = s.shape.num_heads;
  const DecodeSimConfig& c = s.config;
  s.noise.resize(dim);
  s.scored_query.resize(std::size_t{heads} * dim);
  for (State::Request& req : s.requests) {
    // The new token; its block's entry (key) when the token completes a block.
    ++req.tokens;
    if (req.tokens % c.tokens_per_entry == 0) {
      const std::size_t old = req.keys.size();
      req.keys.resize(old + dim);
      std::span<float> k_new(req.keys.data() + old, dim);
      RandomUnit(req.rng, k_new);
      req.newest.assign(k_new.begin(), k_new.end());  // the pull is towards the key, not its salience
      s.AddSalience(req, old / dim, k_new);
    }
    req.selections.resize(c.queries_per_step());
    s.q_chain = req.q_state;
    for (std::uint32_t j = 0; j < c.queries_per_step(); ++j) {
      for (std::uint32_t h = 0; h < heads; ++h) {
        std::span<float> q(s.q_chain.data() + std::size_t{h} * dim, dim);
        RandomUnit(req.rng, s.noise);
        for (std::uint32_t d = 0; d < dim; ++d) {
          q[d] = static_cast<float>(c.query_keep * q[d] + c.query_noise * s.noise[d] + c.query_newest * req.newest[d]);
        }
        Normalize(q);
        float* sq = s.scored_query.data() + std::size_t{h} * dim;
        for (std::uint32_t d = 0; d < dim; ++d) {
          sq[d] = q[d] + static_cast<float>(c.sink_align) * s.sink_dir[d] + static_cast<float>(c.heavy_align) * s.heavy_dir[d];
        }
      }
      if (j == 0) req.q_state = s.q_chain;
      ULA_RETURN_IF_ERROR(s.indexer.Select({s.scored_query, req.weights}, req.keys, req.selections[j]));
    }
    UnionSelections(req.selections, static_cast<std::uint32_t>(req.keys.size() / dim), req.union_sel);
  }
  return Ok();
}

std::uint32_t IndexerDecodeSim::num_requests() const { return static_cast<std::uint32_t>(state_->requests.size()); }

std::uint32_t IndexerDecodeSim::context_len(std::uint32_t request) const {
  return static_cast<std::uint32_t>(state_->requests.at(request).keys.size() / state_->shape.head_dim);
}

std::uint64_t IndexerDecodeSim::tokens(std::uint32_t request) const { return state_->requests.at(request).tokens; }

std::span<const std::vector<std::uint32_t>> IndexerDecodeSim::Selections(std::uint32_t request) const {
  return state_->requests.at(request).selections;
}

std::span<const std::uint32_t> IndexerDecodeSim::UnionSelection(std::uint32_t request) const {
  return state_->requests.at(request).union_sel;
}

}  // namespace ula

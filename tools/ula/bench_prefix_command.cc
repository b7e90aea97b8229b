// `ula bench prefix`: the returning-prefix experiment on the small hybrid model.
// Cache N prefixes, send one unrelated long request that needs memory at once (or in
// chunks), then send the N prefixes again; compare the eviction rules. Also measures the
// unified buffer's own overhead on the model: median time between output tokens against
// fixed pools, same run. Then the branching experiment: each prefix returns as several
// variants that share a random part of it and then differ; with checkpoints at the
// branching point (the cache's token-granular match) against without (checkpoints only
// every checkpoint_interval tokens and at the end, as the page-granular cache had). The
// chunked runs print what each chunk's allocation evicted. Then the sliding-window tables,
// and the unaligned tail of finished requests: multi-turn conversations whose turns extend
// the last, with the partial last page kept (ours) against dropped (SGLang's).
//
// Sizes: the small model computes, but the buffer's accounting follows a
// real hybrid model's config (--sizing NAME: configs/hybrid/NAME.json, default Qwen3-Next-80B-A3B):
// its state bytes per request (every linear-attention layer's recurrent and conv state) and
// its KV bytes per token (every full-attention layer), so that one checkpoint is worth as
// many KV pages as in that model. The ratio is kept, the scale is not: a KV page is the small
// model's page block (16 tokens), and a state block is ratio x that many bytes (ratio =
// real state bytes / real bytes of a 16-token page), so the buffer is the real model's at
// 1 / (real page bytes / small page bytes) scale. The small model's own state and sliding-
// window ring sit at the start of their blocks. --sizing small: the small model's own bytes.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <optional>
#include <string>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_checks.h"
#include "command_registry.h"
#include "config/json_fields.h"
#include "config/model_config.h"
#include "unified/fixed_split_allocator.h"
#include "model/hybrid_runner.h"
#include "ula/unified_buffer.h"

namespace ula::cli {
namespace {

struct Options {
  bool json = false;
  std::uint32_t prefixes = 28;
  std::uint32_t prefix_tokens = 512;
  std::uint32_t suffix_tokens = 16;
  std::uint32_t new_tokens = 8;
  std::uint32_t checkpoint_interval = 256;
  std::uint32_t long_tokens = 7000;
  std::uint32_t chunk_tokens = 2048;
  double free_fraction = 0.5;  // free space before the long request, as a fraction of its size
  std::uint32_t seed = 7;
  std::uint32_t variants = 3;  // branching experiment: variants per prefix
  std::uint32_t host_slots = 64;  // the host-tier run: checkpoints the host holds
  std::uint32_t host_page_slots = 512;  // the host-tier run with KV: KV pages the host holds
  std::uint32_t turns = 4;  // the unaligned-tail experiment: turns per conversation
  std::string sizing = "qwen3_next_80b_a3b";  // configs/hybrid/<name>.json, or "small"
  std::string config_dir;
};

// A real hybrid model's memory per request and per token (configs/hybrid/<name>.json).
struct RealSizing {
  std::string name;
  std::uint32_t attention_layers = 0, linear_layers = 0;
  std::uint64_t kv_bytes_per_token = 0;  // all full-attention layers
  std::uint64_t state_bytes = 0;         // one request's recurrent + conv state, all linear layers
  std::uint64_t ssm_bytes_per_layer = 0, conv_bytes_per_layer = 0;
};

Result<RealSizing> LoadRealSizing(const std::string& name, const std::filesystem::path& dir) {
  const std::string path = (dir / "hybrid" / (name + ".json")).string();
  auto text = config_internal::ReadTextFile(path);
  if (!text) return std::unexpected(text.error());
  auto f = config_internal::JsonFields::Parse(*text, path);
  if (!f) return std::unexpected(f.error());
  RealSizing r;
  auto n = f->String("name");
  if (!n) return std::unexpected(n.error());
  r.name = *n;
  for (const char* field : {"source", "state_layout"}) {
    if (auto v = f->String(field); !v) return std::unexpected(v.error());
  }
  std::uint64_t v[10];
  const char* ints[10] = {"num_hidden_layers",     "full_attention_interval", "num_key_value_heads",
                          "head_dim",              "linear_num_key_heads",    "linear_num_value_heads",
                          "linear_key_head_dim",   "linear_value_head_dim",   "linear_conv_kernel_dim", nullptr};
  for (int i = 0; ints[i] != nullptr; ++i) {
    auto x = f->UInt(ints[i], 1, 1u << 20);
    if (!x) return std::unexpected(x.error());
    v[i] = *x;
  }
  double bytes[3];
  const char* sourced[3] = {"kv_bytes_per_value", "conv_state_bytes_per_value", "ssm_state_bytes_per_value"};
  for (int i = 0; i < 3; ++i) {
    auto x = f->SourcedDouble(sourced[i], 0.5, 8);
    if (!x) return std::unexpected(x.error());
    bytes[i] = *x;
  }
  ULA_RETURN_IF_ERROR(f->CheckNoUnknownFields());
  const auto [layers, interval, kv_heads, head_dim, lk_heads, lv_heads, lk_dim, lv_dim, conv_k] =
      std::array<std::uint64_t, 9>{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8]};
  if (layers % interval != 0) return std::unexpected(f->FieldError("full_attention_interval", "must divide num_hidden_layers"));
  r.attention_layers = static_cast<std::uint32_t>(layers / interval);
  r.linear_layers = static_cast<std::uint32_t>(layers - r.attention_layers);
  r.kv_bytes_per_token = static_cast<std::uint64_t>(r.attention_layers * 2 * kv_heads * head_dim * bytes[0]);
  const std::uint64_t conv_dim = 2 * lk_heads * lk_dim + lv_heads * lv_dim;
  r.conv_bytes_per_layer = static_cast<std::uint64_t>((conv_k - 1) * conv_dim * bytes[1]);
  r.ssm_bytes_per_layer = static_cast<std::uint64_t>(lv_heads * lk_dim * lv_dim * bytes[2]);
  r.state_bytes = r.linear_layers * (r.conv_bytes_per_layer + r.ssm_bytes_per_layer);
  return r;
}

// The allocator's kinds: the small model's, with the state block sized to the real model's
// state/page ratio (nullopt sizing: the small model's own).
std::vector<KindConfig> AccountedKinds(const HybridModel& model, const std::optional<RealSizing>& real) {
  auto kinds = model.Kinds(64);
  if (real) {
    const double real_page = double(real->kv_bytes_per_token) * model.config().page_tokens;
    const double ratio = double(real->state_bytes) / real_page;
    const auto state = static_cast<std::uint64_t>(std::ceil(ratio * double(kinds[1].block_bytes) / 64.0)) * 64;
    kinds[0].block_bytes = std::max(kinds[0].block_bytes, state);
  }
  return kinds;
}

std::vector<std::uint32_t> RandomTokens(std::mt19937& rng, std::size_t n, std::uint32_t vocab) {
  std::vector<std::uint32_t> t(n);
  for (auto& x : t) x = rng() % vocab;
  return t;
}

struct Sizes {
  std::uint64_t page_bytes, state_bytes, window_bytes, checkpoint_bytes;
  std::uint64_t prefix_bytes;  // one cached prefix: its pages and checkpoints
  std::uint64_t long_bytes;    // the long request's demand
  std::uint64_t buffer_bytes;
};

Sizes ComputeSizes(const std::vector<KindConfig>& kinds, const HybridModel& model, const Options& o) {
  const std::uint32_t P = model.config().page_tokens;
  Sizes s;
  s.page_bytes = kinds[1].block_bytes;
  s.state_bytes = kinds[0].block_bytes;
  s.window_bytes = kinds[2].block_bytes;
  s.checkpoint_bytes = s.state_bytes + s.window_bytes;
  const std::uint32_t fed = o.prefix_tokens + o.new_tokens - 1;
  const std::uint32_t checkpoints = (o.checkpoint_interval ? o.prefix_tokens / o.checkpoint_interval : 0) + 1;
  s.prefix_bytes = std::uint64_t{(fed + P - 1) / P} * s.page_bytes + checkpoints * s.checkpoint_bytes;
  s.long_bytes = std::uint64_t{(o.long_tokens + P - 1) / P} * s.page_bytes + s.checkpoint_bytes;
  const auto free_bytes = static_cast<std::uint64_t>(o.free_fraction * s.long_bytes) / s.page_bytes * s.page_bytes;
  s.buffer_bytes = o.prefixes * s.prefix_bytes + free_bytes + s.page_bytes /* padding page */;
  return s;
}

struct RunResult {
  EvictionRule rule;
  bool chunked;
  std::uint32_t host_slots = 0;
  std::uint32_t host_page_slots = 0;
  std::uint32_t on_host = 0;  // prefixes whose checkpoint at the prefix's end went to the host
  std::uint32_t retained = 0;
  std::uint64_t recomputed = 0;
  double returning_ms = 0;
  EvictionStats evicted;
  std::vector<EvictionStats> chunks;  // what each allocation of the long request evicted
};

Result<RunResult> RunOnce(const HybridModel& model, const std::vector<KindConfig>& kinds, const Options& o,
                          const Sizes& sizes, EvictionRule rule, bool chunked, std::uint32_t host_slots,
                          std::uint32_t host_page_slots, const std::vector<std::vector<std::uint32_t>>& prefixes,
                          const std::vector<std::vector<std::uint32_t>>& returning) {
  UnifiedBufferConfig c;
  c.alignment = 64;
  c.kinds = kinds;
  c.capacity_bytes = sizes.buffer_bytes;
  c.padding_kind = kModelKvKind;
  c.padding_blocks = 1;
  // One backend holds the buffer's arena and, for the host-tier run, the host arena.
  auto backend = MakeCpuBackend(CpuBackendOptions{.copy_threads = 1});
  auto device = backend->CreateArena(Tier::kDevice, Rank(0), c.capacity_bytes);
  if (!device) return std::unexpected(device.error());
  auto buffer = UnifiedBuffer::Create(c, *device);
  if (!buffer) return std::unexpected(buffer.error());
  auto cache = PrefixCache::Create(PrefixCacheConfig{.page_tokens = model.config().page_tokens}, buffer->get());
  if (!cache) return std::unexpected(cache.error());
  if (host_slots > 0) {
    auto host = backend->CreateArena(Tier::kHost, Rank(0),
                                     host_slots * sizes.checkpoint_bytes + std::uint64_t{host_page_slots} * sizes.page_bytes);
    if (!host) return std::unexpected(host.error());
    ULA_RETURN_IF_ERROR((*cache)->AttachHostTier({backend.get(), device->id, *host, host_slots, host_page_slots}));
  }
  HybridRunner runner(model, **buffer, cache->get());
  const ServeOptions serve{.max_new_tokens = o.new_tokens, .checkpoint_interval = o.checkpoint_interval, .rule = rule};
  RunResult r{.rule = rule, .chunked = chunked, .host_slots = host_slots, .host_page_slots = host_page_slots, .evicted = {}, .chunks = {}};
  for (const auto& p : prefixes) {
    auto s = runner.Serve(p, serve);
    if (!s) return std::unexpected(s.error());
  }
  auto seq = runner.Reserve(o.long_tokens, chunked ? o.chunk_tokens : 0, rule, &r.evicted, &r.chunks);
  if (!seq) return std::unexpected(seq.error());
  ULA_RETURN_IF_ERROR(runner.Release(*seq));  // not cacheable: measures what eviction destroyed
  for (const auto& p : prefixes) {
    r.retained += (*cache)->Holds(p) ? 1 : 0;
    r.on_host += (*cache)->HoldsOnHost(p) ? 1 : 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& q : returning) {
    auto s = runner.Serve(q, serve);
    if (!s) return std::unexpected(s.error());
    r.recomputed += s->recomputed - o.suffix_tokens;  // prefix tokens that had to be computed again
  }
  r.returning_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ULA_RETURN_IF_ERROR((*buffer)->CheckInvariants());
  ULA_RETURN_IF_ERROR((*cache)->CheckInvariants());
  return r;
}

struct BranchResult {
  std::uint32_t alignment = 0;
  std::uint64_t matched = 0, recomputed = 0;
  std::uint32_t checkpoints = 0;  // in the cache at the end
  double ms = 0;
};

// Serves every prefix, then its variants, on a buffer large enough that nothing is evicted.
Result<BranchResult> RunBranching(const HybridModel& model, const std::vector<KindConfig>& kinds, const Options& o,
                                  const Sizes& sizes,
                                  std::uint32_t alignment, const std::vector<std::vector<std::uint32_t>>& prefixes,
                                  const std::vector<std::vector<std::uint32_t>>& variants) {
  UnifiedBufferConfig c;
  c.alignment = 64;
  c.kinds = kinds;
  c.capacity_bytes = (prefixes.size() + variants.size()) * 2 * sizes.prefix_bytes + sizes.page_bytes;
  c.padding_kind = kModelKvKind;
  c.padding_blocks = 1;
  auto buffer = UnifiedBuffer::Create(c);
  if (!buffer) return std::unexpected(buffer.error());
  auto cache = PrefixCache::Create(PrefixCacheConfig{.page_tokens = model.config().page_tokens}, buffer->get());
  if (!cache) return std::unexpected(cache.error());
  HybridRunner runner(model, **buffer, cache->get());
  const ServeOptions serve{.max_new_tokens = o.new_tokens, .checkpoint_interval = o.checkpoint_interval,
                           .branch_alignment = alignment};
  for (const auto& p : prefixes) {
    auto s = runner.Serve(p, serve);
    if (!s) return std::unexpected(s.error());
  }
  BranchResult r{.alignment = alignment};
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& v : variants) {
    auto s = runner.Serve(v, serve);
    if (!s) return std::unexpected(s.error());
    r.matched += s->matched;
    r.recomputed += s->recomputed;
  }
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  r.checkpoints = static_cast<std::uint32_t>((*cache)->num_checkpoints());
  ULA_RETURN_IF_ERROR((*buffer)->CheckInvariants());
  ULA_RETURN_IF_ERROR((*cache)->CheckInvariants());
  return r;
}

double Median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Sliding-window KV: a ring in every checkpoint against window pages in the tree (
// item 4). The same prefixes and returning requests, on buffers of the same bytes
// (`fraction` of what the ring needs to keep every prefix), allocation-aware eviction.
struct WindowResult {
  bool pages = false;
  std::uint64_t window_bytes = 0;  // window KV the buffer holds after the prefixes were served
  std::uint32_t retained = 0;
  std::uint64_t recomputed = 0;
  std::uint64_t variant_recomputed = 0;  // of the branching variants served before the returning requests
  double returning_ms = 0, token_us = 0;
};

// `variants` (may be empty) are served after the prefixes and before the returning requests.
Result<WindowResult> RunWindow(bool pages, std::uint32_t window, const Options& o, const Sizes& ring_sizes, double fraction,
                               const std::vector<std::vector<std::uint32_t>>& prefixes,
                               const std::vector<std::vector<std::uint32_t>>& returning,
                               WindowRecency recency = WindowRecency::kCushion,
                               const std::vector<std::vector<std::uint32_t>>& variants = {}) {
  HybridModelConfig mc;
  mc.window_in_pages = pages;
  mc.window = window;
  auto model = HybridModel::Create(mc);
  if (!model) return std::unexpected(model.error());
  UnifiedBufferConfig c;
  c.alignment = 64;
  c.kinds = (*model)->Kinds(64);
  c.capacity_bytes = static_cast<std::uint64_t>(fraction * o.prefixes * ring_sizes.prefix_bytes) / 64 * 64 +
                     ring_sizes.page_bytes;
  c.padding_kind = kModelKvKind;
  c.padding_blocks = 1;
  auto buffer = UnifiedBuffer::Create(c);
  if (!buffer) return std::unexpected(buffer.error());
  PrefixCacheConfig pc{.page_tokens = mc.page_tokens, .window_recency = recency};
  if (pages) pc.sliding_window = mc.window;
  auto cache = PrefixCache::Create(pc, buffer->get());
  if (!cache) return std::unexpected(cache.error());
  HybridRunner runner(**model, **buffer, cache->get());
  const ServeOptions serve{.max_new_tokens = o.new_tokens, .checkpoint_interval = o.checkpoint_interval};
  for (const auto& p : prefixes) {
    auto s = runner.Serve(p, serve);
    if (!s) return std::unexpected(s.error());
  }
  WindowResult r{.pages = pages};
  for (const auto& v : variants) {
    auto s = runner.Serve(v, serve);
    if (!s) return std::unexpected(s.error());
    r.variant_recomputed += s->recomputed;
  }
  r.window_bytes = (*buffer)->Stats().live_blocks_per_kind[kModelWindowKind.value()] * c.kinds[2].block_bytes;
  for (const auto& p : prefixes) r.retained += (*cache)->Holds(p) ? 1 : 0;
  std::vector<double> token_us;
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& q : returning) {
    auto s = runner.Serve(q, serve);
    if (!s) return std::unexpected(s.error());
    r.recomputed += s->recomputed - o.suffix_tokens;
    token_us.insert(token_us.end(), s->token_us.begin(), s->token_us.end());
  }
  r.returning_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  r.token_us = Median(token_us);
  ULA_RETURN_IF_ERROR((*buffer)->CheckInvariants());
  ULA_RETURN_IF_ERROR((*cache)->CheckInvariants());
  return r;
}

// The unaligned tail of a finished request (UnalignedTail): conversations of `turns` turns,
// each turn's prompt the previous turn's prompt and output plus a user message of 8-39
// tokens (so every finished sequence ends off a page boundary), served turn by turn, the
// conversations of a turn in a random order (`orders`, the same for every run), on a buffer
// of `buffer_bytes`. Reuse is counted from the second turn on.
struct TailResult {
  UnalignedTail rule;
  std::uint64_t matched = 0, recomputed = 0;
  std::uint64_t lost = 0;  // of the recomputed: tokens of the previous turn's sequence
  std::uint64_t pages = 0, checkpoints = 0;  // what the tree holds at the end
  std::uint64_t held_bytes = 0;               // all of it, in the buffer
  std::uint32_t evicted_nodes = 0;
};

struct Conversation {
  std::vector<std::uint32_t> first;                  // turn 1's prompt
  std::vector<std::vector<std::uint32_t>> messages;  // [turns - 1] the user messages after it
};

Result<TailResult> RunTail(const HybridModel& model, const std::vector<KindConfig>& kinds, const Options& o,
                           UnalignedTail rule, std::uint64_t buffer_bytes, const std::vector<Conversation>& convs,
                           const std::vector<std::vector<std::uint32_t>>& orders) {
  UnifiedBufferConfig c;
  c.alignment = 64;
  c.kinds = kinds;
  c.capacity_bytes = buffer_bytes / 64 * 64;
  c.padding_kind = kModelKvKind;
  c.padding_blocks = 1;
  auto buffer = UnifiedBuffer::Create(c);
  if (!buffer) return std::unexpected(buffer.error());
  auto cache = PrefixCache::Create(PrefixCacheConfig{.page_tokens = model.config().page_tokens, .unaligned_tail = rule},
                                   buffer->get());
  if (!cache) return std::unexpected(cache.error());
  HybridRunner runner(model, **buffer, cache->get());
  const ServeOptions serve{.max_new_tokens = o.new_tokens, .checkpoint_interval = o.checkpoint_interval};
  TailResult r{.rule = rule};
  std::vector<std::vector<std::uint32_t>> prompts, fed(convs.size());
  for (const auto& conv : convs) prompts.push_back(conv.first);
  for (std::uint32_t turn = 0; turn < o.turns; ++turn) {
    for (const std::uint32_t i : orders[turn]) {
      if (turn > 0) {  // the previous turn's prompt and output (all of it), then the message
        const auto& msg = convs[i].messages[turn - 1];
        prompts[i].insert(prompts[i].end(), msg.begin(), msg.end());
      }
      auto s = runner.Serve(prompts[i], serve);
      if (!s) return std::unexpected(s.error());
      if (turn > 0) {
        r.matched += s->matched;
        r.recomputed += s->recomputed;
        r.lost += s->recomputed - (prompts[i].size() - fed[i].size());
      }
      r.evicted_nodes += s->evicted.nodes;
      fed[i] = prompts[i];
      fed[i].insert(fed[i].end(), s->output.begin(), s->output.end() - 1);  // what Finish inserted
      prompts[i].insert(prompts[i].end(), s->output.begin(), s->output.end());
    }
  }
  r.pages = (*buffer)->Stats().live_blocks_per_kind[kModelKvKind.value()];
  r.checkpoints = (*cache)->num_checkpoints();
  r.held_bytes = (*buffer)->Stats().live_bytes;
  ULA_RETURN_IF_ERROR((*buffer)->CheckInvariants());
  ULA_RETURN_IF_ERROR((*cache)->CheckInvariants());
  return r;
}

const char* UnalignedTailName(UnalignedTail rule) { return rule == UnalignedTail::kKeep ? "keep" : "drop"; }

// Decode time per token on the unified buffer and on fixed pools, interleaved.
std::pair<double, double> MeasureTbt(const HybridModel& model, const Options& o) {
  const auto kinds = model.Kinds(64);
  UnifiedBufferConfig uc;
  uc.alignment = 64;
  uc.kinds = kinds;
  uc.capacity_bytes = 512 * kinds[1].block_bytes;
  uc.padding_kind = kModelKvKind;
  uc.padding_blocks = 1;
  auto unified = UnifiedBuffer::Create(uc).value();
  FixedSplitConfig fc;
  fc.kinds = kinds;
  fc.capacity_bytes = uc.capacity_bytes;
  fc.fractions = {0.2, 0.6, 0.2};
  fc.padding_kind = kModelKvKind;
  fc.padding_blocks = 1;
  auto fixed = FixedSplitAllocator::Create(fc).value();
  std::mt19937 rng(o.seed + 1);
  const auto prompt = RandomTokens(rng, 256, model.config().vocab);
  std::vector<double> u, f;
  for (int rep = 0; rep < 5; ++rep) {
    for (HybridAllocator* a : {static_cast<HybridAllocator*>(unified.get()), static_cast<HybridAllocator*>(fixed.get())}) {
      HybridRunner runner(model, *a, nullptr);
      auto r = runner.Serve(prompt, ServeOptions{.max_new_tokens = 65});
      auto& out = a == unified.get() ? u : f;
      out.insert(out.end(), r->token_us.begin(), r->token_us.end());
    }
  }
  return {Median(u), Median(f)};
}

int Run(const Options& o) {
  auto model = HybridModel::Create(HybridModelConfig{});
  if (!model) {
    fmt::print(stderr, "{}\n", model.error().ToString());
    return 1;
  }
  std::optional<RealSizing> real;
  if (o.sizing != "small") {
    const std::filesystem::path dir = o.config_dir.empty() ? DefaultConfigDir() : std::filesystem::path(o.config_dir);
    auto r = LoadRealSizing(o.sizing, dir);
    if (!r) {
      fmt::print(stderr, "ula bench prefix: {}\n", r.error().ToString());
      return 2;
    }
    real = *r;
  }
  const std::vector<KindConfig> kinds = AccountedKinds(**model, real);
  const Sizes sizes = ComputeSizes(kinds, **model, o);
  const std::uint32_t page_tokens = (*model)->config().page_tokens;
  const double pages_per_checkpoint = double(sizes.checkpoint_bytes) / double(sizes.page_bytes);
  std::mt19937 rng(o.seed);
  std::vector<std::vector<std::uint32_t>> prefixes, returning;
  for (std::uint32_t i = 0; i < o.prefixes; ++i) {
    prefixes.push_back(RandomTokens(rng, o.prefix_tokens, (*model)->config().vocab));
    auto q = prefixes.back();
    const auto suffix = RandomTokens(rng, o.suffix_tokens, (*model)->config().vocab);
    q.insert(q.end(), suffix.begin(), suffix.end());
    returning.push_back(std::move(q));
  }
  nlohmann::json out;
  out["sizes"] = {{"buffer_bytes", sizes.buffer_bytes},       {"page_bytes", sizes.page_bytes},
                  {"checkpoint_bytes", sizes.checkpoint_bytes}, {"cached_prefix_bytes", sizes.prefix_bytes},
                  {"all_prefixes_bytes", o.prefixes * sizes.prefix_bytes}, {"long_request_bytes", sizes.long_bytes}};
  out["sizing"] = {{"name", o.sizing}, {"checkpoint_pages", pages_per_checkpoint}, {"page_tokens", page_tokens}};
  if (real) {
    const std::uint64_t real_page = real->kv_bytes_per_token * page_tokens;
    out["sizing"].update({{"attention_layers", real->attention_layers}, {"linear_layers", real->linear_layers},
                          {"kv_bytes_per_token", real->kv_bytes_per_token}, {"kv_bytes_per_page", real_page},
                          {"state_bytes_per_request", real->state_bytes},
                          {"ssm_bytes_per_layer", real->ssm_bytes_per_layer},
                          {"conv_bytes_per_layer", real->conv_bytes_per_layer},
                          {"state_per_page", double(real->state_bytes) / double(real_page)},
                          {"scale", double(real_page) / double(sizes.page_bytes)}});
  }
  out["setup"] = {{"prefixes", o.prefixes}, {"prefix_tokens", o.prefix_tokens}, {"suffix_tokens", o.suffix_tokens},
                  {"new_tokens", o.new_tokens}, {"checkpoint_interval", o.checkpoint_interval},
                  {"long_tokens", o.long_tokens}, {"chunk_tokens", o.chunk_tokens}, {"seed", o.seed},
                  {"variants", o.variants}, {"host_slots", o.host_slots}};
  if (!o.json) {
    fmt::print("buffer {} KiB: {} prefixes x {} KiB cached ({} KiB) + {} KiB free; long request {} tokens = {} KiB\n",
               sizes.buffer_bytes >> 10, o.prefixes, sizes.prefix_bytes >> 10, (o.prefixes * sizes.prefix_bytes) >> 10,
               (sizes.buffer_bytes - o.prefixes * sizes.prefix_bytes) >> 10, o.long_tokens, sizes.long_bytes >> 10);
    if (real) {
      const std::uint64_t real_page = real->kv_bytes_per_token * page_tokens;
      fmt::print("sizing {}: {} full-attention layers -> KV {} B/token, {} B per {}-token page; {} linear layers x "
                 "(recurrent {} B + conv {} B) -> state {} B per request = {:.1f} pages; accounted at 1/{:.1f} scale\n",
                 real->name, real->attention_layers, real->kv_bytes_per_token, real_page, page_tokens,
                 real->linear_layers, real->ssm_bytes_per_layer, real->conv_bytes_per_layer, real->state_bytes,
                 double(real->state_bytes) / double(real_page), double(real_page) / double(sizes.page_bytes));
    } else {
      fmt::print("sizing small: the small CPU model's own bytes\n");
    }
    fmt::print("page {} B, checkpoint {} B = {:.1f} pages (state block {} B + window ring {} B)\n", sizes.page_bytes,
               sizes.checkpoint_bytes, pages_per_checkpoint, sizes.state_bytes, sizes.window_bytes);
    fmt::print("{:<24} {:>7} {:>9} {:>7} {:>11} {:>13} {:>15} {:>13}\n", "rule", "chunked", "retained", "on host",
               "recomputed", "returning_ms", "evicted nodes", "evicted pages");
  }
  out["runs"] = nlohmann::json::array();
  struct Config {
    bool chunked;
    EvictionRule rule;
    std::uint32_t host_slots;
    std::uint32_t host_page_slots = 0;
  };
  std::vector<Config> configs;
  for (bool chunked : {false, true}) {
    for (EvictionRule rule : {EvictionRule::kNaive, EvictionRule::kAllocationAware}) configs.push_back({chunked, rule, 0});
  }
  configs.push_back({false, EvictionRule::kAllocationAware, o.host_slots});  // evicted checkpoints go to the host
  configs.push_back({false, EvictionRule::kAllocationAware, o.host_slots, o.host_page_slots});  // and KV pages
  for (const Config& config : configs) {
    {
      const bool chunked = config.chunked;
      const EvictionRule rule = config.rule;
      auto r = RunOnce(**model, kinds, o, sizes, rule, chunked, config.host_slots, config.host_page_slots, prefixes,
                       returning);
      if (!r) {
        fmt::print(stderr, "run failed: {}\n", r.error().ToString());
        return 1;
      }
      nlohmann::json chunks = nlohmann::json::array();
      std::string chunk_text;
      for (const EvictionStats& c : r->chunks) {
        chunks.push_back({{"nodes", c.nodes}, {"pages", c.pages}, {"checkpoints", c.checkpoints}});
        chunk_text += fmt::format(" {}/{}/{}", c.nodes, c.pages, c.checkpoints);
      }
      out["runs"].push_back({{"rule", EvictionRuleName(rule)},
                             {"chunks", chunks},
                             {"chunked", chunked},
                             {"host_slots", config.host_slots},
                             {"host_page_slots", config.host_page_slots},
                             {"retained", r->retained},
                             {"on_host", r->on_host},
                             {"of", o.prefixes},
                             {"recomputed_tokens", r->recomputed},
                             {"returning_ms", r->returning_ms},
                             {"evicted_nodes", r->evicted.nodes},
                             {"evicted_pages", r->evicted.pages},
                             {"offloaded_pages", r->evicted.offloaded_pages},
                             {"evicted_checkpoints", r->evicted.checkpoints}});
      if (!o.json) {
        std::string name =
            config.host_slots > 0 ? fmt::format("{}+host{}", EvictionRuleName(rule), config.host_slots) : EvictionRuleName(rule);
        if (config.host_page_slots > 0) name += fmt::format("+kv{}", config.host_page_slots);
        fmt::print("{:<24} {:>7} {:>6}/{:<2} {:>7} {:>11} {:>13.1f} {:>15} {:>13}\n", name, chunked ? "yes" : "no",
                   r->retained, o.prefixes, r->on_host, r->recomputed, r->returning_ms, r->evicted.nodes, r->evicted.pages);
        if (chunked) fmt::print("  evicted per chunk (nodes/pages/checkpoints):{}\n", chunk_text);
      }
    }
  }
  // Branching: variant j of prefix i shares its first `shared` tokens (random, at least half).
  std::vector<std::vector<std::uint32_t>> variants;
  const std::uint32_t vocab = (*model)->config().vocab;
  for (const auto& p : prefixes) {
    const std::uint32_t shared = o.prefix_tokens / 2 + rng() % (o.prefix_tokens / 2);
    for (std::uint32_t j = 0; j < o.variants; ++j) {
      std::vector<std::uint32_t> v(p.begin(), p.begin() + shared);
      auto tail = RandomTokens(rng, o.suffix_tokens * 2, vocab);
      if (shared < p.size() && tail[0] == p[shared]) tail[0] = (tail[0] + 1) % vocab;
      v.insert(v.end(), tail.begin(), tail.end());
      variants.push_back(std::move(v));
    }
  }
  out["branching"] = nlohmann::json::array();
  if (!o.json) {
    fmt::print("branching: {} prefixes x {} variants sharing a random {}-{} tokens of it, nothing evicted\n", o.prefixes,
               o.variants, o.prefix_tokens / 2, o.prefix_tokens - 1);
    fmt::print("{:<26} {:>12} {:>11} {:>12} {:>9}\n", "checkpoint at branch", "matched", "recomputed", "checkpoints",
               "ms");
  }
  for (std::uint32_t alignment : {0u, (*model)->config().page_tokens}) {
    auto r = RunBranching(**model, kinds, o, sizes, alignment, prefixes, variants);
    if (!r) {
      fmt::print(stderr, "branching run failed: {}\n", r.error().ToString());
      return 1;
    }
    const std::string name = alignment == 0 ? "no (interval + end only)" : fmt::format("yes (rounded to {})", alignment);
    out["branching"].push_back({{"branch_checkpoints", alignment != 0},
                                {"branch_alignment", alignment},
                                {"matched_tokens", r->matched},
                                {"recomputed_tokens", r->recomputed},
                                {"checkpoints", r->checkpoints},
                                {"ms", r->ms}});
    if (!o.json) {
      fmt::print("{:<26} {:>12} {:>11} {:>12} {:>9.1f}\n", name, r->matched, r->recomputed, r->checkpoints, r->ms);
    }
  }
  out["window"] = nlohmann::json::array();
  if (!o.json) {
    fmt::print("sliding-window KV: ring per checkpoint vs window pages in the tree, same prefixes, allocation-aware\n");
    fmt::print("{:<14} {:>8} {:>14} {:>9} {:>11} {:>13} {:>9}\n", "window", "buffer", "window KiB", "retained",
               "recomputed", "returning_ms", "token_us");
  }
  // The model's window (64 tokens, 4 pages) and one shorter than a page (8 tokens), on the
  // buffer sized for the rings of the model's window.
  for (const auto& [window, fraction] : {std::pair{64u, 1.0}, std::pair{64u, 0.5}, std::pair{8u, 1.0}}) {
    for (bool pages : {false, true}) {
      auto r = RunWindow(pages, window, o, sizes, fraction, prefixes, returning);
      if (!r) {
        fmt::print(stderr, "window run failed: {}\n", r.error().ToString());
        return 1;
      }
      out["window"].push_back({{"window_pages", pages}, {"window", window}, {"buffer_fraction", fraction},
                               {"window_bytes", r->window_bytes},
                               {"retained", r->retained}, {"of", o.prefixes}, {"recomputed_tokens", r->recomputed},
                               {"returning_ms", r->returning_ms}, {"token_median_us", r->token_us}});
      if (!o.json) {
        fmt::print("{:<14} {:>7.0f}% {:>14} {:>6}/{:<2} {:>11} {:>13.1f} {:>9.1f}\n",
                   fmt::format("{} W={}", pages ? "pages" : "ring", window),
                   fraction * 100, r->window_bytes >> 10, r->retained, o.prefixes, r->recomputed, r->returning_ms,
                   r->token_us);
      }
    }
  }
  // Window recency (window pages, W = 64, buffers of a fraction of the rings'): the variants branch off the
  // prefixes (deep matches, inserts that walk down shared nodes), then the prefixes return.
  // Today's rule (a touch refreshes the whole path's window pages) against SGLang's (a match
  // refreshes its window cushion, an insert's walk down no ancestor).
  out["window_recency"] = nlohmann::json::array();
  if (!o.json) {
    fmt::print("window recency: pages W=64, {} variants then the {} returning requests\n", variants.size(),
               returning.size());
    fmt::print("{:<10} {:>7} {:>9} {:>20} {:>21} {:>14}\n", "rule", "buffer", "retained", "variants recomputed",
               "returning recomputed", "window KiB");
  }
  for (double fraction : {0.5, 0.15, 0.12, 0.1})
  for (WindowRecency recency : {WindowRecency::kPath, WindowRecency::kCushion}) {
    auto r = RunWindow(true, 64, o, sizes, fraction, prefixes, returning, recency, variants);
    if (!r) {
      fmt::print(stderr, "window recency run failed: {}\n", r.error().ToString());
      return 1;
    }
    const char* name = recency == WindowRecency::kPath ? "path" : "cushion";
    out["window_recency"].push_back({{"rule", name}, {"buffer_fraction", fraction}, {"retained", r->retained}, {"of", o.prefixes},
                                     {"variant_recomputed_tokens", r->variant_recomputed},
                                     {"returning_recomputed_tokens", r->recomputed}, {"window_bytes", r->window_bytes}});
    if (!o.json) {
      fmt::print("{:<10} {:>6.0f}% {:>6}/{:<2} {:>20} {:>21} {:>14}\n", name, fraction * 100, r->retained, o.prefixes,
                 r->variant_recomputed, r->recomputed, r->window_bytes >> 10);
    }
  }
  // The unaligned tail: ours (keep the partial page) against SGLang's (drop it), on a buffer
  // where nothing is evicted, then on buffers of a fraction of what the keep rule held there.
  std::vector<Conversation> convs;
  std::vector<std::vector<std::uint32_t>> orders(o.turns);
  for (auto& order : orders) {
    order.resize(o.prefixes);
    std::iota(order.begin(), order.end(), 0u);
    std::shuffle(order.begin(), order.end(), rng);
  }
  std::uint64_t final_tokens = 0;
  for (std::uint32_t i = 0; i < o.prefixes; ++i) {
    // Turn 1: prefix_tokens / 2 to 3 / 2 prefix_tokens, so that the last page boundary
    // of a finished turn meets an interval checkpoint only by chance (1 / interval x P).
    Conversation conv{.first = RandomTokens(rng, o.prefix_tokens / 2 + rng() % o.prefix_tokens, vocab), .messages = {}};
    std::uint64_t total = conv.first.size();
    for (std::uint32_t t = 1; t < o.turns; ++t) {
      conv.messages.push_back(RandomTokens(rng, 8 + rng() % 32, vocab));
      total += o.new_tokens + conv.messages.back().size();
    }
    final_tokens += total + o.new_tokens;
    convs.push_back(std::move(conv));
  }
  const std::uint32_t turn_checkpoints = (o.checkpoint_interval ? o.prefix_tokens / o.checkpoint_interval : 0) + 2 * o.turns;
  const std::uint64_t ample = 2 * (final_tokens / page_tokens + 2 * o.prefixes) * sizes.page_bytes +
                              std::uint64_t{o.prefixes} * turn_checkpoints * sizes.checkpoint_bytes;
  out["unaligned_tail"] = nlohmann::json::array();
  if (!o.json) {
    fmt::print("unaligned tail: {} conversations x {} turns (turn 1 of {}-{} tokens, each next turn the last one's "
               "prompt and output plus 8-39 tokens, the conversations in a random order per turn), reuse from turn 2\n",
               o.prefixes, o.turns, o.prefix_tokens / 2, o.prefix_tokens / 2 + o.prefix_tokens - 1);
    fmt::print("{:<6} {:>8} {:>14} {:>11} {:>18} {:>12} {:>12} {:>10} {:>15}\n", "tail", "buffer", "matched", "recomputed",
               "of earlier turns", "pages held", "checkpoints", "held KiB", "evicted nodes");
  }
  std::uint64_t keep_held = 0;  // what the keep rule held on the ample buffer
  for (double fraction : {1.0, 0.75, 0.5}) {
    for (UnalignedTail rule : {UnalignedTail::kKeep, UnalignedTail::kDrop}) {
      // fraction 1: nothing is evicted; the others: that fraction of keep_held, and room for
      // the running request (its pages, state and checkpoints).
      const std::uint64_t bytes =
          fraction == 1.0 ? ample : static_cast<std::uint64_t>(fraction * double(keep_held)) +
                                   4 * sizes.checkpoint_bytes + 64 * sizes.page_bytes;
      auto r = RunTail(**model, kinds, o, rule, bytes, convs, orders);
      if (!r) {
        fmt::print(stderr, "unaligned tail run failed: {}\n", r.error().ToString());
        return 1;
      }
      if (fraction == 1.0 && rule == UnalignedTail::kKeep) keep_held = r->held_bytes;
      const std::string buffer = fraction == 1.0 ? "ample" : fmt::format("{:.0f}%", fraction * 100);
      out["unaligned_tail"].push_back({{"tail", UnalignedTailName(rule)}, {"buffer", buffer}, {"buffer_bytes", bytes},
                                       {"matched_tokens", r->matched}, {"recomputed_tokens", r->recomputed},
                                       {"recomputed_of_earlier_turns", r->lost}, {"pages_held", r->pages},
                                       {"checkpoints_held", r->checkpoints}, {"held_bytes", r->held_bytes},
                                       {"evicted_nodes", r->evicted_nodes}});
      if (!o.json) {
        fmt::print("{:<6} {:>8} {:>14} {:>11} {:>18} {:>12} {:>12} {:>10} {:>15}\n", UnalignedTailName(rule), buffer,
                   r->matched, r->recomputed, r->lost, r->pages, r->checkpoints, r->held_bytes >> 10, r->evicted_nodes);
      }
    }
  }
  const auto [unified_us, fixed_us] = MeasureTbt(**model, o);
  out["tbt"] = {{"unified_median_us", unified_us}, {"fixed_median_us", fixed_us}, {"ratio", unified_us / fixed_us}};
  if (o.json) {
    fmt::print("{}\n", out.dump(2));
  } else {
    fmt::print("median time between output tokens: unified {:.1f} us, fixed pools {:.1f} us (ratio {:.3f})\n",
               unified_us, fixed_us, unified_us / fixed_us);
  }
  return 0;
}

Action Setup(CLI::App& app) {
  auto o = std::make_shared<Options>();
  app.add_flag("--json", o->json, "print JSON");
  app.add_option("--prefixes", o->prefixes, "cached prefixes")->check(IntIn(1, 1000));
  app.add_option("--prefix-tokens", o->prefix_tokens, "tokens per prefix")->check(IntIn(16, 8192));
  app.add_option("--long-tokens", o->long_tokens, "tokens of the unrelated request")->check(IntIn(1, 1 << 20));
  app.add_option("--chunk-tokens", o->chunk_tokens, "chunk size of the chunked runs")->check(IntIn(16, 1 << 20));
  app.add_option("--free-fraction", o->free_fraction, "free space before the long request, as a fraction of its size")
      ->check(RealIn(0, 10));
  app.add_option("--seed", o->seed, "token seed")->check(AtLeast<std::uint32_t>(0));
  app.add_option("--variants", o->variants, "branching experiment: variants per prefix")->check(IntIn(1, 100));
  app.add_option("--sizing", o->sizing, "configs/hybrid/<name>.json real model whose bytes the buffer accounts, or small")
      ->capture_default_str();
  app.add_option("--config-dir", o->config_dir, "configs directory (default: $ULA_CONFIG_DIR or the source tree's)");
  app.add_option("--host-slots", o->host_slots, "checkpoints the host tier of the host-tier run holds")
      ->check(IntIn(1, 100000));
  app.add_option("--turns", o->turns, "unaligned-tail experiment: turns per conversation")->check(IntIn(2, 100));
  app.add_option("--host-page-slots", o->host_page_slots, "KV pages the host tier of the KV host-tier run holds")
      ->check(IntIn(1, 1000000));
  return [o] { return Run(*o); };
}

ULA_REGISTER_COMMAND(bench_prefix, "bench", "prefix", "returning-prefix experiment on the small hybrid model", Setup);

}  // namespace
}  // namespace ula::cli

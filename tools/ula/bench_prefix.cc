// `ula bench prefix`: the returning-prefix experiment on the small hybrid model.
// Cache N prefixes, send one unrelated long request that needs memory at once (or in
// chunks), then send the N prefixes again; compare the eviction rules. Also measures the
// unified buffer's own overhead on the model: median time between output tokens against
// fixed pools, same run. Then the branching experiment: each prefix returns as several
// variants that share a random part of it and then differ; with checkpoints at the
// branching point (the cache's token-granular match) against without (checkpoints only
// every checkpoint_interval tokens and at the end, as the page-granular cache had).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_checks.h"
#include "command_registry.h"
#include "ula/fixed_split_allocator.h"
#include "ula/hybrid_runner.h"
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
};

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

Sizes ComputeSizes(const HybridModel& model, const Options& o) {
  const auto kinds = model.Kinds(64);
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
};

Result<RunResult> RunOnce(const HybridModel& model, const Options& o, const Sizes& sizes, EvictionRule rule, bool chunked,
                          std::uint32_t host_slots, std::uint32_t host_page_slots,
                          const std::vector<std::vector<std::uint32_t>>& prefixes,
                          const std::vector<std::vector<std::uint32_t>>& returning) {
  UnifiedBufferConfig c;
  c.alignment = 64;
  c.kinds = model.Kinds(64);
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
  RunResult r{.rule = rule, .chunked = chunked, .host_slots = host_slots, .host_page_slots = host_page_slots, .evicted = {}};
  for (const auto& p : prefixes) {
    auto s = runner.Serve(p, serve);
    if (!s) return std::unexpected(s.error());
  }
  auto seq = runner.Reserve(o.long_tokens, chunked ? o.chunk_tokens : 0, rule, &r.evicted);
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
Result<BranchResult> RunBranching(const HybridModel& model, const Options& o, const Sizes& sizes,
                                  std::uint32_t alignment, const std::vector<std::vector<std::uint32_t>>& prefixes,
                                  const std::vector<std::vector<std::uint32_t>>& variants) {
  UnifiedBufferConfig c;
  c.alignment = 64;
  c.kinds = model.Kinds(64);
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

// Sliding-window KV: a ring in every checkpoint against window pages in the tree (issue 20
// item 4). The same prefixes and returning requests, on buffers of the same bytes
// (`fraction` of what the ring needs to keep every prefix), allocation-aware eviction.
struct WindowResult {
  bool pages = false;
  std::uint64_t window_bytes = 0;  // window KV the buffer holds after the prefixes were served
  std::uint32_t retained = 0;
  std::uint64_t recomputed = 0;
  double returning_ms = 0, token_us = 0;
};

Result<WindowResult> RunWindow(bool pages, std::uint32_t window, const Options& o, const Sizes& ring_sizes, double fraction,
                               const std::vector<std::vector<std::uint32_t>>& prefixes,
                               const std::vector<std::vector<std::uint32_t>>& returning) {
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
  PrefixCacheConfig pc{.page_tokens = mc.page_tokens};
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
  const Sizes sizes = ComputeSizes(**model, o);
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
  out["setup"] = {{"prefixes", o.prefixes}, {"prefix_tokens", o.prefix_tokens}, {"suffix_tokens", o.suffix_tokens},
                  {"new_tokens", o.new_tokens}, {"checkpoint_interval", o.checkpoint_interval},
                  {"long_tokens", o.long_tokens}, {"chunk_tokens", o.chunk_tokens}, {"seed", o.seed},
                  {"variants", o.variants}, {"host_slots", o.host_slots}};
  if (!o.json) {
    fmt::print("buffer {} KiB: {} prefixes x {} KiB cached ({} KiB) + {} KiB free; long request {} tokens = {} KiB\n",
               sizes.buffer_bytes >> 10, o.prefixes, sizes.prefix_bytes >> 10, (o.prefixes * sizes.prefix_bytes) >> 10,
               (sizes.buffer_bytes - o.prefixes * sizes.prefix_bytes) >> 10, o.long_tokens, sizes.long_bytes >> 10);
    fmt::print("page {} B (16 tokens x 2 attention layers), checkpoint {} B (state {} B + window ring {} B)\n",
               sizes.page_bytes, sizes.checkpoint_bytes, sizes.state_bytes, sizes.window_bytes);
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
      auto r = RunOnce(**model, o, sizes, rule, chunked, config.host_slots, config.host_page_slots, prefixes, returning);
      if (!r) {
        fmt::print(stderr, "run failed: {}\n", r.error().ToString());
        return 1;
      }
      out["runs"].push_back({{"rule", EvictionRuleName(rule)},
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
    auto r = RunBranching(**model, o, sizes, alignment, prefixes, variants);
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
  app.add_option("--host-slots", o->host_slots, "checkpoints the host tier of the host-tier run holds")
      ->check(IntIn(1, 100000));
  app.add_option("--host-page-slots", o->host_page_slots, "KV pages the host tier of the KV host-tier run holds")
      ->check(IntIn(1, 1000000));
  return [o] { return Run(*o); };
}

ULA_REGISTER_COMMAND(bench_prefix, "bench", "prefix", "returning-prefix experiment on the small hybrid model", Setup);

}  // namespace
}  // namespace ula::cli

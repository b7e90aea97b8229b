// `ula bench unified`: the shared unified buffer against fixed splits on three workloads,
// plus allocator throughput, compaction cost and block-table translation cost.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_checks.h"
#include "command_registry.h"
#include "unified/fixed_split_allocator.h"
#include "unified/page_envelope.h"
#include "ula/unified_buffer.h"

namespace ula::cli {
namespace {

using Clock = std::chrono::steady_clock;

// Sizes in units of 4 KiB. A KV page envelope (16 tokens, all full-attention layers) is one
// unit; a recurrent state is 16 units (= 256 tokens of KV); a sliding-window ring 4 units.
constexpr std::uint64_t kUnitBytes = 4096;
constexpr std::uint64_t kStateUnits = 16;
constexpr std::uint64_t kSwaUnits = 4;
constexpr std::uint32_t kPageTokens = 16;
constexpr BlockKind kState(0), kKv(1), kSwa(2);

struct Options {
  bool json = false;
  std::uint64_t buffer_units = 8192;  // 32 MiB
  std::uint32_t seed = 1;
  int steps = 3000;
};

std::vector<KindConfig> Kinds() {
  return {{"state", kStateUnits * kUnitBytes, BufferEnd::kLow},
          {"kv", kUnitBytes, BufferEnd::kHigh},
          {"swa", kSwaUnits * kUnitBytes, BufferEnd::kLow}};
}

struct RequestShape {
  std::uint32_t tokens;  // prompt + output, reserved at admission
  int lifetime;          // steps it stays
};

// A workload: requests arrive one per `gap` steps; shape(step) draws the request.
struct Workload {
  std::string name;
  std::function<RequestShape(int step, std::mt19937&)> shape;
  int gap = 1;
};

std::vector<Workload> Workloads(int steps) {
  auto shorts = [](std::mt19937& r) {
    return RequestShape{std::uniform_int_distribution<std::uint32_t>(64, 768)(r),
                        std::uniform_int_distribution<int>(100, 400)(r)};
  };
  auto longs = [](std::mt19937& r) {
    return RequestShape{std::uniform_int_distribution<std::uint32_t>(8192, 49152)(r),
                        std::uniform_int_distribution<int>(100, 400)(r)};
  };
  return {
      {"many_short", [=](int, std::mt19937& r) { return shorts(r); }, 1},
      {"few_long", [=](int, std::mt19937& r) { return longs(r); }, 20},
      {"shifting_mix",
       [=](int step, std::mt19937& r) {
         // Short-heavy, then long-heavy, then short-heavy again.
         const int phase = step * 3 / steps;
         const int long_pct = phase == 1 ? 80 : 5;
         return std::uniform_int_distribution<int>(0, 99)(r) < long_pct ? longs(r) : shorts(r);
       },
       3},
  };
}

Demand DemandOf(const RequestShape& s) {
  return Demand::Of(3).Add(kState, 1).Add(kSwa, 1).Add(kKv, (s.tokens + kPageTokens - 1) / kPageTokens);
}

// FIFO admission over `steps` steps; returns the number of requests admitted.
std::uint64_t RunAdmission(HybridAllocator& a, const Workload& w, const Options& o) {
  std::mt19937 rng(o.seed);
  std::deque<RequestShape> queue;
  struct Running {
    int end;
    std::vector<BlockId> blocks;
  };
  std::vector<Running> running;
  std::uint64_t admitted = 0;
  for (int step = 0; step < o.steps; ++step) {
    std::erase_if(running, [&](Running& r) {
      if (r.end > step) return false;
      for (BlockId id : r.blocks) (void)a.Free(id);
      return true;
    });
    if (step % w.gap == 0) queue.push_back(w.shape(step, rng));
    while (!queue.empty()) {
      const Demand d = DemandOf(queue.front());
      if (!a.CanAllocate(d)) break;
      auto ids = a.AllocateDemand(d);
      if (!ids) break;
      running.push_back({step + queue.front().lifetime, std::move(*ids)});
      queue.pop_front();
      ++admitted;
    }
    if (queue.size() > 10000) queue.pop_front();  // bounded backlog
  }
  return admitted;
}

std::unique_ptr<HybridAllocator> MakeShared(const Options& o, bool hold_bytes, CompactionMode mode) {
  UnifiedBufferConfig c;
  c.capacity_bytes = o.buffer_units * kUnitBytes;
  c.alignment = kUnitBytes;
  c.kinds = Kinds();
  c.padding_kind = kKv;
  c.padding_blocks = 1;
  c.compaction = mode;
  c.hold_bytes = hold_bytes;
  return std::move(UnifiedBuffer::Create(c).value());
}

std::unique_ptr<HybridAllocator> MakeFixed(const Options& o, double state_fraction) {
  FixedSplitConfig c;
  c.capacity_bytes = o.buffer_units * kUnitBytes;
  c.kinds = Kinds();
  // The per-request kinds (state + window ring) share state_fraction in their size ratio.
  const double per_req = kStateUnits + kSwaUnits;
  c.fractions = {state_fraction * kStateUnits / per_req, 1.0 - state_fraction, state_fraction * kSwaUnits / per_req};
  c.padding_kind = kKv;
  c.padding_blocks = 1;
  c.hold_bytes = false;
  return std::move(FixedSplitAllocator::Create(c).value());
}

// Random free + allocate pairs (KV pages and states) on a partly full buffer; million ops/s.
double AllocFreeMops(HybridAllocator& a, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<BlockId> live;
  const Demand page = Demand::Of(3).Add(kKv, 1);
  const Demand state = Demand::Of(3).Add(kState, 1);
  // Each slot of `live` keeps its kind, so the mix (1 state per 16 blocks) stays constant.
  for (int i = 0; i < 2000; ++i) live.push_back(a.AllocateDemand(i % 16 == 0 ? state : page).value().front());
  constexpr int kOps = 400000;
  const auto start = Clock::now();
  for (int i = 0; i < kOps / 2; ++i) {
    const std::size_t victim = rng() % live.size();
    (void)a.Free(live[victim]);
    live[victim] = a.AllocateDemand(victim % 16 == 0 ? state : page).value().front();
  }
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  for (BlockId id : live) (void)a.Free(id);
  return kOps / s / 1e6;
}

struct TranslateCost {
  double translate_us = 0;
  double copy_us = 0;
  std::uint64_t pages = 0;
};

// One batch's block table (64 requests x 32 pages) translated, against copying the KV it names.
TranslateCost MeasureTranslate(const Options& o) {
  const PageEnvelopeLayout layout{.page_tokens = kPageTokens, .num_layers = 8, .k_bytes_per_token = 128,
                                  .v_bytes_per_token = 128};
  UnifiedBufferConfig c;
  c.alignment = 4096;
  c.kinds = {{"state", kStateUnits * kUnitBytes, BufferEnd::kLow},
             {"kv", layout.AlignedEnvelopeBytes(4096), BufferEnd::kHigh}};
  constexpr std::uint32_t kPages = 64 * 32;
  c.capacity_bytes = (kPages + 64) * c.kinds[1].block_bytes;
  c.padding_kind = BlockKind(1);
  c.padding_blocks = 1;
  auto buffer = UnifiedBuffer::Create(c).value();
  auto ids = buffer->AllocateDemand(Demand{{0, kPages}}).value();
  std::vector<std::uint64_t> offsets(ids.size());
  std::vector<std::byte> dst(std::uint64_t{kPages} * c.kinds[1].block_bytes);
  std::byte* base = buffer->base();
  std::memset(base, 1, c.capacity_bytes);
  std::vector<double> t_us, c_us;
  for (int rep = 0; rep < 15; ++rep) {
    auto t0 = Clock::now();
    (void)buffer->Translate(ids, offsets);
    auto t1 = Clock::now();
    for (std::uint32_t i = 0; i < kPages; ++i) {
      std::memcpy(dst.data() + std::uint64_t{i} * c.kinds[1].block_bytes, base + offsets[i], layout.envelope_bytes());
    }
    auto t2 = Clock::now();
    t_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    c_us.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
  }
  std::nth_element(t_us.begin(), t_us.begin() + t_us.size() / 2, t_us.end());
  std::nth_element(c_us.begin(), c_us.begin() + c_us.size() / 2, c_us.end());
  return {t_us[t_us.size() / 2], c_us[c_us.size() / 2], kPages};
}

int Run(const Options& o) {
  const std::vector<double> fractions = {0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7};
  nlohmann::json out;
  out["buffer_bytes"] = o.buffer_units * kUnitBytes;
  out["block_bytes"] = {{"state", kStateUnits * kUnitBytes}, {"kv_page", kUnitBytes}, {"swa_ring", kSwaUnits * kUnitBytes}};
  out["seed"] = o.seed;
  out["steps"] = o.steps;
  out["workloads"] = nlohmann::json::array();
  double compaction_ratio = 0;
  bool all_ok = true;
  if (!o.json) {
    fmt::print("buffer {} MiB; blocks: state {} KiB, KV page {} KiB (16 tokens), window ring {} KiB; seed {}, {} steps\n",
               o.buffer_units * kUnitBytes >> 20, kStateUnits * 4, 4, kSwaUnits * 4, o.seed, o.steps);
    fmt::print("{:<14} {:>8} {:>8} |", "workload", "shared", "best");
    for (double f : fractions) fmt::print(" {:>6}", fmt::format("f={:.2f}", f));
    fmt::print("\n");
  }
  for (const Workload& w : Workloads(o.steps)) {
    auto shared = MakeShared(o, false, CompactionMode::kLazy);
    const std::uint64_t shared_admitted = RunAdmission(*shared, w, o);
    if (w.name == "shifting_mix") {
      const auto s = shared->Stats();
      compaction_ratio = s.bytes_freed ? static_cast<double>(s.bytes_moved) / s.bytes_freed : 0.0;
    }
    nlohmann::json fixed = nlohmann::json::array();
    std::uint64_t best = 0;
    std::vector<std::uint64_t> per;
    for (double f : fractions) {
      auto a = MakeFixed(o, f);
      const std::uint64_t n = RunAdmission(*a, w, o);
      best = std::max(best, n);
      per.push_back(n);
      fixed.push_back({{"state_fraction", f}, {"admitted", n}});
    }
    all_ok = all_ok && shared_admitted >= best;
    out["workloads"].push_back({{"name", w.name}, {"shared_admitted", shared_admitted}, {"fixed", fixed}});
    if (!o.json) {
      fmt::print("{:<14} {:>8} {:>8} |", w.name, shared_admitted, best);
      for (auto n : per) fmt::print(" {:>6}", n);
      fmt::print("\n");
    }
  }
  auto shared_ops = MakeShared(o, false, CompactionMode::kLazy);
  auto fixed_ops = MakeFixed(o, 0.5);
  const double mops = AllocFreeMops(*shared_ops, o.seed);
  const double fixed_mops = AllocFreeMops(*fixed_ops, o.seed);
  const TranslateCost tc = MeasureTranslate(o);
  const double fraction = tc.translate_us / tc.copy_us;
  out["alloc_free_mops"] = mops;
  out["fixed_alloc_free_mops"] = fixed_mops;
  out["compaction_bytes_per_freed_byte"] = compaction_ratio;
  out["translate_fraction"] = fraction;
  out["translate_us"] = tc.translate_us;
  out["copy_us"] = tc.copy_us;
  out["translate_pages"] = tc.pages;
  out["shared_admits_at_least_best_fixed"] = all_ok;
  if (o.json) {
    fmt::print("{}\n", out.dump(2));
  } else {
    fmt::print("alloc+free: shared {:.2f} Mops/s, fixed split {:.2f} Mops/s (ratio {:.2f})\n", mops, fixed_mops,
               mops / fixed_mops);
    fmt::print("compaction (lazy, shifting_mix): {:.4f} bytes moved per byte freed\n", compaction_ratio);
    fmt::print("translate {} pages: {:.2f} us vs copying their KV {:.0f} us -> {:.4f}% of the copy\n", tc.pages,
               tc.translate_us, tc.copy_us, 100 * fraction);
    fmt::print("shared >= best fixed split on every workload: {}\n", all_ok ? "yes" : "NO");
  }
  return 0;
}

Action Setup(CLI::App& app) {
  auto o = std::make_shared<Options>();
  app.add_flag("--json", o->json, "print JSON");
  app.add_option("--buffer-units", o->buffer_units, "buffer size in 4 KiB units")->check(IntIn(64, 1 << 22));
  app.add_option("--seed", o->seed, "workload seed")->check(AtLeast<std::uint32_t>(0));
  app.add_option("--steps", o->steps, "scheduling steps per workload")->check(IntIn(10, 1000000));
  return [o] { return Run(*o); };
}

ULA_REGISTER_COMMAND(bench_unified, "bench", "unified", "unified buffer vs fixed splits for hybrid models", Setup);

}  // namespace

}  // namespace ula::cli

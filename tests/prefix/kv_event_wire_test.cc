// The prefix cache's events over a real ZeroMQ socket: a KvEventPublisher on loopback and a
// router in another process (kv_event_subscriber.py: pyzmq and msgpack, decoding SGLang's /
// vLLM's KVEventBatch schema and recomputing SGLang's hash of every stored block with
// hashlib). After randomized workloads (inserts, copy-on-write matches that load KV back from
// the host, evictions that move it there, a Reset), the subscriber's multiset of stored blocks
// per (medium, group) equals the cache's own (StoredBlocks), message for message.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "test_seed.h"
#include "ula/backend.h"
#include "ula/kv_event_publisher.h"
#include "ula/prefix_cache.h"
#include "ula/unified_buffer.h"

namespace ula {
namespace {

constexpr BlockKind kState(0), kKv(1), kSwa(2);
constexpr std::uint32_t kPage = 2;

// The subscriber process: argv endpoint block_size sliding_window; lines on stdin / stdout.
class Subscriber {
 public:
  Subscriber(const std::string& endpoint, std::uint32_t block_size, std::uint32_t window) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      close(in[1]);
      close(out[0]);
      const std::string bs = std::to_string(block_size), w = std::to_string(window);
      // Set by ctest (tests/prefix/CMakeLists.txt).
      const char* python = std::getenv("ULA_PYTHON3");
      const char* script = std::getenv("ULA_SUBSCRIBER");
      if (python == nullptr || script == nullptr) _exit(126);
      execl(python, python, script, endpoint.c_str(), bs.c_str(), w.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_ = in[1];
    from_ = out[0];
  }
  ~Subscriber() {
    if (to_ >= 0) close(to_);
    if (from_ >= 0) close(from_);
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  bool started() const { return pid_ > 0; }
  // One line of its stdout, or "" after timeout_ms without one.
  std::string ReadLine(int timeout_ms) {
    while (true) {
      if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      pollfd p{from_, POLLIN, 0};
      if (poll(&p, 1, timeout_ms) <= 0) return "";
      char chunk[65536];
      const ssize_t n = read(from_, chunk, sizeof(chunk));
      if (n <= 0) return "";
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
  }
  void Send(const std::string& line) { ASSERT_EQ(write(to_, line.data(), line.size()), static_cast<ssize_t>(line.size())); }
  int Wait() {
    int status = 0;
    waitpid(pid_, &status, 0);
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  bool reaped_ = false;
  std::string buffer_;
};

using Block = std::tuple<std::string, int, std::int64_t>;  // medium, group, hash

std::vector<Block> CacheView(const PrefixCache& cache) {
  std::vector<Block> out;
  for (const CacheEvent& e : cache.StoredBlocks()) out.emplace_back(EventMediumName(e.medium), e.window() ? 1 : 0, e.hash);
  std::sort(out.begin(), out.end());
  return out;
}

// Runs `steps` operations of `op` on the cache, publishing its events after each, with a
// subscriber in another process, and compares its view with the cache's at the end.
template <class Op>
void RunOverTheWire(PrefixCache& cache, int steps, Op op) {
  auto publisher = KvEventPublisher::Create(KvEventPublisherConfig{.endpoint = "tcp://127.0.0.1:*",
                                                                    .block_size = cache.config().page_tokens,
                                                                    .sliding_window = cache.config().sliding_window});
  ASSERT_TRUE(publisher) << publisher.error().ToString();
  Subscriber sub((*publisher)->endpoint(), cache.config().page_tokens, cache.config().sliding_window);
  ASSERT_TRUE(sub.started());
  // PUB drops what it sends before the subscription arrives: heartbeats until it reports one.
  std::string line;
  for (int i = 0; i < 200 && line.empty(); ++i) {
    ASSERT_TRUE((*publisher)->Publish({}, 0.0));
    line = sub.ReadLine(50);
  }
  ASSERT_EQ(line, "ready");
  std::uint64_t last = 0;
  std::size_t events = 0;
  for (int step = 0; step < steps && !::testing::Test::HasFatalFailure(); ++step) {
    op(step);
    const std::vector<CacheEvent> batch = cache.TakeEvents();
    events += batch.size();
    auto seq = (*publisher)->Publish(batch, static_cast<double>(step));
    ASSERT_TRUE(seq) << seq.error().ToString();
    last = *seq;
  }
  sub.Send("end " + std::to_string(last) + "\n");
  const std::string result = sub.ReadLine(30000);
  ASSERT_EQ(sub.Wait(), 0) << result;
  const auto json = nlohmann::json::parse(result);
  std::vector<Block> theirs;
  for (const auto& b : json.at("blocks")) theirs.emplace_back(b[0].get<std::string>(), b[1].get<int>(), b[2].get<std::int64_t>());
  std::sort(theirs.begin(), theirs.end());
  EXPECT_EQ(theirs, CacheView(cache));
  std::printf("  %zu events in %d batches; the subscriber decoded %d messages, %d wire events, checked %d hashes, "
              "holds %zu blocks\n",
              events, steps, json.at("messages").get<int>(), json.at("events").get<int>(),
              json.at("hashes_checked").get<int>(), theirs.size());
  EXPECT_GT(json.at("hashes_checked").get<int>(), steps / 4);
}

std::vector<std::uint32_t> RandomTokens(std::mt19937& rng, const std::vector<std::vector<std::uint32_t>>& bases) {
  std::vector<std::uint32_t> t;
  const auto& base = bases[rng() % bases.size()];
  t.assign(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(rng() % (base.size() + 1)));
  for (std::uint32_t i = 0, tail = rng() % 5; i < tail; ++i) t.push_back(1 + rng() % 3);
  if (t.empty()) t.push_back(1 + rng() % 3);
  return t;
}

// A hybrid cache with a host tier for checkpoints and KV pages: GPU and CPU media.
TEST(KvEventWire, ASubscriberRebuildsTheStoredBlocksPerMediumWithAHostTier) {
  ULA_TEST_SEEDED(seed, 20261204);
  std::printf("seed=%llu\n", static_cast<unsigned long long>(seed));
  std::mt19937 rng(static_cast<std::uint32_t>(seed));
  auto backend = MakeCpuBackend(CpuBackendOptions{.copy_threads = 1});
  UnifiedBufferConfig c;
  c.alignment = 64;
  c.capacity_bytes = 48 * 64;
  c.kinds = {{"state", 64, BufferEnd::kLow}, {"kv", 64, BufferEnd::kHigh}, {"swa", 64, BufferEnd::kLow}};
  c.padding_kind = kKv;
  c.padding_blocks = 0;
  auto device = backend->CreateArena(Tier::kDevice, Rank(0), c.capacity_bytes).value();
  auto a = UnifiedBuffer::Create(c, device).value();
  auto host = backend->CreateArena(Tier::kHost, Rank(0), 4 * 128 + 12 * 64).value();
  auto cache = PrefixCache::Create(PrefixCacheConfig{.page_tokens = kPage, .record_events = true}, a.get()).value();
  ASSERT_TRUE(cache->AttachHostTier({backend.get(), device.id, host, 4, 12}));
  std::vector<std::vector<std::uint32_t>> bases;
  for (int b = 0; b < 4; ++b) {
    std::vector<std::uint32_t> t(12);
    for (auto& x : t) x = 1 + rng() % 50;
    bases.push_back(t);
  }
  int offloads = 0, loads = 0;
  RunOverTheWire(*cache, 400, [&](int step) {
    const std::uint32_t what = rng() % 10;
    if (step == 200) {
      ASSERT_TRUE(cache->Reset());  // AllBlocksCleared in the middle
    } else if (what < 5) {
      const auto t = RandomTokens(rng, bases);
      const auto n = static_cast<std::uint32_t>(t.size());
      const Demand d = Demand::Of(3).Add(kState, 1).Add(kKv, (n + kPage - 1) / kPage);
      if (!a->CanAllocate(d)) {
        auto room = cache->MakeRoom(d, EvictionRule::kAllocationAware);
        if (!room) return;
        offloads += room->offloaded_pages;
      }
      auto ids = a->AllocateDemand(d).value();
      const std::vector<BlockId> pages(ids.begin() + 1, ids.end());
      const std::vector<PositionedCheckpoint> cps = {{n, {ids[0], BlockId::Invalid()}}};
      ASSERT_TRUE(cache->Insert(t, pages, cps));
    } else if (what < 8) {
      const auto t = RandomTokens(rng, bases);
      const auto before = cache->Metrics().host_page_hits;
      auto m = cache->MatchCopyOnWrite(t, static_cast<std::uint32_t>(t.size()), EvictionRule::kAllocationAware);
      if (!m || m->length == 0) return;
      loads += cache->Metrics().host_page_hits > before;
      ASSERT_TRUE(cache->Unlock(*m));
      ASSERT_TRUE(a->Free(m->copy.state));
    } else if (what < 9) {
      (void)cache->Evict(rng() % 4, rng() % 2);
    } else {  // a long request's demand: KV moves to the host
      auto room = cache->MakeRoom(Demand::Of(3).Add(kKv, 40), EvictionRule::kAllocationAware);
      if (room) offloads += room->offloaded_pages;
    }
  });
  std::printf("  %d pages offloaded, %d load-backs\n", offloads, loads);
  EXPECT_GT(offloads, 0);
  EXPECT_GT(loads, 0);
}

// A window-pages cache without a recurrent kind: KV (group 0) and window pages (group 1).
TEST(KvEventWire, ASubscriberKeepsWindowPagesInTheirOwnGroup) {
  ULA_TEST_SEEDED(seed, 20261205);
  std::printf("seed=%llu\n", static_cast<unsigned long long>(seed));
  std::mt19937 rng(static_cast<std::uint32_t>(seed));
  UnifiedBufferConfig c;
  c.alignment = 64;
  c.capacity_bytes = 48 * 64;
  c.kinds = {{"state", 64, BufferEnd::kLow}, {"kv", 64, BufferEnd::kHigh}, {"swa", 64, BufferEnd::kLow}};
  c.padding_kind = kKv;
  c.padding_blocks = 0;
  auto a = UnifiedBuffer::Create(c).value();
  auto cache = PrefixCache::Create(PrefixCacheConfig{.page_tokens = kPage, .state_kind = BlockKind::Invalid(),
                                                     .sliding_window = 3, .record_events = true},
                                   a.get())
                   .value();
  std::vector<std::vector<std::uint32_t>> bases;
  for (int b = 0; b < 4; ++b) {
    std::vector<std::uint32_t> t(12);
    for (auto& x : t) x = 1 + rng() % 50;
    bases.push_back(t);
  }
  RunOverTheWire(*cache, 300, [&](int) {
    const std::uint32_t what = rng() % 10;
    if (what < 5) {
      const auto t = RandomTokens(rng, bases);
      const auto n = static_cast<std::uint32_t>((t.size() + kPage - 1) / kPage);
      const Demand d = Demand::Of(3).Add(kKv, n).Add(kSwa, n);
      if (!a->CanAllocate(d) && !cache->MakeRoom(d, EvictionRule::kAllocationAware)) return;
      auto ids = a->AllocateDemand(d).value();
      const std::vector<BlockId> pages(ids.begin(), ids.begin() + n), window(ids.begin() + n, ids.end());
      ASSERT_TRUE(cache->Insert(t, pages, {}, window));
    } else if (what < 8) {
      const auto t = RandomTokens(rng, bases);
      (void)cache->Match(t, static_cast<std::uint32_t>(t.size()));
    } else {
      (void)cache->Evict(rng() % 3, 0, rng() % 4);
    }
  });
}

TEST(KvEventWire, BadPublisherConfigIsAnError) {
  EXPECT_EQ(KvEventPublisher::Create({.endpoint = "udp://127.0.0.1:1"}).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(KvEventPublisher::Create({.endpoint = "tcp://127.0.0.1:*", .block_size = 0}).error().code(),
            ErrorCode::kInvalidArgument);
  auto first = KvEventPublisher::Create({.endpoint = "tcp://127.0.0.1:*"});
  ASSERT_TRUE(first);
  EXPECT_EQ(KvEventPublisher::Create({.endpoint = (*first)->endpoint()}).error().code(), ErrorCode::kIo);  // taken
}

}  // namespace
}  // namespace ula

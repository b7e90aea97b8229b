// StepPlanner::Plan's descriptors as columns (ula/descriptor_sink.h) against the same plans as
// records: field by field over a seeded run with misses, swaps and evictions; a column not
// asked for is never written, a row past the plan's never touched; malformed columns are
// refused before anything changes.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "step/space_fixture.h"
#include "test_seed.h"
#include "ula/descriptor_sink.h"
#include "ula/step_planner.h"

namespace ula {
namespace {

using testing::SmallConfig;

constexpr std::uint32_t kTopK = 8;
constexpr std::int64_t kUnwritten = -7;  // what every column row holds before a plan writes it

// One rank, one group, two requests of 40 entries over 40 device slots: most steps miss and
// evict. Twins built alike plan alike (the same state, the same selections).
struct Twin {
  std::unique_ptr<Backend> backend = MakeCountingBackend();
  std::unique_ptr<AddressSpace> space;
  std::unique_ptr<StepPlanner> planner;
  std::vector<LogicalAddr> addrs[2];

  explicit Twin(bool shadows) {
    AddressSpaceConfig cfg = testing::EngineModes(SmallConfig(40, 100, 1, 1, 32));
    cfg.host_shadows = shadows;
    space = AddressSpace::Create(cfg, *backend).value();
    planner = StepPlanner::Create(*space, {.max_batch = 2, .max_q_len = 2, .max_top_k = kTopK}).value();
    for (std::uint32_t r = 0; r < 2; ++r) {
      EXPECT_TRUE(space->AddRequest(RequestId(r + 1), Rank(0)));
      addrs[r] = space->Allocate(RequestId(r + 1), 40).value();
    }
    space->AdvanceRound();  // the new entries are evictable from now on
  }
};

// Every field as its own column; the byte offsets int64, the others alternately int32 and int64.
struct Columns {
  std::vector<std::int64_t> wide[14];
  std::vector<std::int32_t> narrow[14];
  DescriptorColumns view;

  explicit Columns(std::size_t rows) {
    DescriptorColumn* cols[] = {&view.src_offset, &view.dst_offset, &view.src_slot, &view.dst_slot,
                                &view.bytes,      &view.addr,       &view.src_rank, &view.dst_rank,
                                &view.group,      &view.src_tier,   &view.dst_tier, &view.op,
                                &view.num_layers, &view.evict_slot};
    for (int f = 0; f < 14; ++f) {
      if (f < 2 || f % 2 == 1) {
        wide[f].assign(rows, kUnwritten);
        *cols[f] = DescriptorColumn(std::span(wide[f]));
      } else {
        narrow[f].assign(rows, static_cast<std::int32_t>(kUnwritten));
        *cols[f] = DescriptorColumn(std::span(narrow[f]));
      }
    }
  }
  std::int64_t At(int f, std::size_t j) const { return wide[f].empty() ? narrow[f][j] : wide[f][j]; }
};

// The 14 fields of a record, in Columns' order.
std::vector<std::int64_t> Fields(const CopyDescriptor& d) {
  return {static_cast<std::int64_t>(d.src_offset), static_cast<std::int64_t>(d.dst_offset), d.src_slot, d.dst_slot,
          d.bytes, d.addr, d.src_rank, d.dst_rank, d.group, d.src_tier, d.dst_tier, d.op, d.num_layers,
          d.evict_slot};
}
const char* const kFieldNames[14] = {"src_offset", "dst_offset", "src_slot", "dst_slot", "bytes",
                                     "addr",       "src_rank",   "dst_rank", "group",    "src_tier",
                                     "dst_tier",   "op",         "num_layers", "evict_slot"};

// [2 requests][q_len 2][top_k]: each query's kTopK distinct entries of its request, drawn anew.
std::vector<std::int32_t> Draw(const Twin& t, std::mt19937_64& rng) {
  std::vector<std::int32_t> sel;
  for (std::uint32_t r = 0; r < 2; ++r) {
    for (int q = 0; q < 2; ++q) {
      std::vector<LogicalAddr> pick = t.addrs[r];
      std::shuffle(pick.begin(), pick.end(), rng);
      for (std::uint32_t i = 0; i < kTopK; ++i) sel.push_back(static_cast<std::int32_t>(pick[i].value()));
    }
  }
  return sel;
}

const StepShape kShape{2, 2, kTopK};
const std::vector<RequestId> kRows{RequestId(1), RequestId(2)};

TEST(EngineColumns, ColumnsEqualRecordsFieldByField) {
  ULA_TEST_SEEDED(seed, 20261206);
  for (const bool shadows : {false, true}) {
    SCOPED_TRACE(shadows ? "host shadows" : "no host shadows");
    std::mt19937_64 rng(seed);
    Twin a(shadows), b(shadows), c(shadows);
    std::vector<CopyDescriptor> records(a.planner->max_descriptors());
    Columns columns(b.planner->max_descriptors());
    // c asks for two columns only: the others do not exist, and rows past the plan's stay.
    std::vector<std::int32_t> dst_slot(c.planner->max_descriptors(), kUnwritten);
    std::vector<std::int32_t> op(c.planner->max_descriptors(), kUnwritten);
    DescriptorColumns two;
    two.dst_slot = DescriptorColumn(std::span(dst_slot));
    two.op = DescriptorColumn(std::span(op));
    std::uint64_t misses = 0, evictions = 0, evicts = 0, swaps = 0;
    for (int step = 0; step < 40; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      const auto sel = Draw(a, rng);
      std::vector<std::int32_t> ia(sel.size()), ib(sel.size()), ic(sel.size());
      auto pa = a.planner->Plan(Rank(0), GroupId(0), kShape, kRows, sel, ia, records);
      auto pb = b.planner->Plan(Rank(0), GroupId(0), kShape, kRows, sel, ib, columns.view);
      auto pc = c.planner->Plan(Rank(0), GroupId(0), kShape, kRows, sel, ic, two);
      ASSERT_TRUE(pa) << pa.error().ToString();
      ASSERT_TRUE(pb) << pb.error().ToString();
      ASSERT_TRUE(pc) << pc.error().ToString();
      const std::uint32_t n = pa->num_descriptors;
      ASSERT_EQ(pb->num_descriptors, n);
      ASSERT_EQ(pc->num_descriptors, n);
      EXPECT_EQ(ib, ia);
      EXPECT_EQ(ic, ia);
      for (std::uint32_t j = 0; j < n; ++j) {
        const auto want = Fields(records[j]);
        for (int f = 0; f < 14; ++f) EXPECT_EQ(columns.At(f, j), want[f]) << kFieldNames[f] << " of descriptor " << j;
        EXPECT_EQ(dst_slot[j], want[3]) << j;
        EXPECT_EQ(op[j], want[11]) << j;
        evicts += records[j].op == static_cast<std::uint8_t>(CopyOp::kEvict);
        swaps += records[j].op == static_cast<std::uint8_t>(CopyOp::kSwap);
      }
      for (std::size_t j = n; j < dst_slot.size(); ++j) {  // this plan's rows only
        EXPECT_EQ(dst_slot[j], kUnwritten) << j;
        EXPECT_EQ(op[j], kUnwritten) << j;
      }
      misses += n;
      evictions += pa->stats.evictions;
      // Every descriptor done; the round ends after the step's attention.
      const std::vector<std::uint8_t> done(n, kDescriptorDone);
      for (Twin* t : {&a, &b, &c}) {
        auto report = t->planner->Complete(t == &a ? pa->fence : t == &b ? pb->fence : pc->fence, done);
        ASSERT_TRUE(report) << report.error().ToString();
        EXPECT_EQ(report->published, n);
        t->space->AdvanceRound();
      }
      std::fill(dst_slot.begin(), dst_slot.end(), static_cast<std::int32_t>(kUnwritten));
      std::fill(op.begin(), op.end(), static_cast<std::int32_t>(kUnwritten));
    }
    EXPECT_EQ(b.space->DebugDigest(), a.space->DebugDigest());
    EXPECT_EQ(c.space->DebugDigest(), a.space->DebugDigest());
    // The run covered what it claims to: misses, evictions, and each kind of victim move.
    EXPECT_GT(misses, 100u);
    EXPECT_GT(evictions, 50u);
    EXPECT_GT(shadows ? evicts : swaps, 10u);
    ASSERT_TRUE(a.space->CheckInvariants());
  }
}

TEST(EngineColumns, MalformedColumnsAreRefusedAndChangeNothing) {
  ULA_TEST_SEEDED(seed, 20261207);
  std::mt19937_64 rng(seed);
  Twin a(/*shadows=*/false), b(/*shadows=*/false);
  const auto sel = Draw(a, rng);
  const std::size_t rows = a.planner->max_descriptors();
  std::vector<std::int64_t> src_offset(rows, kUnwritten), dst_offset(rows, kUnwritten);
  std::vector<std::int32_t> dst_slot(rows, kUnwritten), src_slot(rows, kUnwritten), short_slot(3, kUnwritten);
  std::vector<std::int32_t> narrow_offset(rows, kUnwritten);
  std::vector<std::int32_t> idx(sel.size(), 77);
  const auto digest = a.space->DebugDigest();
  auto refused = [&](const DescriptorColumns& cols, ErrorCode code, const std::string& says) {
    auto r = a.planner->Plan(Rank(0), GroupId(0), kShape, kRows, sel, idx, cols);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), code) << r.error().ToString();
    EXPECT_NE(r.error().ToString().find(says), std::string::npos) << r.error().ToString();
    EXPECT_FALSE(a.planner->has_pending());
    EXPECT_EQ(a.space->DebugDigest(), digest);
    EXPECT_EQ(idx, std::vector<std::int32_t>(sel.size(), 77));
    for (const auto* v : {&dst_slot, &src_slot, &short_slot, &narrow_offset}) {
      EXPECT_TRUE(std::ranges::all_of(*v, [](std::int32_t x) { return x == kUnwritten; }));
    }
    for (const auto* v : {&src_offset, &dst_offset}) {
      EXPECT_TRUE(std::ranges::all_of(*v, [](std::int64_t x) { return x == kUnwritten; }));
    }
  };
  refused(DescriptorColumns{}, ErrorCode::kInvalidArgument, "none asked for");
  {
    DescriptorColumns cols;  // two columns of different lengths
    cols.dst_slot = DescriptorColumn(std::span(dst_slot));
    cols.src_slot = DescriptorColumn(std::span(short_slot));
    refused(cols, ErrorCode::kInvalidArgument, "src_slot has 3 rows");
  }
  {
    DescriptorColumns cols;  // a byte offset as int32
    cols.src_offset = DescriptorColumn(std::span(src_offset));
    cols.dst_offset = DescriptorColumn(std::span(narrow_offset));
    refused(cols, ErrorCode::kInvalidArgument, "dst_offset: must be int64");
  }
  {
    DescriptorColumns cols;  // fewer rows than this step's misses
    cols.src_slot = DescriptorColumn(std::span(short_slot));
    refused(cols, ErrorCode::kResourceExhausted, "has 3 rows");
  }
  // The next plan is the one its twin makes, which saw no refused call.
  DescriptorColumns cols;
  cols.src_offset = DescriptorColumn(std::span(src_offset));
  cols.dst_offset = DescriptorColumn(std::span(dst_offset));
  cols.dst_slot = DescriptorColumn(std::span(dst_slot));
  cols.src_slot = DescriptorColumn(std::span(src_slot));
  std::vector<CopyDescriptor> records(rows);
  std::vector<std::int32_t> twin_idx(sel.size());
  auto pa = a.planner->Plan(Rank(0), GroupId(0), kShape, kRows, sel, idx, cols);
  auto pb = b.planner->Plan(Rank(0), GroupId(0), kShape, kRows, sel, twin_idx, records);
  ASSERT_TRUE(pa) << pa.error().ToString();
  ASSERT_TRUE(pb) << pb.error().ToString();
  ASSERT_EQ(pa->num_descriptors, pb->num_descriptors);
  ASSERT_GT(pa->num_descriptors, 3u);
  EXPECT_EQ(pa->fence, pb->fence);
  EXPECT_EQ(idx, twin_idx);
  for (std::uint32_t j = 0; j < pa->num_descriptors; ++j) {
    EXPECT_EQ(src_offset[j], static_cast<std::int64_t>(records[j].src_offset)) << j;
    EXPECT_EQ(dst_offset[j], static_cast<std::int64_t>(records[j].dst_offset)) << j;
    EXPECT_EQ(src_slot[j], static_cast<std::int32_t>(records[j].src_slot)) << j;
    EXPECT_EQ(dst_slot[j], static_cast<std::int32_t>(records[j].dst_slot)) << j;
  }
  EXPECT_EQ(a.space->DebugDigest(), b.space->DebugDigest());
}

}  // namespace
}  // namespace ula

// Trace encoding (trace_file.h): a bounds-checked byte reader decodes; every failure is an
// Error naming the byte offset.
#include "workload/trace_file.h"

#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <iterator>

namespace ula {
namespace {

constexpr char kMagic[8] = {'U', 'L', 'A', 'T', 'R', 'A', 'C', 'E'};
constexpr std::size_t kHeaderBytes = 8 + 4 + 4 + 4 + 4 + 8 + 8 + 8;

std::uint64_t Fnv1a64(std::span<const std::byte> bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::byte b : bytes) {
    h ^= static_cast<std::uint8_t>(b);
    h *= 0x100000001b3ull;
  }
  return h;
}

class Writer {
 public:
  void Fixed(std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xff));
  }
  void Varint(std::uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<std::byte>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<std::byte>(v));
  }
  void ZigZag(std::int64_t v) { Varint((static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63)); }
  std::vector<std::byte>& bytes() { return out_; }

 private:
  std::vector<std::byte> out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  std::size_t offset() const { return pos_; }
  std::size_t left() const { return in_.size() - pos_; }

  Result<std::uint64_t> Fixed(int bytes) {
    if (left() < static_cast<std::size_t>(bytes)) return Truncated();
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= std::uint64_t{static_cast<std::uint8_t>(in_[pos_ + i])} << (8 * i);
    pos_ += bytes;
    return v;
  }
  Result<std::uint64_t> Varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      if (left() == 0) return Truncated();
      const auto b = static_cast<std::uint8_t>(in_[pos_++]);
      if (shift == 63 && b > 1) return Corrupt("varint overflows 64 bits");
      v |= std::uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80) == 0) return v;
    }
    return Corrupt("varint longer than 10 bytes");
  }
  Result<std::uint64_t> VarintAtMost(std::uint64_t max, const char* what) {
    auto v = Varint();
    if (!v) return v;
    if (*v > max) return Corrupt(fmt::format("{} {} exceeds {}", what, *v, max));
    return v;
  }
  Result<std::int64_t> ZigZag() {
    auto v = Varint();
    if (!v) return std::unexpected(v.error());
    return static_cast<std::int64_t>((*v >> 1) ^ (~(*v & 1) + 1));
  }
  std::unexpected<Error> Truncated() const {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("trace truncated at byte {}", pos_));
  }
  std::unexpected<Error> Corrupt(std::string_view what) const {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("trace corrupt at byte {}: {}", pos_, what));
  }

 private:
  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
};

}  // namespace

Status Trace::Validate() const {
  if (kind != TraceValueKind::kPosition && kind != TraceValueKind::kLogicalAddress) {
    return MakeError(ErrorCode::kInvalidArgument, "field 'kind': unknown value kind");
  }
  if (num_groups == 0) return MakeError(ErrorCode::kInvalidArgument, "field 'num_groups': must be >= 1");
  if (queries_per_step == 0) {
    return MakeError(ErrorCode::kInvalidArgument, "field 'queries_per_step': must be >= 1");
  }
  for (std::size_t s = 0; s < steps.size(); ++s) {
    for (const TraceRecord& r : steps[s].records) {
      if (r.group >= num_groups || r.query >= queries_per_step) {
        return MakeError(ErrorCode::kOutOfRange,
                         fmt::format("step {} request {}: group {} / query {} outside {} groups / {} queries", s,
                                     r.request, r.group, r.query, num_groups, queries_per_step));
      }
      if (kind == TraceValueKind::kPosition) {
        for (std::uint32_t v : r.values) {
          if (v >= r.context_len) {
            return MakeError(ErrorCode::kOutOfRange,
                             fmt::format("step {} request {}: position {} >= context_len {}", s, r.request, v,
                                         r.context_len));
          }
        }
      }
    }
  }
  return Ok();
}

std::uint64_t Trace::num_records() const {
  std::uint64_t n = 0;
  for (const auto& s : steps) n += s.records.size();
  return n;
}

std::uint64_t Trace::num_values() const {
  std::uint64_t n = 0;
  for (const auto& s : steps) {
    for (const auto& r : s.records) n += r.values.size();
  }
  return n;
}

Result<std::vector<std::byte>> EncodeTrace(const Trace& trace) {
  ULA_RETURN_IF_ERROR(trace.Validate());
  Writer w;
  for (char c : kMagic) w.Fixed(static_cast<std::uint8_t>(c), 1);
  w.Fixed(kTraceFormatVersion, 4);
  w.Fixed(static_cast<std::uint8_t>(trace.kind), 1);
  w.Fixed(0, 3);
  w.Fixed(trace.num_groups, 4);
  w.Fixed(trace.queries_per_step, 4);
  w.Fixed(trace.steps.size(), 8);
  w.Fixed(trace.num_records(), 8);
  w.Fixed(trace.num_values(), 8);
  for (const TraceStep& step : trace.steps) {
    w.Varint(step.records.size());
    for (const TraceRecord& r : step.records) {
      w.Varint(r.request);
      w.Varint(r.group);
      w.Varint(r.query);
      w.Varint(r.context_len);
      w.Varint(r.values.size());
      std::int64_t prev = 0;
      for (std::uint32_t v : r.values) {
        w.ZigZag(static_cast<std::int64_t>(v) - prev);
        prev = v;
      }
    }
  }
  const std::uint64_t sum = Fnv1a64(w.bytes());
  w.Fixed(sum, 8);
  return std::move(w.bytes());
}

Result<Trace> DecodeTrace(std::span<const std::byte> bytes) {
  if (bytes.size() < kHeaderBytes + 8) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("trace truncated: {} bytes", bytes.size()));
  }
  if (std::memcmp(bytes.data(), kMagic, 8) != 0) {
    return MakeError(ErrorCode::kInvalidArgument, "not a trace file (bad magic)");
  }
  const std::span<const std::byte> body = bytes.first(bytes.size() - 8);
  Reader tail(bytes.last(8));
  const std::uint64_t stored_sum = *tail.Fixed(8);
  Reader r(body);
  (void)r.Fixed(8);  // magic
  const std::uint64_t version = *r.Fixed(4);
  if (version != kTraceFormatVersion) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("trace version {} unsupported (want {})", version,
                                                              kTraceFormatVersion));
  }
  if (Fnv1a64(body) != stored_sum) return MakeError(ErrorCode::kInvalidArgument, "trace checksum mismatch");
  Trace t;
  const std::uint64_t kind = *r.Fixed(1);
  if (kind > 1) return r.Corrupt("unknown value kind");
  t.kind = static_cast<TraceValueKind>(kind);
  if (*r.Fixed(3) != 0) return r.Corrupt("reserved bytes not zero");
  t.num_groups = static_cast<std::uint32_t>(*r.Fixed(4));
  t.queries_per_step = static_cast<std::uint32_t>(*r.Fixed(4));
  const std::uint64_t num_steps = *r.Fixed(8);
  const std::uint64_t num_records = *r.Fixed(8);
  const std::uint64_t num_values = *r.Fixed(8);
  if (t.num_groups == 0 || t.queries_per_step == 0) return r.Corrupt("zero groups or queries");
  // Every step, record and value takes at least one byte: bound allocations by bytes left.
  if (num_steps > r.left() || num_records > r.left() || num_values > r.left()) {
    return r.Corrupt("header counts exceed the file size");
  }
  t.steps.resize(num_steps);
  std::uint64_t records_seen = 0, values_seen = 0;
  for (TraceStep& step : t.steps) {
    auto count = r.VarintAtMost(num_records - records_seen, "record count");
    if (!count) return std::unexpected(count.error());
    records_seen += *count;
    step.records.resize(*count);
    for (TraceRecord& rec : step.records) {
      auto request = r.Varint();
      auto group = request ? r.VarintAtMost(t.num_groups - 1, "group") : request;
      auto query = group ? r.VarintAtMost(t.queries_per_step - 1, "query") : group;
      auto context = query ? r.VarintAtMost(0xffffffffu, "context_len") : query;
      auto n = context ? r.VarintAtMost(num_values - values_seen, "value count") : context;
      if (!n) return std::unexpected(n.error());
      rec.request = *request;
      rec.group = static_cast<std::uint32_t>(*group);
      rec.query = static_cast<std::uint32_t>(*query);
      rec.context_len = static_cast<std::uint32_t>(*context);
      values_seen += *n;
      rec.values.resize(*n);
      std::int64_t prev = 0;
      for (std::uint32_t& v : rec.values) {
        auto delta = r.ZigZag();
        if (!delta) return std::unexpected(delta.error());
        const std::int64_t value = prev + *delta;
        if (value < 0 || value > 0xffffffffll) return r.Corrupt("value outside 32 bits");
        v = static_cast<std::uint32_t>(value);
        prev = value;
      }
    }
  }
  if (records_seen != num_records || values_seen != num_values) return r.Corrupt("counts differ from header");
  if (r.left() != 0) return r.Corrupt("trailing bytes");
  if (auto st = t.Validate(); !st) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("trace corrupt: {}", st.error().message()));
  }
  return t;
}

Status WriteTraceFile(const std::filesystem::path& path, const Trace& trace) {
  auto bytes = EncodeTrace(trace);
  if (!bytes) return std::unexpected(bytes.error());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return MakeError(ErrorCode::kIo, fmt::format("cannot create '{}'", path.string()));
  out.write(reinterpret_cast<const char*>(bytes->data()), static_cast<std::streamsize>(bytes->size()));
  out.close();
  if (!out) return MakeError(ErrorCode::kIo, fmt::format("cannot write '{}'", path.string()));
  return Ok();
}

Result<Trace> ReadTraceFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return MakeError(ErrorCode::kIo, fmt::format("cannot open '{}'", path.string()));
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return MakeError(ErrorCode::kIo, fmt::format("cannot read '{}'", path.string()));
  auto bytes = std::as_bytes(std::span<const char>(raw));
  auto trace = DecodeTrace(bytes);
  if (!trace) {
    return MakeError(trace.error().code(), fmt::format("{}: {}", path.string(), trace.error().message()));
  }
  return trace;
}

}  // namespace ula

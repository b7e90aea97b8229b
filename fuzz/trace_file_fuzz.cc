// Trace files (src/workload/trace_file.h) from arbitrary bytes. Properties: DecodeTrace
// never crashes, reads out of bounds or allocates without bound; what it accepts is valid
// (Trace::Validate), encodes again, and that encoding decodes to the same trace and is
// the input itself (one encoding per trace: the checksum covers every byte).
#include <cstring>
#include <span>
#include <vector>

#include "fuzz_input.h"
#include "workload/trace_file.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ula;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  auto trace = DecodeTrace(bytes);
  if (!trace) return 0;
  FUZZ_OK(trace->Validate());
  auto again = EncodeTrace(*trace);
  FUZZ_OK(again);
  auto back = DecodeTrace(*again);
  FUZZ_OK(back);
  FUZZ_CHECK(*back == *trace, "decode(encode(t)) != t");
  FUZZ_CHECK(again->size() == size && std::memcmp(again->data(), data, size) == 0,
             "an accepted trace file is not the encoding of what it decodes to");
  return 0;
}

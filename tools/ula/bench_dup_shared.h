// `ula bench dup` on a sharing workload (configs/workloads with "sharing", shared_workload.h):
// the stored entries of UlaCache with shared addresses and a SparsePrefixCache (TP: one
// cache over the striped space, both attention strategies; DP: one cache per rank, routed
// cache-aware by RouteByPrefix and, for the cost of that choice, round robin), against the
// baselines' copies as engines run them today (a radix cache per GPU: under TP every GPU
// stores every cached prefix; HiSparse adds its per-request device buffers).
#pragma once

#include <cstdint>
#include <string>

namespace ula {
class TpAddressSpace;
}

namespace ula::cli {

// Entries a TP space stores over all ranks and groups: its shards' device and host pools,
// and the local buffers' copies (both `bench dup` forms count TP this way).
struct TpStoredEntries {
  std::uint64_t pooled = 0, buffered = 0;
  std::uint64_t physical() const { return pooled + buffered; }
};
TpStoredEntries CountTpStoredEntries(const TpAddressSpace& tp);

struct SharedDupOptions {
  std::string config_dir, model, workload;
  std::uint32_t ranks = 8, requests = 0, steps = 6, hisparse_buffer = 4096;  // requests 0: all
  double buffer_factor = 1.25;
  bool json = false;
};

// Prints the table (or one JSON object); returns the exit code.
int RunDupShared(const SharedDupOptions& o);

}  // namespace ula::cli

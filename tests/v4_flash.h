// DeepSeek-V4-Flash for the tests: its model config (configs/models/deepseek_v4_flash.json)
// and a space built from it (SpaceConfigOfModel, src/config/model_kinds.h) whose 21 CSA
// groups of one 584-byte C4 row each hold the given number of entries per tier.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>

#include "config/model_config.h"
#include "config/model_kinds.h"
#include "ula/address_space.h"
#include "ula/tp_address_space.h"

namespace ula::test {

inline constexpr std::uint32_t kFlashGroups = 21;   // CSA layers: one C4 group each
inline constexpr std::uint32_t kFlashC4Row = 584;   // V4's FP8 packed C4 row

inline ModelConfig FlashModel() {
  auto m = LoadModelConfigByName("deepseek_v4_flash", DefaultConfigDir());
  EXPECT_TRUE(m) << m.error().ToString();
  return *m;
}

// The engine path's modes (stable new entries, no host shadows); drafts: the most a round
// rolls back (the window ring's slack).
inline AddressSpaceConfig FlashSpaceConfig(std::uint32_t device_entries, std::uint32_t host_entries,
                                           std::uint32_t drafts) {
  AddressSpaceConfig base;
  base.device_bytes_per_rank = std::uint64_t{device_entries} * kFlashGroups * kFlashC4Row;
  base.host_bytes_per_rank = std::uint64_t{host_entries} * kFlashGroups * kFlashC4Row;
  base.stable_new_entries = true;
  auto c = SpaceConfigOfModel(FlashModel(), {.max_draft_tokens = drafts}, base);
  EXPECT_TRUE(c) << c.error().ToString();
  EXPECT_EQ(c->num_groups, kFlashGroups);
  EXPECT_EQ(c->row(), kFlashC4Row);
  return *c;
}

// The same space over `ranks` TP ranks, attention at home: each rank's pools sized as one DP
// rank's above, every kind of the model (TpConfig::kinds).
inline TpConfig FlashTpConfig(std::uint32_t ranks, std::uint32_t device_entries, std::uint32_t host_entries,
                              std::uint32_t drafts) {
  const AddressSpaceConfig dp = FlashSpaceConfig(device_entries, host_entries, drafts);
  TpConfig c;
  c.num_ranks = ranks;
  c.num_groups = dp.num_groups;
  c.entry_bytes = dp.entry_bytes;
  c.attention = TpAttention::kAtHome;
  c.device_bytes_per_rank = dp.device_bytes_per_rank;
  c.host_bytes_per_rank = dp.host_bytes_per_rank;
  c.page_tokens = dp.page_tokens;
  c.stable_new_entries = true;
  c.kinds = dp.kinds;
  return c;
}

}  // namespace ula::test

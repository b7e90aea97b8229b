// Config loading: the shipped configs load with their published figures, and every field
// of a model or hardware config is rejected with an error that names it.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "config/hardware_config.h"
#include "config/model_config.h"

namespace ula {
namespace {

TEST(ModelConfig, Glm5LoadsWithPublishedShape) {
  auto m = LoadModelConfigByName("glm5", DefaultConfigDir());
  ASSERT_TRUE(m) << m.error().ToString();
  EXPECT_EQ(m->num_layers, 78u);
  EXPECT_EQ(m->mtp_layers, 1u);
  EXPECT_EQ(m->kv_entry_bytes_per_layer, 656u);
  EXPECT_EQ(m->index_key_bytes_per_layer, 132u);
  EXPECT_EQ(m->top_k, 2048u);
  EXPECT_EQ(m->layers_per_group, 4u);
  EXPECT_EQ(m->num_groups(), 21u);  // 19 groups of 4, one of 2, one MTP group
  EXPECT_EQ(m->GroupLayers(0), 4u);
  EXPECT_EQ(m->GroupLayers(19), 2u);
  EXPECT_EQ(m->GroupLayers(20), 1u);
  EXPECT_EQ(m->group_entry_bytes(), 4u * 656u);
  EXPECT_EQ(m->kv_bytes_per_token(), 79u * 656u);
}

TEST(ModelConfig, DeepSeekV32HasASelectionPerLayer) {
  auto m = LoadModelConfigByName("deepseek_v32", DefaultConfigDir());
  ASSERT_TRUE(m) << m.error().ToString();
  EXPECT_EQ(m->num_layers, 61u);
  EXPECT_EQ(m->num_groups(), 62u);
  EXPECT_EQ(m->group_entry_bytes(), 656u);
  EXPECT_EQ(m->top_k, 2048u);
}

TEST(ModelConfig, SmallTestModelsAreFloat32) {
  for (const char* name : {"tiny_glm", "tiny_dsa"}) {
    auto m = LoadModelConfigByName(name, DefaultConfigDir());
    ASSERT_TRUE(m) << m.error().ToString();
    EXPECT_TRUE(m->is_float32()) << name;
  }
}

TEST(ModelConfig, MissingFileIsAnIoError) {
  auto m = LoadModelConfigByName("no_such_model", DefaultConfigDir());
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().code(), ErrorCode::kIo);
}

nlohmann::json ReadJson(const std::string& path) {
  auto m = std::ifstream(path);
  return nlohmann::json::parse(m);
}

// Each mutation must fail with an error naming `field`.
struct BadField {
  std::string field;
  nlohmann::json value;  // null: remove the field
};

void ExpectRejected(const nlohmann::json& base, const BadField& bad, bool hardware) {
  nlohmann::json j = base;
  if (bad.value.is_null()) {
    j.erase(bad.field);
  } else {
    j[bad.field] = bad.value;
  }
  const std::string text = j.dump();
  std::string message;
  if (hardware) {
    auto h = ParseHardwareConfig(text, "test");
    ASSERT_FALSE(h) << bad.field << " = " << bad.value.dump();
    EXPECT_EQ(h.error().code(), ErrorCode::kInvalidArgument);
    message = h.error().message();
  } else {
    auto m = ParseModelConfig(text, "test");
    ASSERT_FALSE(m) << bad.field << " = " << bad.value.dump();
    EXPECT_EQ(m.error().code(), ErrorCode::kInvalidArgument);
    message = m.error().message();
  }
  // A consistency error names the stated size field and, in its formula, this one.
  EXPECT_NE(message.find(bad.field), std::string::npos)
      << "error does not name " << bad.field << ": " << message;
}

TEST(ModelConfig, RejectsEachBadFieldByName) {
  const nlohmann::json base = ReadJson((DefaultConfigDir() / "models" / "glm5.json").string());
  ASSERT_TRUE(ParseModelConfig(base.dump(), "test"));
  // Every field: missing, and of the wrong type.
  for (auto it = base.begin(); it != base.end(); ++it) {
    ExpectRejected(base, {it.key(), nullptr}, false);
    ExpectRejected(base, {it.key(), it->is_string() ? nlohmann::json(7) : nlohmann::json("x")}, false);
  }
  // Values out of range or inconsistent.
  const BadField bad[] = {
      {"name", ""},
      {"num_layers", 0},
      {"num_layers", -3},
      {"layers_per_group", 0},
      {"layers_per_group", 79},
      {"attention_heads", 0},
      {"kv_lora_rank", 0},
      {"kv_lora_rank", 1.5},
      {"kv_lora_rank", 256},  // 656 no longer matches
      {"kv_lora_bytes_per_value", 3},
      {"kv_scale_bytes", 8},
      {"rope_bytes_per_value", 0},
      {"kv_entry_bytes_per_layer", 657},
      {"index_heads", 0},
      {"index_head_dim", 0},
      {"index_key_bytes_per_value", 8},
      {"index_key_bytes_per_layer", 131},
      {"top_k", 0},
      {"top_k", 5000000000.0},
      {"mtp_layers", -1},
      {"misspelt_field", 1},
  };
  for (const BadField& b : bad) ExpectRejected(base, b, false);
}

TEST(ModelConfig, DeepSeekV4FlashHasThreeLayerKinds) {
  auto m = LoadModelConfigByName("deepseek_v4_flash", DefaultConfigDir());
  ASSERT_TRUE(m) << m.error().ToString();
  ASSERT_TRUE(m->has_layer_kinds());
  EXPECT_EQ(m->num_layers, 43u);
  EXPECT_EQ(m->mtp_layers, 1u);
  EXPECT_EQ(m->compress_ratios.size(), 44u);
  EXPECT_EQ(m->sliding_window, 128u);
  EXPECT_EQ(m->top_k, 512u);
  EXPECT_EQ(m->attention_heads, 64u);
  EXPECT_EQ(m->index_heads, 64u);
  EXPECT_EQ(m->index_head_dim, 128u);
  // Two window-only layers, CSA / HCA alternating from layer 2, the MTP layer window-only.
  EXPECT_EQ(m->layer_kind(0), AttentionLayerType::kSlidingWindow);
  EXPECT_EQ(m->layer_kind(1), AttentionLayerType::kSlidingWindow);
  EXPECT_EQ(m->layer_kind(2), AttentionLayerType::kCompressedSparse);
  EXPECT_EQ(m->layer_kind(3), AttentionLayerType::kHeavilyCompressed);
  EXPECT_EQ(m->layer_kind(42), AttentionLayerType::kCompressedSparse);
  EXPECT_EQ(m->layer_kind(43), AttentionLayerType::kSlidingWindow);
  EXPECT_EQ(m->num_layers_of_kind(AttentionLayerType::kSlidingWindow), 3u);
  EXPECT_EQ(m->num_layers_of_kind(AttentionLayerType::kCompressedSparse), 21u);
  EXPECT_EQ(m->num_layers_of_kind(AttentionLayerType::kHeavilyCompressed), 20u);
  // SGLang's layouts: packed FP8 584 B, uniform FP8 512 B, BF16 1024 B; index keys 132 / 68 B.
  EXPECT_EQ(m->kv_entry_bytes_per_layer, 584u);
  EXPECT_EQ(m->kv_entry_bytes_fp8_uniform, 512u);
  EXPECT_EQ(m->kv_entry_bytes_bf16, 1024u);
  EXPECT_EQ(m->index_key_bytes_per_layer, 132u);
  EXPECT_EQ(m->index_key_bytes_fp4, 68u);
}

TEST(ModelConfig, DeepSeekV4ProOpensWithTwoHcaLayers) {
  auto m = LoadModelConfigByName("deepseek_v4_pro", DefaultConfigDir());
  ASSERT_TRUE(m) << m.error().ToString();
  EXPECT_EQ(m->num_layers, 61u);
  EXPECT_EQ(m->attention_heads, 128u);
  EXPECT_EQ(m->top_k, 1024u);
  EXPECT_EQ(m->layer_kind(0), AttentionLayerType::kHeavilyCompressed);
  EXPECT_EQ(m->layer_kind(1), AttentionLayerType::kHeavilyCompressed);
  EXPECT_EQ(m->layer_kind(2), AttentionLayerType::kCompressedSparse);
  EXPECT_EQ(m->num_layers_of_kind(AttentionLayerType::kSlidingWindow), 1u);  // the MTP layer
  EXPECT_EQ(m->num_layers_of_kind(AttentionLayerType::kCompressedSparse), 30u);
  EXPECT_EQ(m->num_layers_of_kind(AttentionLayerType::kHeavilyCompressed), 31u);
}

TEST(ModelConfig, SingleKindModelsHaveNoLayerKinds) {
  for (const char* name : {"glm5", "deepseek_v32", "tiny_glm", "tiny_dsa"}) {
    auto m = LoadModelConfigByName(name, DefaultConfigDir());
    ASSERT_TRUE(m) << m.error().ToString();
    EXPECT_FALSE(m->has_layer_kinds()) << name;
    EXPECT_EQ(m->num_layers_of_kind(AttentionLayerType::kCompressedSparse), 0u) << name;
  }
  // A config built in code is held to the same rule: a window without ratios is refused.
  auto m = LoadModelConfigByName("glm5", DefaultConfigDir());
  ASSERT_TRUE(m);
  m->sliding_window = 128;
  auto st = m->Validate();
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message().find("sliding_window"), std::string::npos) << st.error().message();
}

TEST(ModelConfig, RejectsEachBadLayerKindFieldByName) {
  const nlohmann::json base = ReadJson((DefaultConfigDir() / "models" / "deepseek_v4_flash.json").string());
  ASSERT_TRUE(ParseModelConfig(base.dump(), "test"));
  // Every field, the layer-kind group included: missing (the group comes whole), wrong type.
  for (auto it = base.begin(); it != base.end(); ++it) {
    ExpectRejected(base, {it.key(), nullptr}, false);
    ExpectRejected(base, {it.key(), it->is_string() ? nlohmann::json(7) : nlohmann::json("x")}, false);
  }
  nlohmann::json short_ratios = base["compress_ratios"];
  short_ratios.erase(short_ratios.size() - 1);
  nlohmann::json bad_ratio = base["compress_ratios"];
  bad_ratio[5] = 8;
  nlohmann::json negative_ratio = base["compress_ratios"];
  negative_ratio[5] = -4;
  const BadField bad[] = {
      {"compress_ratios", short_ratios},  // 43 entries: the MTP layer's is missing
      {"compress_ratios", bad_ratio},
      {"compress_ratios", negative_ratio},
      {"compress_ratios", nlohmann::json::array()},
      {"sliding_window", 0},
      {"compress_rate_csa", 3},
      {"compress_rate_csa", 8},    // the ratios' 4 is then neither kind
      {"compress_rate_csa", 256},  // not below compress_rate_hca
      {"compress_rate_hca", 4},
      {"compress_rate_hca", 96},
      {"kv_entry_bytes_by_format", nlohmann::json::array({584})},
      {"compressor_state_bytes_per_value", 3},
      {"compressor_state_bytes_per_value", 8},
  };
  for (const BadField& b : bad) ExpectRejected(base, b, false);
  // The group without its ratios: a lone window is refused by name.
  nlohmann::json lone = ReadJson((DefaultConfigDir() / "models" / "glm5.json").string());
  lone["sliding_window"] = 128;
  ExpectRejected(lone, {"sliding_window", 128}, false);
  // Per-format sizes that disagree with their layouts, and unknown formats.
  struct Nested {
    const char* object;
    const char* field;
    nlohmann::json value;
  };
  const Nested nested[] = {
      {"kv_entry_bytes_by_format", "fp8_packed", 583},
      {"kv_entry_bytes_by_format", "fp8_uniform", 511},
      {"kv_entry_bytes_by_format", "bf16", 1000},
      {"kv_entry_bytes_by_format", "int4", 256},
      {"index_key_bytes_by_format", "fp8", 131},
      {"index_key_bytes_by_format", "fp4", 72},  // 64 + 8: not SGLang's 64 + 128 / 32
      {"index_key_bytes_by_format", "fp4", nullptr},
  };
  for (const Nested& n : nested) {
    nlohmann::json j = base;
    if (n.value.is_null()) {
      j[n.object].erase(n.field);
    } else {
      j[n.object][n.field] = n.value;
    }
    auto m = ParseModelConfig(j.dump(), "test");
    ASSERT_FALSE(m) << n.object << "." << n.field << " = " << n.value.dump();
    EXPECT_EQ(m.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(m.error().message().find(n.field), std::string::npos) << m.error().message();
  }
}

TEST(ModelConfig, RejectsMalformedJson) {
  auto m = ParseModelConfig("{\"name\": ", "broken.json");
  ASSERT_FALSE(m);
  EXPECT_NE(m.error().message().find("broken.json"), std::string::npos);
  EXPECT_FALSE(ParseModelConfig("[1, 2]", "array.json"));
}

TEST(HardwareConfig, H200AndB300LoadWithPublishedFigures) {
  auto h = LoadHardwareConfigByName("h200", DefaultConfigDir());
  ASSERT_TRUE(h) << h.error().ToString();
  EXPECT_EQ(h->device_memory_bytes, 141'000'000'000u);
  EXPECT_DOUBLE_EQ(h->hbm_bandwidth_bytes_per_s, 4.8e12);
  EXPECT_DOUBLE_EQ(h->nvlink_bandwidth_bytes_per_s, 900e9);
  EXPECT_DOUBLE_EQ(h->host_link_bandwidth_bytes_per_s, 55e9);
  EXPECT_EQ(h->host_memory_bytes_per_gpu, 128'000'000'000u);
  auto b = LoadHardwareConfigByName("b300", DefaultConfigDir());
  ASSERT_TRUE(b) << b.error().ToString();
  EXPECT_EQ(b->device_memory_bytes, 288'000'000'000u);
  EXPECT_DOUBLE_EQ(b->hbm_bandwidth_bytes_per_s, 8e12);
  EXPECT_DOUBLE_EQ(b->nvlink_bandwidth_bytes_per_s, 1.8e12);
  EXPECT_EQ(b->host_memory_bytes_per_gpu, 192'000'000'000u);
}

TEST(HardwareConfig, RejectsEachBadFieldByName) {
  const nlohmann::json base = ReadJson((DefaultConfigDir() / "hardware" / "h200.json").string());
  ASSERT_TRUE(ParseHardwareConfig(base.dump(), "test"));
  for (auto it = base.begin(); it != base.end(); ++it) {
    ExpectRejected(base, {it.key(), nullptr}, true);
    ExpectRejected(base, {it.key(), it->is_string() ? nlohmann::json(7) : nlohmann::json("x")}, true);
    if (it->is_object()) {
      // A value without its source, and a negative value.
      ExpectRejected(base, {it.key(), nlohmann::json{{"value", 1}}}, true);
      ExpectRejected(base, {it.key(), nlohmann::json{{"value", -1}, {"source", "s"}}}, true);
      ExpectRejected(base, {it.key(), nlohmann::json{{"value", 1}, {"source", ""}}}, true);
    }
  }
  ExpectRejected(base, {"name", ""}, true);
  ExpectRejected(base, {"gpus_per_node", nlohmann::json{{"value", 0}, {"source", "s"}}}, true);
  ExpectRejected(base, {"gpus_per_node", nlohmann::json{{"value", 2.5}, {"source", "s"}}}, true);
  ExpectRejected(base, {"host_link_bandwidth_bytes_per_s", nlohmann::json{{"value", 9e12}, {"source", "s"}}},
                 true);
  ExpectRejected(base, {"extra", 1}, true);
}

TEST(ConfigDir, EnvironmentOverridesTheFoundDirectory) {
  const std::string before = DefaultConfigDir().string();
  ::setenv("ULA_CONFIG_DIR", "elsewhere/configs", 1);
  EXPECT_EQ(DefaultConfigDir().string(), "elsewhere/configs");
  ::unsetenv("ULA_CONFIG_DIR");
  EXPECT_EQ(DefaultConfigDir().string(), before);
}

// Without the environment, the test binary (in a build tree inside the clone) finds the
// clone's configs/ at run time: nothing absolute is compiled in.
TEST(ConfigDir, FoundAboveTheBinaryWithoutTheEnvironment) {
  ::unsetenv("ULA_CONFIG_DIR");
  const std::filesystem::path dir = DefaultConfigDir();
  EXPECT_TRUE(dir.is_absolute()) << dir;
  EXPECT_TRUE(std::filesystem::exists(dir / "models" / "glm5.json")) << dir;
}

// The walk up: the first start (and its ancestors) wins over later starts; a start with no
// configs/models above it is passed over; nothing found is an empty path.
TEST(ConfigDir, WalksUpEachStartInOrder) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / fmt::format("ula_config_dir_{}", ::getpid());
  fs::remove_all(root);
  fs::create_directories(root / "a" / "configs" / "models");
  fs::create_directories(root / "a" / "build" / "tools" / "ula");
  fs::create_directories(root / "b" / "configs" / "models");
  fs::create_directories(root / "b" / "deep");
  fs::create_directories(root / "c" / "configs");  // no models/: not a config directory
  fs::create_directories(root / "c" / "x");
  EXPECT_EQ(FindConfigDirAbove({root / "a" / "build" / "tools" / "ula"}), root / "a" / "configs");
  EXPECT_EQ(FindConfigDirAbove({root / "b" / "deep", root / "a" / "build"}), root / "b" / "configs");
  EXPECT_EQ(FindConfigDirAbove({root / "c" / "x", root / "b" / "deep"}), root / "b" / "configs");
  EXPECT_EQ(FindConfigDirAbove({root / "c" / "x"}), fs::path{}) << "configs/ without models/ is not one";
  EXPECT_EQ(FindConfigDirAbove({}), fs::path{});
  fs::remove_all(root);
}

}  // namespace
}  // namespace ula

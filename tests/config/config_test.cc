// Config loading: the shipped configs load with their published figures, and every field
// of a model or hardware config is rejected with an error that names it.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
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

TEST(ConfigDir, EnvironmentOverridesTheCompiledInDirectory) {
  const std::string before = DefaultConfigDir().string();
  ::setenv("ULA_CONFIG_DIR", "elsewhere/configs", 1);
  EXPECT_EQ(DefaultConfigDir().string(), "elsewhere/configs");
  ::unsetenv("ULA_CONFIG_DIR");
  EXPECT_EQ(DefaultConfigDir().string(), before);
}

}  // namespace
}  // namespace ula

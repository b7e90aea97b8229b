// The `ulacache` extension module (imported as ulacache._ulacache; python/ulacache/__init__.py
// re-exports it next to the exception classes). Error translation, configs, the indexer.
#include <pybind11/stl.h>

#include "bind_common.h"
#include "config/hardware_config.h"
#include "indexer/indexer.h"
#include "config/model_config.h"

namespace ulapy {
namespace {

void TranslateErrors() {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const UlaException& e) {
      // ulacache.error_class(code_name) -> the subclass; raise cls(code, message).
      py::gil_scoped_acquire gil;
      py::object pkg = py::module_::import("ulacache");
      const std::string code(ula::ErrorCodeName(e.error.code()));
      py::object cls = pkg.attr("error_class")(code);
      py::object exc = cls(code, e.error.message());
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });
}

void BindIndexer(py::module_& m) {
  py::class_<ula::Indexer>(m, "Indexer", R"doc(
The CPU lightning indexer (DeepSeek-V3.2 DSA style, src/indexer/indexer.h): score(k) =
sum_h w[h] * relu(q[h] . k) in float32 in a fixed order; top-k by score, ties by position.)doc")
      .def(py::init([](std::uint32_t num_heads, std::uint32_t head_dim, std::uint32_t top_k) {
             return Unwrap(ula::Indexer::Create({num_heads, head_dim, top_k}));
           }),
           py::arg("num_heads"), py::arg("head_dim"), py::arg("top_k"))
      .def(
          "select",
          [](ula::Indexer& ix, const py::array& query, const py::array& weights, const py::array& keys) {
            auto q = View<const float>(query, "query");
            auto w = View<const float>(weights, "weights");
            auto k = View<const float>(keys, "keys");
            std::vector<std::uint32_t> out;
            {
              py::gil_scoped_release nogil;
              Unwrap(ix.Select({q, w}, k, out));
            }
            return ToNumpy<std::uint32_t>(std::move(out));
          },
          py::arg("query"), py::arg("weights"), py::arg("keys"),
          "Positions of the top-k keys (float32 [n, head_dim]) for one query (float32 [num_heads * head_dim], "
          "weights float32 [num_heads]), in top-k order, as uint32 [min(k, n)].")
      .def_property_readonly("top_k", [](const ula::Indexer& ix) { return ix.shape().top_k; })
      .def_property_readonly("shape", [](const ula::Indexer& ix) {
             return py::make_tuple(ix.shape().num_heads, ix.shape().head_dim, ix.shape().top_k);
           }, "(num_heads, head_dim, top_k).")
      .def(
          "score",
          [](const ula::Indexer& ix, const py::array& query, const py::array& weights, const py::array& keys) {
            auto q = View<const float>(query, "query");
            auto w = View<const float>(weights, "weights");
            auto k = View<const float>(keys, "keys");
            std::vector<float> out;
            {
              py::gil_scoped_release nogil;
              Unwrap(ix.Score({q, w}, k, out));
            }
            return ToNumpy<float>(std::move(out));
          },
          py::arg("query"), py::arg("weights"), py::arg("keys"), "The index score of every key, float32 [n].")
      .def(
          "select_union",
          [](ula::Indexer& ix, const std::vector<std::pair<py::array, py::array>>& queries, const py::array& keys) {
            std::vector<ula::IndexQuery> qs;
            for (const auto& [q, w] : queries) qs.push_back({View<const float>(q, "query"), View<const float>(w, "weights")});
            auto k = View<const float>(keys, "keys");
            std::vector<std::vector<std::uint32_t>> per_query;
            std::vector<std::uint32_t> all;
            {
              py::gil_scoped_release nogil;
              Unwrap(ix.SelectUnion(qs, k, per_query, all));
            }
            py::list lists;
            for (auto& l : per_query) lists.append(ToNumpy<std::uint32_t>(std::move(l)));
            return py::make_tuple(lists, ToNumpy<std::uint32_t>(std::move(all)));
          },
          py::arg("queries"), py::arg("keys"),
          "queries [(query, weights), ...] -> ([top-k uint32 per query], their union uint32: every position once, "
          "in order of first appearance).");
}

}  // namespace

void BindConfig(py::module_& m) {
  py::enum_<ula::AttentionLayerType>(m, "AttentionLayerType", "A layer's attention kind (src/config/model_config.h).")
      .value("sliding_window", ula::AttentionLayerType::kSlidingWindow)
      .value("compressed_sparse", ula::AttentionLayerType::kCompressedSparse)
      .value("heavily_compressed", ula::AttentionLayerType::kHeavilyCompressed);
  py::class_<ula::ModelConfig>(m, "ModelConfig", "A model's shape (configs/models/*.json, src/config/model_config.h).")
      .def_readonly("name", &ula::ModelConfig::name)
      .def_readonly("source", &ula::ModelConfig::source)
      .def_readonly("num_layers", &ula::ModelConfig::num_layers)
      .def_readonly("mtp_layers", &ula::ModelConfig::mtp_layers)
      .def_readonly("layers_per_group", &ula::ModelConfig::layers_per_group)
      .def_readonly("attention_heads", &ula::ModelConfig::attention_heads)
      .def_readonly("kv_lora_rank", &ula::ModelConfig::kv_lora_rank)
      .def_readonly("qk_rope_head_dim", &ula::ModelConfig::qk_rope_head_dim)
      .def_readonly("kv_entry_bytes_per_layer", &ula::ModelConfig::kv_entry_bytes_per_layer)
      .def_readonly("index_heads", &ula::ModelConfig::index_heads)
      .def_readonly("index_head_dim", &ula::ModelConfig::index_head_dim)
      .def_readonly("index_key_bytes_per_layer", &ula::ModelConfig::index_key_bytes_per_layer)
      .def_readonly("top_k", &ula::ModelConfig::top_k)
      .def_readonly("kv_lora_bytes_per_value", &ula::ModelConfig::kv_lora_bytes_per_value)
      .def_readonly("kv_scale_bytes", &ula::ModelConfig::kv_scale_bytes)
      .def_readonly("rope_bytes_per_value", &ula::ModelConfig::rope_bytes_per_value)
      .def_readonly("index_key_bytes_per_value", &ula::ModelConfig::index_key_bytes_per_value)
      .def_readonly("index_key_scale_bytes", &ula::ModelConfig::index_key_scale_bytes)
      .def_property_readonly("kv_bytes_per_token", &ula::ModelConfig::kv_bytes_per_token,
                             "KV bytes of one token over all layers (main + MTP).")
      .def_property_readonly("index_key_bytes_per_token", &ula::ModelConfig::index_key_bytes_per_token,
                             "Indexer key bytes of one token (one key per group).")
      .def("validate", [](const ula::ModelConfig& c) { Unwrap(c.Validate()); })
      .def_property_readonly("num_groups", &ula::ModelConfig::num_groups)
      .def("group_layers", &ula::ModelConfig::GroupLayers, py::arg("group"))
      .def_property_readonly("group_entry_bytes", &ula::ModelConfig::group_entry_bytes)
      .def_property_readonly("is_float32", &ula::ModelConfig::is_float32)
      // The layer-kind group (DeepSeek-V4; empty or 0 for a model without layer kinds).
      .def_readonly("compress_ratios", &ula::ModelConfig::compress_ratios, "[num_layers + mtp_layers]: 0, csa or hca")
      .def_readonly("sliding_window", &ula::ModelConfig::sliding_window)
      .def_readonly("compress_rate_csa", &ula::ModelConfig::compress_rate_csa)
      .def_readonly("compress_rate_hca", &ula::ModelConfig::compress_rate_hca)
      .def_readonly("kv_entry_bytes_fp8_uniform", &ula::ModelConfig::kv_entry_bytes_fp8_uniform)
      .def_readonly("kv_entry_bytes_bf16", &ula::ModelConfig::kv_entry_bytes_bf16)
      .def_readonly("index_key_bytes_fp4", &ula::ModelConfig::index_key_bytes_fp4)
      .def_readonly("compressor_state_bytes_per_value", &ula::ModelConfig::compressor_state_bytes_per_value)
      .def_property_readonly("has_layer_kinds", &ula::ModelConfig::has_layer_kinds)
      .def(
          "layer_kind",
          [](const ula::ModelConfig& c, std::uint32_t layer) {
            if (!c.has_layer_kinds() || layer >= c.compress_ratios.size()) {
              Throw(ula::ErrorCode::kOutOfRange, "layer " + std::to_string(layer) + " of " +
                                                     std::to_string(c.compress_ratios.size()) + " layers with a kind");
            }
            return c.layer_kind(layer);
          },
          py::arg("layer"), "The attention kind of layer `layer` (MTP layers after the main ones).")
      .def("num_layers_of_kind", &ula::ModelConfig::num_layers_of_kind, py::arg("kind"));
  m.def(
      "parse_model_config", [](std::string_view text) { return Unwrap(ula::ParseModelConfig(text)); },
      py::arg("json_text"), "A ModelConfig from JSON text; InvalidArgumentError names the bad field.");
  m.def(
      "load_model_config", [](const std::string& path) { return Unwrap(ula::LoadModelConfig(path)); },
      py::arg("path"), "A ModelConfig from a JSON file (IoError, InvalidArgumentError).");

  py::class_<ula::HardwareConfig>(m, "HardwareConfig", "A GPU's figures (configs/hardware/*.json).")
      .def_readonly("name", &ula::HardwareConfig::name)
      .def_readonly("device_memory_bytes", &ula::HardwareConfig::device_memory_bytes)
      .def_readonly("hbm_bandwidth_bytes_per_s", &ula::HardwareConfig::hbm_bandwidth_bytes_per_s)
      .def_readonly("nvlink_bandwidth_bytes_per_s", &ula::HardwareConfig::nvlink_bandwidth_bytes_per_s)
      .def_readonly("host_link_bandwidth_bytes_per_s", &ula::HardwareConfig::host_link_bandwidth_bytes_per_s)
      .def_readonly("host_memory_bytes_per_gpu", &ula::HardwareConfig::host_memory_bytes_per_gpu)
      .def_readonly("gpus_per_node", &ula::HardwareConfig::gpus_per_node)
      .def_readonly("dense_bf16_flops", &ula::HardwareConfig::dense_bf16_flops, "0 = unknown")
      .def_readonly("dense_fp8_flops", &ula::HardwareConfig::dense_fp8_flops, "0 = unknown")
      .def("validate", [](const ula::HardwareConfig& c) { Unwrap(c.Validate()); });
  m.def(
      "load_hardware_config", [](const std::string& path) { return Unwrap(ula::LoadHardwareConfig(path)); },
      py::arg("path"), "A HardwareConfig from a JSON file (IoError, InvalidArgumentError).");
}

}  // namespace ulapy

PYBIND11_MODULE(_ulacache, m) {
  m.doc() = "UlaCache: stable logical addresses over device and host KV pools (C++ core, thin bindings).";
  ulapy::TranslateErrors();
  ulapy::BindConfig(m);
  ulapy::BindIndexer(m);
  ulapy::BindSparse(m);
  ulapy::BindKinds(m);
  ulapy::BindTp(m);
  ulapy::BindHybrid(m);
}

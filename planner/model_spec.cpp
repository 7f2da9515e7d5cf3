#include "planner/model_spec.h"

#include <nlohmann/json.hpp>

#include "planner/data_paths.h"
#include "planner/errors.h"
#include "planner/json_fields.h"

namespace ftplan {
namespace {

// Keys that would change the architecture in ways this model does not describe.
constexpr const char* kUnsupportedKeys[] = {"num_local_experts", "num_experts", "moe_intermediate_size",
                                            "n_routed_experts", "sliding_window_pattern",
                                            "q_lora_rank", "kv_lora_rank"};

RopeScaling read_rope_scaling(const nlohmann::json& rope, const std::string& where) {
  RopeScaling scaling;
  if (!rope.is_object()) fail_input(where + ": expected an object");
  scaling.type = read_string_or(rope, "rope_type", read_string_or(rope, "type", "", where), where);
  if (scaling.type == "default") scaling.type = "";
  scaling.factor = read_number_or(rope, "factor", 1.0, where, 1e-6, 1e6);
  scaling.low_freq_factor = read_number_or(rope, "low_freq_factor", 1.0, where, 1e-6, 1e6);
  scaling.high_freq_factor = read_number_or(rope, "high_freq_factor", 4.0, where, 1e-6, 1e6);
  scaling.original_max_position =
      read_int_or(rope, "original_max_position_embeddings", 0, where, 0, INT64_C(1) << 30);
  return scaling;
}

}  // namespace

ModelSpec model_spec_from_json(const nlohmann::json& c, const std::string& name) {
  const std::string where = name.empty() ? "config" : name;
  if (!c.is_object()) fail_input(where + ": expected a JSON object (a Hugging Face config.json)");
  for (const char* key : kUnsupportedKeys)
    if (has_field(c, key) && !(c.at(key).is_number() && c.at(key).get<double>() == 0))
      fail_input(where + ": " + key + ": mixture-of-experts and MLA models are not supported");

  ModelSpec m;
  m.name = name;
  m.model_type = read_string_or(c, "model_type", "llama", where);
  if (m.model_type != "llama" && m.model_type != "mistral" && m.model_type != "qwen2")
    fail_input(where + ": model_type: '" + m.model_type +
               "' is not supported (llama, mistral, qwen2)");
  m.vocab_size = read_int(c, "vocab_size", where, 1, 10'000'000);
  m.hidden_size = read_int(c, "hidden_size", where, 1, 1'000'000);
  m.intermediate_size = read_int(c, "intermediate_size", where, 1, 10'000'000);
  m.num_layers = read_int(c, "num_hidden_layers", where, 1, 100'000);
  m.num_heads = read_int(c, "num_attention_heads", where, 1, 100'000);
  m.num_kv_heads = read_int_or(c, "num_key_value_heads", m.num_heads, where, 1, 100'000);
  if (m.num_heads % m.num_kv_heads != 0)
    fail_input(where + ": num_key_value_heads: " + std::to_string(m.num_kv_heads) +
               " does not divide num_attention_heads " + std::to_string(m.num_heads));
  if (has_field(c, "head_dim")) {
    m.head_dim = read_int(c, "head_dim", where, 1, 100'000);
  } else {
    if (m.hidden_size % m.num_heads != 0)
      fail_input(where + ": num_attention_heads: " + std::to_string(m.num_heads) +
                 " does not divide hidden_size " + std::to_string(m.hidden_size) +
                 " (and no head_dim is given)");
    m.head_dim = m.hidden_size / m.num_heads;
  }
  m.max_position_embeddings = read_int_or(c, "max_position_embeddings", 4096, where, 1, INT64_C(1) << 30);
  // Llama and Mistral default to untied embeddings; Qwen2's small models tie them in their config.
  m.tie_word_embeddings = read_bool_or(c, "tie_word_embeddings", false, where);
  bool attention_bias = read_bool_or(c, "attention_bias", false, where);
  m.qkv_bias = attention_bias || m.model_type == "qwen2";  // Qwen2 always has q,k,v biases
  m.o_bias = attention_bias;
  m.mlp_bias = read_bool_or(c, "mlp_bias", false, where);
  m.rms_norm_eps = read_number_or(c, "rms_norm_eps", 1e-5, where, 0.0, 1.0);

  // rope_theta at the top level (transformers < 5) or inside rope_parameters (transformers >= 5).
  m.rope_theta = read_number_or(c, "rope_theta", 10000.0, where, 1e-6, 1e12);
  if (has_field(c, "rope_parameters")) {
    const auto& rp = c.at("rope_parameters");
    m.rope_theta = read_number_or(rp, "rope_theta", m.rope_theta, where + ": rope_parameters", 1e-6, 1e12);
    m.rope_scaling = read_rope_scaling(rp, where + ": rope_parameters");
  }
  if (has_field(c, "rope_scaling")) m.rope_scaling = read_rope_scaling(c.at("rope_scaling"), where + ": rope_scaling");

  // Reject sizes whose products would overflow 64-bit counts later (bytes of activations too).
  const double h = static_cast<double>(m.hidden_size);
  double per_layer = h * (m.q_dim() + 2.0 * m.kv_dim()) + m.q_dim() * h + 3.0 * h * m.intermediate_size;
  if (per_layer * m.num_layers + 2.0 * m.vocab_size * h > 1e15)
    fail_input(where + ": hidden_size: the model would have over 1e15 parameters");
  return m;
}

ModelSpec load_model(const std::string& name_or_path) {
  const std::string path = resolve_data_file(name_or_path, "configs/models", "--model");
  const bool is_name = name_or_path.find('/') == std::string::npos &&
                       name_or_path.find(".json") == std::string::npos;
  return model_spec_from_json(read_json_file(path), is_name ? name_or_path : path);
}

std::array<LinearShape, 7> block_linears(const ModelSpec& m) {
  const int64_t h = m.hidden_size, i = m.intermediate_size;
  return {{{"q_proj", h, m.q_dim(), m.qkv_bias},
           {"k_proj", h, m.kv_dim(), m.qkv_bias},
           {"v_proj", h, m.kv_dim(), m.qkv_bias},
           {"o_proj", m.q_dim(), h, m.o_bias},
           {"gate_proj", h, i, m.mlp_bias},
           {"up_proj", h, i, m.mlp_bias},
           {"down_proj", i, h, m.mlp_bias}}};
}

ParamCounts count_params(const ModelSpec& m) {
  ParamCounts p;
  const int64_t h = m.hidden_size;
  for (const auto& lin : block_linears(m)) {
    int64_t n = lin.in_features * lin.out_features + (lin.bias ? lin.out_features : 0);
    bool is_mlp = lin.name == "gate_proj" || lin.name == "up_proj" || lin.name == "down_proj";
    (is_mlp ? p.mlp : p.attention) += n;
  }
  p.norms = 2 * h;
  p.per_layer = p.attention + p.mlp + p.norms;
  p.embedding = m.vocab_size * h;
  p.final_norm = h;
  p.lm_head = m.tie_word_embeddings ? 0 : m.vocab_size * h;
  p.total = p.embedding + m.num_layers * p.per_layer + p.final_norm + p.lm_head;
  return p;
}

}  // namespace ftplan

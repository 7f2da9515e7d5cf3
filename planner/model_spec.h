// Model spec: the architecture of a Llama-family decoder, read from a Hugging Face config.json.
// Covers Llama 1/2/3/3.1, Mistral, Qwen2, CodeLlama and TinyLlama (GQA, head_dim, tied embeddings,
// attention/MLP bias, rope_theta at top level or inside rope_parameters).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace ftplan {

struct RopeScaling {
  std::string type;                     // "" (none), "llama3", "linear", "dynamic"
  double factor = 1.0;                  // e.g. 8.0 for Llama-3.1
  double low_freq_factor = 1.0;         // llama3 only, e.g. 1.0
  double high_freq_factor = 4.0;        // llama3 only, e.g. 4.0
  int64_t original_max_position = 0;   // llama3 only, e.g. 8192
};

struct ModelSpec {
  std::string name;              // short name or file stem, e.g. "llama-3-8b"
  std::string model_type;        // "llama", "mistral", "qwen2"
  int64_t vocab_size = 0;        // e.g. 128256
  int64_t hidden_size = 0;       // e.g. 4096
  int64_t intermediate_size = 0; // e.g. 14336
  int64_t num_layers = 0;        // e.g. 32
  int64_t num_heads = 0;         // e.g. 32
  int64_t num_kv_heads = 0;      // e.g. 8 (GQA); equals num_heads without GQA
  int64_t head_dim = 0;          // e.g. 128; hidden_size / num_heads unless given
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;         // Qwen2: true; Llama attention_bias: true sets q,k,v and o
  bool o_bias = false;
  bool mlp_bias = false;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;

  int64_t q_dim() const { return num_heads * head_dim; }      // q_proj output features
  int64_t kv_dim() const { return num_kv_heads * head_dim; }  // k_proj / v_proj output features
};

// Parameter counts of the pieces of the model, exact (no rounding).
struct ParamCounts {
  int64_t embedding = 0;    // vocab_size * hidden_size
  int64_t per_layer = 0;    // one decoder block: attention + MLP + two RMSNorms
  int64_t attention = 0;    // q,k,v,o weights and biases of one block
  int64_t mlp = 0;          // gate, up, down of one block
  int64_t norms = 0;        // the two RMSNorm weights of one block
  int64_t final_norm = 0;   // hidden_size
  int64_t lm_head = 0;      // 0 when tied to the embedding
  int64_t total = 0;
};

// Parses and validates a config.json object; throws ftplan::InputError naming the field.
ModelSpec model_spec_from_json(const nlohmann::json& config, const std::string& name);

// Reads a config.json by short name (configs/models/<name>.json, see data_paths.h) or path.
ModelSpec load_model(const std::string& name_or_path);

ParamCounts count_params(const ModelSpec& model);

// The linear layers of one block, by their Hugging Face module names.
struct LinearShape {
  std::string name;      // "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
  int64_t in_features;
  int64_t out_features;
  bool bias;
};
// The seven linear layers of one decoder block, in execution order.
std::array<LinearShape, 7> block_linears(const ModelSpec& model);

}  // namespace ftplan

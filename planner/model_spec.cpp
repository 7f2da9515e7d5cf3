#include "planner/model_spec.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "planner/data_paths.h"
#include "planner/errors.h"
#include "planner/format.h"
#include "planner/json_fields.h"
#include "planner/model_family.h"

namespace ftplan {
namespace {

// Architecture keys every family reads.
const std::vector<std::string> kCommonKeys{"vocab_size",          "hidden_size",       "intermediate_size",
                                           "num_hidden_layers",   "num_attention_heads", "num_key_value_heads",
                                           "head_dim",            "max_position_embeddings", "tie_word_embeddings",
                                           "rms_norm_eps",        "rope_theta",        "rope_scaling",
                                           "rope_parameters",     "attention_dropout", "quantization_config"};

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

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
  // YaRN (transformers modeling_rope_utils.py _compute_yarn_parameters): beta_fast / beta_slow default 32 / 1,
  // attention_factor 0.1 ln(factor) + 1 when absent, truncate true when absent.
  scaling.beta_fast = read_number_or(rope, "beta_fast", 32.0, where, 1e-6, 1e6);
  scaling.beta_slow = read_number_or(rope, "beta_slow", 1.0, where, 1e-6, 1e6);
  scaling.attention_factor = read_number_or(rope, "attention_factor", 0.0, where, 0.0, 1e6);
  scaling.truncate = read_bool_or(rope, "truncate", true, where);
  scaling.mscale = read_number_or(rope, "mscale", 0.0, where, 0.0, 1e6);
  scaling.mscale_all_dim = read_number_or(rope, "mscale_all_dim", 0.0, where, 0.0, 1e6);
  return scaling;
}

// Experts and MLA first (they have their own message), then every key that is neither read by every
// family, nor metadata, nor in the family's row: all of them named at once.
void check_keys(const nlohmann::json& c, const ModelFamily& f, const std::string& where, bool decoder = true) {
  for (auto it = c.begin(); it != c.end(); ++it)
    if (!f.moe.active() && !f.mla && is_mixture_or_mla_key(it.key()) && !it->is_null() &&
        !(it->is_number() && it->get<double>() == 0))
      fail_input(where + ": " + it.key() + ": experts and latent attention are not supported on model_type '" +
                 f.model_type + "', a dense family (they are read for mixtral, qwen2_moe, qwen3_moe, gpt_oss, "
                 "deepseek_v2, deepseek_v3)");
  std::string unknown;
  for (auto it = c.begin(); it != c.end(); ++it) {
    const std::string& k = it.key();
    const bool common = decoder ? contains(kCommonKeys, k) : k == "quantization_config";
    if (common || is_metadata_key(k) || contains(f.keys, k)) continue;
    unknown += (unknown.empty() ? "" : "; ") + where + ": " + k;
  }
  if (!unknown.empty())
    fail_input(unknown + ": not modelled for model_type '" + f.model_type + "' (" + f.source +
               "): a key that may change the architecture is refused rather than ignored");
}

// The config over the family's config-class defaults: a key the config gives (null included, which
// transformers reads as None) wins.
nlohmann::json with_defaults(const nlohmann::json& c, const ModelFamily& f) {
  if (f.defaults.empty()) return c;
  nlohmann::json merged = nlohmann::json::parse(f.defaults);
  for (auto it = c.begin(); it != c.end(); ++it) merged[it.key()] = *it;
  return merged;
}

// A dropout probability other than 0 keeps masks this model does not count.
void require_no_dropout(const nlohmann::json& c, const char* key, const std::string& where) {
  if (read_number_or(c, key, 0.0, where, 0.0, 1.0) != 0.0)
    fail_input(where + ": " + key + ": dropout during training keeps masks that are not modelled (published "
               "configs set 0.0)");
}

// The layers that attend over the window, by the family's rule or the config's layer_types.
void read_sliding_window(const nlohmann::json& c, const ModelFamily& f, const std::string& where, ModelSpec& m) {
  if (f.sliding == SlidingLayers::none) return;
  const int64_t L = m.num_layers;
  int64_t window = read_int_or(c, "sliding_window", 0, where, 1, INT64_C(1) << 30);
  if (has_field(c, "sliding_window_size") && window && read_int(c, "sliding_window_size", where, 1, INT64_C(1) << 30) != window)
    fail_input(where + ": sliding_window_size: differs from sliding_window " + std::to_string(window));
  std::vector<bool> local(static_cast<size_t>(L), false);
  switch (f.sliding) {
    case SlidingLayers::all:
      std::fill(local.begin(), local.end(), true);
      break;
    case SlidingLayers::from_max_window: {
      if (!read_bool_or(c, "use_sliding_window", false, where)) window = 0;
      const int64_t first = read_int_or(c, "max_window_layers", f.default_max_window_layers, where, 0, 100'000);
      for (int64_t i = first; i < L; ++i) local[size_t(i)] = true;
      break;
    }
    case SlidingLayers::every_other:
      for (int64_t i = 0; i < L; ++i) local[size_t(i)] = i % 2 == 0;
      break;
    case SlidingLayers::pattern: {
      const int64_t p = read_int_or(c, "sliding_window_pattern", 6, where, 1, 100'000);
      for (int64_t i = 0; i < L; ++i) local[size_t(i)] = (i + 1) % p != 0;
      break;
    }
    case SlidingLayers::none: break;
  }
  if (has_field(c, "layer_types")) {
    const auto& types = c.at("layer_types");
    if (!types.is_array() || static_cast<int64_t>(types.size()) != L)
      fail_input(where + ": layer_types: expected a list of " + std::to_string(L) + " layer types");
    for (int64_t i = 0; i < L; ++i) {
      const auto& t = types.at(size_t(i));
      const std::string type = t.is_string() ? t.get<std::string>() : std::string();
      if (type == "sliding_attention") local[size_t(i)] = true;
      else if (type == "full_attention") local[size_t(i)] = false;
      else fail_input(where + ": layer_types: " + t.dump() + " is not sliding_attention or full_attention");
    }
  }
  if (window == 0 || std::none_of(local.begin(), local.end(), [](bool b) { return b; })) return;
  m.sliding_window = window;
  m.sliding_layers = local;
}

// A list of layer indices (mlp_only_layers), each in [0, layers).
std::vector<int64_t> read_layer_list(const nlohmann::json& c, const char* key, int64_t layers, const std::string& where) {
  std::vector<int64_t> out;
  if (!has_field(c, key)) return out;
  const auto& v = c.at(key);
  if (!v.is_array()) fail_input(where + ": " + key + ": expected a list of layer indices, got " + v.dump());
  for (const auto& x : v) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= layers)
      fail_input(where + ": " + key + ": " + x.dump() + " is not a layer index in [0, " + std::to_string(layers) + ")");
    out.push_back(x.get<int64_t>());
  }
  return out;
}

// DeepSeek's router: how scores are made and the top-k chosen (DeepseekV2Config / DeepseekV3Config keys;
// transformers models/deepseek_v2/configuration_deepseek_v2.py, models/deepseek_v3/configuration_deepseek_v3.py:
// V2 defaults topk_method "greedy", routed_scaling_factor 1.0, scoring_func "softmax"; V3 "noaux_tc", n_group 8,
// topk_group 4, routed_scaling_factor 2.5, sigmoid scores; the family row's `defaults` carry V3's).
void read_deepseek_router(const nlohmann::json& c, const ModelFamily& f, const std::string& where, MoeSpec& e) {
  const bool v3 = f.moe.router_score_bias;
  e.topk_method = read_string_or(c, "topk_method", v3 ? "noaux_tc" : "greedy", where);
  if (e.topk_method != "greedy" && e.topk_method != "group_limited_greedy" && e.topk_method != "noaux_tc")
    fail_input(where + ": topk_method: '" + e.topk_method + "' is not one of greedy, group_limited_greedy, noaux_tc");
  e.scoring_func = read_string_or(c, "scoring_func", v3 ? "sigmoid" : "softmax", where);
  if (e.scoring_func != "softmax" && e.scoring_func != "sigmoid")
    fail_input(where + ": scoring_func: '" + e.scoring_func + "' is not softmax or sigmoid");
  e.routed_scaling_factor = read_number_or(c, "routed_scaling_factor", v3 ? 2.5 : 1.0, where, 1e-9, 1e9);
  if (e.topk_method != "greedy") {  // n_group / topk_group are read by the group-limited methods only
    e.n_group = read_int_or(c, "n_group", v3 ? 8 : 1, where, 1, 1'000'000);
    e.topk_group = read_int_or(c, "topk_group", v3 ? 4 : 1, where, 1, 1'000'000);
    if (e.num_experts % e.n_group != 0)
      fail_input(where + ": n_group: " + std::to_string(e.n_group) + " does not divide " + f.moe.experts_key + " " +
                 std::to_string(e.num_experts));
    if (e.topk_group > e.n_group)
      fail_input(where + ": topk_group: " + std::to_string(e.topk_group) + " exceeds n_group " + std::to_string(e.n_group));
    if (e.top_k > e.topk_group * (e.num_experts / e.n_group))
      fail_input(where + ": num_experts_per_tok: " + std::to_string(e.top_k) + " exceeds the experts of topk_group (" +
                 std::to_string(e.topk_group) + ") groups of " + std::to_string(e.num_experts / e.n_group));
    if (e.topk_method == "noaux_tc" && e.num_experts / e.n_group < 2)
      fail_input(where + ": n_group: noaux_tc ranks groups by their top-2 scores, so a group needs 2 experts (" +
                 std::to_string(e.num_experts) + " / " + std::to_string(e.n_group) + ")");
  }
}

// The experts of a MoE family (its MoeFamily row) and which layers hold them.
void read_moe(const nlohmann::json& c, const ModelFamily& f, const std::string& where, ModelSpec& m) {
  const MoeFamily& row = f.moe;
  MoeSpec& e = m.moe;
  e.num_experts = read_int(c, row.experts_key.c_str(), where, 1, 1'000'000);
  e.top_k = read_int(c, "num_experts_per_tok", where, 1, 1'000'000);
  if (e.top_k > e.num_experts)
    fail_input(where + ": num_experts_per_tok: " + std::to_string(e.top_k) + " exceeds " + row.experts_key + " " +
               std::to_string(e.num_experts));
  if (has_field(c, "experts_per_token") && read_int(c, "experts_per_token", where, 1, 1'000'000) != e.top_k)
    fail_input(where + ": experts_per_token: differs from num_experts_per_tok " + std::to_string(e.top_k));
  e.expert_intermediate_size = read_int(c, row.expert_size_key.c_str(), where, 1, 10'000'000);
  if (row.shared_key == "shared_expert_intermediate_size")
    e.shared_intermediate_size = read_int_or(c, "shared_expert_intermediate_size", 0, where, 0, 10'000'000);
  else if (row.shared_key == "n_shared_experts")  // DeepSeek: one MLP of n_shared_experts x moe_intermediate_size
    e.shared_intermediate_size = read_int_or(c, "n_shared_experts", 0, where, 0, 1024) * e.expert_intermediate_size;
  e.shared_expert_gate = row.shared_expert_gate && e.shared_intermediate_size > 0;
  e.router_name = row.router_name;
  e.module = row.module;
  if (e.shared_intermediate_size > 0) e.shared_module = row.shared_module;
  e.router_module = row.router_module;
  e.router_bias = row.router_bias;
  e.router_score_bias = row.router_score_bias;
  e.expert_bias = row.expert_bias;
  e.fused_expert_params = row.fused_expert_params;
  e.expert_names = row.expert_names;
  e.softmax_after_topk = row.softmax_after_topk;
  // gpt-oss: GptOssConfig.swiglu_limit (default 7.0), the clamp Mxfp4GptOssExperts reads (transformers
  // integrations/mxfp4.py @ 93a1c400, getattr(config, "swiglu_limit", 7.0)); GptOssExperts at 6edf5b31 hard-codes
  // 7.0, the same for every published config.
  if (row.clamped_glu) e.swiglu_limit = read_number_or(c, "swiglu_limit", 7.0, where, 1e-6, 1e6);
  e.aux_loss_coef = read_number_or(c, row.aux_coef_key.c_str(), 0.0, where, 0.0, 1e6);
  e.output_router_logits = read_bool_or(c, "output_router_logits", false, where);
  e.norm_topk_prob = contains(f.keys, "norm_topk_prob") ? read_bool_or(c, "norm_topk_prob", row.norm_topk_default, where)
                                                         : row.norm_topk_default;
  if (contains(f.keys, "topk_method")) read_deepseek_router(c, f, where, e);
  if (read_number_or(c, "router_jitter_noise", 0.0, where, 0.0, 1e6) != 0.0)
    fail_input(where + ": router_jitter_noise: multiplicative router noise in training is not modelled (published "
               "configs set 0.0)");
  const int64_t L = m.num_layers;
  e.moe_layers.assign(static_cast<size_t>(L), true);
  if (row.layers == MoeLayers::sparse_step) {
    const int64_t step = read_int_or(c, "decoder_sparse_step", 1, where, 1, 100'000);
    const std::vector<int64_t> dense = read_layer_list(c, "mlp_only_layers", L, where);
    for (int64_t i = 0; i < L; ++i)
      e.moe_layers[size_t(i)] = std::find(dense.begin(), dense.end(), i) == dense.end() && (i + 1) % step == 0;
  } else if (row.layers == MoeLayers::first_k_dense) {
    const int64_t first = read_int_or(c, "first_k_dense_replace", 0, where, 0, L);
    const int64_t freq = read_int_or(c, "moe_layer_freq", 1, where, 1, 100'000);
    for (int64_t i = 0; i < L; ++i) e.moe_layers[size_t(i)] = i >= first && i % freq == 0;
  }
  if (e.num_moe_layers() == 0)
    fail_input(where + ": " + row.experts_key + ": no layer holds the experts (check decoder_sparse_step, "
               "mlp_only_layers, first_k_dense_replace, moe_layer_freq)");
}

// Multi-head latent attention (DeepSeek): the ranks and per-head dims.
void read_mla(const nlohmann::json& c, const std::string& where, ModelSpec& m) {
  m.mla.kv_lora_rank = read_int(c, "kv_lora_rank", where, 1, 1'000'000);
  m.mla.q_lora_rank = read_int_or(c, "q_lora_rank", 0, where, 1, 1'000'000);  // null: a plain q_proj
  m.mla.qk_nope_head_dim = read_int(c, "qk_nope_head_dim", where, 1, 100'000);
  m.mla.qk_rope_head_dim = read_int(c, "qk_rope_head_dim", where, 1, 100'000);
  m.mla.rope_interleave = read_bool_or(c, "rope_interleave", true, where);  // V3's key; V2 always interleaves
  if (m.mla.qk_rope_head_dim % 2 != 0)
    fail_input(where + ": qk_rope_head_dim: " + std::to_string(m.mla.qk_rope_head_dim) + " is odd (RoPE rotates pairs)");
  m.v_head_dim = read_int(c, "v_head_dim", where, 1, 100'000);
  // Every head has its own decompressed key and value: as many KV heads as query heads (num_key_value_heads
  // is not read by the attention; transformers 5's head_dim is the RoPE part).
  m.head_dim = m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim;
  m.num_kv_heads = m.num_heads;
  if (m.qkv_bias || m.o_bias)
    fail_input(where + ": attention_bias: true on latent attention (q_a_proj, kv_a_proj_with_mqa, o_proj biases) "
               "is not modelled (published configs set false)");
}

// One decoder's architecture from its config object (a model's config, or a wrapper's text_config).
void read_decoder(const nlohmann::json& config, const ModelFamily& f, const std::string& where, ModelSpec& m) {
  check_keys(config, f, where);
  const nlohmann::json c = with_defaults(config, f);
  m.model_type = f.model_type;
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
  m.tie_word_embeddings = read_bool_or(c, "tie_word_embeddings", f.tie_default, where);
  const bool attention_bias = contains(f.keys, "attention_bias") && read_bool_or(c, "attention_bias", false, where);
  if (attention_bias && f.fused_qkv)
    fail_input(where + ": attention_bias: true, but " + f.source + " builds qkv_proj and o_proj without biases");
  m.qkv_bias = attention_bias || f.qkv_bias_always;
  m.o_bias = attention_bias;
  m.mlp_bias = contains(f.keys, "mlp_bias") && read_bool_or(c, "mlp_bias", false, where);
  m.rms_norm_eps = read_number_or(c, "rms_norm_eps", 1e-5, where, 0.0, 1.0);
  if (read_int_or(c, "pretraining_tp", 1, where, 1, 1024) != 1)
    fail_input(where + ": pretraining_tp: above 1 splits every linear into slices in forward: not modelled");
  require_no_dropout(c, "attention_dropout", where);
  if (contains(f.keys, "embd_pdrop")) require_no_dropout(c, "embd_pdrop", where);
  if (contains(f.keys, "resid_pdrop")) require_no_dropout(c, "resid_pdrop", where);
  if (read_bool_or(c, "use_bidirectional_attention", false, where))
    fail_input(where + ": use_bidirectional_attention: true (an embedding model) is not modelled");

  // The family's block.
  m.norm_pre_attention = f.norm_pre_attention;
  m.norm_post_attention = f.norm_post_attention;
  m.norm_pre_mlp = f.norm_pre_mlp;
  m.norm_post_mlp = f.norm_post_mlp;
  m.qk_norm = f.qk_norm;
  m.norm_scale_fp32 = f.norm_scale_fp32;
  m.fused_qkv = f.fused_qkv;
  m.fused_gate_up = f.fused_gate_up;
  m.scaled_embedding = f.scaled_embedding;
  m.hidden_act = read_string_or(c, f.activation_key.c_str(), read_string_or(c, "hidden_act", f.default_activation, where),
                                where);
  m.default_lora_targets = f.default_lora_targets;
  if (f.softcapping) {
    m.attn_logit_softcapping = read_number_or(c, "attn_logit_softcapping", 0.0, where, 0.0, 1e6);
    m.final_logit_softcapping = read_number_or(c, "final_logit_softcapping", 0.0, where, 0.0, 1e6);
  }

  // rope_theta at the top level (transformers < 5) or inside rope_parameters (transformers >= 5).
  m.rope_theta = read_number_or(c, "rope_theta", 10000.0, where, 1e-6, 1e12);
  if (has_field(c, "rope_parameters")) {
    const auto& rp = c.at("rope_parameters");
    m.rope_theta = read_number_or(rp, "rope_theta", m.rope_theta, where + ": rope_parameters", 1e-6, 1e12);
    m.rope_scaling = read_rope_scaling(rp, where + ": rope_parameters");
  }
  if (has_field(c, "rope_scaling")) m.rope_scaling = read_rope_scaling(c.at("rope_scaling"), where + ": rope_scaling");
  if (contains(f.keys, "query_pre_attn_scalar"))
    m.query_pre_attn_scalar = read_number_or(c, "query_pre_attn_scalar", double(m.head_dim), where, 1e-6, 1e9);
  if (contains(f.keys, "rope_local_base_freq"))
    m.rope_local_base_freq = read_number_or(c, "rope_local_base_freq", m.rope_theta, where, 1e-6, 1e12);
  if (contains(f.keys, "partial_rotary_factor"))
    m.partial_rotary_factor = read_number_or(c, "partial_rotary_factor", 1.0, where, 1e-6, 1.0);
  m.norm_cast_after_scale = f.norm_cast_after_scale;
  read_sliding_window(c, f, where, m);
  m.attention_sinks = f.attention_sinks;
  if (f.mla) {
    read_mla(c, where, m);
    m.mla.yarn_softmax_mscale = f.mla_yarn_softmax_mscale;
  }
  if (f.moe.active()) read_moe(c, f, where, m);
}

// A SigLIP vision tower (transformers models/siglip/modeling_siglip.py: SiglipVisionEmbeddings' patch
// Conv2d with bias and position Embedding((image/patch)^2), per layer two LayerNorms with bias,
// q,k,v,out_proj and fc1, fc2 with biases, a post LayerNorm, and, unless vision_use_head is false, the
// attention-pooling head: probe, nn.MultiheadAttention, LayerNorm, MLP) and Gemma 3's projector.
VisionTower read_siglip(const nlohmann::json& v, int64_t text_hidden, const std::string& where) {
  if (!v.is_object()) fail_input(where + ": expected an object");
  static const std::vector<std::string> known{"model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                                              "num_attention_heads", "num_channels", "image_size", "patch_size",
                                              "hidden_act", "layer_norm_eps", "attention_dropout", "vision_use_head"};
  std::string unknown;
  for (auto it = v.begin(); it != v.end(); ++it)
    if (!contains(known, it.key()) && !is_metadata_key(it.key()))
      unknown += (unknown.empty() ? "" : "; ") + where + ": " + it.key();
  if (!unknown.empty()) fail_input(unknown + ": not modelled for the SigLIP vision tower");
  VisionTower t;
  t.model_type = read_string_or(v, "model_type", "siglip_vision_model", where);
  if (t.model_type != "siglip_vision_model")
    fail_input(where + ": model_type: '" + t.model_type + "' is not modelled (siglip_vision_model)");
  // SiglipVisionConfig's defaults.
  const int64_t h = read_int_or(v, "hidden_size", 768, where, 1, 1'000'000);
  const int64_t i = read_int_or(v, "intermediate_size", 3072, where, 1, 10'000'000);
  const int64_t L = read_int_or(v, "num_hidden_layers", 12, where, 1, 100'000);
  const int64_t heads = read_int_or(v, "num_attention_heads", 12, where, 1, 100'000);
  const int64_t C = read_int_or(v, "num_channels", 3, where, 1, 1024);
  const int64_t image = read_int_or(v, "image_size", 224, where, 1, 100'000);
  const int64_t patch = read_int_or(v, "patch_size", 16, where, 1, 100'000);
  require_no_dropout(v, "attention_dropout", where);
  if (h % heads != 0)
    fail_input(where + ": num_attention_heads: " + std::to_string(heads) + " does not divide hidden_size " +
               std::to_string(h));
  const double size = double(C) * patch * patch * h + double(image / patch) * (image / patch) * h +
                     double(L) * (4.0 * h * h + 2.0 * h * i) + 4.0 * h * h + 2.0 * h * i + double(h) * text_hidden;
  if (size > 1e15) fail_input(where + ": hidden_size: the vision tower would have over 1e15 parameters");
  const int64_t patches = (image / patch) * (image / patch);
  const int64_t embeddings = C * patch * patch * h + h + patches * h;
  const int64_t layer = 2 * h + 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h);
  const int64_t head = read_bool_or(v, "vision_use_head", true, where)
                           ? h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (h * i + i) + (i * h + h)
                           : 0;
  t.tower_params = embeddings + L * layer + 2 * h + head;
  t.projector_params = h * text_hidden + h;
  return t;
}

}  // namespace

int64_t ModelSpec::num_sliding_layers() const {
  return sliding_window > 0 ? std::count(sliding_layers.begin(), sliding_layers.end(), true) : 0;
}

ModelSpec model_spec_from_json(const nlohmann::json& c, const std::string& name) {
  const std::string where = name.empty() ? "config" : name;
  if (!c.is_object()) fail_input(where + ": expected a JSON object (a Hugging Face config.json)");
  ModelSpec m;
  m.name = name;
  const std::string model_type = read_string_or(c, "model_type", "llama", where);
  const ModelFamily* f = find_model_family(model_type);
  if (!f) fail_input(where + ": model_type: '" + model_type + "' is not supported (" + model_family_list() + ")");

  if (f->text_config_type.empty()) {
    read_decoder(c, *f, where, m);
  } else {
    // A multimodal wrapper: its own keys, the decoder in text_config, the tower in vision_config.
    check_keys(c, *f, where, false);
    m.wrapper_type = f->model_type;
    m.text_checkpoint_prefix = f->text_checkpoint_prefix;
    const ModelFamily* text = find_model_family(f->text_config_type);
    const nlohmann::json tc = has_field(c, "text_config") ? c.at("text_config") : nlohmann::json::object();
    if (!tc.is_object()) fail_input(where + ": text_config: expected an object");
    const std::string text_type = read_string_or(tc, "model_type", text->model_type, where + ": text_config");
    if (text_type != text->model_type)
      fail_input(where + ": text_config: model_type: '" + text_type + "' (a " + f->model_type + " wraps a " +
                 text->model_type + ")");
    read_decoder(tc, *text, where + ": text_config", m);
    if (has_field(c, "vision_config")) {
      m.vision = read_siglip(c.at("vision_config"), m.hidden_size, where + ": vision_config");
      m.notes.push_back(m.wrapper_type + ": the vision tower (" + m.vision.model_type + ", " +
                        format_count(m.vision.tower_params) + " parameters) and projector (" +
                        format_count(m.vision.projector_params) +
                        ") are counted and held with the embedding; text-only batches: they run no forward, "
                        "LoRA leaves them frozen");
    } else {
      m.notes.push_back(m.wrapper_type + ": no vision_config: the vision tower is left out of the counts");
    }
  }

  if (has_field(c, "quantization_config")) {
    m.quantized = quantized_base_from_json(c.at("quantization_config"), where, m.moe.active());
    for (const auto& lin : block_linears(m))
      if (!m.quantized.experts_only || is_expert_role(lin.role)) m.quantized.modules.push_back(lin.name);
    m.notes.push_back("quantization_config: " + std::string(m.quantized.experts_only ? "the routed experts" : "block linears") +
                      " stored as " + m.quantized.describe() + "; full fine-tuning refused" +
                      (m.quantized.method == "mxfp4"
                           ? " (a run that dequantises on load, as OpenAI's gpt-oss fine-tuning recipe does with "
                             "Mxfp4Config(dequantize=True), is planned from the config without quantization_config)"
                           : ""));
  }
  if (m.moe.active()) {
    const ParamCounts p = count_params(m);
    std::string moe = "mixture of experts: " + std::to_string(m.moe.num_experts) + " experts, top " +
                      std::to_string(m.moe.top_k) + " per token, on " + std::to_string(p.moe_layers) + " of " +
                      std::to_string(m.num_layers) + " layers";
    if (m.moe.shared_intermediate_size > 0)
      moe += ", a shared expert of " + std::to_string(m.moe.shared_intermediate_size);
    moe += "; " + format_count(p.total) + " parameters, " + format_count(p.active) + " active per token";
    m.notes.push_back(moe);
  }
  if (m.attention_sinks)
    m.notes.push_back("attention sinks: one learned logit per head joins every softmax (num_heads parameters); fused "
                      "kernels keep the same tensors");
  if (m.attn_logit_softcapping > 0)
    m.notes.push_back("attention soft-cap " + format_fixed(m.attn_logit_softcapping, 1) +
                      ": eager attention keeps tanh's output (B x heads x S^2) for backward; fused kernels keep none");
  if (m.final_logit_softcapping > 0)
    m.notes.push_back("final logit soft-cap " + format_fixed(m.final_logit_softcapping, 1) +
                      ": the full loss keeps tanh's output (tokens x vocab) for backward");
  if (m.sliding_window > 0)
    m.notes.push_back("sliding window " + std::to_string(m.sliding_window) + " on " +
                      std::to_string(m.num_sliding_layers()) + " of " + std::to_string(m.num_layers) +
                      " layers: fused (flash) attention computes min(S, window) keys per query; eager attention "
                      "computes and keeps the full S x S scores (transformers masks the window)");

  // Reject sizes whose products would overflow 64-bit counts later (bytes of activations too).
  const double h = static_cast<double>(m.hidden_size);
  double per_layer = h * (m.q_dim() + 2.0 * m.kv_dim()) + m.q_dim() * h + 3.0 * h * m.intermediate_size +
                     3.0 * h * double(m.moe.num_experts) * double(m.moe.expert_intermediate_size);
  if (per_layer * m.num_layers + 2.0 * m.vocab_size * h + double(m.vision.total()) > 1e15)
    fail_input(where + ": hidden_size: the model would have over 1e15 parameters");
  return m;
}

ModelSpec load_model(const std::string& name_or_path) {
  const std::string path = resolve_data_file(name_or_path, "configs/models", "--model");
  const bool is_name = name_or_path.find('/') == std::string::npos &&
                       name_or_path.find(".json") == std::string::npos;
  return model_spec_from_json(read_json_file(path), is_name ? name_or_path : path);
}

std::vector<LinearShape> block_linears(const ModelSpec& m) {
  if (!m.moe.active()) return layer_linears(m, false);
  // The representative MoE block (a MoE model's dense layers, if any, are layer_linears(m, false)).
  return layer_linears(m, true);
}

std::vector<LinearShape> layer_linears(const ModelSpec& m, bool moe_layer) {
  const int64_t h = m.hidden_size, i = m.intermediate_size;
  moe_layer = moe_layer && m.moe.active();
  std::vector<LinearShape> out;
  if (m.mla.active()) {
    // Multi-head latent attention (DeepSeek): no biases (attention_bias is refused when true).
    const int64_t q_all = m.num_heads * m.head_dim;
    if (m.mla.q_lora_rank > 0) {
      out.push_back({"q_a_proj", h, m.mla.q_lora_rank, false, LinearRole::attention_in});
      out.push_back({"q_b_proj", m.mla.q_lora_rank, q_all, false, LinearRole::attention_latent});
    } else {
      out.push_back({"q_proj", h, q_all, false, LinearRole::attention_in});
    }
    out.push_back({"kv_a_proj_with_mqa", h, m.mla.kv_lora_rank + m.mla.qk_rope_head_dim, false, LinearRole::attention_in});
    out.push_back({"kv_b_proj", m.mla.kv_lora_rank, m.num_heads * (m.mla.qk_nope_head_dim + m.value_head_dim()), false,
                   LinearRole::attention_latent});
    out.push_back({"o_proj", m.attn_out_dim(), h, false, LinearRole::attention_out});
  } else if (m.fused_qkv) {
    out.push_back({"qkv_proj", h, m.q_dim() + 2 * m.kv_dim(), m.qkv_bias, LinearRole::attention_in});
  } else {
    out.push_back({"q_proj", h, m.q_dim(), m.qkv_bias, LinearRole::attention_in});
    out.push_back({"k_proj", h, m.kv_dim(), m.qkv_bias, LinearRole::attention_in});
    out.push_back({"v_proj", h, m.kv_dim(), m.qkv_bias, LinearRole::attention_in});
  }
  if (!m.mla.active()) out.push_back({"o_proj", m.q_dim(), h, m.o_bias, LinearRole::attention_out});
  if (moe_layer) {
    // The MoE block: the router, every routed expert (instances = num_experts), the shared expert.
    const MoeSpec& e = m.moe;
    const int64_t E = e.num_experts, I = e.expert_intermediate_size;
    out.push_back({e.router_name, h, E, e.router_bias, LinearRole::router, 1, e.router_module});
    const bool module = !e.fused_expert_params;
    if (e.expert_names.size() == 2) {  // a fused gate_up projection (gpt-oss)
      out.push_back({e.expert_names[0], h, 2 * I, e.expert_bias, LinearRole::expert_in, E, module});
      out.push_back({e.expert_names[1], I, h, e.expert_bias, LinearRole::expert_out, E, module});
    } else {
      out.push_back({e.expert_names[0], h, I, e.expert_bias, LinearRole::expert_in, E, module});
      out.push_back({e.expert_names[1], h, I, e.expert_bias, LinearRole::expert_in, E, module});
      out.push_back({e.expert_names[2], I, h, e.expert_bias, LinearRole::expert_out, E, module});
    }
    if (e.shared_intermediate_size > 0) {
      const int64_t s = e.shared_intermediate_size;
      out.push_back({"gate_proj", h, s, m.mlp_bias, LinearRole::mlp_in});
      out.push_back({"up_proj", h, s, m.mlp_bias, LinearRole::mlp_in});
      out.push_back({"down_proj", s, h, m.mlp_bias, LinearRole::mlp_out});
      if (e.shared_expert_gate) out.push_back({"shared_expert_gate", h, 1, false, LinearRole::router});
    }
    return out;
  }
  if (m.fused_gate_up) {
    out.push_back({"gate_up_proj", h, 2 * i, m.mlp_bias, LinearRole::mlp_in});
  } else {
    out.push_back({"gate_proj", h, i, m.mlp_bias, LinearRole::mlp_in});
    out.push_back({"up_proj", h, i, m.mlp_bias, LinearRole::mlp_in});
  }
  out.push_back({"down_proj", i, h, m.mlp_bias, LinearRole::mlp_out});
  return out;
}

std::vector<LinearShape> model_linears(const ModelSpec& m) {
  std::vector<LinearShape> out;
  for (bool moe : {false, true}) {
    if (moe && !m.moe.active()) continue;
    if (!moe && m.moe.active() && m.moe.uniform()) continue;  // no dense block
    for (const auto& lin : layer_linears(m, moe)) out.push_back(lin);
  }
  return out;
}

std::vector<std::string> linear_names(const ModelSpec& m) {
  std::vector<std::string> names;
  for (const auto& lin : model_linears(m))
    if (std::find(names.begin(), names.end(), lin.name) == names.end()) names.push_back(lin.name);
  return names;
}

int64_t MoeSpec::num_moe_layers() const {
  return active() ? std::count(moe_layers.begin(), moe_layers.end(), true) : 0;
}

bool MoeSpec::uniform() const { return !active() || num_moe_layers() == static_cast<int64_t>(moe_layers.size()); }

std::vector<LinearShape> block_linears(const ModelSpec& m, int64_t tp) {
  std::vector<LinearShape> out = block_linears(m);
  if (tp <= 1) return out;
  // KV heads per rank: kv_heads / tp, or one replicated head when there are fewer heads than ranks.
  const int64_t kv_rank = std::max<int64_t>(1, m.num_kv_heads / tp) * m.head_dim;
  const int64_t q_rank = m.q_dim() / tp;
  for (auto& lin : out) {
    const bool column = lin.role == LinearRole::attention_in || lin.role == LinearRole::mlp_in;
    if (!column) {
      lin.in_features = (lin.in_features + tp - 1) / tp;
    } else if (lin.name == "k_proj" || lin.name == "v_proj") {
      lin.out_features = kv_rank;
    } else if (lin.name == "qkv_proj") {
      lin.out_features = q_rank + 2 * kv_rank;
    } else {
      lin.out_features = (lin.out_features + tp - 1) / tp;
    }
  }
  return out;
}

ParamCounts count_params(const ModelSpec& m, int64_t tp) {
  // Tensor parallelism of experts and latent attention is refused (parallelism_problems): whole counts.
  if (tp <= 1 || m.moe.active() || m.mla.active()) return count_params(m);
  ParamCounts p = count_params(m);
  p.attention = p.mlp = 0;
  for (const auto& lin : block_linears(m, tp)) {
    const int64_t n = lin.in_features * lin.out_features + (lin.bias ? lin.out_features : 0);
    const bool is_mlp = lin.role == LinearRole::mlp_in || lin.role == LinearRole::mlp_out;
    (is_mlp ? p.mlp : p.attention) += n;
  }
  // Norms over a whole projection (OLMo 2's q/k norms) follow the projection's split.
  if (m.qk_norm == QkNorm::whole_projection) p.norms = m.block_norms() * m.hidden_size + (m.q_dim() + m.kv_dim()) / tp;
  p.per_layer = p.attention + p.mlp + p.norms;
  const int64_t vocab_rank = (m.vocab_size + tp - 1) / tp;
  p.embedding = vocab_rank * m.hidden_size;
  p.lm_head = m.tie_word_embeddings ? 0 : vocab_rank * m.hidden_size;
  p.total = p.embedding + m.num_layers * p.per_layer + p.final_norm + p.lm_head + p.vision;
  return p;
}

ParamCounts count_params(const ModelSpec& m) {
  ParamCounts p;
  const int64_t h = m.hidden_size;
  for (const auto& lin : block_linears(m)) {
    const int64_t n = lin.instances * (lin.in_features * lin.out_features + (lin.bias ? lin.out_features : 0));
    (is_mlp_role(lin.role) ? p.mlp : p.attention) += n;
    if (lin.role == LinearRole::router && lin.name == m.moe.router_name) p.router += n;
    if (is_expert_role(lin.role)) p.one_expert += n / lin.instances;
  }
  if (m.attention_sinks) p.attention += m.num_heads;  // gpt-oss: sinks [num_attention_heads]
  if (m.moe.router_score_bias) {  // e_score_correction_bias: a buffer
    p.router += m.moe.num_experts, p.mlp += m.moe.num_experts;
    p.buffers = m.moe.num_experts;
  }
  p.experts = m.moe.num_experts * p.one_expert;
  p.norms = m.block_norms() * h;
  if (m.qk_norm == QkNorm::per_head) p.norms += 2 * m.head_dim;
  if (m.qk_norm == QkNorm::whole_projection) p.norms += m.q_dim() + m.kv_dim();
  if (m.mla.active()) p.norms += m.mla.kv_lora_rank + m.mla.q_lora_rank;  // kv_a_layernorm, q_a_layernorm
  p.per_layer = p.attention + p.mlp + p.norms;
  p.dense_per_layer = p.per_layer;
  p.moe_layers = m.moe.num_moe_layers();
  if (m.moe.active() && !m.moe.uniform()) {  // the dense blocks: the same attention and norms, the dense MLP
    int64_t dense_mlp = 0;
    for (const auto& lin : layer_linears(m, false))
      if (is_mlp_role(lin.role)) dense_mlp += lin.in_features * lin.out_features + (lin.bias ? lin.out_features : 0);
    p.dense_per_layer = p.attention + dense_mlp + p.norms;
  }
  p.blocks = m.moe.active() ? p.moe_layers * p.per_layer + (m.num_layers - p.moe_layers) * p.dense_per_layer
                            : m.num_layers * p.per_layer;
  p.embedding = m.vocab_size * h;
  p.final_norm = h;
  p.lm_head = m.tie_word_embeddings ? 0 : m.vocab_size * h;
  p.vision = m.vision.total();
  p.total = p.embedding + p.blocks + p.final_norm + p.lm_head + p.vision;
  p.active = p.total - p.moe_layers * (m.moe.num_experts - m.moe.top_k) * p.one_expert;
  return p;
}

}  // namespace ftplan

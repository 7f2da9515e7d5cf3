// Model families as data: one row per Hugging Face model_type, saying what its decoder block has
// beyond the Llama block and which config.json keys it reads. model_spec_from_json consults the row
// and fills the ModelSpec fields; the counting, activation and FLOP code read those fields, so a new
// family is a new row here (and, only when it brings a new kind of difference, a new spec field).
//
// Each row cites the transformers file it was read from. The rows:
//   llama        the reference block: pre-attention and pre-MLP RMSNorm, q,k,v,o, SwiGLU gate/up/down
//   mistral      llama + sliding_window on every layer (null: none)
//   qwen2        llama + q,k,v biases always; sliding window on layers >= max_window_layers when
//                use_sliding_window
//   qwen3        llama + per-head q/k RMSNorms (RMSNorm(head_dim)); Qwen2's window rule
//   gemma2       four norms per block (pre/post attention, pre/post MLP), GeGLU, embeddings scaled by
//                sqrt(hidden) (no parameters), tied head by default, attention and final logit soft-capping,
//                sliding window on even layers (layer_idx % 2 == 0), RMSNorm scale (1 + w) in fp32
//   gemma3_text  gemma2's block + per-head q/k norms; no soft-capping by default; local layers all but
//                every sliding_window_pattern-th; transformers' Gemma3TextConfig defaults for omitted keys
//   gemma3       the multimodal wrapper: text_config (a gemma3_text) + vision_config (SigLIP) + projector
//   phi3         llama with fused qkv_proj and gate_up_proj (the LoRA target names differ); sliding_window
//                on every layer; Phi-3 and Phi-4 both
//   olmo2        no pre-norms: RMSNorm after attention and after the MLP; q/k RMSNorms over the whole
//                projection (RMSNorm(heads·head_dim), RMSNorm(kv_heads·head_dim))
// Mixtures of experts (MoeFamily: which keys give the experts, what a MoE block holds):
//   mixtral      mistral's attention; every MLP a router (gate) over num_local_experts experts w1, w3, w2 of
//                intermediate_size, num_experts_per_tok per token
//   qwen2_moe    qwen2's attention; experts of moe_intermediate_size + a shared expert of
//                shared_expert_intermediate_size scaled by sigmoid(shared_expert_gate); MoE on layers with
//                (i + 1) % decoder_sparse_step == 0 outside mlp_only_layers, the dense MLP elsewhere
//   qwen3_moe    qwen3's attention (q/k norms); experts of moe_intermediate_size, no shared expert
//   gpt_oss      q,k,v,o with biases, a sink logit per head, sliding window on layer_types; a router with a
//                bias; experts as fused 3D parameters gate_up_proj/down_proj with biases (mxfp4 in the checkpoint)
//   deepseek_v2  multi-head latent attention; n_routed_experts of moe_intermediate_size + n_shared_experts
//                shared ones (one MLP of n_shared x moe_intermediate_size); dense MLP on layers before
//                first_k_dense_replace and off moe_layer_freq
//   deepseek_v3  deepseek_v2 + the router's score-correction bias (topk_method noaux_tc)
#pragma once

#include <string>
#include <vector>

#include "planner/model_spec.h"

namespace ftplan {

// Which layers attend over a sliding window when the config gives one (a layer_types list, where
// the config has one, overrides the rule: "sliding_attention" / "full_attention" per layer).
enum class SlidingLayers {
  none,             // the family has no window: a sliding_window key is refused as unknown
  all,              // every layer (Mistral, Phi-3); sliding_window null = none
  from_max_window,  // layers >= max_window_layers, when use_sliding_window is true (Qwen2, Qwen3)
  every_other,      // layers 0, 2, 4, ...: is_sliding = not bool(layer_idx % 2) (Gemma 2)
  pattern,          // all but every sliding_window_pattern-th: bool((layer_idx + 1) % pattern) (Gemma 3)
};

// Which layers hold the MoE block (the others the dense MLP of intermediate_size).
enum class MoeLayers {
  all,            // every layer (Mixtral, gpt-oss)
  sparse_step,    // (i + 1) % decoder_sparse_step == 0 and i not in mlp_only_layers (Qwen2-MoE, Qwen3-MoE)
  first_k_dense,  // i >= first_k_dense_replace and i % moe_layer_freq == 0 (DeepSeek-V2/V3)
};

// A mixture-of-experts family: the keys that give its experts and what its MoE block holds
// (planner/model_spec.h MoeSpec). experts_key empty: a dense family.
struct MoeFamily {
  std::string experts_key;          // "num_local_experts" (Mixtral, gpt-oss), "num_experts" (Qwen-MoE), "n_routed_experts"
  std::string expert_size_key = "moe_intermediate_size";  // or "intermediate_size" (Mixtral, gpt-oss)
  std::string shared_key;           // "shared_expert_intermediate_size" (its width), "n_shared_experts" (count x expert width)
  bool shared_expert_gate = false;  // Qwen2-MoE's sigmoid gate on the shared expert
  MoeLayers layers = MoeLayers::all;
  std::vector<std::string> expert_names{"gate_proj", "up_proj", "down_proj"};  // Mixtral: w1, w3, w2; gpt-oss: gate_up_proj, down_proj
  std::string router_name = "gate"; // gpt-oss: "router"
  std::string module = "mlp";       // the MoE block's module in the decoder layer: "mlp", "block_sparse_moe" (Mixtral)
  std::string shared_module;        // the shared expert's module in the MoE block: "shared_expert" (Qwen2-MoE),
                                    // "shared_experts" (DeepSeek); "" without one
  bool router_module = true;        // the router is an nn.Linear (false: DeepSeek's MoEGate, gpt-oss's router)
  bool router_bias = false;         // gpt-oss
  bool router_score_bias = false;   // DeepSeek-V3: e_score_correction_bias
  bool expert_bias = false;         // gpt-oss
  bool fused_expert_params = false; // gpt-oss: experts are 3D nn.Parameters, not nn.Linear
  bool softmax_after_topk = false;  // gpt-oss: softmax over the top-k logits (MoeSpec::softmax_after_topk)
  bool clamped_glu = false;         // gpt-oss: reads swiglu_limit (MoeSpec::swiglu_limit)
  std::string aux_coef_key = "router_aux_loss_coef";  // DeepSeek: aux_loss_alpha
  bool norm_topk_default = false;   // norm_topk_prob when the config omits it (or has no such key): Mixtral
                                    // renormalises always (true), Qwen2/3-MoE's config classes default to false
  bool active() const { return !experts_key.empty(); }
};

struct ModelFamily {
  std::string model_type;            // the config's model_type, e.g. "gemma2"
  std::string source;                // where the row is read from, e.g. "transformers models/gemma2/modeling_gemma2.py"
  bool norm_pre_attention = true;    // ModelSpec's fields of the same names
  bool norm_post_attention = false;
  bool norm_pre_mlp = true;
  bool norm_post_mlp = false;
  QkNorm qk_norm = QkNorm::none;
  bool norm_scale_fp32 = false;
  bool norm_cast_after_scale = false;  // OLMo 2: weight·x in fp32, then the cast
  bool fused_qkv = false;
  bool fused_gate_up = false;
  std::string activation_key = "hidden_act";  // Gemma reads hidden_activation (then hidden_act)
  std::string default_activation = "silu";    // "silu" (SwiGLU) or "gelu_pytorch_tanh" (GeGLU)
  bool qkv_bias_always = false;      // Qwen2's q,k,v carry biases whatever the config says
  bool tie_default = false;          // tie_word_embeddings when the config leaves it out (Gemma: true)
  bool scaled_embedding = false;
  bool softcapping = false;          // reads attn_logit_softcapping and final_logit_softcapping
  SlidingLayers sliding = SlidingLayers::none;
  MoeFamily moe;                     // mixture of experts; moe.active() false for dense families
  bool mla = false;                  // multi-head latent attention (DeepSeek): q_lora_rank, kv_lora_rank, qk_*_head_dim, v_head_dim
  bool mla_yarn_softmax_mscale = false;  // DeepSeek-V3: YaRN also scales the softmax by get_mscale(factor, mscale_all_dim)^2
  bool attention_sinks = false;      // gpt-oss: a learned sink logit per head
  int64_t default_max_window_layers = 0;  // Qwen2/3: the config class's default, 28
  std::vector<std::string> default_lora_targets;  // PEFT's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
                                                  // (peft src/peft/utils/constants.py); empty: none
  std::vector<std::string> keys;     // architecture keys read or knowingly ignored beyond the common ones
  std::string defaults;              // JSON: transformers' config-class defaults for keys a published config
                                     // omits (applied under the config), or ""
  std::string text_config_type;      // a multimodal wrapper: the model_type of its text_config, else ""
  std::string text_checkpoint_prefix;  // a wrapper: its checkpoints' prefix of the decoder's names, e.g. "language_model."
  bool executor_runs = false;        // ftexec builds and trains this family (llama, mistral, qwen2, qwen3, gemma2,
                                     // gemma3_text, phi3, olmo2, mixtral, qwen2_moe, qwen3_moe, gpt_oss, deepseek_v2,
                                     // deepseek_v3)
};

// The row for a model_type, or nullptr.
const ModelFamily* find_model_family(const std::string& model_type);

// Every model_type with a row, in table order, e.g. "llama, mistral, qwen2, ..." (for messages).
std::string model_family_list();
// The model_types ftexec trains (executor_runs), e.g. "llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe".
std::string executor_family_list();

// Keys every config may carry that describe no architecture (names, token ids, dtypes, generation
// defaults): ignored. True for `key`.
bool is_metadata_key(const std::string& key);

// Keys of experts and latent attention: on a dense family's config they are refused with a message
// naming the key and the families that read them, before the unknown-key check.
bool is_mixture_or_mla_key(const std::string& key);

}  // namespace ftplan

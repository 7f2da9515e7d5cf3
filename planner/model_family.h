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

struct ModelFamily {
  std::string model_type;            // the config's model_type, e.g. "gemma2"
  std::string source;                // where the row is read from, e.g. "transformers models/gemma2/modeling_gemma2.py"
  bool norm_pre_attention = true;    // ModelSpec's fields of the same names
  bool norm_post_attention = false;
  bool norm_pre_mlp = true;
  bool norm_post_mlp = false;
  QkNorm qk_norm = QkNorm::none;
  bool norm_scale_fp32 = false;
  bool fused_qkv = false;
  bool fused_gate_up = false;
  std::string activation_key = "hidden_act";  // Gemma reads hidden_activation (then hidden_act)
  std::string default_activation = "silu";    // "silu" (SwiGLU) or "gelu_pytorch_tanh" (GeGLU)
  bool qkv_bias_always = false;      // Qwen2's q,k,v carry biases whatever the config says
  bool tie_default = false;          // tie_word_embeddings when the config leaves it out (Gemma: true)
  bool scaled_embedding = false;
  bool softcapping = false;          // reads attn_logit_softcapping and final_logit_softcapping
  SlidingLayers sliding = SlidingLayers::none;
  int64_t default_max_window_layers = 0;  // Qwen2/3: the config class's default, 28
  std::vector<std::string> default_lora_targets;  // PEFT's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
                                                  // (peft src/peft/utils/constants.py); empty: none
  std::vector<std::string> keys;     // architecture keys read or knowingly ignored beyond the common ones
  std::string defaults;              // JSON: transformers' config-class defaults for keys a published config
                                     // omits (applied under the config), or ""
  std::string text_config_type;      // a multimodal wrapper: the model_type of its text_config, else ""
  bool executor_runs = false;        // ftexec's model is this block (the Llama block: llama, mistral, qwen2)
};

// The row for a model_type, or nullptr.
const ModelFamily* find_model_family(const std::string& model_type);

// Every model_type with a row, in table order, e.g. "llama, mistral, qwen2, ..." (for messages).
std::string model_family_list();

// Keys every config may carry that describe no architecture (names, token ids, dtypes, generation
// defaults): ignored. True for `key`.
bool is_metadata_key(const std::string& key);

// Keys that would change the architecture in ways these rows do not describe (experts, MLA):
// refused with a message saying so, before the unknown-key check.
bool is_mixture_or_mla_key(const std::string& key);

}  // namespace ftplan

#include "planner/model_family.h"

#include <algorithm>

namespace ftplan {
namespace {

// The Llama block; every row starts from it and says what differs.
ModelFamily llama_block(const std::string& model_type, const std::string& source) {
  ModelFamily f;
  f.model_type = model_type;
  f.source = source;
  f.default_lora_targets = {"q_proj", "v_proj"};
  return f;
}

std::vector<ModelFamily> make_table() {
  std::vector<ModelFamily> t;
  {  // transformers src/transformers/models/llama/modeling_llama.py (LlamaDecoderLayer, LlamaMLP)
    ModelFamily f = llama_block("llama", "transformers models/llama/modeling_llama.py");
    f.keys = {"hidden_act", "attention_bias", "mlp_bias", "pretraining_tp"};
    f.executor_runs = true;
    t.push_back(f);
  }
  {  // models/mistral/modeling_mistral.py: MistralAttention passes config.sliding_window on every layer
    ModelFamily f = llama_block("mistral", "transformers models/mistral/modeling_mistral.py");
    f.keys = {"hidden_act", "sliding_window"};
    f.sliding = SlidingLayers::all;
    f.executor_runs = true;
    t.push_back(f);
  }
  {  // models/qwen2/modeling_qwen2.py: q,k,v nn.Linear(bias=True), o_proj bias=False; configuration_qwen2.py:
     // sliding_window only if use_sliding_window, on layers i >= max_window_layers (default 28)
    ModelFamily f = llama_block("qwen2", "transformers models/qwen2/modeling_qwen2.py, configuration_qwen2.py");
    f.keys = {"hidden_act", "use_sliding_window", "sliding_window", "max_window_layers", "layer_types"};
    f.qkv_bias_always = true;
    f.sliding = SlidingLayers::from_max_window;
    f.default_max_window_layers = 28;
    f.executor_runs = true;
    t.push_back(f);
  }
  {  // models/qwen3/modeling_qwen3.py: Qwen3Attention.q_norm/k_norm = Qwen3RMSNorm(head_dim), applied per head
    ModelFamily f = llama_block("qwen3", "transformers models/qwen3/modeling_qwen3.py, configuration_qwen3.py");
    f.keys = {"hidden_act", "attention_bias", "use_sliding_window", "sliding_window", "max_window_layers",
              "layer_types"};
    f.qk_norm = QkNorm::per_head;
    f.sliding = SlidingLayers::from_max_window;
    f.default_max_window_layers = 28;
    t.push_back(f);
  }
  {  // models/gemma2/modeling_gemma2.py: Gemma2DecoderLayer has input_, post_attention_, pre_feedforward_ and
     // post_feedforward_layernorm; Gemma2RMSNorm computes x·(1 + weight) in fp32; the embedding is scaled by
     // sqrt(hidden_size); eager attention soft-caps scores, Gemma2ForCausalLM soft-caps the logits;
     // is_sliding = not bool(layer_idx % 2). configuration_gemma2.py: tie_word_embeddings=True, head_dim=256,
     // sliding_window=4096, final_logit_softcapping=30.0, attn_logit_softcapping=50.0 by default.
    ModelFamily f = llama_block("gemma2", "transformers models/gemma2/modeling_gemma2.py, configuration_gemma2.py");
    f.keys = {"hidden_act", "hidden_activation", "attention_bias", "query_pre_attn_scalar", "sliding_window",
              "sliding_window_size", "attn_logit_softcapping", "final_logit_softcapping", "cache_implementation",
              "layer_types"};
    f.norm_post_attention = f.norm_post_mlp = true;
    f.norm_scale_fp32 = true;
    f.activation_key = "hidden_activation";
    f.default_activation = "gelu_pytorch_tanh";
    f.tie_default = true;
    f.scaled_embedding = true;
    f.softcapping = true;
    f.sliding = SlidingLayers::every_other;
    f.defaults = R"({"head_dim": 256, "sliding_window": 4096, "final_logit_softcapping": 30.0,
                     "attn_logit_softcapping": 50.0})";
    t.push_back(f);
  }
  {  // models/gemma3/modeling_gemma3.py: Gemma 2's block + Gemma3Attention.q_norm/k_norm = Gemma3RMSNorm(head_dim);
     // is_sliding = bool((layer_idx + 1) % sliding_window_pattern). configuration_gemma3.py (Gemma3TextConfig at
     // transformers 008f5c8c) gives the defaults below, which the published gemma-3-4b config relies on.
    ModelFamily f = llama_block("gemma3_text", "transformers models/gemma3/modeling_gemma3.py, configuration_gemma3.py");
    f.keys = {"hidden_act", "hidden_activation", "attention_bias", "query_pre_attn_scalar", "sliding_window",
              "sliding_window_pattern", "layer_types", "rope_local_base_freq", "attn_logit_softcapping",
              "final_logit_softcapping", "cache_implementation", "use_bidirectional_attention"};
    f.norm_post_attention = f.norm_post_mlp = true;
    f.norm_scale_fp32 = true;
    f.qk_norm = QkNorm::per_head;
    f.activation_key = "hidden_activation";
    f.default_activation = "gelu_pytorch_tanh";
    f.tie_default = true;
    f.scaled_embedding = true;
    f.softcapping = true;
    f.sliding = SlidingLayers::pattern;
    f.defaults = R"({"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                     "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                     "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                     "sliding_window": 4096, "sliding_window_pattern": 6})";
    t.push_back(f);
  }
  {  // models/gemma3/modeling_gemma3.py Gemma3ForConditionalGeneration: a Gemma3TextModel (text_config), a SigLIP
     // vision tower (vision_config) and Gemma3MultiModalProjector (mm_input_projection_weight [vision hidden,
     // text hidden] + mm_soft_emb_norm RMSNorm(vision hidden)); the lm_head is tied to the text embedding.
    ModelFamily f = llama_block("gemma3", "transformers models/gemma3/modeling_gemma3.py (Gemma3ForConditionalGeneration)");
    f.keys = {"text_config", "vision_config", "mm_tokens_per_image", "boi_token_index", "eoi_token_index",
              "image_token_index", "boi_token_id", "eoi_token_id", "image_token_id"};
    f.text_config_type = "gemma3_text";
    f.default_lora_targets = {"q_proj", "v_proj"};  // PEFT maps gemma3_text; the wrapper's decoder is one
    t.push_back(f);
  }
  {  // models/phi3/modeling_phi3.py: Phi3Attention.qkv_proj = Linear(hidden, (heads + 2·kv_heads)·head_dim, bias=False),
     // o_proj; Phi3MLP.gate_up_proj = Linear(hidden, 2·intermediate, bias=False), down_proj; sliding_window on every
     // layer. PEFT has no default target for phi3. Phi-4 ships as model_type phi3.
    ModelFamily f = llama_block("phi3", "transformers models/phi3/modeling_phi3.py");
    f.keys = {"hidden_act", "attention_bias", "embd_pdrop", "resid_pdrop", "original_max_position_embeddings",
              "sliding_window", "partial_rotary_factor"};
    f.fused_qkv = f.fused_gate_up = true;
    f.sliding = SlidingLayers::all;
    f.default_lora_targets = {};
    t.push_back(f);
  }
  {  // models/olmo2/modeling_olmo2.py: Olmo2DecoderLayer has post_attention_layernorm and post_feedforward_layernorm
     // only (applied to each sublayer's output before the residual add); Olmo2Attention.q_norm =
     // Olmo2RMSNorm(heads·head_dim), k_norm = Olmo2RMSNorm(kv_heads·head_dim), applied before the head reshape.
     // PEFT has no default target for olmo2.
    ModelFamily f = llama_block("olmo2", "transformers models/olmo2/modeling_olmo2.py");
    f.keys = {"hidden_act", "attention_bias"};
    f.norm_pre_attention = f.norm_pre_mlp = false;
    f.norm_post_attention = f.norm_post_mlp = true;
    f.qk_norm = QkNorm::whole_projection;
    f.default_lora_targets = {};
    t.push_back(f);
  }
  return t;
}

const std::vector<ModelFamily>& table() {
  static const std::vector<ModelFamily> t = make_table();
  return t;
}

}  // namespace

const ModelFamily* find_model_family(const std::string& model_type) {
  for (const auto& f : table())
    if (f.model_type == model_type) return &f;
  return nullptr;
}

std::string model_family_list() {
  std::string s;
  for (const auto& f : table()) s += (s.empty() ? "" : ", ") + f.model_type;
  return s;
}

bool is_metadata_key(const std::string& key) {
  // transformers' PretrainedConfig attributes that describe no architecture, and the generation defaults a
  // full config dump carries.
  static const std::vector<std::string> keys{
      "_name_or_path", "architectures", "auto_map", "model_type", "transformers_version", "torch_dtype", "dtype",
      "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
      "initializer_range", "tokenizer_class", "_attn_implementation", "_attn_implementation_autoset",
      "_commit_hash", "id2label", "label2id", "num_labels", "return_dict", "output_attentions",
      "output_hidden_states", "torchscript", "use_bfloat16", "tf_legacy_loss", "pruned_heads", "is_encoder_decoder",
      "is_decoder", "add_cross_attention", "tie_encoder_decoder", "cross_attention_hidden_size",
      "chunk_size_feed_forward", "problem_type", "finetuning_task", "task_specific_params", "prefix", "max_length",
      "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
      "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
      "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
      "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
      "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens", "output_router_logits"};
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

bool is_mixture_or_mla_key(const std::string& key) {
  static const std::vector<std::string> keys{"num_local_experts", "num_experts",  "moe_intermediate_size",
                                             "n_routed_experts",  "q_lora_rank",  "kv_lora_rank",
                                             "num_experts_per_tok", "n_shared_experts"};
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

}  // namespace ftplan

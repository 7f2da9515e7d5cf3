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
    f.executor_runs = true;
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
                     "attn_logit_softcapping": 50.0, "query_pre_attn_scalar": 256})";
    f.executor_runs = true;
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
                     "sliding_window": 4096, "sliding_window_pattern": 6, "query_pre_attn_scalar": 256,
                     "rope_local_base_freq": 10000.0})";
    f.executor_runs = true;
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
    // The published checkpoints (google/gemma-3-4b-it) hold language_model.model.* and vision_tower.*,
    // multi_modal_projector.*: Gemma3ForConditionalGeneration._checkpoint_conversion_mapping maps
    // "^language_model.model" to its model.language_model (modeling_gemma3.py @ 0018aa647bb13801f061e2d1027c326f531b59fb).
    f.text_checkpoint_prefix = "language_model.";
    f.executor_runs = true;  // the text model only: the vision tower runs no forward on text batches
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
    f.executor_runs = true;
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
    f.norm_cast_after_scale = true;  // Olmo2RMSNorm: (self.weight * hidden_states).to(input_dtype)
    f.default_lora_targets = {};
    f.executor_runs = true;
    t.push_back(f);
  }
  {  // models/mixtral/modeling_mixtral.py: MixtralAttention as Mistral's (sliding_window on every layer, null: none);
     // MixtralSparseMoeBlock: gate = nn.Linear(hidden, num_local_experts, bias=False), experts MixtralBlockSparseTop2MLP
     // w1, w3 = Linear(hidden, intermediate_size), w2 = Linear(intermediate_size, hidden), no biases; top
     // num_experts_per_tok of the softmax; router_jitter_noise multiplies the input by noise in training.
    ModelFamily f = llama_block("mixtral", "transformers models/mixtral/modeling_mixtral.py");
    f.keys = {"hidden_act", "sliding_window", "num_local_experts", "num_experts_per_tok", "router_aux_loss_coef",
              "router_jitter_noise"};
    f.sliding = SlidingLayers::all;
    f.moe.experts_key = "num_local_experts";
    f.moe.expert_size_key = "intermediate_size";
    f.moe.expert_names = {"w1", "w3", "w2"};
    f.moe.module = "block_sparse_moe";  // MixtralDecoderLayer.block_sparse_moe (transformers v4; the hub's checkpoints)
    f.moe.norm_topk_default = true;  // MixtralSparseMoeBlock: routing_weights /= routing_weights.sum(dim=-1)
    f.executor_runs = true;          // executor/moe.h (router_jitter_noise > 0 is refused by the reader)
    t.push_back(f);
  }
  {  // models/qwen2_moe/modeling_qwen2_moe.py: Qwen2's attention (q,k,v biases); Qwen2MoeSparseMoeBlock: gate =
     // Linear(hidden, num_experts, bias=False), experts Qwen2MoeMLP(moe_intermediate_size), shared_expert
     // Qwen2MoeMLP(shared_expert_intermediate_size), shared_expert_gate = Linear(hidden, 1, bias=False); a layer is
     // sparse when it is not in mlp_only_layers and (layer_idx + 1) % decoder_sparse_step == 0, else
     // Qwen2MoeMLP(intermediate_size).
    ModelFamily f = llama_block("qwen2_moe", "transformers models/qwen2_moe/modeling_qwen2_moe.py, configuration_qwen2_moe.py");
    f.keys = {"hidden_act", "use_sliding_window", "sliding_window", "max_window_layers", "layer_types", "num_experts",
              "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size", "decoder_sparse_step",
              "mlp_only_layers", "norm_topk_prob", "router_aux_loss_coef"};
    f.qkv_bias_always = true;
    f.sliding = SlidingLayers::from_max_window;
    f.default_max_window_layers = 28;
    f.moe.experts_key = "num_experts";
    f.moe.shared_key = "shared_expert_intermediate_size";
    f.moe.shared_expert_gate = true;
    f.moe.shared_module = "shared_expert";
    f.moe.layers = MoeLayers::sparse_step;
    f.executor_runs = true;  // executor/moe.h: the routed experts stacked, the shared expert as the block's gate/up/down
    t.push_back(f);
  }
  {  // models/qwen3_moe/modeling_qwen3_moe.py: Qwen3's attention (per-head q/k RMSNorms); Qwen3MoeSparseMoeBlock:
     // gate = Linear(hidden, num_experts, bias=False), experts Qwen3MoeMLP(moe_intermediate_size), no shared expert;
     // Qwen2-MoE's rule for sparse layers (decoder_sparse_step, mlp_only_layers).
    ModelFamily f = llama_block("qwen3_moe", "transformers models/qwen3_moe/modeling_qwen3_moe.py, configuration_qwen3_moe.py");
    f.keys = {"hidden_act", "attention_bias", "use_sliding_window", "sliding_window", "max_window_layers", "layer_types",
              "num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step", "mlp_only_layers",
              "norm_topk_prob", "router_aux_loss_coef"};
    f.qk_norm = QkNorm::per_head;
    f.sliding = SlidingLayers::from_max_window;
    f.default_max_window_layers = 28;
    f.moe.experts_key = "num_experts";
    f.moe.layers = MoeLayers::sparse_step;
    f.executor_runs = true;  // executor/moe.h: the router and the experts as stacked [E, ...] tensors
    t.push_back(f);
  }
  {  // models/gpt_oss/modeling_gpt_oss.py: GptOssAttention q,k,v,o with bias=config.attention_bias and sinks =
     // Parameter(num_attention_heads); sliding window on layer_types' "sliding_attention" layers (the config's default
     // alternates, even layers local); GptOssTopKRouter weight [num_local_experts, hidden] + bias; GptOssExperts as
     // 3D parameters gate_up_proj [E, hidden, 2 x intermediate_size] + gate_up_proj_bias, down_proj
     // [E, intermediate_size, hidden] + down_proj_bias; the checkpoint stores the experts in mxfp4
     // (quantization_config). PEFT has no default target for gpt_oss.
    ModelFamily f = llama_block("gpt_oss", "transformers models/gpt_oss/modeling_gpt_oss.py, configuration_gpt_oss.py");
    f.keys = {"hidden_act", "attention_bias", "num_local_experts", "num_experts_per_tok", "experts_per_token",
              "sliding_window", "layer_types", "swiglu_limit", "initial_context_length", "router_aux_loss_coef"};
    f.sliding = SlidingLayers::every_other;
    f.attention_sinks = true;
    f.default_lora_targets = {};
    f.moe.experts_key = "num_local_experts";
    f.moe.expert_size_key = "intermediate_size";
    f.moe.expert_names = {"gate_up_proj", "down_proj"};
    f.moe.router_name = "router";
    f.moe.router_module = false;
    f.moe.router_bias = true;
    f.moe.expert_bias = true;
    f.moe.fused_expert_params = true;
    f.moe.softmax_after_topk = true;  // GptOssTopKRouter: topk(logits), softmax over the k values
    f.moe.clamped_glu = true;         // GptOssExperts: clamp, gate * sigmoid(1.702 gate), (up + 1) * glu
    f.norm_cast_after_scale = true;   // GptOssRMSNorm: (weight * x_fp32 * rstd).to(input_dtype)
    f.executor_runs = true;           // executor/moe.h (fused experts, the clamped GLU), llama_model.cpp (sinks, YaRN)
    t.push_back(f);
  }
  {  // models/deepseek_v2/modeling_deepseek_v2.py (the hub's modeling_deepseek.py alike): DeepseekV2Attention, multi-head
     // latent attention: q_proj = Linear(hidden, heads x (qk_nope + qk_rope)) when q_lora_rank is null, else q_a_proj
     // (hidden -> q_lora_rank), q_a_layernorm, q_b_proj; kv_a_proj_with_mqa (hidden -> kv_lora_rank + qk_rope),
     // kv_a_layernorm(kv_lora_rank), kv_b_proj (kv_lora_rank -> heads x (qk_nope + v_head_dim)), o_proj
     // (heads x v_head_dim -> hidden); DeepseekV2MoE: MoEGate weight [n_routed_experts, hidden] (a bare parameter),
     // experts DeepseekV2MLP(moe_intermediate_size), shared_experts DeepseekV2MLP(moe_intermediate_size x
     // n_shared_experts); MoE on layers >= first_k_dense_replace with layer_idx % moe_layer_freq == 0, the dense MLP
     // (intermediate_size) elsewhere. PEFT has no default target for deepseek_v2.
    ModelFamily f = llama_block("deepseek_v2", "transformers models/deepseek_v2/modeling_deepseek_v2.py");
    f.keys = {"hidden_act", "attention_bias", "mlp_bias", "pretraining_tp", "n_routed_experts", "n_shared_experts",
              "num_experts_per_tok", "moe_intermediate_size", "first_k_dense_replace", "moe_layer_freq", "q_lora_rank",
              "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "aux_loss_alpha", "seq_aux",
              "norm_topk_prob", "routed_scaling_factor", "scoring_func", "topk_method", "n_group", "topk_group",
              "ep_size"};
    f.mla = true;
    f.default_lora_targets = {};
    f.moe.experts_key = "n_routed_experts";
    f.moe.shared_key = "n_shared_experts";
    f.moe.shared_module = "shared_experts";
    f.moe.layers = MoeLayers::first_k_dense;
    f.moe.router_module = false;
    f.moe.aux_coef_key = "aux_loss_alpha";
    f.executor_runs = true;
    t.push_back(f);
  }
  {  // models/deepseek_v3/modeling_deepseek_v3.py: DeepSeek-V2's block; DeepseekV3TopkRouter adds
     // e_score_correction_bias [n_routed_experts] (the noaux_tc balancing bias, updated outside the gradient);
     // the multi-token-prediction layers (num_nextn_predict_layers) are not part of DeepseekV3ForCausalLM.
    ModelFamily f = llama_block("deepseek_v3", "transformers models/deepseek_v3/modeling_deepseek_v3.py");
    f.keys = {"hidden_act", "attention_bias", "mlp_bias", "pretraining_tp", "n_routed_experts", "n_shared_experts",
              "num_experts_per_tok", "moe_intermediate_size", "first_k_dense_replace", "moe_layer_freq", "q_lora_rank",
              "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "aux_loss_alpha", "seq_aux",
              "norm_topk_prob", "routed_scaling_factor", "scoring_func", "topk_method", "n_group", "topk_group",
              "ep_size", "num_nextn_predict_layers", "rope_interleave"};
    f.mla = true;
    // DeepseekV3Attention.__init__ (@ f5a9ec512fa9fe69e51ea0c6388c68d50de567b3): with rope_scaling and a non-zero
    // mscale_all_dim, scaling *= yarn_get_mscale(factor, mscale_all_dim)^2; DeepseekV2Attention (@ 03eac6f6) does not.
    f.mla_yarn_softmax_mscale = true;
    f.default_lora_targets = {};
    f.moe.experts_key = "n_routed_experts";
    f.moe.shared_key = "n_shared_experts";
    f.moe.shared_module = "shared_experts";
    f.moe.layers = MoeLayers::first_k_dense;
    f.moe.router_module = false;
    f.moe.router_score_bias = true;
    f.moe.aux_coef_key = "aux_loss_alpha";
    f.moe.norm_topk_default = true;  // DeepseekV3Config(norm_topk_prob=True)
    f.executor_runs = true;
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

std::string executor_family_list() {
  std::string s;
  for (const auto& f : table())
    if (f.executor_runs) s += (s.empty() ? "" : ", ") + f.model_type;
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
                                             "num_experts_per_tok", "n_shared_experts", "shared_expert_intermediate_size",
                                             "experts_per_token", "first_k_dense_replace", "decoder_sparse_step"};
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

}  // namespace ftplan

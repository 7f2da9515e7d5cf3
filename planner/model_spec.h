// Model spec: the architecture of a decoder, read from a Hugging Face config.json.
// Covers the families of planner/model_family.h: Llama 1/2/3/3.x, Mistral (sliding window), Qwen2,
// Qwen3 (q/k norms), Gemma 2 and 3 (pre- and post-norms, soft-capping, local/global layers, the
// Gemma 3 multimodal wrapper's text_config and vision tower), Phi-3/Phi-4 (fused projections),
// OLMo 2 (post-norms, q/k norms over the whole projection), the mixtures of experts (Mixtral,
// Qwen2-MoE, Qwen3-MoE, gpt-oss, DeepSeek-V2/V3 with multi-head latent attention: MoeSpec, MlaSpec),
// and a quantised base (quantized_base.h).
// What differs between families is a field here, filled from the family's row; the counting,
// activation and FLOP code read these fields, never the family name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "planner/quantized_base.h"

namespace ftplan {

struct RopeScaling {
  std::string type;                     // "" (none), "llama3", "linear", "dynamic", "yarn"
  double factor = 1.0;                  // e.g. 8.0 for Llama-3.1
  double low_freq_factor = 1.0;         // llama3 only, e.g. 1.0
  double high_freq_factor = 4.0;        // llama3 only, e.g. 4.0
  int64_t original_max_position = 0;   // llama3 and yarn, e.g. 8192 (Llama 3.1), 4096 (gpt-oss)
  double beta_fast = 32.0;              // yarn only: the fast rotation boundary, e.g. 32 (transformers' default)
  double beta_slow = 1.0;               // yarn only: the slow rotation boundary, e.g. 1
  double attention_factor = 0.0;        // yarn only: the cos/sin scale; 0: 0.1·ln(factor) + 1 (transformers' default)
  bool truncate = true;                 // yarn only: floor/ceil the correction range, e.g. false (gpt-oss)
  double mscale = 0.0;                  // yarn only (DeepSeek): attention_factor = get_mscale(factor, mscale) /
  double mscale_all_dim = 0.0;          // get_mscale(factor, mscale_all_dim) when both are set; 0: not set
};

// RMSNorms on the queries and keys before RoPE.
enum class QkNorm {
  none,
  per_head,          // one weight of head_dim shared by every head (Qwen3, Gemma 3): 2·head_dim parameters
  whole_projection,  // over the whole projection (OLMo 2): q_dim + kv_dim parameters
};

// A multimodal wrapper's vision tower (Gemma 3: SigLIP) and its projector into the text model.
struct VisionTower {
  std::string model_type;     // vision_config.model_type, e.g. "siglip_vision_model"; "" = none
  int64_t tower_params = 0;   // e.g. 416,866,032 (Gemma-3-4B's SigLIP without its pooling head)
  int64_t projector_params = 0;  // e.g. 2,950,272 (1152×2560 + an RMSNorm of 1152)
  int64_t total() const { return tower_params + projector_params; }
};

// A mixture-of-experts MLP (planner/model_family.h reads it from the family's keys). Each MoE layer's MLP
// is a router (hidden -> num_experts logits) choosing top_k of num_experts gated MLPs per token, plus the
// shared experts (DeepSeek, Qwen2-MoE) every token runs; the other layers keep the dense MLP.
struct MoeSpec {
  int64_t num_experts = 0;               // routed experts per MoE layer, e.g. 8 (Mixtral-8x7B); 0 = a dense model
  int64_t top_k = 0;                     // experts each token runs, e.g. 2 (Mixtral), 8 (Qwen3-30B-A3B)
  int64_t expert_intermediate_size = 0;  // one expert's MLP width, e.g. 14336 (Mixtral), 768 (Qwen3-30B-A3B)
  int64_t shared_intermediate_size = 0;  // the shared expert MLP's width, e.g. 5632 (Qwen1.5-MoE), 2816
                                         // (DeepSeek-V2-Lite: 2 shared experts x 1408); 0 = none
  bool shared_expert_gate = false;       // Qwen2-MoE: the shared expert scaled by sigmoid(Linear(hidden, 1))
  std::string router_name = "gate";      // the router's module name, e.g. "gate", "router" (gpt-oss)
  std::string module = "mlp";            // the MoE block's module in a decoder layer (Hugging Face names), e.g. "mlp",
                                         // "block_sparse_moe" (Mixtral): model.layers.N.<module>.<router_name>.weight
  std::string shared_module;             // the shared expert's module in the MoE block, e.g. "shared_expert"
                                         // (Qwen2-MoE: <module>.shared_expert.gate_proj.weight); "" without one
  bool router_module = true;             // an nn.Linear (PEFT all-linear, bitsandbytes); false: a bare weight
                                         // (DeepSeek's MoEGate, gpt-oss's router)
  bool router_bias = false;              // gpt-oss: the router has a bias
  bool router_score_bias = false;        // DeepSeek-V3 (topk_method noaux_tc): e_score_correction_bias [num_experts]
  bool expert_bias = false;              // gpt-oss: every expert's gate_up and down projections carry biases
  bool fused_expert_params = false;      // gpt-oss: experts are 3D parameters (gate_up_proj, down_proj), not nn.Linear
  std::vector<std::string> expert_names{"gate_proj", "up_proj", "down_proj"};  // an expert's linears: gate, up,
                                         // down, e.g. {"w1", "w3", "w2"} (Mixtral), {"gate_up_proj", "down_proj"} (gpt-oss)
  std::vector<bool> moe_layers;          // per layer: true where the MLP is the MoE block, e.g. DeepSeek-V2-Lite:
                                         // false, true, true, ... (first_k_dense_replace 1)
  double aux_loss_coef = 0;              // router_aux_loss_coef (aux_loss_alpha), e.g. 0.02 (Mixtral)
  bool output_router_logits = false;     // the config's output_router_logits: transformers adds the load-balancing
                                         // loss in training (the job's moe.aux_loss defaults to it)
  bool softmax_after_topk = false;       // gpt-oss (GptOssTopKRouter): softmax over the k largest logits in the compute
                                         // dtype, instead of top-k of the softmax over all experts
  double swiglu_limit = 0;               // gpt-oss's clamped GLU: gate <= limit, |up| <= limit, gate·sigmoid(1.702·gate)·
                                         // (up + 1), gate and up interleaved in gate_up_proj, e.g. 7.0; 0: silu(gate)·up
  bool norm_topk_prob = false;           // the top-k routing weights renormalised to sum to 1, e.g. true (Mixtral
                                         // always; Qwen3-30B-A3B's config), false (Qwen3MoeConfig's default)
  // DeepSeek's router (read for deepseek_v2 / deepseek_v3 only; ftexec routes by them):
  std::string topk_method;               // "" (Qwen, Mixtral: top-k of the softmax); "greedy", "group_limited_greedy"
                                         // (DeepSeek-V2's MoEGate), "noaux_tc" (DeepSeek-V3's TopkRouter)
  std::string scoring_func = "softmax";  // router scores: "softmax", "sigmoid" (DeepSeek-V3)
  int64_t n_group = 1;                   // expert groups for group-limited routing, e.g. 8 (DeepSeek-V3)
  int64_t topk_group = 1;                // groups a token may pick from, e.g. 4 (DeepSeek-V3), 3 (DeepSeek-V2)
  double routed_scaling_factor = 1.0;    // the routed experts' weights times this, e.g. 2.5 (DeepSeek-V3), 16 (V2)

  bool active() const { return num_experts > 0; }
  int64_t num_moe_layers() const;        // e.g. 26 of DeepSeek-V2-Lite's 27
  bool uniform() const;                  // every layer of the same kind (no dense layers among MoE ones)
};

// Multi-head latent attention (DeepSeek-V2/V3, transformers models/deepseek_v2/modeling_deepseek_v2.py):
// queries through a q_lora_rank bottleneck (q_a_proj, q_a_layernorm, q_b_proj) or a plain q_proj; keys and
// values decompressed from a kv_lora_rank latent (kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj). Queries
// and keys have qk_nope + qk_rope dims per head (ModelSpec::head_dim), values v_head_dim.
struct MlaSpec {
  int64_t q_lora_rank = 0;       // e.g. 1536 (DeepSeek-V3); 0: a plain q_proj (DeepSeek-V2-Lite)
  int64_t kv_lora_rank = 0;      // e.g. 512; 0 = no latent attention
  int64_t qk_nope_head_dim = 0;  // e.g. 128
  int64_t qk_rope_head_dim = 0;  // e.g. 64 (the decoupled RoPE key, shared by the heads)
  bool rope_interleave = true;   // RoPE on interleaved pairs (x0, x1), (x2, x3), ... (DeepSeek-V2's complex
                                 // rotation; DeepSeek-V3's rope_interleave, default true); false: rotate-half
  bool yarn_softmax_mscale = false;  // DeepSeek-V3: under YaRN the softmax scale is also x get_mscale(factor, mscale_all_dim)^2
  bool active() const { return kv_lora_rank > 0; }
};

struct ModelSpec {
  std::string name;              // short name or file stem, e.g. "llama-3-8b"
  std::string model_type;        // the decoder's family: "llama", "mistral", "qwen2", "qwen3", "gemma2",
                                 // "gemma3_text", "phi3", "olmo2" (a wrapper's text_config family)
  std::string wrapper_type;      // the config's own model_type when it wraps the decoder, e.g. "gemma3"; else ""
  std::string text_checkpoint_prefix;  // a wrapper's checkpoint names of the decoder: this + the decoder's own
                                       // ("model.layers.0...", "lm_head.weight"), e.g. "language_model." (Gemma 3's
                                       // published checkpoints); "" for a plain decoder
  int64_t vocab_size = 0;        // e.g. 128256
  int64_t hidden_size = 0;       // e.g. 4096
  int64_t intermediate_size = 0; // e.g. 14336
  int64_t num_layers = 0;        // e.g. 32
  int64_t num_heads = 0;         // e.g. 32
  int64_t num_kv_heads = 0;      // e.g. 8 (GQA); equals num_heads without GQA
  int64_t head_dim = 0;          // e.g. 128; hidden_size / num_heads unless given; MLA: qk_nope + qk_rope, e.g. 192
  int64_t v_head_dim = 0;        // value dims per head, e.g. 128 (MLA); 0: head_dim
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;         // Qwen2: true; Llama attention_bias: true sets q,k,v and o
  bool o_bias = false;
  bool mlp_bias = false;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;

  // Norms of one block, each an RMSNorm of hidden_size (Llama: pre-attention and pre-MLP).
  bool norm_pre_attention = true;   // input_layernorm, e.g. true (false in OLMo 2)
  bool norm_post_attention = false; // on the attention output before the residual add, e.g. true (Gemma 2/3, OLMo 2)
  bool norm_pre_mlp = true;         // Llama's post_attention_layernorm / Gemma's pre_feedforward_layernorm
  bool norm_post_mlp = false;       // post_feedforward_layernorm, e.g. true (Gemma 2/3, OLMo 2)
  QkNorm qk_norm = QkNorm::none;    // e.g. per_head (Qwen3)
  bool norm_scale_fp32 = false;     // Gemma: x·(1 + weight) in fp32, so a trained norm keeps an fp32 output
  bool norm_cast_after_scale = false;  // weight·x in fp32, then cast back (OLMo 2's Olmo2RMSNorm; Gemma's too, by
                                       // norm_scale_fp32); false: Llama's cast of x first, then ·weight. Read by ftexec
                                       // only (the same in fp32; the planner counts both alike)
  bool fused_qkv = false;           // one qkv_proj instead of q,k,v (Phi-3)
  bool fused_gate_up = false;       // one gate_up_proj instead of gate, up (Phi-3)
  std::string hidden_act = "silu";  // the gated MLP's activation, e.g. "silu" (SwiGLU), "gelu_pytorch_tanh"
                                    // (GeGLU): the same tensors are kept either way
  bool scaled_embedding = false;    // embeddings × sqrt(hidden_size) (Gemma): no parameters, nothing kept
  double query_pre_attn_scalar = 0;    // attention scores scaled by query_pre_attn_scalar^-0.5, e.g. 256 (Gemma 2/3);
                                       // 0: head_dim (the Llama scaling)
  double rope_local_base_freq = 0;     // the sliding layers' RoPE base (default RoPE, no scaling), e.g. 10000.0
                                       // (Gemma 3); 0: every layer uses rope_theta and rope_scaling
  double partial_rotary_factor = 1.0;  // RoPE on this fraction of head_dim, e.g. 0.75 (Phi-4-mini); 1: all of it
  double attn_logit_softcapping = 0;   // cap·tanh(scores/cap) on attention scores, e.g. 50.0 (Gemma 2); 0 = none
  double final_logit_softcapping = 0;  // the same on the logits, e.g. 30.0 (Gemma 2); 0 = none
  int64_t sliding_window = 0;          // tokens a local layer attends to, e.g. 4096 (Gemma 2); 0 = none
  std::vector<bool> sliding_layers;    // per layer: true where it attends over sliding_window tokens, e.g.
                                       // Gemma 2: true, false, true, ...; empty = every layer global
  bool attention_sinks = false;        // gpt-oss: a learned sink logit per head (num_heads parameters)
  MoeSpec moe;                         // mixture of experts; moe.active() false for dense models
  MlaSpec mla;                         // multi-head latent attention (DeepSeek)
  VisionTower vision;                  // Gemma 3 wrapper: counted, frozen under LoRA, not run by text batches
  QuantizedBase quantized;             // quantization_config: the block linears as the checkpoint stores them
  std::vector<std::string> default_lora_targets;  // PEFT's default for the family, e.g. {"q_proj", "v_proj"};
                                                  // empty: PEFT has none (Phi-3, OLMo 2: targets must be given)
  std::vector<std::string> notes;      // what the reader assumed or left out, printed with the assumptions

  int64_t q_dim() const { return num_heads * head_dim; }      // q_proj output features
  int64_t kv_dim() const { return num_kv_heads * head_dim; }  // k_proj / v_proj output features
  int64_t value_head_dim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
  int64_t v_dim() const { return num_kv_heads * value_head_dim(); }      // values, e.g. kv_dim()
  int64_t attn_out_dim() const { return num_heads * value_head_dim(); }  // o_proj input, e.g. q_dim()
  int64_t block_norms() const {                               // hidden-size RMSNorms per block, e.g. 2 or 4
    return int64_t(norm_pre_attention) + norm_post_attention + norm_pre_mlp + norm_post_mlp;
  }
  int64_t num_sliding_layers() const;                         // layers attending over the window, e.g. 21
};

// Parameter counts of the pieces of the model, exact (no rounding).
struct ParamCounts {
  int64_t embedding = 0;    // vocab_size * hidden_size
  int64_t per_layer = 0;    // one decoder block: attention + MLP + its norms (a MoE model: one MoE block)
  int64_t attention = 0;    // q,k,v,o (or qkv,o; MLA's projections) weights and biases of one block, gpt-oss's sinks
  int64_t mlp = 0;          // gate, up, down (or gate_up, down) of one block; MoE: router + experts + shared expert
  int64_t norms = 0;        // the block's RMSNorm weights, q/k norms and MLA's latent norms included
  int64_t router = 0;       // MoE: the router (and DeepSeek-V3's score-correction bias), part of mlp
  int64_t buffers = 0;      // MoE: what one MoE block's checkpoint holds that is not trained, part of router: DeepSeek-V3's
                            // e_score_correction_bias (a register_buffer, num_experts), frozen under every method
  int64_t one_expert = 0;   // MoE: one routed expert's weights and biases
  int64_t experts = 0;      // MoE: the routed experts of one MoE block (num_experts x one_expert), part of mlp
  int64_t dense_per_layer = 0;  // a dense block of a MoE model (DeepSeek's first_k_dense_replace layers); = per_layer
  int64_t moe_layers = 0;   // blocks whose MLP is the MoE block, e.g. 26
  int64_t blocks = 0;       // every decoder block together: moe_layers x per_layer + the rest x dense_per_layer
  int64_t active = 0;       // parameters one token runs: total less (num_experts - top_k) experts per MoE block
                            // (embedding included; = total for dense models)
  int64_t final_norm = 0;   // hidden_size
  int64_t lm_head = 0;      // 0 when tied to the embedding
  int64_t vision = 0;       // a multimodal wrapper's vision tower and projector; 0 for text models
  int64_t total = 0;
};

// One tensor-parallel rank's parameters: its share of the block linears (block_linears(model, tp)),
// the vocabulary-parallel embedding and head (ceil(vocab / tp) rows), whole norms and vision tower;
// count_params(model, 1) == count_params(model).
ParamCounts count_params(const ModelSpec& model, int64_t tp);

// Parses and validates a config.json object; throws ftplan::InputError naming the field.
ModelSpec model_spec_from_json(const nlohmann::json& config, const std::string& name);

// Reads a config.json by short name (configs/models/<name>.json, see data_paths.h) or path.
ModelSpec load_model(const std::string& name_or_path);

ParamCounts count_params(const ModelSpec& model);

// What a block linear reads and feeds: the activation model keeps a shared input once per group.
enum class LinearRole {
  attention_in,      // q_proj, k_proj, v_proj, qkv_proj (MLA: q_proj or q_a_proj, kv_a_proj_with_mqa): read the
                     // attention norm's output
  attention_out,     // o_proj: reads the attention output
  mlp_in,            // gate_proj, up_proj, gate_up_proj: read the MLP norm's output (a MoE block's shared expert too)
  mlp_out,           // down_proj: reads the gated product
  attention_latent,  // MLA's q_b_proj, kv_b_proj: read their latent norm's output
  router,            // a MoE router (and Qwen2-MoE's shared_expert_gate): reads the MLP norm's output
  expert_in,         // a routed expert's gate/up (gate_up): reads the tokens dispatched to it
  expert_out,        // a routed expert's down projection
};
inline bool is_mlp_role(LinearRole r) {
  return r == LinearRole::mlp_in || r == LinearRole::mlp_out || r == LinearRole::router || r == LinearRole::expert_in ||
         r == LinearRole::expert_out;
}
inline bool is_expert_role(LinearRole r) { return r == LinearRole::expert_in || r == LinearRole::expert_out; }

// The linear layers of one block, by their Hugging Face module names.
struct LinearShape {
  std::string name;      // "q_proj", ..., or Phi-3's "qkv_proj", "gate_up_proj"; Mixtral's experts "w1", "w3", "w2"
  int64_t in_features;
  int64_t out_features;
  bool bias;
  LinearRole role;
  int64_t instances = 1;  // copies per block: num_experts for a routed expert's linear, else 1
  bool module = true;     // an nn.Linear (PEFT all-linear, bitsandbytes quantise it); false: a bare parameter
                          // (gpt-oss's fused experts and router, DeepSeek's MoEGate)
};
// The linear layers of one decoder block in execution order, named as the family's transformers
// code names them (so LoRA target lists such as "qkv_proj" match): seven for Llama, four for Phi-3;
// a MoE model's MoE block (attention, router, one entry per expert linear with instances = num_experts,
// the shared expert).
std::vector<LinearShape> block_linears(const ModelSpec& model);
// The linears of a MoE block (moe_layer) or of a dense block; for a dense model both are block_linears.
std::vector<LinearShape> layer_linears(const ModelSpec& model, bool moe_layer);
// The linears of every kind of block the model has (a MoE model's dense blocks, then its MoE block).
std::vector<LinearShape> model_linears(const ModelSpec& model);
// Every distinct linear name of the model's blocks (dense and MoE), e.g. for all-linear and target checks.
std::vector<std::string> linear_names(const ModelSpec& model);
// One tensor-parallel rank's share of them (Megatron-LM, Shoeybi et al. 2019): the column-parallel
// linears (q, k, v, gate, up and the fused qkv, gate_up) keep out_features / tp outputs and their
// biases; the row-parallel ones (o, down) in_features / tp inputs, their biases whole. KV heads fewer
// than tp are replicated, one per rank (Megatron-LM's GQA). tp = 1: block_linears.
std::vector<LinearShape> block_linears(const ModelSpec& model, int64_t tp);

}  // namespace ftplan

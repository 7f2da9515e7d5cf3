// A decoder of the dense families in planner/model_family.h (Llama 2/3/3.1/3.2, Mistral, Qwen2, Qwen3,
// Gemma 2, Gemma 3 text, Phi-3/Phi-4, OLMo 2) and the mixtures of experts Qwen3-MoE, Mixtral, Qwen2-MoE (shared expert)
// gpt-oss (attention sinks, YaRN RoPE, fused experts with biases: see "gpt-oss" below) and DeepSeek-V2/V3 (multi-head
// latent attention, shared experts, leading dense layers) in LibTorch, built from the same
// ftplan::ModelSpec the planner reads: RMSNorm (Llama's, or Gemma's x·(1 + w) in fp32, or OLMo 2's cast
// after the scale) before and/or after attention and the MLP as the spec's norm_* fields say, RoPE
// (default, linear, dynamic and llama3 scaling; Gemma 3's local base on sliding layers), GQA attention
// with q/k RMSNorms per head (Qwen3, Gemma 3) or over the whole projection (OLMo 2), separate or fused
// q/k/v and gate/up projections (Phi-3), a sliding-window mask on the layers the spec names, attention
// and final logit soft-capping, scaled embeddings (Gemma), a SwiGLU or GeGLU MLP or a mixture of
// experts (executor/moe.h) per layer, tied or untied head, biases as the config says. Each family's
// difference is a ModelSpec field read where it acts, never the model_type.
// Parameters carry Hugging Face's names so safetensors load and save without a mapping table (stacked
// expert tensors are split into one tensor per expert by moe_checkpoint_tensors).
//
// The forward keeps exactly the tensors listed at the top of planner/activation_memory.h for
// backward for the Llama block (the measured CPU peak is checked against the planner's formula in
// the tests):
//   RMSNorm upcasts its input to fp32 first; eager attention repeats k and v to all heads and takes
//   an fp32 softmax; o_proj reads a contiguous copy; SwiGLU is down(silu(gate(x)) * up(x)); the loss
//   is an fp32 log_softmax + nll_loss on labels shifted by the data loader, and the logits are not
//   kept alive after it.
// What the other blocks keep beyond that (not in the planner's formula): soft-capping's tanh outputs
// (one per attention score, and the logits before the fp32 cast), the post-norms' inputs, OLMo 2's
// whole-projection q/k norm inputs, gpt-oss's scores joined with the sink column and its softmax in the compute
// dtype, GeGLU's gelu input (as SwiGLU's silu input), a sliding layer's
// mask (bool, S x S, shared by the layers); a fused qkv_proj / gate_up_proj output is one tensor
// whose q, k, v (gate, up) are views.
//
// gpt-oss (transformers models/gpt_oss/modeling_gpt_oss.py @ 6edf5b311854175ff83c59179b3360beca1ceffc): GptOssRMSNorm
// is OLMo 2's (weight·x in fp32, then the cast: norm_cast_after_scale); GptOssAttention has q/k/v/o biases
// (attention_bias) and sinks [num_heads]: eager_attention_forward joins each head's sink logit to its scaled,
// masked scores as one more column, takes the softmax over [scores, sink] in the scores' dtype and drops the sink
// column (so a row's weights sum to less than 1); sliding_window on layer_types' "sliding_attention" layers;
// GptOssRotaryEmbedding is rotate-half RoPE (_apply_rotary_emb: first_half·cos - second_half·sin, second_half·cos +
// first_half·sin) with YaRN's inverse frequencies and cos, sin times its attention factor (rope_attention_scaling);
// no SDPA (_supports_sdpa False: refused). The MoE block: executor/moe.h.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "executor/moe.h"
#include "executor/nf4.h"
#include "executor/safetensors.h"
#include "planner/model_spec.h"

namespace ftexec {

// A LoRA adapter on one linear layer (Hu et al. 2021): y = W x + B A dropout(x) · alpha / r.
struct LoraAdapter {
  at::Tensor a;         // lora_A.weight, [r, in]: kaiming-uniform init as PEFT does
  at::Tensor b;         // lora_B.weight, [out, r]: zeros, so the adapted model starts equal to the base
  double scaling = 2.0; // alpha / r, e.g. 32 / 16
  double dropout = 0.0; // on the adapter's input, training only, e.g. 0.05
};

struct Linear {
  at::Tensor weight;  // [out, in]; undefined when held in NF4
  at::Tensor bias;    // [out], undefined without bias
  std::optional<LoraAdapter> lora;
  std::shared_ptr<Nf4Tensor> nf4;  // QLoRA: the frozen weight in NF4 (executor/nf4.h), else null
                                  // (mutable: ZeRO-3/FSDP rebind its tensors onto shardable buffers)
};

struct LlamaBlock {
  // The block's RMSNorms of hidden size, each undefined where the spec has none (block_norms gives their
  // Hugging Face names: the name "post_attention_layernorm" is Llama's pre-MLP norm and Gemma's norm on the
  // attention output).
  at::Tensor attn_norm;       // before attention (norm_pre_attention): input_layernorm
  at::Tensor attn_out_norm;   // on attention's output (norm_post_attention, Gemma, OLMo 2)
  at::Tensor mlp_norm;        // before the MLP (norm_pre_mlp)
  at::Tensor mlp_out_norm;    // on the MLP's output (norm_post_mlp): post_feedforward_layernorm
  Linear q_proj, k_proj, v_proj, o_proj;
  Linear qkv_proj;                      // Phi-3's fused q|k|v (ModelSpec::fused_qkv); q/k/v_proj then empty
  at::Tensor q_norm, k_norm;            // q/k RMSNorms (self_attn.q_norm.weight): [head_dim] per head (Qwen3, Gemma 3),
                                        // [q_dim] and [kv_dim] over the projection (OLMo 2); undefined without
  Linear gate_proj, up_proj, down_proj; // the dense MLP; weights undefined in a MoE layer
  Linear gate_up_proj;                  // Phi-3's fused gate|up (ModelSpec::fused_gate_up); gate/up_proj then empty
  // DeepSeek's multi-head latent attention (ModelSpec::mla): q_proj, or q_a_proj -> q_a_layernorm -> q_b_proj;
  // kv_a_proj_with_mqa -> (latent, k_pe), kv_a_layernorm on the latent, kv_b_proj -> k_nope | v per head; o_proj.
  Linear q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj;
  at::Tensor q_a_layernorm;             // [q_lora_rank] (self_attn.q_a_layernorm.weight); undefined without
  at::Tensor kv_a_layernorm;            // [kv_lora_rank] (self_attn.kv_a_layernorm.weight); undefined without MLA
  std::shared_ptr<MoeBlock> moe;        // a MoE layer's router and experts (executor/moe.h), else null
  at::Tensor sinks;                     // gpt-oss: one learned sink logit per head, [num_heads] (self_attn.sinks);
                                        // undefined without (ModelSpec::attention_sinks)
};

struct ModelOptions {
  at::ScalarType dtype = at::kFloat;  // parameters and compute: kFloat or kBFloat16
  at::Device device = at::kCPU;
  bool use_sdpa = false;              // fused attention; only where compat::kHasSdpa
  bool checkpointing = false;         // keep each block's input only, recompute it in backward
  std::optional<bool> moe_aux_loss;   // the load-balancing loss (job key moe.aux_loss); unset: the config's
                                      // output_router_logits, as transformers
};

struct TensorParallel;   // executor/tensor_parallel.h
struct ContextParallel;  // executor/context_parallel.h

struct LlamaModel {
  ftplan::ModelSpec spec;
  ModelOptions options;
  at::Tensor embed_tokens;  // [vocab, hidden]
  std::vector<LlamaBlock> layers;
  at::Tensor norm;          // [hidden]
  at::Tensor lm_head;       // [vocab, hidden]; undefined when tied to embed_tokens
  bool training = true;     // LoRA dropout on
  // Caches for the current sequence length (no grad, on the device).
  int64_t cached_seq_len = 0;
  at::Tensor rope_cos, rope_sin;  // [S, head_dim] in the compute dtype
  at::Tensor rope_cos_local, rope_sin_local;  // the sliding layers' (ModelSpec::rope_local_base_freq), else undefined
  at::Tensor causal_mask;         // [S, S] bool, true above the diagonal
  at::Tensor sliding_mask;        // [S, S] bool, also true at distance >= sliding_window; undefined without a window
  // Tensor parallelism (executor/tensor_parallel.h): this rank's shard of every split tensor, and the
  // state llama_embed / llama_block_forward / llama_head_loss then run the tensor-parallel forward
  // with; null for a whole model. seq_shards: the residual stream holds S / seq_shards tokens
  // (sequence parallelism: tp; context parallelism: x cp).
  std::shared_ptr<TensorParallel> tp;
  // Context parallelism (executor/context_parallel.h): this rank's chunk of every sequence (the
  // caches above then hold the chunk's rows: RoPE at global positions, the mask offset); null
  // without. seq_shards is then multiplied by cp.
  std::shared_ptr<ContextParallel> cp;
  int64_t seq_shards = 1;
  MoeAux moe_aux;                 // the MoE layers' routing of the last forward (load-balancing loss)

  const at::Tensor& head_weight() const { return lm_head.defined() ? lm_head : embed_tokens; }
};

// Builds the model with Hugging Face's initialisation from `seed` (linears and embedding
// N(0, 0.02), biases 0, norms 1), drawn on the CPU in fp32 so every device and dtype starts from
// the same numbers; `random_init` false leaves the weights uninitialised (to be loaded).
LlamaModel llama_create(const ftplan::ModelSpec& spec, const ModelOptions& options, uint64_t seed,
                        bool random_init = true);

// QLoRA: every block linear's weight quantized to NF4 (Linear::nf4) and its dense copy dropped;
// biases, norms, the embedding and the head stay in the model's dtype (as bitsandbytes leaves them).
void llama_quantize_nf4(LlamaModel& model);
// Bytes of the NF4 weights (0 without QLoRA).
int64_t llama_nf4_bytes(const LlamaModel& model);

// The base parameters by Hugging Face name, in a fixed order (adapters and NF4 weights are not
// included). A stacked expert tensor is named with "*" for the expert index; checkpoint_tensors()
// gives what a checkpoint holds.
std::vector<std::pair<std::string, at::Tensor>> llama_named_parameters(const LlamaModel& model);
// The model's buffers by Hugging Face name: tensors a checkpoint holds that are not trained (DeepSeek-V3's
// model.layers.N.mlp.gate.e_score_correction_bias); loaded and saved beside the parameters, kept fixed.
std::vector<std::pair<std::string, at::Tensor>> llama_named_buffers(const LlamaModel& model);
// The names and shapes a checkpoint of this config must hold (one tensor per expert; buffers included).
std::vector<std::pair<std::string, std::vector<int64_t>>> llama_expected_tensors(const ftplan::ModelSpec& spec);
// A parameter's name in the model's Hugging Face checkpoint: the model's own name ("model.norm.weight") with
// a multimodal wrapper's prefix of its decoder (ModelSpec::text_checkpoint_prefix, Gemma 3:
// "language_model.model.norm.weight"). ftexec trains the wrapper's decoder only: loading skips the
// wrapper's other tensors (vision tower, projector) and saving writes the decoder's.
std::string checkpoint_name(const ftplan::ModelSpec& spec, const std::string& name);
// Named tensors as a Hugging Face checkpoint holds them: stacked expert tensors split into per-expert views.
std::vector<std::pair<std::string, at::Tensor>> checkpoint_tensors(const std::vector<std::pair<std::string, at::Tensor>>& named);

// The linears of one layer that ftexec holds as Linear (q, k, v, o and, in a dense layer, gate, up and
// down; a MoE layer's router and experts are its MoeBlock), as the planner describes them.
std::vector<ftplan::LinearShape> layer_dense_linears(const ftplan::ModelSpec& spec, int64_t layer);

// The block's other tensors by name inside the layer ("self_attn.q_norm.weight", "mlp.gate.weight",
// "mlp.experts.*.gate_proj.weight", ...), beside the norms and the Linear ones, and their shapes.
std::vector<std::pair<std::string, at::Tensor*>> block_extra_tensors(LlamaBlock& block, const ftplan::ModelSpec& spec);
std::vector<std::pair<std::string, std::vector<int64_t>>> block_extra_shapes(const ftplan::ModelSpec& spec, int64_t layer);

// The block's hidden-size RMSNorms by Hugging Face name inside the layer, in checkpoint order: `leading`
// true gives the one before the linears (input_layernorm), false the others (post_attention_layernorm,
// pre_feedforward_layernorm, post_feedforward_layernorm, as the spec has them).
std::vector<std::pair<std::string, at::Tensor*>> block_norms(LlamaBlock& block, const ftplan::ModelSpec& spec, bool leading);
std::vector<std::string> block_norm_names(const ftplan::ModelSpec& spec, bool leading);

// The layer's RoPE tables and attention mask (a sliding layer's window, Gemma 3's local RoPE).
const at::Tensor& layer_rope_cos(const LlamaModel& model, int64_t layer);
const at::Tensor& layer_rope_sin(const LlamaModel& model, int64_t layer);
const at::Tensor& layer_attention_mask(const LlamaModel& model, int64_t layer);

// The linears of one block by module name ("q_proj", ..., "down_proj", Phi-3's "qkv_proj" and
// "gate_up_proj") and their HF prefix inside the block ("self_attn." or "mlp.").
Linear& block_linear(LlamaBlock& block, const std::string& module);
const Linear& block_linear(const LlamaBlock& block, const std::string& module);
std::string block_linear_prefix(const std::string& module);
// The same in layer `layer` of the spec: a MoE layer's gate/up/down are its shared expert's, e.g.
// "mlp.shared_expert." (MoeSpec::module and shared_module).
std::string block_linear_prefix(const ftplan::ModelSpec& spec, int64_t layer, const std::string& module);

// Loads Hugging Face safetensors: a file, a folder holding model.safetensors or
// model.safetensors.index.json, or an index file (sharded). Every name and shape is checked against
// the config first; all problems are reported together in one InputError naming the tensors.
void llama_load_weights(LlamaModel& model, const std::string& path);
// Writes <dir>/model.safetensors (HF names, the parameters' dtype), atomically.
void llama_save_weights(const LlamaModel& model, const std::string& dir);

// RoPE inverse frequencies after the config's scaling (HF's _compute_*_parameters), head_dim / 2 values.
std::vector<double> rope_inv_freq(const ftplan::ModelSpec& spec, int64_t seq_len);
// The factor HF's rotary embedding multiplies cos and sin by (its attention_scaling): YaRN's attention factor,
// e.g. 0.1·ln(32) + 1 = 1.3466 (gpt-oss); 1 for the other scalings.
double rope_attention_scaling(const ftplan::ModelSpec& spec);
// YaRN's get_mscale(scale, mscale) = 0.1·mscale·ln(scale) + 1, 1 when scale <= 1 (transformers modeling_rope_utils.py).
double yarn_get_mscale(double scale, double mscale);

// Mean next-token cross-entropy of input_ids [B, S] against labels [B, S] (int64, on the device;
// label -100 is ignored). Builds the autograd graph when grad mode is on.
at::Tensor llama_loss(LlamaModel& model, const at::Tensor& input_ids, const at::Tensor& labels);

// Final hidden states [B, S, hidden] after the last norm (no head): for tests and inference.
at::Tensor llama_hidden(LlamaModel& model, const at::Tensor& input_ids);
// The logits [B, S, vocab] in the compute dtype: the head on llama_hidden, soft-capped where the spec says
// (final_logit_softcapping), as the loss sees them.
at::Tensor llama_logits(LlamaModel& model, const at::Tensor& input_ids);

// The model in its units, as the distributed strategies run it (llama_loss is their composition):
// the embedding of input_ids [B, S]; one block, checkpointed when options.checkpointing and grad mode
// is on; the final norm, head and mean cross-entropy of hidden states [B, S, hidden].
at::Tensor llama_embed(LlamaModel& model, const at::Tensor& input_ids);
at::Tensor llama_block_apply(LlamaModel& model, int64_t layer, const at::Tensor& x);
at::Tensor llama_head_loss(LlamaModel& model, const at::Tensor& hidden, const at::Tensor& labels);

// One decoder block on x [B, S, hidden] (never checkpointed): exposed for the checkpointing test.
at::Tensor llama_block_forward(LlamaModel& model, int64_t layer, const at::Tensor& x);

// Tensors <-> safetensors entries (CPU, contiguous; the tensor must outlive the entry).
std::string safetensors_dtype_of(at::ScalarType type);
at::ScalarType scalar_type_of_safetensors(const std::string& dtype, const std::string& where);
SafetensorsEntry safetensors_entry(const std::string& name, const at::Tensor& cpu_contiguous);
at::Tensor tensor_view_of(const SafetensorsEntry& entry);  // borrows the mapped bytes: copy before the file closes

std::string shape_to_string(at::IntArrayRef shape);

}  // namespace ftexec

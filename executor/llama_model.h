// A Llama-family decoder (Llama 2/3/3.1/3.2, Mistral, Qwen2, Qwen3, Qwen3-MoE, Mixtral and Qwen2-MoE layouts) in LibTorch,
// built from the same ftplan::ModelSpec the planner reads: RMSNorm, RoPE (default, linear, dynamic and
// llama3 scaling), GQA attention, per-head q/k RMSNorms where the spec has them (Qwen3), SwiGLU MLP or a
// mixture of experts (executor/moe.h) per layer, tied or untied head, biases as the config says.
// Parameters carry Hugging Face's names so safetensors load and save without a mapping table (stacked
// expert tensors are split into one tensor per expert by moe_checkpoint_tensors).
//
// The forward keeps exactly the tensors listed at the top of planner/activation_memory.h for
// backward (the measured CPU peak is checked against the planner's formula in the tests):
//   RMSNorm upcasts its input to fp32 first; eager attention repeats k and v to all heads and takes
//   an fp32 softmax; o_proj reads a contiguous copy; SwiGLU is down(silu(gate(x)) * up(x)); the loss
//   is an fp32 log_softmax + nll_loss on labels shifted by the data loader, and the logits are not
//   kept alive after it.
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
  at::Tensor input_layernorm;           // [hidden]
  Linear q_proj, k_proj, v_proj, o_proj;
  at::Tensor q_norm, k_norm;            // [head_dim] each, Qwen3's per-head RMSNorms (self_attn.q_norm.weight);
                                        // undefined without (ModelSpec::qk_norm none)
  at::Tensor post_attention_layernorm;  // [hidden]
  Linear gate_proj, up_proj, down_proj; // the dense MLP; weights undefined in a MoE layer
  std::shared_ptr<MoeBlock> moe;        // a MoE layer's router and experts (executor/moe.h), else null
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
  at::Tensor causal_mask;         // [S, S] bool, true above the diagonal
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
// The names and shapes a checkpoint of this config must hold (one tensor per expert).
std::vector<std::pair<std::string, std::vector<int64_t>>> llama_expected_tensors(const ftplan::ModelSpec& spec);
// Named tensors as a Hugging Face checkpoint holds them: stacked expert tensors split into per-expert views.
std::vector<std::pair<std::string, at::Tensor>> checkpoint_tensors(const std::vector<std::pair<std::string, at::Tensor>>& named);

// The linears of one layer that ftexec holds as Linear (q, k, v, o and, in a dense layer, gate, up and
// down; a MoE layer's router and experts are its MoeBlock), as the planner describes them.
std::vector<ftplan::LinearShape> layer_dense_linears(const ftplan::ModelSpec& spec, int64_t layer);

// The block's other tensors by name inside the layer ("self_attn.q_norm.weight", "mlp.gate.weight",
// "mlp.experts.*.gate_proj.weight", ...), beside the norms and the Linear ones, and their shapes.
std::vector<std::pair<std::string, at::Tensor*>> block_extra_tensors(LlamaBlock& block, const ftplan::ModelSpec& spec);
std::vector<std::pair<std::string, std::vector<int64_t>>> block_extra_shapes(const ftplan::ModelSpec& spec, int64_t layer);

// The seven linears of one block by module name ("q_proj", ..., "down_proj") and their HF prefix
// inside the block ("self_attn." or "mlp.").
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

// Mean next-token cross-entropy of input_ids [B, S] against labels [B, S] (int64, on the device;
// label -100 is ignored). Builds the autograd graph when grad mode is on.
at::Tensor llama_loss(LlamaModel& model, const at::Tensor& input_ids, const at::Tensor& labels);

// Final hidden states [B, S, hidden] after the last norm (no head): for tests and inference.
at::Tensor llama_hidden(LlamaModel& model, const at::Tensor& input_ids);

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

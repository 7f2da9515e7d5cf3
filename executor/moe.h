// A mixture-of-experts MLP (Qwen3-MoE, Mixtral, Qwen2-MoE, DeepSeek-V2/V3: moe_route) in LibTorch, as transformers'
// Qwen3MoeSparseMoeBlock computes it (src/transformers/models/qwen3_moe/modeling_qwen3_moe.py @
// 00d4b3d2142cb4ced2f51b90614b5d26bc045015), and its kin MixtralSparseMoeBlock (models/mixtral/
// modeling_mixtral.py @ the same commit: the same routing, always renormalised, the experts' linears
// named w1, w3, w2, the block named block_sparse_moe) and Qwen2MoeSparseMoeBlock (models/qwen2_moe/
// modeling_qwen2_moe.py @ 00a3f9386614dde0dc41cf4e9b8d0abd3af0671d: Qwen3's routing plus a shared expert,
// added as sigmoid(shared_expert_gate(x)) * shared_expert(x); llama_model.cpp holds the shared expert as
// the block's gate/up/down Linears and MoeBlock::shared_expert_gate scales it):
//   router_logits = gate(x)                                    [T, E]
//   weights = softmax(router_logits, fp32); top-k of them      [T, k]
//   weights /= weights.sum(-1) when norm_topk_prob; cast to the compute dtype
//   y[t] = sum_j weights[t, j] * expert_{e(t, j)}(x[t]),  expert(x) = down(silu(gate_proj(x)) * up_proj(x))
// and, in training with output_router_logits, transformers' load_balancing_loss_func over every MoE
// layer's router logits (Switch Transformer eqs. 4-6): E * sum_e f_e * P_e with f_e the fraction of the
// (token, slot) pairs routed to e and P_e the mean router probability of e, both over the tokens of
// every MoE layer together; the loss adds router_aux_loss_coef times it.
//
// gpt-oss (transformers models/gpt_oss/modeling_gpt_oss.py @ 6edf5b311854175ff83c59179b3360beca1ceffc, GptOssTopKRouter and
// GptOssExperts) differs in three places, each a MoeSpec field: the router has a bias and takes the softmax over
// its k largest logits in the compute dtype (softmax_after_topk); the experts are fused input-major parameters
// with biases (fused_expert_params), gate_up = x @ gate_up_proj[e] + bias, gate = gate_up[..., ::2], up =
// gate_up[..., 1::2]; and the GLU is clamped (swiglu_limit): gate.clamp(max=limit), up.clamp(-limit, limit),
// (up + 1) * gate * sigmoid(1.702 gate), then @ down_proj[e] + bias. Its load-balancing loss reads what
// GptOssTopKRouter returns first, the router_scores (the k softmax weights scattered into zeros), which
// load_balancing_loss_func passes through a softmax again: P_e is the mean of softmax(router_scores), not of
// softmax(router_logits). With biases a padded row is no longer zero after the first GEMM, but it is never
// gathered back, so it still adds nothing to the output or to any gradient.
//
// The experts are held as stacked tensors ([E, out, in] per projection) and run as three batched GEMMs
// (at::bmm) over padded groups: the (token, slot) pairs are sorted by expert (a stable sort), each
// expert's pairs gathered into its rows of an [E, C, hidden] buffer, C the busiest expert's pair count,
// the rest zeros (one index_select from x and a zero row, which keeps only its index for backward). LibTorch 1.13 has no grouped GEMM (torch._grouped_mm is PyTorch 2.8); per-expert
// at::mm over slices of the stacked weights would run E small GEMMs and, in backward, E slice-gradients
// of the whole stack (or an unbind and a stack copy); one bmm per projection gives the stacked gradient
// at once. The zero rows stay zero through gate, up, silu and down, are never gathered back, and so add
// nothing to any gradient. The cost is memory: bmm keeps its padded inputs, E x C rows instead of T x k,
// which is the planner's capacity-factor model with factor E x C / (T x k) (--moe-capacity-factor), so
// the memory test plans with the factor the run measured.
//
// Checkpoints hold one tensor per expert (Hugging Face's names, model.layers.N.mlp.experts.M.gate_proj.
// weight; Mixtral's model.layers.N.block_sparse_moe.experts.M.w1.weight: MoeSpec::module and expert_names);
// the model names a stacked tensor with "*" for the expert index and moe_checkpoint_tensors() splits it
// (views along dimension 0).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "planner/model_spec.h"

namespace ftexec {

// One MoE layer's MLP: the router and the routed experts, stacked.
struct MoeBlock {
  at::Tensor gate;       // the router, [E, hidden] (mlp.gate.weight)
  at::Tensor gate_proj;  // [E, expert_intermediate, hidden] (mlp.experts.M.gate_proj.weight, M = 0..E-1)
  at::Tensor up_proj;    // [E, expert_intermediate, hidden]
  at::Tensor down_proj;  // [E, hidden, expert_intermediate]
  at::Tensor shared_expert_gate;  // Qwen2-MoE: [1, hidden] (mlp.shared_expert_gate.weight); undefined without
  at::Tensor score_bias;  // DeepSeek-V3: e_score_correction_bias [E] (mlp.gate.e_score_correction_bias), a buffer:
                          // it shifts the choice of experts only, has no gradient and ftexec keeps it fixed (the
                          // noaux_tc balancing update is not part of transformers' training step); undefined without
  // gpt-oss (MoeSpec::fused_expert_params; GptOssTopKRouter, GptOssExperts): the router's bias and the experts as
  // transformers holds them, input-major 3-D parameters; gate_proj and up_proj stay undefined and down_proj is
  // [E, expert_intermediate, hidden] (mlp.experts.down_proj), not the per-expert nn.Linear layout above.
  at::Tensor router_bias;         // [E] (mlp.router.bias)
  at::Tensor gate_up_proj;        // [E, hidden, 2 x expert_intermediate], gate and up interleaved (mlp.experts.gate_up_proj)
  at::Tensor gate_up_proj_bias;   // [E, 2 x expert_intermediate] (mlp.experts.gate_up_proj_bias)
  at::Tensor down_proj_bias;      // [E, hidden] (mlp.experts.down_proj_bias)
};

// What one forward of the whole model leaves for the load-balancing loss (one per model; rewritten by
// every forward, and identically by a checkpointed block's recompute).
struct MoeAux {
  bool enabled = false;            // the job's moe.aux_loss (default: the config's output_router_logits)
  double coef = 0;                 // router_aux_loss_coef, e.g. 0.001
  int64_t top_k = 1;               // num_experts_per_tok, e.g. 8
  std::vector<at::Tensor> counts;  // per layer (undefined for a dense one): (token, slot) pairs per expert, [E] fp32
  std::vector<at::Tensor> probs;   // per layer: the router probabilities summed over tokens, [E] fp32, detached
  double grad_scale = 0;           // the loss's upstream gradient, set by the head's backward for the blocks'
  double max_capacity_factor = 0;  // the largest E x C / (T x k) of any forward so far: the padding the batched
                                   // GEMMs ran, as the planner's --moe-capacity-factor (1.0: perfectly balanced)
};

// The spec's MoE layers (MoeSpec::moe_layers) and whether ftexec builds them: routed experts with
// separate gate, up and down projections and a plain nn.Linear router, a shared expert (with its gate) or none.
bool moe_layer(const ftplan::ModelSpec& spec, int64_t layer);

// The block's tensors by name inside the layer ("mlp.gate.weight", "mlp.experts.*.gate_proj.weight", ...,
// "mlp.shared_expert_gate.weight": "*" the expert index of a stacked tensor, "mlp" MoeSpec::module), in a
// fixed order, with their shapes.
std::vector<std::pair<std::string, at::Tensor*>> moe_named_tensors(MoeBlock& block, const ftplan::ModelSpec& spec);
std::vector<std::pair<std::string, std::vector<int64_t>>> moe_tensor_shapes(const ftplan::ModelSpec& spec);

// The block's buffers (not trained, but in the checkpoint): DeepSeek-V3's "mlp.gate.e_score_correction_bias".
std::vector<std::pair<std::string, at::Tensor*>> moe_named_buffers(MoeBlock& block, const ftplan::ModelSpec& spec);
std::vector<std::pair<std::string, std::vector<int64_t>>> moe_buffer_shapes(const ftplan::ModelSpec& spec);

// The tensors a Hugging Face checkpoint holds for a model tensor: itself, or for a stacked expert
// tensor (a name holding ".*.") one [out, in] view per expert, the "*" replaced by its index.
std::vector<std::pair<std::string, at::Tensor>> moe_checkpoint_tensors(const std::string& name, const at::Tensor& t);
std::vector<std::pair<std::string, std::vector<int64_t>>> moe_checkpoint_shapes(const std::string& name,
                                                                                const std::vector<int64_t>& shape);

// DeepSeek's routers (MoeSpec::topk_method set), as transformers computes them: DeepseekV2MoEGate
// (models/deepseek_v2/modeling_deepseek_v2.py @ 03eac6f6d2af7e8562113f0b78d3d2d59a7d843d): fp32 logits
// F.linear(x.float(), weight.float()), softmax, top-k ("greedy") or top-k among the topk_group groups with the
// highest max score ("group_limited_greedy", the others masked to 0), weights times routed_scaling_factor (that
// file reads norm_topk_prob but never applies it: llama_create refuses it true); DeepseekV3TopkRouter
// (models/deepseek_v3/modeling_deepseek_v3.py @ f5a9ec512fa9fe69e51ea0c6388c68d50de567b3): sigmoid scores; the
// choice on scores + e_score_correction_bias, groups ranked by the sum of their top-2, the others masked to 0;
// the weights gathered from the unbiased scores, / (sum + 1e-20) when norm_topk_prob, times
// routed_scaling_factor. Both keep the weights in fp32 and combine the experts' outputs in fp32 (DeepseekV2MoE.moe:
// .type(topk_weight.dtype).mul_(...).sum(1); DeepseekV3MoE.moe: an fp32 final_hidden_states), then cast back.
// Neither computes a load-balancing loss (llama_create refuses moe.aux_loss on them).
struct MoeRouting {
  at::Tensor probs;  // [T, E] fp32: the router's scores (the softmax / sigmoid), for the aux loss record
  at::Tensor top_w;  // [T, k]: the routing weights (the compute dtype, or fp32 for DeepSeek)
  at::Tensor top_i;  // [T, k] int64: the experts chosen
};
MoeRouting moe_route(const MoeBlock& block, const ftplan::ModelSpec& spec, const at::Tensor& x);

// The MoE MLP on x [B, S, hidden] (the post-attention norm's output). Records the layer's counts and
// probabilities in `aux` (and, with aux->enabled and grad mode on, routes the load-balancing loss's
// gradient into the router through the block's output).
at::Tensor moe_forward(const MoeBlock& block, const ftplan::ModelSpec& spec, const at::Tensor& x, MoeAux& aux,
                       int64_t layer);

// The load-balancing loss of the last forward (router_aux_loss_coef included), a scalar that joins the
// loss: its value from the recorded counts and probabilities; its backward hands the upstream gradient
// to the blocks (aux.grad_scale). `anchor`: a tensor of the head's graph (the final hidden states).
at::Tensor moe_aux_loss(MoeAux& aux, const at::Tensor& anchor);

// Qwen2-MoE's shared expert joined to the routed experts' output: routed + sigmoid(shared_expert_gate(x)) *
// shared (the shared expert's output on x), or routed + shared without a gate.
at::Tensor moe_add_shared(const MoeBlock& block, const at::Tensor& x, const at::Tensor& routed, const at::Tensor& shared);

}  // namespace ftexec

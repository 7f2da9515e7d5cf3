// Tensor parallelism of the Llama block on LibTorch tensor ops and the tp group's collectives
// (Shoeybi et al. 2019, Megatron-LM; sequence parallelism: Korthikanti et al. 2022). The references:
// Megatron-LM megatron/core/tensor_parallel/{layers.py, mappings.py, cross_entropy.py} (commit
// 00611e6eeb0b09b5ee074750956855215ddbd67f: ColumnParallelLinear, RowParallelLinear,
// VocabParallelEmbedding, _VocabParallelCrossEntropy, copy_to / reduce_from / scatter_to /
// gather_from_sequence_parallel_region) and torchtitan's parallelize_llama
// (torchtitan/models/llama3/infra/parallelize.py, commit 81c1243395b46ce693a0681cfe1bb20e9b9433fb:
// q/k/v, w1/w3 colwise, wo/w2 rowwise, norms SequenceParallel, the embedding and output by vocabulary).
//
// Rank r of tp holds (every split contiguous, chunk r of tp):
//   q_proj, k_proj, v_proj, gate_proj, up_proj   column-parallel: rows (output features) split,
//                                                 biases too; q's heads H/tp, k's and v's KV heads KV/tp
//   o_proj, down_proj                             row-parallel: columns (input features) split; a bias
//                                                 whole, added once after the reduction
//   embed_tokens, lm_head                         by vocabulary rows (vocab-parallel embedding and
//                                                 cross-entropy; a tied head shares the embedding's rows)
//   norms                                         whole (replicated)
//   LoRA on a column-parallel linear              lora_A whole, lora_B split by rows as its base
//   LoRA on a row-parallel linear                 lora_A split by columns as its base, lora_B whole
// The block: f = copy to the tp region (identity forward, all-reduce of the gradient backward), g =
// reduce from it (all-reduce forward, identity backward); under sequence parallelism the residual
// stream and the norms hold S/tp tokens, f becomes an all-gather over the sequence (backward a
// reduce-scatter) and g a reduce-scatter (backward an all-gather). Per block: f before q/k/v and
// before gate/up, g after o_proj and after down_proj: 2 collectives forward, 2 backward (the
// planner's 4 per block, planner/step_time.cpp); the embedding's g and the head's f make the +2.
// A LoRA path joins its base: on a column-parallel linear B_r (A x) reads the base's f output, and A's
// gradient (a sum over the tp ranks' B_r) is all-reduced over tp; on a row-parallel one A_r x_r is
// reduced by its own g (r features per token) and B applied after it. Weights used on sequence shards
// (the norms, a row-parallel lora_B under sequence parallelism) have their gradients all-reduced over
// tp in backward, as Megatron's finalize_model_grads does for sequence-parallel layernorms.
// The loss: Megatron's vocabulary-parallel cross-entropy (max, then the sum of exponentials and the
// target's logit all-reduced over tp: 3 values per token), the softmax over the local vocabulary kept
// for backward; mean over the tokens whose label is not -100, as nll_loss does.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "executor/comm.h"
#include "planner/parallelism.h"

namespace ftexec {

struct LlamaModel;

struct TensorParallel {
  Comm* comm = nullptr;           // the tp group (DeviceMesh::tp), tp ranks
  int64_t tp = 1;                 // degree
  int64_t rank = 0;               // this rank's position in the group
  bool sequence_parallel = false;
  int64_t vocab_start = 0, vocab_end = 0;  // this rank's vocabulary rows [start, end)
};

// Splits `model` (whole on every rank, from the same seed) into this rank's shard and attaches the
// TP state (LlamaModel::tp): from here llama_embed, llama_block_apply and llama_head_loss run the
// tensor-parallel forward. `comm`: the tp group. Must run before the strategy takes the parameters.
void tp_shard_model(LlamaModel& model, Comm& comm, const ftplan::Parallelism& layout);

// The split dimension of a parameter under TP by its Hugging Face / PEFT name: 0 (rows), 1 (columns),
// or -1 (whole on every tp rank).
int tp_split_dim(const std::string& name);
// Whole on every tp rank (tp_split_dim == -1): counted once over tp in the gradient norm.
inline bool tp_replicated(const std::string& name) { return tp_split_dim(name) < 0; }

// The whole tensors of a unit from every tp rank's shards: each split tensor all-gathered over the
// tp group (every member calls it with the same unit). Returns the unit with whole tensors.
std::vector<std::pair<std::string, at::Tensor>> tp_gather_unit(const TensorParallel& tp,
                                                               const std::vector<std::pair<std::string, at::Tensor>>& unit);

// The forward pieces (llama_model.cpp dispatches to them when model.tp is set).
at::Tensor tp_embed(LlamaModel& model, const at::Tensor& input_ids);                 // [B, S(/tp), h]
at::Tensor tp_block_forward(LlamaModel& model, int64_t layer, const at::Tensor& x);  // x: [B, S(/tp), h]
at::Tensor tp_head_loss(LlamaModel& model, const at::Tensor& hidden, const at::Tensor& labels);

}  // namespace ftexec

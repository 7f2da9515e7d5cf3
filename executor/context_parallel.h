// Context parallelism of the Llama block on LibTorch tensor ops and the cp group's collectives: the
// sequence split into cp contiguous chunks, each cp rank running every token-wise op on its own
// chunk and attention over the whole sequence's K and V (ring attention: Liu et al. 2023,
// arXiv:2310.01889). The references: torch.distributed.tensor.experimental.context_parallel
// (pytorch torch/distributed/tensor/experimental/_attention.py, commit
// 0123248a484ffe531edb5098b986c1bac08cd296: _templated_ring_attention and its backward; the default
// rotate method ALL_GATHER, _AllGatherRotater: K and V all-gathered once per attention call, again in
// backward) and torchtitan's use of it (torchtitan/distributed/parallel_dims.py, commit
// 0119de156de558030726b8539ef0078d8aaaec99: FSDP shards over the flattened dp_shard x cp mesh
// "dp_shard_cp", gradients and the loss are reduced over "dp_cp").
//
// Rank c of cp (its cp coordinate on the device mesh, executor/device_mesh.h) holds tokens
// [c·S/cp, (c+1)·S/cp) of every sequence of its micro-batches (contiguous chunks: torch's
// load-balanced round-robin split is an optimisation of the causal work, not of the bytes):
//   the embedding, norms, MLP, q/k/v/o projections and the head    on the chunk only
//   RoPE                                                           at the chunk's global positions
//   attention (cp_mode=all_gather)                                 q of the chunk against K and V of
//        the whole sequence, all-gathered over cp (K and V of this rank's KV heads, before GQA's
//        repeat), the causal mask's rows offset to the chunk's place; backward gathers K and V again
//        (only the local chunks are kept for backward, as torch's rotater does), recomputes the
//        attention core and reduce-scatters the gradients of K and V over cp: per block and
//        micro-batch one all-gather forward, one all-gather and one reduce-scatter backward of
//        2·T·kv_dim/tp elements (the planner's sharded_layer_comm, planner/step_time.cpp)
//   the loss                                                       the sum of the chunk's token
//        losses over the global batch's labelled-token count, times cp: the strategies average
//        gradients and the reported loss over dp x cp (the parameters are replicated over cp and
//        their gradients reduced with data parallelism's, torchtitan's dp_cp), so the mean is the
//        global batch's mean over all its tokens.
// cp_mode=ring (K/V chunks passed around the ring, online-softmax merge) is not implemented here:
// refused by name (ftplan::exec_layout_problems).
#pragma once

#include <cstdint>
#include <memory>

#include <ATen/ATen.h>

#include "executor/comm.h"
#include "planner/parallelism.h"

namespace ftexec {

struct LlamaModel;

struct ContextParallel {
  Comm* comm = nullptr;  // the cp group (DeviceMesh::cp), cp ranks
  int64_t cp = 1;        // degree
  int64_t rank = 0;      // this rank's chunk
};

// Attaches the CP state (LlamaModel::cp): from here llama_embed and llama_head_loss take this rank's
// chunk of the ids and labels, RoPE and the causal mask are this chunk's rows, and attention runs
// over the cp group. After tp_shard_model (it multiplies LlamaModel::seq_shards by cp).
void cp_attach(LlamaModel& model, Comm& comm, const ftplan::Parallelism& layout);

// This rank's contiguous chunk of dimension 1 (the sequence) of t [B, S, ...].
at::Tensor cp_chunk(const ContextParallel& cp, const at::Tensor& t);

// The causal attention of this rank's queries q [B, H, S/cp, d] (RoPE applied at global positions)
// over every rank's k, v [B, KV, S/cp, d]; `mask` [S/cp, S] true where masked. Returns [B, H, S/cp, d].
at::Tensor cp_attention(const ContextParallel& cp, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const at::Tensor& mask, double scale);

// What this rank's loss is multiplied by so that averaging it over cp gives the global batch's mean:
// cp / (labelled tokens of the whole micro-batch), times the chunk's labelled tokens when `loss` is
// already a mean over them. `labels`: the whole micro-batch's; `local`: this rank's chunk.
double cp_loss_scale(const ContextParallel& cp, const at::Tensor& labels, const at::Tensor& local, bool local_mean);

}  // namespace ftexec

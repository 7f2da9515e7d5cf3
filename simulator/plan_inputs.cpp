#include "simulator/plan_inputs.h"

#include <algorithm>
#include <cmath>

#include "planner/collectives.h"
#include "planner/compute_model.h"
#include "planner/precision.h"

namespace ftplan::sim {

StepInputs step_inputs_from_plan(const PlanContext& ctx, const Candidate& c, bool overlap) {
  const ModelSpec& model = *ctx.memory.model;
  const HardwareSpec& hw = *ctx.memory.hw;
  const TrainingSetup& setup = *ctx.memory.setup;
  const PreparedJob& mem = ctx.memory;
  const int64_t B = c.micro_batch;
  const double T = micro_batch_tokens(setup, B);
  const Parallelism& layout = c.parallel;
  // Tensor and context parallelism split every token's work: each rank computes 1/(tp·cp) of it.
  // Each piece at its achieved rate (compute_model.h piece_rates: one rate unless calibrated).
  const double split = static_cast<double>(layout.tp * layout.cp);
  const PieceRates rates = ctx.rates_for(T / double(layout.cp), layout.ep);
  const double s_mm = 1.0 / (rates.block_matmul * split), s_att = 1.0 / (rates.attention * split),
               s_lora = 1.0 / (rates.lora * split), s_head = 1.0 / (rates.head * split);
  const ShardedLayerComm lc = sharded_layer_comm(ctx, c, T);
  const FlopsPerToken& f = ctx.flops;

  StepInputs in;
  const Parallelism& par = layout;
  in.parallel = par;
  in.name = c.name.empty() ? name(par) : c.name;
  const bool pipeline = is_pipeline(par);
  in.num_gpus = static_cast<int>(pipeline ? par.pp : std::max<int64_t>(1, par.gpus()));
  in.micro_batches = static_cast<int>(setup.grad_accum);
  in.checkpointing = c.checkpointing == Checkpointing::full;
  in.overlap = overlap;

  // QLoRA dequantises each block's NF4 weights before its forward and again before its backward.
  const double block_dequant = ctx.nf4_params ? nf4_dequant_time_s(ctx.nf4_params / layout.tp / model.num_layers, hw) : 0.0;
  // Autocast's effects where fp32 parameters meet the matmuls (not under FSDP/ZeRO-3): memory_model.h.
  const int ac = par.gathers_params() ? 0 : 1;
  const int64_t block_input = B * mem.block_input_bytes_per_sample[ac];

  LayerCost embedding;
  embedding.name = "embedding";
  embedding.param_bytes = ctx.embedding_weight_bytes;
  embedding.grad_bytes = ctx.embedding_grad_bytes;
  embedding.updated_param_bytes = ctx.embedding_update_bytes;
  embedding.checkpoint_bytes = block_input;
  embedding.checkpointable = false;
  embedding.tp_forward_comm_s = lc.tp_collective_s;  // the vocabulary-parallel embedding's output
  embedding.tp_comm_bytes = static_cast<int64_t>(lc.activation_bytes);
  in.layers.push_back(embedding);

  // A mixture of experts: the busiest rank's experts compute `load` x the balanced pairs (planner/step_time.cpp);
  // under expert parallelism each MoE block's all-to-all moves the busiest rank's rows of hidden_size.
  double load = 1;
  int64_t a2a_bytes = 0;
  if (model.moe.active()) {
    load = setup.moe.capacity_factor ? *setup.moe.capacity_factor : par.ep > 1 ? setup.moe.imbalance_factor : 1.0;
    if (par.ep > 1)
      a2a_bytes = static_cast<int64_t>(activation_bytes(setup.precision) * (T / par.cp) * double(model.moe.top_k) * load *
                                       double(model.hidden_size));
  }
  const double extra = (load - 1.0) * f.block_expert;
  // Eager element-wise work beyond fused kernels, as estimate_step counts it (compute_model.h): the recompute
  // under checkpointing replays forward_s.
  const double eager_block_s = eager_elementwise_bytes_per_token(model, *mem.framework, setup) * T / split / hw.hbm_bandwidth_bytes_per_s;
  for (int64_t l = 0; l < model.num_layers; ++l) {
    LayerCost block;
    block.name = "block " + std::to_string(l);
    block.forward_s = (f.block_matmul * s_mm + f.block_attention_executed * s_att + f.block_lora * s_lora) * T + block_dequant + eager_block_s;
    block.backward_input_s = (f.block_matmul * s_mm + 2 * f.block_attention_executed * s_att + f.block_lora * s_lora) * T + block_dequant +
                             2 * eager_block_s;
    block.backward_weight_s = ((f.weights_train ? f.block_matmul * s_mm : 0.0) + f.block_lora * s_lora) * T;
    if (model.moe.active()) {
      block.forward_s += extra * T * s_mm;
      block.backward_input_s += extra * T * s_mm;
      block.backward_weight_s += (f.weights_train ? extra : 0.0) * T * s_mm;
      if (model.moe.moe_layers[size_t(l)]) block.all_to_all_bytes = a2a_bytes;
    }
    block.param_bytes = ctx.block_weight_bytes;
    block.grad_bytes = ctx.block_grad_bytes;
    block.updated_param_bytes = ctx.block_update_bytes;
    const int selective = c.checkpointing == Checkpointing::selective ? 1 : 0;
    block.saved_activation_bytes = B * mem.block_bytes_per_sample[static_cast<int>(c.attention)][selective][ac] +
                                   (ac ? static_cast<int64_t>(mem.layer_weight_copy_bytes) : 0);
    block.checkpoint_bytes = block_input;
    block.tp_forward_comm_s = 2 * lc.tp_collective_s;   // after o_proj and down_proj
    block.tp_backward_comm_s = 2 * lc.tp_collective_s;  // the input gradients of q/k/v and gate/up
    block.tp_comm_bytes = static_cast<int64_t>(lc.activation_bytes);
    block.attention_forward_s = layout.cp > 1 ? lc.attention_forward_s : 0.0;
    block.cp_forward_comm_s = lc.cp_forward_s;
    block.cp_backward_comm_s = lc.cp_backward_s;
    in.layers.push_back(block);
  }

  LayerCost head;
  head.name = "head+loss";
  head.forward_s = f.head * T * s_head;
  head.backward_input_s = f.head * T * s_head;
  head.backward_weight_s = f.weights_train ? f.head * T * s_head : 0.0;
  head.param_bytes = ctx.head_weight_bytes;
  head.grad_bytes = ctx.head_grad_bytes;
  head.updated_param_bytes = ctx.head_update_bytes;
  head.saved_activation_bytes = B * mem.head_bytes_per_sample[ac] + (ac ? static_cast<int64_t>(mem.head_weight_copy_bytes) : 0);
  head.checkpoint_bytes = block_input;
  head.checkpointable = false;
  head.tp_backward_comm_s = lc.tp_collective_s;  // the head's input gradient
  head.tp_comm_bytes = static_cast<int64_t>(lc.activation_bytes);
  in.layers.push_back(head);
  // The loss's peak, alive from the head's forward to its backward (the closed form's logits_loss).
  in.logits_bytes = static_cast<int64_t>(B * mem.loss_peak_bytes_per_sample);

  // What stays resident all step: the memory model's weights, gradients, optimizer states and
  // overhead; DDP's bucket copy and ZeRO-1/2's buckets too. The simulator itself allocates the
  // gathered units and unsharded gradients of ZeRO-3/FSDP, and the activations.
  const MemoryEstimate e = estimate_memory(mem, c, ctx.num_gpus, false);
  const MemoryBreakdown& m = e.per_gpu;
  int64_t resident = m.weights + m.optimizer + m.overhead + mem.dequant_bytes;
  const bool sim_allocates_grads = par.shards_gradients();
  resident += m.gradients;
  if (!sim_allocates_grads && !pipeline) resident += m.temporary - mem.dequant_bytes;
  in.static_bytes_per_rank = resident;
  if (pipeline) {
    // Virtual stage j (chunk j / p of stage j mod p): its blocks, the embedding on the first, the head
    // on the last; a stage's static bytes are its chunks' model states, sharded over its
    // data-parallel group as the whole-model estimate shards them.
    const int p = in.num_gpus, V = p * pipeline_chunks(par);
    const double n = static_cast<double>(std::max<int64_t>(1, par.shard_group()));
    const double w = par.shards_params() ? n : 1, g = par.shards_gradients() ? n : 1, o = par.shards_optimizer() ? n : 1;
    std::vector<double> stage_bytes(p, 0.0);
    for (int j = 0; j < V; ++j) {
      const int64_t layers = model.num_layers / V + (j < model.num_layers % V ? 1 : 0);
      in.stage_layer_counts.push_back(static_cast<int>(layers + (j == 0 ? 1 : 0) + (j == V - 1 ? 1 : 0)));
      double bytes = layers * (mem.layer_weight_bytes / w + mem.layer_grad_bytes / g + mem.layer_opt_bytes / o);
      if (j == 0) bytes += mem.embedding_weight_bytes / w + mem.embedding_grad_bytes / g + mem.embedding_opt_bytes / o;
      if (j == V - 1)
        bytes += (mem.head_weight_bytes + mem.tied_head_weight_bytes) / w + mem.head_grad_bytes / g + mem.head_opt_bytes / o;
      stage_bytes[j % p] += bytes;
    }
    for (int k = 0; k < p; ++k)
      in.static_bytes_by_rank.push_back(static_cast<int64_t>(std::ceil(stage_bytes[k])) + m.overhead + mem.dequant_bytes);
  }
  in.optimizer_step_s = estimate_step(ctx, c).optimizer_s;

  // Communication: the planner's α-β formulas over the job's interconnect.
  const Interconnect grad_net = ctx.group_net(grad_group(par));
  const Interconnect shard_net = ctx.group_net(shard_group(par));
  const Interconnect replica_net = ctx.group_net(replicate_group(par));
  const Interconnect pp_net = ctx.group_net(pp_group(par));
  in.all_reduce_s = [grad_net](int64_t b) { return collective_time_s(grad_net, Collective::all_reduce, double(b)); };
  in.reduce_scatter_s = [shard_net](int64_t b) { return collective_time_s(shard_net, Collective::reduce_scatter, double(b)); };
  in.all_gather_s = [shard_net](int64_t b) { return collective_time_s(shard_net, Collective::all_gather, double(b)); };
  const int64_t shard = std::max<int64_t>(1, par.shard_group());
  in.replica_all_reduce_s = [replica_net, shard](int64_t b) {
    return collective_time_s(replica_net, Collective::all_reduce, double(b) / shard);
  };
  in.p2p_s = [pp_net](int64_t b) { return collective_time_s(pp_net, Collective::send_recv, double(b)); };
  in.host_copy_s = [shard_net](int64_t b) { return double(b) / shard_net.host_bandwidth_bytes_per_s; };
  const Interconnect ep_net = ctx.group_net(ep_group(par));
  in.all_to_all_s = [ep_net](int64_t b) { return collective_time_s(ep_net, Collective::all_to_all, double(b)); };
  in.all_to_all_overlap = ctx.memory.framework->expert_parallel_overlap;
  return in;
}

}  // namespace ftplan::sim

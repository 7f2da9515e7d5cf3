#include "planner/step_time.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "planner/precision.h"

namespace ftplan {

PlanContext prepare_plan(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup,
                         int64_t num_gpus, const ShardShape& shape) {
  return prepare_plan(model, hw, setup, num_gpus, shape, std::make_shared<PlanContext::GroupNets>());
}

PlanContext prepare_plan(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup, int64_t num_gpus,
                         const ShardShape& shape, std::shared_ptr<PlanContext::GroupNets> group_nets) {
  PlanContext c;
  c.group_nets = std::move(group_nets);
  c.memory = prepare_job(model, hw, setup, shape);
  // Padded batches under a framework that passes SDPA a padding mask run every key block (framework.h).
  c.flops = flops_per_token(model, setup, setup.packing || !c.memory.framework->padded_batches_pass_mask);
  c.num_gpus = std::max<int64_t>(1, num_gpus);
  c.net = c.group_net({c.num_gpus, 1});  // interconnect_for(hw, num_gpus), through the cache
  c.peak_flops = peak_flops(hw, setup.precision);
  c.efficiency = compute_efficiency(hw, setup);
  c.uniform_rates = piece_rates(model, hw, setup, 0.0);  // uniform: no calibration, or --efficiency
  if (!c.uniform_rates.uniform) c.uniform_rates = PieceRates{};
  const PreparedJob& m = c.memory;
  const double L = static_cast<double>(model.num_layers);
  // Expert parallelism: a block's data-parallel traffic carries its other parameters and the rank's own
  // experts (1/ep of them, exchanged within the expert group's dp_shard x cp / ep ranks: counted over the
  // shard group, a close approximation of the smaller group's ring).
  const bool ep_split = shape.ep > 1 && m.layer_expert_weight_bytes > 0;
  auto own = [&](double whole, double experts) { return ep_split ? whole - experts + experts / double(shape.ep) : whole; };
  const double layer_weight = own(m.layer_weight_bytes, m.layer_expert_weight_bytes);
  const double layer_grad = own(m.layer_grad_bytes, m.layer_expert_grad_bytes);
  c.weight_bytes = m.embedding_weight_bytes + L * layer_weight + m.head_weight_bytes;
  c.grad_bytes = m.embedding_grad_bytes + L * layer_grad + m.head_grad_bytes;
  c.layer_weight_bytes = layer_weight;
  c.layer_grad_bytes = layer_grad;
  c.trainable_params = m.trainable_params;
  c.expert_trainable_params = m.expert_trainable_params;
  c.nf4_params = trainable_params(model, setup).quantized;
  auto whole = [](double bytes) { return static_cast<int64_t>(std::ceil(bytes)); };
  c.embedding_weight_bytes = whole(m.embedding_weight_bytes);
  c.block_weight_bytes = whole(layer_weight);
  c.head_weight_bytes = whole(m.head_weight_bytes);
  c.embedding_grad_bytes = whole(m.embedding_grad_bytes);
  c.block_grad_bytes = whole(layer_grad);
  c.head_grad_bytes = whole(m.head_grad_bytes);
  // Updated trainable weights: gradient bytes / gradient width × weight width, exactly.
  const ParamBytes tb = trainable_param_bytes(setup.precision, setup.optimizer);
  auto updates = [&](int64_t grad_bytes) {
    return static_cast<int64_t>(std::llround(grad_bytes / tb.gradient)) * static_cast<int64_t>(tb.weight);
  };
  c.embedding_update_bytes = updates(c.embedding_grad_bytes);
  c.block_update_bytes = updates(c.block_grad_bytes);
  c.head_update_bytes = updates(c.head_grad_bytes);
  c.trainable_weight_bytes = c.embedding_update_bytes + L * c.block_update_bytes + c.head_update_bytes;
  c.weight_bytes = c.embedding_weight_bytes + L * c.block_weight_bytes + c.head_weight_bytes;
  c.grad_bytes = c.embedding_grad_bytes + L * c.block_grad_bytes + c.head_grad_bytes;
  return c;
}

PieceRates PlanContext::rates_for(double rows, int64_t ep) const {
  if (uniform_rates.uniform && uniform_rates.rate > 0) return uniform_rates;
  for (const auto& [key, r] : rates_cache)
    if (key.first == rows && key.second == ep) return r;
  if (rates_cache.size() > 64) rates_cache.clear();
  rates_cache.emplace_back(std::make_pair(rows, ep), piece_rates(*memory.model, *memory.hw, *memory.setup, rows, memory.shape.tp, ep));
  return rates_cache.back().second;
}

const Interconnect& PlanContext::group_net(const GroupPlacement& g) const {
  // group_interconnect reads the job's size only as the GPUs it uses on a node.
  const int64_t on_node = std::min<int64_t>(std::max<int64_t>(1, num_gpus), std::max<int64_t>(1, memory.hw->gpus_per_node));
  const auto key = std::make_tuple(g.size, g.stride, on_node);
  for (const auto& [k, net] : recent_nets)
    if (k == key) return *net;
  auto it = group_nets->find(key);
  if (it == group_nets->end()) it = group_nets->emplace(key, group_interconnect(*memory.hw, g.size, g.stride, on_node)).first;
  recent_nets.emplace_back(key, &it->second);
  return it->second;
}

double stage_unit_collective_s(const PlanContext& ctx, Collective c, UnitBytes which, const Interconnect& net,
                               double layers, bool embedding, bool head) {
  auto sum = [&](int64_t e, int64_t block, int64_t h) {
    return (embedding ? collective_time_s(net, c, e) : 0.0) + layers * collective_time_s(net, c, block) +
           (head ? collective_time_s(net, c, h) : 0.0);
  };
  switch (which) {
    case UnitBytes::weights: return sum(ctx.embedding_weight_bytes, ctx.block_weight_bytes, ctx.head_weight_bytes);
    case UnitBytes::gradients: return sum(ctx.embedding_grad_bytes, ctx.block_grad_bytes, ctx.head_grad_bytes);
    case UnitBytes::updates: return sum(ctx.embedding_update_bytes, ctx.block_update_bytes, ctx.head_update_bytes);
  }
  return 0.0;
}

double per_unit_collective_s(const PlanContext& ctx, Collective c, UnitBytes which, const Interconnect& net) {
  const double L = static_cast<double>(ctx.memory.model->num_layers);
  auto sum = [&](int64_t embedding, int64_t block, int64_t head) {
    return collective_time_s(net, c, embedding) + L * collective_time_s(net, c, block) + collective_time_s(net, c, head);
  };
  switch (which) {
    case UnitBytes::weights: return sum(ctx.embedding_weight_bytes, ctx.block_weight_bytes, ctx.head_weight_bytes);
    case UnitBytes::gradients: return sum(ctx.embedding_grad_bytes, ctx.block_grad_bytes, ctx.head_grad_bytes);
    case UnitBytes::updates: return sum(ctx.embedding_update_bytes, ctx.block_update_bytes, ctx.head_update_bytes);
  }
  return 0.0;
}

BucketedTime ddp_bucketed_all_reduce(const PlanContext& ctx, const StepOptions& opt) {
  return ddp_bucketed_all_reduce(ctx, opt, ctx.net, ctx.grad_bytes);
}

BucketedTime ddp_bucketed_all_reduce(const PlanContext& ctx, const StepOptions& opt, const Interconnect& net, double grad_bytes) {
  (void)ctx;
  BucketedTime t;
  const int64_t total = static_cast<int64_t>(grad_bytes);
  if (total <= 0) return t;
  auto ar = [&](int64_t bytes) { return collective_time_s(net, Collective::all_reduce, static_cast<double>(bytes)); };
  const int64_t first = std::min(total, opt.ddp_first_bucket_bytes);
  t.total_s = ar(first);
  t.last_s = t.total_s;
  t.buckets = 1;
  const int64_t rest = total - first;
  const int64_t full = rest / opt.ddp_bucket_bytes, remainder = rest % opt.ddp_bucket_bytes;
  if (full > 0) {
    t.total_s += full * ar(opt.ddp_bucket_bytes);
    t.last_s = ar(opt.ddp_bucket_bytes);
    t.buckets += full;
  }
  if (remainder > 0) {
    t.total_s += ar(remainder);
    t.last_s = ar(remainder);
    t.buckets += 1;
  }
  return t;
}

namespace {
// The bytes of one element of a block input as this job checkpoints it (memory_model.h).
double residual_bytes_of(const PlanContext& ctx) {
  const auto& j = ctx.memory;
  return double(j.residual_bytes[0]);
}
}  // namespace

double micro_batch_tokens(const TrainingSetup& setup, int64_t micro_batch) {
  // Packed rows fill seq_len; padded batches are timed at the mean row length where the dataset
  // gives one (the padding is not counted): compute_model.h timed_row_tokens.
  return static_cast<double>(micro_batch) * timed_row_tokens(setup);
}

double lora_tp_bytes(const PlanContext& ctx, const Candidate& cand, double tokens, double stage_layers,
                     double exchange_bytes) {
  // LoRA's adapters under tensor parallelism, as ftexec runs them (executor/tensor_parallel.h, after
  // Megatron-LM's f and g, megatron/core/tensor_parallel/mappings.py at commit
  // 00611e6eeb0b09b5ee074750956855215ddbd67f: lora_A whole on a column-parallel base, split by input
  // features on a row-parallel one, lora_B split by output features on a column-parallel base, whole on
  // a row-parallel one). Bytes only, like the loss's all-reduces: r wide, their time is latency.
  // Per micro-batch and block, for each adapted linear:
  //   column-parallel (q, k, v, gate, up): lora_A is whole and every rank's B_r adds to its gradient:
  //     lora_A's gradient (r x in_features) is all-reduced in backward;
  //   row-parallel (o, down): A_r x_r is a partial sum, reduced by its own g: [tokens, r] all-reduced in
  //     forward (under sequence parallelism reduce-scattered, its gradient all-gathered in backward),
  //     again when full checkpointing recomputes the forward; under sequence parallelism lora_B runs on
  //     sequence shards and its gradient (out_features x r) is all-reduced like a norm's.
  // The base is frozen, the embedding too: nothing before the first block's attention needs a gradient,
  // so its f's backward (an all-reduce; under sequence parallelism the reduce-scatter, with the
  // embedding's g's backward all-gather) never runs: one exchange less, on the first stage. With a
  // pipeline the busiest stage is the last (the head's exchange, nothing skipped).
  const ModelSpec& model = *ctx.memory.model;
  const TrainingSetup& setup = *ctx.memory.setup;
  const Parallelism& par = cand.parallel;
  const double r = static_cast<double>(setup.lora.rank);
  const double act_elem = activation_bytes(setup.precision);
  const double grad_elem = trainable_param_bytes(setup.precision, setup.optimizer).gradient;
  const double z = act_elem * (tokens / par.cp) * r;  // A_r x_r of one row-parallel linear
  const bool ckpt = cand.checkpointing == Checkpointing::full;
  double block = 0;
  for (const LinearShape& lin : block_linears(model)) {
    if (std::find(setup.lora.targets.begin(), setup.lora.targets.end(), lin.name) == setup.lora.targets.end()) continue;
    const bool row = lin.role == LinearRole::attention_out || lin.role == LinearRole::mlp_out;
    if (!row) {
      block += lin.instances * wire_bytes(Collective::all_reduce, r * lin.in_features * grad_elem, par.tp);
    } else if (par.sequence_parallel) {
      block += lin.instances * (wire_bytes(Collective::reduce_scatter, z, par.tp) * (ckpt ? 2.0 : 1.0) +
                                wire_bytes(Collective::all_gather, z, par.tp) +
                                wire_bytes(Collective::all_reduce, lin.out_features * r * grad_elem, par.tp));
    } else {
      block += lin.instances * wire_bytes(Collective::all_reduce, z, par.tp) * (ckpt ? 2.0 : 1.0);
    }
  }
  return stage_layers * block - (par.pp == 1 ? exchange_bytes : 0.0);
}

ShardedLayerComm sharded_layer_comm(const PlanContext& ctx, const Candidate& cand, double tokens) {
  const ModelSpec& model = *ctx.memory.model;
  const TrainingSetup& setup = *ctx.memory.setup;
  const Parallelism& par = cand.parallel;
  const double T = tokens;
  const double act_elem = activation_bytes(setup.precision);
  const PieceRates rates = ctx.rates_for(T / double(par.cp), par.ep);
  ShardedLayerComm lc;
  lc.attention_forward_s = ctx.flops.block_attention_executed * T / rates.attention / static_cast<double>(par.tp * par.cp);
  // Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): per block two all-reduces of the activations
  // in forward (after the row-parallel o_proj and down_proj) and two in backward (the input gradients of
  // the column-parallel q/k/v and gate/up), two more when full checkpointing recomputes the forward;
  // with sequence parallelism each becomes a reduce-scatter plus an all-gather, the same volume
  // (Korthikanti et al. 2022, sec. 4.2.2). The vocabulary-parallel embedding all-reduces its output,
  // the head its input gradient. On the critical path: not overlapped.
  if (par.tp > 1) {
    const Interconnect& tp_net = ctx.group_net(tp_group(par));
    const double act = act_elem * (T / par.cp) * model.hidden_size;
    lc.activation_bytes = act;
    if (par.sequence_parallel) {
      lc.tp_collective_s = collective_time_s(tp_net, Collective::reduce_scatter, act) + collective_time_s(tp_net, Collective::all_gather, act);
      lc.tp_collective_bytes = wire_bytes(Collective::reduce_scatter, act, par.tp) + wire_bytes(Collective::all_gather, act, par.tp);
    } else {
      lc.tp_collective_s = collective_time_s(tp_net, Collective::all_reduce, act);
      lc.tp_collective_bytes = wire_bytes(Collective::all_reduce, act, par.tp);
    }
  }
  // Context parallelism: each layer's attention needs every chunk's K and V. Ring: cp - 1 chunks
  // passed around in forward, K/V and their gradients in backward, each step overlapped with the
  // attention over the chunk in hand (ring attention, Liu et al. 2023); all-gather: K and V gathered
  // in forward, gathered again and their gradients reduce-scattered in backward, not overlapped
  // (torch's context_parallel default).
  if (par.cp > 1) {
    const Interconnect& cp_net = ctx.group_net(cp_group(par));
    const double kv_per_rank = double(model.kv_dim()) * std::max<int64_t>(1, model.num_kv_heads >= par.tp ? 1 : par.tp / model.num_kv_heads) / par.tp;
    const double kv_all = 2.0 * act_elem * T * kv_per_rank;  // K and V of the whole sequence, one TP rank's heads
    if (par.cp_mode == ContextParallel::ring) {
      const double chunk = kv_all / par.cp;
      const double step = collective_time_s(Collective::send_recv, chunk, 2, cp_net.nodes > 1 ? std::min(cp_net.p2p_bandwidth_bytes_per_s, cp_net.inter_bandwidth_bytes_per_s) : cp_net.p2p_bandwidth_bytes_per_s, cp_net.latency_s);
      lc.cp_forward_s = (par.cp - 1) * step;
      lc.cp_backward_s = 2.0 * (par.cp - 1) * step;
      lc.cp_forward_bytes = (par.cp - 1) * chunk;
      lc.cp_backward_bytes = 2.0 * (par.cp - 1) * chunk;
    } else {
      const double ag = collective_time_s(cp_net, Collective::all_gather, kv_all);
      const double rs = collective_time_s(cp_net, Collective::reduce_scatter, kv_all);
      lc.cp_forward_s = ag;
      lc.cp_backward_s = ag + rs;
      lc.cp_forward_bytes = wire_bytes(Collective::all_gather, kv_all, par.cp);
      lc.cp_backward_bytes = wire_bytes(Collective::all_gather, kv_all, par.cp) + wire_bytes(Collective::reduce_scatter, kv_all, par.cp);
    }
  }
  return lc;
}

double paged_state_migration_s(double paged_state_bytes, double free_device_bytes, double host_bandwidth_bytes_per_s) {
  if (paged_state_bytes <= 0 || paged_state_bytes <= free_device_bytes || host_bandwidth_bytes_per_s <= 0) return 0;
  return 2.0 * paged_state_bytes / host_bandwidth_bytes_per_s;
}

StepEstimate estimate_step(const PlanContext& ctx, const Candidate& cand, const StepOptions& opt) {
  const ModelSpec& model = *ctx.memory.model;
  const HardwareSpec& hw = *ctx.memory.hw;
  const TrainingSetup& setup = *ctx.memory.setup;
  const Parallelism& par = cand.parallel;
  if (!(shard_shape(par) == ctx.memory.shape))
    throw std::logic_error("estimate_step: the candidate's tp/sp/cp differ from the plan context's shape");
  const double G = static_cast<double>(setup.grad_accum);
  // Tokens per micro-batch per data-parallel replica.
  const double T = micro_batch_tokens(setup, cand.micro_batch);
  // The achieved FLOP/s of each piece at this micro-batch's GEMM shapes (compute_model.h).
  const PieceRates rates = ctx.rates_for(T / double(par.cp), par.ep);
  const double rate = rates.rate;
  const bool ckpt = cand.checkpointing == Checkpointing::full;
  // Tensor and context parallelism split every token's work: each rank computes 1/(tp·cp) of it.
  const double split = static_cast<double>(par.tp * par.cp);
  // Selective checkpointing recomputes part of each block in backward: the attention core
  // (Korthikanti et al. 2022), or the matmuls torchtitan's policy does not save (k, o and up
  // projections) with the pointwise ops between them.
  double selective_recompute = 0;
  if (cand.checkpointing == Checkpointing::selective) {
    if (ctx.memory.framework->selective_mode == "every-second-matmul") {
      const double h = model.hidden_size, q = model.q_dim(), kv = model.kv_dim(), i = model.intermediate_size;
      const double all = h * (q + 2 * kv) + q * h + 3 * h * i;
      selective_recompute = ctx.flops.block_matmul * model.num_layers * (h * kv + q * h + h * i) / all;
    } else {
      selective_recompute = ctx.flops.block_attention_executed * model.num_layers;
    }
  }

  // A mixture of experts: the busiest rank's experts compute `load` x the balanced token-expert pairs (the
  // imbalance factor under expert parallelism; capacity-limited routing pads to capacity_factor everywhere).
  double expert_extra_forward = 0, expert_extra_backward = 0, load = 1;
  if (model.moe.active()) {
    load = setup.moe.capacity_factor ? *setup.moe.capacity_factor : par.ep > 1 ? setup.moe.imbalance_factor : 1.0;
    expert_extra_forward = (load - 1.0) * model.num_layers * ctx.flops.block_expert;
    expert_extra_backward = expert_extra_forward * (ctx.flops.weights_train ? 2.0 : 1.0) + (ckpt ? expert_extra_forward : 0);
  }
  // One micro-batch through the whole model on one GPU (its 1/(tp·cp) share).
  double forward = 0, backward = 0;
  if (rates.uniform) {
    forward = (ctx.flops.forward_executed + expert_extra_forward) * T / rate / split;
    backward = (ctx.flops.backward_executed + (ckpt ? ctx.flops.block_forward_executed : 0) + selective_recompute + expert_extra_backward) * T / rate / split;
  } else {
    // Each piece at its own rate: recompute at the forward's rates, selective recompute of the attention
    // core at attention's (of matmuls at the block matmuls'), the busiest expert rank's extra at the matmuls'.
    const double selective_s = selective_recompute / (ctx.memory.framework->selective_mode == "every-second-matmul" ? rates.block_matmul : rates.attention);
    forward = (forward_s_per_token(model, ctx.flops, rates) + expert_extra_forward / rates.block_matmul) * T / split;
    backward = (backward_s_per_token(model, ctx.flops, rates) + (ckpt ? model.num_layers * block_forward_s_per_token(ctx.flops, rates) : 0) +
                selective_s + expert_extra_backward / rates.block_matmul) * T / split;
  }
  // Eager element-wise work beyond fused kernels (compute_model.h eager_elementwise_bytes_per_token), at HBM
  // bandwidth: once in forward, twice in backward, once more where full checkpointing recomputes the blocks.
  const double eager_block_s = eager_elementwise_bytes_per_token(model, *ctx.memory.framework, setup) * T / split /
                               hw.hbm_bandwidth_bytes_per_s;
  forward += model.num_layers * eager_block_s;
  backward += model.num_layers * eager_block_s * (ckpt ? 3.0 : 2.0);
  const double dequant = ctx.nf4_params ? nf4_dequant_time_s(ctx.nf4_params / par.tp, hw) * (ckpt ? 3 : 2) : 0;
  // Activation offloading: each block input goes to the host in forward and back in backward, on
  // its own stream (torchtune's OffloadActivations): only what compute cannot hide is exposed.
  const double seq_split = static_cast<double>(par.cp * (par.sequence_parallel ? par.tp : 1));
  const double offload_bytes =
      cand.activation_offload ? 2.0 * model.num_layers * residual_bytes_of(ctx) * T * model.hidden_size / seq_split : 0;
  const double offload_s = offload_bytes / hw.pcie_host_bandwidth_bytes_per_s;
  double micro = forward + backward + dequant + (opt.overlap ? std::max(0.0, offload_s - (forward + backward)) : offload_s);

  auto exposed = [&](double comm, double window, double unhideable) {
    return opt.overlap ? std::max(std::min(comm, unhideable), comm - window) : comm;
  };

  // Tensor and context parallelism: per layer and micro-batch (sharded_layer_comm), summed here.
  double tp_comm = 0, tp_bytes = 0, cp_comm = 0, cp_exposed = 0, cp_bytes = 0;
  const double act_elem = activation_bytes(setup.precision);
  if (par.tp > 1 || par.cp > 1) {
    const ShardedLayerComm lc = sharded_layer_comm(ctx, cand, T);
    const double L = model.num_layers;
    // 4 exchanges per block (+2 when full checkpointing recomputes the forward), + the embedding's
    // and the head's.
    const double count = (4.0 + (ckpt ? 2.0 : 0.0)) * L + 2.0;
    tp_comm = count * lc.tp_collective_s;
    // Bytes on the busiest rank: a pipeline stage exchanges for its own ceil(L/pp) blocks, and holds
    // the embedding or the head, not both (the time above is the whole model's, shared by the stages).
    const double stage_count = par.pp > 1 ? (4.0 + (ckpt ? 2.0 : 0.0)) * std::ceil(L / double(par.pp)) + 1.0 : count;
    tp_bytes = stage_count * lc.tp_collective_bytes;
    if (par.tp > 1) {
      // The vocabulary-parallel cross-entropy all-reduces 3 fp32 values per token: the logits' maximum,
      // the sum of exponentials and the target's logit (Megatron-LM megatron/core/tensor_parallel/
      // cross_entropy.py; ftexec sends the last two in one call). Bytes only: their time is noise.
      tp_bytes += wire_bytes(Collective::all_reduce, 3.0 * 4.0 * T / par.cp, par.tp);
      // Sequence parallelism: a norm weight's gradient is a sum over the tokens, which are split over
      // tp: all-reduced over tp (Megatron's _allreduce_layernorm_grads does it once per step; ftexec
      // once per micro-batch, counted here as ftexec does it): a stage's 2 norms per block + the final.
      if (par.sequence_parallel && setup.method == Method::full) {
        const double stage_layers = std::ceil(double(model.num_layers) / double(par.pp));
        tp_bytes += wire_bytes(Collective::all_reduce, (2.0 * stage_layers + 1.0) * model.hidden_size * act_elem, par.tp);
      }
      if (setup.method == Method::lora || setup.method == Method::qlora)
        tp_bytes += lora_tp_bytes(ctx, cand, T, std::ceil(L / double(par.pp)), lc.tp_collective_bytes);
    }
    const double passes = ckpt ? 2.0 : 1.0;  // full checkpointing exchanges again while it recomputes
    cp_comm = L * (passes * lc.cp_forward_s + lc.cp_backward_s);
    cp_bytes = L * (passes * lc.cp_forward_bytes + lc.cp_backward_bytes);
    cp_exposed = par.cp_mode == ContextParallel::ring
                     ? L * (passes * exposed(lc.cp_forward_s, lc.attention_forward_s, 0.0) +
                            exposed(lc.cp_backward_s, 2.0 * lc.attention_forward_s, 0.0))
                     : cp_comm;
  }
  // Expert parallelism: every MoE block dispatches its tokens to the experts' ranks and combines the outputs
  // back, an all-to-all each, in forward, twice more in backward (their gradients), again under full
  // checkpointing's recompute. The busiest rank receives load x its own T·top_k rows of hidden_size. Exposed
  // unless the framework overlaps them with the experts' compute (configs/frameworks: expert_parallel_overlap).
  double ep_comm = 0, ep_exposed = 0, ep_bytes = 0;
  if (par.ep > 1 && model.moe.active()) {
    const Interconnect& ep_net = ctx.group_net(ep_group(par));
    const double rows = (T / par.cp) * double(model.moe.top_k) * load;
    const double buffer = act_elem * rows * model.hidden_size;
    const double count = (4.0 + (ckpt ? 2.0 : 0.0)) * double(model.moe.num_moe_layers());
    ep_comm = count * collective_time_s(ep_net, Collective::all_to_all, buffer);
    ep_bytes = count * wire_bytes(Collective::all_to_all, buffer, par.ep);
    const double expert_compute =
        (ctx.flops.block_expert * model.num_layers * load * (ctx.flops.weights_train ? 3.0 : 2.0)) * T / rates.block_matmul / split;
    ep_exposed = ctx.memory.framework->expert_parallel_overlap ? exposed(ep_comm, expert_compute, 0.0) : ep_comm;
  }
  micro += tp_comm + cp_exposed;

  StepEstimate s;
  double tokens = G * T * static_cast<double>(par.dp());  // every data-parallel replica's micro-batches
  double per_step_exposed = 0, comm = 0, bytes = 0;
  const double model_parallel = static_cast<double>(par.tp * par.pp);
  double optimizer = optimizer_step_time_s(ctx.trainable_params, hw,
                                          optimizer_step_bytes_per_param(setup.precision, setup.optimizer,
                                                                         ctx.memory.framework->optimizer_foreach,
                                                                         setup.paged_optimizer)) /
                     model_parallel;
  double compute = G * micro;
  const int64_t shard = par.shard_group();
  const Interconnect& shard_net = ctx.group_net(shard_group(par));
  const Interconnect& grad_net = ctx.group_net(grad_group(par));
  auto stime = [&](Collective c, double b) { return collective_time_s(shard_net, c, b); };

  if (par.pp > 1) {
    const double p = static_cast<double>(par.pp);
    const double v = par.schedule == PipelineSchedule::interleaved_1f1b ? static_cast<double>(par.virtual_stages) : 1.0;
    // One activation (or its gradient) to the neighbouring stage: sequence-parallel stages send their
    // 1/tp of the tokens.
    const double act = act_elem * T * model.hidden_size / seq_split;
    const Interconnect& pp_net = ctx.group_net(pp_group(par));
    const double hop = collective_time_s(pp_net, Collective::send_recv, act);
    if (par.schedule == PipelineSchedule::naive) {
      // One stage busy at a time: a micro-batch walks through p stages forward and back.
      compute = G * micro;
      comm = G * 2 * (p - 1) * hop;
      per_step_exposed = comm;
      s.bubble_s = G * micro * (p - 1) / p;  // each GPU idles while the others work
      s.bubble_fraction = (p - 1) / p;
    } else {
      // m micro-batches through p stages of v chunks each: (v·m + p - 1) slots of one chunk's work
      // (GPipe, 1F1B: v = 1; interleaved: the bubble shrinks v-fold, Narayanan et al. 2021, sec. 2.2).
      const double m = G;
      const double slot = micro / (p * v) + 2 * hop;
      compute = m * micro / p;
      comm = m * v * 2 * hop;
      per_step_exposed = comm;
      s.bubble_s = (p - 1) * slot;
      s.bubble_fraction = (p - 1) / (v * m + p - 1);
    }
    // The busiest stage: a middle one sends each micro-batch's activation forward and its
    // gradient back; with two stages each sends one of the two.
    bytes = G * v * act * (p > 2 ? 2 : p > 1 ? 1 : 0);
    s.comm_bytes_per_group.pp = bytes;
    // Data parallelism over each stage: its gradients (and, sharded, its parameters), once per
    // optimizer step after the stage's last backward, exposed.
    const double layers = std::ceil(double(model.num_layers) / p);
    if (par.grad_group() > 1) {
      const double stage_grads = layers * ctx.block_grad_bytes + std::max(ctx.embedding_grad_bytes, ctx.head_grad_bytes);
      double dp_comm = 0, dp_bytes = 0;
      if (par.sharding == Sharding::none) {
        dp_comm = stage_unit_collective_s(ctx, Collective::all_reduce, UnitBytes::gradients, grad_net, layers, true, false);
        dp_bytes = wire_bytes(Collective::all_reduce, stage_grads, par.grad_group());
      } else {
        dp_comm = stage_unit_collective_s(ctx, Collective::reduce_scatter, UnitBytes::gradients, shard_net, layers, true, false);
        dp_bytes = wire_bytes(Collective::reduce_scatter, stage_grads, shard);
        if (par.shards_params()) {  // parameters gathered once per step and kept through the micro-batches
          const double stage_weights = layers * ctx.block_weight_bytes + std::max(ctx.embedding_weight_bytes, ctx.head_weight_bytes);
          dp_comm += stage_unit_collective_s(ctx, Collective::all_gather, UnitBytes::weights, shard_net, layers, true, false);
          dp_bytes += wire_bytes(Collective::all_gather, stage_weights, shard);
        } else {  // ZeRO-1: the updated parameters gathered after the step
          const double stage_updates = layers * ctx.block_update_bytes + std::max(ctx.embedding_update_bytes, ctx.head_update_bytes);
          dp_comm += stage_unit_collective_s(ctx, Collective::all_gather, UnitBytes::updates, shard_net, layers, true, false);
          dp_bytes += wire_bytes(Collective::all_gather, stage_updates, shard);
        }
        if (par.dp_replicate > 1) {
          const double ar = collective_time_s(ctx.group_net(replicate_group(par)), Collective::all_reduce, stage_grads / shard);
          dp_comm += ar;
          dp_bytes += wire_bytes(Collective::all_reduce, stage_grads / shard, par.dp_replicate);
        }
        optimizer /= shard;
      }
      comm += dp_comm;
      per_step_exposed += dp_comm;
      bytes += dp_bytes;
    }
  } else if (par.sharding == Sharding::none) {
    if (par.grad_group() > 1) {  // DDP
      const BucketedTime ar = ddp_bucketed_all_reduce(ctx, opt, grad_net, ctx.grad_bytes);
      comm = ar.total_s;
      per_step_exposed = exposed(ar.total_s, backward, ar.last_s);
      bytes = wire_bytes(Collective::all_reduce, ctx.grad_bytes, par.grad_group());
    }
  } else if (!par.shards_params() && !par.offload_optimizer) {
    // ZeRO-1/2, per unit: gradients reduce-scattered as backward produces them; updated parameters gathered.
    const double rs = per_unit_collective_s(ctx, Collective::reduce_scatter, UnitBytes::gradients, shard_net);
    const double ag = per_unit_collective_s(ctx, Collective::all_gather, UnitBytes::updates, shard_net);
    const double reductions = par.zero_stage == 1 ? 1.0 : G;
    const double rs_exposed = exposed(rs, backward, stime(Collective::reduce_scatter, ctx.embedding_grad_bytes ? ctx.embedding_grad_bytes : ctx.block_grad_bytes));
    comm = reductions * rs + ag;
    per_step_exposed = reductions * rs_exposed + ag;
    bytes = reductions * wire_bytes(Collective::reduce_scatter, ctx.grad_bytes, shard) +
            wire_bytes(Collective::all_gather, ctx.trainable_weight_bytes, shard);
    optimizer /= shard;
  } else if (!par.shards_params()) {
    // ZeRO-Offload (stage 1/2): gradient shards to the host, Adam on the CPU, updated shards back.
    const double rs = per_unit_collective_s(ctx, Collective::reduce_scatter, UnitBytes::gradients, shard_net);
    const double down = ctx.grad_bytes / shard / shard_net.host_bandwidth_bytes_per_s;  // gradient shard to host
    const double up = ctx.trainable_weight_bytes / shard / shard_net.host_bandwidth_bytes_per_s;
    const double ag = per_unit_collective_s(ctx, Collective::all_gather, UnitBytes::updates, shard_net);
    comm = G * (rs + down) + up + ag;
    per_step_exposed = G * exposed(rs + down, backward, stime(Collective::reduce_scatter, ctx.block_grad_bytes)) + up + ag;
    bytes = G * wire_bytes(Collective::reduce_scatter, ctx.grad_bytes, shard) + wire_bytes(Collective::all_gather, ctx.trainable_weight_bytes, shard);
    optimizer = ctx.trainable_params / model_parallel / double(shard) / kCpuAdamParamsPerS;
  } else {
    // ZeRO-3 / FSDP: each unit gathered before use, gradients reduce-scattered.
    const double gathers = par.reshard_after_forward ? 2.0 : 1.0;  // forward, backward
    // Each unit is gathered before its forward and again before its backward (ZeRO-3: 1.5x DDP's
    // volume), except that PyTorch FSDP keeps its last (root) unit gathered from forward into
    // backward, and a frozen embedding (LoRA, QLoRA) has no backward: its input, the token ids,
    // needs no gradient, so no pre-backward hook fires for it.
    const bool full_shard = gathers == 2.0;
    const double root_kept = par.sharding == Sharding::fsdp && par.reshard_after_forward ? 1.0 : 0.0;
    const double frozen_embedding = full_shard && ctx.embedding_grad_bytes == 0 ? 1.0 : 0.0;
    double mb_comm = gathers * per_unit_collective_s(ctx, Collective::all_gather, UnitBytes::weights, shard_net) -
                     root_kept * stime(Collective::all_gather, ctx.head_weight_bytes) -
                     frozen_embedding * stime(Collective::all_gather, ctx.embedding_weight_bytes) +
                     per_unit_collective_s(ctx, Collective::reduce_scatter, UnitBytes::gradients, shard_net);
    const double gathered = gathers * ctx.weight_bytes - root_kept * ctx.head_weight_bytes -
                            frozen_embedding * ctx.embedding_weight_bytes;
    double mb_bytes = wire_bytes(Collective::all_gather, gathered, shard) +
                      wire_bytes(Collective::reduce_scatter, ctx.grad_bytes, shard);
    if (par.offload_params) {  // parameters come up from the host for each use
      mb_comm += gathered / shard / shard_net.host_bandwidth_bytes_per_s;
    }
    // The first unit's gather and the last unit's reduce-scatter have no compute to hide behind.
    const double unhidden = stime(Collective::all_gather, ctx.embedding_weight_bytes) +
                            stime(Collective::reduce_scatter, ctx.embedding_grad_bytes ? ctx.embedding_grad_bytes : ctx.block_grad_bytes);
    comm = G * mb_comm;
    per_step_exposed = G * exposed(mb_comm, micro, unhidden);
    bytes = G * mb_bytes;
    if (par.offload_optimizer && !par.offload_params) {  // gradient shards down, updated shards up
      const double down = ctx.grad_bytes / shard / shard_net.host_bandwidth_bytes_per_s;
      const double up = ctx.trainable_weight_bytes / shard / shard_net.host_bandwidth_bytes_per_s;
      comm += G * down + up;
      per_step_exposed += G * down + up;
    }
    if (par.dp_replicate > 1) {  // replicas (HSDP) all-reduce their gradient shards
      const double ar = collective_time_s(ctx.group_net(replicate_group(par)), Collective::all_reduce, ctx.grad_bytes / shard);
      comm += ar;
      per_step_exposed += ar;
      bytes += wire_bytes(Collective::all_reduce, ctx.grad_bytes / shard, par.dp_replicate);
    }
    optimizer = par.offload_optimizer ? ctx.trainable_params / model_parallel / double(shard) / kCpuAdamParamsPerS
                                      : optimizer / shard;
  }
  comm += G * (tp_comm + cp_comm + ep_comm);
  per_step_exposed += G * ep_exposed;
  s.comm_bytes_per_group.dp = bytes - s.comm_bytes_per_group.pp;
  s.comm_bytes_per_group.tp = G * tp_bytes;
  s.comm_bytes_per_group.cp = G * cp_bytes;
  s.comm_bytes_per_group.ep = G * ep_bytes;
  bytes += G * (tp_bytes + cp_bytes + ep_bytes);
  // Expert parallelism with unsharded optimizer states: each rank steps its own experts only (sharded states
  // already hold 1/(dp_shard x cp) of the experts, as of the rest).
  if (par.ep > 1 && ctx.expert_trainable_params > 0 && !par.shards_optimizer() && ctx.trainable_params > 0) {
    const double own = double(ctx.trainable_params - ctx.expert_trainable_params) + double(ctx.expert_trainable_params) / par.ep;
    optimizer *= own / double(ctx.trainable_params);
  }
  // Paged optimizer states (bitsandbytes) that do not fit beside the step's own peak: moved in and out
  // once per optimizer step (paged_state_migration_s).
  if (setup.paged_optimizer) {
    const MemoryEstimate m = estimate_memory(ctx.memory, cand, ctx.num_gpus, false);
    s.paged_state_migration_s =
        paged_state_migration_s(double(m.per_gpu.paged_optimizer), double(hw.memory_bytes) - double(m.device_peak),
                                hw.pcie_host_bandwidth_bytes_per_s);
    optimizer += s.paged_state_migration_s;
  }
  s.compute_s = compute;
  s.comm_s = comm;
  s.exposed_comm_s = per_step_exposed;
  s.optimizer_s = optimizer;
  const bool pipelined = par.pp > 1 && par.schedule != PipelineSchedule::naive;
  s.step_time_s = compute + per_step_exposed + optimizer + (pipelined ? s.bubble_s : 0);
  s.tokens_per_step = tokens;
  s.tokens_per_s = tokens / s.step_time_s;
  s.flops_per_step = ctx.flops.model * tokens;
  const int64_t gpus_used = std::max<int64_t>(1, par.gpus());
  s.mfu = s.flops_per_step / (s.step_time_s * gpus_used * ctx.peak_flops);
  s.comm_bytes_per_step = bytes;
  return s;
}

}  // namespace ftplan

#include "planner/step_time.h"

#include <algorithm>
#include <cmath>

#include "planner/precision.h"

namespace ftplan {

PlanContext prepare_plan(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup,
                         int64_t num_gpus) {
  PlanContext c;
  c.memory = prepare_job(model, hw, setup);
  c.flops = flops_per_token(model, setup);
  c.num_gpus = std::max<int64_t>(1, num_gpus);
  c.net = interconnect_for(hw, c.num_gpus);
  c.peak_flops = peak_flops(hw, setup.precision);
  c.efficiency = compute_efficiency(hw, setup);
  const PreparedJob& m = c.memory;
  const double L = static_cast<double>(model.num_layers);
  c.weight_bytes = m.embedding_weight_bytes + L * m.layer_weight_bytes + m.head_weight_bytes;
  c.grad_bytes = m.embedding_grad_bytes + L * m.layer_grad_bytes + m.head_grad_bytes;
  c.layer_weight_bytes = m.layer_weight_bytes;
  c.layer_grad_bytes = m.layer_grad_bytes;
  c.trainable_params = m.trainable_params;
  c.nf4_params = trainable_params(model, setup).quantized;
  auto whole = [](double bytes) { return static_cast<int64_t>(std::ceil(bytes)); };
  c.embedding_weight_bytes = whole(m.embedding_weight_bytes);
  c.block_weight_bytes = whole(m.layer_weight_bytes);
  c.head_weight_bytes = whole(m.head_weight_bytes);
  c.embedding_grad_bytes = whole(m.embedding_grad_bytes);
  c.block_grad_bytes = whole(m.layer_grad_bytes);
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
  BucketedTime t;
  const int64_t total = static_cast<int64_t>(ctx.grad_bytes);
  if (total <= 0) return t;
  auto ar = [&](int64_t bytes) { return collective_time_s(ctx.net, Collective::all_reduce, static_cast<double>(bytes)); };
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
  const double per_token = double(j.setup->memory_seq_len()) * j.model->hidden_size;
  return per_token > 0 ? j.block_input_bytes_per_sample[0] / per_token : 2.0;
}
}  // namespace

StepEstimate estimate_step(const PlanContext& ctx, const Candidate& cand, const StepOptions& opt) {
  const ModelSpec& model = *ctx.memory.model;
  const HardwareSpec& hw = *ctx.memory.hw;
  const TrainingSetup& setup = *ctx.memory.setup;
  const Interconnect& net = ctx.net;
  const int64_t N = ctx.num_gpus;
  const double G = static_cast<double>(setup.grad_accum);
  // Tokens per micro-batch per GPU: packed rows fill seq_len; padded batches are timed at the mean
  // row length where the dataset gives one (the padding is not counted).
  const double row = !setup.packing && setup.dataset.mean_tokens_per_row > 0
                         ? std::min<double>(setup.dataset.mean_tokens_per_row, setup.seq_len)
                         : static_cast<double>(setup.seq_len);
  const double T = static_cast<double>(cand.micro_batch) * row;
  const double rate = ctx.peak_flops * ctx.efficiency;
  const bool ckpt = cand.checkpointing == Checkpointing::full;
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
      selective_recompute = ctx.flops.block_attention * model.num_layers;
    }
  }

  // One micro-batch through the whole model on one GPU.
  const double forward = ctx.flops.forward * T / rate;
  const double backward = (ctx.flops.backward + (ckpt ? ctx.flops.block_forward : 0) + selective_recompute) * T / rate;
  const double dequant = ctx.nf4_params ? nf4_dequant_time_s(ctx.nf4_params, hw) * (ckpt ? 3 : 2) : 0;
  // Activation offloading: each block input goes to the host in forward and back in backward, on
  // its own stream (torchtune's OffloadActivations): only what compute cannot hide is exposed.
  const double offload_bytes = cand.activation_offload ? 2.0 * model.num_layers * residual_bytes_of(ctx) * T * model.hidden_size : 0;
  const double offload_s = offload_bytes / hw.pcie_host_bandwidth_bytes_per_s;
  const double micro = forward + backward + dequant + (opt.overlap ? std::max(0.0, offload_s - (forward + backward)) : offload_s);

  auto time = [&](Collective c, double bytes) { return collective_time_s(net, c, bytes); };
  // Communication `comm` hidden behind a compute window, except `unhideable`.
  auto exposed = [&](double comm, double window, double unhideable) {
    return opt.overlap ? std::max(std::min(comm, unhideable), comm - window) : comm;
  };

  StepEstimate s;
  double tokens = G * T;             // one replica
  double per_step_exposed = 0, comm = 0, bytes = 0;
  double optimizer = optimizer_step_time_s(ctx.trainable_params, hw);
  double compute = G * micro;
  switch (cand.strategy) {
    case Strategy::single: break;
    case Strategy::ddp: {
      const BucketedTime ar = ddp_bucketed_all_reduce(ctx, opt);
      comm = ar.total_s;
      per_step_exposed = exposed(ar.total_s, backward, ar.last_s);
      bytes = wire_bytes(Collective::all_reduce, ctx.grad_bytes, N);
      tokens *= N;
      break;
    }
    case Strategy::zero1:
    case Strategy::zero2: {
      // Per unit: gradients reduce-scattered as backward produces them; updated parameters gathered.
      const double rs = per_unit_collective_s(ctx, Collective::reduce_scatter, UnitBytes::gradients, net);
      const double ag = per_unit_collective_s(ctx, Collective::all_gather, UnitBytes::updates, net);
      const double reductions = cand.strategy == Strategy::zero1 ? 1.0 : G;
      const double rs_exposed = exposed(rs, backward, time(Collective::reduce_scatter, ctx.embedding_grad_bytes ? ctx.embedding_grad_bytes : ctx.block_grad_bytes));
      comm = reductions * rs + ag;
      per_step_exposed = reductions * rs_exposed + ag;
      bytes = reductions * wire_bytes(Collective::reduce_scatter, ctx.grad_bytes, N) +
              wire_bytes(Collective::all_gather, ctx.trainable_weight_bytes, N);
      optimizer /= N;
      tokens *= N;
      break;
    }
    case Strategy::zero3:
    case Strategy::fsdp:
    case Strategy::fsdp_shard_grad_op:
    case Strategy::fsdp_hybrid:
    case Strategy::zero3_offload: {
      const bool hybrid = cand.strategy == Strategy::fsdp_hybrid;
      Interconnect shard_net = net;
      if (hybrid) shard_net.nodes = 1, shard_net.num_gpus = net.gpus_per_node;
      const int64_t shard = hybrid ? net.gpus_per_node : N;
      auto stime = [&](Collective c, double b) { return collective_time_s(shard_net, c, b); };
      const double gathers = cand.strategy == Strategy::fsdp_shard_grad_op ? 1.0 : 2.0;  // forward, backward
      // Each unit is gathered before its forward and again before its backward (ZeRO-3: 1.5x DDP's
      // volume), except that PyTorch FSDP keeps its last (root) unit gathered from forward into
      // backward, and a frozen embedding (LoRA, QLoRA) has no backward: its input, the token ids,
      // needs no gradient, so no pre-backward hook fires for it.
      const bool full_shard = gathers == 2.0;
      const double root_kept = cand.strategy == Strategy::fsdp || hybrid ? 1.0 : 0.0;
      const double frozen_embedding = full_shard && ctx.embedding_grad_bytes == 0 ? 1.0 : 0.0;
      double mb_comm = gathers * per_unit_collective_s(ctx, Collective::all_gather, UnitBytes::weights, shard_net) -
                       root_kept * stime(Collective::all_gather, ctx.head_weight_bytes) -
                       frozen_embedding * stime(Collective::all_gather, ctx.embedding_weight_bytes) +
                       per_unit_collective_s(ctx, Collective::reduce_scatter, UnitBytes::gradients, shard_net);
      const double gathered = gathers * ctx.weight_bytes - root_kept * ctx.head_weight_bytes -
                              frozen_embedding * ctx.embedding_weight_bytes;
      double mb_bytes = wire_bytes(Collective::all_gather, gathered, shard) +
                        wire_bytes(Collective::reduce_scatter, ctx.grad_bytes, shard);
      if (cand.strategy == Strategy::zero3_offload) {  // parameters come up from the host for each use
        mb_comm += gathered / shard / net.host_bandwidth_bytes_per_s;
      }
      // The first unit's gather and the last unit's reduce-scatter have no compute to hide behind.
      const double unhidden = stime(Collective::all_gather, ctx.embedding_weight_bytes) +
                              stime(Collective::reduce_scatter, ctx.embedding_grad_bytes ? ctx.embedding_grad_bytes : ctx.block_grad_bytes);
      comm = G * mb_comm;
      per_step_exposed = G * exposed(mb_comm, micro, unhidden);
      bytes = G * mb_bytes;
      if (hybrid && net.nodes > 1) {  // replicas across nodes all-reduce their gradient shards
        const double ar = collective_time_s(Collective::all_reduce, ctx.grad_bytes / shard, net.nodes,
                                            net.inter_bandwidth_bytes_per_s, net.latency_s);
        comm += ar;
        per_step_exposed += ar;
        bytes += wire_bytes(Collective::all_reduce, ctx.grad_bytes / shard, net.nodes);
      }
      optimizer = cand.strategy == Strategy::zero3_offload ? ctx.trainable_params / double(N) / kCpuAdamParamsPerS
                                                           : optimizer / shard;
      tokens *= N;
      break;
    }
    case Strategy::zero2_offload: {
      const double rs = per_unit_collective_s(ctx, Collective::reduce_scatter, UnitBytes::gradients, net);
      const double down = ctx.grad_bytes / N / net.host_bandwidth_bytes_per_s;  // gradient shard to host
      const double up = ctx.trainable_weight_bytes / N / net.host_bandwidth_bytes_per_s;
      const double ag = per_unit_collective_s(ctx, Collective::all_gather, UnitBytes::updates, net);
      comm = G * (rs + down) + up + ag;
      per_step_exposed = G * exposed(rs + down, backward, time(Collective::reduce_scatter, ctx.block_grad_bytes)) + up + ag;
      bytes = G * wire_bytes(Collective::reduce_scatter, ctx.grad_bytes, N) + wire_bytes(Collective::all_gather, ctx.trainable_weight_bytes, N);
      optimizer = ctx.trainable_params / double(N) / kCpuAdamParamsPerS;
      tokens *= N;
      break;
    }
    case Strategy::mp:
    case Strategy::pipeline_gpipe:
    case Strategy::pipeline_1f1b: {
      const double p = static_cast<double>(std::min<int64_t>(N, model.num_layers));
      const double act = activation_bytes(setup.precision) * T * model.hidden_size;
      const double hop = time(Collective::send_recv, act);  // one activation (or its gradient) to a neighbour
      if (cand.strategy == Strategy::mp) {
        // One stage busy at a time: a micro-batch walks through p stages forward and back.
        compute = G * micro;
        comm = G * 2 * (p - 1) * hop;
        per_step_exposed = comm;
        s.bubble_s = G * micro * (p - 1) / p;  // each GPU idles while the others work
        s.bubble_fraction = (p - 1) / p;
      } else {
        // m micro-batches through p stages: (m + p - 1) slots of one stage's work.
        const double m = G;
        const double slot = micro / p + 2 * hop;
        compute = m * micro / p;
        comm = m * 2 * hop;
        per_step_exposed = comm;
        s.bubble_s = (p - 1) * slot;
        s.bubble_fraction = (p - 1) / (m + p - 1);
      }
      // The busiest stage: a middle one sends each micro-batch's activation forward and its
      // gradient back; with two stages each sends one of the two.
      bytes = G * act * (p > 2 ? 2 : p > 1 ? 1 : 0);
      optimizer /= p;
      break;
    }
  }
  s.compute_s = compute;
  s.comm_s = comm;
  s.exposed_comm_s = per_step_exposed;
  s.optimizer_s = optimizer;
  const bool pipelined = cand.strategy == Strategy::pipeline_gpipe || cand.strategy == Strategy::pipeline_1f1b;
  s.step_time_s = compute + per_step_exposed + optimizer + (pipelined ? s.bubble_s : 0);
  s.tokens_per_step = tokens;
  s.tokens_per_s = tokens / s.step_time_s;
  s.flops_per_step = ctx.flops.model * tokens;
  const int64_t gpus_used = cand.strategy == Strategy::single ? 1 : N;
  s.mfu = s.flops_per_step / (s.step_time_s * gpus_used * ctx.peak_flops);
  s.comm_bytes_per_step = bytes;
  return s;
}

}  // namespace ftplan

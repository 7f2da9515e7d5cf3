#include "simulator/graph_builders.h"

#include <algorithm>
#include <string>

namespace ftplan::sim {
namespace {

constexpr std::size_t kNone = static_cast<std::size_t>(-1);

// Creates ops on a graph, chains each rank's compute stream in program order, and collects the
// allocations until their freeing op is known.
struct Builder {
  const StepInputs& in;
  OpGraph g;
  std::vector<Allocation> allocs;
  std::vector<OpId> last_compute;
  std::vector<std::vector<OpId>> pending;  // blocking comm ops the rank's next compute op waits for

  Builder(const StepInputs& inputs, int ranks, int represented, std::size_t expected_ops)
      : in(inputs), last_compute(ranks, kNoOp), pending(ranks) {
    g.num_ranks = ranks;
    g.num_ranks_represented = represented;
    allocs.reserve(expected_ops);
  }

  OpId add(OpKind kind, int rank, Stream stream, double duration_s, int layer, int micro_batch,
           int64_t bytes, std::string label) {
    Op op;
    op.kind = kind;
    op.rank = rank;
    op.stream = stream;
    op.duration_s = duration_s;
    op.layer = layer;
    op.micro_batch = micro_batch;
    op.bytes = bytes;
    op.label = std::move(label);
    const OpId id = graph_add_op(g, std::move(op));
    if (stream == Stream::compute) {
      graph_add_edge(g, last_compute[rank], id);
      last_compute[rank] = id;
      for (OpId blocker : pending[rank]) graph_add_edge(g, blocker, id);
      pending[rank].clear();
    }
    return id;
  }

  // A communication op the rank's next compute op must wait for (on the critical path).
  OpId add_blocking(OpKind kind, int rank, double duration_s, int layer, int micro_batch, int64_t bytes,
                    std::string label, OpId after, Stream stream = Stream::comm) {
    const OpId id = add(kind, rank, stream, duration_s, layer, micro_batch, bytes, std::move(label));
    graph_add_edge(g, after, id);
    pending[rank].push_back(id);
    return id;
  }

  std::size_t alloc(std::string label, int rank, int64_t bytes, OpId from) {
    Allocation a;
    a.label = std::move(label);
    a.rank = rank;
    a.bytes = bytes;
    a.alloc_op = from;
    allocs.push_back(std::move(a));
    return allocs.size() - 1;
  }

  void free_at(std::size_t alloc_index, OpId op) {
    if (alloc_index != kNone) allocs[alloc_index].free_op = op;
  }

  OpGraph finish() {
    allocs.erase(std::remove_if(allocs.begin(), allocs.end(), [](const Allocation& a) { return a.bytes == 0; }),
                 allocs.end());
    for (const Allocation& a : allocs) {  // what graph_add_allocation does, without moving each one
      if (a.alloc_op != kNoOp) (*g.graph)[a.alloc_op].allocated_bytes += a.bytes;
      if (a.free_op != kNoOp) (*g.graph)[a.free_op].freed_bytes += a.bytes;
    }
    g.allocations = std::move(allocs);
    if (!in.overlap) graph_serialize_per_rank(g);
    return std::move(g);
  }

  std::string unit_name(int layer) const {
    const std::string& name = in.layers[layer].name;
    return name.empty() ? "L" + std::to_string(layer) : name;
  }
};

std::string mb_suffix(int micro_batch) { return " mb" + std::to_string(micro_batch); }

bool is_checkpointed(const StepInputs& in, int layer) {
  return in.checkpointing && in.layers[layer].checkpointable;
}

// The ops of one compute step of a unit and the exchanges around it.
struct Span {
  OpId first = kNoOp;  // the first compute op
  OpId last = kNoOp;   // the last compute op
  OpId done = kNoOp;   // what a consumer waits for: the last compute op, or the tensor-parallel collective after it
};

// A unit's compute op (`duration_s`) with its context-parallel K/V exchange `cp_s` and its
// tensor-parallel collectives `tp_s`. Ring attention splits the op: the attention part
// (`attention_s`) runs beside the exchange and the rest waits for it, so only what the attention
// does not hide is exposed; an all-gather of K/V comes before the op, blocking. The tensor-parallel
// collectives follow the op and block the next compute op (Megatron-LM's all-reduce after the
// row-parallel linears; with sequence parallelism a reduce-scatter and an all-gather).
Span emit_exchanging(Builder& b, OpKind kind, int rank, double duration_s, double attention_s, double cp_s, double tp_s,
                     int layer, int micro_batch, const std::string& label) {
  const bool ring = b.in.parallel.cp_mode == ContextParallel::ring;
  const LayerCost& l = b.in.layers[layer];
  Span sp;
  if (cp_s > 0 && !ring)
    b.add_blocking(OpKind::all_gather, rank, cp_s, layer, micro_batch, 0, "cp all-gather K/V " + label, b.last_compute[rank],
                   Stream::mp_comm);
  if (cp_s > 0 && ring) {
    const OpId before = b.last_compute[rank];
    sp.first = b.add(kind, rank, Stream::compute, attention_s, layer, micro_batch, 0, label + " (attention)");
    const OpId exchange = b.add(OpKind::send, rank, Stream::mp_comm, cp_s, layer, micro_batch, 0, "cp ring K/V " + label);
    graph_add_edge(b.g, before, exchange);
    b.pending[rank].push_back(exchange);
    sp.last = b.add(kind, rank, Stream::compute, duration_s - attention_s, layer, micro_batch, 0, label);
  } else {
    sp.first = sp.last = b.add(kind, rank, Stream::compute, duration_s, layer, micro_batch, 0, label);
  }
  sp.done = sp.last;
  if (tp_s > 0)
    sp.done = b.add_blocking(b.in.parallel.sequence_parallel ? OpKind::reduce_scatter : OpKind::all_reduce, rank, tp_s,
                             layer, micro_batch, l.tp_comm_bytes, "tp " + std::string(b.in.parallel.sequence_parallel ? "reduce-scatter+all-gather " : "all-reduce ") + label,
                             sp.last, Stream::mp_comm);
  return sp;
}

struct ForwardOps {
  OpId op = kNoOp;     // the last compute op
  OpId first = kNoOp;  // the first compute op
  OpId done = kNoOp;   // what the next stage waits for
  std::size_t saved = kNone;   // saved activations or, under checkpointing, the checkpoint
  std::size_t logits = kNone;  // the head only
};

// Expert parallelism: a MoE block's all-to-alls of one pass (`count` of them: dispatch and combine, or
// their gradients, and again for a recompute) as one op on the expert_comm stream (the ep group's own
// communicator), issued when the previous compute op ends; unless the framework overlaps them, the
// block's compute waits for it.
OpId emit_all_to_all(Builder& b, int rank, int layer, int micro_batch, int count, const std::string& what) {
  const LayerCost& l = b.in.layers[layer];
  if (l.all_to_all_bytes <= 0) return kNoOp;
  const OpId op = b.add(OpKind::all_to_all, rank, Stream::expert_comm, count * b.in.all_to_all_s(l.all_to_all_bytes), layer,
                        micro_batch, count * l.all_to_all_bytes, "all-to-all x" + std::to_string(count) + " " + what +
                        " " + b.unit_name(layer) + mb_suffix(micro_batch));
  graph_add_edge(b.g, b.last_compute[rank], op);
  return b.in.all_to_all_overlap ? kNoOp : op;
}

ForwardOps emit_forward(Builder& b, int rank, int layer, int micro_batch) {
  const LayerCost& l = b.in.layers[layer];
  const std::string name = b.unit_name(layer);
  const std::string mb = mb_suffix(micro_batch);
  ForwardOps f;
  // The MoE block's dispatch and combine come first; the compute waits for them (unless overlapped).
  if (const OpId a2a = emit_all_to_all(b, rank, layer, micro_batch, 2, "fwd"); a2a != kNoOp) b.pending[rank].push_back(a2a);
  const Span sp = emit_exchanging(b, OpKind::forward, rank, l.forward_s, l.attention_forward_s, l.cp_forward_comm_s,
                                  l.tp_forward_comm_s, layer, micro_batch, "fwd " + name + mb);
  f.op = sp.last;
  f.first = sp.first;
  f.done = sp.done;
  if (is_checkpointed(b.in, layer))
    f.saved = b.alloc("checkpoint " + name + mb, rank, l.checkpoint_bytes, f.first);
  else
    f.saved = b.alloc("saved activations " + name + mb, rank, l.saved_activation_bytes, f.first);
  if (layer + 1 == static_cast<int>(b.in.layers.size()))
    f.logits = b.alloc("logits" + mb, rank, b.in.logits_bytes, f.first);
  return f;
}

struct BackwardOps {
  OpId first = kNoOp;
  OpId input = kNoOp;   // backward_input's last compute op
  OpId weight = kNoOp;  // backward_weight, the last op of the unit
};

BackwardOps emit_backward(Builder& b, int rank, int layer, int micro_batch, const ForwardOps& f) {
  const LayerCost& l = b.in.layers[layer];
  const std::string name = b.unit_name(layer);
  const std::string mb = mb_suffix(micro_batch);
  BackwardOps ops;
  std::size_t recomputed = kNone;
  // Expert parallelism: the backward all-to-alls (and a recompute's) before the block's first compute op.
  if (const OpId a2a = emit_all_to_all(b, rank, layer, micro_batch, is_checkpointed(b.in, layer) ? 4 : 2, "bwd"); a2a != kNoOp)
    b.pending[rank].push_back(a2a);
  if (is_checkpointed(b.in, layer)) {
    const Span re = emit_exchanging(b, OpKind::recompute, rank, l.forward_s, l.attention_forward_s, l.cp_forward_comm_s,
                                    l.tp_forward_comm_s, layer, micro_batch, "recompute " + name + mb);
    ops.first = re.first;
    recomputed = b.alloc("recomputed activations " + name + mb, rank, l.saved_activation_bytes, ops.first);
  }
  const Span in = emit_exchanging(b, OpKind::backward_input, rank, l.backward_input_s, 2 * l.attention_forward_s,
                                  l.cp_backward_comm_s, l.tp_backward_comm_s, layer, micro_batch, "bwd-in " + name + mb);
  ops.input = in.last;
  ops.weight = b.add(OpKind::backward_weight, rank, Stream::compute, l.backward_weight_s, layer,
                     micro_batch, 0, "bwd-w " + name + mb);
  if (ops.first == kNoOp) ops.first = in.first;
  b.free_at(f.logits, ops.input);
  b.free_at(f.saved, ops.weight);
  b.free_at(recomputed, ops.weight);
  return ops;
}

// At least the number of buckets ddp_bucket_plan makes (a cheap reservation hint).
std::size_t ddp_bucket_count_bound(const StepInputs& in) {
  int64_t total = 0;
  for (const LayerCost& l : in.layers) total += l.grad_bytes;
  return static_cast<std::size_t>(total / in.bucket_bytes) + 2;
}

}  // namespace

std::vector<DdpBucket> ddp_bucket_plan(const StepInputs& in) {
  std::vector<DdpBucket> plan;
  int64_t cap = in.first_bucket_bytes;
  int64_t fill = 0;
  int ready = 0;
  for (int i = static_cast<int>(in.layers.size()) - 1; i >= 0; --i) {
    int64_t left = in.layers[i].grad_bytes;
    while (left > 0) {
      const int64_t take = std::min(left, cap - fill);
      fill += take;
      left -= take;
      ready = i;
      if (fill == cap) {
        plan.push_back({fill, i});
        fill = 0;
        cap = in.bucket_bytes;
      }
    }
  }
  if (fill > 0) plan.push_back({fill, ready});
  return plan;
}

std::vector<PipelineSlot> pipeline_stage_order(PipelineSchedule schedule, int stage, int stages,
                                               int micro_batches, int chunks) {
  std::vector<PipelineSlot> order;
  const int m = micro_batches;
  if (schedule == PipelineSchedule::naive) {
    for (int k = 0; k < m; ++k) {
      order.push_back({k, true});
      order.push_back({k, false});
    }
  } else if (schedule == PipelineSchedule::gpipe) {
    // GPipe (Huang et al. 2019, fig. 2c): all forwards, then all backwards in reverse.
    for (int k = 0; k < m; ++k) order.push_back({k, true});
    for (int k = m - 1; k >= 0; --k) order.push_back({k, false});
  } else if (schedule == PipelineSchedule::interleaved_1f1b && chunks > 1) {
    // Megatron-LM's interleaved 1F1B (Narayanan et al. 2021, fig. 4 bottom; megatron/core/pipeline_parallel/
    // schedules.py forward_backward_pipelining_with_interleaving): m·v virtual micro-batches; the k-th
    // runs chunk (k mod p·v) / p (backward: the chunks in reverse) of micro-batch (k / p·v)·p + k mod p;
    // stage s warms up with (p - s - 1)·2 + (v - 1)·p forwards (all of them when m = p).
    const int p = stages, v = chunks, total = m * v;
    auto micro = [&](int k) { return (k / (p * v)) * p + k % p; };
    auto chunk = [&](int k, bool forward) {
      const int c = (k % (p * v)) / p;
      return forward ? c : v - 1 - c;
    };
    const int warmup = m == p ? total : std::min(total, (p - stage - 1) * 2 + (v - 1) * p);
    for (int k = 0; k < warmup; ++k) order.push_back({micro(k), true, chunk(k, true)});
    for (int i = 0; i < total - warmup; ++i) {
      order.push_back({micro(warmup + i), true, chunk(warmup + i, true)});
      order.push_back({micro(i), false, chunk(i, false)});
    }
    for (int k = total - warmup; k < total; ++k) order.push_back({micro(k), false, chunk(k, false)});
  } else {
    // 1F1B / PipeDream-flush (Narayanan et al. 2021, fig. 4): stage s warms up with p-s-1 forwards.
    const int warmup = std::min(stages - stage - 1, m);
    for (int k = 0; k < warmup; ++k) order.push_back({k, true});
    for (int i = 0; i < m - warmup; ++i) {
      order.push_back({warmup + i, true});
      order.push_back({i, false});
    }
    for (int k = m - warmup; k < m; ++k) order.push_back({k, false});
  }
  return order;
}

OpGraph build_data_parallel_graph(const StepInputs& in) {
  validate_step_inputs(in);
  const Parallelism& par = in.parallel;
  const int layers = static_cast<int>(in.layers.size());
  const int m = in.micro_batches;
  const int64_t n = std::max<int64_t>(1, par.shard_group());
  const bool ddp = par.sharding == Sharding::none && par.grad_group() > 1;
  const bool full_shard = par.shards_params() && par.reshard_after_forward;
  const bool gathers = par.shards_params();
  // PyTorch FSDP does not reshard the last (root) unit after forward; DeepSpeed ZeRO-3 regathers it.
  const bool keeps_last = par.sharding == Sharding::fsdp && par.reshard_after_forward;
  const bool reduce_every_mb = par.shards_gradients();
  const bool reduce_scatters = par.sharding != Sharding::none;
  const bool offload = par.offload_optimizer;
  const bool gather_after_step = par.sharding != Sharding::none && !par.shards_params();
  const std::size_t expected_ops = static_cast<std::size_t>(m) * layers * 6 + 2 * static_cast<std::size_t>(layers) +
                                   (ddp ? ddp_bucket_count_bound(in) : 0) + 1;
  Builder b(in, 1, in.num_gpus, expected_ops);
  b.alloc("static: weights, gradients, optimizer states", 0, in.static_bytes_per_rank, kNoOp);

  // The units in execution order: per micro-batch the forwards, then the backwards in reverse.
  struct Unit {
    int layer, micro_batch;
    bool forward, gather;
  };
  std::vector<Unit> units;
  units.reserve(static_cast<std::size_t>(2) * layers * m);
  for (int k = 0; k < m; ++k) {
    for (int i = 0; i < layers; ++i) units.push_back({i, k, true, gathers});
    // Backward gathers again, but not FSDP's root, nor a first unit without gradients (a frozen
    // embedding: its input needs no gradient, so it has no backward to gather for).
    for (int i = layers - 1; i >= 0; --i)
      units.push_back({i, k, false, full_shard && !(keeps_last && i == layers - 1) && !(i == 0 && in.layers[0].grad_bytes == 0)});
  }
  std::vector<OpId> gather_op(units.size(), kNoOp);
  std::vector<std::size_t> gather_alloc(units.size(), kNone);
  auto issue_gather = [&](std::size_t j, OpId after) {
    const Unit& u = units[j];
    const int64_t bytes = in.layers[u.layer].param_bytes;
    if (!u.gather || bytes == 0) return;
    const std::string what = b.unit_name(u.layer) + (u.forward ? " fwd" : " bwd") + mb_suffix(u.micro_batch);
    gather_op[j] = b.add(OpKind::all_gather, 0, Stream::comm, in.all_gather_s(bytes), u.layer,
                         u.micro_batch, bytes, "all-gather " + what);
    graph_add_edge(b.g, after, gather_op[j]);
    gather_alloc[j] = b.alloc("gathered params " + what, 0, bytes, gather_op[j]);
  };
  // Prefetch: unit j's all-gather is issued when unit j-1-depth has finished computing.
  const std::size_t ahead = 1 + static_cast<std::size_t>(in.fsdp_prefetch_depth);
  for (std::size_t j = 0; j < std::min(ahead, units.size()); ++j) issue_gather(j, kNoOp);

  const std::vector<DdpBucket> buckets = ddp ? ddp_bucket_plan(in) : std::vector<DdpBucket>{};
  std::size_t next_bucket = 0;
  std::vector<ForwardOps> forwards(layers);
  std::vector<std::size_t> kept_gather(layers, kNone);  // gathered in forward, freed after backward
  std::vector<OpId> before_step;                        // the gradient communication's last ops
  for (std::size_t j = 0; j < units.size(); ++j) {
    const Unit& u = units[j];
    const bool last_mb = u.micro_batch == m - 1;
    OpId first, last;
    if (u.forward) {
      forwards[u.layer] = emit_forward(b, 0, u.layer, u.micro_batch);
      first = last = forwards[u.layer].op;
    } else {
      const BackwardOps ops = emit_backward(b, 0, u.layer, u.micro_batch, forwards[u.layer]);
      first = ops.first;
      last = ops.weight;
    }
    graph_add_edge(b.g, gather_op[j], first);
    if (u.forward && gather_alloc[j] != kNone && (!full_shard || (keeps_last && u.layer == layers - 1)))
      kept_gather[u.layer] = gather_alloc[j];
    else
      b.free_at(gather_alloc[j], last);
    if (!u.forward) {
      b.free_at(kept_gather[u.layer], last);
      kept_gather[u.layer] = kNone;
    }
    if (j + ahead < units.size()) issue_gather(j + ahead, last);
    if (u.forward) continue;

    // Gradient communication, once backward_weight (`last`) has produced the unit's gradients.
    const LayerCost& l = in.layers[u.layer];
    const std::string what = b.unit_name(u.layer) + mb_suffix(u.micro_batch);
    if (ddp && last_mb) {
      // Buckets are planned in backward order, so the ready ones are next in line.
      for (; next_bucket < buckets.size() && buckets[next_bucket].ready_after_layer == u.layer; ++next_bucket) {
        const std::size_t k = next_bucket;
        const OpId ar = b.add(OpKind::all_reduce, 0, Stream::comm, in.all_reduce_s(buckets[k].bytes),
                              u.layer, u.micro_batch, buckets[k].bytes, "all-reduce bucket " + std::to_string(k));
        graph_add_edge(b.g, last, ar);
        before_step.push_back(ar);
      }
    }
    if (reduce_scatters && (reduce_every_mb || last_mb) && l.grad_bytes > 0) {
      const std::size_t grads =
          reduce_every_mb ? b.alloc("unsharded grads " + what, 0, l.grad_bytes, last) : kNone;
      OpId tail = b.add(OpKind::reduce_scatter, 0, Stream::comm, in.reduce_scatter_s(l.grad_bytes),
                        u.layer, u.micro_batch, l.grad_bytes, "reduce-scatter " + what);
      graph_add_edge(b.g, last, tail);
      b.free_at(grads, tail);
      if (par.dp_replicate > 1) {
        const OpId ar = b.add(OpKind::all_reduce, 0, Stream::comm, in.replica_all_reduce_s(l.grad_bytes),
                              u.layer, u.micro_batch, l.grad_bytes, "replica all-reduce " + what);
        graph_add_edge(b.g, tail, ar);
        tail = ar;
      }
      if (offload) {
        const int64_t shard = l.grad_bytes / n;
        const OpId down = b.add(OpKind::copy_to_host, 0, Stream::host_copy, in.host_copy_s(shard),
                                u.layer, u.micro_batch, shard, "grads to host " + what);
        graph_add_edge(b.g, tail, down);
        tail = down;
      }
      before_step.push_back(tail);
    }
  }

  // The optimizer step, then whatever brings the updated parameters back.
  const OpId step = b.add(OpKind::optimizer_step, 0, offload ? Stream::cpu : Stream::compute,
                          in.optimizer_step_s, -1, -1, 0, offload ? "optimizer step (host)" : "optimizer step");
  for (OpId op : before_step) graph_add_edge(b.g, op, step);
  if (offload) graph_add_edge(b.g, b.last_compute[0], step);
  if (offload || gather_after_step) {
    for (int i = 0; i < layers; ++i) {
      const LayerCost& unit = in.layers[i];  // the updated (trainable) parameters
      const int64_t bytes = unit.updated_param_bytes >= 0 ? unit.updated_param_bytes : unit.grad_bytes;
      if (bytes == 0) continue;
      OpId after = step;
      if (offload) {
        after = b.add(OpKind::copy_to_device, 0, Stream::host_copy, in.host_copy_s(bytes / n), i, -1,
                      bytes / n, "params to device " + b.unit_name(i));
        graph_add_edge(b.g, step, after);
      }
      if (gather_after_step) {
        const OpId ag = b.add(OpKind::all_gather, 0, Stream::comm, in.all_gather_s(bytes), i, -1, bytes,
                              "all-gather updated params " + b.unit_name(i));
        graph_add_edge(b.g, after, ag);
      }
    }
  }
  return b.finish();
}

OpGraph build_pipeline_graph(const StepInputs& in) {
  validate_step_inputs(in);
  const Parallelism& par = in.parallel;
  const int p = in.num_gpus;
  const int v = pipeline_chunks(par);
  const int V = p * v;  // virtual stages: chunk c of stage s is virtual stage c·p + s
  const int m = in.micro_batches;
  const std::vector<int> bounds = stage_layer_bounds(in);
  Builder b(in, p, static_cast<int>(std::max<int64_t>(p, par.gpus())), static_cast<std::size_t>(m) * (in.layers.size() * 6 + 2 * V) + 4 * in.layers.size() + p);

  // Per virtual stage and micro-batch: the first op of its forward/backward slot, and the op after
  // which the next virtual stage may go on (the send, or the last op on the last/first one).
  auto table = [&] { return std::vector<std::vector<OpId>>(V, std::vector<OpId>(m, kNoOp)); };
  auto fwd_first = table(), fwd_done = table(), bwd_first = table(), bwd_done = table();
  auto stage_of = [&](int vs) { return vs % p; };
  // Data parallelism over each stage (PP x DP): once per step.
  const bool dp = par.grad_group() > 1;
  const bool sharded = par.sharding != Sharding::none;
  for (int s = 0; s < p; ++s) {
    const int64_t static_bytes = in.static_bytes_by_rank.empty() ? in.static_bytes_per_rank : in.static_bytes_by_rank[s];
    b.alloc("static: weights, gradients, optimizer states", s, static_bytes, kNoOp);
    std::vector<int> units;  // this stage's units, chunk by chunk
    for (int c = 0; c < v; ++c)
      for (int i = bounds[c * p + s]; i < bounds[c * p + s + 1]; ++i) units.push_back(i);
    // Sharded parameters (stage 3) are gathered once, before the first forward, and kept all step.
    if (dp && par.shards_params())
      for (int i : units)
        if (in.layers[i].param_bytes > 0)
          b.add_blocking(OpKind::all_gather, s, in.all_gather_s(in.layers[i].param_bytes), i, -1, in.layers[i].param_bytes,
                         "all-gather params " + b.unit_name(i), kNoOp);
    std::vector<std::vector<ForwardOps>> forwards(static_cast<std::size_t>(m) * v);
    for (const PipelineSlot& slot : pipeline_stage_order(par.schedule, s, p, m, v)) {
      const int k = slot.micro_batch;
      const int vs = slot.chunk * p + s;
      const int lo = bounds[vs], hi = bounds[vs + 1];
      auto& kept = forwards[static_cast<std::size_t>(k) * v + slot.chunk];
      if (slot.forward) {
        kept.resize(hi - lo);
        OpId done = kNoOp;
        for (int i = lo; i < hi; ++i) {
          kept[i - lo] = emit_forward(b, s, i, k);
          done = kept[i - lo].done;
          if (i == lo) fwd_first[vs][k] = kept[i - lo].first;
        }
        fwd_done[vs][k] = done;
        const int64_t bytes = vs + 1 < V ? in.layers[hi].checkpoint_bytes : 0;
        if (bytes > 0) {
          fwd_done[vs][k] = b.add(OpKind::send, s, Stream::comm, in.p2p_s(bytes), hi - 1, k, bytes,
                                  "send activations to rank " + std::to_string(stage_of(vs + 1)) + mb_suffix(k));
          graph_add_edge(b.g, done, fwd_done[vs][k]);
        }
      } else {
        OpId last = kNoOp;
        for (int i = hi - 1; i >= lo; --i) {
          const BackwardOps ops = emit_backward(b, s, i, k, kept[i - lo]);
          if (i == hi - 1) bwd_first[vs][k] = ops.first;
          last = ops.weight;
        }
        bwd_done[vs][k] = last;
        const int64_t bytes = vs > 0 ? in.layers[lo].checkpoint_bytes : 0;
        if (bytes > 0) {
          bwd_done[vs][k] = b.add(OpKind::send, s, Stream::comm, in.p2p_s(bytes), lo, k, bytes,
                                  "send gradient to rank " + std::to_string(stage_of(vs - 1)) + mb_suffix(k));
          graph_add_edge(b.g, last, bwd_done[vs][k]);
        }
      }
    }
    // The stage's gradients over its data-parallel group, after its last backward.
    std::vector<OpId> synced;
    int64_t stage_grads = 0;
    if (dp) {
      for (int i : units) {
        const int64_t grads = in.layers[i].grad_bytes;
        if (grads == 0) continue;
        stage_grads += grads;
        const OpId op = sharded ? b.add(OpKind::reduce_scatter, s, Stream::comm, in.reduce_scatter_s(grads), i, -1, grads,
                                        "reduce-scatter grads " + b.unit_name(i))
                                : b.add(OpKind::all_reduce, s, Stream::comm, in.all_reduce_s(grads), i, -1, grads,
                                        "all-reduce grads " + b.unit_name(i));
        graph_add_edge(b.g, b.last_compute[s], op);
        synced.push_back(op);
      }
      if (sharded && par.dp_replicate > 1 && stage_grads > 0) {
        const OpId ar = b.add(OpKind::all_reduce, s, Stream::comm, in.replica_all_reduce_s(stage_grads), -1, -1,
                              stage_grads, "replica all-reduce grads");
        for (OpId op : synced) graph_add_edge(b.g, op, ar);
        synced.push_back(ar);
      }
    }
    b.pending[s].insert(b.pending[s].end(), synced.begin(), synced.end());
    const OpId step = b.add(OpKind::optimizer_step, s, Stream::compute, in.optimizer_step_s, -1, -1, 0, "optimizer step");
    // ZeRO-1/2 over the stage: the updated parameters gathered after the step.
    if (dp && sharded && !par.shards_params())
      for (int i : units) {
        const LayerCost& unit = in.layers[i];
        const int64_t bytes = unit.updated_param_bytes >= 0 ? unit.updated_param_bytes : unit.grad_bytes;
        if (bytes == 0) continue;
        const OpId ag = b.add(OpKind::all_gather, s, Stream::comm, in.all_gather_s(bytes), i, -1, bytes,
                              "all-gather updated params " + b.unit_name(i));
        graph_add_edge(b.g, step, ag);
      }
  }
  for (int vs = 0; vs < V; ++vs) {
    for (int k = 0; k < m; ++k) {
      if (vs > 0) graph_add_edge(b.g, fwd_done[vs - 1][k], fwd_first[vs][k]);
      if (vs + 1 < V) graph_add_edge(b.g, bwd_done[vs + 1][k], bwd_first[vs][k]);
    }
  }
  return b.finish();
}

OpGraph build_step_graph(const StepInputs& inputs) {
  if (is_pipeline(inputs.parallel)) return build_pipeline_graph(inputs);
  return build_data_parallel_graph(inputs);
}

}  // namespace ftplan::sim

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

  Builder(const StepInputs& inputs, int ranks, int represented, std::size_t expected_ops)
      : in(inputs), last_compute(ranks, kNoOp) {
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
    }
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

struct ForwardOps {
  OpId op = kNoOp;
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
  const OpId a2a = emit_all_to_all(b, rank, layer, micro_batch, 2, "fwd");
  f.op = b.add(OpKind::forward, rank, Stream::compute, l.forward_s, layer, micro_batch, 0,
               "fwd " + name + mb);
  graph_add_edge(b.g, a2a, f.op);
  if (is_checkpointed(b.in, layer))
    f.saved = b.alloc("checkpoint " + name + mb, rank, l.checkpoint_bytes, f.op);
  else
    f.saved = b.alloc("saved activations " + name + mb, rank, l.saved_activation_bytes, f.op);
  if (layer + 1 == static_cast<int>(b.in.layers.size()))
    f.logits = b.alloc("logits" + mb, rank, b.in.logits_bytes, f.op);
  return f;
}

struct BackwardOps {
  OpId first = kNoOp;
  OpId input = kNoOp;   // backward_input
  OpId weight = kNoOp;  // backward_weight, the last op of the unit
};

BackwardOps emit_backward(Builder& b, int rank, int layer, int micro_batch, const ForwardOps& f) {
  const LayerCost& l = b.in.layers[layer];
  const std::string name = b.unit_name(layer);
  const std::string mb = mb_suffix(micro_batch);
  BackwardOps ops;
  std::size_t recomputed = kNone;
  const OpId a2a = emit_all_to_all(b, rank, layer, micro_batch, is_checkpointed(b.in, layer) ? 4 : 2, "bwd");
  if (is_checkpointed(b.in, layer)) {
    ops.first = b.add(OpKind::recompute, rank, Stream::compute, l.forward_s, layer, micro_batch, 0,
                      "recompute " + name + mb);
    recomputed = b.alloc("recomputed activations " + name + mb, rank, l.saved_activation_bytes, ops.first);
  }
  ops.input = b.add(OpKind::backward_input, rank, Stream::compute, l.backward_input_s, layer,
                    micro_batch, 0, "bwd-in " + name + mb);
  graph_add_edge(b.g, a2a, ops.first == kNoOp ? ops.input : ops.first);
  ops.weight = b.add(OpKind::backward_weight, rank, Stream::compute, l.backward_weight_s, layer,
                     micro_batch, 0, "bwd-w " + name + mb);
  if (ops.first == kNoOp) ops.first = ops.input;
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
                                               int micro_batches) {
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
  const int p = in.num_gpus;
  const int m = in.micro_batches;
  const std::vector<int> bounds = stage_layer_bounds(in);
  Builder b(in, p, p, static_cast<std::size_t>(m) * (in.layers.size() * 4 + 2) + p);

  // Per stage and micro-batch: the first op of its forward/backward slot, and the op after which
  // the neighbour may go on (the send, or the last compute op on the last/first stage).
  auto table = [&] { return std::vector<std::vector<OpId>>(p, std::vector<OpId>(m, kNoOp)); };
  auto fwd_first = table(), fwd_done = table(), bwd_first = table(), bwd_done = table();
  for (int s = 0; s < p; ++s) {
    const int64_t static_bytes = in.static_bytes_by_rank.empty() ? in.static_bytes_per_rank : in.static_bytes_by_rank[s];
    b.alloc("static: weights, gradients, optimizer states", s, static_bytes, kNoOp);
    const int lo = bounds[s], hi = bounds[s + 1];
    std::vector<std::vector<ForwardOps>> forwards(m, std::vector<ForwardOps>(hi - lo));
    for (const PipelineSlot& slot : pipeline_stage_order(in.parallel.schedule, s, p, m)) {
      const int k = slot.micro_batch;
      if (slot.forward) {
        OpId last = kNoOp;
        for (int i = lo; i < hi; ++i) {
          forwards[k][i - lo] = emit_forward(b, s, i, k);
          last = forwards[k][i - lo].op;
          if (i == lo) fwd_first[s][k] = last;
        }
        fwd_done[s][k] = last;
        const int64_t bytes = s + 1 < p ? in.layers[hi].checkpoint_bytes : 0;
        if (bytes > 0) {
          fwd_done[s][k] = b.add(OpKind::send, s, Stream::comm, in.p2p_s(bytes), hi - 1, k, bytes,
                                 "send activations to rank " + std::to_string(s + 1) + mb_suffix(k));
          graph_add_edge(b.g, last, fwd_done[s][k]);
        }
      } else {
        OpId last = kNoOp;
        for (int i = hi - 1; i >= lo; --i) {
          const BackwardOps ops = emit_backward(b, s, i, k, forwards[k][i - lo]);
          if (i == hi - 1) bwd_first[s][k] = ops.first;
          last = ops.weight;
        }
        bwd_done[s][k] = last;
        const int64_t bytes = s > 0 ? in.layers[lo].checkpoint_bytes : 0;
        if (bytes > 0) {
          bwd_done[s][k] = b.add(OpKind::send, s, Stream::comm, in.p2p_s(bytes), lo, k, bytes,
                                 "send gradient to rank " + std::to_string(s - 1) + mb_suffix(k));
          graph_add_edge(b.g, last, bwd_done[s][k]);
        }
      }
    }
    b.add(OpKind::optimizer_step, s, Stream::compute, in.optimizer_step_s, -1, -1, 0, "optimizer step");
  }
  for (int s = 0; s < p; ++s) {
    for (int k = 0; k < m; ++k) {
      if (s > 0) graph_add_edge(b.g, fwd_done[s - 1][k], fwd_first[s][k]);
      if (s + 1 < p) graph_add_edge(b.g, bwd_done[s + 1][k], bwd_first[s][k]);
    }
  }
  return b.finish();
}

OpGraph build_step_graph(const StepInputs& inputs) {
  if (is_pipeline(inputs.parallel)) return build_pipeline_graph(inputs);
  return build_data_parallel_graph(inputs);
}

}  // namespace ftplan::sim

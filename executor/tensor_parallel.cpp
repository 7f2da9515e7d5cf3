#include "executor/tensor_parallel.h"

#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>

#include "executor/context_parallel.h"
#include "executor/llama_model.h"
#include "executor/torch_compat.h"
#include "planner/errors.h"

namespace ftexec {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

Comm& comm_of(AutogradContext* ctx) { return *reinterpret_cast<Comm*>(ctx->saved_data["comm"].toInt()); }
int64_t address(Comm* c) { return reinterpret_cast<int64_t>(c); }

at::Tensor all_reduced(Comm& c, const at::Tensor& x) {
  at::Tensor out = x.contiguous().clone();
  c.all_reduce_sum(out);
  return out;
}

// [B, S, h] -> [S, B, h] contiguous, flat: chunk i of the flat buffer is tokens [i·S/N, (i+1)·S/N)
// of every row (Megatron keeps its activations sequence-first for this reason).
at::Tensor seq_first_flat(const at::Tensor& x) { return x.transpose(0, 1).contiguous().view({-1}); }

// Sequence all-gather: [B, S/N, h] -> [B, S, h].
at::Tensor seq_gather(Comm& c, const at::Tensor& x) {
  const int64_t N = c.world(), B = x.size(0), s = x.size(1), h = x.size(2);
  at::Tensor flat = at::empty({N * s * B * h}, x.options());
  flat.narrow(0, c.rank() * s * B * h, s * B * h).copy_(seq_first_flat(x));
  c.all_gather(flat);
  return flat.view({N * s, B, h}).transpose(0, 1).contiguous();
}

// Sequence reduce-scatter: [B, S, h] summed over ranks -> this rank's [B, S/N, h].
at::Tensor seq_reduce_scatter(Comm& c, const at::Tensor& x) {
  const int64_t N = c.world(), B = x.size(0), S = x.size(1), h = x.size(2);
  at::Tensor flat = seq_first_flat(x);
  if (flat.data_ptr() == x.data_ptr()) flat = flat.clone();  // (never in place on the input)
  c.reduce_scatter_sum(flat);
  return flat.narrow(0, c.rank() * (S / N) * B * h, (S / N) * B * h).view({S / N, B, h}).transpose(0, 1).contiguous();
}

// f (Megatron copy_to_tensor_model_parallel_region): identity forward, all-reduce backward.
struct CopyToTp : public torch::autograd::Function<CopyToTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {all_reduced(comm_of(ctx), g[0]), at::Tensor()};
  }
};

// g (reduce_from_tensor_model_parallel_region): all-reduce forward, identity backward.
struct ReduceFromTp : public torch::autograd::Function<ReduceFromTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm) {
    return all_reduced(*reinterpret_cast<Comm*>(comm), x);
  }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0], at::Tensor()}; }
};

// gather_from_sequence_parallel_region: all-gather forward, reduce-scatter backward.
struct GatherSeq : public torch::autograd::Function<GatherSeq> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return seq_gather(*reinterpret_cast<Comm*>(comm), x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {seq_reduce_scatter(comm_of(ctx), g[0]), at::Tensor()};
  }
};

// reduce_scatter_to_sequence_parallel_region: reduce-scatter forward, all-gather backward.
struct ScatterSeq : public torch::autograd::Function<ScatterSeq> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return seq_reduce_scatter(*reinterpret_cast<Comm*>(comm), x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {seq_gather(comm_of(ctx), g[0]), at::Tensor()};
  }
};

// Megatron's _VocabParallelCrossEntropy on logits [T, V/tp] (this rank's vocabulary rows) and
// labels [T] (global ids, -100 ignored): the mean loss over the labelled tokens.
struct VocabParallelCrossEntropy : public torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits_in, const at::Tensor& labels, int64_t comm,
                            int64_t vocab_start) {
    Comm& c = *reinterpret_cast<Comm*>(comm);
    at::NoGradGuard no_grad;
    at::Tensor logits = logits_in.to(at::kFloat).contiguous();
    if (logits.data_ptr() == logits_in.data_ptr()) logits = logits.clone();
    const int64_t T = logits.size(0), Vp = logits.size(1);
    at::Tensor max = std::get<0>(logits.max(-1)).contiguous();
    c.all_reduce_max(max);
    logits.sub_(max.unsqueeze(-1));
    const at::Tensor outside = (labels < vocab_start) | (labels >= vocab_start + Vp);
    const at::Tensor local = (labels - vocab_start).masked_fill(outside, 0);
    at::Tensor both = at::empty({2, T}, logits.options());
    both[0].copy_(logits.gather(1, local.unsqueeze(1)).squeeze(1).masked_fill(outside, 0.0));
    logits.exp_();
    both[1].copy_(logits.sum(-1));
    c.all_reduce_sum(both);  // the target's logit and the sum of exponentials, one call
    const at::Tensor predicted = both[0], sum_exp = both[1];
    const at::Tensor valid = labels != -100;
    const double n = std::max<double>(1.0, valid.sum().item<double>());
    at::Tensor loss = ((sum_exp.log() - predicted) * valid.to(at::kFloat)).sum() / n;
    logits.div_(sum_exp.unsqueeze(-1));  // the local softmax, kept for backward
    ctx->save_for_backward({logits, local, outside, valid});
    ctx->saved_data["n"] = n;
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits_in.scalar_type());
    return loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto saved = ctx->get_saved_variables();
    at::Tensor softmax = saved[0].clone();
    const at::Tensor local = saved[1], outside = saved[2], valid = saved[3];
    const double n = ctx->saved_data["n"].toDouble();
    const at::Tensor hit = (~outside).to(at::kFloat).unsqueeze(1);
    softmax.scatter_add_(1, local.unsqueeze(1), -hit);
    softmax.mul_((valid.to(at::kFloat) * (g[0].to(at::kFloat) / n)).unsqueeze(1));
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {softmax.to(dtype), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

const TensorParallel& tp_of(const LlamaModel& m) { return *m.tp; }

// Into the tp region: f, or the sequence all-gather under sequence parallelism.
at::Tensor enter(const TensorParallel& tp, const at::Tensor& x) {
  return tp.sequence_parallel ? GatherSeq::apply(x, address(tp.comm)) : CopyToTp::apply(x, address(tp.comm));
}
// Out of it: g, or the sequence reduce-scatter.
at::Tensor leave(const TensorParallel& tp, const at::Tensor& x) {
  return tp.sequence_parallel ? ScatterSeq::apply(x, address(tp.comm)) : ReduceFromTp::apply(x, address(tp.comm));
}
// A weight whose gradient is partial on each tp rank: identity forward, all-reduce of its gradient.
at::Tensor summed_grad(const TensorParallel& tp, const at::Tensor& w) {
  return w.requires_grad() ? CopyToTp::apply(w, address(tp.comm)) : w;
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // As llama_model.cpp's (HF LlamaRMSNorm, sum / h for the mean).
  const at::Tensor xf = x.to(at::kFloat);
  const double inv_h = 1.0 / static_cast<double>(x.size(-1));
  const at::Tensor rstd = at::rsqrt(xf.pow(2).sum({-1}, /*keepdim=*/true).mul(inv_h).add(eps));
  return weight * (xf * rstd).to(x.scalar_type());
}

at::Tensor lora_input(const LoraAdapter& a, const at::Tensor& x, bool training) {
  return (training && a.dropout > 0.0) ? std::get<0>(at::native_dropout(x, a.dropout, true)) : x;
}

// Column-parallel: xin is the input already in the tp region (whole sequence, replicated).
at::Tensor column(const TensorParallel& tp, const Linear& l, const at::Tensor& xin, bool training) {
  at::Tensor y = at::linear(xin, l.weight, l.bias);
  if (l.lora) {
    const LoraAdapter& a = *l.lora;
    y = y + at::linear(at::linear(lora_input(a, xin, training), summed_grad(tp, a.a)), a.b) * a.scaling;
  }
  return y;
}

// Row-parallel: x holds this rank's input features; the output leaves the tp region.
at::Tensor row(const TensorParallel& tp, const Linear& l, const at::Tensor& x, bool training) {
  at::Tensor y = leave(tp, at::linear(x, l.weight));
  if (l.bias.defined()) y = y + l.bias;
  if (l.lora) {
    const LoraAdapter& a = *l.lora;
    const at::Tensor z = leave(tp, at::linear(lora_input(a, x, training), a.a));
    y = y + at::linear(z, tp.sequence_parallel ? summed_grad(tp, a.b) : a.b) * a.scaling;
  }
  return y;
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const auto B = x.size(0), kv = x.size(1), S = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({B, kv, n_rep, S, d}).reshape({B, kv * n_rep, S, d});
}

// llama_model.cpp's attention over this rank's H/tp heads and KV/tp KV heads.
at::Tensor attention(LlamaModel& m, const LlamaBlock& blk, const at::Tensor& x_local, int64_t layer) {
  const TensorParallel& tp = tp_of(m);
  const auto& s = m.spec;
  const at::Tensor x = enter(tp, x_local);
  const int64_t B = x.size(0), S = x.size(1), H = s.num_heads / tp.tp, KV = s.num_kv_heads / tp.tp, d = s.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  at::Tensor q = column(tp, blk.q_proj, x, m.training).view({B, S, H, d}).transpose(1, 2);
  at::Tensor k = column(tp, blk.k_proj, x, m.training).view({B, S, KV, d}).transpose(1, 2);
  at::Tensor v = column(tp, blk.v_proj, x, m.training).view({B, S, KV, d}).transpose(1, 2);
  const at::Tensor& cos = layer_rope_cos(m, layer);
  const at::Tensor& sin = layer_rope_sin(m, layer);
  const at::Tensor& mask = layer_attention_mask(m, layer);  // a sliding layer's window (Mistral)
  q = q * cos + rotate_half(q) * sin;
  k = k * cos + rotate_half(k) * sin;
  at::Tensor out;
  if (m.cp) {
    out = cp_attention(*m.cp, q, k, v, mask, scale);  // this rank's heads' K and V over the cp group
  } else if (m.options.use_sdpa) {
    if (!compat::kSdpaHasGqa) {
      k = repeat_kv(k, H / KV);
      v = repeat_kv(v, H / KV);
    }
    out = compat::sdpa_causal(q, k, v, scale);
  } else {
    k = repeat_kv(k, H / KV);
    v = repeat_kv(v, H / KV);
    at::Tensor probs;
    {
      at::Tensor scores = at::matmul(q, k.transpose(2, 3));
      scores.mul_(scale);
      scores.masked_fill_(mask, -std::numeric_limits<double>::infinity());
      probs = at::softmax(scores, -1, at::kFloat);
    }
    probs = probs.to(x.scalar_type());
    out = at::matmul(probs, v);
  }
  q.reset(), k.reset(), v.reset();
  out = out.transpose(1, 2).reshape({B, S, H * d});
  return row(tp, blk.o_proj, out, m.training);
}

at::Tensor mlp(LlamaModel& m, const LlamaBlock& blk, const at::Tensor& x_local) {
  const TensorParallel& tp = tp_of(m);
  const at::Tensor x = enter(tp, x_local);
  at::Tensor h = at::silu(column(tp, blk.gate_proj, x, m.training)) * column(tp, blk.up_proj, x, m.training);
  return row(tp, blk.down_proj, h, m.training);
}

at::Tensor norm_weight(const TensorParallel& tp, const at::Tensor& w) {
  return tp.sequence_parallel ? summed_grad(tp, w) : w;
}

at::Tensor chunk_of(const at::Tensor& t, int dim, int64_t n, int64_t r) {
  at::NoGradGuard no_grad;
  return t.chunk(n, dim)[r].contiguous().clone().set_requires_grad(t.requires_grad());
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

int tp_split_dim(const std::string& name) {
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight") return 0;
  for (const char* col : {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}) {
    const std::string c = std::string(col);
    if (name.find("." + c + ".") == std::string::npos) continue;
    if (ends_with(name, c + ".weight") || ends_with(name, c + ".bias") || ends_with(name, "lora_B.weight")) return 0;
    return -1;  // lora_A: whole
  }
  for (const char* rowp : {"o_proj", "down_proj"}) {
    const std::string r = std::string(rowp);
    if (name.find("." + r + ".") == std::string::npos) continue;
    if (ends_with(name, r + ".weight") || ends_with(name, "lora_A.weight")) return 1;
    return -1;  // the bias, lora_B: whole
  }
  return -1;  // norms
}

void tp_shard_model(LlamaModel& m, Comm& comm, const ftplan::Parallelism& layout) {
  auto tp = std::make_shared<TensorParallel>();
  tp->comm = &comm;
  tp->tp = layout.tp;
  tp->rank = comm.rank();
  tp->sequence_parallel = layout.sequence_parallel;
  const auto& spec = m.spec;
  if (spec.fused_qkv || spec.fused_gate_up || spec.qk_norm != ftplan::QkNorm::none || spec.norm_post_attention ||
      spec.norm_post_mlp || !spec.norm_pre_attention || !spec.norm_pre_mlp || spec.norm_scale_fp32 ||
      spec.norm_cast_after_scale || spec.scaled_embedding || spec.attn_logit_softcapping > 0 ||
      spec.final_logit_softcapping > 0 || spec.query_pre_attn_scalar > 0 || spec.hidden_act != "silu")
    ftplan::fail_input("--parallel (parallel) tp(" + std::to_string(layout.tp) + "): model_type " + spec.model_type +
                       ": ftexec's tensor parallelism runs the Llama block (no fused projections, q/k norms, post-norms, "
                       "Gemma norms, soft-capping or GeGLU)");
  const int64_t n = tp->tp, r = tp->rank, V = m.spec.vocab_size;
  if (comm.world() != n)
    throw std::logic_error("tp_shard_model: the tp group has " + std::to_string(comm.world()) + " ranks, tp is " + std::to_string(n));
  tp->vocab_start = r * (V / n);
  tp->vocab_end = tp->vocab_start + V / n;
  const bool tied = !m.lm_head.defined();
  m.embed_tokens = chunk_of(m.embed_tokens, 0, n, r);
  if (!tied) m.lm_head = chunk_of(m.lm_head, 0, n, r);
  for (auto& b : m.layers) {
    for (const char* name : {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}) {
      Linear& l = block_linear(b, name);
      if (l.nf4) ftplan::fail_input("--method qlora with tp > 1: ftexec splits dense weights only");
      l.weight = chunk_of(l.weight, 0, n, r);
      if (l.bias.defined()) l.bias = chunk_of(l.bias, 0, n, r);
      if (l.lora) l.lora->b = chunk_of(l.lora->b, 0, n, r);
    }
    for (const char* name : {"o_proj", "down_proj"}) {
      Linear& l = block_linear(b, name);
      if (l.nf4) ftplan::fail_input("--method qlora with tp > 1: ftexec splits dense weights only");
      l.weight = chunk_of(l.weight, 1, n, r);
      if (l.lora) l.lora->a = chunk_of(l.lora->a, 1, n, r);
    }
  }
  m.seq_shards = tp->sequence_parallel ? n : 1;
  m.tp = tp;
}

std::vector<std::pair<std::string, at::Tensor>> tp_gather_unit(const TensorParallel& tp,
                                                               const std::vector<std::pair<std::string, at::Tensor>>& unit) {
  at::NoGradGuard no_grad;
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, t] : unit) {
    const int dim = tp_split_dim(name);
    if (dim < 0 || tp.tp == 1) {
      out.emplace_back(name, t);
      continue;
    }
    // Gathered along dim 0 of the transposed tensor for a column split, then transposed back.
    const at::Tensor mine = (dim == 0 ? t : t.transpose(0, 1)).contiguous().view({-1});
    at::Tensor flat = at::empty({mine.numel() * tp.tp}, mine.options());
    flat.narrow(0, tp.rank * mine.numel(), mine.numel()).copy_(mine);
    tp.comm->all_gather(flat);
    std::vector<int64_t> shape = (dim == 0 ? t : t.transpose(0, 1)).sizes().vec();
    shape[0] *= tp.tp;
    at::Tensor whole = flat.view(shape);
    out.emplace_back(name, dim == 0 ? whole : whole.transpose(0, 1).contiguous());
  }
  return out;
}

at::Tensor tp_embed(LlamaModel& m, const at::Tensor& ids) {
  const TensorParallel& tp = tp_of(m);
  // VocabParallelEmbedding: ids outside this rank's rows look up row 0 and are zeroed, then summed.
  const at::Tensor outside = (ids < tp.vocab_start) | (ids >= tp.vocab_end);
  const at::Tensor local = (ids - tp.vocab_start).masked_fill(outside, 0);
  at::Tensor e = at::embedding(m.embed_tokens, local);
  e = e.masked_fill(outside.unsqueeze(-1), 0.0);
  return leave(tp, e);
}

at::Tensor tp_block_forward(LlamaModel& m, int64_t layer, const at::Tensor& x) {
  const TensorParallel& tp = tp_of(m);
  const LlamaBlock& blk = m.layers[layer];
  const double eps = m.spec.rms_norm_eps;
  // The Llama block only (exec_problems refuses tp for the others' norms, fused projections and soft-capping).
  at::Tensor h = x + attention(m, blk, rms_norm(x, norm_weight(tp, blk.attn_norm), eps), layer);
  return h + mlp(m, blk, rms_norm(h, norm_weight(tp, blk.mlp_norm), eps));
}

at::Tensor tp_head_loss(LlamaModel& m, const at::Tensor& h, const at::Tensor& labels) {
  const TensorParallel& tp = tp_of(m);
  const at::Tensor x = enter(tp, rms_norm(h, norm_weight(tp, m.norm), m.spec.rms_norm_eps));
  const at::Tensor logits = at::linear(x, m.head_weight());  // [B, S, V/tp]
  return VocabParallelCrossEntropy::apply(logits.view({-1, logits.size(-1)}), labels.reshape({-1}), address(tp.comm),
                                          tp.vocab_start);
}

}  // namespace ftexec

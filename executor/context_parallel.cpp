#include "executor/context_parallel.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "executor/llama_model.h"

namespace ftexec {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const auto B = x.size(0), kv = x.size(1), S = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({B, kv, n_rep, S, d}).reshape({B, kv * n_rep, S, d});
}

// K and V of the whole sequence from every rank's chunks [B, KV, s, d]: one all-gather of the flat
// buffer [cp, 2, B, KV, s, d] (chunk c = rank c's k then v), returned as [B, KV, cp·s, d] each.
std::pair<at::Tensor, at::Tensor> gather_kv(Comm& c, const at::Tensor& k, const at::Tensor& v) {
  at::NoGradGuard no_grad;
  const int64_t N = c.world(), n = k.numel();
  const int64_t B = k.size(0), KV = k.size(1), s = k.size(2), d = k.size(3);
  at::Tensor flat = at::empty({N * 2 * n}, k.options());
  flat.narrow(0, c.rank() * 2 * n, n).copy_(k.reshape({-1}));
  flat.narrow(0, c.rank() * 2 * n + n, n).copy_(v.reshape({-1}));
  c.all_gather(flat);
  const at::Tensor all = flat.view({N, 2, B, KV, s, d});
  auto whole = [&](int64_t i) { return all.select(1, i).permute({1, 2, 0, 3, 4}).reshape({B, KV, N * s, d}); };
  return {whole(0), whole(1)};
}

// The gradients of K and V [B, KV, cp·s, d] summed over the cp ranks, this rank's chunk kept: one
// reduce-scatter of the flat buffer [cp, 2, B, KV, s, d].
std::pair<at::Tensor, at::Tensor> reduce_scatter_kv(Comm& c, const at::Tensor& dk, const at::Tensor& dv) {
  at::NoGradGuard no_grad;
  const int64_t N = c.world(), B = dk.size(0), KV = dk.size(1), s = dk.size(2) / N, d = dk.size(3);
  at::Tensor flat = at::empty({N, 2, B, KV, s, d}, dk.options());
  flat.select(1, 0).copy_(dk.view({B, KV, N, s, d}).permute({2, 0, 1, 3, 4}));
  flat.select(1, 1).copy_(dv.view({B, KV, N, s, d}).permute({2, 0, 1, 3, 4}));
  c.reduce_scatter_sum(flat.view({-1}));
  const at::Tensor mine = flat.select(0, c.rank());
  return {mine.select(0, 0).clone(), mine.select(0, 1).clone()};
}

// The eager attention core of llama_model.cpp (scores scaled and masked in place, an fp32 softmax)
// on the gathered K and V.
at::Tensor attention_core(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V, const at::Tensor& mask,
                          double scale) {
  const int64_t n_rep = q.size(1) / K.size(1);
  const at::Tensor k = repeat_kv(K, n_rep), v = repeat_kv(V, n_rep);
  at::Tensor probs;
  {
    at::Tensor scores = at::matmul(q, k.transpose(2, 3));
    scores.mul_(scale);
    scores.masked_fill_(mask, -std::numeric_limits<double>::infinity());
    probs = at::softmax(scores, -1, at::kFloat);
  }
  return at::matmul(probs.to(q.scalar_type()), v);
}

// torch's _AllGatherRotater path as one autograd function: forward all-gathers K and V and keeps only
// q and the local k, v; backward gathers K and V again, recomputes the core under grad mode and
// reduce-scatters the gradients of K and V (the gradient of each rank's chunk comes from every rank's
// queries).
struct AllGatherAttention : public torch::autograd::Function<AllGatherAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& mask, int64_t comm, double scale) {
    Comm& c = *reinterpret_cast<Comm*>(comm);
    ctx->save_for_backward({q, k, v, mask});
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["scale"] = scale;
    at::NoGradGuard no_grad;
    auto [K, V] = gather_kv(c, k, v);
    return attention_core(q, K, V, mask, scale);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    Comm& c = *reinterpret_cast<Comm*>(ctx->saved_data["comm"].toInt());
    const double scale = ctx->saved_data["scale"].toDouble();
    auto saved = ctx->get_saved_variables();
    auto [K0, V0] = gather_kv(c, saved[1], saved[2]);
    at::Tensor q = saved[0].detach().requires_grad_(true);
    at::Tensor K = K0.requires_grad_(true), V = V0.requires_grad_(true);
    variable_list grads;
    {
      at::AutoGradMode enable(true);
      const at::Tensor out = attention_core(q, K, V, saved[3], scale);
      grads = torch::autograd::grad({out}, {q, K, V}, {g[0]});
    }
    auto [dk, dv] = reduce_scatter_kv(c, grads[1], grads[2]);
    return {grads[0], dk, dv, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

void cp_attach(LlamaModel& m, Comm& comm, const ftplan::Parallelism& layout) {
  if (comm.world() != layout.cp)
    throw std::logic_error("cp_attach: the cp group has " + std::to_string(comm.world()) + " ranks, cp is " +
                           std::to_string(layout.cp));
  if (layout.cp_mode != ftplan::ContextParallel::all_gather)
    throw std::logic_error("cp_attach: ftexec runs cp_mode=all_gather only (exec_layout_problems refuses the others)");
  auto cp = std::make_shared<ContextParallel>();
  cp->comm = &comm;
  cp->cp = layout.cp;
  cp->rank = comm.rank();
  m.seq_shards *= cp->cp;
  m.cached_seq_len = 0;  // RoPE and the mask become this chunk's rows
  m.cp = cp;
}

at::Tensor cp_chunk(const ContextParallel& cp, const at::Tensor& t) {
  const int64_t s = t.size(1) / cp.cp;
  return t.narrow(1, cp.rank * s, s).contiguous();
}

at::Tensor cp_attention(const ContextParallel& cp, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const at::Tensor& mask, double scale) {
  return AllGatherAttention::apply(q, k.contiguous(), v.contiguous(), mask, reinterpret_cast<int64_t>(cp.comm), scale);
}

double cp_loss_scale(const ContextParallel& cp, const at::Tensor& labels, const at::Tensor& local, bool local_mean) {
  const double all = std::max<double>(1.0, (labels != -100).sum().item<double>());
  const double mine = local_mean ? std::max<double>(1.0, (local != -100).sum().item<double>()) : 1.0;
  return mine * double(cp.cp) / all;
}

}  // namespace ftexec

#include <cmath>

#include "executor/strategies/units.h"
#include "planner/errors.h"

namespace ftexec {
namespace strategies {

std::vector<std::vector<UnitTensor>> model_units(LlamaModel& m, bool with_nf4) {
  std::vector<std::vector<UnitTensor>> units;
  units.push_back({{"model.embed_tokens.weight", &m.embed_tokens}});
  for (size_t l = 0; l < m.layers.size(); ++l) {
    auto& b = m.layers[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<UnitTensor> u;
    u.push_back({p + "input_layernorm.weight", &b.input_layernorm});
    for (const auto& shape : layer_dense_linears(m.spec, static_cast<int64_t>(l))) {
      Linear& lin = block_linear(b, shape.name);
      const std::string q = p + block_linear_prefix(shape.name) + shape.name;
      if (lin.weight.defined()) u.push_back({q + ".weight", &lin.weight});  // (not when held in NF4)
      if (lin.nf4 && with_nf4) {
        u.push_back({q + ".weight", &lin.nf4->codes});
        u.push_back({q + ".weight.absmax", &lin.nf4->absmax_q});
        u.push_back({q + ".weight.nested_absmax", &lin.nf4->absmax_scale});
      }
      if (lin.bias.defined()) u.push_back({q + ".bias", &lin.bias});
      if (lin.lora) {
        u.push_back({q + ".lora_A.weight", &lin.lora->a});
        u.push_back({q + ".lora_B.weight", &lin.lora->b});
      }
    }
    for (const auto& [name, slot] : block_extra_tensors(b, m.spec)) u.push_back({p + name, slot});  // q/k norms, experts
    u.push_back({p + "post_attention_layernorm.weight", &b.post_attention_layernorm});
    units.push_back(std::move(u));
  }
  std::vector<UnitTensor> head{{"model.norm.weight", &m.norm}};
  if (m.lm_head.defined()) head.push_back({"lm_head.weight", &m.lm_head});
  units.push_back(std::move(head));
  return units;
}

at::Tensor bind_storage(const at::Tensor& owner, int64_t offset, at::IntArrayRef shape) {
  at::NoGradGuard no_grad;
  at::Tensor t = at::empty({0}, owner.options().requires_grad(false));
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * shape[i + 1];
  t.set_(owner.storage(), owner.storage_offset() + offset, shape, strides);
  return t;
}

FlatGroup flat_group(const std::vector<UnitTensor>& tensors, int world) {
  FlatGroup g;
  g.tensors = tensors;
  for (const auto& t : tensors) {
    g.offsets.push_back(g.numel);
    g.numel += t.slot->numel();
  }
  g.padded = (g.numel + world - 1) / world * world;
  g.shard = g.padded / world;
  if (tensors.empty()) return g;
  at::NoGradGuard no_grad;
  g.full = at::zeros({g.padded}, tensors[0].slot->options().requires_grad(false));
  for (size_t i = 0; i < tensors.size(); ++i) {
    at::Tensor& field = *tensors[i].slot;
    const bool rg = field.requires_grad();
    g.full.narrow(0, g.offsets[i], field.numel()).copy_(field.reshape({-1}));
    at::Tensor bound = bind_storage(g.full, g.offsets[i], field.sizes());
    bound.set_requires_grad(rg);
    field = bound;
  }
  return g;
}

void bind_grads(const FlatGroup& g, const at::Tensor& grads) {
  for (size_t i = 0; i < g.tensors.size(); ++i) {
    at::Tensor& p = *g.tensors[i].slot;
    if (!p.requires_grad()) continue;
    p.mutable_grad() = bind_storage(grads, g.offsets[i], p.sizes());
  }
}

void pack_grads(const FlatGroup& g, const at::Tensor& grads) {
  at::NoGradGuard no_grad;
  if (g.padded > g.numel) grads.narrow(0, g.numel, g.padded - g.numel).zero_();
  for (size_t i = 0; i < g.tensors.size(); ++i) {
    const at::Tensor& p = *g.tensors[i].slot;
    at::Tensor dst = grads.narrow(0, g.offsets[i], p.numel());
    if (p.grad().defined()) dst.copy_(p.grad().reshape({-1}));
    else dst.zero_();
  }
}

DecayRanges shard_decay_ranges(const FlatGroup& g, int rank) {
  DecayRanges out;
  const int64_t lo = int64_t(rank) * g.shard, hi = lo + g.shard;
  for (size_t i = 0; i < g.tensors.size(); ++i) {
    if (!hf_decays(g.tensors[i].name)) continue;
    const int64_t begin = std::max(lo, g.offsets[i]), end = std::min(hi, g.offsets[i] + g.tensors[i].slot->numel());
    if (begin < end) out.emplace_back(begin - lo, end - begin);
  }
  return out;
}

std::vector<DecayRanges> unit_decay_groups(const std::vector<UnitTensor>& tensors) {
  std::vector<DecayRanges> out;
  for (const auto& t : tensors) out.push_back(decay_ranges_of(t.name, t.slot->numel()));
  return out;
}

at::Tensor shard_param(const at::Tensor& owner_slice, const at::Tensor& grad) {
  at::Tensor p = bind_storage(owner_slice, 0, owner_slice.sizes());
  p.set_requires_grad(true);
  p.mutable_grad() = grad;
  return p;
}

double clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm, Comm* comm, int replicas) {
  at::NoGradGuard no_grad;
  double norm = 0;
  if (!comm) {
    // As the single-device trainer computes it, so replicated runs match it bit for bit.
    std::vector<at::Tensor> norms;
    for (const auto& g : grads)
      if (g.defined()) norms.push_back(at::linalg_vector_norm(g, 2, c10::nullopt, false, at::kFloat));
    if (norms.empty()) return 0;
    norm = at::linalg_vector_norm(at::stack(norms), 2).item<double>();
  } else {
    double sq = 0;
    for (const auto& g : grads)
      if (g.defined()) {
        const double n = at::linalg_vector_norm(g, 2, c10::nullopt, false, at::kFloat).item<double>();
        sq += n * n;
      }
    norm = std::sqrt(comm->all_reduce_scalar(sq) / replicas);
  }
  if (max_norm > 0 && norm > max_norm) {
    const double coef = max_norm / (norm + 1e-6);
    for (const auto& g : grads)
      if (g.defined()) g.mul_(coef);
  }
  return norm;
}

std::pair<at::Tensor, at::Tensor> micro_batch_tensors(const TokenBatch& b, const at::Device& device) {
  return batch_tensors(b, device);
}

std::vector<std::vector<std::pair<std::string, at::Tensor>>> trainable_by_unit(LlamaModel& m) {
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> out;
  for (const auto& unit : model_units(m)) {
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (const auto& t : unit)
      if (t.slot->defined() && t.slot->requires_grad()) named.emplace_back(t.name, *t.slot);
    if (!named.empty()) out.push_back(std::move(named));
  }
  return out;
}

void emit_replicated(LlamaModel& m, int rank, const DistStrategy::SaveEmit& emit) {
  if (rank != 0) return;
  at::NoGradGuard no_grad;
  for (const auto& unit : trainable_by_unit(m)) emit(unit);
}

}  // namespace strategies

std::unique_ptr<DistStrategy> make_dist_strategy(LlamaModel& model, Comm& comm, const StrategyOptions& o) {
  // What the layout shards decides the class; its degrees and flags configure it.
  const ftplan::Parallelism& p = o.parallel;
  if (p.gpus() != comm.world())
    ftplan::fail_input("parallel layout " + ftplan::name(p) + ": " + std::to_string(p.gpus()) +
                       " ranks != WORLD_SIZE(" + std::to_string(comm.world()) + ")");
  if (p.tp != 1 || p.cp != 1 || p.ep != 1 || p.sequence_parallel)
    ftplan::fail_input("parallel layout " + ftplan::name(p) + ": ftexec runs no tensor, context or expert parallelism yet");
  if (p.pipelined()) {
    if (model.moe_aux.enabled)
      ftplan::fail_input("--moe-aux-loss (moe.aux_loss): the load-balancing loss over every stage's router logits is not "
                         "implemented for pipelines (layout " + ftplan::name(p) + "); run without it (--moe-aux-loss false)");
    if (p.dp() != 1 || p.sharding != ftplan::Sharding::none)
      ftplan::fail_input("parallel layout " + ftplan::name(p) + ": ftexec runs a pipeline without data parallelism yet");
    return strategies::make_pipeline(model, comm, o);
  }
  if (p.shards_params()) return strategies::make_sharded(model, comm, o);
  if (p.shards_optimizer() || p.dp_replicate > 1) return strategies::make_data_parallel(model, comm, o);
  return strategies::make_single(model, comm, o);
}

}  // namespace ftexec

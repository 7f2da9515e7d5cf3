#include <cmath>

#include "executor/context_parallel.h"
#include "executor/device_mesh.h"
#include "executor/strategies/units.h"
#include "executor/tensor_parallel.h"
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
    for (const auto& [name, slot] : block_norms(b, m.spec, true)) u.push_back({p + name, slot});
    for (const auto& shape : layer_dense_linears(m.spec, static_cast<int64_t>(l))) {
      Linear& lin = block_linear(b, shape.name);
      const std::string q = p + block_linear_prefix(m.spec, static_cast<int64_t>(l), shape.name) + shape.name;
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
    for (const auto& [name, slot] : block_norms(b, m.spec, false)) u.push_back({p + name, slot});
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

namespace {
bool decays(const std::string& name) { return hf_decays(name); }
}  // namespace

DecayRanges shard_decay_ranges(const FlatGroup& g, int rank) { return shard_ranges_where(g, rank, decays); }

DecayRanges shard_ranges_where(const FlatGroup& g, int rank, bool (*pred)(const std::string&)) {
  DecayRanges out;
  const int64_t lo = int64_t(rank) * g.shard, hi = lo + g.shard;
  for (size_t i = 0; i < g.tensors.size(); ++i) {
    if (!pred(g.tensors[i].name)) continue;
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

std::unique_ptr<TpNorm> tp_norm_of(const LlamaModel& m, const std::vector<std::string>& names,
                                   const std::vector<at::Tensor>& tensors) {
  if (!m.tp) return nullptr;
  auto t = std::make_unique<TpNorm>();
  t->comm = m.tp->comm;
  t->tp = m.tp->tp;
  for (size_t i = 0; i < tensors.size(); ++i) {
    DecayRanges r;
    if (tp_replicated(names.at(i))) r.emplace_back(0, tensors[i].numel());
    t->replicated.push_back(r);
  }
  return t;
}

double clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm, Comm* comm, int replicas, const TpNorm* tp) {
  at::NoGradGuard no_grad;
  double norm = 0;
  if (tp && tp->tp > 1) {
    // Each tp rank's shards, the replicated elements weighted 1/tp, summed over data-parallel
    // shards (comm) and then over tp.
    double sq = 0;
    for (size_t i = 0; i < grads.size(); ++i) {
      const at::Tensor& g = grads[i];
      if (!g.defined()) continue;
      const double n = at::linalg_vector_norm(g, 2, c10::nullopt, false, at::kFloat).item<double>();
      double rep = 0;
      for (const auto& [offset, length] : tp->replicated.at(i)) {
        const double r = at::linalg_vector_norm(g.reshape({-1}).narrow(0, offset, length), 2, c10::nullopt, false, at::kFloat).item<double>();
        rep += r * r;
      }
      sq += n * n - rep * (1.0 - 1.0 / double(tp->tp));
    }
    if (comm) sq = comm->all_reduce_scalar(sq) / replicas;
    norm = std::sqrt(std::max(0.0, tp->comm->all_reduce_scalar(sq)));
  } else if (!comm) {
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

namespace {

// A layout with tensor or context parallelism, or a pipeline with data parallelism: the device mesh,
// the model split over tp and cp, and the inner strategy over the mesh's dp (or pp) communicator.
// Composition in one order, as torchtitan's parallelize_llama: TP first, then CP, then data
// parallelism over what they left. Under cp the inner strategy runs over dp x cp (the mesh's dp
// communicator) with cp folded into its degrees, as torchtitan's dp_shard_cp / dp_cp meshes
// (torchtitan/distributed/parallel_dims.py, commit 0119de156de558030726b8539ef0078d8aaaec99): into
// dp_shard when the layout shards (ZeRO/FSDP over dp_shard x cp), into dp_replicate otherwise (DDP).
class Composed final : public DistStrategy {
 public:
  Composed(LlamaModel& m, Comm& world, const StrategyOptions& o) : m_(m), mesh_(world, o.parallel), o_(o) {
    const ftplan::Parallelism& p = o.parallel;
    if (p.tp > 1) tp_shard_model(m, mesh_.tp(), p);
    if (p.cp > 1) cp_attach(m, mesh_.cp(), p);
    StrategyOptions inner = o;
    inner.parallel.tp = 1;
    inner.parallel.sequence_parallel = false;
    inner.parallel.cp = 1;
    if (p.sharding != ftplan::Sharding::none) inner.parallel.dp_shard *= p.cp;
    else inner.parallel.dp_replicate *= p.cp;
    if (p.pipelined() || (p.dp() == 1 && p.cp == 1)) {
      if (p.cp > 1) ftplan::fail_input("parallel layout " + ftplan::name(p) + ": cp with pp: ftexec runs no pipeline under context parallelism yet");
      if (p.sharding != ftplan::Sharding::none)
        ftplan::fail_input("parallel layout " + ftplan::name(p) + ": shard=" + ftplan::sharding_name(p) +
                           " with pp: ftexec replicates pipeline stages over data parallelism (dp_replicate), not sharded yet");
      inner.parallel.dp_replicate = inner.parallel.dp_shard = 1;
      pipeline_ = true;
      inner_ = strategies::make_pipeline(m, mesh_.pp(), inner, p.dp() > 1 ? &mesh_.dp() : nullptr);
    } else {
      inner.parallel.pp = 1;
      Comm& dp = mesh_.dp();
      if (inner.parallel.shards_params()) inner_ = strategies::make_sharded(m, dp, inner);
      else inner_ = strategies::make_data_parallel(m, dp, inner);
    }
  }

  // The cp ranks of one dp coordinate read the same micro-batches (each its chunk of them).
  int64_t data_parallel_size() const override { return inner_->data_parallel_size() / (pipeline_ ? 1 : o_.parallel.cp); }
  int64_t data_parallel_rank(int) const override { return data_parallel_size() > 1 ? mesh_.coordinate("dp") : 0; }
  double step(const std::vector<TokenBatch>& micro) override {
    const double loss = inner_->step(micro);
    grad_norm_ = inner_->last_grad_norm();
    return loss;
  }
  StateBytes state_bytes() const override { return inner_->state_bytes(); }
  std::vector<std::pair<std::string, at::Tensor>> checkpoint_tensors() override { return inner_->checkpoint_tensors(); }
  // Replicas of one tp shard hold the same tensors, but the tp ranks do not: each rank keeps its own.
  bool checkpoint_replicated() const override { return inner_->checkpoint_replicated() && o_.parallel.tp == 1; }
  int64_t optimizer_steps() const override { return inner_->optimizer_steps(); }
  void set_optimizer_steps(int64_t s) override { inner_->set_optimizer_steps(s); }
  void after_load() override { inner_->after_load(); }

  // The inner strategy hands each unit to its rank 0 (dp coordinate 0; a pipeline's stage 0): those
  // ranks, one per tp coordinate, all-gather the split tensors over tp, and world rank 0 emits.
  void gather_trainable(const SaveEmit& emit) override {
    if (pipeline_ && mesh_.coordinate("dp") != 0) return;  // the replicas hold the same stage
    const bool first = mesh_.world().rank() == 0;
    inner_->gather_trainable([&](const std::vector<std::pair<std::string, at::Tensor>>& unit) {
      if (!m_.tp) {
        if (first) emit(unit);
        return;
      }
      const auto whole = tp_gather_unit(*m_.tp, unit);
      if (first) emit(whole);
    });
  }

  std::vector<std::pair<std::string, CommStats>> group_stats() const override { return mesh_.stats(); }
  void reset_group_stats() override { mesh_.reset_stats(); }

 private:
  LlamaModel& m_;
  DeviceMesh mesh_;
  StrategyOptions o_;
  bool pipeline_ = false;
  std::unique_ptr<DistStrategy> inner_;
};

}  // namespace

std::unique_ptr<DistStrategy> make_dist_strategy(LlamaModel& model, Comm& comm, const StrategyOptions& o) {
  // What the layout shards decides the class; its degrees and flags configure it.
  const ftplan::Parallelism& p = o.parallel;
  if (p.gpus() != comm.world())
    ftplan::fail_input("parallel layout " + ftplan::name(p) + ": " + std::to_string(p.gpus()) +
                       " ranks != WORLD_SIZE(" + std::to_string(comm.world()) + ")");
  if (p.ep != 1) ftplan::fail_input("parallel layout " + ftplan::name(p) + ": ftexec runs no expert parallelism");
  if (p.tp > 1 || p.cp > 1 || (p.pipelined() && p.dp() > 1)) return std::make_unique<Composed>(model, comm, o);
  if (p.sequence_parallel) ftplan::fail_input("parallel layout " + ftplan::name(p) + ": sp=1 needs tp > 1");
  if (p.pipelined()) {
    if (model.moe_aux.enabled)
      ftplan::fail_input("--moe-aux-loss (moe.aux_loss): the load-balancing loss over every stage's router logits is not "
                         "implemented for pipelines (layout " + ftplan::name(p) + "); run without it (--moe-aux-loss false)");
    if (p.dp() != 1 || p.sharding != ftplan::Sharding::none)
      ftplan::fail_input("parallel layout " + ftplan::name(p) + ": ftexec runs a pipeline without sharding");
    return strategies::make_pipeline(model, comm, o);
  }
  if (p.shards_params()) return strategies::make_sharded(model, comm, o);
  if (p.shards_optimizer() || p.dp_replicate > 1) return strategies::make_data_parallel(model, comm, o);
  return strategies::make_single(model, comm, o);
}

}  // namespace ftexec

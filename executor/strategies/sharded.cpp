// Sharded parameters (zero_stage 3): ZeRO-3 and PyTorch FSDP's FULL_SHARD, SHARD_GRAD_OP and
// HYBRID_SHARD, read from the layout: sharding (zero | fsdp), reshard_after_forward, dp_shard (the
// shard group) x dp_replicate (the replica groups), offload_params (with offload_optimizer).
// Each unit (embedding, block, head) keeps its parameters as flat buffers (the trainable ones, and
// the frozen ones per dtype: QLoRA's NF4 codes and absmaxes are uint8 and fp32 tensors sharded like
// any other) whose storage is empty except while the unit is in use; the rank keeps its shard.
//   forward   before unit u runs: gather u (unless prefetched) and prefetch u+1; after: free u.
//   backward  a hook on unit u's output fires when its gradient is complete, i.e. just before u's
//             backward: gather u again, prefetch u-1, point u's .grad fields at one zeroed flat
//             buffer. Once every gradient of u is accumulated (AccumulateGrad hooks) and the gradient
//             of u's input is complete (so no node of u still needs its weights), reduce-scatter the
//             flat gradients into the shard and free the parameters and the flat gradients.
//   fsdp      (sharding fsdp, reshard_after_forward) as zero3, but the last unit (norm, lm_head) stays
//             gathered from its forward to the end of backward, as PyTorch FSDP's root unit does
//             (gathered once: one all-gather fewer).
//   fsdp_shard_grad_op  (reshard_after_forward false: ZeRO-2-like FSDP) every unit stays gathered from its forward to the end of
//             its backward: one all-gather per unit and micro-batch, none in backward, at the cost
//             of holding all parameters at the turn from forward to backward; gradients are
//             reduce-scattered and gradients and optimizer states stay sharded as in fsdp.
//   fsdp_hybrid  (dp_replicate > 1) fsdp inside each shard group of S = dp_shard consecutive ranks (a
//             node: the hwdb entry's gpus_per_node, or --shard-group-size), replicated across the
//             N/S = dp_replicate groups: gathers and
//             reduce-scatters run over the shard group; once per step, before clipping, each
//             gradient shard is all-reduced across the replica group (the ranks holding the same
//             shard in every group). PyTorch FSDP all-reduces after every micro-batch's backward
//             unless no_sync is used; once per step is the same sum with G times fewer bytes, and
//             is what the planner counts (planner/step_time.cpp).
//   zero3_offload  (offload_params: ZeRO-Infinity's offload_param + offload_optimizer) as zero3, but every shard
//             lives on the host: a gather copies this rank's shard up before the all-gather, the
//             reduced gradient shard goes down at once (accumulated there in fp32), and AdamW runs
//             on the host. Between steps the device holds nothing of the model.
// Freeing resizes the storage to 0 bytes (compat::storage_resize), as FSDP does, so the tensors
// autograd saved keep their identity and see the refilled bytes in backward.
#include <map>

#include "executor/memory_meter.h"
#include "executor/strategies/units.h"
#include "executor/tensor_parallel.h"
#include "executor/torch_compat.h"
#include "planner/errors.h"

namespace ftexec::strategies {
namespace {

class Sharded final : public DistStrategy {
 public:
  Sharded(LlamaModel& m, Comm& comm, const StrategyOptions& o) : m_(m), comm_(comm), o_(o) {
    const ftplan::Parallelism& p = o.parallel;
    keep_root_ = p.sharding == ftplan::Sharding::fsdp && p.reshard_after_forward;
    keep_all_ = !p.reshard_after_forward;
    if (p.offload_params != p.offload_optimizer)
      ftplan::fail_input("parallel layout " + ftplan::name(p) + ": at zero_stage 3 ftexec offloads the parameters with the "
                         "optimizer states (offload=optimizer+params) or neither");
    offload_ = p.offload_params;
    const int N = comm.world(), r = comm.rank();
    // Shard group: consecutive ranks [g·S, (g+1)·S) with S = dp_shard; replica group: the ranks at
    // the same position in each of the dp_replicate groups.
    if (p.dp_shard * p.dp_replicate != N)
      ftplan::fail_input("parallel layout " + ftplan::name(p) + ": dp_replicate(" + std::to_string(p.dp_replicate) +
                         ") * dp_shard(" + std::to_string(p.dp_shard) + ") != WORLD_SIZE(" + std::to_string(N) + ")");
    group_size_ = static_cast<int>(p.dp_shard);
    pos_ = r % group_size_;
    if (group_size_ < N) {
      for (int k = 0; k < group_size_; ++k) shard_group_.push_back(r - pos_ + k);
      for (int k = pos_; k < N; k += group_size_) replica_group_.push_back(k);
    }
    if (m.spec.tie_word_embeddings)
      ftplan::fail_input("parallel layout " + ftplan::name(p) + ": tied embeddings (" + m.spec.name +
                         ") are not supported by ftexec's sharded strategies yet");
    set_trainable(m, o.method);
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> shard_params;
    std::vector<DecayRanges> decay;
    for (auto& tensors : model_units(m, /*with_nf4=*/true)) {
      Unit u;
      std::vector<UnitTensor> train;
      std::map<at::ScalarType, std::vector<UnitTensor>> frozen;  // one flat buffer per dtype
      for (auto& t : tensors) {
        if (t.slot->requires_grad()) train.push_back(t);
        else frozen[t.slot->scalar_type()].push_back(t);
      }
      // Padded to a multiple of N (not only S): a hybrid gradient shard (padded / S) then divides
      // into the N/S chunks of the replica group's ring all-reduce.
      u.groups.push_back(flat_group(train, N));
      for (auto& [dtype, ts] : frozen) u.groups.push_back(flat_group(ts, N));
      HostMemoryScope host(offload_);
      for (FlatGroup& g : u.groups) {
        g.shard = g.padded / group_size_;
        at::Tensor shard;
        if (!g.empty()) {
          shard = at::empty({g.shard}, g.full.options().device(offload_ ? at::Device(at::kCPU) : g.full.device()));
          shard.copy_(g.chunk(pos_));
          compat::storage_resize(g.full, 0);
        }
        u.shards.push_back(shard);
      }
      const FlatGroup& train_group = u.groups[0];
      const at::Tensor& train_shard = u.shards[0];
      if (!train_group.empty()) {
        // Offloaded: the gradient shard accumulates in fp32 on the host (DeepSpeed's CPU Adam reads fp32).
        u.grad_shard = at::zeros({train_group.shard}, train_shard.options().dtype(offload_ ? at::kFloat : train_shard.scalar_type()));
        shard_params.push_back(shard_param(train_shard, u.grad_shard));
        decay.push_back(shard_decay_ranges(train_group, pos_));
        grad_shards_.push_back(u.grad_shard);
        if (m.tp) tp_replicated_.push_back(shard_ranges_where(train_group, pos_, tp_replicated));
      }
      units_.push_back(std::move(u));
    }
    {
      HostMemoryScope host(offload_);
      adam_ = std::make_unique<AdamW>(shard_params, o.adamw, o.precision == ftplan::Precision::mixed, decay);
    }
    for (size_t ui = 0; ui < units_.size(); ++ui)
      for (const auto& t : units_[ui].train().tensors)
        hooks_.push_back(compat::add_post_accumulate_hook(*t.slot, [this, ui] { on_grad(ui); }));
  }

  int64_t data_parallel_size() const override { return comm_.world(); }

  double step(const std::vector<TokenBatch>& micro) override {
    const int64_t G = static_cast<int64_t>(micro.size());
    double loss_sum = 0;
    for (int64_t i = 0; i < G; ++i) {
      first_micro_ = i == 0;
      auto [ids, labels] = micro_batch_tensors(micro[i], m_.options.device);
      at::Tensor loss = forward(ids, labels);
      loss_sum += loss.item<double>();
      begin_backward(units_.size() - 1);
      (loss * (1.0 / double(G))).backward();
      for (size_t u = units_.size(); u-- > 0;)  // units no hook finished (frozen, unused)
        if (!units_[u].finished) finish(u);
      release(units_.size() - 1);  // FSDP's root unit
    }
    at::NoGradGuard no_grad;
    if (!replica_group_.empty()) {  // hybrid: sum the shards' gradients across the replica groups
      for (auto& u : units_)
        if (u.grad_shard.defined()) comm_.all_reduce_ring(u.grad_shard, shard_padding_bytes(u.train()), replica_group_);
    }
    // Squared norms summed over every rank count each shard once per replica group: divide.
    HostMemoryScope host(offload_);
    TpNorm tp_norm;
    if (m_.tp) tp_norm = TpNorm{m_.tp->comm, m_.tp->tp, tp_replicated_};
    grad_norm_ = clip_grad_norm(grad_shards_, o_.max_grad_norm, &comm_, comm_.world() / group_size_, m_.tp ? &tp_norm : nullptr);
    adam_->step();
    return comm_.all_reduce_scalar(loss_sum / double(G)) / comm_.world();
  }

  StateBytes state_bytes() const override {
    StateBytes s;
    for (const auto& u : units_) {
      for (const auto& shard : u.shards)
        if (shard.defined()) s.weights += shard.nbytes();
      if (u.grad_shard.defined()) s.gradients += u.grad_shard.nbytes();
    }
    s.optimizer = adam_->state_bytes();
    if (offload_) {
      s.host = s.weights + s.gradients + s.optimizer;
      s.weights = s.gradients = s.optimizer = 0;
    }
    return s;
  }

  std::vector<std::pair<std::string, at::Tensor>> checkpoint_tensors() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (size_t u = 0; u < units_.size(); ++u)
      if (units_[u].shards[0].defined()) out.emplace_back("param_shard." + std::to_string(u), units_[u].shards[0]);
    for (auto& [k, t] : adam_->named_state()) out.emplace_back("optimizer." + k, t);
    return out;
  }
  int64_t optimizer_steps() const override { return adam_->step_count(); }
  void set_optimizer_steps(int64_t s) override { adam_->set_step_count(s); }

  // Rank 0's shard group gathers each unit's trainable flat buffer in turn (the frozen ones are not
  // saved), rank 0 emits it, and every member frees it again; the other groups hold the same
  // shards (replicas) and wait.
  void gather_trainable(const SaveEmit& emit) override {
    if (comm_.rank() >= group_size_) return;
    at::NoGradGuard no_grad;
    for (size_t ui = 0; ui < units_.size(); ++ui) {
      Unit& u = units_[ui];
      FlatGroup& g = u.groups[0];
      if (g.empty()) continue;
      const bool was_gathered = u.gathered;
      if (!was_gathered) {
        compat::storage_resize(g.full, size_t(g.padded) * g.full.element_size());
        g.chunk(pos_).copy_(u.shards[0]);
        comm_.all_gather(g.full, g.padding_bytes(), shard_group_);
      }
      if (comm_.rank() == 0) {
        std::vector<std::pair<std::string, at::Tensor>> named;
        for (const auto& t : g.tensors) named.emplace_back(t.name, *t.slot);
        emit(named);
      }
      if (!was_gathered) compat::storage_resize(g.full, 0);
    }
  }

 private:
  struct Unit {
    std::vector<FlatGroup> groups;   // [0] the trainable parameters, then the frozen ones by dtype
    std::vector<at::Tensor> shards;  // this rank's chunk of each group, own storage (undefined: empty group)
    at::Tensor grad_shard;           // this rank's gradient chunk of groups[0], own storage
    const FlatGroup& train() const { return groups[0]; }
    at::Tensor grad_full;                              // [train.padded] during the unit's backward
    bool gathered = false;
    bool needs_backward = false;  // its output required grad in this micro-batch's forward
    bool input_done = true;       // the gradient of its input is complete (or not needed)
    bool finished = true;         // backward done, gradients reduced, parameters freed
    int64_t ready = 0;            // gradients accumulated in this backward
  };

  void gather(size_t ui) {
    Unit& u = units_[ui];
    if (u.gathered) return;
    at::NoGradGuard no_grad;
    for (size_t k = 0; k < u.groups.size(); ++k) {
      FlatGroup& g = u.groups[k];
      if (g.empty()) continue;
      compat::storage_resize(g.full, size_t(g.padded) * g.full.element_size());
      g.chunk(pos_).copy_(u.shards[k]);
      comm_.all_gather(g.full, g.padding_bytes(), shard_group_);
    }
    u.gathered = true;
  }

  void release(size_t ui) {
    Unit& u = units_[ui];
    if (!u.gathered) return;
    for (FlatGroup& g : u.groups)
      if (!g.empty()) compat::storage_resize(g.full, 0);
    u.gathered = false;
  }

  bool keep_after_forward(size_t ui) const { return keep_all_ || (keep_root_ && ui == units_.size() - 1); }

  // Padding inside this rank's shard of `g` (the padding sits at the end of the flat buffer).
  double shard_padding_bytes(const FlatGroup& g) const {
    const int64_t end = (pos_ + 1) * g.shard, begin = pos_ * g.shard;
    return double(std::max<int64_t>(0, end - std::max(begin, g.numel))) * g.element_bytes();
  }

  // Runs unit ui on `input` and arms its backward hooks.
  template <class F>
  at::Tensor run_unit(size_t ui, const at::Tensor& input, F&& f) {
    gather(ui);
    if (ui + 1 < units_.size()) gather(ui + 1);  // prefetch the next unit
    Unit& u = units_[ui];
    u.input_done = !(input.defined() && input.requires_grad());
    u.ready = 0;
    u.finished = false;
    at::Tensor out = f();
    if (!keep_after_forward(ui)) release(ui);
    u.needs_backward = out.requires_grad();
    if (u.needs_backward && ui + 1 < units_.size()) {
      out.register_hook([this, ui](const at::Tensor&) {
        input_grad_done(ui + 1);
        begin_backward(ui);
      });
    }
    return out;
  }

  at::Tensor forward(const at::Tensor& ids, const at::Tensor& labels) {
    at::Tensor h = run_unit(0, at::Tensor(), [&] { return llama_embed(m_, ids); });
    for (int64_t l = 0; l < static_cast<int64_t>(m_.layers.size()); ++l)
      h = run_unit(size_t(l + 1), h, [&] { return llama_block_apply(m_, l, h); });
    return run_unit(units_.size() - 1, h, [&] { return llama_head_loss(m_, h, labels); });
  }

  void begin_backward(size_t ui) {
    Unit& u = units_[ui];
    if (u.finished) return;
    gather(ui);
    if (ui > 0 && units_[ui - 1].needs_backward && !units_[ui - 1].finished) gather(ui - 1);  // prefetch
    if (!u.train().empty() && !u.grad_full.defined()) {
      at::NoGradGuard no_grad;
      u.grad_full = at::zeros({u.train().padded}, u.train().full.options());
      bind_grads(u.train(), u.grad_full);
    }
  }

  void on_grad(size_t ui) {
    ++units_[ui].ready;
    maybe_finish(ui);
  }

  void input_grad_done(size_t ui) {
    units_[ui].input_done = true;
    maybe_finish(ui);
  }

  void maybe_finish(size_t ui) {
    const Unit& u = units_[ui];
    if (!u.finished && u.input_done && u.ready == int64_t(u.train().tensors.size())) finish(ui);
  }

  void finish(size_t ui) {
    Unit& u = units_[ui];
    at::NoGradGuard no_grad;
    if (!u.train().empty()) {
      if (!u.grad_full.defined()) {  // no gradient reached this unit: reduce zeros (every rank must)
        u.grad_full = at::zeros({u.train().padded}, u.train().full.options());
      }
      comm_.reduce_scatter_sum(u.grad_full, u.train().padding_bytes(), shard_group_);
      at::Tensor mine = u.grad_full.narrow(0, pos_ * u.train().shard, u.train().shard);
      // The mean over all ranks (SUM, then divide); hybrid adds the other groups' sums at the step.
      mine.mul_(1.0 / comm_.world());
      if (first_micro_) {
        u.grad_shard.copy_(mine);
      } else {
        HostMemoryScope host(offload_);  // (offloaded: the shard's copy on its way to the host)
        u.grad_shard.add_(mine.to(u.grad_shard.device(), u.grad_shard.scalar_type()));
      }
      for (auto& t : u.train().tensors) t.slot->mutable_grad() = at::Tensor();
      u.grad_full = at::Tensor();
    }
    // FSDP reshards its root unit only once backward is over (PyTorch FSDP's root keeps its
    // parameters from forward to the end of backward); the step's final sweep releases it.
    if (!(keep_root_ && ui == units_.size() - 1)) release(ui);
    u.finished = true;
  }

  LlamaModel& m_;
  Comm& comm_;
  StrategyOptions o_;
  bool keep_root_ = false;  // FSDP resharding after forward: the last unit stays gathered through backward
  bool keep_all_ = false;   // no resharding after forward: every unit stays gathered until its backward ends
  bool offload_ = false;    // offload_params: shards, gradient shards and AdamW on the host
  int group_size_ = 1;      // S = dp_shard: ranks sharding one replica (N but for hybrid)
  int pos_ = 0;             // this rank's position in its shard group: the chunk it owns
  RankGroup shard_group_;   // empty: the world
  RankGroup replica_group_; // hybrid with S < N: the ranks holding the same shard
  bool first_micro_ = true;
  std::vector<Unit> units_;
  std::vector<at::Tensor> grad_shards_;
  std::vector<DecayRanges> tp_replicated_;  // tensor parallelism: per gradient shard, the elements every tp rank holds whole
  std::unique_ptr<AdamW> adam_;
  std::vector<std::shared_ptr<torch::autograd::Node>> hooks_;
};

}  // namespace

std::unique_ptr<DistStrategy> make_sharded(LlamaModel& model, Comm& comm, const StrategyOptions& o) {
  return std::make_unique<Sharded>(model, comm, o);
}

}  // namespace ftexec::strategies

// Sharded parameters: ZeRO-3 and PyTorch-FSDP-style full sharding.
// Each unit (embedding, block, head) keeps its parameters as flat buffers (trainable and frozen
// apart) whose storage is empty except while the unit is in use; the rank keeps its shard.
//   forward   before unit u runs: gather u (unless prefetched) and prefetch u+1; after: free u.
//   backward  a hook on unit u's output fires when its gradient is complete, i.e. just before u's
//             backward: gather u again, prefetch u-1, point u's .grad fields at one zeroed flat
//             buffer. Once every gradient of u is accumulated (AccumulateGrad hooks) and the gradient
//             of u's input is complete (so no node of u still needs its weights), reduce-scatter the
//             flat gradients into the shard and free the parameters and the flat gradients.
//   fsdp      as zero3, but the last unit (norm, lm_head) stays gathered from its forward to the end
//             of backward, as PyTorch FSDP's root unit does (gathered once: one all-gather fewer).
// Freeing resizes the storage to 0 bytes (compat::storage_resize), as FSDP does, so the tensors
// autograd saved keep their identity and see the refilled bytes in backward.
#include "executor/strategies/units.h"
#include "executor/torch_compat.h"
#include "planner/errors.h"

namespace ftexec::strategies {
namespace {

class Sharded final : public DistStrategy {
 public:
  Sharded(LlamaModel& m, Comm& comm, const StrategyOptions& o) : m_(m), comm_(comm), o_(o) {
    fsdp_ = o.strategy == ftplan::Strategy::fsdp;
    if (m.spec.tie_word_embeddings)
      ftplan::fail_input("strategy " + ftplan::to_string(o.strategy) + ": tied embeddings (" + m.spec.name +
                         ") are not supported by ftexec's sharded strategies yet");
    set_trainable(m, o.method);
    const int N = comm.world(), r = comm.rank();
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> shard_params;
    for (auto& tensors : model_units(m)) {
      Unit u;
      std::vector<UnitTensor> train, frozen;
      for (auto& t : tensors) (t.slot->requires_grad() ? train : frozen).push_back(t);
      u.train = flat_group(train, N);
      u.frozen = flat_group(frozen, N);
      for (FlatGroup* g : {&u.train, &u.frozen}) {
        if (g->empty()) continue;
        at::Tensor shard = g->chunk(r).clone();
        (g == &u.train ? u.train_shard : u.frozen_shard) = shard;
        compat::storage_resize(g->full, 0);
      }
      if (!u.train.empty()) {
        u.grad_shard = at::zeros({u.train.shard}, u.train_shard.options());
        shard_params.push_back(shard_param(u.train_shard, u.grad_shard));
        grad_shards_.push_back(u.grad_shard);
      }
      units_.push_back(std::move(u));
    }
    adam_ = std::make_unique<AdamW>(shard_params, o.adamw, o.precision == ftplan::Precision::mixed);
    for (size_t ui = 0; ui < units_.size(); ++ui)
      for (size_t ti = 0; ti < units_[ui].train.tensors.size(); ++ti)
        hooks_.push_back(compat::add_post_accumulate_hook(*units_[ui].train.tensors[ti].slot, [this, ui] { on_grad(ui); }));
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
    grad_norm_ = clip_grad_norm(grad_shards_, o_.max_grad_norm, &comm_);
    adam_->step();
    return comm_.all_reduce_scalar(loss_sum / double(G)) / comm_.world();
  }

  StateBytes state_bytes() const override {
    StateBytes s;
    for (const auto& u : units_) {
      if (u.train_shard.defined()) s.weights += u.train_shard.nbytes();
      if (u.frozen_shard.defined()) s.weights += u.frozen_shard.nbytes();
      if (u.grad_shard.defined()) s.gradients += u.grad_shard.nbytes();
    }
    s.optimizer = adam_->state_bytes();
    return s;
  }

  std::vector<std::pair<std::string, at::Tensor>> checkpoint_tensors() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (size_t u = 0; u < units_.size(); ++u)
      if (units_[u].train_shard.defined()) out.emplace_back("param_shard." + std::to_string(u), units_[u].train_shard);
    for (auto& [k, t] : adam_->named_state()) out.emplace_back("optimizer." + k, t);
    return out;
  }
  int64_t optimizer_steps() const override { return adam_->step_count(); }
  void set_optimizer_steps(int64_t s) override { adam_->set_step_count(s); }

 private:
  struct Unit {
    FlatGroup train, frozen;
    at::Tensor train_shard, frozen_shard, grad_shard;  // this rank's, own storage
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
    const int r = comm_.rank();
    for (auto [g, shard] : {std::make_pair(&u.train, &u.train_shard), std::make_pair(&u.frozen, &u.frozen_shard)}) {
      if (g->empty()) continue;
      compat::storage_resize(g->full, size_t(g->padded) * g->full.element_size());
      g->chunk(r).copy_(*shard);
      comm_.all_gather(g->full, g->padding_bytes());
    }
    u.gathered = true;
  }

  void release(size_t ui) {
    Unit& u = units_[ui];
    if (!u.gathered) return;
    for (FlatGroup* g : {&u.train, &u.frozen})
      if (!g->empty()) compat::storage_resize(g->full, 0);
    u.gathered = false;
  }

  bool keep_after_forward(size_t ui) const { return fsdp_ && ui == units_.size() - 1; }

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
    if (!u.train.empty() && !u.grad_full.defined()) {
      at::NoGradGuard no_grad;
      u.grad_full = at::zeros({u.train.padded}, u.train_shard.options());
      bind_grads(u.train, u.grad_full);
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
    if (!u.finished && u.input_done && u.ready == int64_t(u.train.tensors.size())) finish(ui);
  }

  void finish(size_t ui) {
    Unit& u = units_[ui];
    at::NoGradGuard no_grad;
    if (!u.train.empty()) {
      if (!u.grad_full.defined()) {  // no gradient reached this unit: reduce zeros (every rank must)
        u.grad_full = at::zeros({u.train.padded}, u.train_shard.options());
      }
      comm_.reduce_scatter_sum(u.grad_full, u.train.padding_bytes());
      at::Tensor mine = u.grad_full.narrow(0, comm_.rank() * u.train.shard, u.train.shard);
      mine.mul_(1.0 / comm_.world());  // the mean over ranks (SUM, then divide)
      if (first_micro_) u.grad_shard.copy_(mine);
      else u.grad_shard.add_(mine);
      for (auto& t : u.train.tensors) t.slot->mutable_grad() = at::Tensor();
      u.grad_full = at::Tensor();
    }
    // FSDP reshards its root unit only once backward is over (PyTorch FSDP's root keeps its
    // parameters from forward to the end of backward); the step's final sweep releases it.
    if (!(fsdp_ && ui == units_.size() - 1)) release(ui);
    u.finished = true;
  }

  LlamaModel& m_;
  Comm& comm_;
  StrategyOptions o_;
  bool fsdp_ = false;
  bool first_micro_ = true;
  std::vector<Unit> units_;
  std::vector<at::Tensor> grad_shards_;
  std::unique_ptr<AdamW> adam_;
  std::vector<std::shared_ptr<torch::autograd::Node>> hooks_;
};

}  // namespace

std::unique_ptr<DistStrategy> make_sharded(LlamaModel& model, Comm& comm, const StrategyOptions& o) {
  return std::make_unique<Sharded>(model, comm, o);
}

}  // namespace ftexec::strategies

// Layers split across ranks: naive model parallelism and GPipe.
// Stage k of p = world size holds consecutive blocks (the planner's split: L/p, the first L%p stages
// one more), stage 0 also the embedding, the last stage the final norm, lm_head and the loss.
// Activations go forward and their gradients back point to point (send/recv).
//   mp              each micro-batch runs forward through every stage, then backward: one stage
//                   busy at a time.
//   pipeline_gpipe  all micro-batches forward, then all backward (Huang et al. 2019); each stage keeps
//                   the activations of every micro-batch in flight.
// Every rank reads every micro-batch (the labels live on the last stage, the ids on the first).
#include "executor/strategies/units.h"
#include "planner/errors.h"

namespace ftexec::strategies {
namespace {

class Pipeline final : public DistStrategy {
 public:
  Pipeline(LlamaModel& m, Comm& comm, const StrategyOptions& o) : m_(m), comm_(comm), o_(o) {
    gpipe_ = o.strategy == ftplan::Strategy::pipeline_gpipe;
    const int64_t L = static_cast<int64_t>(m.layers.size());
    p_ = comm.world();
    k_ = comm.rank();
    if (p_ > L)
      ftplan::fail_input("strategy " + ftplan::to_string(o.strategy) + ": " + std::to_string(p_) +
                         " stages (WORLD_SIZE) need at least as many layers, " + m.spec.name + " has " +
                         std::to_string(L));
    if (m.spec.tie_word_embeddings && p_ > 1)
      ftplan::fail_input("strategy " + ftplan::to_string(o.strategy) + ": tied embeddings (" + m.spec.name +
                         ") across stages are not supported by ftexec yet");
    set_trainable(m, o.method);
    // The planner's split (planner/memory_model.cpp): L/p layers, the first L%p stages one more.
    std::vector<int64_t> first(p_ + 1, 0);
    for (int64_t s = 0; s < p_; ++s) first[s + 1] = first[s] + L / p_ + (s < L % p_ ? 1 : 0);
    first_layer_ = first[k_];
    last_layer_ = first[k_ + 1];
    auto units = model_units(m);
    auto stage_of_unit = [&](size_t ui) -> int64_t {
      if (ui == 0) return 0;
      if (ui == units.size() - 1) return p_ - 1;
      const int64_t layer = int64_t(ui) - 1;
      for (int64_t s = 0; s < p_; ++s)
        if (layer < first[s + 1]) return s;
      return p_ - 1;
    };
    std::vector<bool> stage_trains(p_, false);
    for (size_t ui = 0; ui < units.size(); ++ui)
      for (auto& t : units[ui])
        if (t.slot->requires_grad()) stage_trains[stage_of_unit(ui)] = true;
    for (int64_t s = 0; s < k_; ++s) upstream_trains_ = upstream_trains_ || stage_trains[s];
    downstream_sends_grad_ = upstream_trains_ || stage_trains[k_];  // does stage k+1's input need grad?
    // Keep this stage's units; drop the others.
    for (size_t ui = 0; ui < units.size(); ++ui) {
      for (auto& t : units[ui]) {
        if (stage_of_unit(ui) != k_) {
          *t.slot = at::Tensor();
          continue;
        }
        owned_.push_back(*t.slot);
        if (t.slot->requires_grad()) trainable_.push_back(*t.slot);
      }
    }
    adam_ = std::make_unique<AdamW>(trainable_, o.adamw, o.precision == ftplan::Precision::mixed);
  }

  int64_t data_parallel_size() const override { return 1; }

  double step(const std::vector<TokenBatch>& micro) override {
    const int64_t G = static_cast<int64_t>(micro.size());
    loss_sum_ = 0;
    inflight_.assign(G, {});
    if (gpipe_) {
      for (int64_t i = 0; i < G; ++i) forward(i, micro[i], G);
      for (int64_t i = 0; i < G; ++i) backward(i, micro[i]);
    } else {
      for (int64_t i = 0; i < G; ++i) {
        forward(i, micro[i], G);
        backward(i, micro[i]);
      }
    }
    inflight_.clear();
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> grads;
    for (const auto& t : trainable_) grads.push_back(t.grad());
    grad_norm_ = clip_grad_norm(grads, o_.max_grad_norm, &comm_);
    adam_->step();
    for (const auto& g : grads)
      if (g.defined()) g.zero_();
    return comm_.all_reduce_scalar(k_ == p_ - 1 ? loss_sum_ / double(G) : 0.0);
  }

  StateBytes state_bytes() const override {
    StateBytes s;
    for (const auto& t : owned_) s.weights += t.nbytes();
    for (const auto& t : trainable_)
      if (t.grad().defined()) s.gradients += t.grad().nbytes();
    s.optimizer = adam_->state_bytes();
    return s;
  }

  std::vector<std::pair<std::string, at::Tensor>> checkpoint_tensors() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (size_t i = 0; i < trainable_.size(); ++i) out.emplace_back("param." + std::to_string(i), trainable_[i]);
    for (auto& [k, t] : adam_->named_state()) out.emplace_back("optimizer." + k, t);
    return out;
  }
  int64_t optimizer_steps() const override { return adam_->step_count(); }
  void set_optimizer_steps(int64_t s) override { adam_->set_step_count(s); }

 private:
  struct InFlight {
    at::Tensor input;   // received activation (stages > 0)
    at::Tensor output;  // sent activation, or the scaled loss on the last stage
  };

  at::Tensor activation(const TokenBatch& b) const {
    return at::empty({b.batch, b.seq_len, m_.spec.hidden_size},
                     at::TensorOptions().dtype(m_.options.dtype).device(m_.options.device));
  }

  void forward(int64_t i, const TokenBatch& b, int64_t G) {
    auto [ids, labels] = micro_batch_tensors(b, m_.options.device);
    InFlight& f = inflight_[i];
    at::Tensor h;
    if (k_ == 0) {
      h = llama_embed(m_, ids);
    } else {
      f.input = activation(b);
      comm_.recv(f.input, int(k_ - 1));
      f.input.set_requires_grad(upstream_trains_);
      h = f.input;
    }
    for (int64_t l = first_layer_; l < last_layer_; ++l) h = llama_block_apply(m_, l, h);
    if (k_ < p_ - 1) {
      comm_.send(h.detach(), int(k_ + 1));
      f.output = h;
    } else {
      at::Tensor loss = llama_head_loss(m_, h, labels);
      loss_sum_ += loss.item<double>();
      f.output = loss * (1.0 / double(G));
    }
  }

  void backward(int64_t i, const TokenBatch& b) {
    InFlight& f = inflight_[i];
    if (k_ == p_ - 1) {
      f.output.backward();
    } else if (downstream_sends_grad_) {
      at::Tensor g = activation(b);
      comm_.recv(g, int(k_ + 1));
      if (f.output.requires_grad()) f.output.backward(g);
    }
    if (k_ > 0 && upstream_trains_) comm_.send(f.input.grad(), int(k_ - 1));
    f = InFlight{};
  }

  LlamaModel& m_;
  Comm& comm_;
  StrategyOptions o_;
  bool gpipe_ = false;
  int64_t p_ = 1, k_ = 0, first_layer_ = 0, last_layer_ = 0;
  bool upstream_trains_ = false, downstream_sends_grad_ = false;
  std::vector<at::Tensor> owned_, trainable_;
  std::unique_ptr<AdamW> adam_;
  std::vector<InFlight> inflight_;
  double loss_sum_ = 0;
};

}  // namespace

std::unique_ptr<DistStrategy> make_pipeline(LlamaModel& model, Comm& comm, const StrategyOptions& o) {
  return std::make_unique<Pipeline>(model, comm, o);
}

}  // namespace ftexec::strategies

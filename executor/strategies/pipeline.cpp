// Layers split across ranks: naive model parallelism, GPipe and 1F1B (the layout's pp and schedule:
// naive, gpipe, one_f_one_b). Stage k of p = pp = world size holds consecutive blocks (the planner's split: L/p, the first L%p stages
// one more), stage 0 also the embedding, the last stage the final norm, lm_head and the loss.
// Activations go forward and their gradients back point to point (send/recv).
//   mp              each micro-batch runs forward through every stage, then backward: one stage
//                   busy at a time.
//   pipeline_gpipe  all micro-batches forward, then all backward (Huang et al. 2019); each stage keeps
//                   the activations of every micro-batch in flight.
//   pipeline_1f1b   PipeDream-flush (Narayanan et al. 2021, as Megatron-LM's
//                   forward_backward_pipelining_without_interleaving): stage k runs min(p-k-1, m)
//                   warm-up forwards, then alternates one forward and one backward, then drains the
//                   backwards; at most min(p-k, m) micro-batches are in flight on stage k instead of m.
//                   Same gradients as GPipe (the same sums, in the same micro-batch order per
//                   parameter), same bytes; in the steady state each neighbour pair exchanges an
//                   activation and a gradient at once (Comm::send_recv), as Megatron's
//                   send_forward_recv_backward does, since two blocking sends facing each other deadlock.
// Every rank reads every micro-batch (the labels live on the last stage, the ids on the first).
#include "executor/strategies/units.h"
#include "executor/tensor_parallel.h"
#include "planner/errors.h"

namespace ftexec::strategies {
namespace {

class Pipeline final : public DistStrategy {
 public:
  Pipeline(LlamaModel& m, Comm& comm, const StrategyOptions& o, Comm* dp) : m_(m), comm_(comm), o_(o), dp_(dp) {
    const ftplan::Parallelism& layout = o.parallel;
    const std::string name = "parallel layout " + ftplan::name(layout);
    if (layout.schedule == ftplan::PipelineSchedule::interleaved_1f1b || layout.virtual_stages != 1)
      ftplan::fail_input(name + ": ftexec runs the naive, gpipe and 1f1b schedules (virtual_stages 1), not interleaved 1F1B yet");
    gpipe_ = layout.schedule == ftplan::PipelineSchedule::gpipe;
    one_f_one_b_ = layout.schedule == ftplan::PipelineSchedule::one_f_one_b;
    const int64_t L = static_cast<int64_t>(m.layers.size());
    p_ = layout.pp;
    k_ = comm.rank();
    if (p_ != comm.world())
      ftplan::fail_input(name + ": pp(" + std::to_string(p_) + ") != WORLD_SIZE(" + std::to_string(comm.world()) + ")");
    if (p_ > L)
      ftplan::fail_input(name + ": " + std::to_string(p_) + " stages (pp) need at least as many layers, " + m.spec.name +
                         " has " + std::to_string(L));
    if (m.spec.tie_word_embeddings && p_ > 1)
      ftplan::fail_input(name + ": tied embeddings (" + m.spec.name + ") across stages are not supported by ftexec yet");
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
    // What --save needs of every unit, recorded before the other stages' tensors go: the owner
    // and, for each trainable tensor, its name, shape and dtype (stage 0 receives into those).
    for (size_t ui = 0; ui < units.size(); ++ui) {
      SavedUnit su;
      su.stage = stage_of_unit(ui);
      for (auto& t : units[ui])
        if (t.slot->requires_grad()) {
          su.names.push_back(t.name);
          su.shapes.push_back(t.slot->sizes().vec());
          su.options = t.slot->options().requires_grad(false);
          if (su.stage == k_) su.mine.push_back(*t.slot);
        }
      if (!su.names.empty()) saved_units_.push_back(std::move(su));
    }
    // Keep this stage's units; drop the others.
    std::vector<DecayRanges> decay;
    for (size_t ui = 0; ui < units.size(); ++ui) {
      for (auto& t : units[ui]) {
        if (stage_of_unit(ui) != k_) {
          *t.slot = at::Tensor();
          continue;
        }
        owned_.push_back(*t.slot);
        if (t.slot->requires_grad()) {
          trainable_.push_back(*t.slot);
          trainable_names_.push_back(t.name);
          decay.push_back(decay_ranges_of(t.name, t.slot->numel()));
        }
      }
    }
    // QLoRA: the NF4 weights of the other stages' blocks go too.
    for (int64_t l = 0; l < L; ++l)
      if (l < first_layer_ || l >= last_layer_)
        for (const auto& shape : layer_dense_linears(m.spec, l)) block_linear(m.layers[l], shape.name).nf4.reset();
    adam_ = std::make_unique<AdamW>(trainable_, o.adamw, o.precision == ftplan::Precision::mixed, decay);
    tp_norm_ = tp_norm_of(m, trainable_names_, trainable_);
  }

  // With data parallelism (dp_ over dp_replicate ranks holding the same stage) each replica reads its
  // own micro-batches; a pipeline alone reads them all.
  int64_t data_parallel_size() const override { return dp_ ? dp_->world() : 1; }

  double step(const std::vector<TokenBatch>& micro) override {
    const int64_t G = static_cast<int64_t>(micro.size());
    loss_sum_ = 0;
    inflight_.assign(G, {});
    if (one_f_one_b_) {
      run_1f1b(micro);
    } else if (gpipe_) {
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
    if (dp_ && dp_->world() > 1) sync_replicas();
    std::vector<at::Tensor> grads;
    for (const auto& t : trainable_) grads.push_back(t.grad());
    grad_norm_ = clip_grad_norm(grads, o_.max_grad_norm, &comm_, 1, tp_norm_.get());
    adam_->step();
    for (const auto& g : grads)
      if (g.defined()) g.zero_();
    const double loss = comm_.all_reduce_scalar(k_ == p_ - 1 ? loss_sum_ / double(G) : 0.0);
    return dp_ && dp_->world() > 1 ? dp_->all_reduce_scalar(loss) / dp_->world() : loss;
  }

  // Replicated stages (pp x dp): once per step, after the stage's last backward, the stage's
  // gradients are averaged over its data-parallel replicas in one flat all-reduce (what the
  // planner counts: planner/step_time.cpp, "data parallelism over each stage").
  void sync_replicas() {
    int64_t numel = 0;
    for (const auto& t : trainable_) numel += t.numel();
    if (numel == 0) return;
    at::Tensor flat = at::zeros({numel}, trainable_[0].options().requires_grad(false));
    int64_t off = 0;
    for (const auto& t : trainable_) {
      if (t.grad().defined()) flat.narrow(0, off, t.numel()).copy_(t.grad().reshape({-1}));
      off += t.numel();
    }
    dp_->all_reduce_sum(flat);
    flat.mul_(1.0 / dp_->world());
    off = 0;
    for (auto& t : trainable_) {
      at::Tensor p = t;
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      p.grad().copy_(flat.narrow(0, off, p.numel()).view(p.sizes()));
      off += p.numel();
    }
  }

  StateBytes state_bytes() const override {
    StateBytes s;
    s.weights = llama_nf4_bytes(m_);  // QLoRA: this stage's NF4 weights
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

  // Unit by unit: stage 0 emits its own; another stage's unit comes from its owner, tensor by
  // tensor, point to point (only rank 0 and that owner take part).
  void gather_trainable(const SaveEmit& emit) override {
    at::NoGradGuard no_grad;
    for (const SavedUnit& su : saved_units_) {
      std::vector<std::pair<std::string, at::Tensor>> named;
      if (su.stage == 0) {
        if (k_ != 0) continue;
        for (size_t i = 0; i < su.names.size(); ++i) named.emplace_back(su.names[i], su.mine[i]);
      } else if (k_ == su.stage) {
        for (const auto& t : su.mine) comm_.send(t.contiguous(), 0);
        continue;
      } else if (k_ == 0) {
        for (size_t i = 0; i < su.names.size(); ++i) {
          at::Tensor t = at::empty(su.shapes[i], su.options);
          comm_.recv(t, int(su.stage));
          named.emplace_back(su.names[i], t);
        }
      } else {
        continue;
      }
      emit(named);
    }
  }

 private:
  struct SavedUnit {
    int64_t stage = 0;                         // the stage that owns the unit
    std::vector<std::string> names;            // its trainable tensors
    std::vector<std::vector<int64_t>> shapes;
    at::TensorOptions options;
    std::vector<at::Tensor> mine;              // the tensors themselves, on their owner
  };
  struct InFlight {
    at::Tensor input;   // received activation (stages > 0)
    at::Tensor output;  // sent activation, or the scaled loss on the last stage
  };

  at::Tensor activation(const TokenBatch& b) const {
    return at::empty({b.batch, b.seq_len / m_.seq_shards, m_.spec.hidden_size},  // (sequence parallel: S/tp)
                     at::TensorOptions().dtype(m_.options.dtype).device(m_.options.device));
  }

  // Runs this stage's layers on micro-batch i. `input`: the activation received from stage k-1
  // (undefined on stage 0). Returns the activation to send to stage k+1 (undefined on the last
  // stage, which computes the loss).
  at::Tensor stage_forward(int64_t i, const TokenBatch& b, int64_t G, const at::Tensor& input) {
    auto [ids, labels] = micro_batch_tensors(b, m_.options.device);
    InFlight& f = inflight_[i];
    at::Tensor h;
    if (k_ == 0) {
      h = llama_embed(m_, ids);
    } else {
      f.input = input;
      f.input.set_requires_grad(upstream_trains_);
      h = f.input;
    }
    for (int64_t l = first_layer_; l < last_layer_; ++l) h = llama_block_apply(m_, l, h);
    if (k_ < p_ - 1) {
      f.output = h;
      return h.detach();
    }
    at::Tensor loss = llama_head_loss(m_, h, labels);
    loss_sum_ += loss.item<double>();
    f.output = loss * (1.0 / double(G));
    return at::Tensor();
  }

  // Backward of micro-batch i from the gradient of its output (received from stage k+1; undefined
  // on the last stage or when none is sent). Returns the gradient of its input for stage k-1
  // (undefined when none is sent), and frees the micro-batch.
  at::Tensor stage_backward(int64_t i, const at::Tensor& grad) {
    InFlight& f = inflight_[i];
    if (k_ == p_ - 1) {
      f.output.backward();
    } else if (grad.defined() && f.output.requires_grad()) {
      f.output.backward(grad);
    }
    at::Tensor g = k_ > 0 && upstream_trains_ ? f.input.grad() : at::Tensor();
    f = InFlight{};
    return g;
  }

  bool receives_grad() const { return k_ < p_ - 1 && downstream_sends_grad_; }

  at::Tensor recv_activation(const TokenBatch& b) {
    at::Tensor a = activation(b);
    comm_.recv(a, int(k_ - 1));
    return a;
  }

  void forward(int64_t i, const TokenBatch& b, int64_t G) {
    const at::Tensor out = stage_forward(i, b, G, k_ > 0 ? recv_activation(b) : at::Tensor());
    if (out.defined()) comm_.send(out, int(k_ + 1));
  }

  void backward(int64_t i, const TokenBatch& b) {
    at::Tensor grad;
    if (receives_grad()) {
      grad = activation(b);
      comm_.recv(grad, int(k_ + 1));
    }
    const at::Tensor g = stage_backward(i, grad);
    if (g.defined()) comm_.send(g, int(k_ - 1));
  }

  // PipeDream-flush on stage k (Megatron-LM's schedule, names as there).
  void run_1f1b(const std::vector<TokenBatch>& micro) {
    const int64_t G = static_cast<int64_t>(micro.size());
    const bool has_prev = k_ > 0, has_next = k_ < p_ - 1;
    const int64_t warmup = std::min<int64_t>(p_ - k_ - 1, G), remaining = G - warmup;
    int64_t fi = 0, bi = 0;  // next micro-batch to run forward, backward
    for (; fi < warmup; ++fi) forward(fi, micro[fi], G);
    at::Tensor input = remaining > 0 && has_prev ? recv_activation(micro[fi]) : at::Tensor();
    for (int64_t r = 0; r < remaining; ++r, ++fi, ++bi) {
      const at::Tensor out = stage_forward(fi, micro[fi], G, input);
      at::Tensor grad;
      if (has_next) {  // send_forward_recv_backward
        if (receives_grad()) {
          grad = activation(micro[bi]);
          comm_.send_recv(out, int(k_ + 1), grad, int(k_ + 1));
        } else {
          comm_.send(out, int(k_ + 1));
        }
      }
      const at::Tensor g = stage_backward(bi, grad);
      input = at::Tensor();
      if (!has_prev) continue;
      if (r + 1 < remaining) {  // send_backward_recv_forward
        input = activation(micro[fi + 1]);
        if (g.defined()) comm_.send_recv(g, int(k_ - 1), input, int(k_ - 1));
        else comm_.recv(input, int(k_ - 1));
      } else if (g.defined()) {
        comm_.send(g, int(k_ - 1));
      }
    }
    for (; bi < G; ++bi) backward(bi, micro[bi]);  // cool-down
  }

  LlamaModel& m_;
  Comm& comm_;
  StrategyOptions o_;
  bool gpipe_ = false;
  bool one_f_one_b_ = false;
  int64_t p_ = 1, k_ = 0, first_layer_ = 0, last_layer_ = 0;
  bool upstream_trains_ = false, downstream_sends_grad_ = false;
  Comm* dp_ = nullptr;  // the stage's data-parallel replicas (pp x dp), or null
  std::vector<at::Tensor> owned_, trainable_;
  std::vector<std::string> trainable_names_;
  std::unique_ptr<TpNorm> tp_norm_;  // tensor parallelism: the norm over the tp group
  std::vector<SavedUnit> saved_units_;  // units with trainable tensors, forward order
  std::unique_ptr<AdamW> adam_;
  std::vector<InFlight> inflight_;
  double loss_sum_ = 0;
};

}  // namespace

std::unique_ptr<DistStrategy> make_pipeline(LlamaModel& model, Comm& comm, const StrategyOptions& o, Comm* dp) {
  return std::make_unique<Pipeline>(model, comm, o, dp);
}

}  // namespace ftexec::strategies

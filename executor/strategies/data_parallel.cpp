// Replicated parameters: one process, DDP, ZeRO-1 and ZeRO-2 (the layout's fields: every degree 1;
// dp_replicate > 1 without sharding; zero_stage 1 or 2 over dp_shard, offload_optimizer).
//   single  the single-device Trainer (executor/trainer.h): the reference every other layout matches.
//   ddp    gradients all-reduced in buckets (the first 1 MiB, then 25 MiB, in backward order), each
//          launched from the AccumulateGrad hooks as soon as backward has filled it and every earlier
//          bucket is launched (PyTorch's Reducer); Gloo runs it on its own thread while backward
//          goes on. Buckets copy the gradients (gradient_as_bucket_view=False), as the planner counts.
//          Under gradient accumulation only the last micro-batch communicates (no_sync).
//   zero1  gradients accumulate locally; once per step each unit's gradients are copied into the
//          bucket and reduce-scattered; AdamW updates this rank's shard of each unit's flat buffer;
//          the updated shards are all-gathered in place.
//   zero2  as zero1, but each unit is reduce-scattered during every micro-batch's backward as soon as
//          its gradients are complete, and only the shard is kept (full gradients are freed as they
//          are copied into the bucket).
//   zero2_offload  (ZeRO-Offload, Ren et al. 2021) as zero2, but the reduced gradient shard goes to
//          the host at once (accumulated there in fp32), and AdamW runs on the host over an fp32
//          copy of the shard (or bf16 with fp32 masters under mixed) and its moments; the updated
//          shard is copied back into the device's flat buffer and all-gathered. The device keeps the
//          weights and the one reduction bucket, nothing else between steps.
#include <algorithm>

#include "executor/memory_meter.h"
#include "executor/strategies/units.h"
#include "executor/tensor_parallel.h"
#include "executor/torch_compat.h"
#include "planner/errors.h"

namespace ftexec::strategies {
namespace {

double sum_loss_and_average(Comm& comm, double local_mean) {
  return comm.all_reduce_scalar(local_mean) / comm.world();
}

int64_t bytes_of(const std::vector<at::Tensor>& ts) {
  int64_t b = 0;
  for (const auto& t : ts)
    if (t.defined()) b += t.nbytes();
  return b;
}

int64_t model_weight_bytes(LlamaModel& m) {
  int64_t b = llama_nf4_bytes(m);  // QLoRA's frozen block linears
  for (const auto& u : model_units(m))
    for (const auto& t : u) b += t.slot->nbytes();
  for (const auto& [name, t] : llama_named_buffers(m)) b += t.nbytes();  // untrained, never sharded (DeepSeek-V3)
  return b;
}

// ---- one process -------------------------------------------------------------------------------
class Single final : public DistStrategy {
 public:
  Single(LlamaModel& m, Comm& comm, const StrategyOptions& o)
      : m_(m), comm_(comm), trainer_(m, o.method, o.precision, o.adamw, o.grad_accum, o.max_grad_norm) {}

  int64_t data_parallel_size() const override { return 1; }

  double step(const std::vector<TokenBatch>& micro) override {
    size_t next = 0;
    const double loss = trainer_.step([&] { return micro.at(next++); });
    grad_norm_ = trainer_.last_grad_norm();
    return loss;
  }

  StateBytes state_bytes() const override {
    StateBytes s;
    s.weights = trainer_.weight_bytes();
    s.gradients = trainer_.gradient_bytes();
    s.optimizer = trainer_.optimizer_bytes();
    return s;
  }

  std::vector<std::pair<std::string, at::Tensor>> checkpoint_tensors() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    const auto& trainable = trainer_.trainable();
    for (size_t i = 0; i < trainable.size(); ++i) out.emplace_back("param." + std::to_string(i), trainable[i]);
    for (auto& [k, t] : trainer_.optimizer().named_state()) out.emplace_back("optimizer." + k, t);
    return out;
  }
  bool checkpoint_replicated() const override { return true; }
  int64_t optimizer_steps() const override { return trainer_.optimizer().step_count(); }
  void set_optimizer_steps(int64_t s) override { trainer_.optimizer().set_step_count(s); }
  void gather_trainable(const SaveEmit& emit) override { emit_replicated(m_, comm_.rank(), emit); }

 private:
  LlamaModel& m_;
  Comm& comm_;
  Trainer trainer_;
};

// ---- DDP ---------------------------------------------------------------------------------------
class Ddp final : public DistStrategy {
 public:
  Ddp(LlamaModel& m, Comm& comm, const StrategyOptions& o)
      : m_(m), comm_(comm), o_(o), trainable_(set_trainable(m, o.method)),
        adam_(trainable_, o.adamw, o.precision == ftplan::Precision::mixed,
              hf_decay_groups(trainable_names(m, o.method), trainable_)) {
    // Buckets in reverse parameter order (roughly the order backward produces gradients).
    int64_t cap = o.ddp_first_bucket_bytes;
    slot_of_.resize(trainable_.size());
    for (int64_t i = static_cast<int64_t>(trainable_.size()) - 1; i >= 0; --i) {
      const at::Tensor& p = trainable_[i];
      if (buckets_.empty() || (buckets_.back().bytes > 0 && buckets_.back().bytes + int64_t(p.nbytes()) > cap)) {
        if (!buckets_.empty()) cap = o.ddp_bucket_bytes;
        buckets_.push_back({});
      }
      auto& b = buckets_.back();
      slot_of_[i] = {static_cast<int>(buckets_.size() - 1), b.numel};
      b.members.push_back(i);
      b.numel += p.numel();
      b.bytes += p.nbytes();
    }
    for (auto& b : buckets_) b.flat = at::zeros({b.numel}, trainable_[0].options().requires_grad(false));
    for (size_t i = 0; i < trainable_.size(); ++i)
      hooks_.push_back(compat::add_post_accumulate_hook(trainable_[i], [this, i] { on_grad(i); }));
    tp_norm_ = tp_norm_of(m, trainable_names(m, o.method), trainable_);
  }

  int64_t data_parallel_size() const override { return comm_.world(); }

  double step(const std::vector<TokenBatch>& micro) override {
    const int64_t G = static_cast<int64_t>(micro.size());
    double loss = 0;
    for (int64_t i = 0; i < G; ++i) {
      sync_ = i == G - 1;  // no_sync on the others
      if (sync_) start_sync();
      auto [ids, labels] = micro_batch_tensors(micro[i], m_.options.device);
      at::Tensor l = llama_loss(m_, ids, labels);
      loss += l.item<double>();
      (l * (1.0 / double(G))).backward();
    }
    finish_sync();
    grad_norm_ = clip_grad_norm(grads(), o_.max_grad_norm, nullptr, 1, tp_norm_.get());
    adam_.step();
    zero_grads();
    return sum_loss_and_average(comm_, loss / double(G));
  }

  StateBytes state_bytes() const override {
    StateBytes s;
    s.weights = model_weight_bytes(m_);
    s.gradients = bytes_of(grads());
    s.optimizer = adam_.state_bytes();
    for (const auto& b : buckets_) s.buffers += b.flat.nbytes();
    return s;
  }

  std::vector<std::pair<std::string, at::Tensor>> checkpoint_tensors() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (size_t i = 0; i < trainable_.size(); ++i) out.emplace_back("param." + std::to_string(i), trainable_[i]);
    for (auto& [k, t] : adam_.named_state()) out.emplace_back("optimizer." + k, t);
    return out;
  }
  bool checkpoint_replicated() const override { return true; }
  int64_t optimizer_steps() const override { return adam_.step_count(); }
  void set_optimizer_steps(int64_t s) override { adam_.set_step_count(s); }
  void gather_trainable(const SaveEmit& emit) override { emit_replicated(m_, comm_.rank(), emit); }

 private:
  struct Bucket {
    std::vector<int64_t> members;
    int64_t numel = 0;
    int64_t bytes = 0;
    int64_t ready = 0;
    at::Tensor flat;
  };

  std::vector<at::Tensor> grads() const {
    std::vector<at::Tensor> g;
    for (const auto& p : trainable_) g.push_back(p.grad());
    return g;
  }

  void start_sync() {
    for (auto& b : buckets_) b.ready = 0;
    next_launch_ = 0;
  }

  void on_grad(size_t i) {
    if (!sync_) return;
    at::NoGradGuard no_grad;
    const auto [bi, offset] = slot_of_[i];
    Bucket& b = buckets_[bi];
    b.flat.narrow(0, offset, trainable_[i].numel()).copy_(trainable_[i].grad().reshape({-1}));
    if (++b.ready == static_cast<int64_t>(b.members.size())) launch_ready();
  }

  void launch_ready() {
    while (next_launch_ < buckets_.size() && buckets_[next_launch_].ready == int64_t(buckets_[next_launch_].members.size()))
      comm_.all_reduce_sum_async(buckets_[next_launch_++].flat);
  }

  void finish_sync() {
    at::NoGradGuard no_grad;
    // Parameters that got no gradient this step (unused) count as zero, in bucket order.
    for (size_t bi = next_launch_; bi < buckets_.size(); ++bi) {
      Bucket& b = buckets_[bi];
      for (int64_t i : b.members)
        if (!trainable_[i].grad().defined()) b.flat.narrow(0, slot_of_[i].second, trainable_[i].numel()).zero_();
      b.ready = static_cast<int64_t>(b.members.size());
    }
    launch_ready();
    comm_.wait_all();
    const double inv = 1.0 / comm_.world();
    for (size_t i = 0; i < trainable_.size(); ++i) {
      at::Tensor& p = trainable_[i];
      at::Tensor src = buckets_[slot_of_[i].first].flat.narrow(0, slot_of_[i].second, p.numel()).view(p.sizes());
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      p.grad().copy_(src).mul_(inv);
    }
    sync_ = false;
  }

  void zero_grads() {
    at::NoGradGuard no_grad;
    for (auto& p : trainable_)
      if (p.grad().defined()) p.grad().zero_();
  }

  LlamaModel& m_;
  Comm& comm_;
  StrategyOptions o_;
  std::vector<at::Tensor> trainable_;
  AdamW adam_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<int, int64_t>> slot_of_;  // parameter -> (bucket, element offset)
  std::vector<std::shared_ptr<torch::autograd::Node>> hooks_;
  std::unique_ptr<TpNorm> tp_norm_;  // tensor parallelism: the norm over the tp group
  size_t next_launch_ = 0;
  bool sync_ = false;
};

// ---- ZeRO-1 / ZeRO-2 ---------------------------------------------------------------------------
class Zero final : public DistStrategy {
 public:
  Zero(LlamaModel& m, Comm& comm, const StrategyOptions& o) : m_(m), comm_(comm), o_(o) {
    const ftplan::Parallelism& p = o.parallel;
    if (p.dp_replicate != 1 || p.dp_shard != comm.world())
      ftplan::fail_input("parallel layout " + ftplan::name(p) + ": ftexec shards ZeRO stage " + std::to_string(p.zero_stage) +
                         " over every rank (dp_shard(" + std::to_string(p.dp_shard) + ") = WORLD_SIZE(" +
                         std::to_string(comm.world()) + "), dp_replicate 1)");
    if (p.offload_params)
      ftplan::fail_input("parallel layout " + ftplan::name(p) + ": offload of parameters needs zero_stage 3");
    offload_ = p.offload_optimizer;      // ZeRO-Offload: shard gradients and AdamW on the host
    stage2_ = p.zero_stage >= 2 || offload_;  // (ZeRO-Offload reduces gradients as stage 2 does)
    set_trainable(m, o.method);
    const int N = comm.world(), r = comm.rank();
    int64_t total = 0, largest = 0;
    for (auto& unit : model_units(m)) {
      std::vector<UnitTensor> trainable;
      for (auto& t : unit)
        if (t.slot->requires_grad()) trainable.push_back(t);
      if (trainable.empty()) continue;
      groups_.push_back(flat_group(trainable, N));
      total += groups_.back().padded;
      largest = std::max(largest, groups_.back().padded);
    }
    // DeepSpeed's bucket: reduce_bucket_size elements, at least the largest unit, at most all of them.
    bucket_numel_ = std::min(total, std::max(largest, o.zero_bucket_elements));
    holds_all_ = bucket_numel_ == total;
    const auto opts = groups_.at(0).full.options();
    bucket_ = at::zeros({bucket_numel_}, opts);
    // ZeRO-1 with one bucket for everything reads its gradient shards straight from the bucket.
    int64_t cursor = 0;
    std::vector<at::Tensor> shard_params;
    std::vector<DecayRanges> decay;
    for (auto& g : groups_) {
      decay.push_back(shard_decay_ranges(g, r));
      at::Tensor shard_grad;
      if (offload_) {
        HostMemoryScope host;
        const auto host_opts = opts.device(at::kCPU);
        shard_grad = at::zeros({g.shard}, host_opts.dtype(at::kFloat));
        host_shards_.push_back(at::empty({g.shard}, host_opts));
        host_shards_.back().copy_(g.chunk(r));
        shard_grads_.push_back(shard_grad);
        shard_params.push_back(shard_param(host_shards_.back(), shard_grad));
        continue;
      }
      if (stage2_ || !holds_all_) {
        shard_grad = at::zeros({g.shard}, opts);
      } else {
        fixed_offset_.push_back(cursor);
        shard_grad = bucket_.narrow(0, cursor + r * g.shard, g.shard);
        cursor += g.padded;
      }
      shard_grads_.push_back(shard_grad);
      shard_params.push_back(shard_param(g.chunk(r), shard_grad));
    }
    slot_offset_.assign(groups_.size(), -1);
    if (m.tp) {
      tp_norm_ = std::make_unique<TpNorm>();
      tp_norm_->comm = m.tp->comm;
      tp_norm_->tp = m.tp->tp;
      for (auto& g : groups_) tp_norm_->replicated.push_back(shard_ranges_where(g, r, tp_replicated));
    }
    {
      HostMemoryScope host(offload_);
      adam_ = std::make_unique<AdamW>(shard_params, o.adamw, o.precision == ftplan::Precision::mixed, decay);
    }
    if (stage2_) {
      ready_.assign(groups_.size(), 0);
      for (size_t gi = 0; gi < groups_.size(); ++gi)
        for (size_t ti = 0; ti < groups_[gi].tensors.size(); ++ti)
          hooks_.push_back(compat::add_post_accumulate_hook(*groups_[gi].tensors[ti].slot, [this, gi, ti] { on_grad(gi, ti); }));
    }
  }

  int64_t data_parallel_size() const override { return comm_.world(); }

  double step(const std::vector<TokenBatch>& micro) override {
    const int64_t G = static_cast<int64_t>(micro.size());
    double loss = 0;
    for (int64_t i = 0; i < G; ++i) {
      first_micro_ = i == 0;
      cursor_ = 0;
      std::fill(ready_.begin(), ready_.end(), 0);
      auto [ids, labels] = micro_batch_tensors(micro[i], m_.options.device);
      at::Tensor l = llama_loss(m_, ids, labels);
      loss += l.item<double>();
      (l * (1.0 / double(G))).backward();
      if (stage2_) {
        for (size_t gi = 0; gi < groups_.size(); ++gi)  // units that got no gradient this micro-batch
          if (ready_[gi] < int64_t(groups_[gi].tensors.size())) reduce_unit(gi, /*from_bucket=*/false);
      }
    }
    if (!stage2_) {
      cursor_ = 0;
      first_micro_ = true;
      for (size_t gi = groups_.size(); gi-- > 0;) reduce_unit(gi, false);  // backward order, as ZeRO does
    }
    {
      at::NoGradGuard no_grad;
      {
        HostMemoryScope host(offload_);
        grad_norm_ = clip_grad_norm(shard_grads_, o_.max_grad_norm, &comm_, 1, tp_norm_.get());
        adam_->step();
      }
      for (size_t gi = 0; gi < host_shards_.size(); ++gi) groups_[gi].chunk(comm_.rank()).copy_(host_shards_[gi]);
      for (size_t gi = 0; gi < groups_.size(); ++gi) comm_.all_gather(groups_[gi].full, groups_[gi].padding_bytes());
      if (!stage2_) {
        for (auto& g : groups_)
          for (auto& t : g.tensors)
            if (t.slot->grad().defined()) t.slot->grad().zero_();
      }
    }
    return sum_loss_and_average(comm_, loss / double(G));
  }

  StateBytes state_bytes() const override {
    StateBytes s;
    s.weights = model_weight_bytes(m_);
    for (const auto& g : groups_)
      for (const auto& t : g.tensors)
        if (t.slot->grad().defined()) s.gradients += t.slot->grad().nbytes();
    s.buffers = bucket_.nbytes();
    if (offload_) {
      s.host = bytes_of(shard_grads_) + bytes_of(host_shards_) + adam_->state_bytes();
      return s;
    }
    if (stage2_ || !holds_all_) s.gradients += bytes_of(shard_grads_);
    s.optimizer = adam_->state_bytes();
    return s;
  }

  std::vector<std::pair<std::string, at::Tensor>> checkpoint_tensors() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (size_t gi = 0; gi < groups_.size(); ++gi)
      out.emplace_back("param_shard." + std::to_string(gi),
                       offload_ ? host_shards_[gi] : groups_[gi].chunk(comm_.rank()));
    for (auto& [k, t] : adam_->named_state()) out.emplace_back("optimizer." + k, t);
    return out;
  }
  int64_t optimizer_steps() const override { return adam_->step_count(); }
  void set_optimizer_steps(int64_t s) override { adam_->set_step_count(s); }
  void after_load() override {
    at::NoGradGuard no_grad;
    for (size_t gi = 0; gi < host_shards_.size(); ++gi) groups_[gi].chunk(comm_.rank()).copy_(host_shards_[gi]);
    for (auto& g : groups_) comm_.all_gather(g.full, g.padding_bytes());
  }
  // After each step's all-gather every rank holds the whole updated parameters.
  void gather_trainable(const SaveEmit& emit) override { emit_replicated(m_, comm_.rank(), emit); }

 private:
  // The bucket slot of unit gi: fixed (ZeRO-1 holding everything) or the next free range (slots are
  // reduced synchronously, so the bucket wraps around once the next unit does not fit).
  at::Tensor slot(size_t gi) {
    const FlatGroup& g = groups_[gi];
    if (!fixed_offset_.empty()) return bucket_.narrow(0, fixed_offset_[gi], g.padded);
    if (slot_offset_[gi] < 0) {
      if (cursor_ + g.padded > bucket_numel_) cursor_ = 0;
      slot_offset_[gi] = cursor_;
      cursor_ += g.padded;
    }
    return bucket_.narrow(0, slot_offset_[gi], g.padded);
  }

  // ZeRO-2: copy each gradient into the bucket as soon as it is accumulated, free it, and reduce
  // the unit once it is complete.
  void on_grad(size_t gi, size_t ti) {
    at::NoGradGuard no_grad;
    const FlatGroup& g = groups_[gi];
    at::Tensor s = slot(gi);
    at::Tensor& p = *g.tensors[ti].slot;
    if (ready_[gi] == 0) s.zero_();
    s.narrow(0, g.offsets[ti], p.numel()).copy_(p.grad().reshape({-1}));
    p.mutable_grad() = at::Tensor();
    if (++ready_[gi] == int64_t(g.tensors.size())) reduce_unit(gi, /*from_bucket=*/true);
  }

  void reduce_unit(size_t gi, bool from_bucket) {
    at::NoGradGuard no_grad;
    const FlatGroup& g = groups_[gi];
    at::Tensor s = slot(gi);
    if (!from_bucket) {
      if (stage2_ && ready_[gi] == 0) s.zero_();
      if (!stage2_) pack_grads(g, s);
      // (ZeRO-2, a partly complete unit: what arrived is already in the slot; the rest is zero.)
    }
    comm_.reduce_scatter_sum(s, g.padding_bytes());
    const int r = comm_.rank();
    s.narrow(0, r * g.shard, g.shard).mul_(1.0 / comm_.world());  // the mean over ranks (SUM, then divide)
    if (stage2_ || !holds_all_) {
      const at::Tensor mine = s.narrow(0, r * g.shard, g.shard);
      if (first_micro_ || !stage2_) shard_grads_[gi].copy_(mine);
      else if (offload_) {
        HostMemoryScope host;  // the shard's copy on its way to the host
        shard_grads_[gi].add_(mine.to(shard_grads_[gi].device(), at::kFloat));
      } else {
        shard_grads_[gi].add_(mine);
      }
    }
    if (gi < ready_.size()) ready_[gi] = int64_t(g.tensors.size());
    slot_offset_[gi] = -1;
  }

  LlamaModel& m_;
  Comm& comm_;
  StrategyOptions o_;
  bool stage2_ = false;            // zero_stage >= 2: gradients reduce-scattered as backward produces them
  bool offload_ = false;           // offload_optimizer: shard gradients, shard copies and AdamW on the host
  std::vector<FlatGroup> groups_;  // per unit with trainable tensors, forward order
  std::vector<at::Tensor> shard_grads_;
  std::vector<at::Tensor> host_shards_;  // zero2_offload: this rank's shard of each group, on the host
  std::unique_ptr<AdamW> adam_;
  at::Tensor bucket_;
  int64_t bucket_numel_ = 0;
  bool holds_all_ = false;
  std::vector<int64_t> fixed_offset_, slot_offset_;
  int64_t cursor_ = 0;
  std::vector<int64_t> ready_;
  bool first_micro_ = true;
  std::vector<std::shared_ptr<torch::autograd::Node>> hooks_;
  std::unique_ptr<TpNorm> tp_norm_;
};

}  // namespace

std::unique_ptr<DistStrategy> make_single(LlamaModel& model, Comm& comm, const StrategyOptions& o) {
  return std::make_unique<Single>(model, comm, o);
}

std::unique_ptr<DistStrategy> make_data_parallel(LlamaModel& model, Comm& comm, const StrategyOptions& o) {
  if (!o.parallel.shards_optimizer()) {  // replicas: DDP over dp_replicate
    if (o.parallel.dp_shard != 1)
      ftplan::fail_input("parallel layout " + ftplan::name(o.parallel) + ": dp_shard(" + std::to_string(o.parallel.dp_shard) +
                         ") > 1 needs a sharding (shard=zero1|zero2|zero3|fsdp|fsdp_shard_grad_op)");
    if (o.parallel.offload_optimizer || o.parallel.offload_params)
      ftplan::fail_input("parallel layout " + ftplan::name(o.parallel) + ": offload needs a ZeRO stage (shard=zero2 or zero3)");
    return std::make_unique<Ddp>(model, comm, o);
  }
  return std::make_unique<Zero>(model, comm, o);  // zero_stage 1 or 2 (zero1, zero2, zero2_offload)
}

}  // namespace ftexec::strategies

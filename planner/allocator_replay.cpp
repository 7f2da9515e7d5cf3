#include "planner/allocator_replay.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <unordered_map>

#include "planner/caching_allocator.h"
#include "planner/memory_model.h"
#include "planner/precision.h"

namespace ftplan {

std::optional<ReplayStep> replay_step_for(const PreparedJob& job, const Candidate& c) {
  const ModelSpec& model = *job.model;
  const TrainingSetup& setup = *job.setup;
  const FrameworkProfile& fw = *job.framework;
  const Parallelism& par = c.parallel;
  const bool replayed = job.hw->kind == "gpu" && fw.allocator_replay && par.sharding == Sharding::fsdp &&
                        setup.fsdp_version == 1 && par.shards_params() && par.reshard_after_forward && par.tp == 1 &&
                        par.cp == 1 && par.pp == 1 && par.ep == 1 && !par.pipelined() && !par.offload_optimizer &&
                        !par.offload_params && setup.method == Method::full && c.checkpointing == Checkpointing::full &&
                        setup.loss == Loss::full && !setup.compile && !c.activation_offload && setup.grad_accum == 1 &&
                        !setup.optimizer_in_backward && !model.moe.active() && job.layer_weight_bytes > 0;
  if (!replayed) return std::nullopt;
  ReplayStep s;
  s.shards = std::max<int64_t>(1, par.shard_group());
  s.layers = model.num_layers;
  s.micro_batch = c.micro_batch;
  const double B = static_cast<double>(c.micro_batch);
  s.tokens = B * static_cast<double>(setup.memory_seq_len());
  s.vocab = static_cast<double>(model.vocab_size);
  s.layer_weight_bytes = job.layer_weight_bytes, s.layer_compute_bytes = job.layer_compute_bytes;
  s.layer_grad_bytes = job.layer_grad_bytes, s.layer_opt_bytes = job.layer_opt_bytes;
  s.root_weight_bytes = job.embedding_weight_bytes + job.head_weight_bytes;
  s.root_compute_bytes = job.embedding_compute_bytes + job.head_compute_bytes;
  s.root_grad_bytes = job.embedding_grad_bytes + job.head_grad_bytes;
  s.root_opt_bytes = job.embedding_opt_bytes + job.head_opt_bytes;
  // The head's weight gradient, made first in backward: the embedding's shape where the two are tied.
  s.head_compute_bytes = job.head_compute_bytes + (model.tie_word_embeddings ? job.embedding_compute_bytes : 0.0);
  s.embedding_compute_bytes = job.embedding_compute_bytes;
  // A layer's parameters (the optimizer keeps states per parameter): q, k, v, o, gate, up, down, two norms.
  const double h = double(model.hidden_size), q = double(model.num_heads * model.head_dim),
               kv = double(model.num_kv_heads * model.head_dim), i = double(model.intermediate_size);
  const std::vector<double> params{h * q, h * kv, h * kv, q * h, h * i, h * i, i * h, h, h};
  double sum = 0;
  for (double p : params) sum += p;
  for (double p : params) s.layer_param_fractions.push_back(p / sum);
  const double emb = job.embedding_weight_bytes, head = job.head_weight_bytes;
  s.root_param_fractions = head > 0 ? std::vector<double>{emb / (emb + head), head / (emb + head)} : std::vector<double>{1.0};
  s.optimizer_transient_bytes = job.optimizer_transient_bytes;
  // Activations (FSDP computes with the gathered bf16 parameters: the [.][.][0] entries).
  const double a = activation_bytes(setup.precision);
  s.block_input_bytes = B * double(job.block_input_bytes_per_sample[0]);
  s.head_input_bytes = B * double(job.head_bytes_per_sample[0]);
  s.hidden_grad_bytes = a * s.tokens * h;
  // The recomputed layer's tensors: the two RMSNorm inputs in fp32, the four SwiGLU tensors (gate, SiLU, up,
  // down's input), the rest (q, k, v, attention output, norm outputs) in [tokens, hidden] pieces, summing to the
  // memory model's block (activation_memory.h).
  const double block = B * double(job.block_bytes_per_sample[static_cast<int>(c.attention)][0][0]);
  std::vector<double> named{4 * s.tokens * h, 4 * s.tokens * h, a * s.tokens * i, a * s.tokens * i, a * s.tokens * i,
                            a * s.tokens * i};
  double named_sum = 0;
  for (double t : named) named_sum += t;
  if (named_sum > block) {  // a smaller block than the Llama list (not expected): scale the list to it
    for (double& t : named) t *= block / named_sum;
    named_sum = block;
  }
  s.block_tensors = named;
  const double piece = a * s.tokens * h;
  for (double rest = block - named_sum; rest > 0.5; rest -= piece) s.block_tensors.push_back(std::min(piece, rest));
  s.logits_bytes_per_element = a;
  s.loss_shifted_copy = fw.losses.count(Loss::full) && fw.losses.at(Loss::full).shifted_copy;
  s.workspace_bytes = fw.cublas_workspace_bytes;
  return s;
}

namespace {

// The tensors of the replayed step, by key: allocate, free, and stop at the first request that fails.
using Key = int64_t;
enum Tag : int64_t {
  kWorkspace = 1, kParam, kShardCopy, kGathered, kInput, kForward, kHeadInput, kLogits, kLogitsFp32, kShifted,
  kLogSoftmax, kGradNll, kGradLogSoftmax, kGradSlice, kGradLogits, kGradHead, kGradHidden, kSaved, kGradViews,
  kGradAct, kGradFlat, kGradReduced, kGradShard, kGradEmbedding, kState, kTemporary
};
// A tensor's key: its kind, then up to three indices (layer, parameter, state), -1 for the root unit.
Key key(Tag tag, int64_t i = 0, int64_t j = 0, int64_t k = 0) {
  return ((((int64_t(tag) << 20) + (i + 1)) << 16) + j) * 4 + k;
}

class Replay {
 public:
  explicit Replay(int64_t capacity) : alloc_(capacity) { live_.reserve(2048); }
  CachingAllocator& allocator() { return alloc_; }
  bool failed() const { return failed_; }
  const char* failed_tensor() const { return failed_tensor_; }
  int64_t failed_request() const { return failed_request_; }
  int64_t allocated_at_failure() const { return allocated_at_failure_; }
  int64_t reserved_at_failure() const { return reserved_at_failure_; }

  // Records the failure when the allocator cannot serve the request; nothing happens after one.
  void take(Key k, double bytes, const char* what) {
    if (failed_) return;
    const int64_t n = static_cast<int64_t>(std::ceil(std::max(0.0, bytes)));
    const int64_t handle = alloc_.malloc(n);
    if (handle < 0) {
      failed_ = true;
      failed_tensor_ = what;
      failed_request_ = n;
      allocated_at_failure_ = alloc_.allocated_bytes();
      reserved_at_failure_ = alloc_.reserved_bytes();
      return;
    }
    live_[k] = handle;
  }
  void give(Key k) {
    auto it = live_.find(k);
    if (it == live_.end()) return;
    alloc_.free(it->second);
    live_.erase(it);
  }

 private:
  CachingAllocator alloc_;
  std::unordered_map<Key, int64_t> live_;
  bool failed_ = false;
  const char* failed_tensor_ = "";
  int64_t failed_request_ = 0, allocated_at_failure_ = 0, reserved_at_failure_ = 0;
};

}  // namespace

// One step of the Hugging Face Trainer under accelerate's FSDP-1 (FULL_SHARD, transformer-layer wrapping,
// forward_prefetch, BACKWARD_PRE, use_orig_params, bf16 MixedPrecision) with every decoder layer checkpointed:
//  - each unit is gathered before its forward and backward: a bf16 copy of the rank's shard, then the whole unit,
//    and the copy freed; the next unit's gather is issued first (prefetch); layers are resharded after forward,
//    the root unit (embedding, final norm, head) is not (torch/distributed/fsdp/_runtime_utils.py _unshard,
//    _reshard, _prefetch_handle; _flat_param.py pre_unshard/_use_low_precision_shard at
//    pytorch/pytorch 00ae0bc91ac2c1718d1baa193d9d299e2b82776c);
//  - a checkpointed layer keeps only its input; its forward's intermediates live briefly; backward recomputes
//    the layer, keeping its tensors, then frees them as their gradients are made;
//  - the loss: transformers' bf16 logits, their fp32 upcast and (before 4.49) the contiguous shifted copy, the
//    fp32 log-softmax kept for backward; backward makes the fp32 gradient of the log-softmax and of its input,
//    (before 4.49) the zero-padded gradient of the slice, and casts it to bf16 for the head
//    (LlamaForCausalLM.forward in transformers 4.43; loss/loss_utils.py ForCausalLMLoss since 4.49);
//  - a unit's parameter gradients are concatenated into its flat gradient (split_with_sizes backward: cat),
//    reduce-scattered into a new shard and kept in the shard's dtype until the optimizer step;
//  - AdamW creates its two states per parameter at its first step (torch/optim/adamw.py _init_group:
//    torch.zeros_like(p)), the foreach step allocates one temporary per state (_foreach_sqrt), and the Trainer's
//    zero_grad(set_to_none=True) frees the gradient shards.
ReplayResult replay_steps(const ReplayStep& step, int64_t capacity_bytes, int steps) {
  return replay_steps(step, capacity_bytes, steps, nullptr);
}

ReplayResult replay_steps(const ReplayStep& s, int64_t capacity_bytes, int steps, std::vector<ReplayStepPeaks>* peaks) {
  Replay r(capacity_bytes);
  ReplayResult out;
  const double N = static_cast<double>(s.shards);
  const int64_t L = s.layers;
  const double V = s.vocab, rows = static_cast<double>(s.micro_batch);
  bool states = false;
  // unit -1 is the root (embedding, final norm, head), 0..L-1 the layers.
  auto unshard = [&](int64_t unit, double compute) {
    r.take(key(kShardCopy, unit), compute / N, "a unit's bf16 shard copy");
    r.take(key(kGathered, unit), compute, "a gathered unit");
    r.give(key(kShardCopy, unit));
  };
  const int64_t root = -1;
  // A unit's post-backward: its views' gradients concatenated into the flat gradient, reduce-scattered, kept as
  // the rank's shard in the parameters' dtype.
  auto reduce_scatter = [&](int64_t unit, double compute, double grad, std::initializer_list<Key> views,
                            const char* flat_what) {
    r.take(key(kGradFlat), compute, flat_what);
    for (Key v : views) r.give(v);
    r.take(key(kGradReduced), compute / N, "a reduce-scattered gradient");
    r.give(key(kGradFlat));
    r.take(key(kGradShard, unit), grad / N, "a gradient shard");
    r.give(key(kGradReduced));
  };
  // Each unit's parameters, in the optimizer's order (the root's first, model.parameters()), with their share of
  // the unit: fn(unit, parameter, share of the unit's bytes).
  auto each_param = [&](auto&& fn) {
    for (size_t p = 0; p < s.root_param_fractions.size(); ++p) fn(root, int64_t(p), s.root_param_fractions[p], true);
    for (int64_t l = 0; l < L; ++l)
      for (size_t p = 0; p < s.layer_param_fractions.size(); ++p) fn(l, int64_t(p), s.layer_param_fractions[p], false);
  };
  // Long-lived: the sharded parameters (the dtype they are stored in) and the cuBLAS workspace.
  r.take(key(kWorkspace), double(s.workspace_bytes), "the cuBLAS workspace");
  r.take(key(kParam, root), s.root_weight_bytes / N, "the root's parameter shard");
  for (int64_t l = 0; l < L; ++l) r.take(key(kParam, l), s.layer_weight_bytes / N, "a layer's parameter shard");
  for (int step = 1; step <= steps && !r.failed(); ++step) {
    out.steps = step;
    r.allocator().reset_peaks();
    // This step's batch: the activations and the loss scale with its tokens.
    const double T = s.step_tokens.empty() ? s.tokens : s.step_tokens[size_t(step - 1) % s.step_tokens.size()];
    const double f = s.tokens > 0 ? T / s.tokens : 1.0;
    const double block_input = f * s.block_input_bytes, head_input = f * s.head_input_bytes,
                 hidden_grad = f * s.hidden_grad_bytes;
    // Forward.
    unshard(root, s.root_compute_bytes);
    r.take(key(kInput, 0), block_input, "a checkpointed layer's input");
    unshard(0, s.layer_compute_bytes);
    for (int64_t l = 0; l < L && !r.failed(); ++l) {
      if (l + 1 < L) unshard(l + 1, s.layer_compute_bytes);
      for (size_t t = 0; t < s.block_tensors.size(); ++t) {  // intermediates, each freed once the next exists
        r.take(key(kForward, int64_t(t)), f * s.block_tensors[t], "a layer's forward intermediate");
        if (t >= 1) r.give(key(kForward, int64_t(t) - 1));
      }
      r.take(key(kInput, l + 1), block_input, "a checkpointed layer's input");
      r.give(key(kForward, int64_t(s.block_tensors.size()) - 1));
      r.give(key(kGathered, l));
    }
    r.take(key(kHeadInput), head_input, "the final norm's and the head's saved inputs");
    const double shifted = (T - rows) * V * 4;
    r.take(key(kLogits), s.logits_bytes_per_element * T * V, "the head's logits");
    r.take(key(kLogitsFp32), 4 * T * V, "the loss's fp32 logits");
    if (s.loss_shifted_copy) {
      r.give(key(kLogits));
      r.take(key(kShifted), shifted, "the loss's shifted fp32 copy");
      r.take(key(kLogSoftmax), shifted, "the loss's fp32 log-softmax");
      r.give(key(kShifted));
      r.give(key(kLogitsFp32));
    } else {
      r.take(key(kLogSoftmax), 4 * T * V, "the loss's fp32 log-softmax");
      r.give(key(kLogitsFp32));
      r.give(key(kLogits));  // the model's output, dropped when compute_loss returns
    }
    // Backward: the loss, then the head.
    const double lsm = s.loss_shifted_copy ? shifted : 4 * T * V;
    r.take(key(kGradNll), lsm, "the loss's gradient");
    r.take(key(kGradLogSoftmax), lsm, "the log-softmax's input gradient");
    r.give(key(kGradNll));
    r.give(key(kLogSoftmax));
    if (s.loss_shifted_copy) {
      r.take(key(kGradSlice), 4 * T * V, "the zero-padded gradient of the shifted slice");
      r.give(key(kGradLogSoftmax));
      r.take(key(kGradLogits), s.logits_bytes_per_element * T * V, "the logits' bf16 gradient");
      r.give(key(kGradSlice));
    } else {
      r.take(key(kGradLogits), s.logits_bytes_per_element * T * V, "the logits' bf16 gradient");
      r.give(key(kGradLogSoftmax));
    }
    r.take(key(kGradHead), s.head_compute_bytes, "the head's weight gradient");
    r.take(key(kGradHidden, L), hidden_grad, "the hidden-state gradient");
    r.give(key(kGradLogits));
    r.give(key(kHeadInput));
    unshard(L - 1, s.layer_compute_bytes);
    for (int64_t l = L - 1; l >= 0 && !r.failed(); --l) {
      if (l >= 1) unshard(l - 1, s.layer_compute_bytes);
      for (size_t t = 0; t < s.block_tensors.size(); ++t)
        r.take(key(kSaved, int64_t(t)), f * s.block_tensors[t], "a recomputed layer's tensor");
      r.take(key(kGradViews), s.layer_compute_bytes, "a layer's parameter gradients");
      for (size_t t = s.block_tensors.size(); t-- > 0;) {
        r.take(key(kGradAct, int64_t(t)), f * s.block_tensors[t], "a layer's activation gradient");
        if (t + 1 < s.block_tensors.size()) r.give(key(kGradAct, int64_t(t) + 1));
        r.give(key(kSaved, int64_t(t)));
      }
      r.take(key(kGradHidden, l), hidden_grad, "the hidden-state gradient");
      r.give(key(kGradAct, 0));
      r.give(key(kGradHidden, l + 1));
      reduce_scatter(l, s.layer_compute_bytes, s.layer_grad_bytes, {key(kGradViews)}, "a layer's flat gradient");
      r.give(key(kGathered, l));
      r.give(key(kInput, l + 1));
    }
    // The root's backward: the embedding's gradient, then the root's flat gradient.
    r.take(key(kGradEmbedding), s.embedding_compute_bytes, "the embedding's gradient");
    reduce_scatter(root, s.root_compute_bytes, s.root_grad_bytes, {key(kGradEmbedding), key(kGradHead)},
                   "the root's flat gradient");
    r.give(key(kGathered, root));
    r.give(key(kInput, 0));
    r.give(key(kGradHidden, 0));
    // The optimizer step: the states at the first step, the foreach temporaries, then zero_grad.
    if (!states) {
      each_param([&](int64_t unit, int64_t p, double share, bool is_root) {
        const double bytes = (is_root ? s.root_opt_bytes : s.layer_opt_bytes) / N / 2 * share;
        for (int k = 0; k < 2; ++k) r.take(key(kState, unit, p, k), bytes, "an AdamW state");
      });
      states = true;
    }
    const double whole = s.root_grad_bytes + double(L) * s.layer_grad_bytes;
    const double transient = whole > 0 ? s.optimizer_transient_bytes / N / whole : 0.0;
    each_param([&](int64_t unit, int64_t p, double share, bool is_root) {
      r.take(key(kTemporary, unit, p), transient * (is_root ? s.root_grad_bytes : s.layer_grad_bytes) * share,
             "an optimizer temporary");
    });
    each_param([&](int64_t unit, int64_t p, double, bool) { r.give(key(kTemporary, unit, p)); });
    r.give(key(kGradShard, root));
    for (int64_t l = 0; l < L; ++l) r.give(key(kGradShard, l));
    if (peaks) peaks->push_back({r.allocator().peak_allocated_bytes(), r.allocator().peak_reserved_bytes()});
    out.peak_allocated_bytes = std::max(out.peak_allocated_bytes, r.allocator().peak_allocated_bytes());
    out.peak_reserved_bytes = std::max(out.peak_reserved_bytes, r.allocator().peak_reserved_bytes());
  }
  out.oom = r.failed();
  if (out.oom) {
    out.failed_step = out.steps;
    out.failed_tensor = r.failed_tensor();
    out.request_bytes = r.failed_request();
    out.allocated_bytes = r.allocated_at_failure();
    out.reserved_bytes = r.reserved_at_failure();
  }
  out.peak_allocated_bytes = std::max(out.peak_allocated_bytes, r.allocator().peak_allocated_bytes());
  out.peak_reserved_bytes = std::max(out.peak_reserved_bytes, r.allocator().peak_reserved_bytes());
  return out;
}

}  // namespace ftplan

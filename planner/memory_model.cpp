#include "planner/memory_model.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "planner/activation_memory.h"
#include "planner/format.h"
#include "planner/precision.h"

namespace ftplan {
namespace {

// NCCL's communicator buffers per GPU in a distributed job (estimate: 4 MiB × channels × peers
// on NVLink rings, rounded up; NCCL_BUFFSIZE default 4 MiB).
constexpr int64_t kNcclBufferBytes = INT64_C(256) << 20;
// DeepSpeed ZeRO-1/2 default reduce_bucket_size / allgather_bucket_size: 5e8 elements.
constexpr double kZeroBucketElements = 5e8;

// Parameters of one unit (the embedding, one block, the head), by how they are stored.
struct UnitParams {
  int64_t trainable = 0;  // stored with the trainable convention (weights, gradients, optimizer)
  int64_t frozen = 0;     // stored in the compute dtype
  int64_t nf4 = 0;        // stored in NF4 (QLoRA's frozen block linears)
  int64_t nf4_bytes = 0;  // their storage, tensor by tensor (nf4_storage_bytes)
  int64_t total() const { return trainable + frozen + nf4; }
};

UnitParams operator*(int64_t n, UnitParams u) { return {n * u.trainable, n * u.frozen, n * u.nf4, n * u.nf4_bytes}; }
UnitParams operator+(UnitParams a, UnitParams b) {
  return {a.trainable + b.trainable, a.frozen + b.frozen, a.nf4 + b.nf4, a.nf4_bytes + b.nf4_bytes};
}

int64_t lora_params_per_layer(const ModelSpec& model, const LoraSpec& lora) {
  int64_t n = 0;
  for (const auto& lin : block_linears(model))
    if (std::find(lora.targets.begin(), lora.targets.end(), lin.name) != lora.targets.end())
      n += lora.rank * (lin.in_features + lin.out_features);  // A: r×in, B: out×r
  return n;
}

struct JobUnits {
  UnitParams embedding, layer, head;  // head: final norm + lm_head (when untied)
  int64_t largest_linear = 0;         // elements of the largest block linear weight
};

JobUnits job_units(const ModelSpec& model, const TrainingSetup& setup) {
  const ParamCounts p = count_params(model);
  JobUnits u;
  int64_t linear_weights = 0, linear_nf4_bytes = 0;
  for (const auto& lin : block_linears(model)) {
    linear_weights += lin.in_features * lin.out_features;
    linear_nf4_bytes += nf4_storage_bytes(lin.in_features * lin.out_features);
    u.largest_linear = std::max(u.largest_linear, lin.in_features * lin.out_features);
  }
  switch (setup.method) {
    case Method::full:
      u.embedding = {p.embedding, 0, 0};
      u.layer = {p.per_layer, 0, 0};
      u.head = {p.final_norm + p.lm_head, 0, 0};
      break;
    case Method::lora:
      u.embedding = {0, p.embedding, 0};
      u.layer = {lora_params_per_layer(model, setup.lora), p.per_layer, 0};
      u.head = {0, p.final_norm + p.lm_head, 0};
      break;
    case Method::qlora:  // bitsandbytes quantises the block linears' weights; the rest stays bf16
      u.embedding = {0, p.embedding, 0};
      u.layer = {lora_params_per_layer(model, setup.lora), p.per_layer - linear_weights, linear_weights, linear_nf4_bytes};
      u.head = {0, p.final_norm + p.lm_head, 0};
      break;
  }
  return u;
}

struct StateBytes {
  double weights = 0, gradients = 0, optimizer = 0;
};

StateBytes state_bytes(const UnitParams& u, const TrainingSetup& setup) {
  const ParamBytes tb = trainable_param_bytes(setup.precision, setup.optimizer);
  return {u.trainable * tb.weight + u.frozen * frozen_weight_bytes(setup.precision) + double(u.nf4_bytes),
          u.trainable * tb.gradient, u.trainable * tb.optimizer};
}

// Every term saturates at 2^59 bytes (512 PiB): absurd sizes stay absurd instead of overflowing,
// and eight saturated terms still add up inside int64.
constexpr double kMaxTermBytes = 576460752303423488.0;  // 2^59
int64_t to_bytes(double x) { return static_cast<int64_t>(std::ceil(std::min(x, kMaxTermBytes))); }

bool is_pipeline(Strategy s) {
  return s == Strategy::mp || s == Strategy::pipeline_gpipe || s == Strategy::pipeline_1f1b;
}

void finish(MemoryEstimate& e, const HardwareSpec& hw, const TrainingSetup& setup, bool explain) {
  auto& m = e.per_gpu;
  m.total = m.weights + m.gradients + m.optimizer + m.activations + m.logits_loss + m.temporary + m.overhead;
  e.usable_bytes = static_cast<int64_t>(hw.memory_bytes * (1.0 - setup.headroom_fraction));
  e.fits = m.total <= e.usable_bytes;
  if (!e.fits && explain) {
    std::ostringstream r;
    r << "out of memory by " << format_gib(m.total - e.usable_bytes) << ": needs " << format_gib(m.total)
      << " per GPU, " << hw.id << " has " << format_gib(e.usable_bytes) << " usable ("
      << format_gib(hw.memory_bytes) << " less " << setup.headroom_fraction * 100 << "% headroom)";
    e.reason = r.str();
  }
}

}  // namespace

TrainableParams trainable_params(const ModelSpec& model, const TrainingSetup& setup) {
  const JobUnits u = job_units(model, setup);
  const UnitParams all = u.embedding + model.num_layers * u.layer + u.head;
  TrainableParams t;
  t.total = count_params(model).total;
  t.trainable = all.trainable;
  t.frozen = all.frozen + all.nf4;
  t.quantized = all.nf4;
  t.lora_per_layer = setup.method == Method::full ? 0 : u.layer.trainable;
  return t;
}

PreparedJob prepare_job(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup) {
  PreparedJob j;
  j.model = &model;
  j.hw = &hw;
  j.setup = &setup;
  const JobUnits u = job_units(model, setup);
  const StateBytes e = state_bytes(u.embedding, setup), l = state_bytes(u.layer, setup), h = state_bytes(u.head, setup);
  j.embedding_weight_bytes = e.weights;
  j.embedding_grad_bytes = e.gradients;
  j.embedding_opt_bytes = e.optimizer;
  j.layer_weight_bytes = l.weights;
  j.layer_grad_bytes = l.gradients;
  j.layer_opt_bytes = l.optimizer;
  j.head_weight_bytes = h.weights;
  j.head_grad_bytes = h.gradients;
  j.head_opt_bytes = h.optimizer;
  j.tied_head_weight_bytes = model.tie_word_embeddings ? e.weights : 0;
  j.trainable_params = (u.embedding + model.num_layers * u.layer + u.head).trainable;
  j.dequant_bytes = setup.method == Method::qlora ? 2 * u.largest_linear : 0;
  for (Attention a : {Attention::fused, Attention::eager})
    j.block_bytes_per_sample[static_cast<int>(a)] = block_activation_bytes(model, activation_inputs(setup, 1, a));
  j.head_bytes_per_sample = head_activation_bytes(model, activation_inputs(setup, 1, Attention::fused));
  j.block_input_bytes_per_sample = activation_bytes(setup.precision) * setup.seq_len * model.hidden_size;
  j.logits_bytes_per_sample = logits_loss_bytes(model, 1, setup.seq_len);
  return j;
}

MemoryEstimate estimate_memory(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup,
                               const Candidate& c) {
  return estimate_memory(prepare_job(model, hw, setup), c, setup.num_gpus);
}

MemoryEstimate estimate_memory(const PreparedJob& job, const Candidate& c, int64_t num_gpus, bool explain) {
  const ModelSpec& model = *job.model;
  const HardwareSpec& hw = *job.hw;
  const TrainingSetup& setup = *job.setup;
  MemoryEstimate e;
  e.strategy = c.strategy;
  e.candidate = c;
  const int64_t N = std::max<int64_t>(1, num_gpus);
  e.gpus_used = c.strategy == Strategy::single ? 1 : N;
  // Per-micro-batch sizes in double: a product of absurd sizes saturates (to_bytes) rather than
  // overflowing.
  const double B = static_cast<double>(c.micro_batch);
  const double block = B * job.block_bytes_per_sample[static_cast<int>(c.attention)];
  const double head_act = B * job.head_bytes_per_sample;
  const double block_input = B * job.block_input_bytes_per_sample;
  const double logits = B * job.logits_bytes_per_sample;
  const bool ckpt = c.checkpointing == Checkpointing::full;
  auto& m = e.per_gpu;

  // Activations of `layers` blocks with `in_flight` micro-batches alive (pipelines keep several).
  auto activations = [&](int64_t layers, bool with_head, int64_t in_flight) {
    double kept = ckpt ? layers * block_input : layers * block;
    double bytes = in_flight * (kept + (with_head ? head_act : 0));
    if (ckpt && layers > 0) bytes += block;  // the block being recomputed
    return to_bytes(bytes);
  };

  m.overhead = hw.framework_overhead_bytes + (e.gpus_used > 1 && hw.kind == "gpu" ? kNcclBufferBytes : 0);

  if (is_pipeline(c.strategy)) {
    // Stage k holds consecutive layers; the first stage the embedding, the last the head and loss
    // (tied embeddings are duplicated on the last stage, as Megatron does).
    const int64_t p = std::min<int64_t>(N, model.num_layers);
    const int64_t micro_batches = c.strategy == Strategy::mp ? 1 : setup.grad_accum;
    MemoryBreakdown worst;
    for (int64_t k = 0; k < p; ++k) {
      const int64_t layers = model.num_layers / p + (k < model.num_layers % p ? 1 : 0);
      const bool first = k == 0, last = k == p - 1;
      double w = layers * job.layer_weight_bytes, g = layers * job.layer_grad_bytes, o = layers * job.layer_opt_bytes;
      if (first) w += job.embedding_weight_bytes, g += job.embedding_grad_bytes, o += job.embedding_opt_bytes;
      if (last) w += job.head_weight_bytes + job.tied_head_weight_bytes, g += job.head_grad_bytes, o += job.head_opt_bytes;
      // GPipe keeps all m micro-batches in flight; 1F1B at most p - k on stage k.
      int64_t in_flight = c.strategy == Strategy::pipeline_1f1b ? std::min(p - k, micro_batches) : micro_batches;
      MemoryBreakdown s;
      s.weights = to_bytes(w);
      s.gradients = to_bytes(g);
      s.optimizer = to_bytes(o);
      s.activations = activations(layers, last, in_flight);
      // The loss keeps fp32 log-probs (4·T·V) for each micro-batch in flight beyond the current one.
      s.logits_loss = last ? to_bytes(logits + (in_flight - 1) * (logits / 3)) : 0;
      // Received activations and the gradient sent back: two block-input-sized buffers.
      s.temporary = to_bytes((p > 1 ? 2 * block_input : 0) + job.dequant_bytes);
      s.overhead = m.overhead;
      s.total = s.weights + s.gradients + s.optimizer + s.activations + s.logits_loss + s.temporary + s.overhead;
      if (s.total > worst.total) worst = s;
    }
    m = worst;
    finish(e, hw, setup, explain);
    return e;
  }

  const double layers = static_cast<double>(model.num_layers);
  double w = job.embedding_weight_bytes + layers * job.layer_weight_bytes + job.head_weight_bytes;
  double g = job.embedding_grad_bytes + layers * job.layer_grad_bytes + job.head_grad_bytes;
  double o = job.embedding_opt_bytes + layers * job.layer_opt_bytes + job.head_opt_bytes;
  if (!ckpt) {
    m.activations = activations(model.num_layers, true, 1);
    m.logits_loss = to_bytes(logits);
  } else {
    // Backward runs the head (and frees the loss's tensors) before it recomputes the last block,
    // so the recomputed block and the loss peak are never alive together: activations hold every
    // block input and the recomputed block; logits+loss only what the head and loss need beyond.
    m.activations = to_bytes(model.num_layers * block_input + block);
    m.logits_loss = to_bytes(std::max(0.0, head_act + logits - block));
  }
  const double layer_w = job.layer_weight_bytes, layer_g = job.layer_grad_bytes;
  const double largest_unit_w = std::max(layer_w, std::max(job.embedding_weight_bytes, job.head_weight_bytes));
  const double bucket =
      std::min(g, kZeroBucketElements * trainable_param_bytes(setup.precision, setup.optimizer).gradient);
  const int64_t shard = c.strategy == Strategy::fsdp_hybrid ? std::min(N, hw.gpus_per_node) : N;
  const double host_fp32_grads = 4.0 * job.trainable_params;
  double temp = job.dequant_bytes, host = 0;
  switch (c.strategy) {
    case Strategy::single: break;
    case Strategy::ddp: temp += g; break;  // buckets copy every gradient (gradient_as_bucket_view=False)
    case Strategy::zero1: o /= N; temp += bucket; break;
    case Strategy::zero2: g /= N; o /= N; temp += bucket; break;
    case Strategy::zero3:  // largest gathered unit + the prefetched layer + one layer's full gradients
      w /= N; g /= N; o /= N;
      temp += largest_unit_w + layer_w + layer_g;
      break;
    case Strategy::fsdp:
    case Strategy::fsdp_hybrid:  // the last unit (norm, lm_head) is not resharded after forward
      w /= shard; g /= shard; o /= shard;
      temp += job.head_weight_bytes + 2 * largest_unit_w + layer_g;
      break;
    case Strategy::fsdp_shard_grad_op:  // parameters stay gathered from forward through backward
      w = w + w / N; g /= N; o /= N;
      temp += layer_g;
      break;
    case Strategy::zero2_offload:
      // ZeRO-Offload: the reduced gradient shard goes to the host (fp32), where AdamW updates a copy
      // of the weight shard; the GPU keeps the weights and the reduction bucket. (DeepSpeed's
      // overlap_comm double-buffers that bucket: one more bucket, not counted.)
      host = (job.trainable_params * trainable_param_bytes(setup.precision, setup.optimizer).weight + o +
              host_fp32_grads) / N;
      o = 0; g = 0;
      temp += bucket;
      break;
    case Strategy::zero3_offload:  // parameters too: the GPU holds only gathered units (as zero3)
      host = (w + o + host_fp32_grads) / N;
      w = 0; g = 0; o = 0;
      temp += largest_unit_w + layer_w + layer_g;
      break;
    default: break;
  }
  if (setup.paged_optimizer) {  // bitsandbytes pages optimizer states out to host memory under pressure
    host += o;
    o = 0;
  }
  m.weights = to_bytes(w);
  m.gradients = to_bytes(g);
  m.optimizer = to_bytes(o);
  m.temporary = to_bytes(temp);
  m.host = to_bytes(host);
  finish(e, hw, setup, explain);
  return e;
}

std::vector<Strategy> applicable_strategies(const ModelSpec& model, const HardwareSpec& hw,
                                            const TrainingSetup& setup) {
  if (setup.num_gpus <= 1) return {Strategy::single, Strategy::zero2_offload, Strategy::zero3_offload};
  std::vector<Strategy> out;
  for (Strategy s : all_strategies()) {
    if (s == Strategy::fsdp_hybrid && setup.num_gpus <= hw.gpus_per_node) continue;
    if (is_pipeline(s) && model.num_layers < setup.num_gpus) continue;
    out.push_back(s);
  }
  return out;
}

int64_t max_micro_batch(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup,
                        Candidate c, int64_t limit) {
  const PreparedJob job = prepare_job(model, hw, setup);
  auto fits = [&](int64_t b) {
    c.micro_batch = b;
    return estimate_memory(job, c, setup.num_gpus, false).fits;
  };
  if (!fits(1)) return 0;
  int64_t lo = 1, hi = 2;  // memory grows with the micro-batch: double, then bisect
  while (hi <= limit && fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  hi = std::min(hi, limit + 1);
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

int64_t min_gpus(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup,
                 const Candidate& c, int64_t limit) {
  const PreparedJob job = prepare_job(model, hw, setup);
  const int64_t start = c.strategy == Strategy::single || c.strategy == Strategy::zero2_offload ||
                                c.strategy == Strategy::zero3_offload
                            ? 1
                            : 2;
  for (int64_t n = start; n <= limit; ++n) {
    if (is_pipeline(c.strategy) && n > model.num_layers) break;
    if (c.strategy == Strategy::fsdp_hybrid && n <= hw.gpus_per_node) continue;
    if (estimate_memory(job, c, n, false).fits) return n;
    if (c.strategy == Strategy::single) break;
  }
  return 0;
}

double zero_model_state_bytes(double params, double k, int64_t n, int stage) {
  switch (stage) {
    case 0: return (2 + 2 + k) * params;
    case 1: return 4 * params + k * params / n;
    case 2: return 2 * params + (2 + k) * params / n;
    default: return (2 + 2 + k) * params / n;
  }
}

std::vector<std::string> memory_assumptions(const ModelSpec& model, const HardwareSpec& hw,
                                            const TrainingSetup& setup) {
  const ParamBytes tb = trainable_param_bytes(setup.precision, setup.optimizer);
  std::vector<std::string> lines;
  std::ostringstream conv;
  conv << "precision " << to_string(setup.precision) << " with " << to_string(setup.optimizer) << ": "
       << tb.weight << " + " << tb.gradient << " + " << tb.optimizer << " = "
       << tb.weight + tb.gradient + tb.optimizer << " B per trainable parameter (weights + gradients + "
       << "optimizer incl. master weights)";
  lines.push_back(conv.str());
  if (setup.method == Method::lora)
    lines.push_back("LoRA: frozen base in " + std::string(setup.precision == Precision::fp32 ? "fp32" : "bf16") +
                    ", rank " + std::to_string(setup.lora.rank) + " on " + std::to_string(setup.lora.targets.size()) +
                    " module(s) per block");
  if (setup.method == Method::qlora)
    lines.push_back("QLoRA: block linears in NF4 (block 64, double quantisation: 4.127 bits/param), the rest bf16");
  lines.push_back("activations: tensors autograd keeps for backward (RMSNorm input in fp32, " +
                  std::string(activation_bytes(setup.precision) == 2 ? "bf16" : "fp32") +
                  " elsewhere); loss peak 12 B x tokens x vocab (fp32 log-softmax, its gradient, the logits' gradient)");
  lines.push_back("peak = sum of the terms (gradients alive with all activations: exact with gradient accumulation); "
                  "under full checkpointing the loss peak and the recomputed block are not alive together");
  lines.push_back("overhead: " + format_gib(hw.framework_overhead_bytes) +
                  " CUDA context + workspaces per GPU, +256 MiB NCCL buffers when distributed");
  lines.push_back("DDP: buckets hold a second copy of the gradients; ZeRO-1/2: 5e8-element buckets; "
                  "ZeRO-3: the largest gathered unit + one prefetched + one layer's unsharded gradients; FSDP also keeps "
                  "its last unit (norm, lm_head) gathered from forward into backward");
  std::ostringstream fit;
  fit << "fits: total <= " << (1 - setup.headroom_fraction) * 100 << "% of " << format_gib(hw.memory_bytes)
      << " (" << hw.name << ")";
  lines.push_back(fit.str());
  (void)model;
  return lines;
}

}  // namespace ftplan

#include "planner/memory_model.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "planner/activation_memory.h"
#include "planner/errors.h"
#include "planner/framework.h"
#include "planner/format.h"
#include "planner/precision.h"

namespace ftplan {
namespace {

// Parameters of one unit (the embedding, one block, the head), by how they are stored.
struct UnitParams {
  int64_t trainable = 0;  // stored with the trainable convention (weights, gradients, optimizer)
  int64_t frozen = 0;     // stored as the framework keeps frozen weights
  int64_t nf4 = 0;        // stored in NF4 (QLoRA's quantised linears)
  int64_t nf4_bytes = 0;  // their storage, tensor by tensor (nf4_storage_bytes)
  int64_t total() const { return trainable + frozen + nf4; }
};

UnitParams operator*(int64_t n, UnitParams u) { return {n * u.trainable, n * u.frozen, n * u.nf4, n * u.nf4_bytes}; }
UnitParams operator+(UnitParams a, UnitParams b) {
  return {a.trainable + b.trainable, a.frozen + b.frozen, a.nf4 + b.nf4, a.nf4_bytes + b.nf4_bytes};
}

// One tensor-parallel rank's adapters: each split as its base linear is (A whole and B by output
// columns on a column-parallel linear, A by input rows and B whole on a row-parallel one). A routed
// expert's linear has one adapter per expert (PEFT wraps each expert's nn.Linear).
int64_t lora_params(const std::vector<LinearShape>& linears, const LoraSpec& lora, bool experts_only = false) {
  int64_t n = 0;
  for (const auto& lin : linears)
    if ((!experts_only || is_expert_role(lin.role)) &&
        std::find(lora.targets.begin(), lora.targets.end(), lin.name) != lora.targets.end())
      n += lin.instances * lora.rank * (lin.in_features + lin.out_features);  // A: r×in, B: out×r
  return n;
}

struct JobUnits {
  UnitParams embedding, layer, head;  // head: final norm + lm_head (when untied); layer: one (MoE) block
  UnitParams blocks;                  // every block together (a MoE model's dense and MoE blocks)
  UnitParams experts;                 // the routed experts of every MoE block (their part of `blocks`)
  bool uniform = true;                // every block is `layer` (blocks = num_layers x layer)
  int64_t largest_quantized = 0;      // elements of the largest NF4 weight
  double layer_linear_weights = 0;    // elements of one block's linear weights (amp copies); mean over blocks
};

// One kind of block: its units, its routed experts' units, its linear weights.
struct LayerUnits {
  UnitParams layer, experts;
  int64_t linear_weights = 0;
};

LayerUnits layer_units(const ModelSpec& model, const TrainingSetup& setup, const ParamCounts& p, int64_t tp,
                       bool moe_layer, int64_t& largest_quantized) {
  const bool dq = setup.quantization.double_quant;
  const std::vector<LinearShape> linears = model.moe.active() ? layer_linears(model, moe_layer) : block_linears(model, tp);
  // What is stored quantised: a quantised base's modules as its checkpoint stores them (mxfp4: the experts);
  // QLoRA's bitsandbytes quantises every nn.Linear of the blocks (not bare parameters).
  auto quantized = [&](const LinearShape& lin) {
    return model.quantized.active() ? (!model.quantized.experts_only || is_expert_role(lin.role)) : lin.module;
  };
  int64_t q_weights = 0, q_bytes = 0, x_q_weights = 0, x_q_bytes = 0;
  LayerUnits r;
  for (const auto& lin : linears) {
    const int64_t w = lin.in_features * lin.out_features;
    r.linear_weights += lin.instances * w;
    if (setup.method != Method::qlora || !quantized(lin)) continue;
    const int64_t bytes = lin.instances * (model.quantized.active() ? quantized_linear_bytes(model.quantized, lin.in_features, lin.out_features)
                                                                    : nf4_storage_bytes(w, dq));
    q_weights += lin.instances * w, q_bytes += bytes;
    if (is_expert_role(lin.role)) x_q_weights += lin.instances * w, x_q_bytes += bytes;
    largest_quantized = std::max(largest_quantized, w);
  }
  const int64_t params = moe_layer || !model.moe.active() ? p.per_layer : p.dense_per_layer;
  const int64_t expert_params = moe_layer ? p.experts : 0;
  const int64_t lora = setup.method == Method::full ? 0 : lora_params(linears, setup.lora);
  const int64_t lora_x = setup.method == Method::full ? 0 : lora_params(linears, setup.lora, true);
  // A MoE block's buffers (DeepSeek-V3's e_score_correction_bias) are stored but never trained: frozen.
  const int64_t buffers = moe_layer ? p.buffers : 0;
  switch (setup.method) {
    case Method::full:
      r.layer = {params - buffers, buffers, 0};
      r.experts = {expert_params, 0, 0};
      break;
    case Method::lora:
      r.layer = {lora, params, 0};
      r.experts = {lora_x, expert_params, 0};
      break;
    case Method::qlora:
      r.layer = {lora, params - q_weights, q_weights, q_bytes};
      r.experts = {lora_x, expert_params - x_q_weights, x_q_weights, x_q_bytes};
      break;
  }
  return r;
}

JobUnits job_units(const ModelSpec& model, const TrainingSetup& setup, const FrameworkProfile& fw, int64_t tp = 1) {
  const ParamCounts p = count_params(model, tp);
  const bool dq = setup.quantization.double_quant;
  if (model.quantized.active() && setup.method != Method::qlora)  // never its stored weights counted as bf16
    fail_input("--method (method) " + to_string(setup.method) + ": the base is stored quantized (" +
               model.quantized.describe() + "): LoRA on it is planned as qlora (job_fields.h apply_model)");
  JobUnits u;
  const LayerUnits main = layer_units(model, setup, p, tp, model.moe.active(), u.largest_quantized);
  u.layer = main.layer;
  u.uniform = model.moe.uniform();
  u.layer_linear_weights = static_cast<double>(main.linear_weights);
  u.blocks = model.num_layers * main.layer;
  u.experts = p.moe_layers * main.experts;
  if (!u.uniform) {  // a MoE model's dense blocks beside its MoE blocks
    const LayerUnits dense = layer_units(model, setup, p, tp, false, u.largest_quantized);
    const int64_t n_dense = model.num_layers - p.moe_layers;
    u.blocks = p.moe_layers * main.layer + n_dense * dense.layer;
    u.layer_linear_weights = (double(p.moe_layers) * main.linear_weights + double(n_dense) * dense.linear_weights) /
                             double(model.num_layers);
  }
  const int64_t embedding = p.embedding + p.vision;  // a wrapper's vision tower and projector live with the embedding
  switch (setup.method) {
    case Method::full:
      u.embedding = {embedding, 0, 0};
      u.head = {p.final_norm + p.lm_head, 0, 0};
      break;
    case Method::lora:
      u.embedding = {0, embedding, 0};
      u.head = {0, p.final_norm + p.lm_head, 0};
      break;
    case Method::qlora: {  // the block linears in NF4 (and the head where the framework quantises it)
      u.embedding = {0, embedding, 0};
      const bool q_head = fw.quantize_lm_head && p.lm_head > 0 && !model.quantized.active();
      u.head = {0, p.final_norm + (q_head ? 0 : p.lm_head), q_head ? p.lm_head : 0,
                q_head ? nf4_storage_bytes(p.lm_head, dq) : 0};
      if (q_head) u.largest_quantized = std::max(u.largest_quantized, p.lm_head);
      break;
    }
  }
  return u;
}

struct StateBytes {
  double weights = 0, compute = 0, gradients = 0, optimizer = 0;
};

// A unit's bytes: as stored, as gathered for compute (bf16 under mixed/amp/bf16), its gradients and
// optimizer states. QLoRA's unquantised weights are fp32 where the framework upcasts them
// (prepare_model_for_kbit_training).
StateBytes state_bytes(const UnitParams& u, const TrainingSetup& setup, const FrameworkProfile& fw) {
  const ParamBytes tb = trainable_param_bytes(setup.precision, setup.optimizer, setup.paged_optimizer);
  const double frozen = setup.method == Method::qlora && fw.fp32_upcast_unquantized ? 4.0
                        : setup.precision == Precision::amp                            ? fw.amp_frozen_weight_bytes
                                                                                       : frozen_weight_bytes(setup.precision);
  const double compute = activation_bytes(setup.precision);
  return {u.trainable * tb.weight + u.frozen * frozen + double(u.nf4_bytes),
          (u.trainable + u.frozen) * compute + double(u.nf4_bytes), u.trainable * tb.gradient, u.trainable * tb.optimizer};
}

// Every term saturates at 2^59 bytes (512 PiB): absurd sizes stay absurd instead of overflowing,
// and eight saturated terms still add up inside int64.
constexpr double kMaxTermBytes = 576460752303423488.0;  // 2^59
int64_t to_bytes(double x) { return static_cast<int64_t>(std::ceil(std::min(std::max(x, 0.0), kMaxTermBytes))); }

bool is_pipeline(Strategy s) {
  return s == Strategy::mp || s == Strategy::pipeline_gpipe || s == Strategy::pipeline_1f1b;
}

int64_t sum_terms(const MemoryBreakdown& m) {
  return m.weights + m.gradients + m.optimizer + m.activations + m.logits_loss + m.temporary;
}

// The three figures of one moment's allocations: allocated (+ cuBLAS workspace, which the caching
// allocator holds), reserved (the allocator's slack, by the profile), device (+ CUDA context and
// NCCL buffers). A host-only device has none of these.
struct Figures {
  int64_t allocated = 0, reserved = 0, device = 0;
  int64_t device_at_oom = 0;  // device with only the slack the allocator cannot release (what fits is judged on)
};
Figures figures(int64_t tensor_bytes, const HardwareSpec& hw, const FrameworkProfile& fw, bool distributed) {
  if (hw.kind != "gpu") return {tensor_bytes, tensor_bytes, tensor_bytes, tensor_bytes};
  Figures f;
  f.allocated = tensor_bytes + fw.cublas_workspace_bytes;
  f.reserved = to_bytes(double(f.allocated) * fw.reserved_over_allocated);
  const int64_t fixed = fw.cuda_context_bytes + (distributed ? fw.nccl_bytes_per_gpu : 0);
  f.device = f.reserved + fixed;
  // Before raising an out-of-memory error the caching allocator frees every cached block no tensor uses and
  // retries (c10/cuda/CUDACachingAllocator.cpp DeviceCachingAllocator::malloc: release_available_cached_blocks,
  // then release_cached_blocks, each followed by alloc_block), so the cache above the at-OOM slack never fails a job.
  f.device_at_oom = fw.reserved_over_allocated_at_oom < fw.reserved_over_allocated
                        ? to_bytes(double(f.allocated) * fw.reserved_over_allocated_at_oom) + fixed
                        : f.device;
  return f;
}

// What a plan may use of the device: what a process can allocate, less the headroom.
int64_t usable_bytes(const HardwareSpec& hw, const TrainingSetup& setup) {
  return static_cast<int64_t>(double(usable_device_bytes(hw)) * (1.0 - setup.headroom_fraction));
}

void finish(MemoryEstimate& e, const HardwareSpec& hw, const TrainingSetup& setup, bool explain) {
  e.usable_bytes = usable_bytes(hw, setup);
  const double host_node = setup.host_memory_gib ? *setup.host_memory_gib * double(1ll << 30)
                                                 : double(hw.host_memory_bytes_per_node);
  e.host_usable_bytes = static_cast<int64_t>(host_node * (1.0 - setup.headroom_fraction));
  const bool fragmented = e.replay && e.replay->oom;
  e.device_fits = e.fit_bytes <= e.usable_bytes && !fragmented;
  const bool host_fits = e.host_per_node <= e.host_usable_bytes;
  e.fits = e.device_fits && host_fits;
  if (e.fits || !explain) return;
  std::ostringstream r;
  if (fragmented) {
    const ReplayResult& p = *e.replay;
    r << "out of memory by fragmentation: replayed through the caching allocator, step " << p.failed_step << " cannot place "
      << p.failed_tensor << " (" << format_gib(p.request_bytes) << ") with " << format_gib(p.allocated_bytes) << " allocated and "
      << format_gib(p.reserved_bytes) << " reserved of the " << format_gib(e.usable_bytes) << " usable less the CUDA context"
      << " and NCCL buffers: cached segments split by smaller tensors cannot be released (set PYTORCH_CUDA_ALLOC_CONF="
         "expandable_segments:True, or a smaller micro-batch)";
  } else if (!e.device_fits) {
    r << "out of memory by " << format_gib(e.fit_bytes - e.usable_bytes) << ": needs " << format_gib(e.fit_bytes)
      << " per GPU (" << e.peak_phase << (e.peak_phase == "step" ? ", " + std::string(e.peak_moment) : "") << "), " << hw.id
      << " has " << format_gib(e.usable_bytes) << " usable (" << format_gib(usable_device_bytes(hw))
      << (usable_device_bytes(hw) < hw.memory_bytes ? " a process can allocate of " + format_gib(hw.memory_bytes) : std::string())
      << ", less " << setup.headroom_fraction * 100 << "% headroom)";
  }
  if (!host_fits) {
    if (!e.device_fits) r << "; ";
    r << "out of host memory by " << format_gib(e.host_per_node - e.host_usable_bytes) << ": needs "
      << format_gib(e.host_per_node) << " per node, it has " << format_gib(e.host_usable_bytes) << " usable ("
      << format_gib(host_node) << (setup.host_memory_gib ? " from --host-memory-gib" : " per node in hwdb") << ")";
  }
  e.reason = r.str();
}

}  // namespace

TrainableParams trainable_params(const ModelSpec& model, const TrainingSetup& setup) {
  const JobUnits u = job_units(model, setup, framework_profile(setup.framework));
  const UnitParams all = u.embedding + u.blocks + u.head;
  TrainableParams t;
  t.total = count_params(model).total;
  t.trainable = all.trainable;
  t.frozen = all.frozen + all.nf4;
  t.quantized = all.nf4;
  t.lora_per_layer = setup.method == Method::full ? 0 : u.blocks.trainable / std::max<int64_t>(1, model.num_layers);
  return t;
}

namespace {
ActivationInputs sharded_inputs(ActivationInputs in, const ShardShape& shape) {
  in.tp = shape.tp;
  in.sequence_parallel = shape.sequence_parallel;
  in.cp = shape.cp;
  in.ep = shape.ep;
  return in;
}
}  // namespace

ShardShape shard_shape(const Parallelism& p) { return {p.tp, p.sequence_parallel && p.tp > 1, p.cp, p.ep}; }

PreparedJob prepare_job(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup, const ShardShape& shape) {
  PreparedJob j;
  j.model = &model;
  j.hw = &hw;
  j.setup = &setup;
  j.shape = shape;
  j.framework = &framework_profile(setup.framework);
  const FrameworkProfile& fw = *j.framework;
  // One tensor-parallel rank's share of every unit; loading and saving handle the whole model.
  const JobUnits u = job_units(model, setup, fw, shape.tp);
  const JobUnits whole = shape.tp > 1 ? job_units(model, setup, fw) : u;
  // One block's bytes: the block, or the mean block where a MoE model's dense and MoE blocks differ.
  const double L = static_cast<double>(std::max<int64_t>(1, model.num_layers));
  auto per_layer = [L](StateBytes b) {
    b.weights /= L, b.compute /= L, b.gradients /= L, b.optimizer /= L;
    return b;
  };
  const StateBytes e = state_bytes(u.embedding, setup, fw), h = state_bytes(u.head, setup, fw);
  const StateBytes l = u.uniform ? state_bytes(u.layer, setup, fw) : per_layer(state_bytes(u.blocks, setup, fw));
  if (model.moe.active()) {  // the routed experts' share of one (mean) block: what expert parallelism splits
    const StateBytes x = per_layer(state_bytes(u.experts, setup, fw));
    j.layer_expert_weight_bytes = x.weights;
    j.layer_expert_compute_bytes = x.compute;
    j.layer_expert_grad_bytes = x.gradients;
    j.layer_expert_opt_bytes = x.optimizer;
  }
  j.embedding_weight_bytes = e.weights;
  j.embedding_compute_bytes = e.compute;
  j.embedding_grad_bytes = e.gradients;
  j.embedding_opt_bytes = e.optimizer;
  j.layer_weight_bytes = l.weights;
  j.layer_compute_bytes = l.compute;
  j.layer_grad_bytes = l.gradients;
  j.layer_opt_bytes = l.optimizer;
  j.head_weight_bytes = h.weights;
  j.head_compute_bytes = h.compute;
  j.head_grad_bytes = h.gradients;
  j.head_opt_bytes = h.optimizer;
  j.tied_head_weight_bytes = model.tie_word_embeddings ? e.weights : 0;
  const UnitParams all = u.embedding + u.blocks + u.head;
  j.trainable_params = all.trainable;
  j.expert_trainable_params = u.experts.trainable;
  const ParamBytes tb = trainable_param_bytes(setup.precision, setup.optimizer);
  // FSDP-1 with use_orig_params: a unit mixing frozen and trainable weights keeps a gradient for
  // all of it (the FlatParameter's gradient is whole) unless the adapters are units of their own.
  if (setup.method != Method::full && !fw.fsdp_lora_separate_units && setup.fsdp_version == 1)
    j.layer_frozen_grad_bytes = u.uniform ? (u.layer.frozen + u.layer.nf4) * tb.gradient
                                          : double(u.blocks.frozen + u.blocks.nf4) * tb.gradient / L;
  // amp: autocast's bf16 copies of fp32 weights (full fine-tuning, or a LoRA base the framework keeps in fp32).
  const bool fp32_weights = setup.method == Method::full || (setup.method == Method::lora && fw.amp_frozen_weight_bytes == 4);
  const bool amp_copies = setup.precision == Precision::amp && fw.autocast_weight_copies && fp32_weights;
  const ParamCounts pc = count_params(model, shape.tp);
  j.layer_weight_copy_bytes = amp_copies ? 2.0 * u.layer_linear_weights : 0;
  j.head_weight_copy_bytes = amp_copies ? 2.0 * (pc.lm_head > 0 ? pc.lm_head : pc.embedding) : 0;
  // The optimizer step's temporaries, per trainable parameter with fp32 states (halved with bf16 ones).
  const double state_scale = setup.precision == Precision::bf16 ? 0.5 : 1.0;
  j.optimizer_transient_bytes = setup.optimizer == Optimizer::adamw
                                    ? fw.optimizer_step_transient_bytes_per_param * state_scale * j.trainable_params
                                    : 0;
  // Loading holds the weights as they are stored, QLoRA's quantised ones in the compute dtype first
  // (bitsandbytes quantises each weight on its way to the GPU).
  {
    const StateBytes we = state_bytes(whole.embedding, setup, fw), wh = state_bytes(whole.head, setup, fw);
    const double blocks_weights = whole.uniform ? model.num_layers * state_bytes(whole.layer, setup, fw).weights
                                                : state_bytes(whole.blocks, setup, fw).weights;
    const UnitParams w_all = whole.embedding + whole.blocks + whole.head;
    j.model_load_bytes = we.weights + blocks_weights + wh.weights +
                         (model.quantized.active() ? 0.0 : double(w_all.nf4) * activation_bytes(setup.precision) - double(w_all.nf4_bytes));
    // In the trainable parameters' own dtype: PEFT's save_pretrained and Hugging Face's save write the tensors as
    // they are (fp32 adapters under amp), as does ftexec's --save.
    j.trainable_save_bytes = double(w_all.trainable) * tb.weight;
    j.model_save_bytes = we.weights + blocks_weights + wh.weights;
  }
  // bitsandbytes' quantisation statistics: the NF4 storage beyond the packed codes (half a byte per weight).
  if (setup.method == Method::qlora && !fw.quant_state_sharded && !model.quantized.active()) {
    auto stats = [](const UnitParams& x) { return std::max(0.0, double(x.nf4_bytes) - 0.5 * double(x.nf4)); };
    j.layer_quant_state_bytes = u.uniform ? stats(u.layer) : stats(u.blocks) / L;
    j.head_quant_state_bytes = stats(u.head);
  }
  j.dequant_bytes = setup.method == Method::qlora
                        ? to_bytes(fw.dequant_weights_alive * activation_bytes(setup.precision) * u.largest_quantized)
                        : 0;
  // Loading quantises one weight at a time: its input and the quantiser's temporaries (a profile figure per
  // element of the largest quantised weight), or, where the profile gives none, the step's dequantised weights.
  j.load_quantize_bytes = setup.method != Method::qlora ? 0
                          : fw.quantize_transient_bytes_per_element >= 0
                              ? to_bytes(fw.quantize_transient_bytes_per_element * double(u.largest_quantized))
                              : j.dequant_bytes;
  for (int ac = 0; ac < 2; ++ac) {
    const ActivationFramework af{fw.gqa_kv_repeated, ac == 1 && fw.autocast_weight_copies && fp32_weights,
                                 fw.selective_mode == "every-second-matmul", fw.quantized_matmul_saves_input,
                                 fw.sp_keeps_gathered_input, fw.fused_norm_mlp_kernels};
    for (Attention a : {Attention::fused, Attention::eager})
      for (int sel = 0; sel < 2; ++sel)
        j.block_bytes_per_sample[static_cast<int>(a)][sel][ac] =
            block_activation_bytes(model, sharded_inputs(activation_inputs(setup, 1, a, af, sel == 1), shape));
    const ActivationInputs one = sharded_inputs(activation_inputs(setup, 1, Attention::fused, af), shape);
    j.head_bytes_per_sample[ac] = head_activation_bytes(model, one);
    // A block input (what checkpointing keeps and a pipeline stage sends): split by cp, and by tp
    // under sequence parallelism.
    j.residual_bytes[ac] = one.residual_bytes;
    j.block_input_bytes_per_sample[ac] = split_activation_bytes(
        {double(one.residual_bytes) * setup.memory_seq_len() * model.hidden_size, 0, 0}, shape.tp, shape.sequence_parallel, shape.cp);
  }
  const double S = static_cast<double>(setup.memory_seq_len());
  const LossProfile& loss = fw.losses.count(setup.loss) ? fw.losses.at(setup.loss) : fw.losses.at(fw.loss);
  const bool compiled = setup.compile && loss.compiled_peak_bytes_per_token_vocab >= 0;
  const double peak_tv = compiled ? loss.compiled_peak_bytes_per_token_vocab : loss.peak_bytes_per_token_vocab;
  const double kept_tv = compiled ? loss.compiled_kept_bytes_per_token_vocab : loss.kept_bytes_per_token_vocab;
  j.loss_peak_bytes_per_sample = S * (peak_tv * model.vocab_size + loss.peak_bytes_per_token_hidden * model.hidden_size);
  j.loss_kept_bytes_per_sample = S * (kept_tv * model.vocab_size + loss.kept_bytes_per_token_hidden * model.hidden_size);
  // A final logit soft-cap keeps tanh's output through the loss where the loss takes whole logits.
  const double softcap = setup.loss == Loss::full && !compiled ? double(logit_softcap_bytes(model, 1, setup.memory_seq_len(), setup.precision)) : 0.0;
  j.loss_peak_bytes_per_sample += softcap;
  j.loss_kept_bytes_per_sample += softcap;
  // A mixture of experts' load-balancing loss, computed after the cross-entropy from every MoE layer's router
  // logits: what it keeps stays alive through the cross-entropy's backward; its one-hot mask only while computed.
  if (model.moe.active() && setup.moe.aux_loss.value_or(model.moe.output_router_logits)) {
    const double kept = double(aux_loss_bytes(model, 1, setup.memory_seq_len(), setup.precision, false));
    const double transient = double(aux_loss_bytes(model, 1, setup.memory_seq_len(), setup.precision, true)) - kept;
    j.loss_peak_bytes_per_sample = std::max(j.loss_peak_bytes_per_sample, j.loss_kept_bytes_per_sample + transient) + kept;
    j.loss_kept_bytes_per_sample += kept;
  }
  // Vocabulary-parallel loss (Megatron-LM's, torchtitan's loss_parallel): one rank's vocabulary
  // columns, of its context-parallel tokens.
  if (shape.tp * shape.cp > 1) {
    j.loss_peak_bytes_per_sample /= double(shape.tp * shape.cp);
    j.loss_kept_bytes_per_sample /= double(shape.tp * shape.cp);
  }
  return j;
}

MemoryEstimate estimate_memory(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup,
                               const Candidate& c) {
  return estimate_memory(prepare_job(model, hw, setup, shard_shape(c.parallel)), c, setup.num_gpus);
}

MemoryEstimate estimate_memory(const PreparedJob& job, const Candidate& c, int64_t num_gpus, bool explain) {
  const ModelSpec& model = *job.model;
  const HardwareSpec& hw = *job.hw;
  const TrainingSetup& setup = *job.setup;
  const FrameworkProfile& fw = *job.framework;
  const Parallelism& par = c.parallel;
  (void)num_gpus;  // the layout says how many GPUs it uses
  if (!(shard_shape(par) == job.shape))
    throw std::logic_error("estimate_memory: the candidate's tp/sp/cp differ from the prepared job's shape");
  MemoryEstimate e;
  e.candidate = c;
  e.gpus_used = std::max<int64_t>(1, par.gpus());
  const bool distributed = e.gpus_used > 1;
  // Per-micro-batch sizes in double: a product of absurd sizes saturates (to_bytes) rather than
  // overflowing.
  const double B = static_cast<double>(c.micro_batch);
  const bool ckpt = c.checkpointing == Checkpointing::full;
  const int sel = c.checkpointing == Checkpointing::selective ? 1 : 0;
  // Autocast's effects (fp32 residual stream, bf16 weight copies) where fp32 parameters meet the
  // matmuls; layouts that gather parameters (stage 3: FSDP, ZeRO-3) compute with the bf16 copies they gather.
  const int ac = par.gathers_params() ? 0 : 1;
  const double weight_copy = ac ? job.layer_weight_copy_bytes : 0.0, head_copy = ac ? job.head_weight_copy_bytes : 0.0;
  const double block = B * job.block_bytes_per_sample[static_cast<int>(c.attention)][sel][ac];
  const double block_full = B * job.block_bytes_per_sample[static_cast<int>(c.attention)][0][ac];  // a recomputed block
  // Selective checkpointing recomputes the rest of one block at a time in backward.
  const double selective_recompute = sel ? std::max(0.0, block_full - block) : 0.0;
  const double head_act = B * job.head_bytes_per_sample[ac];
  const double block_input = B * job.block_input_bytes_per_sample[ac];
  const double loss_peak = B * job.loss_peak_bytes_per_sample;
  const double loss_kept = B * job.loss_kept_bytes_per_sample;
  const bool offload_act = c.activation_offload && ckpt;
  auto& m = e.per_gpu;
  double act_host = 0;  // activation offloading: the block inputs in host memory, per rank

  // Activations of `layers` blocks with `in_flight` micro-batches alive (pipelines keep several),
  // with amp's bf16 weight copies (saved once per micro-batch's forward).
  auto activations = [&](int64_t layers, bool with_head, int64_t in_flight) {
    double kept = ckpt ? layers * block_input : layers * (block + weight_copy);
    if (offload_act) {  // all but the inputs being copied out / brought back stay on the host
      act_host += in_flight * std::max<int64_t>(0, layers - 2) * block_input;
      kept = std::min<int64_t>(layers, 2) * block_input;
    }
    double bytes = in_flight * (kept + (with_head ? head_act + head_copy : 0));
    if (ckpt && layers > 0) bytes += block_full + weight_copy;  // the block being recomputed
    if (layers > 0) bytes += selective_recompute;
    return to_bytes(bytes);
  };

  // The model states of the layers a rank holds (all of them, or a pipeline stage's), sharded over the
  // data-parallel ranks as the layout says: ZeRO's stages, FSDP (fully, or keeping parameters gathered
  // from forward to backward), offload to the host; DDP's buckets copy every gradient.
  const int64_t shard = par.shard_group();
  const ParamBytes tb = trainable_param_bytes(setup.precision, setup.optimizer);
  struct States {
    double w = 0, g = 0, o = 0, temp = 0, host = 0, opt_transient = 0;
  };
  // Expert parallelism (torchtitan's dp2ep, torchtitan/distributed/parallel_dims.py): the routed experts of each
  // block are split over the ep ranks of an expert group (each rank holds num_experts / ep of them, whole), and
  // whatever the layout shards it shards the experts over the rest of the sharding group, dp_shard x cp / ep
  // (dp_shard_mod_ep): a sharded state's experts end up / (dp_shard x cp) like the other states, an unsharded
  // one's / ep. A gathered block holds its other parameters whole and only the rank's own experts.
  const double E = static_cast<double>(std::max<int64_t>(1, par.ep));
  const bool ep_split = E > 1 && job.layer_expert_weight_bytes > 0;
  auto own_experts = [&](double whole, double experts) { return ep_split ? whole - experts + experts / E : whole; };
  const double layer_compute_own = own_experts(job.layer_compute_bytes, job.layer_expert_compute_bytes);
  const double layer_grad_own = own_experts(job.layer_grad_bytes, job.layer_expert_grad_bytes);
  const double layer_weight_own = own_experts(job.layer_weight_bytes, job.layer_expert_weight_bytes);
  // xw, xg, xo: the experts' bytes among w, g, o (all the rank's blocks), split over the expert group.
  auto shard_states = [&](double w, double g, double o, double layers, bool first, bool last, double trainable,
                          double xw = 0, double xg = 0, double xo = 0) {
    const double q_state = layers * job.layer_quant_state_bytes + (last ? job.head_quant_state_bytes : 0.0);
    States r{w, g, o, double(job.dequant_bytes), 0, job.optimizer_transient_bytes * (trainable / std::max(1.0, double(job.trainable_params)))};
    if (par.pp == 1) r.opt_transient = job.optimizer_transient_bytes;  // the whole model: exactly
    if (ep_split) {
      r.w = own_experts(w, xw), r.g = own_experts(g, xg), r.o = own_experts(o, xo);
      xw /= E, xg /= E, xo /= E;
    }
    const double grad_bytes_per_elem = tb.gradient;
    const double bucket_elements = fw.zero_bucket_is_hidden_squared ? double(model.hidden_size) * double(model.hidden_size)
                                                                     : fw.zero_reduce_bucket_elements;
    const double bucket = std::min(r.g, bucket_elements * grad_bytes_per_elem) * (fw.zero_overlap_comm_double_buffer ? 2 : 1);
    // Gathered units are in the compute dtype (bf16 under mixed and amp).
    const double emb_c = first ? job.embedding_compute_bytes : 0.0, head_c = last ? job.head_compute_bytes : 0.0;
    const double layer_c = layer_compute_own, layer_g = layer_grad_own + job.layer_frozen_grad_bytes;
    const double largest_unit_c = std::max(layer_c, std::max(emb_c, head_c));
    const double host_fp32_grads = 4.0 * trainable;
    const bool fsdp = par.sharding == Sharding::fsdp;
    // FSDP-1 units mixing frozen and trainable weights hold gradients for the frozen part too.
    if (fsdp) r.g += layers * job.layer_frozen_grad_bytes;
    // Gradient accumulation under no_sync keeps every unit's gradient unsharded between micro-batches.
    const bool unsharded_grads = fsdp && setup.grad_accum > 1 && fw.fsdp_no_sync_unsharded_grads;
    const double w_all = r.w, o_all = r.o;
    const double N = double(shard);
    // A sharded state over N ranks: the experts (already / ep) over the expert shard group N / ep.
    const double x_group = std::max(1.0, N / E);
    auto sharded = [&](double total, double experts) {
      return ep_split ? (total - experts) / N + experts / x_group : total / N;
    };
    if (par.sharding == Sharding::none) {
      if (par.grad_group() > 1) r.temp += r.g;  // DDP's buckets copy every gradient (gradient_as_bucket_view=False)
    } else if (par.sharding == Sharding::zero) {
      if (par.zero_stage >= 1) r.o = sharded(r.o, xo), r.opt_transient /= N;
      if (par.zero_stage >= 2) r.g = sharded(r.g, xg);
      if (par.zero_stage >= 3) {  // the largest gathered unit + the prefetched layer + one layer's full gradients
        r.w = sharded(r.w, xw);
        r.temp += largest_unit_c + layer_c + layer_g;
        // contiguous_gradients: the IPG bucket, reduce_bucket_size elements in the parameters' dtype, allocated
        // when the optimizer is built and never freed (framework.h zero3_contiguous_gradients_buffer).
        if (fw.zero3_contiguous_gradients_buffer) r.temp += bucket_elements * tb.weight;
      } else {
        r.temp += bucket;
      }
    } else if (par.reshard_after_forward) {  // FSDP FULL_SHARD: the last unit (norm, lm_head) is not resharded after forward
      r.w = sharded(r.w, xw), r.o = sharded(r.o, xo), r.opt_transient /= N;
      r.g = unsharded_grads ? r.g : sharded(r.g, xg);
      r.temp += head_c + 2 * largest_unit_c + (unsharded_grads ? 0 : layer_g);
    } else {  // SHARD_GRAD_OP: parameters stay gathered from forward through backward
      const double gathered = emb_c + layers * layer_c + head_c;
      r.w = sharded(r.w, xw) + gathered, r.o = sharded(r.o, xo), r.opt_transient /= N;
      r.g = unsharded_grads ? r.g : sharded(r.g, xg);
      r.temp += unsharded_grads ? 0 : layer_g;
    }
    if (par.offload_optimizer) {
      // ZeRO-Offload: the reduced gradient shard goes to the host (fp32), where AdamW updates a copy of
      // the weight shard; offloaded parameters (ZeRO-3 / FSDP CPUOffload) live there too, and the GPU
      // holds only the units it gathers.
      // The QLoRA statistics (q_state, inside w) are not parameters: they stay on the GPU, below.
      r.host = ((par.offload_params ? w_all - q_state : trainable * tb.weight) + o_all + host_fp32_grads) / N;
      // FSDP-1 CPUOffload(offload_params=True) pins each FlatParameter's local shard and pre-allocates a pinned
      // zero gradient of the same size beside it, for frozen FlatParameters too (FlatParamHandle.
      // init_flat_param_attributes: flat_param._cpu_grad = torch.zeros_like(flat_param._local_shard)
      // .pin_memory(), torch/distributed/fsdp/_flat_param.py at fe03cf693c7c774a88c01cd0bc52f80402b8437f); the
      // trainable part is the host gradient counted above, the frozen part a second copy of its shard.
      if (fsdp && par.offload_params && setup.fsdp_version == 1) r.host += std::max(0.0, w_all - q_state - trainable * tb.weight) / N;
      if (par.offload_params) r.w = 0;
      // FSDP CPUOffload(offload_params=True): a gradient is copied to the host (_cpu_grad) only when it is
      // reduce-scattered; under no_sync the post-backward hook returns before that, so the unsharded
      // gradients of every unit stay on the GPU between accumulated micro-batches
      // (torch/distributed/fsdp/_runtime_utils.py _post_backward_hook, 'if not state._sync_gradients: return',
      // pytorch/pytorch at 00ae0bc91ac2c1718d1baa193d9d299e2b82776c).
      r.g = fsdp && par.offload_params && unsharded_grads ? r.g : 0;
      // Before each all-gather FSDP copies the unit's shard from the host to the GPU on its pre-unshard
      // stream (FlatParamHandle.pre_unshard: flat_param_to(self.device, non_blocking=True)), freed once gathered
      // (torch/distributed/fsdp/_flat_param.py at fe03cf693c7c774a88c01cd0bc52f80402b8437f).
      if (fsdp && par.offload_params) r.temp += largest_unit_c / N;
      r.o = 0, r.opt_transient = 0;
    }
    // QLoRA with bitsandbytes: the quantisation statistics are an attribute of the weight, not a parameter,
    // so sharding and offloading leave them whole on every GPU (fw.quant_state_sharded false).
    if (par.shards_params() && q_state > 0) r.w += par.offload_params ? q_state : q_state - q_state / N;
    return r;
  };

  if (par.pp > 1) {
    // Stage k holds consecutive layers (interleaved: `virtual_stages` chunks, k, k + pp, ...); the first
    // stage the embedding, the last the head and loss (tied embeddings are duplicated on the last stage,
    // as Megatron does).
    const int64_t p = std::min<int64_t>(par.pp, model.num_layers);
    const int64_t v = par.schedule == PipelineSchedule::interleaved_1f1b ? std::max<int64_t>(1, par.virtual_stages) : 1;
    const int64_t chunks = p * v;
    const int64_t micro_batches = par.schedule == PipelineSchedule::naive ? 1 : setup.grad_accum;
    MemoryBreakdown worst;
    int64_t worst_sum = -1;
    double worst_host = 0, worst_act_host = 0;
    // Only stages 0, 1 and p - 1 can hold the peak: a middle stage k >= 2 has no more layers (the first
    // L mod chunks chunks take one more) and no more micro-batches in flight than stage 1, so its terms
    // are each at most stage 1's (a search meets pipelines of up to 80 stages many times).
    std::vector<int64_t> stages{0};
    if (p > 1) stages.push_back(1);
    if (p > 2) stages.push_back(p - 1);
    for (int64_t k : stages) {
      int64_t layers = 0;
      for (int64_t j = 0; j < v; ++j) {
        const int64_t chunk = j * p + k;
        layers += model.num_layers / chunks + (chunk < model.num_layers % chunks ? 1 : 0);
      }
      const bool first = k == 0, last = k == p - 1;
      double w = layers * job.layer_weight_bytes, g = layers * job.layer_grad_bytes, o = layers * job.layer_opt_bytes;
      if (first) w += job.embedding_weight_bytes, g += job.embedding_grad_bytes, o += job.embedding_opt_bytes;
      if (last) w += job.head_weight_bytes + job.tied_head_weight_bytes, g += job.head_grad_bytes, o += job.head_opt_bytes;
      const double trainable = job.trainable_params * (g / std::max(1e-300, job.embedding_grad_bytes + model.num_layers * job.layer_grad_bytes + job.head_grad_bytes));
      act_host = 0;
      MemoryBreakdown s;
      if (v == 1) {
        // GPipe keeps all m micro-batches in flight; 1F1B at most p - k on stage k.
        const int64_t in_flight = par.schedule == PipelineSchedule::one_f_one_b ? std::min(p - k, micro_batches) : micro_batches;
        s.activations = activations(layers, last, in_flight);
        // The loss's peak for the current micro-batch, and what it keeps for each other one in flight.
        s.logits_loss = last ? to_bytes(loss_peak + (in_flight - 1) * loss_kept) : 0;
      } else {
        // Interleaved 1F1B (Megatron-LM schedules.py): stage k warms up with (p - k - 1)·2 + (v - 1)·p
        // chunk forwards, so (p - k - 1)·2 + (v - 1)·p + 1 chunk passes are alive at its peak; on the
        // first stage that is p·(1 + (p - 1)/(p·v)) micro-batches of its layers (Korthikanti et al.
        // 2022, sec. 4.2.3).
        const int64_t chunk_passes = std::min(micro_batches * v, (p - k - 1) * 2 + (v - 1) * p + 1);
        const double per_chunk = double(layers) / double(v);
        const double kept = ckpt ? per_chunk * block_input : per_chunk * (block + weight_copy);
        double bytes = chunk_passes * kept;
        if (offload_act) {
          act_host += chunk_passes * std::max(0.0, per_chunk - 2) * block_input;
          bytes = chunk_passes * std::min(per_chunk, 2.0) * block_input;
        }
        const int64_t head_in_flight = std::max<int64_t>(1, std::min(micro_batches, (chunk_passes + v - 1) / v));
        if (last) bytes += head_in_flight * (head_act + head_copy);
        if (ckpt) bytes += block_full + weight_copy;
        bytes += selective_recompute;
        s.activations = to_bytes(bytes);
        s.logits_loss = last ? to_bytes(loss_peak + (head_in_flight - 1) * loss_kept) : 0;
      }
      const States st = shard_states(w, g, o, double(layers), first, last, trainable);
      s.weights = to_bytes(st.w);
      s.gradients = to_bytes(st.g);
      s.optimizer = to_bytes(st.o);
      // Received activations and the gradient sent back: two block-input-sized buffers.
      s.temporary = to_bytes((p > 1 ? 2 * block_input : 0) + st.temp);
      if (sum_terms(s) > worst_sum) worst = s, worst_sum = sum_terms(s), worst_host = st.host, worst_act_host = act_host;
    }
    m = worst;
    m.host = to_bytes(worst_host);
    act_host = worst_act_host;
    e.peak_moment = "forward-backward";
  } else {
    const double layers = static_cast<double>(model.num_layers);
    double w = job.embedding_weight_bytes + layers * job.layer_weight_bytes + job.head_weight_bytes;
    double g = job.embedding_grad_bytes + layers * job.layer_grad_bytes + job.head_grad_bytes;
    double o = job.embedding_opt_bytes + layers * job.layer_opt_bytes + job.head_opt_bytes;
    if (!ckpt) {
      // Selective: the loss's peak and the last block's recompute are not alive together.
      m.activations = activations(model.num_layers, true, 1);
      m.logits_loss = to_bytes(std::max(0.0, loss_peak - selective_recompute));
    } else {
      // Backward runs the head (and frees the loss's tensors) before it recomputes the last block,
      // so the recomputed block and the loss peak are never alive together: activations hold every
      // block input and the recomputed block; logits+loss only what the head and loss need beyond.
      m.activations = activations(model.num_layers, false, 1);
      const double recompute = block_full + weight_copy;
      m.logits_loss = to_bytes(std::max(0.0, head_act + head_copy + loss_peak - recompute));
    }
    States st = shard_states(w, g, o, layers, true, true, double(job.trainable_params), layers * job.layer_expert_weight_bytes,
                             layers * job.layer_expert_grad_bytes, layers * job.layer_expert_opt_bytes);
    double paged = 0;
    if (setup.paged_optimizer) {  // bitsandbytes pages optimizer states out to host memory under pressure
      paged = st.o;
      st.host += st.o;
      st.o = 0;
    }
    // The optimizer step in backward frees each gradient as soon as it is applied: one unit's at a time.
    if (setup.optimizer_in_backward)
      st.g = std::min(st.g, std::max({job.layer_grad_bytes, job.embedding_grad_bytes, job.head_grad_bytes}));
    // Gradients freed by zero_grad(set_to_none=True) between steps (framework.h grads_freed_between_steps)
    // are allocated by autograd as backward reaches each parameter: at the backward's start, where the
    // loss's peak and every saved activation are alive, only the head's gradients exist (the tied
    // embedding's too: it is the head's weight); by the end, when all gradients exist, the activations
    // are freed: the optimizer step's figure below (weights + gradients + states) covers that end. With
    // gradient accumulation the next micro-batch's backward starts with every gradient alive. ZeRO keeps
    // its own gradient buffers (deepspeed/runtime/zero/stage_1_and_2.py ipg buckets and averaged gradient
    // partitions).
    // FSDP-1 FULL_SHARD: the Trainer's model.zero_grad() sets every FlatParameter's sharded gradient to None
    // (use_orig_params=False: the FlatParameters are the module's parameters; True: the root's pre-forward
    // drops them once the original parameters' are None, _clear_grads_if_needed), and each unit's post-
    // backward hook reduce-scatters into a new shard (torch/distributed/fsdp/_runtime_utils.py
    // _post_backward_hook / _reduce_grad). So backward starts with no gradient shard, but the root unit
    // (embedding, final norm, head under transformer-layer wrapping) reaches its FlatParameter through
    // the split of its unsharded views, which runs once the embedding's gradient arrives, at backward's
    // end: the head's unsharded gradient, in the compute dtype, waits from the first op of backward to the
    // last. Measured: in Liger-Kernel's HF + FSDP-1 Llama-3-8B logs (examples/huggingface/llama_B_48_*.log at
    // 4d4d9c6) the unpatched run's top step is the planner's figure at 480 padded tokens within 0.4%, and the
    // patched runs, whose steps are as long, never exceed the optimizer step (tests). FSDP-2 frees its
    // DTensor gradients the same way, but its published runs do not follow the rule (torchtitan's Llama-3.1-8B
    // on 8 GPUs -6.9% -> -10.4%; torchtune's Llama-3.1-70B with offload, whose head is its own unit, +5.7% ->
    // +20.3%): FSDP-2 keeps every gradient in the peak until what differs is found (README "How accurate is it").
    const double grads_all = st.g;
    const bool fsdp1_freed = par.sharding == Sharding::fsdp && setup.fsdp_version == 1 && par.reshard_after_forward;
    // The head's weight is the embedding's where they are tied: its gradient is the embedding-sized one.
    const double head_unsharded_grad =
        fsdp1_freed && job.head_grad_bytes + (model.tie_word_embeddings ? job.embedding_grad_bytes : 0.0) > 0
            ? job.head_compute_bytes + (model.tie_word_embeddings ? job.embedding_compute_bytes : 0.0)
            : 0.0;
    const bool freed = fw.grads_freed_between_steps && setup.grad_accum == 1 && !setup.optimizer_in_backward &&
                       (par.sharding == Sharding::none || fsdp1_freed);
    if (freed && fsdp1_freed) {
      st.g = head_unsharded_grad;
    } else if (freed) {
      const double unsharded = job.embedding_grad_bytes + layers * job.layer_grad_bytes + job.head_grad_bytes;
      const double at_start = job.head_grad_bytes + (model.tie_word_embeddings ? job.embedding_grad_bytes : 0.0);
      st.g = unsharded > 0 ? st.g * std::min(1.0, at_start / unsharded) : 0.0;
    }
    m.weights = to_bytes(st.w);
    m.gradients = to_bytes(st.g);
    m.optimizer = to_bytes(st.o);
    m.temporary = to_bytes(st.temp);
    m.host = to_bytes(st.host);
    m.paged_optimizer = to_bytes(paged);
    e.peak_moment = "forward-backward";
    // FSDP-1's end of backward: every shard re-created, and the root unit's gradient assembled: the split of its
    // FlatParameter into views runs backward as a concatenation of the views' gradients (torch
    // split_with_sizes_backward: at::cat), so the embedding's and the head's unsharded gradients and the whole
    // root gradient are alive together, twice the root's trainable weights in the compute dtype, before the
    // reduce-scatter shards it (FlatParamHandle views: torch.split, torch/distributed/fsdp/_flat_param.py). The
    // blocks are resharded by then; the root unit is still gathered (the embedding's backward reads it).
    if (freed && fsdp1_freed) {
      const double root_grad = (job.head_grad_bytes > 0 ? job.head_compute_bytes : 0.0) +
                               (job.embedding_grad_bytes > 0 ? job.embedding_compute_bytes : 0.0);
      const double root_gathered = job.embedding_compute_bytes + job.head_compute_bytes;
      const int64_t at_end = m.weights + to_bytes(grads_all + 2 * root_grad) + m.optimizer + to_bytes(root_gathered);
      if (at_end > sum_terms(m)) {
        m.gradients = to_bytes(grads_all + 2 * root_grad);
        m.temporary = to_bytes(root_gathered);
        m.activations = 0;
        m.logits_loss = 0;
        e.peak_moment = "end of backward";
      }
    }
    // The optimizer step, after backward: activations gone, its own temporaries alive. The peak when
    // they outweigh the activations (full fine-tuning with little activation memory).
    const bool ddp_buckets = par.sharding == Sharding::none && par.grad_group() > 1;
    const int64_t at_step = m.weights + to_bytes(grads_all) + m.optimizer + to_bytes(st.opt_transient) +
                            (ddp_buckets ? to_bytes(st.temp - job.dequant_bytes) : 0);
    if (at_step > sum_terms(m)) {
      m.gradients = to_bytes(grads_all);
      m.temporary = at_step - m.weights - m.gradients - m.optimizer;
      m.activations = 0;
      m.logits_loss = 0;
      e.peak_moment = "optimizer step";
    }
  }

  // The three figures of the step's peak.
  const Figures step = figures(sum_terms(m), hw, fw, distributed);
  e.allocated_peak = step.allocated;
  e.reserved_peak = step.reserved;
  e.device_peak = step.device;
  m.total = step.device;
  m.overhead = m.total - sum_terms(m);

  // Loading: the weights arrive before any gradient or optimizer state. A sharded strategy holds its
  // shard plus one unit being sharded; QLoRA quantises one weight at a time from the load dtype.
  const bool sharded = par.shards_params() && par.reshard_after_forward;
  // A MoE block as the largest unit: whole without expert parallelism, its own experts only with it.
  const double unit_load = std::max({layer_weight_own, job.embedding_weight_bytes, job.head_weight_bytes});
  double load_tensors = (sharded ? double(m.weights) + unit_load : double(m.weights));
  if (par.offload_params) load_tensors = unit_load + double(m.weights);  // m.weights: what offload leaves on the GPU
  load_tensors += double(job.load_quantize_bytes);
  const Figures load = figures(to_bytes(load_tensors), hw, fw, distributed);
  e.load.device_bytes = load.device;
  e.load.reserved_bytes = load.reserved;
  e.step.device_bytes = step.device;
  e.step.reserved_bytes = step.reserved;
  // Without torch.cuda.empty_cache after loading, the segments the allocator reserved while loading stay
  // reserved through the step, and torch.cuda.reset_peak_memory_stats resets the reserved peak to what is
  // reserved then (c10/cuda/CUDACachingAllocator.cpp resetPeakStats: peak = current), so the step's reserved
  // and nvidia-smi figures are at least the load's (framework.h step_reserved_keeps_load_cache). What fits
  // is judged on is unchanged: before failing, the allocator releases the cached segments no tensor uses.
  if (fw.step_reserved_keeps_load_cache && load.reserved > e.reserved_peak) {
    e.reserved_peak = load.reserved;
    e.device_peak = std::max(e.device_peak, load.device);
    e.step.device_bytes = e.device_peak;
    e.step.reserved_bytes = e.reserved_peak;
    m.total = e.device_peak;
    m.overhead = m.total - sum_terms(m);
  }
  // Saving after an optimizer step: gradients freed; sharded strategies gather unit by unit, in the
  // parameters' stored dtype. FSDP-1's full state dict unshards a unit in its state_dict pre-hook and
  // reshards it in the post-hook, and Module.state_dict runs the root's hooks around its children's, so the
  // root unit (embedding, final norm and head) stays gathered while every block is gathered in turn
  // (torch/distributed/fsdp/_state_dict_utils.py _full_pre_state_dict_hook / _full_post_state_dict_hook ->
  // _enter_unshard_params_ctx / _exit_unshard_params_ctx, on rank 0 under rank0_only); FSDP-2 and ZeRO-3
  // gather one parameter or module at a time.
  const bool fsdp1_root_gathered = par.sharding == Sharding::fsdp && setup.fsdp_version == 1;
  double save_gather = fsdp1_root_gathered ? job.embedding_weight_bytes + job.head_weight_bytes + layer_weight_own : unit_load;
  // A sharded or local state dict (setup.state_dict, FSDP only). FSDP-1's sharded one unshards each unit as
  // the full one does (_sharded_pre_state_dict_hook -> _common_unshard_pre_state_dict_hook with
  // offload_to_cpu=False), then clones this rank's chunk of every parameter on the GPU (param_hook ->
  // _create_chunk_sharded_tensor: chunks[rank].clone()) and moves it to the host only under
  // ShardedStateDictConfig(offload_to_cpu=True) (torch/distributed/fsdp/_state_dict_utils.py
  // _sharded_post_state_dict_hook at 22eccc02f3a5a7818f93bc8ff2aaf98eb8d64742). Every chunk lives in the
  // state dict until the checkpoint is written, the frozen ones too when only adapters are kept (PEFT's
  // get_peft_model_state_dict calls model.state_dict() and filters it, peft/utils/save_and_load.py L71 at v0.10.0).
  // FSDP-2's sharded state dict holds DTensors of the local shards (no gather, no clone); a local state dict
  // holds views of the flat shards.
  const bool fsdp_layout = par.sharding == Sharding::fsdp && par.shards_params();
  const std::optional<StateDict> state_dict = fsdp_layout ? setup.state_dict : std::nullopt;
  double save_clones = 0, save_host_shard = 0;
  if (state_dict && *state_dict != StateDict::full) {
    const double L = static_cast<double>(model.num_layers);
    const double flat = job.embedding_weight_bytes + job.head_weight_bytes +
                        L * (job.layer_weight_bytes - job.layer_quant_state_bytes) - job.head_quant_state_bytes;
    const double chunk = flat / double(std::max<int64_t>(1, par.pp)) / double(std::max<int64_t>(1, shard));
    const bool clones = *state_dict == StateDict::sharded && setup.fsdp_version == 1;
    if (!clones) save_gather = 0;  // DTensor chunks or flat-shard views: nothing gathered
    if (clones && !fw.sharded_state_dict_offload_to_cpu) save_clones = chunk;
    if (*state_dict == StateDict::sharded && fw.sharded_state_dict_offload_to_cpu) save_host_shard = chunk;
  }
  const double save_tensors = double(m.weights + m.optimizer) +
                              (sharded && fw.save_gathers_units_on_gpu ? save_gather : 0.0) + save_clones;
  // A sharded or local state dict's chunks are smaller than the blocks the step left cached (a block input, a
  // gathered unit), and the save frees nothing else, so the caching allocator serves them from that cache
  // (it splits cached blocks before it reserves new segments, c10/cuda/CUDACachingAllocator.cpp get_free_block)
  // and reserves only what it allocates beyond it: no fragmentation ratio. A full state dict's gathered units
  // can be larger than any cached block and take new segments on top of the cache (the PEFT docs' Llama-2-70B
  // LoRA: 72 GB while training, 80 GB at its FULL_STATE_DICT save), so that save keeps the profile's ratio.
  FrameworkProfile save_fw = fw;
  if (state_dict && *state_dict != StateDict::full) save_fw.reserved_over_allocated = save_fw.reserved_over_allocated_at_oom = 1.0;
  const Figures save = figures(to_bytes(save_tensors), hw, save_fw, distributed);
  e.save.device_bytes = save.device;
  e.save.reserved_bytes = save.reserved;
  e.fit_bytes = std::max({load.device_at_oom, step.device_at_oom, save.device_at_oom});

  // Host memory per node: every rank's process, loading copies, offloaded states, saved state dict.
  const int64_t ranks = std::min<int64_t>(e.gpus_used, std::max<int64_t>(1, hw.gpus_per_node));
  const double process = hw.kind == "gpu" ? double(ranks) * fw.host_process_bytes_per_rank : 0.0;
  const double offloaded = double(ranks) * (double(m.host) + act_host);
  auto copies = [&](HostCopies h, double bytes) {
    return h == HostCopies::per_rank ? ranks * bytes : h == HostCopies::rank0 ? bytes : 0.0;
  };
  e.load.host_bytes_per_node = to_bytes(process + copies(fw.load_host_copies, job.model_load_bytes));
  e.step.host_bytes_per_node = to_bytes(process + offloaded);
  // A full state dict of an FSDP model is gathered whole on rank 0's host (every parameter, frozen ones too, in
  // its stored dtype) before a LoRA save keeps the adapters: accelerate's get_state_dict and save_fsdp_model call
  // model.state_dict() under FULL_STATE_DICT(offload_to_cpu, rank0_only) (src/accelerate/accelerator.py
  // L4060-L4066, utils/fsdp_utils.py _get_model_state_dict at 16cb6eb8) and PEFT's get_peft_model_state_dict
  // filters model.state_dict() (src/peft/utils/save_and_load.py L131-L132 at v0.20.0).
  const bool whole_on_host = fsdp_layout && fw.full_state_dict_holds_frozen;
  const double full_copy = whole_on_host ? std::max(job.trainable_save_bytes, job.model_save_bytes) : job.trainable_save_bytes;
  e.save.host_bytes_per_node =
      to_bytes(process + offloaded +
               (state_dict && *state_dict != StateDict::full ? double(ranks) * save_host_shard
                                                             : copies(fw.save_host_copies, full_copy)));
  e.host_per_node = std::max({e.load.host_bytes_per_node, e.step.host_bytes_per_node, e.save.host_bytes_per_node});
  e.peak_phase = e.load.device_bytes > e.step.device_bytes && e.load.device_bytes >= e.save.device_bytes ? "load"
                 : e.save.device_bytes > e.step.device_bytes                                         ? "save"
                                                                                                     : "step";
  if (e.peak_phase != "step") {
    m.total = std::max(e.load.device_bytes, e.save.device_bytes);
    m.overhead = m.total - sum_terms(m);
  }
  // The step through the caching allocator, where the layout is one the replay plays and the figures fit (a
  // plan they refuse needs no replay): what it can reserve is the usable memory less what nvidia-smi counts
  // outside the allocator.
  const int64_t usable = usable_bytes(hw, setup);
  if (e.fit_bytes <= usable) {
    if (const std::optional<ReplayStep> trace = replay_step_for(job, c)) {
      const int64_t fixed = fw.cuda_context_bytes + (distributed ? fw.nccl_bytes_per_gpu : 0);
      e.replay = replay_steps(*trace, usable - fixed);
    }
  }
  finish(e, hw, setup, explain);
  return e;
}

Candidate preset_candidate(Strategy strategy, int64_t num_gpus, const HardwareSpec& hw, int64_t micro_batch,
                           Checkpointing checkpointing, Attention attention, bool activation_offload) {
  Candidate c;
  c.parallel = preset(strategy, num_gpus, hw.gpus_per_node);
  c.name = to_string(strategy);
  c.micro_batch = micro_batch;
  c.checkpointing = checkpointing;
  c.attention = attention;
  c.activation_offload = activation_offload;
  return c;
}

Candidate layout_candidate(const Parallelism& parallel, int64_t micro_batch, Checkpointing checkpointing,
                           Attention attention, bool activation_offload) {
  Candidate c;
  c.parallel = parallel;
  c.name = name(parallel);
  c.micro_batch = micro_batch;
  c.checkpointing = checkpointing;
  c.attention = attention;
  c.activation_offload = activation_offload;
  return c;
}

std::optional<Parallelism> scaled_layout(const Parallelism& p, int64_t n, const HardwareSpec& hw) {
  if (const auto s = preset_of(p)) {
    if (*s == Strategy::single) return n == 1 ? std::optional(p) : std::nullopt;
    if (*s == Strategy::fsdp_hybrid && (n <= hw.gpus_per_node || n % hw.gpus_per_node != 0)) return std::nullopt;
    return preset(*s, n, hw.gpus_per_node);
  }
  const int64_t model_parallel = p.tp * p.cp * p.pp;
  if (n % model_parallel != 0) return std::nullopt;
  Parallelism q = p;
  const int64_t dp = n / model_parallel;
  if (q.sharding == Sharding::none) {
    q.dp_replicate = dp;
  } else {
    if (dp % q.dp_replicate != 0) return std::nullopt;
    q.dp_shard = dp / q.dp_replicate;
  }
  // Expert parallelism keeps its degree: it needs as many sharded data-parallel ranks.
  if (q.ep > 1 && (q.dp_shard * q.cp) % q.ep != 0) return std::nullopt;
  return q;
}

std::vector<Strategy> applicable_strategies(const ModelSpec& model, const HardwareSpec& hw,
                                            const TrainingSetup& setup) {
  if (setup.num_gpus <= 1) return {Strategy::single, Strategy::zero2_offload, Strategy::zero3_offload};
  std::vector<Strategy> out;
  for (Strategy s : all_strategies()) {
    // HYBRID_SHARD: whole nodes, each a shard group.
    if (s == Strategy::fsdp_hybrid && (setup.num_gpus <= hw.gpus_per_node || setup.num_gpus % hw.gpus_per_node != 0)) continue;
    if (is_pipeline(s) && model.num_layers < setup.num_gpus) continue;
    out.push_back(s);
  }
  return out;
}

int64_t max_micro_batch(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup,
                        Candidate c, int64_t limit) {
  const PreparedJob job = prepare_job(model, hw, setup, shard_shape(c.parallel));
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
  const PreparedJob job = prepare_job(model, hw, setup, shard_shape(c.parallel));
  const std::optional<Strategy> s = preset_of(c.parallel);
  // One GPU runs single and the offload presets; the other presets need two; a composition its
  // model-parallel degrees.
  const bool one_gpu_preset = s && (*s == Strategy::single || *s == Strategy::zero2_offload || *s == Strategy::zero3_offload);
  const int64_t start = s ? (one_gpu_preset ? 1 : 2) : c.parallel.tp * c.parallel.cp * c.parallel.pp;
  for (int64_t n = start; n <= limit; ++n) {
    if (s && is_pipeline(*s) && n > model.num_layers) break;
    const auto layout = scaled_layout(c.parallel, n, hw);
    if (!layout) continue;
    Candidate at = c;
    at.parallel = *layout;
    if (estimate_memory(job, at, n, false).fits) return n;
    if (s == Strategy::single) break;
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
  const FrameworkProfile& fw = framework_profile(setup.framework);
  const ParamBytes tb = trainable_param_bytes(setup.precision, setup.optimizer, setup.paged_optimizer);
  std::vector<std::string> lines;
  lines.push_back("framework " + fw.name + ": " + fw.title + " (" + fw.versions + "); configs/frameworks/" + fw.name +
                  ".json cites each value");
  std::ostringstream conv;
  conv << "precision " << to_string(setup.precision) << " with " << to_string(setup.optimizer) << ": "
       << tb.weight << " + " << tb.gradient << " + " << tb.optimizer << " = "
       << tb.weight + tb.gradient + tb.optimizer << " B per trainable parameter (weights + gradients + "
       << "optimizer incl. master weights)" << (setup.given.count("precision") ? "" : " (the framework's default)");
  lines.push_back(conv.str());
  if (setup.method == Method::lora)
    lines.push_back("LoRA: frozen base in " + std::string(setup.precision == Precision::fp32 ? "fp32" : "bf16") +
                    ", rank " + std::to_string(setup.lora.rank) + " on " + std::to_string(setup.lora.targets.size()) +
                    " module(s) per block");
  for (const auto& note : model.notes) lines.push_back("model: " + note);
  if (model.moe.active()) {
    std::ostringstream moe;
    const bool aux = setup.moe.aux_loss.value_or(model.moe.output_router_logits);
    moe << "experts: ";
    if (setup.moe.capacity_factor)
      moe << "capacity-limited routing, every expert padded to " << format_fixed(*setup.moe.capacity_factor, 2)
          << " x its balanced tokens";
    else
      moe << "dropless routing, the busiest expert-parallel rank receiving " << format_fixed(setup.moe.imbalance_factor, 2)
          << " x the balanced tokens" << (setup.given.count("moe.imbalance_factor") ? "" : " (balanced: --moe-imbalance-factor)");
    moe << "; each block keeps the router's fp32 softmax and top-k, the dispatched tokens' expert activations and "
           "the combined outputs; load-balancing loss "
        << (aux ? "on" : "off") << (setup.moe.aux_loss ? " (--moe-aux-loss)" : " (the config's output_router_logits)")
        << "; expert parallelism (ep in --parallel) holds num_experts / ep experts per rank: their weights, "
           "gradients and optimizer states / ep, sharded further over dp_shard x cp / ep where the layout shards";
    if (setup.method != Method::full) {
      bool on_experts = false;
      for (const auto& lin : block_linears(model))
        if (is_expert_role(lin.role) &&
            std::find(setup.lora.targets.begin(), setup.lora.targets.end(), lin.name) != setup.lora.targets.end())
          on_experts = true;
      moe << "; LoRA " << (on_experts ? "on the experts too (one adapter per expert)" : "on attention (and dense) linears only, the experts frozen");
    }
    if (!model.moe.uniform())
      moe << "; dense and MoE blocks differ: per-unit terms (a gathered block, one block's activations) use the mean block";
    lines.push_back(moe.str());
  }
  if (setup.method == Method::qlora && model.quantized.active())
    lines.push_back("LoRA on a quantized base: block linears as stored (" + model.quantized.describe() + "), the rest " +
                    (fw.fp32_upcast_unquantized ? "upcast to fp32" : "in bf16"));
  else if (setup.method == Method::qlora)
    lines.push_back(std::string("QLoRA: block linears") + (fw.quantize_lm_head ? " and the head" : "") + " in NF4 (block 64, " +
                    (setup.quantization.double_quant ? "double quantisation: 4.127" : "fp32 absmax per block: 4.5") +
                    " bits/weight), the rest " + (fw.fp32_upcast_unquantized ? "upcast to fp32" : "in bf16") +
                    (fw.quantized_matmul_saves_input ? "; each 4-bit matmul keeps its input (bitsandbytes < 0.43.2)" : "") +
                    (fw.quant_state_sharded ? "" : "; the absmaxes stay whole on every GPU under FSDP/ZeRO-3 and their offload (bitsandbytes' quant_state is not a parameter)"));
  const LossProfile& loss = fw.losses.count(setup.loss) ? fw.losses.at(setup.loss) : fw.losses.at(fw.loss);
  std::ostringstream l;
  l << "loss " << to_string(setup.loss) << ": peak " << loss.peak_bytes_per_token_vocab << " B x tokens x vocab";
  if (loss.peak_bytes_per_token_hidden > 0) l << " + " << loss.peak_bytes_per_token_hidden << " B x tokens x hidden";
  if (setup.compile && loss.compiled_peak_bytes_per_token_vocab >= 0)
    l << " (compiled: " << loss.compiled_peak_bytes_per_token_vocab << " B x tokens x vocab)";
  l << ", " << loss.kept_bytes_per_token_vocab << " B kept from forward to backward";
  lines.push_back(l.str());
  lines.push_back(std::string("activations: tensors autograd keeps for backward (RMSNorm input ") +
                  (fw.fused_norm_mlp_kernels && !setup.compile
                       ? "as it arrives and its rstd, SwiGLU's gate and up: the framework's fused kernels, "
                       : "in fp32, ") +
                  (activation_bytes(setup.precision) == 2 ? "bf16" : "fp32") + " elsewhere" +
                  (fw.gqa_kv_repeated ? "; k and v repeated to every query head" : "") +
                  (setup.compile ? "; compiled: pointwise intermediates recomputed" : "") +
                  (setup.precision == Precision::amp && fw.autocast_weight_copies
                       ? "; amp with fp32 parameters (single, DDP, ZeRO-1/2): fp32 residual stream and bf16 weight copies"
                       : "") +
                  "); selective checkpointing: " + fw.selective_mode);
  if (setup.memory_seq_len() != setup.seq_len)
    lines.push_back("padding: memory planned for the longest row, " + std::to_string(setup.memory_seq_len()) +
                    " tokens (--max-tokens-per-row), not seq-len " + std::to_string(setup.seq_len));
  lines.push_back("peak: the larger of forward-backward (all terms alive together; under checkpointing the loss peak "
                  "and the recomputed block are not) and the optimizer step (activations freed, its temporaries alive)" +
                  std::string(fw.grads_freed_between_steps && setup.grad_accum == 1 && !setup.optimizer_in_backward
                                  ? "; gradients freed by zero_grad(set_to_none) after each step: at backward's start only "
                                    "the head's exist (one GPU, DDP; FSDP-1 FULL_SHARD: no gradient shard, the root unit's "
                                    "head gradient unsharded until backward's end, then every shard: the end of backward; "
                                    "ZeRO and FSDP-2 count them all)"
                                  : ""));
  if (hw.kind == "gpu") {
    std::ostringstream fig;
    fig << "figures: allocated (torch.cuda.max_memory_allocated) = the terms + " << format_bytes(fw.cublas_workspace_bytes)
        << " cuBLAS workspace; reserved (max_memory_reserved) = allocated x " << format_fixed(fw.reserved_over_allocated, 2)
        << "; device (nvidia-smi) = reserved + " << format_bytes(fw.cuda_context_bytes) << " CUDA context + "
        << format_bytes(fw.nccl_bytes_per_gpu) << " NCCL buffers when distributed; ";
    if (fw.reserved_over_allocated_at_oom < fw.reserved_over_allocated)
      fig << "total uses device; fits uses device with reserved = allocated x " << format_fixed(fw.reserved_over_allocated_at_oom, 2)
          << " (the allocator releases its unused cache and retries before it fails)";
    else
      fig << "fits and total use device";
    lines.push_back(fig.str());
  }
  if (fw.allocator_replay)
    lines.push_back("replay: FSDP-1 FULL_SHARD steps with full checkpointing and the full loss are also played tensor by "
                    "tensor through PyTorch's caching allocator (best fit, split, release of whole cached segments before "
                    "failing; c10/cuda/CUDACachingAllocator.cpp) for 3 steps at the usable memory less the CUDA context and "
                    "NCCL buffers: a step it cannot place does not fit (fragmentation), whatever the figures above say");
  lines.push_back("phases: load (weights only, a sharded strategy's unit being sharded, QLoRA quantising one weight), "
                  "step, save (gradients freed, a sharded strategy gathering unit by unit; FSDP-1 keeps its root unit gathered throughout); host per node: each rank's "
                  "process (" + format_gib(fw.host_process_bytes_per_rank) + "), loading copies (" +
                  (fw.load_host_copies == HostCopies::per_rank ? "one per rank" : fw.load_host_copies == HostCopies::rank0 ? "rank 0 only" : "none") +
                  "), offloaded states, the saved state dict" +
                  (fw.full_state_dict_holds_frozen ? " (an FSDP full state dict: the whole model on rank 0, before a LoRA save keeps the adapters)"
                                                   : " (the trainable weights)"));
  if (setup.state_dict) {
    const StateDict sd = *setup.state_dict;
    lines.push_back(
        "checkpoints save a " + to_string(sd) + " state dict (--state-dict, FSDP layouts only): " +
        (sd == StateDict::full ? std::string("gathered unit by unit to rank 0's host")
         : sd == StateDict::local
             ? std::string("each rank's flat shards as they are (views: nothing gathered, nothing copied)")
             : std::string("FSDP-1 gathers each unit and clones this rank's chunk of every parameter, ") +
                   (fw.sharded_state_dict_offload_to_cpu
                        ? "moving each to the host at once (the rank's whole shard in host memory; "
                        : "keeping every chunk on the GPU until the checkpoint is written (a second copy of the shard; ") +
                   fw.name + " profile saving.sharded_state_dict_offload_to_cpu); FSDP-2 keeps DTensors of its shards") +
        (sd == StateDict::full ? "" : "; the save's reserved = allocated (the chunks reuse the step's cached blocks)"));
  }
  if (setup.method == Method::qlora && fw.quantize_transient_bytes_per_element >= 0)
    lines.push_back("loading quantises each weight with " + format_fixed(fw.quantize_transient_bytes_per_element, 1) +
                    " B per element of the largest quantised weight alive (" + fw.name + " profile)");
  if (fw.step_reserved_keeps_load_cache)
    lines.push_back("reserved and device figures of the step keep the load phase's cached segments (" + fw.name +
                    ": no empty_cache after loading)");
  lines.push_back("DDP: buckets hold a second copy of the gradients; ZeRO-1/2: " +
                  std::string(fw.zero_bucket_is_hidden_squared ? "hidden^2" : format_count(int64_t(fw.zero_reduce_bucket_elements))) +
                  "-element buckets; ZeRO-3: the largest gathered unit + one prefetched + one layer's unsharded gradients" +
                  std::string(fw.zero3_contiguous_gradients_buffer ? " + the contiguous-gradients bucket" : "") + "; "
                  "FSDP keeps its last unit gathered from forward into backward" +
                  (fw.fsdp_no_sync_unsharded_grads ? ", and unsharded gradients between accumulated micro-batches" : ""));
  std::ostringstream fit;
  fit << "fits: device <= " << (1 - setup.headroom_fraction) * 100 << "% of " << format_gib(usable_device_bytes(hw))
      << (usable_device_bytes(hw) < hw.memory_bytes
              ? " (what a process can allocate on the " + hw.name + ", torch's total capacity: nvidia-smi's " +
                    format_gib(hw.memory_bytes) + " less the driver's reserve)"
              : " (" + hw.name + ")")
      << " and host <= " << (1 - setup.headroom_fraction) * 100 << "% of "
      << format_gib(setup.host_memory_gib ? *setup.host_memory_gib * double(1ll << 30) : double(hw.host_memory_bytes_per_node))
      << " per node";
  lines.push_back(fit.str());
  return lines;
}

}  // namespace ftplan

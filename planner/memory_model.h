// Per-GPU memory of a fine-tuning job under each strategy, as a breakdown whose terms each come
// from one small function (see precision.h, activation_memory.h and the comments below).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "planner/allocator_replay.h"
#include "planner/framework.h"
#include "planner/hardware_spec.h"
#include "planner/model_spec.h"
#include "planner/training_setup.h"

namespace ftplan {

// One fully specified way to run the job: what `ftplan plan` searches over.
struct Candidate {
  Parallelism parallel;             // the layout (planner/parallelism.h): every estimate reads it
  std::string name;                 // how outputs name it: the preset's name, or the --parallel string
  int64_t micro_batch = 1;
  Checkpointing checkpointing = Checkpointing::none;
  Attention attention = Attention::fused;
  bool activation_offload = false;  // checkpointed block inputs kept in host memory (needs full checkpointing)
};

// Trainable parameter counts of the job.
struct TrainableParams {
  int64_t total = 0;      // every parameter of the model
  int64_t trainable = 0;  // full: total; LoRA/QLoRA: the adapters
  int64_t frozen = 0;     // total - trainable (base weights under LoRA/QLoRA)
  int64_t quantized = 0;  // QLoRA: frozen block linears stored in NF4
  int64_t lora_per_layer = 0;
};
TrainableParams trainable_params(const ModelSpec& model, const TrainingSetup& setup);

struct MemoryBreakdown {          // bytes on one GPU (the most loaded rank), at the peak
  int64_t weights = 0;            // working weights (frozen + trainable), sharded where the strategy shards
  int64_t gradients = 0;          // trainable gradients (FSDP-1 mixed units: frozen ones too)
  int64_t optimizer = 0;          // optimizer states incl. fp32 master weights
  int64_t activations = 0;        // kept for backward (and the weights' bf16 copies under amp)
  int64_t logits_loss = 0;        // the loss's peak, by the framework's loss implementation
  int64_t temporary = 0;          // gathered layers, gradient buckets, NF4 dequantisation, optimizer-step copies
  int64_t overhead = 0;           // cuBLAS workspace, allocator slack (reserved − allocated), CUDA context,
                                  // NCCL buffers: device_peak − the terms above
  int64_t total = 0;              // device_peak: what fits is judged on
  int64_t host = 0;               // host memory one rank's offload uses (not part of total)
  int64_t paged_optimizer = 0;    // of host: bitsandbytes paged optimizer states (CUDA unified memory), which
                                  // migrate to the GPU for each parameter's update (step_time.h paged_state_migration_s)
};

// One phase of the job: loading the model, the training step, saving.
struct PhaseMemory {
  int64_t reserved_bytes = 0;       // per GPU, as torch.cuda.max_memory_reserved reports it
  int64_t device_bytes = 0;         // per GPU, as nvidia-smi shows it
  int64_t host_bytes_per_node = 0;  // the node's host memory
};

struct MemoryEstimate {
  Candidate candidate;
  int64_t gpus_used = 1;             // single uses 1 of the job's GPUs
  MemoryBreakdown per_gpu;
  // The three figures of the step's peak: what torch.cuda.max_memory_allocated reports, what
  // max_memory_reserved reports (the caching allocator's segments), what nvidia-smi shows.
  int64_t allocated_peak = 0, reserved_peak = 0, device_peak = 0;
  std::string_view peak_moment;      // "forward-backward" or "optimizer step" (a literal: no allocation per candidate)
  PhaseMemory load, step, save;
  std::string_view peak_phase;       // "load", "step" or "save": the phase with the highest device figure
  int64_t host_per_node = 0;         // the highest of the phases' host figures
  // What fits is judged on: total, with the cached blocks the allocator releases before it fails counted out
  // (FrameworkProfile::reserved_over_allocated_at_oom); total itself where the profile's two ratios agree.
  int64_t fit_bytes = 0;
  int64_t usable_bytes = 0;          // memory × (1 − headroom)
  int64_t host_usable_bytes = 0;     // host memory per node × (1 − headroom)
  // The step replayed through the caching allocator (allocator_replay.h), where the layout is replayed and
  // fit_bytes fits: a failure there (fragmentation) refuses the plan all the same.
  std::optional<ReplayResult> replay;
  bool device_fits = false;          // fit_bytes within usable_bytes, and the replay (if any) placed every step
  bool fits = false;                 // device and host
  std::string reason;                // why it does not fit, or "" when it does
};

// How one rank's share of the model is cut by tensor, context and expert parallelism: what a PreparedJob
// is computed for (every layout with the same shape shares it).
struct ShardShape {
  int64_t tp = 1;
  bool sequence_parallel = false;
  int64_t cp = 1;
  int64_t ep = 1;  // expert parallel: the routed experts split over ep ranks (their tokens dispatched by all-to-all)
  bool operator==(const ShardShape& o) const {
    return tp == o.tp && sequence_parallel == o.sequence_parallel && cp == o.cp && ep == o.ep;
  }
  bool operator<(const ShardShape& o) const {
    return tp != o.tp ? tp < o.tp : cp != o.cp ? cp < o.cp : ep != o.ep ? ep < o.ep : sequence_parallel < o.sequence_parallel;
  }
};
ShardShape shard_shape(const Parallelism& parallel);

// What every candidate of one job shares, computed once so that a search evaluates a candidate
// with arithmetic alone (activations are linear in the micro-batch: stored per sample).
struct PreparedJob {
  const ModelSpec* model = nullptr;
  const HardwareSpec* hw = nullptr;
  const TrainingSetup* setup = nullptr;
  const FrameworkProfile* framework = nullptr;
  ShardShape shape;  // the bytes below are one tp x cp rank's
  double embedding_weight_bytes = 0, layer_weight_bytes = 0, head_weight_bytes = 0;  // as stored
  double embedding_compute_bytes = 0, layer_compute_bytes = 0, head_compute_bytes = 0;  // gathered (compute dtype)
  double embedding_grad_bytes = 0, layer_grad_bytes = 0, head_grad_bytes = 0;
  double embedding_opt_bytes = 0, layer_opt_bytes = 0, head_opt_bytes = 0;
  // The routed experts' share of the block bytes above (mean per block; 0 for dense models): expert
  // parallelism splits them over the ep ranks of an expert group.
  double layer_expert_weight_bytes = 0, layer_expert_compute_bytes = 0, layer_expert_grad_bytes = 0,
         layer_expert_opt_bytes = 0;
  int64_t expert_trainable_params = 0;    // the routed experts' trainable parameters (all blocks)
  double layer_frozen_grad_bytes = 0;     // FSDP-1 units mixing frozen and trainable: the frozen part's gradients
  double tied_head_weight_bytes = 0;      // pipelines: the tied embedding duplicated on the last stage
  double layer_weight_copy_bytes = 0;     // amp: the bf16 copies of one block's linear weights saved for backward
  double head_weight_copy_bytes = 0;      // amp: the head's
  double optimizer_transient_bytes = 0;   // the optimizer step's temporaries, unsharded
  double model_load_bytes = 0;            // the whole model in the framework's load dtype (host copies)
  double trainable_save_bytes = 0;        // what a save writes: the trainable weights (adapters, or all)
  double model_save_bytes = 0;            // the whole model as stored: what a full state dict holds before a filter
  int64_t trainable_params = 0;
  int64_t dequant_bytes = 0;              // QLoRA: the dequantised weights alive at once
  int64_t load_quantize_bytes = 0;        // QLoRA: what quantising the largest weight holds while loading
  // QLoRA where the framework keeps the quantisation statistics outside the sharded parameters
  // (fw.quant_state_sharded false): one block's and the head's absmax bytes (part of the weight bytes above)
  double layer_quant_state_bytes = 0, head_quant_state_bytes = 0;
  // [fused, eager][none, selective][autocast with fp32 parameters: no, yes] one block. Under amp,
  // strategies that compute with fp32 parameters (single, DDP, ZeRO-1/2, pipelines) run autocast: an
  // fp32 residual stream and bf16 weight copies; FSDP and ZeRO-3 gather bf16 parameters instead.
  int64_t block_bytes_per_sample[2][2][2] = {};
  int64_t head_bytes_per_sample[2] = {0, 0};
  int64_t block_input_bytes_per_sample[2] = {0, 0};
  int residual_bytes[2] = {2, 2};         // one element of the residual stream (the block input)
  double loss_peak_bytes_per_sample = 0;  // the loss implementation's peak
  double loss_kept_bytes_per_sample = 0;  // what it keeps from forward to backward
};
// The pointers must outlive the PreparedJob; the framework profile is the job's (setup.framework).
PreparedJob prepare_job(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup,
                        const ShardShape& shape = {});
// The job keeps pointers: temporaries would dangle, so they do not compile.
PreparedJob prepare_job(ModelSpec&&, const HardwareSpec&, const TrainingSetup&, const ShardShape& = {}) = delete;
PreparedJob prepare_job(const ModelSpec&, HardwareSpec&&, const TrainingSetup&, const ShardShape& = {}) = delete;
PreparedJob prepare_job(const ModelSpec&, const HardwareSpec&, TrainingSetup&&, const ShardShape& = {}) = delete;

// The estimate for one candidate on `num_gpus` GPUs; the closed-form peak is the sum of the terms
// (gradients counted alive with all activations: exact under gradient accumulation, conservative
// for a single micro-batch).
// `explain` = false skips writing the reason (a search's hot path).
MemoryEstimate estimate_memory(const PreparedJob& job, const Candidate& candidate, int64_t num_gpus,
                               bool explain = true);
MemoryEstimate estimate_memory(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup,
                               const Candidate& candidate);

// The candidate of a preset on `num_gpus` GPUs of `hw` (fsdp_hybrid shards over a node's GPUs).
Candidate preset_candidate(Strategy strategy, int64_t num_gpus, const HardwareSpec& hw, int64_t micro_batch = 1,
                           Checkpointing checkpointing = Checkpointing::none, Attention attention = Attention::fused,
                           bool activation_offload = false);
// A candidate of a composition, named by name(parallel).
Candidate layout_candidate(const Parallelism& parallel, int64_t micro_batch = 1,
                           Checkpointing checkpointing = Checkpointing::none, Attention attention = Attention::fused,
                           bool activation_offload = false);

// The same layout on `num_gpus` GPUs: a preset's own layout there; a composition with its model-
// parallel degrees (tp, cp, pp) kept and its data-parallel degree scaled; none when it cannot be.
std::optional<Parallelism> scaled_layout(const Parallelism& layout, int64_t num_gpus, const HardwareSpec& hw);

// The strategies that make sense for the job's GPU count (single and offload on one GPU; all of
// them on several; hybrid only across nodes; pipelines only with at least as many layers as GPUs).
std::vector<Strategy> applicable_strategies(const ModelSpec& model, const HardwareSpec& hw,
                                            const TrainingSetup& setup);

// The largest micro-batch (<= limit) that fits, or 0 when even 1 does not.
int64_t max_micro_batch(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup,
                        Candidate candidate, int64_t limit = 4096);

// The fewest GPUs (<= limit) with which the candidate fits, or 0 when none does.
int64_t min_gpus(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup,
                 const Candidate& candidate, int64_t limit = 4096);

// Lines that say which conventions and assumptions produced the numbers.
std::vector<std::string> memory_assumptions(const ModelSpec& model, const HardwareSpec& hw,
                                            const TrainingSetup& setup);

// The ZeRO paper's model-state memory (Rajbhandari et al. 2020, Figure 1), in bytes:
// stage 0: (2 + 2 + K)·Ψ; 1: 4Ψ + KΨ/N; 2: 2Ψ + (2 + K)Ψ/N; 3: (4 + K)Ψ/N.
double zero_model_state_bytes(double params, double k_optimizer_bytes, int64_t num_gpus, int stage);

}  // namespace ftplan

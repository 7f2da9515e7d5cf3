// Per-GPU memory of a fine-tuning job under each strategy, as a breakdown whose terms each come
// from one small function (see precision.h, activation_memory.h and the comments below).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/hardware_spec.h"
#include "planner/model_spec.h"
#include "planner/training_setup.h"

namespace ftplan {

// One fully specified way to run the job: what `ftplan plan` searches over.
struct Candidate {
  Strategy strategy = Strategy::single;
  int64_t micro_batch = 1;
  Checkpointing checkpointing = Checkpointing::none;
  Attention attention = Attention::fused;
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

struct MemoryBreakdown {          // bytes on one GPU (the most loaded rank)
  int64_t weights = 0;            // working weights (frozen + trainable), sharded where the strategy shards
  int64_t gradients = 0;          // trainable gradients
  int64_t optimizer = 0;          // optimizer states incl. fp32 master weights
  int64_t activations = 0;        // kept for backward
  int64_t logits_loss = 0;        // the loss's peak (12·T·V)
  int64_t temporary = 0;          // gathered layers, gradient buckets, NF4 dequantisation
  int64_t overhead = 0;           // CUDA context, cuBLAS workspace, NCCL buffers, allocator slack
  int64_t total = 0;
  int64_t host = 0;               // host memory used by offload (not part of total)
};

struct MemoryEstimate {
  Strategy strategy = Strategy::single;
  Candidate candidate;
  int64_t gpus_used = 1;             // single uses 1 of the job's GPUs
  MemoryBreakdown per_gpu;
  int64_t usable_bytes = 0;          // memory × (1 − headroom)
  bool fits = false;
  std::string reason;                // why it does not fit, or "" when it does
};

// What every candidate of one job shares, computed once so that a search evaluates a candidate
// with arithmetic alone (activations are linear in the micro-batch: stored per sample).
struct PreparedJob {
  const ModelSpec* model = nullptr;
  const HardwareSpec* hw = nullptr;
  const TrainingSetup* setup = nullptr;
  double embedding_weight_bytes = 0, layer_weight_bytes = 0, head_weight_bytes = 0;
  double embedding_grad_bytes = 0, layer_grad_bytes = 0, head_grad_bytes = 0;
  double embedding_opt_bytes = 0, layer_opt_bytes = 0, head_opt_bytes = 0;
  double tied_head_weight_bytes = 0;      // pipelines: the tied embedding duplicated on the last stage
  int64_t trainable_params = 0;
  int64_t dequant_bytes = 0;              // QLoRA: one NF4 weight dequantised to bf16
  int64_t block_bytes_per_sample[2] = {0, 0};  // [fused, eager] activations of one block
  int64_t head_bytes_per_sample = 0;
  int64_t block_input_bytes_per_sample = 0;
  int64_t logits_bytes_per_sample = 0;
};
// The pointers must outlive the PreparedJob.
PreparedJob prepare_job(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup);

// The estimate for one candidate on `num_gpus` GPUs; the closed-form peak is the sum of the terms
// (gradients counted alive with all activations: exact under gradient accumulation, conservative
// for a single micro-batch).
// `explain` = false skips writing the reason (a search's hot path).
MemoryEstimate estimate_memory(const PreparedJob& job, const Candidate& candidate, int64_t num_gpus,
                               bool explain = true);
MemoryEstimate estimate_memory(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup,
                               const Candidate& candidate);

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

// Whether a training step fits once the caching allocator's fragmentation is counted: the step's tensors,
// allocated and freed in the order the framework runs them, replayed through PyTorch's caching allocator
// (planner/caching_allocator.h) for a few steps on one rank's share of the device.
//
// Why: the largest tensors of a step are transient (the loss's [tokens, vocab] buffers, tens of GiB). After
// the first step frees them, their cached segments take the tensors allocated later (the gradient shards, the
// optimizer states AdamW creates at its first step, the next step's activations), which split them; a split
// segment cannot be released, so the next step's [tokens, vocab] buffers need new segments on top. A job can
// then fail at its second step with well under the device allocated (pytorch/pytorch#35901; the allocator's
// Note [Expandable Segments]). Liger-Kernel's Hugging Face + FSDP-1 logs show it: Llama-3-8B at batch 48 peaks
// at 68,349 MiB allocated and 78,662 MiB reserved on an 80 GB A100, and its reserved figure drops by 12 GiB at
// step 19 when the allocator had to release its cache (examples/huggingface/llama_B_48_no_patching.log at
// linkedin/Liger-Kernel@4d4d9c6d760e6046c3cd4c3925ddb59aa4e98c84).
//
// The replayed step is the Hugging Face Trainer's under accelerate's FSDP-1 FULL_SHARD with every decoder layer
// checkpointed and the full loss (the layout and framework the published fragmentation failures ran): other
// layouts are not replayed (replay_step_for returns nothing) and are judged on the memory model's figures alone.
// The sizes are the memory model's (PreparedJob): the replay adds the allocator's behaviour, not new tensors.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ftplan {

struct PreparedJob;  // planner/memory_model.h
struct Candidate;

// One rank's step, in bytes (unsharded sizes are whole units; the replay divides by `shards`).
struct ReplayStep {
  int64_t shards = 1;  // the FSDP group the units are sharded over
  int64_t layers = 0;
  int64_t micro_batch = 1;
  double tokens = 0;   // micro_batch x the padded sequence length
  // Padded batches of varying length: step k's tokens (its activations and loss scale with them); empty: every
  // step `tokens` (what the planner plans for: the longest batch).
  std::vector<double> step_tokens;
  double vocab = 0;
  // Units: a decoder layer, and the root (embedding, final norm, head).
  double layer_weight_bytes = 0, layer_compute_bytes = 0, layer_grad_bytes = 0, layer_opt_bytes = 0;
  double root_weight_bytes = 0, root_compute_bytes = 0, root_grad_bytes = 0, root_opt_bytes = 0;
  double head_compute_bytes = 0, embedding_compute_bytes = 0;  // the root's weight gradients (tied: both embedding-sized)
  std::vector<double> layer_param_fractions;  // each parameter of a layer, as a fraction of the layer (sums to 1)
  std::vector<double> root_param_fractions;
  double optimizer_transient_bytes = 0;        // the optimizer step's temporaries, unsharded (whole model)
  // Activations.
  double block_input_bytes = 0;                // a checkpointed layer's input
  std::vector<double> block_tensors;           // the tensors a recomputed layer keeps for its backward
  double head_input_bytes = 0;                 // the final norm's and the head's saved inputs
  double hidden_grad_bytes = 0;                // the gradient flowing between layers
  double logits_bytes_per_element = 2;         // the head's output dtype
  bool loss_shifted_copy = false;              // transformers < 4.49: logits.float() and a contiguous shifted copy
  int64_t workspace_bytes = 0;                 // cuBLAS workspace (allocated once)
};

struct ReplayResult {
  int steps = 0;                  // steps replayed
  bool oom = false;
  int failed_step = 0;            // 1-based
  std::string failed_tensor;      // e.g. "the loss's fp32 logits"
  int64_t request_bytes = 0;      // the request that failed
  int64_t allocated_bytes = 0, reserved_bytes = 0;  // at the failure
  int64_t peak_allocated_bytes = 0, peak_reserved_bytes = 0;  // over the replayed steps (to the failure)
};

// The step the replay plays for this layout, or nothing where the layout is not replayed (see above).
std::optional<ReplayStep> replay_step_for(const PreparedJob& job, const Candidate& c);

// Plays `steps` steps through a caching allocator that can reserve `capacity_bytes`.
ReplayResult replay_steps(const ReplayStep& step, int64_t capacity_bytes, int steps = 3);

// The same, step by step: each step's peak allocated and reserved bytes (what a per-step
// torch.cuda.reset_peak_memory_stats log records), up to the step that fails.
struct ReplayStepPeaks {
  int64_t allocated_bytes = 0, reserved_bytes = 0;
};
ReplayResult replay_steps(const ReplayStep& step, int64_t capacity_bytes, int steps, std::vector<ReplayStepPeaks>* peaks);

}  // namespace ftplan

// Framework profiles: how a training stack (Hugging Face Trainer + PEFT, DeepSpeed, FSDP through
// accelerate, Lightning/litgpt, torchtune, torchtitan, ftexec) behaves where it moves memory or
// time, as data: one file per framework, configs/frameworks/<name>.json, every value with the
// framework file and commit (or document) it comes from. The estimators read this struct and
// nothing else about a framework; adding a framework means adding a file.
//
// File format ("ftplan-framework/1"): {"format", "name", "title", "versions", "notes", and sections
// whose every leaf is {"value": ..., "source": "..."} (an optional "note" beside them)}. Unknown keys,
// missing sources and out-of-range values are InputErrors naming the file and the key.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "planner/model_spec.h"
#include "planner/training_setup.h"

namespace ftplan {

// What the loss keeps and peaks at, in bytes per token per vocabulary entry (the [T, V] tensors)
// and per token per hidden unit (fused linear cross-entropy's [T, H] buffers).
struct LossProfile {
  double kept_bytes_per_token_vocab = 0;    // alive from the loss's forward to its backward, e.g. 4
  double peak_bytes_per_token_vocab = 0;    // all [T, V] tensors alive at the loss's peak, e.g. 12
  double kept_bytes_per_token_hidden = 0;   // fused: e.g. grad_input kept for backward, 2
  double peak_bytes_per_token_hidden = 0;   // fused: a chunk of logits (≈ T·H/V rows × V) + grad_input, e.g. 4
  // Under --compile, where the framework compiles the loss (the upcast fused into the kernel):
  // negative means "as eager".
  double compiled_kept_bytes_per_token_vocab = -1, compiled_peak_bytes_per_token_vocab = -1;
  // The full loss copies the upcast logits' shifted slice (logits[..., :-1, :].contiguous(): transformers before
  // 4.49) before the log-softmax: one more [T, V] fp32 tensor in forward, and a zero-padded one in backward.
  // The peak above counts what is alive at once; the allocator replay (allocator_replay.h) plays each tensor.
  bool shifted_copy = false;
};

// Where a framework's model, gradients and copies live while loading and saving.
enum class HostCopies { none, per_rank, rank0 };

struct FrameworkProfile {
  std::string name;     // file stem, e.g. "hf"
  std::string title;    // e.g. "Hugging Face transformers Trainer + PEFT + bitsandbytes"
  std::string versions; // e.g. "transformers 4.49-4.57, peft 0.13-0.17, bitsandbytes 0.45-0.48"

  // Defaults for the job's fields the user leaves out.
  Precision precision = Precision::mixed;
  Loss loss = Loss::full;
  Attention attention = Attention::fused;
  int64_t fsdp_version = 1;
  bool packing = false;
  bool double_quant = false;        // QLoRA: bitsandbytes' double quantisation of the block absmaxes

  std::map<Loss, LossProfile> losses;  // the loss implementations the framework offers

  // Activations.
  bool gqa_kv_repeated = false;     // attention saves k and v repeated to every query head (repeat_kv)
  // The framework's own fused RMSNorm and gated-MLP kernels (Liger-Kernel): the norm keeps its input as it
  // arrives and the fp32 rstd (no fp32 upcast, no normalised copy); the gated MLP keeps gate and up, and
  // down_proj its input where it trains.
  bool fused_norm_mlp_kernels = false;
  // Sequence parallelism: the column-parallel linears keep their all-gathered input (whole sequence)
  // for backward, as a plain matmul on the gathered tensor does; false: the shard is kept and gathered
  // again in backward (Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication).
  bool sp_keeps_gathered_input = false;
  bool autocast_weight_copies = true;  // amp runs under autocast: bf16 copies of fp32 weights are saved
                                       // for backward, and the residual stream stays fp32
  // What selective checkpointing keeps: "attention-core" (Korthikanti et al. 2022: everything but the
  // attention scores) or "every-second-matmul" (torchtitan's op-level policy: the block input, the
  // outputs of every second matmul and of the attention kernel; the rest recomputed).
  std::string selective_mode = "attention-core";
  // Padded (unpacked) batches reach SDPA with an explicit attention mask, so a fused kernel runs every key
  // block instead of skipping those above the causal diagonal (compute_model.h flops_per_token).
  bool padded_batches_pass_mask = false;

  // QLoRA.
  bool quantize_lm_head = false;              // the head is quantised too
  bool fp32_upcast_unquantized = false;       // prepare_model_for_kbit_training: the rest becomes fp32
  double dequant_weights_alive = 1;           // dequantised weights alive at once (bnb: one, forward/backward)
  bool quantized_matmul_saves_input = false;  // bitsandbytes < 0.43.2: MatMul4Bit keeps its input for backward
  // The quantisation statistics (absmax per block, double quantisation's nested absmax) are tensors that
  // FSDP / ZeRO-3 shard and offload with the packed weight (torchao's NF4Tensor all-gathers them); false:
  // they live outside the sharded parameters, whole on every GPU (bitsandbytes' Params4bit.quant_state).
  bool quant_state_sharded = true;

  // FSDP with LoRA: how the units hold gradients.
  bool fsdp_lora_separate_units = true;       // adapters wrapped as their own units (no frozen gradients)
  bool fsdp_no_sync_unsharded_grads = true;   // gradient accumulation keeps unsharded gradients

  // DeepSpeed ZeRO buffers, in elements (a hidden-size square where the framework fills "auto").
  bool zero_bucket_is_hidden_squared = false; // reduce_bucket_size = hidden²
  double zero_reduce_bucket_elements = 5e8;
  double zero_prefetch_bucket_elements = 5e7;  // stage 3
  bool zero_overlap_comm_double_buffer = false;  // stage 1/2: a second reduce bucket
  // zero.stage3_contiguous_gradients_buffer: ZeRO-3 with contiguous_gradients allocates one reduce-bucket-sized
  // buffer in the parameters' dtype at initialisation and keeps it for the whole run (the IPG bucket).
  bool zero3_contiguous_gradients_buffer = false;

  // The optimizer step.
  double optimizer_step_transient_bytes_per_param = 0;  // e.g. foreach AdamW's sqrt of exp_avg_sq
  // optimizer.grads_freed_between_steps: zero_grad(set_to_none=True) frees every gradient after the step, so
  // backward allocates them anew, the head's first (memory_model.cpp: the forward-backward peak); false
  // where the gradients stay allocated (zeroed in place, or in a framework's own flat buffers).
  bool grads_freed_between_steps = false;
  bool optimizer_foreach = false;  // optimizer.implementation: "foreach" (one pass per op) or "fused" (one kernel)

  // Loading and saving.
  double amp_frozen_weight_bytes = 2;  // amp: a frozen (LoRA base) weight's bytes: 2 when loaded in bf16, 4 in fp32
  HostCopies load_host_copies = HostCopies::per_rank;  // full model copies in host memory while loading
  bool unties_embeddings = false;      // a tied checkpoint becomes a separate lm_head (litgpt finetune)
  // QLoRA: bytes alive while one weight is quantised on the GPU, per element of the largest quantised weight,
  // beyond the stored result (its bf16 input and the quantiser's temporaries), e.g. 68 for torchao 0.1's
  // nearest-of-16 search; negative: the dequantised weights of the step (qlora.dequant_weights_alive).
  double quantize_transient_bytes_per_element = -1;

  // The step's reserved (and nvidia-smi) figure keeps the load phase's cached segments: the recipe neither
  // empties the cache (torch.cuda.empty_cache) after loading nor can a peak reset lower the reserved figure
  // below what is cached, so reserved at the step = max(load reserved, step reserved).
  bool step_reserved_keeps_load_cache = false;
  HostCopies save_host_copies = HostCopies::rank0;     // a full state dict gathered on the host to save
  bool save_gathers_units_on_gpu = true;               // sharded strategies gather unit by unit to save
  // FSDP's sharded state dict (StateDictType.SHARDED_STATE_DICT) with ShardedStateDictConfig(offload_to_cpu):
  // each parameter's chunk, cloned on the GPU, is moved to the host at once (true: the rank's whole shard
  // ends up in host memory), or stays on the GPU until the checkpoint is written (false: a second copy of the
  // rank's shard on the GPU; accelerate before 0.31 passed no config, and torch's default is False).
  bool sharded_state_dict_offload_to_cpu = true;
  // A full state dict of a sharded model holds every parameter on rank 0's host before a LoRA save keeps the
  // adapters (accelerate's get_state_dict, PEFT's get_peft_model_state_dict: model.state_dict(), then a filter);
  // false where the framework writes the trainable weights alone.
  bool full_state_dict_holds_frozen = true;

  // Runtime: what nvidia-smi sees beyond the caching allocator, and what the host process holds.
  int64_t cuda_context_bytes = 0;       // e.g. 446693376 (426 MiB)
  int64_t cublas_workspace_bytes = 0;   // in the allocator, e.g. 8519680 (32 MiB on Hopper)
  int64_t nccl_bytes_per_gpu = 0;       // distributed runs
  int64_t host_process_bytes_per_rank = 0;  // the Python process, CUDA libraries, data loader
  double reserved_over_allocated = 1.0; // the caching allocator's reserved peak / allocated peak
  // The same ratio when memory runs out: before raising an out-of-memory error the allocator releases the
  // cached blocks no tensor uses and retries, so only the slack inside segments in use can make a job fail.
  // fits is judged with it; at most reserved_over_allocated.
  double reserved_over_allocated_at_oom = 1.0;
  // fits also replays the step's tensors through PyTorch's caching allocator (allocator_replay.h) where the
  // layout is one the replay plays (the Trainer's FSDP-1 step), so fragmentation can refuse a plan.
  bool allocator_replay = false;

  // Knobs the framework offers (bad input otherwise).
  bool offers_activation_offload = false;
  bool offers_optimizer_in_backward = false;
  bool optimizer_in_backward_allows_accumulation = false;
  bool offers_selective_checkpointing = false;
  bool offers_compile = false;

  // Eager element-wise work of one block, bytes each module's eager ops read and write per element of
  // their tensor (bf16 activations), counted op by op from the framework's module code (compute_model.h
  // eager_elementwise_bytes_per_token): one RMSNorm per hidden element (e.g. 36: transformers' upcast,
  // pow, mean, rsqrt-mul, downcast, weight), rotary embedding per q and k element (e.g. 20), the gated MLP's
  // activation per intermediate element (e.g. 10: silu, then x up). 0: not counted.
  double eager_norm_bytes_per_hidden = 0;
  double eager_rope_bytes_per_element = 0;
  double eager_mlp_act_bytes_per_intermediate = 0;
  std::vector<int64_t> fsdp_versions{1};

  // Parallelism beyond data parallelism (planner/parallelism.h), and what sharded data parallelism means.
  std::string default_sharding = "fsdp";  // dp_shard without shard=: "fsdp" or "zero3"
  bool offers_tensor_parallel = false;
  bool tensor_parallel_with_lora = false;
  // tp or cp over pure replicas (dp_replicate > 1 with dp_shard = 1); accelerate refuses it
  bool model_parallel_with_pure_replicas = true;
  std::string sequence_parallel = "never";  // with tensor parallelism: "never", "optional", "always"
  bool offers_context_parallel = false;
  ContextParallel cp_mode = ContextParallel::all_gather;  // how its context parallelism exchanges K and V
  bool offers_pipeline_parallel = false;    // pipelines composed with data parallelism, TP, CP
  std::vector<PipelineSchedule> pipeline_schedules;
  bool offers_expert_parallel = false;      // a mixture of experts' experts split over ep ranks (ep in --parallel)
  bool expert_parallel_overlap = false;     // its all-to-all dispatch and combine run beside the experts' compute

  std::map<std::string, std::string> sources;  // "section.key" -> where the value comes from
};

// Parses and validates one profile's JSON; `where` names it in errors (the file path).
FrameworkProfile framework_profile_from_json(const nlohmann::json& j, const std::string& where);

// The model as the framework builds it from the checkpoint: a tied embedding and head become two matrices
// where the framework unties them (FrameworkProfile::unties_embeddings); otherwise the model unchanged.
ModelSpec model_as_built(ModelSpec model, const FrameworkProfile& fw);

// Loads configs/frameworks/<name>.json (or a path); InputError naming the field ("--framework").
FrameworkProfile load_framework(const std::string& name_or_path);

// The profile a job names, loaded once per process and kept (the estimators' one way to a profile).
const FrameworkProfile& framework_profile(const std::string& name_or_path);

// The names of the shipped profiles, sorted.
std::vector<std::string> list_frameworks();

// Fills the fields the user left out (setup.given) from the profile, then checks the knobs against
// it: a loss, a knob or an FSDP version the framework does not offer is an InputError naming both.
void apply_framework(TrainingSetup& setup, const FrameworkProfile& profile);

}  // namespace ftplan

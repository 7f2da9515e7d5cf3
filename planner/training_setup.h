// Training setup: what is trained, how, on how many of which GPU. Together with a ModelSpec and a
// HardwareSpec it is everything an estimate needs. Read from a job file (configs/jobs/X.json) or
// from the CLI flags of the same names; the format is shared by `ftplan` and `ftexec`.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "planner/parallelism.h"

namespace ftplan {

enum class Method { full, lora, qlora };
// mixed: bf16 weights and gradients, fp32 master weights and Adam moments (2 + 2 + 12 = 16 B);
// mixed_fp32_grads: the same with fp32 gradient accumulation (2 + 4 + 12 = 18 B, Megatron/DeepSpeed);
// amp: fp32 weights, gradients and moments with bf16 autocast (4 + 4 + 8 = 16 B; Hugging Face's
//      default load dtype with bf16=True, litgpt bf16-mixed, FSDP's fp32 shards with bf16 compute);
// bf16: everything in bf16 (2 + 2 + 4 = 8 B, torchtune/litgpt); fp32: 4 + 4 + 8 = 16 B.
enum class Precision { mixed, mixed_fp32_grads, amp, bf16, fp32 };
enum class Optimizer { adamw, adamw8bit, sgd };
// full: every block recomputed from its input; selective: the attention core recomputed (its
// scores and softmax), the rest kept (Korthikanti et al. 2022, sec. 5; Megatron's "selective").
enum class Checkpointing { none, full, selective };
// How the loss is computed: the full [tokens, vocab] logits; chunked over tokens (torchtune's
// CEWithChunkedOutputLoss, litgpt's chunked lm_head); fused with the head so no [tokens, vocab]
// tensor exists (Liger's fused linear cross-entropy).
enum class Loss { full, chunked, fused_linear };
enum class Attention { fused, eager };
// How a checkpoint saves an FSDP model (torch.distributed.fsdp.StateDictType, accelerate's
// fsdp_state_dict_type): a full state dict gathered unit by unit to rank 0; a sharded one, each rank its
// chunk of every parameter (ShardedTensor/DTensor); a local one, each rank its flat shard as it is.
enum class StateDict { full, sharded, local };
enum class Strategy {
  single,              // one GPU
  mp,                  // naive model parallel: consecutive layers on N GPUs, one busy at a time
  pipeline_gpipe,      // GPipe over grad_accum micro-batches
  pipeline_1f1b,       // 1F1B (PipeDream-flush) over grad_accum micro-batches
  ddp,                 // replicas, bucketed gradient all-reduce
  zero1,               // optimizer states sharded
  zero2,               // + gradients sharded
  zero3,               // + parameters sharded
  fsdp,                // PyTorch FSDP FULL_SHARD
  fsdp_shard_grad_op,  // FSDP SHARD_GRAD_OP (parameters kept gathered between forward and backward)
  fsdp_hybrid,         // FSDP HYBRID_SHARD: full shard inside a node, replicate across nodes
  zero2_offload,       // ZeRO-2 with optimizer states and master weights in host memory
  zero3_offload,       // ZeRO-3 with parameters and optimizer states in host memory
};

const std::vector<Strategy>& all_strategies();
std::string to_string(Method v);
std::string to_string(Precision v);
std::string to_string(Optimizer v);
std::string to_string(Checkpointing v);
std::string to_string(Attention v);
std::string to_string(Loss v);  // "full", "chunked", "fused-linear"
std::string to_string(StateDict v);  // "full", "sharded", "local"
std::string to_string(Strategy v);  // "single", "mp", "pipeline", "pipeline_1f1b", "ddp", "zero1", ...
// Parsers throw InputError naming `field` and listing the accepted values.
Method parse_method(const std::string& s, const std::string& field);
Precision parse_precision(const std::string& s, const std::string& field);
Optimizer parse_optimizer(const std::string& s, const std::string& field);
Checkpointing parse_checkpointing(const std::string& s, const std::string& field);
Attention parse_attention(const std::string& s, const std::string& field);
Loss parse_loss(const std::string& s, const std::string& field);
StateDict parse_state_dict(const std::string& s, const std::string& field);
Strategy parse_strategy(const std::string& s, const std::string& field);

struct LoraSpec {
  int64_t rank = 16;                                     // r, e.g. 16
  double alpha = 8;                                      // scaling = alpha / rank; PEFT's LoraConfig default
                                                         // lora_alpha=8 whatever the rank (peft tuners/lora/config.py)
  double dropout = 0.0;                                  // PEFT's default
  std::vector<std::string> targets{"q_proj", "v_proj"};  // PEFT's default for Llama; or all seven
  bool all_linear = false;  // given as "all-linear": apply_model (job_fields.h) names the model's own linears
};
// "q_proj,v_proj", "all-linear" (the seven Llama block linears; apply_model renames them for a family
// whose linears differ) -> module names; InputError on a name no family has.
std::vector<std::string> parse_lora_targets(const std::string& list, const std::string& field);

// The dataset a whole job goes through.
struct DatasetSpec {
  int64_t rows = 0;                 // e.g. 10000 records
  int64_t mean_tokens_per_row = 0;  // 0: rows are packed/padded to seq_len
  int64_t max_tokens_per_row = 0;   // the longest row, e.g. 3000; 0: seq_len. Padded batches are as
                                    // long as their longest row: memory is planned for it
  int64_t tokens = 0;               // total tokens, when given instead of rows
};

// QLoRA's quantisation, where the framework lets the user choose.
struct QuantizationSpec {
  bool double_quant = true;         // bitsandbytes bnb_4bit_use_double_quant (the QLoRA paper's recipe);
                                    // the framework's default applies when a job leaves it out
};

// How a mixture of experts' tokens meet its experts (planner/model_spec.h MoeSpec).
struct MoeOptions {
  // Dropless routing (transformers, torchtitan): every token runs its top_k experts. Under expert
  // parallelism the busiest rank receives imbalance_factor x the balanced T x top_k token-expert pairs
  // (its compute, activations and all-to-all volume); 1.0 = perfectly balanced routing.
  double imbalance_factor = 1.0;           // e.g. 1.0; at most num_experts / top_k
  std::optional<double> capacity_factor;   // instead: each expert takes at most capacity_factor x T x top_k /
                                           // num_experts tokens, padded to it (GShard, DeepSpeed-MoE); e.g. 1.25
  std::optional<bool> aux_loss;            // the load-balancing loss (transformers' load_balancing_loss_func over
                                           // every layer's router logits); default: the config's output_router_logits
};

struct TrainingSetup {
  std::string model;                 // short name or path of a config.json, e.g. "llama-3-8b"
  std::string framework = "hf";      // configs/frameworks/<name>.json: whose behaviour is predicted
  std::string gpu = "a100-80gb-sxm"; // hwdb id
  int64_t num_gpus = 1;              // GPUs in the job, e.g. 4
  Method method = Method::full;
  LoraSpec lora;
  Precision precision = Precision::mixed;
  Optimizer optimizer = Optimizer::adamw;
  bool paged_optimizer = false;      // bitsandbytes paged optimizer: states may live in host memory
  int64_t seq_len = 2048;            // tokens per sample
  int64_t grad_accum = 1;            // micro-batches per optimizer step (pipeline: its micro-batches)
  int64_t epochs = 1;
  DatasetSpec dataset;
  double headroom_fraction = 0.05;   // memory kept free: fits when total <= (1 - headroom) * memory
  int64_t fsdp_version = 1;          // PyTorch FSDP 1 (FlatParameter) or 2 (fully_shard)
  Loss loss = Loss::full;
  QuantizationSpec quantization;
  MoeOptions moe;
  bool activation_offload = false;   // activations kept in host memory between forward and backward
  bool optimizer_in_backward = false;  // each parameter updated as its gradient is ready, then freed
  bool compile = false;              // torch.compile
  bool packing = false;              // rows packed to seq_len (else each batch padded to its longest row)
  std::optional<double> host_memory_gib;  // overrides the hwdb's host memory per node
  std::optional<std::string> pcie_slot;   // the PCIe slot the GPUs sit in, "GENxLANES" (e.g. "3x8"): scales
                                          // the hwdb's PCIe figures (apply_topology)
  std::optional<double> price_per_gpu_hour;  // USD per GPU-hour, e.g. 2.1; overrides the hwdb's price
  std::optional<StateDict> state_dict;       // how checkpoints save an FSDP model; default: the framework's
                                             // save (its profile's saving section)

  // Chosen by the user, or searched by `ftplan plan` when absent.
  std::optional<int64_t> micro_batch;         // samples per GPU per micro-batch, e.g. 4
  std::optional<Checkpointing> checkpointing;
  std::optional<Attention> attention;
  std::optional<Strategy> strategy;           // a preset (planner/parallelism.h)
  std::optional<Parallelism> parallel;        // or a composition: --parallel "tp=8,pp=2,dp_shard=4"
  std::string parallel_text;                  // as given; apply_framework re-reads it with the
                                              // framework's default sharding for dp_shard
  std::optional<double> efficiency;           // overrides the hwdb's matmul_efficiency

  // Topology: nodes x GPUs per node (defaults: the hwdb entry's GPUs per node; gpus = nodes x that).
  std::optional<int64_t> nodes;
  std::optional<int64_t> gpus_per_node;

  // Executor settings, carried through the plan file to ftexec.
  int64_t steps = 20;
  double learning_rate = 1e-4;
  int64_t seed = 0;
  std::string data = "synthetic";
  std::string device = "cuda";

  // The job keys the user gave (a file or flags); the framework profile fills the others.
  std::set<std::string> given;

  int64_t micro_batch_or(int64_t fallback) const { return micro_batch.value_or(fallback); }
  // Tokens per sample the memory is planned for: the padded length of the longest batch.
  int64_t memory_seq_len() const;
};

// Reads a job object; unknown keys, wrong types and out-of-range values are InputErrors that name
// "<where>: <field>". A "published" object (reference measurements) is accepted and ignored.
TrainingSetup training_setup_from_json(const nlohmann::json& j, const std::string& where);
nlohmann::json training_setup_to_json(const TrainingSetup& setup);

// Tokens the whole job processes: dataset tokens (rows × mean length, or rows × seq_len) × epochs.
int64_t job_tokens(const TrainingSetup& setup);

}  // namespace ftplan

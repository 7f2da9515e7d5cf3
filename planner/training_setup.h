// Training setup: what is trained, how, on how many of which GPU. Together with a ModelSpec and a
// HardwareSpec it is everything an estimate needs. Read from a job file (configs/jobs/X.json) or
// from the CLI flags of the same names; the format is shared by `ftplan` and `ftexec`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ftplan {

enum class Method { full, lora, qlora };
// mixed: bf16 weights and gradients, fp32 master weights and Adam moments (2 + 2 + 12 = 16 B);
// mixed_fp32_grads: the same with fp32 gradient accumulation (2 + 4 + 12 = 18 B, Megatron/DeepSpeed);
// bf16: everything in bf16 (2 + 2 + 4 = 8 B, torchtune/litgpt); fp32: 4 + 4 + 8 = 16 B.
enum class Precision { mixed, mixed_fp32_grads, bf16, fp32 };
enum class Optimizer { adamw, adamw8bit, sgd };
enum class Checkpointing { none, full };
enum class Attention { fused, eager };
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
std::string to_string(Strategy v);  // "single", "mp", "pipeline", "pipeline_1f1b", "ddp", "zero1", ...
// Parsers throw InputError naming `field` and listing the accepted values.
Method parse_method(const std::string& s, const std::string& field);
Precision parse_precision(const std::string& s, const std::string& field);
Optimizer parse_optimizer(const std::string& s, const std::string& field);
Checkpointing parse_checkpointing(const std::string& s, const std::string& field);
Attention parse_attention(const std::string& s, const std::string& field);
Strategy parse_strategy(const std::string& s, const std::string& field);

struct LoraSpec {
  int64_t rank = 16;                                     // r, e.g. 16
  double alpha = 32;                                     // scaling = alpha / rank
  double dropout = 0.0;                                  // PEFT's default
  std::vector<std::string> targets{"q_proj", "v_proj"};  // PEFT's default for Llama; or all seven
};
// "q_proj,v_proj", "all-linear" (all seven block linears) -> module names; InputError on others.
std::vector<std::string> parse_lora_targets(const std::string& list, const std::string& field);

// The dataset a whole job goes through.
struct DatasetSpec {
  int64_t rows = 0;                 // e.g. 10000 records
  int64_t mean_tokens_per_row = 0;  // 0: rows are packed/padded to seq_len
  int64_t tokens = 0;               // total tokens, when given instead of rows
};

struct TrainingSetup {
  std::string model;                 // short name or path of a config.json, e.g. "llama-3-8b"
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

  // Chosen by the user, or searched by `ftplan plan` when absent.
  std::optional<int64_t> micro_batch;         // samples per GPU per micro-batch, e.g. 4
  std::optional<Checkpointing> checkpointing;
  std::optional<Attention> attention;
  std::optional<Strategy> strategy;
  std::optional<double> efficiency;           // overrides the hwdb's matmul_efficiency

  // Executor settings, carried through the plan file to ftexec.
  int64_t steps = 20;
  double learning_rate = 1e-4;
  int64_t seed = 0;
  std::string data = "synthetic";
  std::string device = "cuda";

  int64_t micro_batch_or(int64_t fallback) const { return micro_batch.value_or(fallback); }
};

// Reads a job object; unknown keys, wrong types and out-of-range values are InputErrors that name
// "<where>: <field>". A "published" object (reference measurements) is accepted and ignored.
TrainingSetup training_setup_from_json(const nlohmann::json& j, const std::string& where);
nlohmann::json training_setup_to_json(const TrainingSetup& setup);

// Tokens the whole job processes: dataset tokens (rows × mean length, or rows × seq_len) × epochs.
int64_t job_tokens(const TrainingSetup& setup);

}  // namespace ftplan

// What ftexec runs: a TrainingSetup (the job format shared with ftplan), the resolved candidate,
// the model spec, and the executor's own settings. Read from a plan file (`ftplan plan -o`) and/or
// CLI flags; flags override the plan. No LibTorch here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/model_spec.h"
#include "planner/training_setup.h"

namespace ftexec {

struct ExecJob {
  ftplan::TrainingSetup setup;     // micro_batch, checkpointing, attention and strategy filled in
  ftplan::ModelSpec model;
  std::string model_config_path;   // the config.json the spec came from
  std::string device = "cpu";      // "cpu" or "cuda" / "cuda:N"
  int64_t warmup_steps = 1;        // excluded from the timings, e.g. 1
  double max_grad_norm = 1.0;      // gradient clipping (HF Trainer's default); 0: off
  double weight_decay = 0.0;       // AdamW decoupled weight decay (not on biases and norm weights, as HF Trainer)
  double adam_beta1 = 0.9;         // HF TrainingArguments' defaults
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  int64_t threads = 0;             // intra-op threads; 0: all cores
  int64_t cpu_memory_limit_bytes = 0;  // 0: none
  std::string save_dir;            // adapter (LoRA) or full weights, "" for none
  std::string load_weights;        // HF safetensors file, folder or index; "" to init from the seed
  bool progress = false;           // a progress bar (only on a terminal)
  std::optional<nlohmann::json> plan;  // the plan file, for the prediction beside the measurement
};

// The setup of a plan file ("format": "ftplan-plan/1"): its "job" with the "candidate" applied.
// InputError naming the file and field for anything malformed.
ftplan::TrainingSetup setup_from_plan(const nlohmann::json& plan, const std::string& where);

// Resolves the model config (short name or path), checks what ftexec supports (every preset strategy,
// a --parallel layout it can run (ftplan::exec_problems); method full/lora/qlora, precision
// fp32/bf16/mixed, optimizer adamw), and fills defaults. Every problem is collected and reported
// together in one InputError.
ExecJob make_exec_job(const ftplan::TrainingSetup& setup, const std::string& device);

// The layout this run executes on `world` ranks (planner/parallelism.h), the one description every
// strategy class reads: the job's parallel key (--parallel) as given, else its strategy's preset
// (--strategy, default single) over `world` ranks, with `shard_group_size` ranks per node when > 0
// (--shard-group-size), else the job's gpus_per_node, else its GPU's in hwdb/ (fsdp_hybrid's shard
// groups). InputError naming the field and every operand when the degrees do not multiply to the
// world size (e.g. "--strategy fsdp_hybrid: dp_replicate(1) * dp_shard(4) * cp(1) * tp(1) * pp(1) = 4
// != WORLD_SIZE(6)"), when the layout does not suit the model (ftplan::parallelism_problems: pp above
// the layers, ...), or when ftexec cannot run it yet (ftplan::exec_layout_problems).
ftplan::Parallelism exec_parallelism(const ExecJob& job, int world, int64_t shard_group_size = 0);

// measured.json's "settings": the optimizer and run settings the run used (learning rate, AdamW betas,
// epsilon, weight decay and what it excludes, gradient clipping, LoRA rank and alpha, warm-up, threads).
nlohmann::json exec_settings_json(const ExecJob& job);

// The median of step times (warm-up steps already left out by the caller).
double median(std::vector<double> values);

}  // namespace ftexec

// Reading the configs people train with as a job: a DeepSpeed config JSON, an accelerate config YAML,
// an axolotl YAML, a torchtune recipe YAML, a LLaMA-Factory YAML, Hugging Face TrainingArguments
// (JSON or YAML, with TRL's SFTConfig/ModelConfig keys), and the torchrun or sbatch launch scripts
// `ftplan export` writes. Every key a file gives lands on the job through the field table
// (planner/job_fields.h), so a value is checked the same way as in a job file or a flag; every key
// that does not map onto the job is listed in `ignored_keys`, never dropped silently; two files that
// disagree, or a file and a flag that disagree, are an InputError naming both ("a.yml: micro_batch_size
// 2 disagrees with b.json: train_micro_batch_size_per_gpu 4").
//
// What a file means is read in two steps: `read_config_files` parses the files and maps their keys
// (values, layout, framework, rules that need the GPU count); `apply_config_values` lays the values on
// the setup after the user's flags are known; `apply_config_rules` resolves, once the GPU count is
// final (apply_topology), the layout (DeepSpeed's stage 3 on 4 GPUs is zero3; FSDP with offload is
// "dp_shard=4,shard=fsdp,offload=optimizer+params"), DeepSpeed's train_batch_size (= micro-batch x
// accumulation x data-parallel GPUs) and max_steps (the job's length in tokens).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/hardware_spec.h"
#include "planner/parallelism.h"
#include "planner/training_setup.h"

namespace ftplan {

enum class ConfigKind { deepspeed, accelerate, axolotl, torchtune, llamafactory, hf_trainer, torchrun, slurm };
std::string to_string(ConfigKind kind);  // "deepspeed", ..., "hf-trainer", "torchrun", "slurm"

// The kind a parsed file is, from its keys (a JSON or YAML object) or its lines (a launch script);
// nullopt when it is none of them.
std::optional<ConfigKind> detect_config_kind(const nlohmann::json& document);

// A YAML document as JSON, scalars typed as PyYAML (YAML 1.1, what axolotl, torchtune, LLaMA-Factory
// and accelerate load with) types them: true/yes/on, null/~/empty, integers (with _), floats
// ("2e-5" too, as pydantic and OmegaConf coerce it); a quoted scalar stays a string. InputError
// naming `where` on malformed YAML.
nlohmann::json yaml_to_json(const std::string& text, const std::string& where);

// One value a file gives the job: its job key (job_fields.h), the value and where it came from.
struct ImportedValue {
  std::string key;        // "micro_batch"
  nlohmann::json value;   // 2
  std::string origin;     // "axolotl.yml: micro_batch_size"
  std::string as_written; // "2": the file's own value, for messages
};

// How the files lay the job out, before the GPU count is known: the degrees they fix and the
// sharding; the data-parallel degree they leave open takes the rest of the GPUs.
struct ImportedLayout {
  Sharding sharding = Sharding::none;
  int zero_stage = 0;
  bool reshard_after_forward = true;
  bool hybrid = false;               // FSDP HYBRID_SHARD: shard inside a node, replicate across nodes
  bool offload_optimizer = false;
  bool offload_params = false;
  int64_t tp = 1, cp = 1, pp = 1;
  bool sequence_parallel = false;    // with tp: the norms and residual stream split by tokens (torchtune always)
  ContextParallel cp_mode = ContextParallel::all_gather;
  int64_t dp_replicate = 0, dp_shard = 0;  // 0: the rest of the GPUs
  bool single_on_one_gpu = false;    // one GPU runs the framework's single-device path (torchtune, DDP)
  bool explicit_layout = true;       // false: the framework's default when a file names none (DDP)
  std::string origin;                // "ds_zero3.json: zero_optimization.stage"
  std::string describe() const;      // "ZeRO stage 3", "FSDP full shard with CPU offload", "DDP"
};

struct ImportedFile {
  std::string path;
  ConfigKind kind;
};

struct ConfigImport {
  std::vector<ImportedFile> files;
  std::vector<ImportedValue> values;
  std::optional<ImportedLayout> layout;
  std::string framework, framework_origin;        // the profile the files run on, e.g. "deepspeed"
  std::string unknown_model, unknown_model_origin;  // a model name model_names.json lacks
  // Precision as the files say it: "bf16", "fp16" (planned as bf16: the same bytes), "fp32", or
  // "" when none says; resolved against the framework when the files are read.
  std::string precision_mode, precision_origin, precision_written;
  // Rules that wait for the GPU count (apply_config_rules).
  std::optional<int64_t> train_batch_size;  // DeepSpeed: micro-batch x accumulation x data-parallel GPUs
  std::string train_batch_size_origin;
  std::optional<int64_t> max_steps;         // optimizer steps: the job's length
  bool max_steps_per_epoch = false;         // torchtune's max_steps_per_epoch (x epochs)
  std::string max_steps_origin;
  struct AutoValue {
    std::string origin;  // "ds.json: train_micro_batch_size_per_gpu"
    std::string key;     // the job key (or "train_batch_size") the file left to "auto"
  };
  std::vector<AutoValue> autos;
  std::vector<std::string> ignored_keys;    // "axolotl.yml: wandb_project"
  std::vector<std::string> notes;           // how a value was read or resolved

  bool empty() const { return files.empty(); }
  const ImportedValue* value(const std::string& key) const;
};

// Reads the files in order (a file may name another: axolotl's `deepspeed:`, accelerate's
// `deepspeed_config_file`, which are read too when they exist beside the file, in a folder above it
// or in the working directory, unless a DeepSpeed config is among `paths`). InputError naming the
// file and the key on an unknown kind, a value of the wrong type, a setting ftplan does not model,
// or two files that disagree.
ConfigImport read_config_files(const std::vector<std::string>& paths);

// A value given elsewhere: a flag ("--micro-batch") or a job file key ("job.json: micro_batch").
struct GivenValue {
  nlohmann::json value;
  std::string origin;  // "--micro-batch 4"
};

// Lays the files' values on the setup. A key also in `elsewhere` must have the same value (after
// parsing: "q_proj,v_proj" equals ["q_proj", "v_proj"]), else an InputError naming both.
void apply_config_values(TrainingSetup& setup, ConfigImport& imp, const std::map<std::string, GivenValue>& elsewhere);

// Once the GPU count is final: the files' layout (a preset where it is one, else a --parallel
// composition; a --strategy/--parallel that differs is refused naming both), DeepSpeed's
// train_batch_size rule and max_steps. Notes what "auto" values resolved to.
void apply_config_rules(TrainingSetup& setup, ConfigImport& imp, const HardwareSpec& hw,
                        const std::map<std::string, GivenValue>& elsewhere);

// Where the files set what an error message names: the origins of the imported values whose job
// key or flag the message mentions, e.g. " (from axolotl.yml: activation_offloading)"; "" if none.
std::string config_origins_in(const ConfigImport& imp, const std::string& message);

// {"files": [{"path", "kind"}], "framework", "layout", "mapped": [{"key", "value", "from"}],
//  "ignored_keys": [...], "notes": [...]}
nlohmann::json import_json(const ConfigImport& imp);
// The same as lines for a text report: "imported: a.yml (axolotl), b.json (deepspeed)", ...
std::vector<std::string> import_lines(const ConfigImport& imp);

// configs/import/model_names.json: a Hugging Face repo id (case-insensitive) or a torchtune model
// builder (torchtune.models.llama3_1.lora_llama3_1_8b: the lora_/qlora_ prefix gives the method) to a
// shipped model config's short name; nullopt when the table has none.
std::optional<std::string> model_for_hf_id(const std::string& repo_id);
struct TorchtuneModel {
  std::string model;   // "llama-3.1-8b"
  Method method;       // from the builder's prefix
};
std::optional<TorchtuneModel> model_for_torchtune_component(const std::string& component);
// The reverse, for export: the first Hugging Face id / torchtune builder the table lists for a short name.
std::optional<std::string> hf_id_for_model(const std::string& short_name);
struct TorchtuneBuilder {
  std::string builder;                // "torchtune.models.llama3_1.llama3_1_8b"
  std::string tokenizer;              // "torchtune.models.llama3.llama3_tokenizer"
  std::string checkpoint_model_type;  // "LLAMA3"
};
std::optional<TorchtuneBuilder> torchtune_builder_for_model(const std::string& short_name);

}  // namespace ftplan

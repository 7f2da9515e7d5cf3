// Writing a plan in the keys of the stack that runs it: a DeepSpeed config JSON, an accelerate config
// YAML, an axolotl, torchtune or LLaMA-Factory YAML, a torchrun launch script or an sbatch script.
// Each target writes what it can express of the plan's job (`export_carried_keys`); what it cannot
// express is refused (InputError naming the target and the job key: "--to deepspeed: parallel
// tp=2: ..."), never written approximately. Reading the output back with `--from`
// (planner/config_import.h) gives the same job: tests/planner/test_config_export.cpp round-trips
// every target.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "planner/parallelism.h"
#include "planner/training_setup.h"

namespace ftplan {

enum class ExportTarget { deepspeed, accelerate, axolotl, torchtune, llamafactory, torchrun, slurm };
std::string to_string(ExportTarget target);
ExportTarget parse_export_target(const std::string& text, const std::string& field);
const std::vector<ExportTarget>& all_export_targets();

// The plan an export reads: `ftplan plan -o`'s file ({"format": "ftplan-plan/1", "job", "predicted"})
// or `ftplan plan --json`'s report ({"job", "recommended"}).
struct ExportPlan {
  TrainingSetup job;              // the recommended job: its strategy or parallel, micro-batch, checkpointing
  Parallelism layout;             // the job's layout on its GPUs
  std::string layout_name;        // "zero3", or a --parallel string
  int64_t nodes = 1;
  int64_t gpus_per_node = 1;      // GPUs per node the job uses (the hwdb node, or --gpus-per-node)
  std::optional<double> job_time_s;  // the predicted job time, when the plan has a dataset
};
ExportPlan export_plan_from_json(const nlohmann::json& plan, const std::string& where);

struct ExportResult {
  std::string text;                // the file
  std::vector<std::string> notes;  // what the reader should know (printed on stderr)
};

struct ExportOptions {
  double time_margin = 0.25;  // slurm: the time limit is the plan's job time x (1 + margin), whole minutes
};

ExportResult export_plan(const ExportPlan& plan, ExportTarget target, const ExportOptions& options = {});

// The job keys a target writes for this plan (and `--from` reads back); the layout counts as
// "strategy"/"parallel". The rest of the job is not the target's to say (the dataset, the GPU type, ...).
std::vector<std::string> export_carried_keys(const ExportPlan& plan, ExportTarget target);

// A Slurm time limit, "D-HH:MM:SS", for a duration in seconds rounded up to the minute.
std::string slurm_time(double seconds);

}  // namespace ftplan

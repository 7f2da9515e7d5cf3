// The job options shared by every subcommand (`ftplan memory`, `plan`, `sweep`, `check`, `simulate`):
// a job file (configs/jobs/X.json) and/or flags; a flag the user gives overrides the file.
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "planner/hardware_spec.h"
#include "planner/model_spec.h"
#include "planner/training_setup.h"

namespace ftplan::cli {

struct JobOptions {
  std::string job_file;
  std::optional<std::string> model, method, lora_targets, gpu, checkpointing, attention, precision, optimizer,
      strategy;
  std::optional<int64_t> lora_rank, gpus, seq_len, micro_batch, grad_accum, epochs, dataset_rows,
      dataset_tokens, mean_tokens;
  std::optional<double> lora_alpha, lora_dropout, headroom, efficiency;
  bool paged_optimizer = false;
  bool json = false;
};

// Binds the options to a subcommand.
void add_job_options(CLI::App& app, JobOptions& options);

// Everything one estimate needs, loaded and validated.
struct LoadedJob {
  TrainingSetup setup;
  ModelSpec model;
  HardwareSpec hardware;
};

// Reads the job file (if any), applies the flags, loads the model config and the hwdb entry.
LoadedJob load_job(const JobOptions& options);

}  // namespace ftplan::cli

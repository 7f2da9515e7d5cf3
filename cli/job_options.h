// The job options shared by every subcommand (`ftplan memory`, `plan`, `sweep`, `check`, `simulate`):
// a job file (configs/jobs/X.json) and/or flags; a flag the user gives overrides the file. Every
// flag is a row of planner/job_fields.h's table, read through cli/field_flags.h.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/field_flags.h"
#include "planner/calibration.h"
#include "planner/config_import.h"
#include "planner/hardware_spec.h"
#include "planner/model_spec.h"
#include "planner/training_setup.h"

namespace ftplan::cli {

struct JobOptions {
  std::string job_file;
  std::vector<std::string> from;  // --from FILE (repeatable): DeepSpeed, accelerate, axolotl, torchtune, ... configs
  FieldFlags flags;  // the table's kFtplanFlag rows as typed
  std::string calibration;        // --calibration FILE: the efficiency parameters of `ftplan calibrate` / `ftexec calibrate`
  bool json = false;
};

// Binds the options to a subcommand.
void add_job_options(CLI::App& app, JobOptions& options);

// Everything one estimate needs, loaded and validated.
struct LoadedJob {
  TrainingSetup setup;
  ModelSpec model;
  HardwareSpec hardware;
  std::string model_path;  // the config.json the model came from (resolved)
  std::optional<ConfigImport> imported;  // what --from read: files, mapped and ignored keys, notes
  std::optional<Calibration> calibration;  // --calibration, applied to `hardware`
  std::string calibration_path;
};

// Reads the job file (if any), applies the flags, reads the --from configs (a flag or job key that
// contradicts them is an error naming both), loads the model config and the hwdb entry, and runs
// the whole-job checks (validate_job).
LoadedJob load_job(const JobOptions& options);

// What --from read, in a command's output: the "import" object of its JSON, or lines under its table.
void add_import_json(const LoadedJob& job, nlohmann::json& out);
std::string import_text(const LoadedJob& job);

}  // namespace ftplan::cli

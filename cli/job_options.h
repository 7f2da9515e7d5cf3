// The job options shared by every subcommand (`ftplan memory`, `plan`, `sweep`, `check`, `simulate`):
// a job file (configs/jobs/X.json) and/or flags; a flag the user gives overrides the file. Every
// flag is a row of planner/job_fields.h's table, read through cli/field_flags.h.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cli/field_flags.h"
#include "planner/hardware_spec.h"
#include "planner/model_spec.h"
#include "planner/training_setup.h"

namespace ftplan::cli {

struct JobOptions {
  std::string job_file;
  FieldFlags flags;  // the table's kFtplanFlag rows as typed
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
};

// Reads the job file (if any), applies the flags, loads the model config and the hwdb entry, and
// runs the whole-job checks (validate_job).
LoadedJob load_job(const JobOptions& options);

}  // namespace ftplan::cli

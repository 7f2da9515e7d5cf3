// One options struct per subcommand; add_commands binds them, run_selected calls the chosen one.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/job_options.h"
#include "planner/plan_search.h"

namespace ftplan::cli {

struct MemoryOptions {
  JobOptions job;
};

struct PlanOptions {
  JobOptions job;
  std::string objective = "time";
  std::string output;     // -o plan.json
  bool simulate = false;  // rank the finalists with the simulator
};

struct CheckOptions {
  JobOptions job;
  std::string objective = "time";
  FieldFlags limits;  // --max-hours, --max-cost, --max-memory-fraction
  bool any = false;   // pass when any feasible plan meets the limits
};

struct SweepOptions {
  JobOptions job;
  std::string objective = "time";
  std::string gpu_types;   // comma list of hwdb ids; default all GPUs
  std::string gpu_counts = "1,2,4,8";
  std::string format = "table";  // table | csv | json | markdown | svg (the time-cost frontier)
  bool all = false;        // every candidate, not just each strategy's best
  bool cheapest = false, fastest = false;
  FieldFlags limits;  // --max-hours, --max-cost
};

struct ReportOptions {
  JobOptions job;
  std::string objective = "time";
  std::string output;                  // -o report.html (required)
  std::string gpu_types;               // the frontier's sweep: comma list of hwdb ids; default every GPU
  std::string gpu_counts = "1,2,4,8";  // and GPU counts (the job's own count is added)
};

struct SimulateOptions {
  JobOptions job;
  std::string trace;
};

struct CompareOptions {
  std::string plan;
  std::vector<std::string> runs;  // measured.json, trainer_state.json, torchtune/DeepSpeed logs, CSV, ...
  bool json = false;
  bool force = false;  // compare a run of a different job anyway
  bool ranks = false;  // the runs are ranks of one job: one comparison of the most loaded rank
  std::string framework;  // predict for this profile (default: the run's, else the plan's)
  std::string torchtune_memory_unit = "auto";  // auto | gib | gb
};

struct CalibrateOptions {
  std::vector<std::string> runs;  // measured.json (ftexec), or other stacks' logs with --plan
  std::string output;             // -o FILE: the calibration
  std::string plan;               // --plan: the plan the non-ftexec logs ran
  std::string prior;              // --prior: a calibration to start from (e.g. ftexec calibrate's)
  std::string gpu;                // --gpu: the hwdb id of the device (default: the runs')
  std::string step_time = "logged";  // --step-time logged | min
  bool leave_one_out = false;
  bool force = false;
  bool json = false;
};

struct ValidateOptions {
  std::string suite;   // default configs/validation/published.json
  std::string source;  // only this source's cases
  bool json = false;
};

struct GpusOptions {
  bool json = false;
};

struct ExportCommandOptions {
  std::string plan;          // plan.json from ftplan plan -o (or ftplan plan --json's output)
  std::string to;            // deepspeed | accelerate | axolotl | torchtune | llamafactory | torchrun | slurm
  std::string output;        // -o FILE (default: standard output)
  double time_margin = 0.25; // slurm: time limit = job time x (1 + margin)
};

struct Commands {
  MemoryOptions memory;
  PlanOptions plan;
  CheckOptions check;
  SweepOptions sweep;
  SimulateOptions simulate;
  ReportOptions report;
  CompareOptions compare;
  CalibrateOptions calibrate;
  ValidateOptions validate;
  GpusOptions gpus;
  ExportCommandOptions export_;
};

void add_commands(CLI::App& app, Commands& commands);
int run_selected(CLI::App& app, const Commands& commands);

int run_memory(const MemoryOptions& options);
int run_plan(const PlanOptions& options);
int run_check(const CheckOptions& options);
int run_sweep(const SweepOptions& options);
int run_simulate(const SimulateOptions& options);
int run_report(const ReportOptions& options);
int run_compare(const CompareOptions& options);
int run_validate(const ValidateOptions& options);
int run_calibrate(const CalibrateOptions& options);
int run_gpus(const GpusOptions& options);
int run_export(const ExportCommandOptions& options);

// --gpu-types and --gpu-counts of ftplan sweep and ftplan report, read and checked (InputError
// naming the flag): the GPU types (default every GPU of hwdb/), each checked against the job's
// topology flags, and the counts, each in [1, 65536].
// The GPU types of a sweep; the job's --calibration applies to the type it was made on (the others
// keep their hwdb figures).
std::vector<HardwareSpec> sweep_gpu_types(const std::string& list, const TrainingSetup& setup, const LoadedJob* job = nullptr);
std::vector<int64_t> sweep_gpu_counts(const std::string& list);

// ftplan plan --simulate: re-rank the finalists by their simulated step time.
void rerank_with_simulator(const LoadedJob& job, PlanResult& plan);


}  // namespace ftplan::cli

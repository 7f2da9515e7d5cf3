#include "cli/commands.h"

namespace ftplan::cli {

void add_validate(CLI::App& app, Commands& c) {
  auto* validate = app.add_subcommand("validate", "Predicted vs published measurements: error per case, MAPE per source");
  validate->add_option("--suite", c.validate.suite, "Suite file (default configs/validation/published.json)");
  validate->add_option("--source", c.validate.source, "Only the cases of this source");
  validate->add_flag("--json", c.validate.json, "Print JSON");
}


void add_commands(CLI::App& app, Commands& c) {
  auto* memory = app.add_subcommand("memory", "Per-GPU memory of every strategy, as a breakdown");
  add_job_options(*memory, c.memory.job);

  auto* plan = app.add_subcommand("plan", "Rank every feasible plan by time or cost and explain the choice");
  add_job_options(*plan, c.plan.job);
  plan->add_option("--objective", c.plan.objective, "time | cost");
  plan->add_option("-o,--output", c.plan.output, "Write the recommended plan (for ftexec) to this file");
  plan->add_flag("--simulate", c.plan.simulate, "Rank the finalists with the step simulator");

  auto* check = app.add_subcommand("check", "CI gate: exit 0 if the plan meets every limit, 1 if not, 2 on bad input");
  add_job_options(*check, c.check.job);
  check->add_option("--objective", c.check.objective, "time | cost");
  bind_field_flags(*check, c.check.limits, kCheckFlag);
  check->add_flag("--any", c.check.any, "Pass when any feasible plan meets every limit (default: the recommended plan)");

  auto* sweep = app.add_subcommand("sweep", "What-if: GPU types x counts x strategies x micro-batches x checkpointing");
  add_job_options(*sweep, c.sweep.job);
  sweep->add_option("--objective", c.sweep.objective, "time | cost");
  sweep->add_option("--gpu-types", c.sweep.gpu_types, "Comma list of hwdb ids (default: every GPU)");
  sweep->add_option("--gpu-counts", c.sweep.gpu_counts, "Comma list of GPU counts (default 1,2,4,8)");
  sweep->add_option("--format", c.sweep.format, "table | csv | json | markdown | svg (the time-cost frontier)");
  sweep->add_flag("--all", c.sweep.all, "Every feasible candidate, not only each strategy's best");
  sweep->add_flag("--cheapest", c.sweep.cheapest, "Print only the cheapest plan within the limits");
  sweep->add_flag("--fastest", c.sweep.fastest, "Print only the fastest plan within the limits");
  bind_field_flags(*sweep, c.sweep.limits, kSweepFlag);

  auto* simulate = app.add_subcommand("simulate", "Play one training step as a graph of compute and communication");
  add_job_options(*simulate, c.simulate.job);
  simulate->add_option("--trace", c.simulate.trace, "Write a Chrome trace (Perfetto, chrome://tracing)");

  auto* report = app.add_subcommand("report", "One HTML page to look at: memory of every strategy, time vs cost "
                                              "across GPU types and counts, the simulated step");
  add_job_options(*report, c.report.job);
  report->add_option("-o,--output", c.report.output, "The HTML file to write (self-contained: inline SVG, no script)")
      ->required();
  report->add_option("--objective", c.report.objective, "time | cost")->capture_default_str();
  report->add_option("--gpu-types", c.report.gpu_types, "The frontier's GPU types: comma list of hwdb ids (default: every GPU)");
  report->add_option("--gpu-counts", c.report.gpu_counts, "The frontier's GPU counts; the job's own count is added")
      ->capture_default_str();

  auto* compare = app.add_subcommand("compare", "Predicted vs measured: plan.json beside the runs' logs");
  compare->add_option("plan", c.compare.plan, "Plan file from ftplan plan -o, or a job file (planned here)")->required();
  compare->add_option("runs", c.compare.runs,
                      "Run logs, format read from the content: ftexec's measured.json, HF trainer_state.json, "
                      "torchtune metric log, DeepSpeed or accelerate log, plain CSV/JSON (README: Run logs)")
      ->required();
  compare->add_flag("--json", c.compare.json, "Print JSON");
  add_validate(app, c);
  auto* calibrate = app.add_subcommand("calibrate", "Fit the time model's efficiency parameters from measured runs");
  calibrate->add_option("runs", c.calibrate.runs,
                        "Measured runs: ftexec's measured.json, or any run log compare reads (with --plan)")
      ->required();
  calibrate->add_option("-o,--output", c.calibrate.output, "Write the calibration (for --calibration) to this file");
  calibrate->add_option("--plan", c.calibrate.plan, "The plan the non-ftexec logs ran (their job and layout)");
  calibrate->add_option("--prior", c.calibrate.prior, "Start from this calibration (e.g. from ftexec calibrate) instead of the hwdb's figures");
  calibrate->add_option("--gpu", c.calibrate.gpu, "The hwdb id of the device the runs ran on (default: what the runs say)");
  calibrate->add_flag("--leave-one-out", c.calibrate.leave_one_out,
                      "Also judge the calibration: predict each run from a fit on the others, error before and after");
  calibrate->add_flag("--force", c.calibrate.force, "Use runs whose job differs from --plan's");
  calibrate->add_option("--step-time", c.calibrate.step_time,
                        "logged (the log's figure; ftexec: the median after warm-up) | min (ftexec's fastest step: "
                        "least disturbed by other work on a shared machine)")
      ->capture_default_str();
  calibrate->add_flag("--json", c.calibrate.json, "Print JSON");
  compare->add_flag("--force", c.compare.force, "Compare even when the run differs from the planned job");
  compare->add_flag("--ranks", c.compare.ranks,
                    "The runs are ranks of one job: compare the most loaded rank (default: one comparison per run)");
  compare->add_option("--framework", c.compare.framework,
                      "Predict for this framework profile (default: the run's own, e.g. torchtune; else the plan's)");
  compare->add_option("--torchtune-memory-unit", c.compare.torchtune_memory_unit,
                      "Unit of torchtune's peak_memory_*: gib (since torchtune PR #1348, 2024-08-15), gb (1e9, "
                      "before), auto (what the log says, else gib)")
      ->capture_default_str();

  auto* exp = app.add_subcommand("export", "Write a plan in a training stack's own keys: a DeepSpeed, accelerate, axolotl, "
                                           "torchtune or LLaMA-Factory config, a torchrun or sbatch launch script");
  exp->add_option("plan", c.export_.plan, "Plan file from ftplan plan -o (or ftplan plan --json's output)")->required();
  exp->add_option("--to", c.export_.to, "deepspeed | accelerate | axolotl | torchtune | llamafactory | torchrun | slurm")
      ->required();
  exp->add_option("-o,--output", c.export_.output, "Write to this file (default: standard output)");
  exp->add_option("--time-margin", c.export_.time_margin,
                  "slurm: the time limit is the plan's job time x (1 + margin), [0, 10] fraction")
      ->capture_default_str();

  auto* gpus = app.add_subcommand("gpus", "The GPU catalogue (hwdb/): memory, dense peaks, NVLink domain, host memory, "
                                          "dated rental price");
  gpus->add_flag("--json", c.gpus.json, "Print JSON");
}

int run_selected(CLI::App& app, const Commands& c) {
  if (app.got_subcommand("memory")) return run_memory(c.memory);
  if (app.got_subcommand("plan")) return run_plan(c.plan);
  if (app.got_subcommand("check")) return run_check(c.check);
  if (app.got_subcommand("sweep")) return run_sweep(c.sweep);
  if (app.got_subcommand("simulate")) return run_simulate(c.simulate);
  if (app.got_subcommand("report")) return run_report(c.report);
  if (app.got_subcommand("compare")) return run_compare(c.compare);
  if (app.got_subcommand("validate")) return run_validate(c.validate);
  if (app.got_subcommand("calibrate")) return run_calibrate(c.calibrate);
  if (app.got_subcommand("gpus")) return run_gpus(c.gpus);
  if (app.got_subcommand("export")) return run_export(c.export_);
  return 2;
}

}  // namespace ftplan::cli

#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "planner/errors.h"
#include "planner/job_fields.h"
#include "planner/report.h"
#include "planner/sweep.h"

namespace ftplan::cli {
namespace {

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

std::vector<HardwareSpec> sweep_gpu_types(const std::string& list, const TrainingSetup& setup, const LoadedJob* job) {
  std::vector<HardwareSpec> gpus;
  const std::vector<std::string> ids = list.empty() ? std::vector<std::string>{} : split(list);
  for (const auto& id : ids.empty() ? list_hardware_ids() : ids) {
    HardwareSpec hw = load_hardware(id);
    if (job && job->calibration && job->calibration->device == hw.id) hw = apply_calibration(hw, *job->calibration, job->calibration_path);
    TrainingSetup topology = setup;  // --gpus-per-node applies to every GPU type swept
    topology.nodes.reset();
    if (!hw.pcie_slot.stated()) topology.pcie_slot.reset();  // --pcie-slot: only cards on a PCIe host link
    apply_topology(topology, hw);
    if (hw.kind == "gpu") gpus.push_back(hw);
  }
  return gpus;
}

std::vector<int64_t> sweep_gpu_counts(const std::string& list) {
  std::vector<int64_t> counts;
  for (const auto& c : split(list)) {
    int64_t n = 0;
    try {
      n = std::stoll(c);
    } catch (...) {
      fail_input("--gpu-counts: '" + c + "' is not a number");
    }
    if (n < 1 || n > 65536) fail_input("--gpu-counts: " + c + " must be in [1, 65536]");
    counts.push_back(n);
  }
  if (counts.empty()) fail_input("--gpu-counts: empty");
  return counts;
}

int run_sweep(const SweepOptions& o) {
  if (o.cheapest && o.fastest) fail_input("--cheapest/--fastest: give one, not both");
  if (o.format != "table" && o.format != "csv" && o.format != "json" && o.format != "markdown" && o.format != "svg")
    fail_input("--format: '" + o.format + "' is not one of table, csv, json, markdown, svg");
  JobOptions job_options = o.job;
  const LoadedJob job = load_job(job_options);
  const std::vector<HardwareSpec> gpus = sweep_gpu_types(o.gpu_types, job.setup, &job);
  const std::vector<int64_t> counts = sweep_gpu_counts(o.gpu_counts);
  const SweepLimits limits{o.limits.get_number("--max-hours"), o.limits.get_number("--max-cost")};
  if ((limits.max_hours || limits.max_cost) && job_tokens(job.setup) == 0)
    fail_input("--max-hours/--max-cost: the job has no dataset (give --dataset-rows or --dataset-tokens)");
  Objective objective = parse_objective(o.objective, "--objective");
  if (o.cheapest) objective = Objective::cost;
  if (o.fastest) objective = Objective::time;

  TrainingSetup setup = job.setup;
  std::vector<SweepRow> rows =
      run_sweep(job.model, gpus, counts, setup, objective, o.all, limits);
  if (o.cheapest || o.fastest) rows.resize(std::min<size_t>(rows.size(), 1));
  if (o.format == "csv") std::cout << sweep_csv(rows);
  else if (o.format == "markdown") std::cout << sweep_markdown(rows);
  else if (o.format == "svg") std::cout << frontier_svg(rows);
  else if (o.format == "json" || o.job.json) std::cout << sweep_json(rows).dump(2) << "\n";
  else std::cout << sweep_table(rows) << import_text(job);
  if (job.calibration) {
    const std::string line = "calibrated: " + job.calibration_path + " applied to " + job.calibration->device +
                             " (the other GPU types use their hwdb figures)\n";
    (o.format == "table" && !o.job.json ? std::cout : std::cerr) << line;
  }
  // CSV, Markdown and the JSON list keep their shape: what --from read goes to stderr.
  if (o.format != "table" || o.job.json) std::cerr << import_text(job);
  return (o.cheapest || o.fastest) && rows.empty() ? 1 : 0;
}

}  // namespace ftplan::cli

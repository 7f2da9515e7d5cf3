#include <filesystem>
#include <iostream>

#include "cli/commands.h"
#include "planner/errors.h"
#include "planner/job_fields.h"
#include "planner/output_file.h"
#include "planner/plan_report.h"

namespace ftplan::cli {

int run_plan(const PlanOptions& options) {
  if (!options.output.empty()) check_output_path(options.output, "-o");
  LoadedJob job = load_job(options.job);
  const Objective objective = parse_objective(options.objective, "--objective");
  PlanResult plan = plan_job(job.model, job.hardware, job.setup, objective);
  if (options.simulate) rerank_with_simulator(job, plan);
  if (options.job.json) {
    nlohmann::json j = plan_report_json(job.model, job.hardware, job.setup, plan);
    add_import_json(job, j);
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << plan_report_table(job.model, job.hardware, job.setup, plan) << import_text(job);
  }
  if (!options.output.empty()) {
    if (!plan.recommended) {
      std::cerr << "ftplan: no plan written to " << options.output << ": nothing fits\n";
      return 1;
    }
    // The plan is for ftexec: the checks ftexec makes run before it is written.
    const std::vector<std::string> problems = exec_problems(job.setup, job.model);
    if (!problems.empty()) {
      std::string msg = "-o: ftexec cannot run this plan: ";
      for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
      fail_input(msg);
    }
    // A model given as a path is written absolute, so the plan runs from any folder.
    if (job.setup.model.find('/') != std::string::npos || job.setup.model.find(".json") != std::string::npos)
      job.setup.model = std::filesystem::absolute(job.model_path).lexically_normal().string();
    write_output(options.output,
                 plan_file_json(job.model, job.hardware, job.setup, *plan.recommended).dump(2) + "\n", "-o");
  }
  return 0;
}

}  // namespace ftplan::cli

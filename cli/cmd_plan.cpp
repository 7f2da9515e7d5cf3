#include <iostream>

#include "cli/commands.h"
#include "planner/json_fields.h"
#include "planner/plan_report.h"

namespace ftplan::cli {

int run_plan(const PlanOptions& options) {
  const LoadedJob job = load_job(options.job);
  const Objective objective = parse_objective(options.objective, "--objective");
  PlanResult plan = plan_job(job.model, job.hardware, job.setup, objective);
  if (options.simulate) rerank_with_simulator(job, plan);
  if (options.job.json)
    std::cout << plan_report_json(job.model, job.hardware, job.setup, plan).dump(2) << "\n";
  else
    std::cout << plan_report_table(job.model, job.hardware, job.setup, plan);
  if (!options.output.empty()) {
    if (!plan.recommended) {
      std::cerr << "ftplan: no plan written to " << options.output << ": nothing fits\n";
      return 1;
    }
    write_file_atomically(options.output,
                          plan_file_json(job.model, job.hardware, job.setup, *plan.recommended).dump(2) + "\n");
  }
  return 0;
}

}  // namespace ftplan::cli

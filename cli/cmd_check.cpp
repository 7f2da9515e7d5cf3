#include <iostream>

#include "cli/commands.h"
#include "planner/check.h"
#include "planner/errors.h"

namespace ftplan::cli {

// Exit 0 when the judged plan meets every limit, 1 when it violates one (each named with its
// excess), 2 on bad input. planner/check.h says which plan is judged.
int run_check(const CheckOptions& o) {
  const CheckLimits limits{o.limits.get_number("--max-hours"), o.limits.get_number("--max-cost"),
                           o.limits.get_number("--max-memory-fraction"), o.limits.get_number("--max-host-memory-fraction")};
  const LoadedJob job = load_job(o.job);
  const Objective objective = parse_objective(o.objective, "--objective");
  if ((limits.max_hours || limits.max_cost) && job_tokens(job.setup) == 0)
    fail_input("--max-hours/--max-cost: the job has no dataset (give --dataset-rows or --dataset-tokens)");
  const PlanResult plan = plan_job(job.model, job.hardware, job.setup, objective);
  const CheckResult result = check_plan(plan, job.hardware, job.setup, limits, o.any);
  if (o.job.json) {
    nlohmann::json j = check_json(result, plan, job.hardware, job.setup);
    add_import_json(job, j);
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << check_report(result, plan, job.hardware, job.setup) << import_text(job);
  }
  return result.passed ? 0 : 1;
}

}  // namespace ftplan::cli

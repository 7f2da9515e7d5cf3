#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "planner/errors.h"
#include "planner/format.h"
#include "planner/plan_search.h"

namespace ftplan::cli {

// Exit 0 when the recommended plan meets every limit, 1 when it violates one (each named with its
// excess), 2 on bad input.
int run_check(const CheckOptions& o) {
  const LoadedJob job = load_job(o.job);
  const Objective objective = parse_objective(o.objective, "--objective");
  if (o.max_hours && !(*o.max_hours > 0)) fail_input("--max-hours: must be positive");
  if (o.max_cost && !(*o.max_cost > 0)) fail_input("--max-cost: must be positive");
  if (o.max_memory_fraction && !(*o.max_memory_fraction > 0 && *o.max_memory_fraction <= 1))
    fail_input("--max-memory-fraction: must be in (0, 1]");
  if ((o.max_hours || o.max_cost) && job_tokens(job.setup) == 0)
    fail_input("--max-hours/--max-cost: the job has no dataset (give --dataset-rows or --dataset-tokens)");

  const PlanResult plan = plan_job(job.model, job.hardware, job.setup, objective);
  if (!plan.recommended) {
    std::cout << "FAIL memory: no plan fits " << job.setup.num_gpus << "x " << job.hardware.id << "\n";
    for (const auto& s : plan.strategies) std::cout << "  " << to_string(s.strategy) << ": " << s.verdict << "\n";
    return 1;
  }
  const RankedCandidate& r = *plan.recommended;
  std::ostringstream report;
  int violations = 0;
  auto line = [&](bool ok, const std::string& what, const std::string& detail) {
    report << (ok ? "ok   " : "FAIL ") << what << ": " << detail << "\n";
    violations += ok ? 0 : 1;
  };
  report << "plan: " << to_string(r.candidate.strategy) << " on " << r.gpus_used << "x " << job.hardware.id
         << ", micro-batch " << r.candidate.micro_batch << ", checkpointing " << to_string(r.candidate.checkpointing)
         << "\n";
  if (o.max_hours) {
    const double hours = r.job_time_s / 3600.0;
    line(hours <= *o.max_hours, "time",
         format_fixed(hours, 2) + " h vs limit " + format_fixed(*o.max_hours, 2) + " h" +
             (hours > *o.max_hours ? " (over by " + format_fixed(hours - *o.max_hours, 2) + " h, " +
                                         format_fixed((hours / *o.max_hours - 1) * 100, 1) + "%)"
                                   : ""));
  }
  if (o.max_cost) {
    line(r.cost_usd <= *o.max_cost, "cost",
         format_fixed(r.cost_usd, 2) + " USD vs limit " + format_fixed(*o.max_cost, 2) + " USD" +
             (r.cost_usd > *o.max_cost ? " (over by " + format_fixed(r.cost_usd - *o.max_cost, 2) + " USD)" : ""));
  }
  if (o.max_memory_fraction) {
    const double fraction = r.memory.per_gpu.total / double(job.hardware.memory_bytes);
    line(fraction <= *o.max_memory_fraction, "memory",
         format_fixed(fraction, 3) + " of " + format_gib(job.hardware.memory_bytes) + " vs limit " +
             format_fixed(*o.max_memory_fraction, 3) +
             (fraction > *o.max_memory_fraction
                  ? " (over by " + format_gib(r.memory.per_gpu.total - *o.max_memory_fraction * job.hardware.memory_bytes) + ")"
                  : ""));
  }
  std::cout << report.str() << (violations ? "check failed: " + std::to_string(violations) + " limit(s) violated\n"
                                           : "check passed\n");
  return violations ? 1 : 0;
}

}  // namespace ftplan::cli

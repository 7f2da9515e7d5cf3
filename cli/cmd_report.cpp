#include <algorithm>

#include "cli/commands.h"
#include "planner/errors.h"
#include "planner/output_file.h"
#include "planner/report.h"
#include "simulator/step_report.h"

namespace ftplan::cli {

// ftplan report JOB -o report.html: the plan, a sweep across GPU types and counts, and the
// simulated step of the recommended candidate, as one HTML page.
int run_report(const ReportOptions& o) {
  check_output_path(o.output, "-o");
  if (o.job.json) fail_input("--json: ftplan report writes HTML to -o; ftplan plan --json prints the plan as JSON");
  const LoadedJob job = load_job(o.job);
  const Objective objective = parse_objective(o.objective, "--objective");
  const std::vector<HardwareSpec> gpus = sweep_gpu_types(o.gpu_types, job.setup, &job);
  std::vector<int64_t> counts = sweep_gpu_counts(o.gpu_counts);
  if (std::find(counts.begin(), counts.end(), job.setup.num_gpus) == counts.end()) counts.push_back(job.setup.num_gpus);
  std::sort(counts.begin(), counts.end());

  const PlanResult plan = plan_job(job.model, job.hardware, job.setup, objective);
  const std::vector<SweepRow> rows = run_sweep(job.model, gpus, counts, job.setup, objective, false, {});
  ReportPage page = job_report_page(job.model, job.hardware, job.setup, plan, rows, gpus, counts);
  page.generator = std::string("ftplan ") + FTPLAN_VERSION;

  // The step simulated: the recommended candidate, else (nothing fits) the first layout's smallest.
  const RankedCandidate* chosen = plan.recommended ? &*plan.recommended
                                  : plan.strategies.empty() ? nullptr : &plan.strategies.front().best;
  if (chosen) {
    const PlanContext ctx = prepare_plan(job.model, job.hardware, job.setup, job.setup.num_gpus,
                                         shard_shape(chosen->candidate.parallel));
    page.sections.push_back(sim::step_section(ctx, chosen->candidate));
  } else {
    page.sections.push_back({"step", "The simulated step", html_paragraph("No strategy applies: nothing to simulate.")});
  }
  write_output(o.output, report_page_html(page), "-o");
  return 0;
}

}  // namespace ftplan::cli

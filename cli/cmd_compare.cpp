#include <iostream>

#include "cli/commands.h"
#include "planner/compare_report.h"
#include "planner/errors.h"
#include "planner/json_fields.h"
#include "planner/plan_report.h"
#include "planner/plan_search.h"
#include "planner/run_logs.h"

namespace ftplan::cli {
namespace {

// The plan's prediction beside one run: redone for the run's framework profile when it is not the
// plan's (--framework overrides both).
nlohmann::json compare_one(const nlohmann::json& plan, const RunLog& log, const CompareOptions& o) {
  const std::string planned = plan.contains("job") && plan["job"].is_object() && plan["job"].contains("framework") &&
                                      plan["job"]["framework"].is_string()
                                  ? plan["job"]["framework"].get<std::string>()
                                  : "hf";
  const std::string framework = !o.framework.empty() ? o.framework : log.framework;
  const bool repredicted = !framework.empty() && framework != planned;
  try {
    nlohmann::json c = compare_run_log(repredicted ? plan_for_framework(plan, framework) : plan, log, o.force);
    if (repredicted)
      c["notes"].push_back("predicted for framework " + framework + " (the run's); the plan was made for " + planned);
    c["framework"] = repredicted ? framework : planned;
    return c;
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong type in either file
    const std::string what = e.what();
    fail_input(o.plan + ", " + log.path + ": a field has the wrong type (" + what.substr(what.find(']') + 2) + ")");
  }
}

// PLAN is a plan file (`ftplan plan -o`), or a job file planned here: its recommended candidate,
// written as `plan -o` would, without -o's refusal of what ftexec cannot run (a run of torchtune's
// optimizer in backward or a paged optimizer is compared, not executed).
nlohmann::json load_plan(const std::string& path, std::string& planned_here) {
  nlohmann::json plan = read_json_file(path);
  if (!plan.is_object() || plan.contains("predicted") || !plan.contains("model") || !plan["model"].is_string())
    return plan;
  JobOptions job_options;
  job_options.job_file = path;
  const LoadedJob job = load_job(job_options);
  const PlanResult result = plan_job(job.model, job.hardware, job.setup, Objective::time);
  if (!result.recommended) fail_input(path + ": no plan of this job fits: nothing to compare");
  const RankedCandidate& c = *result.recommended;
  planned_here = "planned here from the job file " + path + ": " + c.candidate.name + ", micro-batch " +
                 std::to_string(c.candidate.micro_batch) + ", checkpointing " + to_string(c.candidate.checkpointing) +
                 " on " + std::to_string(c.gpus_used) + " x " + job.hardware.id;
  return plan_file_json(job.model, job.hardware, job.setup, c);
}

}  // namespace

int run_compare(const CompareOptions& o) {
  std::string planned_here;
  const nlohmann::json plan = load_plan(o.plan, planned_here);
  RunLogOptions read_options;
  read_options.torchtune_memory_unit = o.torchtune_memory_unit;
  std::vector<RunLog> logs;
  for (const auto& path : o.runs) logs.push_back(read_run_log(path, read_options));
  if (o.ranks && logs.size() > 1) logs = {merge_rank_logs(logs)};

  // Every comparison is made (and every refusal raised) before anything is printed.
  std::vector<nlohmann::json> comparisons;
  for (const auto& log : logs) {
    comparisons.push_back(compare_one(plan, log, o));
    if (!planned_here.empty()) comparisons.back()["notes"].push_back(planned_here);
  }
  if (o.json) {
    if (comparisons.size() == 1) {
      std::cout << comparisons[0].dump(2) << "\n";
    } else {
      std::cout << nlohmann::json{{"comparisons", comparisons}}.dump(2) << "\n";
    }
    return 0;
  }
  for (size_t i = 0; i < comparisons.size(); ++i) {
    const auto& c = comparisons[i];
    if (comparisons.size() > 1 || logs[i].format != "ftexec-measured/1")
      std::cout << (i ? "\n" : "") << "run: " << logs[i].path << " (" << logs[i].format << ", framework "
                << c["framework"].get<std::string>() << ")\n";
    std::cout << compare_table(c);
  }
  return 0;
}

}  // namespace ftplan::cli

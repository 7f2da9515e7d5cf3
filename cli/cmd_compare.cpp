#include <iostream>

#include "cli/commands.h"
#include "planner/compare_report.h"
#include "planner/errors.h"
#include "planner/json_fields.h"

namespace ftplan::cli {

int run_compare(const CompareOptions& o) {
  nlohmann::json plan = read_json_file(o.plan);
  const nlohmann::json measured = read_json_file(o.measured);
  // The prediction to hold against the run is for the framework that ran it.
  const std::string planned = plan.contains("job") && plan["job"].is_object() && plan["job"].contains("framework") &&
                                      plan["job"]["framework"].is_string()
                                  ? plan["job"]["framework"].get<std::string>()
                                  : "hf";
  std::string framework = o.framework;
  if (framework.empty() && measured.is_object() && measured.contains("framework") && measured["framework"].is_string())
    framework = measured["framework"].get<std::string>();
  const bool repredicted = !framework.empty() && framework != planned;
  if (repredicted) plan = plan_for_framework(plan, framework);
  try {
    nlohmann::json c = compare_json(plan, measured, o.force);
    if (repredicted)
      c["notes"].push_back("predicted for framework " + framework + " (the run's); the plan was made for " + planned);
    c["framework"] = repredicted ? framework : planned;
    std::cout << (o.json ? c.dump(2) + "\n" : compare_table(c));
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong type in either file
    const std::string what = e.what();
    fail_input(o.plan + ", " + o.measured + ": a field has the wrong type (" + what.substr(what.find(']') + 2) + ")");
  }
  return 0;
}

}  // namespace ftplan::cli

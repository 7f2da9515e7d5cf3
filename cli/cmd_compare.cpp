#include <iostream>

#include "cli/commands.h"
#include "planner/compare_report.h"
#include "planner/errors.h"
#include "planner/json_fields.h"

namespace ftplan::cli {

int run_compare(const CompareOptions& o) {
  const nlohmann::json plan = read_json_file(o.plan);
  const nlohmann::json measured = read_json_file(o.measured);
  try {
    if (o.json)
      std::cout << compare_json(plan, measured, o.force).dump(2) << "\n";
    else
      std::cout << compare_report(plan, measured, o.force);
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong type in either file
    const std::string what = e.what();
    fail_input(o.plan + ", " + o.measured + ": a field has the wrong type (" + what.substr(what.find(']') + 2) + ")");
  }
  return 0;
}

}  // namespace ftplan::cli

#include <cmath>
#include <iostream>

#include "cli/commands.h"
#include "planner/config_export.h"
#include "planner/errors.h"
#include "planner/json_fields.h"
#include "planner/output_file.h"

namespace ftplan::cli {

// ftplan export PLAN --to TARGET [-o FILE]: the plan in the target's keys; a plan the target cannot
// express is bad input naming the target and the key (exit 2). Notes go to stderr.
int run_export(const ExportCommandOptions& o) {
  const ExportTarget target = parse_export_target(o.to, "--to");
  if (!std::isfinite(o.time_margin) || o.time_margin < 0 || o.time_margin > 10)
    fail_input("--time-margin: " + std::to_string(o.time_margin) + " is out of range [0, 10]");
  if (!o.output.empty()) check_output_path(o.output, "-o");
  const ExportPlan plan = export_plan_from_json(read_json_file(o.plan), o.plan);
  ExportOptions options;
  options.time_margin = o.time_margin;
  const ExportResult result = export_plan(plan, target, options);
  if (o.output.empty()) std::cout << result.text;
  else write_output(o.output, result.text, "-o");
  for (const auto& note : result.notes) std::cerr << "ftplan: note: " << note << "\n";
  return 0;
}

}  // namespace ftplan::cli

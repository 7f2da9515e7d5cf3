#include <iostream>

#include "cli/commands.h"
#include "planner/data_paths.h"
#include "planner/json_fields.h"
#include "planner/validation.h"

namespace ftplan::cli {

// Exit 0 when the suite's thresholds are met, 1 when one is exceeded (each named), 2 on bad input.
int run_validate(const ValidateOptions& o) {
  const std::string path = o.suite.empty() ? data_dir() + "/configs/validation/published.json" : o.suite;
  const ValidationReport report = run_validation(read_json_file(path), o.source);
  if (o.json)
    std::cout << validation_json(report).dump(2) << "\n";
  else
    std::cout << validation_table(report);
  return report.passed ? 0 : 1;
}

}  // namespace ftplan::cli

#include <iostream>

#include "cli/commands.h"
#include "planner/memory_report.h"

namespace ftplan::cli {

int run_memory(const MemoryOptions& options) {
  const LoadedJob job = load_job(options.job);
  const MemoryReport report = build_memory_report(job.model, job.hardware, job.setup);
  if (options.job.json) {
    nlohmann::json j = memory_report_json(report);
    add_import_json(job, j);
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << memory_report_table(report) << import_text(job);
  }
  return 0;  // a plan that does not fit is a result, not an error
}

}  // namespace ftplan::cli

#include <iostream>

#include "cli/commands.h"
#include "planner/memory_report.h"

namespace ftplan::cli {

int run_memory(const MemoryOptions& options) {
  const LoadedJob job = load_job(options.job);
  const MemoryReport report = build_memory_report(job.model, job.hardware, job.setup);
  if (options.job.json)
    std::cout << memory_report_json(report).dump(2) << "\n";
  else
    std::cout << memory_report_table(report);
  return 0;  // a plan that does not fit is a result, not an error
}

}  // namespace ftplan::cli

#include <iostream>

#include "cli/commands.h"
#include "planner/gpu_catalogue.h"

namespace ftplan::cli {

// The hwdb catalogue: one row per entry, as a table or JSON.
int run_gpus(const GpusOptions& o) {
  const auto gpus = load_gpu_catalogue();
  if (o.json)
    std::cout << gpu_catalogue_json(gpus).dump(2) << "\n";
  else
    std::cout << gpu_catalogue_table(gpus);
  return 0;
}

}  // namespace ftplan::cli

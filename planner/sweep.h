// What-if analysis: one job over GPU types × GPU counts × strategies × micro-batches ×
// checkpointing; rows rendered as a table, CSV, JSON or Markdown (for a CI job summary).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/plan_search.h"

namespace ftplan {

struct SweepRow {
  std::string gpu;        // hwdb id
  int64_t gpus = 1;       // GPUs in the job
  RankedCandidate result;
};

struct SweepLimits {
  std::optional<double> max_hours, max_cost;
};

// Every (GPU type, count) pair: each strategy's best feasible candidate, or every feasible candidate
// when `all_candidates`, best first by the objective (near-ties to the simpler strategy). Rows
// violating the limits are dropped.
std::vector<SweepRow> run_sweep(const ModelSpec& model, const std::vector<HardwareSpec>& gpus,
                                const std::vector<int64_t>& counts, const TrainingSetup& setup, Objective objective,
                                bool all_candidates, const SweepLimits& limits, int64_t* evaluated = nullptr);

std::string sweep_table(const std::vector<SweepRow>& rows);
std::string sweep_csv(const std::vector<SweepRow>& rows);
std::string sweep_markdown(const std::vector<SweepRow>& rows);
nlohmann::json sweep_json(const std::vector<SweepRow>& rows);

}  // namespace ftplan

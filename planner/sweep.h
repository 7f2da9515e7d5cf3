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

// What the time-cost frontier compares: the whole job's time and cost when the job has a dataset,
// else the time and cost of one million tokens (the same ranking: both scale with the tokens).
struct SweepPoint {
  double time_s = 0;    // job_time_s, or 1e6 / tokens_per_s
  double cost_usd = 0;  // cost_usd, or cost_usd_per_million_tokens
};
bool sweep_has_job(const std::vector<SweepRow>& rows);  // non-empty and every row has job time and cost
SweepPoint sweep_point(const SweepRow& row, bool job);
// The frontier (Pareto set): indices of the rows that no other row beats on both time and cost,
// fastest first. Of rows with the same time and cost, the first (the sweep's rank order) stands for them.
std::vector<size_t> sweep_frontier(const std::vector<SweepRow>& rows);

std::string sweep_table(const std::vector<SweepRow>& rows);
std::string sweep_csv(const std::vector<SweepRow>& rows);
std::string sweep_markdown(const std::vector<SweepRow>& rows);
nlohmann::json sweep_json(const std::vector<SweepRow>& rows);

}  // namespace ftplan

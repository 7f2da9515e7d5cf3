// `ftplan memory`'s report: computed once, printed as a table or JSON.
#pragma once

#include <optional>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/memory_model.h"

namespace ftplan {

struct MemoryReportRow {
  MemoryEstimate estimate;
  int64_t max_micro_batch = 0;  // largest micro-batch that fits with this strategy
  int64_t min_gpus = 0;         // fewest GPUs that fit (0: none up to 4096)
};

struct MemoryReport {
  ModelSpec model;
  HardwareSpec hardware;
  TrainingSetup setup;
  TrainableParams params;
  Candidate candidate;  // micro-batch, checkpointing and attention the rows use
  std::vector<MemoryReportRow> rows;
  std::vector<std::string> assumptions;
};

// The candidate the user's setup names (defaults: micro-batch 1, no checkpointing, fused attention).
// The candidate a job fixes: its --parallel composition, else the preset (`strategy`, else the job's
// --strategy, else single), with its micro-batch, checkpointing, attention and activation offload.
Candidate candidate_from_setup(const TrainingSetup& setup, const HardwareSpec& hw,
                               std::optional<Strategy> strategy = std::nullopt);

MemoryReport build_memory_report(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup);

// memory_per_gpu_bytes: the breakdown at the peak (weights ... overhead, total = the figure fits is
// judged on), the three figures of the step's peak (allocated_peak, reserved_peak, device_peak),
// peak_phase and peak_moment, and phases {load, step, save} with each one's device and host figures.
nlohmann::json memory_breakdown_json(const MemoryEstimate& e);
nlohmann::json model_json(const ModelSpec& model, const TrainableParams& params);
nlohmann::json memory_report_json(const MemoryReport& report);
std::string memory_report_table(const MemoryReport& report);

}  // namespace ftplan

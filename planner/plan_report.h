// `ftplan plan`'s report and the plan file that `ftexec` runs: computed once, printed as a table
// or JSON, written atomically with -o.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "planner/memory_report.h"
#include "planner/plan_search.h"

namespace ftplan {

nlohmann::json ranked_candidate_json(const RankedCandidate& c);
// The memory output's keys plus step_time_s, tokens_per_s, comm_bytes_per_step, job_time_s,
// cost_usd per strategy; `candidates`; `recommended` {strategy, reason, job_time_s, ...}; `job`: the
// recommended job as the plan file holds it (what `ftplan export` reads).
nlohmann::json plan_report_json(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup,
                                const PlanResult& plan);
std::string plan_report_table(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup,
                              const PlanResult& plan);

// The plan file: {"format": "ftplan-plan/1", "job": ..., "candidate": ..., "predicted": ...}; the
// job has the recommended candidate's strategy, micro-batch, checkpointing and attention filled in.
nlohmann::json plan_file_json(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup,
                              const RankedCandidate& chosen);

// Step-time assumptions printed under every plan.
std::vector<std::string> step_assumptions(const PlanContext& context, const TrainingSetup& setup);

}  // namespace ftplan

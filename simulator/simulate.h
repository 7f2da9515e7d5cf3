// One call from StepInputs to a scheduled step, and its summary as JSON (what
// `ftplan simulate --json` prints).
#pragma once

#include <nlohmann/json.hpp>

#include "simulator/op_graph.h"
#include "simulator/scheduler.h"
#include "simulator/step_inputs.h"

namespace ftplan::sim {

struct StepSimulation {
  OpGraph graph;
  Schedule schedule;
};

// build_step_graph (validates; InputError) then schedule_run.
StepSimulation simulate_step(const StepInputs& inputs);

// {"strategy", "simulated_ranks", "represented_ranks", "ops", "step_time_s",
//  "ranks": [{"rank", "step_time_s", "finish_s", "compute_busy_s", "exposed_comm_s",
//             "exposed_host_s", "idle_s", "bubble_fraction", "peak_memory_bytes", "peak_time_s",
//             "alive_at_peak": [{"label", "bytes"}, ... the largest max_alive_listed],
//             "alive_at_peak_other_bytes"}]}
nlohmann::json simulation_summary_json(const StepInputs& inputs, const StepSimulation& sim,
                                       std::size_t max_alive_listed = 16);

}  // namespace ftplan::sim

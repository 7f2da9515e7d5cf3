// One call from StepInputs to a scheduled step, and its summary as JSON (what
// `ftplan simulate --json` prints).
#pragma once

#include <nlohmann/json.hpp>

#include "simulator/op_graph.h"
#include "simulator/scheduler.h"
#include "simulator/step_inputs.h"

namespace ftplan::sim {

// Cost guard: a step's graph grows with micro-batches x layers x simulated ranks (about 1.5 us and
// 450 B per op on this project's CI machine), so a step is simulated in full only up to
// kMaxSimulatedOps ops. Beyond, the step is coarsened: its last two micro-batch counts that fit are
// simulated and every time and memory figure is extrapolated linearly to the real count (step time
// and memory are affine in the micro-batch count for every strategy: DDP/ZeRO/FSDP repeat one
// micro-batch; a GPipe or 1F1B pipeline adds one slot per micro-batch once m >= 2 stages). A job
// whose single micro-batch is already over the limit is refused (InputError).
constexpr int64_t kMaxSimulatedOps = 250000;

struct Coarsening {
  bool applied = false;
  int micro_batches = 0;            // the job's, e.g. 1048576
  int simulated_micro_batches = 0;  // what the graph and trace hold, e.g. 512
  std::string note;                 // one line saying so
};

struct StepSimulation {
  OpGraph graph;
  Schedule schedule;  // coarsened: the simulated graph's timings, with step time and every rank's
                      // totals and peak memory extrapolated to the job's micro-batches
  Coarsening coarsening;
};

// build_step_graph (validates; InputError) then schedule_run, coarsened beyond kMaxSimulatedOps.
StepSimulation simulate_step(const StepInputs& inputs);
// The reference path: every micro-batch simulated, no cost guard (tests compare the two).
StepSimulation simulate_step_exactly(const StepInputs& inputs);

// {"strategy", "simulated_ranks", "represented_ranks", "ops", "step_time_s", "coarsened" (null, or
//  {"micro_batches", "simulated_micro_batches", "note"}),
//  "ranks": [{"rank", "step_time_s", "finish_s", "compute_busy_s", "exposed_comm_s",
//             "exposed_host_s", "idle_s", "bubble_fraction", "peak_memory_bytes", "peak_time_s",
//             "alive_at_peak": [{"label", "bytes"}, ... the largest max_alive_listed],
//             "alive_at_peak_other_bytes"}]}
nlohmann::json simulation_summary_json(const StepInputs& inputs, const StepSimulation& sim,
                                       std::size_t max_alive_listed = 16);

}  // namespace ftplan::sim

#include "simulator/simulate.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "planner/errors.h"
#include "simulator/graph_builders.h"

namespace ftplan::sim {

StepSimulation simulate_step_exactly(const StepInputs& inputs) {
  StepSimulation sim;
  sim.graph = build_step_graph(inputs);
  sim.schedule = schedule_run(sim.graph);
  return sim;
}

namespace {

StepInputs with_micro_batches(StepInputs in, int m) {
  in.micro_batches = m;
  return in;
}

// a + (b - a) * steps: one more figure extrapolated from micro-batch counts m-1 (a) and m (b).
double extend(double a, double b, double steps) { return b + (b - a) * steps; }

}  // namespace

StepSimulation simulate_step(const StepInputs& inputs) {
  validate_step_inputs(inputs);
  const int m = inputs.micro_batches;
  // A micro-batch has at most ~16 ops per layer (forward, recompute, backward, gathers, reductions):
  // refuse before building anything that large.
  auto refuse = [](int64_t ops) {
    fail_input("simulate: one micro-batch of this job has about " + std::to_string(ops) + " ops (limit " +
               std::to_string(kMaxSimulatedOps) + "): too large to simulate; `ftplan plan` gives its closed form");
  };
  if (16 * static_cast<int64_t>(inputs.layers.size()) > kMaxSimulatedOps) refuse(16 * static_cast<int64_t>(inputs.layers.size()));
  // Micro-batches come in groups of q: one, or pp under the interleaved schedule (Megatron runs it on
  // multiples of the stage count).
  const int q = inputs.parallel.schedule == PipelineSchedule::interleaved_1f1b && pipeline_chunks(inputs.parallel) > 1
                    ? std::max(1, inputs.num_gpus)
                    : 1;
  if (m <= 2 * q) return simulate_step_exactly(inputs);
  // Ops of one and two groups give the cost of each further one.
  const int64_t ops1 = static_cast<int64_t>(graph_op_count(build_step_graph(with_micro_batches(inputs, q))));
  if (ops1 > kMaxSimulatedOps) refuse(ops1);
  const int64_t ops2 = static_cast<int64_t>(graph_op_count(build_step_graph(with_micro_batches(inputs, 2 * q))));
  const int64_t per_group = std::max<int64_t>(1, ops2 - ops1);
  const int groups = m / q;
  if (ops1 + (groups - 1) * per_group <= kMaxSimulatedOps) return simulate_step_exactly(inputs);
  // The largest count that fits, at least two full pipeline fills past the warm-up.
  const int fit = q * static_cast<int>(std::min<int64_t>(groups, 1 + (kMaxSimulatedOps - ops1) / per_group));
  const int floor_m = is_pipeline(inputs.parallel) ? std::max(2 * inputs.num_gpus + 1, 3 * q) : 3;
  if (fit < floor_m)
    fail_input("simulate: grad_accum " + std::to_string(m) + " needs about " +
               std::to_string(ops1 + (groups - 1) * per_group) + " ops and not even " + std::to_string(floor_m) +
               " micro-batches fit the limit of " + std::to_string(kMaxSimulatedOps) +
               " ops; `ftplan plan` gives its closed form");
  const StepSimulation before = simulate_step_exactly(with_micro_batches(inputs, fit - q));
  StepSimulation sim = simulate_step_exactly(with_micro_batches(inputs, fit));
  const double steps = static_cast<double>(m - fit) / q;
  Schedule& s = sim.schedule;
  s.step_time_s = extend(before.schedule.step_time_s, s.step_time_s, steps);
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    RankTimeline& t = s.ranks[r];
    const RankTimeline& a = before.schedule.ranks.at(r);
    t.finish_s = extend(a.finish_s, t.finish_s, steps);
    t.compute_busy_s = extend(a.compute_busy_s, t.compute_busy_s, steps);
    t.exposed_comm_s = extend(a.exposed_comm_s, t.exposed_comm_s, steps);
    t.exposed_host_s = extend(a.exposed_host_s, t.exposed_host_s, steps);
    t.idle_s = extend(a.idle_s, t.idle_s, steps);
    t.peak_memory_bytes = static_cast<int64_t>(
        extend(static_cast<double>(a.peak_memory_bytes), static_cast<double>(t.peak_memory_bytes), steps));
  }
  sim.coarsening = {true, m, fit,
                    "coarsened: simulated " + std::to_string(fit) + " of " + std::to_string(m) +
                        " micro-batches (the limit is " + std::to_string(kMaxSimulatedOps) +
                        " ops) and extrapolated step time, per-rank totals and peak memory linearly from " +
                        std::to_string(fit - q) + " and " + std::to_string(fit) +
                        "; the graph and trace hold the simulated micro-batches"};
  return sim;
}

nlohmann::json simulation_summary_json(const StepInputs& inputs, const StepSimulation& sim,
                                       std::size_t max_alive_listed) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const RankTimeline& rt : sim.schedule.ranks) {
    nlohmann::json alive = nlohmann::json::array();
    int64_t other_bytes = 0;
    for (std::size_t i = 0; i < rt.alive_at_peak.size(); ++i) {
      const Allocation& a = sim.graph.allocations[rt.alive_at_peak[i]];
      if (i < max_alive_listed) alive.push_back({{"label", a.label}, {"bytes", a.bytes}});
      else other_bytes += a.bytes;
    }
    ranks.push_back({{"rank", rt.rank},
                     {"step_time_s", sim.schedule.step_time_s},
                     {"finish_s", rt.finish_s},
                     {"compute_busy_s", rt.compute_busy_s},
                     {"exposed_comm_s", rt.exposed_comm_s},
                     {"exposed_host_s", rt.exposed_host_s},
                     {"idle_s", rt.idle_s},
                     {"bubble_fraction", rt.bubble_fraction},
                     {"peak_memory_bytes", rt.peak_memory_bytes},
                     {"peak_time_s", rt.peak_time_s},
                     {"alive_at_peak", std::move(alive)},
                     {"alive_at_peak_other_bytes", other_bytes}});
  }
  return {{"strategy", inputs.name},
          {"parallel", parallelism_json(inputs.parallel)},
          {"simulated_ranks", sim.graph.num_ranks},
          {"represented_ranks", sim.graph.num_ranks_represented},
          {"ops", graph_op_count(sim.graph)},
          {"step_time_s", sim.schedule.step_time_s},
          {"coarsened", sim.coarsening.applied ? nlohmann::json{{"micro_batches", sim.coarsening.micro_batches},
                                                                 {"simulated_micro_batches", sim.coarsening.simulated_micro_batches},
                                                                 {"note", sim.coarsening.note}}
                                               : nlohmann::json(nullptr)},
          {"ranks", std::move(ranks)}};
}

}  // namespace ftplan::sim

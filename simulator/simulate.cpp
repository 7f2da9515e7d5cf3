#include "simulator/simulate.h"

#include "simulator/graph_builders.h"

namespace ftplan::sim {

StepSimulation simulate_step(const StepInputs& inputs) {
  StepSimulation sim;
  sim.graph = build_step_graph(inputs);
  sim.schedule = schedule_run(sim.graph);
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
  return {{"strategy", to_string(inputs.strategy)},
          {"simulated_ranks", sim.graph.num_ranks},
          {"represented_ranks", sim.graph.num_ranks_represented},
          {"ops", graph_op_count(sim.graph)},
          {"step_time_s", sim.schedule.step_time_s},
          {"ranks", std::move(ranks)}};
}

}  // namespace ftplan::sim

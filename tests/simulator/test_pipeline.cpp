// Pipeline schedules and naive model parallel: every stage simulated as its own rank.
#include <catch2/catch.hpp>

#include <algorithm>

#include "simulator/graph_builders.h"
#include "simulator/simulate.h"
#include "sim_fixtures.h"

using namespace ftplan;
using namespace ftplan::sim;
using namespace ftplan::sim::testing;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;

namespace {

// p stages of two identical units each (forward 1 ms, backward 2 ms), communication free.
StepInputs uniform_pipeline(Strategy strategy, int p, int m) {
  StepInputs in;
  set_preset(in, strategy, p);
  in.micro_batches = m;
  for (int i = 0; i < 2 * p; ++i) {
    LayerCost l;
    l.forward_s = 0.001;
    l.backward_input_s = 0.001;
    l.backward_weight_s = 0.001;
    l.param_bytes = l.grad_bytes = 100 * kMiB;
    l.saved_activation_bytes = 50 * kMiB;
    l.checkpoint_bytes = 4 * kMiB;  // sent between stages, in 0 s
    in.layers.push_back(l);
  }
  in.logits_bytes = 1 * kGiB;
  in.static_bytes_per_rank = 10 * kGiB;
  in.optimizer_step_s = 0.0005;  // after the flush: not part of the bubble
  in.p2p_s = [](int64_t) { return 0.0; };
  return in;
}

}  // namespace

TEST_CASE("GPipe and 1F1B bubble = (p-1)/(m+p-1) when communication is free", "[sim]") {
  // Narayanan et al. 2021 (Megatron-LM, §2.2.1): bubble time fraction = (p-1)/m of the ideal time,
  // i.e. (p-1)/(m+p-1) of the step, for GPipe and 1F1B alike with equal stages.
  const Strategy strategy = GENERATE(Strategy::pipeline_gpipe, Strategy::pipeline_1f1b);
  const auto [p, m] = GENERATE(table<int, int>({{2, 1}, {2, 4}, {4, 2}, {4, 4}, {4, 8}, {8, 3}, {8, 32}}));
  CAPTURE(to_string(strategy), p, m);
  const StepSimulation sim = simulate_step(uniform_pipeline(strategy, p, m));
  const double expected = static_cast<double>(p - 1) / (m + p - 1);
  REQUIRE(sim.schedule.ranks.size() == static_cast<std::size_t>(p));
  for (const RankTimeline& r : sim.schedule.ranks) {
    CAPTURE(r.rank);
    CHECK_THAT(r.bubble_fraction, WithinRel(expected, 1e-9));
  }
  // The step: (m + p - 1) slots of forward + backward per stage (2 units × 3 ms), then the optimizer.
  CHECK_THAT(sim.schedule.step_time_s, WithinRel((m + p - 1) * 0.006 + 0.0005, 1e-9));
}

TEST_CASE("1F1B keeps min(p, m) micro-batches of activations on stage 0, GPipe keeps m", "[sim]") {
  const auto [p, m] = GENERATE(table<int, int>({{4, 2}, {4, 4}, {4, 8}, {8, 16}}));
  CAPTURE(p, m);
  const int64_t per_micro_batch = 2 * 50 * kMiB;  // stage 0's two units
  const int64_t static_bytes = 10 * kGiB;

  const StepSimulation gpipe = simulate_step(uniform_pipeline(Strategy::pipeline_gpipe, p, m));
  const StepSimulation one_f_one_b = simulate_step(uniform_pipeline(Strategy::pipeline_1f1b, p, m));
  CHECK(gpipe.schedule.ranks[0].peak_memory_bytes == static_bytes + m * per_micro_batch);
  CHECK(one_f_one_b.schedule.ranks[0].peak_memory_bytes ==
        static_bytes + std::min(p, m) * per_micro_batch);
  // The last stage holds one micro-batch under 1F1B (plus the logits).
  CHECK(one_f_one_b.schedule.ranks[p - 1].peak_memory_bytes == static_bytes + per_micro_batch + 1 * kGiB);
}

TEST_CASE("naive model parallel: one GPU busy at a time", "[sim]") {
  StepInputs in = model_inputs(Strategy::mp, 4, 10, 2);  // 12 units over 4 GPUs, 2 micro-batches
  in.optimizer_step_s = 0.0;  // each rank steps its own optimizer at the end, all at once
  const StepSimulation sim = simulate_step(in);

  // Sum over ranks of the time each is busy (compute, or its own send) = the step: no overlap.
  double busy = 0.0, compute = 0.0;
  for (const RankTimeline& r : sim.schedule.ranks) {
    busy += r.compute_busy_s + r.exposed_comm_s;
    compute += r.compute_busy_s;
  }
  CHECK_THAT(busy, WithinRel(sim.schedule.step_time_s, 1e-12));
  double expected_compute = 0.0;
  for (const LayerCost& l : in.layers) expected_compute += 2 * (l.forward_s + l.backward_input_s + l.backward_weight_s);
  CHECK_THAT(compute, WithinRel(expected_compute, 1e-12));

  // And directly: no two ops of different ranks overlap in time.
  std::vector<std::pair<double, double>> spans;
  for (OpId v = 0; v < graph_op_count(sim.graph); ++v)
    if (sim.schedule.ops[v].end_s > sim.schedule.ops[v].start_s)
      spans.push_back({sim.schedule.ops[v].start_s, sim.schedule.ops[v].end_s});
  std::sort(spans.begin(), spans.end());
  for (std::size_t i = 1; i < spans.size(); ++i) CHECK(spans[i].first >= spans[i - 1].second - 1e-15);
}

TEST_CASE("pipeline stage orders", "[sim]") {
  // 1F1B with p = 4, m = 6 on stage 1: two warm-up forwards, then alternate, then drain.
  std::string order;
  for (const PipelineSlot& s : pipeline_stage_order(PipelineSchedule::one_f_one_b, 1, 4, 6))
    order += (s.forward ? "F" : "B") + std::to_string(s.micro_batch) + " ";
  CHECK(order == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5 ");
  CHECK(stage_layer_bounds(model_inputs(Strategy::pipeline_1f1b, 4, 10, 1)) == std::vector<int>{0, 3, 6, 9, 12});
}

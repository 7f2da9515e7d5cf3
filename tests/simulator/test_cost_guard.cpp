// The simulator's cost guard (hardening issue, item 4): beyond kMaxSimulatedOps the step is
// coarsened and extrapolated; the coarsened figures equal a full simulation (the reference path,
// simulate_step_exactly) where one can still be run, and it says so; a job too large even for one
// micro-batch is refused.
#include <catch2/catch.hpp>

#include "planner/errors.h"
#include "simulator/simulate.h"
#include "tests/simulator/sim_fixtures.h"

using namespace ftplan::sim;
using namespace ftplan::sim::testing;
using Catch::Matchers::Contains;
using Catch::Matchers::WithinRel;

TEST_CASE("a coarsened step equals the full simulation", "[sim][guard]") {
  // Two blocks: ~15-20 ops per micro-batch on one rank (pipelines: over both stages), so these m are over the limit.
  const auto [strategy, gpus, m] = GENERATE(table<ftplan::Strategy, int, int>({
      {ftplan::Strategy::ddp, 4, 40000},
      {ftplan::Strategy::zero3, 4, 20000},
      {ftplan::Strategy::pipeline_1f1b, 2, 40000},
      {ftplan::Strategy::pipeline_gpipe, 2, 40000},
  }));
  CAPTURE(ftplan::to_string(strategy), gpus, m);
  StepInputs in = model_inputs(strategy, gpus, 2, m);
  in.static_bytes_by_rank.clear();
  const StepSimulation coarse = simulate_step(in);
  REQUIRE(coarse.coarsening.applied);
  CHECK(coarse.coarsening.micro_batches == m);
  CHECK(coarse.coarsening.simulated_micro_batches < m);
  CHECK_THAT(coarse.coarsening.note, Contains("coarsened"));
  CHECK(static_cast<int64_t>(graph_op_count(coarse.graph)) <= kMaxSimulatedOps);
  const StepSimulation full = simulate_step_exactly(in);
  CHECK(static_cast<int64_t>(graph_op_count(full.graph)) > kMaxSimulatedOps);
  CHECK_THAT(coarse.schedule.step_time_s, WithinRel(full.schedule.step_time_s, 1e-9));
  REQUIRE(coarse.schedule.ranks.size() == full.schedule.ranks.size());
  for (size_t r = 0; r < full.schedule.ranks.size(); ++r) {
    CAPTURE(r);
    const auto &c = coarse.schedule.ranks[r], &f = full.schedule.ranks[r];
    CHECK(c.peak_memory_bytes == f.peak_memory_bytes);
    CHECK_THAT(c.compute_busy_s, WithinRel(f.compute_busy_s, 1e-9));
    CHECK_THAT(c.exposed_comm_s + 1.0, WithinRel(f.exposed_comm_s + 1.0, 1e-9));
    CHECK_THAT(c.idle_s + 1.0, WithinRel(f.idle_s + 1.0, 1e-9));
  }
}

TEST_CASE("a step below the limit is simulated in full", "[sim][guard]") {
  const StepSimulation s = simulate_step(model_inputs(ftplan::Strategy::fsdp, 8, 4, 16));
  CHECK_FALSE(s.coarsening.applied);
  CHECK(s.coarsening.note.empty());
}

TEST_CASE("a step too large for even one micro-batch is refused, not run", "[sim][guard]") {
  // 20,000 blocks: refused from the layer count before any graph is built.
  CHECK_THROWS_WITH(simulate_step(model_inputs(ftplan::Strategy::ddp, 8, 20000, 1)), Contains("too large to simulate"));
}

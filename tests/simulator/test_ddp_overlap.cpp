// DDP's bucketed all-reduce overlapping the backward.
#include <catch2/catch.hpp>

#include "simulator/graph_builders.h"
#include "simulator/simulate.h"
#include "sim_fixtures.h"

using namespace ftplan;
using namespace ftplan::sim;
using namespace ftplan::sim::testing;
using Catch::Matchers::WithinRel;

namespace {

// Unit 0 (the embedding) has 2 MiB of gradients, units 1..7 have 10 MiB each (72 MiB in all).
StepInputs eight_units() {
  StepInputs in;
  set_preset(in, Strategy::ddp, 8);
  for (int i = 0; i < 8; ++i) {
    LayerCost l;
    l.forward_s = 0.005;
    l.backward_input_s = 0.005;
    l.backward_weight_s = 0.005;  // 10 ms of backward per unit
    l.grad_bytes = l.param_bytes = (i == 0 ? 2 : 10) * kMiB;
    l.saved_activation_bytes = 100 * kMiB;
    in.layers.push_back(l);
  }
  in.optimizer_step_s = 0.002;
  in.all_reduce_s = [](int64_t b) { return linear_comm_s(b, 30e-6, 10e9); };  // 25 MiB: 2.65 ms
  return in;
}

}  // namespace

TEST_CASE("DDP buckets: a 1 MiB first bucket, then 25 MiB, filled from the last unit backwards", "[sim]") {
  // By hand, from unit 7 down: 1 MiB of u7 closes the first bucket; 9 (u7) + 10 (u6) + 6 (u5) = 25;
  // 4 (u5) + 10 (u4) + 10 (u3) + 1 (u2) = 25; 9 (u2) + 10 (u1) + 2 (u0) = 21, closed at the end.
  const std::vector<DdpBucket> plan = ddp_bucket_plan(eight_units());
  REQUIRE(plan.size() == 4);
  CHECK(plan[0].bytes == 1 * kMiB);
  CHECK(plan[0].ready_after_layer == 7);
  CHECK(plan[1].bytes == 25 * kMiB);  // 9 (u7) + 10 (u6) + 6 (u5)
  CHECK(plan[1].ready_after_layer == 5);
  CHECK(plan[2].bytes == 25 * kMiB);  // 4 (u5) + 10 (u4) + 10 (u3) + 1 (u2)
  CHECK(plan[2].ready_after_layer == 2);
  CHECK(plan[3].bytes == 21 * kMiB);  // 9 (u2) + 10 (u1) + 2 (u0): the last bucket
  CHECK(plan[3].ready_after_layer == 0);
}

TEST_CASE("DDP with a long backward hides every all-reduce but the last bucket's", "[sim]") {
  StepInputs in = eight_units();
  const std::vector<DdpBucket> plan = ddp_bucket_plan(in);
  const StepSimulation sim = simulate_step(in);
  const RankTimeline& r = sim.schedule.ranks[0];

  // Each earlier bucket's all-reduce (<= 2.65 ms) runs while at least one more unit's backward
  // (10 ms) is still computing; the last bucket can only start once the embedding's gradient exists.
  const double last_bucket_s = in.all_reduce_s(plan.back().bytes);
  CHECK_THAT(r.exposed_comm_s, WithinRel(last_bucket_s, 1e-12));
  const double compute_s = 8 * 0.015 + in.optimizer_step_s;
  CHECK_THAT(sim.schedule.step_time_s, WithinRel(compute_s + last_bucket_s, 1e-12));

  SECTION("gradient accumulation reduces only on the last micro-batch (no_sync)") {
    in.micro_batches = 4;
    const StepSimulation accum = simulate_step(in);
    std::size_t all_reduces = 0;
    for (OpId v = 0; v < graph_op_count(accum.graph); ++v)
      if (graph_op(accum.graph, v).kind == OpKind::all_reduce) {
        ++all_reduces;
        CHECK(graph_op(accum.graph, v).micro_batch == 3);
      }
    CHECK(all_reduces == plan.size());
    CHECK_THAT(accum.schedule.ranks[0].exposed_comm_s, WithinRel(last_bucket_s, 1e-12));
  }
  SECTION("a short backward cannot hide the buckets") {
    for (LayerCost& l : in.layers) l.backward_input_s = l.backward_weight_s = 0.0001;
    CHECK(simulate_step(in).schedule.ranks[0].exposed_comm_s > 2 * last_bucket_s);
  }
}

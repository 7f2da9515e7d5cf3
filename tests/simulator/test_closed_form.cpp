// With overlap off every op on a rank waits for the previous one, so the simulated step must be the
// closed-form sum of every compute and communication term: the reference path the overlapped
// simulation is compared against (STYLE.md §7).
#include <catch2/catch.hpp>

#include "planner/errors.h"
#include "simulator/graph_builders.h"
#include "simulator/simulate.h"
#include "sim_fixtures.h"

using namespace ftplan;
using namespace ftplan::sim;
using namespace ftplan::sim::testing;
using Catch::Matchers::WithinRel;

namespace {

double compute_per_micro_batch_s(const StepInputs& in) {
  double total = 0.0;
  for (const LayerCost& l : in.layers) {
    total += l.forward_s + l.backward_input_s + l.backward_weight_s;
    if (in.checkpointing && l.checkpointable) total += l.forward_s;  // the recompute
  }
  return total;
}

}  // namespace

TEST_CASE("overlap off: DDP step = compute + every bucket's all-reduce + optimizer", "[sim]") {
  const int m = GENERATE(1, 3);
  const bool checkpointing = GENERATE(false, true);
  CAPTURE(m, checkpointing);
  StepInputs in = model_inputs(Strategy::ddp, 8, 6, m);
  in.overlap = false;
  in.checkpointing = checkpointing;

  // Closed form: m micro-batches of compute; the buckets are reduced once (no_sync before the
  // last micro-batch); then the optimizer.
  double expected = m * compute_per_micro_batch_s(in) + in.optimizer_step_s;
  for (const DdpBucket& bucket : ddp_bucket_plan(in)) expected += in.all_reduce_s(bucket.bytes);

  const StepSimulation sim = simulate_step(in);
  CHECK_THAT(sim.schedule.step_time_s, WithinRel(expected, 1e-12));
  CHECK_THAT(graph_critical_path_s(sim.graph), WithinRel(expected, 1e-12));
  CHECK_THAT(sim.schedule.ranks[0].idle_s, Catch::Matchers::WithinAbs(0.0, 1e-12));
}

TEST_CASE("overlap off: FSDP step = compute + all-gathers + reduce-scatters + optimizer", "[sim]") {
  const int m = GENERATE(1, 2);
  const bool checkpointing = GENERATE(false, true);
  CAPTURE(m, checkpointing);
  StepInputs in = model_inputs(Strategy::fsdp, 64, 5, m);
  in.overlap = false;
  in.checkpointing = checkpointing;

  // Closed form per micro-batch: every unit gathered before its forward and again before its
  // backward, except the last unit, which stays gathered from its forward to its backward (not
  // resharded after forward); every unit's gradient reduce-scattered (no no_sync under FSDP).
  const int units = static_cast<int>(in.layers.size());
  double per_mb = compute_per_micro_batch_s(in);
  for (int i = 0; i < units; ++i) {
    const LayerCost& l = in.layers[i];
    per_mb += in.all_gather_s(l.param_bytes) * (i == units - 1 ? 1 : 2);
    per_mb += in.reduce_scatter_s(l.grad_bytes);
  }
  const double expected = m * per_mb + in.optimizer_step_s;

  const StepSimulation sim = simulate_step(in);
  CHECK_THAT(sim.schedule.step_time_s, WithinRel(expected, 1e-12));
  CHECK_THAT(graph_critical_path_s(sim.graph), WithinRel(expected, 1e-12));
  // With overlap off, every communication second is exposed.
  CHECK_THAT(sim.schedule.ranks[0].exposed_comm_s,
             WithinRel(expected - m * compute_per_micro_batch_s(in) - in.optimizer_step_s, 1e-9));
}

TEST_CASE("every symmetric strategy: overlap off sums all ops, overlap on is no slower", "[sim]") {
  const Strategy strategy = GENERATE(Strategy::single, Strategy::ddp, Strategy::zero1, Strategy::zero2,
                                     Strategy::zero3, Strategy::fsdp, Strategy::fsdp_shard_grad_op,
                                     Strategy::fsdp_hybrid, Strategy::zero2_offload, Strategy::zero3_offload);
  const int m = GENERATE(1, 2);
  CAPTURE(to_string(strategy), m);
  StepInputs in = model_inputs(strategy, strategy == Strategy::single ? 1 : 16, 4, m);
  in.checkpointing = true;

  in.overlap = false;
  const StepSimulation serial = simulate_step(in);
  CHECK_THAT(serial.schedule.step_time_s, WithinRel(graph_total_duration_s(serial.graph), 1e-12));

  in.overlap = true;
  const StepSimulation overlapped = simulate_step(in);
  const RankTimeline& r = overlapped.schedule.ranks[0];
  CHECK(overlapped.schedule.step_time_s <= serial.schedule.step_time_s * (1 + 1e-12));
  CHECK(overlapped.schedule.step_time_s >= graph_critical_path_s(overlapped.graph) * (1 - 1e-12));
  CHECK_THAT(r.compute_busy_s, WithinRel(m * compute_per_micro_batch_s(in) +
                                             (strategy == Strategy::zero2_offload ||
                                                      strategy == Strategy::zero3_offload
                                                  ? 0.0
                                                  : in.optimizer_step_s),
                                         1e-12));
  // The timeline accounts for every second of the step exactly once.
  CHECK_THAT(r.compute_busy_s + r.exposed_comm_s + r.exposed_host_s + r.idle_s,
             WithinRel(overlapped.schedule.step_time_s, 1e-12));
  CHECK(r.peak_memory_bytes >= in.static_bytes_per_rank);
}

TEST_CASE("invalid step inputs are reported together, each naming its field", "[sim]") {
  StepInputs in = model_inputs(Strategy::ddp, 8, 2, 0);
  in.num_gpus = 0;  // the layout says 8 data-parallel ranks, the inputs none
  in.all_reduce_s = nullptr;
  in.layers[1].forward_s = -1.0;
  try {
    simulate_step(in);
    FAIL("expected an InputError");
  } catch (const InputError& e) {
    const std::string message = e.what();
    CHECK_THAT(message, Catch::Matchers::Contains("num_gpus(0)"));
    CHECK_THAT(message, Catch::Matchers::Contains("micro_batches(0)"));
    CHECK_THAT(message, Catch::Matchers::Contains("ddp needs all_reduce_s"));
    CHECK_THAT(message, Catch::Matchers::Contains("layers[1]: durations"));
  }
}

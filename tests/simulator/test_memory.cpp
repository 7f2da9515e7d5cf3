// The simulated peak memory against the closed-form peak: equal where their assumptions coincide
// (no communication buffer alive at the peak), and where they differ, by how much and why.
#include <catch2/catch.hpp>

#include "simulator/simulate.h"
#include "sim_fixtures.h"

using namespace ftplan;
using namespace ftplan::sim;
using namespace ftplan::sim::testing;

namespace {

int64_t sum_saved_bytes(const StepInputs& in) {
  int64_t total = 0;
  for (const LayerCost& l : in.layers)
    total += in.checkpointing && l.checkpointable ? l.checkpoint_bytes : l.saved_activation_bytes;
  return total;
}

}  // namespace

TEST_CASE("peak memory = static + all saved activations + logits when no comm buffer is alive", "[sim]") {
  // single and DDP hold no communication buffer of their own (DDP's buckets are static), so the
  // peak is at the head's backward start: every unit's activations are saved and the logits exist.
  // Gradient accumulation does not raise it: a micro-batch's activations go before the next's.
  const Strategy strategy = GENERATE(Strategy::single, Strategy::ddp);
  const int m = GENERATE(1, 4);
  const bool overlap = GENERATE(true, false);
  CAPTURE(to_string(strategy), m, overlap);
  StepInputs in = model_inputs(strategy, strategy == Strategy::single ? 1 : 8, 6, m);
  in.overlap = overlap;

  const int64_t closed_form = in.static_bytes_per_rank + sum_saved_bytes(in) + in.logits_bytes;
  const StepSimulation sim = simulate_step(in);
  const RankTimeline& r = sim.schedule.ranks[0];
  CHECK(r.peak_memory_bytes == closed_form);
  // What is alive at the peak: static, one saved tensor per unit, the logits.
  CHECK(r.alive_at_peak.size() == in.layers.size() + 2);
  CHECK(sim.graph.allocations[r.alive_at_peak.front()].label.rfind("static", 0) == 0);

  SECTION("full checkpointing keeps only the block inputs (plus the non-checkpointed units)") {
    // Here the forward's end is still the peak: a block's recomputed activations (700 MiB) are
    // smaller than the logits (2 GiB) plus the head's activations (300 MiB), which are gone by then.
    in.checkpointing = true;
    const int64_t closed_form_ckpt = in.static_bytes_per_rank + sum_saved_bytes(in) + in.logits_bytes;
    CHECK(simulate_step(in).schedule.ranks[0].peak_memory_bytes == closed_form_ckpt);
    CHECK(closed_form_ckpt < closed_form);
  }
}

TEST_CASE("FSDP: the backward-prefetched unit is alive beside the logits, one unit above the closed form", "[sim]") {
  // Every unit holds 400 MiB of parameters here, so "one gathered unit" is one number.
  StepInputs in = model_inputs(Strategy::fsdp, 64, 6, 1);
  for (LayerCost& l : in.layers) l.param_bytes = l.grad_bytes = 400 * kMiB;
  const int units = static_cast<int>(in.layers.size());
  // The usual closed form: static shards + all saved activations + logits + the one unit gathered
  // for the computation at hand.
  const int64_t closed_form = in.static_bytes_per_rank + sum_saved_bytes(in) + in.logits_bytes + 400 * kMiB;

  const StepSimulation sim = simulate_step(in);
  const RankTimeline& r = sim.schedule.ranks[0];
  // Why the simulation is higher: the head is not resharded after its forward, and when the head's
  // forward ends FSDP's backward prefetch at once all-gathers the next unit to go backward (the
  // last block) while the head's backward_input still needs the logits. So at that instant two
  // gathered units are alive beside the logits and every saved activation: exactly one gathered
  // unit (400 MiB) above the closed form. A planner that uses the closed form for FSDP must add it.
  CHECK(r.peak_memory_bytes == closed_form + 400 * kMiB);

  // The peak is the head's forward end = its backward_input start.
  OpId head_bwd = kNoOp;
  for (OpId v = 0; v < graph_op_count(sim.graph); ++v)
    if (graph_op(sim.graph, v).kind == OpKind::backward_input && graph_op(sim.graph, v).layer == units - 1)
      head_bwd = v;
  REQUIRE(head_bwd != kNoOp);
  CHECK(r.peak_time_s == sim.schedule.ops[head_bwd].start_s);

  int gathered = 0;
  bool logits = false;
  for (std::size_t a : r.alive_at_peak) {
    const std::string& label = sim.graph.allocations[a].label;
    if (label.rfind("gathered params", 0) == 0) ++gathered;
    if (label.rfind("logits", 0) == 0) logits = true;
  }
  CHECK(gathered == 2);
  CHECK(logits);

  SECTION("without prefetch the closed form holds") {
    // fsdp_prefetch_depth 0: a unit is gathered only once the previous one has finished, so at the
    // head's backward only the head is gathered.
    in.fsdp_prefetch_depth = 0;
    CHECK(simulate_step(in).schedule.ranks[0].peak_memory_bytes == closed_form);
  }
}

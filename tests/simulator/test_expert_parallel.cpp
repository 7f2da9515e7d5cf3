// Expert parallelism in the simulator (simulator/graph_builders.cpp): each MoE block's all-to-all dispatch and
// combine as ops on the expert_comm stream, fed from the planner's own formulas (simulator/plan_inputs.cpp). With
// overlap off the simulation equals the closed form; torchtitan does not overlap them, so every block waits
// for its all-to-alls and the compute stream idles through them.
#include <catch2/catch.hpp>

#include <string>

#include "planner/data_paths.h"
#include "planner/hardware_spec.h"
#include "planner/json_fields.h"
#include "planner/model_spec.h"
#include "planner/step_time.h"
#include "simulator/plan_inputs.h"
#include "simulator/simulate.h"

using namespace ftplan;
using Catch::Matchers::WithinRel;

namespace {

struct MoeJob {
  ModelSpec model;
  HardwareSpec hw;
  TrainingSetup setup;
};

MoeJob moe_job(const std::string& model, Method method) {
  MoeJob j;
  j.model = model_spec_from_json(read_json_file(data_dir() + "/configs/models/" + model + ".json"), model);
  j.hw = load_hardware("h100-sxm");
  j.setup.framework = "torchtitan";
  j.setup.model = model;
  j.setup.method = method;
  j.setup.num_gpus = 8;
  j.setup.seq_len = 2048;
  j.setup.grad_accum = 2;
  j.setup.precision = Precision::mixed;
  if (method != Method::full) j.setup.lora.targets = {"q_proj", "v_proj"};
  return j;
}

}  // namespace

TEST_CASE("closed form equals the simulation with overlap off, under expert parallelism", "[sim][moe]") {
  const std::string model = GENERATE(as<std::string>{}, "qwen3-30b-a3b", "deepseek-v2-lite");
  const std::string text = GENERATE(as<std::string>{}, "dp_shard=8,ep=8", "dp_shard=8,shard=zero2,ep=4", "dp_shard=8,shard=zero1,ep=8");
  const Checkpointing ckpt = GENERATE(Checkpointing::none, Checkpointing::full);
  CAPTURE(model, text, to_string(ckpt));
  const MoeJob j = moe_job(model, Method::lora);
  const Candidate c = layout_candidate(parse_parallelism(text, "--parallel", "fsdp"), 1, ckpt);
  const PlanContext ctx = prepare_plan(j.model, j.hw, j.setup, 8, shard_shape(c.parallel));
  StepOptions no_overlap;
  no_overlap.overlap = false;
  const StepEstimate closed = estimate_step(ctx, c, no_overlap);
  const sim::StepSimulation serial = sim::simulate_step(sim::step_inputs_from_plan(ctx, c, false));
  CHECK_THAT(serial.schedule.step_time_s, WithinRel(closed.step_time_s, 1e-9));
}

TEST_CASE("all-to-all ops: two per MoE block in forward, two in backward, four under recompute; the block waits", "[sim][moe]") {
  const MoeJob j = moe_job("deepseek-v2-lite", Method::lora);  // 26 MoE blocks of 27
  const Checkpointing ckpt = GENERATE(Checkpointing::none, Checkpointing::full);
  const Candidate c = layout_candidate(parse_parallelism("dp_shard=8,ep=8", "--parallel", "fsdp"), 1, ckpt);
  const PlanContext ctx = prepare_plan(j.model, j.hw, j.setup, 8, shard_shape(c.parallel));
  const sim::StepInputs in = sim::step_inputs_from_plan(ctx, c, true);
  const sim::StepSimulation s = sim::simulate_step(in);
  int64_t ops = 0, all_to_alls = 0;
  double a2a_s = 0;
  for (sim::OpId v = 0; v < sim::graph_op_count(s.graph); ++v) {
    const sim::Op& op = sim::graph_op(s.graph, v);
    if (op.kind != sim::OpKind::all_to_all) continue;
    ++ops;
    all_to_alls += op.bytes / in.layers[op.layer].all_to_all_bytes;
    a2a_s += op.duration_s;
    CHECK(op.stream == sim::Stream::expert_comm);
    // Not overlapped (torchtitan): the block's next compute op depends on it.
    bool feeds_compute = false;
    for (auto [e, end] = boost::out_edges(v, *s.graph.graph); e != end; ++e)
      feeds_compute = feeds_compute || sim::graph_op(s.graph, boost::target(*e, *s.graph.graph)).stream == sim::Stream::compute;
    CHECK(feeds_compute);
  }
  const int64_t micro_batches = j.setup.grad_accum;
  CHECK(ops == 2 * 26 * micro_batches);
  CHECK(all_to_alls == (ckpt == Checkpointing::full ? 6 : 4) * 26 * micro_batches);
  // The compute stream idles through every all-to-all.
  CHECK(s.schedule.step_time_s >= s.schedule.ranks[0].compute_busy_s + a2a_s * (1 - 1e-12));
  // Without expert parallelism there are none.
  const Candidate plain = layout_candidate(parse_parallelism("dp_shard=8", "--parallel", "fsdp"), 1, ckpt);
  const PlanContext ctx1 = prepare_plan(j.model, j.hw, j.setup, 8, shard_shape(plain.parallel));
  const sim::StepSimulation s1 = sim::simulate_step(sim::step_inputs_from_plan(ctx1, plain, true));
  for (sim::OpId v = 0; v < sim::graph_op_count(s1.graph); ++v) CHECK(sim::graph_op(s1.graph, v).kind != sim::OpKind::all_to_all);
}

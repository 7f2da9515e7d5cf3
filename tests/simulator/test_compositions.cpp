// Compositions in the simulator: the op graph built from the parallelism description (tensor-parallel
// collectives on the critical path, context-parallel K/V exchanges beside the attention, interleaved
// pipeline schedules, PP x DP gradient synchronisation) against the planner's closed form and
// against schedules worked out by hand.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <tuple>

#include "planner/hardware_spec.h"
#include "planner/model_spec.h"
#include "planner/parallelism.h"
#include "planner/step_time.h"
#include "simulator/chrome_trace.h"
#include "simulator/graph_builders.h"
#include "simulator/plan_inputs.h"
#include "simulator/simulate.h"
#include "sim_fixtures.h"

using namespace ftplan;
using namespace ftplan::sim;
using namespace ftplan::sim::testing;
using Catch::Matchers::WithinRel;

namespace {

TrainingSetup composition_setup(Method method, int64_t gpus, Checkpointing) {
  TrainingSetup s;
  s.framework = "torchtitan";
  s.model = "llama-3-8b";
  s.gpu = "h100-sxm";
  s.method = method;
  s.num_gpus = gpus;
  s.seq_len = 4096;
  s.grad_accum = 2;
  return s;
}

int count_ops(const OpGraph& g, const std::string& label_prefix) {
  int n = 0;
  for (OpId v = 0; v < graph_op_count(g); ++v)
    if (graph_op(g, v).label.rfind(label_prefix, 0) == 0) ++n;
  return n;
}

// p stages, `per_stage` identical blocks each (forward 1 ms, backward 1 + 1 ms), no embedding or head
// cost, communication free unless set.
StepInputs uniform_layout(const std::string& parallel, int per_stage, int m) {
  StepInputs in;
  in.parallel = parse_parallelism(parallel, "test", "zero1");
  in.name = name(in.parallel);
  in.num_gpus = static_cast<int>(in.parallel.pp);
  in.micro_batches = m;
  for (int i = 0; i < per_stage * in.num_gpus; ++i) {
    LayerCost l;
    l.name = "block " + std::to_string(i);
    l.forward_s = 0.001;
    l.backward_input_s = 0.001;
    l.backward_weight_s = 0.001;
    l.param_bytes = l.grad_bytes = 64 * kMiB;
    l.saved_activation_bytes = 50 * kMiB;
    l.checkpoint_bytes = 4 * kMiB;
    in.layers.push_back(l);
  }
  in.static_bytes_per_rank = 10 * kGiB;
  in.optimizer_step_s = 0.0005;
  in.p2p_s = [](int64_t) { return 0.0; };
  in.all_reduce_s = [](int64_t b) { return linear_comm_s(b, 30e-6, 100e9); };
  in.reduce_scatter_s = [](int64_t b) { return linear_comm_s(b, 20e-6, 200e9); };
  in.all_gather_s = [](int64_t b) { return linear_comm_s(b, 20e-6, 200e9); };
  in.replica_all_reduce_s = [](int64_t b) { return linear_comm_s(b / 8, 50e-6, 25e9); };
  return in;
}

}  // namespace

TEST_CASE("overlap off: the simulated step equals the closed form for TP, CP and TP x FSDP", "[sim][bridge][parallel]") {
  const std::string layout = GENERATE(as<std::string>{}, "tp=8", "tp=4,dp_shard=2", "tp=2,sp=1,dp_shard=4",
                                      "tp=2,dp_replicate=4", "tp=4,dp_shard=2,shard=zero2", "tp=2,dp_shard=4,shard=zero1",
                                      "cp=2,dp_shard=4", "cp=4,cp_mode=all_gather,dp_shard=2", "tp=2,cp=2,dp_shard=2",
                                      "tp=4,sp=1,cp=2");
  const Method method = GENERATE(Method::full, Method::lora);
  const Checkpointing ckpt = GENERATE(Checkpointing::none, Checkpointing::full);
  CAPTURE(layout, to_string(method), to_string(ckpt));
  const ModelSpec model = load_model("llama-3-8b");
  const HardwareSpec hw = load_hardware("h100-sxm");
  const TrainingSetup setup = composition_setup(method, 8, ckpt);
  const Parallelism par = parse_parallelism(layout, "test", "fsdp");
  REQUIRE(parallelism_problems(par, model, setup, 8, Attention::fused).empty());
  const PlanContext ctx = prepare_plan(model, hw, setup, 8, shard_shape(par));
  const Candidate c = layout_candidate(par, 1, ckpt, Attention::fused);

  StepOptions no_overlap;
  no_overlap.overlap = false;
  const StepEstimate closed = estimate_step(ctx, c, no_overlap);
  const StepSimulation serial = simulate_step(step_inputs_from_plan(ctx, c, false));
  CHECK_THAT(serial.schedule.step_time_s, WithinRel(closed.step_time_s, 1e-9));

  // Overlap hides only what may be hidden: never slower than serial, never faster than the closed
  // form's compute with the tensor-parallel collectives (on the critical path) and the optimizer.
  const StepSimulation overlapped = simulate_step(step_inputs_from_plan(ctx, c, true));
  CHECK(overlapped.schedule.step_time_s <= serial.schedule.step_time_s * (1 + 1e-12));
  CHECK(overlapped.schedule.step_time_s >= overlapped.schedule.ranks[0].compute_busy_s * (1 - 1e-12));
  // The closed form with overlap agrees with the simulation where both hide the same communication:
  // TP and all-gathered CP are exposed in both, the ring's exposure is max(0, exchange - attention).
  // (With gradients to synchronise, the simulator's one comm stream also queues them behind the TP and
  // CP exchanges, which the closed form's overlap does not: there they may differ.)
  if (par.grad_group() == 1) {
    const StepEstimate with_overlap = estimate_step(ctx, c);
    CHECK_THAT(overlapped.schedule.step_time_s, WithinRel(with_overlap.step_time_s, 1e-9));
  }
}

TEST_CASE("tensor parallelism puts its collectives inside every block, on the critical path", "[sim][parallel]") {
  const ModelSpec model = load_model("llama-3-8b");  // 32 blocks
  const HardwareSpec hw = load_hardware("h100-sxm");
  const bool sp = GENERATE(false, true);
  const Checkpointing ckpt = GENERATE(Checkpointing::none, Checkpointing::full);
  CAPTURE(sp, to_string(ckpt));
  TrainingSetup setup = composition_setup(Method::full, 8, ckpt);
  setup.grad_accum = 1;
  const Parallelism par = parse_parallelism(sp ? "tp=8,sp=1" : "tp=8", "test");
  const PlanContext ctx = prepare_plan(model, hw, setup, 8, shard_shape(par));
  const Candidate c = layout_candidate(par, 1, ckpt, Attention::fused);
  const StepInputs in = step_inputs_from_plan(ctx, c, true);
  const StepSimulation sim = simulate_step(in);
  // Megatron-LM: two exchanges in each block's forward, two in its backward, two more in a recompute;
  // one after the vocabulary-parallel embedding, one in the head's backward.
  const int per_block = 4 + (ckpt == Checkpointing::full ? 2 : 0);
  CHECK(count_ops(sim.graph, "tp ") == 32 * 2 + 2 + (ckpt == Checkpointing::full ? 32 : 0));  // one op per 2 exchanges in a block
  const ShardedLayerComm lc = sharded_layer_comm(ctx, c, 4096);
  double tp_total = 0;
  for (OpId v = 0; v < graph_op_count(sim.graph); ++v)
    if (graph_op(sim.graph, v).label.rfind("tp ", 0) == 0) tp_total += graph_op(sim.graph, v).duration_s;
  CHECK_THAT(tp_total, WithinRel((per_block * 32 + 2) * lc.tp_collective_s, 1e-9));
  // None of it is hidden: the rank's exposed communication is exactly the TP collectives.
  CHECK_THAT(sim.schedule.ranks[0].exposed_comm_s, WithinRel(tp_total, 1e-9));
}

TEST_CASE("context parallelism: the ring hides its K/V exchange behind the attention", "[sim][parallel]") {
  // Hand-made: one block, forward 4 ms of which attention 3 ms, backward_input 8 ms (attention 6 ms).
  StepInputs in;
  in.parallel = parse_parallelism("cp=2", "test");
  in.name = "cp=2";
  in.num_gpus = 2;
  in.micro_batches = 1;
  LayerCost l;
  l.name = "block 0";
  l.forward_s = 0.004;
  l.backward_input_s = 0.008;
  l.attention_forward_s = 0.003;
  in.all_reduce_s = [](int64_t) { return 0.0; };
  const double exchange = GENERATE(0.001, 0.005);  // forward exchange: hidden (1 < 3 ms), or 2 ms exposed
  CAPTURE(exchange);
  l.cp_forward_comm_s = exchange;
  l.cp_backward_comm_s = 2 * exchange;  // K/V and their gradients: hidden behind 6 ms, or 4 ms exposed
  in.layers.push_back(l);
  const StepSimulation ring = simulate_step(in);
  CHECK_THAT(ring.schedule.step_time_s, WithinRel(0.012 + std::max(0.0, exchange - 0.003) + std::max(0.0, 2 * exchange - 0.006), 1e-9));
  in.parallel.cp_mode = ContextParallel::all_gather;  // gathered before the op: all exposed
  const StepSimulation gathered = simulate_step(in);
  CHECK_THAT(gathered.schedule.step_time_s, WithinRel(0.012 + 3 * exchange, 1e-9));
}

TEST_CASE("interleaved 1F1B: the bubble shrinks v-fold (Narayanan et al. 2021)", "[sim][parallel][pipeline]") {
  // Sec. 2.2.2: with v chunks per stage the pipeline flush costs (p-1)·t/v instead of (p-1)·t, t being
  // one micro-batch's forward and backward on a stage; m micro-batches take m·t of work.
  const auto [p, v, m] = GENERATE(table<int, int, int>({{2, 2, 4}, {4, 2, 4}, {4, 2, 8}, {4, 4, 8}, {8, 2, 16}}));
  CAPTURE(p, v, m);
  const std::string layout = "pp=" + std::to_string(p) + ",virtual_stages=" + std::to_string(v);
  StepInputs in = uniform_layout(layout, 2 * v, m);  // two blocks per chunk
  const double t = 2 * v * 0.003;                     // a stage: 2v blocks of 1 + 1 + 1 ms
  const StepSimulation sim = simulate_step(in);
  CHECK_THAT(sim.schedule.step_time_s - in.optimizer_step_s, WithinRel(m * t + (p - 1) * t / v, 1e-9));
  for (const RankTimeline& r : sim.schedule.ranks) {
    CAPTURE(r.rank);
    CHECK_THAT(r.bubble_fraction, WithinRel(double(p - 1) / (v * m + p - 1), 1e-9));
  }
  // The same layers without interleaving: the flush is v times longer.
  StepInputs plain = uniform_layout("pp=" + std::to_string(p), 2 * v, m);
  CHECK_THAT(simulate_step(plain).schedule.step_time_s - in.optimizer_step_s, WithinRel(m * t + (p - 1) * t, 1e-9));
}

TEST_CASE("interleaved stage order follows Megatron-LM's schedule", "[sim][parallel][pipeline]") {
  // p = 2, v = 2, m = 4: stage 0 warms up with (p-1)·2 + (v-1)·p = 4 forwards: micro-batches 0, 1 of
  // chunk 0, then 0, 1 of chunk 1; then 1F1B; the backwards run chunk 1 before chunk 0.
  const auto order = pipeline_stage_order(PipelineSchedule::interleaved_1f1b, 0, 2, 4, 2);
  REQUIRE(order.size() == 16);
  const std::vector<std::tuple<int, bool, int>> first6 = {{0, true, 0}, {1, true, 0}, {0, true, 1}, {1, true, 1},
                                                          {2, true, 0}, {0, false, 1}};
  for (std::size_t i = 0; i < first6.size(); ++i) {
    CAPTURE(i);
    CHECK(order[i].micro_batch == std::get<0>(first6[i]));
    CHECK(order[i].forward == std::get<1>(first6[i]));
    CHECK(order[i].chunk == std::get<2>(first6[i]));
  }
  // Every (micro-batch, chunk) runs forward once and backward once.
  int forwards = 0, backwards = 0;
  for (const auto& s : order) (s.forward ? forwards : backwards) += 1;
  CHECK(forwards == 8);
  CHECK(backwards == 8);
}

TEST_CASE("overlap off: PP x DP = the pipeline, then the first stage's gradient sync, then the step", "[sim][parallel][pipeline]") {
  // p = 4 stages of 2 blocks, m = 4: the pipeline takes (m + p - 1)·t; stage 0 finishes its last
  // backward last and then synchronises its two blocks' gradients (DDP: all-reduce; ZeRO-1: reduce-
  // scatter, and after the step the updated parameters' all-gather).
  const std::string layout = GENERATE(as<std::string>{}, "pp=4,dp_replicate=2", "pp=4,dp_shard=2,shard=zero1");
  CAPTURE(layout);
  StepInputs in = uniform_layout(layout, 2, 4);
  in.overlap = false;
  const double t = 2 * 0.003;
  const double pipeline = (4 + 4 - 1) * t;
  const int64_t g = 64 * kMiB;
  const bool ddp = layout.find("zero1") == std::string::npos;
  const double sync = ddp ? 2 * in.all_reduce_s(g) : 2 * in.reduce_scatter_s(g);
  const double after = ddp ? 0.0 : 2 * in.all_gather_s(g);
  const StepSimulation sim = simulate_step(in);
  CHECK_THAT(sim.schedule.step_time_s, WithinRel(pipeline + sync + in.optimizer_step_s + after, 1e-9));
  CHECK(count_ops(sim.graph, ddp ? "all-reduce grads" : "reduce-scatter grads") == 8);  // every block once
}

TEST_CASE("PP x DP on a shipped model: the simulation is within the stage imbalance of the closed form", "[sim][bridge][parallel]") {
  // The closed form splits the model's work evenly over the stages; the simulator places the
  // embedding on the first stage and the head (a 128k-vocabulary matmul) on the last, so its
  // step is longer by at most the head's share of a stage per slot.
  const ModelSpec model = load_model("llama-3-8b");
  const HardwareSpec hw = load_hardware("h100-sxm");
  TrainingSetup setup = composition_setup(Method::full, 8, Checkpointing::none);
  setup.grad_accum = 8;
  const Parallelism par = parse_parallelism(GENERATE(as<std::string>{}, "pp=4,dp_replicate=2", "pp=2,dp_shard=4,shard=zero1",
                                                     "pp=4,virtual_stages=2,dp_replicate=2"),
                                            "test", "fsdp");
  CAPTURE(to_string(par));
  REQUIRE(parallelism_problems(par, model, setup, 8, Attention::fused).empty());
  const PlanContext ctx = prepare_plan(model, hw, setup, 8, shard_shape(par));
  const Candidate c = layout_candidate(par, 1, Checkpointing::none, Attention::fused);
  StepOptions no_overlap;
  no_overlap.overlap = false;
  const StepEstimate closed = estimate_step(ctx, c, no_overlap);
  const StepSimulation serial = simulate_step(step_inputs_from_plan(ctx, c, false));
  CHECK(serial.schedule.step_time_s >= closed.step_time_s * (1 - 1e-9));
  CHECK(serial.schedule.step_time_s <= closed.step_time_s * 1.15);
}

TEST_CASE("a small job's trace holds every rank; a large one each class once", "[sim][trace][parallel]") {
  const ModelSpec model = load_model("llama-3-8b");
  const HardwareSpec hw = load_hardware("h100-sxm");
  TrainingSetup setup = composition_setup(Method::lora, 8, Checkpointing::none);
  setup.grad_accum = 4;
  const Parallelism par = parse_parallelism("tp=2,pp=2,dp_replicate=2", "test");
  const PlanContext ctx = prepare_plan(model, hw, setup, 8, shard_shape(par));
  const Candidate c = layout_candidate(par, 1, Checkpointing::none, Attention::fused);
  const StepSimulation sim = simulate_step(step_inputs_from_plan(ctx, c, true));
  CHECK(sim.graph.num_ranks == 2);  // one class per stage
  const nlohmann::json trace = chrome_trace_json(sim.graph, sim.schedule, par);
  std::vector<int> events(8, 0), head(8, 0);
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    ++events.at(e["pid"].get<int>());
    if (e["name"].get<std::string>().find("head+loss") != std::string::npos) ++head.at(e["pid"].get<int>());
  }
  // Ranks are numbered tp fastest, then dp_replicate, then pp: ranks 0-3 are stage 0, 4-7 stage 1,
  // each with its stage's events.
  for (int r = 0; r < 8; ++r) {
    CAPTURE(r);
    CHECK(events[r] == events[r < 4 ? 0 : 4]);
    CHECK(events[r] > 0);
  }
  for (int r = 0; r < 8; ++r) CHECK((head[r] > 0) == (r >= 4));  // the head is on the last stage
  // Above the limit, each class once.
  const nlohmann::json small = chrome_trace_json(sim.graph, sim.schedule, par, 4);
  std::set<int> pids;
  for (const auto& e : small["traceEvents"]) pids.insert(e["pid"].get<int>());
  CHECK(pids.size() == 2);
}

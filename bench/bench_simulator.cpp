// Step simulator speed. Goals (issue 4): one step of a Llama-3.1-70B-like model with FSDP on 64
// GPUs in < 50 ms; a 32-layer model with DDP on 8 GPUs in < 1 ms. Inputs are hand-made round
// numbers of the right size (not the planner's figures yet): what matters is the op count.
//   build-sim/bench/bench_simulator [--benchmark_filter=fsdp]
#include <benchmark/benchmark.h>

#include "planner/json_fields.h"
#include "simulator/plan_inputs.h"

#include <cstdint>
#include <string>

#include "simulator/chrome_trace.h"
#include "simulator/graph_builders.h"
#include "simulator/scheduler.h"
#include "simulator/simulate.h"

namespace {

using namespace ftplan;
using namespace ftplan::sim;

// A Llama-like model: `blocks` decoder blocks of `block_params` parameters, embedding and head of
// vocab × hidden each, bf16, one micro-batch of `tokens` tokens at `flops_per_s` sustained.
StepInputs llama_like(Strategy strategy, int num_gpus, int blocks, double block_params,
                      double embedding_params, int64_t tokens, int64_t hidden, int micro_batches) {
  constexpr double flops_per_s = 400e12;  // H100 bf16 dense at ~40% of peak
  constexpr double link_bytes_per_s = 40e9;
  StepInputs in;
  set_preset(in, strategy, num_gpus);
  in.micro_batches = micro_batches;
  auto unit = [&](const std::string& name, double params, bool checkpointable) {
    LayerCost l;
    l.name = name;
    l.forward_s = 2.0 * params * tokens / flops_per_s;  // 2·N·T (Kaplan et al. 2020, §2.1)
    l.backward_input_s = l.forward_s;
    l.backward_weight_s = l.forward_s;
    l.param_bytes = l.grad_bytes = static_cast<int64_t>(2 * params);
    l.saved_activation_bytes = 34 * tokens * hidden;  // Korthikanti et al. 2022, without the s·a term
    l.checkpoint_bytes = 2 * tokens * hidden;
    l.checkpointable = checkpointable;
    return l;
  };
  in.layers.push_back(unit("embedding", embedding_params, false));
  for (int i = 0; i < blocks; ++i) in.layers.push_back(unit("block " + std::to_string(i), block_params, true));
  in.layers.push_back(unit("head+loss", embedding_params, false));
  in.logits_bytes = tokens * 128256 * 4;
  in.static_bytes_per_rank = static_cast<int64_t>(16.0 * (blocks * block_params + 2 * embedding_params) /
                                                  (strategy == Strategy::ddp ? 1 : num_gpus));
  in.optimizer_step_s = 0.01;
  const double n = num_gpus;
  auto ring = [=](double factor) {  // factor·(N-1)/N·bytes/bw + latency
    return [=](int64_t bytes) { return 20e-6 + factor * (n - 1) / n * static_cast<double>(bytes) / link_bytes_per_s; };
  };
  in.all_reduce_s = ring(2.0);
  in.reduce_scatter_s = ring(1.0);
  in.all_gather_s = ring(1.0);
  in.replica_all_reduce_s = ring(2.0 / 8);
  in.p2p_s = [](int64_t bytes) { return 10e-6 + static_cast<double>(bytes) / 40e9; };
  in.host_copy_s = [](int64_t bytes) { return 10e-6 + static_cast<double>(bytes) / 25e9; };
  return in;
}

StepInputs llama70b_fsdp(int micro_batches) {
  return llama_like(Strategy::fsdp, 64, 80, 0.856e9, 1.05e9, 4096, 8192, micro_batches);
}

StepInputs llama8b_ddp(int micro_batches) {
  return llama_like(Strategy::ddp, 8, 32, 0.218e9, 0.525e9, 4096, 4096, micro_batches);
}

void report(benchmark::State& state, const StepInputs& in) {
  const StepSimulation sim = simulate_step(in);
  state.counters["ops"] = static_cast<double>(graph_op_count(sim.graph));
  state.counters["step_s"] = sim.schedule.step_time_s;
  state.counters["peak_GiB"] = static_cast<double>(sim.schedule.ranks[0].peak_memory_bytes) / (1 << 30);
}

void BM_simulate(benchmark::State& state, StepInputs in) {
  for (auto _ : state) {
    StepSimulation sim = simulate_step(in);
    benchmark::DoNotOptimize(sim.schedule.step_time_s);
  }
  report(state, in);
}

void BM_build_only(benchmark::State& state, StepInputs in) {
  for (auto _ : state) {
    OpGraph g = build_step_graph(in);
    benchmark::DoNotOptimize(g.num_ranks);
  }
}

void BM_schedule_only(benchmark::State& state, StepInputs in) {
  const OpGraph g = build_step_graph(in);
  for (auto _ : state) {
    Schedule s = schedule_run(g);
    benchmark::DoNotOptimize(s.step_time_s);
  }
}

void BM_trace_json(benchmark::State& state, StepInputs in) {
  const StepSimulation sim = simulate_step(in);
  for (auto _ : state) {
    std::string text = chrome_trace_json(sim.graph, sim.schedule).dump();
    benchmark::DoNotOptimize(text.data());
  }
}

StepInputs pipeline_80(Strategy s) {
  StepInputs in = llama_like(s, 8, 80, 0.856e9, 1.05e9, 4096, 8192, 32);
  in.static_bytes_per_rank /= 8;
  return in;
}

}  // namespace

// Goal: < 50 ms.
BENCHMARK_CAPTURE(BM_simulate, fsdp_llama70b_64gpu_m1, llama70b_fsdp(1))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_simulate, fsdp_llama70b_64gpu_m8, llama70b_fsdp(8))->Unit(benchmark::kMillisecond);
// Goal: < 1 ms.
BENCHMARK_CAPTURE(BM_simulate, ddp_32layer_8gpu_m1, llama8b_ddp(1))->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_simulate, ddp_32layer_8gpu_m4, llama8b_ddp(4))->Unit(benchmark::kMicrosecond);
// Where the time goes.
BENCHMARK_CAPTURE(BM_build_only, ddp_32layer_8gpu_m1, llama8b_ddp(1))->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_schedule_only, ddp_32layer_8gpu_m1, llama8b_ddp(1))->Unit(benchmark::kMicrosecond);
// Every rank simulated: 80 layers, 8 stages, 32 micro-batches.
BENCHMARK_CAPTURE(BM_simulate, pipeline_1f1b_80layer_p8_m32, pipeline_80(Strategy::pipeline_1f1b))
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_trace_json, fsdp_llama70b_64gpu_m1, llama70b_fsdp(1))->Unit(benchmark::kMillisecond);

// The same goals on the planner's own inputs (simulator/plan_inputs.h) for shipped models: the
// whole path `ftplan simulate` takes, preparation included.
void BM_simulate_from_plan(benchmark::State& state, std::string model_name, std::string gpu, int64_t gpus,
                           ftplan::Method method, Strategy strategy) {
  using namespace ftplan;
  const ModelSpec model = model_spec_from_json(
      read_json_file(std::string(FTPLAN_SOURCE_DIR) + "/configs/models/" + model_name + ".json"), model_name);
  const HardwareSpec hw = load_hardware(std::string(FTPLAN_SOURCE_DIR) + "/hwdb/" + gpu + ".json");
  TrainingSetup setup;
  setup.model = model_name;
  setup.gpu = gpu;
  setup.num_gpus = gpus;
  setup.method = method;
  setup.seq_len = 4096;
  for (auto _ : state) {
    const PlanContext ctx = prepare_plan(model, hw, setup, gpus);
    auto s = simulate_step(step_inputs_from_plan(ctx, preset_candidate(strategy, gpus, hw, 1, Checkpointing::full, Attention::fused)));
    benchmark::DoNotOptimize(s.schedule.step_time_s);
  }
}
BENCHMARK_CAPTURE(BM_simulate_from_plan, llama31_70b_fsdp_64xh100, "llama-3.1-70b", "h100-sxm", 64,
                  ftplan::Method::full, Strategy::fsdp)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_simulate_from_plan, llama3_8b_ddp_8xa100, "llama-3-8b", "a100-80gb-sxm", 8,
                  ftplan::Method::full, Strategy::ddp)
    ->Unit(benchmark::kMicrosecond);

// Issue 12's goal: one step of a 1,024-GPU TP8 x PP8 x DP16 job (Llama-3.1-70B full fine-tuning,
// 8,192 tokens, 32 micro-batches, 1F1B; data parallelism sharded FSDP-style) simulated in under
// 100 ms: the simulator plays one rank per pipeline stage (8 classes), the TP and DP ranks of a
// stage doing the same work. Plan preparation included.
void BM_simulate_composition(benchmark::State& state, std::string layout) {
  using namespace ftplan;
  const ModelSpec model = model_spec_from_json(
      read_json_file(std::string(FTPLAN_SOURCE_DIR) + "/configs/models/llama-3.1-70b.json"), "llama-3.1-70b");
  const HardwareSpec hw = load_hardware(std::string(FTPLAN_SOURCE_DIR) + "/hwdb/h100-sxm.json");
  TrainingSetup setup;
  setup.model = "llama-3.1-70b";
  setup.gpu = "h100-sxm";
  setup.framework = "torchtitan";
  setup.method = Method::full;
  setup.seq_len = 8192;
  setup.grad_accum = 32;
  const Parallelism par = parse_parallelism(layout, "bench", "fsdp");
  setup.num_gpus = par.gpus();
  size_t ops = 0;
  for (auto _ : state) {
    const PlanContext ctx = prepare_plan(model, hw, setup, setup.num_gpus, shard_shape(par));
    auto s = simulate_step(step_inputs_from_plan(ctx, layout_candidate(par, 1, Checkpointing::full, Attention::fused)));
    ops = graph_op_count(s.graph);
    benchmark::DoNotOptimize(s.schedule.step_time_s);
  }
  state.counters["ops"] = static_cast<double>(ops);
}
BENCHMARK_CAPTURE(BM_simulate_composition, tp8_pp8_dp16_1024xh100, "tp=8,pp=8,dp_shard=16")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_simulate_composition, tp8_pp8_interleaved2_dp16_1024xh100,
                  "tp=8,pp=8,virtual_stages=2,dp_shard=16")->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();

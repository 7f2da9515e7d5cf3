// Planner throughput: candidate evaluations per second (memory + step time + job cost), the inner
// loop of `ftplan plan` and `ftplan sweep`. Goal: >= 1,000,000 per second on one core, so a sweep
// of 400,000 candidates (Calculon's size for 8 GPUs) takes under a second.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "planner/allocator_replay.h"
#include "planner/data_paths.h"
#include "planner/json_fields.h"
#include "planner/memory_model.h"
#include "planner/plan_search.h"
#include "planner/sweep.h"

namespace {

using namespace ftplan;

struct Fixture {
  ModelSpec model;
  HardwareSpec hw;
  TrainingSetup setup;
  Fixture() {
    model = load_model("llama-3-8b");
    hw = load_hardware("a100-80gb-sxm");
    setup.model = "llama-3-8b";
    setup.gpu = hw.id;
    setup.num_gpus = 8;
    setup.method = Method::lora;
    setup.seq_len = 2048;
    setup.dataset.rows = 100000;
  }
};

void BM_EvaluateCandidate(benchmark::State& state) {
  Fixture f;
  const PlanContext ctx = prepare_plan(f.model, f.hw, f.setup, f.setup.num_gpus);
  std::vector<Candidate> candidates;
  for (Strategy s : all_strategies())
    for (int64_t b : {1, 2, 4, 8, 16, 32, 64})
      for (Checkpointing c : {Checkpointing::none, Checkpointing::full}) candidates.push_back(preset_candidate(s, f.setup.num_gpus, f.hw, b, c, Attention::fused));
  size_t i = 0;
  double sink = 0;
  for (auto _ : state) {
    RankedCandidate r = evaluate_candidate(ctx, candidates[i], Objective::time);
    sink += r.score;
    i = (i + 1) % candidates.size();
  }
  benchmark::DoNotOptimize(sink);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_EvaluateCandidate);

// A whole sweep: 13 GPU types × counts 1..N × strategies × micro-batches × checkpointing.
void BM_Sweep(benchmark::State& state) {
  Fixture f;
  std::vector<HardwareSpec> gpus;
  for (const auto& id : list_hardware_ids()) {
    HardwareSpec hw = load_hardware(id);
    if (hw.kind == "gpu") gpus.push_back(hw);
  }
  std::vector<int64_t> counts;
  for (int64_t n = 1; n <= state.range(0); ++n) counts.push_back(n);
  int64_t evaluated = 0;
  for (auto _ : state) {
    evaluated = 0;
    auto rows = run_sweep(f.model, gpus, counts, f.setup, Objective::time, false, {}, &evaluated);
    benchmark::DoNotOptimize(rows);
  }
  state.counters["candidates"] = static_cast<double>(evaluated);
  state.SetItemsProcessed(state.iterations() * evaluated);
}
// Arg 200: ~400,000 candidates, the size Calculon searches for 8 GPUs.
BENCHMARK(BM_Sweep)->Arg(8)->Arg(64)->Arg(200)->Unit(benchmark::kMillisecond);

// Issue 12's goal: a full search for Llama-3.1-70B full fine-tuning at 8,192 tokens over 1 to 1,024
// H100s (every count; every preset and every composition torchtitan can run: tp x sp x cp x pp with
// its schedules x the data-parallel rest, x micro-batches x checkpointing x attention) in under 1 s on
// one core, at >= 1,000,000 candidate evaluations per second.
// Llama-3.1-70B full fine-tuning at 8,192 tokens under torchtitan (every dimension on offer).
TrainingSetup llama70b_full_setup(int64_t gpus) {
  TrainingSetup setup;
  setup.model = "llama-3.1-70b";
  setup.framework = "torchtitan";
  setup.method = Method::full;
  setup.seq_len = 8192;
  setup.grad_accum = 16;
  setup.num_gpus = gpus;
  setup.dataset.rows = 100000;
  return setup;
}

void BM_Search70BFullOver1To1024H100(benchmark::State& state) {
  const ModelSpec model = load_model("llama-3.1-70b");
  const HardwareSpec hw = load_hardware("h100-sxm");
  const TrainingSetup setup = llama70b_full_setup(1);
  std::vector<int64_t> counts;
  for (int64_t n = 1; n <= state.range(0); ++n) counts.push_back(n);
  int64_t evaluated = 0;
  size_t rows_found = 0;
  for (auto _ : state) {
    evaluated = 0;
    auto rows = run_sweep(model, {hw}, counts, setup, Objective::time, false, {}, &evaluated);
    rows_found = rows.size();
    benchmark::DoNotOptimize(rows);
  }
  state.counters["candidates"] = static_cast<double>(evaluated);
  state.counters["feasible_layouts"] = static_cast<double>(rows_found);
  state.SetItemsProcessed(state.iterations() * evaluated);
}
BENCHMARK(BM_Search70BFullOver1To1024H100)->Arg(1024)->Unit(benchmark::kMillisecond);

// `ftplan plan`'s own search (early pruning: a layout stops at its first micro-batch that does not fit)
// for the same job on 32 H100s (4 nodes of 8).
void BM_Plan70BFull32H100(benchmark::State& state) {
  const ModelSpec model = load_model("llama-3.1-70b");
  const HardwareSpec hw = load_hardware("h100-sxm");
  const TrainingSetup setup = llama70b_full_setup(32);
  int64_t evaluated = 0;
  for (auto _ : state) {
    const PlanResult plan = plan_job(model, hw, setup, Objective::time);
    evaluated = plan.evaluated;
    benchmark::DoNotOptimize(plan.recommended);
  }
  state.counters["candidates"] = static_cast<double>(evaluated);
  state.SetItemsProcessed(state.iterations() * evaluated);
}
BENCHMARK(BM_Plan70BFull32H100)->Unit(benchmark::kMillisecond);

// The caching allocator's replay (planner/allocator_replay.h): one replay of Liger's Qwen2-7B batch-32 step
// (Hugging Face FSDP-1 on 4 A100s, full checkpointing, 3 steps), and a sweep of that job over every GPU type
// on 8 GPUs, where every fitting FSDP-1 candidate with full checkpointing is replayed.
TrainingSetup qwen2_full_fsdp1_setup() {
  TrainingSetup setup;
  setup.model = "qwen2-7b";
  setup.framework = "hf-2024";
  setup.method = Method::full;
  setup.precision = Precision::amp;
  setup.fsdp_version = 1;
  setup.seq_len = 512;
  setup.checkpointing = Checkpointing::full;
  setup.dataset.rows = 46802;
  return setup;
}

void BM_ReplayQwen2Batch32(benchmark::State& state) {
  const ModelSpec model = load_model("qwen2-7b");
  const HardwareSpec hw = load_hardware("a100-80gb-sxm");
  TrainingSetup setup = qwen2_full_fsdp1_setup();
  setup.num_gpus = 4;
  const Candidate c = preset_candidate(Strategy::fsdp, 4, hw, 32, Checkpointing::full, Attention::fused);
  const PreparedJob job = prepare_job(model, hw, setup, shard_shape(c.parallel));
  const ReplayStep step = *replay_step_for(job, c);
  for (auto _ : state) benchmark::DoNotOptimize(replay_steps(step, hw.usable_memory_bytes));
}
BENCHMARK(BM_ReplayQwen2Batch32)->Unit(benchmark::kMillisecond);

void BM_SweepQwen2FullFsdp1(benchmark::State& state) {
  const ModelSpec model = load_model("qwen2-7b");
  std::vector<HardwareSpec> gpus;
  for (const auto& id : list_hardware_ids()) {
    HardwareSpec hw = load_hardware(id);
    if (hw.kind == "gpu") gpus.push_back(hw);
  }
  const TrainingSetup setup = qwen2_full_fsdp1_setup();
  int64_t evaluated = 0;
  for (auto _ : state) {
    evaluated = 0;
    auto rows = run_sweep(model, gpus, {8}, setup, Objective::time, false, {}, &evaluated);
    benchmark::DoNotOptimize(rows);
  }
  state.counters["candidates"] = static_cast<double>(evaluated);
  state.SetItemsProcessed(state.iterations() * evaluated);
}
BENCHMARK(BM_SweepQwen2FullFsdp1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();

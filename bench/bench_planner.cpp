// Planner throughput: candidate evaluations per second (memory + step time + job cost), the inner
// loop of `ftplan plan` and `ftplan sweep`. Goal: >= 1,000,000 per second on one core, so a sweep
// of 400,000 candidates (Calculon's size for 8 GPUs) takes under a second.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "planner/data_paths.h"
#include "planner/json_fields.h"
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

}  // namespace

BENCHMARK_MAIN();

// The choice of plan: the seeds' rules of thumb where they hold, the ranking's invariants, an
// infeasible job as a result, the cost objective, and a candidate's job time and cost by hand.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "planner/data_paths.h"
#include "planner/hardware_spec.h"
#include "planner/json_fields.h"
#include "planner/model_spec.h"
#include "planner/plan_report.h"
#include "planner/plan_search.h"
#include "planner/sweep.h"
#include "planner/training_setup.h"

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using Catch::Matchers::WithinRel;
using ftplan::load_model;
using ftplan::Attention;
using ftplan::Checkpointing;
using ftplan::Method;
using ftplan::Objective;
using ftplan::Strategy;

namespace {

// plan_search.cpp prefers the simpler strategy among plans within 0.5% of each other.
constexpr double kTie = 0.005;

ftplan::TrainingSetup load_job(const std::string& name) {
  return ftplan::training_setup_from_json(
      ftplan::read_json_file(ftplan::data_dir() + "/configs/jobs/" + name + ".json"), name);
}

ftplan::TrainingSetup make_setup(const std::string& model, Method method, const std::string& gpu, int64_t gpus,
                                 int64_t seq_len) {
  ftplan::TrainingSetup s;
  s.framework = "ftexec";  // the formulas checked here are ftexec's behaviour; profiles: test_framework.cpp
  s.model = model;
  s.method = method;
  s.gpu = gpu;
  s.num_gpus = gpus;
  s.seq_len = seq_len;
  return s;
}

Strategy strategy_of(const ftplan::Candidate& c) { return ftplan::parse_strategy(c.name, "test"); }

const ftplan::StrategyOutcome& outcome(const ftplan::PlanResult& plan, Strategy s) {
  for (const auto& o : plan.strategies)
    if (o.name == ftplan::to_string(s)) return o;
  FAIL("strategy " << ftplan::to_string(s) << " not in the plan");
  return plan.strategies.front();
}

// Replicas of the whole model's computation: DDP and the ZeRO/FSDP family (no pipeline, no offload).
bool is_data_parallel(Strategy s) {
  return s == Strategy::ddp || s == Strategy::zero1 || s == Strategy::zero2 || s == Strategy::zero3 ||
         s == Strategy::fsdp || s == Strategy::fsdp_shard_grad_op;
}

bool is_sharded(Strategy s) { return s == Strategy::zero3 || s == Strategy::fsdp; }

}  // namespace

TEST_CASE("fits one GPU, several GPUs: DDP (or a DP strategy that ties with it)", "[plan]") {
  auto [name, method, gpu, gpus, seq_len] = GENERATE(table<std::string, Method, std::string, int64_t, int64_t>({
      {"tinyllama-1.1b", Method::lora, "a100-80gb-sxm", 4, 1024},
      {"tinyllama-1.1b", Method::full, "a100-80gb-sxm", 8, 2048},
      {"llama-3-8b", Method::lora, "a100-40gb-sxm", 4, 1024},
      {"llama-3-8b", Method::qlora, "rtx-4090", 2, 1024},
      {"qwen2-0.5b", Method::full, "h100-sxm", 8, 4096},
  }));
  CAPTURE(name, ftplan::to_string(method), gpu, gpus, seq_len);
  const auto model = load_model(name);
  const auto hw = ftplan::load_hardware(gpu);
  const auto setup = make_setup(name, method, gpu, gpus, seq_len);
  const auto plan = ftplan::plan_job(model, hw, setup, Objective::time);
  REQUIRE(outcome(plan, Strategy::single).feasible);  // the premise: it fits one GPU
  REQUIRE(plan.recommended);
  const Strategy winner = strategy_of(plan.recommended->candidate);
  CAPTURE(ftplan::to_string(winner), plan.reason);
  CHECK(is_data_parallel(winner));
  const auto& ddp = outcome(plan, Strategy::ddp);
  REQUIRE(ddp.feasible);
  // DDP is the winner or within 2% of it, apart from the optimizer step it runs whole: for full FT of
  // small models on 8 GPUs ZeRO/FSDP win by that step (the foreach AdamW's 84 B per parameter at HBM
  // speed under mixed precision, compute_model.h), which they shard, while their extra gathers hide
  // behind compute. Scores are seconds per token here (no dataset given).
  REQUIRE_FALSE(plan.recommended->has_job);
  const double ddp_optimizer_s_per_token = ddp.best.step.optimizer_s / ddp.best.step.tokens_per_step;
  CHECK(ddp.best.score <= plan.recommended->score * 1.02 + ddp_optimizer_s_per_token);
  CHECK_THAT(plan.rule_of_thumb, Contains("fits one GPU -> DDP"));
}

TEST_CASE("does not fit one GPU: FSDP/ZeRO-3", "[plan]") {
  // Llama-3-8B full FT: 16 B x 8.03e9 = 128 GB of model states > 80 GB.
  auto [name, gpu, gpus] = GENERATE(table<std::string, std::string, int64_t>({
      {"llama-3-8b", "a100-80gb-sxm", 8},
      {"mistral-7b", "h100-sxm", 8},
      {"llama-2-7b", "a100-80gb-sxm", 4},
  }));
  CAPTURE(name, gpu, gpus);
  const auto model = load_model(name);
  const auto hw = ftplan::load_hardware(gpu);
  const auto setup = make_setup(name, Method::full, gpu, gpus, 2048);
  const auto plan = ftplan::plan_job(model, hw, setup, Objective::time);
  CHECK_FALSE(outcome(plan, Strategy::single).feasible);
  CHECK_FALSE(outcome(plan, Strategy::ddp).feasible);
  REQUIRE(plan.recommended);
  CAPTURE(plan.recommended->candidate.name, plan.reason);
  CHECK(is_sharded(strategy_of(plan.recommended->candidate)));
  CHECK_THAT(plan.rule_of_thumb, Contains("does not fit one GPU -> FSDP/ZeRO-3") && Contains("agree"));
  CHECK_THAT(outcome(plan, Strategy::ddp).verdict, StartsWith("out of memory by"));
}

TEST_CASE("ranking invariants", "[plan]") {
  auto [name, method, gpu, gpus] = GENERATE(table<std::string, Method, std::string, int64_t>({
      {"tinyllama-1.1b", Method::lora, "rtx-6000-ada", 4},
      {"llama-3-8b", Method::full, "a100-80gb-sxm", 8},
      {"llama-3-8b", Method::lora, "a100-40gb-sxm", 4},
      {"codellama-34b", Method::lora, "rtx-6000-ada", 4},
      {"mistral-7b", Method::qlora, "l4", 2},
      {"llama-3.1-70b", Method::qlora, "h100-sxm", 16},
  }));
  CAPTURE(name, ftplan::to_string(method), gpu, gpus);
  const auto model = load_model(name);
  const auto hw = ftplan::load_hardware(gpu);
  auto setup = make_setup(name, method, gpu, gpus, 2048);
  const auto plan = ftplan::plan_job(model, hw, setup, Objective::time);
  REQUIRE(plan.recommended);
  REQUIRE_FALSE(plan.candidates.empty());
  CHECK(plan.evaluated >= static_cast<int64_t>(plan.candidates.size()));

  SECTION("every candidate fits") {
    for (const auto& c : plan.candidates) {
      CAPTURE(c.candidate.name, c.candidate.micro_batch);
      CHECK(c.memory.fits);
      CHECK(c.memory.per_gpu.total <= c.memory.usable_bytes);
    }
  }
  SECTION("sorted by score, near-ties (0.5%) broken towards the simpler strategy") {
    double best = plan.candidates.front().score;
    for (const auto& c : plan.candidates) best = std::min(best, c.score);
    CHECK(plan.recommended->score <= best * (1 + kTie));
    for (size_t i = 1; i < plan.candidates.size(); ++i) {
      CAPTURE(i);
      CHECK(plan.candidates[i - 1].score <= plan.candidates[i].score * (1 + kTie));
    }
    CHECK(plan.recommended->candidate.name == plan.candidates.front().candidate.name);  // (a preset or a composition)
    CHECK(plan.recommended->candidate.micro_batch == plan.candidates.front().candidate.micro_batch);
  }
  SECTION("the reason names the winner and the runner-up") {
    const std::string winner = plan.recommended->candidate.name;  // a preset's name or a composition's
    const ftplan::RankedCandidate* runner = nullptr;
    for (const auto& c : plan.candidates)
      if (c.candidate.name != winner) {
        runner = &c;
        break;
      }
    CAPTURE(plan.reason);
    CHECK_THAT(plan.reason, StartsWith(winner));
    if (runner) {
      CHECK_THAT(plan.reason, Contains(runner->candidate.name + " (micro-batch"));
    } else {
      CHECK_THAT(plan.reason, Contains("only strategy that fits"));
    }
  }
  SECTION("every strategy has a verdict; each feasible one's best is a listed candidate") {
    for (const auto& o : plan.strategies) {
      CAPTURE(o.name, o.verdict);
      CHECK_FALSE(o.verdict.empty());
      if (!o.feasible) CHECK_THAT(o.verdict, StartsWith("out of memory by"));
      if (o.feasible) {
        CHECK(o.best.memory.fits);
        CHECK(o.best.score >= plan.recommended->score / (1 + kTie));
      }
    }
  }
}

TEST_CASE("naive model parallel never beats DDP when DDP fits", "[plan]") {
  auto [name, method, gpu, gpus, seq_len] = GENERATE(table<std::string, Method, std::string, int64_t, int64_t>({
      {"tinyllama-1.1b", Method::lora, "rtx-6000-ada", 4, 1024},
      {"tinyllama-1.1b", Method::full, "rtx-3090", 4, 1024},
      {"llama-3-8b", Method::lora, "a100-40gb-sxm", 4, 512},
      {"llama-3-8b", Method::qlora, "rtx-4090", 4, 2048},
      {"mistral-7b", Method::lora, "l40s", 8, 4096},
      {"llama-3.2-1b", Method::full, "a100-80gb-pcie", 2, 2048},
  }));
  CAPTURE(name, ftplan::to_string(method), gpu, gpus, seq_len);
  const auto model = load_model(name);
  const auto hw = ftplan::load_hardware(gpu);
  const auto plan = ftplan::plan_job(model, hw, make_setup(name, method, gpu, gpus, seq_len), Objective::time);
  const auto& ddp = outcome(plan, Strategy::ddp);
  const auto& mp = outcome(plan, Strategy::mp);
  REQUIRE(ddp.feasible);
  REQUIRE(plan.recommended);
  CHECK(strategy_of(plan.recommended->candidate) != Strategy::mp);
  if (mp.feasible) CHECK(ddp.best.score < mp.best.score);
}

TEST_CASE("a job that fits nowhere is a result, not an error", "[plan]") {
  const auto model = load_model("llama-3.1-70b");
  const auto hw = ftplan::load_hardware("rtx-3090");
  SECTION("Llama-3.1-70B full FT on 1x RTX 3090: only ZeRO-3 offload fits the GPU, and only with the host it needs") {
    // Single needs 16 B x 70.55e9 = 1.13 TB; ZeRO-2 offload still keeps the 141 GB bf16 weights on
    // the GPU; ZeRO-3 offload keeps only gathered units on the GPU but its host holds the bf16
    // weights, fp32 master weights, fp32 gradients and moments: 2 + 4 + 4 + 8 = 18 B x 70.55e9 =
    // 1.27 TB (1,155 GiB), far beyond the RTX 3090 workstation's host memory.
    auto setup = make_setup("llama-3.1-70b", Method::full, "rtx-3090", 1, 2048);
    const auto plan = ftplan::plan_job(model, hw, setup, Objective::time);
    CHECK_THAT(outcome(plan, Strategy::single).verdict, StartsWith("out of memory by"));
    CHECK_THAT(outcome(plan, Strategy::zero2_offload).verdict, StartsWith("out of memory by"));
    CHECK_FALSE(plan.recommended);
    CHECK_THAT(outcome(plan, Strategy::zero3_offload).verdict, Contains("out of host memory"));
    setup.host_memory_gib = 2048;  // a host that holds it: then ZeRO-3 offload is the plan
    const auto roomy = ftplan::plan_job(model, hw, setup, Objective::time);
    REQUIRE(roomy.recommended);
    CHECK(strategy_of(roomy.recommended->candidate) == Strategy::zero3_offload);
  }
  SECTION("at 16k tokens per sample nothing fits: no recommendation, every verdict out of memory") {
    // Even checkpointed block inputs alone are 80 x 2 B x 16384 x 8192 = 21.5 GB > 22.8 GiB x 0.95
    // once the loss (12 x 16384 x 128256 B = 25.2 GB) is added.
    const auto plan = ftplan::plan_job(model, hw, make_setup("llama-3.1-70b", Method::full, "rtx-3090", 1, 16384),
                                       Objective::time);
    CHECK_FALSE(plan.recommended);
    CHECK(plan.candidates.empty());
    CHECK_FALSE(plan.reason.empty());
    REQUIRE(plan.strategies.size() == 3);  // single, zero2_offload, zero3_offload on one GPU
    for (const auto& o : plan.strategies) {
      CAPTURE(o.name);
      CHECK_FALSE(o.feasible);
      CHECK_THAT(o.verdict, StartsWith("out of memory by"));
    }
  }
}

TEST_CASE("evaluate_candidate: job time is whole steps, cost is GPU-seconds x price", "[plan]") {
  // The TinyLlama seed job: 1024 rows x 1024 tokens x 1 epoch = 1,048,576 tokens; DDP on 4 GPUs,
  // grad-accum 2: micro-batch 16 -> 4 x 2 x 16 x 1024 = 131,072 tokens/step -> exactly 8 steps;
  // micro-batch 3 -> 24,576 tokens/step -> 42.67 -> 43 steps (the last partial step still runs).
  auto setup = load_job("tinyllama-lora-4x-rtx6000ada");
  const auto model = load_model(setup.model);
  const auto hw = ftplan::load_hardware(setup.gpu);
  REQUIRE(ftplan::job_tokens(setup) == 1'048'576);
  const auto ctx = ftplan::prepare_plan(model, hw, setup, 4);
  auto [micro_batch, steps] = GENERATE(table<int64_t, double>({{16, 8.0}, {3, 43.0}, {1, 128.0}}));
  CAPTURE(micro_batch);
  const auto r = ftplan::evaluate_candidate(ctx, ftplan::preset_candidate(Strategy::ddp, 4, hw, micro_batch, Checkpointing::none, Attention::fused),
                                            Objective::time);
  CHECK(r.step.tokens_per_step == 4.0 * 2 * micro_batch * 1024);
  CHECK(r.has_job);
  CHECK_THAT(r.job_time_s, WithinRel(steps * r.step.step_time_s, 1e-12));
  CHECK_THAT(r.gpu_hours, WithinRel(r.job_time_s * 4 / 3600, 1e-12));
  CHECK_THAT(r.cost_usd, WithinRel(r.job_time_s * 4 * 0.74 / 3600, 1e-12));  // hwdb: 0.74 USD per GPU-hour
  CHECK(r.score == r.job_time_s);
  const auto c = ftplan::evaluate_candidate(ctx, ftplan::preset_candidate(Strategy::ddp, 4, hw, micro_batch, Checkpointing::none, Attention::fused),
                                            Objective::cost);
  CHECK(c.score == c.cost_usd);
  // Single uses one of the job's GPUs: it pays for one.
  const auto one = ftplan::evaluate_candidate(ctx, ftplan::preset_candidate(Strategy::single, 1, hw, micro_batch, Checkpointing::none, Attention::fused),
                                              Objective::cost);
  CHECK(one.gpus_used == 1);
  CHECK_THAT(one.cost_usd, WithinRel(one.job_time_s * 0.74 / 3600, 1e-12));
}

TEST_CASE("--price-per-gpu-hour: the cost scales exactly with the price, the time not at all", "[plan][cost]") {
  // The TinyLlama seed job on 4x RTX 6000 Ada (hwdb: 0.74 USD per GPU-hour, RunPod 2026-07).
  const auto setup = load_job("tinyllama-lora-4x-rtx6000ada");
  const auto model = load_model(setup.model);
  const auto hw = ftplan::load_hardware(setup.gpu);
  REQUIRE(hw.price_usd_per_gpu_hour > 0);
  const ftplan::Candidate c = ftplan::preset_candidate(Strategy::ddp, 4, hw, 4, Checkpointing::none, Attention::fused);
  const auto base = ftplan::evaluate_candidate(ftplan::prepare_plan(model, hw, setup, 4), c, Objective::cost);
  REQUIRE(base.has_job);
  auto price = GENERATE(0.01, 0.74, 2.5, 1e6);
  CAPTURE(price);
  auto priced = setup;
  priced.price_per_gpu_hour = price;
  CHECK(ftplan::gpu_hour_price_usd(hw, priced) == price);
  const auto r = ftplan::evaluate_candidate(ftplan::prepare_plan(model, hw, priced, 4), c, Objective::cost);
  const double ratio = price / hw.price_usd_per_gpu_hour;
  CHECK_THAT(r.cost_usd, WithinRel(base.cost_usd * ratio, 1e-12));
  CHECK_THAT(r.cost_usd_per_million_tokens, WithinRel(base.cost_usd_per_million_tokens * ratio, 1e-12));
  CHECK(r.job_time_s == base.job_time_s);
  CHECK(r.gpu_hours == base.gpu_hours);
  CHECK_THAT(r.cost_usd, WithinRel(r.gpu_hours * price, 1e-12));

  SECTION("the assumptions and the report say where the price came from") {
    const auto plan = ftplan::plan_job(model, hw, priced, Objective::cost);
    const auto j = ftplan::plan_report_json(model, hw, priced, plan);
    CHECK(j["gpu"]["price_usd_per_gpu_hour"] == price);
    CHECK(j["gpu"]["price_source"] == "--price-per-gpu-hour");
    CHECK(j["gpu"]["hwdb_price_usd_per_gpu_hour"] == hw.price_usd_per_gpu_hour);
    std::string assumptions;
    for (const auto& line : j["assumptions"]) assumptions += line.get<std::string>() + "\n";
    CHECK_THAT(assumptions, Contains("(--price-per-gpu-hour; hwdb rtx-6000-ada: 0.74)"));
    const auto hwdb_plan = ftplan::plan_report_json(model, hw, setup, ftplan::plan_job(model, hw, setup, Objective::cost));
    CHECK(hwdb_plan["gpu"]["price_source"] == "hwdb");
    std::string hwdb_assumptions;
    for (const auto& line : hwdb_plan["assumptions"]) hwdb_assumptions += line.get<std::string>() + "\n";
    CHECK_THAT(hwdb_assumptions, Contains("hwdb rtx-6000-ada, indicative on-demand, read " + hw.price_date));
  }
}

TEST_CASE("--price-per-gpu-hour in a sweep prices every GPU type alike", "[plan][cost]") {
  // Two GPU types of different hwdb prices: with the override each row costs its GPU-hours x the
  // one price given, whatever its type's own price.
  auto setup = load_job("tinyllama-lora-4x-rtx6000ada");
  const auto model = load_model(setup.model);
  setup.price_per_gpu_hour = 1.5;
  const auto a = ftplan::load_hardware("a100-80gb-sxm"), h = ftplan::load_hardware("h100-sxm");
  REQUIRE(a.price_usd_per_gpu_hour != h.price_usd_per_gpu_hour);
  const auto rows = ftplan::run_sweep(model, {a, h}, {2, 4}, setup, Objective::cost, false, {});
  REQUIRE(rows.size() >= 4);
  for (const auto& row : rows) {
    CAPTURE(row.gpu, row.gpus, row.result.candidate.name);
    CHECK_THAT(row.result.cost_usd, WithinRel(row.result.gpu_hours * 1.5, 1e-12));
  }
}

TEST_CASE("objective cost prefers cheaper and fewer GPUs at equal speed", "[plan]") {
  const auto setup = load_job("tinyllama-lora-4x-rtx6000ada");
  const auto model = load_model(setup.model);
  SECTION("two GPUs identical but for the price: the cheaper one wins, at exactly the price ratio") {
    auto cheap = ftplan::load_hardware("a100-80gb-sxm");
    auto dear = cheap;
    cheap.id = "a100-cheap";
    cheap.price_usd_per_gpu_hour = 1.0;
    dear.id = "a100-dear";
    dear.price_usd_per_gpu_hour = 2.0;
    const auto rows = ftplan::run_sweep(model, {dear, cheap}, {4}, setup, Objective::cost, false, {});
    REQUIRE(rows.size() >= 2);
    CHECK(rows.front().gpu == "a100-cheap");
    for (const auto& d : rows) {
      if (d.gpu != "a100-dear") continue;
      for (const auto& c : rows) {
        if (c.gpu != "a100-cheap" || c.result.candidate.name != d.result.candidate.name) continue;
        CAPTURE(d.result.candidate.name);
        CHECK_THAT(d.result.cost_usd, WithinRel(2 * c.result.cost_usd, 1e-12));
        CHECK_THAT(d.result.job_time_s, WithinRel(c.result.job_time_s, 1e-12));
      }
    }
  }
  SECTION("DDP at 1, 2, 4, 8 GPUs: the same per-GPU speed at best, so the fewest GPUs are cheapest") {
    // Cost = steps x N x step time x price; N x ceil(tokens / (N x t)) >= ceil(tokens / t) and the
    // step time only grows with communication.
    auto ddp = setup;
    ddp.strategy = Strategy::ddp;
    ddp.micro_batch = 16;
    const auto hw = ftplan::load_hardware("a100-80gb-sxm");
    const auto rows = ftplan::run_sweep(model, {hw}, {8, 4, 2, 1}, ddp, Objective::cost, false, {});
    REQUIRE(rows.size() == 4);
    CHECK(rows.front().gpus == 1);
    for (size_t i = 1; i < rows.size(); ++i) {
      CHECK(rows[i].gpus > rows[i - 1].gpus);
      CHECK(rows[i].result.cost_usd >= rows[i - 1].result.cost_usd);
    }
    // Under the time objective the order reverses: more GPUs finish sooner.
    const auto fast = ftplan::run_sweep(model, {hw}, {1, 2, 4, 8}, ddp, Objective::time, false, {});
    REQUIRE(fast.size() == 4);
    CHECK(fast.front().gpus == 8);
  }
  SECTION("plan_job under cost: the winner is within the tie margin of the cheapest candidate") {
    const auto hw = ftplan::load_hardware(setup.gpu);
    const auto plan = ftplan::plan_job(model, hw, setup, Objective::cost);
    REQUIRE(plan.recommended);
    double cheapest = plan.recommended->cost_usd;
    for (const auto& c : plan.candidates) cheapest = std::min(cheapest, c.cost_usd);
    CHECK(plan.recommended->cost_usd <= cheapest * (1 + kTie));
    CHECK_THAT(plan.reason, Contains("cheapest plan"));
  }
}

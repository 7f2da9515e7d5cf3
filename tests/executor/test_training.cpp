// The executor on the tiny config: training makes progress, LoRA leaves the base untouched,
// checkpointing changes no gradient, and the measured CPU peak memory matches the planner.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <cmath>

#include "executor/data.h"
#include "executor/exec_job.h"
#include "executor/llama_model.h"
#include "executor/lora.h"
#include "executor/memory_meter.h"
#include "executor/run_job.h"
#include "executor/trainer.h"
#include "executor_test_util.h"
#include "planner/activation_memory.h"
#include "planner/errors.h"
#include "planner/hardware_spec.h"
#include "planner/memory_model.h"
#include "planner/memory_report.h"

// glog (through LibTorch) defines CHECK too: Catch2 must come last and win.
#undef CHECK
#include <catch2/catch.hpp>

using namespace ftexec;
using Catch::Matchers::Contains;
using ftexec_test::tiny_spec;

namespace {

TokenBatch fixed_batch(int64_t batch, int64_t seq_len, uint64_t seed = 7) {
  auto data = open_data_source("synthetic", tiny_spec().vocab_size, seed);
  return data->next(batch, seq_len);
}

std::vector<at::Tensor> clones(const std::vector<std::pair<std::string, at::Tensor>>& named) {
  std::vector<at::Tensor> out;
  for (const auto& [name, t] : named) out.push_back(t.detach().clone());
  return out;
}

}  // namespace

TEST_CASE("loss falls over 30 steps on a repeated batch", "[executor]") {
  at::set_num_threads(2);
  LlamaModel model = llama_create(tiny_spec(), ModelOptions{}, 0);
  Trainer trainer(model, ftplan::Method::full, ftplan::Precision::fp32, AdamWOptions{3e-3}, 2, 1.0);
  const TokenBatch batch = fixed_batch(4, 32);
  std::vector<double> losses;
  for (int step = 0; step < 30; ++step) losses.push_back(trainer.step([&] { return batch; }));
  CAPTURE(losses.front(), losses[10], losses.back());
  CHECK(losses.front() == Approx(std::log(256.0)).epsilon(0.05));  // random init: ~ln(vocab)
  CHECK(losses.back() < losses.front() - 1.0);
  CHECK(losses.back() < losses[10]);
}

TEST_CASE("LoRA trains only the adapters; base weights stay bit-identical", "[executor]") {
  at::set_num_threads(2);
  const auto precision = GENERATE(ftplan::Precision::fp32, ftplan::Precision::mixed);
  CAPTURE(ftplan::to_string(precision));
  ModelOptions options;
  options.dtype = precision == ftplan::Precision::fp32 ? at::kFloat : at::kBFloat16;
  LlamaModel model = llama_create(tiny_spec(), options, 0);
  ftplan::LoraSpec lora;
  lora.rank = 4;
  lora.alpha = 8;
  lora.targets = {"q_proj", "v_proj", "down_proj"};
  lora_attach(model, lora, 0);
  const auto base_before = clones(llama_named_parameters(model));
  const auto adapters_before = clones(lora_named_parameters(model));
  Trainer trainer(model, ftplan::Method::lora, precision, AdamWOptions{1e-2}, 1, 1.0);
  CHECK(trainer.trainable().size() == adapters_before.size());
  const TokenBatch batch = fixed_batch(2, 32);
  std::vector<double> losses;
  for (int step = 0; step < 10; ++step) losses.push_back(trainer.step([&] { return batch; }));
  CHECK(losses.back() < losses.front());

  const auto base_after = llama_named_parameters(model);
  for (size_t i = 0; i < base_after.size(); ++i) {
    CAPTURE(base_after[i].first);
    CHECK_FALSE(base_after[i].second.requires_grad());
    CHECK(at::equal(base_after[i].second, base_before[i]));
  }
  const auto adapters_after = lora_named_parameters(model);
  for (size_t i = 0; i < adapters_after.size(); ++i) {
    CAPTURE(adapters_after[i].first);
    CHECK_FALSE(at::equal(adapters_after[i].second, adapters_before[i]));
  }
}

TEST_CASE("checkpointed gradients equal the plain ones", "[executor]") {
  at::set_num_threads(2);
  const bool with_lora = GENERATE(false, true);
  CAPTURE(with_lora);
  auto make = [&](bool checkpointing) {
    ModelOptions options;
    options.checkpointing = checkpointing;
    LlamaModel m = llama_create(tiny_spec(), options, 3);
    if (with_lora) {
      ftplan::LoraSpec lora;
      lora.rank = 4;
      lora.dropout = 0.1;  // the recompute must replay the same dropout masks
      lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
      lora_attach(m, lora, 3);
      // Move lora_B off zero so every adapter gradient is non-trivial.
      at::NoGradGuard no_grad;
      auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
      for (auto& [name, t] : lora_named_parameters(m))
        if (name.find("lora_B") != std::string::npos) at::Tensor(t).normal_(0.0, 0.02, gen);
    }
    return m;
  };
  LlamaModel plain = make(false), ckpt = make(true);
  const TokenBatch batch = fixed_batch(2, 48);
  const auto method = with_lora ? ftplan::Method::lora : ftplan::Method::full;
  Trainer t_plain(plain, method, ftplan::Precision::fp32, AdamWOptions{}, 1, 0.0);
  Trainer t_ckpt(ckpt, method, ftplan::Precision::fp32, AdamWOptions{}, 1, 0.0);
  at::Generator(at::globalContext().defaultGenerator(at::kCPU)).set_current_seed(11);
  const double loss_plain = t_plain.forward_backward(batch);
  at::Generator(at::globalContext().defaultGenerator(at::kCPU)).set_current_seed(11);
  const double loss_ckpt = t_ckpt.forward_backward(batch);
  CHECK(loss_plain == loss_ckpt);
  REQUIRE(t_plain.trainable().size() == t_ckpt.trainable().size());
  for (size_t i = 0; i < t_plain.trainable().size(); ++i) {
    const at::Tensor& g1 = t_plain.trainable()[i].grad();
    const at::Tensor& g2 = t_ckpt.trainable()[i].grad();
    CAPTURE(i);
    REQUIRE(g1.defined());
    REQUIRE(g2.defined());
    CHECK(g1.abs().sum().item<double>() > 0);
    CHECK(at::equal(g1, g2));
  }
}

TEST_CASE("measured CPU peak memory is within 10% of the planner's estimate", "[executor][memory]") {
  // The tiny job with activations dominating: fp32, eager attention, full fine-tuning, one CPU
  // "device" (hwdb/cpu.json, framework overhead 0), strategy single, seq 128, micro-batch 8.
  ftplan::TrainingSetup setup = ftexec_test::activation_memory_setup("tiny-test");
  ExecJob job = make_exec_job(setup, "cpu");
  job.threads = 2;
  const nlohmann::json measured = run_job(job);

  const ftplan::Candidate candidate = ftplan::candidate_from_setup(setup, ftplan::load_hardware("cpu"), ftplan::Strategy::single);
  const auto predicted = ftplan::estimate_memory(job.model, ftplan::load_hardware("cpu"), setup, candidate).per_gpu;
  const auto& rank = measured["ranks"][0];
  const auto& parts = rank["components"];
  const double peak = rank["peak_memory_bytes"].get<double>();
  CAPTURE(peak, predicted.total, predicted.weights, predicted.gradients, predicted.optimizer, predicted.activations,
          predicted.logits_loss, predicted.temporary, predicted.overhead, parts.dump());
  // Model states are exact: tensor sizes on both sides.
  CHECK(parts["weights"].get<int64_t>() == predicted.weights);
  CHECK(parts["gradients"].get<int64_t>() == predicted.gradients);
  CHECK(parts["optimizer"].get<int64_t>() == predicted.optimizer);
  // The peak: within 10% (the tolerance).
  CHECK_THAT(peak, Catch::Matchers::WithinRel(double(predicted.total), 0.10));
  // And the transient part alone (activations + loss), the figure the activation formula predicts.
  CHECK_THAT(parts["activations"].get<double>(),
             Catch::Matchers::WithinRel(double(predicted.activations + predicted.logits_loss), 0.10));
}

TEST_CASE("run_job writes the measured figures and rejects what it cannot run", "[executor]") {
  ftplan::TrainingSetup setup;
  setup.framework = "ftexec";  // the prediction of what ftexec does
  setup.model = "tiny-test";
  setup.precision = ftplan::Precision::fp32;
  setup.seq_len = 32;
  setup.micro_batch = 2;
  setup.steps = 3;
  setup.device = "cpu";

  SECTION("measured.json keys") {
    ExecJob job = make_exec_job(setup, "cpu");
    job.threads = 2;
    const auto m = run_job(job);
    CHECK(m["loss"].size() == 3);
    CHECK(m["step_time_s"].get<double>() > 0);
    CHECK(m["tokens_per_s"].get<double>() > 0);
    CHECK(m["tokens_per_step"].get<int64_t>() == 64);
    CHECK(m["ranks"][0]["rank"] == 0);
    CHECK(m["ranks"][0]["peak_memory_bytes"].get<int64_t>() > 0);
    CHECK(m["torch_version"].get<std::string>().rfind("1.", 0) == 0);
    CHECK(m["mfu"].is_number());
  }
  SECTION("a precision or optimizer ftexec does not run is bad input naming it") {
    // (Every strategy the planner names runs: zero3_offload is a distributed strategy, below.)
    setup.strategy = ftplan::Strategy::zero3_offload;
    CHECK_NOTHROW(make_exec_job(setup, "cpu"));
    setup.precision = ftplan::Precision::mixed_fp32_grads;
    CHECK_THROWS_WITH(make_exec_job(setup, "cpu"), Contains("--precision") && Contains("mixed-fp32-grads"));
    setup.precision = ftplan::Precision::fp32;
    setup.paged_optimizer = true;
    CHECK_THROWS_WITH(make_exec_job(setup, "cpu"), Contains("paged_optimizer"));
  }
  SECTION("one process runs any layout of one rank on the same path, with the same losses") {
    // zero3 on one rank: flat shards of the whole model, no communication.
    ExecJob single = make_exec_job(setup, "cpu");
    single.threads = 2;
    setup.strategy = ftplan::Strategy::zero3;
    ExecJob job = make_exec_job(setup, "cpu");
    job.threads = 2;
    const auto a = run_job(single), b = run_job(job);
    CHECK(b["candidate"]["strategy"] == "zero3");
    CHECK(b["candidate"]["parallel"]["sharding"] == "zero3");
    CHECK(a["candidate"]["parallel"]["dp_shard"] == 1);
    CHECK(a["world_size"] == 1);
    CHECK(b["comm_bytes_per_step"] == 0);
    const auto la = a["loss"].get<std::vector<double>>(), lb = b["loss"].get<std::vector<double>>();
    REQUIRE(la.size() == lb.size());
    for (size_t i = 0; i < la.size(); ++i) CHECK_THAT(lb[i], Catch::Matchers::WithinRel(la[i], 1e-5));
  }
  SECTION("an unknown model is bad input") {
    setup.model = "no-such-model";
    CHECK_THROWS_AS(make_exec_job(setup, "cpu"), ftplan::InputError);
  }
  SECTION("out of memory during the run is a runtime failure") {
    ExecJob job = make_exec_job(setup, "cpu");
    job.cpu_memory_limit_bytes = 1 << 20;  // 1 MiB: the weights alone take 2 MiB with AdamW
    CHECK_THROWS_WITH(run_job(job), Contains("out of memory"));
    cpu_meter_set_limit(0);
  }
  SECTION("a plan that does not fit the device is bad input") {
    ExecJob job = make_exec_job(setup, "cpu");
    job.cpu_memory_limit_bytes = 1 << 30;
    job.plan = nlohmann::json{{"predicted", {{"memory_per_gpu_bytes", {{"total", int64_t(4) << 30}}}}}};
    CHECK_THROWS_AS(run_job(job), ftplan::InputError);
    cpu_meter_set_limit(0);
  }
}

TEST_CASE("setup_from_plan applies the candidate to the job", "[executor]") {
  nlohmann::json plan = {{"format", "ftplan-plan/1"},
                         {"job", {{"model", "tiny-test"}, {"method", "lora"}, {"seq_len", 64}, {"steps", 4}}},
                         {"candidate", {{"strategy", "single"}, {"micro_batch", 4}, {"checkpointing", "full"},
                                        {"attention", "eager"}, {"gpus", 1}}}};
  const auto setup = setup_from_plan(plan, "plan.json");
  CHECK(setup.method == ftplan::Method::lora);
  CHECK(setup.micro_batch == 4);
  CHECK(setup.checkpointing == ftplan::Checkpointing::full);
  CHECK(setup.seq_len == 64);
  plan["format"] = "something-else";
  CHECK_THROWS_WITH(setup_from_plan(plan, "plan.json"), Contains("plan.json"));
}

// QLoRA in the executor ([qlora]): NF4 storage and its error against hand values and the planner's
// 4.127 bits per weight; the custom autograd path's gradient; training falls; and the measured peak
// against the planner's QLoRA terms (NF4 weights + one dequantized weight alive at a time).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <iostream>

#include "executor/exec_job.h"
#include "executor/llama_model.h"
#include "executor/lora.h"
#include "executor/memory_meter.h"
#include "executor/nf4.h"
#include "executor/run_job.h"
#include "executor/trainer.h"
#include "executor/data.h"
#include "executor_test_util.h"
#include "planner/hardware_spec.h"
#include "planner/memory_model.h"
#include "planner/memory_report.h"
#include "planner/precision.h"

#undef CHECK
#include <catch2/catch.hpp>

using namespace ftexec;
using ftexec_test::tiny_spec;

TEST_CASE("NF4 round trip: hand values, packing and the error bound", "[executor][qlora]") {
  SECTION("one block by hand: absmax 2, codes from bitsandbytes' table") {
    at::Tensor w = at::zeros({64});
    w[0] = 2.0, w[1] = 1.0, w[2] = 0.6, w[3] = -2.0, w[4] = -0.2;
    const Nf4Tensor q = nf4_quantize(w);
    // The block's absmax 2 is its group's scale: stored as 255/255 of it, exactly.
    CHECK(q.absmax_q[0].item<int>() == 255);
    CHECK(q.absmax_scale[0].item<float>() == 2.0f);
    // 2/2 = 1 -> code 15; 1/2 = 0.5 -> nearest 0.4407098 (12; 0.5626170 is 0.0033 farther); the
    // first element in the high nibble.
    CHECK(q.codes[0].item<int>() == (15 << 4 | 12));
    const at::Tensor d = nf4_dequantize(q, at::kFloat);
    CHECK(d[0].item<float>() == 2.0f);
    CHECK(d[1].item<float>() == Approx(2 * 0.44070982933044434).epsilon(1e-6));  // 1.0 -> 0.88142
    CHECK(d[2].item<float>() == Approx(2 * 0.33791524171829224).epsilon(1e-6));  // 0.3 -> 0.33792
    CHECK(d[3].item<float>() == -2.0f);
    CHECK(d[4].item<float>() == Approx(2 * -0.09105003625154495).epsilon(1e-6)); // -0.1 -> -0.09105
    CHECK(d[5].item<float>() == 0.0f);  // NF4 has an exact zero
  }
  SECTION("N(0,1) weights: bounded error, better than uniform 4-bit, 4.127 bits per weight") {
    const at::Tensor w = at::randn({256, 128}, at::detail::getDefaultCPUGenerator());  // 32768 = 2 x 16384
    const Nf4Tensor q = nf4_quantize(w);
    const at::Tensor d = nf4_dequantize(q, at::kFloat);
    const at::Tensor blocks = w.reshape({-1, 64});
    const at::Tensor absmax = blocks.abs().amax(1, true);
    const at::Tensor err = (d.reshape({-1, 64}) - blocks).abs();
    // Half the widest gap between codes (-1 .. -0.6961928) times the block's absmax, plus the 8-bit
    // absmax's rounding (half a step of scale/255, times |code| <= 1).
    const double half_gap = (1.0 - 0.6961928009986877) / 2;
    const double scale_max = q.absmax_scale.max().item<double>();
    const at::Tensor bound = absmax * half_gap + scale_max / 510.0 + 1e-6;
    CHECK((err <= bound).all().item<bool>());
    const double rms = err.pow(2).mean().sqrt().item<double>();
    // Uniform symmetric 4-bit (levels k/7 of the absmax): NF4's quantiles must beat it on normal data.
    const at::Tensor uniform = (blocks / absmax * 7).round() / 7 * absmax;
    const double rms_uniform = (uniform - blocks).pow(2).mean().sqrt().item<double>();
    std::cout << "[qlora] NF4 round-trip RMS error " << rms << " (uniform int4 " << rms_uniform << ") for N(0,1)\n";
    CHECK(rms < rms_uniform);
    // Storage: 16384 codes + 512 absmax bytes + 2 fp32 scales = the planner's 4.127 bits/param.
    CHECK(q.storage_bytes() == 16384 + 512 + 8);
    CHECK(double(q.storage_bytes()) == double(w.numel()) * ftplan::kNf4BytesPerParam);
    CHECK(q.storage_bytes() == ftplan::nf4_storage_bytes(w.numel()));
    // A partial group of 256 blocks (tiny-test's linears) still pays its fp32 scale, as the planner counts.
    CHECK(nf4_quantize(at::randn({64, 64})).storage_bytes() == ftplan::nf4_storage_bytes(64 * 64));
  }
  SECTION("a weight that does not fill whole blocks is refused") {
    CHECK_THROWS_WITH(nf4_quantize(at::zeros({3, 7})), Catch::Matchers::Contains("multiple of the block size 64"));
  }
}

TEST_CASE("nf4_linear's gradient equals the dense one, and no weight is saved for backward", "[executor][qlora]") {
  const at::Tensor w = at::randn({96, 64}) * 0.02;
  const Nf4Tensor q = nf4_quantize(w);
  const at::Tensor dense = nf4_dequantize(q, at::kFloat);
  at::Tensor x1 = at::randn({2, 5, 64}).set_requires_grad(true);
  at::Tensor x2 = x1.detach().clone().set_requires_grad(true);
  const at::Tensor g = at::randn({2, 5, 96});
  at::Tensor y1 = nf4_linear(x1, q);
  at::Tensor y2 = at::linear(x2, dense);
  CHECK(at::allclose(y1, y2, 1e-6, 1e-7));
  y1.backward(g);
  y2.backward(g);
  CHECK(at::allclose(x1.grad(), x2.grad(), 1e-6, 1e-7));
}

TEST_CASE("one dequantized weight is alive at a time, and none between forward and backward", "[executor][qlora][memory]") {
  // The planner's QLoRA term (planner/memory_model.cpp dequant_bytes): one weight dequantized at a
  // time. A 1024 x 1024 weight (4 MiB in fp32) against a 2 x 8 x 1024 input (64 KiB).
  cpu_meter_install();
  const Nf4Tensor q = nf4_quantize(at::randn({1024, 1024}));
  at::Tensor x = at::randn({2, 8, 1024}).set_requires_grad(true);
  const double weight_bytes = 1024.0 * 1024 * 4, io_bytes = 2.0 * 8 * 1024 * 4;
  const int64_t before = memory_read("cpu").current_bytes;
  memory_reset_peak("cpu");
  at::Tensor y = nf4_linear(x, q);
  const int64_t kept = memory_read("cpu").current_bytes - before;  // what forward leaves for backward
  y.sum().backward();
  const int64_t peak = memory_read("cpu").peak_bytes - before;
  CAPTURE(kept, peak, weight_bytes);
  CHECK(kept <= io_bytes + 4096);  // the output only: neither the weight nor x is saved
  CHECK(peak >= weight_bytes);     // a dequantized weight existed...
  CHECK(peak < 1.15 * weight_bytes);  // ...one at a time, its chunked temporaries small
}

TEST_CASE("QLoRA trains the adapters on NF4 block linears; the loss falls", "[executor][qlora]") {
  at::set_num_threads(2);
  LlamaModel model = llama_create(tiny_spec(), ModelOptions{}, 0);
  llama_quantize_nf4(model);
  ftplan::LoraSpec lora;
  lora.rank = 8;
  lora.alpha = 16;
  lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  lora_attach(model, lora, 0);
  for (const auto& b : model.layers) CHECK_FALSE(b.q_proj.weight.defined());  // only the NF4 copy remains
  Trainer trainer(model, ftplan::Method::qlora, ftplan::Precision::fp32, AdamWOptions{1e-2}, 1, 1.0);
  auto data = open_data_source("synthetic", tiny_spec().vocab_size, 7);
  const TokenBatch batch = data->next(4, 32);
  std::vector<double> losses;
  for (int step = 0; step < 25; ++step) losses.push_back(trainer.step([&] { return batch; }));
  CAPTURE(losses.front(), losses[10], losses.back());
  CHECK(losses.back() < losses.front() - 0.2);
  CHECK(losses.back() < losses[10]);
  // The NF4 bytes to the byte: the planner's QLoRA block less its LoRA block (same adapters) is the
  // NF4 storage less the fp32 linear weights it replaces (tiny-test's linears hold 2048..11008
  // weights: partial groups of 256 blocks, each paying its fp32 scale).
  const auto spec = tiny_spec();
  const auto hw = ftplan::load_hardware("cpu");
  ftplan::TrainingSetup s;
  s.framework = "ftexec";  // the prediction of what ftexec does
  s.precision = ftplan::Precision::fp32;
  s.lora = lora;
  s.method = ftplan::Method::qlora;
  const double qlora_block = ftplan::prepare_job(spec, hw, s).layer_weight_bytes;
  s.method = ftplan::Method::lora;
  const double lora_block = ftplan::prepare_job(spec, hw, s).layer_weight_bytes;
  double linear_weights = 0;
  for (const auto& lin : ftplan::block_linears(spec)) linear_weights += double(lin.in_features * lin.out_features);
  const double planned = spec.num_layers * (qlora_block - lora_block + 4.0 * linear_weights);
  std::cout << "[qlora] tiny-test NF4 bytes: " << llama_nf4_bytes(model) << ", planner " << planned << "\n";
  CHECK(double(llama_nf4_bytes(model)) == planned);
}

TEST_CASE("QLoRA's measured peak is within 10% of the planner's estimate", "[executor][qlora][memory]") {
  // The measured-vs-planned job (framework ftexec, fp32, eager, single, CPU) with QLoRA on every linear.
  ftplan::TrainingSetup setup = ftexec_test::activation_memory_setup("tiny-test");
  setup.method = ftplan::Method::qlora;
  setup.lora.rank = 8;
  setup.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  setup.seq_len = 64;
  setup.micro_batch = 4;
  setup.steps = 2;
  ExecJob job = make_exec_job(setup, "cpu");
  job.threads = 2;
  const nlohmann::json measured = run_job(job);
  const ftplan::Candidate c = ftplan::candidate_from_setup(setup, ftplan::load_hardware("cpu"), ftplan::Strategy::single);
  const auto predicted = ftplan::estimate_memory(job.model, ftplan::load_hardware("cpu"), setup, c).per_gpu;
  const auto& rank = measured["ranks"][0];
  const auto& parts = rank["components"];
  const double peak = rank["peak_memory_bytes"].get<double>();
  CAPTURE(peak, predicted.total, predicted.weights, predicted.gradients, predicted.optimizer, predicted.activations,
          predicted.logits_loss, predicted.temporary, parts.dump());
  std::cout << "[qlora][memory] single: measured " << peak << " B, predicted " << predicted.total << " B ("
            << 100.0 * (peak - predicted.total) / predicted.total << " %), weights " << parts["weights"] << " vs "
            << predicted.weights << "\n";
  CHECK(parts["gradients"].get<int64_t>() == predicted.gradients);
  CHECK(parts["optimizer"].get<int64_t>() == predicted.optimizer);
  CHECK(std::abs(parts["weights"].get<double>() - double(predicted.weights)) < 4.0 * 7 * 2);  // NF4 scale rounding
  CHECK_THAT(peak, Catch::Matchers::WithinRel(double(predicted.total), 0.10));
}

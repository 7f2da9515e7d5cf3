// Framework profiles (configs/frameworks): each shipped profile loads with every value sourced, and the
// behaviours they carry give the figures derived by hand below.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "planner/data_paths.h"
#include "planner/errors.h"
#include "planner/json_fields.h"
#include "planner/framework.h"
#include "planner/hardware_spec.h"
#include "planner/memory_model.h"
#include "planner/model_spec.h"
#include "planner/training_setup.h"

using Catch::Matchers::Contains;
using ftplan::Candidate;
using ftplan::Checkpointing;
using ftplan::Method;
using ftplan::Strategy;

namespace {

ftplan::TrainingSetup job(const std::string& model, const std::string& framework, Method method) {
  ftplan::TrainingSetup s;
  s.model = model;
  s.framework = framework;
  s.method = method;
  ftplan::apply_framework(s, ftplan::framework_profile(framework));
  return s;
}

// The PEFT docs' Llama-2-70B QLoRA jobs: NF4 with double quantisation, r=8 on every block linear, 2 GPUs, 2,048 tokens.
ftplan::TrainingSetup llama2_70b_qlora_2_gpus(const std::string& framework) {
  auto s = job("llama-2-70b", framework, Method::qlora);
  s.lora.rank = 8;
  s.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  s.quantization.double_quant = true;
  s.num_gpus = 2;
  s.seq_len = 2048;
  return s;
}

}  // namespace

TEST_CASE("every shipped profile loads, with a source for every value", "[framework]") {
  const auto names = ftplan::list_frameworks();
  REQUIRE(names.size() >= 6);
  for (const char* want : {"hf", "deepspeed", "fsdp", "lightning", "torchtune", "ftexec"})
    CHECK(std::find(names.begin(), names.end(), want) != names.end());
  for (const auto& name : names) {
    CAPTURE(name);
    const ftplan::FrameworkProfile p = ftplan::load_framework(name);
    CHECK(p.name == name);
    CHECK(p.losses.count(p.loss) == 1);
    CHECK(p.sources.size() >= 35);  // every leaf of the schema, each with its source
    for (const auto& [key, source] : p.sources) CHECK(source.size() >= 8);
  }
}

TEST_CASE("a profile with an unknown key, a missing source or a missing value is refused", "[framework]") {
  nlohmann::json hf = ftplan::read_json_file(ftplan::data_dir() + "/configs/frameworks/hf.json");
  auto bad = hf;
  bad["loading"]["host_copiez"] = {{"value", "none"}, {"source", "a typo of host_copies"}};
  CHECK_THROWS_WITH(ftplan::framework_profile_from_json(bad, "x.json"), Contains("host_copiez") && Contains("unknown key"));
  bad = hf;
  bad["runtime"]["cuda_context_bytes"].erase("source");
  CHECK_THROWS_WITH(ftplan::framework_profile_from_json(bad, "x.json"), Contains("cuda_context_bytes"));
  bad = hf;
  bad["optimizer"]["implementation"]["value"] = "fast";
  CHECK_THROWS_WITH(ftplan::framework_profile_from_json(bad, "x.json"),
                    Contains("implementation") && Contains("not foreach or fused"));
  bad = hf;
  bad["knobs"].erase("compile");
  CHECK_THROWS_WITH(ftplan::framework_profile_from_json(bad, "x.json"), Contains("knobs: compile: missing"));
  bad = hf;  // the allocator only releases cache when memory runs out: the at-OOM slack cannot exceed the other
  bad["runtime"]["reserved_over_allocated_at_oom"]["value"] = 1.2;
  CHECK_THROWS_WITH(ftplan::framework_profile_from_json(bad, "x.json"),
                    Contains("reserved_over_allocated_at_oom: 1.200 is above reserved_over_allocated 1.040"));
}

TEST_CASE("FSDP-1 with LoRA: units mixing frozen and trainable weights hold gradients for all of them", "[framework][memory]") {
  // Llama-2-7B, LoRA r=16 on q_proj,v_proj, pure bf16 (2-byte gradients), FSDP on 8 GPUs.
  // One block: 4 x 4096^2 + 3 x 4096 x 11008 + 2 x 4096 = 202,383,360 parameters; its adapters
  // 2 x 16 x (4096 + 4096) = 262,144. lightning-2024 wraps whole blocks (mixed units): each block's
  // FlatParameter gradient is whole: (202,383,360 + 262,144) x 2 B = 405,291,008 B per block.
  const auto model = ftplan::load_model("llama-2-7b");
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  auto s = job("llama-2-7b", "lightning-2024", Method::lora);
  s.precision = ftplan::Precision::bf16;
  s.num_gpus = 8;
  s.seq_len = 512;
  const Candidate c = ftplan::preset_candidate(Strategy::fsdp, 8, hw, 1, Checkpointing::full, ftplan::Attention::fused);
  SECTION("synchronised every micro-batch: the gradients are sharded over 8 GPUs") {
    s.grad_accum = 1;
    CHECK(ftplan::estimate_memory(model, hw, s, c).per_gpu.gradients == 32 * INT64_C(405291008) / 8);
  }
  SECTION("under no_sync (gradient accumulation) every block's gradient stays unsharded") {
    s.grad_accum = 4;
    CHECK(ftplan::estimate_memory(model, hw, s, c).per_gpu.gradients == 32 * INT64_C(405291008));
  }
  SECTION("adapters wrapped as their own units (hf: PEFT's policy) hold only the adapters' gradients") {
    auto h = job("llama-2-7b", "hf", Method::lora);
    h.precision = ftplan::Precision::bf16;
    h.num_gpus = 8;
    h.seq_len = 512;
    h.grad_accum = 4;  // no_sync keeps them unsharded: 32 x 262,144 x 2 B
    CHECK(ftplan::estimate_memory(model, hw, h, c).per_gpu.gradients == 32 * INT64_C(262144) * 2);
  }
}

TEST_CASE("bitsandbytes 4-bit bytes of one Llama-2-7B block", "[framework][memory]") {
  // The seven block linears hold 4 x 4096^2 + 3 x 4096 x 11008 = 202,375,168 weights: 101,187,584 B
  // of codes and 3,162,112 blocks of 64. Without double quantisation (BitsAndBytesConfig's default)
  // each block has an fp32 absmax: + 12,648,448 B = 113,836,032 B (4.5 bits per weight). The two
  // RMSNorm weights (8,192) are upcast to fp32 by prepare_model_for_kbit_training: + 32,768 B.
  const auto model = ftplan::load_model("llama-2-7b");
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  auto s = job("llama-2-7b", "hf", Method::qlora);
  s.lora.targets = {"q_proj"};
  s.lora.rank = 1;  // adapters: 1 x (4096 + 4096) = 8,192 fp32 parameters under amp, 4 B each
  CHECK_FALSE(s.quantization.double_quant);
  const double adapters = 8192.0 * 4;
  CHECK(ftplan::prepare_job(model, hw, s).layer_weight_bytes == 113836032.0 + 32768.0 + adapters);
  // With double quantisation: an 8-bit absmax per block and an fp32 scale per 256 blocks, tensor by
  // tensor (q,k,v,o: 262,144 blocks, 1,024 scales each; gate, up, down: 704,512 blocks, 2,752 each):
  // 101,187,584 + 3,162,112 + (4 x 1,024 + 3 x 2,752) x 4 = 104,399,104 B.
  s.quantization.double_quant = true;
  CHECK(ftplan::prepare_job(model, hw, s).layer_weight_bytes == 104399104.0 + 32768.0 + adapters);
}

TEST_CASE("chunked vs full loss: the peaks differ by the profile's bytes per token and vocabulary entry", "[framework][memory]") {
  // torchtune: full cross-entropy on fp32 logits peaks at 12 B per token x vocab, the eager chunked
  // loss at 6.5 (the bf16 chunks, the saved fp32 log-softmax, one chunk's upcast). Llama-3.2-1B
  // (vocabulary 128,256), micro-batch 2 x 1,024 tokens, no checkpointing, one GPU:
  // (12 - 6.5) x 2,048 x 128,256 = 1,444,675,584 B less.
  const auto model = ftplan::load_model("llama-3.2-1b");
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  auto s = job("llama-3.2-1b", "torchtune", Method::lora);
  s.seq_len = 1024;
  const Candidate c = ftplan::preset_candidate(Strategy::single, 1, hw, 2, Checkpointing::none, ftplan::Attention::fused);
  s.loss = ftplan::Loss::full;
  const auto full = ftplan::estimate_memory(model, hw, s, c).per_gpu.logits_loss;
  s.loss = ftplan::Loss::chunked;
  const auto chunked = ftplan::estimate_memory(model, hw, s, c).per_gpu.logits_loss;
  CHECK(full == INT64_C(12) * 2048 * 128256);
  CHECK(full - chunked == INT64_C(1444675584));
  // Under compile the chunked loss is compiled with its upcast: 2.5 B at the peak.
  s.compile = true;
  CHECK(ftplan::estimate_memory(model, hw, s, c).per_gpu.logits_loss == INT64_C(5) * 2048 * 128256 / 2);
}

TEST_CASE("host memory: Llama-3.1-70B full fine-tuning with ZeRO-3 offload on one RTX 3090 and 64 GiB of host memory",
          "[framework][memory]") {
  // The GPU holds only gathered units; the host holds fp32 weights (amp, the hf default), fp32
  // gradients and AdamW's two fp32 moments: (4 + 4 + 8) x 70,553,706,496 = 1,128,859,303,936 B, plus
  // the process (3 GiB), during the step; saving gathers the fp32 state dict on rank 0's host beside
  // them (+ 4 x 70,553,706,496 B): far beyond 64 GiB.
  const auto model = ftplan::load_model("llama-3.1-70b");
  const auto hw = ftplan::load_hardware("rtx-3090");
  auto s = job("llama-3.1-70b", "hf", Method::full);
  s.host_memory_gib = 64;
  s.seq_len = 2048;
  const auto e = ftplan::estimate_memory(model, hw, s, ftplan::preset_candidate(Strategy::zero3_offload, s.num_gpus, hw, 1, Checkpointing::full));
  CHECK(e.per_gpu.host == INT64_C(1128859303936));
  CHECK(e.step.host_bytes_per_node == INT64_C(1128859303936) + (INT64_C(3) << 30));
  CHECK(e.save.host_bytes_per_node == e.step.host_bytes_per_node + 4 * INT64_C(70553706496));
  CHECK(e.host_per_node == e.save.host_bytes_per_node);
  CHECK(e.per_gpu.total <= e.usable_bytes);  // the GPU alone would fit ...
  CHECK_FALSE(e.fits);                       // ... the host does not
  CHECK_THAT(e.reason, Contains("out of host memory") && Contains("--host-memory-gib"));
}

TEST_CASE("allocated <= reserved <= device for every strategy and framework", "[framework][memory]") {
  const auto model = ftplan::load_model("llama-3-8b");
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  for (const auto& fw : ftplan::list_frameworks()) {
    for (Method method : {Method::full, Method::lora, Method::qlora}) {
      auto s = job("llama-3-8b", fw, method);
      s.num_gpus = 8;
      s.seq_len = 1024;
      s.grad_accum = 2;
      const auto job_prepared = ftplan::prepare_job(model, hw, s);
      for (Strategy st : ftplan::all_strategies()) {
        for (Checkpointing ck : {Checkpointing::none, Checkpointing::full, Checkpointing::selective}) {
          CAPTURE(fw, ftplan::to_string(method), ftplan::to_string(st), ftplan::to_string(ck));
          const auto e = ftplan::estimate_memory(job_prepared, ftplan::preset_candidate(st, 8, hw, 2, ck, ftplan::Attention::fused), 8);
          CHECK(e.allocated_peak <= e.reserved_peak);
          CHECK(e.reserved_peak <= e.device_peak);
          CHECK(e.device_peak <= e.per_gpu.total);
          CHECK(e.per_gpu.overhead >= 0);
          CHECK(e.step.device_bytes == e.device_peak);
        }
      }
    }
  }
}

TEST_CASE("a knob the framework does not offer, or refuses, is bad input naming both", "[framework]") {
  auto s = job("llama-3-8b", "torchtune", Method::full);
  s.optimizer_in_backward = true;
  s.grad_accum = 4;
  CHECK_THROWS_WITH(ftplan::apply_framework(s, ftplan::framework_profile("torchtune")),
                    Contains("--optimizer-in-backward") && Contains("--grad-accum 4") && Contains("torchtune"));
  s.grad_accum = 1;
  CHECK_NOTHROW(ftplan::apply_framework(s, ftplan::framework_profile("torchtune")));
  auto h = job("llama-3-8b", "hf", Method::full);
  h.activation_offload = true;
  CHECK_THROWS_WITH(ftplan::apply_framework(h, ftplan::framework_profile("hf")),
                    Contains("--activation-offload") && Contains("--framework hf"));
  h.activation_offload = false;
  h.loss = ftplan::Loss::chunked;
  h.given.insert("loss");  // as a job file or --loss records it
  CHECK_THROWS_WITH(ftplan::apply_framework(h, ftplan::framework_profile("hf")),
                    Contains("--loss chunked") && Contains("full, fused-linear"));
  CHECK_THROWS_WITH(ftplan::framework_profile("no-such-framework"), Contains("--framework"));
}

TEST_CASE("torchtune FSDP LoRA: the stated settings of two README rows cannot produce their published figures", "[framework][memory]") {
  // Why the validation cases tt-l2-70b-lora-8xa100 and tt-l2-7b-lora-2x4090 are planned for alpaca rows truncated
  // at 512 tokens rather than the README's stated 4096 / 2048: hand-derived lower bounds of the stated settings.
  const auto a100 = ftplan::load_hardware("a100-80gb-sxm");
  SECTION("Llama-2-70B, LoRA q,k,v r16, 8 GPUs, 4 x 4096 tokens, checkpointing: weights + layer inputs > 24.59 GiB") {
    const auto model = ftplan::load_model("llama-2-70b");
    auto s = job("llama-2-70b", "torchtune", Method::lora);
    s.precision = ftplan::Precision::bf16;
    s.fsdp_version = 1;
    s.num_gpus = 8;
    s.seq_len = 4096;
    s.lora.rank = 16;
    s.lora.targets = {"q_proj", "k_proj", "v_proj"};
    const Candidate c = ftplan::preset_candidate(Strategy::fsdp, 8, a100, 4, Checkpointing::full, ftplan::Attention::fused);
    const auto e = ftplan::estimate_memory(model, a100, s, c);
    // 68,976,648,192 frozen bf16 parameters + 44,564,480 bf16 adapters, sharded over 8: 17,255,303,168 B.
    CHECK(e.per_gpu.weights == (INT64_C(68976648192) + 44564480) * 2 / 8);
    // 80 layer inputs of 4 x 4096 tokens x 8192 x 2 B = 21,474,836,480 B (20 GiB), plus the block recomputed.
    const int64_t checkpoints = INT64_C(80) * 4 * 4096 * 8192 * 2;
    CHECK(checkpoints == INT64_C(21474836480));
    CHECK(e.per_gpu.activations > checkpoints);
    // Together over 36 GiB, the published row 26.4 GB = 24.59 GiB.
    CHECK(e.per_gpu.weights + checkpoints > INT64_C(36) * (INT64_C(1) << 30));  // 36.07 GiB
  }
  SECTION("Llama-2-7B, LoRA q,v r8, 2 GPUs, 4 x 2048 tokens, no checkpointing (7B_lora.yaml): over the 24 GB card") {
    const auto rtx = ftplan::load_hardware("rtx-4090");
    const auto model = ftplan::load_model("llama-2-7b");
    auto s = job("llama-2-7b", "torchtune", Method::lora);
    s.precision = ftplan::Precision::bf16;
    s.fsdp_version = 1;
    s.num_gpus = 2;
    s.seq_len = 2048;
    s.lora.rank = 8;
    s.lora.targets = {"q_proj", "v_proj"};
    const Candidate c = ftplan::preset_candidate(Strategy::fsdp, 2, rtx, 4, Checkpointing::none, ftplan::Attention::fused);
    const auto e = ftplan::estimate_memory(model, rtx, s, c);
    // Per token and layer at least SDPA's q, k, v, output (4 x 4096 x 2 B) and the SiLU-mul's gate and up outputs
    // (2 x 11008 x 2 B) and the two norms' bf16 inputs (2 x 4096 x 2 B): 93,184 B; x 32 layers x 8192 tokens.
    const int64_t floor = INT64_C(32) * 8192 * (4 * 4096 * 2 + 2 * 11008 * 2 + 2 * 4096 * 2);
    CHECK(floor == INT64_C(24427626496));
    CHECK(e.per_gpu.activations > floor);
    CHECK(e.per_gpu.weights + floor > rtx.memory_bytes);
    SECTION("alpaca rows truncated at 512 (torchtune/datasets/_alpaca.py at 0217d44c): a quarter of the activations") {
      auto short_rows = s;
      short_rows.seq_len = 512;
      const auto e512 = ftplan::estimate_memory(model, rtx, short_rows, c);
      CHECK(e512.per_gpu.activations * 4 == Approx(double(e.per_gpu.activations)).epsilon(0.01));
      CHECK(e512.per_gpu.weights == e.per_gpu.weights);
    }
  }
}

TEST_CASE("answerai-fsdp: allocated and reserved peaks of the benchmark's own published pair", "[framework][memory]") {
  // AnswerDotAI/fsdp_qlora benchmarks_03_2024.md L41-L50 at e877dda: Llama-2-7B LoRA (r64 on all seven linears),
  // batch 1, 2 GPUs, FSDP-1, checkpointing: peak allocated 8.28 GiB at context 512 and 9.16 GiB at 2048, peak
  // reserved 10.24 and 10.22 GiB. The profile's reserved_over_allocated is the mean of the two ratios, 1.18.
  using Catch::Matchers::WithinRel;
  const auto model = ftplan::load_model("llama-2-7b");
  const auto hw = ftplan::load_hardware("rtx-3090");
  auto s = job("llama-2-7b", "answerai-fsdp", Method::lora);
  s.num_gpus = 2;
  s.lora.rank = 64;
  s.lora.alpha = 16;
  s.lora.dropout = 0.1;
  s.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  const Candidate c = ftplan::preset_candidate(Strategy::fsdp, 2, hw, 1, Checkpointing::full, ftplan::Attention::fused);
  constexpr double kGiB = 1073741824.0;
  CHECK_THAT((10.24 / 8.28 + 10.22 / 9.16) / 2, Catch::Matchers::WithinAbs(1.18, 0.005));  // 1.176, to 2 places
  SECTION("context 512: allocated within 2% of the published 8.28 GiB, reserved 1.18 x allocated (published 10.24 GiB)") {
    // 8.13 GiB: FSDP-1's adapter gradient shards (0.15 GiB) are freed by zero_grad and re-created during backward,
    // so none is alive at backward's start (8.28 GiB when they were counted).
    s.seq_len = 512;
    const auto e = ftplan::estimate_memory(model, hw, s, c);
    CHECK_THAT(double(e.allocated_peak), WithinRel(8.28 * kGiB, 0.02));
    CHECK_THAT(double(e.reserved_peak), WithinRel(1.18 * double(e.allocated_peak), 1e-6));
    CHECK_THAT(double(e.reserved_peak), WithinRel(10.24 * kGiB, 0.07));
  }
  SECTION("context 2048: allocated within 3% of the published 9.16 GiB, reserved within 9% of 10.22") {
    s.seq_len = 2048;
    const auto e = ftplan::estimate_memory(model, hw, s, c);
    CHECK_THAT(double(e.allocated_peak), WithinRel(9.16 * kGiB, 0.03));
    CHECK_THAT(double(e.reserved_peak), WithinRel(10.22 * kGiB, 0.09));
  }
}

TEST_CASE("fits is judged with the slack the allocator keeps at an OOM, not the cache it releases", "[framework][memory]") {
  // Answer.AI's 2 x RTX 3090, Llama-2-7B LoRA r64 on all linears, batch 4, context 2048 (FSDP NO_SHARD, 'DDP'):
  // published 22.04 GiB reserved, and it ran. The profile's reserved is 1.18 x allocated (a roomy peak), its
  // at-OOM slack the hf profile's 1.04: the device figure shows the cache, the fit counts it out.
  const auto model = ftplan::load_model("llama-2-7b");
  const auto hw = ftplan::load_hardware("rtx-3090");
  auto s = job("llama-2-7b", "answerai-fsdp", Method::lora);
  s.num_gpus = 2;
  s.seq_len = 2048;
  s.lora.rank = 64;
  s.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  s.headroom_fraction = 0;
  const Candidate c = ftplan::preset_candidate(Strategy::ddp, 2, hw, 4, Checkpointing::full, ftplan::Attention::fused);
  const auto e = ftplan::estimate_memory(model, hw, s, c);
  const auto fw = ftplan::framework_profile("answerai-fsdp");
  REQUIRE(fw.reserved_over_allocated == 1.18);
  REQUIRE(fw.reserved_over_allocated_at_oom == 1.04);
  const int64_t fixed = fw.cuda_context_bytes + fw.nccl_bytes_per_gpu;
  CHECK(e.reserved_peak == int64_t(std::ceil(double(e.allocated_peak) * 1.18)));
  CHECK(e.device_peak == e.reserved_peak + fixed);
  CHECK(e.fit_bytes == int64_t(std::ceil(double(e.allocated_peak) * 1.04)) + fixed);
  CHECK(e.device_peak > hw.memory_bytes);  // the cache-inclusive figure is over the card ...
  CHECK(e.fit_bytes < hw.memory_bytes);    // ... what cannot be released is not, and it ran
  CHECK(e.fits);
  SECTION("a profile with one ratio judges fits on the device figure itself") {
    auto h = job("llama-2-7b", "hf", Method::lora);
    h.num_gpus = 2;
    h.seq_len = 2048;
    const auto eh = ftplan::estimate_memory(model, hw, h, c);
    CHECK(eh.fit_bytes == eh.device_peak);
  }
}

TEST_CASE("litgpt unties a tied checkpoint: Llama-3.2-1B gets a separate lm_head", "[framework][memory]") {
  // Llama-3.2-1B ties lm_head to the 128256 x 2048 embedding (config.json tie_word_embeddings). litgpt's
  // convert_hf_checkpoint copies the embedding into lm_head.weight and its finetune recipes never tie, so
  // the model it trains holds 128256 x 2048 = 262,668,288 more bf16 parameters: 525,336,576 bytes.
  const auto tied = ftplan::load_model("llama-3.2-1b");
  REQUIRE(tied.tie_word_embeddings);
  const auto lit = ftplan::model_as_built(tied, ftplan::framework_profile("lightning"));
  CHECK_FALSE(lit.tie_word_embeddings);
  CHECK(ftplan::model_as_built(tied, ftplan::framework_profile("hf")).tie_word_embeddings);
  const auto hw = ftplan::load_hardware("a10g");
  auto s = job("llama-3.2-1b", "lightning", Method::lora);
  s.seq_len = 512;
  const Candidate c = ftplan::preset_candidate(Strategy::single, 1, hw, 1, Checkpointing::none, ftplan::Attention::fused);
  const auto e_tied = ftplan::estimate_memory(tied, hw, s, c);
  const auto e_lit = ftplan::estimate_memory(lit, hw, s, c);
  CHECK(e_lit.per_gpu.weights - e_tied.per_gpu.weights == INT64_C(128256) * 2048 * 2);
}

TEST_CASE("fsdp (accelerate) takes FSDP's published allocated/reserved pair; fits its at-OOM slack", "[framework][memory]") {
  // The one published pair of peaks of a PyTorch FSDP run is Answer.AI's (10.24 vs 8.28 GiB, 10.22 vs 9.16 GiB):
  // the fsdp profile states the same 1.18, and fits with the 1.04 left at an out-of-memory error.
  const auto fsdp = ftplan::framework_profile("fsdp");
  const auto aai = ftplan::framework_profile("answerai-fsdp");
  CHECK(fsdp.reserved_over_allocated == aai.reserved_over_allocated);
  CHECK(fsdp.reserved_over_allocated_at_oom == 1.04);
  const auto model = ftplan::load_model("llama-2-70b");
  const auto hw = ftplan::load_hardware("h100-sxm");
  auto s = job("llama-2-70b", "fsdp", Method::qlora);
  s.num_gpus = 2;
  s.seq_len = 2048;
  const Candidate c = ftplan::preset_candidate(Strategy::fsdp, 2, hw, 2, Checkpointing::full, ftplan::Attention::fused);
  const auto e = ftplan::estimate_memory(model, hw, s, c);
  CHECK(e.reserved_peak == int64_t(std::ceil(double(e.allocated_peak) * 1.18)));
  CHECK(e.fit_bytes >= int64_t(std::ceil(double(e.allocated_peak) * 1.04)) + fsdp.cuda_context_bytes + fsdp.nccl_bytes_per_gpu);
  CHECK(e.fit_bytes < e.device_peak);
}

TEST_CASE("FSDP-1 CPU offload pins a zero gradient beside every FlatParameter's host shard, frozen ones too",
          "[framework][memory]") {
  // FlatParamHandle.init_flat_param_attributes under CPUOffload(offload_params=True): _local_shard pinned and
  // _cpu_grad = zeros_like(_local_shard).pin_memory() for every handle (torch/distributed/fsdp/_flat_param.py at
  // fe03cf69). The PEFT docs' Llama-2-70B QLoRA with FSDP offload on 2 GPUs (fsdp profile, bf16): the frozen
  // FlatParameters hold 68,451,041,280 NF4 weights packed 2 per byte (34,225,520,640 B) and 525,606,912
  // unquantised parameters (embedding, lm_head, norms) in bf16 (sharded QLoRA has no kbit preparation):
  // 1,051,213,824 B; 35,276,734,464 B, 17,638,367,232 B per rank. The trainable adapters' _cpu_grad is the host
  // gradient already counted, and bitsandbytes' statistics (not parameters) stay on the GPU. FSDP-2's offload
  // keeps no such buffer.
  const auto model = ftplan::load_model("llama-2-70b");
  const auto hw = ftplan::load_hardware("h100-sxm");
  auto s = llama2_70b_qlora_2_gpus("fsdp");
  s.precision = ftplan::Precision::bf16;
  CHECK(INT64_C(68451041280) / 2 + (INT64_C(68976648192) - INT64_C(68451041280)) * 2 == INT64_C(35276734464));
  const Candidate c = ftplan::layout_candidate(
      ftplan::parse_parallelism("dp_shard=2,shard=fsdp,offload=optimizer+params", "parallel"), 2, Checkpointing::full);
  s.fsdp_version = 1;
  const auto v1 = ftplan::estimate_memory(model, hw, s, c);
  s.fsdp_version = 2;
  const auto v2 = ftplan::estimate_memory(model, hw, s, c);
  CHECK(v1.per_gpu.host - v2.per_gpu.host == INT64_C(17638367232));
  CHECK(v1.step.host_bytes_per_node - v2.step.host_bytes_per_node == 2 * INT64_C(17638367232));
  CHECK(v1.per_gpu.total == v2.per_gpu.total);  // nothing moves on the GPU
}

TEST_CASE("fsdp: sharded QLoRA keeps the embedding, norms and head in the load dtype (no kbit preparation)", "[framework][memory]") {
  // TRL skips prepare_model_for_kbit_training for sharded QLoRA, and FSDP-1 cannot flatten fp32 norms beside
  // bf16-stored 4-bit weights. The PEFT docs' Llama-2-70B QLoRA, FSDP over 2 GPUs, bf16, no offload, per GPU:
  //   the double-quantised statistics, whole: 1,086,259,200 B;
  //   the NF4 codes, 68,451,041,280 weights x 0.5 B / 2 = 17,112,760,320 B;
  //   the embedding, head and norms, 525,606,912 parameters x 2 B / 2 = 525,606,912 B (hf's fp32: x 4 B);
  //   the bf16 adapters, 103,546,880 x 2 B / 2 = 103,546,880 B; 18,828,173,312 B in all.
  const auto model = ftplan::load_model("llama-2-70b");
  const auto hw = ftplan::load_hardware("h100-sxm");
  const Candidate c = ftplan::preset_candidate(Strategy::fsdp, 2, hw, 2, Checkpointing::full, ftplan::Attention::fused);
  auto qlora = [](const std::string& framework) {
    auto s = llama2_70b_qlora_2_gpus(framework);
    s.precision = ftplan::Precision::bf16;
    return s;
  };
  CHECK(INT64_C(68976648192) - INT64_C(68451041280) == 525606912);
  const int64_t want = INT64_C(1086259200) + INT64_C(17112760320) + INT64_C(525606912) + INT64_C(103546880);
  CHECK(want == INT64_C(18828173312));
  CHECK_FALSE(ftplan::framework_profile("fsdp").fp32_upcast_unquantized);
  CHECK(ftplan::estimate_memory(model, hw, qlora("fsdp"), c).per_gpu.weights == want);
  CHECK(ftplan::framework_profile("hf").fp32_upcast_unquantized);
  CHECK(ftplan::estimate_memory(model, hw, qlora("hf"), c).per_gpu.weights == want + INT64_C(525606912));
}

TEST_CASE("fsdp-2024 and deepspeed-2024: bitsandbytes 0.43.0's MatMul4Bit keeps each 4-bit linear's input", "[framework][memory]") {
  // The PEFT docs' March 2024 QLoRA runs (bitsandbytes>=0.43.0; 0.43.2 dropped the input, bitsandbytes#1270):
  // MatMul4Bit.forward keeps ctx.tensors = (A, B). Llama-2-70B, LoRA r=8 with dropout 0.1 on every block linear
  // (so no adapter keeps the base's input), 2 x 2048 tokens, full checkpointing: only the recomputed block
  // gains the inputs of its 4-bit linears, bf16: q/k/v's shared input and gate/up's (2 x 8192), o_proj's (8192)
  // and down_proj's (28672): 2 B x 4096 tokens x 53,248 = 436,207,616 B.
  CHECK(2 * 4096 * (8192 + 8192 + 8192 + 28672) == 436207616);
  const auto model = ftplan::load_model("llama-2-70b");
  const auto hw = ftplan::load_hardware("h100-sxm");
  const Candidate c = ftplan::preset_candidate(Strategy::fsdp, 2, hw, 2, Checkpointing::full, ftplan::Attention::fused);
  const Candidate z = ftplan::preset_candidate(Strategy::zero3, 2, hw, 2, Checkpointing::full, ftplan::Attention::fused);
  auto qlora = [](const std::string& framework) {
    auto s = llama2_70b_qlora_2_gpus(framework);
    s.lora.dropout = 0.1;
    return s;
  };
  CHECK_FALSE(ftplan::framework_profile("fsdp").quantized_matmul_saves_input);
  CHECK(ftplan::framework_profile("fsdp-2024").quantized_matmul_saves_input);
  CHECK(ftplan::framework_profile("deepspeed-2024").quantized_matmul_saves_input);
  const auto now = ftplan::estimate_memory(model, hw, qlora("fsdp"), c);
  const auto then = ftplan::estimate_memory(model, hw, qlora("fsdp-2024"), c);
  CHECK(then.per_gpu.activations - now.per_gpu.activations == INT64_C(436207616));
  CHECK(then.per_gpu.weights == now.per_gpu.weights);
  const auto ds_now = ftplan::estimate_memory(model, hw, qlora("deepspeed"), z);
  const auto ds_then = ftplan::estimate_memory(model, hw, qlora("deepspeed-2024"), z);
  CHECK(ds_then.per_gpu.activations - ds_now.per_gpu.activations == INT64_C(436207616));
  // The 2024 profiles are their parents otherwise: the allocator ratios, the ZeRO bucket.
  CHECK(ftplan::framework_profile("fsdp-2024").reserved_over_allocated == ftplan::framework_profile("fsdp").reserved_over_allocated);
  CHECK_FALSE(ftplan::framework_profile("deepspeed-2024").zero_bucket_is_hidden_squared);
}

TEST_CASE("torchtune-2024: torchao 0.1 quantises while loading, and the step's reserved figure keeps that cache",
          "[framework][memory]") {
  // torchtune's April 2024 QLoRA tutorial (qlora_finetune.rst at 0914d5cf): Llama-2-7B, q,k,v,o and the MLP
  // quantised, r 8, batch 2, checkpointing on. torchao 0.1's to_nf4 holds, for one weight, its bf16 input (2 B
  // per element), the scaled blocks (2 B) and quantize_tensor_nearest's [numel, 16] bf16 difference and its
  // abs (32 + 32 B): 68 B per element of the largest quantised weight, gate/up/down's 4096 x 11008 =
  // 45,088,768 elements: 3,066,036,224 B on top of the model while it loads.
  // The model: per block the NF4 codes and double-quantised statistics of 202,375,168 weights (104,399,104 B,
  // the bitsandbytes test above), two bf16 norms (16,384 B) and bf16 adapters of rank 8 (4 x 8 x 8,192 +
  // 3 x 8 x 15,104 = 624,640 parameters: 1,249,280 B): 105,664,768 B x 32 = 3,381,272,576 B; the bf16
  // embedding and output (2 x 32000 x 4096 x 2 B = 524,288,000 B) and the final norm (8,192 B): 3,905,568,768 B.
  const auto model = ftplan::load_model("llama-2-7b");
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  auto s = job("llama-2-7b", "torchtune-2024", Method::qlora);
  s.lora.rank = 8;
  s.lora.alpha = 16;
  s.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  s.quantization.double_quant = true;
  s.seq_len = 1304;
  s.headroom_fraction = 0;
  const Candidate c = ftplan::preset_candidate(Strategy::single, 1, hw, 2, Checkpointing::full, ftplan::Attention::fused);
  const auto fw = ftplan::framework_profile("torchtune-2024");
  REQUIRE(fw.quantize_transient_bytes_per_element == 68);
  REQUIRE(fw.step_reserved_keeps_load_cache);
  const auto e = ftplan::estimate_memory(model, hw, s, c);
  CHECK(e.per_gpu.weights == INT64_C(3905568768));
  const int64_t load_allocated = INT64_C(3905568768) + INT64_C(3066036224) + fw.cublas_workspace_bytes;
  const int64_t load_reserved = int64_t(std::ceil(double(load_allocated) * fw.reserved_over_allocated));
  CHECK(e.load.device_bytes == load_reserved + fw.cuda_context_bytes);
  // The step's own allocations are below the load's (activations of 2 x 1,304 tokens with checkpointing), and
  // no empty_cache runs between them: the step's reserved and device figures are the load's; allocated is the step's.
  CHECK(e.allocated_peak < load_allocated);
  CHECK(e.reserved_peak == load_reserved);
  CHECK(e.device_peak == load_reserved + fw.cuda_context_bytes);
  CHECK(e.fit_bytes == e.device_peak);  // the profile's two ratios agree: the load's figure is what fits reads
  SECTION("torchtune 0.4+ (the torchtune profile): torchao's chunked quantiser at load, the step's own reserved figure") {
    // torchao since pytorch/ao#196 searches the nearest code in chunks of 1024^2 elements: the bf16 input (2 B), the
    // scaled blocks (2 B), a uint8 code per element (1 B) and the two halves of the packing (0.5 + 0.5 B): 6 B.
    auto t = job("llama-2-7b", "torchtune", Method::qlora);
    t.lora = s.lora;
    t.quantization.double_quant = true;
    t.seq_len = 1304;
    t.loss = ftplan::Loss::full;  // torchtune 0.1's loss; the current recipes drop the fp32 logits before backward
    const auto et = ftplan::estimate_memory(model, hw, t, c);
    const auto ft = ftplan::framework_profile("torchtune");
    CHECK(et.load.device_bytes == int64_t(std::ceil(double(INT64_C(3905568768) + INT64_C(45088768) * 6 + ft.cublas_workspace_bytes) *
                                                    ft.reserved_over_allocated)) + ft.cuda_context_bytes);
    CHECK(et.reserved_peak == int64_t(std::ceil(double(et.allocated_peak) * ft.reserved_over_allocated)));
    // The step differs only by the recipe's fp32 logits kept through backward: 4 B x 2 x 1304 x 32000 = 333,824,000 B.
    CHECK(std::llabs(e.allocated_peak - et.allocated_peak - INT64_C(333824000)) <= 1);
  }
}

TEST_CASE("lightning's 4-bit matmul holds the fp16 dequantised weight and its bf16 cast together", "[framework][memory]") {
  // Lightning's BitsandbytesPrecision quantises from an fp16 copy, so bitsandbytes' QuantState.dtype is fp16 and
  // MatMul4Bit runs F.dequantize_4bit(B, state).to(bf16): two [out, in] copies of 2 B alive at once. litgpt
  // quantises every nn.Linear, the head too: Llama-3-8B's 128256 x 4096 = 525,336,576-element lm_head is the
  // largest, 2 x 2 x 525,336,576 = 2,101,346,304 B. The hf profile (PEFT) keeps the head in bf16 and quantises
  // in bf16 (no cast): one 2 B copy of the largest block linear, 14336 x 4096: 117,440,512 B.
  const auto model = ftplan::load_model("llama-3-8b");
  const auto hw = ftplan::load_hardware("a10g");
  auto s = job("llama-3-8b", "lightning-2024", Method::qlora);
  s.seq_len = 512;
  REQUIRE(ftplan::framework_profile("lightning-2024").dequant_weights_alive == 2);
  CHECK(ftplan::prepare_job(model, hw, s).dequant_bytes == INT64_C(2101346304));
  // Loading re-quantises the head from an fp16 copy (2 B) into packed codes (0.5 B) and an fp32 absmax per 64
  // (0.0625 B) while the old codes are held: 525,336,576 x 2.5625 = 1,346,174,976 B.
  CHECK(ftplan::prepare_job(model, hw, s).load_quantize_bytes == INT64_C(1346174976));
  auto h = job("llama-3-8b", "hf", Method::qlora);
  h.seq_len = 512;
  CHECK(ftplan::prepare_job(model, hw, h).dequant_bytes == INT64_C(117440512));
}

TEST_CASE("torchtune-2024 keeps the recipe's fp32 logits through backward: 16 B per token and vocabulary entry",
          "[framework][memory]") {
  // Before pytorch/torchtune#1235 (July 2024) the recipe's `logits` local (fp32, [tokens, vocab]) stayed referenced
  // through loss.backward(): at log_softmax's backward the logits, the saved log-softmax, nll_loss's gradient and
  // log_softmax's input gradient are alive, 4 x 4 B, against 3 x 4 B once the local is deleted. Llama-2-7B LoRA at
  // 4 x 2048 tokens (the May 2024 README's single-RTX-4090 row): 4 B x 8192 x 32000 = 1,048,576,000 B more.
  const auto model = ftplan::load_model("llama-2-7b");
  const auto hw = ftplan::load_hardware("rtx-4090");
  const Candidate c = ftplan::preset_candidate(Strategy::single, 1, hw, 4, Checkpointing::full, ftplan::Attention::fused);
  auto old_job = job("llama-2-7b", "torchtune-2024", Method::lora);
  CHECK(old_job.loss == ftplan::Loss::full);  // torchtune 0.1's default: torch.nn.CrossEntropyLoss
  auto new_job = job("llama-2-7b", "torchtune", Method::lora);
  new_job.loss = ftplan::Loss::full;
  for (auto* s : {&old_job, &new_job}) {
    s->seq_len = 2048;
    s->lora.targets = {"q_proj", "v_proj"};
  }
  const auto e_old = ftplan::estimate_memory(model, hw, old_job, c);
  const auto e_new = ftplan::estimate_memory(model, hw, new_job, c);
  CHECK(std::llabs(e_old.per_gpu.logits_loss - e_new.per_gpu.logits_loss - INT64_C(1048576000)) <= 1);
  CHECK(e_old.per_gpu.activations == e_new.per_gpu.activations);
}

// The PEFT docs' Llama-2-70B LoRA jobs: r=8 on every block linear, 8 GPUs, 2,048 tokens.
ftplan::TrainingSetup llama2_70b_lora_8_gpus(const std::string& framework, ftplan::Precision precision) {
  auto s = job("llama-2-70b", framework, Method::lora);
  s.precision = precision;
  s.lora.rank = 8;
  s.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  s.num_gpus = 8;
  s.seq_len = 2048;
  return s;
}

TEST_CASE("fsdp (accelerate): a LoRA base loaded in fp32 is sharded in fp32, and loaded on rank 0 only", "[framework][memory]") {
  // PEFT's FSDP example loads a non-quantised base with torch_dtype float32 (examples/sft/utils.py) and
  // accelerate's FSDP keeps each FlatParameter in the loaded dtype; fsdp_cpu_ram_efficient_loading (accelerate
  // config's default) materialises the checkpoint on rank 0 only. Llama-2-70B (68,976,648,192 base
  // parameters), LoRA r=8 on every block linear (80 x 8 x ((8192 + 8192) x 2 + (8192 + 1024) x 2 +
  // (8192 + 28672) x 3) = 103,546,880 fp32 adapter parameters), amp, FULL_SHARD over 8 GPUs:
  //   fsdp: (68,976,648,192 + 103,546,880) x 4 / 8 = 34,540,097,536 B per rank;
  //   hf (base loaded in bf16): 68,976,648,192 x 2 / 8 + 103,546,880 x 4 / 8 = 17,295,935,488 B.
  // Loading, per node: 8 processes + one fp32 copy (fsdp: 276,320,780,288 B) against one bf16 copy per
  // rank (hf: 8 x 138,367,483,904 B).
  const auto model = ftplan::load_model("llama-2-70b");
  const auto hw = ftplan::load_hardware("h100-sxm");
  auto lora = [](const std::string& framework) { return llama2_70b_lora_8_gpus(framework, ftplan::Precision::amp); };
  const Candidate c = ftplan::preset_candidate(Strategy::fsdp, 8, hw, 1, Checkpointing::full, ftplan::Attention::fused);
  const int64_t base = INT64_C(68976648192), adapters = INT64_C(103546880);
  CHECK(80 * 8 * ((8192 + 8192) * 2 + (8192 + 1024) * 2 + (8192 + 28672) * 3) == adapters);
  CHECK((base + adapters) * 4 / 8 == INT64_C(34540097536));
  CHECK(base * 2 / 8 + adapters * 4 / 8 == INT64_C(17295935488));
  const auto fsdp = ftplan::estimate_memory(model, hw, lora("fsdp"), c);
  const auto hf = ftplan::estimate_memory(model, hw, lora("hf"), c);
  CHECK(fsdp.per_gpu.weights == INT64_C(34540097536));
  CHECK(hf.per_gpu.weights == INT64_C(17295935488));
  const auto f = ftplan::framework_profile("fsdp"), h = ftplan::framework_profile("hf");
  CHECK(fsdp.load.host_bytes_per_node == 8 * int64_t(f.host_process_bytes_per_rank) + INT64_C(276320780288));
  CHECK(hf.load.host_bytes_per_node == 8 * int64_t(h.host_process_bytes_per_rank) + 8 * INT64_C(138367483904));
  SECTION("saving: a full state dict is gathered whole on rank 0's host before PEFT keeps the adapters") {
    // accelerate's get_state_dict / save_fsdp_model call model.state_dict() under FULL_STATE_DICT(offload_to_cpu,
    // rank0_only) and PEFT filters it afterwards: rank 0 holds the whole model as stored, fsdp's fp32 base and
    // adapters (276,320,780,288 B) and hf's bf16 base with fp32 adapters (68,976,648,192 x 2 + 103,546,880 x 4 =
    // 138,367,483,904 B), not the 414,187,520 B of adapters it writes; ftexec writes the adapter alone.
    CHECK(base * 2 + adapters * 4 == INT64_C(138367483904));
    CHECK(fsdp.save.host_bytes_per_node == 8 * int64_t(f.host_process_bytes_per_rank) + INT64_C(276320780288));
    CHECK(hf.save.host_bytes_per_node == 8 * int64_t(h.host_process_bytes_per_rank) + INT64_C(138367483904));
    auto own = lora("ftexec");
    own.precision = ftplan::Precision::amp;
    const auto ex = ftplan::estimate_memory(model, hw, own, c);
    const auto x = ftplan::framework_profile("ftexec");
    CHECK_FALSE(x.full_state_dict_holds_frozen);
    CHECK(ex.save.host_bytes_per_node == 8 * int64_t(x.host_process_bytes_per_rank) + adapters * 4);
  }
}

TEST_CASE("saving a full state dict: FSDP-1 keeps its root unit gathered while each block is gathered", "[framework][memory]") {
  // FSDP-1 unshards a unit in its state_dict pre-hook and reshards it in the post-hook, and the root's hooks
  // run around its children's, so on rank 0 the root unit (embedding, final norm, lm_head) and one block are
  // gathered together, in the stored dtype (_state_dict_utils.py _full_pre_state_dict_hook); FSDP-2 gathers
  // one parameter at a time (the largest unit bounds it). Llama-2-7B full fine-tune, hf, amp (fp32 parameters),
  // FULL_SHARD over 8 GPUs:
  //   root  = (32,000 x 4,096 embedding + 32,000 x 4,096 lm_head + 4,096 norm) x 4 B = 1,048,592,384 B
  //   block = (4 x 4,096^2 + 3 x 4,096 x 11,008 + 2 x 4,096) x 4 B = 809,533,440 B
  // save device = ceil((weights + optimizer + gathered + cuBLAS workspace) x 1.04) + CUDA context + NCCL.
  const auto model = ftplan::load_model("llama-2-7b");
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  const auto fw = ftplan::framework_profile("hf");
  const int64_t root = (INT64_C(32000) * 4096 * 2 + 4096) * 4, block = (INT64_C(4) * 4096 * 4096 + INT64_C(3) * 4096 * 11008 + 2 * 4096) * 4;
  CHECK(root == INT64_C(1048592384));
  CHECK(block == INT64_C(809533440));
  auto s = job("llama-2-7b", "hf", Method::full);
  s.precision = ftplan::Precision::amp;
  s.num_gpus = 8;
  s.seq_len = 1024;
  const Candidate c = ftplan::preset_candidate(Strategy::fsdp, 8, hw, 1, Checkpointing::full, ftplan::Attention::fused);
  auto save_device = [&](const ftplan::MemoryEstimate& e, int64_t gathered) {
    const double allocated = double(e.per_gpu.weights + e.per_gpu.optimizer + gathered + fw.cublas_workspace_bytes);
    return int64_t(std::ceil(allocated * fw.reserved_over_allocated)) + fw.cuda_context_bytes + fw.nccl_bytes_per_gpu;
  };
  SECTION("FSDP-1: the root unit and one block") {
    s.fsdp_version = 1;
    const auto e = ftplan::estimate_memory(model, hw, s, c);
    CHECK(e.save.device_bytes == save_device(e, root + block));
  }
  SECTION("FSDP-2: one unit at a time, at most the largest") {
    s.fsdp_version = 2;
    const auto e = ftplan::estimate_memory(model, hw, s, c);
    CHECK(e.save.device_bytes == save_device(e, block));
  }
}

TEST_CASE("saving a sharded state dict: accelerate before 0.31 leaves every cloned chunk on the GPU", "[framework][memory]") {
  // FSDP-1's SHARDED_STATE_DICT gathers each unit as the full one does (the root throughout), then clones this
  // rank's chunk of every parameter (_create_chunk_sharded_tensor: chunks[rank].clone()); accelerate 0.28-0.30
  // passes no ShardedStateDictConfig, so offload_to_cpu=False and the chunks stay on the GPU until written
  // (fsdp-2024); 0.31+ moves each to the host at once (fsdp). A local state dict holds views of the flat shards.
  // The chunks reuse the step's cached blocks: the save's reserved figure is its allocated one.
  // The PEFT docs' Llama-2-70B QLoRA, FSDP-1 with CPU offload over 2 GPUs:
  //   chunk: the FlatParameters hold the frozen 35,276,734,464 B (the _cpu_grad test above) and the bf16
  //          adapters, 103,546,880 x 2 B: 35,483,828,224 B, 17,741,914,112 B per rank (bitsandbytes'
  //          statistics are not parameters: resident, not cloned);
  //   root:  (2 x 32,000 x 8,192 + 8,192) x 2 B = 1,048,592,384 B, gathered for the whole save;
  //   block: 855,638,016 NF4 codes x 0.5 B + 13,578,240 B of double-quantised statistics + 2 x 8,192 x 2 B of
  //          norms + 1,294,336 adapter parameters x 2 B = 444,018,688 B, one gathered at a time.
  const auto model = ftplan::load_model("llama-2-70b");
  const auto hw = ftplan::load_hardware("h100-sxm");
  const int64_t chunk = (INT64_C(35276734464) + INT64_C(103546880) * 2) / 2;
  CHECK(chunk == INT64_C(17741914112));
  const int64_t root = (INT64_C(2) * 32000 * 8192 + 8192) * 2;
  const int64_t block = INT64_C(855638016) / 2 + INT64_C(13578240) + 2 * 8192 * 2 + INT64_C(1294336) * 2;
  CHECK(root == INT64_C(1048592384));
  CHECK(block == INT64_C(444018688));
  auto s = llama2_70b_qlora_2_gpus("fsdp-2024");
  s.precision = ftplan::Precision::bf16;
  s.fsdp_version = 1;
  const Candidate c = ftplan::layout_candidate(
      ftplan::parse_parallelism("dp_shard=2,shard=fsdp,offload=optimizer+params", "parallel"), 2, Checkpointing::full);
  const auto full = ftplan::estimate_memory(model, hw, s, c);
  s.state_dict = ftplan::StateDict::local;
  const auto local = ftplan::estimate_memory(model, hw, s, c);
  CHECK_FALSE(ftplan::framework_profile("fsdp-2024").sharded_state_dict_offload_to_cpu);
  CHECK(ftplan::framework_profile("fsdp").sharded_state_dict_offload_to_cpu);
  SECTION("fsdp-2024: the root, one block and a second copy of the shard on the GPU; the save the peak") {
    s.state_dict = ftplan::StateDict::sharded;
    const auto e = ftplan::estimate_memory(model, hw, s, c);
    CHECK(std::llabs(e.save.reserved_bytes - local.save.reserved_bytes - (root + block + chunk)) <= 2);
    const auto& fw = ftplan::framework_profile("fsdp-2024");
    CHECK(e.save.device_bytes == e.save.reserved_bytes + fw.cuda_context_bytes + fw.nccl_bytes_per_gpu);
    CHECK(e.step.device_bytes == full.step.device_bytes);
    CHECK(e.peak_phase == "save");
    CHECK(full.peak_phase == "step");
    CHECK(e.save.host_bytes_per_node <= full.save.host_bytes_per_node);  // nothing reaches the host
  }
  SECTION("fsdp (accelerate 0.31+): the chunks go to the host, each rank its whole shard") {
    s.framework = "fsdp";
    s.state_dict = ftplan::StateDict::local;
    const auto l = ftplan::estimate_memory(model, hw, s, c);
    s.state_dict = ftplan::StateDict::sharded;
    const auto e = ftplan::estimate_memory(model, hw, s, c);
    CHECK(std::llabs(e.save.reserved_bytes - l.save.reserved_bytes - (root + block)) <= 2);  // the gathers, no chunk
    CHECK(e.save.host_bytes_per_node - l.save.host_bytes_per_node == 2 * chunk);
  }
  SECTION("a local state dict holds views of the flat shards: nothing gathered, nothing copied") {
    CHECK(local.save.host_bytes_per_node <= full.save.host_bytes_per_node);
    CHECK(local.save.device_bytes < full.save.device_bytes);
  }
}

// hf-liger: Liger-Kernel's kernels patched into transformers (monkey_patch.py defaults): the fused linear
// cross-entropy by default, fused RMSNorm/SwiGLU activations, and no eager element-wise surplus.
TEST_CASE("hf-liger: Liger's fused kernels, in one profile that extends hf", "[framework]") {
  const auto& hf = ftplan::framework_profile("hf");
  const auto& liger = ftplan::framework_profile("hf-liger");
  CHECK_FALSE(hf.fused_norm_mlp_kernels);
  CHECK(liger.fused_norm_mlp_kernels);
  CHECK(liger.loss == ftplan::Loss::fused_linear);
  CHECK(hf.loss == ftplan::Loss::full);
  // A fused kernel's bytes: the surplus over one kernel (4, 4 and 6 B) is zero.
  CHECK(liger.eager_norm_bytes_per_hidden == 4);
  CHECK(liger.eager_rope_bytes_per_element == 4);
  CHECK(liger.eager_mlp_act_bytes_per_intermediate == 6);
  // Everything else is hf's: the allocator, the attention's repeated k and v.
  CHECK(liger.reserved_over_allocated == hf.reserved_over_allocated);
  CHECK(liger.gqa_kv_repeated == hf.gqa_kv_repeated);
}

TEST_CASE("deepspeed ZeRO-3 keeps its contiguous-gradients bucket: reduce_bucket_size elements in the parameters' dtype", "[framework][memory]") {
  // DeepSpeed's stage-3 optimizer allocates the IPG bucket (reduce_bucket_size elements, the trainable
  // parameters' dtype) at initialisation when contiguous_gradients (its default) and never frees it. A
  // Trainer --deepspeed JSON with 'auto' gets hidden^2 (hf); accelerate's config-file launch (deepspeed) writes
  // no reduce_bucket_size, so DeepSpeed's default 5e8 applies. The PEFT docs' Llama-2-70B LoRA (r=8 on every block linear,
  // bf16 under DeepSpeed) with ZeRO-3 on 8 H100s: one block 855,654,400 base + 8 x ((8192 + 8192) x 2 +
  // (8192 + 1024) x 2 + (8192 + 28672) x 3) = 1,294,336 adapter parameters, all bf16 when gathered: 1,713,897,472 B; the largest gathered unit (a block, above
  // the 262,144,000-parameter embedding and head) + one prefetched block + the block's adapter gradients
  // (1,294,336 x 2 B) = 3,430,383,616 B; the bucket adds 500,000,000 x 2 B = 1,000,000,000 B (hf: 8192^2 x 2 B
  // = 134,217,728 B).
  const auto model = ftplan::load_model("llama-2-70b");
  const auto hw = ftplan::load_hardware("h100-sxm");
  auto lora = [](const std::string& framework) { return llama2_70b_lora_8_gpus(framework, ftplan::Precision::mixed); };
  const int64_t block = INT64_C(855654400), adapters = 8 * ((8192 + 8192) * 2 + (8192 + 1024) * 2 + (8192 + 28672) * 3);
  CHECK(adapters == 1294336);
  const int64_t gathered = 2 * (block + adapters) * 2 + adapters * 2;
  CHECK(gathered == INT64_C(3430383616));
  const Candidate c = ftplan::preset_candidate(Strategy::zero3, 8, hw, 1, Checkpointing::full, ftplan::Attention::fused);
  CHECK(ftplan::framework_profile("deepspeed").zero3_contiguous_gradients_buffer);
  CHECK_FALSE(ftplan::framework_profile("deepspeed").zero_bucket_is_hidden_squared);
  CHECK(ftplan::estimate_memory(model, hw, lora("deepspeed"), c).per_gpu.temporary == gathered + INT64_C(1000000000));
  // HF Trainer's ZeRO-3 is the same DeepSpeed code (the deepspeed profile inherits the key from hf), with the
  // JSON's 'auto' bucket; ftexec reduce-scatters each unit's own gradient and keeps no bucket.
  CHECK(ftplan::framework_profile("hf").zero3_contiguous_gradients_buffer);
  CHECK(ftplan::framework_profile("hf").zero_bucket_is_hidden_squared);
  CHECK(ftplan::estimate_memory(model, hw, lora("hf"), c).per_gpu.temporary == gathered + INT64_C(8192) * 8192 * 2);
  CHECK_FALSE(ftplan::framework_profile("ftexec").zero3_contiguous_gradients_buffer);
}

// Liger-Kernel's examples/huggingface runs of Llama-3-8B (run_llama.sh at 4d4d9c6): a full fine-tune through the
// HF Trainer with FSDP-1 on 4 A100s at batch 48 per device, accelerate's fp32 upcast of the flat parameters (amp).
ftplan::TrainingSetup liger_llama3_8b_batch48(const std::string& framework) {
  auto s = job("llama-3-8b", framework, Method::full);
  s.precision = ftplan::Precision::amp;
  s.num_gpus = 4;
  s.micro_batch = 48;
  return s;
}

TEST_CASE("hf, FSDP-1 full fine-tune of Llama-3-8B: each padded token costs what Liger's 20-step log measures", "[framework][memory]") {
  // Liger-Kernel's examples/huggingface/llama_B_48_no_patching.log at 4d4d9c6 (plain transformers 4.43.3 + TRL,
  // FSDP-1 full_shard over 4 A100s, activation checkpointing, batch 48 per device, Alpaca padded per batch to a
  // multiple of 16 tokens, run_llama.sh at the same commit): rank 0's per-step max_memory_allocated takes the
  // values 40,119.50, 41,463.32, 42,807.18, 44,151.09, 45,495.05, 46,839.06 ... 68,349.51 MiB: one lattice whose
  // step is what 16 more padded tokens in each of the 48 rows add, (68,349.51 - 40,119.50) / 21 = 1,344.29 MiB
  // and 1,343.82..1,344.01 between neighbours. The planner's per-token terms (the 12 B x 128,256 fp32 loss, the
  // checkpointed layer inputs, the recomputed layer) must add the same: 1,344 MiB per 16 tokens within 0.1%.
  const auto model = ftplan::load_model("llama-3-8b");
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  auto s = liger_llama3_8b_batch48("hf");
  const Candidate c = ftplan::preset_candidate(Strategy::fsdp, 4, hw, 48, Checkpointing::full, ftplan::Attention::fused);
  auto allocated_mib = [&](int64_t tokens) {
    s.seq_len = tokens;
    return double(ftplan::estimate_memory(model, hw, s, c).allocated_peak) / (1 << 20);
  };
  for (int64_t tokens : {128, 256, 400, 496}) {
    CAPTURE(tokens);
    CHECK_THAT(allocated_mib(tokens + 16) - allocated_mib(tokens), Catch::Matchers::WithinRel(1344.0, 0.001));
  }
}

TEST_CASE("hf, FSDP-1 full fine-tune of Llama-3-8B: the optimizer step's peak is what Liger's logs measure", "[framework][memory]") {
  // With Liger's fused linear cross-entropy the forward-backward stays below the optimizer step, so rank 0's
  // max_memory_allocated is the step's own figure, the same at every batch length: 38,307.8 MiB (+-0.2) in all 19
  // logged steps of each of llama_B_48_pre_init_patching.log and llama_B_48_post_init_class_patching.log (losses
  // 1.3-1.4; Liger-Kernel examples/huggingface at 4d4d9c6: transformers 4.43.3 + TRL, FSDP-1 full_shard over 4 A100s,
  // batch 48; the instance-patching runs beside them, whose patch broke the loss, peak the same), and in the
  // short-batch steps 7-9 of the unpatched run
  // results/llama_use_liger_False_patching_type_None.log at 38411af. By hand: 8,030,261,248 parameters / 4 ranks in
  // fp32, as weights, gradients, AdamW's two states and foreach AdamW's sqrt of the second moment: 5 x 4 B x
  // 2,007,565,312 = 40,151,306,240 B = 38,291.3 MiB, and cuBLAS's workspace.
  const auto model = ftplan::load_model("llama-3-8b");
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  auto s = liger_llama3_8b_batch48("hf-liger");
  s.seq_len = 64;
  const Candidate c = ftplan::preset_candidate(Strategy::fsdp, 4, hw, 48, Checkpointing::full, ftplan::Attention::fused);
  const auto e = ftplan::estimate_memory(model, hw, s, c);
  CHECK(e.peak_moment == "optimizer step");
  CHECK(e.per_gpu.weights == INT64_C(8030261248) * 4 / 4);
  CHECK(e.per_gpu.gradients + e.per_gpu.optimizer + e.per_gpu.temporary == 4 * e.per_gpu.weights);
  CHECK_THAT(double(e.allocated_peak) / (1 << 20), Catch::Matchers::WithinRel(38307.8, 0.001));
  SECTION("at the batch lengths the same data reaches, FSDP-1's freed gradient shards keep forward-backward below it") {
    // The unpatched run's rank 0 reached about 480 padded tokens (its top peak, 68,349.51 MiB, is the planner's
    // figure at 480 within 0.4%) in steps whose 4-rank mean was at most 368 tokens (num_input_tokens_seen / 192
    // rows); the patched runs' steps reach means of 388 and 408, so their long steps are at least as long.
    // zero_grad(set_to_none) frees the 2,007,565,312 B of fp32 gradient shards each step; counted at backward's
    // start they would lift forward-backward at 480 tokens to 42.7 GiB, above every logged step. Freed, the
    // step's figure holds (the end of backward, every shard re-created and the root's gradient assembled, stays
    // below it).
    s.seq_len = 480;
    const auto at480 = ftplan::estimate_memory(model, hw, s, c);
    CHECK(at480.peak_moment == "optimizer step");
    CHECK_THAT(double(at480.allocated_peak) / (1 << 20), Catch::Matchers::WithinRel(38307.8, 0.001));
    auto plain = liger_llama3_8b_batch48("hf");
    plain.seq_len = 480;
    CHECK_THAT(double(ftplan::estimate_memory(model, hw, plain, c).allocated_peak) / (1 << 20),
               Catch::Matchers::WithinRel(68349.51, 0.004));
  }
}

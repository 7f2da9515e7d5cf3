// The memory model against figures derived by hand or published: PEFT's trainable counts, the ZeRO
// paper's model-state memory, the bytes-per-parameter conventions, one Llama-3-8B block's activations
// tensor by tensor, and properties that must hold over many configurations.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/activation_memory.h"
#include "planner/data_paths.h"
#include "planner/hardware_spec.h"
#include "planner/json_fields.h"
#include "planner/memory_model.h"
#include "planner/model_spec.h"
#include "planner/precision.h"
#include "planner/training_setup.h"

using Catch::Matchers::WithinRel;
using ftplan::load_model;
using ftplan::Attention;
using ftplan::Candidate;
using ftplan::Checkpointing;
using ftplan::Method;
using ftplan::Strategy;

namespace {

ftplan::TrainingSetup make_setup(const std::string& model, Method method, int64_t gpus, int64_t seq_len) {
  ftplan::TrainingSetup s;
  s.framework = "ftexec";  // the formulas checked here are ftexec's behaviour; profiles: test_framework.cpp
  s.model = model;
  s.method = method;
  s.num_gpus = gpus;
  s.seq_len = seq_len;
  return s;
}

int64_t model_states(const ftplan::MemoryEstimate& e) {
  return e.per_gpu.weights + e.per_gpu.gradients + e.per_gpu.optimizer;
}

// The shipped models used by the property tests (small and large, GQA and not, tied and untied).
const std::vector<std::string> kModels = {"tinyllama-1.1b", "llama-2-7b", "llama-3-8b", "mistral-7b",
                                          "qwen2-0.5b", "llama-3.2-1b", "codellama-34b"};

}  // namespace

TEST_CASE("PEFT trainable counts", "[memory]") {
  SECTION("Llama-2-7B, r=8 on q_proj,v_proj: 4,194,304 (PEFT's print_trainable_parameters)") {
    // Per layer: q_proj and v_proj are 4096 -> 4096; A is r x in, B is out x r:
    // 2 modules x 8 x (4096 + 4096) = 131,072; x 32 layers = 4,194,304.
    const auto model = load_model("llama-2-7b");
    auto setup = make_setup("llama-2-7b", Method::lora, 1, 2048);
    setup.lora.rank = 8;
    const auto t = ftplan::trainable_params(model, setup);
    CHECK(t.trainable == 4'194'304);
    CHECK(t.lora_per_layer == 131'072);
    CHECK(t.total == 6'738'415'616);
    CHECK(t.frozen == t.total);
    CHECK(t.quantized == 0);
  }
  SECTION("Llama-3-8B, r=16 on all-linear: 41,943,040") {
    // in + out per linear: q 4096+4096 = 8192, k 4096+1024 = 5120, v 5120, o 8192,
    // gate 4096+14336 = 18432, up 18432, down 14336+4096 = 18432; sum = 81,920.
    // x r=16 = 1,310,720 per layer; x 32 layers = 41,943,040.
    const auto model = load_model("llama-3-8b");
    auto setup = make_setup("llama-3-8b", Method::lora, 1, 2048);
    setup.lora.rank = 16;
    setup.lora.targets = ftplan::parse_lora_targets("all-linear", "test");
    const auto t = ftplan::trainable_params(model, setup);
    CHECK(t.lora_per_layer == 1'310'720);
    CHECK(t.trainable == 41'943'040);
  }
  SECTION("full fine-tuning trains everything; QLoRA quantises exactly the block linears") {
    const auto model = load_model("llama-3-8b");
    auto full = make_setup("llama-3-8b", Method::full, 1, 2048);
    CHECK(ftplan::trainable_params(model, full).trainable == 8'030'261'248);
    CHECK(ftplan::trainable_params(model, full).frozen == 0);
    auto q = make_setup("llama-3-8b", Method::qlora, 1, 2048);
    // Block linear weights: 32 x (2*4096*4096 + 2*4096*1024 + 3*4096*14336) = 32 x 218,103,808.
    CHECK(ftplan::trainable_params(model, q).quantized == 32LL * 218'103'808);
  }
}

TEST_CASE("bytes per trainable parameter under each convention", "[memory]") {
  // precision.h: mixed 2 + 2 + (4 master + 4 m + 4 v) = 16 (ZeRO's K = 12); mixed with fp32 grads
  // 2 + 4 + 12 = 18 (Megatron/DeepSpeed); pure bf16 2 + 2 + 2·2 = 8 (torchtune); fp32 4 + 4 + 8 = 16.
  auto [precision, optimizer, weight, grad, opt] = GENERATE(table<ftplan::Precision, ftplan::Optimizer, double, double, double>({
      {ftplan::Precision::mixed, ftplan::Optimizer::adamw, 2, 2, 12},
      {ftplan::Precision::mixed_fp32_grads, ftplan::Optimizer::adamw, 2, 4, 12},
      {ftplan::Precision::bf16, ftplan::Optimizer::adamw, 2, 2, 4},
      {ftplan::Precision::fp32, ftplan::Optimizer::adamw, 4, 4, 8},
      // 8-bit AdamW: fp32 master 4 + two 1-byte moments; SGD with momentum: master 4 + one fp32 moment.
      {ftplan::Precision::mixed, ftplan::Optimizer::adamw8bit, 2, 2, 6},
      {ftplan::Precision::mixed, ftplan::Optimizer::sgd, 2, 2, 8},
  }));
  CAPTURE(ftplan::to_string(precision), ftplan::to_string(optimizer));
  const auto b = ftplan::trainable_param_bytes(precision, optimizer);
  CHECK(b.weight == weight);
  CHECK(b.gradient == grad);
  CHECK(b.optimizer == opt);
}

TEST_CASE("NF4 with double quantisation is 4.127 bits per parameter", "[memory]") {
  // QLoRA paper sec. 3: 4 + 8/64 + 32/(64·256) = 4.127 bits.
  CHECK_THAT(ftplan::kNf4BitsPerParam, WithinRel(4.127, 1e-4));
  CHECK(ftplan::kNf4BytesPerParam == ftplan::kNf4BitsPerParam / 8);
  // Tensor by tensor: exactly 4.127 bits for whole groups of 64 x 256 weights; a partial group
  // still pays its fp32 scale, a partial block its absmax byte. By hand:
  CHECK(ftplan::nf4_storage_bytes(32768) == 16384 + 512 + 2 * 4);
  CHECK(double(ftplan::nf4_storage_bytes(32768)) == 32768 * ftplan::kNf4BytesPerParam);
  CHECK(ftplan::nf4_storage_bytes(4096) == 2048 + 64 + 4);     // 64 blocks: one scale for < 256
  CHECK(ftplan::nf4_storage_bytes(100) == 50 + 2 + 4);         // 2 blocks, the last partial
  CHECK(ftplan::nf4_storage_bytes(4096L * 14336) == 4096L * 14336 / 2 + 4096L * 14336 / 64 + 3584 * 4);
}

TEST_CASE("ZeRO paper model-state memory, 7.5B parameters, K=12, 64 GPUs", "[memory]") {
  // Rajbhandari et al. 2020, Figure 1: 120 GB baseline, 31.4 GB (P_os), 16.6 GB (P_os+g), 1.88 GB
  // (P_os+g+p), decimal GB. The paper rounds to three significant figures: WithinRel 0.01.
  // By hand: 16·7.5 = 120; 4·7.5 + 12·7.5/64 = 31.406; 2·7.5 + 14·7.5/64 = 16.64; 16·7.5/64 = 1.875.
  auto [stage, paper_gb] = GENERATE(table<int, double>({{0, 120.0}, {1, 31.4}, {2, 16.6}, {3, 1.88}}));
  CAPTURE(stage);
  CHECK_THAT(ftplan::zero_model_state_bytes(7.5e9, 12, 64, stage) / 1e9, WithinRel(paper_gb, 0.01));
}

TEST_CASE("estimate_memory reproduces the ZeRO model-state formula on a 7.5B model", "[memory]") {
  // A synthetic Llama: 36 layers of hidden 4096, MLP 11008, 32 heads, vocab 32000, untied.
  // By hand: per layer 4·4096² + 3·4096·11008 + 2·4096 = 202,383,360; embedding and lm_head
  // 32000·4096 each; final norm 4096: 36·202,383,360 + 2·131,072,000 + 4096 = 7,547,949,056.
  const nlohmann::json config = {{"model_type", "llama"},        {"vocab_size", 32000},
                                 {"hidden_size", 4096},          {"intermediate_size", 11008},
                                 {"num_hidden_layers", 36},      {"num_attention_heads", 32},
                                 {"num_key_value_heads", 32},    {"tie_word_embeddings", false}};
  const auto model = ftplan::model_spec_from_json(config, "zero-7.5b");
  const int64_t psi = 7'547'949'056;
  REQUIRE(ftplan::count_params(model).total == psi);

  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  auto setup = make_setup("zero-7.5b", Method::full, 64, 1024);
  auto [strategy, stage, paper_gb] = GENERATE(table<Strategy, int, double>({
      {Strategy::single, 0, 120.0},
      {Strategy::ddp, 0, 120.0},
      {Strategy::zero1, 1, 31.4},
      {Strategy::zero2, 2, 16.6},
      {Strategy::zero3, 3, 1.88},
      {Strategy::fsdp, 3, 1.88},
  }));
  CAPTURE(ftplan::to_string(strategy), stage);
  const auto e = ftplan::estimate_memory(model, hw, setup, ftplan::preset_candidate(strategy, setup.num_gpus, hw, 1, Checkpointing::none, Attention::fused));
  // Each of weights, gradients and optimizer is rounded up to a whole byte: at most 3 bytes off.
  const double formula = ftplan::zero_model_state_bytes(static_cast<double>(psi), 12, 64, stage);
  CHECK(std::abs(static_cast<double>(model_states(e)) - formula) <= 3.0);
  // And the paper's figure, which is for 7.5e9 rather than 7.548e9 parameters (0.64% apart).
  CHECK_THAT(model_states(e) / 1e9, WithinRel(paper_gb, 0.01));
}

TEST_CASE("one Llama-3-8B block's activations, tensor by tensor", "[memory]") {
  // activation_memory.h's list for B=1, S=2048 (T=2048), bf16 (a=2), fused attention, full FT;
  // h = 4096, q_dim = 4096, kv_dim = 1024, i = 14336, heads = 32.
  const auto model = load_model("llama-3-8b");
  ftplan::ActivationInputs in;
  in.micro_batch = 1;
  in.seq_len = 2048;
  in.precision = ftplan::Precision::mixed;
  in.attention = Attention::fused;
  in.method = Method::full;
  const int64_t T = 2048, a = 2, h = 4096, q = 4096, kv = 1024, i = 14336, heads = 32;
  const int64_t rmsnorm_fp32_input = 4 * T * h;   // 33,554,432 per norm
  const int64_t rmsnorm_rstd = 4 * T;             // 8,192 per norm
  const int64_t rmsnorm_normalised = a * T * h;   // 16,777,216 per norm (the norm weight trains)
  const int64_t attn_norm_output = a * T * h;     // 16,777,216, read by q/k/v
  const int64_t mlp_norm_output = a * T * h;      // 16,777,216, read by gate/up
  const int64_t sdpa_q = a * T * q;               // 16,777,216
  const int64_t sdpa_k = a * T * kv;              // 4,194,304
  const int64_t sdpa_v = a * T * kv;              // 4,194,304
  const int64_t sdpa_out = a * T * q;             // 16,777,216
  const int64_t sdpa_lse = 4 * 1 * heads * 2048;  // 262,144
  const int64_t o_proj_input = a * T * q;         // 16,777,216
  const int64_t gate = a * T * i, silu = a * T * i, up = a * T * i;  // 58,720,256 each
  const int64_t down_input = a * T * i;           // 58,720,256
  const int64_t hand = 2 * (rmsnorm_fp32_input + rmsnorm_rstd + rmsnorm_normalised) + attn_norm_output +
                       mlp_norm_output + sdpa_q + sdpa_k + sdpa_v + sdpa_out + sdpa_lse + o_proj_input + gate +
                       silu + up + down_input;
  REQUIRE(hand == 428'097'536);
  CHECK(ftplan::block_activation_bytes(model, in) == hand);

  SECTION("Liger's fused RMSNorm and SwiGLU kernels keep the norm's input as it arrives and gate and up") {
    // LigerRMSNormFunction saves X (bf16 here), W and RSTD: no fp32 upcast, no normalised copy;
    // LigerSiLUMulFunction saves a and b (SiLU recomputed); down_proj keeps its input (it trains).
    ftplan::ActivationInputs liger = in;
    liger.fused_norm_mlp = true;
    const int64_t liger_norm = a * T * h + rmsnorm_rstd;
    const int64_t liger_hand = 2 * liger_norm + attn_norm_output + mlp_norm_output + sdpa_q + sdpa_k + sdpa_v +
                               sdpa_out + sdpa_lse + o_proj_input + gate + up + down_input;
    REQUIRE(hand - liger_hand == 2 * (rmsnorm_fp32_input + rmsnorm_normalised - a * T * h) + silu);  // 125,829,120
    CHECK(ftplan::block_activation_bytes(model, liger) == liger_hand);
    // Under torch.compile the compiled rule holds (Liger's kernels are then not what keeps the tensors).
    ftplan::ActivationInputs both = liger;
    both.compile = true;
    ftplan::ActivationInputs compiled = in;
    compiled.compile = true;
    CHECK(ftplan::block_activation_bytes(model, both) == ftplan::block_activation_bytes(model, compiled));
  }

  SECTION("eager attention swaps the fused tensors for repeated q,k,v and the S² scores") {
    ftplan::ActivationInputs eager = in;
    eager.attention = Attention::eager;
    const int64_t S = 2048;
    const int64_t scores_fp32 = 4 * 1 * heads * S * S;  // softmax output in fp32
    const int64_t scores_bf16 = 2 * 1 * heads * S * S;  // its bf16 copy for P·V
    const int64_t eager_only = 3 * a * T * q;            // q, k, v repeated to all 32 heads
    const int64_t fused_only = sdpa_q + sdpa_k + sdpa_v + sdpa_out + sdpa_lse;
    CHECK(ftplan::block_activation_bytes(model, eager) - ftplan::block_activation_bytes(model, in) ==
          scores_fp32 + scores_bf16 + eager_only - fused_only);
    // (4 + 2)·B·heads·S² = 805,306,368 bytes: the s² terms alone outweigh the whole fused block.
    CHECK(scores_fp32 + scores_bf16 == 805'306'368);
  }
  SECTION("fp32 keeps only the fp32 scores (no bf16 copy)") {
    ftplan::ActivationInputs f32 = in, f32_eager = in;
    f32.precision = f32_eager.precision = ftplan::Precision::fp32;
    f32_eager.attention = Attention::eager;
    const int64_t A = 4;
    const int64_t diff = 4 * heads * 2048 * 2048 + 3 * A * T * q - (A * T * (2 * q + 2 * kv) + 4 * heads * 2048);
    CHECK(ftplan::block_activation_bytes(model, f32_eager) - ftplan::block_activation_bytes(model, f32) == diff);
  }
  SECTION("activations are linear in the micro-batch") {
    ftplan::ActivationInputs four = in;
    four.micro_batch = 4;
    CHECK(ftplan::block_activation_bytes(model, four) == 4 * hand);
  }
}

TEST_CASE("the loss's peak is 12·B·S·V bytes", "[memory]") {
  // activation_memory.h: fp32 log-softmax, its gradient and the logits' gradient, 4 bytes each.
  const auto model = load_model("llama-3-8b");
  auto [B, S] = GENERATE(table<int64_t, int64_t>({{1, 2048}, {2, 2048}, {4, 1024}, {8, 512}}));
  CAPTURE(B, S);
  const int64_t expected = 12 * B * S * 128256;
  CHECK(ftplan::logits_loss_bytes(model, B, S) == expected);
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  auto setup = make_setup("llama-3-8b", Method::lora, 1, S);
  const auto e = ftplan::estimate_memory(model, hw, setup, ftplan::preset_candidate(Strategy::single, 1, hw, B, Checkpointing::none, Attention::fused));
  CHECK(e.per_gpu.logits_loss == expected);
}

TEST_CASE("a job that does not fit is a result with a reason", "[memory]") {
  // Llama-3.1-70B full FT needs 16 B x 70.55e9 = 1.13 TB of model states; an RTX 3090 has 24 GiB.
  const auto model = load_model("llama-3.1-70b");
  const auto hw = ftplan::load_hardware("rtx-3090");
  auto setup = make_setup("llama-3.1-70b", Method::full, 1, 2048);
  const auto e = ftplan::estimate_memory(model, hw, setup, ftplan::preset_candidate(Strategy::single, 1, hw, 1, Checkpointing::full, Attention::fused));
  CHECK_FALSE(e.fits);
  CHECK(e.per_gpu.total > e.usable_bytes);
  CHECK_THAT(e.reason, Catch::Matchers::StartsWith("out of memory by"));
  CHECK_THAT(e.reason, Catch::Matchers::Contains("rtx-3090"));
  // The usable memory is what a process can allocate × (1 − headroom).
  CHECK(e.usable_bytes == static_cast<int64_t>(double(hw.usable_memory_bytes) * 0.95));

  SECTION("a job that fits has no reason") {
    const auto tiny = load_model("tinyllama-1.1b");
    auto s = make_setup("tinyllama-1.1b", Method::lora, 1, 512);
    const auto ok = ftplan::estimate_memory(tiny, hw, s, ftplan::preset_candidate(Strategy::single, 1, hw, 1, Checkpointing::none, Attention::fused));
    CHECK(ok.fits);
    CHECK(ok.reason.empty());
  }
}

TEST_CASE("properties: more GPUs never raise sharded memory per GPU", "[memory]") {
  const auto name = GENERATE(from_range(kModels));
  const auto method = GENERATE(Method::full, Method::lora, Method::qlora);
  const auto strategy = GENERATE(Strategy::zero1, Strategy::zero2, Strategy::zero3, Strategy::fsdp,
                                 Strategy::fsdp_shard_grad_op, Strategy::zero3_offload);
  CAPTURE(name, ftplan::to_string(method), ftplan::to_string(strategy));
  const auto model = load_model(name);
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  auto setup = make_setup(name, method, 2, 2048);
  const auto job = ftplan::prepare_job(model, hw, setup);
  auto c = [&](int64_t n) { return ftplan::preset_candidate(strategy, n, hw, 2, Checkpointing::full, Attention::fused); };
  // From 2 GPUs up (1 GPU has no NCCL buffers, so 1 -> 2 may add 256 MiB for a tiny model).
  int64_t previous = ftplan::estimate_memory(job, c(2), 2).per_gpu.total;
  for (int64_t n = 3; n <= 128; ++n) {
    const int64_t total = ftplan::estimate_memory(job, c(n), n).per_gpu.total;
    CAPTURE(n);
    REQUIRE(total <= previous);
    previous = total;
  }
}

TEST_CASE("properties: full checkpointing never raises activation memory", "[memory]") {
  const auto name = GENERATE(from_range(kModels));
  const auto method = GENERATE(Method::full, Method::lora, Method::qlora);
  const auto attention = GENERATE(Attention::fused, Attention::eager);
  auto [gpus, seq_len, micro_batch] = GENERATE(table<int64_t, int64_t, int64_t>({{1, 512, 1}, {4, 2048, 4}, {8, 4096, 2}}));
  CAPTURE(name, ftplan::to_string(method), ftplan::to_string(attention), gpus, seq_len, micro_batch);
  const auto model = load_model(name);
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  auto setup = make_setup(name, method, gpus, seq_len);
  setup.grad_accum = 4;
  const auto job = ftplan::prepare_job(model, hw, setup);
  for (Strategy s : ftplan::applicable_strategies(model, hw, setup)) {
    CAPTURE(ftplan::to_string(s));
    const auto none = ftplan::estimate_memory(job, ftplan::preset_candidate(s, gpus, hw, micro_batch, Checkpointing::none, attention), gpus);
    const auto full = ftplan::estimate_memory(job, ftplan::preset_candidate(s, gpus, hw, micro_batch, Checkpointing::full, attention), gpus);
    CHECK(full.per_gpu.activations <= none.per_gpu.activations);
    CHECK(full.per_gpu.total <= none.per_gpu.total);
  }
}

TEST_CASE("properties: LoRA never needs more than full fine-tuning; QLoRA weights are smaller", "[memory]") {
  // For the same candidate. (With LoRA dropout > 0 each adapted module keeps its own dropped-out
  // input, so all-linear LoRA with dropout can keep more activations than full FT: dropout 0 here,
  // PEFT's default.)
  const auto name = GENERATE(from_range(kModels));
  const auto targets = GENERATE(as<std::string>{}, "q_proj,v_proj", "all-linear");
  const auto attention = GENERATE(Attention::fused, Attention::eager);
  const auto checkpointing = GENERATE(Checkpointing::none, Checkpointing::full);
  CAPTURE(name, targets, ftplan::to_string(attention), ftplan::to_string(checkpointing));
  const auto model = load_model(name);
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  auto full = make_setup(name, Method::full, 4, 2048);
  auto lora = make_setup(name, Method::lora, 4, 2048);
  lora.lora.targets = ftplan::parse_lora_targets(targets, "test");
  auto qlora = lora;
  qlora.method = Method::qlora;
  for (Strategy s : ftplan::applicable_strategies(model, hw, full)) {
    for (int64_t b : {1, 4, 16}) {
      CAPTURE(ftplan::to_string(s), b);
      const Candidate c = ftplan::preset_candidate(s, full.num_gpus, hw, b, checkpointing, attention);
      const auto f = ftplan::estimate_memory(model, hw, full, c);
      const auto l = ftplan::estimate_memory(model, hw, lora, c);
      const auto q = ftplan::estimate_memory(model, hw, qlora, c);
      CHECK(l.per_gpu.total <= f.per_gpu.total);
      // Pipelines report their worst stage, which can differ between the two (full FT's first
      // stage holds the embedding's optimizer states, LoRA's last stage the head's activations),
      // so their activations are compared only through the total.
      const bool pipelined = s == Strategy::mp || s == Strategy::pipeline_gpipe || s == Strategy::pipeline_1f1b;
      if (!pipelined) CHECK(l.per_gpu.activations <= f.per_gpu.activations);
      if (s != Strategy::zero3_offload) CHECK(q.per_gpu.weights < l.per_gpu.weights);  // offload keeps no weights on the GPU
    }
  }
}

TEST_CASE("properties: 1F1B's worst stage never needs more than GPipe's", "[memory]") {
  const auto name = GENERATE(from_range(kModels));
  const auto gpus = GENERATE(as<int64_t>{}, 2, 4, 8);
  const auto grad_accum = GENERATE(as<int64_t>{}, 1, 2, 4, 8, 32);
  const auto checkpointing = GENERATE(Checkpointing::none, Checkpointing::full);
  CAPTURE(name, gpus, grad_accum, ftplan::to_string(checkpointing));
  const auto model = load_model(name);
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  auto setup = make_setup(name, Method::lora, gpus, 2048);
  setup.grad_accum = grad_accum;
  const auto gpipe = ftplan::estimate_memory(model, hw, setup, ftplan::preset_candidate(Strategy::pipeline_gpipe, gpus, hw, 2, checkpointing, Attention::fused));
  const auto one_f_one_b = ftplan::estimate_memory(model, hw, setup, ftplan::preset_candidate(Strategy::pipeline_1f1b, gpus, hw, 2, checkpointing, Attention::fused));
  CHECK(one_f_one_b.per_gpu.total <= gpipe.per_gpu.total);
  // With more micro-batches than stages, 1F1B keeps strictly fewer in flight on the first stage.
  if (grad_accum > gpus && checkpointing == Checkpointing::none) CHECK(one_f_one_b.per_gpu.total < gpipe.per_gpu.total);
}

TEST_CASE("properties: memory grows with the micro-batch; max_micro_batch is the boundary", "[memory]") {
  const auto name = GENERATE(from_range(kModels));
  const auto method = GENERATE(Method::full, Method::lora, Method::qlora);
  CAPTURE(name, ftplan::to_string(method));
  const auto model = load_model(name);
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  auto setup = make_setup(name, method, 8, 2048);
  setup.grad_accum = 4;
  for (Strategy s : ftplan::applicable_strategies(model, hw, setup)) {
    for (Checkpointing ck : {Checkpointing::none, Checkpointing::full}) {
      CAPTURE(ftplan::to_string(s), ftplan::to_string(ck));
      Candidate c = ftplan::preset_candidate(s, setup.num_gpus, hw, 1, ck, Attention::fused);
      int64_t previous = ftplan::estimate_memory(model, hw, setup, c).per_gpu.total;
      for (int64_t b = 2; b <= 64; ++b) {
        c.micro_batch = b;
        const int64_t total = ftplan::estimate_memory(model, hw, setup, c).per_gpu.total;
        CHECK(total > previous);
        previous = total;
      }
      const int64_t best = ftplan::max_micro_batch(model, hw, setup, c);
      if (best == 0) {
        c.micro_batch = 1;
        CHECK_FALSE(ftplan::estimate_memory(model, hw, setup, c).fits);
      } else {
        c.micro_batch = best;
        CHECK(ftplan::estimate_memory(model, hw, setup, c).fits);
        c.micro_batch = best + 1;
        CHECK_FALSE(ftplan::estimate_memory(model, hw, setup, c).fits);
      }
    }
  }
}

TEST_CASE("min_gpus is the boundary for ZeRO-3", "[memory]") {
  auto [name, method, gpu] = GENERATE(table<std::string, Method, std::string>({
      {"llama-3.1-70b", Method::full, "a100-80gb-sxm"},
      {"llama-3.1-70b", Method::full, "h100-sxm"},
      {"codellama-34b", Method::full, "a100-40gb-sxm"},
      {"llama-3-8b", Method::full, "rtx-3090"},
      {"llama-3.1-70b", Method::lora, "rtx-4090"},
  }));
  CAPTURE(name, ftplan::to_string(method), gpu);
  const auto model = load_model(name);
  const auto hw = ftplan::load_hardware(gpu);
  auto setup = make_setup(name, method, 1, 2048);
  const Candidate c = ftplan::preset_candidate(Strategy::zero3, 2, hw, 1, Checkpointing::full, Attention::fused);
  const int64_t n = ftplan::min_gpus(model, hw, setup, c);
  CAPTURE(n);
  REQUIRE(n > 2);  // the cases are chosen to need several GPUs
  const auto job = ftplan::prepare_job(model, hw, setup);
  auto at = [&](int64_t gpus) { return ftplan::preset_candidate(Strategy::zero3, gpus, hw, 1, Checkpointing::full, Attention::fused); };
  CHECK(ftplan::estimate_memory(job, at(n), n).fits);
  CHECK_FALSE(ftplan::estimate_memory(job, at(n - 1), n - 1).fits);
  // Model states alone need 16 B/param / usable memory for full FT: a lower bound by hand.
  if (method == Method::full) {
    const double lower = 16.0 * ftplan::count_params(model).total / (hw.memory_bytes * 0.95);
    CHECK(static_cast<double>(n) >= lower);
  }
}

TEST_CASE("bitsandbytes' quantisation statistics stay whole on every GPU under FSDP and its CPU offload", "[memory]") {
  // hf (bitsandbytes): Params4bit.quant_state is an attribute, not a parameter, so FSDP shards and offloads
  // only the packed codes; torchtune (torchao NF4Tensor) all-gathers its scalers with the codes.
  const auto model = load_model("llama-3-8b");
  const auto hw = ftplan::load_hardware("rtx-4090");
  // The statistics by hand, from the block linears' shapes: one uint8 absmax per block of 64 weights and
  // one fp32 nested absmax per 256 of them (double quantisation).
  double stats = 0;
  for (const auto& lin : ftplan::block_linears(model)) {
    const int64_t blocks = (lin.in_features * lin.out_features + 63) / 64;
    stats += double(blocks + (blocks + 255) / 256 * 4);
  }
  stats *= double(model.num_layers);
  auto run = [&](const std::string& framework, const std::string& layout, int64_t gpus, int64_t accum) {
    auto setup = make_setup("llama-3-8b", Method::qlora, gpus, 1024);
    setup.framework = framework;
    setup.quantization.double_quant = true;
    setup.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    setup.grad_accum = accum;
    const auto c = layout == "single"
                       ? ftplan::preset_candidate(Strategy::single, 1, hw, 1, Checkpointing::full, Attention::fused)
                       : ftplan::layout_candidate(ftplan::parse_parallelism(layout, "test"), 1, Checkpointing::full,
                                                  Attention::fused);
    return ftplan::estimate_memory(model, hw, setup, c);
  };
  for (const std::string fw : {"hf", "torchtune"}) {
    CAPTURE(fw);
    const double whole = double(run(fw, "single", 1, 1).per_gpu.weights);  // every weight, the statistics included
    const bool replicated = fw == "hf";
    for (int64_t n : {2, 4}) {
      CAPTURE(n);
      const double w = double(run(fw, "dp_shard=" + std::to_string(n) + ",shard=fsdp", n, 1).per_gpu.weights);
      CHECK_THAT(w, WithinRel(replicated ? (whole - stats) / double(n) + stats : whole / double(n), 1e-9));
      const double off =
          double(run(fw, "dp_shard=" + std::to_string(n) + ",shard=fsdp,offload=optimizer+params", n, 1).per_gpu.weights);
      CHECK_THAT(off, WithinRel(replicated ? stats : 0.0, 1e-9));
    }
  }
}

TEST_CASE("FSDP CPU offload keeps unsharded gradients on the GPU under no_sync only", "[memory]") {
  // torch FSDP-1 _post_backward_hook returns before copying a gradient to _cpu_grad when gradients are not
  // synchronised (no_sync, which hf's accelerate enters between accumulated micro-batches).
  const auto model = load_model("llama-2-7b");
  const auto hw = ftplan::load_hardware("rtx-4090");
  auto est = [&](int64_t accum) {
    auto setup = make_setup("llama-2-7b", Method::lora, 2, 1024);
    setup.framework = "hf";
    setup.grad_accum = accum;
    const auto c = ftplan::layout_candidate(ftplan::parse_parallelism("dp_shard=2,shard=fsdp,offload=optimizer+params", "test"),
                                            1, Checkpointing::full, Attention::fused);
    return ftplan::estimate_memory(model, hw, setup, c);
  };
  auto setup = make_setup("llama-2-7b", Method::lora, 2, 1024);
  setup.framework = "hf";
  const auto t = ftplan::trainable_params(model, setup);
  const auto tb = ftplan::trainable_param_bytes(setup.precision, setup.optimizer);
  CHECK(est(1).per_gpu.gradients == 0);
  CHECK_THAT(double(est(2).per_gpu.gradients), WithinRel(double(t.trainable) * tb.gradient, 1e-9));
}

TEST_CASE("gradients freed by zero_grad(set_to_none) are not alive with the activations at backward's start", "[memory]") {
  // Llama-3.2-1B full fine-tune in bf16 on one A100 under torchtune (zero_grad(set_to_none=True) after each
  // step: optimizer.grads_freed_between_steps). At backward's start, where the loss's peak and every saved
  // activation are alive, only the head unit's gradients exist: the final norm's, 2,048 x 2 B = 4,096 B, and
  // the tied embedding's (the head's weight), 128,256 x 2,048 x 2 B = 525,336,576 B. Every gradient (1,235,814,400 parameters x 2 B = 2,471,628,800 B) is alive at the
  // optimizer step, when the activations are gone.
  const auto model = load_model("llama-3.2-1b");
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  auto setup = make_setup("llama-3.2-1b", Method::full, 1, 2048);
  setup.framework = "torchtune";
  setup.precision = ftplan::Precision::bf16;
  REQUIRE(ftplan::count_params(model).total == 1'235'814'400);
  const int64_t all_grads = 2'471'628'800, head_grads = 4'096 + 525'336'576;
  auto estimate = [&](const ftplan::TrainingSetup& s, Strategy strategy, int64_t gpus, int64_t micro_batch) {
    auto t = s;
    t.num_gpus = gpus;
    return ftplan::estimate_memory(model, hw, t, ftplan::preset_candidate(strategy, gpus, hw, micro_batch, Checkpointing::none, Attention::fused));
  };
  const auto freed = estimate(setup, Strategy::single, 1, 4);
  CHECK(freed.peak_moment == "forward-backward");
  CHECK(freed.per_gpu.gradients == head_grads);
  SECTION("with gradient accumulation the next micro-batch's backward starts with every gradient alive") {
    auto accum = setup;
    accum.grad_accum = 2;
    const auto e = estimate(accum, Strategy::single, 1, 4);
    CHECK(e.per_gpu.gradients == all_grads);
    CHECK(e.per_gpu.activations == freed.per_gpu.activations);
    CHECK(e.per_gpu.logits_loss == freed.per_gpu.logits_loss);
    CHECK(e.allocated_peak - freed.allocated_peak == all_grads - head_grads);
  }
  SECTION("a framework that zeroes its gradients in place keeps them all (ftexec)") {
    auto kept = setup;
    kept.framework = "ftexec";
    CHECK(estimate(kept, Strategy::single, 1, 4).per_gpu.gradients == all_grads);
  }
  SECTION("little activation memory: the optimizer step's peak holds every gradient") {
    auto small = setup;
    small.seq_len = 128;
    const auto e = estimate(small, Strategy::single, 1, 1);
    CHECK(e.peak_moment == "optimizer step");
    CHECK(e.per_gpu.gradients == all_grads);
    CHECK(e.per_gpu.activations == 0);
  }
  SECTION("FSDP-1 FULL_SHARD: no gradient shard at backward's start, the root unit's head gradient unsharded") {
    // model.zero_grad() / optimizer.zero_grad(set_to_none=True) drops every FlatParameter's sharded gradient; the
    // root unit (embedding, final norm; the tied head) reaches its FlatParameter only at backward's end, so the
    // head's gradients wait unsharded, in the compute dtype: the same 525,340,672 B as on one GPU.
    auto v1 = setup;
    v1.fsdp_version = 1;
    const auto e = estimate(v1, Strategy::fsdp, 2, 4);
    CHECK(e.per_gpu.gradients == head_grads);
    CHECK(e.peak_moment == "forward-backward");
    SECTION("little activation memory: the end of backward, every shard re-created, is the peak") {
      auto small = v1;
      small.seq_len = 128;
      const auto s = estimate(small, Strategy::fsdp, 2, 1);
      CHECK(s.peak_moment != "forward-backward");
      CHECK(s.per_gpu.gradients >= all_grads / 2);
    }
  }
  SECTION("FSDP-2 keeps every gradient shard in the peak (FSDP over 2 GPUs)") {
    auto v2 = setup;
    v2.fsdp_version = 2;
    CHECK(estimate(v2, Strategy::fsdp, 2, 4).per_gpu.gradients == all_grads / 2);
  }
}

// Fits is judged against what a process can allocate (hwdb usable_memory_bytes), not nvidia-smi's total:
// a job whose device figure lies between the two does not fit.
TEST_CASE("fits: the device figure against torch's total capacity", "[memory]") {
  const auto model = load_model("llama-2-7b");
  auto hw = ftplan::load_hardware("a100-40gb-sxm");
  auto setup = make_setup("llama-2-7b", Method::full, 1, 1024);
  setup.headroom_fraction = 0;
  const auto cand = ftplan::preset_candidate(Strategy::single, 1, hw, 1, Checkpointing::full, Attention::fused);
  const auto e = ftplan::estimate_memory(model, hw, setup, cand);
  CHECK(e.usable_bytes == hw.usable_memory_bytes);
  CHECK(e.fits == (e.fit_bytes <= hw.usable_memory_bytes));
  // Put the card's capacity just above and just below the job's figure.
  hw.usable_memory_bytes = e.fit_bytes;
  CHECK(ftplan::estimate_memory(model, hw, setup, cand).fits);
  hw.memory_bytes = e.fit_bytes + (1LL << 30);
  hw.usable_memory_bytes = e.fit_bytes - 1;
  const auto over = ftplan::estimate_memory(model, hw, setup, cand);
  CHECK_FALSE(over.fits);
  CHECK(over.usable_bytes == e.fit_bytes - 1);
  CHECK_THAT(over.reason, Catch::Matchers::Contains("a process can allocate of"));
}

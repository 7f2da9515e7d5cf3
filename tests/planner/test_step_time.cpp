// Step time: the pipeline bubble, communication volumes per strategy against hand arithmetic,
// FLOPs per token against the 6N / 4N rules written out term by term, and the overlap model.
#include <catch2/catch.hpp>

#include <string>
#include <tuple>

#include "planner/collectives.h"
#include "planner/compute_model.h"
#include "planner/data_paths.h"
#include "planner/framework.h"
#include "planner/hardware_spec.h"
#include "planner/job_fields.h"
#include "planner/json_fields.h"
#include "planner/memory_model.h"
#include "planner/model_spec.h"
#include "planner/precision.h"
#include "planner/step_time.h"
#include "planner/training_setup.h"
#include "planner_fixtures.h"

using Catch::Matchers::WithinRel;
using ftplan::load_model;
using ftplan::Attention;
using ftplan::Candidate;
using ftplan::Checkpointing;
using ftplan::Method;
using ftplan::Strategy;

namespace {

// A preset's candidate on the context's GPUs.
ftplan::Candidate cand(const ftplan::PlanContext& ctx, Strategy s, int64_t micro_batch, ftplan::Checkpointing ck,
                       ftplan::Attention at) {
  return ftplan::preset_candidate(s, ctx.num_gpus, *ctx.memory.hw, micro_batch, ck, at);
}

constexpr double kExact = 1e-12;  // same arithmetic, different order

ftplan::TrainingSetup make_setup(const std::string& model, Method method, int64_t gpus, int64_t seq_len,
                                 int64_t grad_accum = 1) {
  return ftplan::testing::ftexec_setup(model, method, gpus, seq_len, grad_accum);
}

// Llama-3-8B by hand: the 7 block linears hold 2·4096·4096 + 2·4096·1024 + 3·4096·14336
// = 218,103,808 weights; the lm_head 128256·4096 = 525,336,576.
constexpr double kLlama3BlockLinearWeights = 218'103'808.0;
constexpr double kLlama3HeadWeights = 525'336'576.0;
constexpr double kLlama3Params = 8'030'261'248.0;

}  // namespace

TEST_CASE("pipeline bubble is (p-1)/(m+p-1)", "[step]") {
  // GPipe (Huang et al. 2019, sec. 2.3): m micro-batches over p stages take m + p - 1 slots.
  auto [p, m] = GENERATE(table<int64_t, int64_t>({{2, 1}, {2, 8}, {4, 4}, {4, 16}, {8, 8}, {8, 32}, {4, 1}}));
  const auto strategy = GENERATE(Strategy::pipeline_gpipe, Strategy::pipeline_1f1b);
  CAPTURE(p, m, ftplan::to_string(strategy));
  const auto model = load_model("llama-3-8b");  // 32 layers: divisible by 2, 4 and 8
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  const auto setup = make_setup("llama-3-8b", Method::lora, p, 2048, m);
  const auto ctx = ftplan::prepare_plan(model, hw, setup, p);
  const auto s = ftplan::estimate_step(ctx, cand(ctx, strategy, 1, Checkpointing::none, Attention::fused));
  const double P = static_cast<double>(p), M = static_cast<double>(m);
  CHECK_THAT(s.bubble_fraction, WithinRel((P - 1) / (M + P - 1), kExact));

  // The step is (m + p - 1) slots of one stage's work plus the optimizer step. A slot is one
  // micro-batch's forward and backward on 1/p of the model (single's compute per micro-batch / p)
  // and two activation hops (activation forward, its gradient back) of 2·B·S·h bytes.
  const auto single_ctx = ftplan::prepare_plan(model, hw, setup, 1);
  const auto single = ftplan::estimate_step(single_ctx, cand(single_ctx, Strategy::single, 1, Checkpointing::none, Attention::fused));
  const double stage_compute = single.compute_s / M / P;
  const double hop = hw.comm_latency_s + 2.0 * 2048 * 4096 / 2.3e11;  // A100 SXM: 230 GB/s via NVSwitch
  const double slot = stage_compute + 2 * hop;
  CHECK_THAT(s.compute_s, WithinRel(M * stage_compute, kExact));
  CHECK_THAT(s.exposed_comm_s, WithinRel(M * 2 * hop, kExact));
  CHECK_THAT(s.bubble_s, WithinRel((P - 1) * slot, kExact));
  CHECK_THAT(s.step_time_s, WithinRel((M + P - 1) * slot + s.optimizer_s, kExact));
  CHECK_THAT(s.bubble_s / (s.step_time_s - s.optimizer_s), WithinRel((P - 1) / (M + P - 1), kExact));
  // Each stage steps its own 1/p of the optimizer states.
  CHECK_THAT(s.optimizer_s, WithinRel(single.optimizer_s / P, kExact));
  // One replica: the pipeline processes m micro-batches of B·S tokens per step.
  CHECK(s.tokens_per_step == M * 2048);
}

TEST_CASE("naive model parallel keeps one GPU busy at a time", "[step]") {
  const auto model = load_model("tinyllama-1.1b");
  const auto hw = ftplan::load_hardware("rtx-6000-ada");
  const auto setup = make_setup("tinyllama-1.1b", Method::lora, 4, 1024, 2);
  const auto ctx = ftplan::prepare_plan(model, hw, setup, 4);
  const auto single = ftplan::estimate_step(ftplan::prepare_plan(model, hw, setup, 1), cand(ftplan::prepare_plan(model, hw, setup, 1), Strategy::single, 4, Checkpointing::none, Attention::fused));
  const auto mp = ftplan::estimate_step(ctx, cand(ctx, Strategy::mp, 4, Checkpointing::none, Attention::fused));
  // The same compute as one GPU doing everything, plus 2(p-1) activation hops per micro-batch.
  CHECK_THAT(mp.compute_s, WithinRel(single.compute_s, kExact));
  // Per micro-batch 2(p-1) hops of B·S·h bf16 activations = 2·4·1024·2048 B; neighbour pairs on
  // the RTX 6000 Ada box: the slowest is gpu1 -> gpu2 across UPI at 12 GB/s (hwdb topology).
  const double hop = hw.comm_latency_s + 2.0 * 4 * 1024 * 2048 / 1.2e10;
  CHECK_THAT(mp.exposed_comm_s, WithinRel(2 * 2 * 3 * hop, kExact));
  CHECK_THAT(mp.step_time_s, WithinRel(single.compute_s + 2 * 2 * 3 * hop + single.optimizer_s / 4, kExact));
  CHECK_THAT(mp.bubble_fraction, WithinRel(3.0 / 4.0, kExact));
  CHECK(mp.tokens_per_step == single.tokens_per_step);
}

TEST_CASE("communication volume per strategy", "[step]") {
  // Full fine-tuning of Llama-3-8B, mixed precision: bf16 gradients and weights, 2 B x 8,030,261,248.
  const auto model = load_model("llama-3-8b");
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  const auto N = GENERATE(as<int64_t>{}, 2, 4, 8);
  CAPTURE(N);
  const double n = static_cast<double>(N);
  const auto setup = make_setup("llama-3-8b", Method::full, N, 2048);
  const auto ctx = ftplan::prepare_plan(model, hw, setup, N);
  auto bytes = [&](Strategy s) {
    return ftplan::estimate_step(ctx, cand(ctx, s, 1, Checkpointing::full, Attention::fused)).comm_bytes_per_step;
  };
  const double ddp = bytes(Strategy::ddp);
  // DDP: ring all-reduce of all gradients, 2(N-1)/N · 2Ψ.
  CHECK_THAT(ddp, WithinRel(2 * (n - 1) / n * 2 * kLlama3Params, kExact));
  // ZeRO-3/FSDP: all-gather in forward and backward, reduce-scatter of gradients: 3(N-1)/N · 2Ψ,
  // 1.5x DDP (Rajbhandari et al. 2020, sec. 7.2.2).
  CHECK_THAT(bytes(Strategy::zero3) / ddp, WithinRel(1.5, kExact));
  // PyTorch FSDP keeps its root unit (the modules outside the wrapped blocks) gathered from forward
  // into backward, saving at most one gather of it: the embedding and the head, 2 B x (2 x
  // 525,336,576 + 4096) = 2,101,354,496 B of 16,060,522,496. So 1.5 x DDP less at most
  // (N-1)/N x 2.1e9 B: between 1.435 and 1.5 (WithinRel 0.05 of the paper's 1.5).
  const double fsdp = bytes(Strategy::fsdp);
  CHECK(fsdp <= bytes(Strategy::zero3) * (1 + kExact));
  CHECK(fsdp >= (n - 1) / n * (3 * 2 * kLlama3Params - 2'101'354'496.0) * (1 - kExact));
  CHECK_THAT(fsdp / ddp, WithinRel(1.5, 0.05));
  // ZeRO-1/2: reduce-scatter of gradients + all-gather of parameters = DDP's volume (sec. 7.2.1).
  CHECK_THAT(bytes(Strategy::zero1), WithinRel(ddp, kExact));
  CHECK_THAT(bytes(Strategy::zero2), WithinRel(ddp, kExact));
  // SHARD_GRAD_OP gathers once per micro-batch: (1 + 1)(N-1)/N · 2Ψ = DDP's volume.
  CHECK_THAT(bytes(Strategy::fsdp_shard_grad_op), WithinRel(ddp, kExact));
  CHECK(bytes(Strategy::single) == 0.0);

  SECTION("gradient accumulation: DDP and ZeRO-1 communicate once per step, ZeRO-3 per micro-batch") {
    const auto acc = make_setup("llama-3-8b", Method::full, N, 2048, 4);
    const auto actx = ftplan::prepare_plan(model, hw, acc, N);
    auto abytes = [&](Strategy s) {
      return ftplan::estimate_step(actx, cand(actx, s, 1, Checkpointing::full, Attention::fused)).comm_bytes_per_step;
    };
    CHECK_THAT(abytes(Strategy::ddp), WithinRel(ddp, kExact));
    CHECK_THAT(abytes(Strategy::zero1), WithinRel(ddp, kExact));
    CHECK_THAT(abytes(Strategy::zero3), WithinRel(4 * 1.5 * ddp, kExact));
    CHECK_THAT(abytes(Strategy::fsdp), WithinRel(4 * fsdp, kExact));
  }
}

TEST_CASE("LoRA's DDP all-reduce is megabytes", "[step]") {
  // Llama-3-8B, r=16 on q_proj,v_proj: 16 x ((4096+4096) + (4096+1024)) = 212,992 per layer,
  // x 32 = 6,815,744 adapter parameters, bf16 gradients: 13,631,488 B; on 4 GPUs 2·3/4 of that
  // = 20,447,232 B per step.
  const auto model = load_model("llama-3-8b");
  const auto hw = ftplan::load_hardware("a100-40gb-sxm");
  const auto setup = make_setup("llama-3-8b", Method::lora, 4, 1024);
  const auto ctx = ftplan::prepare_plan(model, hw, setup, 4);
  CHECK(ctx.trainable_params == 6'815'744);
  const auto s = ftplan::estimate_step(ctx, cand(ctx, Strategy::ddp, 4, Checkpointing::none, Attention::fused));
  CHECK_THAT(s.comm_bytes_per_step, WithinRel(20'447'232.0, kExact));
  // DDP's buckets (step_time.h): a first bucket of 1 MiB, then 25 MiB ones. 13,631,488 B =
  // 1,048,576 + 12,582,912: two all-reduces, each paying α·2(N-1) = 6α, and the ring's
  // 1.5 x 13,631,488 B over 230 GB/s (A100 SXM NVSwitch, hwdb).
  const double ar = 2 * 6 * hw.comm_latency_s + 20'447'232.0 / 2.3e11;
  CHECK_THAT(s.comm_s, WithinRel(ar, kExact));
  CHECK(s.exposed_comm_s <= s.comm_s);
}

TEST_CASE("DDP's gradient buckets", "[step]") {
  // Llama-3-8B full FT: 2 B x 8,030,261,248 = 16,060,522,496 B of gradients. First bucket 1 MiB;
  // (16,060,522,496 - 1,048,576) / 26,214,400 = 612 full buckets + a remainder: 614 buckets.
  const auto model = load_model("llama-3-8b");
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  const auto setup = make_setup("llama-3-8b", Method::full, 8, 2048);
  const auto ctx = ftplan::prepare_plan(model, hw, setup, 8);
  const auto t = ftplan::ddp_bucketed_all_reduce(ctx, {});
  CHECK(t.buckets == 614);
  const double remainder = 16'060'522'496.0 - 1'048'576.0 - 612 * 26'214'400.0;  // 16,261,120 B
  auto ar = [&](double bytes) { return 14 * hw.comm_latency_s + 2 * 7.0 / 8 * bytes / 2.3e11; };
  CHECK_THAT(t.last_s, WithinRel(ar(remainder), kExact));
  CHECK_THAT(t.total_s, WithinRel(ar(1'048'576.0) + 612 * ar(26'214'400.0) + ar(remainder), 1e-9));
  // The bytes are the unbucketed ring's; only the latency grows with the bucket count.
  CHECK_THAT(t.total_s - 614 * 14 * hw.comm_latency_s, WithinRel(2 * 7.0 / 8 * 16'060'522'496.0 / 2.3e11, 1e-9));
}

TEST_CASE("turning overlap off never makes a step faster", "[step]") {
  auto [name, method, gpu, gpus, grad_accum] = GENERATE(table<std::string, Method, std::string, int64_t, int64_t>({
      {"llama-3-8b", Method::full, "a100-80gb-sxm", 8, 1},
      {"llama-3-8b", Method::lora, "a100-40gb-sxm", 4, 2},
      {"tinyllama-1.1b", Method::lora, "rtx-6000-ada", 4, 2},
      {"codellama-34b", Method::lora, "rtx-6000-ada", 4, 4},
      {"llama-3.1-70b", Method::qlora, "h100-sxm", 16, 1},
  }));
  CAPTURE(name, ftplan::to_string(method), gpu, gpus, grad_accum);
  const auto model = load_model(name);
  const auto hw = ftplan::load_hardware(gpu);
  const auto setup = make_setup(name, method, gpus, 2048, grad_accum);
  const auto ctx = ftplan::prepare_plan(model, hw, setup, gpus);
  ftplan::StepOptions off;
  off.overlap = false;
  for (Strategy s : ftplan::applicable_strategies(model, hw, setup)) {
    for (int64_t b : {1, 4}) {
      CAPTURE(ftplan::to_string(s), b);
      const Candidate c = cand(ctx, s, b, Checkpointing::full, Attention::fused);
      const auto on = ftplan::estimate_step(ctx, c);
      const auto no = ftplan::estimate_step(ctx, c, off);
      CHECK(no.step_time_s >= on.step_time_s);
      CHECK(no.exposed_comm_s == no.comm_s);  // reference path: every byte exposed
      CHECK(on.exposed_comm_s <= on.comm_s);
      CHECK(on.comm_bytes_per_step == no.comm_bytes_per_step);
    }
  }
}

TEST_CASE("FLOPs per token", "[step]") {
  // Kaplan et al. 2020: 2 FLOPs per weight per token forward; backward 2x forward for trained
  // weights, 1x for frozen ones. Attention scores: 4·S·q_dim per layer forward, 2x in backward
  // (compute_model.h). The embedding lookup is not a matmul; the lm_head is.
  const auto model = load_model("llama-3-8b");
  const double L = 32, S = 2048, q = 4096;
  const double matmul_weights = L * kLlama3BlockLinearWeights + kLlama3HeadWeights;  // 7,504,658,432
  const double attention = 4 * S * q * L;                                           // one forward
  SECTION("full fine-tuning: 6 per matmul weight + 3x the attention forward") {
    const auto f = ftplan::flops_per_token(model, make_setup("llama-3-8b", Method::full, 1, 2048));
    CHECK_THAT(f.model, WithinRel(6 * matmul_weights + 3 * attention, kExact));
    CHECK_THAT(f.forward, WithinRel(2 * matmul_weights + attention, kExact));
    CHECK_THAT(f.block_forward, WithinRel(L * 2 * kLlama3BlockLinearWeights + attention, kExact));
    // Close to the 6N rule: 6·8.03e9 = 4.818e10; the exact figure 4.825e10 (embedding out, attention in).
    CHECK_THAT(f.model, WithinRel(6 * kLlama3Params, 0.01));
  }
  SECTION("LoRA: 4 per frozen weight + attention + 6 per adapter weight") {
    auto setup = make_setup("llama-3-8b", Method::lora, 1, 2048);
    const auto f = ftplan::flops_per_token(model, setup);
    const double adapters = 6'815'744;  // r=16 on q_proj, v_proj (see above)
    CHECK_THAT(f.model, WithinRel(4 * matmul_weights + 3 * attention + 6 * adapters, kExact));
    CHECK_THAT(f.model / (6 * kLlama3Params), WithinRel(4.0 / 6.0, 0.05));
    // QLoRA does the same matmuls (the dequantisation is time, not FLOPs).
    setup.method = Method::qlora;
    CHECK_THAT(ftplan::flops_per_token(model, setup).model, WithinRel(f.model, kExact));
  }
  SECTION("full checkpointing adds one forward of the blocks to the step's compute") {
    const auto hw = ftplan::load_hardware("a100-80gb-sxm");
    const auto setup = make_setup("llama-3-8b", Method::lora, 1, 2048, 2);
    const auto ctx = ftplan::prepare_plan(model, hw, setup, 1);
    const auto none = ftplan::estimate_step(ctx, cand(ctx, Strategy::single, 2, Checkpointing::none, Attention::fused));
    const auto full = ftplan::estimate_step(ctx, cand(ctx, Strategy::single, 2, Checkpointing::full, Attention::fused));
    const double tokens = 2 * 2 * 2048;  // grad_accum x micro-batch x seq_len
    const double rate = hw.peak_flops_bf16 * hw.matmul_efficiency;
    // Timed at the FLOPs the kernels execute (fused causal attention: half the S x S blocks).
    CHECK_THAT(full.compute_s - none.compute_s, WithinRel(tokens * ctx.flops.block_forward_executed / rate, 1e-9));
    CHECK_THAT(none.compute_s,
               WithinRel(tokens * (ctx.flops.forward_executed + ctx.flops.backward_executed) / rate, kExact));
    // MFU counts model FLOPs only: recomputation lowers it.
    CHECK(full.mfu < none.mfu);
    CHECK(full.flops_per_step == none.flops_per_step);
  }
}

TEST_CASE("DDP tokens per step and throughput", "[step]") {
  const auto model = load_model("tinyllama-1.1b");
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  const auto setup = make_setup("tinyllama-1.1b", Method::lora, 8, 1024, 2);
  const auto ctx = ftplan::prepare_plan(model, hw, setup, 8);
  const auto s = ftplan::estimate_step(ctx, cand(ctx, Strategy::ddp, 4, Checkpointing::none, Attention::fused));
  CHECK(s.tokens_per_step == 8.0 * 2 * 4 * 1024);  // GPUs x grad_accum x micro-batch x seq_len
  CHECK_THAT(s.tokens_per_s, WithinRel(s.tokens_per_step / s.step_time_s, kExact));
  CHECK_THAT(s.step_time_s, WithinRel(s.compute_s + s.exposed_comm_s + s.optimizer_s, kExact));
  CHECK(s.mfu > 0.0);
  // MFU counts the whole S x S attention, the time only the causal half the kernel runs: at most the
  // efficiency times model / executed FLOPs.
  CHECK(s.mfu <= hw.matmul_efficiency * ctx.flops.model / (ctx.flops.forward_executed + ctx.flops.backward_executed));
}

TEST_CASE("fused causal attention is timed at the key blocks its kernel runs", "[step]") {
  // flash-attention skips the key blocks above the causal diagonal and outside the window
  // (compute_model.cpp): query i attends to min(i + 1, window) keys, a mean of m - m^2 / (2 S) over S
  // queries (m = min(S, window)): S / 2 for a global layer. Eager attention computes the whole S x S.
  // The model FLOPs (MFU) keep the whole 4·S·q_dim.
  const auto model = load_model("llama-3-8b");
  const double L = 32, S = 2048, q = 4096;
  auto setup = make_setup("llama-3-8b", Method::full, 1, 2048);
  setup.attention = Attention::fused;
  const auto f = ftplan::flops_per_token(model, setup);
  CHECK(f.block_attention == 4 * S * q);
  CHECK(f.block_attention_executed == 4 * (S / 2) * q);  // 16,777,216 of 33,554,432
  const double skipped = L * 2 * S * q;                  // per token, forward
  CHECK_THAT(f.forward_executed, WithinRel(f.forward - skipped, kExact));
  CHECK_THAT(f.backward_executed, WithinRel(f.backward - 2 * skipped, kExact));
  CHECK_THAT(f.block_forward_executed, WithinRel(f.block_forward - skipped, kExact));
  SECTION("eager attention runs every block") {
    setup.attention = Attention::eager;
    const auto e = ftplan::flops_per_token(model, setup);
    CHECK(e.block_attention_executed == e.block_attention);
    CHECK(e.forward_executed == e.forward);
  }
  SECTION("a sliding window: Gemma-2-9B, 21 local layers of window 4096 and 21 global, at 8192 tokens") {
    const auto gemma = load_model("gemma-2-9b");
    auto gs = make_setup("gemma-2-9b", Method::lora, 1, 8192);
    gs.attention = Attention::fused;
    // Local: 4096 - 4096^2 / (2 x 8192) = 3072 keys per query; global: 8192 / 2 = 4096; the mean 3584.
    CHECK(ftplan::flops_per_token(gemma, gs).block_attention_executed == 4.0 * 3584 * gemma.q_dim());
    CHECK(ftplan::flops_per_token(gemma, gs).block_attention == 4.0 * 6144 * gemma.q_dim());
  }
  SECTION("a padded batch that reaches SDPA with its mask runs every block (hf); torchtune passes is_causal") {
    const auto hw = ftplan::load_hardware("a100-80gb-sxm");
    for (const auto& [fw, packing, halved] : {std::tuple<std::string, bool, bool>{"hf", false, false},
                                              {"hf", true, true}, {"torchtune", false, true}, {"torchtune", true, true}}) {
      CAPTURE(fw, packing);
      auto fs = setup;
      fs.framework = fw;
      fs.packing = packing;
      const auto ctx = ftplan::prepare_plan(model, hw, fs, 1);
      CHECK(ctx.flops.block_attention_executed == (halved ? 2 * S * q : 4 * S * q));
    }
  }
  SECTION("the step's compute time counts the executed FLOPs, its MFU the model FLOPs") {
    const auto hw = ftplan::load_hardware("a100-80gb-sxm");
    const auto ctx = ftplan::prepare_plan(model, hw, setup, 1);
    const auto s = ftplan::estimate_step(ctx, cand(ctx, Strategy::single, 1, Checkpointing::none, Attention::fused));
    const double rate = hw.peak_flops_bf16 * hw.matmul_efficiency;
    CHECK_THAT(s.compute_s, WithinRel(S * (f.model - 3 * skipped) / rate, kExact));
    CHECK_THAT(s.flops_per_step, WithinRel(S * f.model, kExact));
  }
}

TEST_CASE("padded batches: time from the mean row length (tokens and attention keys), memory from the longest", "[step]") {
  // Issue 11: "memory from the longest batch the data can produce; time from the mean". Llama-3-8B, rows
  // of 512 tokens on average, at most 2048, padded (not packed), fused attention under ftexec (is_causal).
  const auto model = load_model("llama-3-8b");
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  const double q = 4096;
  auto setup = make_setup("llama-3-8b", Method::lora, 1, 2048);
  setup.attention = Attention::fused;
  setup.dataset.mean_tokens_per_row = 512;
  setup.dataset.max_tokens_per_row = 2048;
  CHECK(ftplan::timed_row_tokens(setup) == 512);
  const auto f = ftplan::flops_per_token(model, setup);
  // A query of a 512-token row attends over at most 512 keys: 4 · 512 · q_dim, the causal half executed.
  CHECK(f.block_attention == 4 * 512 * q);
  CHECK(f.block_attention_executed == 4 * 256 * q);
  CHECK(ftplan::micro_batch_tokens(setup, 4) == 4 * 512);
  auto packed = setup;
  packed.packing = true;  // packed rows fill seq_len: 2048 keys, 4 x 2048 tokens
  CHECK(ftplan::timed_row_tokens(packed) == 2048);
  CHECK(ftplan::flops_per_token(model, packed).block_attention == 4 * 2048 * q);
  CHECK(ftplan::micro_batch_tokens(packed, 4) == 4 * 2048);
  auto no_mean = setup;
  no_mean.dataset.mean_tokens_per_row = 0;  // no mean given: rows of seq_len
  CHECK(ftplan::timed_row_tokens(no_mean) == 2048);
  auto long_mean = setup;
  long_mean.seq_len = 256;  // rows truncated to seq_len: the mean is capped there
  CHECK(ftplan::timed_row_tokens(long_mean) == 256);
  // The step: the mean-length rows cost their own attention, and the memory does not move with the mean.
  const auto ctx = ftplan::prepare_plan(model, hw, setup, 1);
  const auto ctx_no_mean = ftplan::prepare_plan(model, hw, no_mean, 1);
  const auto c = cand(ctx, Strategy::single, 4, Checkpointing::none, Attention::fused);
  const auto s = ftplan::estimate_step(ctx, c);
  const auto s_no_mean = ftplan::estimate_step(ctx_no_mean, c);
  const double rate = hw.peak_flops_bf16 * hw.matmul_efficiency;
  CHECK_THAT(s.compute_s, WithinRel(4 * 512 * (f.forward_executed + f.backward_executed) / rate, kExact));
  CHECK(s.compute_s < s_no_mean.compute_s / 4);  // a quarter of the tokens, each with a quarter of the keys
  CHECK(ftplan::estimate_memory(model, hw, setup, c).per_gpu.total == ftplan::estimate_memory(model, hw, no_mean, c).per_gpu.total);
}

TEST_CASE("the optimizer step's bytes per parameter follow its implementation", "[step]") {
  using ftplan::Optimizer;
  using ftplan::Precision;
  // compute_model.h: fused AdamW reads p, g, m, v and writes p, m, v (2P + G + 4S); torch's foreach
  // AdamW makes one pass per _foreach op (4P + 3G + 14S); mixed precision refreshes its bf16 copy
  // from the fp32 master (+ 4 + 2).
  CHECK(ftplan::optimizer_step_bytes_per_param(Precision::bf16, Optimizer::adamw, false) == 2 * 2 + 2 + 4 * 2);     // 14
  CHECK(ftplan::optimizer_step_bytes_per_param(Precision::bf16, Optimizer::adamw, true) == 4 * 2 + 3 * 2 + 14 * 2);  // 42
  CHECK(ftplan::optimizer_step_bytes_per_param(Precision::amp, Optimizer::adamw, true) == 4 * 4 + 3 * 4 + 14 * 4);   // 84
  CHECK(ftplan::optimizer_step_bytes_per_param(Precision::amp, Optimizer::adamw, false) == 28);
  CHECK(ftplan::optimizer_step_bytes_per_param(Precision::mixed, Optimizer::adamw, false) == 2 * 4 + 2 + 4 * 4 + 4 + 2);  // 32
  // bitsandbytes' 8-bit AdamW is one kernel whatever the framework: one byte per moment.
  CHECK(ftplan::optimizer_step_bytes_per_param(Precision::bf16, Optimizer::adamw8bit, true) == 2 * 2 + 2 + 4);  // 10
  CHECK(ftplan::optimizer_step_bytes_per_param(Precision::bf16, Optimizer::sgd, true) == 2 * 2 + 2 + 5 * 2);     // 16
  SECTION("the framework's implementation times the step: hf foreach, torchtune fused") {
    const auto model = load_model("llama-3.2-3b");
    const auto hw = ftplan::load_hardware("a100-80gb-sxm");
    for (const auto& [fw, bytes] : {std::pair<std::string, double>{"hf", 42.0}, {"torchtune", 14.0}}) {
      CAPTURE(fw);
      auto setup = make_setup("llama-3.2-3b", Method::full, 1, 1024);
      setup.framework = fw;
      setup.precision = Precision::bf16;
      const auto ctx = ftplan::prepare_plan(model, hw, setup, 1);
      const auto s = ftplan::estimate_step(ctx, cand(ctx, Strategy::single, 1, Checkpointing::full, Attention::fused));
      CHECK_THAT(s.optimizer_s, WithinRel(double(ctx.trainable_params) * bytes / hw.hbm_bandwidth_bytes_per_s, kExact));
    }
  }
}

TEST_CASE("bitsandbytes' paged optimizer states cross the host link every step when they do not fit", "[step][paged]") {
  using ftplan::Optimizer;
  using ftplan::Precision;
  // step_time.h paged_state_migration_s: states that fit beside the step stay on the GPU; states that do not
  // are all evicted before their next use (FIFO over a cyclic walk) and come in and go out once per step.
  CHECK(ftplan::paged_state_migration_s(10e9, 10e9, 25e9) == 0);
  CHECK(ftplan::paged_state_migration_s(10e9, 20e9, 25e9) == 0);
  CHECK_THAT(ftplan::paged_state_migration_s(10e9, 9e9, 25e9), WithinRel(2 * 10e9 / 25e9, kExact));  // 0.8 s, not 2 x 1 GB
  CHECK_THAT(ftplan::paged_state_migration_s(10e9, -1e9, 25e9), WithinRel(0.8, kExact));
  // bitsandbytes' 32-bit PagedAdamW keeps fp32 moments on a bf16 model: 8 B per parameter, 4 B without paging.
  CHECK(ftplan::trainable_param_bytes(Precision::bf16, Optimizer::adamw, true).optimizer == 8);
  CHECK(ftplan::trainable_param_bytes(Precision::bf16, Optimizer::adamw, false).optimizer == 4);
  // Its update is its own fused kernel (optimizer_update_32bit): 2P + G + 4 x 4 B = 22 B, even where the framework's
  // default AdamW is foreach.
  CHECK(ftplan::optimizer_step_bytes_per_param(Precision::bf16, Optimizer::adamw, true, true) == 2 * 2 + 2 + 4 * 4);

  // torchtune's Llama-2-7B full fine-tune with PagedAdamW on one RTX 4090 (recipes/configs/llama2/
  // 7B_full_low_memory.yaml): 6,738,415,616 parameters x 8 B = 53.9 GB of states against a 24 GB card that
  // already holds the 13.5 GB of bf16 weights: all of it in and out, 2 x 53.9 GB at the hwdb's 24 GB/s = 4.49 s.
  const auto model = load_model("llama-2-7b");
  auto setup = make_setup("llama-2-7b", Method::full, 1, 2048);
  setup.framework = "torchtune";
  setup.precision = Precision::bf16;
  setup.optimizer = Optimizer::adamw;
  setup.paged_optimizer = true;
  setup.optimizer_in_backward = true;
  constexpr double kParams = 6'738'415'616.0;
  SECTION("RTX 4090: the states do not fit") {
    const auto hw = ftplan::load_hardware("rtx-4090");
    const auto ctx = ftplan::prepare_plan(model, hw, setup, 1);
    REQUIRE(double(ctx.trainable_params) == kParams);
    const auto c = cand(ctx, Strategy::single, 4, Checkpointing::full, Attention::fused);
    const auto m = ftplan::estimate_memory(ctx.memory, c, 1, false);
    CHECK(double(m.per_gpu.paged_optimizer) == 8 * kParams);
    CHECK(m.per_gpu.optimizer == 0);
    const auto s = ftplan::estimate_step(ctx, c);
    CHECK_THAT(s.paged_state_migration_s, WithinRel(2 * 8 * kParams / 2.4e10, kExact));  // 4.4923 s
    CHECK_THAT(s.optimizer_s - s.paged_state_migration_s, WithinRel(kParams * 22 / hw.hbm_bandwidth_bytes_per_s, 1e-9));
    CHECK_THAT(s.step_time_s, WithinRel(s.compute_s + s.optimizer_s, kExact));
  }
  SECTION("RTX 4090 in a PCIe 3.0 x8 slot: the same bytes over a quarter of the link") {
    auto hw = ftplan::load_hardware("rtx-4090");
    auto slotted = setup;
    slotted.pcie_slot = "3x8";
    ftplan::apply_topology(slotted, hw);
    const auto ctx = ftplan::prepare_plan(model, hw, slotted, 1);
    const auto s = ftplan::estimate_step(ctx, cand(ctx, Strategy::single, 4, Checkpointing::full, Attention::fused));
    CHECK_THAT(s.paged_state_migration_s, WithinRel(2 * 8 * kParams / (2.4e10 / 4), kExact));  // 17.97 s
  }
  SECTION("H200: 54 GB of states fit beside the step, and stay") {
    const auto hw = ftplan::load_hardware("h200");
    const auto ctx = ftplan::prepare_plan(model, hw, setup, 1);
    const auto s = ftplan::estimate_step(ctx, cand(ctx, Strategy::single, 4, Checkpointing::full, Attention::fused));
    CHECK(s.paged_state_migration_s == 0);
    CHECK_THAT(s.optimizer_s, WithinRel(kParams * 22 / hw.hbm_bandwidth_bytes_per_s, 1e-9));
  }
}

TEST_CASE("eager element-wise work beyond fused kernels, at HBM bandwidth; none under compile", "[step][elementwise]") {
  // compute_model.h eager_elementwise_bytes_per_token: per block and token, two RMSNorms over hidden_size,
  // RoPE over q_dim + kv_dim, the MLP's activation over intermediate_size, each at the framework's eager bytes
  // per element less one fused kernel's (4, 4, 6). Llama-3.2-3B: hidden 3072, q 3072, kv 1024, intermediate 8192.
  const auto model = load_model("llama-3.2-3b");
  auto setup = make_setup("llama-3.2-3b", Method::lora, 1, 1024);
  const double hf = 2 * (36 - 4) * 3072.0 + (20 - 4) * 4096.0 + (10 - 6) * 8192.0;          // 294,912 B
  const double torchtune = 2 * (40 - 4) * 3072.0 + (48 - 4) * 4096.0 + (10 - 6) * 8192.0;   // 434,176 B
  CHECK(hf == 294'912);
  for (const auto& [fw, bytes] : {std::pair<std::string, double>{"hf", hf}, {"torchtune", torchtune}, {"ftexec", 0.0}}) {
    CAPTURE(fw);
    setup.framework = fw;
    setup.compile = false;
    CHECK(ftplan::eager_elementwise_bytes_per_token(model, ftplan::framework_profile(fw), setup) == bytes);
    setup.compile = true;
    CHECK(ftplan::eager_elementwise_bytes_per_token(model, ftplan::framework_profile(fw), setup) == 0);
  }
  SECTION("the step: forward once, backward twice, full checkpointing's recompute once more") {
    const auto hw = ftplan::load_hardware("a100-80gb-sxm");
    setup.framework = "hf";
    for (const auto ck : {Checkpointing::none, Checkpointing::full}) {
      CAPTURE(ftplan::to_string(ck));
      setup.compile = false;
      const auto eager_ctx = ftplan::prepare_plan(model, hw, setup, 1);
      const auto eager = ftplan::estimate_step(eager_ctx, cand(eager_ctx, Strategy::single, 4, ck, Attention::fused));
      setup.compile = true;
      const auto compiled_ctx = ftplan::prepare_plan(model, hw, setup, 1);
      const auto compiled = ftplan::estimate_step(compiled_ctx, cand(compiled_ctx, Strategy::single, 4, ck, Attention::fused));
      const double passes = ck == Checkpointing::full ? 4 : 3;
      const double tokens = 4 * 1024.0;
      CHECK_THAT(eager.compute_s - compiled.compute_s, WithinRel(28 * hf * passes * tokens / 2.039e12, 1e-9));  // 65 ms / 87 ms
    }
  }
}

TEST_CASE("hwdb per-shape GEMM anchors scale matmul_efficiency by a GEMM's shape", "[step][gemm]") {
  const ftplan::ModelSpec model = ftplan::load_model("llama-3.2-1b");  // hidden 2048, vocabulary 128256
  ftplan::HardwareSpec hw = ftplan::load_hardware("h100-sxm");
  hw.matmul_efficiency = 0.4;
  hw.gemm_efficiency_bf16 = {0.2, 0.2, 0.6, 0.8};  // measured in isolation; 0.8 at the largest anchor
  ftplan::TrainingSetup s;
  s.precision = ftplan::Precision::mixed;
  const double peak = 989e12;
  // Relative to the largest anchor, times matmul_efficiency: 0.4 x 0.6 / 0.8 = 0.3 at 512, 0.1 at 64 and below.
  const std::vector<double> a = ftplan::hwdb_gemm_anchors(hw, s.precision, 0.4);
  REQUIRE(a.size() == 4);
  CHECK(a[0] == Approx(0.1));
  CHECK(a[2] == Approx(0.3));
  CHECK(a[3] == Approx(0.4));
  // The head GEMM's smallest dimension is the micro-batch's rows: 512 rows -> 0.3, 16 rows -> 0.1, and
  // 8192 rows -> min(8192, hidden 2048): halfway in log2 between 512 and 4096 is 1 / (1/3 / 0.3 + 2/3 / 0.4).
  CHECK(ftplan::piece_rates(model, hw, s, 512).head == Approx(peak * 0.3));
  CHECK(ftplan::piece_rates(model, hw, s, 16).head == Approx(peak * 0.1));
  CHECK(ftplan::piece_rates(model, hw, s, 8192).head == Approx(peak / (1.0 / 3.0 / 0.3 + 2.0 / 3.0 / 0.4)));
  CHECK_FALSE(ftplan::piece_rates(model, hw, s, 512).uniform);
  // Attention stays at matmul_efficiency.
  CHECK(ftplan::piece_rates(model, hw, s, 512).attention == Approx(peak * 0.4));
  // fp32 (no bf16 tensor cores), --efficiency, or no table: one uniform rate.
  ftplan::TrainingSetup fp32 = s;
  fp32.precision = ftplan::Precision::fp32;
  CHECK(ftplan::piece_rates(model, hw, fp32, 512).uniform);
  ftplan::TrainingSetup given = s;
  given.efficiency = 0.5;
  CHECK(ftplan::piece_rates(model, hw, given, 512).uniform);
  CHECK(ftplan::piece_rates(model, hw, given, 512).head == Approx(peak * 0.5));
  hw.gemm_efficiency_bf16.clear();
  CHECK(ftplan::piece_rates(model, hw, s, 512).uniform);
  CHECK(ftplan::piece_rates(model, hw, s, 512).head == Approx(peak * 0.4));
}

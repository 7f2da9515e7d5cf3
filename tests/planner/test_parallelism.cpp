// Parallelism as degrees (planner/parallelism.h): parsing and validation that names every operand,
// the presets as points of the description, Korthikanti et al. 2022's activation formulas, a
// tensor-parallel Llama block and rank by hand, KV-head replication, and Narayanan et al. 2021's
// interleaved pipeline bubble.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "planner/activation_memory.h"
#include "planner/errors.h"
#include "planner/hardware_spec.h"
#include "planner/memory_model.h"
#include "planner/model_spec.h"
#include "planner/parallelism.h"
#include "planner/plan_search.h"
#include "planner/step_time.h"
#include "planner/training_setup.h"
#include "planner_fixtures.h"

using Catch::Matchers::Contains;
using Catch::Matchers::WithinRel;
using ftplan::Attention;
using ftplan::Checkpointing;
using ftplan::Method;
using ftplan::Parallelism;
using ftplan::PipelineSchedule;
using ftplan::Sharding;
using ftplan::Strategy;

namespace {

constexpr double kExact = 1e-12;

ftplan::TrainingSetup make_setup(const std::string& model, Method method, int64_t gpus, int64_t seq_len,
                                 int64_t grad_accum = 1) {
  return ftplan::testing::ftexec_setup(model, method, gpus, seq_len, grad_accum);
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

std::string input_error(const std::string& text) {
  try {
    ftplan::parse_parallelism(text, "--parallel");
  } catch (const ftplan::InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("--parallel parses degrees and flags, and prints them back canonically", "[parallel]") {
  const Parallelism p = ftplan::parse_parallelism("tp=8,pp=2,dp_shard=4", "--parallel");
  CHECK(p.tp == 8);
  CHECK(p.pp == 2);
  CHECK(p.dp_shard == 4);
  CHECK(p.dp_replicate == 1);
  CHECK(p.gpus() == 64);
  // dp_shard without shard= takes the framework's default sharding (here the parser's default, FSDP).
  CHECK(p.sharding == Sharding::fsdp);
  CHECK(ftplan::parse_parallelism("dp_shard=4", "--parallel", "zero3").sharding == Sharding::zero);
  CHECK(ftplan::parse_parallelism("dp_shard=4", "--parallel", "zero3").zero_stage == 3);
  // virtual_stages implies the interleaved schedule; spaces around items are allowed.
  const Parallelism q = ftplan::parse_parallelism(" pp=4, vpp=2 ,dp_replicate=2", "--parallel");
  CHECK(q.schedule == PipelineSchedule::interleaved_1f1b);
  CHECK(q.virtual_stages == 2);
  // Round trip through the canonical string, for compositions of every kind.
  for (const std::string text : {"tp=8,pp=2,dp_shard=4", "tp=4,sp=1,dp_shard=2,shard=zero2", "cp=4,cp_mode=all_gather",
                                 "pp=4,schedule=interleaved_1f1b,virtual_stages=2,dp_replicate=2",
                                 "dp_shard=8,shard=fsdp_shard_grad_op", "dp_shard=4,shard=zero3,offload=optimizer+params",
                                 "dp_replicate=2,dp_shard=8,shard=fsdp", "pp=2,schedule=gpipe"}) {
    CAPTURE(text);
    const Parallelism a = ftplan::parse_parallelism(text, "--parallel");
    CHECK(ftplan::parse_parallelism(ftplan::to_string(a), "--parallel") == a);
  }
}

TEST_CASE("--parallel refuses what it cannot read, naming the key", "[parallel][bad-input]") {
  CHECK_THAT(input_error("tp=8,foo=2"), Contains("--parallel: foo: unknown key"));
  CHECK_THAT(input_error("tp=eight"), Contains("--parallel: tp: 'eight' is not a whole number"));
  CHECK_THAT(input_error("tp=0"), Contains("--parallel: tp: 0 is out of range"));
  CHECK_THAT(input_error("tp=2,tp=4"), Contains("--parallel: tp: given twice"));
  CHECK_THAT(input_error("tp8"), Contains("is not key=value"));
  CHECK_THAT(input_error(""), Contains("--parallel: empty"));
  CHECK_THAT(input_error("shard=zero4"), Contains("--parallel: shard: 'zero4' is not one of"));
  CHECK_THAT(input_error("pp=2,schedule=zb"), Contains("--parallel: schedule: 'zb' is not one of"));
  CHECK_THAT(input_error("sp=2"), Contains("--parallel: sp: '2' is not 0 or 1"));
}

TEST_CASE("validation names every operand", "[parallel][bad-input]") {
  const auto model = ftplan::load_model("llama-3-8b");  // 32 heads, 8 KV heads, 32 layers, intermediate 14336
  auto setup = make_setup("llama-3-8b", Method::full, 32, 4096, 4);
  auto problems = [&](const std::string& text, int64_t gpus, Attention at = Attention::fused) {
    return joined(ftplan::parallelism_problems(ftplan::parse_parallelism(text, "--parallel"), model, setup, gpus, at));
  };
  // The issue's own example, operand by operand.
  CHECK_THAT(problems("tp=8,pp=2,dp_shard=4", 32), Contains("tp(8) * pp(2) * dp_shard(4) = 64 != gpus(32)"));
  CHECK(problems("tp=8,pp=2,dp_shard=2", 32).empty());
  CHECK_THAT(problems("tp=3", 3), Contains("tp(3) does not divide num_attention_heads(32)"));
  // 16 ranks over 8 KV heads replicate each KV head twice (Megatron's GQA): allowed.
  CHECK_THAT(problems("tp=16", 16), !Contains("num_key_value_heads"));
  CHECK_THAT(problems("pp=64", 64), Contains("pp(64) > num_hidden_layers(32)"));
  CHECK_THAT(problems("cp=3", 3), Contains("cp(3) cannot split seq_len(4096)"));
  CHECK_THAT(problems("cp=2", 2, Attention::eager), Contains("cp(2) with attention eager"));
  CHECK_THAT(problems("sp=1", 1), Contains("sp=1 (sequence parallelism) needs tp > 1"));
  CHECK(problems("pp=4,virtual_stages=2", 4).empty());
  setup.grad_accum = 6;
  CHECK_THAT(problems("pp=4,virtual_stages=2", 4), Contains("grad_accum(6) micro-batches must divide by pp(4)"));
  CHECK_THAT(problems("pp=8,virtual_stages=8", 8), Contains("pp(8) * virtual_stages(8) > num_hidden_layers(32)"));
  CHECK_THAT(problems("ep=2", 2), Contains("ep(2)"));
  // Every problem at once, not the first only.
  const std::string many = problems("tp=3,pp=64", 32);
  CHECK_THAT(many, Contains("!= gpus(32)"));
  CHECK_THAT(many, Contains("tp(3) does not divide"));
  CHECK_THAT(many, Contains("pp(64) > num_hidden_layers(32)"));
}

TEST_CASE("every preset is a point of the description and is named by it", "[parallel]") {
  const auto strategy = GENERATE(Strategy::single, Strategy::mp, Strategy::pipeline_gpipe, Strategy::pipeline_1f1b,
                                 Strategy::ddp, Strategy::zero1, Strategy::zero2, Strategy::zero3, Strategy::fsdp,
                                 Strategy::fsdp_shard_grad_op, Strategy::fsdp_hybrid, Strategy::zero2_offload,
                                 Strategy::zero3_offload);
  const int64_t gpus = strategy == Strategy::single ? 1 : 16;
  CAPTURE(ftplan::to_string(strategy));
  const Parallelism p = ftplan::preset(strategy, gpus, 8);
  CHECK(p.gpus() == gpus);
  REQUIRE(ftplan::preset_of(p).has_value());
  CHECK(*ftplan::preset_of(p) == strategy);
  CHECK(ftplan::name(p) == ftplan::to_string(strategy));
  // Its canonical string parses back to the same layout: the name and the degrees are one thing.
  CHECK(ftplan::parse_parallelism(ftplan::to_string(p), "--parallel") == p);
  // A composition is no preset and is named by its degrees.
  Parallelism tp = p;
  tp.tp = 2;
  CHECK_FALSE(ftplan::preset_of(tp).has_value());
  CHECK(ftplan::name(tp) == ftplan::to_string(tp));
}

TEST_CASE("Korthikanti et al. 2022, Table 2: activation bytes per layer of GPT-3 175B", "[parallel][activations]") {
  // "Reducing Activation Recomputation in Large Transformer Models" (arXiv 2205.05198), sec. 4 and
  // Table 2, for 16-bit activations: a layer keeps sbh(34 + 5as/h) bytes, 10sbh of it outside the
  // tensor-parallel region (layer-norm inputs, dropout masks, the attention and MLP inputs) and
  // 24sbh + 5as²b inside it (q, k, v, QKᵀ, softmax, its dropout, the MLP's 4h intermediates).
  // GPT-3 175B (sec. 6, Table 3): s = 2048, b = 1, h = 12288, a = 96 heads, t = 8; there 5as/h = 80.
  const double s = 2048, b = 1, h = 12288, a = 96, t = 8;
  REQUIRE(5 * a * s / h == 80);
  // ActivationTerms hold one tensor-parallel rank's share of the inside terms (what a rank computes).
  auto terms = [&](double tp, bool selective_recompute) {
    ftplan::ActivationTerms k;
    k.sequence = 10 * s * b * h;
    k.tensor = (24 * s * b * h + (selective_recompute ? 0 : 5 * a * s * s * b)) / tp;
    return k;
  };
  const auto full = terms(1, false), full8 = terms(t, false);
  const auto selective8 = terms(t, true);  // selective recompute: the attention core (5as²b) is recomputed
  const double sbh = s * b * h;
  // No parallelism: sbh(34 + 5as/h) = 114 sbh = 2,868,903,936 bytes.
  CHECK(ftplan::split_activation_bytes(full, 1, false, 1) == 2'868'903'936);
  CHECK(ftplan::split_activation_bytes(full, 1, false, 1) == 114 * sbh);
  // Tensor parallel: sbh(10 + 24/t + 5as/(ht)) = 23 sbh.
  CHECK(ftplan::split_activation_bytes(full8, 8, false, 1) == (10 + 24 / t + 5 * a * s / (h * t)) * sbh);
  CHECK(ftplan::split_activation_bytes(full8, 8, false, 1) == 578'813'952);
  // Tensor + sequence parallel: sbh/t (34 + 5as/h) = 114/8 sbh.
  CHECK(ftplan::split_activation_bytes(full8, 8, true, 1) == sbh / t * (34 + 5 * a * s / h));
  CHECK(ftplan::split_activation_bytes(full8, 8, true, 1) == 358'612'992);
  // Tensor parallel + selective recompute: sbh(10 + 24/t) = 13 sbh.
  CHECK(ftplan::split_activation_bytes(selective8, 8, false, 1) == sbh * (10 + 24 / t));
  CHECK(ftplan::split_activation_bytes(selective8, 8, false, 1) == 327'155'712);
  // Tensor + sequence parallel + selective recompute: 34 sbh / t, 5x less than TP alone (sec. 5.2's
  // headline: "reduces activation memory by 5x").
  CHECK(ftplan::split_activation_bytes(selective8, 8, true, 1) == 34 * sbh / t);
  CHECK(ftplan::split_activation_bytes(selective8, 8, true, 1) == 106'954'752);
  CHECK_THAT(double(ftplan::split_activation_bytes(full8, 8, false, 1)) / ftplan::split_activation_bytes(selective8, 8, true, 1),
             WithinRel(23.0 / 4.25, kExact));
  // Context parallelism splits every term by the sequence chunks (Megatron-LM's context parallel).
  CHECK(ftplan::split_activation_bytes(full8, 8, true, 2) == 358'612'992 / 2);
  CHECK(ftplan::split_activation_bytes(full, 1, false, 4) == 2'868'903'936 / 4);
}

TEST_CASE("a tensor-parallel Llama block keeps Korthikanti's split, by hand", "[parallel][activations]") {
  // Llama-3.1-70B: h = 8192, 64 heads of 128, 8 KV heads, intermediate 28672; bf16 full fine-tuning,
  // B = 1, S = 2048, T = 2048 tokens. The block's tensors (activation_memory.h):
  //   outside the TP region (whole on every rank, split by tp under SP): two RMSNorms, each its fp32
  //     input 4Th, rstd 4T and normalised input 2Th; the attention and MLP inputs 2Th each
  //     = 16Th + 8T
  //   inside (one rank's heads and columns): eager attention with q, k, v repeated to the rank's
  //     heads 3·2·T·q/t, fp32 softmax and its bf16 copy 6·(heads/t)·S², o_proj input 2T·q/t;
  //     SwiGLU gate, SiLU, up and down's input 4·2·T·i/t
  const auto model = ftplan::load_model("llama-3.1-70b");
  REQUIRE(model.hidden_size == 8192);
  REQUIRE(model.num_heads == 64);
  REQUIRE(model.num_kv_heads == 8);
  REQUIRE(model.intermediate_size == 28672);
  auto setup = make_setup("llama-3.1-70b", Method::full, 8, 2048);
  const double T = 2048, S = 2048, h = 8192, q = 8192, i = 28672, heads = 64;
  const double outside = 16 * T * h + 8 * T;
  auto inside_eager = [&](double t) { return 6 * T * q / t + 6 * (heads / t) * S * S + 2 * T * q / t + 8 * T * i / t; };
  for (const int64_t tp : {1, 2, 4, 8}) {
    for (const bool sp : {false, true}) {
      if (sp && tp == 1) continue;
      CAPTURE(tp, sp);
      auto in = ftplan::activation_inputs(setup, 1, Attention::eager);
      in.tp = tp;
      in.sequence_parallel = sp;
      const double want = outside / (sp ? tp : 1) + inside_eager(tp);
      CHECK_THAT(double(ftplan::block_activation_bytes(model, in)), WithinRel(want, 1e-9));
      // Selective recompute drops exactly the attention core's 6·(heads/t)·S² (Korthikanti's 5as²b
      // with HF's fp32 softmax) and nothing else.
      auto sel = ftplan::activation_inputs(setup, 1, Attention::eager, {}, true);
      sel.tp = tp;
      sel.sequence_parallel = sp;
      CHECK_THAT(double(ftplan::block_activation_bytes(model, sel)), WithinRel(want - 6 * (heads / tp) * S * S, 1e-9));
    }
  }
  // Fused attention keeps q, k, v at their own widths (8 KV heads: one per rank at tp = 8), its output,
  // the fp32 log-sum-exp 4·(heads/t)·S and o_proj's input (the output transposed into a copy):
  // inside = 2T(q + 2kv)/t + 2·2Tq/t + 4(heads/t)S + 8Ti/t.
  auto in = ftplan::activation_inputs(setup, 1, Attention::fused);
  in.tp = 8;
  const double kv = 1024;
  CHECK_THAT(double(ftplan::block_activation_bytes(model, in)),
             WithinRel(outside + 2 * T * (q + 2 * kv) / 8 + 4 * T * q / 8 + 4 * (heads / 8) * S + 8 * T * i / 8, 1e-9));
  // tp = 16 > 8 KV heads: each rank holds one (replicated) KV head of 128, not half of one.
  in.tp = 16;
  CHECK_THAT(double(ftplan::block_activation_bytes(model, in)),
             WithinRel(outside + 2 * T * (q / 16 + 2 * 128) + 4 * T * q / 16 + 4 * (heads / 16) * S + 8 * T * i / 16, 1e-9));
}

TEST_CASE("one tensor-parallel rank's parameters, by hand (Megatron's split)", "[parallel][memory]") {
  const auto model = ftplan::load_model("llama-3.1-70b");  // vocab 128256, untied head
  const int64_t h = 8192, kv = 1024, i = 28672, V = 128256;
  const auto whole = ftplan::count_params(model);
  for (const int64_t tp : {1, 2, 8}) {
    CAPTURE(tp);
    const auto rank = ftplan::count_params(model, tp);
    // q, o: h·h/t; k, v: h·kv/t; gate, up, down: h·i/t; the two RMSNorms whole on every rank.
    CHECK(rank.attention == (2 * h * h + 2 * h * kv) / tp);
    CHECK(rank.mlp == 3 * h * i / tp);
    CHECK(rank.norms == 2 * h);
    CHECK(rank.per_layer == rank.attention + rank.mlp + rank.norms);
    // Vocabulary-parallel embedding and head: V/t rows each.
    CHECK(rank.embedding == V / tp * h);
    CHECK(rank.lm_head == V / tp * h);
    CHECK(rank.final_norm == h);
  }
  // tp = 16 with 8 KV heads: k and v keep one whole head (128 columns) each on every rank.
  const auto r16 = ftplan::count_params(model, 16);
  CHECK(r16.attention == 2 * h * h / 16 + 2 * h * 128);
  CHECK(ftplan::count_params(model, 1).total == whole.total);
}

TEST_CASE("tensor parallelism cuts weights, gradients and optimizer states per rank", "[parallel][memory]") {
  // Llama-3.1-70B full fine-tuning on 8 H100: tp=8 holds 1/8 of the block linears and of the vocabulary
  // on each rank (exact, per count_params), FSDP over 8 instead holds 1/8 of everything; the two agree
  // on the states to within the replicated norms, and tp=8,dp_shard=... composes both.
  const auto model = ftplan::load_model("llama-3.1-70b");
  const auto hw = ftplan::load_hardware("h100-sxm");
  auto setup = make_setup("llama-3.1-70b", Method::full, 8, 2048);
  const auto tp8 = ftplan::parse_parallelism("tp=8", "--parallel");
  const auto job1 = ftplan::prepare_job(model, hw, setup);
  const auto job8 = ftplan::prepare_job(model, hw, setup, ftplan::shard_shape(tp8));
  const auto rank = ftplan::count_params(model, 8), whole = ftplan::count_params(model);
  // Bytes per stored weight from the unsplit job; a rank stores its count_params(model, 8) share of them.
  const double per_weight = job1.layer_weight_bytes / double(whole.per_layer);
  CHECK(per_weight >= 2);
  CHECK_THAT(job8.layer_weight_bytes, WithinRel(double(rank.per_layer) * per_weight, 1e-12));
  CHECK_THAT(job8.embedding_weight_bytes, WithinRel(double(rank.embedding) * per_weight, 1e-12));
  CHECK_THAT(job8.layer_opt_bytes / job1.layer_opt_bytes, WithinRel(double(rank.per_layer) / whole.per_layer, 1e-12));
  const auto m_tp = ftplan::estimate_memory(job8, ftplan::layout_candidate(tp8), 8);
  // Composed with FSDP over 4 data-parallel ranks (32 GPUs), the states shrink 4x more.
  auto setup32 = setup;
  setup32.num_gpus = 32;
  const auto tp8fsdp4 = ftplan::parse_parallelism("tp=8,dp_shard=4", "--parallel");
  const auto job32 = ftplan::prepare_job(model, hw, setup32, ftplan::shard_shape(tp8fsdp4));
  const auto m_both = ftplan::estimate_memory(job32, ftplan::layout_candidate(tp8fsdp4), 32);
  CHECK_THAT(double(m_both.per_gpu.optimizer), WithinRel(m_tp.per_gpu.optimizer / 4.0, 1e-9));
  CHECK_THAT(double(m_both.per_gpu.gradients), WithinRel(m_tp.per_gpu.gradients / 4.0, 0.02));
  // Activations are the TP rank's and do not change with the data-parallel degree.
  CHECK(m_both.per_gpu.activations == m_tp.per_gpu.activations);
}

TEST_CASE("Narayanan et al. 2021: the interleaved schedule shrinks the bubble v-fold", "[parallel][step]") {
  // "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", sec. 2.2.2:
  // with v model chunks per stage the bubble takes (p-1)·(t_f+t_b)/v, a fraction (p-1)/(v·m) of the
  // ideal time, for m micro-batches over p stages.
  auto [p, v, m] = GENERATE(table<int64_t, int64_t, int64_t>({{2, 2, 4}, {4, 2, 8}, {4, 4, 16}, {8, 2, 16}, {8, 4, 8}}));
  CAPTURE(p, v, m);
  const auto model = ftplan::load_model("llama-3-8b");  // 32 layers: p·v divides them
  auto hw = ftplan::load_hardware("h100-sxm");
  // Links without cost isolate the schedule's arithmetic from the activation hops.
  hw.comm_latency_s = 0;
  hw.intra_node_bandwidth_bytes_per_s = hw.inter_node_bandwidth_bytes_per_s = 1e300;
  for (auto& link : hw.topology.links) link.bandwidth_bytes_per_s = 1e300;
  const auto setup = make_setup("llama-3-8b", Method::lora, p, 2048, m);
  Parallelism layout;
  layout.pp = p;
  layout.schedule = PipelineSchedule::interleaved_1f1b;
  layout.virtual_stages = v;
  REQUIRE(ftplan::parallelism_problems(layout, model, setup, p, Attention::fused).empty());
  const auto ctx = ftplan::prepare_plan(model, hw, setup, p);
  const auto s = ftplan::estimate_step(ctx, ftplan::layout_candidate(layout));
  const double P = double(p), V = double(v), M = double(m);
  CHECK_THAT(s.bubble_s / s.compute_s, WithinRel((P - 1) / (V * M), 1e-9));
  CHECK_THAT(s.bubble_fraction, WithinRel((P - 1) / (V * M + P - 1), kExact));
  // The same job without interleaving: v times the bubble.
  Parallelism plain = layout;
  plain.schedule = PipelineSchedule::one_f_one_b;
  plain.virtual_stages = 1;
  const auto s1 = ftplan::estimate_step(ctx, ftplan::layout_candidate(plain));
  CHECK_THAT(s1.bubble_s, WithinRel(V * s.bubble_s, 1e-9));
  CHECK_THAT(s1.compute_s, WithinRel(s.compute_s, kExact));
}

TEST_CASE("the plan's explanation names the degrees that decided", "[parallel][plan]") {
  // Llama-3.1-70B full fine-tuning at 8,192 tokens on 4 nodes of 8 H100 under torchtitan (which
  // composes tp, sp, cp and pp with FSDP): nothing unsharded fits; the search considers compositions.
  const auto model = ftplan::load_model("llama-3.1-70b");
  const auto hw = ftplan::load_hardware("h100-sxm");
  auto setup = make_setup("llama-3.1-70b", Method::full, 32, 8192, 16);
  setup.framework = "torchtitan";
  setup.gpu = "h100-sxm";
  const auto plan = ftplan::plan_job(model, hw, setup, ftplan::Objective::time);
  REQUIRE(plan.recommended.has_value());
  CHECK(plan.compositions_considered > 0);
  CAPTURE(plan.reason);
  // Every slower layout's verdict names, in brackets, the degrees in which it differs from the winner,
  // e.g. "[tp 1 vs 2, cp 1 vs 2, dp_shard 32 vs 8]".
  int slower = 0;
  for (const auto& o : plan.strategies) {
    if (!o.feasible || o.verdict == "recommended" || o.verdict.rfind("ties with", 0) == 0) continue;
    CAPTURE(o.name, o.verdict);
    CHECK_THAT(o.verdict, Contains(" vs ") && Contains("["));
    if (o.parallel.tp != plan.recommended->candidate.parallel.tp)
      CHECK_THAT(o.verdict, Contains("tp " + std::to_string(o.parallel.tp) + " vs " +
                                     std::to_string(plan.recommended->candidate.parallel.tp)));
    ++slower;
  }
  CHECK(slower > 0);
}

TEST_CASE("the search composes context parallelism without tensor parallelism under every framework offering it", "[parallel][plan]") {
  // torchtune runs sequence parallelism whenever it runs tensor parallelism ("always"): layouts without
  // tp still have their cp (a bug once dropped them, since sp needs tp).
  const auto model = ftplan::load_model("llama-3.1-8b");
  const auto hw = ftplan::load_hardware("h100-sxm");
  const std::string framework = GENERATE(as<std::string>{}, "torchtune", "torchtitan", "hf");
  CAPTURE(framework);
  auto setup = make_setup("llama-3.1-8b", Method::full, 8, 65536);
  setup.framework = framework;
  int cp_only = 0, with_sp = 0;
  for (const auto& p : ftplan::composition_layouts(model, hw, setup)) {
    if (p.tp == 1 && p.cp > 1) ++cp_only;
    if (p.sequence_parallel) {
      ++with_sp;
      CHECK(p.tp > 1);
    }
  }
  CHECK(cp_only > 0);
  if (framework != "hf") CHECK(with_sp > 0);  // hf: transformers' tp_plan has no sequence parallelism
}

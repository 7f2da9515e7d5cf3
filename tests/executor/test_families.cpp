// The families ftexec trains beyond the Llama block ([family]): Qwen3 (per-head q/k RMSNorms),
// Qwen3-MoE (a top-k router, experts as stacked tensors run as batched GEMMs, the load-balancing loss),
// Mixtral (the same block named block_sparse_moe, experts w1/w3/w2), Qwen2-MoE (plus a shared expert
// scaled by a sigmoid gate, q/k/v biases), Gemma 2 and Gemma 3 text (four Gemma norms, GeGLU,
// soft-capping, sliding windows, local RoPE), Phi-3 (fused qkv_proj and gate_up_proj), OLMo 2
// (post-norms, whole-projection q/k norms), gpt-oss (attention sinks, YaRN, fused experts with biases and a
// clamped GLU, mxfp4 checkpoints dequantised on load) and DeepSeek-V2/V3 (multi-head latent attention, leading
// dense layers, DeepSeek's routers, shared experts, V3's score-correction bias as a fixed buffer).
// Their forward is checked against the independent reference in test_reference.cpp; here: every
// strategy reproduces the single process's loss, checkpoints carry Hugging Face's names (one tensor
// per expert), the measured memory of every family against the planner's (fp32, eager), and the families ftexec does
// not build are refused in one line naming the model_type.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <tuple>

#include "dist_test_util.h"
#include "executor/data.h"
#include "executor/exec_job.h"
#include "executor/llama_model.h"
#include "executor/lora.h"
#include "executor/mxfp4.h"
#include "executor/run_job.h"
#include "executor/safetensors.h"
#include "executor/trainer.h"
#include "executor_test_util.h"
#include "planner/errors.h"
#include "planner/hardware_spec.h"
#include "planner/memory_model.h"
#include "planner/memory_report.h"
#include "planner/model_family.h"

#undef CHECK
#include <catch2/catch.hpp>

using ftexec_test::run_ftexec;
using ftexec_test::ScratchDir;
using Catch::Matchers::Contains;

namespace {

const std::string kQwen3 = "tests/data/models/tiny-qwen3.json";
const std::string kQwen3Moe = "tests/data/models/tiny-qwen3-moe.json";
const std::string kMixtral = "tests/data/models/tiny-mixtral.json";
const std::string kQwen2Moe = "tests/data/models/tiny-qwen2-moe.json";
const std::string kGemma2 = "tests/data/models/tiny-gemma2.json";  // window 8 on layers 0, 2 (seq 32)
const std::string kGemma3 = "tests/data/models/tiny-gemma3.json";  // window 8 on layers 0, 1; local RoPE
const std::string kPhi3 = "tests/data/models/tiny-phi3.json";      // window 12 on every layer
const std::string kDeepseekV2 = "tests/data/models/tiny-deepseek-v2.json";  // MLA with q_proj, grouped softmax routing
const std::string kDeepseekV3 = "tests/data/models/tiny-deepseek-v3.json";  // MLA with q_a/q_b, sigmoid noaux_tc, score bias
const std::string kGptOss = "tests/data/models/tiny-gpt-oss.json";  // window 8 on layer 0, sinks, fused experts

ftplan::ModelSpec spec_of(const std::string& path) {
  const std::string file = path.front() == '/' ? path : std::string(FTPLAN_SOURCE_DIR) + "/" + path;
  return ftplan::model_spec_from_json(ftplan::read_json_file(file), path);
}

// A job file turning the load-balancing loss off (moe.aux_loss: false; ftexec's boolean flags can only
// turn a setting on): ftexec run FILE, the rest as flags.
std::string no_aux_job_file(const std::string& model) {
  static ScratchDir dir("family_jobs");
  const std::string path = dir / "no_aux.json";
  std::ofstream(path) << nlohmann::json{{"model", std::string(FTPLAN_SOURCE_DIR) + "/" + model}, {"device", "cpu"},
                                        {"moe", {{"aux_loss", false}}}}.dump() << "\n";
  return path;
}

// An untied copy of a tied config (ftexec's sharded strategies do not shard a tied embedding yet), by path.
std::string untied(const std::string& model) {
  static ScratchDir dir("family_untied");
  nlohmann::json c = ftplan::read_json_file(std::string(FTPLAN_SOURCE_DIR) + "/" + model);
  c["tie_word_embeddings"] = false;
  const std::string path = dir / ("untied-" + model.substr(model.rfind('/') + 1));
  std::ofstream(path) << c.dump(2) << "\n";
  return path;
}

// The tiny job; `aux` false: from the job file above, the load-balancing loss off.
std::string job(const std::string& model, int64_t grad_accum, bool aux = true) {
  return (aux ? "--model " + model : no_aux_job_file(model)) + " --precision fp32 --attention eager --seq-len 32 --micro-batch 2 --grad-accum " +
         std::to_string(grad_accum) + " --steps 4 --threads 1 --no-progress --seed 0 --lr 3e-3";
}

// One run per distinct command line (each 1-3 s), shared by the tests.
nlohmann::json measured(const std::string& args) {
  static std::map<std::string, nlohmann::json> cache;
  static ScratchDir dir("family_runs");
  auto it = cache.find(args);
  if (it != cache.end()) return it->second;
  const std::string out = dir / ("m" + std::to_string(cache.size()) + ".json");
  const auto r = run_ftexec(args + " --timeout-s 60 --out " + out);
  INFO("ftexec run " << args << "\n" << r.output);
  REQUIRE(r.exit_code == 0);
  return cache[args] = ftplan::read_json_file(out);
}

std::vector<double> losses(const nlohmann::json& m) { return m["loss"].get<std::vector<double>>(); }

// A checkpoint's tensors as llama_expected_tensors lists them, and as a map name -> shape to look them up.
using TensorList = std::vector<std::pair<std::string, std::vector<int64_t>>>;
using Shapes = std::map<std::string, std::vector<int64_t>>;
Shapes shapes_of(const TensorList& list) { return Shapes(list.begin(), list.end()); }

// The parameters a checkpoint's tensors hold.
int64_t params_of(const TensorList& tensors) {
  int64_t total = 0;
  for (const auto& [name, shape] : tensors) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    total += n;
  }
  return total;
}

}  // namespace

TEST_CASE("Qwen3, Qwen3-MoE, Mixtral, Qwen2-MoE, Gemma 2, Phi-3, gpt-oss, DeepSeek-V3: DDP, ZeRO and FSDP reproduce the "
          "single-process loss",
          "[dist][family]") {
  // model, strategy, ranks, grad_accum per rank, extra flags
  auto [model, strategy, nproc, accum, extra] = GENERATE(table<std::string, std::string, int, int, std::string>({
      {kQwen3, "ddp", 2, 1, ""},
      {kQwen3, "fsdp", 2, 1, ""},
      {kQwen3, "zero3", 2, 1, "--method lora --lora-rank 4 --lora-targets all-linear"},
      {kQwen3Moe, "ddp", 2, 1, ""},                        // the load-balancing loss on (the config's)
      {kQwen3Moe, "fsdp", 2, 2, ""},                       // ... with gradient accumulation
      {kQwen3Moe, "fsdp", 2, 1, "--checkpointing full"},   // recomputed routing, the aux gradient in the recompute
      {kQwen3Moe, "zero2", 2, 1, "no-aux"},
      {kQwen3Moe, "ddp", 2, 1, "--method lora --lora-rank 4 --lora-targets q_proj,k_proj,v_proj,o_proj"},
      {kQwen3Moe, "pipeline", 2, 2, "no-aux"},  // the stages split the layers
      {kMixtral, "ddp", 2, 1, ""},              // block_sparse_moe, w1/w3/w2, the aux loss on
      {kMixtral, "fsdp", 2, 1, "save"},         // ... and --save: the sharded parameters gathered under HF names
      {kQwen2Moe, "ddp", 2, 1, ""},             // the shared expert and its gate, q/k/v biases
      {kQwen2Moe, "fsdp", 2, 1, "save"},
      {kGemma2, "ddp", 2, 1, ""},
      {untied(kGemma2), "fsdp", 2, 1, "--checkpointing full"},  // (a tied embedding is not sharded yet)
      {kPhi3, "ddp", 2, 1, "--method lora --lora-rank 4 --lora-targets qkv_proj,gate_up_proj"},
      {kPhi3, "fsdp", 2, 1, ""},
      {kDeepseekV3, "ddp", 2, 1, ""},       // latent attention, a dense layer, sigmoid grouped routing, a shared expert
      {kDeepseekV3, "fsdp", 2, 1, "save"},  // ... and the score bias (a buffer, not sharded) saved by rank 0
      {kGptOss, "ddp", 2, 1, ""},       // sinks, YaRN, fused experts with biases, the aux loss on (the config's)
      {kGptOss, "fsdp", 2, 1, "save"},  // ... and --save: gate_up_proj, down_proj and their biases under HF names
  }));
  CAPTURE(model, strategy, nproc, accum, extra);
  const bool pipelined = strategy == "pipeline";
  const bool aux = extra != "no-aux";
  const bool save = extra == "save";  // the distributed run saves its weights (the single process does not)
  const std::string flags = aux && !save ? extra : "";
  static ScratchDir saved("family_dist_save");
  const std::string save_dir = saved / model.substr(model.rfind('/') + 1);
  const std::string ref_args = job(model, pipelined ? accum : accum * nproc, aux) + " " + flags;
  const std::string dist_args = job(model, accum, aux) + " " + flags + " --strategy " + strategy + " --nproc " + std::to_string(nproc) +
                                (save ? " --save " + save_dir : "");
  const auto ref = measured(ref_args), dist = measured(dist_args);
  const auto a = losses(dist), b = losses(ref);
  CAPTURE(a, b);
  CHECK(b.back() != b.front());  // it trains (fresh random batches each step: the loss moves, 4 steps need not lower it)
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
  REQUIRE(a.size() == b.size());
  std::cout << "[dist][family] " << model.substr(model.rfind('/') + 1) << " " << strategy << " x" << nproc << " " << extra
            << ": loss vs one process, max relative " << worst << "\n";
  CHECK(worst < 1e-5);
  if (save) {
    // Every tensor by its Hugging Face name (one per expert; Mixtral's block_sparse_moe, Qwen2-MoE's
    // mlp.shared_expert.*), exactly the config's set; the loader (which checks every name and shape) takes it.
    const auto spec = spec_of(model);
    ftexec::SafetensorsFile file(save_dir + "/model.safetensors");
    const auto expected = ftexec::llama_expected_tensors(spec);
    CHECK(file.entries().size() == expected.size());
    for (const auto& [name, shape] : expected) {
      CAPTURE(name);
      REQUIRE(file.find(name) != nullptr);
      CHECK(file.find(name)->shape == shape);
    }
    ftexec::LlamaModel b = ftexec::llama_create(spec, ftexec::ModelOptions{}, 7);
    ftexec::llama_load_weights(b, save_dir);
    for (const auto& [name, t] : ftexec::checkpoint_tensors(ftexec::llama_named_parameters(b))) {
      CAPTURE(name);
      CHECK(at::equal(t, ftexec::tensor_view_of(*file.find(name))));
    }
    for (const auto& [name, t] : ftexec::llama_named_buffers(b)) {  // DeepSeek-V3's e_score_correction_bias: kept fixed
      CAPTURE(name);
      CHECK(at::equal(t, at::zeros({spec.moe.num_experts})));
    }
  }
  if (spec_of(model).moe.active()) {
    CHECK(dist["ranks"][0]["moe_capacity_factor"].get<double>() >= 1.0);  // the padded groups: E x C >= T x k
    CHECK(dist["ranks"][0]["moe_capacity_factor"].get<double>() <= 2.0);  // at most num_experts / top_k
  }
}

TEST_CASE("the load-balancing loss is on by the config and off by moe.aux_loss false", "[dist][family]") {
  // Same weights and batches: at step 1 (before the updates diverge) the two losses differ by the aux
  // term alone, coef x E x sum_e f_e P_e (f_e: the fraction of tokens with e among their top k, at most 1;
  // P_e: the mean router probability, summing to 1): above 0 and at most coef x E = 0.01 x 4. Its value
  // is checked against transformers' load_balancing_loss_func in test_reference.cpp.
  const auto with = losses(measured(job(kQwen3Moe, 2)));
  const auto without = losses(measured(job(kQwen3Moe, 2, false)));
  const double aux = with.front() - without.front();
  CAPTURE(aux);
  CHECK(aux > 1e-4);
  CHECK(aux <= 0.01 * 4);
  // Checkpointing recomputes each block (and its routing) in backward, where the aux gradient joins:
  // the same trajectory as without.
  const auto recomputed = losses(measured(job(kQwen3Moe, 2) + " --checkpointing full"));
  REQUIRE(recomputed.size() == with.size());
  for (size_t i = 0; i < with.size(); ++i) CHECK(std::abs(recomputed[i] - with[i]) <= 1e-6 * std::abs(with[i]));
}

TEST_CASE("checkpoints carry each family's Hugging Face names: q/k norms, the router, one tensor per expert", "[executor][family]") {
  SECTION("the expected tensors of the shipped configs") {
    const auto qwen3 = ftexec::llama_expected_tensors(ftplan::load_model("qwen3-8b"));
    const Shapes q = shapes_of(qwen3);
    CHECK(q.at("model.layers.35.self_attn.q_norm.weight") == std::vector<int64_t>{128});
    CHECK(q.at("model.layers.0.self_attn.k_norm.weight") == std::vector<int64_t>{128});
    CHECK(q.at("model.layers.0.mlp.gate_proj.weight") == std::vector<int64_t>{12288, 4096});
    // Qwen3-8B: 36 layers x (2 norms + 4 attention + 2 q/k norms + 3 MLP) + embedding, norm, lm_head.
    CHECK(qwen3.size() == size_t(36 * 11 + 3));

    const auto moe_spec = ftplan::load_model("qwen3-30b-a3b");
    const auto moe = ftexec::llama_expected_tensors(moe_spec);
    const Shapes m = shapes_of(moe);
    CHECK(m.at("model.layers.47.mlp.gate.weight") == std::vector<int64_t>{128, 2048});
    CHECK(m.at("model.layers.0.mlp.experts.127.gate_proj.weight") == std::vector<int64_t>{768, 2048});
    CHECK(m.at("model.layers.0.mlp.experts.0.up_proj.weight") == std::vector<int64_t>{768, 2048});
    CHECK(m.at("model.layers.0.mlp.experts.5.down_proj.weight") == std::vector<int64_t>{2048, 768});
    CHECK(m.count("model.layers.0.mlp.gate_proj.weight") == 0);
    // 48 layers x (2 norms + 4 attention + 2 q/k norms + router + 128 x 3 experts) + 3.
    CHECK(moe.size() == size_t(48 * (9 + 128 * 3) + 3));
    // The count the planner gives: the same parameters.
    const int64_t params = params_of(moe);
    CHECK(params == ftplan::count_params(moe_spec).total);

    // Mixtral-8x7B: the MoE block is block_sparse_moe, its experts w1, w3, w2 (the names of the hub's
    // model.safetensors.index.json); 32 x (2 norms + 4 attention + router + 8 x 3 experts) + 3 = 995.
    const auto mixtral_spec = ftplan::load_model("mixtral-8x7b");
    const auto mixtral = ftexec::llama_expected_tensors(mixtral_spec);
    const Shapes x = shapes_of(mixtral);
    CHECK(x.at("model.layers.31.block_sparse_moe.gate.weight") == std::vector<int64_t>{8, 4096});
    CHECK(x.at("model.layers.0.block_sparse_moe.experts.7.w1.weight") == std::vector<int64_t>{14336, 4096});
    CHECK(x.at("model.layers.0.block_sparse_moe.experts.0.w3.weight") == std::vector<int64_t>{14336, 4096});
    CHECK(x.at("model.layers.0.block_sparse_moe.experts.0.w2.weight") == std::vector<int64_t>{4096, 14336});
    for (const auto& [name, shape] : mixtral) CHECK(name.find(".mlp.") == std::string::npos);
    CHECK(mixtral.size() == size_t(32 * 31 + 3));

    // Qwen1.5-MoE-A2.7B: q/k/v biases, 60 experts, the shared expert and its gate; 24 x (2 norms + 7 attention
    // + router + 60 x 3 + 3 shared + shared_expert_gate) + 3 = 4659.
    const auto qwen2_spec = ftplan::load_model("qwen1.5-moe-a2.7b-chat");
    const auto qwen2 = ftexec::llama_expected_tensors(qwen2_spec);
    const Shapes w = shapes_of(qwen2);
    CHECK(w.at("model.layers.0.self_attn.q_proj.bias") == std::vector<int64_t>{2048});
    CHECK(w.count("model.layers.0.self_attn.o_proj.bias") == 0);
    CHECK(w.at("model.layers.23.mlp.gate.weight") == std::vector<int64_t>{60, 2048});
    CHECK(w.at("model.layers.0.mlp.experts.59.down_proj.weight") == std::vector<int64_t>{2048, 1408});
    CHECK(w.at("model.layers.0.mlp.shared_expert.gate_proj.weight") == std::vector<int64_t>{5632, 2048});
    CHECK(w.at("model.layers.0.mlp.shared_expert.down_proj.weight") == std::vector<int64_t>{2048, 5632});
    CHECK(w.at("model.layers.0.mlp.shared_expert_gate.weight") == std::vector<int64_t>{1, 2048});
    CHECK(w.count("model.layers.0.mlp.gate_proj.weight") == 0);
    CHECK(qwen2.size() == size_t(24 * 194 + 3));
    for (const auto& [spec, tensors] : {std::pair{mixtral_spec, mixtral}, std::pair{qwen2_spec, qwen2}}) {
      CHECK(params_of(tensors) == ftplan::count_params(spec).total);
    }
  }
  SECTION("DeepSeek-V2-Lite: latent attention, the bare router, one tensor per expert, shared_experts, a dense layer 0") {
    // The names of deepseek-ai/DeepSeek-V2-Lite's model.safetensors.index.json: 27 layers, layer 0 dense
    // (first_k_dense_replace 1), 64 routed experts of 1408, shared_experts of 2 x 1408, q_proj (q_lora_rank null).
    const auto spec = ftplan::load_model("deepseek-v2-lite");
    const auto list = ftexec::llama_expected_tensors(spec);
    const Shapes d = shapes_of(list);
    CHECK(d.at("model.layers.0.self_attn.q_proj.weight") == std::vector<int64_t>{3072, 2048});  // 16 x (128 + 64)
    CHECK(d.at("model.layers.0.self_attn.kv_a_proj_with_mqa.weight") == std::vector<int64_t>{576, 2048});
    CHECK(d.at("model.layers.0.self_attn.kv_a_layernorm.weight") == std::vector<int64_t>{512});
    CHECK(d.at("model.layers.0.self_attn.kv_b_proj.weight") == std::vector<int64_t>{4096, 512});  // 16 x (128 + 128)
    CHECK(d.at("model.layers.0.self_attn.o_proj.weight") == std::vector<int64_t>{2048, 2048});
    CHECK(d.at("model.layers.0.mlp.gate_proj.weight") == std::vector<int64_t>{10944, 2048});
    CHECK(d.at("model.layers.26.mlp.gate.weight") == std::vector<int64_t>{64, 2048});
    CHECK(d.at("model.layers.1.mlp.experts.63.down_proj.weight") == std::vector<int64_t>{2048, 1408});
    CHECK(d.at("model.layers.1.mlp.shared_experts.gate_proj.weight") == std::vector<int64_t>{2816, 2048});
    CHECK(d.count("model.layers.1.mlp.gate_proj.weight") == 0);
    CHECK(d.count("model.layers.0.self_attn.q_a_proj.weight") == 0);
    CHECK(d.count("model.layers.1.mlp.gate.e_score_correction_bias") == 0);
    // layer 0: 2 norms + 5 attention (q, kv_a, kv_a_layernorm, kv_b, o) + 3 MLP; 26 x (7 + router + 64 x 3 + 3
    // shared) + embedding, norm, lm_head.
    CHECK(list.size() == size_t(10 + 26 * (7 + 1 + 64 * 3 + 3) + 3));
    CHECK(params_of(list) == ftplan::count_params(spec).total);
  }
  SECTION("DeepSeek-V3 (tiny): q_a_proj, q_a_layernorm, q_b_proj and the router's e_score_correction_bias") {
    const auto spec = spec_of(kDeepseekV3);
    const auto list = ftexec::llama_expected_tensors(spec);
    const Shapes d = shapes_of(list);
    CHECK(d.at("model.layers.1.self_attn.q_a_proj.weight") == std::vector<int64_t>{24, 64});
    CHECK(d.at("model.layers.1.self_attn.q_a_layernorm.weight") == std::vector<int64_t>{24});
    CHECK(d.at("model.layers.1.self_attn.q_b_proj.weight") == std::vector<int64_t>{96, 24});  // 4 x (16 + 8)
    CHECK(d.at("model.layers.1.mlp.gate.e_score_correction_bias") == std::vector<int64_t>{4});
    CHECK(d.count("model.layers.0.mlp.gate.e_score_correction_bias") == 0);  // layer 0 is dense
    CHECK(d.count("model.layers.1.self_attn.q_proj.weight") == 0);
    CHECK(params_of(list) == ftplan::count_params(spec).total);  // the planner counts the bias too
  }
  SECTION("a tiny MoE (Qwen3-MoE, Mixtral, Qwen2-MoE, DeepSeek-V3) saves per-expert tensors and loads them back bit for bit") {
    const std::string model = GENERATE(kQwen3Moe, kMixtral, kQwen2Moe, kDeepseekV3);
    CAPTURE(model);
    const auto spec = spec_of(model);
    ftexec::LlamaModel a = ftexec::llama_create(spec, ftexec::ModelOptions{}, 1);
    ScratchDir dir("family_save");
    ftexec::llama_save_weights(a, dir.path.string());
    ftexec::SafetensorsFile file(dir / "model.safetensors");
    const auto expected = ftexec::llama_expected_tensors(spec);
    CHECK(file.entries().size() == expected.size());
    for (const auto& [name, shape] : expected) {
      CAPTURE(name);
      REQUIRE(file.find(name) != nullptr);
      CHECK(file.find(name)->shape == shape);
    }
    // Expert 3 of layer 1 is slice 3 of the stacked tensor (by the family's module and expert names).
    const std::string e3_name = "model.layers.1." + spec.moe.module + ".experts.3." + spec.moe.expert_names.at(2) + ".weight";
    REQUIRE(file.find(e3_name) != nullptr);
    const at::Tensor e3 = ftexec::tensor_view_of(*file.find(e3_name));
    CHECK(at::equal(e3, a.layers[1].moe->down_proj.select(0, 3)));
    if (spec.moe.shared_expert_gate) {  // Qwen2-MoE: the shared expert is the block's gate/up/down Linears
      REQUIRE(file.find("model.layers.1.mlp.shared_expert.up_proj.weight") != nullptr);
      CHECK(at::equal(ftexec::tensor_view_of(*file.find("model.layers.1.mlp.shared_expert.up_proj.weight")),
                      a.layers[1].up_proj.weight));
      CHECK(at::equal(ftexec::tensor_view_of(*file.find("model.layers.1.mlp.shared_expert_gate.weight")),
                      a.layers[1].moe->shared_expert_gate));
    }
    if (spec.moe.router_score_bias) {  // DeepSeek-V3: a non-zero buffer, saved and loaded with the parameters
      at::NoGradGuard no_grad;
      ftexec::llama_named_buffers(a).at(0).second.copy_(at::arange(4, at::kFloat) * 0.25);
      ftexec::llama_save_weights(a, dir.path.string());
      ftexec::SafetensorsFile again(dir / "model.safetensors");
      REQUIRE(again.find("model.layers.1.mlp.gate.e_score_correction_bias") != nullptr);
      CHECK(at::equal(ftexec::tensor_view_of(*again.find("model.layers.1.mlp.gate.e_score_correction_bias")),
                      at::arange(4, at::kFloat) * 0.25));
    }
    ftexec::LlamaModel b = ftexec::llama_create(spec, ftexec::ModelOptions{}, 2);
    ftexec::llama_load_weights(b, dir.path.string());
    const auto pa = ftexec::llama_named_parameters(a), pb = ftexec::llama_named_parameters(b);
    REQUIRE(pa.size() == pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      CAPTURE(pa[i].first);
      CHECK(at::equal(pa[i].second, pb[i].second));
    }
    const auto ba = ftexec::llama_named_buffers(a), bb = ftexec::llama_named_buffers(b);
    REQUIRE(ba.size() == bb.size());
    for (size_t i = 0; i < ba.size(); ++i) {
      CAPTURE(ba[i].first);
      CHECK(at::equal(ba[i].second, bb[i].second));
    }
  }
}

TEST_CASE("DeepSeek: what ftexec does not run of it is refused by name, in one line, exit 2", "[executor][family]") {
  // In process (llama_create and lora_attach throw the InputError ftexec prints as its one line, exit 2).
  const auto v2 = spec_of(kDeepseekV2), v3 = spec_of(kDeepseekV3);
  auto refused = [](ftplan::ModelSpec spec, const std::string& field, ftexec::ModelOptions o = {}) {
    CAPTURE(field);
    CHECK_THROWS_WITH(ftexec::llama_create(spec, o, 1), Contains(field));
  };
  ftplan::ModelSpec renorm = v2;
  renorm.moe.norm_topk_prob = true;
  refused(renorm, "norm_topk_prob");
  ftplan::ModelSpec sigmoid_v2 = v2;
  sigmoid_v2.moe.scoring_func = "sigmoid";
  refused(sigmoid_v2, "scoring_func sigmoid");
  ftplan::ModelSpec greedy_v3 = v3;
  greedy_v3.moe.topk_method = "greedy";
  refused(greedy_v3, "topk_method greedy");
  ftexec::ModelOptions aux;
  aux.moe_aux_loss = true;
  refused(v3, "moe.aux_loss", aux);
  // LoRA on the routed experts (gate_proj names the experts' and the shared experts' alike) or the router.
  ftexec::LlamaModel m = ftexec::llama_create(v3, ftexec::ModelOptions{}, 1);
  ftplan::LoraSpec lora;
  lora.rank = 4;
  for (const std::string target : {"gate_proj", "down_proj", "gate"}) {
    lora.targets = {"q_a_proj", target};
    CHECK_THROWS_WITH(ftexec::lora_attach(m, lora, 2), Contains("--lora-targets (lora.targets) " + target));
  }
  lora.targets = {"q_proj"};  // V3's tiny config has q_lora_rank: no q_proj
  CHECK_THROWS_WITH(ftexec::lora_attach(m, lora, 2), Contains("q_proj: not a linear of a deepseek_v3 block"));
  // The CLI: the shipped DeepSeek-V2-Lite (YaRN RoPE, trained since) with fused attention: one line, exit 2, before
  // any weight is allocated (QLoRA on a MoE is refused by the job's check, tested with Qwen3-MoE below).
  const auto r = run_ftexec("--model deepseek-v2-lite --precision fp32 --attention fused --seq-len 32 --micro-batch 1 "
                            "--steps 1 --no-progress");
  CAPTURE(r.output);
  CHECK(r.exit_code == 2);
  CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
  CHECK_THAT(r.output, Contains("--attention (attention) fused"));
}

TEST_CASE("MoE: LoRA on the experts, QLoRA and a capacity factor are refused by name", "[dist][family]") {
  const std::string common = " --precision fp32 --seq-len 32 --micro-batch 1 --steps 1 --no-progress";
  for (const auto& [model, flags, field] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {kQwen3Moe, "--method lora --lora-targets q_proj,gate_proj", "--lora-targets (lora.targets) gate_proj"},
           {kQwen3Moe, "--method qlora --lora-targets q_proj", "--method (method) qlora"},
           {kQwen3Moe, "--moe-capacity-factor 1.25", "--moe-capacity-factor (moe.capacity_factor)"},
           {kQwen3Moe, "--strategy pipeline --nproc 2", "--moe-aux-loss (moe.aux_loss)"},
           {kQwen3Moe, "--strategy pipeline --nproc 2 --moe-aux-loss", "--moe-aux-loss (moe.aux_loss)"},
           {kMixtral, "--method lora --lora-targets q_proj,w1", "--lora-targets (lora.targets) w1"},
           {kGptOss, "--method qlora --lora-targets q_proj", "--method (method) qlora"},
           // gpt-oss-20b's hub config says mxfp4: ftexec trains the dequantised model, which that config does not describe
           {"gpt-oss-20b", "--attention eager --method lora --lora-targets q_proj", "--model (model): quantization_config mxfp4"}}) {
    CAPTURE(model, flags);
    const auto r = run_ftexec("--model " + model + common + " " + flags);
    CAPTURE(r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Contains(field));
  }
}

TEST_CASE("Mixtral, Qwen2-MoE and gpt-oss: LoRA on the router, the experts or the shared expert is refused naming the target",
          "[executor][family]") {
  // In process (ftexec's exit 2 and one line are checked above): Qwen2-MoE's gate_proj/up_proj/down_proj name
  // the routed experts' linears and the shared expert's alike (PEFT would adapt both), its shared_expert_gate is
  // a router; Mixtral's router is gate, its experts w1, w3, w2. LoRA on the attention builds (the reference test
  // checks its numbers).
  for (const auto& [model, target] : std::vector<std::pair<std::string, std::string>>{
           {kMixtral, "gate"}, {kMixtral, "w2"}, {kQwen2Moe, "gate_proj"}, {kQwen2Moe, "down_proj"},
           {kQwen2Moe, "shared_expert_gate"}, {kGptOss, "router"}, {kGptOss, "gate_up_proj"}, {kGptOss, "down_proj"}}) {
    CAPTURE(model, target);
    ftexec::LlamaModel m = ftexec::llama_create(spec_of(model), ftexec::ModelOptions{}, 1);
    ftplan::LoraSpec lora;
    lora.rank = 4;
    lora.targets = {"q_proj", target};
    CHECK_THROWS_WITH(ftexec::lora_attach(m, lora, 2), Contains("--lora-targets (lora.targets) " + target));
    lora.targets = {"q_proj", "v_proj"};
    ftexec::lora_attach(m, lora, 2);
    CHECK(ftexec::lora_named_parameters(m).size() == size_t(2 * 2 * m.spec.num_layers));  // A and B on q, v per layer
  }
}

TEST_CASE("Qwen3, Qwen3-MoE, Qwen2-MoE, Gemma 2, Phi-3, gpt-oss and DeepSeek-V3: measured CPU peak within 10% of the "
          "planner's (the MoE at its measured padding)",
          "[executor][family][memory]") {
  // test_training.cpp's standard for the dense tiny model: fp32, eager, full fine-tuning, one process,
  // seq 128 x micro-batch 8, states exact, the peak and the activations within 10%. The MoE's batched
  // GEMMs pad every expert to the busiest one's pairs: the planner is asked for that padding
  // (moe.capacity_factor = the run's largest E x C / (T x k)), which is what its capacity-factor model
  // describes; the load-balancing loss is off here (transformers' keeps every layer's logits and
  // softmax, which the planner counts for hf; ftexec keeps E counts per layer).
  // (Gemma 3 text and OLMo 2, which add no term beyond these, measured 0.27% and 0.24% on the peak when run here
  // too; left out to keep the suite short.)
  const std::string model = GENERATE(kQwen3, kQwen3Moe, kQwen2Moe, kGemma2, kPhi3, kGptOss, kDeepseekV3);
  CAPTURE(model);
  ftplan::TrainingSetup setup = ftexec_test::activation_memory_setup(std::string(FTPLAN_SOURCE_DIR) + "/" + model);
  setup.moe.aux_loss = false;
  const auto spec = spec_of(model);
  if (!spec.moe.active()) setup.moe.aux_loss.reset();
  ftexec::ExecJob job = ftexec::make_exec_job(setup, "cpu");
  job.threads = 2;
  const nlohmann::json measured = ftexec::run_job(job);
  const auto& rank = measured["ranks"][0];
  if (spec.moe.active()) setup.moe.capacity_factor = rank["moe_capacity_factor"].get<double>();
  const auto hw = ftplan::load_hardware("cpu");
  const ftplan::Candidate candidate = ftplan::candidate_from_setup(setup, hw, ftplan::Strategy::single);
  const auto predicted = ftplan::estimate_memory(job.model, hw, setup, candidate).per_gpu;
  const auto& parts = rank["components"];
  const double peak = rank["peak_memory_bytes"].get<double>();
  CAPTURE(peak, predicted.total, predicted.weights, predicted.activations, predicted.logits_loss, predicted.temporary,
          parts.dump(), setup.moe.capacity_factor.value_or(0.0));
  CHECK(parts["weights"].get<int64_t>() == predicted.weights);
  CHECK(parts["gradients"].get<int64_t>() == predicted.gradients);
  CHECK(parts["optimizer"].get<int64_t>() == predicted.optimizer);
  const double transient = parts["activations"].get<double>(), predicted_transient = double(predicted.activations + predicted.logits_loss);
  std::cout << "[family][memory] " << model.substr(model.rfind('/') + 1) << ": peak measured " << peak << " B, predicted "
            << predicted.total << " B (" << 100.0 * (peak - predicted.total) / predicted.total << " %); activations + loss "
            << transient << " vs " << predicted_transient << " (" << 100.0 * (transient - predicted_transient) / predicted_transient
            << " %)" << (spec.moe.active() ? "; capacity factor " + std::to_string(*setup.moe.capacity_factor) : "") << "\n";
  CHECK_THAT(peak, Catch::Matchers::WithinRel(double(predicted.total), 0.10));
  CHECK_THAT(transient, Catch::Matchers::WithinRel(predicted_transient, 0.10));
}

TEST_CASE("Gemma 2/3, Phi-3 and OLMo 2 checkpoints carry Hugging Face's names: four norms, fused projections, "
          "q/k norms", "[executor][family]") {
  // name -> shape of a shipped config's checkpoint, and the planner's parameter count of the same names.
  auto expected = [](const std::string& model) {
    const auto spec = ftplan::load_model(model);
    const auto list = ftexec::llama_expected_tensors(spec);
    const int64_t params = params_of(list);
    CHECK(params == ftplan::count_params(spec).total);
    return std::make_pair(shapes_of(list), list.size());
  };
  SECTION("Gemma 2 2B: input_, post_attention_, pre_feedforward_, post_feedforward_layernorm, tied head") {
    const auto [g, n] = expected("gemma-2-2b");
    for (const char* norm : {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"})
      CHECK(g.at("model.layers.25." + std::string(norm) + ".weight") == std::vector<int64_t>{2304});
    CHECK(g.count("lm_head.weight") == 0);
    CHECK(n == size_t(26 * 11 + 2));  // 26 x (4 norms + 4 attention + 3 MLP) + embedding, norm
  }
  SECTION("Gemma 3 1B: Gemma 2's block and per-head q/k norms") {
    const auto [g, n] = expected("gemma-3-1b");
    CHECK(g.at("model.layers.0.self_attn.q_norm.weight") == std::vector<int64_t>{256});
    CHECK(g.at("model.layers.0.pre_feedforward_layernorm.weight") == std::vector<int64_t>{1152});
    CHECK(n == size_t(26 * 13 + 2));
  }
  SECTION("Phi-3 mini: qkv_proj [3 x 3072, 3072] and gate_up_proj [2 x 8192, 3072], Llama's two norms") {
    const auto [g, n] = expected("phi-3-mini-4k");
    CHECK(g.at("model.layers.31.self_attn.qkv_proj.weight") == std::vector<int64_t>{9216, 3072});
    CHECK(g.at("model.layers.0.mlp.gate_up_proj.weight") == std::vector<int64_t>{16384, 3072});
    CHECK(g.at("model.layers.0.post_attention_layernorm.weight") == std::vector<int64_t>{3072});
    CHECK(g.count("model.layers.0.self_attn.q_proj.weight") == 0);
    CHECK(n == size_t(32 * 6 + 3));  // 32 x (2 norms + qkv, o + gate_up, down) + embedding, norm, lm_head
  }
  SECTION("OLMo 2 7B: post-norms only, q_norm [q_dim] and k_norm [kv_dim]") {
    const auto [g, n] = expected("olmo-2-7b");
    CHECK(g.count("model.layers.0.input_layernorm.weight") == 0);
    CHECK(g.at("model.layers.0.post_feedforward_layernorm.weight") == std::vector<int64_t>{4096});
    CHECK(g.at("model.layers.0.self_attn.q_norm.weight") == std::vector<int64_t>{4096});
    CHECK(g.at("model.layers.0.self_attn.k_norm.weight") == std::vector<int64_t>{4096});
    CHECK(n == size_t(32 * 11 + 3));
  }
  SECTION("a tiny Phi-3 trained by ftexec saves the fused names, and they load back bit for bit") {
    ScratchDir dir("family_phi3_save");
    const std::string out = dir / "saved";
    const auto r = run_ftexec(job(kPhi3, 1) + " --save " + out + " --timeout-s 60");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    ftexec::SafetensorsFile file(out + "/model.safetensors");
    const auto spec = spec_of(kPhi3);
    const auto names = ftexec::llama_expected_tensors(spec);
    CHECK(file.entries().size() == names.size());
    for (const auto& [name, shape] : names) {
      CAPTURE(name);
      REQUIRE(file.find(name) != nullptr);
      CHECK(file.find(name)->shape == shape);
    }
    CHECK(file.find("model.layers.1.self_attn.qkv_proj.weight")->shape == std::vector<int64_t>{128, 64});  // (4 + 2 x 2) x 16
    CHECK(file.find("model.layers.1.mlp.gate_up_proj.weight")->shape == std::vector<int64_t>{256, 64});
    ftexec::LlamaModel b = ftexec::llama_create(spec, ftexec::ModelOptions{}, 2);
    ftexec::llama_load_weights(b, out);
    for (const auto& [name, t] : ftexec::llama_named_parameters(b)) {
      CAPTURE(name);
      CHECK(at::equal(t, ftexec::tensor_view_of(*file.find(name))));
    }
  }
}

TEST_CASE("Phi-3: a Llama linear name as a LoRA target, and tensor parallelism, are refused by name", "[dist][family]") {
  const std::string base = "--model " + kPhi3 + " --precision fp32 --seq-len 32 --micro-batch 1 --steps 1 --no-progress";
  for (const auto& [flags, field] : std::vector<std::pair<std::string, std::string>>{
           {"--method lora --lora-targets q_proj", "--lora-targets (lora.targets): 'q_proj' is not a linear"},
           {"--parallel tp=2 --nproc 2", "fused_qkv"}}) {
    CAPTURE(flags);
    const auto r = run_ftexec(base + " " + flags);
    CAPTURE(r.output);
    CHECK(r.exit_code == 2);
    CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
    CHECK_THAT(r.output, Contains(field));
  }
}

TEST_CASE("the Gemma 3 multimodal wrapper: ftexec trains its decoder under the checkpoint's language_model. names",
          "[executor][family]") {
  const std::string wrapper = "tests/data/models/tiny-gemma3-mm.json", text = kGemma3;
  SECTION("gemma-3-4b: the decoder's names behind language_model., the vision tower not among them") {
    const auto spec = ftplan::load_model("gemma-3-4b");
    const auto list = ftexec::llama_expected_tensors(spec);
    const Shapes g = shapes_of(list);
    CHECK(g.at("language_model.model.embed_tokens.weight") == std::vector<int64_t>{262208, 2560});
    CHECK(g.at("language_model.model.layers.33.self_attn.k_norm.weight") == std::vector<int64_t>{256});
    CHECK(list.size() == size_t(34 * 13 + 2));
    const int64_t params = params_of(list);
    const auto counts = ftplan::count_params(spec);
    CHECK(params == counts.total - counts.vision);  // the decoder: all but the tower and projector
  }
  SECTION("the wrapper trains exactly the text model's trajectory (same seed, same batches)") {
    const auto a = losses(measured(job(wrapper, 1))), b = losses(measured(job(text, 1)));
    CAPTURE(a, b);
    CHECK(a == b);
  }
  SECTION("saved under language_model.; a checkpoint holding the vision tower too loads, its tower skipped") {
    const auto spec = spec_of(wrapper);
    ftexec::LlamaModel a = ftexec::llama_create(spec, ftexec::ModelOptions{}, 1);
    ScratchDir dir("family_gemma3_mm");
    ftexec::llama_save_weights(a, dir / "saved");
    ftexec::SafetensorsFile saved(dir / "saved/model.safetensors");
    CHECK(saved.find("language_model.model.layers.2.post_feedforward_layernorm.weight") != nullptr);
    CHECK(saved.find("model.layers.2.post_feedforward_layernorm.weight") == nullptr);
    CHECK(saved.entries().size() == ftexec::llama_expected_tensors(spec).size());
    // The published layout: the decoder plus vision_tower.* and multi_modal_projector.*.
    std::vector<at::Tensor> keep;
    std::vector<ftexec::SafetensorsEntry> entries;
    for (const auto& e : saved.entries()) {
      keep.push_back(ftexec::tensor_view_of(e).clone());
      entries.push_back(ftexec::safetensors_entry(e.name, keep.back()));
    }
    keep.push_back(at::ones({32, 3, 8, 8}));
    entries.push_back(ftexec::safetensors_entry("vision_tower.vision_model.embeddings.patch_embedding.weight", keep.back()));
    keep.push_back(at::ones({32, 64}));
    entries.push_back(ftexec::safetensors_entry("multi_modal_projector.mm_input_projection_weight", keep.back()));
    std::filesystem::create_directories(dir / "published");
    ftexec::write_safetensors(dir / "published/model.safetensors", entries);
    ftexec::LlamaModel b = ftexec::llama_create(spec, ftexec::ModelOptions{}, 2);
    ftexec::llama_load_weights(b, dir / "published");
    const auto pa = ftexec::llama_named_parameters(a), pb = ftexec::llama_named_parameters(b);
    REQUIRE(pa.size() == pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      CAPTURE(pa[i].first);
      CHECK(at::equal(pa[i].second, pb[i].second));
    }
    // A stray decoder tensor is still an error (the prefix is not a wildcard).
    keep.push_back(at::ones({64}));
    entries.push_back(ftexec::safetensors_entry("language_model.model.layers.9.input_layernorm.weight", keep.back()));
    ftexec::write_safetensors(dir / "published/model.safetensors", entries);
    CHECK_THROWS_WITH(ftexec::llama_load_weights(b, dir / "published"),
                      Contains("language_model.model.layers.9.input_layernorm.weight is not a tensor of this config"));
  }
}

namespace {

// transformers integrations/mxfp4.py FP4_VALUES, written out again for the independent computation below.
const double kFp4[16] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0};

// mxfp4 by the definition, one element at a time: W[e, i, o] (input-major, as GptOssExperts holds it) is code
// (i % 2 ? high : low nibble) of byte i / 2 % 16 of block i / 32 of row o, times 2^(scale - 127).
at::Tensor mxfp4_by_definition(const at::Tensor& blocks, const at::Tensor& scales) {
  const int64_t E = blocks.size(0), out = blocks.size(1), G = blocks.size(2);
  at::Tensor w = at::empty({E, G * 32, out}, at::kDouble);
  auto b = blocks.accessor<uint8_t, 4>();
  auto s = scales.accessor<uint8_t, 3>();
  auto o_ = w.accessor<double, 3>();
  for (int64_t e = 0; e < E; ++e)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < G * 32; ++i) {
        const uint8_t byte = b[e][o][i / 32][(i % 32) / 2];
        const int code = i % 2 ? byte >> 4 : byte & 0x0F;
        o_[e][i][o] = std::ldexp(kFp4[code], int(s[e][o][i / 32]) - 127);
      }
  return w;
}

}  // namespace

TEST_CASE("gpt-oss: mxfp4 experts are dequantised on load as transformers does; checkpoints carry the HF names",
          "[executor][family]") {
  SECTION("a few blocks by hand: low nibble first, the e8m0 scale 2^(s - 127), transposed to [E, in, out]") {
    at::Tensor blocks = at::zeros({1, 2, 1, 16}, at::kByte), scales = at::zeros({1, 2, 1}, at::kByte);
    // row 0, scale 128 (x2): 0x21 -> codes 1, 2 (+0.5, +1); 0xF8 -> codes 8, 15 (-0, -6); 0x7A -> 10, 7 (-1, +6)
    blocks[0][0][0][0] = 0x21, blocks[0][0][0][1] = 0xF8, blocks[0][0][0][2] = 0x7A, scales[0][0][0] = 128;
    // row 1, scale 125 (x1/4): 0x43 -> codes 3, 4 (+1.5, +2); byte 15 = 0x0E -> codes 14, 0 (-4, +0)
    blocks[0][1][0][0] = 0x43, blocks[0][1][0][15] = 0x0E, scales[0][1][0] = 125;
    const at::Tensor w = ftexec::mxfp4_dequantize(blocks, scales, at::kFloat);
    REQUIRE(w.sizes() == at::IntArrayRef({1, 32, 2}));
    const std::vector<float> row0{1.0f, 2.0f, -0.0f, -12.0f, -2.0f, 12.0f, 0.0f};
    for (int64_t i = 0; i < 7; ++i) CHECK(w[0][i][0].item<float>() == row0[size_t(i)]);
    CHECK(std::signbit(w[0][2][0].item<float>()));  // -0.0 stays negative zero, as FP4_VALUES[8]
    CHECK(w[0][0][1].item<float>() == 0.375f);
    CHECK(w[0][1][1].item<float>() == 0.5f);
    CHECK(w[0][30][1].item<float>() == -1.0f);
    CHECK(w[0][31][1].item<float>() == 0.0f);
    CHECK(w.abs().sum().item<float>() == 1 + 2 + 12 + 2 + 12 + 0.375f + 0.5f + 1.0f);
  }
  SECTION("a hub-style checkpoint (experts as *_blocks / *_scales) loads into the config's experts, and saves bf16/fp32 names") {
    const auto spec = spec_of(kGptOss);
    ftexec::LlamaModel a = ftexec::llama_create(spec, ftexec::ModelOptions{}, 1);
    ScratchDir dir("family_gpt_oss_mxfp4");
    ftexec::llama_save_weights(a, dir / "bf16");
    ftexec::SafetensorsFile plain(dir / "bf16/model.safetensors");
    // The plain checkpoint: GptOssExperts' names, no per-expert split.
    CHECK(plain.find("model.layers.1.mlp.experts.gate_up_proj")->shape == std::vector<int64_t>{4, 64, 64});
    CHECK(plain.find("model.layers.1.mlp.experts.down_proj")->shape == std::vector<int64_t>{4, 32, 64});
    CHECK(plain.find("model.layers.1.mlp.experts.down_proj_bias")->shape == std::vector<int64_t>{4, 64});
    CHECK(plain.find("model.layers.1.mlp.router.bias")->shape == std::vector<int64_t>{4});
    CHECK(plain.find("model.layers.0.self_attn.sinks")->shape == std::vector<int64_t>{4});
    CHECK(plain.entries().size() == ftexec::llama_expected_tensors(spec).size());
    // The same with every expert weight replaced by random mxfp4 codes and scales 2^-8 .. 2^2.
    auto gen = at::detail::createCPUGenerator(5);
    std::vector<at::Tensor> keep;
    std::vector<ftexec::SafetensorsEntry> entries;
    std::map<std::string, std::pair<at::Tensor, at::Tensor>> quantized;
    for (const auto& e : plain.entries()) {
      const bool expert = e.name.size() > 5 && (e.name.substr(e.name.size() - 12) == "gate_up_proj" || e.name.substr(e.name.size() - 9) == "down_proj");
      if (!expert) {
        keep.push_back(ftexec::tensor_view_of(e).clone());
        entries.push_back(ftexec::safetensors_entry(e.name, keep.back()));
        continue;
      }
      const int64_t E = e.shape[0], in = e.shape[1], out = e.shape[2];
      at::Tensor blocks = at::randint(0, 256, {E, out, in / 32, 16}, gen, at::kLong).to(at::kByte);
      at::Tensor scales = at::randint(119, 130, {E, out, in / 32}, gen, at::kLong).to(at::kByte);
      quantized[e.name] = {blocks, scales};
      keep.push_back(blocks);
      entries.push_back(ftexec::safetensors_entry(e.name + "_blocks", blocks));
      keep.push_back(scales);
      entries.push_back(ftexec::safetensors_entry(e.name + "_scales", scales));
    }
    REQUIRE(quantized.size() == 4);  // gate_up_proj and down_proj of 2 layers
    std::filesystem::create_directories(dir / "hub");
    ftexec::write_safetensors(dir / "hub/model.safetensors", entries);
    ftexec::LlamaModel b = ftexec::llama_create(spec, ftexec::ModelOptions{}, 2);
    ftexec::llama_load_weights(b, dir / "hub");
    for (const auto& [name, t] : ftexec::llama_named_parameters(b)) {
      CAPTURE(name);
      auto q = quantized.find(name);
      if (q == quantized.end()) CHECK(at::equal(t, ftexec::tensor_view_of(*plain.find(name))));
      else CHECK(at::equal(t.to(at::kDouble), mxfp4_by_definition(q->second.first, q->second.second)));
    }
    // Saving writes the dequantised experts under their plain names.
    ftexec::llama_save_weights(b, dir / "resaved");
    ftexec::SafetensorsFile resaved(dir / "resaved/model.safetensors");
    CHECK(resaved.find("model.layers.0.mlp.experts.gate_up_proj_blocks") == nullptr);
    CHECK(resaved.find("model.layers.0.mlp.experts.gate_up_proj")->dtype == "F32");
    // Scales without blocks' partner, or a wrong shape: refused naming the tensor.
    entries.erase(std::remove_if(entries.begin(), entries.end(),
                                 [](const ftexec::SafetensorsEntry& e) { return e.name == "model.layers.1.mlp.experts.down_proj_scales"; }),
                  entries.end());
    ftexec::write_safetensors(dir / "hub/model.safetensors", entries);
    CHECK_THROWS_WITH(ftexec::llama_load_weights(b, dir / "hub"), Contains("model.layers.1.mlp.experts.down_proj_scales is missing"));
  }
  SECTION("gpt-oss-20b: the hub's tensor names and shapes, and the planner's parameter count") {
    const auto spec = ftplan::load_model("gpt-oss-20b");
    const auto list = ftexec::llama_expected_tensors(spec);
    const Shapes g = shapes_of(list);
    CHECK(g.at("model.layers.23.self_attn.sinks") == std::vector<int64_t>{64});
    CHECK(g.at("model.layers.0.self_attn.q_proj.bias") == std::vector<int64_t>{4096});
    CHECK(g.at("model.layers.0.self_attn.o_proj.bias") == std::vector<int64_t>{2880});
    CHECK(g.at("model.layers.0.mlp.router.weight") == std::vector<int64_t>{32, 2880});
    CHECK(g.at("model.layers.0.mlp.router.bias") == std::vector<int64_t>{32});
    CHECK(g.at("model.layers.0.mlp.experts.gate_up_proj") == std::vector<int64_t>{32, 2880, 5760});
    CHECK(g.at("model.layers.0.mlp.experts.gate_up_proj_bias") == std::vector<int64_t>{32, 5760});
    CHECK(g.at("model.layers.0.mlp.experts.down_proj") == std::vector<int64_t>{32, 2880, 2880});
    CHECK(g.at("model.layers.0.mlp.experts.down_proj_bias") == std::vector<int64_t>{32, 2880});
    // 24 x (2 norms + 8 attention weights and biases + sinks + router weight, bias + 4 expert tensors) + 3 = 411.
    CHECK(list.size() == size_t(24 * 17 + 3));
    CHECK(params_of(list) == ftplan::count_params(spec).total);
  }
}

TEST_CASE("gpt-oss: a checkpointed block recomputes the same loss and gradients (sinks, router and expert biases)",
          "[executor][family]") {
  // In process: --checkpointing full hands the block's trainable tensors to its recompute, gpt-oss's sinks,
  // router bias and fused experts with their biases among them; a tensor left out would get no gradient.
  const auto spec = spec_of(kGptOss);
  const ftexec::TokenBatch batch = ftexec::open_data_source("synthetic", spec.vocab_size, 4)->next(2, 32);
  std::vector<std::vector<at::Tensor>> grads(2);
  double loss[2] = {0, 0};
  for (int checkpointed = 0; checkpointed < 2; ++checkpointed) {
    ftexec::ModelOptions options;
    options.checkpointing = checkpointed == 1;
    ftexec::LlamaModel m = ftexec::llama_create(spec, options, 3);
    ftexec::Trainer trainer(m, ftplan::Method::full, ftplan::Precision::fp32, ftexec::AdamWOptions{}, 1, 0.0);
    loss[checkpointed] = trainer.forward_backward(batch);
    for (const auto& t : trainer.trainable()) grads[size_t(checkpointed)].push_back(t.grad().clone());
  }
  CHECK(loss[1] == loss[0]);
  REQUIRE(grads[0].size() == grads[1].size());
  REQUIRE(grads[0].size() == ftexec::llama_named_parameters(ftexec::llama_create(spec, {}, 3, false)).size());
  for (size_t i = 0; i < grads[0].size(); ++i) {
    CAPTURE(i);
    REQUIRE(grads[1][i].defined());
    CHECK(grads[0][i].abs().max().item<double>() > 0);
    CHECK(at::allclose(grads[1][i], grads[0][i], 1e-5, 1e-7));
  }
}

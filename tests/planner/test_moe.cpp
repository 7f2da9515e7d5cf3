// Mixtures of experts (planner/model_family.h rows mixtral, qwen2_moe, qwen3_moe, gpt_oss, deepseek_v2,
// deepseek_v3) and expert parallelism (planner/parallelism.h ep): exact total and active parameter counts of
// the shipped configs against each model's published safetensors index or card, each family's MoE block by
// hand, mxfp4 experts at their stored bytes, expert weights split under EP and whole without it, the
// load-time peak under FSDP, FLOPs from the active parameters, activations under top-k routing with an
// imbalance or capacity factor, the all-to-all's bytes, the search's EP layouts, and refusals by name.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/activation_memory.h"
#include "planner/collectives.h"
#include "planner/compute_model.h"
#include "planner/data_paths.h"
#include "planner/errors.h"
#include "planner/framework.h"
#include "planner/hardware_spec.h"
#include "planner/job_fields.h"
#include "planner/json_fields.h"
#include "planner/memory_model.h"
#include "planner/memory_report.h"
#include "planner/model_spec.h"
#include "planner/parallelism.h"
#include "planner/plan_search.h"
#include "planner/precision.h"
#include "planner/quantized_base.h"
#include "planner/step_time.h"

using Catch::Matchers::Contains;
using Catch::Matchers::WithinRel;
using ftplan::Attention;
using ftplan::Checkpointing;
using ftplan::Method;

namespace {

nlohmann::json config(const std::string& name) {
  return ftplan::read_json_file(ftplan::data_dir() + "/configs/models/" + name + ".json");
}

ftplan::ModelSpec spec(const std::string& name) { return ftplan::model_spec_from_json(config(name), name); }

ftplan::TrainingSetup job(const std::string& model, Method method, int64_t gpus, const std::string& framework = "torchtitan") {
  ftplan::TrainingSetup s;
  s.framework = framework;
  s.model = model;
  s.method = method;
  s.num_gpus = gpus;
  s.seq_len = 4096;
  s.precision = ftplan::Precision::mixed;
  s.given.insert("precision");
  return s;
}

ftplan::Candidate layout(const std::string& text, int64_t micro_batch = 1,
                         Checkpointing ck = Checkpointing::full) {
  return ftplan::layout_candidate(ftplan::parse_parallelism(text, "--parallel", "fsdp"), micro_batch, ck);
}

}  // namespace

TEST_CASE("MoE configs give the published total parameter counts exactly, and their active counts", "[moe][model]") {
  // total: the model's safetensors total as published (the index's metadata.total_size / bytes per parameter,
  // or the Hub's count; configs/models/SOURCES.md names each source). active: total less the routed experts a
  // token does not run, (num_experts - top_k) x one expert per MoE block; the embedding counted (as for dense
  // models, whose params_active equals params_total).
  SECTION("Mixtral-8x7B: 46,702,792,704; 12,879,925,248 active") {
    // mistralai/Mixtral-8x7B-v0.1 model.safetensors.index.json: total_size 93,405,585,408 bytes in bf16 / 2.
    const auto m = spec("mixtral-8x7b");
    const auto p = ftplan::count_params(m);
    CHECK(p.total == 46'702'792'704);
    CHECK(int64_t(93'405'585'408) / 2 == p.total);
    // One expert: w1, w3 (4096 x 14336) and w2 (14336 x 4096), no biases.
    CHECK(p.one_expert == 3 * 4096 * INT64_C(14336));
    CHECK(p.moe_layers == 32);
    // Active: 32 blocks x 6 unused experts x 176,160,768 fewer: 12,879,925,248 (Mistral AI, "Mixtral of experts"
    // (Jiang et al. 2024), sec. 2: "13B active parameters"; the announcement: "12.9B active").
    CHECK(p.active == p.total - 32 * 6 * p.one_expert);
    CHECK(p.active == 12'879'925'248);
  }
  SECTION("Qwen3-30B-A3B: 30,532,122,624; 3,353,032,704 active") {
    // Qwen/Qwen3-30B-A3B model.safetensors.index.json: total_size 61,064,245,248 bytes in bf16 / 2.
    const auto m = spec("qwen3-30b-a3b");
    const auto p = ftplan::count_params(m);
    CHECK(p.total == 30'532'122'624);
    CHECK(int64_t(61'064'245'248) / 2 == p.total);
    CHECK(p.one_expert == 3 * 2048 * INT64_C(768));
    // Model card: "30.5B in total and 3.3B activated": 48 blocks x 120 unused experts fewer.
    CHECK(p.active == p.total - 48 * 120 * p.one_expert);
    CHECK(p.active == 3'353'032'704);
  }
  SECTION("Qwen1.5-MoE-A2.7B(-Chat): 14,315,784,192; 2,689,173,504 active") {
    // Qwen/Qwen1.5-MoE-A2.7B: Hub safetensors total 14,315,784,192 (KerasHub qwen1.5_moe_2.7b_en `params`: the
    // same). A block: q,k,v with biases, o; the router (2048 x 60), 60 experts of 1408, the shared expert of
    // 5632 and its gate (2048 x 1).
    const auto m = spec("qwen1.5-moe-a2.7b-chat");
    const auto p = ftplan::count_params(m);
    CHECK(p.total == 14'315'784'192);
    CHECK(p.per_layer == 3 * (2048 * 2048 + 2048) + 2048 * 2048 + 2 * 2048 + 2048 * 60 + 60 * 3 * 2048 * 1408 +
                             3 * 2048 * 5632 + 2048);
    // Model card: "14.3B parameters in total and 2.7B activated parameters during runtime".
    CHECK(p.active == 2'689'173'504);
  }
  SECTION("gpt-oss-20b: 20,914,757,184; 4,187,440,704 active, OpenAI's 3.61B without the embedding") {
    // openai/gpt-oss-20b: the Hub's safetensors count 20,914,757,184 (its mxfp4 blocks unpacked).
    const auto m = spec("gpt-oss-20b");
    const auto p = ftplan::count_params(m);
    CHECK(p.total == 20'914'757'184);
    // A block: q (2880 x 4096), k and v (2880 x 512), o (4096 x 2880), all with biases; 64 sinks; two norms;
    // the router (2880 x 32 + 32); 32 experts of gate_up (2880 x 5760 + 5760) and down (2880 x 2880 + 2880).
    CHECK(p.per_layer == (2880 * 4096 + 4096) + 2 * (2880 * 512 + 512) + (4096 * 2880 + 2880) + 64 + 2 * 2880 +
                             (2880 * 32 + 32) + 32 * ((2880 * 5760 + 5760) + (2880 * 2880 + 2880)));
    CHECK(p.active == 4'187'440'704);
    // gpt-oss model card (OpenAI 2025), Table 1: 3.61B active parameters, counting the unembedding but not the
    // embedding.
    CHECK(p.active - p.embedding == 3'608'307'264);
  }
  SECTION("DeepSeek-V2-Lite: 15,706,484,224; 2,661,150,208 active, DeepSeek's 2.4B without the embedding") {
    // deepseek-ai/DeepSeek-V2-Lite model.safetensors.index.json: total_size 31,412,968,448 bytes in bf16 / 2.
    const auto m = spec("deepseek-v2-lite");
    const auto p = ftplan::count_params(m);
    CHECK(p.total == 15'706'484'224);
    CHECK(int64_t(31'412'968'448) / 2 == p.total);
    CHECK(p.moe_layers == 26);  // first_k_dense_replace 1: block 0 keeps the dense MLP of 10944
    // Latent attention: q_proj 2048 x 16·192, kv_a_proj_with_mqa 2048 x (512 + 64), kv_a_layernorm 512,
    // kv_b_proj 512 x 16·(128 + 128), o_proj 16·128 x 2048.
    const int64_t attention = 2048 * 3072 + 2048 * 576 + 512 * 4096 + 2048 * 2048;
    CHECK(p.dense_per_layer == attention + 512 + 2 * 2048 + 3 * 2048 * 10944);
    CHECK(p.per_layer == attention + 512 + 2 * 2048 + 64 * 2048 + 64 * 3 * 2048 * 1408 + 3 * 2048 * 2816);
    CHECK(p.active == 2'661'150'208);
    // DeepSeek-V2 paper (DeepSeek-AI 2024), appendix B: DeepSeek-V2-Lite "15.7B total parameters, of which 2.4B
    // are activated for each token" (DeepSeek counts the head, not the input embedding).
    CHECK(p.active - p.embedding == 2'451'435'008);
    // DeepseekV2MoEGate's routing as the config gives it: softmax scores, greedy top-6, weights x 1.0, not renormalised.
    CHECK(m.moe.topk_method == "greedy");
    CHECK(m.moe.scoring_func == "softmax");
    CHECK(m.moe.routed_scaling_factor == 1.0);
    CHECK_FALSE(m.moe.norm_topk_prob);
    CHECK(p.buffers == 0);
  }
}

TEST_CASE("DeepSeek-V3: 671,026,419,200 main-model parameters; its fp8 checkpoint is refused by name", "[moe][model]") {
  // DeepSeek-V3's published config.json (architecture keys; the multi-token-prediction module is not part of
  // DeepseekV3ForCausalLM). DeepSeek's README_WEIGHTS.md: 671B main-model weights; 36.6B activated without the
  // input embedding (the checkpoint header's main-model count 671,026,419,200).
  nlohmann::json c = {{"architectures", {"DeepseekV3ForCausalLM"}}, {"model_type", "deepseek_v3"},
                      {"attention_bias", false}, {"attention_dropout", 0.0}, {"aux_loss_alpha", 0.001},
                      {"ep_size", 1}, {"first_k_dense_replace", 3}, {"hidden_act", "silu"}, {"hidden_size", 7168},
                      {"intermediate_size", 18432}, {"kv_lora_rank", 512}, {"max_position_embeddings", 163840},
                      {"moe_intermediate_size", 2048}, {"moe_layer_freq", 1}, {"n_group", 8},
                      {"n_routed_experts", 256}, {"n_shared_experts", 1}, {"norm_topk_prob", true},
                      {"num_attention_heads", 128}, {"num_experts_per_tok", 8}, {"num_hidden_layers", 61},
                      {"num_key_value_heads", 128}, {"num_nextn_predict_layers", 1}, {"q_lora_rank", 1536},
                      {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64}, {"rms_norm_eps", 1e-06},
                      {"rope_theta", 10000}, {"routed_scaling_factor", 2.5}, {"scoring_func", "sigmoid"},
                      {"seq_aux", true}, {"tie_word_embeddings", false}, {"topk_group", 4},
                      {"topk_method", "noaux_tc"}, {"v_head_dim", 128}, {"vocab_size", 129280}};
  const auto m = ftplan::model_spec_from_json(c, "deepseek-v3");
  const auto p = ftplan::count_params(m);
  CHECK(p.total == 671'026'419'200);
  CHECK(p.moe_layers == 58);
  CHECK(p.router == 7168 * 256 + 256);  // the router and its e_score_correction_bias
  CHECK(p.active - p.embedding == 36'625'618'432);
  // The bias is a buffer (DeepseekV3TopkRouter.register_buffer): in the checkpoint, never trained, so full
  // fine-tuning holds no gradient or optimizer state for it.
  CHECK(p.buffers == 256);
  ftplan::TrainingSetup full;
  full.method = Method::full;
  const auto t = ftplan::trainable_params(m, full);
  CHECK(t.trainable == p.total - 58 * 256);
  CHECK(t.frozen == 58 * 256);
  // The router as DeepseekV3TopkRouter reads it (ftexec routes by these fields).
  CHECK(m.moe.topk_method == "noaux_tc");
  CHECK(m.moe.scoring_func == "sigmoid");
  CHECK(m.moe.n_group == 8);
  CHECK(m.moe.topk_group == 4);
  CHECK(m.moe.routed_scaling_factor == 2.5);
  CHECK(m.moe.norm_topk_prob);
  CHECK(m.mla.rope_interleave);  // DeepseekV3Config's default
  {  // bad routing keys: one line naming the key
    nlohmann::json bad = c;
    bad["n_group"] = 7;
    CHECK_THROWS_WITH(ftplan::model_spec_from_json(bad, "deepseek-v3"), Contains("n_group: 7 does not divide n_routed_experts 256"));
    bad = c;
    bad["topk_method"] = "random";
    CHECK_THROWS_WITH(ftplan::model_spec_from_json(bad, "deepseek-v3"), Contains("topk_method: 'random'"));
    bad = c;
    bad["topk_group"] = 9;
    CHECK_THROWS_WITH(ftplan::model_spec_from_json(bad, "deepseek-v3"), Contains("topk_group: 9 exceeds n_group 8"));
  }
  c["quantization_config"] = {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"},
                              {"weight_block_size", {128, 128}}};
  CHECK_THROWS_WITH(ftplan::model_spec_from_json(c, "deepseek-v3"),
                    Contains("quantization_config.quant_method") && Contains("fp8"));
}

TEST_CASE("each family's MoE block, by hand", "[moe][model]") {
  SECTION("Mixtral: router gate, experts w1, w3, w2 x 8, no shared expert; PEFT's default targets") {
    const auto m = spec("mixtral-8x7b");
    std::vector<std::string> names;
    for (const auto& lin : ftplan::block_linears(m)) names.push_back(lin.name + "x" + std::to_string(lin.instances));
    CHECK(names == std::vector<std::string>{"q_projx1", "k_projx1", "v_projx1", "o_projx1", "gatex1", "w1x8", "w3x8", "w2x8"});
    CHECK(m.default_lora_targets == std::vector<std::string>{"q_proj", "v_proj"});
    CHECK(m.moe.aux_loss_coef == 0.02);
    CHECK_FALSE(m.moe.output_router_logits);
  }
  SECTION("Qwen2-MoE: the shared expert and its gate beside 60 experts") {
    const auto m = spec("qwen1.5-moe-a2.7b-chat");
    CHECK(m.moe.shared_intermediate_size == 5632);
    CHECK(m.moe.shared_expert_gate);
    CHECK(m.qkv_bias);
    CHECK_FALSE(m.o_bias);
  }
  SECTION("Qwen2/3-MoE: decoder_sparse_step and mlp_only_layers choose the dense blocks") {
    auto c = config("qwen3-30b-a3b");
    c["mlp_only_layers"] = {0, 47};
    c["decoder_sparse_step"] = 2;
    const auto m = ftplan::model_spec_from_json(c, "q");
    CHECK_FALSE(m.moe.moe_layers[0]);   // in mlp_only_layers
    CHECK(m.moe.moe_layers[1]);         // (1 + 1) % 2 == 0
    CHECK_FALSE(m.moe.moe_layers[2]);   // (2 + 1) % 2 != 0
    CHECK_FALSE(m.moe.moe_layers[47]);  // in mlp_only_layers
    CHECK(m.moe.num_moe_layers() == 23);
    // Dense blocks carry Qwen3's dense MLP of intermediate_size 6144.
    const auto p = ftplan::count_params(m);
    CHECK(p.dense_per_layer - p.per_layer == 3 * 2048 * 6144 - (2048 * 128 + 128 * 3 * 2048 * 768));
  }
  SECTION("gpt-oss: even layers slide over 128 tokens; experts are bare parameters") {
    const auto m = spec("gpt-oss-20b");
    CHECK(m.sliding_window == 128);
    CHECK(m.num_sliding_layers() == 12);
    CHECK(m.attention_sinks);
    for (const auto& lin : ftplan::block_linears(m))
      if (ftplan::is_expert_role(lin.role)) CHECK_FALSE(lin.module);
    CHECK(m.default_lora_targets.empty());
  }
  SECTION("DeepSeek-V2-Lite: one dense block, then MoE; q_proj (no q_lora_rank)") {
    const auto m = spec("deepseek-v2-lite");
    CHECK_FALSE(m.moe.moe_layers[0]);
    CHECK(m.moe.moe_layers[1]);
    CHECK(m.head_dim == 192);
    CHECK(m.value_head_dim() == 128);
    CHECK(m.num_kv_heads == 16);
    CHECK(m.moe.shared_intermediate_size == 2 * 1408);
    CHECK_FALSE(m.moe.router_module);  // MoEGate: a bare weight, not an nn.Linear
  }
}

TEST_CASE("mxfp4 experts at their stored bytes: gpt-oss-20b's checkpoint is 13,761,264,768 bytes", "[moe][quantized]") {
  // openai/gpt-oss-20b model.safetensors.index.json: total_size 13,761,264,768. The experts' weights as
  // *_blocks (4 bits) + *_scales (one byte per 32 weights), everything else (the expert biases included) bf16.
  const auto m = spec("gpt-oss-20b");
  REQUIRE(m.quantized.active());
  CHECK(m.quantized.method == "mxfp4");
  CHECK(m.quantized.experts_only);
  CHECK(m.quantized.bytes_per_weight == 4.25 / 8);
  const auto p = ftplan::count_params(m);
  int64_t expert_weights = 0, expert_bytes = 0;
  for (const auto& lin : ftplan::block_linears(m))
    if (ftplan::is_expert_role(lin.role)) {
      expert_weights += p.moe_layers * lin.instances * lin.in_features * lin.out_features;
      expert_bytes += p.moe_layers * lin.instances * ftplan::quantized_linear_bytes(m.quantized, lin.in_features, lin.out_features);
    }
  CHECK(expert_weights == 19'110'297'600);  // the model card's 19.1B MLP weights (w_mlp1 + w_mlp2)
  CHECK(expert_bytes + 2 * (p.total - expert_weights) == 13'761'264'768);
  // LoRA on this base is planned like QLoRA: the expert weights are its quantised parameters.
  auto s = job("gpt-oss-20b", Method::lora, 1, "hf");
  s.lora.targets = {"q_proj", "v_proj"};
  s.given.insert("lora.targets");
  ftplan::apply_model(s, m);
  CHECK(s.method == Method::qlora);
  CHECK(ftplan::trainable_params(m, s).quantized == 19'110'297'600);
  // Full fine-tuning of the stored mxfp4 weights is refused, naming the field.
  auto full = job("gpt-oss-20b", Method::full, 1, "hf");
  CHECK_THROWS_WITH(ftplan::validate_job(full, m, "job"), Contains("--method") && Contains("mxfp4"));
}

TEST_CASE("expert weights: split over the expert group under EP, whole on every rank without it", "[moe][memory]") {
  const auto m = spec("mixtral-8x7b");
  const auto hw = ftplan::load_hardware("h100-sxm");
  const auto p = ftplan::count_params(m);
  const int64_t experts = p.moe_layers * p.experts;  // 45,097,156,608
  const int64_t rest = p.total - experts;            // 1,605,636,096
  REQUIRE(experts == 45'097'156'608);
  SECTION("ZeRO-2 (weights replicated): bf16 weights rest + experts / 8; sharded states unchanged") {
    auto s = job("mixtral-8x7b", Method::full, 8);
    const auto without = ftplan::estimate_memory(m, hw, s, layout("dp_shard=8,shard=zero2"));
    const auto with = ftplan::estimate_memory(m, hw, s, layout("dp_shard=8,shard=zero2,ep=8"));
    CHECK(without.per_gpu.weights == 2 * p.total);                 // 93,405,585,408: every expert on every rank
    CHECK(with.per_gpu.weights == 2 * rest + 2 * experts / 8);     // 14,485,561,344: one expert per rank
    // Gradients and optimizer states are sharded over the 8 ranks either way (ZeRO-2 / dp_shard_mod_ep x ep).
    CHECK_THAT(double(with.per_gpu.gradients), WithinRel(double(without.per_gpu.gradients), 1e-9));
    CHECK_THAT(double(with.per_gpu.optimizer), WithinRel(double(without.per_gpu.optimizer), 1e-9));
  }
  SECTION("ZeRO-1 LoRA: the frozen experts replicated, or / ep") {
    auto s = job("mixtral-8x7b", Method::lora, 8);
    s.lora.targets = {"q_proj", "v_proj"};
    const int64_t lora = 32 * 16 * ((4096 + 4096) + (4096 + 1024));  // r=16 (the default): q and v adapters
    const auto without = ftplan::estimate_memory(m, hw, s, layout("dp_shard=8,shard=zero1"));
    const auto with = ftplan::estimate_memory(m, hw, s, layout("dp_shard=8,shard=zero1,ep=8"));
    CHECK(s.lora.rank == 16);
    CHECK(without.per_gpu.weights == 2 * p.total + 2 * lora);  // frozen bf16 + adapters (2 B each, mixed)
    CHECK(with.per_gpu.weights == 2 * rest + 2 * experts / 8 + 2 * lora);
  }
  SECTION("FSDP LoRA: the same shard, but a gathered block holds the rank's own experts only") {
    auto s = job("mixtral-8x7b", Method::lora, 8);
    s.lora.targets = {"q_proj", "v_proj"};
    const auto without = ftplan::estimate_memory(m, hw, s, layout("dp_shard=8"));
    const auto with = ftplan::estimate_memory(m, hw, s, layout("dp_shard=8,ep=8"));
    CHECK_THAT(double(with.per_gpu.weights), WithinRel(double(without.per_gpu.weights), 1e-9));
    // FULL_SHARD's temporaries: the head, two gathered blocks and one block's (adapter) gradients: a block's
    // frozen experts in bf16 are 2 x 1,409,286,144 bytes whole, 2 x 1,409,286,144 / 8 with its own expert only.
    const double gathered_experts = 2.0 * p.experts, own = 2.0 * p.experts / 8;
    CHECK_THAT(double(without.per_gpu.temporary - with.per_gpu.temporary), WithinRel(2 * (gathered_experts - own), 1e-9));
  }
}

TEST_CASE("the load-time peak of a MoE model under FSDP: the shard and one whole MoE block", "[moe][memory]") {
  // Loading holds the rank's shard and the unit being sharded (memory_model.cpp): for Mixtral under amp
  // (fp32 parameters, torchtitan's default) a MoE block is 1,451,270,144 x 4 bytes, 5.8 GB, beside the
  // 23.4 GB shard; with ep=8 only the block's own expert is materialised.
  const auto m = spec("mixtral-8x7b");
  const auto hw = ftplan::load_hardware("h100-sxm");
  auto s = job("mixtral-8x7b", Method::full, 8);
  s.precision = ftplan::Precision::amp;
  const auto& fw = ftplan::framework_profile(s.framework);
  const auto p = ftplan::count_params(m);
  auto device = [&](double tensors) {  // memory_model.cpp figures(): allocated, reserved, + context and NCCL
    const double allocated = std::ceil(tensors) + fw.cublas_workspace_bytes;
    return std::ceil(allocated * fw.reserved_over_allocated) + fw.cuda_context_bytes + fw.nccl_bytes_per_gpu;
  };
  const auto e = ftplan::estimate_memory(m, hw, s, layout("dp_shard=8"));
  CHECK(e.per_gpu.weights == 4 * p.total / 8);
  CHECK_THAT(double(e.load.device_bytes), WithinRel(device(4.0 * p.total / 8 + 4.0 * p.per_layer), 1e-9));
  const auto ep = ftplan::estimate_memory(m, hw, s, layout("dp_shard=8,ep=8"));
  CHECK_THAT(double(ep.load.device_bytes),
             WithinRel(device(4.0 * p.total / 8 + 4.0 * (p.per_layer - p.experts) + 4.0 * p.experts / 8), 1e-9));
  CHECK(ep.load.device_bytes < e.load.device_bytes);
}

TEST_CASE("FLOPs from the active parameters", "[moe][compute]") {
  const auto m = spec("mixtral-8x7b");
  auto s = job("mixtral-8x7b", Method::full, 8);
  const auto f = ftplan::flops_per_token(m, s);
  const auto p = ftplan::count_params(m);
  // Forward matmuls: 2 per active weight: every block's attention and router, 2 of 8 experts; the head.
  // No FLOPs for the embedding lookup and the norms.
  const double matmul_weights = double(p.active - p.embedding - m.num_layers * p.norms - p.final_norm);
  CHECK(matmul_weights == 12'748'587'008.0);
  CHECK_THAT(f.forward - m.num_layers * f.block_attention, WithinRel(2.0 * matmul_weights, 1e-12));
  CHECK_THAT(f.block_expert, WithinRel(2.0 * 2 * p.one_expert, 1e-12));
  // Full fine-tuning: 6 FLOPs per active weight, plus attention: never 6 x the 46.7B total.
  CHECK_THAT(f.model - 3 * m.num_layers * f.block_attention, WithinRel(6.0 * matmul_weights, 1e-12));
  // LoRA on the experts: each of the 2 experts a token runs applies its adapter (r=8 on w1: 8 x (4096 + 14336)).
  s.method = Method::lora;
  s.lora.rank = 8;
  s.lora.targets = {"w1"};
  CHECK(ftplan::flops_per_token(m, s).block_lora == 2.0 * 2 * 8 * (4096 + 14336));
}

TEST_CASE("LoRA on attention only, or on the experts too", "[moe][memory]") {
  const auto m = spec("mixtral-8x7b");
  auto s = job("mixtral-8x7b", Method::lora, 1);
  s.lora.rank = 8;
  s.lora.targets = {"q_proj", "v_proj"};
  CHECK(ftplan::trainable_params(m, s).trainable == 32 * 8 * ((4096 + 4096) + (4096 + 1024)));  // 3,407,872
  // PEFT wraps every expert's w1, w2, w3: 8 experts x 3 adapters of 8 x (4096 + 14336) per block.
  s.lora.targets = {"w1", "w2", "w3"};
  CHECK(ftplan::trainable_params(m, s).trainable == 32 * 8 * 3 * 8 * (4096 + 14336));  // 113,246,208
  // all-linear: every nn.Linear of the block, the router included; gpt-oss's bare expert parameters are not.
  s.lora.all_linear = true;
  ftplan::apply_model(s, m);
  CHECK(s.lora.targets == std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate", "w1", "w3", "w2"});
  const auto g = spec("gpt-oss-20b");
  auto t = job("gpt-oss-20b", Method::lora, 1);
  t.lora.all_linear = true;
  ftplan::apply_model(t, g);
  CHECK(t.lora.targets == std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj"});
}

TEST_CASE("activations under top-k routing: imbalance under EP, capacity, the experts' adapters", "[moe][memory]") {
  // Qwen3-30B-A3B, LoRA on attention only (the experts frozen: their input and down's input not kept), bf16:
  // a rank's experts keep gate, act(gate) and up, 3 x 2 x 768 bytes per pair, for T x 8 pairs balanced.
  const auto m = spec("qwen3-30b-a3b");
  auto s = job("qwen3-30b-a3b", Method::lora, 8);
  s.lora.targets = {"q_proj", "v_proj"};
  s.seq_len = 1024;
  ftplan::ActivationInputs in = ftplan::activation_inputs(s, 1, Attention::fused);
  const double T = 1024, k = 8, I = 768;
  auto block = [&](int64_t ep, double imbalance, double capacity) {
    ftplan::ActivationInputs x = in;
    x.ep = ep, x.imbalance_factor = imbalance, x.capacity_factor = capacity;
    return double(ftplan::block_activation_bytes(m, x));
  };
  // Without expert parallelism every rank computes its own T x top_k pairs: the imbalance changes nothing.
  CHECK(block(1, 2.0, 0) == block(1, 1.0, 0));
  // Under EP the busiest rank's experts compute imbalance x the pairs.
  CHECK(block(8, 2.0, 0) - block(8, 1.0, 0) == 3 * 2 * T * k * I);
  // Capacity-limited routing pads every expert to capacity_factor x its balanced pairs.
  CHECK(block(1, 1.0, 1.25) - block(1, 1.0, 0) == 0.25 * 3 * 2 * T * k * I);
  // LoRA on the experts' gate: the dispatched input (2 x hidden per pair) and A's output (2 x r per pair).
  s.lora.targets = {"q_proj", "v_proj", "gate_proj"};
  ftplan::ActivationInputs lx = ftplan::activation_inputs(s, 1, Attention::fused);
  CHECK(double(ftplan::block_activation_bytes(m, lx)) - block(1, 1.0, 0) == 2 * T * k * 2048 + 2 * T * k * 16);
}

TEST_CASE("Qwen2-MoE's shared expert, by hand: its MLP, its sigmoid gate, the output it scales; the norm's output once",
          "[moe][memory]") {
  // Qwen1.5-MoE-A2.7B against the same model without the shared expert, bf16 activations (a = 2), T = 1024.
  // Full fine-tuning: the shared expert keeps gate, act(gate), up and down's input (4·a·T·sw), the gate's
  // sigmoid (a·T) and the shared output the sigmoid multiplies (a·T·h); the MLP norm's output it reads is
  // already kept by the router (counting it again was a planner bug, +a·T·h). LoRA on q,v: the shared expert
  // frozen keeps gate, act(gate) and up, the sigmoid and the scaled output (the product still needs both).
  // executor/moe.cpp keeps exactly these (tests/executor/test_families.cpp measures a tiny Qwen2-MoE).
  const auto m = spec("qwen1.5-moe-a2.7b-chat");
  ftplan::ModelSpec routed_only = m;
  routed_only.moe.shared_intermediate_size = 0;
  routed_only.moe.shared_expert_gate = false;
  const double T = 1024, a = 2, h = 2048, sw = 5632;
  REQUIRE(m.moe.shared_intermediate_size == 5632);
  for (const Method method : {Method::full, Method::lora}) {
    CAPTURE(ftplan::to_string(method));
    auto s = job("qwen1.5-moe-a2.7b-chat", method, 8);
    s.seq_len = 1024;
    if (method == Method::lora) s.lora.targets = {"q_proj", "v_proj"};
    const ftplan::ActivationInputs in = ftplan::activation_inputs(s, 1, Attention::fused);
    const double shared = double(ftplan::block_activation_bytes(m, in)) - double(ftplan::block_activation_bytes(routed_only, in));
    CHECK(shared == (method == Method::full ? 4 : 3) * a * T * sw + a * T + a * T * h);
  }
}

TEST_CASE("expert parallelism: the all-to-all's bytes and time", "[moe][step]") {
  // all-to-all over N ranks: each sends (N - 1)/N of its buffer, α paid N - 1 times.
  CHECK(ftplan::wire_bytes(ftplan::Collective::all_to_all, 8e6, 8) == 7e6);
  CHECK_THAT(ftplan::collective_time_s(ftplan::Collective::all_to_all, 8e6, 8, 100e9, 1e-6), WithinRel(7e-6 + 7e6 / 100e9, 1e-12));
  // Qwen3-30B-A3B LoRA on attention under ZeRO-2: with ep=8 the only new traffic is the all-to-all, four per MoE
  // block per micro-batch (dispatch and combine, forward and backward), each of 4096 tokens x 8 experts x
  // 2048 x 2 bytes; the adapters' gradients and updates exchanged are the same.
  const auto m = spec("qwen3-30b-a3b");
  // One efficiency for every GEMM (no per-shape table): ep changes the rows each expert's GEMM sees, and
  // with it the GEMM's efficiency where the hwdb has a table; here only the communication differs.
  auto hw = ftplan::load_hardware("h100-sxm");
  hw.gemm_efficiency_bf16.clear();
  auto s = job("qwen3-30b-a3b", Method::lora, 8);
  s.lora.targets = {"q_proj", "v_proj"};
  const auto base = layout("dp_shard=8,shard=zero2", 1, Checkpointing::none),
             ep = layout("dp_shard=8,shard=zero2,ep=8", 1, Checkpointing::none);
  const auto ctx1 = ftplan::prepare_plan(m, hw, s, 8, ftplan::shard_shape(base.parallel));
  const auto ctx8 = ftplan::prepare_plan(m, hw, s, 8, ftplan::shard_shape(ep.parallel));
  const auto without = ftplan::estimate_step(ctx1, base), with = ftplan::estimate_step(ctx8, ep);
  const double buffer = 2.0 * 4096 * 8 * 2048;
  CHECK_THAT(with.comm_bytes_per_step - without.comm_bytes_per_step, WithinRel(4 * 48 * buffer * 7 / 8, 1e-9));
  // torchtitan runs them in the compute stream's order: every one exposed.
  CHECK(with.exposed_comm_s > without.exposed_comm_s);
  CHECK_THAT(with.step_time_s - without.step_time_s,
             WithinRel(with.comm_s - without.comm_s + (with.optimizer_s - without.optimizer_s), 1e-6));
}

TEST_CASE("an ep layout needs its expert group: the fewest GPUs keep ep ranks", "[moe][memory]") {
  const auto m = spec("qwen3-30b-a3b");
  const auto hw = ftplan::load_hardware("h100-sxm");
  auto s = job("qwen3-30b-a3b", Method::lora, 8);
  s.lora.targets = {"q_proj", "v_proj"};
  CHECK_FALSE(ftplan::scaled_layout(layout("dp_shard=8,ep=8").parallel, 4, hw));
  CHECK(ftplan::scaled_layout(layout("dp_shard=8,ep=8").parallel, 16, hw)->dp_shard == 16);
  CHECK(ftplan::min_gpus(m, hw, s, layout("dp_shard=8,ep=8", 1, Checkpointing::none)) >= 8);
}

TEST_CASE("the search composes ep with data parallelism where the framework offers it", "[moe][search]") {
  const auto m = spec("qwen3-30b-a3b");
  const auto hw = ftplan::load_hardware("h100-sxm");
  auto s = job("qwen3-30b-a3b", Method::lora, 8);
  s.lora.targets = {"q_proj", "v_proj"};
  bool fsdp_ep8 = false;
  for (const auto& p : ftplan::composition_layouts(m, hw, s)) {
    CHECK(m.moe.num_experts % p.ep == 0);
    if (p.ep == 8 && p.dp_shard == 8 && p.sharding == ftplan::Sharding::fsdp) fsdp_ep8 = true;
  }
  CHECK(fsdp_ep8);
  s.framework = "hf";  // no expert parallelism: no ep layout
  for (const auto& p : ftplan::composition_layouts(m, hw, s)) CHECK(p.ep == 1);
}

TEST_CASE("MoE bad input: refused by name", "[moe][bad-input]") {
  auto j = config("mixtral-8x7b");
  auto load = [&] { return ftplan::model_spec_from_json(j, "mixtral-8x7b"); };
  SECTION("ep that does not divide the experts names both") {
    const auto m = spec("mixtral-8x7b");
    auto s = job("mixtral-8x7b", Method::full, 24);
    const auto problems = ftplan::parallelism_problems(ftplan::parse_parallelism("dp_shard=24,ep=3", "--parallel", "fsdp"),
                                                       m, s, 24, Attention::fused);
    REQUIRE(problems.size() == 1);
    CHECK_THAT(problems[0], Contains("ep(3)") && Contains("num_experts(8)"));
  }
  SECTION("ep borrows from dp_shard x cp, not from replicas (torchtitan)") {
    const auto m = spec("mixtral-8x7b");
    auto s = job("mixtral-8x7b", Method::full, 8);
    const auto problems = ftplan::parallelism_problems(ftplan::parse_parallelism("dp_replicate=8,ep=8", "--parallel", "fsdp"),
                                                       m, s, 8, Attention::fused);
    REQUIRE(problems.size() == 1);
    CHECK_THAT(problems[0], Contains("ep(8) must divide dp_shard(1) * cp(1)"));
  }
  SECTION("ep on a dense model; tensor parallelism of experts") {
    const auto dense = ftplan::load_model("llama-3-8b");
    auto s = job("llama-3-8b", Method::full, 8);
    CHECK_THAT(ftplan::parallelism_problems(ftplan::parse_parallelism("dp_shard=8,ep=8", "--parallel", "fsdp"), dense, s, 8,
                                            Attention::fused)[0],
               Contains("ep(8)") && Contains("no experts"));
    const auto m = spec("mixtral-8x7b");
    CHECK_THAT(ftplan::parallelism_problems(ftplan::parse_parallelism("tp=2,dp_shard=4", "--parallel", "fsdp"), m, s, 8,
                                            Attention::fused)[0],
               Contains("tp(2)") && Contains("experts"));
  }
  SECTION("a MoE key the family does not read") {
    j["num_experts"] = 8;
    CHECK_THROWS_WITH(load(), Contains("num_experts") && Contains("mixtral"));
  }
  SECTION("router jitter noise") {
    j["router_jitter_noise"] = 0.01;
    CHECK_THROWS_WITH(load(), Contains("router_jitter_noise"));
  }
  SECTION("more experts per token than experts") {
    j["num_experts_per_tok"] = 9;
    CHECK_THROWS_WITH(load(), Contains("num_experts_per_tok"));
  }
  SECTION("mlp_only_layers outside the model") {
    auto q = config("qwen3-30b-a3b");
    q["mlp_only_layers"] = {48};
    CHECK_THROWS_WITH(ftplan::model_spec_from_json(q, "q"), Contains("mlp_only_layers"));
  }
  SECTION("experts on a dense family") {
    auto d = ftplan::read_json_file(ftplan::data_dir() + "/configs/models/llama-3-8b.json");
    d["n_routed_experts"] = 64;
    CHECK_THROWS_WITH(ftplan::model_spec_from_json(d, "l"), Contains("n_routed_experts") && Contains("llama"));
  }
  SECTION("mxfp4 leaving the experts unquantised") {
    auto g = config("gpt-oss-20b");
    g["quantization_config"]["modules_to_not_convert"].push_back("model.layers.*.mlp.experts");
    CHECK_THROWS_WITH(ftplan::model_spec_from_json(g, "g"), Contains("quantization_config.modules_to_not_convert"));
  }
  SECTION("an imbalance beyond num_experts / top_k") {
    const auto m = spec("mixtral-8x7b");
    auto s = job("mixtral-8x7b", Method::full, 8);
    s.moe.imbalance_factor = 5;
    s.given.insert("moe.imbalance_factor");
    CHECK_THROWS_WITH(ftplan::validate_job(s, m, "job"), Contains("moe.imbalance_factor"));
  }
}

TEST_CASE("model JSON: params_active below params_total for a MoE model", "[moe][model]") {
  const auto m = spec("mixtral-8x7b");
  auto s = job("mixtral-8x7b", Method::full, 8);
  const auto j = ftplan::model_json(m, ftplan::trainable_params(m, s));
  CHECK(j.at("params_total") == 46'702'792'704);
  CHECK(j.at("params_active") == 12'879'925'248);
  CHECK(j.at("moe").at("num_experts") == 8);
  CHECK(j.at("moe").at("top_k") == 2);
}

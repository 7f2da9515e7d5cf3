// Model families (planner/model_family.h) and quantized bases (planner/quantized_base.h): exact
// parameter counts of the shipped configs against each model's published figure, what each family's
// row puts in the spec, LoRA target names, a sliding-window eager block and soft-capping derived by
// hand, the stored bytes of GPTQ/AWQ/bitsandbytes linears by hand, and refusals that name the key.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/activation_memory.h"
#include "planner/compute_model.h"
#include "planner/data_paths.h"
#include "planner/errors.h"
#include "planner/hardware_spec.h"
#include "planner/job_fields.h"
#include "planner/json_fields.h"
#include "planner/memory_model.h"
#include "planner/memory_report.h"
#include "planner/model_family.h"
#include "planner/model_spec.h"
#include "planner/precision.h"
#include "planner/quantized_base.h"

using Catch::Matchers::Contains;
using ftplan::Attention;
using ftplan::Method;

namespace {

nlohmann::json model_json_file(const std::string& name) {
  return ftplan::read_json_file(ftplan::data_dir() + "/configs/models/" + name + ".json");
}

ftplan::ModelSpec spec(const std::string& name) { return ftplan::model_spec_from_json(model_json_file(name), name); }

std::vector<std::string> names(const ftplan::ModelSpec& m) {
  std::vector<std::string> out;
  for (const auto& lin : ftplan::block_linears(m)) out.push_back(lin.name);
  return out;
}

}  // namespace

TEST_CASE("family configs give the published parameter counts exactly", "[model][family]") {
  // Each figure is the model's safetensors total as published (configs/models/SOURCES.md gives the
  // source of each): the index's metadata total_size divided by the bytes per parameter, or the
  // Hub's safetensors parameter count.
  auto [name, total] = GENERATE(table<std::string, int64_t>({
      // Qwen/Qwen3-8B model.safetensors.index.json: total_size 16,381,470,720 bytes in bf16 / 2.
      {"qwen3-8b", 8'190'735'360},
      // google/gemma-2-9b: Hub safetensors total 9,241,705,984 (bf16 -it: 18,483,411,968 bytes / 2).
      {"gemma-2-9b", 9'241'705'984},
      // google/gemma-2-2b: 10,457,367,552 bytes of float32 tensors / 4.
      {"gemma-2-2b", 2'614'341'888},
      // google/gemma-3-1b-it: Hub safetensors total 999,885,952 (KerasHub gemma3_1b preset: the same).
      {"gemma-3-1b", 999'885'952},
      // google/gemma-3-4b-it: Hub safetensors total 4,300,079,472, the SigLIP tower and projector included.
      {"gemma-3-4b", 4'300'079'472},
      // microsoft/Phi-3-mini-4k-instruct: Hub safetensors total 3,821,079,552 (KerasHub preset: the same).
      {"phi-3-mini-4k", 3'821'079'552},
      // microsoft/phi-4: Hub safetensors total 14,659,507,200.
      {"phi-4", 14'659'507'200},
      // allenai/OLMo-2-1124-7B: Hub safetensors {"F32": 7,298,617,344}.
      {"olmo-2-7b", 7'298'617'344},
      // mistralai/Mistral-Nemo-Instruct-2407: Hub safetensors total 12,247,782,400.
      {"mistral-nemo-12b", 12'247'782'400},
  }));
  CAPTURE(name);
  const auto m = spec(name);
  const auto p = ftplan::count_params(m);
  CHECK(p.total == total);
  CHECK(p.embedding + m.num_layers * p.per_layer + p.final_norm + p.lm_head + p.vision == p.total);
  CHECK(p.per_layer == p.attention + p.mlp + p.norms);
}

TEST_CASE("each family's block, by hand", "[model][family]") {
  SECTION("Qwen3-8B: per-head q/k RMSNorms of head_dim, no biases, untied") {
    const auto m = spec("qwen3-8b");
    CHECK(m.qk_norm == ftplan::QkNorm::per_head);
    CHECK_FALSE(m.qkv_bias);
    const auto p = ftplan::count_params(m);
    CHECK(p.attention == 2 * 4096LL * 4096 + 2 * 4096LL * 1024);  // 41,943,040
    CHECK(p.mlp == 3 * 4096LL * 12288);                          // 150,994,944
    CHECK(p.norms == 2 * 4096 + 2 * 128);                         // two block norms + q_norm, k_norm
    CHECK(p.per_layer == 192'946'432);
    CHECK(m.sliding_window == 0);  // use_sliding_window false
  }
  SECTION("Gemma-2-9B: four norms, GeGLU, tied, soft-capped, every other layer local") {
    const auto m = spec("gemma-2-9b");
    CHECK(m.block_norms() == 4);
    CHECK(m.norm_scale_fp32);
    CHECK(m.hidden_act == "gelu_pytorch_tanh");
    CHECK(m.tie_word_embeddings);  // the config leaves it out: Gemma2Config's default
    CHECK(m.scaled_embedding);
    CHECK(m.attn_logit_softcapping == 50.0);
    CHECK(m.final_logit_softcapping == 30.0);
    CHECK(m.sliding_window == 4096);
    REQUIRE(m.sliding_layers.size() == 42);
    CHECK(m.sliding_layers[0]);  // is_sliding = not bool(layer_idx % 2)
    CHECK_FALSE(m.sliding_layers[1]);
    CHECK(m.num_sliding_layers() == 21);
    const auto p = ftplan::count_params(m);
    // q 3584→4096, k and v 3584→2048, o 4096→3584; gate, up 3584→14336, down back; four norms of 3584.
    CHECK(p.attention == 44'040'192);
    CHECK(p.mlp == 154'140'672);
    CHECK(p.norms == 4 * 3584);
    CHECK(p.lm_head == 0);
  }
  SECTION("Gemma-3: per-head q/k norms, 5 local layers to 1 global, the wrapper's text defaults and tower") {
    const auto one = spec("gemma-3-1b");
    CHECK(one.qk_norm == ftplan::QkNorm::per_head);
    CHECK(ftplan::count_params(one).norms == 4 * 1152 + 2 * 256);
    CHECK(one.sliding_window == 512);
    CHECK_FALSE(one.sliding_layers[5]);  // bool((5 + 1) % 6) is false: global
    CHECK(one.sliding_layers[4]);
    CHECK(one.num_sliding_layers() == 22);  // 26 layers, global at 5, 11, 17, 23
    CHECK(one.final_logit_softcapping == 0);  // null in the config
    const auto four = spec("gemma-3-4b");
    CHECK(four.wrapper_type == "gemma3");
    CHECK(four.model_type == "gemma3_text");
    // text_config names five keys; Gemma3TextConfig's defaults give the rest.
    CHECK(four.vocab_size == 262208);
    CHECK(four.num_heads == 8);
    CHECK(four.num_kv_heads == 4);
    CHECK(four.head_dim == 256);
    CHECK(four.tie_word_embeddings);
    CHECK(four.sliding_window == 1024);
    CHECK(four.num_sliding_layers() == 29);
    // SigLIP (hidden 1152, MLP 4304, 27 layers, 896/14 = 64² patches, no pooling head):
    // patch conv 3·14·14·1152 + 1152, positions 4096·1152, per layer 2 LayerNorms, q,k,v,o and fc1, fc2
    // with biases = 15,239,504, a post LayerNorm: 416,866,032; projector 1152·2560 + 1152.
    CHECK(four.vision.tower_params == 3 * 14 * 14 * 1152 + 1152 + 4096 * 1152 + 27 * 15'239'504LL + 2 * 1152);
    CHECK(four.vision.tower_params == 416'866'032);
    CHECK(four.vision.projector_params == 1152 * 2560 + 1152);
    CHECK(ftplan::count_params(four).per_layer == 94'382'592);
  }
  SECTION("Phi-3: fused qkv_proj and gate_up_proj, the same parameters as separate ones") {
    const auto m = spec("phi-3-mini-4k");
    CHECK(names(m) == std::vector<std::string>{"qkv_proj", "o_proj", "gate_up_proj", "down_proj"});
    const auto p = ftplan::count_params(m);
    CHECK(p.attention == 3072LL * (3072 + 2 * 3072) + 3072LL * 3072);  // 37,748,736
    CHECK(p.mlp == 3072LL * 2 * 8192 + 8192LL * 3072);                 // 75,497,472
    auto unfused = m;
    unfused.fused_qkv = unfused.fused_gate_up = false;
    CHECK(ftplan::count_params(unfused).per_layer == p.per_layer);
    CHECK(m.sliding_window == 2047);
    CHECK(m.num_sliding_layers() == 32);  // every layer
    CHECK(spec("phi-4").sliding_window == 0);  // null
  }
  SECTION("OLMo 2: norms after each sublayer only, q/k norms over the whole projection") {
    const auto m = spec("olmo-2-7b");
    CHECK_FALSE(m.norm_pre_attention);
    CHECK_FALSE(m.norm_pre_mlp);
    CHECK(m.norm_post_attention);
    CHECK(m.norm_post_mlp);
    CHECK(m.qk_norm == ftplan::QkNorm::whole_projection);
    CHECK(ftplan::count_params(m).norms == 2 * 4096 + 4096 + 4096);  // q_norm(32·128), k_norm(32·128)
  }
  SECTION("Mistral: the 7B's window on every layer, Nemo's null window, Qwen2's window off") {
    CHECK(spec("mistral-7b").num_sliding_layers() == 32);
    CHECK(spec("mistral-7b").sliding_window == 4096);
    CHECK(spec("mistral-nemo-12b").sliding_window == 0);
    CHECK(spec("qwen2-7b").sliding_window == 0);  // use_sliding_window false
  }
}

TEST_CASE("LoRA targets use the family's module names", "[model][family][lora]") {
  ftplan::TrainingSetup s;
  s.method = Method::lora;
  SECTION("Phi-3: all-linear names the fused modules; qkv_proj counts r·(in + out)") {
    const auto m = spec("phi-3-mini-4k");
    s.lora.targets = ftplan::parse_lora_targets("all-linear", "--lora-targets");
    s.lora.all_linear = true;
    s.given.insert("lora.targets");
    ftplan::apply_model(s, m);
    CHECK(s.lora.targets == std::vector<std::string>{"qkv_proj", "o_proj", "gate_up_proj", "down_proj"});
    CHECK_NOTHROW(ftplan::validate_job(s, m));
    s.lora.targets = ftplan::parse_lora_targets("qkv_proj", "--lora-targets");
    s.lora.all_linear = false;
    ftplan::apply_model(s, m);
    s.framework = "ftexec";
    // r = 16 on qkv_proj (3072 → 9216): 32 layers × 16 × (3072 + 9216) = 6,291,456.
    CHECK(ftplan::trainable_params(m, s).trainable == 6'291'456);
  }
  SECTION("Phi-3 has no q_proj: refused naming the target and the family's modules") {
    const auto m = spec("phi-3-mini-4k");
    s.lora.targets = {"q_proj", "v_proj"};
    s.given.insert("lora.targets");
    CHECK_THROWS_WITH(ftplan::validate_job(s, m), Contains("'q_proj'") && Contains("qkv_proj") && Contains("lora.targets"));
  }
  SECTION("no targets given: PEFT's default for the family, or a refusal where PEFT has none") {
    const auto qwen3 = spec("qwen3-8b");
    ftplan::apply_model(s, qwen3);
    CHECK(s.lora.targets == std::vector<std::string>{"q_proj", "v_proj"});
    CHECK_NOTHROW(ftplan::validate_job(s, qwen3));
    CHECK_THROWS_WITH(ftplan::validate_job(s, spec("olmo-2-7b")), Contains("lora.targets") && Contains("olmo2"));
    CHECK_THROWS_WITH(ftplan::validate_job(s, spec("phi-4")), Contains("lora.targets") && Contains("gate_up_proj"));
  }
}

TEST_CASE("a sliding-window layer under eager attention, by hand", "[memory][family]") {
  // Gemma-2-9B, LoRA r=16 on q_proj and v_proj, B=1, S=8192 (twice the 4096 window), bf16 (a=2),
  // eager attention; h=3584, q_dim=4096, i=14336, 16 heads, T=8192.
  auto m = spec("gemma-2-9b");
  ftplan::ActivationInputs in;
  in.micro_batch = 1;
  in.seq_len = 8192;
  in.precision = ftplan::Precision::mixed;
  in.attention = Attention::eager;
  in.method = Method::lora;
  in.lora.rank = 16;
  in.lora.targets = {"q_proj", "v_proj"};
  const int64_t T = 8192, a = 2, h = 3584, q = 4096, i = 14336, heads = 16, S = 8192;
  const int64_t norms = 4 * (4 * T * h + 4 * T);  // four RMSNorms: fp32 input and rstd (frozen weights)
  const int64_t attn_input = a * T * h;           // the attention norm's output, read by the adapters
  const int64_t qkv_repeated = 3 * a * T * q;     // q, k, v repeated to the 16 heads
  const int64_t scores = heads * S * S;           // B·heads·S² = 1,073,741,824
  // The fp32 softmax, its bf16 copy for P·V, and tanh's output of the soft-cap (50·tanh(s/50)).
  const int64_t kept_scores = 4 * scores + 2 * scores + a * scores;
  const int64_t mlp = 3 * a * T * i;  // gate, GELU(gate), up
  const int64_t lora = 2 * a * T * 16;
  const int64_t hand = norms + attn_input + qkv_repeated + kept_scores + mlp + lora;
  REQUIRE(hand == 10'025'041'920);
  // Every layer, local or global: transformers' eager attention computes the full S×S scores and masks
  // the window (gemma2 eager_attention_forward), so a local layer does not keep B·heads·S·window.
  CHECK(ftplan::block_activation_bytes(m, in) == hand);
  auto no_window = m;
  no_window.sliding_window = 0;
  no_window.sliding_layers.clear();
  CHECK(ftplan::block_activation_bytes(no_window, in) == hand);
  // Had local layers kept S·window scores, they would be (4 + 2 + 2)·heads·S·(S − 4096) lighter.
  CHECK(hand - 8 * heads * S * (S - 4096) == 5'730'074'624);
  SECTION("the soft-cap's tanh is an eager-only tensor") {
    auto uncapped = m;
    uncapped.attn_logit_softcapping = 0;
    CHECK(ftplan::block_activation_bytes(m, in) - ftplan::block_activation_bytes(uncapped, in) == a * scores);
    ftplan::ActivationInputs fused = in;
    fused.attention = Attention::fused;
    CHECK(ftplan::block_activation_bytes(m, fused) == ftplan::block_activation_bytes(uncapped, fused));
  }
  SECTION("FLOPs: local layers attend over the window under fused attention only") {
    ftplan::TrainingSetup s;
    s.method = Method::lora;
    s.seq_len = 8192;
    s.attention = Attention::fused;
    // 21 local layers over 4096 keys, 21 global over 8192: the mean, 6144 keys per query.
    CHECK(ftplan::flops_per_token(m, s).block_attention == 4.0 * 6144 * q);
    s.attention = Attention::eager;
    CHECK(ftplan::flops_per_token(m, s).block_attention == 4.0 * 8192 * q);
    s.attention = Attention::fused;
    s.seq_len = 2048;  // shorter than the window: no difference
    CHECK(ftplan::flops_per_token(m, s).block_attention == 4.0 * 2048 * q);
  }
}

TEST_CASE("the final logit soft-cap keeps tanh's output through the full loss", "[memory][family]") {
  const auto m = spec("gemma-2-9b");
  // a·B·S·vocab = 2 · 1 · 1024 · 256,000.
  CHECK(ftplan::logit_softcap_bytes(m, 1, 1024, ftplan::Precision::mixed) == 524'288'000);
  auto uncapped = m;
  uncapped.final_logit_softcapping = 0;
  CHECK(ftplan::logit_softcap_bytes(uncapped, 1, 1024, ftplan::Precision::mixed) == 0);
  ftplan::TrainingSetup s;
  s.framework = "ftexec";
  s.method = Method::lora;
  s.seq_len = 1024;
  const auto hw = ftplan::load_hardware("a100-80gb-sxm");
  const auto capped_job = ftplan::prepare_job(m, hw, s);
  const auto plain_job = ftplan::prepare_job(uncapped, hw, s);
  CHECK(capped_job.loss_peak_bytes_per_sample - plain_job.loss_peak_bytes_per_sample == 524'288'000.0);
  CHECK(capped_job.loss_kept_bytes_per_sample - plain_job.loss_kept_bytes_per_sample == 524'288'000.0);
}

TEST_CASE("a fused qkv_proj keeps its whole output where v is saved uncopied", "[memory][family]") {
  // Phi-3-mini (32 heads, 32 kv heads): v is a view into qkv_proj's output, so q's and k's parts of it
  // (a·T·(q_dim + kv_dim)) stay alive beside the rotated q and k. B=1, S=2048, bf16, full fine-tuning.
  const auto m = spec("phi-3-mini-4k");
  auto unfused = m;
  unfused.fused_qkv = unfused.fused_gate_up = false;
  ftplan::ActivationInputs in;
  in.seq_len = 2048;
  in.method = Method::full;
  for (Attention at : {Attention::fused, Attention::eager}) {
    in.attention = at;
    CHECK(ftplan::block_activation_bytes(m, in) - ftplan::block_activation_bytes(unfused, in) ==
          2 * 2048LL * (3072 + 3072));
  }
  // Phi-4 (40 heads, 10 kv heads) where repeat_kv copies v (eager, or a fused kernel fed repeated kv):
  // nothing more than the separate projections keep.
  const auto phi4 = spec("phi-4");
  auto phi4_unfused = phi4;
  phi4_unfused.fused_qkv = phi4_unfused.fused_gate_up = false;
  in.attention = Attention::eager;
  CHECK(ftplan::block_activation_bytes(phi4, in) == ftplan::block_activation_bytes(phi4_unfused, in));
  in.attention = Attention::fused;
  in.gqa_kv_repeated = false;
  CHECK(ftplan::block_activation_bytes(phi4, in) - ftplan::block_activation_bytes(phi4_unfused, in) ==
        2 * 2048LL * (5120 + 1280));
}

TEST_CASE("quantized bases: the bytes of one linear as stored, by hand", "[model][quantized]") {
  const std::string where = "test";
  SECTION("GPTQ 4-bit, group 128, a 4096×4096 linear") {
    const auto g = ftplan::quantized_base_from_json(
        {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}, {"desc_act", false}, {"sym", true}}, where);
    // qweight int32 [4096·4/32, 4096] = 4096·4096/2; qzeros int32 [32, 4096·4/32]; scales fp16 [32, 4096];
    // g_idx int32 [4096] (AutoGPTQ qlinear_triton.py's buffers).
    const int64_t hand = 4096 * 4096 / 2 + 32 * 4096 / 2 + 2 * 32 * 4096 + 4 * 4096;
    REQUIRE(hand == 8'732'672);
    CHECK(ftplan::quantized_linear_bytes(g, 4096, 4096) == hand);
    CHECK_THAT(g.bytes_per_weight, Catch::Matchers::WithinRel(8732672.0 / (4096.0 * 4096.0), 1e-12));
    // down_proj of Llama-3-8B (14336 → 4096): 112 groups along the input.
    CHECK(ftplan::quantized_linear_bytes(g, 14336, 4096) ==
          14336LL * 4096 / 2 + 112 * 4096 / 2 + 2 * 112 * 4096 + 4 * 14336);
  }
  SECTION("GPTQ group_size -1: one group per input row") {
    const auto g = ftplan::quantized_base_from_json({{"quant_method", "gptq"}, {"bits", 8}, {"group_size", -1}}, where);
    CHECK(ftplan::quantized_linear_bytes(g, 4096, 1024) == 4096LL * 1024 + 1 * 1024 + 2 * 1024 + 4 * 4096);
  }
  SECTION("AWQ 4-bit GEMM, group 128: GPTQ's tensors without g_idx") {
    const auto w = ftplan::quantized_base_from_json(
        {{"quant_method", "awq"}, {"bits", 4}, {"group_size", 128}, {"version", "gemm"}, {"zero_point", true}}, where);
    CHECK(ftplan::quantized_linear_bytes(w, 4096, 4096) == 8'732'672 - 4 * 4096);
  }
  SECTION("bitsandbytes: NF4 blocks of 64 (double quantisation as the config says); int8 with a scale per row") {
    const auto nf4 = ftplan::quantized_base_from_json(
        {{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}, {"bnb_4bit_quant_type", "nf4"},
         {"bnb_4bit_use_double_quant", true}}, where);
    CHECK(ftplan::quantized_linear_bytes(nf4, 4096, 4096) == ftplan::nf4_storage_bytes(4096 * 4096, true));
    const auto int8 = ftplan::quantized_base_from_json({{"quant_method", "bitsandbytes"}, {"load_in_8bit", true}}, where);
    CHECK(ftplan::quantized_linear_bytes(int8, 4096, 4096) == 4096LL * 4096 + 4 * 4096);
  }
  SECTION("LoRA on a GPTQ Llama-3-8B is planned as QLoRA of the stored bytes") {
    auto config = model_json_file("llama-3-8b");
    config["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}};
    const auto gptq = ftplan::model_spec_from_json(config, "llama-3-8b-gptq");
    const auto plain = spec("llama-3-8b");
    ftplan::TrainingSetup s;
    s.framework = "ftexec";
    s.method = Method::lora;
    ftplan::apply_model(s, gptq);
    CHECK(s.method == Method::qlora);
    // One block, by hand: q, o 8,732,672 each; k, v (4096 → 1024) 2,195,456 each; gate, up (4096 → 14336)
    // 30,523,392 each; down (14336 → 4096) 30,564,352.
    int64_t block = 0;
    for (const auto& lin : ftplan::block_linears(gptq))
      block += ftplan::quantized_linear_bytes(gptq.quantized, lin.in_features, lin.out_features);
    CHECK(block == 2 * 8'732'672 + 2 * 2'195'456 + 2 * 30'523'392 + 30'564'352);
    // Against QLoRA's NF4 (double quantisation) of the same base: only the linears' bytes differ.
    ftplan::TrainingSetup q = s;
    const auto hw = ftplan::load_hardware("a100-80gb-sxm");
    int64_t nf4 = 0;
    for (const auto& lin : ftplan::block_linears(plain)) nf4 += ftplan::nf4_storage_bytes(lin.in_features * lin.out_features, true);
    CHECK(ftplan::prepare_job(gptq, hw, s).layer_weight_bytes - ftplan::prepare_job(plain, hw, q).layer_weight_bytes ==
          double(block - nf4));
    CHECK(ftplan::trainable_params(gptq, s).quantized == 32 * 218'103'808LL);
    // Full fine-tuning cannot train stored 4-bit weights.
    ftplan::TrainingSetup full;
    full.method = Method::full;
    CHECK_THROWS_WITH(ftplan::validate_job(full, gptq), Contains("method") && Contains("gptq"));
  }
}

TEST_CASE("what is not modelled is refused, naming the key", "[model][family]") {
  auto j = model_json_file("llama-3-8b");
  const auto load = [&] { return ftplan::model_spec_from_json(j, "bad"); };
  SECTION("a model_type without a row") {
    j["model_type"] = "gpt_neox";
    CHECK_THROWS_WITH(load(), Contains("model_type") && Contains("gpt_neox") && Contains("gemma2"));
  }
  SECTION("an architecture key the family does not read, every one named") {
    j["use_parallel_residual"] = true;
    j["attn_logit_softcapping"] = 50.0;  // Gemma's key on a Llama: not read by this row
    CHECK_THROWS_WITH(load(), Contains("bad: use_parallel_residual") && Contains("bad: attn_logit_softcapping") &&
                                  Contains("not modelled for model_type 'llama'"));
  }
  SECTION("a sliding window on a family without one") {
    j = model_json_file("olmo-2-7b");
    j["sliding_window"] = 4096;
    CHECK_THROWS_WITH(load(), Contains("sliding_window") && Contains("olmo2"));
  }
  SECTION("attention dropout keeps masks") {
    j["attention_dropout"] = 0.1;
    CHECK_THROWS_WITH(load(), Contains("attention_dropout"));
  }
  SECTION("layer_types of the wrong length") {
    j = model_json_file("gemma-2-2b");
    j["layer_types"] = {"sliding_attention", "full_attention"};
    CHECK_THROWS_WITH(load(), Contains("layer_types"));
  }
  SECTION("a wrapper whose text_config is another family") {
    j = model_json_file("gemma-3-4b");
    j["text_config"]["model_type"] = "llama";
    CHECK_THROWS_WITH(load(), Contains("text_config") && Contains("gemma3_text"));
  }
  SECTION("quantization: an unknown method, mxfp4, a format or key not modelled") {
    j["quantization_config"] = {{"quant_method", "hqq"}};
    CHECK_THROWS_WITH(load(), Contains("quantization_config.quant_method") && Contains("hqq"));
    j["quantization_config"] = {{"quant_method", "mxfp4"}};
    CHECK_THROWS_WITH(load(), Contains("quantization_config.quant_method") && Contains("mixture-of-experts"));
    j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}, {"checkpoint_format", "marlin"}};
    CHECK_THROWS_WITH(load(), Contains("quantization_config.checkpoint_format"));
    j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}, {"bogus", 1}};
    CHECK_THROWS_WITH(load(), Contains("quantization_config.bogus"));
    j["quantization_config"] = {{"quant_method", "bitsandbytes"}, {"load_in_4bit", true},
                                {"llm_int8_skip_modules", {"lm_head", "model.layers.0.mlp.down_proj"}}};
    CHECK_THROWS_WITH(load(), Contains("quantization_config.llm_int8_skip_modules") && Contains("down_proj"));
    j["quantization_config"] = {{"quant_method", "awq"}, {"bits", 4}, {"version", "gemv"}};
    CHECK_THROWS_WITH(load(), Contains("quantization_config.version"));
  }
  SECTION("every shipped config is read without a refusal") {
    for (const char* name : {"tinyllama-1.1b", "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b",
                             "llama-3-8b-instruct", "llama-3-70b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b",
                             "llama-3.2-1b", "llama-3.2-3b", "mistral-7b", "mistral-7b-v0.2", "codellama-34b",
                             "yi-34b", "qwen2-0.5b", "qwen2-7b", "tiny-test"}) {
      CAPTURE(name);
      CHECK_NOTHROW(spec(name));
    }
  }
}

TEST_CASE("model JSON: params_active equals params_total for dense models", "[model][family]") {
  const auto m = spec("gemma-3-4b");
  ftplan::TrainingSetup s;
  s.framework = "ftexec";
  const auto j = ftplan::model_json(m, ftplan::trainable_params(m, s));
  CHECK(j.at("params_total") == 4'300'079'472);
  CHECK(j.at("params_active") == j.at("params_total"));
  CHECK(j.at("params_vision") == 416'866'032 + 2'950'272);
}

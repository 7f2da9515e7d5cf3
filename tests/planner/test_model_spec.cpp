// Model specs read from the shipped Hugging Face config.json files: exact parameter counts, the
// variants of the format (GQA, head_dim, tied embeddings, Qwen2 biases, rope_parameters), and bad
// input rejected with a message that names the field.
#include <catch2/catch.hpp>

#include <string>

#include <nlohmann/json.hpp>

#include "planner/data_paths.h"
#include "planner/errors.h"
#include "planner/json_fields.h"
#include "planner/model_spec.h"

namespace {

std::string model_path(const std::string& name) { return ftplan::data_dir() + "/configs/models/" + name + ".json"; }

nlohmann::json model_json(const std::string& name) { return ftplan::read_json_file(model_path(name)); }

ftplan::ModelSpec load_model(const std::string& name) { return ftplan::model_spec_from_json(model_json(name), name); }

}  // namespace

TEST_CASE("shipped configs give the exact parameter counts", "[model]") {
  // Totals as reported by transformers' model.num_parameters() for the hub checkpoints (tied
  // embeddings counted once), i.e. the sum of the tensor sizes in the safetensors index.
  auto [name, total] = GENERATE(table<std::string, int64_t>({
      {"tinyllama-1.1b", 1'100'048'384},
      {"llama-2-7b", 6'738'415'616},
      {"llama-3-8b", 8'030'261'248},
      {"llama-3-8b-instruct", 8'030'261'248},
      {"llama-3.1-8b", 8'030'261'248},
      {"mistral-7b", 7'241'732'096},
      {"codellama-34b", 33'743'970'304},
      {"llama-3.1-70b", 70'553'706'496},
      {"llama-3.2-1b", 1'235'814'400},
      {"qwen2-0.5b", 494'032'768},
      {"qwen2-7b", 7'615'616'512},
      // Our CPU test model: 2 * 256*64 (embedding + lm_head) + 2 * 45,440 per layer + 64.
      {"tiny-test", 123'712},
  }));
  CAPTURE(name);
  const auto counts = ftplan::count_params(load_model(name));
  CHECK(counts.total == total);
  // The pieces add up to the total.
  const auto m = load_model(name);
  CHECK(counts.embedding + m.num_layers * counts.per_layer + counts.final_norm + counts.lm_head == counts.total);
  CHECK(counts.per_layer == counts.attention + counts.mlp + counts.norms);
}

TEST_CASE("Llama-3-8B: architecture and per-layer count", "[model]") {
  const auto m = load_model("llama-3-8b");
  CHECK(m.model_type == "llama");
  CHECK(m.vocab_size == 128256);
  CHECK(m.hidden_size == 4096);
  CHECK(m.num_layers == 32);
  CHECK(m.num_heads == 32);
  CHECK(m.num_kv_heads == 8);
  CHECK(m.head_dim == 128);
  CHECK(m.kv_dim() == 1024);
  CHECK_FALSE(m.tie_word_embeddings);
  CHECK_FALSE(m.qkv_bias);
  CHECK(m.rope_theta == 500000.0);
  CHECK(m.rope_scaling.type.empty());

  const auto p = ftplan::count_params(m);
  // q,o: 4096*4096 each; k,v: 4096*1024 each; gate,up,down: 4096*14336 each; two norms of 4096.
  CHECK(p.attention == 2 * 4096LL * 4096 + 2 * 4096LL * 1024);
  CHECK(p.mlp == 3 * 4096LL * 14336);
  CHECK(p.per_layer == 218'112'000);
  CHECK(p.embedding == 128256LL * 4096);
  CHECK(p.lm_head == p.embedding);
}

TEST_CASE("Llama-3.1 and 3.2: llama3 rope scaling, head_dim and tied embeddings", "[model]") {
  SECTION("llama-3.1-8b") {
    const auto m = load_model("llama-3.1-8b");
    CHECK(m.rope_scaling.type == "llama3");
    CHECK(m.rope_scaling.factor == 8.0);
    CHECK(m.rope_scaling.low_freq_factor == 1.0);
    CHECK(m.rope_scaling.high_freq_factor == 4.0);
    CHECK(m.rope_scaling.original_max_position == 8192);
    CHECK(m.max_position_embeddings == 131072);
  }
  SECTION("llama-3.2-1b") {
    const auto m = load_model("llama-3.2-1b");
    CHECK(m.head_dim == 64);
    CHECK(m.tie_word_embeddings);
    CHECK(m.rope_scaling.factor == 32.0);
    const auto p = ftplan::count_params(m);
    CHECK(p.lm_head == 0);  // tied: the embedding matrix is the output projection
  }
}

TEST_CASE("Mistral and CodeLlama configs", "[model]") {
  const auto mistral = load_model("mistral-7b");
  CHECK(mistral.model_type == "mistral");
  CHECK(mistral.vocab_size == 32000);
  CHECK(mistral.num_kv_heads == 8);
  const auto code = load_model("codellama-34b");
  CHECK(code.hidden_size == 8192);
  CHECK(code.num_layers == 48);
  CHECK(code.num_heads == 64);
  CHECK(code.num_kv_heads == 8);
  CHECK(code.intermediate_size == 22016);
  CHECK(code.rope_theta == 1e6);  // an integer in the hub file: 1000000
  CHECK(code.max_position_embeddings == 16384);
}

TEST_CASE("Qwen2: q,k,v biases, no o_proj or MLP bias", "[model]") {
  const auto m = load_model("qwen2-0.5b");
  CHECK(m.model_type == "qwen2");
  CHECK(m.qkv_bias);
  CHECK_FALSE(m.o_bias);
  CHECK_FALSE(m.mlp_bias);
  CHECK(m.tie_word_embeddings);
  CHECK(m.head_dim == 64);
  const auto p = ftplan::count_params(m);
  // q: 896*896 + 896, k and v: 896*128 + 128 each, o: 896*896.
  CHECK(p.attention == 896LL * 896 + 896 + 2 * (896LL * 128 + 128) + 896LL * 896);
  for (const auto& lin : ftplan::block_linears(m)) {
    CAPTURE(lin.name);
    CHECK(lin.bias == (lin.name == "q_proj" || lin.name == "k_proj" || lin.name == "v_proj"));
  }
  // Without the biases Qwen2-7B would be 3584 + 2*512 = 4608 parameters per layer smaller.
  const auto m7 = load_model("qwen2-7b");
  auto no_bias = m7;
  no_bias.qkv_bias = false;
  CHECK(ftplan::count_params(m7).per_layer - ftplan::count_params(no_bias).per_layer == 4608);
}

TEST_CASE("rope_theta inside rope_parameters (transformers 5 style)", "[model]") {
  const auto j = ftplan::read_json_file(std::string(FTPLAN_SOURCE_DIR) + "/tests/data/llama-3-8b-rope-parameters.json");
  REQUIRE_FALSE(j.contains("rope_theta"));
  const auto m = ftplan::model_spec_from_json(j, "llama-3-8b-rope-parameters");
  CHECK(m.rope_theta == 500000.0);
  CHECK(m.rope_scaling.type.empty());  // "default" means no scaling
  CHECK(ftplan::count_params(m).total == 8'030'261'248);
}

TEST_CASE("bad configs are rejected with the field named", "[model]") {
  using Catch::Matchers::Contains;
  auto j = model_json("llama-3-8b");
  const auto load = [&] { return ftplan::model_spec_from_json(j, "bad"); };

  SECTION("valid as shipped") { CHECK_NOTHROW(load()); }
  SECTION("heads that do not divide hidden_size") {
    j["num_attention_heads"] = 30;
    j["num_key_value_heads"] = 6;
    CHECK_THROWS_MATCHES(load(), ftplan::InputError, Catch::Matchers::Message(
        "bad: num_attention_heads: 30 does not divide hidden_size 4096 (and no head_dim is given)"));
  }
  SECTION("kv heads that do not divide heads") {
    j["num_key_value_heads"] = 7;
    CHECK_THROWS_WITH(load(), Contains("num_key_value_heads") && Contains("7"));
  }
  SECTION("zero vocab") {
    j["vocab_size"] = 0;
    CHECK_THROWS_WITH(load(), Contains("bad: vocab_size: 0 is out of range"));
  }
  SECTION("negative vocab") {
    j["vocab_size"] = -128256;
    CHECK_THROWS_WITH(load(), Contains("vocab_size") && Contains("out of range"));
  }
  SECTION("missing hidden_size") {
    j.erase("hidden_size");
    CHECK_THROWS_WITH(load(), Contains("bad: hidden_size: missing"));
  }
  SECTION("a string where a number belongs") {
    j["hidden_size"] = "4096";
    CHECK_THROWS_WITH(load(), Contains("hidden_size") && Contains("expected an integer"));
  }
  SECTION("a fractional layer count") {
    j["num_hidden_layers"] = 31.5;
    CHECK_THROWS_WITH(load(), Contains("num_hidden_layers"));
  }
  SECTION("an absurd hidden_size is out of range") {
    j["hidden_size"] = INT64_C(1) << 40;
    CHECK_THROWS_WITH(load(), Contains("hidden_size") && Contains("out of range"));
  }
  SECTION("sizes in range whose product would overflow are rejected") {
    // Each field is within its own bound, but the model would have ~1e17 parameters.
    j["hidden_size"] = 1'000'000;
    j["num_attention_heads"] = 1000;
    j["num_key_value_heads"] = 1000;
    j["intermediate_size"] = 10'000'000;
    j["num_hidden_layers"] = 1000;
    CHECK_THROWS_WITH(load(), Contains("hidden_size") && Contains("1e15"));
  }
  SECTION("a number too large for 64 bits") {
    j["vocab_size"] = UINT64_MAX;
    CHECK_THROWS_WITH(load(), Contains("vocab_size"));
  }
  SECTION("unsupported model_type") {
    j["model_type"] = "gpt2";
    CHECK_THROWS_WITH(load(), Contains("model_type") && Contains("gpt2"));
  }
  SECTION("mixture-of-experts key") {
    j["num_local_experts"] = 8;
    CHECK_THROWS_WITH(load(), Contains("num_local_experts") && Contains("not supported"));
  }
  SECTION("rope_parameters of the wrong type") {
    j["rope_parameters"] = "fast";
    CHECK_THROWS_AS(load(), ftplan::InputError);
  }
  SECTION("not an object") {
    j = nlohmann::json::array();
    CHECK_THROWS_AS(load(), ftplan::InputError);
  }
}

// The executor's file formats: safetensors (HF checkpoints, sharded or not), PEFT adapters, data.
#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "executor/data.h"
#include "executor/llama_model.h"
#include "executor/lora.h"
#include "executor/safetensors.h"
#include "executor/save_folder.h"
#include "executor_test_util.h"
#include "planner/errors.h"
#include "planner/json_fields.h"

// glog (through LibTorch) defines CHECK too: Catch2 must come last and win.
#undef CHECK
#include <catch2/catch.hpp>

using namespace ftexec;
using Catch::Matchers::Contains;
using ftexec_test::ScratchDir;
using ftexec_test::tiny_spec;

TEST_CASE("safetensors round trip keeps names, dtypes, shapes and bytes", "[executor][safetensors]") {
  ScratchDir dir("st_roundtrip");
  const at::Tensor f32 = at::randn({3, 5});
  const at::Tensor bf16 = at::randn({7}).to(at::kBFloat16);
  const at::Tensor f16 = at::randn({2, 2, 2}).to(at::kHalf);
  write_safetensors(dir / "t.safetensors",
                    {safetensors_entry("a.weight", f32), safetensors_entry("b", bf16), safetensors_entry("c.h", f16)},
                    {{"format", "pt"}, {"note", "x"}});
  SafetensorsFile file(dir / "t.safetensors");
  REQUIRE(file.entries().size() == 3);
  CHECK(file.metadata().at("note") == "x");
  CHECK(file.find("a.weight")->dtype == "F32");
  CHECK(file.find("b")->dtype == "BF16");
  CHECK((file.find("c.h")->shape == std::vector<int64_t>{2, 2, 2}));
  CHECK(at::equal(tensor_view_of(*file.find("a.weight")), f32));
  CHECK(at::equal(tensor_view_of(*file.find("b")), bf16));
  CHECK(at::equal(tensor_view_of(*file.find("c.h")), f16));
  // The header length is 8-byte aligned, so the data is.
  std::ifstream in(dir / "t.safetensors", std::ios::binary);
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  CHECK(len[0] % 8 == 0);

  SECTION("a truncated or garbage file is bad input naming the file") {
    std::ofstream(dir / "bad.safetensors", std::ios::binary) << "\xff\xff\xff\xff\xff\xff\xff\x7f{}";
    CHECK_THROWS_WITH(SafetensorsFile(dir / "bad.safetensors"), Contains("bad.safetensors"));
  }
}

TEST_CASE("model weights save and load, single file and sharded", "[executor][safetensors]") {
  ScratchDir dir("st_model");
  LlamaModel a = llama_create(tiny_spec(), ModelOptions{}, 1);
  llama_save_weights(a, dir.path.string());
  SafetensorsFile saved(dir / "model.safetensors");
  const auto expected = llama_expected_tensors(tiny_spec());
  CHECK(saved.entries().size() == expected.size());
  for (const auto& [name, shape] : expected) {
    CAPTURE(name);
    REQUIRE(saved.find(name) != nullptr);
    CHECK(saved.find(name)->shape == shape);
  }
  CHECK((saved.find("model.layers.1.self_attn.k_proj.weight")->shape == std::vector<int64_t>{32, 64}));
  CHECK(saved.find("lm_head.weight") != nullptr);

  SECTION("single file") {
    LlamaModel b = llama_create(tiny_spec(), ModelOptions{}, 2);
    llama_load_weights(b, dir.path.string());
    const auto pa = llama_named_parameters(a), pb = llama_named_parameters(b);
    for (size_t i = 0; i < pa.size(); ++i) CHECK(at::equal(pa[i].second, pb[i].second));
  }
  SECTION("sharded with model.safetensors.index.json, into bf16") {
    ScratchDir sharded("st_sharded");
    std::vector<SafetensorsEntry> first, second;
    nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
    for (const auto& e : saved.entries()) {
      const bool in_first = e.name.find("layers.1.") == std::string::npos && e.name != "lm_head.weight";
      (in_first ? first : second).push_back(e);
      index["weight_map"][e.name] = in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    }
    write_safetensors(sharded / "model-00001-of-00002.safetensors", first);
    write_safetensors(sharded / "model-00002-of-00002.safetensors", second);
    ftplan::write_file_atomically(sharded / "model.safetensors.index.json", index.dump());
    ModelOptions bf16;
    bf16.dtype = at::kBFloat16;
    LlamaModel b = llama_create(tiny_spec(), bf16, 2, /*random_init=*/false);
    llama_load_weights(b, sharded.path.string());
    const auto pa = llama_named_parameters(a), pb = llama_named_parameters(b);
    for (size_t i = 0; i < pa.size(); ++i) CHECK(at::equal(pa[i].second.to(at::kBFloat16), pb[i].second));
  }
  SECTION("a config whose shapes differ is rejected naming the tensor") {
    auto spec = tiny_spec();
    spec.intermediate_size = 128;
    LlamaModel b = llama_create(spec, ModelOptions{}, 2);
    const auto before = b.layers[0].gate_proj.weight.clone();
    CHECK_THROWS_AS(llama_load_weights(b, dir.path.string()), ftplan::InputError);
    CHECK_THROWS_WITH(llama_load_weights(b, dir.path.string()),
                      Contains("model.layers.0.mlp.gate_proj.weight has shape [172, 64]") && Contains("expects [128, 64]"));
    CHECK(at::equal(b.layers[0].gate_proj.weight, before));  // nothing loaded
  }
  SECTION("missing and unexpected tensors are rejected naming them") {
    auto spec = tiny_spec();
    spec.num_layers = 3;
    LlamaModel b = llama_create(spec, ModelOptions{}, 2);
    CHECK_THROWS_WITH(llama_load_weights(b, dir.path.string()), Contains("model.layers.2.self_attn.q_proj.weight is missing"));
    auto tied = tiny_spec();
    tied.num_layers = 1;
    LlamaModel c = llama_create(tied, ModelOptions{}, 2);
    CHECK_THROWS_WITH(llama_load_weights(c, dir.path.string()),
                      Contains("model.layers.1.input_layernorm.weight is not a tensor of this config"));
  }
  SECTION("a missing file is bad input") {
    LlamaModel b = llama_create(tiny_spec(), ModelOptions{}, 2);
    CHECK_THROWS_WITH(llama_load_weights(b, dir / "nope.safetensors"), Contains("does not exist"));
  }
}

TEST_CASE("the PEFT adapter has PEFT's names, shapes and config", "[executor][lora]") {
  ScratchDir dir("peft");
  LlamaModel m = llama_create(tiny_spec(), ModelOptions{}, 0);
  ftplan::LoraSpec lora;
  lora.rank = 8;
  lora.alpha = 16;
  lora.targets = {"q_proj", "v_proj", "down_proj"};
  lora_attach(m, lora, 0);
  lora_save_peft(m, lora, dir.path.string(), "tiny-test");
  SafetensorsFile file(dir / "adapter_model.safetensors");
  std::map<std::string, std::vector<int64_t>> expected;
  for (int l = 0; l < 2; ++l) {
    const std::string p = "base_model.model.model.layers." + std::to_string(l) + ".";
    expected[p + "self_attn.q_proj.lora_A.weight"] = {8, 64};
    expected[p + "self_attn.q_proj.lora_B.weight"] = {64, 8};
    expected[p + "self_attn.v_proj.lora_A.weight"] = {8, 64};
    expected[p + "self_attn.v_proj.lora_B.weight"] = {32, 8};  // 2 kv heads x head_dim 16
    expected[p + "mlp.down_proj.lora_A.weight"] = {8, 172};
    expected[p + "mlp.down_proj.lora_B.weight"] = {64, 8};
  }
  REQUIRE(file.entries().size() == expected.size());
  for (const auto& e : file.entries()) {
    CAPTURE(e.name);
    REQUIRE(expected.count(e.name));
    CHECK(e.shape == expected[e.name]);
    CHECK(e.dtype == "F32");
  }
  // PEFT's init: lora_B zeros, lora_A within kaiming-uniform(a=sqrt(5))'s bound 1/sqrt(in).
  const at::Tensor b = tensor_view_of(*file.find("base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"));
  CHECK(b.abs().max().item<double>() == 0.0);
  const at::Tensor a = tensor_view_of(*file.find("base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"));
  CHECK(a.abs().max().item<double>() <= 1.0 / std::sqrt(172.0));
  CHECK(a.abs().max().item<double>() > 0.5 / std::sqrt(172.0));

  const auto config = ftplan::read_json_file(dir / "adapter_config.json");
  CHECK(config["peft_type"] == "LORA");
  CHECK(config["task_type"] == "CAUSAL_LM");
  CHECK(config["r"] == 8);
  CHECK(config["lora_alpha"] == 16.0);
  CHECK(config["target_modules"] == nlohmann::json({"q_proj", "v_proj", "down_proj"}));
  CHECK(config["base_model_name_or_path"] == "tiny-test");

  SECTION("an unknown target module is bad input") {
    LlamaModel m2 = llama_create(tiny_spec(), ModelOptions{}, 0);
    lora.targets = {"qkv_proj"};
    CHECK_THROWS_WITH(lora_attach(m2, lora, 0), Contains("qkv_proj"));
  }
}

TEST_CASE("a safetensors file written tensor by tensor, in any order, equals the one written at once", "[executor][safetensors][save]") {
  ScratchDir dir("st_stream");
  LlamaModel m = llama_create(tiny_spec(), ModelOptions{}, 3);
  llama_save_weights(m, (dir.path / "whole").string());
  std::vector<SafetensorsWriter::Tensor> layout;
  const auto named = llama_named_parameters(m);
  for (const auto& [name, t] : named) layout.push_back({name, "F32", t.sizes().vec()});
  {
    SafetensorsWriter w(dir / "streamed.safetensors", layout);
    for (size_t i = named.size(); i-- > 0;)  // backwards: offsets, not arrival order, place the bytes
      w.write(named[i].first, "F32", named[i].second.data_ptr(), named[i].second.nbytes());
    w.finish();
    CHECK(w.file_bytes() == std::filesystem::file_size(dir / "whole/model.safetensors"));
  }
  std::ifstream a(dir / "streamed.safetensors", std::ios::binary), b(dir / "whole/model.safetensors", std::ios::binary);
  const std::string sa((std::istreambuf_iterator<char>(a)), {}), sb((std::istreambuf_iterator<char>(b)), {});
  CHECK(sa == sb);  // byte for byte

  SECTION("a tensor missing, unknown, of another size or written twice is an error naming it") {
    SafetensorsWriter w(dir / "bad.safetensors", layout);
    const auto& [name, t] = named[1];
    CHECK_THROWS_WITH(w.write("no.such.tensor", "F32", t.data_ptr(), t.nbytes()), Contains("no.such.tensor"));
    CHECK_THROWS_WITH(w.write(name, "F32", t.data_ptr(), t.nbytes() - 4), Contains(name) && Contains("bytes"));
    w.write(name, "F32", t.data_ptr(), t.nbytes());
    CHECK_THROWS_WITH(w.write(name, "F32", t.data_ptr(), t.nbytes()), Contains("twice"));
    CHECK_THROWS_WITH(w.finish(), Contains("bad.safetensors") && Contains("was never written"));
  }
}

TEST_CASE("--save's folder appears whole or not at all, and keeps files it does not write", "[executor][save]") {
  namespace fs = std::filesystem;
  ScratchDir dir("save_folder");
  auto write = [](const std::string& path, const std::string& text) { std::ofstream(path) << text; };
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  auto leftovers = [&](const fs::path& folder) {  // temporary folders left behind
    int n = 0;
    for (const auto& e : fs::directory_iterator(folder)) n += e.path().filename().string().find(".ftexec-save-") != std::string::npos;
    return n;
  };
  SECTION("a new folder: nothing until commit, then everything") {
    const std::string out = dir / "out";
    SaveFolder f(out);
    write(f.file("model.safetensors"), "weights");
    write(f.file("config.json"), "{}");
    CHECK_FALSE(fs::exists(out));
    f.commit();
    CHECK(read(out + "/model.safetensors") == "weights");
    CHECK(read(out + "/config.json") == "{}");
    CHECK(leftovers(dir.path) == 0);
  }
  SECTION("a folder with files: ours replaced, the others kept") {
    const std::string out = dir / "existing";
    fs::create_directories(out);
    write(out + "/README.md", "mine");
    write(out + "/model.safetensors", "old");
    SaveFolder f(out);
    write(f.file("model.safetensors"), "new");
    CHECK(read(out + "/model.safetensors") == "old");
    f.commit();
    CHECK(read(out + "/model.safetensors") == "new");
    CHECK(read(out + "/README.md") == "mine");
    CHECK(leftovers(out) == 0);
  }
  SECTION("a run that fails before commit leaves no trace") {
    {
      SaveFolder f(dir / "never");
      write(f.file("model.safetensors"), "half");
    }
    CHECK_FALSE(fs::exists(dir / "never"));
    CHECK(leftovers(dir.path) == 0);
  }
}

TEST_CASE("data files are packed to seq_len with labels shifted by one", "[executor][data]") {
  ScratchDir dir("data");
  SECTION("JSONL input_ids") {
    std::ofstream(dir / "d.jsonl") << "{\"input_ids\": [1, 2, 3, 4]}\n\n{\"input_ids\": [5, 6, 7]}\n";
    const auto tokens = read_token_file(dir / "d.jsonl", 256);
    CHECK((tokens == std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
    auto source = open_data_source(dir / "d.jsonl", 256, 0);
    const TokenBatch b = source->next(2, 3);
    CHECK((b.input_ids == std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
    CHECK((b.labels == std::vector<int64_t>{2, 3, 4, 5, 6, 7}));
    const TokenBatch wrap = source->next(1, 3);  // the stream wraps around (next epoch)
    CHECK((wrap.input_ids == std::vector<int64_t>{7, 1, 2}));
    CHECK((wrap.labels == std::vector<int64_t>{1, 2, 3}));
  }
  SECTION("uint32 binary") {
    const uint32_t raw[] = {10, 11, 12, 13, 14};
    std::ofstream(dir / "d.bin", std::ios::binary).write(reinterpret_cast<const char*>(raw), sizeof(raw));
    const TokenBatch b = open_data_source(dir / "d.bin", 256, 0)->next(1, 4);
    CHECK((b.input_ids == std::vector<int64_t>{10, 11, 12, 13}));
    CHECK((b.labels == std::vector<int64_t>{11, 12, 13, 14}));
  }
  SECTION("a token outside the vocabulary is bad input naming the line") {
    std::ofstream(dir / "e.jsonl") << "{\"input_ids\": [1, 2]}\n{\"input_ids\": [300]}\n";
    CHECK_THROWS_WITH(read_token_file(dir / "e.jsonl", 256), Contains("e.jsonl:2") && Contains("300"));
  }
  SECTION("synthetic data is reproducible from the seed") {
    const auto a = open_data_source("synthetic", 256, 5)->next(2, 16);
    const auto b = open_data_source("synthetic", 256, 5)->next(2, 16);
    CHECK(a.input_ids == b.input_ids);
    CHECK(std::vector<int64_t>(a.input_ids.begin() + 1, a.input_ids.begin() + 16) ==
          std::vector<int64_t>(a.labels.begin(), a.labels.begin() + 15));
  }
}

TEST_CASE("RoPE llama3 scaling follows HF's _compute_llama3_parameters", "[executor]") {
  auto spec = tiny_spec();
  spec.head_dim = 64;
  spec.rope_theta = 500000.0;
  spec.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 8192};
  const auto scaled = rope_inv_freq(spec, 128);
  spec.rope_scaling = {};
  const auto plain = rope_inv_freq(spec, 128);
  REQUIRE(scaled.size() == 32);
  CHECK(scaled[0] == plain[0]);                                           // wavelength < 2048: kept
  CHECK_THAT(scaled[31], Catch::Matchers::WithinRel(plain[31] / 8.0, 1e-12));  // wavelength > 8192: / factor
  for (size_t i = 0; i < scaled.size(); ++i) {
    CHECK(scaled[i] <= plain[i]);
    CHECK(scaled[i] >= plain[i] / 8.0 * (1 - 1e-12));
  }
}

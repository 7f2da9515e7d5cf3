// --from (issue 15, item 1): the configs people train with, read as a job. Every case reads a file as
// its project publishes it (tests/data/configs/README.md names the repository, path and commit) and
// checks what each key became, what was listed as ignored, and that contradictions between files or
// between a file and a flag are refused naming both.
#include <catch2/catch.hpp>

#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/config_import.h"
#include "planner/data_paths.h"
#include "planner/errors.h"
#include "planner/framework.h"
#include "planner/hardware_spec.h"
#include "planner/job_fields.h"
#include "planner/json_fields.h"
#include "planner/training_setup.h"

using Catch::Matchers::Contains;
using ftplan::ConfigImport;
using ftplan::GivenValue;
using ftplan::TrainingSetup;
using Json = nlohmann::json;

namespace {

std::string data(const std::string& path) { return std::string(FTPLAN_SOURCE_DIR) + "/tests/data/configs/" + path; }

std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = std::string(FTPLAN_BINARY_DIR) + "/config_import_" + name;
  std::ofstream(path) << text;
  return path;
}

// What `ftplan ... --from FILES --gpu GPU [flags]` builds: the flags first, then the files, the
// topology, the files' rules and the framework. `flags` are job keys with values as the flags give them.
struct Imported {
  TrainingSetup setup;
  ConfigImport imp;
};
Imported import(const std::vector<std::string>& files, const std::string& gpu, const Json& flags = Json::object()) {
  Imported out;
  TrainingSetup& s = out.setup;
  std::map<std::string, GivenValue> given;
  s.gpu = gpu;
  for (auto it = flags.begin(); it != flags.end(); ++it) {
    const ftplan::FieldSpec& f = ftplan::field_by_key(it.key());
    ftplan::apply_job_field(s, f, *it, f.flag);
    given[it.key()] = {*it, std::string(f.flag) + " " + (it->is_string() ? it->get<std::string>() : it->dump())};
  }
  out.imp = ftplan::read_config_files(files);
  ftplan::apply_config_values(s, out.imp, given);
  ftplan::HardwareSpec hw = ftplan::load_hardware(s.gpu);
  ftplan::apply_topology(s, hw);
  ftplan::apply_config_rules(s, out.imp, hw, given);
  ftplan::apply_framework(s, ftplan::framework_profile(s.framework));
  return out;
}

std::string layout(const TrainingSetup& s) {
  if (s.parallel) return ftplan::to_string(*s.parallel);
  return s.strategy ? ftplan::to_string(*s.strategy) : "(searched)";
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ftplan::InputError& e) {
    return e.what();
  }
  return "no error";
}

bool has_ignored(const ConfigImport& imp, const std::string& key) {
  for (const auto& k : imp.ignored_keys)
    if (k.size() >= key.size() && k.compare(k.size() - key.size(), key.size(), key) == 0) return true;
  return false;
}

}  // namespace

TEST_CASE("YAML scalars are typed as PyYAML types them", "[import]") {
  const Json j = ftplan::yaml_to_json(
      "a: true\nb: yes\nc: False\nd: ~\ne:\nf: 2e-5\ng: 1.0e-4\nh: 500_000\ni: '2'\nj: \"true\"\nk: auto\nl: [1, x]\n"
      "m: {n: 3}\no: -7\n",
      "t.yml");
  CHECK(j["a"] == true);
  CHECK(j["b"] == true);
  CHECK(j["c"] == false);
  CHECK(j["d"].is_null());
  CHECK(j["e"].is_null());
  CHECK(j["f"].get<double>() == 2e-5);
  CHECK(j["g"].get<double>() == 1e-4);
  CHECK(j["h"] == 500000);
  CHECK(j["i"] == "2");
  CHECK(j["j"] == "true");
  CHECK(j["k"] == "auto");
  CHECK(j["l"] == Json::array({1, "x"}));
  CHECK(j["m"]["n"] == 3);
  CHECK(j["o"] == -7);
  CHECK_THAT(error_of([] { ftplan::yaml_to_json("a: [1,\nb: 2\n", "bad.yml"); }), Contains("bad.yml: line") && Contains("malformed YAML"));
}

TEST_CASE("Each shipped config is recognised as its kind", "[import]") {
  using K = ftplan::ConfigKind;
  const auto [path, kind] = GENERATE(table<std::string, K>({
      {"axolotl/examples/llama-3/qlora.yml", K::axolotl},
      {"axolotl/examples/archived/tiny-llama/pretrain.yml", K::axolotl},
      {"axolotl/deepspeed_configs/zero3_bf16.json", K::deepspeed},
      {"deepspeed/training/autotuning/hf/dsconfigs/ds_config_z2.json", K::deepspeed},
      {"accelerate/examples/config_yaml_templates/fsdp.yaml", K::accelerate},
      {"accelerate/examples/config_yaml_templates/multi_gpu.yaml", K::accelerate},
      {"accelerate/examples/deepspeed_config_templates/zero_stage3_offload_config.json", K::deepspeed},
      {"torchtune/recipes/configs/llama3_1/8B_lora.yaml", K::torchtune},
      {"llamafactory/examples/extras/fsdp_qlora/llama3_lora_sft.yaml", K::llamafactory},
      {"llamafactory/examples/deepspeed/ds_z3_config.json", K::deepspeed},
      {"alignment-handbook/recipes/zephyr-7b-beta/sft/config_qlora.yaml", K::hf_trainer},
      {"alignment-handbook/recipes/accelerate_configs/zero3.yaml", K::accelerate},
  }));
  CAPTURE(path);
  const ConfigImport imp = ftplan::read_config_files({data(path)});
  REQUIRE(!imp.files.empty());
  CHECK(imp.files.front().kind == kind);
}

TEST_CASE("An unknown file kind is refused naming the file", "[import][bad]") {
  const std::string path = temp_file("unknown.yaml", "foo: 1\nbar: [2]\n");
  CHECK_THAT(error_of([&] { ftplan::read_config_files({path}); }), Contains("unknown.yaml: unknown config kind"));
  CHECK_THAT(error_of([&] { ftplan::read_config_files({data("no-such-file.yml")}); }), Contains("--from: no such file"));
}

TEST_CASE("axolotl's QLoRA example maps every key it sets", "[import][axolotl]") {
  // axolotl examples/llama-3/qlora.yml: Llama-3-8B QLoRA r=32, seq 4096 packed, micro-batch 2 x 4, paged AdamW.
  const Imported r = import({data("axolotl/examples/llama-3/qlora.yml")}, "a100-80gb-sxm", {{"gpus", 4}});
  const TrainingSetup& s = r.setup;
  CHECK(s.model == "llama-3-8b");
  CHECK(s.method == ftplan::Method::qlora);
  CHECK(s.lora.rank == 32);
  CHECK(s.lora.alpha == 16);
  CHECK(s.lora.dropout == 0.05);
  CHECK(s.lora.all_linear);
  CHECK(s.seq_len == 4096);
  CHECK(s.packing);
  CHECK(s.micro_batch == 2);
  CHECK(s.grad_accum == 4);
  CHECK(s.epochs == 4);
  CHECK(s.optimizer == ftplan::Optimizer::adamw);
  CHECK(s.paged_optimizer);
  CHECK(s.learning_rate == 0.0002);
  CHECK(s.checkpointing == ftplan::Checkpointing::full);
  CHECK(s.attention == ftplan::Attention::fused);
  CHECK(s.framework == "hf");
  CHECK(s.precision == ftplan::Precision::amp);  // bf16: auto under the Trainer: the hf profile's convention
  CHECK(layout(s) == "ddp");                      // no deepspeed, no fsdp: DDP over the 4 GPUs
  // Every other non-empty key is listed, none dropped: the 13 keys that are not job settings.
  CHECK(r.imp.ignored_keys.size() == 13);
  for (const char* k : {"datasets", "evals_per_epoch", "logging_steps", "lr_scheduler", "model_type", "output_dir",
                        "saves_per_epoch", "special_tokens", "tf32", "tokenizer_type", "val_set_size", "warmup_ratio",
                        "weight_decay"})
    CHECK(has_ignored(r.imp, std::string("qlora.yml: ") + k));
}

TEST_CASE("axolotl with the DeepSpeed config it names reads both", "[import][axolotl][deepspeed]") {
  // examples/llama-3/lora-1b-ray.yml names deepspeed_configs/zero3.json (found in the folder above the YAML).
  const Imported r = import({data("axolotl/examples/llama-3/lora-1b-ray.yml")}, "a100-80gb-sxm", {{"gpus", 4}});
  REQUIRE(r.imp.files.size() == 2);
  CHECK(r.imp.files[1].kind == ftplan::ConfigKind::deepspeed);
  CHECK_THAT(r.imp.files[1].path, Contains("deepspeed_configs/zero3.json"));
  CHECK(r.setup.framework == "deepspeed");
  CHECK(layout(r.setup) == "zero3");
  CHECK(r.setup.model == "llama-3.2-1b");
  CHECK(r.setup.lora.targets == std::vector<std::string>{"gate_proj", "down_proj", "up_proj", "q_proj", "v_proj", "k_proj", "o_proj"});
  CHECK(r.setup.precision == ftplan::Precision::mixed);  // DeepSpeed's bf16: fp32 master weights and moments
  CHECK(r.setup.micro_batch == 2);                       // "auto" in zero3.json, filled from micro_batch_size
}

TEST_CASE("The CI pair: axolotl's TinyLlama pretrain with ZeRO-3, its length from max_steps", "[import][axolotl]") {
  const Imported r = import({data("axolotl/examples/archived/tiny-llama/pretrain.yml"), data("axolotl/deepspeed_configs/zero3_bf16.json")},
                            "a100-40gb-sxm", {{"gpus", 4}});
  const TrainingSetup& s = r.setup;
  CHECK(s.model == "tinyllama-1.1b");
  CHECK(s.method == ftplan::Method::full);
  CHECK(layout(s) == "zero3");
  CHECK(s.framework == "deepspeed");
  CHECK(s.optimizer == ftplan::Optimizer::adamw8bit);
  // max_steps 200 x micro-batch 2 x accumulation 4 x 4 GPUs x 2048 tokens; max_steps overrides num_epochs 4.
  CHECK(s.dataset.tokens == 200LL * 2 * 4 * 4 * 2048);
  CHECK(s.epochs == 1);
  CHECK(ftplan::job_tokens(s) == 13107200);
  CHECK(has_ignored(r.imp, "zero3_bf16.json: zero_optimization.stage3_prefetch_bucket_size"));
  CHECK(has_ignored(r.imp, "pretrain.yml: pretraining_dataset"));
}

TEST_CASE("DeepSpeed configs: ZeRO stage and offload become the layout", "[import][deepspeed]") {
  const auto [path, gpus, expected] = GENERATE(table<std::string, int, std::string>({
      {"axolotl/deepspeed_configs/zero1.json", 4, "zero1"},
      {"axolotl/deepspeed_configs/zero2.json", 4, "zero2_offload"},  // axolotl's zero2.json offloads the optimizer
      {"axolotl/deepspeed_configs/zero3.json", 8, "zero3"},
      {"axolotl/deepspeed_configs/zero3_bf16_cpuoffload_all.json", 8, "zero3_offload"},
      {"deepspeed/training/autotuning/hf/dsconfigs/ds_config_z2.json", 2, "zero2"},
      {"deepspeed/training/autotuning/hf/dsconfigs/ds_config_fp16_z3.json", 2, "zero3"},
      {"accelerate/examples/deepspeed_config_templates/zero_stage2_config.json", 2, "zero2"},
      {"accelerate/examples/deepspeed_config_templates/zero_stage3_offload_config.json", 2, "zero3_offload"},
      {"llamafactory/examples/deepspeed/ds_z2_offload_config.json", 4, "zero2_offload"},
  }));
  CAPTURE(path);
  const Imported r = import({data(path)}, "h100-sxm", {{"gpus", gpus}, {"model", "llama-3.2-1b"}});
  CHECK(layout(r.setup) == expected);
  CHECK(r.setup.framework == "deepspeed");
  // fp16 is planned with bf16's bytes, and says so.
  if (path.find("fp16") != std::string::npos) {
    REQUIRE(!r.imp.notes.empty());
    CHECK_THAT(r.imp.notes.front(), Contains("fp16.enabled true: fp16 planned as bf16"));
  }
}

TEST_CASE("DeepSpeed offload the planner cannot express is refused naming the key", "[import][deepspeed][bad]") {
  // zero3_bf16_cpuoffload_params.json offloads parameters but not the optimizer states.
  CHECK_THAT(error_of([] { ftplan::read_config_files({data("axolotl/deepspeed_configs/zero3_bf16_cpuoffload_params.json")}); }),
             Contains("zero3_bf16_cpuoffload_params.json: zero_optimization.offload_param"));
  // Parameter offload below stage 3.
  const std::string z2 = temp_file("z2_param.json", R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
      "offload_param": {"device": "cpu"}}})");
  CHECK_THAT(error_of([&] { ftplan::read_config_files({z2}); }),
             Contains("z2_param.json: zero_optimization.offload_param") && Contains("needs ZeRO stage 3"));
  CHECK_THAT(error_of([] { ftplan::read_config_files({data("deepspeed/training/tensor_parallel/hf_integration/configs/ds_config.json")}); }),
             Contains("ds_config.json: tensor_parallel.autotp_size"));
}

TEST_CASE("DeepSpeed's train_batch_size rule: micro-batch x accumulation x data-parallel GPUs", "[import][deepspeed]") {
  const std::string fixed = temp_file("tbs.json", R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4,
      "zero_optimization": {"stage": 2}})");
  // 64 = 4 x 2 x 8: the accumulation follows.
  const Imported r = import({fixed}, "h100-sxm", {{"gpus", 8}, {"model", "llama-3.2-1b"}});
  CHECK(r.setup.grad_accum == 2);
  CHECK(r.setup.micro_batch == 4);
  // On 4 GPUs with --grad-accum 1 it does not hold: refused naming the key and every operand.
  CHECK_THAT(error_of([&] { import({fixed}, "h100-sxm", {{"gpus", 4}, {"grad_accum", 1}, {"model", "llama-3.2-1b"}}); }),
             Contains("tbs.json: train_batch_size 64 != micro_batch 4 x grad_accum 1 x 4 data-parallel GPU(s) = 16"));
  // Only train_batch_size: micro-batch = 64 / 8 with accumulation 1, as DeepSpeed derives it.
  const std::string only = temp_file("tbs_only.json", R"({"train_batch_size": 64, "zero_optimization": {"stage": 1}})");
  CHECK(import({only}, "h100-sxm", {{"gpus", 8}, {"model", "llama-3.2-1b"}}).setup.micro_batch == 8);
}

TEST_CASE("accelerate configs: distributed type, processes, machines, FSDP options, parallelism_config", "[import][accelerate]") {
  SECTION("FSDP template") {
    const Imported r = import({data("accelerate/examples/config_yaml_templates/fsdp.yaml")}, "h100-sxm", {{"model", "llama-3.2-1b"}});
    CHECK(r.setup.num_gpus == 2);
    CHECK(r.setup.framework == "fsdp");
    CHECK(layout(r.setup) == "fsdp");
    CHECK(r.setup.checkpointing == ftplan::Checkpointing::none);  // fsdp_activation_checkpointing: false
    CHECK(has_ignored(r.imp, "fsdp.yaml: fsdp_config.fsdp_backward_prefetch"));
    CHECK(r.setup.state_dict == ftplan::StateDict::sharded);  // fsdp_state_dict_type: SHARDED_STATE_DICT
  }
  SECTION("axolotl's 70B QLoRA FSDP: fsdp_state_dict_type FULL_STATE_DICT") {
    const Imported r = import({data("axolotl/examples/llama-3/qlora-fsdp-70b.yaml")}, "h100-sxm");
    CHECK(r.setup.state_dict == ftplan::StateDict::full);
  }
  SECTION("multi-node DDP: 8 processes on 2 machines") {
    const Imported r = import({data("accelerate/examples/config_yaml_templates/multi_node.yaml")}, "h100-sxm", {{"model", "llama-3.2-1b"}});
    CHECK(r.setup.num_gpus == 8);
    CHECK(r.setup.nodes == 2);
    CHECK(r.setup.gpus_per_node == 4);
    CHECK(layout(r.setup) == "ddp");
  }
  SECTION("DeepSpeed through accelerate: the DeepSpeed file it names") {
    const Imported r = import({data("accelerate/examples/config_yaml_templates/deepspeed.yaml")}, "h100-sxm", {{"model", "llama-3.2-1b"}});
    REQUIRE(r.imp.files.size() == 2);
    CHECK_THAT(r.imp.files[1].path, Contains("zero_stage1_config.json"));
    CHECK(layout(r.setup) == "zero1");
    CHECK(r.setup.num_gpus == 2);
  }
  SECTION("torch-native N-D parallelism (accelerate examples/torch_native_parallelism)") {
    const Imported cp = import({data("accelerate/examples/torch_native_parallelism/configs/cp.yaml")}, "h100-sxm",
                               {{"model", "llama-3.2-1b"}, {"seq_len", 4096}});
    CHECK(layout(cp.setup) == "cp=8,cp_mode=all_gather,shard=fsdp");
    CHECK(cp.setup.fsdp_version == 2);
    CHECK(cp.setup.checkpointing == ftplan::Checkpointing::full);
    const Imported tp = import({data("accelerate/examples/torch_native_parallelism/configs/tp_hsdp.yaml")}, "h100-sxm", {{"model", "llama-3.2-1b"}});
    CHECK(layout(tp.setup) == "tp=2,dp_replicate=2,dp_shard=2,shard=fsdp");
  }
  SECTION("alignment-handbook: an accelerate ZeRO-3 config beside its TrainingArguments YAML") {
    const Imported r = import({data("alignment-handbook/recipes/zephyr-7b-beta/sft/config_qlora.yaml"),
                               data("alignment-handbook/recipes/accelerate_configs/zero3.yaml")},
                              "h100-sxm");
    CHECK(r.setup.model == "mistral-7b");
    CHECK(r.setup.method == ftplan::Method::qlora);
    CHECK(r.setup.num_gpus == 8);
    CHECK(layout(r.setup) == "zero3");  // the explicit ZeRO-3 wins over the Trainer's default DDP
    CHECK(r.setup.framework == "deepspeed");
    CHECK(r.setup.micro_batch == 4);
    CHECK(r.setup.seq_len == 2048);
  }
}

TEST_CASE("torchtune recipes: the model component gives model and method", "[import][torchtune]") {
  const Imported r = import({data("torchtune/recipes/configs/llama3_1/8B_lora.yaml")}, "a100-80gb-sxm", {{"gpus", 2}});
  const TrainingSetup& s = r.setup;
  CHECK(s.model == "llama-3.1-8b");
  CHECK(s.method == ftplan::Method::lora);
  CHECK(s.lora.rank == 8);
  CHECK(s.lora.alpha == 16);
  // lora_attn_modules [q_proj, v_proj, output_proj] + apply_lora_to_mlp: the MLP's three linears.
  CHECK(s.lora.targets == std::vector<std::string>{"q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"});
  CHECK(s.micro_batch == 2);
  CHECK(s.grad_accum == 8);
  CHECK(s.precision == ftplan::Precision::bf16);
  CHECK(s.checkpointing == ftplan::Checkpointing::none);
  CHECK(s.loss == ftplan::Loss::chunked);  // LinearCrossEntropyLoss, planned as chunked (noted)
  CHECK(s.framework == "torchtune");
  CHECK(layout(s) == "fsdp");  // lora_finetune_distributed shards with FSDP-2
  CHECK(has_ignored(r.imp, "8B_lora.yaml: checkpointer"));
  // On one GPU the single-device recipe.
  CHECK(layout(import({data("torchtune/recipes/configs/llama3_1/8B_qlora_single_device.yaml")}, "a100-80gb-sxm").setup) == "single");
  // 70B full fine-tuning with fsdp_cpu_offload: FSDP with parameters and optimizer states on the host.
  CHECK(layout(import({data("torchtune/recipes/configs/llama3_1/70B_full.yaml")}, "h100-sxm", {{"gpus", 8}}).setup) ==
        "dp_shard=8,shard=fsdp,offload=optimizer+params");
  CHECK_THAT(error_of([] { ftplan::read_config_files({data("torchtune/recipes/configs/llama3/8B_dora.yaml")}); }),
             Contains("8B_dora.yaml: model.use_dora"));
}

TEST_CASE("LLaMA-Factory YAML: its defaults where keys are absent", "[import][llamafactory]") {
  const Imported r = import({data("llamafactory/examples/extras/fsdp_qlora/llama3_lora_sft.yaml")}, "a100-80gb-sxm", {{"gpus", 2}});
  const TrainingSetup& s = r.setup;
  CHECK(s.model == "llama-3-8b-instruct");
  CHECK(s.method == ftplan::Method::qlora);  // quantization_bit: 4
  CHECK(s.lora.rank == 8);
  CHECK(s.lora.alpha == 16);                 // absent: 2 x lora_rank (hparams/finetuning_args.py)
  CHECK(s.lora.all_linear);                  // lora_target: all
  CHECK(s.checkpointing == ftplan::Checkpointing::full);  // LLaMA-Factory checkpoints unless disabled
  CHECK(s.dataset.rows == 2000);             // max_samples 1000 x 2 datasets (an upper bound, noted)
  CHECK(s.epochs == 3);
  CHECK(s.seq_len == 2048);
  // A model name the table lacks needs --model; the DeepSpeed file it names is found above the YAML.
  CHECK_THAT(error_of([] { import({data("llamafactory/examples/train_lora/qwen3_lora_sft_ds3.yaml")}, "h100-sxm"); }),
             Contains("qwen3_lora_sft_ds3.yaml: model_name_or_path: 'Qwen/Qwen3-4B-Instruct-2507'"));
  const Imported q = import({data("llamafactory/examples/train_lora/qwen3_lora_sft_ds3.yaml")}, "h100-sxm",
                            {{"model", "qwen3-8b"}, {"gpus", 4}});
  CHECK(layout(q.setup) == "zero3");
  CHECK(q.imp.files.size() == 2);
}

TEST_CASE("HF TrainingArguments read the same from YAML and JSON", "[import][hf]") {
  const std::string yaml = data("alignment-handbook/recipes/zephyr-7b-beta/sft/config_qlora.yaml");
  std::ifstream in(yaml);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string json = temp_file("training_args.json", ftplan::yaml_to_json(text, yaml).dump(2));
  const Imported a = import({yaml}, "h100-sxm", {{"gpus", 2}});
  const Imported b = import({json}, "h100-sxm", {{"gpus", 2}});
  CHECK(ftplan::training_setup_to_json(a.setup) == ftplan::training_setup_to_json(b.setup));
  CHECK(a.setup.model == "mistral-7b");
  CHECK(a.setup.method == ftplan::Method::qlora);  // use_peft + load_in_4bit
  CHECK(a.setup.lora.rank == 16);
  CHECK(a.setup.micro_batch == 4);
  CHECK(a.setup.grad_accum == 2);
  CHECK(a.setup.seq_len == 2048);
  CHECK(a.setup.seed == 42);
  CHECK(b.imp.files.front().kind == ftplan::ConfigKind::hf_trainer);
}

TEST_CASE("Two files that disagree are refused naming both", "[import][bad]") {
  const std::string ds = temp_file("ds_mb4.json", R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3}})");
  CHECK_THAT(error_of([&] { ftplan::read_config_files({data("axolotl/examples/llama-3/qlora.yml"), ds}); }),
             Contains("qlora.yml: micro_batch_size 2 disagrees with") && Contains("ds_mb4.json: train_micro_batch_size_per_gpu 4"));
  // The same value twice is not a contradiction.
  const std::string same = temp_file("ds_mb2.json", R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}})");
  CHECK_NOTHROW(ftplan::read_config_files({data("axolotl/examples/llama-3/qlora.yml"), same}));
  // Precision: bf16 in the YAML, fp32 in the DeepSpeed config.
  const std::string fp32 = temp_file("ds_fp32.json", R"({"bf16": {"enabled": false}, "zero_optimization": {"stage": 2}})");
  CHECK_THAT(error_of([&] { ftplan::read_config_files({data("axolotl/examples/llama-3/qlora.yml"), fp32}); }),
             Contains("qlora.yml: bf16 auto (bf16) disagrees with") && Contains("ds_fp32.json: bf16.enabled false (fp32)"));
  // Frameworks: a torchtune recipe with a DeepSpeed config.
  CHECK_THAT(error_of([&] { ftplan::read_config_files({data("torchtune/recipes/configs/llama3_1/8B_lora.yaml"), same}); }),
             Contains("8B_lora.yaml") && Contains("disagrees with") && Contains("ds_mb2.json"));
  // Layouts: ZeRO-3 and FSDP.
  CHECK_THAT(error_of([&] {
               ftplan::read_config_files({data("accelerate/examples/config_yaml_templates/fsdp.yaml"), data("axolotl/deepspeed_configs/zero1.json")});
             }),
             Contains("disagrees"));
}

TEST_CASE("A flag that contradicts a file is refused naming both; an equal one is fine", "[import][bad]") {
  const std::string qlora = data("axolotl/examples/llama-3/qlora.yml");
  CHECK_THAT(error_of([&] { import({qlora}, "h100-sxm", {{"micro_batch", 4}}); }),
             Contains("--micro-batch 4 contradicts") && Contains("qlora.yml: micro_batch_size 2"));
  CHECK_NOTHROW(import({qlora}, "h100-sxm", {{"micro_batch", 2}}));
  CHECK_THAT(error_of([&] { import({qlora}, "h100-sxm", {{"model", "llama-3.1-8b"}}); }),
             Contains("--model llama-3.1-8b contradicts") && Contains("base_model NousResearch/Meta-Llama-3-8B"));
  CHECK_THAT(error_of([&] { import({qlora}, "h100-sxm", {{"lora.targets", "q_proj,v_proj"}}); }), Contains("lora_target_linear"));
  CHECK_THAT(error_of([&] { import({data("axolotl/deepspeed_configs/zero3.json")}, "h100-sxm", {{"model", "llama-3.2-1b"}, {"gpus", 4}, {"strategy", "fsdp"}}); }),
             Contains("--strategy fsdp contradicts") && Contains("zero3.json: zero_optimization.stage"));
  // A layout flag over a file that names none (the Trainer's DDP is a default, not the file's value) is used.
  CHECK(layout(import({qlora}, "h100-sxm", {{"gpus", 4}, {"strategy", "fsdp"}}).setup) == "fsdp");
  CHECK_THAT(error_of([&] { import({qlora}, "h100-sxm", {{"precision", "mixed"}}); }),
             Contains("--precision mixed contradicts") && Contains("qlora.yml: bf16 auto"));
}

TEST_CASE("A value of the wrong type is refused naming the file and key", "[import][bad]") {
  const std::string a = temp_file("wrong_mb.yml", "base_model: meta-llama/Llama-3.1-8B\nmicro_batch_size: four\n");
  CHECK_THAT(error_of([&] { ftplan::read_config_files({a}); }), Contains("wrong_mb.yml: micro_batch_size: expected a whole number"));
  const std::string b = temp_file("wrong_pack.yml", "base_model: meta-llama/Llama-3.1-8B\nsample_packing: maybe\n");
  CHECK_THAT(error_of([&] { ftplan::read_config_files({b}); }), Contains("wrong_pack.yml: sample_packing: expected true or false"));
  const std::string c = temp_file("wrong_stage.json", R"({"zero_optimization": {"stage": "three"}})");
  CHECK_THAT(error_of([&] { ftplan::read_config_files({c}); }), Contains("wrong_stage.json: zero_optimization.stage: expected a whole number"));
  const std::string d = temp_file("wrong_range.yml", "base_model: meta-llama/Llama-3.1-8B\nsequence_len: 0\n");
  CHECK_THAT(error_of([&] { ftplan::read_config_files({d}); }), Contains("wrong_range.yml: sequence_len: 0 is out of range"));
  CHECK_THAT(error_of([] { ftplan::read_config_files({data("axolotl/examples/llama-3/lora-8b.yml")}); }), Contains("lora-8b.yml: load_in_8bit"));
}

TEST_CASE("A framework error names the file key that asked for it", "[import][bad]") {
  // Activation offloading under the Hugging Face Trainer (hf profile: no activation offload).
  const std::string f = temp_file("offload.yml", "base_model: meta-llama/Llama-3.2-1B\nactivation_offloading: true\n");
  CHECK_THAT(error_of([&] { import({f}, "h100-sxm"); }), Contains("--activation-offload"));
  const ConfigImport imp = ftplan::read_config_files({f});
  CHECK(ftplan::config_origins_in(imp, "--activation-offload: --framework hf has no activation offloading") ==
        " (from " + f + ": activation_offloading; " + f + ": (axolotl runs the Hugging Face Trainer))");
}

TEST_CASE("Launch scripts give the topology", "[import][scripts]") {
  const std::string sbatch = temp_file("job.sbatch",
                                       "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gpus-per-node=8\n#SBATCH --time=0-02:00:00\n"
                                       "srun torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d \\\n  train.py --x 1\n");
  const Imported r = import({sbatch}, "h100-sxm", {{"model", "llama-3.2-1b"}});
  CHECK(r.setup.num_gpus == 16);
  CHECK(r.setup.nodes == 2);
  CHECK(r.setup.gpus_per_node == 8);
  CHECK(has_ignored(r.imp, "#SBATCH --time"));
  const std::string bad = temp_file("bad.sh", "#!/bin/bash\ntorchrun --nnodes=2 --nproc_per_node=x8 train.py\n");
  CHECK_THAT(error_of([&] { ftplan::read_config_files({bad}); }), Contains("bad.sh: torchrun --nproc_per_node: expected a whole number"));
}

TEST_CASE("model_names.json: every entry names a shipped model config", "[import][models]") {
  const Json j = ftplan::read_json_file(std::string(FTPLAN_SOURCE_DIR) + "/configs/import/model_names.json");
  std::set<std::string> ids;
  for (const char* section : {"hf", "torchtune"})
    for (const auto& row : j.at(section)) {
      const std::string model = row.at("model");
      CAPTURE(model);
      CHECK_NOTHROW(ftplan::resolve_data_file(model, "configs/models", "model"));
      const std::string id = row.contains("id") ? row.at("id").get<std::string>() : row.at("builder").get<std::string>();
      CHECK(ids.insert(id).second);  // no name twice
    }
  CHECK(ftplan::model_for_hf_id("META-LLAMA/llama-3.1-8b-instruct") == std::optional<std::string>("llama-3.1-8b"));
  CHECK(!ftplan::model_for_hf_id("meta-llama/Llama-9-1T"));
  const auto tt = ftplan::model_for_torchtune_component("torchtune.models.llama3_2.qlora_llama3_2_3b");
  REQUIRE(tt);
  CHECK(tt->model == "llama-3.2-3b");
  CHECK(tt->method == ftplan::Method::qlora);
  CHECK(ftplan::hf_id_for_model("llama-3.1-8b") == std::optional<std::string>("meta-llama/Llama-3.1-8B"));
}

// The job file (configs/jobs/X.json), shared by ftplan and ftexec: a round trip through JSON,
// bad input rejected with the field named, LoRA target lists and the job's token count.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/data_paths.h"
#include "planner/errors.h"
#include "planner/json_fields.h"
#include "planner/training_setup.h"

using Catch::Matchers::Contains;

namespace {

nlohmann::json job_json(const std::string& name) {
  return ftplan::read_json_file(ftplan::data_dir() + "/configs/jobs/" + name + ".json");
}

nlohmann::json minimal() { return {{"model", "llama-3-8b"}}; }

}  // namespace

TEST_CASE("job files round-trip through training_setup_to_json", "[job]") {
  const auto name = GENERATE(as<std::string>{}, "tinyllama-lora-4x-rtx6000ada", "codellama-34b-lora-4x-rtx6000ada",
                             "llama-3-8b-instruct-lora-a100-40gb");
  CAPTURE(name);
  const auto a = ftplan::training_setup_from_json(job_json(name), name);
  const auto j = ftplan::training_setup_to_json(a);
  const auto b = ftplan::training_setup_from_json(j, name + " (round trip)");
  CHECK(ftplan::training_setup_to_json(b) == j);
  CHECK(b.model == a.model);
  CHECK(b.gpu == a.gpu);
  CHECK(b.num_gpus == a.num_gpus);
  CHECK(b.method == a.method);
  CHECK(b.lora.rank == a.lora.rank);
  CHECK(b.lora.alpha == a.lora.alpha);
  CHECK(b.lora.targets == a.lora.targets);
  CHECK(b.precision == a.precision);
  CHECK(b.seq_len == a.seq_len);
  CHECK(b.micro_batch == a.micro_batch);
  CHECK(b.grad_accum == a.grad_accum);
  CHECK(b.epochs == a.epochs);
  CHECK(b.dataset.rows == a.dataset.rows);
  CHECK(b.dataset.mean_tokens_per_row == a.dataset.mean_tokens_per_row);
  CHECK(b.strategy == a.strategy);
  CHECK(ftplan::job_tokens(b) == ftplan::job_tokens(a));
}

TEST_CASE("a job with every optional field round-trips", "[job]") {
  nlohmann::json j = {{"model", "mistral-7b"},
                      {"gpu", "h100-sxm"},
                      {"gpus", 8},
                      {"method", "qlora"},
                      {"lora", {{"rank", 64}, {"alpha", 16}, {"dropout", 0.05}, {"targets", "all-linear"}}},
                      {"precision", "bf16"},
                      {"optimizer", "adamw8bit"},
                      {"paged_optimizer", true},
                      {"seq_len", 4096},
                      {"micro_batch", 2},
                      {"grad_accum", 8},
                      {"checkpointing", "full"},
                      {"attention", "eager"},
                      {"strategy", "fsdp_shard_grad_op"},
                      {"efficiency", 0.4},
                      {"dataset", {{"tokens", 123456789}}},
                      {"epochs", 3},
                      {"headroom_fraction", 0.1},
                      {"steps", 7},
                      {"learning_rate", 2e-4},
                      {"seed", 42},
                      {"data", "synthetic"},
                      {"device", "cpu"}};
  const auto a = ftplan::training_setup_from_json(j, "job");
  CHECK(a.method == ftplan::Method::qlora);
  CHECK(a.lora.rank == 64);
  CHECK(a.lora.alpha == 16);
  CHECK(a.lora.targets.size() == 7);
  CHECK(a.optimizer == ftplan::Optimizer::adamw8bit);
  CHECK(a.paged_optimizer);
  CHECK(a.checkpointing == ftplan::Checkpointing::full);
  CHECK(a.attention == ftplan::Attention::eager);
  CHECK(a.strategy == ftplan::Strategy::fsdp_shard_grad_op);
  CHECK(a.efficiency == 0.4);
  CHECK(a.device == "cpu");
  const auto out = ftplan::training_setup_to_json(a);
  const auto b = ftplan::training_setup_from_json(out, "job (round trip)");
  CHECK(ftplan::training_setup_to_json(b) == out);
  CHECK(b.lora.dropout == 0.05);
  CHECK(b.headroom_fraction == 0.1);
  CHECK(b.seed == 42);
  CHECK(b.steps == 7);
  CHECK(ftplan::job_tokens(b) == 3 * 123456789LL);
}

TEST_CASE("bad job files name the field", "[job]") {
  SECTION("unknown key") {
    auto j = minimal();
    j["micro_bacth"] = 4;
    CHECK_THROWS_AS(ftplan::training_setup_from_json(j, "job.json"), ftplan::InputError);
    CHECK_THROWS_WITH(ftplan::training_setup_from_json(j, "job.json"), Contains("micro_bacth") && Contains("job.json"));
  }
  SECTION("unknown key inside lora and dataset") {
    auto j = minimal();
    j["lora"] = {{"rnak", 8}};
    CHECK_THROWS_WITH(ftplan::training_setup_from_json(j, "job.json"), Contains("rnak"));
    auto d = minimal();
    d["dataset"] = {{"rows", 10}, {"colums", 3}};
    CHECK_THROWS_WITH(ftplan::training_setup_from_json(d, "job.json"), Contains("colums"));
  }
  SECTION("zero or negative sizes") {
    auto [field, value] = GENERATE(table<std::string, int>({{"micro_batch", -1}, {"micro_batch", 0}, {"seq_len", 0},
                                                             {"gpus", -4}, {"grad_accum", 0}, {"epochs", -1}}));
    CAPTURE(field, value);
    auto j = minimal();
    j[field] = value;
    CHECK_THROWS_AS(ftplan::training_setup_from_json(j, "job.json"), ftplan::InputError);
    CHECK_THROWS_WITH(ftplan::training_setup_from_json(j, "job.json"), Contains(field));
  }
  SECTION("wrong type") {
    auto j = minimal();
    j["seq_len"] = "2048";
    CHECK_THROWS_WITH(ftplan::training_setup_from_json(j, "job.json"), Contains("seq_len"));
  }
  SECTION("missing model") {
    CHECK_THROWS_WITH(ftplan::training_setup_from_json(nlohmann::json::object(), "job.json"), Contains("model"));
  }
  SECTION("a bad enum lists the accepted values") {
    auto j = minimal();
    j["method"] = "lorax";
    CHECK_THROWS_WITH(ftplan::training_setup_from_json(j, "job.json"),
                      Contains("method") && Contains("lorax") && Contains("full, lora, qlora"));
    auto s = minimal();
    s["strategy"] = "deepspeed";
    CHECK_THROWS_WITH(ftplan::training_setup_from_json(s, "job.json"),
                      Contains("strategy") && Contains("ddp") && Contains("zero3") && Contains("fsdp"));
    auto p = minimal();
    p["precision"] = "fp16";
    CHECK_THROWS_WITH(ftplan::training_setup_from_json(p, "job.json"),
                      Contains("precision") && Contains("mixed, mixed-fp32-grads, amp, bf16, fp32"));
  }
  SECTION("a bad LoRA target names the list's field and the accepted modules") {
    auto j = minimal();
    j["lora"] = {{"targets", {"q_proj", "c_attn"}}};
    CHECK_THROWS_WITH(ftplan::training_setup_from_json(j, "job.json"),
                      Contains("targets") && Contains("c_attn") && Contains("all-linear"));
  }
  SECTION("a dataset needs rows or tokens") {
    auto j = minimal();
    j["dataset"] = nlohmann::json::object();
    CHECK_THROWS_WITH(ftplan::training_setup_from_json(j, "job.json"), Contains("dataset"));
  }
}

TEST_CASE("LoRA target lists", "[job]") {
  const auto all = ftplan::parse_lora_targets("all-linear", "--lora-targets");
  CHECK(all == std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"});
  CHECK(ftplan::parse_lora_targets("q_proj,v_proj", "--lora-targets") == std::vector<std::string>{"q_proj", "v_proj"});
  // Duplicates are dropped.
  CHECK(ftplan::parse_lora_targets("q_proj,q_proj,o_proj", "x").size() == 2);
  CHECK_THROWS_WITH(ftplan::parse_lora_targets("", "--lora-targets"), Contains("--lora-targets"));
  // PEFT's default for Llama.
  CHECK(ftplan::LoraSpec{}.targets == std::vector<std::string>{"q_proj", "v_proj"});
}

TEST_CASE("tokens a job processes", "[job]") {
  ftplan::TrainingSetup s;
  s.seq_len = 1024;
  SECTION("rows x mean tokens per row x epochs") {
    // The Llama-3-8B seed job: 10,000 records x 512 tokens x 10 epochs = 51,200,000.
    const auto seed = ftplan::training_setup_from_json(job_json("llama-3-8b-instruct-lora-a100-40gb"), "seed");
    CHECK(ftplan::job_tokens(seed) == 51'200'000);
  }
  SECTION("rows padded to seq_len when no mean is given") {
    s.dataset.rows = 1024;
    s.epochs = 2;
    CHECK(ftplan::job_tokens(s) == 1024 * 1024 * 2);
  }
  SECTION("tokens given directly") {
    s.dataset.tokens = 5'000'000;
    s.epochs = 3;
    CHECK(ftplan::job_tokens(s) == 15'000'000);
  }
  SECTION("no dataset: zero") { CHECK(ftplan::job_tokens(s) == 0); }
}

// Run logs as the stacks write them (tests/data/logs/, each with its source in SOURCES.md): the
// figures read equal what the file says (hand-checked below), and `compare` holds them against a
// plan of the same model and shape, with a "missing" row for each figure the log lacks.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "planner/compare_report.h"
#include "planner/errors.h"
#include "planner/framework.h"
#include "planner/hardware_spec.h"
#include "planner/model_spec.h"
#include "planner/plan_report.h"
#include "planner/plan_search.h"
#include "planner/run_logs.h"
#include "planner/training_setup.h"

using Catch::Matchers::Contains;
using Catch::Matchers::WithinRel;

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string data(const std::string& name) { return std::string(FTPLAN_SOURCE_DIR) + "/tests/data/logs/" + name; }

// The plan file `ftplan plan -o` writes for this job (without -o's check that ftexec can run it:
// these runs are compared, not executed).
nlohmann::json plan_for(const nlohmann::json& job) {
  ftplan::TrainingSetup s = ftplan::training_setup_from_json(job, "test job");
  ftplan::apply_framework(s, ftplan::framework_profile(s.framework));
  const ftplan::ModelSpec model = ftplan::load_model(s.model);
  const ftplan::HardwareSpec hw = ftplan::load_hardware(s.gpu);
  const ftplan::PlanResult r = ftplan::plan_job(model, hw, s, ftplan::Objective::time);
  REQUIRE(r.recommended);
  return ftplan::plan_file_json(model, hw, s, *r.recommended);
}

// anonymousgigachad/llm-training train.py: TinyLlama-1.1B-Chat, 4-bit NF4 (QLoRA), LoRA r=8
// alpha 16 on q_proj,v_proj (adapter_config.json), per-device batch 2, accumulation 4, rows padded
// to 512 tokens, one GPU. The GPU is not in the file: an L4 is assumed.
nlohmann::json hf_job() {
  return {{"model", "tinyllama-1.1b"}, {"framework", "hf"},    {"gpu", "l4"},        {"gpus", 1},
          {"method", "qlora"},         {"lora", {{"rank", 8}, {"alpha", 16}, {"targets", {"q_proj", "v_proj"}}}},
          {"seq_len", 512},            {"micro_batch", 2},     {"grad_accum", 4},    {"strategy", "single"}};
}

// torchtune recipes/configs/code_llama2/7B_full_low_memory.yaml @8bb3a6f0 (the config of the logged
// run): CodeLlama-7B full fine-tuning, batch 2, bf16, activation checkpointing, PagedAdamW with the
// optimizer in backward, one device. Alpaca rows are padded per batch (no max_seq_len): 512 tokens
// assumed; the GPU is not in the log: an A100 80GB is assumed.
nlohmann::json torchtune_job() {
  return {{"model", data("codellama-7b-hf.config.json")},
          {"framework", "torchtune"},
          {"gpu", "a100-80gb-sxm"},
          {"gpus", 1},
          {"method", "full"},
          {"precision", "bf16"},
          {"paged_optimizer", true},
          {"optimizer_in_backward", true},
          {"seq_len", 512},
          {"micro_batch", 2},
          {"checkpointing", "full"},
          {"strategy", "single"}};
}

const nlohmann::json& row(const nlohmann::json& c, const std::string& figure) {
  for (const auto& r : c["rows"])
    if (r["figure"] == figure) return r;
  FAIL("no row " << figure << " in " << c["rows"].dump());
  static nlohmann::json none;
  return none;
}

bool has_row(const nlohmann::json& c, const std::string& figure) {
  for (const auto& r : c["rows"])
    if (r["figure"] == figure) return true;
  return false;
}

bool lacks(const ftplan::RunLog& log, const std::string& figure) {
  return std::find(log.missing.begin(), log.missing.end(), figure) != log.missing.end();
}

}  // namespace

TEST_CASE("an HF Trainer trainer_state.json: runtime per step, samples/s, loss per step", "[runlogs]") {
  const ftplan::RunLog log = ftplan::read_run_log(data("hf_tinyllama_qlora_trainer_state.json"));
  CHECK(log.format == "hf-trainer-state");
  CHECK(log.framework.empty());  // the Trainer drives hf, deepspeed and fsdp: the plan's profile
  // Hand-checked from the file: train_runtime 472.0904 s over global_step 45; 0.763 samples/s.
  REQUIRE(log.step_time_s);
  CHECK_THAT(*log.step_time_s, WithinRel(472.0904 / 45, 1e-12));
  REQUIRE(log.samples_per_s);
  CHECK(*log.samples_per_s == 0.763);
  REQUIRE(log.loss.size() == 4);
  CHECK(log.loss.front() == std::make_pair(int64_t{10}, 8.3368));
  CHECK(log.loss.back() == std::make_pair(int64_t{40}, 0.427));
  CHECK(log.candidate["micro_batch"] == 2);  // train_batch_size
  CHECK(lacks(log, "allocated"));
  CHECK(lacks(log, "reserved"));
  CHECK(lacks(log, "device"));
  CHECK_FALSE(lacks(log, "step_time_s"));
  CHECK_FALSE(lacks(log, "tokens_per_s"));

  const nlohmann::json plan = plan_for(hf_job());
  const auto c = ftplan::compare_run_log(plan, log);
  const auto& p = plan["predicted"];
  CHECK_THAT(row(c, "step_time_s")["measured"].get<double>(), WithinRel(472.0904 / 45, 1e-12));
  CHECK(row(c, "step_time_s")["predicted"] == p["step_time_s"]);
  // tokens/s = 0.763 samples/s x the plan's 512 tokens per sample.
  CHECK_THAT(row(c, "tokens_per_s")["measured"].get<double>(), WithinRel(0.763 * 512, 1e-12));
  for (const char* figure : {"peak allocated (max_memory_allocated)", "peak reserved (max_memory_reserved)",
                             "device memory (nvidia-smi)"}) {
    CAPTURE(figure);
    CHECK(row(c, figure)["missing"] == true);
    CHECK(row(c, figure)["measured"].is_null());
  }
  CHECK(row(c, "peak allocated (max_memory_allocated)")["predicted"] == p["memory_per_gpu_bytes"]["allocated_peak"]);
  CHECK(row(c, "peak reserved (max_memory_reserved)")["predicted"] == p["memory_per_gpu_bytes"]["reserved_peak"]);
  CHECK(row(c, "device memory (nvidia-smi)")["predicted"] == p["memory_per_gpu_bytes"]["device_peak"]);
  CHECK_THAT(c["notes"].dump(), Contains("names no model") && Contains("not in the log: allocated, reserved, device"));
  CHECK(c["run"]["loss"].size() == 4);
  const std::string table = ftplan::compare_table(c);
  CHECK_THAT(table, Contains("missing") && Contains("10.491 s"));
}

TEST_CASE("HF trainer_state.json: a plan of another micro-batch is refused, naming it, unless forced", "[runlogs]") {
  const ftplan::RunLog log = ftplan::read_run_log(data("hf_tinyllama_qlora_trainer_state.json"));
  nlohmann::json job = hf_job();
  job["micro_batch"] = 4;
  const nlohmann::json plan = plan_for(job);
  CHECK_THROWS_AS(ftplan::compare_run_log(plan, log), ftplan::InputError);
  CHECK_THROWS_WITH(ftplan::compare_run_log(plan, log),
                    Contains("hf_tinyllama_qlora_trainer_state.json") && Contains("micro_batch: plan 4, measured 2") &&
                        Contains("--force"));
  const auto forced = ftplan::compare_run_log(plan, log, true);
  CHECK(forced["differences"].size() == 1);
  CHECK_THAT(forced["notes"][0].get<std::string>(), Contains("although the run differs"));
}

TEST_CASE("a torchtune metric log: tokens/s per GPU and loss; no memory, no step time", "[runlogs]") {
  const ftplan::RunLog log = ftplan::read_run_log(data("torchtune_codellama7b_full_low_memory.log"));
  CHECK(log.format == "torchtune-log");
  CHECK(log.framework == "torchtune");
  CHECK(log.steps_logged == 12);
  REQUIRE(log.loss.size() == 12);
  CHECK(log.loss.front() == std::make_pair(int64_t{1}, 2.085338592529297));
  CHECK(log.loss.back() == std::make_pair(int64_t{12}, 1.1174635887145996));
  // Median of steps 2..12 (11 values), hand-sorted: the 6th is step 4's 417.49818620797487.
  REQUIRE(log.tokens_per_s_per_gpu);
  CHECK(*log.tokens_per_s_per_gpu == 417.49818620797487);
  for (const char* figure : {"allocated", "reserved", "device", "step_time_s"}) {
    CAPTURE(figure);
    CHECK(lacks(log, figure));
  }
  CHECK_FALSE(lacks(log, "tokens_per_s"));

  const nlohmann::json plan = plan_for(torchtune_job());
  const auto c = ftplan::compare_run_log(plan, log);
  CHECK(row(c, "tokens_per_s")["measured"] == 417.49818620797487);  // x 1 GPU
  CHECK(row(c, "tokens_per_s")["predicted"] == plan["predicted"]["tokens_per_s"]);
  CHECK(row(c, "step_time_s")["missing"] == true);
  CHECK(row(c, "peak allocated (max_memory_allocated)")["missing"] == true);
  CHECK(row(c, "peak reserved (max_memory_reserved)")["missing"] == true);
  CHECK_FALSE(has_row(c, "peak active (vs allocated)"));
  CHECK_THAT(c["notes"].dump(), Contains("label tokens") && Contains("log_peak_memory_stats was off"));
}

TEST_CASE("a torchtune log with peak memory: the largest of each figure, active against allocated", "[runlogs]") {
  SECTION("GiB, torchtune's unit since PR #1348 (the default)") {
    const ftplan::RunLog log = ftplan::read_run_log(data("torchtune_mps_llama31_8b_full.log"));
    REQUIRE(log.allocated_peak_bytes);
    REQUIRE(log.reserved_peak_bytes);
    REQUIRE(log.active_peak_bytes);
    // Hand-checked: step 6 holds the largest alloc/reserved, step 6 the largest active.
    CHECK_THAT(*log.allocated_peak_bytes, WithinRel(57.90928649902344 * kGiB, 1e-12));
    CHECK_THAT(*log.reserved_peak_bytes, WithinRel(57.90928649902344 * kGiB, 1e-12));
    CHECK_THAT(*log.active_peak_bytes, WithinRel(47.32488775253296 * kGiB, 1e-12));
    // Median of steps 2..6: 23.67, 40.13, 45.42, 45.71, 55.78.
    CHECK(*log.tokens_per_s_per_gpu == 45.4216423034668);
    CHECK(lacks(log, "device"));
    CHECK(lacks(log, "step_time_s"));

    nlohmann::json job = {{"model", "llama-3.1-8b"}, {"framework", "torchtune"}, {"method", "full"},
                          {"precision", "bf16"},     {"gpu", "h100-96gb-hbm2e"}, {"seq_len", 2048},
                          {"micro_batch", 1},        {"checkpointing", "full"},  {"strategy", "single"}};
    const nlohmann::json plan = plan_for(job);
    const auto c = ftplan::compare_run_log(plan, log);
    const auto& m = plan["predicted"]["memory_per_gpu_bytes"];
    CHECK(row(c, "peak active (vs allocated)")["predicted"] == m["allocated_peak"]);
    CHECK(row(c, "peak allocated (max_memory_allocated)")["predicted"] == m["allocated_peak"]);
    CHECK(row(c, "peak reserved (max_memory_reserved)")["predicted"] == m["reserved_peak"]);
    CHECK(row(c, "device memory (nvidia-smi)")["missing"] == true);
  }
  SECTION("GB (1e9) when asked") {
    ftplan::RunLogOptions o;
    o.torchtune_memory_unit = "gb";
    const ftplan::RunLog log = ftplan::read_run_log(data("torchtune_mps_llama31_8b_full.log"), o);
    CHECK_THAT(*log.allocated_peak_bytes, WithinRel(57.90928649902344e9, 1e-12));
  }
  SECTION("the log says which: its memory-stats lines, or a log_<time> name from before 2024-08-15") {
    const std::string step = "Step 1 | loss:1.5 peak_memory_alloc:2.0 peak_memory_reserved:3.0 \n";
    auto alloc = [&](const std::string& text, const std::string& name) {
      return *ftplan::parse_run_log(text, name).allocated_peak_bytes;
    };
    CHECK(alloc("INFO:x:Memory stats after model init:\n\tGPU peak memory allocation: 2.52 GB\n" + step, "a.txt") == 2e9);
    CHECK(alloc("\tGPU peak memory allocation: 2.52 GiB\n" + step, "a.txt") == 2 * kGiB);
    CHECK(alloc(step, "out/logs/log_1715000000.txt") == 2e9);  // 2024-05-06
    CHECK(alloc(step, "out/logs/log_1730294718.txt") == 2 * kGiB);
    CHECK(alloc("Writing logs to /tmp/logs/log_1715000000.txt\n" + step, "copy.txt") == 2e9);
  }
  SECTION("DiskLogger jsonl and tensor-valued metrics") {
    const auto log = ftplan::parse_run_log(
        "{\"step\": 1, \"loss\": 2.0, \"tokens_per_second_per_gpu\": 100.0}\n"
        "{\"step\": 2, \"loss\": 1.5, \"tokens_per_second_per_gpu\": 300.0, \"peak_memory_alloc\": 1.0}\n",
        "log_1750000000.jsonl");
    CHECK(log.format == "torchtune-log");
    CHECK(*log.tokens_per_s_per_gpu == 300.0);
    CHECK(*log.allocated_peak_bytes == kGiB);
    const auto t = ftplan::parse_run_log("Step 3 | loss:1.25 tokens_per_second_per_gpu:tensor(812.5, device='cuda:0') \n",
                                         "x.txt");
    CHECK(*t.tokens_per_s_per_gpu == 812.5);
    CHECK(t.loss.at(0) == std::make_pair(int64_t{3}, 1.25));
  }
  SECTION("a unit other than auto, gib or gb is refused") {
    ftplan::RunLogOptions o;
    o.torchtune_memory_unit = "mb";
    CHECK_THROWS_WITH(ftplan::read_run_log(data("torchtune_mps_llama31_8b_full.log"), o),
                      Contains("--torchtune-memory-unit"));
  }
}

TEST_CASE("DeepSpeed's see_memory_usage and ThroughputTimer lines", "[runlogs]") {
  SECTION("see_memory_usage: allocated = the largest Max_MA, reserved = the largest of CA and Max_CA") {
    const ftplan::RunLog log = ftplan::read_run_log(data("deepspeed_see_memory_usage.log"));
    CHECK(log.format == "deepspeed-log");
    CHECK(log.framework == "deepspeed");
    CHECK_THAT(*log.allocated_peak_bytes, WithinRel(5.31 * kGiB, 1e-12));
    CHECK_THAT(*log.reserved_peak_bytes, WithinRel(7.0 * kGiB, 1e-12));  // Max_CA 7 > CA 6.68
    CHECK(lacks(log, "step_time_s"));
    CHECK(lacks(log, "tokens_per_s"));
    CHECK(lacks(log, "loss"));
  }
  SECTION("ThroughputTimer (the 2022 format): the last running average of samples/s, MaxMemAllocated") {
    const ftplan::RunLog log = ftplan::read_run_log(data("deepspeed_throughput_timer.log"));
    CHECK(*log.samples_per_s == 83.73838805358588);
    CHECK_THAT(*log.allocated_peak_bytes, WithinRel(9.02 * kGiB, 1e-12));
    CHECK(lacks(log, "reserved"));
    // Compared with a plan: step time = the plan's samples per step / samples/s.
    nlohmann::json job = {{"model", "llama-3.2-1b"}, {"framework", "deepspeed"}, {"gpu", "a100-80gb-sxm"},
                          {"gpus", 2},               {"method", "full"},        {"seq_len", 512},
                          {"micro_batch", 4},        {"grad_accum", 2},         {"strategy", "zero2"}};
    const nlohmann::json plan = plan_for(job);
    const auto c = ftplan::compare_run_log(plan, log);
    // 4 x 2 x 2 = 16 samples per step; 512 tokens per sample.
    CHECK_THAT(row(c, "step_time_s")["measured"].get<double>(), WithinRel(16 / 83.73838805358588, 1e-9));
    CHECK_THAT(row(c, "tokens_per_s")["measured"].get<double>(), WithinRel(83.73838805358588 * 512, 1e-12));
  }
  SECTION("wall_clock_breakdown: fwd + bwd + step of each optimizer step, median after the first") {
    const auto log = ftplan::parse_run_log(
        "[2024-01-01 00:00:01,000] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | fwd: 900.00 | bwd: 1800.00 | "
        "bwd_inner: 1700.00 | bwd_allreduce: 100.00 | step: 300.00\n"
        "[2024-01-01 00:00:02,000] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | fwd_microstep: 100.00 | "
        "bwd_microstep: 200.00 | step_microstep: 30.00\n"
        "[2024-01-01 00:00:03,000] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | fwd: 100.00 | bwd: 200.00 | "
        "bwd_inner: 190.00 | bwd_allreduce: 10.00 | step: 30.00\n",
        "ds.log");
    CHECK_THAT(*log.step_time_s, WithinRel(0.33, 1e-12));
  }
}

TEST_CASE("accelerate's TorchTracemalloc lines: the train peak in MiB, not the eval one", "[runlogs]") {
  const ftplan::RunLog log = ftplan::read_run_log(data("accelerate_peft_tracemalloc.log"));
  CHECK(log.format == "accelerate-log");
  CHECK(log.framework.empty());  // the plan's profile
  CHECK(*log.allocated_peak_bytes == 9404.0 * 1024 * 1024);
  CHECK(lacks(log, "reserved"));
  CHECK(lacks(log, "tokens_per_s"));
}

TEST_CASE("plain CSV and JSON with the documented columns", "[runlogs]") {
  SECTION("CSV: medians after the first row, the largest memory") {
    const auto log = ftplan::parse_run_log(
        "step,loss,step_time_s,tokens_per_s,max_memory_allocated_gib,max_memory_reserved_bytes,device_memory_bytes\n"
        "1,2.5,9.0,100,10,12000000000,\n"
        "2,2.0,2.0,400,11,13000000000,14000000000\n"
        "3,1.5,4.0,200,10.5,12500000000,\n",
        "run.csv");
    CHECK(log.format == "plain-csv");
    CHECK(*log.step_time_s == 3.0);
    CHECK(*log.tokens_per_s == 300.0);
    CHECK(*log.allocated_peak_bytes == 11 * kGiB);
    CHECK(*log.reserved_peak_bytes == 13e9);
    CHECK(*log.device_peak_bytes == 14e9);
    CHECK(log.loss.size() == 3);
    CHECK(log.missing.empty());
  }
  SECTION("CSV: an undocumented column or a bad cell is named") {
    CHECK_THROWS_WITH(ftplan::parse_run_log("step,step_time,max_memory_allocated_bytes\n1,2,3\n", "run.csv"),
                      Contains("run.csv") && Contains("step_time") && Contains("step_time_s"));
    CHECK_THROWS_WITH(ftplan::parse_run_log("step,step_time_s\n1,fast\n", "run.csv"),
                      Contains("line 2") && Contains("step_time_s"));
  }
  SECTION("JSON with a job: the job check applies and names every field") {
    const std::string text = R"({"job": {"model": "tinyllama-1.1b", "method": "qlora", "seq_len": 1024},
      "candidate": {"micro_batch": 2}, "steps": [{"step": 1, "step_time_s": 12.0}, {"step": 2, "step_time_s": 10.0}],
      "max_memory_reserved_gib": 5.5})";
    const auto log = ftplan::parse_run_log(text, "run.json");
    CHECK(log.format == "plain-json");
    CHECK(*log.step_time_s == 10.0);
    CHECK(*log.reserved_peak_bytes == 5.5 * kGiB);
    CHECK_THROWS_WITH(ftplan::compare_run_log(plan_for(hf_job()), log),
                      Contains("run.json") && Contains("seq_len: plan 512, measured 1024"));
    CHECK_THROWS_WITH(ftplan::parse_run_log(R"({"step_time_s": 1, "peak_mem": 2})", "run.json"), Contains("peak_mem"));
  }
  SECTION("ranks of one job: the most loaded rank's memory, the slowest step") {
    std::vector<ftplan::RunLog> ranks = {
        ftplan::parse_run_log("step,step_time_s,max_memory_reserved_gib\n1,1.0,10\n2,1.0,10\n", "rank0.csv"),
        ftplan::parse_run_log("step,step_time_s,max_memory_reserved_gib\n1,1.0,12\n2,1.2,12\n", "rank1.csv")};
    const auto merged = ftplan::merge_rank_logs(ranks);
    CHECK(merged.path == "rank1.csv");
    CHECK(*merged.reserved_peak_bytes == 12 * kGiB);
    CHECK(*merged.step_time_s == 1.2);
  }
}

TEST_CASE("the format is read from the content: ftexec's measured.json; anything else is refused", "[runlogs]") {
  const auto ftexec = ftplan::parse_run_log(R"({"format": "ftexec-measured/1", "ranks": [], "framework": "ftexec"})",
                                            "trainer_state.json");  // the name does not matter
  CHECK(ftexec.format == "ftexec-measured/1");
  CHECK(ftexec.framework == "ftexec");
  const auto hf_named_txt = ftplan::read_run_log(data("hf_tinyllama_qlora_trainer_state.json"));
  CHECK(hf_named_txt.format == "hf-trainer-state");

  CHECK_THROWS_AS(ftplan::parse_run_log("hello\nworld\n", "garbage.txt"), ftplan::InputError);
  CHECK_THROWS_WITH(ftplan::parse_run_log("hello\nworld\n", "garbage.txt"),
                    Contains("garbage.txt") && Contains("unknown run-log format"));
  CHECK_THROWS_WITH(ftplan::parse_run_log("{\"a\": 1}", "x.json"), Contains("x.json") && Contains("no known run-log format"));
  CHECK_THROWS_WITH(ftplan::parse_run_log("{\"a\": ", "x.json"), Contains("malformed JSON"));
  CHECK_THROWS_WITH(ftplan::parse_run_log("", "empty.log"), Contains("empty"));
  CHECK_THROWS_WITH(ftplan::read_run_log(data("no-such-file.log")), Contains("cannot open"));
  // A figure no run can have is refused, named.
  CHECK_THROWS_WITH(ftplan::parse_run_log("step,step_time_s\n1,2e9\n", "run.csv"),
                    Contains("run.csv") && Contains("step time") && Contains("out of range"));
}

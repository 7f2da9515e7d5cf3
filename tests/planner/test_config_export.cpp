// ftplan export (issue 15, item 2): a plan written in each target's keys, read back with --from,
// is the same job; what a target cannot express is refused naming the target and the key.
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/config_export.h"
#include "planner/config_import.h"
#include "planner/errors.h"
#include "planner/framework.h"
#include "planner/hardware_spec.h"
#include "planner/job_fields.h"
#include "planner/plan_report.h"
#include "planner/plan_search.h"
#include "planner/training_setup.h"

using Catch::Matchers::Contains;
using ftplan::ExportTarget;
using Json = nlohmann::json;

namespace {

// The plan file `ftplan plan JOB -o plan.json` writes for a job given as job-file keys.
Json plan_file(const Json& job_keys, double job_time_tokens = 1e7) {
  Json j = job_keys;
  if (!j.contains("dataset")) j["dataset"] = {{"tokens", static_cast<int64_t>(job_time_tokens)}};
  ftplan::TrainingSetup s = ftplan::training_setup_from_json(j, "job");
  ftplan::HardwareSpec hw = ftplan::load_hardware(s.gpu);
  ftplan::apply_topology(s, hw);
  ftplan::apply_framework(s, ftplan::framework_profile(s.framework));
  const ftplan::ModelSpec model = ftplan::load_model(s.model);
  ftplan::apply_model(s, model);
  const ftplan::PlanResult plan = ftplan::plan_job(model, hw, s, ftplan::Objective::time);
  REQUIRE(plan.recommended);
  return ftplan::plan_file_json(model, hw, s, *plan.recommended);
}

std::string write(const std::string& name, const std::string& text) {
  const std::string path = std::string(FTPLAN_BINARY_DIR) + "/config_export_" + name;
  std::ofstream(path) << text;
  return path;
}

// The job keys of a setup, flattened ("lora.rank"), as a job file and flags would give them.
std::map<std::string, Json> flat(const ftplan::TrainingSetup& s) {
  std::map<std::string, Json> out;
  const Json j = ftplan::training_setup_to_json(s);
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it->is_object())
      for (auto sub = it->begin(); sub != it->end(); ++sub) out[it.key() + "." + sub.key()] = *sub;
    else
      out[it.key()] = *it;
  }
  return out;
}

// Export `plan` to `target`, read the file back with --from, giving as flags only what the target does
// not carry (export_carried_keys), and return the job it makes beside the plan's own.
struct RoundTrip {
  ftplan::TrainingSetup planned, read_back;
  ftplan::Parallelism planned_layout, read_layout;
  std::string text;
};
RoundTrip round_trip(const Json& plan, ExportTarget target, const std::vector<std::string>& extra_flags = {}) {
  RoundTrip r;
  const ftplan::ExportPlan p = ftplan::export_plan_from_json(plan, "plan.json");
  r.planned = p.job;
  r.planned_layout = p.layout;
  const ftplan::ExportResult out = ftplan::export_plan(p, target);
  r.text = out.text;
  const std::string ext = target == ExportTarget::deepspeed ? "json" : target == ExportTarget::torchrun ? "sh"
                          : target == ExportTarget::slurm   ? "sbatch" : "yaml";
  const std::string path = write(ftplan::to_string(target) + "." + ext, out.text);
  std::vector<std::string> carried = ftplan::export_carried_keys(p, target);
  for (const auto& k : extra_flags) carried.erase(std::remove(carried.begin(), carried.end(), k), carried.end());
  const auto is_carried = [&](const std::string& key) {
    for (const auto& c : carried)
      if (key == c || key.rfind(c + ".", 0) == 0) return true;
    return false;
  };
  // A fresh setup with the keys the target does not carry given as flags.
  ftplan::TrainingSetup s;
  std::map<std::string, ftplan::GivenValue> given;
  for (const auto& [key, value] : flat(p.job)) {
    if (is_carried(key) || key == "nodes" || key == "gpus_per_node") continue;
    const ftplan::FieldSpec& f = ftplan::field_by_key(key);
    ftplan::apply_job_field(s, f, value, f.flag);
    given[key] = {value, std::string(f.flag)};
  }
  ftplan::ConfigImport imp = ftplan::read_config_files({path});
  ftplan::apply_config_values(s, imp, given);
  ftplan::HardwareSpec hw = ftplan::load_hardware(s.gpu);
  ftplan::apply_topology(s, hw);
  ftplan::apply_config_rules(s, imp, hw, given);
  ftplan::apply_framework(s, ftplan::framework_profile(s.framework));
  const ftplan::ModelSpec model = ftplan::load_model(s.model);
  ftplan::apply_model(s, model);
  r.read_back = s;
  r.read_layout = s.parallel ? *s.parallel : ftplan::preset(*s.strategy, s.num_gpus, hw.gpus_per_node);
  return r;
}

// The same job: every job key equal, the layout equal as degrees (fsdp_hybrid on one node is fsdp),
// the topology equal as GPUs (a single-node launch leaves nodes unset).
void require_same_job(const RoundTrip& r) {
  Json a = ftplan::training_setup_to_json(r.planned), b = ftplan::training_setup_to_json(r.read_back);
  for (const char* k : {"strategy", "parallel", "nodes", "gpus_per_node"}) a.erase(k), b.erase(k);
  // An FSDP config names the state dict type; a plan without --state-dict assumed the full one it writes.
  if (!a.contains("state_dict") && b.value("state_dict", "") == "full") b.erase("state_dict");
  INFO(r.text);
  CHECK(a.dump(1) == b.dump(1));
  CHECK(ftplan::to_string(r.planned_layout) == ftplan::to_string(r.read_layout));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ftplan::InputError& e) {
    return e.what();
  }
  return "no error";
}

const Json kLoraDs = {{"model", "llama-3.1-8b"}, {"framework", "deepspeed"}, {"gpu", "a100-80gb-sxm"}, {"gpus", 8},
                      {"method", "lora"}, {"lora", {{"rank", 32}, {"alpha", 64}, {"dropout", 0.05}, {"targets", "all-linear"}}},
                      {"seq_len", 2048}, {"micro_batch", 4}, {"grad_accum", 2}, {"checkpointing", "full"},
                      {"strategy", "zero3"}, {"learning_rate", 2e-4}, {"seed", 7}, {"packing", true}};

}  // namespace

TEST_CASE("Round trip: ZeRO-3 LoRA through every target that carries it", "[export][roundtrip]") {
  const Json plan = plan_file(kLoraDs);
  for (ExportTarget t : {ExportTarget::deepspeed, ExportTarget::accelerate, ExportTarget::axolotl, ExportTarget::llamafactory,
                         ExportTarget::torchrun, ExportTarget::slurm}) {
    CAPTURE(ftplan::to_string(t));
    require_same_job(round_trip(plan, t));
  }
}

TEST_CASE("Round trip: precisions, offload, optimizers and knobs", "[export][roundtrip]") {
  SECTION("ZeRO-2 offload with fp32 gradient accumulation, 8-bit paged AdamW, Liger's fused loss") {
    Json job = kLoraDs;
    job["strategy"] = "zero2_offload";
    job["precision"] = "mixed-fp32-grads";
    job["optimizer"] = "adamw8bit";
    job["paged_optimizer"] = true;
    job["loss"] = "fused-linear";
    const Json plan = plan_file(job);
    for (ExportTarget t : {ExportTarget::deepspeed, ExportTarget::axolotl, ExportTarget::llamafactory}) {
      CAPTURE(ftplan::to_string(t));
      require_same_job(round_trip(plan, t));
    }
  }
  SECTION("ZeRO-3 offload, torch.autocast over fp32 weights (amp), full fine-tuning") {
    Json job = kLoraDs;
    job.erase("lora");
    job["method"] = "full";
    job["model"] = "llama-3.2-1b";
    job["strategy"] = "zero3_offload";
    job["precision"] = "amp";
    const Json plan = plan_file(job);
    for (ExportTarget t : {ExportTarget::deepspeed, ExportTarget::axolotl, ExportTarget::llamafactory, ExportTarget::accelerate}) {
      CAPTURE(ftplan::to_string(t));
      if (t == ExportTarget::accelerate) {  // accelerate's mixed_precision bf16 is the profile's mixed, not amp
        CHECK_THAT(error_of([&] { round_trip(plan, t); }), Contains("--to accelerate: precision amp"));
        continue;
      }
      require_same_job(round_trip(plan, t));
    }
  }
  SECTION("pure bf16 under DeepSpeed (bf16 master weights and optimizer states)") {
    Json job = kLoraDs;
    job["precision"] = "bf16";
    require_same_job(round_trip(plan_file(job), ExportTarget::deepspeed));
  }
  SECTION("QLoRA with FSDP-2 and CPU offload (the fsdp profile), eager attention, compiled") {
    const Json job = {{"model", "llama-3.1-8b"}, {"framework", "fsdp"}, {"gpu", "h100-sxm"}, {"gpus", 4},
                      {"method", "qlora"}, {"lora", {{"rank", 16}, {"alpha", 16}, {"targets", Json::array({"q_proj", "k_proj", "v_proj", "o_proj"})}}},
                      {"seq_len", 1024}, {"micro_batch", 2}, {"grad_accum", 4}, {"checkpointing", "full"}, {"fsdp_version", 2},
                      {"attention", "eager"}, {"compile", true}, {"parallel", "dp_shard=4,shard=fsdp,offload=optimizer+params"}};
    const Json plan = plan_file(job);
    for (ExportTarget t : {ExportTarget::accelerate, ExportTarget::axolotl, ExportTarget::llamafactory}) {
      CAPTURE(ftplan::to_string(t));
      require_same_job(round_trip(plan, t));
    }
  }
  SECTION("FSDP-1 saving sharded checkpoints (--state-dict sharded): the state dict type travels") {
    const Json job = {{"model", "llama-3.1-8b"}, {"framework", "fsdp"}, {"gpu", "h100-sxm"}, {"gpus", 4}, {"method", "lora"},
                      {"seq_len", 1024}, {"micro_batch", 2}, {"checkpointing", "full"}, {"fsdp_version", 1},
                      {"state_dict", "sharded"}, {"strategy", "fsdp"}};
    const Json plan = plan_file(job);
    for (ExportTarget t : {ExportTarget::accelerate, ExportTarget::axolotl, ExportTarget::llamafactory}) {
      CAPTURE(ftplan::to_string(t));
      const RoundTrip r = round_trip(plan, t);
      CHECK_THAT(r.text, Contains("SHARDED_STATE_DICT"));
      REQUIRE(r.read_back.state_dict);
      CHECK(*r.read_back.state_dict == ftplan::StateDict::sharded);
      require_same_job(r);
    }
  }
  SECTION("DDP under the Hugging Face Trainer, no checkpointing, fp32") {
    const Json job = {{"model", "llama-3.2-1b"}, {"framework", "hf"}, {"gpu", "h100-sxm"}, {"gpus", 4}, {"method", "lora"},
                      {"seq_len", 512}, {"micro_batch", 8}, {"checkpointing", "none"}, {"precision", "fp32"}, {"strategy", "ddp"}};
    const Json plan = plan_file(job);
    for (ExportTarget t : {ExportTarget::accelerate, ExportTarget::axolotl, ExportTarget::llamafactory, ExportTarget::deepspeed}) {
      CAPTURE(ftplan::to_string(t));
      if (t == ExportTarget::deepspeed) {
        // DeepSpeed's stage 0 runs as the deepspeed profile, which the plan was not made for: noted, not refused.
        const ftplan::ExportResult out = ftplan::export_plan(ftplan::export_plan_from_json(plan, "plan.json"), t);
        REQUIRE(!out.notes.empty());
        CHECK_THAT(out.notes.front(), Contains("the plan was made for the hf profile; this deepspeed config runs as deepspeed"));
        continue;
      }
      require_same_job(round_trip(plan, t));
    }
  }
  SECTION("torchtune: LoRA with FSDP-2, activation offloading, the chunked loss; one GPU: the single-device recipe") {
    const Json job = {{"model", "llama-3.1-8b"}, {"framework", "torchtune"}, {"gpu", "a100-80gb-sxm"}, {"gpus", 2},
                      {"method", "lora"}, {"lora", {{"rank", 8}, {"alpha", 16}, {"targets", Json::array({"q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})}}},
                      {"seq_len", 2048}, {"micro_batch", 2}, {"grad_accum", 8}, {"checkpointing", "full"},
                      {"activation_offload", true}, {"strategy", "fsdp"}};
    require_same_job(round_trip(plan_file(job), ExportTarget::torchtune));
    Json one = job;
    one["gpus"] = 1;
    one["strategy"] = "single";
    one["method"] = "qlora";
    one["optimizer"] = "adamw8bit";
    one["paged_optimizer"] = true;
    require_same_job(round_trip(plan_file(one), ExportTarget::torchtune));
    // 70B full fine-tuning with fsdp_cpu_offload on 8 GPUs.
    Json big = {{"model", "llama-3.1-70b"}, {"framework", "torchtune"}, {"gpu", "h100-sxm"}, {"gpus", 8}, {"method", "full"},
                {"seq_len", 1024}, {"micro_batch", 1}, {"checkpointing", "full"}, {"parallel", "dp_shard=8,shard=fsdp,offload=optimizer+params"}};
    require_same_job(round_trip(plan_file(big), ExportTarget::torchtune));
  }
  SECTION("compositions (what ftplan plan --json holds): FSDP-2 with tensor parallelism through accelerate, torchtune") {
    const Json acc = {{"model", "llama-3.2-1b"}, {"framework", "fsdp"}, {"gpu", "h100-sxm"}, {"gpus", 8}, {"method", "full"},
                      {"seq_len", 2048}, {"micro_batch", 2}, {"checkpointing", "full"}, {"fsdp_version", 2},
                      {"parallel", "tp=2,dp_replicate=2,dp_shard=2,shard=fsdp"}};
    require_same_job(round_trip(plan_file(acc), ExportTarget::accelerate));
    const Json tt = {{"model", "llama-3.2-1b"}, {"framework", "torchtune"}, {"gpu", "h100-sxm"}, {"gpus", 8}, {"method", "full"},
                     {"seq_len", 2048}, {"micro_batch", 2}, {"checkpointing", "full"}, {"parallel", "tp=2,sp=1,dp_shard=4"}};
    require_same_job(round_trip(plan_file(tt), ExportTarget::torchtune));
  }
  SECTION("two nodes: torchrun and sbatch carry nodes and GPUs per node") {
    Json job = kLoraDs;
    job["gpus"] = 16;
    job["gpu"] = "h100-sxm";
    const Json plan = plan_file(job);
    for (ExportTarget t : {ExportTarget::torchrun, ExportTarget::slurm, ExportTarget::accelerate}) {
      CAPTURE(ftplan::to_string(t));
      const RoundTrip r = round_trip(plan, t);
      require_same_job(r);
      CHECK(r.read_back.nodes == 2);
      CHECK(r.read_back.gpus_per_node == 8);
    }
  }
}

TEST_CASE("DeepSpeed's batch rule and ZeRO keys in the exported config", "[export][deepspeed]") {
  const ftplan::ExportPlan p = ftplan::export_plan_from_json(plan_file(kLoraDs), "plan.json");
  const Json ds = Json::parse(ftplan::export_plan(p, ExportTarget::deepspeed).text);
  CHECK(ds["train_batch_size"] == 4 * 2 * 8);  // micro-batch x accumulation x GPUs
  CHECK(ds["train_micro_batch_size_per_gpu"] == 4);
  CHECK(ds["gradient_accumulation_steps"] == 2);
  CHECK(ds["zero_optimization"]["stage"] == 3);
  CHECK(!ds["zero_optimization"].contains("offload_param"));
  CHECK(ds["bf16"]["enabled"] == true);
}

TEST_CASE("A target that cannot express the plan refuses, naming target and key", "[export][bad]") {
  const auto refusal = [](const Json& job, ExportTarget t) {
    return error_of([&] { ftplan::export_plan(ftplan::export_plan_from_json(plan_file(job), "plan.json"), t); });
  };
  Json fsdp = kLoraDs;
  fsdp["framework"] = "fsdp";
  fsdp["strategy"] = "fsdp";
  CHECK_THAT(refusal(fsdp, ExportTarget::deepspeed), Contains("--to deepspeed: strategy fsdp: DeepSpeed shards with ZeRO"));
  CHECK_THAT(refusal(kLoraDs, ExportTarget::torchtune), Contains("--to torchtune: strategy zero3"));
  Json tp = kLoraDs;
  tp.erase("lora");
  tp["method"] = "full";
  tp["model"] = "llama-3.2-1b";
  tp["framework"] = "hf";
  tp.erase("strategy");
  tp["parallel"] = "tp=2,dp_shard=4,shard=fsdp";
  CHECK_THAT(refusal(tp, ExportTarget::axolotl), Contains("--to axolotl: parallel tp=2,dp_shard=4,shard=fsdp") && Contains("AutoTP"));
  Json offload = kLoraDs;
  offload["framework"] = "torchtune";
  offload["strategy"] = "fsdp";
  offload["activation_offload"] = true;
  offload["precision"] = "bf16";
  CHECK_THAT(refusal(offload, ExportTarget::llamafactory), Contains("--to llamafactory: activation_offload true"));
  // A plan file edited to offload parameters under ZeRO-2: the plan loads, DeepSpeed cannot express it.
  Json plan = plan_file(kLoraDs);
  plan["job"].erase("strategy");
  plan["job"]["parallel"] = "dp_shard=8,shard=zero2,offload=optimizer+params";
  CHECK_THAT(error_of([&] { ftplan::export_plan(ftplan::export_plan_from_json(plan, "plan.json"), ExportTarget::deepspeed); }),
             Contains("--to deepspeed: zero_optimization.offload_param") && Contains("needs ZeRO stage 3 (stage 2)"));
  // No dataset, no job time: no Slurm time limit.
  Json no_time = plan_file(kLoraDs);
  no_time["predicted"]["job_time_s"] = nullptr;
  CHECK_THAT(error_of([&] { ftplan::export_plan(ftplan::export_plan_from_json(no_time, "plan.json"), ExportTarget::slurm); }),
             Contains("--to slurm: dataset"));
  CHECK_THAT(error_of([] { ftplan::parse_export_target("megatron", "--to"); }), Contains("--to: 'megatron' is not one of deepspeed"));
  CHECK_THAT(error_of([] { ftplan::export_plan_from_json(Json{{"x", 1}}, "p.json"); }), Contains("p.json: not a plan"));
}

TEST_CASE("Slurm time limits round up to the minute", "[export][slurm]") {
  CHECK(ftplan::slurm_time(95) == "0-00:02:00");
  CHECK(ftplan::slurm_time(120) == "0-00:02:00");
  CHECK(ftplan::slurm_time(0.5) == "0-00:01:00");
  CHECK(ftplan::slurm_time(26 * 3600 + 3 * 60) == "1-02:03:00");
  // The script's limit is the plan's job time x 1.25, whole minutes.
  Json plan = plan_file(kLoraDs);
  plan["predicted"]["job_time_s"] = 3600.0;
  const std::string text = ftplan::export_plan(ftplan::export_plan_from_json(plan, "plan.json"), ExportTarget::slurm).text;
  CHECK_THAT(text, Contains("#SBATCH --time=0-01:15:00"));
  CHECK_THAT(text, Contains("#SBATCH --nodes=1") && Contains("#SBATCH --gpus-per-node=8"));
}

#include "executor/exec_job.h"

#include <algorithm>

#include "executor/strategy.h"
#include "planner/data_paths.h"
#include "planner/errors.h"
#include "planner/json_fields.h"

namespace ftexec {

ftplan::TrainingSetup setup_from_plan(const nlohmann::json& plan, const std::string& where) {
  if (!plan.is_object()) ftplan::fail_input(where + ": expected a JSON object");
  const std::string format = ftplan::read_string_or(plan, "format", "", where);
  if (format != "ftplan-plan/1")
    ftplan::fail_input(where + ": format \"" + format + "\" is not \"ftplan-plan/1\" (write it with `ftplan plan -o`)");
  if (!plan.contains("job")) ftplan::fail_input(where + ": no \"job\" object");
  ftplan::TrainingSetup setup = ftplan::training_setup_from_json(plan.at("job"), where + ": job");
  if (plan.contains("candidate")) {
    const auto& c = plan.at("candidate");
    const std::string cw = where + ": candidate";
    if (!c.is_object()) ftplan::fail_input(cw + ": expected an object");
    ftplan::require_known_keys(c, {"strategy", "micro_batch", "checkpointing", "attention", "gpus"}, cw);
    if (c.contains("strategy")) setup.strategy = ftplan::parse_strategy(ftplan::read_string(c, "strategy", cw), cw + ": strategy");
    if (c.contains("micro_batch")) setup.micro_batch = ftplan::read_int(c, "micro_batch", cw);
    if (c.contains("checkpointing"))
      setup.checkpointing = ftplan::parse_checkpointing(ftplan::read_string(c, "checkpointing", cw), cw + ": checkpointing");
    if (c.contains("attention"))
      setup.attention = ftplan::parse_attention(ftplan::read_string(c, "attention", cw), cw + ": attention");
    if (c.contains("gpus")) setup.num_gpus = ftplan::read_int(c, "gpus", cw);
  }
  return setup;
}

ExecJob make_exec_job(const ftplan::TrainingSetup& setup_in, const std::string& device) {
  ExecJob job;
  job.setup = setup_in;
  auto& s = job.setup;
  job.device = device.empty() ? s.device : device;
  if (job.device == "cuda") job.device = "cuda:0";
  s.device = job.device.substr(0, 4) == "cuda" ? "cuda" : job.device;
  if (!s.micro_batch) s.micro_batch = 1;
  if (!s.checkpointing) s.checkpointing = ftplan::Checkpointing::none;
  if (!s.strategy) s.strategy = ftplan::Strategy::single;
  if (!s.attention) s.attention = ftplan::Attention::eager;

  std::vector<std::string> problems;
  if (job.device != "cpu" && job.device.rfind("cuda:", 0) != 0)
    problems.push_back("--device: \"" + job.device + "\" is not cpu or cuda[:N]");
  {
    using S = ftplan::Strategy;
    const S st = *s.strategy;
    if (!(st == S::single || dist_strategy_supported(st)))
      problems.push_back("strategy " + ftplan::to_string(st) +
                         ": not run by ftexec (single, ddp, zero1, zero2, zero2_offload, zero3, zero3_offload, fsdp, "
                         "fsdp_shard_grad_op, fsdp_hybrid, mp, pipeline (GPipe), pipeline_1f1b)");
  }
  if (s.precision == ftplan::Precision::mixed_fp32_grads)
    problems.push_back("precision mixed_fp32_grads: not supported by ftexec (fp32, bf16, mixed)");
  if (s.optimizer != ftplan::Optimizer::adamw)
    problems.push_back("optimizer " + ftplan::to_string(s.optimizer) + ": ftexec implements adamw only");
  if (s.paged_optimizer) problems.push_back("paged_optimizer: not supported by ftexec");
  if (s.steps < 1) problems.push_back("--steps: must be at least 1");
  if (s.grad_accum < 1) problems.push_back("--grad-accum: must be at least 1");
  if (s.seq_len < 1) problems.push_back("--seq-len: must be at least 1");
  try {
    job.model_config_path = ftplan::resolve_data_file(s.model, "configs/models", "--model");
    const std::string stem = s.model.find('/') == std::string::npos ? s.model : job.model_config_path;
    job.model = ftplan::model_spec_from_json(ftplan::read_json_file(job.model_config_path), stem);
  } catch (const ftplan::InputError& e) {
    problems.push_back(e.what());
  }
  if (job.model.max_position_embeddings > 0 && s.seq_len > job.model.max_position_embeddings &&
      job.model.rope_scaling.type.empty())
    problems.push_back("--seq-len " + std::to_string(s.seq_len) + " exceeds the model's max_position_embeddings (" +
                       std::to_string(job.model.max_position_embeddings) + ")");
  if (!problems.empty()) {
    std::string msg;
    for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
    ftplan::fail_input(msg);
  }
  job.warmup_steps = std::min<int64_t>(job.warmup_steps, s.steps - 1);
  return job;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace ftexec

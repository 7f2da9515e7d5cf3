#include "executor/exec_job.h"

#include <algorithm>

#include "planner/data_paths.h"
#include "planner/hardware_spec.h"
#include "planner/errors.h"
#include "planner/framework.h"
#include "planner/job_fields.h"
#include "planner/json_fields.h"

namespace ftexec {

ftplan::TrainingSetup setup_from_plan(const nlohmann::json& plan, const std::string& where) {
  if (!plan.is_object()) ftplan::fail_input(where + ": expected a JSON object");
  const std::string format = ftplan::read_string_or(plan, "format", "", where);
  if (format.empty() && plan.contains("model") && !plan.contains("job"))
    return ftplan::training_setup_from_json(plan, where);  // a job file (configs/jobs/X.json)
  if (format != "ftplan-plan/1")
    ftplan::fail_input(where + ": format \"" + format +
                       "\" is not \"ftplan-plan/1\" (write it with `ftplan plan -o`, or give a job file)");
  if (!plan.contains("job")) ftplan::fail_input(where + ": no \"job\" object");
  ftplan::TrainingSetup setup = ftplan::training_setup_from_json(plan.at("job"), where + ": job");
  if (plan.contains("candidate")) {
    // The chosen candidate's fields are job fields: read through the same table.
    const auto& c = plan.at("candidate");
    const std::string cw = where + ": candidate";
    if (!c.is_object()) ftplan::fail_input(cw + ": expected an object");
    ftplan::require_known_keys(c, {"strategy", "parallel", "micro_batch", "checkpointing", "attention", "activation_offload", "gpus"}, cw);
    for (auto it = c.begin(); it != c.end(); ++it) {
      // "parallel" describes the layout the job's strategy or parallel key already fixes; a
      // composition's "strategy" is its --parallel string, not a preset.
      if (it.key() == "parallel" || (it.key() == "strategy" && setup.parallel)) continue;
      ftplan::apply_job_field(setup, ftplan::field_by_key(it.key()), *it, cw + ": " + it.key());
    }
    // The plan's exchange mode, explicit (its canonical string leaves out the default, ring).
    if (setup.parallel && setup.parallel->cp > 1 && setup.parallel_text.find("cp_mode=") == std::string::npos) {
      const auto mode = c.contains("parallel") && c["parallel"].is_object() ? c["parallel"].value("cp_mode", "ring") : "ring";
      setup.parallel_text += ",cp_mode=" + mode;
      setup.parallel = ftplan::parse_parallelism(setup.parallel_text, cw + ": strategy");
    }
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
  // A --parallel layout equal to a preset is named by it (measured.json's candidate); the layout
  // itself runs as given (exec_parallelism), and what ftexec cannot run is refused below.
  // cp without cp_mode= exchanges as ftexec does (configs/frameworks/ftexec.json: all_gather).
  if (s.parallel && s.parallel->cp > 1 && s.parallel_text.find("cp_mode=") == std::string::npos)
    s.parallel->cp_mode = ftplan::framework_profile("ftexec").cp_mode;
  if (!s.strategy && s.parallel)
    if (const auto p = ftplan::preset_of(*s.parallel)) s.strategy = *p;
  if (!s.strategy) s.strategy = ftplan::Strategy::single;
  if (!s.attention) s.attention = ftplan::Attention::eager;

  std::vector<std::string> problems;
  if (job.device != "cpu" && job.device.rfind("cuda:", 0) != 0)
    problems.push_back("--device: \"" + job.device + "\" is not cpu or cuda[:N]");
  try {
    job.model_config_path = ftplan::resolve_data_file(s.model, "configs/models", "--model");
    const std::string stem = s.model.find('/') == std::string::npos ? s.model : job.model_config_path;
    job.model = ftplan::model_spec_from_json(ftplan::read_json_file(job.model_config_path), stem);
    for (const auto& p : ftplan::exec_problems(s, job.model)) problems.push_back(p);
    ftplan::validate_job(s, job.model);
  } catch (const ftplan::InputError& e) {
    problems.push_back(e.what());
  }
  if (!problems.empty()) {
    std::string msg;
    for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
    ftplan::fail_input(msg);
  }
  job.warmup_steps = std::min<int64_t>(job.warmup_steps, s.steps - 1);
  return job;
}

ftplan::Parallelism exec_parallelism(const ExecJob& job, int world, int64_t shard_group_size) {
  const ftplan::TrainingSetup& s = job.setup;
  ftplan::Parallelism p;
  std::string field, hint;
  if (s.parallel) {
    p = *s.parallel;
    field = "--parallel " + ftplan::to_string(p);
  } else {
    const ftplan::Strategy strategy = s.strategy.value_or(ftplan::Strategy::single);
    // The ranks of one node: fsdp_hybrid shards inside it (the planner's min(N, gpus_per_node)).
    const bool own = shard_group_size > 0;
    const int64_t per_node = own ? shard_group_size
                                 : s.gpus_per_node ? *s.gpus_per_node : ftplan::load_hardware(s.gpu).gpus_per_node;
    p = ftplan::preset(strategy, world, per_node);
    field = "--strategy " + ftplan::to_string(strategy);
    if (p.shards_params() && p.dp_shard < world)
      hint = " (shard groups of " + std::to_string(p.dp_shard) + " ranks: " +
             (own ? std::string("--shard-group-size") : s.gpus_per_node ? std::string("--gpus-per-node")
                                                                       : "gpus_per_node of hwdb/" + s.gpu + ".json") +
             ")";
  }
  std::vector<std::string> problems;
  if (p.gpus() != world) {
    auto d = [](const char* k, int64_t v) { return std::string(k) + "(" + std::to_string(v) + ")"; };
    problems.push_back(d("dp_replicate", p.dp_replicate) + " * " + d("dp_shard", p.dp_shard) + " * " + d("cp", p.cp) +
                       " * " + d("tp", p.tp) + " * " + d("pp", p.pp) + " = " + std::to_string(p.gpus()) +
                       " != WORLD_SIZE(" + std::to_string(world) + ")" + hint);
  }
  for (const auto& q : ftplan::parallelism_problems(p, job.model, s, p.gpus(), s.attention.value_or(ftplan::Attention::eager)))
    problems.push_back(q);
  for (const auto& q : ftplan::exec_layout_problems(p)) problems.push_back(q);
  if (!problems.empty()) {
    std::string msg = field + ": ";
    for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
    ftplan::fail_input(msg);
  }
  return p;
}

nlohmann::json exec_settings_json(const ExecJob& job) {
  const auto& s = job.setup;
  nlohmann::json j = {{"learning_rate", s.learning_rate},
                      {"adam_beta1", job.adam_beta1},
                      {"adam_beta2", job.adam_beta2},
                      {"adam_eps", job.adam_eps},
                      {"weight_decay", job.weight_decay},
                      {"weight_decay_excludes", "biases and normalisation weights (Hugging Face Trainer's parameter groups)"},
                      {"max_grad_norm", job.max_grad_norm},
                      {"warmup_steps", job.warmup_steps},
                      {"threads", job.threads}};
  if (s.method != ftplan::Method::full) {
    j["lora_rank"] = s.lora.rank;
    j["lora_alpha"] = s.lora.alpha;
    j["lora_dropout"] = s.lora.dropout;
  }
  return j;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace ftexec

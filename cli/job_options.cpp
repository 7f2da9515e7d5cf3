#include "cli/job_options.h"

#include <map>

#include <nlohmann/json.hpp>

#include "planner/calibration.h"
#include "planner/data_paths.h"
#include "planner/errors.h"
#include "planner/framework.h"
#include "planner/job_fields.h"
#include "planner/json_fields.h"

namespace ftplan::cli {

void add_job_options(CLI::App& app, JobOptions& o) {
  app.add_option("job", o.job_file, "Job file (configs/jobs/X.json); flags override its fields");
  app.add_option("--from", o.from,
                 "Read the job from a training config (repeatable): DeepSpeed JSON, accelerate YAML, axolotl YAML, torchtune "
                 "recipe YAML, LLaMA-Factory YAML, HF TrainingArguments JSON/YAML, torchrun or sbatch script; a flag that "
                 "contradicts a file is an error")
      ->type_name("FILE")
      ->allow_extra_args(false);  // one file per --from: a job file after it stays the positional
  bind_field_flags(app, o.flags, kFtplanFlag, job_field_defaults());
  app.add_flag("--json", o.json, "Print JSON instead of a table");
  app.add_option("--calibration", o.calibration,
                 "Efficiency parameters from `ftplan calibrate` or `ftexec calibrate` (calibration.json) for the job's GPU");
}

namespace {

// The job keys a job file gives, flattened ("lora.rank"), with where they came from.
void add_job_file_values(const nlohmann::json& j, const std::string& path, const std::string& prefix,
                         std::map<std::string, GivenValue>& given) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it->is_null() || key == "description" || key == "published") continue;
    if (prefix.empty() && it->is_object() && (key == "lora" || key == "dataset" || key == "quantization")) {
      add_job_file_values(*it, path, key, given);
      continue;
    }
    given[key] = {*it, path + ": " + key + " " + (it->is_string() ? it->get<std::string>() : it->dump())};
  }
}

// An error from the whole-job checks, with the --from files and keys that set what it names.
template <typename F>
void naming_imports(const LoadedJob& job, F&& check) {
  try {
    check();
  } catch (const InputError& e) {
    if (!job.imported) throw;
    fail_input(e.what() + config_origins_in(*job.imported, e.what()));
  }
}

}  // namespace

LoadedJob load_job(const JobOptions& o) {
  o.flags.validate();
  TrainingSetup s;
  std::map<std::string, GivenValue> given;  // what the job file and the flags say, for --from's contradictions
  if (!o.job_file.empty()) {
    const std::string path = resolve_data_file(o.job_file, "configs/jobs", "job");
    const nlohmann::json j = read_json_file(path);
    s = training_setup_from_json(j, path);
    add_job_file_values(j, path, "", given);
  } else if (!o.flags.has("--model") && o.from.empty()) {
    fail_input("--model: required (or give a job file, or --from a training config)");
  }
  o.flags.apply_job(s);
  for (const FieldSpec& f : field_table())
    if ((f.places & kInJobFile) && *f.flag && o.flags.has(f.flag))
      given[f.key] = {field_value_from_text(f, *o.flags.given.at(f.flag), f.flag), std::string(f.flag) + " " + *o.flags.given.at(f.flag)};

  LoadedJob job;
  if (!o.from.empty()) {
    job.imported = read_config_files(o.from);
    apply_config_values(s, *job.imported, given);
    if (s.model.empty()) fail_input("--model: required (the --from files name no model: base_model, model_name_or_path, model._component_)");
  }
  job.hardware = load_hardware(s.gpu);
  if (!o.calibration.empty()) {
    job.calibration = load_calibration(o.calibration);
    job.calibration_path = o.calibration;
    job.hardware = apply_calibration(job.hardware, *job.calibration, o.calibration);
  }
  apply_topology(s, job.hardware);
  if (job.imported) apply_config_rules(s, *job.imported, job.hardware, given);
  // The framework fills what the user left out (its precision, loss, FSDP version, ...) and refuses
  // knobs it does not offer.
  naming_imports(job, [&] { apply_framework(s, framework_profile(s.framework)); });

  job.model_path = resolve_data_file(s.model, "configs/models", "--model");
  job.model = model_as_built(load_model(s.model), framework_profile(s.framework));
  apply_model(s, job.model);
  naming_imports(job, [&] {
    validate_job(s, job.model, o.job_file);
    validate_layout(s, job.model, job.hardware, o.job_file);
  });
  job.setup = s;
  return job;
}

void add_import_json(const LoadedJob& job, nlohmann::json& out) {
  if (!out.is_object()) return;
  if (job.imported) out["import"] = import_json(*job.imported);
  if (job.calibration)
    out["calibration"] = {{"path", job.calibration_path},
                          {"device", job.calibration->device},
                          {"method", job.calibration->method},
                          {"parameters", calibration_to_json(*job.calibration)["parameters"]},
                          {"determined", job.calibration->determined}};
}

std::string import_text(const LoadedJob& job) {
  std::string text;
  if (job.imported)
    for (const auto& line : import_lines(*job.imported)) text += line + "\n";
  if (job.calibration)
    text += "calibrated: " + job.calibration_path + " (" + job.calibration->method + " on " + job.calibration->device +
            "): its efficiencies, bandwidth factors and latency replace the hwdb's in every time above\n";
  return text;
}

}  // namespace ftplan::cli

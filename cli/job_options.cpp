#include "cli/job_options.h"

#include <nlohmann/json.hpp>

#include "planner/data_paths.h"
#include "planner/errors.h"
#include "planner/framework.h"
#include "planner/job_fields.h"
#include "planner/json_fields.h"

namespace ftplan::cli {

void add_job_options(CLI::App& app, JobOptions& o) {
  app.add_option("job", o.job_file, "Job file (configs/jobs/X.json); flags override its fields");
  bind_field_flags(app, o.flags, kFtplanFlag, job_field_defaults());
  app.add_flag("--json", o.json, "Print JSON instead of a table");
}

LoadedJob load_job(const JobOptions& o) {
  o.flags.validate();
  TrainingSetup s;
  if (!o.job_file.empty()) {
    const std::string path = resolve_data_file(o.job_file, "configs/jobs", "job");
    const nlohmann::json j = read_json_file(path);
    s = training_setup_from_json(j, path);
  } else if (!o.flags.has("--model")) {
    fail_input("--model: required (or give a job file)");
  }
  o.flags.apply_job(s);
  // The framework fills what the user left out (its precision, loss, FSDP version, ...) and refuses
  // knobs it does not offer.
  apply_framework(s, framework_profile(s.framework));

  LoadedJob job;
  job.model_path = resolve_data_file(s.model, "configs/models", "--model");
  job.model = load_model(s.model);
  apply_model(s, job.model);
  job.hardware = load_hardware(s.gpu);
  apply_topology(s, job.hardware);
  validate_job(s, job.model, o.job_file);
  validate_layout(s, job.model, job.hardware, o.job_file);
  job.setup = s;
  return job;
}

}  // namespace ftplan::cli

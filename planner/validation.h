// `ftplan validate`: ftplan's predictions against published, cited measurements
// (configs/validation/published.json): for each case the predicted figure of the metric the source
// reports (allocated, reserved, device; "active" is compared with allocated, "unknown" with
// reserved), the error, the fit/OOM call at an OOM boundary, and tokens/s per GPU where published;
// then MAPE per source and overall, judged against the suite's own thresholds.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ftplan {

struct ValidationCase {
  std::string id, source, metric;
  bool scored = false;            // expressible and not excluded
  std::string skipped_because;    // why not scored
  std::optional<double> measured_bytes, predicted_bytes, error_pct;
  bool measured_oom = false;
  std::optional<bool> predicted_oom;  // predicted figure > the GPU's memory
  bool oom_boundary = false;          // a case at a published fits/OOM boundary
  std::optional<double> measured_tokens_per_s, predicted_tokens_per_s, tokens_error_pct;  // per GPU
  std::string framework, strategy, method;
};

struct ValidationSource {
  std::string source, metric;
  int memory_cases = 0, throughput_cases = 0, oom_cases = 0, oom_right = 0;
  double memory_mape_pct = 0, throughput_mape_pct = 0;
  bool meets_memory = true, meets_throughput = true;  // against the goals (when it has enough cases)
};

// The suite's two kinds of thresholds: "thresholds" are the goals (MAPE per source and overall, every
// OOM-boundary call right); "guards" bound today's accuracy so that a change that makes predictions
// worse fails (`ftplan validate` exits 1 when a guard is exceeded; goals missed are reported).
struct ValidationReport {
  std::vector<ValidationCase> cases;
  std::vector<ValidationSource> sources;
  ValidationSource overall;
  double memory_threshold_pct = 10, throughput_threshold_pct = 20;
  int min_cases_per_source = 3;
  bool goals_met = false;
  std::vector<std::string> goals_missed;  // one line each
  bool passed = false;                    // every guard holds
  std::vector<std::string> failures;      // the guards exceeded, one line each
};

// Runs every case of the suite (or of one source). InputError for a malformed suite.
ValidationReport run_validation(const nlohmann::json& suite, const std::string& only_source = "");

nlohmann::json validation_json(const ValidationReport& report);
std::string validation_table(const ValidationReport& report);

}  // namespace ftplan

// Calibration: the few efficiency parameters of the time model, fitted from measured runs
// (`ftplan calibrate RUN... -o calibration.json`) or measured directly on a machine (`ftexec
// calibrate`), in one file format that `--calibration FILE` applies to plan, check, sweep and simulate.
//
// The parameters (hardware_spec.h EfficiencyModel, and the hwdb bandwidths they scale):
//   gemm_efficiency        achieved / peak at a GEMM's smallest dimension 16, 64, 512 and 4096
//                          (log2-interpolated between, held beyond: compute_model.h piece_rates)
//   attention_efficiency   the attention core (QK^T, softmax, P·V)
//   optimizer_bandwidth_factor   the AdamW pass's achieved / hbm_bandwidth_bytes_per_s
//   link_bandwidth_factor  intra_node, inter_node, host: achieved / the hwdb's bandwidth per link type
//   comm_latency_s         per collective ring step
//
// The fit: each run's step time is predicted from its job and layout (the run's framework profile,
// the plan's hardware), and the parameters θ (their logarithms) minimise
//   Σ_runs log(predicted / measured)²  +  λ Σ_k (θ_k − θ0_k)²
// by damped Gauss-Newton (Levenberg-Marquardt) with a finite-difference Jacobian; θ0 is the prior
// (hwdb's figures, or a file from `ftexec calibrate` given as --prior) and λ = 1e-4 keeps the
// parameters no run depends on at the prior: those are listed as "not determined". Judged by
// leave-one-out (calibrate_leave_one_out): fit on all runs but one, predict the one left out.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/hardware_spec.h"

namespace ftplan {

struct RunLog;

inline constexpr const char* kCalibrationFormat = "ftplan-calibration/1";

struct Calibration {
  std::string device;                  // the hwdb id the parameters hold for, e.g. "cpu", "h100-sxm"
  std::string precision;               // the precision measured, e.g. "fp32" (a note where the plan's differs)
  std::string method;                  // "fit" (ftplan calibrate) or "measured" (ftexec calibrate)
  std::vector<double> gemm_efficiency;  // at kGemmAnchorDims; empty: hwdb's matmul_efficiency
  std::optional<double> attention_efficiency;
  double optimizer_bandwidth_factor = 1.0;
  double intra_node_bandwidth_factor = 1.0, inter_node_bandwidth_factor = 1.0, host_bandwidth_factor = 1.0;
  std::optional<double> comm_latency_s;  // unset: the hwdb's
  std::vector<std::string> determined;   // parameter names the data determined (the rest: the prior)
  nlohmann::json details = nlohmann::json::object();  // residuals, runs, measurements: printed, not read back
};

// The file as JSON, and back; reading checks every field (name, type, range) and names the one at fault.
nlohmann::json calibration_to_json(const Calibration& c);
Calibration calibration_from_json(const nlohmann::json& j, const std::string& where);
Calibration load_calibration(const std::string& path);

// The hardware spec with the calibration applied (EfficiencyModel set, bandwidths scaled, latency
// replaced; efficiency.source = `source`). InputError when the calibration is for another device.
HardwareSpec apply_calibration(const HardwareSpec& hw, const Calibration& c, const std::string& source);
// The hwdb's own figures as a calibration (the prior of a fit with no --prior): every GEMM anchor and
// attention at matmul_efficiency, factors 1, the hwdb latency.
Calibration default_calibration(const HardwareSpec& hw, const std::string& precision);

// One measured run as the fit sees it: its job and candidate (as a plan writes them) and the step time.
struct CalibrationRun {
  std::string path;
  std::string label;        // e.g. "h256 s128 lora r8 mb4"
  nlohmann::json job;       // training_setup_to_json keys
  std::string framework;    // the profile that predicts the run: "ftexec" for ftexec's measurements
  std::string device;       // hwdb id of the device that ran: "cpu" for ftexec on the CPU
  double measured_step_s = 0;
};

// A run from its log: ftexec's measured.json carries its job; another stack's log (run_logs.h) needs
// the plan it ran (`plan`, from `ftplan plan -o`), whose job it takes, checked against what the log
// names (InputError naming the fields unless `force`). InputError when the log has no step time.
// `statistic`: "logged" takes the log's step time as written (ftexec: the median after warm-up);
// "min" the fastest step ftexec logged (step_times_s), the estimate least disturbed by other work on a
// shared machine (other logs have one figure: "min" is refused for them).
CalibrationRun calibration_run(const RunLog& log, const nlohmann::json* plan, bool force,
                               const std::string& statistic = "logged");

// The step time the model predicts for the run on `hw` (already calibrated or not), seconds.
double predict_run_step_s(const CalibrationRun& run, const HardwareSpec& hw);

// Fits the parameters from the runs (all on one device) starting from `prior`; details hold the
// per-run residuals before (prior) and after, and the iterations.
Calibration fit_calibration(const std::vector<CalibrationRun>& runs, const HardwareSpec& hw, const Calibration& prior);

// Leave-one-out: for each run, fit on the others and predict it. {"runs": [{"path", "label",
// "measured_step_s", "before_step_s", "after_step_s", "before_error_pct", "after_error_pct", "worse"}],
//  "mape_before_pct", "mape_after_pct", "worse_runs"}.
nlohmann::json calibrate_leave_one_out(const std::vector<CalibrationRun>& runs, const HardwareSpec& hw,
                                       const Calibration& prior);

// GEMM efficiency anchors (at kGemmAnchorDims) from timed GEMMs: (smallest dimension, achieved / peak)
// points, fitted in time per FLOP (1 / efficiency, linear in the anchors under compute_model.h's
// interpolation) by least squares of the relative error, with a weak smoothness tie between
// neighbouring anchors so that an anchor no point reaches takes its neighbour's value.
std::vector<double> fit_gemm_anchors(const std::vector<std::pair<double, double>>& dim_efficiency);

// The fit's report: parameters (prior → fitted, determined or not) and residuals per run.
std::string calibration_report(const Calibration& c, const Calibration& prior);
std::string leave_one_out_report(const nlohmann::json& loo);

}  // namespace ftplan

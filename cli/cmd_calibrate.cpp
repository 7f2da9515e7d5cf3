// `ftplan calibrate RUN... -o calibration.json`: the time model's efficiency parameters fitted from
// measured runs (planner/calibration.h), the fit's residuals, and with --leave-one-out the held-out
// error of each run before and after.
#include <iostream>

#include "cli/commands.h"
#include "planner/calibration.h"
#include "planner/errors.h"
#include "planner/json_fields.h"
#include "planner/run_logs.h"

namespace ftplan::cli {

int run_calibrate(const CalibrateOptions& o) {
  std::optional<nlohmann::json> plan;
  if (!o.plan.empty()) plan = read_json_file(o.plan);
  std::vector<CalibrationRun> runs;
  for (const auto& path : o.runs) runs.push_back(calibration_run(read_run_log(path), plan ? &*plan : nullptr, o.force, o.step_time));
  std::string device = o.gpu;
  for (const auto& r : runs) {
    if (o.gpu.empty() && device.empty()) device = r.device;
    if (o.gpu.empty() && r.device != device)
      fail_input(r.path + ": ran on \"" + r.device + "\", " + runs.front().path + " on \"" + device +
                 "\": calibrate one device at a time (or name it with --gpu)");
  }
  if (device.empty()) fail_input("--gpu: the runs do not say which device ran them; name its hwdb id");
  const HardwareSpec hw = load_hardware(device);
  const std::string precision = runs.front().job.value("precision", std::string());
  Calibration prior = o.prior.empty() ? default_calibration(hw, precision) : load_calibration(o.prior);
  if (!o.prior.empty()) apply_calibration(hw, prior, o.prior);  // refuses a prior for another device
  // A prior that leaves a parameter to the hwdb: fill it in, so that every parameter has a start.
  {
    const Calibration d = default_calibration(hw, precision);
    if (prior.gemm_efficiency.size() != size_t(kGemmAnchors)) prior.gemm_efficiency = d.gemm_efficiency;
    if (!prior.attention_efficiency) prior.attention_efficiency = d.attention_efficiency;
    if (!prior.comm_latency_s) prior.comm_latency_s = d.comm_latency_s;
  }
  Calibration fitted = fit_calibration(runs, hw, prior);
  fitted.precision = precision;
  nlohmann::json loo;
  if (o.leave_one_out) loo = calibrate_leave_one_out(runs, hw, prior);
  if (!o.output.empty()) write_file_atomically(o.output, calibration_to_json(fitted).dump(2) + "\n");
  if (o.json) {
    nlohmann::json out = {{"calibration", calibration_to_json(fitted)}};
    if (!loo.is_null()) out["leave_one_out"] = loo;
    if (!o.output.empty()) out["written"] = o.output;
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::cout << calibration_report(fitted, prior);
  if (!loo.is_null()) std::cout << "\n" << leave_one_out_report(loo);
  std::cout << "prior: " << (o.prior.empty() ? "hwdb/" + hw.id + ".json's figures" : o.prior) << "\n";
  if (!o.output.empty()) std::cout << "written: " << o.output << " (use it with --calibration on plan, check, sweep, simulate)\n";
  return 0;
}

}  // namespace ftplan::cli

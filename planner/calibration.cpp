#include "planner/calibration.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <set>
#include <sstream>

#include <boost/numeric/ublas/lu.hpp>
#include <boost/numeric/ublas/matrix.hpp>
#include <boost/numeric/ublas/vector.hpp>

#include "planner/compare_report.h"
#include "planner/compute_model.h"
#include "planner/errors.h"
#include "planner/framework.h"
#include "planner/job_fields.h"
#include "planner/json_fields.h"
#include "planner/memory_report.h"
#include "planner/model_spec.h"
#include "planner/parallelism.h"
#include "planner/run_logs.h"
#include "planner/step_time.h"
#include "planner/training_setup.h"

namespace ftplan {

namespace {

// The fitted parameters, in this order, as their logarithms.
const std::vector<std::string> kParams = {"gemm_efficiency.16",
                                          "gemm_efficiency.64",
                                          "gemm_efficiency.512",
                                          "gemm_efficiency.4096",
                                          "attention_efficiency",
                                          "optimizer_bandwidth_factor",
                                          "link_bandwidth_factor.intra_node",
                                          "link_bandwidth_factor.inter_node",
                                          "link_bandwidth_factor.host",
                                          "comm_latency_s"};
constexpr double kPriorWeight = 1e-4;  // λ: how strongly a parameter stays at its prior

struct Bounds {
  double lo, hi;
};
Bounds bounds_of(size_t k) {
  if (k <= size_t(kGemmAnchors)) return {1e-4, 1.0};   // efficiencies: achieved / peak (GEMM anchors, attention)
  if (k <= size_t(kGemmAnchors) + 4) return {1e-3, 4.0};  // factors: optimizer, links
  return {1e-8, 0.1};               // latency, s
}

std::vector<double> to_theta(const Calibration& c, const HardwareSpec& hw) {
  const double e = hw.matmul_efficiency;
  std::vector<double> v;
  for (int k = 0; k < kGemmAnchors; ++k) v.push_back(c.gemm_efficiency.size() == size_t(kGemmAnchors) ? c.gemm_efficiency[k] : e);
  for (double x : {c.attention_efficiency.value_or(e), c.optimizer_bandwidth_factor, c.intra_node_bandwidth_factor,
                   c.inter_node_bandwidth_factor, c.host_bandwidth_factor,
                   c.comm_latency_s.value_or(hw.comm_latency_s > 0 ? hw.comm_latency_s : 1e-6)})
    v.push_back(x);
  for (double& x : v) x = std::log(x);
  return v;
}

void from_theta(Calibration& c, const std::vector<double>& t) {
  const size_t a = kGemmAnchors;
  c.gemm_efficiency.clear();
  for (size_t k = 0; k < a; ++k) c.gemm_efficiency.push_back(std::exp(t[k]));
  c.attention_efficiency = std::exp(t[a]);
  c.optimizer_bandwidth_factor = std::exp(t[a + 1]);
  c.intra_node_bandwidth_factor = std::exp(t[a + 2]);
  c.inter_node_bandwidth_factor = std::exp(t[a + 3]);
  c.host_bandwidth_factor = std::exp(t[a + 4]);
  c.comm_latency_s = std::exp(t[a + 5]);
}

void check_keys(const nlohmann::json& j, const std::set<std::string>& allowed, const std::string& where) {
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!allowed.count(it.key())) fail_input(where + ": unknown key \"" + it.key() + "\"");
}

// A run prepared once for many predictions: only the hardware's efficiency changes between them.
struct PreparedRun {
  TrainingSetup setup;
  ModelSpec model;
  Candidate candidate;
};

PreparedRun prepare_run(const CalibrationRun& run, const HardwareSpec& hw) {
  PreparedRun p;
  p.setup = training_setup_from_json(run.job, run.path + ": job");
  p.setup.framework = run.framework;
  apply_framework(p.setup, framework_profile(run.framework));
  p.model = model_as_built(load_model(p.setup.model), framework_profile(p.setup.framework));
  apply_model(p.setup, p.model);
  HardwareSpec h = hw;
  apply_topology(p.setup, h);
  p.candidate = candidate_from_setup(p.setup, h);
  return p;
}

double predict(const PreparedRun& p, const HardwareSpec& hw) {
  // The run's own node (--gpus-per-node, --pcie-slot) on the hardware being fitted, as prepare_run built its candidate.
  HardwareSpec node = hw;
  TrainingSetup setup = p.setup;
  apply_topology(setup, node);
  const PlanContext ctx = prepare_plan(p.model, node, setup, setup.num_gpus, shard_shape(p.candidate.parallel));
  return estimate_step(ctx, p.candidate, {}).step_time_s;
}

std::vector<double> residuals(const std::vector<PreparedRun>& runs, const std::vector<CalibrationRun>& meta,
                              const HardwareSpec& hw, const std::vector<double>& theta) {
  Calibration c;
  c.device = hw.id;
  from_theta(c, theta);
  const HardwareSpec h = apply_calibration(hw, c, "fit");
  std::vector<double> r;
  for (size_t i = 0; i < runs.size(); ++i) r.push_back(std::log(predict(runs[i], h) / meta[i].measured_step_s));
  return r;
}

// Solves A x = b (A symmetric positive definite, small) by LU with partial pivoting.
std::vector<double> solve(std::vector<std::vector<double>> a, std::vector<double> b) {
  namespace ub = boost::numeric::ublas;
  const size_t n = b.size();
  ub::matrix<double> m(n, n);
  ub::vector<double> x(n);
  for (size_t i = 0; i < n; ++i) {
    x(i) = b[i];
    for (size_t j = 0; j < n; ++j) m(i, j) = a[i][j];
  }
  ub::permutation_matrix<size_t> pm(n);
  if (ub::lu_factorize(m, pm) != 0) return std::vector<double>(n, 0.0);
  ub::lu_substitute(m, pm, x);
  return std::vector<double>(x.begin(), x.end());
}

double cost_of(const std::vector<double>& r, const std::vector<double>& t, const std::vector<double>& t0) {
  double c = 0;
  for (double x : r) c += x * x;
  for (size_t k = 0; k < t.size(); ++k) c += kPriorWeight * (t[k] - t0[k]) * (t[k] - t0[k]);
  return c;
}

std::string fixed(double v, int digits) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(digits) << v;
  return o.str();
}

std::string value_text(size_t k, double v) {
  if (k == kParams.size() - 1) return fixed(v * 1e6, 2) + " us";
  return fixed(v, 4);
}

}  // namespace

std::vector<double> fit_gemm_anchors(const std::vector<std::pair<double, double>>& points) {
  if (points.empty()) fail_input("calibration: no GEMM timings to fit");
  // Row i: the interpolation weights c_ik of point i (compute_model.cpp gemm_efficiency), so that
  // 1/e_i = Σ_k c_ik u_k with u_k = 1 / anchor efficiency; residual (Σ c_ik u_k) e_i - 1.
  const int n = kGemmAnchors;
  std::vector<std::vector<double>> a(n, std::vector<double>(n, 0.0));
  std::vector<double> b(n, 0.0);
  for (const auto& [dim, e] : points) {
    if (!(e > 0) || !std::isfinite(e)) fail_input("calibration: a GEMM timing gave efficiency " + std::to_string(e));
    std::vector<double> c(n, 0.0);
    const double d = std::max(1.0, dim);
    if (d <= kGemmAnchorDims[0]) {
      c[0] = 1;
    } else if (d >= kGemmAnchorDims[n - 1]) {
      c[n - 1] = 1;
    } else {
      int i = 0;
      while (d >= kGemmAnchorDims[i + 1]) ++i;
      const double t = (std::log2(d) - std::log2(kGemmAnchorDims[i])) / (std::log2(kGemmAnchorDims[i + 1]) - std::log2(kGemmAnchorDims[i]));
      c[i] = 1 - t;
      c[i + 1] = t;
    }
    for (int k = 0; k < n; ++k) {
      for (int l = 0; l < n; ++l) a[k][l] += c[k] * e * c[l] * e;
      b[k] += c[k] * e;
    }
  }
  // Smoothness: a small penalty on (u_k - u_{k+1}) relative to the data's scale.
  double scale = 0;
  for (int k = 0; k < n; ++k) scale = std::max(scale, a[k][k]);
  const double tie = 1e-5 * std::max(scale, 1e-12);
  for (int k = 0; k + 1 < n; ++k) {
    a[k][k] += tie;
    a[k + 1][k + 1] += tie;
    a[k][k + 1] -= tie;
    a[k + 1][k] -= tie;
  }
  const std::vector<double> u = solve(a, b);
  std::vector<double> e(n);
  for (int k = 0; k < n; ++k) {
    if (!(u[k] > 0)) fail_input("calibration: the GEMM timings do not determine a positive efficiency at " +
                                std::to_string(int(kGemmAnchorDims[k])));
    e[k] = std::clamp(1.0 / u[k], 1e-4, 1.0);
  }
  return e;
}

nlohmann::json calibration_to_json(const Calibration& c) {
  nlohmann::json p = nlohmann::json::object();
  if (c.gemm_efficiency.size() == size_t(kGemmAnchors)) {
    p["gemm_efficiency"] = nlohmann::json::object();
    for (int k = 0; k < kGemmAnchors; ++k) p["gemm_efficiency"][kGemmAnchorKeys[k]] = c.gemm_efficiency[k];
  }
  if (c.attention_efficiency) p["attention_efficiency"] = *c.attention_efficiency;
  p["optimizer_bandwidth_factor"] = c.optimizer_bandwidth_factor;
  p["link_bandwidth_factor"] = {{"intra_node", c.intra_node_bandwidth_factor},
                                {"inter_node", c.inter_node_bandwidth_factor},
                                {"host", c.host_bandwidth_factor}};
  if (c.comm_latency_s) p["comm_latency_s"] = *c.comm_latency_s;
  return {{"format", kCalibrationFormat}, {"device", c.device},   {"precision", c.precision},
          {"method", c.method},           {"parameters", p},      {"determined", c.determined},
          {"details", c.details}};
}

Calibration calibration_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) fail_input(where + ": expected a JSON object (a calibration from `ftplan calibrate` or `ftexec calibrate`)");
  check_keys(j, {"format", "device", "precision", "method", "parameters", "determined", "details"}, where);
  const std::string format = read_string(j, "format", where);
  if (format != kCalibrationFormat)
    fail_input(where + ": format \"" + format + "\" is not " + kCalibrationFormat);
  Calibration c;
  c.device = read_string(j, "device", where);
  c.precision = read_string_or(j, "precision", "", where);
  c.method = read_string_or(j, "method", "", where);
  if (!j.contains("parameters") || !j["parameters"].is_object()) fail_input(where + ": parameters: expected an object");
  const auto& p = j["parameters"];
  const std::string pw = where + ": parameters";
  check_keys(p, {"gemm_efficiency", "attention_efficiency", "optimizer_bandwidth_factor", "link_bandwidth_factor", "comm_latency_s"}, pw);
  if (p.contains("gemm_efficiency") && !p["gemm_efficiency"].is_null()) {
    const auto& g = p["gemm_efficiency"];
    if (!g.is_object()) fail_input(pw + ".gemm_efficiency: expected an object {\"16\": .., \"64\": .., \"512\": .., \"4096\": ..}");
    check_keys(g, std::set<std::string>(std::begin(kGemmAnchorKeys), std::end(kGemmAnchorKeys)), pw + ".gemm_efficiency");
    for (const char* k : kGemmAnchorKeys) c.gemm_efficiency.push_back(read_number(g, k, pw + ".gemm_efficiency", 1e-4, 1.0));
  }
  if (p.contains("attention_efficiency") && !p["attention_efficiency"].is_null())
    c.attention_efficiency = read_number(p, "attention_efficiency", pw, 1e-4, 1.0);
  c.optimizer_bandwidth_factor = read_number_or(p, "optimizer_bandwidth_factor", 1.0, pw, 1e-3, 4.0);
  if (p.contains("link_bandwidth_factor") && !p["link_bandwidth_factor"].is_null()) {
    const auto& l = p["link_bandwidth_factor"];
    const std::string lw = pw + ".link_bandwidth_factor";
    if (!l.is_object()) fail_input(lw + ": expected an object {\"intra_node\", \"inter_node\", \"host\"}");
    check_keys(l, {"intra_node", "inter_node", "host"}, lw);
    c.intra_node_bandwidth_factor = read_number_or(l, "intra_node", 1.0, lw, 1e-3, 4.0);
    c.inter_node_bandwidth_factor = read_number_or(l, "inter_node", 1.0, lw, 1e-3, 4.0);
    c.host_bandwidth_factor = read_number_or(l, "host", 1.0, lw, 1e-3, 4.0);
  }
  if (p.contains("comm_latency_s") && !p["comm_latency_s"].is_null()) c.comm_latency_s = read_number(p, "comm_latency_s", pw, 1e-8, 0.1);
  if (j.contains("determined")) {
    if (!j["determined"].is_array()) fail_input(where + ": determined: expected an array of parameter names");
    for (const auto& d : j["determined"]) {
      if (!d.is_string() || std::find(kParams.begin(), kParams.end(), d.get<std::string>()) == kParams.end())
        fail_input(where + ": determined: " + d.dump() + " is not a calibration parameter");
      c.determined.push_back(d.get<std::string>());
    }
  }
  if (j.contains("details")) c.details = j["details"];
  return c;
}

Calibration load_calibration(const std::string& path) { return calibration_from_json(read_json_file(path), "calibration " + path); }

HardwareSpec apply_calibration(const HardwareSpec& hw, const Calibration& c, const std::string& source) {
  if (c.device != hw.id)
    fail_input("calibration " + source + ": device \"" + c.device + "\" is not the plan's GPU \"" + hw.id +
               "\" (calibrate on that device, or plan for \"" + c.device + "\")");
  HardwareSpec h = hw;
  h.efficiency.gemm = c.gemm_efficiency;
  h.efficiency.attention = c.attention_efficiency;
  h.efficiency.optimizer_bandwidth_factor = c.optimizer_bandwidth_factor;
  h.efficiency.source = source;
  h.intra_node_bandwidth_bytes_per_s *= c.intra_node_bandwidth_factor;
  for (auto& link : h.topology.links) link.bandwidth_bytes_per_s *= c.intra_node_bandwidth_factor;
  h.inter_node_bandwidth_bytes_per_s *= c.inter_node_bandwidth_factor;
  h.pcie_host_bandwidth_bytes_per_s *= c.host_bandwidth_factor;
  if (c.comm_latency_s) h.comm_latency_s = *c.comm_latency_s;
  return h;
}

Calibration default_calibration(const HardwareSpec& hw, const std::string& precision) {
  Calibration c;
  c.device = hw.id;
  c.precision = precision;
  c.method = "hwdb";
  // The hwdb's per-shape GEMM anchors where it has them and the runs use bf16 tensor cores.
  if (!precision.empty() && precision != "fp32") c.gemm_efficiency = hwdb_gemm_anchors(hw, Precision::mixed, hw.matmul_efficiency);
  from_theta(c, to_theta(c, hw));
  return c;
}

CalibrationRun calibration_run(const RunLog& log, const nlohmann::json* plan, bool force, const std::string& statistic) {
  CalibrationRun run;
  run.path = log.path;
  if (statistic != "logged" && statistic != "min") fail_input("--step-time: '" + statistic + "' is not logged or min");
  std::optional<double> step = log.step_time_s;
  if (log.format == "ftexec-measured/1" && log.measured.is_object() && log.measured.contains("step_time_s") &&
      log.measured["step_time_s"].is_number())
    step = log.measured["step_time_s"].get<double>();
  if (statistic == "min") {
    if (log.format != "ftexec-measured/1" || !log.measured.contains("step_times_s") || !log.measured["step_times_s"].is_array() ||
        log.measured["step_times_s"].empty())
      fail_input("--step-time min: " + log.path + " has no per-step times (ftexec's step_times_s)");
    double best = 0;
    for (const auto& t : log.measured["step_times_s"]) {
      if (!t.is_number()) fail_input(log.path + ": step_times_s: expected numbers");
      const double v = t.get<double>();
      if (best == 0 || v < best) best = v;
    }
    step = best;
  }
  if (!step) fail_input(log.path + ": the log has no step time (" + log.format + "): nothing to calibrate against");
  run.measured_step_s = *step;
  if (!(run.measured_step_s > 0) || !std::isfinite(run.measured_step_s)) fail_input(log.path + ": step_time_s must be > 0");
  if (log.format == "ftexec-measured/1") {
    const auto& m = log.measured;
    if (!m.contains("job") || !m["job"].is_object()) fail_input(log.path + ": no \"job\" object");
    run.job = m["job"];
    run.framework = "ftexec";
    const std::string device = m.value("device", std::string());
    run.device = device.rfind("cuda", 0) == 0 ? run.job.value("gpu", std::string()) : "cpu";
    if (plan) {
      const std::vector<std::string> diff = job_differences(*plan, m);
      if (!diff.empty() && !force) {
        std::string msg = log.path + ": a run of a different job than the plan (";
        for (size_t i = 0; i < diff.size(); ++i) msg += (i ? "; " : "") + diff[i];
        fail_input(msg + "); --force uses it anyway");
      }
    }
  } else {
    if (!plan)
      fail_input(log.path + ": a " + log.format + " log does not hold its whole job and layout: give --plan PLAN (the plan it ran)");
    if (!plan->contains("job") || !(*plan)["job"].is_object()) fail_input("plan: no \"job\" object (write it with `ftplan plan -o`)");
    nlohmann::json fake = {{"job", log.job.is_object() ? log.job : nlohmann::json::object()},
                           {"candidate", log.candidate.is_object() ? log.candidate : nlohmann::json::object()}};
    if (log.world_size) fake["world_size"] = *log.world_size;
    const std::vector<std::string> diff = job_differences(*plan, fake);
    if (!diff.empty() && !force) {
      std::string msg = log.path + ": a run of a different job than the plan (";
      for (size_t i = 0; i < diff.size(); ++i) msg += (i ? "; " : "") + diff[i];
      fail_input(msg + "); --force uses it anyway");
    }
    run.job = (*plan)["job"];
    run.framework = !log.framework.empty() ? log.framework : run.job.value("framework", std::string("hf"));
    run.device = run.job.value("gpu", std::string());
  }
  const auto& j = run.job;
  std::ostringstream label;
  std::string model = j.value("model", std::string());
  model = model.substr(model.find_last_of('/') + 1);
  if (model.size() > 5 && model.substr(model.size() - 5) == ".json") model.resize(model.size() - 5);
  label << model << " " << j.value("method", std::string("?"));
  if (j.contains("lora") && j["lora"].is_object() && j.value("method", std::string()) != "full")
    label << " r" << j["lora"].value("rank", 0);
  label << " s" << j.value("seq_len", 0) << " mb" << j.value("micro_batch", 0);
  run.label = label.str();
  return run;
}

double predict_run_step_s(const CalibrationRun& run, const HardwareSpec& hw) { return predict(prepare_run(run, hw), hw); }

Calibration fit_calibration(const std::vector<CalibrationRun>& runs, const HardwareSpec& hw, const Calibration& prior) {
  if (runs.empty()) fail_input("calibrate: no runs to fit");
  std::vector<PreparedRun> prepared;
  for (const auto& r : runs) prepared.push_back(prepare_run(r, hw));
  const std::vector<double> t0 = to_theta(prior, hw);
  std::vector<double> t = t0;
  const size_t n = t.size();
  std::vector<double> r = residuals(prepared, runs, hw, t);
  double cost = cost_of(r, t, t0);
  const std::vector<double> r_before = r;
  double mu = 1e-3;
  int iterations = 0;
  std::vector<double> column_norm(n, 0.0);
  for (; iterations < 100; ++iterations) {
    // Jacobian of the log residuals by forward differences in the log parameters.
    std::vector<std::vector<double>> jac(r.size(), std::vector<double>(n, 0.0));
    const double h = 1e-4;
    for (size_t k = 0; k < n; ++k) {
      std::vector<double> tk = t;
      tk[k] += h;
      const std::vector<double> rk = residuals(prepared, runs, hw, tk);
      for (size_t i = 0; i < r.size(); ++i) jac[i][k] = (rk[i] - r[i]) / h;
    }
    std::vector<std::vector<double>> a(n, std::vector<double>(n, 0.0));
    std::vector<double> g(n, 0.0);
    for (size_t k = 0; k < n; ++k) {
      column_norm[k] = 0;
      for (size_t i = 0; i < r.size(); ++i) column_norm[k] += jac[i][k] * jac[i][k];
      column_norm[k] = std::sqrt(column_norm[k]);
      for (size_t l = 0; l < n; ++l)
        for (size_t i = 0; i < r.size(); ++i) a[k][l] += jac[i][k] * jac[i][l];
      for (size_t i = 0; i < r.size(); ++i) g[k] += jac[i][k] * r[i];
      a[k][k] += kPriorWeight;
      g[k] += kPriorWeight * (t[k] - t0[k]);
    }
    bool improved = false;
    double step = 0;
    for (int tries = 0; tries < 12 && !improved; ++tries) {
      std::vector<std::vector<double>> damped = a;
      std::vector<double> minus_g(n);
      for (size_t k = 0; k < n; ++k) {
        damped[k][k] += mu * (a[k][k] + 1e-9);
        minus_g[k] = -g[k];
      }
      const std::vector<double> d = solve(damped, minus_g);
      std::vector<double> tn = t;
      step = 0;
      for (size_t k = 0; k < n; ++k) {
        const Bounds b = bounds_of(k);
        tn[k] = std::clamp(t[k] + d[k], std::log(b.lo), std::log(b.hi));
        step = std::max(step, std::fabs(tn[k] - t[k]));
      }
      const std::vector<double> rn = residuals(prepared, runs, hw, tn);
      const double cn = cost_of(rn, tn, t0);
      if (cn < cost) {
        improved = true;
        const double gain = cost - cn;
        t = tn;
        r = rn;
        cost = cn;
        mu = std::max(1e-9, mu / 3);
        if (gain < 1e-12 * std::max(1.0, cost) || step < 1e-7) {
          step = 0;
        }
      } else {
        mu *= 4;
      }
    }
    if (!improved || step == 0) break;
  }
  Calibration c = prior;
  c.method = "fit";
  from_theta(c, t);
  c.determined.clear();
  for (size_t k = 0; k < n; ++k)
    if (column_norm[k] > 1e-3) c.determined.push_back(kParams[k]);
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < runs.size(); ++i) {
    rows.push_back({{"path", runs[i].path},
                    {"label", runs[i].label},
                    {"measured_step_s", runs[i].measured_step_s},
                    {"before_step_s", runs[i].measured_step_s * std::exp(r_before[i])},
                    {"after_step_s", runs[i].measured_step_s * std::exp(r[i])},
                    {"before_error_pct", 100.0 * (std::exp(r_before[i]) - 1.0)},
                    {"after_error_pct", 100.0 * (std::exp(r[i]) - 1.0)}});
  }
  c.details = {{"runs", rows}, {"iterations", iterations}, {"prior_weight", kPriorWeight},
               {"prior", prior.method.empty() ? "hwdb" : prior.method},
               {"objective", "sum of log(predicted / measured)^2 + prior_weight * sum of (log parameter - log prior)^2"}};
  return c;
}

nlohmann::json calibrate_leave_one_out(const std::vector<CalibrationRun>& runs, const HardwareSpec& hw,
                                       const Calibration& prior) {
  if (runs.size() < 2) fail_input("calibrate --leave-one-out: needs at least 2 runs (got " + std::to_string(runs.size()) + ")");
  nlohmann::json rows = nlohmann::json::array();
  double before_sum = 0, after_sum = 0;
  int worse = 0;
  const HardwareSpec prior_hw = apply_calibration(hw, prior, "prior");
  for (size_t i = 0; i < runs.size(); ++i) {
    std::vector<CalibrationRun> others;
    for (size_t k = 0; k < runs.size(); ++k)
      if (k != i) others.push_back(runs[k]);
    const Calibration fitted = fit_calibration(others, hw, prior);
    const double before = predict_run_step_s(runs[i], prior_hw);
    const double after = predict_run_step_s(runs[i], apply_calibration(hw, fitted, "leave-one-out"));
    const double m = runs[i].measured_step_s;
    const double eb = 100.0 * (before - m) / m, ea = 100.0 * (after - m) / m;
    const bool is_worse = std::fabs(ea) > std::fabs(eb);
    worse += is_worse ? 1 : 0;
    before_sum += std::fabs(eb);
    after_sum += std::fabs(ea);
    rows.push_back({{"path", runs[i].path},
                    {"label", runs[i].label},
                    {"measured_step_s", m},
                    {"before_step_s", before},
                    {"after_step_s", after},
                    {"before_error_pct", eb},
                    {"after_error_pct", ea},
                    {"worse", is_worse}});
  }
  const double n = double(runs.size());
  return {{"runs", rows}, {"mape_before_pct", before_sum / n}, {"mape_after_pct", after_sum / n}, {"worse_runs", worse},
          {"note", "each run predicted by a calibration fitted on the other runs only; error = (predicted - measured) / measured"}};
}

std::string calibration_report(const Calibration& c, const Calibration& prior) {
  std::ostringstream o;
  o << "calibration for " << c.device << (c.precision.empty() ? "" : " (" + c.precision + ")") << ", " << c.method << "\n";
  HardwareSpec dummy;
  dummy.matmul_efficiency = 0.0;
  const std::vector<double> tp = to_theta(prior, dummy), tc = to_theta(c, dummy);
  o << "  parameter                          prior        now          determined by the runs\n";
  for (size_t k = 0; k < kParams.size(); ++k) {
    const bool det = std::find(c.determined.begin(), c.determined.end(), kParams[k]) != c.determined.end();
    o << "  " << std::left << std::setw(35) << kParams[k] << std::setw(13) << value_text(k, std::exp(tp[k]))
      << std::setw(13) << value_text(k, std::exp(tc[k])) << (det ? "yes" : "no (kept at the prior)") << "\n";
  }
  if (c.details.contains("runs")) {
    o << "  residuals per run (error = (predicted - measured) / measured):\n";
    o << "    run                                      measured_s   prior_s     error    fitted_s    error\n";
    for (const auto& r : c.details["runs"]) {
      o << "    " << std::left << std::setw(40) << r.value("label", std::string()).substr(0, 40) << std::right << std::setw(10)
        << fixed(r["measured_step_s"].get<double>(), 4) << std::setw(11) << fixed(r["before_step_s"].get<double>(), 4)
        << std::setw(9) << fixed(r["before_error_pct"].get<double>(), 1) << "%" << std::setw(11)
        << fixed(r["after_step_s"].get<double>(), 4) << std::setw(8) << fixed(r["after_error_pct"].get<double>(), 1) << "%\n";
    }
  }
  return o.str();
}

std::string leave_one_out_report(const nlohmann::json& loo) {
  std::ostringstream o;
  o << "leave-one-out: each run predicted by a calibration fitted on the others\n";
  o << "  run                                      measured_s   before_s    error    after_s     error\n";
  for (const auto& r : loo["runs"]) {
    o << "  " << std::left << std::setw(40) << r.value("label", std::string()).substr(0, 40) << std::right << std::setw(10)
      << fixed(r["measured_step_s"].get<double>(), 4) << std::setw(11) << fixed(r["before_step_s"].get<double>(), 4) << std::setw(9)
      << fixed(r["before_error_pct"].get<double>(), 1) << "%" << std::setw(11) << fixed(r["after_step_s"].get<double>(), 4)
      << std::setw(8) << fixed(r["after_error_pct"].get<double>(), 1) << "%" << (r["worse"].get<bool>() ? "  worse after calibration" : "")
      << "\n";
  }
  o << "  mean |error|: before " << fixed(loo["mape_before_pct"].get<double>(), 1) << "%, after "
    << fixed(loo["mape_after_pct"].get<double>(), 1) << "%; " << loo["worse_runs"].get<int>() << " of " << loo["runs"].size()
    << " runs predicted worse after calibration\n";
  return o.str();
}

}  // namespace ftplan

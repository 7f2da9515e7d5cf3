#include "planner/validation.h"

#include <cmath>
#include <iomanip>
#include <map>
#include <sstream>

#include "planner/errors.h"
#include "planner/format.h"
#include "planner/framework.h"
#include "planner/job_fields.h"
#include "planner/hardware_spec.h"
#include "planner/memory_report.h"
#include "planner/model_spec.h"
#include "planner/plan_search.h"
#include "planner/training_setup.h"

namespace ftplan {
namespace {

double pct_error(double predicted, double measured) { return 100.0 * (predicted - measured) / measured; }

// The predicted figure that matches what the source measured.
double figure_for(const MemoryEstimate& e, const std::string& metric) {
  if (metric == "allocated" || metric == "active") return double(e.allocated_peak);
  if (metric == "device") return double(std::max({e.load.device_bytes, e.step.device_bytes, e.save.device_bytes}));
  // A figure of unknown metric (a number in a text, no tool named) is the run's peak: every phase's, at the
  // reserved level between allocated and nvidia-smi.
  if (metric == "unknown") return double(std::max({e.load.reserved_bytes, e.step.reserved_bytes, e.save.reserved_bytes}));
  return double(e.reserved_peak);  // reserved: the step's (torch.cuda.max_memory_reserved logged with the steps)
}

ValidationCase run_case(const nlohmann::json& c, const std::map<std::string, std::string>& metric_of) {
  ValidationCase v;
  v.id = c.value("id", "");
  v.source = c.value("source", "");
  const nlohmann::json& m = c.at("measured");
  v.metric = m.value("metric", metric_of.count(v.source) ? metric_of.at(v.source) : "unknown");
  v.measured_oom = m.value("oom", false);
  v.oom_boundary = c.contains("oom_boundary") && !c.at("oom_boundary").is_null();
  if (m.contains("peak_memory_bytes") && m.at("peak_memory_bytes").is_number())
    v.measured_bytes = m.at("peak_memory_bytes").get<double>();
  if (m.contains("tokens_per_s_per_gpu") && m.at("tokens_per_s_per_gpu").is_number())
    v.measured_tokens_per_s = m.at("tokens_per_s_per_gpu").get<double>();
  if (!c.value("expressible", true)) {
    v.skipped_because = "not expressible: " + c.value("not_expressible_because", std::string("?"));
    return v;
  }
  if (c.value("exclude", false)) {
    v.skipped_because = "excluded: " + c.value("exclude_because", std::string("?"));
    return v;
  }
  const std::string where = "published.json: " + v.id;
  TrainingSetup setup = training_setup_from_json(c.at("job"), where + ": job");
  apply_framework(setup, framework_profile(setup.framework));
  setup.headroom_fraction = 0;  // a published OOM is judged against the whole GPU
  const ModelSpec model = model_as_built(load_model(setup.model), framework_profile(setup.framework));
  apply_model(setup, model);
  HardwareSpec hw = load_hardware(setup.gpu);
  apply_topology(setup, hw);
  const Candidate cand = candidate_from_setup(setup, hw);
  const PlanContext ctx = prepare_plan(model, hw, setup, setup.num_gpus, shard_shape(cand.parallel));
  const RankedCandidate r = evaluate_candidate(ctx, cand, Objective::time, true);
  v.framework = setup.framework;
  v.strategy = cand.name;
  v.method = to_string(setup.method);
  v.scored = true;
  const double predicted = figure_for(r.memory, v.metric);
  v.predicted_bytes = predicted;
  // The planner's own device verdict (memory_model.h device_fits: the phases' device figures less the cache the
  // allocator releases before failing, and the caching allocator's replay), at no headroom: the whole GPU.
  v.predicted_oom = !r.memory.device_fits;
  if (v.measured_bytes && !v.measured_oom) v.error_pct = pct_error(predicted, *v.measured_bytes);
  v.predicted_tokens_per_s = r.step.tokens_per_s / std::max<int64_t>(1, r.gpus_used);
  if (v.measured_tokens_per_s) v.tokens_error_pct = pct_error(*v.predicted_tokens_per_s, *v.measured_tokens_per_s);
  return v;
}

void add_to(ValidationSource& s, const ValidationCase& v, double& mem_sum, double& tps_sum) {
  if (v.error_pct) {
    ++s.memory_cases;
    mem_sum += std::fabs(*v.error_pct);
  }
  if (v.tokens_error_pct) {
    ++s.throughput_cases;
    tps_sum += std::fabs(*v.tokens_error_pct);
  }
  if (v.oom_boundary && v.predicted_oom) {
    ++s.oom_cases;
    s.oom_right += *v.predicted_oom == v.measured_oom ? 1 : 0;
  }
}

}  // namespace

ValidationReport run_validation(const nlohmann::json& suite, const std::string& only_source) {
  if (!suite.is_object() || suite.value("format", "") != "ftplan-validation/1" || !suite.contains("cases"))
    fail_input("validation suite: expected {\"format\": \"ftplan-validation/1\", \"cases\": [...]}");
  ValidationReport report;
  if (suite.contains("thresholds")) {
    const auto& t = suite.at("thresholds");
    report.memory_threshold_pct = t.value("memory_mape_pct", report.memory_threshold_pct);
    report.throughput_threshold_pct = t.value("throughput_mape_pct", report.throughput_threshold_pct);
    report.min_cases_per_source = t.value("min_cases_per_source", report.min_cases_per_source);
  }
  std::map<std::string, std::string> metric_of;
  if (suite.contains("sources"))
    for (auto it = suite.at("sources").begin(); it != suite.at("sources").end(); ++it)
      metric_of[it.key()] = it->value("metric", "unknown");
  bool found = only_source.empty();
  for (const auto& c : suite.at("cases")) {
    if (!only_source.empty() && c.value("source", "") != only_source) continue;
    found = true;
    report.cases.push_back(run_case(c, metric_of));
  }
  if (!found) fail_input("--source: no case of source '" + only_source + "'");

  std::map<std::string, std::pair<double, double>> sums;
  std::map<std::string, ValidationSource> by_source;
  double mem_all = 0, tps_all = 0;
  report.overall.source = "overall";
  for (const auto& v : report.cases) {
    if (!v.scored) continue;
    ValidationSource& s = by_source[v.source];
    s.source = v.source;
    s.metric = metric_of.count(v.source) ? metric_of.at(v.source) : v.metric;
    add_to(s, v, sums[v.source].first, sums[v.source].second);
    add_to(report.overall, v, mem_all, tps_all);
  }
  auto finish = [&](ValidationSource& s, double mem, double tps) {
    s.memory_mape_pct = s.memory_cases ? mem / s.memory_cases : 0;
    s.throughput_mape_pct = s.throughput_cases ? tps / s.throughput_cases : 0;
    s.meets_memory = s.memory_cases < report.min_cases_per_source || s.memory_mape_pct <= report.memory_threshold_pct;
    s.meets_throughput =
        s.throughput_cases < report.min_cases_per_source || s.throughput_mape_pct <= report.throughput_threshold_pct;
  };
  for (auto& [name, s] : by_source) {
    finish(s, sums[name].first, sums[name].second);
    report.sources.push_back(s);
  }
  finish(report.overall, mem_all, tps_all);
  report.overall.meets_memory = report.overall.memory_mape_pct <= report.memory_threshold_pct;
  report.overall.meets_throughput = report.overall.throughput_mape_pct <= report.throughput_threshold_pct;
  auto fmt = [](double x) { return format_fixed(x, 1); };
  auto& missed = report.goals_missed;
  for (const auto& s : report.sources) {
    if (!s.meets_memory)
      missed.push_back(s.source + ": memory MAPE " + fmt(s.memory_mape_pct) + "% > " +
                                fmt(report.memory_threshold_pct) + "% over " + std::to_string(s.memory_cases) + " cases");
    if (!s.meets_throughput)
      missed.push_back(s.source + ": throughput MAPE " + fmt(s.throughput_mape_pct) + "% > " +
                                fmt(report.throughput_threshold_pct) + "% over " + std::to_string(s.throughput_cases) +
                                " cases");
  }
  if (!report.overall.meets_memory)
    missed.push_back("overall: memory MAPE " + fmt(report.overall.memory_mape_pct) + "% > " +
                              fmt(report.memory_threshold_pct) + "%");
  if (!report.overall.meets_throughput)
    missed.push_back("overall: throughput MAPE " + fmt(report.overall.throughput_mape_pct) + "% > " +
                              fmt(report.throughput_threshold_pct) + "%");
  if (report.overall.oom_right < report.overall.oom_cases)
    missed.push_back("OOM boundary: " + std::to_string(report.overall.oom_cases - report.overall.oom_right) + " of " +
                     std::to_string(report.overall.oom_cases) + " fit/OOM calls wrong");
  report.goals_met = missed.empty();

  // The guards: today's accuracy, so that a regression fails. A run of one source checks its own.
  if (suite.contains("guards")) {
    const auto& g = suite.at("guards");
    auto guard = [&](const ValidationSource& s, const nlohmann::json& limits) {
      if (limits.contains("memory_mape_pct") && s.memory_cases && s.memory_mape_pct > limits.at("memory_mape_pct").get<double>())
        report.failures.push_back(s.source + ": memory MAPE " + fmt(s.memory_mape_pct) + "% > guard " +
                                  fmt(limits.at("memory_mape_pct").get<double>()) + "%");
      if (limits.contains("throughput_mape_pct") && s.throughput_cases &&
          s.throughput_mape_pct > limits.at("throughput_mape_pct").get<double>())
        report.failures.push_back(s.source + ": throughput MAPE " + fmt(s.throughput_mape_pct) + "% > guard " +
                                  fmt(limits.at("throughput_mape_pct").get<double>()) + "%");
      if (limits.contains("oom_wrong_max") && s.oom_cases - s.oom_right > limits.at("oom_wrong_max").get<int>())
        report.failures.push_back(s.source + ": " + std::to_string(s.oom_cases - s.oom_right) +
                                  " fit/OOM calls wrong > guard " + std::to_string(limits.at("oom_wrong_max").get<int>()));
    };
    if (only_source.empty() && g.contains("overall")) guard(report.overall, g.at("overall"));
    if (g.contains("sources"))
      for (const auto& s : report.sources)
        if (g.at("sources").contains(s.source)) guard(s, g.at("sources").at(s.source));
  }
  report.passed = report.failures.empty();
  return report;
}

nlohmann::json validation_json(const ValidationReport& r) {
  auto opt = [](const std::optional<double>& x) { return x ? nlohmann::json(*x) : nlohmann::json(nullptr); };
  nlohmann::json cases = nlohmann::json::array();
  for (const auto& v : r.cases) {
    cases.push_back({{"id", v.id},
                     {"source", v.source},
                     {"metric", v.metric},
                     {"scored", v.scored},
                     {"skipped_because", v.skipped_because.empty() ? nlohmann::json(nullptr) : nlohmann::json(v.skipped_because)},
                     {"framework", v.framework},
                     {"strategy", v.strategy},
                     {"method", v.method},
                     {"measured_bytes", opt(v.measured_bytes)},
                     {"predicted_bytes", opt(v.predicted_bytes)},
                     {"error_pct", opt(v.error_pct)},
                     {"measured_oom", v.measured_oom},
                     {"predicted_oom", v.predicted_oom ? nlohmann::json(*v.predicted_oom) : nlohmann::json(nullptr)},
                     {"oom_boundary", v.oom_boundary},
                     {"measured_tokens_per_s_per_gpu", opt(v.measured_tokens_per_s)},
                     {"predicted_tokens_per_s_per_gpu", opt(v.predicted_tokens_per_s)},
                     {"tokens_error_pct", opt(v.tokens_error_pct)}});
  }
  auto source_json = [](const ValidationSource& s) {
    return nlohmann::json{{"source", s.source},
                          {"metric", s.metric},
                          {"memory_cases", s.memory_cases},
                          {"memory_mape_pct", s.memory_mape_pct},
                          {"throughput_cases", s.throughput_cases},
                          {"throughput_mape_pct", s.throughput_mape_pct},
                          {"oom_boundary_cases", s.oom_cases},
                          {"oom_boundary_right", s.oom_right},
                          {"meets_memory", s.meets_memory},
                          {"meets_throughput", s.meets_throughput}};
  };
  nlohmann::json sources = nlohmann::json::array();
  for (const auto& s : r.sources) sources.push_back(source_json(s));
  return {{"cases", cases},
          {"sources", sources},
          {"overall", source_json(r.overall)},
          {"thresholds", {{"memory_mape_pct", r.memory_threshold_pct},
                          {"throughput_mape_pct", r.throughput_threshold_pct},
                          {"min_cases_per_source", r.min_cases_per_source}}},
          {"goals_met", r.goals_met},
          {"goals_missed", r.goals_missed},
          {"passed", r.passed},
          {"guards_exceeded", r.failures}};
}

std::string validation_table(const ValidationReport& r) {
  std::ostringstream out;
  auto gib = [](const std::optional<double>& b) { return b ? format_fixed(*b / double(1ll << 30), 2) : std::string("-"); };
  auto num = [](const std::optional<double>& x, int d) { return x ? format_fixed(*x, d) : std::string("-"); };
  out << std::left << std::setw(40) << "case" << std::setw(10) << "metric" << std::right << std::setw(10) << "meas GiB"
      << std::setw(10) << "pred GiB" << std::setw(8) << "err %" << std::setw(6) << "OOM" << std::setw(10) << "meas t/s"
      << std::setw(10) << "pred t/s" << std::setw(8) << "err %" << "\n";
  int skipped = 0;
  for (const auto& v : r.cases) {
    if (!v.scored) {
      ++skipped;
      continue;
    }
    std::string oom = v.oom_boundary || v.measured_oom
                          ? std::string(v.measured_oom ? "oom" : "fit") + (v.predicted_oom && *v.predicted_oom == v.measured_oom ? "" : "!")
                          : "";
    out << std::left << std::setw(40) << v.id.substr(0, 39) << std::setw(10) << v.metric << std::right << std::setw(10)
        << (v.measured_oom ? std::string("OOM") : gib(v.measured_bytes)) << std::setw(10) << gib(v.predicted_bytes)
        << std::setw(8) << num(v.error_pct, 1) << std::setw(6) << oom << std::setw(10) << num(v.measured_tokens_per_s, 0)
        << std::setw(10) << num(v.predicted_tokens_per_s, 0) << std::setw(8) << num(v.tokens_error_pct, 1) << "\n";
  }
  out << "\n" << std::left << std::setw(36) << "source" << std::setw(11) << "metric" << std::right << std::setw(7) << "cases"
      << std::setw(12) << "mem MAPE %" << std::setw(7) << "t/s n" << std::setw(12) << "t/s MAPE %" << std::setw(11)
      << "OOM right" << "\n";
  auto row = [&](const ValidationSource& s) {
    out << std::left << std::setw(36) << s.source << std::setw(11) << s.metric << std::right << std::setw(7)
        << s.memory_cases << std::setw(12) << (s.memory_cases ? format_fixed(s.memory_mape_pct, 1) : "-")
        << std::setw(7) << s.throughput_cases << std::setw(12)
        << (s.throughput_cases ? format_fixed(s.throughput_mape_pct, 1) : "-") << std::setw(11)
        << (s.oom_cases ? std::to_string(s.oom_right) + "/" + std::to_string(s.oom_cases) : "-")
        << (s.meets_memory && s.meets_throughput ? "" : "  over goal") << "\n";
  };
  for (const auto& s : r.sources) row(s);
  row(r.overall);
  out << "\n" << skipped << " case(s) not scored (not expressible yet, or excluded; --json lists why)\n";
  out << "goals: memory MAPE <= " << format_fixed(r.memory_threshold_pct, 0) << "% and throughput MAPE <= "
      << format_fixed(r.throughput_threshold_pct, 0) << "% overall and per source with >= " << r.min_cases_per_source
      << " cases; every OOM-boundary call right\n";
  if (r.goals_met) {
    out << "goals met\n";
  } else {
    out << "goals not met yet:\n";
    for (const auto& f : r.goals_missed) out << "  " << f << "\n";
  }
  if (r.passed) {
    out << "guards held (no source is less accurate than the suite records): validation passed\n";
  } else {
    out << "validation failed, guards exceeded (predictions got worse):\n";
    for (const auto& f : r.failures) out << "  " << f << "\n";
  }
  return out.str();
}

}  // namespace ftplan

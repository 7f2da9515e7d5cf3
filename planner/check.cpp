#include "planner/check.h"

#include <sstream>

#include "planner/format.h"
#include "planner/plan_report.h"

namespace ftplan {
namespace {

bool meets_all(const std::vector<LimitVerdict>& v) {
  for (const auto& x : v)
    if (!x.ok) return false;
  return true;
}

}  // namespace

std::vector<LimitVerdict> judge_plan(const RankedCandidate& r, const HardwareSpec& hw, const CheckLimits& limits,
                                     const TrainingSetup& setup) {
  std::vector<LimitVerdict> out;
  if (limits.max_hours) {
    LimitVerdict v{"time", true, r.job_time_s / 3600.0, *limits.max_hours, "h", ""};
    v.ok = r.has_job && v.value <= v.limit_value;
    v.detail = format_fixed(v.value, 2) + " h vs limit " + format_fixed(v.limit_value, 2) + " h" +
               (v.ok ? "" : " (over by " + format_fixed(v.value - v.limit_value, 2) + " h, " +
                                format_fixed((v.value / v.limit_value - 1) * 100, 1) + "%)");
    out.push_back(v);
  }
  if (limits.max_cost) {
    LimitVerdict v{"cost", true, r.cost_usd, *limits.max_cost, "USD", ""};
    v.ok = r.has_job && v.value <= v.limit_value;
    v.detail = format_fixed(v.value, 2) + " USD vs limit " + format_fixed(v.limit_value, 2) + " USD" +
               (v.ok ? "" : " (over by " + format_fixed(v.value - v.limit_value, 2) + " USD)");
    out.push_back(v);
  }
  if (limits.max_memory_fraction) {
    const double fraction = r.memory.per_gpu.total / double(hw.memory_bytes);
    LimitVerdict v{"memory", fraction <= *limits.max_memory_fraction, fraction, *limits.max_memory_fraction,
                   "fraction of GPU memory", ""};
    v.detail = format_fixed(fraction, 3) + " of " + format_gib(hw.memory_bytes) + " vs limit " +
               format_fixed(v.limit_value, 3) +
               (v.ok ? "" : " (over by " + format_gib(r.memory.per_gpu.total - v.limit_value * hw.memory_bytes) + ")");
    out.push_back(v);
  }
  if (limits.max_host_memory_fraction) {
    const double host = setup.host_memory_gib ? *setup.host_memory_gib * double(1ll << 30) : double(hw.host_memory_bytes_per_node);
    const double fraction = r.memory.host_per_node / host;
    LimitVerdict v{"host memory", fraction <= *limits.max_host_memory_fraction, fraction, *limits.max_host_memory_fraction,
                   "fraction of host memory", ""};
    const auto& m = r.memory;
    const char* phase = m.host_per_node == m.load.host_bytes_per_node ? "load"
                        : m.host_per_node == m.save.host_bytes_per_node ? "save"
                                                                         : "step";
    v.detail = format_fixed(fraction, 3) + " of " + format_gib(host) + " per node (peak " + format_gib(m.host_per_node) +
               " while " + (std::string(phase) == "load" ? "loading" : std::string(phase) == "save" ? "saving" : "training") +
               ") vs limit " + format_fixed(v.limit_value, 3) +
               (v.ok ? "" : " (over by " + format_gib(r.memory.host_per_node - v.limit_value * host) + ")");
    out.push_back(v);
  }
  return out;
}

CheckResult check_plan(const PlanResult& plan, const HardwareSpec& hw, const TrainingSetup& setup,
                       const CheckLimits& limits, bool any) {
  CheckResult c;
  c.mode = any ? "any" : setup.strategy || setup.parallel ? "strategy" : "recommended";
  c.candidates_feasible = static_cast<int64_t>(plan.candidates.size());
  std::optional<RankedCandidate> first_meeting;
  for (const auto& cand : plan.candidates) {  // best first
    if (!meets_all(judge_plan(cand, hw, limits, setup))) continue;
    ++c.candidates_meeting;
    if (!first_meeting) first_meeting = cand;
  }
  if (!plan.recommended) {
    c.summary = "check failed: no plan fits " + std::to_string(setup.num_gpus) + "x " + hw.id;
    return c;
  }
  c.judged = any && first_meeting ? first_meeting : plan.recommended;
  c.verdicts = judge_plan(*c.judged, hw, limits, setup);
  c.passed = meets_all(c.verdicts);
  int violated = 0;
  for (const auto& v : c.verdicts) violated += v.ok ? 0 : 1;
  if (c.passed)
    c.summary = any ? "check passed: " + std::to_string(c.candidates_meeting) + " of " +
                          std::to_string(c.candidates_feasible) + " feasible plans meet every limit"
                    : "check passed";
  else
    c.summary = "check failed: " + std::to_string(violated) + " limit(s) violated" +
                (any ? " by the best plan; none of " + std::to_string(c.candidates_feasible) +
                           " feasible plans meets every limit"
                     : "");
  return c;
}

nlohmann::json check_json(const CheckResult& c, const PlanResult& plan, const HardwareSpec& hw, const TrainingSetup& setup) {
  nlohmann::json j;
  j["passed"] = c.passed;
  j["exit_code"] = c.passed ? 0 : 1;
  j["mode"] = c.mode;
  j["gpu"] = hw.id;
  j["gpus"] = setup.num_gpus;
  j["summary"] = c.summary;
  j["candidates_feasible"] = c.candidates_feasible;
  j["candidates_meeting_limits"] = c.candidates_meeting;
  j["plan"] = c.judged ? ranked_candidate_json(*c.judged) : nlohmann::json(nullptr);
  nlohmann::json limits = nlohmann::json::array();
  for (const auto& v : c.verdicts)
    limits.push_back({{"limit", v.limit}, {"ok", v.ok}, {"value", v.value}, {"max", v.limit_value}, {"unit", v.unit},
                      {"detail", v.detail}});
  j["limits"] = limits;
  if (!c.judged) {
    nlohmann::json reasons = nlohmann::json::array();
    for (const auto& s : plan.strategies) reasons.push_back({{"strategy", s.name}, {"verdict", s.verdict}});
    j["strategies"] = reasons;
  }
  return j;
}

std::string check_report(const CheckResult& c, const PlanResult& plan, const HardwareSpec& hw, const TrainingSetup& setup) {
  std::ostringstream out;
  if (!c.judged) {
    out << "FAIL memory: no plan fits " << setup.num_gpus << "x " << hw.id << "\n";
    for (const auto& s : plan.strategies) out << "  " << s.name << ": " << s.verdict << "\n";
    out << c.summary << "\n";
    return out.str();
  }
  const RankedCandidate& r = *c.judged;
  out << "plan" << (c.mode == "any" ? " (best meeting the limits)" : c.mode == "strategy" ? " (fixed strategy)" : "")
      << ": " << r.candidate.name << " on " << r.gpus_used << "x " << hw.id << ", micro-batch "
      << r.candidate.micro_batch << ", checkpointing " << to_string(r.candidate.checkpointing) << "\n";
  for (const auto& v : c.verdicts) out << (v.ok ? "ok   " : "FAIL ") << v.limit << ": " << v.detail << "\n";
  out << c.summary << "\n";
  return out.str();
}

}  // namespace ftplan

// `ftplan check`: a CI gate. A plan of the job is judged against limits (job time, cost, share of
// GPU memory); the verdict is computed once and printed as text or JSON. Exit codes: 0 the judged
// plan meets every limit, 1 a limit is violated (or nothing fits), 2 bad input.
// Which plan is judged:
//   default        the recommended plan (the planner's best by the objective)
//   --strategy S   the best plan of strategy S (the job's strategy field: the search is limited to it)
//   --any          the best plan that meets every limit; the check fails only when none does
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/plan_search.h"

namespace ftplan {

struct CheckLimits {
  std::optional<double> max_hours;            // longest acceptable job, hours
  std::optional<double> max_cost;             // highest acceptable job cost, USD
  std::optional<double> max_memory_fraction;  // largest acceptable share of the GPU's memory
  std::optional<double> max_host_memory_fraction;  // largest acceptable share of a node's host memory
};

struct LimitVerdict {
  std::string limit;        // "time", "cost", "memory", "host memory"
  bool ok = true;
  double value = 0;         // the plan's figure, in `unit`
  double limit_value = 0;
  std::string unit;         // "h", "USD", "fraction of GPU memory"
  std::string detail;       // "2.31 h vs limit 2.00 h (over by 0.31 h, 15.5%)"
};

struct CheckResult {
  bool passed = false;
  std::string mode;                        // "recommended", "strategy", "any"
  std::optional<RankedCandidate> judged;   // the plan judged; empty when nothing fits
  std::vector<LimitVerdict> verdicts;      // one per limit given
  int64_t candidates_meeting = 0;          // feasible plans that meet every limit
  int64_t candidates_feasible = 0;
  std::string summary;                     // one line: "check passed", "check failed: 1 limit(s) violated", ...
};

// The verdicts of one plan.
std::vector<LimitVerdict> judge_plan(const RankedCandidate& plan, const HardwareSpec& hw, const CheckLimits& limits,
                                     const TrainingSetup& setup);

// `any`: judge the best plan that meets every limit (else the recommended one).
CheckResult check_plan(const PlanResult& plan, const HardwareSpec& hw, const TrainingSetup& setup,
                       const CheckLimits& limits, bool any);

nlohmann::json check_json(const CheckResult& result, const PlanResult& plan, const HardwareSpec& hw,
                          const TrainingSetup& setup);
std::string check_report(const CheckResult& result, const PlanResult& plan, const HardwareSpec& hw,
                         const TrainingSetup& setup);

}  // namespace ftplan

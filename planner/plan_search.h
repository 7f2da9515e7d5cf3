// The choice: every feasible (strategy, micro-batch, checkpointing) candidate of a job, ranked by
// time or by cost, with one line on why the winner beats the runner-up and one line on why each
// other strategy lost.
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "planner/step_time.h"

namespace ftplan {

enum class Objective { time, cost };
Objective parse_objective(const std::string& s, const std::string& field);
std::string to_string(Objective o);

struct RankedCandidate {
  Candidate candidate;
  MemoryEstimate memory;
  StepEstimate step;
  int64_t gpus_used = 1;
  bool has_job = false;     // a dataset was given: job time and cost are known
  double job_time_s = 0;    // whole job: dataset tokens × epochs / tokens_per_s
  double gpu_hours = 0;
  double cost_usd = 0;
  double cost_usd_per_million_tokens = 0;
  double score = 0;         // what the objective minimises
};

// The best candidate of one layout (a preset, or a composition of degrees).
struct StrategyOutcome {
  std::string name;         // "fsdp", "tp=8,pp=2,dp_shard=4"
  Parallelism parallel;
  bool feasible = false;
  RankedCandidate best;     // the fastest/cheapest feasible candidate, or the smallest infeasible one
  std::string verdict;      // "recommended", "out of memory by ...", "1.9x slower: ..."
};

struct PlanResult {
  Objective objective = Objective::time;
  std::vector<RankedCandidate> candidates;  // feasible, best first
  std::vector<StrategyOutcome> strategies;  // one per layout considered (presets, then compositions)
  std::optional<RankedCandidate> recommended;
  std::string reason;         // why the winner beats the runner-up
  std::string knobs;          // why it uses (or not) checkpointing and activation offload
  std::string rule_of_thumb;  // the seeds' rules, and whether the numbers agree
  int64_t evaluated = 0;      // candidates evaluated
  int64_t compositions_considered = 0;  // layouts beyond the presets (tp, cp, pp with data parallelism)
  bool fits_one_gpu = false;  // some candidate fits a single GPU (the rules of thumb hinge on it)
};

struct SearchSpace {
  std::vector<Candidate> layouts;  // name and parallel of each layout searched (the rest filled per candidate)
  std::vector<int64_t> micro_batches;
  std::vector<Checkpointing> checkpointing;
  std::vector<Attention> attention;
  std::vector<bool> activation_offload{false};
};
// How far the search goes beyond the presets.
struct SearchOptions {
  bool compositions = true;         // also compose tp, sp, cp and pp with data parallelism where the
                                    // framework offers them (composition_layouts)
  size_t compositions_reported = 5; // the best feasible compositions listed beside the presets
};

// Every layout of N GPUs the framework can run beyond the presets: tp (powers of two within a node)
// x sp x cp x pp (with the framework's schedules, interleaved with 2 or 4 chunks per stage) x the
// data-parallel rest (replicas, the framework's sharding, hybrid sharding per node); each valid for
// the model (parallelism_problems).
std::vector<Parallelism> composition_layouts(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup);

// What the user fixed stays fixed; the rest is searched (micro-batches 1, 2, 4, ... 64).
SearchSpace search_space(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup,
                         bool compositions = true);

// The rental price a plan is costed at, USD per GPU-hour: the user's --price-per-gpu-hour
// (price_per_gpu_hour; in a sweep, for every GPU type), else the hwdb entry's dated price.
double gpu_hour_price_usd(const HardwareSpec& hw, const TrainingSetup& setup);

// Evaluates one candidate (memory and step time, job time and cost): the search's inner loop.
RankedCandidate evaluate_candidate(const PlanContext& context, const Candidate& candidate, Objective objective,
                                   bool explain = false, const StepOptions& options = {});

// The ranking order: lower score first; plans within 0.5% of each other go to the simpler strategy
// (single, ddp, zero1, zero2, fsdp, zero3, ..., offload last).
bool ranks_before(const RankedCandidate& a, const RankedCandidate& b);

// Sorts by score, then moves near-ties to the simpler strategy: the tie rule is not transitive, so
// an insertion pass after the sort applies it. `get` maps an element to its RankedCandidate.
template <typename T, typename Get>
void sort_by_rank(std::vector<T>& items, Get get) {
  std::stable_sort(items.begin(), items.end(), [&](const T& a, const T& b) { return get(a).score < get(b).score; });
  for (size_t i = 1; i < items.size(); ++i)
    for (size_t k = i; k > 0 && ranks_before(get(items[k]), get(items[k - 1])); --k) std::swap(items[k], items[k - 1]);
}
inline void sort_by_rank(std::vector<RankedCandidate>& items) {
  sort_by_rank(items, [](const RankedCandidate& c) -> const RankedCandidate& { return c; });
}

PlanResult plan_job(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup,
                    Objective objective, const StepOptions& options = {}, const SearchOptions& search = {});

// Fills recommended, reason, each strategy's verdict and the rule-of-thumb line from the ranked
// candidates (plan_job calls it; a re-ranking such as --simulate calls it again).
void explain_plan(PlanResult& plan, int64_t num_gpus);

}  // namespace ftplan

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "planner/errors.h"
#include "planner/format.h"
#include "planner/json_fields.h"
#include "planner/output_file.h"
#include "planner/plan_report.h"
#include "simulator/chrome_trace.h"
#include "simulator/plan_inputs.h"
#include "simulator/simulate.h"

namespace ftplan::cli {
namespace {

// The candidate to simulate: what the user fixed, the rest from the planner's recommendation
// (or, when nothing fits, the strategy's smallest candidate).
Candidate chosen_candidate(const LoadedJob& job) {
  const PlanResult plan = plan_job(job.model, job.hardware, job.setup, Objective::time);
  if (plan.recommended) return plan.recommended->candidate;
  for (const auto& o : plan.strategies) return o.best.candidate;
  fail_input("simulate: no strategy applies to this job");
}

}  // namespace

void rerank_with_simulator(const LoadedJob& job, PlanResult& plan) {
  if (plan.candidates.empty()) return;
  // The finalists: each strategy's best feasible candidate by the closed form, re-timed by the
  // simulator (its step time and exposed communication replace the closed form's).
  std::vector<RankedCandidate> finalists;
  for (const auto& o : plan.strategies)
    if (o.feasible) finalists.push_back(o.best);
  for (auto& f : finalists) {
    const PlanContext ctx = prepare_plan(job.model, job.hardware, job.setup, job.setup.num_gpus, shard_shape(f.candidate.parallel));
    const sim::StepSimulation s = sim::simulate_step(sim::step_inputs_from_plan(ctx, f.candidate));
    const double scale = s.schedule.step_time_s / f.step.step_time_s;
    f.step.step_time_s = s.schedule.step_time_s;
    f.step.exposed_comm_s = s.schedule.ranks.at(0).exposed_comm_s + s.schedule.ranks.at(0).exposed_host_s;
    f.step.tokens_per_s /= scale;
    f.step.mfu /= scale;
    f.job_time_s *= scale;
    f.gpu_hours *= scale;
    f.cost_usd *= scale;
    f.cost_usd_per_million_tokens *= scale;
    f.score *= scale;
  }
  sort_by_rank(finalists);
  for (auto& o : plan.strategies)
    for (const auto& f : finalists)
      if (f.candidate.parallel == o.parallel) o.best = f;
  plan.candidates = finalists;
  explain_plan(plan, job.setup.num_gpus);
  plan.reason = "ranked by the simulated step: " + plan.reason;
}

int run_simulate(const SimulateOptions& o) {
  if (!o.trace.empty()) check_output_path(o.trace, "--trace");
  const LoadedJob job = load_job(o.job);
  const Candidate candidate = chosen_candidate(job);
  const PlanContext ctx = prepare_plan(job.model, job.hardware, job.setup, job.setup.num_gpus, shard_shape(candidate.parallel));
  const sim::StepInputs inputs = sim::step_inputs_from_plan(ctx, candidate);
  const sim::StepSimulation s = sim::simulate_step(inputs);
  const StepEstimate closed = estimate_step(ctx, candidate);
  const MemoryEstimate memory = estimate_memory(ctx.memory, candidate, ctx.num_gpus);
  if (!o.trace.empty()) write_output(o.trace, sim::chrome_trace_json(s.graph, s.schedule, candidate.parallel).dump(), "--trace");

  nlohmann::json summary = sim::simulation_summary_json(inputs, s);
  summary["candidate"] = {{"strategy", candidate.name},
                          {"parallel", parallelism_json(candidate.parallel)},
                          {"micro_batch", candidate.micro_batch},
                          {"checkpointing", to_string(candidate.checkpointing)},
                          {"attention", to_string(candidate.attention)},
                          {"gpus", ctx.num_gpus}};
  summary["closed_form"] = {{"step_time_s", closed.step_time_s},
                            {"exposed_comm_s", closed.exposed_comm_s},
                            {"bubble_fraction", closed.bubble_fraction},
                            {"peak_memory_bytes", memory.per_gpu.total}};
  if (!o.trace.empty()) summary["trace"] = o.trace;
  if (o.job.json) {
    add_import_json(job, summary);
    std::cout << summary.dump(2) << "\n";
    return 0;
  }
  std::ostringstream out;
  out << job.model.name << ", " << candidate.name << " on " << ctx.num_gpus << "x " << job.hardware.id
      << ", micro-batch " << candidate.micro_batch << ", grad-accum " << job.setup.grad_accum << ", checkpointing "
      << to_string(candidate.checkpointing) << "\n";
  if (s.coarsening.applied) out << "note: " << s.coarsening.note << "\n";
  out << "simulated step " << format_fixed(s.schedule.step_time_s, 4) << " s (closed form "
      << format_fixed(closed.step_time_s, 4) << " s), " << sim::graph_op_count(s.graph) << " ops\n\n";
  out << std::setw(6) << "rank" << std::setw(12) << "finish s" << std::setw(12) << "busy s" << std::setw(14)
      << "exposed comm" << std::setw(10) << "idle s" << std::setw(9) << "bubble" << std::setw(14) << "peak GiB" << "\n";
  for (const auto& r : summary["ranks"]) {
    out << std::setw(6) << r["rank"].get<int>() << std::setw(12) << format_fixed(r["finish_s"].get<double>(), 4)
        << std::setw(12) << format_fixed(r["compute_busy_s"].get<double>(), 4) << std::setw(14)
        << format_fixed(r["exposed_comm_s"].get<double>(), 4) << std::setw(10) << format_fixed(r["idle_s"].get<double>(), 4)
        << std::setw(9) << format_fixed(r["bubble_fraction"].get<double>() * 100, 1) + "%" << std::setw(14)
        << format_fixed(r["peak_memory_bytes"].get<double>() / double(1LL << 30), 2) << "\n";
  }
  const auto& r0 = summary["ranks"][0];
  out << "\nrank " << r0["rank"].get<int>() << " at its peak (" << format_fixed(r0["peak_time_s"].get<double>(), 4)
      << " s into the step), largest allocations alive:\n";
  int shown = 0;
  for (const auto& a : r0["alive_at_peak"]) {
    if (shown++ == 6) break;
    out << "  " << std::setw(12) << format_bytes(a["bytes"].get<double>()) << "  " << a["label"].get<std::string>() << "\n";
  }
  out << "closed-form peak " << format_gib(memory.per_gpu.total) << " vs simulated "
      << format_gib(r0["peak_memory_bytes"].get<double>()) << " on rank " << r0["rank"].get<int>() << "\n";
  if (!o.trace.empty()) out << "trace written to " << o.trace << " (open in Perfetto or chrome://tracing)\n";
  std::cout << out.str() << import_text(job);
  return 0;
}

}  // namespace ftplan::cli

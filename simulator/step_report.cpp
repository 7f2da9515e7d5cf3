#include "simulator/step_report.h"

#include <algorithm>
#include <array>
#include <map>
#include <optional>

#include "planner/errors.h"
#include "planner/format.h"
#include "simulator/plan_inputs.h"

namespace ftplan::sim {
namespace {

constexpr double kBytesPerGiB = 1024.0 * 1024.0 * 1024.0;

// One colour per OpKind, in its order: compute in blues and oranges, collectives in reds and
// purples, sends green, host copies teal, the optimizer yellow.
const std::array<const char*, kOpKindCount> kOpColors = {
    "#4e79a7",  // forward
    "#f28e2b",  // backward_input
    "#ffbe7d",  // backward_weight
    "#a0cbe8",  // recompute
    "#e15759",  // all_reduce
    "#b07aa1",  // reduce_scatter
    "#ff9da7",  // all_gather
    "#59a14f",  // send
    "#76b7b2",  // copy_to_host
    "#499894",  // copy_to_device
    "#edc948",  // optimizer_step
};

// Where the simulated graph's last op ends (a coarsened step's schedule holds the simulated
// micro-batches; its step_time_s is extrapolated to the job's).
double simulated_end_s(const Schedule& schedule) {
  double end = 0;
  for (const OpTiming& t : schedule.ops) end = std::max(end, t.end_s);
  for (const RankTimeline& r : schedule.ranks)
    for (const MemorySample& m : r.memory) end = std::max(end, m.time_s);
  return end;
}

std::string gib(double bytes) { return format_fixed(bytes / kBytesPerGiB, 2); }

}  // namespace

std::vector<int> shown_ranks(int num_ranks, int max_ranks) {
  std::vector<int> ranks;
  if (num_ranks <= 0) return ranks;
  max_ranks = std::max(max_ranks, 1);
  if (num_ranks <= max_ranks) {
    for (int r = 0; r < num_ranks; ++r) ranks.push_back(r);
    return ranks;
  }
  if (max_ranks == 1) return {0};
  for (int i = 0; i < max_ranks; ++i) {
    const int r = static_cast<int>((static_cast<int64_t>(i) * (num_ranks - 1) + (max_ranks - 1) / 2) / (max_ranks - 1));
    if (ranks.empty() || ranks.back() != r) ranks.push_back(r);
  }
  return ranks;
}

svg::TimelineChart step_timeline_chart(const OpGraph& g, const Schedule& schedule, const std::vector<int>& ranks) {
  svg::TimelineChart chart;
  chart.title = "Simulated step: what each stream of each rank runs";
  chart.x_label = "time into the step (s)";
  chart.x_max = simulated_end_s(schedule);
  std::map<int, size_t> position;
  for (size_t i = 0; i < ranks.size(); ++i) position[ranks[i]] = i;
  std::vector<std::array<std::vector<svg::TimelineInterval>, kStreamCount>> lanes(ranks.size());
  std::array<bool, kOpKindCount> present{};
  for (OpId v = 0; v < graph_op_count(g); ++v) {
    const Op& op = graph_op(g, v);
    const auto it = position.find(op.rank);
    if (it == position.end()) continue;
    const OpTiming& t = schedule.ops.at(v);
    const int kind = static_cast<int>(op.kind);
    present[kind] = true;
    lanes[it->second][static_cast<int>(op.stream)].push_back({t.start_s, t.end_s, size_t(kind), op.label});
  }
  std::array<size_t, kOpKindCount> category{};
  for (int k = 0; k < kOpKindCount; ++k)
    if (present[k]) {
      category[k] = chart.categories.size();
      chart.categories.push_back({op_kind_name(static_cast<OpKind>(k)), kOpColors[k]});
    }
  for (size_t i = 0; i < ranks.size(); ++i)
    for (int s = 0; s < kStreamCount; ++s) {
      if (lanes[i][s].empty()) continue;
      svg::TimelineLane lane;
      lane.label = "rank " + std::to_string(ranks[i]) + " " + stream_name(static_cast<Stream>(s));
      lane.intervals = std::move(lanes[i][s]);
      for (auto& iv : lane.intervals) iv.category = category[iv.category];
      chart.lanes.push_back(std::move(lane));
    }
  return chart;
}

svg::StepLineChart step_memory_chart(const OpGraph& /*graph*/, const Schedule& schedule, const std::vector<int>& ranks,
                                     int64_t usable_bytes) {
  svg::StepLineChart chart;
  chart.title = "Memory in use over the step";
  chart.x_label = "time into the step (s)";
  chart.y_label = "memory in use per GPU (GiB)";
  chart.x_max = simulated_end_s(schedule);
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    if (r < 0 || static_cast<size_t>(r) >= schedule.ranks.size()) continue;
    svg::StepSeries series;
    series.name = "rank " + std::to_string(r);
    series.color = svg::palette()[i % svg::palette().size()];
    for (const MemorySample& m : schedule.ranks[r].memory) series.points.push_back({m.time_s, double(m.bytes) / kBytesPerGiB});
    chart.series.push_back(std::move(series));
  }
  if (usable_bytes > 0)
    chart.lines.push_back({double(usable_bytes) / kBytesPerGiB,
                           "usable memory " + svg::number(double(usable_bytes) / kBytesPerGiB, 2) + " GiB", "#111111"});
  return chart;
}

ReportSection step_section(const PlanContext& ctx, const Candidate& candidate) {
  ReportSection s{"step", "The simulated step", ""};
  std::optional<StepSimulation> sim;
  StepInputs inputs;
  try {
    inputs = step_inputs_from_plan(ctx, candidate);
    sim.emplace(simulate_step(inputs));
  } catch (const InputError& e) {
    s.html = html_paragraph("Not simulated: " + std::string(e.what()));
    return s;
  }
  const StepEstimate closed = estimate_step(ctx, candidate);
  const MemoryEstimate memory = estimate_memory(ctx.memory, candidate, ctx.num_gpus);
  const OpGraph& g = sim->graph;
  const Schedule& schedule = sim->schedule;
  const TrainingSetup& setup = *ctx.memory.setup;

  std::string intro = candidate.name + " on " + std::to_string(ctx.num_gpus) + "x " + ctx.memory.hw->id +
                      ", micro-batch " + std::to_string(candidate.micro_batch) + ", gradient accumulation " +
                      std::to_string(setup.grad_accum) + ", checkpointing " + to_string(candidate.checkpointing) +
                      ": simulated step " + format_fixed(schedule.step_time_s, 4) + " s (closed form " +
                      format_fixed(closed.step_time_s, 4) + " s), " + std::to_string(graph_op_count(g)) +
                      " ops on " + std::to_string(g.num_ranks) + " simulated rank(s)";
  if (g.num_ranks_represented > g.num_ranks)
    intro += " standing for all " + std::to_string(g.num_ranks_represented) + " GPUs";
  s.html += html_paragraph(intro + ".");
  if (!memory.fits) s.html += html_paragraph("This candidate does not fit: " + memory.reason + ".");
  if (sim->coarsening.applied) s.html += html_paragraph("Note: " + sim->coarsening.note);

  const std::vector<int> ranks = shown_ranks(g.num_ranks, 8);
  std::string shown = static_cast<int>(ranks.size()) == g.num_ranks
                          ? std::string()
                          : " (" + std::to_string(ranks.size()) + " of the " + std::to_string(g.num_ranks) +
                                " simulated ranks shown, spread evenly)";
  // The two charts share their time axis: the same plot's left and right edges.
  svg::TimelineChart timeline = step_timeline_chart(g, schedule, ranks);
  svg::StepLineChart curve = step_memory_chart(g, schedule, ranks, memory.usable_bytes);
  std::vector<svg::Swatch> curve_legend;
  for (const auto& c : curve.series) curve_legend.push_back({c.name, c.color});
  for (const auto& l : curve.lines) curve_legend.push_back({l.label, l.color, true});
  double lane_names = 0;
  for (const auto& lane : timeline.lanes) lane_names = std::max(lane_names, svg::text_width(lane.label, 12) + 16);
  const double plot_left = std::max({timeline.margins.left, curve.margins.left, lane_names});
  const double legends = std::max(svg::legend_width(timeline.categories), svg::legend_width(curve_legend));
  timeline.margins.left = curve.margins.left = plot_left;
  timeline.margins.right = timeline.margins.right + legends - svg::legend_width(timeline.categories);
  curve.margins.right = curve.margins.right + legends - svg::legend_width(curve_legend);
  s.html += html_figure(svg::render_timeline(timeline),
                        "One lane per stream of each simulated rank" + shown +
                            ": compute (forward, backward, recompute, GPU optimizer step), comm (collectives and "
                            "pipeline sends), host_copy (offload copies) and cpu (the host optimizer step); time in "
                            "seconds from the step's start; hover a block for its ops.");
  s.html += html_figure(svg::render_step_lines(curve),
                        "Memory in use (GiB = 2^30 bytes) on each shown rank while the step runs: the resident "
                        "weights, gradients, optimizer states and overhead of the memory model, plus what the "
                        "simulator allocates and frees (activations, gathered parameters, unsharded gradients, "
                        "logits); the dashed line is the usable memory.");

  std::vector<std::vector<std::string>> rows;
  for (const RankTimeline& r : schedule.ranks) {
    if (rows.size() == 64) break;
    rows.push_back({std::to_string(r.rank), format_fixed(r.finish_s, 4), format_fixed(r.compute_busy_s, 4),
                    format_fixed(r.exposed_comm_s, 4), format_fixed(r.exposed_host_s, 4), format_fixed(r.idle_s, 4),
                    format_fixed(r.bubble_fraction * 100, 1), gib(double(r.peak_memory_bytes)),
                    format_fixed(r.peak_time_s, 4)});
  }
  s.html += html_table({"rank", "finish s", "compute busy s", "exposed comm s", "exposed host s", "idle s", "bubble %",
                        "peak GiB", "peak at s"},
                       rows);
  if (!schedule.ranks.empty()) {
    const RankTimeline& r0 = schedule.ranks.front();
    s.html += html_paragraph("Closed-form peak (device figure) " + gib(double(memory.per_gpu.total)) +
                             " GiB vs simulated peak " + gib(double(r0.peak_memory_bytes)) + " GiB on rank " +
                             std::to_string(r0.rank) + ", reached " + format_fixed(r0.peak_time_s, 4) +
                             " s into the step; the largest allocations alive then:");
    std::vector<std::vector<std::string>> alive;
    for (size_t i = 0; i < r0.alive_at_peak.size() && i < 8; ++i) {
      const Allocation& a = g.allocations.at(r0.alive_at_peak[i]);
      alive.push_back({a.label, gib(double(a.bytes))});
    }
    s.html += html_table({"allocation", "GiB"}, alive);
  }
  return s;
}

}  // namespace ftplan::sim

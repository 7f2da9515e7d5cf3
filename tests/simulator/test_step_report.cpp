// The simulated step in ftplan report (simulator/step_report.h): the timeline holds every op of the
// shown ranks on its stream's lane, the compute lanes add up to each rank's busy time, the memory
// curve peaks at the schedule's peak, and the section is well-formed.
#include <catch2/catch.hpp>

#include <map>
#include <set>

#include "planner/data_paths.h"
#include "planner/format.h"
#include "planner/hardware_spec.h"
#include "planner/json_fields.h"
#include "planner/model_spec.h"
#include "planner/plan_search.h"
#include "simulator/plan_inputs.h"
#include "simulator/step_report.h"
#include "sim_fixtures.h"
#include "tests/planner/xml_check.h"

using Catch::Matchers::Contains;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;
using namespace ftplan;
using namespace ftplan::sim;
using namespace ftplan::sim::testing;
using ftplan::testing::parse_xml;

TEST_CASE("shown_ranks: all of them up to the limit, else spread evenly with both ends", "[sim][report]") {
  CHECK(shown_ranks(4, 8) == std::vector<int>{0, 1, 2, 3});
  CHECK(shown_ranks(80, 8) == std::vector<int>{0, 11, 23, 34, 45, 56, 68, 79});
  CHECK(shown_ranks(9, 2) == std::vector<int>{0, 8});
  CHECK(shown_ranks(9, 1) == std::vector<int>{0});
  CHECK(shown_ranks(0, 8).empty());
}

TEST_CASE("the step's timeline and memory curve hold the schedule", "[sim][report]") {
  const Strategy strategy = GENERATE(Strategy::pipeline_1f1b, Strategy::fsdp, Strategy::zero3_offload, Strategy::ddp);
  CAPTURE(to_string(strategy));
  StepInputs in = model_inputs(strategy, 4, 6, 4);
  const StepSimulation sim = simulate_step(in);
  REQUIRE_FALSE(sim.coarsening.applied);
  const std::vector<int> ranks = shown_ranks(sim.graph.num_ranks, 8);

  const svg::TimelineChart timeline = step_timeline_chart(sim.graph, sim.schedule, ranks);
  // Per lane: the ops of that rank and stream, with their scheduled times.
  std::map<std::string, double> lane_s, expected_s;
  std::map<std::string, size_t> lane_ops, expected_ops;
  for (const auto& lane : timeline.lanes)
    for (const auto& iv : lane.intervals) lane_s[lane.label] += iv.end - iv.start, ++lane_ops[lane.label];
  std::set<std::string> kinds;
  for (OpId v = 0; v < graph_op_count(sim.graph); ++v) {
    const Op& op = graph_op(sim.graph, v);
    const std::string label = "rank " + std::to_string(op.rank) + " " + stream_name(op.stream);
    expected_s[label] += sim.schedule.ops[v].end_s - sim.schedule.ops[v].start_s;
    ++expected_ops[label];
    kinds.insert(op_kind_name(op.kind));
  }
  CHECK(lane_ops == expected_ops);
  for (const auto& [label, s] : expected_s) CHECK_THAT(lane_s[label], WithinRel(s, 1e-12));
  // A compute lane is busy exactly the rank's compute_busy_s.
  for (const RankTimeline& r : sim.schedule.ranks)
    CHECK_THAT(lane_s["rank " + std::to_string(r.rank) + " compute"], WithinRel(r.compute_busy_s, 1e-9));
  std::set<std::string> categories;
  for (const auto& c : timeline.categories) categories.insert(c.name);
  CHECK(categories == kinds);  // a legend entry per op kind that occurs, no other
  CHECK_THAT(timeline.x_max, WithinRel(sim.schedule.step_time_s, 1e-12));

  const svg::StepLineChart curve = step_memory_chart(sim.graph, sim.schedule, ranks, 40 * kGiB);
  REQUIRE(curve.series.size() == ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    double peak = 0;
    for (const auto& [t, gib] : curve.series[i].points) peak = std::max(peak, gib);
    CHECK_THAT(peak, WithinRel(double(sim.schedule.ranks[ranks[i]].peak_memory_bytes) / kGiB, 1e-12));
  }
  REQUIRE(curve.lines.size() == 1);
  CHECK(curve.lines[0].value == 40);
  CHECK(curve.y_label == "memory in use per GPU (GiB)");
  CHECK(curve.x_label == "time into the step (s)");
}

TEST_CASE("the step section of a planned job: the simulated step beside the closed form", "[sim][report]") {
  TrainingSetup setup = training_setup_from_json(
      read_json_file(data_dir() + "/configs/jobs/codellama-34b-lora-4x-rtx6000ada.json"), "codellama");
  const ModelSpec model =
      model_spec_from_json(read_json_file(data_dir() + "/configs/models/codellama-34b.json"), "codellama-34b");
  const HardwareSpec hw = load_hardware(setup.gpu);
  const PlanResult plan = plan_job(model, hw, setup, Objective::time);
  REQUIRE(plan.recommended);
  const Candidate& c = plan.recommended->candidate;
  const PlanContext ctx = prepare_plan(model, hw, setup, setup.num_gpus, shard_shape(c.parallel));
  const ReportSection s = step_section(ctx, c);
  CHECK(s.id == "step");
  const auto doc = parse_xml("<div>" + s.html + "</div>");
  INFO(doc.error);
  REQUIRE(doc.ok);
  const auto svgs = doc.root.all("svg");
  REQUIRE(svgs.size() == 2);
  CHECK(svgs[0]->has_class("timeline"));
  CHECK(svgs[1]->has_class("step-lines"));
  const StepSimulation sim = simulate_step(step_inputs_from_plan(ctx, c));
  const std::string text = doc.root.all_text();
  CHECK_THAT(text, Contains(c.name + " on 4x rtx-6000-ada"));
  CHECK_THAT(text, Contains("simulated step " + format_fixed(sim.schedule.step_time_s, 4) + " s"));
  CHECK_THAT(text, Contains("closed form " + format_fixed(estimate_step(ctx, c).step_time_s, 4) + " s"));
  // A rank table row per simulated rank.
  CHECK(doc.root.all("table").size() == 2);
  CHECK(doc.root.all("table")[0]->all("tr").size() == size_t(sim.graph.num_ranks) + 1);
}

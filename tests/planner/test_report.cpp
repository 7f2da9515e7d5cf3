// ftplan report's page (planner/report.h): the time-cost frontier by hand, the memory chart's bars
// summing to each strategy's device figure against the usable memory, the frontier chart
// highlighting exactly the frontier, and the page as one self-contained, well-formed document.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "planner/data_paths.h"
#include "planner/hardware_spec.h"
#include "planner/json_fields.h"
#include "planner/model_spec.h"
#include "planner/plan_search.h"
#include "planner/report.h"
#include "planner/sweep.h"
#include "planner/training_setup.h"
#include "tests/planner/xml_check.h"

using Catch::Matchers::Contains;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;
using ftplan::testing::parse_xml;
using ftplan::testing::XmlElement;

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

ftplan::SweepRow row(double job_time_s, double cost_usd, const std::string& name = "fsdp") {
  ftplan::SweepRow r;
  r.gpu = "h100-sxm";
  r.gpus = 8;
  r.result.candidate.name = name;
  r.result.has_job = true;
  r.result.job_time_s = job_time_s;
  r.result.cost_usd = cost_usd;
  r.result.step.tokens_per_s = 1e6 / job_time_s;  // per-million-token figures, for the no-dataset case
  r.result.cost_usd_per_million_tokens = cost_usd;
  return r;
}

struct Job {
  ftplan::TrainingSetup setup;
  ftplan::ModelSpec model;
  ftplan::HardwareSpec hw;
};

Job load_job(const std::string& name) {
  Job j;
  j.setup = ftplan::training_setup_from_json(
      ftplan::read_json_file(ftplan::data_dir() + "/configs/jobs/" + name + ".json"), name);
  j.model = ftplan::model_spec_from_json(
      ftplan::read_json_file(ftplan::data_dir() + "/configs/models/" + j.setup.model + ".json"), j.setup.model);
  j.hw = ftplan::load_hardware(j.setup.gpu);
  return j;
}

}  // namespace

TEST_CASE("sweep_frontier: the rows no other row beats on both time and cost, fastest first", "[report]") {
  // (time s, cost USD): 0 (1, 10), 1 (2, 5), 2 (3, 6) beaten by 1, 3 (2, 5) the same as 1, 4 (4, 1),
  // 5 (0.5, 20), 6 (0.5, 25) beaten by 5, 7 (5, 1) beaten by 4.
  std::vector<ftplan::SweepRow> rows = {row(1, 10), row(2, 5), row(3, 6), row(2, 5, "zero3"),
                                        row(4, 1),  row(0.5, 20), row(0.5, 25), row(5, 1)};
  CHECK(ftplan::sweep_frontier(rows) == std::vector<size_t>{5, 0, 1, 4});
  CHECK(ftplan::sweep_has_job(rows));
  SECTION("a job without a dataset: per million tokens, the same frontier") {
    for (auto& r : rows) r.result.has_job = false;
    CHECK_FALSE(ftplan::sweep_has_job(rows));
    CHECK_THAT(ftplan::sweep_point(rows[0], false).time_s, WithinRel(1.0, 1e-12));
    CHECK(ftplan::sweep_frontier(rows) == std::vector<size_t>{5, 0, 1, 4});
  }
  SECTION("the frontier chart highlights those rows and rings the one asked for") {
    const auto chart = ftplan::frontier_chart(rows, 4);
    std::vector<size_t> highlighted, ringed;
    for (size_t i = 0; i < chart.points.size(); ++i) {
      if (chart.points[i].highlighted) highlighted.push_back(i);
      if (chart.points[i].emphasized) ringed.push_back(i);
    }
    CHECK(highlighted == std::vector<size_t>{0, 1, 4, 5});
    CHECK(ringed == std::vector<size_t>{4});
    CHECK(chart.x_label == "job time (h)");
    CHECK(chart.y_label == "job cost (USD)");
    CHECK_THAT(chart.points[4].x, WithinRel(4.0 / 3600, 1e-12));  // seconds to hours
    CHECK(chart.points[4].y == 1);
    const auto svg = parse_xml(ftplan::frontier_svg(rows));
    INFO(svg.error);
    REQUIRE(svg.ok);
    size_t circles = 0;
    for (const XmlElement* c : svg.root.all("circle")) circles += c->has_class("highlighted");
    CHECK(circles == 4);
  }
  CHECK(ftplan::sweep_frontier({}).empty());
}

TEST_CASE("memory chart: one bar per strategy, its terms summing to the device figure, the usable line", "[report]") {
  const Job job = load_job("codellama-34b-lora-4x-rtx6000ada");
  const ftplan::PlanResult plan = ftplan::plan_job(job.model, job.hw, job.setup, ftplan::Objective::time);
  REQUIRE(plan.recommended);
  const auto chart = ftplan::memory_breakdown_chart(plan, job.hw, job.setup);
  REQUIRE(chart.categories.size() == plan.strategies.size());
  REQUIRE(chart.series.size() == 7);
  CHECK(chart.series[0].name == "weights");
  CHECK(chart.series[6].name == "overhead");
  size_t starred = 0;
  for (size_t i = 0; i < plan.strategies.size(); ++i) {
    const auto& o = plan.strategies[i];
    CAPTURE(o.name);
    CHECK(chart.categories[i] == o.name);
    double sum = 0;
    for (const auto& s : chart.series) sum += s.values.at(i);
    CHECK_THAT(sum, WithinRel(double(o.best.memory.per_gpu.total) / kGiB, 1e-12));
    CHECK_THAT(chart.series[0].values[i], WithinRel(double(o.best.memory.per_gpu.weights) / kGiB, 1e-12));
    starred += chart.emphasized.at(i);
    if (chart.emphasized[i]) CHECK(o.name == plan.recommended->candidate.name);
  }
  CHECK(starred == 1);
  REQUIRE(chart.lines.size() == 1);
  // RTX 6000 Ada: usable = what nvidia-smi shows less the 5% headroom, as the plan judges fits.
  CHECK_THAT(chart.lines[0].value, WithinRel(double(plan.strategies[0].best.memory.usable_bytes) / kGiB, 1e-12));
  CHECK_THAT(chart.lines[0].value, WithinRel(double(job.hw.memory_bytes) * 0.95 / kGiB, 1e-6));
  // The axis: every bar whole below 3x the usable memory, at least 1.1x the usable memory.
  REQUIRE(chart.y_max);
  CHECK(*chart.y_max >= 1.1 * chart.lines[0].value);
  CHECK(*chart.y_max <= ftplan::svg::nice_ceiling(3 * chart.lines[0].value));
}

TEST_CASE("the page: one well-formed, self-contained document with the assumptions", "[report]") {
  Job job = load_job("tinyllama-lora-4x-rtx6000ada");
  const ftplan::PlanResult plan = ftplan::plan_job(job.model, job.hw, job.setup, ftplan::Objective::time);
  const std::vector<ftplan::HardwareSpec> gpus = {ftplan::load_hardware("rtx-4090"), ftplan::load_hardware("h100-sxm")};
  const std::vector<int64_t> counts = {1, 2, 4};
  const auto rows = ftplan::run_sweep(job.model, gpus, counts, job.setup, ftplan::Objective::time, false, {});
  REQUIRE(!rows.empty());
  ftplan::ReportPage page = ftplan::job_report_page(job.model, job.hw, job.setup, plan, rows, gpus, counts);
  page.generator = "ftplan test <&>";
  page.sections.push_back({"extra", "An extra section", ftplan::html_paragraph("a < b & c")});
  const std::string html = ftplan::report_page_html(page);

  REQUIRE(html.rfind("<!DOCTYPE html>", 0) == 0);
  const auto doc = parse_xml(html);
  INFO(doc.error);
  REQUIRE(doc.ok);
  CHECK(doc.root.name == "html");
  // Nothing fetched: a CSP forbidding every source but inline style; no script, no src, links in-page.
  bool csp = false;
  for (const XmlElement* m : doc.root.all("meta"))
    if (m->attrs.count("http-equiv") && m->attrs.at("http-equiv") == "Content-Security-Policy")
      csp = m->attrs.at("content") == "default-src 'none'; style-src 'unsafe-inline'";
  CHECK(csp);
  CHECK(doc.root.all("script").empty());
  CHECK(html.find("src=") == std::string::npos);
  for (const XmlElement* a : doc.root.all("a")) CHECK(a->attrs.at("href").rfind("#", 0) == 0);
  // The sections in order, each with its figure; the frontier's points all drawn.
  std::vector<std::string> ids;
  for (const XmlElement* s : doc.root.all("section")) ids.push_back(s->attrs.at("id"));
  CHECK(ids == std::vector<std::string>{"plan", "memory", "frontier", "extra", "assumptions"});
  const auto svgs = doc.root.all("svg");
  REQUIRE(svgs.size() == 2);  // memory and frontier (the step is the simulator's section)
  size_t points = 0;  // a circle stands for data-count plans at the same spot
  for (const XmlElement* c : svgs[1]->all("circle"))
    if (c->has_class("point")) points += std::stoul(c->attrs.at("data-count"));
  CHECK(points == rows.size());
  // The assumptions: framework, memory metric, GPU, price and its date; units.
  const std::string text = doc.root.all_text();
  CHECK_THAT(text, Contains("framework " + job.setup.framework));
  CHECK_THAT(text, Contains("memory metric predicted"));
  CHECK_THAT(text, Contains(job.hw.name));
  CHECK_THAT(text, Contains("read " + job.hw.price_date));
  CHECK_THAT(text, Contains("GiB = 2^30 bytes"));
  CHECK_THAT(text, Contains("job time (h)"));
  CHECK_THAT(text, Contains("job cost (USD)"));
  CHECK_THAT(text, Contains("a < b & c"));
  CHECK_THAT(text, Contains("ftplan test <&>"));
  // Each swept GPU's price, with the month it was read.
  for (const auto& g : gpus) {
    CHECK_THAT(text, Contains(g.price_date));
    CHECK_THAT(html, Contains(">" + g.id + "<"));
  }
}

TEST_CASE("the page when nothing fits: results, not errors", "[report]") {
  Job job = load_job("tinyllama-lora-4x-rtx6000ada");
  job.setup.model = "llama-3.1-405b";
  job.model = ftplan::model_spec_from_json(
      ftplan::read_json_file(ftplan::data_dir() + "/configs/models/llama-3.1-405b.json"), "llama-3.1-405b");
  job.setup.method = ftplan::Method::full;
  job.setup.num_gpus = 1;
  job.hw = ftplan::load_hardware("rtx-4090");
  job.setup.gpu = "rtx-4090";
  const ftplan::PlanResult plan = ftplan::plan_job(job.model, job.hw, job.setup, ftplan::Objective::time);
  CHECK_FALSE(plan.recommended);
  const std::vector<ftplan::HardwareSpec> gpus = {job.hw};
  const std::vector<int64_t> counts = {1};
  const auto rows = ftplan::run_sweep(job.model, gpus, counts, job.setup, ftplan::Objective::time, false, {});
  CHECK(rows.empty());
  const auto page = ftplan::job_report_page(job.model, job.hw, job.setup, plan, rows, gpus, counts);
  const auto doc = parse_xml(ftplan::report_page_html(page));
  INFO(doc.error);
  REQUIRE(doc.ok);
  const std::string text = doc.root.all_text();
  CHECK_THAT(text, Contains("Nothing fits"));
  CHECK_THAT(text, Contains("No plan fits"));
  // The memory chart still shows every strategy's smallest candidate, the single GPU's clipped far
  // above the line (405B parameters x 16 B: about 6 TiB against 22.5 GiB).
  const auto svgs = doc.root.all("svg");
  REQUIRE(svgs.size() == 1);
  size_t groups = 0, clipped = 0;
  for (const XmlElement* g : svgs[0]->all("g")) groups += g->has_class("bar-group");
  for (const XmlElement* r : svgs[0]->all("rect")) clipped += r->has_class("clipped");
  CHECK(groups == plan.strategies.size());
  CHECK(clipped >= 1);
}

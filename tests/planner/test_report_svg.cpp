// The report's SVG charts (planner/report_svg.h): well-formed XML with every text escaped, ticks
// at 1-2-5 steps, and geometry worked out here by hand: a bar's height is its value over the axis's
// top times the plot's height, a point sits at its value's fraction of the axis, a timeline block at
// its start's fraction of the step.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "planner/report_svg.h"
#include "tests/planner/xml_check.h"

using Catch::Matchers::Contains;
using Catch::Matchers::WithinAbs;
using ftplan::testing::parse_xml;
using ftplan::testing::XmlElement;
namespace svg = ftplan::svg;

namespace {

const std::string kHostile = "<script>alert('x')</script> & \"quoted\" \x01 tp=8,dp_shard=4";
const std::string kHostileDecoded = "<script>alert('x')</script> & \"quoted\" ? tp=8,dp_shard=4";

XmlElement parsed(const std::string& svg_text) {
  const auto r = parse_xml(svg_text);
  INFO(r.error);
  REQUIRE(r.ok);
  REQUIRE(r.root.name == "svg");
  return r.root;
}

std::vector<const XmlElement*> with_class(const XmlElement& root, const std::string& tag, const std::string& cls) {
  std::vector<const XmlElement*> out;
  for (const XmlElement* e : root.all(tag))
    if (e->has_class(cls)) out.push_back(e);
  return out;
}

const XmlElement* bar(const XmlElement& root, const std::string& series, const std::string& category) {
  for (const XmlElement* e : with_class(root, "rect", "bar"))
    if (e->attrs.at("data-series") == series && e->attrs.at("data-category") == category) return e;
  return nullptr;
}

}  // namespace

TEST_CASE("escape: the five XML specials become entities, control characters are dropped", "[report]") {
  CHECK(svg::escape("a<b & \"c\" 'd'>") == "a&lt;b &amp; &quot;c&quot; &#39;d&#39;&gt;");
  CHECK(svg::escape("tab\there\nnew") == "tab\there\nnew");
  CHECK(svg::escape(std::string("bell\x07")) == "bell?");
  CHECK(svg::escape("GiB = 2^30") == "GiB = 2^30");
}

TEST_CASE("number: fixed decimals without trailing zeros, never NaN", "[report]") {
  CHECK(svg::number(12.5) == "12.5");
  CHECK(svg::number(3.0) == "3");
  CHECK(svg::number(2.3456, 2) == "2.35");
  CHECK(svg::number(-0.0001) == "0");
  CHECK(svg::number(std::nan("")) == "0");
  CHECK(svg::number(1e300 * 1e300) == "0");
}

TEST_CASE("ticks: 1-2-5 steps inside the range, labelled with the decimals the step needs", "[report]") {
  SECTION("linear") {
    const auto t = svg::linear_ticks(0, 100, 5);
    std::vector<double> values;
    std::vector<std::string> labels;
    for (const auto& k : t) values.push_back(k.value), labels.push_back(k.label);
    CHECK(values == std::vector<double>{0, 20, 40, 60, 80, 100});
    CHECK(labels == std::vector<std::string>{"0", "20", "40", "60", "80", "100"});
    // 0.75 / 6 = 0.125 -> a step of 0.2; 0.8 is past the end.
    const auto f = svg::linear_ticks(0, 0.75, 6);
    REQUIRE(f.size() == 4);
    CHECK(f[3].label == "0.6");
    CHECK_THAT(f[3].value, WithinAbs(0.6, 1e-12));
  }
  SECTION("log: 1, 2, 5 per decade; decades alone over more than 4") {
    const auto t = svg::log_ticks(1, 1000);
    std::vector<std::string> labels;
    for (const auto& k : t) labels.push_back(k.label);
    CHECK(labels == std::vector<std::string>{"1", "2", "5", "10", "20", "50", "100", "200", "500", "1000"});
    const auto wide = svg::log_ticks(0.01, 1e6);
    labels.clear();
    for (const auto& k : wide) labels.push_back(k.label);
    CHECK(labels == std::vector<std::string>{"0.01", "0.1", "1", "10", "100", "1000", "10000", "100000", "1e6"});
    CHECK(svg::log_ticks(0, 10).empty());  // no log axis through 0
  }
  SECTION("nice_ceiling") {
    CHECK(svg::nice_ceiling(73) == 100);
    CHECK(svg::nice_ceiling(1.7) == 2);
    CHECK(svg::nice_ceiling(2.2) == 2.5);
    CHECK(svg::nice_ceiling(250) == 250);
    CHECK_THAT(svg::nice_ceiling(0.03), WithinAbs(0.05, 1e-15));
  }
}

TEST_CASE("stacked bars: heights are value / axis top x plot height, stacked bottom up", "[report]") {
  svg::StackedBarChart c;
  c.title = "memory";
  c.y_label = "memory per GPU (GiB)";
  c.value_unit = "GiB";
  c.categories = {"a", "b"};
  c.series = {{"weights", "#4e79a7", {10, 50}}, {"gradients", "#f28e2b", {25, 30}}};
  c.lines = {{80, "usable 80 GiB", "#111111"}};
  c.y_max = 100;
  c.width = 600;
  c.height = 400;
  c.margins = {60, 20, 40, 100};  // the short names need less than 100 px below the plot
  const XmlElement root = parsed(svg::render_stacked_bars(c));
  // The plot: y from 40 to 400 - 100 = 300, 260 px for 100 GiB.
  const double bottom = 300, px_per_gib = 260.0 / 100;
  struct Expect {
    const char* series;
    const char* category;
    double below, value;  // GiB under the segment, GiB of the segment
  };
  for (const Expect& e : {Expect{"weights", "a", 0, 10}, Expect{"gradients", "a", 10, 25}, Expect{"weights", "b", 0, 50},
                          Expect{"gradients", "b", 50, 30}}) {
    CAPTURE(e.series, e.category);
    const XmlElement* r = bar(root, e.series, e.category);
    REQUIRE(r);
    CHECK_THAT(r->number("height"), WithinAbs(e.value * px_per_gib, 1e-3));  // 26, 65, 130, 78 px
    CHECK_THAT(r->number("y"), WithinAbs(bottom - (e.below + e.value) * px_per_gib, 1e-3));
    CHECK(r->number("data-value") == e.value);
    CHECK_FALSE(r->has_class("clipped"));
  }
  // Equal widths, b right of a; the slots share the plot's width (legend column excluded).
  const XmlElement *a = bar(root, "weights", "a"), *b = bar(root, "weights", "b");
  CHECK(a->number("width") == b->number("width"));
  CHECK(b->number("x") > a->number("x") + a->number("width"));
  CHECK(root.number("height") == 400);
  CHECK(root.number("width") == 600);
  // The usable-memory line at 80 GiB: 300 - 80 x 2.6 = 92.
  const auto lines = root.all("line");
  const auto ref = std::find_if(lines.begin(), lines.end(), [](const XmlElement* l) {
    return l->attrs.count("stroke-dasharray") && l->attrs.at("stroke-dasharray") == "7 4";
  });
  REQUIRE(ref != lines.end());
  CHECK_THAT((*ref)->number("y1"), WithinAbs(92, 1e-3));
  // Totals printed above the bars; the reference line named in the legend.
  std::string text = root.all_text();
  CHECK_THAT(text, Contains("35 GiB"));
  CHECK_THAT(text, Contains("usable 80 GiB"));
  CHECK_THAT(text, Contains("memory per GPU (GiB)"));
}

TEST_CASE("stacked bars: without y_max every bar's height is proportional to its value", "[report]") {
  svg::StackedBarChart c;
  c.categories = {"x", "y", "z"};
  c.series = {{"only", "#4e79a7", {3.5, 7, 12.25}}};
  c.height = 500;
  c.margins = {60, 20, 50, 120};
  const XmlElement root = parsed(svg::render_stacked_bars(c));
  // The axis's top is nice_ceiling(12.25) = 20: 330 px for 20 units.
  for (auto [cat, v] : std::vector<std::pair<std::string, double>>{{"x", 3.5}, {"y", 7}, {"z", 12.25}}) {
    const XmlElement* r = bar(root, "only", cat);
    REQUIRE(r);
    CHECK_THAT(r->number("height"), WithinAbs(v / 20 * 330, 1e-3));
  }
}

TEST_CASE("stacked bars: a bar above the axis is clipped at its top and its total printed", "[report]") {
  svg::StackedBarChart c;
  c.categories = {"single"};
  c.series = {{"weights", "#4e79a7", {80}}, {"optimizer", "#e15759", {70}}, {"overhead", "#bab0ac", {5}}};
  c.value_unit = "GiB";
  c.y_max = 100;
  c.width = 500;
  c.height = 300;
  c.margins = {60, 20, 40, 60};
  const XmlElement root = parsed(svg::render_stacked_bars(c));
  // 200 px for 100 GiB: weights 160 px whole, the optimizer's 80..150 shown up to 100 (40 px) and
  // marked clipped, the overhead (150..155) entirely above: not drawn.
  REQUIRE(bar(root, "weights", "single"));
  CHECK_THAT(bar(root, "weights", "single")->number("height"), WithinAbs(160, 1e-3));
  REQUIRE(bar(root, "optimizer", "single"));
  CHECK_THAT(bar(root, "optimizer", "single")->number("height"), WithinAbs(40, 1e-3));
  CHECK_THAT(bar(root, "optimizer", "single")->number("y"), WithinAbs(40, 1e-3));
  CHECK(bar(root, "optimizer", "single")->has_class("clipped"));
  CHECK_FALSE(bar(root, "overhead", "single"));
  const auto totals = with_class(root, "text", "clipped");
  REQUIRE(totals.size() == 1);
  CHECK_THAT(totals[0]->all_text(), Contains("155"));
  CHECK_THAT(totals[0]->all_text(), Contains("\u25B2"));
}

TEST_CASE("every chart is well-formed XML whatever its text, and the text survives escaped", "[report]") {
  std::vector<std::string> charts;
  svg::StackedBarChart bars;
  bars.title = kHostile;
  bars.y_label = kHostile;
  bars.categories = {kHostile, "fsdp"};
  bars.category_notes = {kHostile, ""};
  bars.emphasized = {true, false};
  bars.series = {{kHostile, "#4e79a7", {1, 2}}};
  bars.lines = {{1.5, kHostile, "#111"}};
  charts.push_back(svg::render_stacked_bars(bars));
  svg::ScatterChart scatter;
  scatter.title = scatter.x_label = scatter.y_label = kHostile;
  scatter.log_x = scatter.log_y = true;
  scatter.groups = {{kHostile, "#4e79a7"}};
  scatter.points = {{1, 2, 0, true, true, kHostile, kHostile}, {3, 1, 0, true, false, kHostile, kHostile},
                    {-1, 5, 0, false, false, "not drawn on a log axis", ""}, {5, 5, 0, false, false, "", kHostile}};
  scatter.emphasis_name = kHostile;
  charts.push_back(svg::render_scatter(scatter));
  svg::TimelineChart timeline;
  timeline.title = timeline.x_label = kHostile;
  timeline.categories = {{kHostile, "#4e79a7"}};
  timeline.lanes = {{kHostile, {{0, 1, 0, kHostile}, {2, 3, 0, kHostile}}}};
  charts.push_back(svg::render_timeline(timeline));
  svg::StepLineChart lines;
  lines.title = lines.x_label = lines.y_label = kHostile;
  lines.series = {{kHostile, "#4e79a7", {{0, 1}, {1, 2}}}};
  lines.lines = {{1.5, kHostile, "#111"}};
  charts.push_back(svg::render_step_lines(lines));
  for (const std::string& chart : charts) {
    const XmlElement root = parsed(chart);
    CHECK(chart.find("<script") == std::string::npos);
    CHECK(chart.find("alert('x')") == std::string::npos);  // the quote is escaped too
    CHECK_THAT(root.all_text(), Contains(kHostileDecoded));
    CHECK(root.attrs.at("xmlns") == "http://www.w3.org/2000/svg");
    // Nothing outside the document: no href, no src, no url() reference.
    CHECK(chart.find("href") == std::string::npos);
    CHECK(chart.find("src=") == std::string::npos);
    CHECK(chart.find("url(") == std::string::npos);
  }
  const auto doc = parse_xml(svg::svg_document(charts[0]));
  CHECK(doc.ok);
}

TEST_CASE("scatter: points at their values' fraction of linear and log axes; highlighted ones joined", "[report]") {
  svg::ScatterChart c;
  c.width = 500;
  c.height = 400;
  c.margins = {50, 20, 30, 50};  // plot x 50..480 (no legend: no group, nothing highlighted), y 350..30
  c.x_axis = svg::Axis{0, 10, false};
  c.y_axis = svg::Axis{0, 100, false};
  c.points = {{5, 50, 0, false, false, "", "mid"}, {10, 0, 0, false, false, "", "corner"}};
  XmlElement root = parsed(svg::render_scatter(c));
  auto points = with_class(root, "circle", "point");
  REQUIRE(points.size() == 2);
  CHECK_THAT(points[0]->number("cx"), WithinAbs(50 + 0.5 * 430, 1e-3));
  CHECK_THAT(points[0]->number("cy"), WithinAbs(350 - 0.5 * 320, 1e-3));
  CHECK_THAT(points[1]->number("cx"), WithinAbs(480, 1e-3));
  CHECK_THAT(points[1]->number("cy"), WithinAbs(350, 1e-3));

  SECTION("log axis: decades equally spaced") {
    c.x_axis = svg::Axis{1, 1000, true};
    c.points = {{1, 10, 0, false, false, "", ""}, {10, 10, 0, false, false, "", ""},
                {100, 10, 0, false, false, "", ""}, {1000, 10, 0, false, false, "", ""}};
    root = parsed(svg::render_scatter(c));
    points = with_class(root, "circle", "point");
    REQUIRE(points.size() == 4);
    // Written to 0.01 px.
    for (size_t i = 0; i < 4; ++i) CHECK_THAT(points[i]->number("cx"), WithinAbs(50 + 430.0 * double(i) / 3, 0.006));
  }
  SECTION("highlighted points: outlined, labelled, joined in x order") {
    c.groups = {{"h100-sxm", "#4e79a7"}};
    c.points = {{8, 10, 0, true, false, "8x h100-sxm fsdp", ""}, {2, 90, 0, true, false, "2x h100-sxm ddp", ""},
                {5, 60, 0, false, false, "", ""}};
    root = parsed(svg::render_scatter(c));
    CHECK(with_class(root, "circle", "highlighted").size() == 2);
    CHECK(with_class(root, "circle", "point").size() == 3);
    const auto line = with_class(root, "polyline", "highlight-line");
    REQUIRE(line.size() == 1);
    // Two vertices, the x = 2 one first.
    const std::string pts = line[0]->attrs.at("points");
    const double x_first = std::stod(pts.substr(0, pts.find(',')));
    const double x_second = std::stod(pts.substr(pts.find(' ') + 1));
    CHECK(x_first < x_second);
    const auto labels = with_class(root, "text", "point-label");
    REQUIRE(labels.size() == 2);
    CHECK(labels[0]->all_text() == "8x h100-sxm fsdp");
  }
}

TEST_CASE("timeline: a block spans its interval; blocks closer than a pixel merge", "[report]") {
  svg::TimelineChart c;
  c.categories = {{"forward", "#4e79a7"}, {"backward", "#f28e2b"}};
  c.x_max = 10;
  c.width = 700;
  c.margins = {100, 20, 40, 40};
  svg::TimelineLane lane{"L", {{0, 1, 0, "fwd 0"}, {1, 2, 1, "bwd 0"}}};
  // 1000 forward ops inside 5 .. 5.001 s: less than a pixel apart, one block of 1000.
  for (int k = 0; k < 1000; ++k) lane.intervals.push_back({5 + k * 1e-6, 5 + (k + 1) * 1e-6, 0, "tiny"});
  c.lanes = {lane};
  const XmlElement root = parsed(svg::render_timeline(c));
  const double plot_w = 700 - 20 - svg::legend_width(c.categories) - 100;
  const auto spans = with_class(root, "rect", "span");
  REQUIRE(spans.size() == 3);
  CHECK_THAT(spans[0]->number("x"), WithinAbs(100, 1e-3));
  CHECK_THAT(spans[0]->number("width"), WithinAbs(plot_w / 10, 1e-3));
  CHECK(spans[0]->attrs.at("data-category") == "forward");
  CHECK_THAT(spans[1]->number("x"), WithinAbs(100 + plot_w / 10, 1e-3));
  CHECK(spans[1]->attrs.at("data-category") == "backward");
  CHECK(spans[2]->attrs.at("data-count") == "1000");
  CHECK_THAT(spans[2]->number("x"), WithinAbs(100 + plot_w / 2, 1e-3));

  SECTION("categories alternating within a pixel: at most one block per pixel column") {
    svg::TimelineLane busy{"busy", {}};
    for (int k = 0; k < 20000; ++k) busy.intervals.push_back({k * 5e-4, (k + 1) * 5e-4, size_t(k % 2), ""});
    c.lanes = {busy};
    const XmlElement r = parsed(svg::render_timeline(c));
    const auto s = with_class(r, "rect", "span");
    CHECK(s.size() >= 1);
    CHECK(double(s.size()) <= std::ceil(plot_w));
    int count = 0;
    for (const auto* e : s) count += std::stoi(e->attrs.at("data-count"));
    CHECK(count == 20000);  // every op is in some block
  }
}

TEST_CASE("step lines: decimated to pixel columns, the peak is kept", "[report]") {
  svg::StepLineChart c;
  c.width = 600;
  c.height = 300;
  c.margins = {60, 20, 40, 40};  // y: 260 (0) .. 40 (y_max)
  c.y_max = 100;
  svg::StepSeries s{"rank 0", "#4e79a7", {}};
  for (int k = 0; k < 100000; ++k) s.points.push_back({k * 1e-5, k == 54321 ? 99.0 : 10.0 + (k % 7)});
  c.series = {s};
  const XmlElement root = parsed(svg::render_step_lines(c));
  const auto paths = with_class(root, "path", "series");
  REQUIRE(paths.size() == 1);
  const std::string d = paths[0]->attrs.at("d");
  CHECK(d.size() < 60000);  // about 4 commands per pixel column, not 100,000 points
  double min_y = 1e9;
  size_t pos = 0;
  while ((pos = d.find('V', pos)) != std::string::npos) min_y = std::min(min_y, std::stod(d.substr(++pos)));
  CHECK_THAT(min_y, WithinAbs(260 - 99.0 / 100 * 220, 1e-2));  // the spike's pixel: 42.2
}

TEST_CASE("scatter: plain points at the same spot of one group are one circle counting them", "[report]") {
  svg::ScatterChart c;
  c.width = 500;
  c.height = 400;
  c.margins = {50, 20, 30, 50};
  c.x_axis = svg::Axis{0, 10, false};
  c.y_axis = svg::Axis{0, 100, false};
  c.groups = {{"a", "#4e79a7"}, {"b", "#f28e2b"}};
  // Three of group a within a tenth of a pixel, one of group b there too, one highlighted there, one apart.
  c.points = {{5, 50, 0, false, false, "", "a1"}, {5.0001, 50, 0, false, false, "", "a2"},
              {5, 50.001, 0, false, false, "", "a3"}, {5, 50, 1, false, false, "", "b1"},
              {5, 50, 0, true, false, "front", "h"},  {9, 90, 0, false, false, "", "a4"}};
  const XmlElement root = parsed(svg::render_scatter(c));
  const auto circles = with_class(root, "circle", "point");
  REQUIRE(circles.size() == 4);
  std::vector<std::string> counts;
  size_t total = 0;
  for (const auto* e : circles) counts.push_back(e->attrs.at("data-count")), total += std::stoul(e->attrs.at("data-count"));
  CHECK(counts == std::vector<std::string>{"3", "1", "1", "1"});  // a1 (a2, a3), b1, a4, then the highlighted one
  CHECK(total == c.points.size());
  CHECK_THAT(circles[0]->all_text(), Contains("a1 (and 2 more plans at this point)"));
}

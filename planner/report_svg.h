// Charts as inline SVG for `ftplan report` and `ftplan sweep --format svg`: axes with ticks, stacked
// bars against reference lines, a scatter with highlighted points, a timeline of lanes and step lines.
// Plain structs in, one `<svg>` element out (well-formed XML, every text escaped, no script, no
// external reference): a chart is data, the renderer knows nothing of memory or GPUs.
//
// Geometry, shared by every chart: the plot area is the rectangle
//   x in [margins.left, width - margins.right - legend], y in [margins.top, height - margins.bottom],
// a value v on a linear axis [lo, hi] sits at bottom - (v - lo) / (hi - lo) * plot height (x: left +
// ... * plot width), on a log axis at the same fraction of log10. Margins given are kept, except
// where a chart says it grows one to fit its labels (the stacked bars' bottom for long category names,
// the timeline's left for long lane names); the legend takes its own column on the right.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ftplan::svg {

// Text and attribute values for XML and HTML: & < > " ' become entities.
std::string escape(const std::string& text);

// A coordinate or a value in an attribute: fixed with at most `decimals` decimals, trailing zeros
// dropped ("12.5", "3", "-0.25").
std::string number(double value, int decimals = 2);

// Axis ticks: 1, 2 or 5 x 10^k steps, each labelled with as many decimals as the step needs.
struct Tick {
  double value = 0;   // e.g. 40
  std::string label;  // e.g. "40"
};
// Ticks at multiples of the step inside [lo, hi], about `target` of them (never more than 2x).
std::vector<Tick> linear_ticks(double lo, double hi, int target = 6);
// Ticks at 1, 2 and 5 x 10^k inside [lo, hi] (only 10^k when the range spans more than 4 decades).
std::vector<Tick> log_ticks(double lo, double hi);
// The smallest 1, 2, 2.5 or 5 x 10^k that is >= value (value > 0), e.g. 73 -> 100, 1.7 -> 2.
double nice_ceiling(double value);

struct Axis {
  double lo = 0, hi = 1;  // the values at the two ends
  bool log = false;       // log10 scale (lo > 0)
};
// Where `value` falls between the pixels p_lo (at lo) and p_hi (at hi).
double axis_pixel(const Axis& axis, double value, double p_lo, double p_hi);

struct Margins {
  double left = 72, right = 24, top = 48, bottom = 56;  // px
};

struct Swatch {
  std::string name;    // legend text, e.g. "weights"
  std::string color;   // CSS colour, e.g. "#4e79a7"
  bool dashed = false; // drawn as a dashed line (a reference line's entry), not a square
};

// Layout estimates: a text's width in px (DejaVu Sans' mean advance, 0.6 em a character) and the
// width of a legend column of these swatches (0 for none).
double text_width(const std::string& text, double font_px);
double legend_width(const std::vector<Swatch>& swatches);

// The categorical colours the report uses when a caller names none (Tableau 20's order).
const std::vector<std::string>& palette();

// A horizontal (bars, lines) line across the plot at `value`, named in the legend (a dashed entry).
struct ReferenceLine {
  double value = 0;          // e.g. 75.67 (GiB)
  std::string label;         // e.g. "usable 75.67 GiB"
  std::string color = "#222";
};

// ---- stacked bars ------------------------------------------------------------------------------
struct BarSeries {
  std::string name;           // e.g. "weights"
  std::string color;          // e.g. "#4e79a7"
  std::vector<double> values; // one per category, >= 0, in the y axis's unit (e.g. GiB)
};

struct StackedBarChart {
  std::string title;                        // e.g. "Memory per GPU at the peak"
  std::string y_label;                      // with its unit, e.g. "memory per GPU (GiB)"
  std::string value_unit;                   // after each bar's total, e.g. "GiB"
  std::vector<std::string> categories;      // one bar each, e.g. "fsdp", "tp=8,dp_shard=4"
  std::vector<std::string> category_notes;  // optional, after a name in grey, e.g. "mb 2 · full"
  std::vector<bool> emphasized;             // optional: a category named in bold with a star (the choice)
  std::vector<BarSeries> series;            // stacked bottom up
  std::vector<ReferenceLine> lines;         // e.g. the GPU's usable memory
  std::optional<double> y_max;              // the axis's top; a taller bar is clipped there and marked
                                            // (class "clipped"); default: the tallest bar or line, rounded
                                            // up by nice_ceiling
  double height = 480;                      // px
  double width = 0;                         // px; 0: margins + legend + bar_pitch per category
  double bar_pitch = 56;                    // px per category when width is 0
  double bar_fill = 0.7;                    // a bar's width over its slot
  Margins margins{72, 24, 48, 56};          // bottom and left grow to fit the (rotated) category names
};
// Each bar's total is printed above it (with value_unit where the slot is wide enough); a clipped
// bar's total above the plot, after a triangle.
// Each segment is <rect class="bar" data-series=.. data-category=.. data-value=..> with a <title>.
std::string render_stacked_bars(const StackedBarChart& chart);

// ---- scatter -----------------------------------------------------------------------------------
struct ScatterPoint {
  double x = 0, y = 0;         // in the axes' units; on a log axis > 0
  std::size_t group = 0;       // index into ScatterChart::groups (its colour and legend entry)
  bool highlighted = false;    // drawn larger, outlined, labelled and joined by the highlight line
  bool emphasized = false;     // ringed (e.g. the job's own plan)
  std::string label;           // shown beside a highlighted point, e.g. "8x h100-sxm fsdp"
  std::string tooltip;         // <title> of the point
};

struct ScatterChart {
  std::string title;
  std::string x_label, y_label;             // with units, e.g. "job time (h)", "cost (USD)"
  bool log_x = false, log_y = false;
  std::optional<Axis> x_axis, y_axis;       // default: the points' range, padded (log: to 1-2-5 steps)
  std::vector<Swatch> groups;
  std::vector<ScatterPoint> points;
  std::string highlight_name = "frontier";  // legend entry of the highlighted points and their line
  std::string emphasis_name;                // legend entry of emphasized points ("" = none)
  double width = 980, height = 560;         // px
  Margins margins{80, 24, 48, 64};
};
// Points are <circle class="point" ...>, highlighted ones class "point highlighted", joined in x
// order by <polyline class="highlight-line">. Plain points of one group within half a pixel of each
// other are one circle whose data-count says how many it stands for.
std::string render_scatter(const ScatterChart& chart);

// ---- timeline ----------------------------------------------------------------------------------
struct TimelineInterval {
  double start = 0, end = 0;  // in the x axis's unit (s)
  std::size_t category = 0;   // index into TimelineChart::categories
  std::string label;          // tooltip of an interval drawn alone, e.g. "fwd block 3 mb0"
};

struct TimelineLane {
  std::string label;                       // e.g. "rank 0 compute"
  std::vector<TimelineInterval> intervals; // need not be sorted
};

struct TimelineChart {
  std::string title;
  std::string x_label;                     // e.g. "time into the step (s)"
  std::vector<Swatch> categories;
  std::vector<TimelineLane> lanes;
  double x_max = 0;                        // the axis's end; 0: the latest interval's end
  double width = 1180;                     // px
  double lane_height = 18, lane_gap = 6;   // px; height = margins + lanes x (height + gap)
  Margins margins{72, 24, 48, 48};         // left grows to fit the lane names
};
// Intervals of one category less than half a pixel apart are drawn as one <rect class="span">
// (data-count = how many), so a lane holds at most about one rect per pixel column whatever the
// number of ops.
std::string render_timeline(const TimelineChart& chart);

// ---- step lines --------------------------------------------------------------------------------
struct StepSeries {
  std::string name, color;
  std::vector<std::pair<double, double>> points;  // (x, y): y holds from x to the next point's x
};

struct StepLineChart {
  std::string title;
  std::string x_label, y_label;      // e.g. "time into the step (s)", "memory in use (GiB)"
  std::vector<StepSeries> series;
  std::vector<ReferenceLine> lines;
  double x_max = 0;                  // 0: the last point's x
  std::optional<double> y_max;       // default: the highest point or line, rounded up by nice_ceiling
  double width = 1180, height = 360; // px
  Margins margins{80, 24, 48, 48};
};
// Each series is one <path class="series">; points within one pixel column are drawn as the
// column's first, highest, lowest and last values, so the peak is never lost.
std::string render_step_lines(const StepLineChart& chart);

// A standalone SVG file: the XML declaration, then `svg_element`.
std::string svg_document(const std::string& svg_element);

}  // namespace ftplan::svg

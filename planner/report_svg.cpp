#include "planner/report_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>
#include <tuple>

namespace ftplan::svg {
namespace {

constexpr double kFontPx = 12;        // the charts' text
constexpr double kSmallFontPx = 10;   // totals, point labels
constexpr double kCharWidthEm = 0.6;  // DejaVu Sans' mean advance, about 0.6 em: text width estimates
constexpr double kSwatchPx = 12;
constexpr double kPi = 3.14159265358979323846;


bool finite(double v) { return std::isfinite(v); }

// <svg> with its size, an accessible name and a white background.
std::string open_svg(double width, double height, const std::string& css_class, const std::string& title) {
  std::ostringstream out;
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart " << escape(css_class) << "\" width=\""
      << number(width, 0) << "\" height=\"" << number(height, 0) << "\" viewBox=\"0 0 " << number(width, 0) << " "
      << number(height, 0) << "\" role=\"img\" aria-label=\"" << escape(title)
      << "\" font-family=\"DejaVu Sans, Verdana, sans-serif\" font-size=\"" << number(kFontPx) << "\">"
      << "<title>" << escape(title) << "</title>"
      << "<rect class=\"background\" x=\"0\" y=\"0\" width=\"" << number(width, 0) << "\" height=\"" << number(height, 0)
      << "\" fill=\"#ffffff\"/>";
  if (!title.empty())
    out << "<text class=\"chart-title\" x=\"12\" y=\"22\" font-size=\"15\" font-weight=\"bold\">" << escape(title)
        << "</text>";
  return out.str();
}


// A column of swatches starting at (x, y): <g class="legend">.
std::string legend(const std::vector<Swatch>& swatches, double x, double y) {
  if (swatches.empty()) return "";
  std::ostringstream out;
  out << "<g class=\"legend\">";
  for (size_t i = 0; i < swatches.size(); ++i) {
    const double top = y + static_cast<double>(i) * 18;
    if (swatches[i].dashed)
      out << "<line x1=\"" << number(x) << "\" x2=\"" << number(x + kSwatchPx) << "\" y1=\"" << number(top + kSwatchPx / 2)
          << "\" y2=\"" << number(top + kSwatchPx / 2) << "\" stroke=\"" << escape(swatches[i].color)
          << "\" stroke-width=\"2\" stroke-dasharray=\"4 2\"/>";
    else
      out << "<rect x=\"" << number(x) << "\" y=\"" << number(top) << "\" width=\"" << number(kSwatchPx) << "\" height=\""
          << number(kSwatchPx) << "\" fill=\"" << escape(swatches[i].color) << "\" stroke=\"#555\" stroke-width=\"0.5\"/>";
    out
        << "<text x=\"" << number(x + kSwatchPx + 6) << "\" y=\"" << number(top + kSwatchPx - 2) << "\">"
        << escape(swatches[i].name) << "</text>";
  }
  out << "</g>";
  return out.str();
}

// Horizontal gridlines and labels of a vertical axis from `ticks`, mapped by `y_of`.
template <typename YOf>
std::string y_axis(const std::vector<Tick>& ticks, YOf y_of, double left, double right, double top, double bottom,
                   const std::string& label) {
  std::ostringstream out;
  out << "<g class=\"y-axis\">";
  for (const Tick& t : ticks) {
    const double y = y_of(t.value);
    out << "<line x1=\"" << number(left) << "\" x2=\"" << number(right) << "\" y1=\"" << number(y) << "\" y2=\""
        << number(y) << "\" stroke=\"#e3e3e3\"/>"
        << "<text x=\"" << number(left - 6) << "\" y=\"" << number(y + 4) << "\" text-anchor=\"end\">"
        << escape(t.label) << "</text>";
  }
  out << "<line x1=\"" << number(left) << "\" x2=\"" << number(left) << "\" y1=\"" << number(top) << "\" y2=\""
      << number(bottom) << "\" stroke=\"#444\"/>";
  const double mid = (top + bottom) / 2;
  out << "<text class=\"axis-label\" transform=\"translate(16 " << number(mid) << ") rotate(-90)\" text-anchor=\"middle\">"
      << escape(label) << "</text></g>";
  return out.str();
}

template <typename XOf>
std::string x_axis(const std::vector<Tick>& ticks, XOf x_of, double left, double right, double top, double bottom,
                   const std::string& label, bool grid) {
  std::ostringstream out;
  out << "<g class=\"x-axis\">";
  for (const Tick& t : ticks) {
    const double x = x_of(t.value);
    if (grid)
      out << "<line x1=\"" << number(x) << "\" x2=\"" << number(x) << "\" y1=\"" << number(top) << "\" y2=\""
          << number(bottom) << "\" stroke=\"#e3e3e3\"/>";
    out << "<line x1=\"" << number(x) << "\" x2=\"" << number(x) << "\" y1=\"" << number(bottom) << "\" y2=\""
        << number(bottom + 4) << "\" stroke=\"#444\"/>"
        << "<text x=\"" << number(x) << "\" y=\"" << number(bottom + 16) << "\" text-anchor=\"middle\">"
        << escape(t.label) << "</text>";
  }
  out << "<line x1=\"" << number(left) << "\" x2=\"" << number(right) << "\" y1=\"" << number(bottom) << "\" y2=\""
      << number(bottom) << "\" stroke=\"#444\"/>";
  out << "<text class=\"axis-label\" x=\"" << number((left + right) / 2) << "\" y=\"" << number(bottom + 36)
      << "\" text-anchor=\"middle\">" << escape(label) << "</text></g>";
  return out.str();
}

std::string reference_lines(const std::vector<ReferenceLine>& lines, double y_max, double left, double right,
                            const std::function<double(double)>& y_of) {
  std::ostringstream out;
  for (const ReferenceLine& l : lines) {
    if (!finite(l.value) || l.value < 0 || l.value > y_max) continue;
    const double y = y_of(l.value);
    out << "<g class=\"reference\"><line x1=\"" << number(left) << "\" x2=\"" << number(right) << "\" y1=\""
        << number(y) << "\" y2=\"" << number(y) << "\" stroke=\"" << escape(l.color)
        << "\" stroke-width=\"1.5\" stroke-dasharray=\"7 4\"><title>" << escape(l.label) << "</title></line></g>";
  }
  return out.str();
}

// A value printed with decimals by its size: 1641, 75.7, 3.42, 0.125.
std::string short_value(double v) {
  const double a = std::fabs(v);
  return number(v, a >= 100 ? 0 : a >= 10 ? 1 : a >= 1 ? 2 : 3);
}

// The largest 1, 2 or 5 x 10^k <= value (value > 0).
double nice_floor(double value) {
  const double mag = std::pow(10.0, std::floor(std::log10(value)));
  for (double m : {5.0, 2.0, 1.0})
    if (m * mag <= value * (1 + 1e-12)) return m * mag;
  return mag;
}

Axis default_axis(std::vector<double> values, bool log) {
  std::vector<double> usable;
  for (double v : values)
    if (finite(v) && (!log || v > 0)) usable.push_back(v);
  if (usable.empty()) return log ? Axis{1, 10, true} : Axis{0, 1, false};
  const auto [mn, mx] = std::minmax_element(usable.begin(), usable.end());
  if (log) {
    double lo = nice_floor(*mn), hi = nice_ceiling(*mx);
    if (hi <= lo) lo /= 2, hi *= 2;
    return {lo, hi, true};
  }
  double lo = *mn, hi = *mx;
  const double pad = hi > lo ? (hi - lo) * 0.05 : std::max(std::fabs(hi) * 0.1, 1.0);
  lo -= pad, hi += pad;
  if (*mn >= 0 && lo < 0) lo = 0;
  return {lo, hi, false};
}

std::vector<Tick> axis_ticks(const Axis& a, int target) {
  return a.log ? log_ticks(a.lo, a.hi) : linear_ticks(a.lo, a.hi, target);
}

}  // namespace

double text_width(const std::string& text, double font_px) {
  size_t chars = 0;
  for (unsigned char c : text)
    if ((c & 0xC0) != 0x80) ++chars;  // UTF-8: count the first byte of each character
  return static_cast<double>(chars) * kCharWidthEm * font_px;
}

double legend_width(const std::vector<Swatch>& swatches) {
  double w = 0;
  for (const auto& s : swatches) w = std::max(w, text_width(s.name, kFontPx));
  return swatches.empty() ? 0 : kSwatchPx + 6 + w + 20;
}

std::string escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default:
        // XML 1.0 allows no control character but tab, newline and carriage return.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') out += '?';
        else out += c;
    }
  }
  return out;
}

std::string number(double value, int decimals) {
  if (!finite(value)) return "0";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", std::max(0, decimals), value);
  std::string s = buf;
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  if (s == "-0") s = "0";
  return s;
}

double nice_ceiling(double value) {
  if (!finite(value) || value <= 0) return 1;
  const double mag = std::pow(10.0, std::floor(std::log10(value)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= value * (1 - 1e-12)) return m * mag;
  return 10 * mag;
}

std::vector<Tick> linear_ticks(double lo, double hi, int target) {
  if (!finite(lo) || !finite(hi)) return {};
  if (hi <= lo) hi = lo + 1;
  target = std::max(target, 1);
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw * (1 - 1e-9)) {
      step = m * mag;
      break;
    }
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  std::vector<Tick> ticks;
  const double first = std::ceil(lo / step - 1e-9);
  for (int i = 0;; ++i) {
    const double v = (first + i) * step;
    if (v > hi + step * 1e-9) break;
    ticks.push_back({v, number(v, decimals)});
  }
  return ticks;
}

std::vector<Tick> log_ticks(double lo, double hi) {
  if (!finite(lo) || !finite(hi) || lo <= 0 || hi <= lo) return {};
  const int k0 = static_cast<int>(std::floor(std::log10(lo))), k1 = static_cast<int>(std::ceil(std::log10(hi)));
  const bool decades_only = k1 - k0 > 4;
  std::vector<Tick> ticks;
  for (int k = k0; k <= k1; ++k)
    for (double m : {1.0, 2.0, 5.0}) {
      if (decades_only && m != 1.0) continue;
      const double v = m * std::pow(10.0, k);
      if (v < lo * (1 - 1e-9) || v > hi * (1 + 1e-9)) continue;
      std::string label;
      if (v >= 1e6 || v < 1e-3) {
        label = number(m, 0) + "e" + std::to_string(k);
      } else {
        label = number(v, std::max(0, -k));
      }
      ticks.push_back({v, label});
    }
  return ticks;
}

double axis_pixel(const Axis& a, double value, double p_lo, double p_hi) {
  double f = 0;
  if (a.log) {
    const double l0 = std::log10(a.lo), l1 = std::log10(a.hi);
    f = l1 > l0 && value > 0 ? (std::log10(value) - l0) / (l1 - l0) : 0;
  } else {
    f = a.hi > a.lo ? (value - a.lo) / (a.hi - a.lo) : 0;
  }
  return p_lo + f * (p_hi - p_lo);
}

const std::vector<std::string>& palette() {
  static const std::vector<std::string> colors = {
      "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
      "#9c755f", "#bab0ac", "#a0cbe8", "#ffbe7d", "#8cd17d", "#b6992d", "#499894", "#86bcb6",
      "#d37295", "#fabfd2", "#79706e", "#d4a6c8", "#1f3d7a", "#8f2d56", "#3b7d23", "#c15f00"};
  return colors;
}

// ---- stacked bars ------------------------------------------------------------------------------

std::string render_stacked_bars(const StackedBarChart& c) {
  const size_t n = c.categories.size();
  std::vector<Swatch> swatches;
  for (const auto& s : c.series) swatches.push_back({s.name, s.color});
  for (const auto& l : c.lines) swatches.push_back({l.label, l.color, true});
  const double legend_w = legend_width(swatches);

  auto value = [&](const BarSeries& s, size_t i) {
    const double v = i < s.values.size() ? s.values[i] : 0.0;
    return finite(v) && v > 0 ? v : 0.0;
  };
  std::vector<double> totals(n, 0.0);
  for (size_t i = 0; i < n; ++i)
    for (const auto& s : c.series) totals[i] += value(s, i);
  double tallest = 0;
  for (double t : totals) tallest = std::max(tallest, t);
  for (const auto& l : c.lines)
    if (finite(l.value)) tallest = std::max(tallest, l.value);
  const double y_max = c.y_max && finite(*c.y_max) && *c.y_max > 0 ? *c.y_max : nice_ceiling(tallest);

  // Category names are rotated by 40 degrees, anchored at their end under the bar: a name of width w
  // reaches w x sin 40 down and w x cos 40 to the left.
  const double rot = 40.0, sin_r = std::sin(rot * kPi / 180), cos_r = std::cos(rot * kPi / 180);
  auto emphasized = [&](size_t i) { return i < c.emphasized.size() && c.emphasized[i]; };
  auto label_of = [&](size_t i) { return (emphasized(i) ? "\u2605 " : "") + c.categories[i]; };
  auto note_of = [&](size_t i) { return i < c.category_notes.size() ? c.category_notes[i] : std::string(); };
  std::vector<double> label_w(n, 0.0);
  double longest = 0;
  for (size_t i = 0; i < n; ++i) {
    label_w[i] = text_width(label_of(i) + (note_of(i).empty() ? "" : "  " + note_of(i)), kFontPx);
    longest = std::max(longest, label_w[i]);
  }
  Margins m = c.margins;
  m.bottom = std::max(m.bottom, 14 + longest * sin_r + kFontPx * cos_r + 6);
  const double pitch0 = c.width > 0 && n ? (c.width - m.left - m.right - legend_w) / double(n) : c.bar_pitch;
  for (size_t i = 0; i < n; ++i) m.left = std::max(m.left, label_w[i] * cos_r - pitch0 * (double(i) + 0.5) + 8);
  const double min_width = std::max(480.0, text_width(c.title, 15) + 24);  // the title fits
  const double width = c.width > 0 ? c.width : std::max(min_width, m.left + m.right + legend_w + c.bar_pitch * double(n));
  const double left = m.left, right = width - m.right - legend_w, top = m.top, bottom = c.height - m.bottom;
  const double plot_h = bottom - top;
  auto y_of = [&](double v) { return bottom - std::min(v, y_max) / y_max * plot_h; };

  std::ostringstream out;
  out << open_svg(width, c.height, "stacked-bars", c.title);
  out << y_axis(linear_ticks(0, y_max, 6), y_of, left, right, top, bottom, c.y_label);
  out << "<line x1=\"" << number(left) << "\" x2=\"" << number(right) << "\" y1=\"" << number(bottom) << "\" y2=\""
      << number(bottom) << "\" stroke=\"#444\"/>";
  const double slot = n ? (right - left) / double(n) : 0;
  const double bar_w = slot * c.bar_fill;
  for (size_t i = 0; i < n; ++i) {
    const double x = left + slot * double(i) + (slot - bar_w) / 2;
    out << "<g class=\"bar-group\" data-category=\"" << escape(c.categories[i]) << "\">";
    double cum = 0;
    for (const auto& s : c.series) {
      const double v = value(s, i);
      if (v <= 0) continue;
      const double lo = cum, hi = cum + v;
      cum = hi;
      if (lo >= y_max) continue;  // entirely above the axis: the clipped bar's marker says so
      const double shown_top = std::min(hi, y_max);
      out << "<rect class=\"bar" << (hi > y_max ? " clipped" : "") << "\" data-series=\"" << escape(s.name)
          << "\" data-category=\"" << escape(c.categories[i]) << "\" data-value=\"" << number(v, 6) << "\" x=\""
          << number(x, 3) << "\" y=\"" << number(y_of(shown_top), 3) << "\" width=\"" << number(bar_w, 3)
          << "\" height=\"" << number((shown_top - lo) / y_max * plot_h, 3) << "\" fill=\"" << escape(s.color)
          << "\"><title>" << escape(c.categories[i] + ": " + s.name + " " + short_value(v) + " " + c.value_unit)
          << "</title></rect>";
    }
    std::string total = short_value(cum) + (c.value_unit.empty() ? "" : " " + c.value_unit);
    if (text_width(total + "XX", kSmallFontPx) > slot) total = short_value(cum);  // the axis names the unit
    if (cum > y_max) {
      // Clipped: a white zigzag across the bar's top and the real total above the plot.
      const double y = top + 8;
      out << "<polyline class=\"clip-mark\" points=\"";
      for (int k = 0; k <= 6; ++k)
        out << number(x + bar_w * k / 6.0) << "," << number(y + (k % 2 ? -3 : 3)) << (k < 6 ? " " : "");
      out << "\" fill=\"none\" stroke=\"#ffffff\" stroke-width=\"3\"/>"
          << "<text class=\"total clipped\" x=\"" << number(x + bar_w / 2) << "\" y=\"" << number(top - 4)
          << "\" text-anchor=\"middle\" font-size=\"" << number(kSmallFontPx) << "\" font-weight=\"bold\">&#9650; "
          << escape(total) << "</text>";
    } else if (cum > 0) {
      out << "<text class=\"total\" x=\"" << number(x + bar_w / 2) << "\" y=\"" << number(y_of(cum) - 4)
          << "\" text-anchor=\"middle\" font-size=\"" << number(kSmallFontPx) << "\">" << escape(total) << "</text>";
    }
    const double cx = left + slot * (double(i) + 0.5);
    out << "<text class=\"category\" transform=\"translate(" << number(cx + 4) << " " << number(bottom + 14)
        << ") rotate(-" << number(rot) << ")\" text-anchor=\"end\"" << (emphasized(i) ? " font-weight=\"bold\"" : "")
        << ">" << escape(label_of(i));
    if (!note_of(i).empty()) out << "<tspan fill=\"#666\" font-weight=\"normal\">  " << escape(note_of(i)) << "</tspan>";
    out << "</text></g>";
  }
  out << reference_lines(c.lines, y_max, left, right, y_of);
  out << legend(swatches, right + 16, top);
  out << "</svg>";
  return out.str();
}

// ---- scatter -----------------------------------------------------------------------------------

std::string render_scatter(const ScatterChart& c) {
  std::vector<double> xs, ys;
  for (const auto& p : c.points) xs.push_back(p.x), ys.push_back(p.y);
  const Axis ax = c.x_axis ? *c.x_axis : default_axis(xs, c.log_x);
  const Axis ay = c.y_axis ? *c.y_axis : default_axis(ys, c.log_y);

  std::vector<Swatch> swatches = c.groups;
  bool any_highlight = false, any_emphasis = false;
  for (const auto& p : c.points) any_highlight |= p.highlighted, any_emphasis |= p.emphasized;
  if (any_highlight) swatches.push_back({c.highlight_name + " (outlined, joined)", "#111111"});
  if (any_emphasis && !c.emphasis_name.empty()) swatches.push_back({c.emphasis_name + " (ringed)", "#ffffff"});
  const double legend_w = legend_width(swatches);

  const Margins& m = c.margins;
  const double left = m.left, right = c.width - m.right - legend_w, top = m.top, bottom = c.height - m.bottom;
  auto x_of = [&](double v) { return axis_pixel(ax, v, left, right); };
  auto y_of = [&](double v) { return axis_pixel(ay, v, bottom, top); };
  auto drawable = [&](const ScatterPoint& p) {
    return finite(p.x) && finite(p.y) && (!ax.log || p.x > 0) && (!ay.log || p.y > 0);
  };
  auto color = [&](const ScatterPoint& p) {
    return p.group < c.groups.size() ? c.groups[p.group].color : palette()[p.group % palette().size()];
  };

  std::ostringstream out;
  out << open_svg(c.width, c.height, "scatter", c.title);
  out << y_axis(axis_ticks(ay, 6), y_of, left, right, top, bottom, c.y_label);
  out << x_axis(axis_ticks(ax, 8), x_of, left, right, top, bottom, c.x_label, true);

  struct Box {
    double x0, y0, x1, y1;
    bool overlaps(const Box& o) const { return x0 < o.x1 && o.x0 < x1 && y0 < o.y1 && o.y0 < y1; }
  };
  std::vector<Box> placed;
  std::ostringstream points, highlighted, labels;
  std::vector<std::pair<double, double>> line;
  // Plain points of one group within half a pixel of each other are drawn once (data-count says how
  // many): a sweep of thousands of plans stays a light file and looks the same.
  std::map<std::tuple<size_t, long, long>, std::pair<size_t, size_t>> same_spot;  // -> first index, count
  for (size_t k = 0; k < c.points.size(); ++k) {
    const ScatterPoint& p = c.points[k];
    if (!drawable(p) || p.highlighted || p.emphasized) continue;
    const auto key = std::make_tuple(p.group, std::lround(x_of(p.x) * 2), std::lround(y_of(p.y) * 2));
    auto it = same_spot.find(key);
    if (it == same_spot.end()) same_spot.emplace(key, std::make_pair(k, size_t(1)));
    else ++it->second.second;
  }
  std::vector<size_t> count(c.points.size(), 1);
  std::vector<bool> drawn_elsewhere(c.points.size(), false);
  for (size_t k = 0; k < c.points.size(); ++k) {
    const ScatterPoint& p = c.points[k];
    if (!drawable(p) || p.highlighted || p.emphasized) continue;
    const auto& spot = same_spot.at(std::make_tuple(p.group, std::lround(x_of(p.x) * 2), std::lround(y_of(p.y) * 2)));
    if (spot.first == k) count[k] = spot.second;
    else drawn_elsewhere[k] = true;
  }
  for (size_t k = 0; k < c.points.size(); ++k) {
    const ScatterPoint& p = c.points[k];
    if (!drawable(p) || drawn_elsewhere[k]) continue;
    const double x = x_of(p.x), y = y_of(p.y);
    std::string tip = p.tooltip.empty() ? p.label : p.tooltip;
    if (count[k] > 1) tip += " (and " + std::to_string(count[k] - 1) + " more plans at this point)";
    std::ostringstream circle;
    circle << "<circle class=\"point" << (p.highlighted ? " highlighted" : "") << "\" data-count=\"" << count[k]
           << "\" cx=\"" << number(x, 2) << "\" cy=\"" << number(y, 2) << "\" r=\"" << (p.highlighted ? "5.5" : "3.5")
           << "\" fill=\"" << escape(color(p)) << "\""
           << (p.highlighted ? " stroke=\"#111111\" stroke-width=\"1.5\"" : " fill-opacity=\"0.55\"") << "><title>"
           << escape(tip) << "</title></circle>";
    if (p.emphasized)
      circle << "<circle class=\"emphasis\" cx=\"" << number(x, 3) << "\" cy=\"" << number(y, 3)
             << "\" r=\"10\" fill=\"none\" stroke=\"#111111\" stroke-width=\"2\"/>";
    if (p.highlighted) {
      highlighted << circle.str();
      line.push_back({x, y});
      if (!p.label.empty()) {
        // The first of a few places beside the point that overlaps no earlier label and stays inside.
        const double w = text_width(p.label, kSmallFontPx), h = kSmallFontPx;
        struct Place { double dx, dy; bool end; };
        std::vector<Place> places;
        for (int k = 0; k < 8; ++k)
          for (const Place& pl : {Place{8, -8, false}, Place{8, 16, false}, Place{-8, -8, true}, Place{-8, 16, true}})
            places.push_back({pl.dx, pl.dy + (pl.dy < 0 ? -13.0 : 13.0) * k, pl.end});
        Box chosen{};
        bool found = false;
        for (const Place& pl : places) {
          const double x0 = pl.end ? x + pl.dx - w : x + pl.dx, y1 = y + pl.dy;
          const Box b{x0, y1 - h, x0 + w, y1 + 2};
          const bool inside = b.x0 >= left && b.x1 <= right + legend_w && b.y0 >= top - 8 && b.y1 <= bottom;
          const bool free = std::none_of(placed.begin(), placed.end(), [&](const Box& o) { return o.overlaps(b); });
          if (inside && free) {
            chosen = b, found = true;
            break;
          }
        }
        if (!found) chosen = {x + 8, y - 8 - h, x + 8 + w, y - 6};
        placed.push_back(chosen);
        labels << "<text class=\"point-label\" x=\"" << number(chosen.x0) << "\" y=\"" << number(chosen.y1 - 2)
               << "\" font-size=\"" << number(kSmallFontPx) << "\">" << escape(p.label) << "</text>";
      }
    } else {
      points << circle.str();
    }
  }
  out << "<g class=\"points\">" << points.str() << "</g>";
  if (line.size() > 1) {
    std::sort(line.begin(), line.end());
    out << "<polyline class=\"highlight-line\" points=\"";
    for (size_t i = 0; i < line.size(); ++i)
      out << number(line[i].first) << "," << number(line[i].second) << (i + 1 < line.size() ? " " : "");
    out << "\" fill=\"none\" stroke=\"#111111\" stroke-width=\"1.5\"/>";
  }
  out << "<g class=\"highlighted\">" << highlighted.str() << "</g><g class=\"labels\">" << labels.str() << "</g>";
  std::string leg = legend(swatches, right + 16, top);
  out << leg << "</svg>";
  return out.str();
}

// ---- timeline ----------------------------------------------------------------------------------

std::string render_timeline(const TimelineChart& c) {
  double x_max = c.x_max;
  if (!(x_max > 0))
    for (const auto& lane : c.lanes)
      for (const auto& iv : lane.intervals)
        if (finite(iv.end)) x_max = std::max(x_max, iv.end);
  if (!(x_max > 0)) x_max = 1;
  const double legend_w = legend_width(c.categories);
  double longest = 0;
  for (const auto& lane : c.lanes) longest = std::max(longest, text_width(lane.label, kFontPx));
  Margins m = c.margins;
  m.left = std::max(m.left, longest + 16);
  const double pitch = c.lane_height + c.lane_gap;
  const double lanes_h = c.lanes.empty() ? c.lane_height : pitch * double(c.lanes.size()) - c.lane_gap;
  const double height = std::max(m.top + lanes_h + m.bottom, m.top + 18 * double(c.categories.size()) + 8);
  const double left = m.left, right = c.width - m.right - legend_w, top = m.top, bottom = top + lanes_h;
  const Axis ax{0, x_max, false};
  auto x_of = [&](double v) { return axis_pixel(ax, std::clamp(v, 0.0, x_max), left, right); };
  auto name_of = [&](size_t cat) { return cat < c.categories.size() ? c.categories[cat].name : std::string("?"); };
  auto color_of = [&](size_t cat) {
    return cat < c.categories.size() ? c.categories[cat].color : palette()[cat % palette().size()];
  };

  std::ostringstream out;
  out << open_svg(c.width, height, "timeline", c.title);
  out << x_axis(linear_ticks(0, x_max, 10), x_of, left, right, top, bottom + 2, c.x_label, true);
  struct Span {
    double x0, x1;
    size_t category;
    size_t count;
    double start, end;
    std::string label;
  };
  for (size_t li = 0; li < c.lanes.size(); ++li) {
    const TimelineLane& lane = c.lanes[li];
    const double y = top + pitch * double(li);
    out << "<g class=\"lane\" data-lane=\"" << escape(lane.label) << "\"><rect class=\"lane-background\" x=\""
        << number(left) << "\" y=\"" << number(y) << "\" width=\"" << number(right - left) << "\" height=\""
        << number(c.lane_height) << "\" fill=\"#f3f3f3\"/>"
        << "<text x=\"" << number(left - 8) << "\" y=\"" << number(y + c.lane_height / 2 + 4)
        << "\" text-anchor=\"end\">" << escape(lane.label) << "</text>";
    std::vector<TimelineInterval> ivs;
    for (const auto& iv : lane.intervals)
      if (finite(iv.start) && finite(iv.end) && iv.end >= iv.start) ivs.push_back(iv);
    std::stable_sort(ivs.begin(), ivs.end(), [](const auto& a, const auto& b) { return a.start < b.start; });
    // Merge neighbours of one category less than half a pixel apart.
    std::vector<Span> spans;
    for (const auto& iv : ivs) {
      const double x0 = x_of(iv.start), x1 = x_of(iv.end);
      if (!spans.empty() && spans.back().category == iv.category && x0 <= spans.back().x1 + 0.5) {
        Span& s = spans.back();
        s.x1 = std::max(s.x1, x1), s.end = std::max(s.end, iv.end), ++s.count;
        continue;
      }
      spans.push_back({x0, x1, iv.category, 1, iv.start, iv.end, iv.label});
    }
    // Still more spans than pixels (categories alternating within a pixel): one span per pixel
    // column, of the category that fills most of it.
    const double plot_w = right - left;
    if (static_cast<double>(spans.size()) > 2 * plot_w) {
      const size_t columns = static_cast<size_t>(std::ceil(plot_w));
      std::vector<std::map<size_t, double>> fill(columns);
      std::vector<size_t> counts(columns, 0);
      for (const auto& iv : ivs) {
        const double x0 = x_of(iv.start) - left, x1 = x_of(iv.end) - left;
        const size_t c0 = std::min(columns - 1, static_cast<size_t>(std::max(0.0, x0)));
        const size_t c1 = std::min(columns - 1, static_cast<size_t>(std::max(0.0, x1)));
        for (size_t col = c0; col <= c1; ++col) {
          const double overlap = std::min(x1, double(col + 1)) - std::max(x0, double(col));
          fill[col][iv.category] += std::max(overlap, 1e-9);
        }
        ++counts[c0];
      }
      spans.clear();
      for (size_t col = 0; col < columns; ++col) {
        if (fill[col].empty()) continue;
        const auto best = std::max_element(fill[col].begin(), fill[col].end(),
                                           [](const auto& a, const auto& b) { return a.second < b.second; });
        const double x0 = left + double(col), x1 = x0 + 1;
        const double t0 = (x0 - left) / plot_w * x_max, t1 = (x1 - left) / plot_w * x_max;
        if (!spans.empty() && spans.back().category == best->first && spans.back().x1 >= x0) {
          spans.back().x1 = x1, spans.back().end = t1, spans.back().count += counts[col];
          continue;
        }
        spans.push_back({x0, x1, best->first, std::max<size_t>(counts[col], 1), t0, t1, ""});
      }
    }
    for (const Span& s : spans) {
      std::string tip = (s.count == 1 && !s.label.empty() ? s.label : name_of(s.category) +
                         (s.count > 1 ? " x" + std::to_string(s.count) : std::string())) +
                        ": " + short_value(s.start) + " to " + short_value(s.end) + " s";
      out << "<rect class=\"span\" data-category=\"" << escape(name_of(s.category)) << "\" data-count=\"" << s.count
          << "\" x=\"" << number(s.x0, 3) << "\" y=\"" << number(y) << "\" width=\""
          << number(std::max(s.x1 - s.x0, 0.5), 3) << "\" height=\"" << number(c.lane_height) << "\" fill=\""
          << escape(color_of(s.category)) << "\"><title>" << escape(tip) << "</title></rect>";
    }
    out << "</g>";
  }
  out << legend(c.categories, right + 16, top);
  out << "</svg>";
  return out.str();
}

// ---- step lines --------------------------------------------------------------------------------

std::string render_step_lines(const StepLineChart& c) {
  double x_max = c.x_max, highest = 0;
  for (const auto& s : c.series)
    for (const auto& [x, y] : s.points) {
      if (finite(x) && !(c.x_max > 0)) x_max = std::max(x_max, x);
      if (finite(y)) highest = std::max(highest, y);
    }
  for (const auto& l : c.lines)
    if (finite(l.value)) highest = std::max(highest, l.value);
  if (!(x_max > 0)) x_max = 1;
  const double y_max = c.y_max && finite(*c.y_max) && *c.y_max > 0 ? *c.y_max : nice_ceiling(highest);
  std::vector<Swatch> swatches;
  for (const auto& s : c.series) swatches.push_back({s.name, s.color});
  for (const auto& l : c.lines) swatches.push_back({l.label, l.color, true});
  const double legend_w = legend_width(swatches);
  const Margins& m = c.margins;
  const double left = m.left, right = c.width - m.right - legend_w, top = m.top, bottom = c.height - m.bottom;
  const Axis ax{0, x_max, false}, ay{0, y_max, false};
  auto x_of = [&](double v) { return axis_pixel(ax, std::clamp(v, 0.0, x_max), left, right); };
  auto y_of = [&](double v) { return axis_pixel(ay, std::clamp(v, 0.0, y_max), bottom, top); };

  std::ostringstream out;
  out << open_svg(c.width, c.height, "step-lines", c.title);
  out << y_axis(linear_ticks(0, y_max, 6), y_of, left, right, top, bottom, c.y_label);
  out << x_axis(linear_ticks(0, x_max, 10), x_of, left, right, top, bottom, c.x_label, false);
  for (const auto& s : c.series) {
    std::ostringstream d;
    bool started = false;
    long column = 0;
    double first = 0, hi = 0, lo = 0, last = 0;
    auto flush = [&]() {
      d << " V" << number(y_of(first)) ;
      if (hi != first) d << " V" << number(y_of(hi));
      if (lo != hi) d << " V" << number(y_of(lo));
      if (last != lo) d << " V" << number(y_of(last));
    };
    for (const auto& [x, y] : s.points) {
      if (!finite(x) || !finite(y)) continue;
      const double px = x_of(x);
      const long col = static_cast<long>(std::floor(px));
      if (!started) {
        d << "M" << number(px) << " " << number(y_of(y));
        started = true, column = col, first = hi = lo = last = y;
        continue;
      }
      if (col == column) {
        hi = std::max(hi, y), lo = std::min(lo, y), last = y;
        continue;
      }
      flush();
      d << " H" << number(px);
      column = col, first = hi = lo = last = y;
    }
    if (!started) continue;
    flush();
    d << " H" << number(right);
    out << "<path class=\"series\" data-series=\"" << escape(s.name) << "\" d=\"" << d.str() << "\" fill=\"none\" stroke=\""
        << escape(s.color) << "\" stroke-width=\"1.5\"><title>" << escape(s.name) << "</title></path>";
  }
  out << reference_lines(c.lines, y_max, left, right, y_of);
  out << legend(swatches, right + 16, top);
  out << "</svg>";
  return out.str();
}

std::string svg_document(const std::string& svg_element) {
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" + svg_element + "\n";
}

}  // namespace ftplan::svg

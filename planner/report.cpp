#include "planner/report.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <sstream>

#include "planner/format.h"
#include "planner/memory_model.h"
#include "planner/plan_report.h"

namespace ftplan {
namespace {

constexpr double kBytesPerGiB = 1024.0 * 1024.0 * 1024.0;

// The terms of MemoryBreakdown, bottom up, each with its colour (they sum to `total`).
struct MemoryTerm {
  const char* name;
  const char* color;
  int64_t MemoryBreakdown::*bytes;
};
const MemoryTerm kMemoryTerms[] = {
    {"weights", "#4e79a7", &MemoryBreakdown::weights},
    {"gradients", "#f28e2b", &MemoryBreakdown::gradients},
    {"optimizer states", "#e15759", &MemoryBreakdown::optimizer},
    {"activations", "#76b7b2", &MemoryBreakdown::activations},
    {"logits + loss", "#59a14f", &MemoryBreakdown::logits_loss},
    {"temporary buffers", "#edc948", &MemoryBreakdown::temporary},
    {"overhead", "#bab0ac", &MemoryBreakdown::overhead},
};

std::string gib(double bytes, int decimals = 2) { return format_fixed(bytes / kBytesPerGiB, decimals); }

int64_t usable_bytes(const PlanResult& plan, const HardwareSpec& hw, const TrainingSetup& setup) {
  for (const auto& o : plan.strategies)
    if (o.best.memory.usable_bytes > 0) return o.best.memory.usable_bytes;
  return static_cast<int64_t>(double(usable_device_bytes(hw)) * (1 - setup.headroom_fraction));
}

std::string usable_text(int64_t usable, const HardwareSpec& hw, const TrainingSetup& setup) {
  return gib(double(usable)) + " GiB usable on one " + hw.id + " (" + gib(double(usable_device_bytes(hw))) +
         " GiB a process can allocate of the " + gib(double(hw.memory_bytes)) + " GiB nvidia-smi reports, less " + format_fixed(setup.headroom_fraction * 100, 0) + "% headroom)";
}

bool reads_as_number(const std::string& cell) {
  if (cell.empty() || cell == "-") return true;
  std::string digits;
  for (char c : cell)
    if (c != ',') digits += c;
  char* end = nullptr;
  std::strtod(digits.c_str(), &end);
  return end && *end == '\0' && end != digits.c_str();
}

std::string candidate_text(const Candidate& c) {
  return "micro-batch " + std::to_string(c.micro_batch) + ", checkpointing " + to_string(c.checkpointing) +
         (c.activation_offload ? ", activation offload" : "");
}

std::string price_source(const HardwareSpec& hw) {
  const auto it = hw.sources.find("price_usd_per_gpu_hour");
  return it == hw.sources.end() ? std::string("-") : it->second;
}

}  // namespace

std::string html_paragraph(const std::string& text) { return "<p>" + svg::escape(text) + "</p>\n"; }

std::string html_figure(const std::string& svg_element, const std::string& caption) {
  return "<figure>" + svg_element + "<figcaption>" + svg::escape(caption) + "</figcaption></figure>\n";
}

std::string html_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::vector<bool> numeric(header.size(), true);
  for (const auto& r : rows)
    for (size_t i = 0; i < header.size(); ++i)
      if (i < r.size() && !reads_as_number(r[i])) numeric[i] = false;
  std::ostringstream out;
  out << "<table><thead><tr>";
  for (const auto& h : header) out << "<th>" << svg::escape(h) << "</th>";
  out << "</tr></thead><tbody>";
  for (const auto& r : rows) {
    out << "<tr>";
    for (size_t i = 0; i < header.size(); ++i)
      out << (numeric[i] ? "<td class=\"num\">" : "<td>") << svg::escape(i < r.size() ? r[i] : "") << "</td>";
    out << "</tr>";
  }
  out << "</tbody></table>\n";
  return out.str();
}

std::string report_page_html(const ReportPage& page) {
  std::ostringstream out;
  out << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n"
      // Nothing may be fetched: a stray reference would be blocked and logged by the browser.
      << "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\"/>\n"
      << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"/>\n"
      << "<meta name=\"generator\" content=\"" << svg::escape(page.generator) << "\"/>\n"
      << "<title>" << svg::escape(page.title) << "</title>\n"
      << "<style>\n"
         "body { font-family: 'DejaVu Sans', Verdana, sans-serif; margin: 24px; color: #222; background: #fff; }\n"
         "h1 { font-size: 22px; margin: 0 0 8px 0; }\n"
         "h2 { font-size: 18px; border-bottom: 1px solid #ddd; padding-bottom: 4px; margin-top: 36px; }\n"
         "p, li, figcaption { max-width: 1180px; line-height: 1.4; }\n"
         "p.summary { margin: 2px 0; font-size: 14px; }\n"
         "nav a { margin-right: 16px; }\n"
         "figure { margin: 12px 0; overflow-x: auto; }\n"
         "figcaption { font-size: 13px; color: #555; margin-top: 4px; }\n"
         "table { border-collapse: collapse; font-size: 12px; margin: 8px 0; }\n"
         "th, td { border: 1px solid #ddd; padding: 3px 8px; vertical-align: top; }\n"
         "th { background: #f4f4f4; text-align: left; }\n"
         "td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }\n"
         "ul.assumptions li { margin: 3px 0; font-size: 13px; }\n"
         "footer { margin-top: 36px; font-size: 12px; color: #666; }\n"
         "</style>\n</head>\n<body>\n<header>\n<h1>"
      << svg::escape(page.title) << "</h1>\n";
  for (const auto& line : page.summary) out << "<p class=\"summary\">" << svg::escape(line) << "</p>\n";
  out << "</header>\n<nav>";
  for (const auto& s : page.sections) out << "<a href=\"#" << svg::escape(s.id) << "\">" << svg::escape(s.title) << "</a>";
  out << "<a href=\"#assumptions\">Assumptions</a></nav>\n";
  for (const auto& s : page.sections)
    out << "<section id=\"" << svg::escape(s.id) << "\">\n<h2>" << svg::escape(s.title) << "</h2>\n" << s.html
        << "</section>\n";
  out << "<section id=\"assumptions\">\n<h2>Assumptions</h2>\n<ul class=\"assumptions\">\n";
  for (const auto& line : page.assumptions) out << "<li>" << svg::escape(line) << "</li>\n";
  out << "</ul>\n</section>\n<footer>" << svg::escape(page.generator)
      << ". Units: GiB = 2^30 bytes, s = seconds, h = hours, USD = US dollars. One file: no script, nothing fetched."
      << "</footer>\n</body>\n</html>\n";
  return out.str();
}

// ---- (a) memory --------------------------------------------------------------------------------

svg::StackedBarChart memory_breakdown_chart(const PlanResult& plan, const HardwareSpec& hw,
                                            const TrainingSetup& setup) {
  svg::StackedBarChart chart;
  chart.title = "Memory per GPU at the peak, by term, against the usable memory of one " + hw.id;
  chart.y_label = "memory per GPU (GiB)";
  chart.value_unit = "GiB";
  for (const MemoryTerm& t : kMemoryTerms) chart.series.push_back({t.name, t.color, {}});
  double tallest = 0;
  for (const auto& o : plan.strategies) {
    const RankedCandidate& c = o.best;
    chart.categories.push_back(o.name);
    chart.category_notes.push_back("mb " + std::to_string(c.candidate.micro_batch) + " \u00b7 " +
                                   to_string(c.candidate.checkpointing));
    chart.emphasized.push_back(plan.recommended && plan.recommended->candidate.name == o.name);
    for (size_t k = 0; k < chart.series.size(); ++k)
      chart.series[k].values.push_back(double(c.memory.per_gpu.*kMemoryTerms[k].bytes) / kBytesPerGiB);
    tallest = std::max(tallest, double(c.memory.per_gpu.total) / kBytesPerGiB);
  }
  const double usable = double(usable_bytes(plan, hw, setup)) / kBytesPerGiB;
  chart.lines.push_back({usable, "usable memory " + svg::number(usable, 2) + " GiB", "#111111"});
  // Up to 3x the usable memory the axis shows every bar whole; beyond, bars are clipped there.
  chart.y_max = svg::nice_ceiling(std::max(usable * 1.1, std::min(tallest, 3 * usable)));
  chart.height = 520;
  return chart;
}

ReportSection memory_section(const PlanResult& plan, const HardwareSpec& hw, const TrainingSetup& setup) {
  ReportSection s{"memory", "Memory per GPU of every strategy", ""};
  if (plan.strategies.empty()) {
    s.html = html_paragraph("No strategy applies to this job.");
    return s;
  }
  const int64_t usable = usable_bytes(plan, hw, setup);
  s.html += html_paragraph(
      "One bar per layout the plan weighed: its best candidate (the micro-batch and checkpointing under each "
      "name; the recommended one starred), or its smallest when none fits. Each bar stacks the terms of the memory model on the most loaded "
      "GPU at the step's peak, in GiB (2^30 bytes); its total is the device figure (what nvidia-smi would show: "
      "PyTorch's reserved memory + CUDA context + NCCL buffers), the figure a plan must fit under. The dashed line "
      "is " + usable_text(usable, hw, setup) + ".");
  s.html += html_figure(svg::render_stacked_bars(memory_breakdown_chart(plan, hw, setup)),
                        "Memory per GPU (GiB) of each strategy's candidate on " + std::to_string(setup.num_gpus) + "x " +
                            hw.id + "; a bar marked with a triangle is taller than the axis and clipped, its total "
                            "printed above it.");
  std::vector<std::string> header{"strategy", "micro-batch", "checkpointing"};
  for (const MemoryTerm& t : kMemoryTerms) header.push_back(std::string(t.name) + " GiB");
  for (const char* h : {"total (device) GiB", "allocated GiB", "reserved GiB", "host per node GiB", "fits"})
    header.push_back(h);
  std::vector<std::vector<std::string>> rows;
  for (const auto& o : plan.strategies) {
    const MemoryEstimate& e = o.best.memory;
    std::vector<std::string> row{o.name, std::to_string(o.best.candidate.micro_batch),
                                 to_string(o.best.candidate.checkpointing)};
    for (const MemoryTerm& t : kMemoryTerms) row.push_back(gib(double(e.per_gpu.*t.bytes)));
    row.push_back(gib(double(e.per_gpu.total)));
    row.push_back(gib(double(e.allocated_peak)));
    row.push_back(gib(double(e.reserved_peak)));
    row.push_back(gib(double(e.host_per_node)));
    row.push_back(e.fits ? "yes" : "no");
    rows.push_back(row);
  }
  s.html += html_table(header, rows);
  return s;
}

// ---- (b) frontier ------------------------------------------------------------------------------

svg::ScatterChart frontier_chart(const std::vector<SweepRow>& rows, size_t emphasized) {
  const bool job = sweep_has_job(rows);
  svg::ScatterChart chart;
  chart.title = "Time vs cost across GPU types and counts";
  chart.x_label = job ? "job time (h)" : "time per million tokens (s)";
  chart.y_label = job ? "job cost (USD)" : "cost per million tokens (USD)";
  chart.log_x = chart.log_y = true;
  chart.highlight_name = "frontier";
  chart.emphasis_name = "this job's plan";
  std::map<std::string, size_t> group_of;
  const std::vector<size_t> frontier = sweep_frontier(rows);
  for (size_t i = 0; i < rows.size(); ++i) {
    const SweepRow& r = rows[i];
    if (!group_of.count(r.gpu)) {
      group_of[r.gpu] = chart.groups.size();
      chart.groups.push_back({r.gpu, svg::palette()[chart.groups.size() % svg::palette().size()]});
    }
    const SweepPoint p = sweep_point(r, job);
    svg::ScatterPoint point;
    point.x = job ? p.time_s / 3600 : p.time_s;
    point.y = p.cost_usd;
    point.group = group_of[r.gpu];
    point.highlighted = std::find(frontier.begin(), frontier.end(), i) != frontier.end();
    point.emphasized = i == emphasized;
    point.label = std::to_string(r.gpus) + "x " + r.gpu + " " + r.result.candidate.name;
    point.tooltip = std::to_string(r.gpus) + "x " + r.gpu + ", " + r.result.candidate.name + ", " +
                    candidate_text(r.result.candidate) + ": " +
                    (job ? format_duration(p.time_s) + ", " + format_fixed(p.cost_usd, 2) + " USD"
                         : format_fixed(p.time_s, 1) + " s and " + format_fixed(p.cost_usd, 3) + " USD per million tokens");
    chart.points.push_back(point);
  }
  return chart;
}

std::string frontier_svg(const std::vector<SweepRow>& rows) {
  return svg::svg_document(svg::render_scatter(frontier_chart(rows, rows.size())));
}

ReportSection frontier_section(const std::vector<SweepRow>& rows, const std::vector<HardwareSpec>& gpus,
                               const std::vector<int64_t>& counts, const TrainingSetup& setup,
                               const PlanResult& plan) {
  ReportSection s{"frontier", "Time vs cost across GPU types and counts", ""};
  std::string count_list;
  for (size_t i = 0; i < counts.size(); ++i) count_list += (i ? ", " : "") + std::to_string(counts[i]);
  if (rows.empty()) {
    s.html = html_paragraph("No plan fits on any of the " + std::to_string(gpus.size()) + " GPU types swept at " +
                            count_list + " GPUs.");
    return s;
  }
  const bool job = sweep_has_job(rows);
  size_t own = rows.size();
  if (plan.recommended)
    for (size_t i = 0; i < rows.size() && own == rows.size(); ++i)
      if (rows[i].gpu == setup.gpu && rows[i].gpus == setup.num_gpus &&
          rows[i].result.candidate.name == plan.recommended->candidate.name)
        own = i;
  const std::vector<size_t> frontier = sweep_frontier(rows);
  s.html += html_paragraph(
      std::to_string(rows.size()) + " plans: each strategy's best candidate on each of " + std::to_string(gpus.size()) +
      " GPU types at " + count_list + " GPUs, where it fits. " +
      (job ? "Job time (h) and cost (USD) of the whole job" : "The job has no dataset: time (s) and cost (USD) per million tokens") +
      ", both on log scales. The " + std::to_string(frontier.size()) +
      " outlined points joined by the line are the frontier: no other plan is both faster and cheaper." +
      (own < rows.size() ? " The ringed point is this job's recommended plan." : ""));
  s.html += html_figure(svg::render_scatter(frontier_chart(rows, own)),
                        std::string(job ? "Job time (h) vs job cost (USD)" : "Time (s) vs cost (USD) per million tokens") +
                            " of every fitting plan, coloured by GPU type; hover a point for its plan.");
  std::vector<std::vector<std::string>> table;
  for (size_t i : frontier) {
    const SweepRow& r = rows[i];
    const RankedCandidate& c = r.result;
    const SweepPoint p = sweep_point(r, job);
    table.push_back({r.gpu, std::to_string(r.gpus), c.candidate.name, std::to_string(c.candidate.micro_batch),
                     to_string(c.candidate.checkpointing), gib(double(c.memory.per_gpu.total)),
                     format_fixed(c.step.step_time_s, 3), format_fixed(c.step.tokens_per_s, 0),
                     job ? format_fixed(p.time_s / 3600, 2) : format_fixed(p.time_s, 1),
                     job ? format_fixed(p.cost_usd, 2) : format_fixed(p.cost_usd, 3)});
  }
  s.html += "<h3>The frontier, fastest first</h3>\n";
  s.html += html_table({"gpu", "gpus", "strategy", "micro-batch", "checkpointing", "memory GiB", "step s", "tokens/s",
                        job ? "job time h" : "s per million tokens", job ? "cost USD" : "USD per million tokens"},
                       table);
  s.html += "<h3>Prices</h3>\n";
  if (setup.price_per_gpu_hour)
    s.html += html_paragraph("Every GPU type is costed at " + format_fixed(*setup.price_per_gpu_hour, 2) +
                             " USD per GPU-hour (--price-per-gpu-hour); the catalogue's prices below are not used.");
  else
    s.html += html_paragraph("Each GPU type is costed at its catalogue price (hwdb/): an indicative on-demand rental, "
                             "the month it was read and where; --price-per-gpu-hour costs every type at yours.");
  std::vector<std::vector<std::string>> prices;
  for (const HardwareSpec& hw : gpus)
    prices.push_back({hw.id, hw.name, format_fixed(hw.price_usd_per_gpu_hour, 2), hw.price_date, price_source(hw)});
  s.html += html_table({"gpu", "name", "USD per GPU-hour", "price read", "source"}, prices);
  return s;
}

// ---- the plan and the assumptions --------------------------------------------------------------

ReportSection plan_section(const PlanResult& plan, const TrainingSetup& setup) {
  ReportSection s{"plan", "The plan", ""};
  if (plan.recommended) {
    const RankedCandidate& w = *plan.recommended;
    std::string text = "Recommended: " + w.candidate.name + " on " + std::to_string(w.gpus_used) + " of " +
                       std::to_string(setup.num_gpus) + " " + setup.gpu + ", " + candidate_text(w.candidate) + ": " +
                       format_fixed(w.step.step_time_s, 3) + " s per step, " + format_fixed(w.step.tokens_per_s, 0) +
                       " tokens/s, MFU " + format_fixed(w.step.mfu * 100, 1) + "%, " + gib(double(w.memory.per_gpu.total)) +
                       " GiB per GPU";
    if (w.has_job) text += ", job " + format_duration(w.job_time_s) + ", " + format_fixed(w.cost_usd, 2) + " USD";
    s.html += html_paragraph(text + ".");
  } else {
    s.html += html_paragraph("Nothing fits on " + std::to_string(setup.num_gpus) + "x " + setup.gpu +
                             ": every strategy's smallest candidate is shown below with the memory it lacks.");
  }
  if (!plan.reason.empty()) s.html += html_paragraph("Why: " + plan.reason);
  if (!plan.knobs.empty()) s.html += html_paragraph("Knobs: " + plan.knobs);
  if (!plan.rule_of_thumb.empty()) s.html += html_paragraph(plan.rule_of_thumb);
  std::vector<std::vector<std::string>> rows;
  for (const auto& o : plan.strategies) {
    const RankedCandidate& c = o.best;
    rows.push_back({o.name, std::to_string(c.candidate.micro_batch), to_string(c.candidate.checkpointing),
                    gib(double(c.memory.per_gpu.total)), o.feasible ? format_fixed(c.step.step_time_s, 3) : "-",
                    o.feasible ? format_fixed(c.step.tokens_per_s, 0) : "-",
                    o.feasible ? format_fixed(c.step.mfu * 100, 1) : "-",
                    o.feasible && c.has_job ? format_fixed(c.job_time_s / 3600, 2) : "-",
                    o.feasible && c.has_job ? format_fixed(c.cost_usd, 2) : "-", o.verdict});
  }
  s.html += html_table({"strategy", "micro-batch", "checkpointing", "memory GiB", "step s", "tokens/s", "MFU %",
                        "job time h", "cost USD", "verdict"},
                       rows);
  s.html += html_paragraph(std::to_string(plan.evaluated) + " candidates evaluated over " +
                           std::to_string(plan.strategies.size()) + " layouts (" +
                           std::to_string(plan.compositions_considered) +
                           " compositions of tensor, context and pipeline parallelism considered), ranked by " +
                           to_string(plan.objective) + ".");
  return s;
}

std::vector<std::string> report_assumptions(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup) {
  std::vector<std::string> lines;
  lines.push_back("GPU: " + hw.name + " (hwdb " + hw.id + "): " + gib(double(hw.memory_bytes)) +
                  " GiB as nvidia-smi reports it, " +
                  (usable_device_bytes(hw) < hw.memory_bytes
                       ? gib(double(usable_device_bytes(hw))) + " GiB a process can allocate (torch's total capacity), "
                       : std::string()) +
                  gib(double(usable_device_bytes(hw)) * (1 - setup.headroom_fraction)) + " GiB usable after " +
                  format_fixed(setup.headroom_fraction * 100, 0) + "% headroom; dense bf16 peak " +
                  format_fixed(hw.peak_flops_bf16 / 1e12, 1) + " TFLOP/s; " + std::to_string(hw.gpus_per_node) +
                  " GPUs per node");
  lines.push_back("memory metric predicted: the device figure per GPU on the most loaded rank (what nvidia-smi shows: "
                  "torch.cuda.max_memory_reserved + CUDA context + NCCL buffers), the figure a plan must fit under; "
                  "the simulated memory curve is the memory model's resident terms (weights, gradients, optimizer "
                  "states, overhead) plus what the simulator allocates and frees as the step runs; GiB = 2^30 bytes");
  for (const auto& line : memory_assumptions(model, hw, setup)) lines.push_back(line);
  for (const auto& line : step_assumptions(prepare_plan(model, hw, setup, setup.num_gpus), setup)) lines.push_back(line);
  lines.push_back("price source (" + hw.id + ", read " + hw.price_date + "): " + price_source(hw));
  return lines;
}

ReportPage job_report_page(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup,
                           const PlanResult& plan, const std::vector<SweepRow>& rows,
                           const std::vector<HardwareSpec>& gpus, const std::vector<int64_t>& counts) {
  ReportPage page;
  page.title = "ftplan report: " + model.name + ", " + to_string(setup.method) + ", " + std::to_string(setup.num_gpus) +
               "x " + hw.id;
  const TrainableParams params = trainable_params(model, setup);
  page.summary.push_back(model.name + ": " + format_count(params.total) + " parameters, " +
                         format_count(params.trainable) + " trained (" + to_string(setup.method) + "), sequence " +
                         std::to_string(setup.seq_len) + " tokens, gradient accumulation " +
                         std::to_string(setup.grad_accum) + ", precision " + to_string(setup.precision) +
                         ", ranked by " + to_string(plan.objective));
  page.summary.push_back("Framework: " + setup.framework + " (configs/frameworks/" + setup.framework +
                         ".json); memory metric: the device figure nvidia-smi would show, per GPU, in GiB (2^30 bytes)");
  page.summary.push_back("GPU: " + std::to_string(setup.num_gpus) + "x " + hw.name + ", " +
                         usable_text(usable_bytes(plan, hw, setup), hw, setup));
  page.summary.push_back(
      "Price: " + format_fixed(gpu_hour_price_usd(hw, setup), 2) + " USD per GPU-hour " +
      (setup.price_per_gpu_hour ? std::string("(--price-per-gpu-hour)")
                                : "(hwdb " + hw.id + ", read " + hw.price_date + ")") +
      (setup.price_per_gpu_hour ? "; the sweep costs every GPU type at this price"
                                : "; the sweep costs each GPU type at its own dated price (table under the frontier)"));
  page.assumptions = report_assumptions(model, hw, setup);
  page.sections.push_back(plan_section(plan, setup));
  page.sections.push_back(memory_section(plan, hw, setup));
  page.sections.push_back(frontier_section(rows, gpus, counts, setup, plan));
  return page;
}

}  // namespace ftplan

// `ftplan report`: one self-contained HTML page about a job, to look at rather than read: every
// strategy's memory breakdown against the GPU's usable memory, the time-vs-cost frontier of a sweep
// across GPU types and counts, and (simulator/step_report.h) the simulated step over time. The page
// holds its charts as inline SVG (planner/report_svg.h), has no script and references nothing
// outside itself; its Content-Security-Policy forbids every fetch, so a browser renders it offline
// and would log any attempt. `ftplan sweep --format svg` writes the frontier chart alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/plan_search.h"
#include "planner/report_svg.h"
#include "planner/sweep.h"

namespace ftplan {

struct ReportSection {
  std::string id;     // the anchor, e.g. "memory"
  std::string title;  // e.g. "Memory per GPU of every strategy"
  std::string html;   // figures, paragraphs and tables, already escaped (html_* below)
};

struct ReportPage {
  std::string title;                     // <title> and <h1>
  std::vector<std::string> summary;      // plain-text lines under the title
  std::vector<std::string> assumptions;  // plain text, listed in their own section
  std::vector<ReportSection> sections;   // in page order
  std::string generator;                 // e.g. "ftplan 0.1"
};

// The whole document: <!DOCTYPE html>, every element closed (it parses as XML too), the CSP meta.
std::string report_page_html(const ReportPage& page);

// Pieces of a section; text is escaped here.
std::string html_paragraph(const std::string& text);
std::string html_figure(const std::string& svg_element, const std::string& caption);
// Cells are plain text; a column whose cells all read as numbers (or "-") is right-aligned.
std::string html_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);

// (a) Memory: one stacked bar per layout the plan weighed (its best candidate, or its smallest when
// none fits), the terms of memory_model.h's MemoryBreakdown in GiB (2^30 bytes) summing to the device
// figure fits is judged on, against a line at the GPU's usable memory. The axis stops at 3x the
// usable memory rounded up by nice_ceiling: a taller bar is clipped there, its total printed.
svg::StackedBarChart memory_breakdown_chart(const PlanResult& plan, const HardwareSpec& hw,
                                            const TrainingSetup& setup);
ReportSection memory_section(const PlanResult& plan, const HardwareSpec& hw, const TrainingSetup& setup);

// (b) The frontier: every sweep row as a point, job time (h) vs cost (USD) on log axes (per million
// tokens when the job has no dataset), coloured by GPU type; sweep_frontier's rows highlighted,
// joined and labelled. `emphasized`: the row index to ring (the job's own plan), or rows.size().
svg::ScatterChart frontier_chart(const std::vector<SweepRow>& rows, size_t emphasized);
// The chart as a standalone SVG file (ftplan sweep --format svg).
std::string frontier_svg(const std::vector<SweepRow>& rows);
// The chart, the frontier's rows as a table, and each swept GPU's price with its date and source.
ReportSection frontier_section(const std::vector<SweepRow>& rows, const std::vector<HardwareSpec>& gpus,
                               const std::vector<int64_t>& counts, const TrainingSetup& setup,
                               const PlanResult& plan);

// The recommendation and why (plan_search.h's explanation).
ReportSection plan_section(const PlanResult& plan, const TrainingSetup& setup);

// What produced the numbers: the GPU (nvidia-smi memory, usable after headroom, peak), the memory
// metric the bars show, the framework, precision and the rest of memory_assumptions, the step-time
// assumptions, and the price with its date and source.
std::vector<std::string> report_assumptions(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup);

// The page without the simulated step: title, summary, assumptions and the plan, memory and
// frontier sections (the simulator's section is appended by the caller: simulator/step_report.h).
ReportPage job_report_page(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup,
                           const PlanResult& plan, const std::vector<SweepRow>& rows,
                           const std::vector<HardwareSpec>& gpus, const std::vector<int64_t>& counts);

}  // namespace ftplan

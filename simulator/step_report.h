// The simulated step in `ftplan report`: the schedule of one optimizer step as a timeline (one lane
// per simulated rank and stream: compute, communication, host copies, host CPU) and every rank's
// memory in use over the step against the GPU's usable memory. The charts read what
// chrome_trace.h writes (ops with their start and duration, memory samples), drawn by
// planner/report_svg.h.
#pragma once

#include <cstdint>
#include <vector>

#include "planner/report.h"
#include "planner/step_time.h"
#include "simulator/simulate.h"

namespace ftplan::sim {

// The ranks a chart shows: every rank up to `max_ranks`, else `max_ranks` of them spread evenly,
// the first and the last included (e.g. 80 stages, 8 shown: 0, 11, 23, 34, 45, 56, 68, 79).
std::vector<int> shown_ranks(int num_ranks, int max_ranks = 8);

// One lane per shown rank and stream that runs an op, in rank then stream order, labelled
// "rank 3 compute"; one category per op kind that occurs (forward, backward_input, ..., all_gather,
// send, copy_to_host, optimizer_step), in OpKind order. The x axis (s) ends at the last op's end.
svg::TimelineChart step_timeline_chart(const OpGraph& graph, const Schedule& schedule, const std::vector<int>& ranks);

// One step line per shown rank, memory in use (GiB = 2^30 bytes) from its samples, with a line at
// `usable_bytes` (0: none).
svg::StepLineChart step_memory_chart(const OpGraph& graph, const Schedule& schedule, const std::vector<int>& ranks,
                                     int64_t usable_bytes);

// The report's section: simulates `candidate` of the job `context` was prepared for (simulate_step,
// its cost guard included) and shows the timeline, the memory curve and each rank's totals beside
// the closed form. A step the simulator refuses becomes a section that says why.
ReportSection step_section(const PlanContext& context, const Candidate& candidate);

}  // namespace ftplan::sim

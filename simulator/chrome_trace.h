// A scheduled step as a Chrome trace event file (opens in Perfetto and chrome://tracing):
// pid = rank, tid = stream; one "X" event per op (ts/dur in µs), "M" events naming each process
// ("rank 3") and thread ("compute", "comm", "host_copy", "cpu", "mp_comm"), and a "C" counter track
// "memory" per rank (GiB = 2^30 bytes) sampled whenever the memory changes.
// Format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "planner/parallelism.h"
#include "simulator/op_graph.h"
#include "simulator/scheduler.h"

namespace ftplan::sim {

nlohmann::json chrome_trace_json(const OpGraph& g, const Schedule& schedule);

// Every rank of the job's layout when it has at most `max_ranks` GPUs: rank r (numbered tp fastest,
// then cp, dp_shard, dp_replicate, pp: planner/parallelism.h) shows the timeline of its class (its
// pipeline stage; the one representative rank otherwise), named with its coordinates, e.g.
// "rank 5 (tp 1, cp 0, dp_shard 0, dp_replicate 1, pp 0)". Larger jobs: each class once, as above.
nlohmann::json chrome_trace_json(const OpGraph& g, const Schedule& schedule, const Parallelism& layout,
                                 int max_ranks = 64);

// Writes chrome_trace_json to path atomically (temporary file, then rename).
void chrome_trace_write(const std::string& path, const OpGraph& g, const Schedule& schedule);

}  // namespace ftplan::sim

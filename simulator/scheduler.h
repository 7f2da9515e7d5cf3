// The event-driven list scheduler: plays an op graph and yields every rank's timeline.
//
// An op starts when all its predecessors have ended and its resource (rank × stream) is free; among
// the ops ready on a free resource the one created first goes (stable priority). Memory: an
// allocation appears when its alloc_op starts and goes when its free_op ends; at one instant the
// frees are applied before the allocations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "simulator/op_graph.h"

namespace ftplan::sim {

struct OpTiming {
  double start_s = 0.0;
  double end_s = 0.0;
};

struct MemorySample {
  double time_s = 0.0;
  int64_t bytes = 0;  // in use after the frees and allocations at time_s
};

struct RankTimeline {
  int rank = 0;
  double finish_s = 0.0;          // when this rank's last op ends
  double compute_busy_s = 0.0;    // time the compute stream runs an op
  double exposed_comm_s = 0.0;    // compute stream idle while a collective, send or host copy runs
  double exposed_host_s = 0.0;    // compute stream idle while only the host CPU works (offload)
  double idle_s = 0.0;            // nothing runs on this rank (within the step)
  double bubble_fraction = 0.0;   // pipelines: 1 - forward/backward busy / time to the last backward
  int64_t peak_memory_bytes = 0;
  double peak_time_s = 0.0;       // first instant the peak is reached
  std::vector<std::size_t> alive_at_peak;  // indices into OpGraph::allocations, largest first
  std::vector<MemorySample> memory;        // one sample per instant the memory changes
};

struct Schedule {
  double step_time_s = 0.0;        // the last op's end over all ranks
  std::vector<OpTiming> ops;       // by OpId
  std::vector<RankTimeline> ranks; // by rank; compute_busy + exposed_comm + exposed_host + idle =
                                   // step_time_s
};

// Throws std::logic_error if the graph has a cycle.
Schedule schedule_run(const OpGraph& g);

}  // namespace ftplan::sim

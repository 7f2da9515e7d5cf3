// A node's GPU interconnect as a Boost.Graph, and the bandwidth a ring collective gets over it.
// The ring visits GPUs in index order (NCCL's rings on these boxes do the same); each hop is routed
// along a shortest path, and a link carrying k hops in one direction gives each 1/k of its bandwidth.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/hardware_spec.h"

namespace ftplan {

struct RingBandwidth {
  double bytes_per_s = 0;   // per GPU, per direction: the slowest link's share
  std::string bottleneck;   // e.g. "cpu0-cpu1 (upi, 1.2e10 B/s) carries 1 ring hop(s) each way"
};

// The ring over the first `num_gpus` GPUs of the node (2 <= num_gpus <= GPUs in the topology).
RingBandwidth ring_bandwidth(const Topology& topology, int64_t num_gpus);

// Several rings at once, each over its GPUs (by index), as the process groups of one parallel
// dimension run their collectives together: each link's bandwidth is shared by every hop of every
// ring that crosses it; the result is the slowest hop's share.
RingBandwidth concurrent_ring_bandwidth(const Topology& topology, const std::vector<std::vector<int64_t>>& rings);

// The bottleneck bandwidth of the path between two GPUs (by index among the GPU vertices).
double path_bandwidth(const Topology& topology, int64_t gpu_a, int64_t gpu_b);

}  // namespace ftplan

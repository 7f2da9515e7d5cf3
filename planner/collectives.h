// Collective communication cost: one α-β formula for every collective (after Calculon and
// Thakur et al. 2005): time = latency + scale · M · (1 + offset/N) / (bandwidth · efficiency).
//   ring all-reduce:            scale 2, offset -1  ->  2(N-1)/N · M / B
//   reduce-scatter, all-gather: scale 1, offset -1  ->   (N-1)/N · M / B
//   broadcast (pipelined ring), point-to-point: scale 1, offset 0 -> M / B
//   all-to-all (expert parallelism's dispatch and combine; NCCL's grouped send/recv pairs): scale 1,
//       offset -1 -> (N-1)/N · M / B, each rank sending M/N to every other rank at once; α paid N-1 times.
//       Across nodes the on-node and off-node parts move over their own links at once: the slower wins.
// M is the full buffer (e.g. all gradients), B the per-GPU per-direction bandwidth of the ring.
#pragma once

#include <cstdint>
#include <string>

#include "planner/hardware_spec.h"

namespace ftplan {

enum class Collective { all_reduce, reduce_scatter, all_gather, broadcast, send_recv, all_to_all };
std::string to_string(Collective c);

struct CollectiveFormula {
  double scale;          // bytes-on-the-wire multiplier
  double offset;         // the 1 + offset/N term
  double latency_steps;  // α is paid latency_steps · (N-1) times (ring steps); 1 for send/recv
};
CollectiveFormula collective_formula(Collective c);

// Bytes each GPU sends for one collective of an M-byte buffer over N GPUs.
double wire_bytes(Collective c, double bytes, int64_t num_gpus);

// The α-β time of one collective over N GPUs on one level of the network.
double collective_time_s(Collective c, double bytes, int64_t num_gpus, double bandwidth_bytes_per_s,
                         double latency_s, double efficiency = 1.0);

// The network a job of N GPUs sees: a ring inside each node (bandwidth from the topology graph),
// and the inter-node network between nodes.
struct Interconnect {
  int64_t num_gpus = 1;
  int64_t gpus_per_node = 1;        // GPUs of the job in one node
  int64_t nodes = 1;
  double intra_bandwidth_bytes_per_s = 0;
  double inter_bandwidth_bytes_per_s = 0;
  double p2p_bandwidth_bytes_per_s = 0;  // between neighbouring pipeline stages
  double host_bandwidth_bytes_per_s = 0; // PCIe host<->device
  double latency_s = 0;
  std::string intra_bottleneck;     // why the ring is as fast as it is
};
Interconnect interconnect_for(const HardwareSpec& hw, int64_t num_gpus);

// The network one process group sees: `size` ranks `stride` apart, ranks numbered node by node
// (gpus_per_node each). Members on one node talk over the node's topology, with every group of the
// same dimension on that node running its ring at the same time (concurrent_ring_bandwidth); the
// nodes a group spans talk over the inter-node network, each member on its own NIC share.
// `job_gpus`: the job's GPUs (the groups beside this one). group_interconnect(hw, N, 1, N) is
// interconnect_for(hw, N).
Interconnect group_interconnect(const HardwareSpec& hw, int64_t size, int64_t stride, int64_t job_gpus);

// Hierarchical across nodes: all-reduce = intra reduce-scatter, inter all-reduce of M/g, intra
// all-gather; reduce-scatter and all-gather likewise in two levels. Inside one node: the ring.
double collective_time_s(const Interconnect& net, Collective c, double bytes);

}  // namespace ftplan

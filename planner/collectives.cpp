#include "planner/collectives.h"

#include <algorithm>
#include <cmath>

#include "planner/topology.h"

namespace ftplan {

std::string to_string(Collective c) {
  switch (c) {
    case Collective::all_reduce: return "all_reduce";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::all_gather: return "all_gather";
    case Collective::broadcast: return "broadcast";
    case Collective::send_recv: return "send_recv";
    case Collective::all_to_all: return "all_to_all";
  }
  return "?";
}

CollectiveFormula collective_formula(Collective c) {
  switch (c) {
    case Collective::all_reduce: return {2.0, -1.0, 2.0};
    case Collective::reduce_scatter: return {1.0, -1.0, 1.0};
    case Collective::all_gather: return {1.0, -1.0, 1.0};
    case Collective::broadcast: return {1.0, 0.0, 1.0};
    case Collective::send_recv: return {1.0, 0.0, 0.0};
    case Collective::all_to_all: return {1.0, -1.0, 1.0};
  }
  return {0, 0, 0};
}

double wire_bytes(Collective c, double bytes, int64_t n) {
  if (c != Collective::send_recv && n <= 1) return 0.0;
  const CollectiveFormula f = collective_formula(c);
  return f.scale * bytes * (1.0 + f.offset / static_cast<double>(std::max<int64_t>(n, 1)));
}

double collective_time_s(Collective c, double bytes, int64_t n, double bandwidth, double latency_s,
                         double efficiency) {
  if (bytes <= 0 || (c != Collective::send_recv && n <= 1)) return 0.0;
  const CollectiveFormula f = collective_formula(c);
  const double steps = c == Collective::send_recv ? 1.0 : f.latency_steps * static_cast<double>(n - 1);
  return latency_s * steps + wire_bytes(c, bytes, n) / (bandwidth * efficiency);
}

Interconnect interconnect_for(const HardwareSpec& hw, int64_t num_gpus) { return group_interconnect(hw, num_gpus, 1, num_gpus); }

Interconnect group_interconnect(const HardwareSpec& hw, int64_t size, int64_t stride, int64_t job_gpus) {
  Interconnect net;
  const int64_t g = std::max<int64_t>(1, hw.gpus_per_node);
  size = std::max<int64_t>(1, size);
  stride = std::max<int64_t>(1, stride);
  net.num_gpus = size;
  // Members of one group on one node: consecutive ranks `stride` apart while they stay on the node.
  const int64_t per_node = stride >= g ? 1 : std::max<int64_t>(1, std::min(size, g / stride));
  net.gpus_per_node = per_node;
  net.nodes = (size + per_node - 1) / per_node;
  net.inter_bandwidth_bytes_per_s = hw.inter_node_bandwidth_bytes_per_s;
  net.host_bandwidth_bytes_per_s = hw.pcie_host_bandwidth_bytes_per_s;
  net.latency_s = hw.comm_latency_s;
  if (per_node >= 2) {
    // Every group of this dimension on the first node runs its ring at once: group (block, offset)
    // holds GPUs block + offset + i·stride; a stride-1 group is alone on its node.
    const int64_t used = std::max<int64_t>(per_node * stride, std::min(std::max<int64_t>(job_gpus, 1), g));
    std::vector<std::vector<int64_t>> rings;
    for (int64_t block = 0; block + per_node * stride <= used; block += per_node * stride) {
      for (int64_t offset = 0; offset < stride; ++offset) {
        std::vector<int64_t> ring;
        for (int64_t i = 0; i < per_node; ++i) ring.push_back(block + offset + i * stride);
        rings.push_back(ring);
      }
      if (stride == 1) break;
    }
    RingBandwidth ring = concurrent_ring_bandwidth(hw.topology, rings);
    net.intra_bandwidth_bytes_per_s = ring.bytes_per_s;
    net.intra_bottleneck = ring.bottleneck;
    // Neighbouring stages: the slowest neighbour pair (member k and k+1 in index order).
    double p2p = path_bandwidth(hw.topology, 0, stride);
    for (int64_t k = 1; k + 1 < per_node; ++k) p2p = std::min(p2p, path_bandwidth(hw.topology, k * stride, (k + 1) * stride));
    net.p2p_bandwidth_bytes_per_s = net.nodes > 1 ? std::min(p2p, net.inter_bandwidth_bytes_per_s) : p2p;
  } else {
    net.intra_bandwidth_bytes_per_s = hw.intra_node_bandwidth_bytes_per_s;
    // One member per node: neighbours are on other nodes.
    net.p2p_bandwidth_bytes_per_s = net.nodes > 1 ? net.inter_bandwidth_bytes_per_s : hw.intra_node_bandwidth_bytes_per_s;
  }
  return net;
}

double collective_time_s(const Interconnect& net, Collective c, double bytes) {
  const double a = net.latency_s;
  const int64_t g = net.gpus_per_node;
  if (c == Collective::send_recv)
    return collective_time_s(c, bytes, 2, net.p2p_bandwidth_bytes_per_s, a);
  if (net.nodes <= 1) return collective_time_s(c, bytes, g, net.intra_bandwidth_bytes_per_s, a);
  const double intra = net.intra_bandwidth_bytes_per_s, inter = net.inter_bandwidth_bytes_per_s;
  switch (c) {
    case Collective::all_reduce:
      return collective_time_s(Collective::reduce_scatter, bytes, g, intra, a) +
             collective_time_s(Collective::all_reduce, bytes / g, net.nodes, inter, a) +
             collective_time_s(Collective::all_gather, bytes, g, intra, a);
    case Collective::reduce_scatter:
    case Collective::all_gather:
      return collective_time_s(c, bytes, g, intra, a) + collective_time_s(c, bytes / g, net.nodes, inter, a);
    case Collective::broadcast:
      return collective_time_s(c, bytes, net.num_gpus, std::min(intra, inter), a);
    case Collective::all_to_all: {
      // (g-1)/N of the buffer to the other ranks on the node over its links, (N-g)/N to the other nodes'
      // ranks over the NICs, at once.
      const double N = double(net.num_gpus);
      const double on_node = bytes * (g - 1) / N / intra, off_node = bytes * (N - g) / N / inter;
      return a * (N - 1) + std::max(on_node, off_node);
    }
    default: return 0.0;
  }
}

}  // namespace ftplan

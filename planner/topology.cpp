#include "planner/topology.h"

#include <algorithm>
#include <limits>
#include <map>
#include <sstream>
#include <vector>

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/breadth_first_search.hpp>

#include "planner/errors.h"

namespace ftplan {
namespace {

using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::undirectedS, boost::no_property,
                                    boost::property<boost::edge_index_t, size_t>>;

struct BuiltGraph {
  Graph graph;
  std::vector<size_t> gpu_vertices;  // vertex index of gpu k
};

BuiltGraph build(const Topology& t) {
  BuiltGraph b;
  b.graph = Graph(t.vertices.size());
  std::map<std::string, size_t> index;
  for (size_t v = 0; v < t.vertices.size(); ++v) {
    index[t.vertices[v].id] = v;
    if (t.vertices[v].kind == "gpu") b.gpu_vertices.push_back(v);
  }
  for (size_t e = 0; e < t.links.size(); ++e) {
    auto a = index.find(t.links[e].a), c = index.find(t.links[e].b);
    if (a == index.end() || c == index.end()) fail_input("topology: link " + t.links[e].a + "-" + t.links[e].b + " names a missing vertex");
    boost::add_edge(a->second, c->second, e, b.graph);
  }
  return b;
}

// The links (by index) and their direction (+1 a->b, -1 b->a) on a fewest-hops path from s to d.
std::vector<std::pair<size_t, int>> route(const BuiltGraph& b, const Topology& t, size_t s, size_t d) {
  const size_t n = boost::num_vertices(b.graph);
  std::vector<size_t> pred(n, std::numeric_limits<size_t>::max());
  std::vector<size_t> pred_edge(n, 0);
  pred[s] = s;
  struct Recorder : boost::default_bfs_visitor {
    std::vector<size_t>* pred;
    std::vector<size_t>* pred_edge;
    void tree_edge(Graph::edge_descriptor e, const Graph& g) {
      size_t u = boost::source(e, g), v = boost::target(e, g);
      (*pred)[v] = u;
      (*pred_edge)[v] = boost::get(boost::edge_index, g, e);
    }
  } recorder;
  recorder.pred = &pred;
  recorder.pred_edge = &pred_edge;
  boost::breadth_first_search(b.graph, s, boost::visitor(recorder));
  if (pred[d] == std::numeric_limits<size_t>::max()) fail_input("topology: GPUs are not connected");
  std::vector<std::pair<size_t, int>> path;
  std::map<std::string, size_t> index;
  for (size_t v = 0; v < t.vertices.size(); ++v) index[t.vertices[v].id] = v;
  for (size_t v = d; v != s; v = pred[v]) {
    size_t e = pred_edge[v];
    path.push_back({e, index.at(t.links[e].b) == v ? +1 : -1});
  }
  return path;
}

}  // namespace

RingBandwidth ring_bandwidth(const Topology& t, int64_t num_gpus) {
  const int64_t gpus = static_cast<int64_t>(std::count_if(t.vertices.begin(), t.vertices.end(),
                                                          [](const TopologyVertex& v) { return v.kind == "gpu"; }));
  std::vector<int64_t> ring;
  for (int64_t k = 0; k < std::min(num_gpus, gpus); ++k) ring.push_back(k);
  return concurrent_ring_bandwidth(t, {ring});
}

RingBandwidth concurrent_ring_bandwidth(const Topology& t, const std::vector<std::vector<int64_t>>& rings) {
  const BuiltGraph b = build(t);
  RingBandwidth r;
  r.bytes_per_s = std::numeric_limits<double>::infinity();
  std::map<std::pair<size_t, int>, int> load;  // (link, direction) -> ring hops
  bool any = false;
  for (const auto& ring : rings) {
    const int64_t n = static_cast<int64_t>(ring.size());
    if (n < 2) continue;
    any = true;
    for (int64_t k = 0; k < n; ++k)
      for (const auto& hop : route(b, t, b.gpu_vertices.at(ring[k]), b.gpu_vertices.at(ring[(k + 1) % n]))) ++load[hop];
  }
  if (!any) {
    r.bottleneck = "one GPU: no communication";
    return r;
  }
  for (const auto& [hop, hops] : load) {
    const TopologyLink& link = t.links[hop.first];
    double share = link.bandwidth_bytes_per_s / hops;
    if (share < r.bytes_per_s) {
      r.bytes_per_s = share;
      std::ostringstream s;
      s << link.a << "-" << link.b << " (" << link.kind << ", " << link.bandwidth_bytes_per_s / 1e9
        << " GB/s) carries " << hops << " ring hop(s) each way";
      r.bottleneck = s.str();
    }
  }
  return r;
}

double path_bandwidth(const Topology& t, int64_t a, int64_t c) {
  const BuiltGraph b = build(t);
  if (a == c) return std::numeric_limits<double>::infinity();
  double bw = std::numeric_limits<double>::infinity();
  for (const auto& hop : route(b, t, b.gpu_vertices.at(a), b.gpu_vertices.at(c)))
    bw = std::min(bw, t.links[hop.first].bandwidth_bytes_per_s);
  return bw;
}

}  // namespace ftplan

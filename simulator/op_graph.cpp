#include "simulator/op_graph.h"

#include <algorithm>
#include <stdexcept>

namespace ftplan::sim {

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::forward: return "forward";
    case OpKind::backward_input: return "backward_input";
    case OpKind::backward_weight: return "backward_weight";
    case OpKind::recompute: return "recompute";
    case OpKind::all_reduce: return "all_reduce";
    case OpKind::reduce_scatter: return "reduce_scatter";
    case OpKind::all_gather: return "all_gather";
    case OpKind::send: return "send";
    case OpKind::copy_to_host: return "copy_to_host";
    case OpKind::copy_to_device: return "copy_to_device";
    case OpKind::optimizer_step: return "optimizer_step";
    case OpKind::all_to_all: return "all_to_all";
  }
  return "?";
}

const char* stream_name(Stream stream) {
  switch (stream) {
    case Stream::compute: return "compute";
    case Stream::comm: return "comm";
    case Stream::host_copy: return "host_copy";
    case Stream::cpu: return "cpu";
    case Stream::mp_comm: return "mp_comm";
    case Stream::expert_comm: return "expert_comm";
  }
  return "?";
}

bool op_kind_is_communication(OpKind kind) {
  return kind == OpKind::all_reduce || kind == OpKind::reduce_scatter ||
         kind == OpKind::all_gather || kind == OpKind::send || kind == OpKind::all_to_all;
}

OpId graph_add_op(OpGraph& g, Op op) {
  if (op.rank < 0 || op.rank >= g.num_ranks)
    throw std::logic_error("graph_add_op: rank " + std::to_string(op.rank) + " outside 0.." +
                           std::to_string(g.num_ranks - 1) + " (" + op.label + ")");
  return boost::add_vertex(std::move(op), *g.graph);
}

void graph_add_edge(OpGraph& g, OpId before, OpId after) {
  if (before == kNoOp || after == kNoOp) return;
  boost::add_edge(before, after, *g.graph);
}

std::size_t graph_add_allocation(OpGraph& g, Allocation a) {
  if (a.alloc_op != kNoOp) (*g.graph)[a.alloc_op].allocated_bytes += a.bytes;
  if (a.free_op != kNoOp) (*g.graph)[a.free_op].freed_bytes += a.bytes;
  g.allocations.push_back(std::move(a));
  return g.allocations.size() - 1;
}

std::size_t graph_op_count(const OpGraph& g) { return boost::num_vertices(*g.graph); }

const Op& graph_op(const OpGraph& g, OpId id) { return (*g.graph)[id]; }

double graph_total_duration_s(const OpGraph& g) {
  double total = 0.0;
  for (OpId v = 0; v < graph_op_count(g); ++v) total += (*g.graph)[v].duration_s;
  return total;
}

std::vector<std::size_t> graph_in_degrees(const OpGraph& g) {
  std::vector<std::size_t> degrees(graph_op_count(g), 0);
  for (OpId v = 0; v < degrees.size(); ++v)
    for (auto [e, end] = boost::out_edges(v, *g.graph); e != end; ++e) ++degrees[boost::target(*e, *g.graph)];
  return degrees;
}

double graph_critical_path_s(const OpGraph& g) {
  const std::size_t n = graph_op_count(g);
  std::vector<std::size_t> pending = graph_in_degrees(g);
  std::vector<double> finish(n, 0.0), ready(n, 0.0);
  std::vector<OpId> queue;
  for (OpId v = 0; v < n; ++v) {
    if (pending[v] == 0) queue.push_back(v);
  }
  double longest = 0.0;
  std::size_t done = 0;
  while (!queue.empty()) {
    const OpId v = queue.back();
    queue.pop_back();
    ++done;
    finish[v] = ready[v] + (*g.graph)[v].duration_s;
    longest = std::max(longest, finish[v]);
    for (auto [e, end] = boost::out_edges(v, *g.graph); e != end; ++e) {
      const OpId w = boost::target(*e, *g.graph);
      ready[w] = std::max(ready[w], finish[v]);
      if (--pending[w] == 0) queue.push_back(w);
    }
  }
  if (done != n) throw std::logic_error("graph_critical_path_s: the op graph has a cycle");
  return longest;
}

void graph_serialize_per_rank(OpGraph& g) {
  std::vector<OpId> last(g.num_ranks, kNoOp);
  for (OpId v = 0; v < graph_op_count(g); ++v) {
    const int rank = (*g.graph)[v].rank;
    graph_add_edge(g, last[rank], v);
    last[rank] = v;
  }
}

}  // namespace ftplan::sim

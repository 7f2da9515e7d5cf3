// The op graph of one training step: one vertex per operation (a layer's forward for one
// micro-batch, a bucket's all-reduce, a host copy, ...), edges for data and ordering dependencies.
// Every op runs on one resource, (rank, stream), for duration_s. Memory is a list of allocations,
// each appearing when one op starts and disappearing when another ends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <boost/graph/adjacency_list.hpp>

namespace ftplan::sim {

enum class OpKind {
  forward,          // a unit's forward for one micro-batch
  backward_input,   // gradient w.r.t. the unit's input
  backward_weight,  // gradient w.r.t. the unit's trainable weights
  recompute,        // full checkpointing: the forward again, just before the backward
  all_reduce,       // DDP bucket; FSDP hybrid across replicas
  reduce_scatter,   // ZeRO/FSDP gradients
  all_gather,       // ZeRO-3/FSDP parameters before use; ZeRO-1/2 parameters after the step
  send,             // pipeline/mp activation or gradient to the neighbouring stage
  copy_to_host,     // offload: gradient shard down
  copy_to_device,   // offload: updated parameter shard up
  optimizer_step,   // on the GPU, or on the host CPU under offload
  all_to_all,       // expert parallelism: a MoE block's token dispatch and combine (forward, or their gradients)
};
constexpr int kOpKindCount = 12;

// comm: data-parallel and pipeline communication; mp_comm: the tensor- and context-parallel
// collectives, which run on their own process groups' NCCL streams beside the data-parallel ones;
// expert_comm: expert parallelism's all-to-alls, on their own process group (the ep mesh's NCCL
// communicator and stream). Links are not modelled as shared between streams.
enum class Stream { compute, comm, host_copy, cpu, mp_comm, expert_comm };
constexpr int kStreamCount = 6;

const char* op_kind_name(OpKind kind);  // "forward", "all_reduce", ...
const char* stream_name(Stream stream);  // "compute", "comm", "host_copy", "cpu", "mp_comm", "expert_comm"
bool op_kind_is_communication(OpKind kind);  // all_reduce, reduce_scatter, all_gather, send, all_to_all

struct Op {
  OpKind kind = OpKind::forward;
  int rank = 0;                    // GPU index, e.g. 3
  Stream stream = Stream::compute;
  double duration_s = 0.0;         // e.g. 0.0125
  int layer = -1;                  // index into StepInputs::layers; -1 for step-wide ops
  int micro_batch = -1;            // -1 for step-wide ops
  int64_t bytes = 0;               // bytes moved (communication and copies), e.g. 26214400
  int64_t allocated_bytes = 0;     // allocated when the op starts (its allocations, summed)
  int64_t freed_bytes = 0;         // freed when the op ends
  std::string label;               // e.g. "fwd block 12 mb0"
};

using OpId = std::size_t;
constexpr OpId kNoOp = std::numeric_limits<OpId>::max();

struct Allocation {
  std::string label;               // e.g. "saved activations block 12 mb0"
  int rank = 0;
  int64_t bytes = 0;
  OpId alloc_op = kNoOp;           // appears when this op starts; kNoOp: from the step's start
  OpId free_op = kNoOp;            // disappears when this op ends; kNoOp: to the step's end
};

// Vertex ids are creation order, which is also the scheduler's priority (lower first) among ops
// ready on the same resource; builders create ops in program order. Out-edges only (directedS):
// the scheduler counts in-degrees in one pass, which saves an in-edge vector per op.
using OpGraphStorage = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS, Op>;

struct OpGraph {
  // Held by pointer: Boost 1.74's adjacency_list has no move constructor and its swap() copies,
  // so a graph held by value would be copied op by op wherever an OpGraph is returned.
  std::unique_ptr<OpGraphStorage> graph = std::make_unique<OpGraphStorage>();
  std::vector<Allocation> allocations;
  int num_ranks = 1;               // ranks simulated; every op has rank < num_ranks
  int num_ranks_represented = 1;   // GPUs they stand for, e.g. 64 for FSDP simulated on rank 0
};

OpId graph_add_op(OpGraph& g, Op op);
void graph_add_edge(OpGraph& g, OpId before, OpId after);  // `after` starts once `before` ended
std::size_t graph_add_allocation(OpGraph& g, Allocation a);  // updates the ops' byte totals
std::size_t graph_op_count(const OpGraph& g);
const Op& graph_op(const OpGraph& g, OpId id);

// Sum of every op's duration (the step time if nothing overlapped on one rank).
double graph_total_duration_s(const OpGraph& g);
// Longest path through the dependencies, ignoring resources (a lower bound on the step time).
// Throws std::logic_error on a cycle.
double graph_critical_path_s(const OpGraph& g);
// Adds an edge from each op to the next one created on the same rank: every op waits for the
// previous one (the no-overlap reference). Requires creation order to respect the dependencies.
void graph_serialize_per_rank(OpGraph& g);
// Number of dependencies of each op (in-edges), by OpId.
std::vector<std::size_t> graph_in_degrees(const OpGraph& g);

}  // namespace ftplan::sim

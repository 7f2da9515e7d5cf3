// The device mesh of a parallel layout (planner/parallelism.h): this rank's coordinates and one
// communicator per dimension, after torchtitan's ParallelDims.build_mesh
// (torchtitan/distributed/parallel_dims.py) and Megatron-LM's parallel_state.initialize_model_parallel
// (megatron/core/parallel_state.py): ranks are numbered tp fastest, then cp, dp_shard, dp_replicate,
// pp (ftplan::tp_group ... pp_group give each group as size and stride), so a TP group is
// consecutive ranks, on one node wherever the node holds tp GPUs.
//
// Communicators (each its own c10d process group: Comm::split, Gloo on CPU, NCCL on CUDA, built by
// every rank in the same order: tp, cp, dp, pp):
//   tp   the tensor-parallel group: activations all-reduced (or reduce-scattered and all-gathered
//        under sequence parallelism) inside every block
//   cp   the context-parallel group: each holds a chunk of every sequence, K and V exchanged in
//        every attention (executor/context_parallel.h)
//   dp   the ranks holding the same model shard: dp_replicate x dp_shard x cp (the planner's
//        grad_group; torchtitan's dp_cp: the parameters are replicated over cp and their gradients
//        reduced with data parallelism's); ZeRO/FSDP shard over its first dp_shard x cp ranks
//        (torchtitan's dp_shard_cp) and HSDP replicates across them (strategies/sharded.cpp's rank
//        groups inside this communicator). coordinate("dp") is the data-parallel coordinate alone
//        (which micro-batches a rank reads: the cp ranks of one dp coordinate read the same ones).
//   pp   the pipeline stages holding the same tp shard and data
// Every communicator counts its own bytes: measured.json's comm_bytes_per_group.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "executor/comm.h"
#include "planner/parallelism.h"

namespace ftexec {

class DeviceMesh {
 public:
  // Collective over `world` (every rank calls it together). world.world() must equal layout.gpus().
  DeviceMesh(Comm& world, const ftplan::Parallelism& layout);

  const ftplan::Parallelism& layout() const { return layout_; }
  Comm& world() { return world_; }
  Comm& tp() { return *tp_; }
  Comm& cp() { return *cp_; }
  Comm& dp() { return *dp_; }
  Comm& pp() { return *pp_; }

  // This rank's coordinate along a dimension ("tp", "cp", "dp_shard", "dp_replicate", "dp", "pp").
  int64_t coordinate(const std::string& dim) const;
  // The global ranks of this rank's group along a dimension, in ring order.
  RankGroup group(const std::string& dim) const;

  // Bytes by dimension: {"tp", stats}, {"cp", stats} (cp > 1), {"dp", stats}, {"pp", stats} (and
  // "world": control traffic).
  std::vector<std::pair<std::string, CommStats>> stats() const;
  void reset_stats();

 private:
  Comm& world_;
  ftplan::Parallelism layout_;
  std::unique_ptr<Comm> tp_, cp_, dp_, pp_;
};

// The global ranks of `rank`'s group of size x stride placement.
RankGroup mesh_group(int64_t rank, const ftplan::GroupPlacement& g);

}  // namespace ftexec

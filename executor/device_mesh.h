// The device mesh of a parallel layout (planner/parallelism.h): this rank's coordinates and one
// communicator per dimension, after torchtitan's ParallelDims.build_mesh
// (torchtitan/distributed/parallel_dims.py) and Megatron-LM's parallel_state.initialize_model_parallel
// (megatron/core/parallel_state.py): ranks are numbered tp fastest, then cp, dp_shard, dp_replicate,
// pp (ftplan::tp_group ... pp_group give each group as size and stride), so a TP group is
// consecutive ranks, on one node wherever the node holds tp GPUs.
//
// Communicators (each its own c10d process group: Comm::split, Gloo on CPU, NCCL on CUDA, built by
// every rank in the same order: tp, dp, pp):
//   tp   the tensor-parallel group: activations all-reduced (or reduce-scattered and all-gathered
//        under sequence parallelism) inside every block
//   dp   the data-parallel ranks holding the same model shard: dp_replicate x dp_shard (the
//        planner's grad_group); ZeRO/FSDP shard over its first dp_shard ranks and HSDP replicates
//        across them (strategies/sharded.cpp's rank groups inside this communicator)
//   pp   the pipeline stages holding the same tp shard and data
// cp has its coordinates and groups here but no communicator: ftexec runs no context parallelism
// (refused by exec_layout_problems).
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
  Comm& dp() { return *dp_; }
  Comm& pp() { return *pp_; }

  // This rank's coordinate along a dimension ("tp", "cp", "dp_shard", "dp_replicate", "dp", "pp").
  int64_t coordinate(const std::string& dim) const;
  // The global ranks of this rank's group along a dimension, in ring order.
  RankGroup group(const std::string& dim) const;

  // Bytes by dimension: {"tp", stats}, {"dp", stats}, {"pp", stats} (and "world": control traffic).
  std::vector<std::pair<std::string, CommStats>> stats() const;
  void reset_stats();

 private:
  Comm& world_;
  ftplan::Parallelism layout_;
  std::unique_ptr<Comm> tp_, dp_, pp_;
};

// The global ranks of `rank`'s group of size x stride placement.
RankGroup mesh_group(int64_t rank, const ftplan::GroupPlacement& g);

}  // namespace ftexec

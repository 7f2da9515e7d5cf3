// The strategies ftexec runs, one class per concept (executor/strategies/), chosen from the
// parallelism description (planner/parallelism.h), never from a preset's name:
//   data_parallel.cpp  every rank holds all parameters: one process (all degrees 1), replicas
//                      (dp_replicate > 1: DDP), ZeRO stage 1 or 2 over dp_shard (+ offload_optimizer)
//   sharded.cpp        stage 3 (ZeRO-3 or FSDP; reshard_after_forward; HSDP when dp_replicate > 1;
//                      offload_params): each unit's parameters sharded as flat buffers
//   pipeline.cpp       pp stages (schedule naive, gpipe or 1f1b)
//   common.cpp         the model's units, flat buffers, gradient clipping, the factory, and
//                      compositions (tp > 1, or pp with data parallelism): a device mesh
//                      (executor/device_mesh.h), the model split over tp (executor/tensor_parallel.h),
//                      and one of the classes above over the mesh's dp group (tp x DDP, tp x ZeRO,
//                      tp x FSDP/HSDP) or the pipeline over its pp group with replicated stages
//                      averaged over dp (tp alone, pp x dp, tp x pp, tp x pp x dp)
// The presets are points of that space (ftplan::preset): single, ddp, zero1/2/3, fsdp,
// fsdp_shard_grad_op, fsdp_hybrid, zero2_offload, zero3_offload, mp, pipeline, pipeline_1f1b.
// A "unit" is what ZeRO-3/FSDP gather at once and what the planner sums its collectives over
// (planner/step_time.h): the embedding, each decoder block, the head (final norm + lm_head).
//
// Data: a data-parallel strategy sees `grad_accum` micro-batches per rank per step, disjoint across
// ranks; a pipeline sees all of them. The global batch is the same either way, so a single-process
// run with grad_accum × data_parallel_size() micro-batches per step is the reference.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "executor/comm.h"
#include "executor/data.h"
#include "executor/llama_model.h"
#include "executor/trainer.h"
#include "planner/parallelism.h"
#include "planner/training_setup.h"

namespace ftexec {

struct StrategyOptions {
  ftplan::Parallelism parallel;                         // the layout; parallel.gpus() == the world size
  ftplan::Method method = ftplan::Method::full;
  ftplan::Precision precision = ftplan::Precision::fp32;
  AdamWOptions adamw;
  int64_t grad_accum = 1;                               // micro-batches per step on each data-parallel rank
  double max_grad_norm = 1.0;                           // 0: no clipping
  int64_t ddp_bucket_bytes = INT64_C(25) << 20;         // PyTorch DDP's bucket_cap_mb
  int64_t ddp_first_bucket_bytes = INT64_C(1) << 20;    // torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
  int64_t zero_bucket_elements = INT64_C(500000000);    // DeepSpeed's reduce_bucket_size
};

// Bytes this rank holds between steps, by kind.
struct StateBytes {
  int64_t weights = 0;    // parameters (replicas, shards or this stage's)
  int64_t gradients = 0;  // gradients kept between micro-batches (full, or the shard)
  int64_t optimizer = 0;  // AdamW moments (+ fp32 masters)
  int64_t buffers = 0;    // persistent communication buckets
  int64_t host = 0;       // offloaded to host memory: shards, fp32 gradients, AdamW states
};

class DistStrategy {
 public:
  virtual ~DistStrategy() = default;
  // Ranks that read disjoint slices of each global batch: the world size for data parallelism, 1
  // for pipelines.
  virtual int64_t data_parallel_size() const = 0;
  // Which slice of each global batch this rank reads (0 .. data_parallel_size()-1): its world rank
  // for data parallelism over the world, its dp coordinate on a device mesh.
  virtual int64_t data_parallel_rank(int world_rank) const { return data_parallel_size() > 1 ? world_rank : 0; }
  // Communication by process group ({"tp", ...}, {"dp", ...}, {"pp", ...}) when the strategy runs on a
  // device mesh (executor/device_mesh.h); empty when everything goes over the world communicator.
  virtual std::vector<std::pair<std::string, CommStats>> group_stats() const { return {}; }
  virtual void reset_group_stats() {}
  // One optimizer step over this rank's micro-batches; returns the mean loss of the global batch.
  virtual double step(const std::vector<TokenBatch>& micro_batches) = 0;
  virtual StateBytes state_bytes() const = 0;
  virtual double last_grad_norm() const { return grad_norm_; }

  // Checkpoints: the tensors this rank owns (live; loading copies into them). Replicated: every
  // rank holds the same, so rank 0 writes them and every rank reads rank 0's file.
  virtual std::vector<std::pair<std::string, at::Tensor>> checkpoint_tensors() = 0;
  virtual bool checkpoint_replicated() const { return false; }
  virtual int64_t optimizer_steps() const = 0;
  virtual void set_optimizer_steps(int64_t steps) = 0;
  virtual void after_load() {}  // e.g. gather the parameter shards again

  // Saving (--save): every rank calls this together once training is over. `emit` runs on rank 0
  // only, once per unit (forward order) that has trainable tensors, with those tensors whole under
  // their model names ("model.layers.0.self_attn.q_proj.lora_A.weight"): replicas read rank 0's
  // own; sharded units are all-gathered one at a time by rank 0's shard group and freed after emit
  // returns; a pipeline's units are sent to rank 0 by the stage that owns them. So at most one
  // unit is whole at a time beyond what the rank holds anyway.
  using SaveEmit = std::function<void(const std::vector<std::pair<std::string, at::Tensor>>&)>;
  virtual void gather_trainable(const SaveEmit& emit) = 0;

 protected:
  double grad_norm_ = 0;
};

// The strategy of options.parallel (the world is comm.world() == parallel.gpus()). InputError for a
// layout or model this executor does not run (naming the field: the checks of ftplan::exec_problems
// and exec_parallelism come first, so this is a second line of defence).
std::unique_ptr<DistStrategy> make_dist_strategy(LlamaModel& model, Comm& comm, const StrategyOptions& options);

}  // namespace ftexec

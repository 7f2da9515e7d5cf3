// Builds the op graph of one optimizer step from StepInputs, one function per strategy family.
//
// Conventions shared by every builder:
// - Each rank's compute stream runs its ops in program order (creation order), like a CUDA stream.
// - A unit's saved activations appear when its forward starts and go when its backward_weight ends;
//   under checkpointing the forward keeps checkpoint_bytes and the recompute brings back
//   saved_activation_bytes until backward_weight ends. The logits live from the head's forward
//   start to its backward_input end.
// - With overlap off every op on a rank waits for the previous one created (the closed-form sum).
// - Tensor- and context-parallel collectives run on the rank's mp_comm stream (their own process
//   groups' NCCL streams), beside the data-parallel and pipeline communication on comm.
#pragma once

#include <cstdint>
#include <vector>

#include "simulator/op_graph.h"
#include "simulator/step_inputs.h"

namespace ftplan::sim {

// Validates the inputs (InputError listing every problem), then calls the builder for the strategy.
OpGraph build_step_graph(const StepInputs& inputs);

// single, ddp, zero1, zero2, zero3, fsdp, fsdp_shard_grad_op, fsdp_hybrid, zero2_offload,
// zero3_offload: one representative rank (rank 0), collectives as single ops on its comm stream.
//   ddp: bucketed all-reduce (ddp_bucket_plan) launched as backward produces the gradients, on the
//     last micro-batch only (no_sync before it).
//   zero1: per-unit gradient reduce-scatter on the last micro-batch; zero2/zero3/fsdp*: on every
//     micro-batch, the unsharded gradient alive from backward_weight's start to the
//     reduce-scatter's end. zero1/zero2(_offload): after the optimizer, a per-unit all-gather of
//     the updated (trainable, grad_bytes) parameters.
//   zero3/fsdp/fsdp_hybrid/zero3_offload (FULL_SHARD): a per-unit all-gather before its forward
//     and again before its backward, issued fsdp_prefetch_depth units ahead (forward and backward
//     prefetch); the gathered copy is freed after the unit's forward (after its backward for the
//     last unit, which is not resharded after forward, as torchtitan does) and after its backward.
//   fsdp_shard_grad_op: gathered before forward only, kept until the unit's backward ends.
//   fsdp_hybrid: + an all-reduce across replicas (replica_all_reduce_s) after each reduce-scatter.
//   *_offload: each reduce-scattered gradient shard copied to the host, the optimizer on the host
//     CPU, then each updated parameter shard copied back.
// All collectives share one comm stream per rank (NCCL shares the links anyway), except expert
// parallelism's all-to-alls (layers with all_to_all_bytes): before each MoE block's forward its dispatch
// and combine (2 x all_to_all_s), before its backward their gradients (2, or 4 with the recompute), one op
// each on the expert_comm stream (the ep group's own communicator) that waits for the previous compute
// op; the block's compute waits for it unless all_to_all_overlap (no profiled framework overlaps them:
// torchtitan's ExpertParallel runs dispatch, experts and combine in order).
OpGraph build_data_parallel_graph(const StepInputs& inputs);

// Pipelines (pp > 1: naive mp, GPipe, 1F1B, interleaved 1F1B with virtual_stages chunks per stage):
// every stage is a rank (num_gpus stages, one per class of rank: the tp, cp and dp ranks of a stage
// do the same work); each virtual stage sends the activation (checkpoint_bytes of the next one's
// first unit) forward and its gradient back as one op on the sender's comm stream. mp runs
// micro-batches one after the other. With data parallelism (PP x DP) each stage synchronises its
// gradients after its last backward (StepInputs' PP x DP note).
OpGraph build_pipeline_graph(const StepInputs& inputs);

// DDP's buckets in the order they are reduced: filled from the last unit's gradients backwards,
// the first one capped at first_bucket_bytes, the rest at bucket_bytes; a unit's gradient may span
// buckets (PyTorch splits at parameter boundaries, so this is exact when units are many params).
struct DdpBucket {
  int64_t bytes = 0;           // e.g. 26214400
  int ready_after_layer = 0;   // its all-reduce may start when this unit's backward_weight ends
};
std::vector<DdpBucket> ddp_bucket_plan(const StepInputs& inputs);

// The order of forward/backward slots of one pipeline stage (0-based) of `stages`.
struct PipelineSlot {
  int micro_batch = 0;
  bool forward = true;
  int chunk = 0;  // the model chunk (interleaved 1F1B), 0..virtual_stages-1
};
std::vector<PipelineSlot> pipeline_stage_order(PipelineSchedule schedule, int stage, int stages,
                                               int micro_batches, int chunks = 1);

}  // namespace ftplan::sim

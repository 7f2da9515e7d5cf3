// What the step simulator needs to play one optimizer step: plain numbers per layer (durations and
// bytes) and the communication cost functions. The planner fills it from its cost functions
// (planner/compute_model.h, planner/collectives.h, planner/memory_model.h); the simulator knows no
// formula of its own, so the closed form and the simulation can be compared term by term.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "planner/parallelism.h"
#include "planner/training_setup.h"

namespace ftplan::sim {

// One unit of the model (a decoder block, or the embedding, or the final norm + head + loss) for
// one micro-batch on one GPU.
struct LayerCost {
  std::string name;                  // e.g. "block 12", "embedding", "head+loss"
  double forward_s = 0.0;            // forward compute, e.g. 0.0125
  double backward_input_s = 0.0;     // gradient w.r.t. the input (≈ forward), e.g. 0.0125
  double backward_weight_s = 0.0;    // gradient w.r.t. the trainable weights (0 when frozen)
  int64_t param_bytes = 0;           // unsharded parameters as communicated (bf16), e.g. 1.7e9
  int64_t grad_bytes = 0;            // trainable gradients as communicated (LoRA: adapters only)
  int64_t saved_activation_bytes = 0;  // kept from forward to backward without checkpointing
  int64_t checkpoint_bytes = 0;      // kept under full checkpointing (the block input); also what
                                     // a pipeline/MP stage sends to the next one
  bool checkpointable = true;        // false for the embedding and the head (never recomputed)
  int64_t updated_param_bytes = -1;  // trainable weights gathered after a ZeRO-1/2 optimizer step
                                     // (they differ from grad_bytes under fp32 gradients); -1: grad_bytes
  // Tensor parallelism (Megatron-LM): the activation collectives of the unit over the tp group, on
  // the critical path (the next compute op waits for them).
  double tp_forward_comm_s = 0.0;    // after the forward, and again after a recompute, e.g. two all-reduces
  double tp_backward_comm_s = 0.0;   // after backward_input (the input gradients)
  int64_t tp_comm_bytes = 0;         // activation bytes one such exchange moves (trace only)
  // Context parallelism: K and V exchanged over the cp group. Ring: each exchange runs beside the
  // attention part of the compute op (forward: attention_forward_s; backward_input: twice that), the
  // rest of the op waits for it; all_gather: before the compute op, blocking.
  double attention_forward_s = 0.0;  // the part of forward_s that is attention, e.g. 0.004
  double cp_forward_comm_s = 0.0;    // per forward and per recompute
  double cp_backward_comm_s = 0.0;   // per backward_input
  int64_t all_to_all_bytes = 0;      // expert parallelism, a MoE block: the buffer of one all-to-all (the
                                     // busiest rank's dispatched rows x hidden), e.g. 33554432; 0: none
};

struct StepInputs {
  Parallelism parallel;              // the layout (planner/parallelism.h): what the builders read
  std::string name = "single";       // how outputs name it: a preset ("fsdp") or a --parallel string
  int num_gpus = 1;                  // GPUs in the job; pipelines: the number of stages, e.g. 4
  int micro_batches = 1;             // gradient accumulation steps, or pipeline m, e.g. 8
  bool checkpointing = false;        // full activation checkpointing of checkpointable layers
  bool overlap = true;               // false: every op waits for the previous op on its rank
                                     // (the closed-form sum, for reference)
  std::vector<LayerCost> layers;     // forward order: embedding first, head+loss last
  int64_t logits_bytes = 0;          // logits (+ their gradient) alive from the head's forward
                                     // start to its backward_input end, per micro-batch
  int64_t static_bytes_per_rank = 0; // weights, gradients, optimizer states (their shards) resident
                                     // all step, incl. DDP buckets; e.g. 30e9
  std::vector<int64_t> static_bytes_by_rank;  // pipeline/mp: per stage; empty = the scalar above
  std::vector<int> stage_layer_counts;        // pipeline/mp: layers per virtual stage (chunk c of stage s
                                              // at c·pp + s), e.g. {11, 10, 10, 11}; empty = split evenly
  double optimizer_step_s = 0.0;     // one rank's optimizer step (offload: on the host CPU)

  // Communication and copy times, supplied by the planner. Collectives take the unsharded buffer
  // size in bytes and return the time over the strategy's group (ring: latency + (N-1)/N·bytes/bw
  // ...); p2p_s and host_copy_s take the bytes actually moved. An op of 0 bytes is not created.
  std::function<double(int64_t bytes)> all_reduce_s;          // ddp
  std::function<double(int64_t bytes)> reduce_scatter_s;      // zero*, fsdp*
  std::function<double(int64_t bytes)> all_gather_s;          // zero*, fsdp*
  std::function<double(int64_t bytes)> replica_all_reduce_s;  // fsdp_hybrid: across nodes, of the
                                                              // shard of a `bytes` gradient
  std::function<double(int64_t bytes)> p2p_s;                 // pipeline, mp
  std::function<double(int64_t bytes)> host_copy_s;           // *_offload
  // Pipelines with data parallelism (PP x DP): each stage's gradients are synchronised over its
  // data-parallel group once per step after its last backward (all_reduce_s unsharded;
  // reduce_scatter_s then all_gather_s of the weights (stage 3, before the first forward) or of the
  // updated parameters (stage 1/2, after the step) sharded; replica_all_reduce_s across replicas).
  std::function<double(int64_t bytes)> all_to_all_s;          // expert parallelism, over the ep group
  bool all_to_all_overlap = false;   // the framework runs the dispatch and combine beside the experts' compute
                                     // (configs/frameworks expert_parallel_overlap); false: the block waits

  int64_t bucket_bytes = INT64_C(25) << 20;       // DDP bucket_cap_mb = 25
  int64_t first_bucket_bytes = INT64_C(1) << 20;  // DDP's first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES)
  int fsdp_prefetch_depth = 1;       // units gathered ahead of the one computing (FSDP default 1)
};

// Throws InputError listing every problem at once, each naming its field, e.g.
// "step inputs: num_gpus(0) must be >= 1; pipeline needs num_gpus(8) <= layers(4)".
void validate_step_inputs(const StepInputs& inputs);

// Layout families: a pipeline simulates one rank per stage; every other layout one representative rank.
bool is_pipeline(const Parallelism& p);  // pp > 1 (gpipe, 1f1b, interleaved, naive mp)

// The inputs of a preset (tests and benchmarks): parallel = preset(strategy, num_gpus, 8), named by it.
void set_preset(StepInputs& inputs, Strategy strategy, int num_gpus);

// Model chunks a pipeline stage holds: virtual_stages under the interleaved schedule, else 1.
int pipeline_chunks(const Parallelism& p);

// Pipeline/mp: the first layer of each virtual stage plus one past the last, e.g. {0, 11, 21, 31, 42};
// virtual stage c·pp + s is chunk c of stage s (pp · pipeline_chunks entries + 1).
std::vector<int> stage_layer_bounds(const StepInputs& inputs);

}  // namespace ftplan::sim

// Step time of one optimizer step: compute + the communication that is not hidden, with an explicit
// overlap model per strategy:
//   DDP: gradient buckets all-reduce while backward runs; only the last bucket (or the excess of
//        communication over backward) is exposed (Li et al. 2020, PyTorch DDP, sec. 3.2.3).
//   ZeRO-1/2: the gradient reduce-scatter overlaps backward like DDP; the parameter all-gather after
//        the optimizer step is exposed.
//   ZeRO-3/FSDP: per-layer all-gathers prefetch behind compute (forward and backward prefetch);
//        the first layer's gather and the last reduce-scatter are exposed, plus any excess of
//        communication over compute.
//   naive MP: one stage busy at a time; pipeline: bubble (p-1)/(m+p-1) (Huang et al. 2019, GPipe).
//   expert parallelism: each MoE block's all-to-all dispatch and combine (forward, and their gradients in
//        backward) exposed, on the compute stream's critical path, unless the framework overlaps them;
//        a block's data-parallel traffic carries the rank's own experts only.
// Gradient accumulation communicates once per optimizer step where the strategy allows it (DDP's
// no_sync, ZeRO-1); ZeRO-2/3 and FSDP communicate on every micro-batch.
#pragma once

#include <map>
#include <memory>
#include <tuple>
#include <string>
#include <utility>
#include <vector>

#include "planner/collectives.h"
#include "planner/compute_model.h"
#include "planner/memory_model.h"

namespace ftplan {

// Everything the step-time and memory estimates of one job on N GPUs share, computed once.
struct PlanContext {
  PreparedJob memory;
  FlopsPerToken flops;
  Interconnect net;
  double peak_flops = 0;          // FLOP/s of the precision in use
  double efficiency = 0;          // achieved / peak
  double weight_bytes = 0;        // all working weights as communicated (ZeRO-3/FSDP gathers)
  double trainable_weight_bytes = 0;
  double grad_bytes = 0;          // all trainable gradients as communicated
  double layer_weight_bytes = 0;  // one block's weights
  double layer_grad_bytes = 0;
  // Per unit (embedding, one block, head) as communicated, whole bytes: the closed form sums its
  // collectives per unit, as FSDP/ZeRO issue them and as the simulator plays them.
  int64_t embedding_weight_bytes = 0, block_weight_bytes = 0, head_weight_bytes = 0;
  int64_t embedding_grad_bytes = 0, block_grad_bytes = 0, head_grad_bytes = 0;
  int64_t embedding_update_bytes = 0, block_update_bytes = 0, head_update_bytes = 0;  // trainable weights
  int64_t nf4_params = 0;
  int64_t trainable_params = 0;
  int64_t expert_trainable_params = 0;  // the routed experts' share of trainable_params
  int64_t num_gpus = 1;
  // The achieved FLOP/s of each piece for `rows` token rows per rank (compute_model.h piece_rates at
  // this context's tensor-parallel shape): `uniform_rates` where nothing is calibrated, else computed
  // once per (rows, ep) and kept.
  PieceRates rates_for(double rows, int64_t ep = 1) const;
  PieceRates uniform_rates;
  mutable std::vector<std::pair<std::pair<double, int64_t>, PieceRates>> rates_cache;

  // The network of one process group (planner/parallelism.h GroupPlacement), computed once per
  // (size, stride, GPUs used on a node) and kept: a search meets the same groups in many layouts, and
  // contexts of one GPU type may share the cache across shapes and GPU counts (prepare_plan's
  // group_nets argument; set once there, since recent_nets points into it).
  const Interconnect& group_net(const GroupPlacement& group) const;
  using GroupNets = std::map<std::tuple<int64_t, int64_t, int64_t>, Interconnect>;
  std::shared_ptr<GroupNets> group_nets = std::make_shared<GroupNets>();
  // This context's few groups, scanned before the shared map (map nodes do not move).
  mutable std::vector<std::pair<std::tuple<int64_t, int64_t, int64_t>, const Interconnect*>> recent_nets;
};

// The pointers inside must outlive the context.
// `shape`: the tensor/context-parallel cut the per-unit bytes are for (memory_model.h ShardShape);
// a candidate is evaluated against the context of its own shape.
PlanContext prepare_plan(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup,
                         int64_t num_gpus, const ShardShape& shape = {});
// The same, with a cache of process-group networks shared with other contexts of the same hardware
// spec (a search's shapes, a sweep's GPU counts).
PlanContext prepare_plan(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup, int64_t num_gpus,
                         const ShardShape& shape, std::shared_ptr<PlanContext::GroupNets> group_nets);
// The context keeps pointers: temporaries would dangle, so they do not compile.
PlanContext prepare_plan(ModelSpec&&, const HardwareSpec&, const TrainingSetup&, int64_t, const ShardShape& = {}) = delete;
PlanContext prepare_plan(const ModelSpec&, HardwareSpec&&, const TrainingSetup&, int64_t, const ShardShape& = {}) = delete;
PlanContext prepare_plan(const ModelSpec&, const HardwareSpec&, TrainingSetup&&, int64_t, const ShardShape& = {}) = delete;

struct StepOptions {
  bool overlap = true;                          // false: every communication is exposed
  int64_t ddp_bucket_bytes = INT64_C(25) << 20;     // PyTorch DDP's bucket_cap_mb
  int64_t ddp_first_bucket_bytes = INT64_C(1) << 20; // torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
};

struct StepEstimate {
  double compute_s = 0;        // forward + backward (+ recompute, + NF4 dequantisation), all micro-batches
  double comm_s = 0;           // every collective and copy, hidden or not
  double exposed_comm_s = 0;   // the part compute does not hide
  double bubble_s = 0;         // pipeline / naive-MP idle time on the busiest GPU
  double optimizer_s = 0;
  double paged_state_migration_s = 0;  // of optimizer_s: paged optimizer states over the host link
  double step_time_s = 0;
  double bubble_fraction = 0;
  double tokens_per_step = 0;  // all GPUs together
  double tokens_per_s = 0;
  double mfu = 0;              // model FLOPs (no recompute) / (time × GPUs × peak)
  double comm_bytes_per_step = 0;  // bytes each GPU sends per optimizer step
  // The same by process group (the layout's dimensions; they sum to comm_bytes_per_step): tp
  // (activations inside the blocks), cp (K/V), ep (all-to-alls), pp (activations between stages),
  // dp (gradients and parameters over the data-parallel ranks).
  struct GroupBytes {
    double tp = 0, cp = 0, ep = 0, pp = 0, dp = 0;
  } comm_bytes_per_group;
  double flops_per_step = 0;       // model FLOPs per optimizer step, all GPUs
};

// Which bytes of each unit a collective moves: all its weights (ZeRO-3/FSDP gathers), its
// gradients (reductions), or its trainable weights (ZeRO-1/2's gather of updated parameters).
enum class UnitBytes { weights, gradients, updates };

// One collective issued per unit (embedding, every block, head): the sum of their times.
double per_unit_collective_s(const PlanContext& context, Collective c, UnitBytes which, const Interconnect& net);
// The same over one pipeline stage's units: `layers` blocks, and the embedding and head where it holds them.
double stage_unit_collective_s(const PlanContext& context, Collective c, UnitBytes which, const Interconnect& net,
                               double layers, bool embedding, bool head);

// DDP's gradient all-reduce in buckets: the first of ddp_first_bucket_bytes, then ddp_bucket_bytes
// each, then the remainder (a bucket may span units); returns the sum of their times and the last
// bucket's time (the one backward cannot hide).
struct BucketedTime {
  double total_s = 0, last_s = 0;
  int64_t buckets = 0;
};
BucketedTime ddp_bucketed_all_reduce(const PlanContext& context, const StepOptions& options);
BucketedTime ddp_bucketed_all_reduce(const PlanContext& context, const StepOptions& options, const Interconnect& net,
                                     double grad_bytes);

StepEstimate estimate_step(const PlanContext& context, const Candidate& candidate, const StepOptions& options = {});

// bitsandbytes' paged optimizer states: each is a CUDA unified-memory buffer (cudaMallocManaged,
// bitsandbytes/functional.py get_paged) that the optimizer prefetches to the GPU before it updates the
// parameter (prefetch_state, cudaMemPrefetchAsync) and then synchronizes (Optimizer8bit.step calls
// torch.cuda.synchronize() after every parameter: bitsandbytes/optim/optimizer.py at
// 06029dd6edcc719e5831443179bcb206c6355093), so the migration is on the step's critical path. Where the
// states fit in the device memory the step leaves free they stay resident after the first step: 0. Where
// they do not, the driver evicts the root chunk at the head of its used list to make room, and chunks
// are not moved to the tail when they are used again (NVIDIA/open-gpu-kernel-modules
// kernel-open/nvidia-uvm/uvm_pmm_gpu.c pick_root_chunk_to_evict, "TODO: Bug 1765193: Move the chunks to
// the tail of the used list whenever they get mapped", at 04848d3dab5ed57188e4776937f69b3fc82cdd84):
// first in, first out. The optimizer walks the same parameters in the same order every step, and a
// cyclic walk over more than fits evicts every chunk before its next use under FIFO, so every paged
// state comes in and, written by the update, goes back out, every step: 2 x paged bytes over the host
// link, the eviction finishing before its chunk is refilled (evict_root_chunk runs before the chunk is
// handed out): one direction at a time.
double paged_state_migration_s(double paged_state_bytes, double free_device_bytes, double host_bandwidth_bytes_per_s);

// Tokens one micro-batch of `micro_batch` rows times: seq_len when packed or padded to it, the
// dataset's mean row length for padded batches of shorter rows.
double micro_batch_tokens(const TrainingSetup& setup, int64_t micro_batch);

// One layer's tensor- and context-parallel communication for one micro-batch of `tokens` tokens on
// one rank: what estimate_step sums and the simulator places op by op (simulator/plan_inputs.cpp).
struct ShardedLayerComm {
  double tp_collective_s = 0;      // one exchange of the activations over tp (all-reduce; RS + AG under SP)
  double tp_collective_bytes = 0;  // its wire bytes per rank
  double activation_bytes = 0;     // the activations it carries, e.g. 2·T·h
  double attention_forward_s = 0;  // one layer's attention forward on one rank: the ring's window
  double cp_forward_s = 0;         // K/V exchange in forward (ring: cp-1 steps; all_gather: one all-gather)
  double cp_backward_s = 0;        // in backward (ring: 2(cp-1) steps, K/V and their gradients; all-gather + reduce-scatter)
  double cp_forward_bytes = 0, cp_backward_bytes = 0;
};
ShardedLayerComm sharded_layer_comm(const PlanContext& context, const Candidate& candidate, double tokens);
// LoRA's (and QLoRA's) own tensor-parallel bytes per micro-batch of `tokens` tokens on a pipeline stage
// of `stage_layers` blocks, beyond the base's exchanges (each `exchange_bytes`): the adapters' small
// collectives, less the first block's input-gradient exchange a frozen embedding never needs.
double lora_tp_bytes(const PlanContext& context, const Candidate& candidate, double tokens, double stage_layers,
                     double exchange_bytes);

}  // namespace ftplan

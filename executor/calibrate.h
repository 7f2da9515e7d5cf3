// `ftexec calibrate`: the time model's efficiency parameters measured directly on the machine it
// runs on, written in the format of `ftplan calibrate` (planner/calibration.h):
//   GEMMs         the job's model shapes (every block linear forward, input-gradient and weight-
//                 gradient GEMM, the head, LoRA's adapters) and square GEMMs of 16 ... 2048 (4096
//                 where fast enough), each timed (fastest of repeats) in the job's compute dtype; the
//                 three anchors fitted from (smallest dimension, achieved / peak) points
//   attention     the model's attention core (eager: QK^T, scale, causal mask, fp32 softmax, P·V; fused:
//                 scaled_dot_product_attention) forward + backward at [micro_batch, heads, seq_len, head_dim],
//                 against the FLOPs the planner times that kernel at: S / 2 keys per query where it skips
//                 the blocks above the causal diagonal (compat::sdpa_causal_skips_blocks), all S where not
//   optimizer     ftexec's AdamW step over 8M parameters: the planner's bytes per parameter for
//                 it (optimizer_step_bytes_per_param at the ftexec profile's optimizer.implementation)
//                 over the time, against the hwdb's memory bandwidth
//   collectives   with several ranks (--nproc N): per group size 2, 4, ... N, all-reduce rings of
//                 4 KiB .. 16 MiB over c10d (Gloo on CPU, NCCL on GPU), latency and bandwidth fitted
//                 to the planner's ring formula (planner/collectives.h); the calibration takes the
//                 group of N's, against the hwdb's bandwidth for a group of N
// Efficiencies are achieved / the hwdb entry's peak for the job's precision (hwdb/cpu.json on the CPU).
#pragma once

#include <nlohmann/json.hpp>

#include "executor/exec_job.h"
#include "executor/launch.h"
#include "planner/hardware_spec.h"
#include "planner/model_spec.h"

namespace ftexec {

// Every rank calls this together (comm's world; a local Comm for one process). Every rank times the
// collectives, then rank 0 the compute alone (the others are done); rank 0 returns the calibration
// JSON (calibration_to_json), the others null. `hw_id`: the hwdb entry whose peak and
// bandwidths the efficiencies are relative to.
class Comm;

// The attention core's FLOPs, forward + backward (3x the forward's 4·keys·q_dim per query), for `batch`
// rows of `seq_len`, as the planner times them (planner/compute_model.cpp flops_per_token): S / 2 keys
// per query where the kernel skips the causal blocks, S where it computes the whole masked S x S.
double timed_attention_flops(const ftplan::ModelSpec& model, int64_t batch, int64_t seq_len, bool causal_blocks_skipped);

struct AttentionTiming {
  int64_t batch = 0;
  bool fused = false;                  // SDPA (else eager)
  bool causal_blocks_skipped = false;  // the kernel skips the blocks above the diagonal
  double time_s = 0;                   // forward + backward, fastest of the repeats
  double executed_flops = 0;           // timed_attention_flops
  double efficiency = 0;               // executed_flops / time_s / peak, clamped to [1e-4, 1]
};
// The job's attention core (one layer) forward + backward on its device.
AttentionTiming time_attention(const ExecJob& job, double peak_flops);

struct OptimizerTiming {
  int64_t params = 0;
  double time_s = 0;           // one AdamW step, fastest of the repeats
  bool foreach = false;        // the ftexec profile's optimizer.implementation
  double bytes_per_param = 0;  // ftplan::optimizer_step_bytes_per_param(precision, adamw, foreach)
  double factor = 0;           // bytes_per_param · params / time_s / the hwdb's HBM bandwidth, clamped to [1e-3, 4]
};
// ftexec's AdamW step over 8M parameters (beyond the caches) in the job's precision.
OptimizerTiming time_optimizer(const ExecJob& job, const ftplan::HardwareSpec& hw);
nlohmann::json calibrate_device(const ExecJob& job, const std::string& hw_id, Comm& comm);

// One rank of `ftexec calibrate`: threads as `ftexec run` sets them, the rendezvous (`backend`: auto,
// gloo or nccl; a local Comm for one process), then calibrate_device.
nlohmann::json calibrate_rank(const ExecJob& job, const std::string& hw_id, const DistEnv& env, double timeout_s,
                              const std::string& backend);

}  // namespace ftexec

// `ftexec calibrate`: the time model's efficiency parameters measured directly on the machine it
// runs on, written in the format of `ftplan calibrate` (planner/calibration.h):
//   GEMMs         the job's model shapes (every block linear forward, input-gradient and weight-
//                 gradient GEMM, the head, LoRA's adapters) and square GEMMs of 16 ... 2048 (4096
//                 where fast enough), each timed (fastest of repeats) in the job's compute dtype; the
//                 three anchors fitted from (smallest dimension, achieved / peak) points
//   attention     the model's attention core (eager: QK^T, scale, causal mask, fp32 softmax, P·V; fused:
//                 scaled_dot_product_attention) forward + backward at [micro_batch, heads, seq_len, head_dim]
//   optimizer     ftexec's AdamW step over up to 8M parameters: the planner's 28 B per parameter over
//                 the time, against the hwdb's memory bandwidth
//   collectives   with several ranks (--nproc N): per group size 2, 4, ... N, all-reduce rings of
//                 4 KiB .. 16 MiB over c10d (Gloo on CPU, NCCL on GPU), latency and bandwidth fitted
//                 to the planner's ring formula (planner/collectives.h); the calibration takes the
//                 group of N's, against the hwdb's bandwidth for a group of N
// Efficiencies are achieved / the hwdb entry's peak for the job's precision (hwdb/cpu.json on the CPU).
#pragma once

#include <nlohmann/json.hpp>

#include "executor/exec_job.h"
#include "executor/launch.h"

namespace ftexec {

// Every rank calls this together (comm's world; a local Comm for one process). Every rank times the
// collectives, then rank 0 the compute alone (the others are done); rank 0 returns the calibration
// JSON (calibration_to_json), the others null. `hw_id`: the hwdb entry whose peak and
// bandwidths the efficiencies are relative to.
class Comm;
nlohmann::json calibrate_device(const ExecJob& job, const std::string& hw_id, Comm& comm);

// One rank of `ftexec calibrate`: threads as `ftexec run` sets them, the rendezvous (`backend`: auto,
// gloo or nccl; a local Comm for one process), then calibrate_device.
nlohmann::json calibrate_rank(const ExecJob& job, const std::string& hw_id, const DistEnv& env, double timeout_s,
                              const std::string& backend);

}  // namespace ftexec

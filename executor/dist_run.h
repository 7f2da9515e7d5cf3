// One rank of a run, the one run path for one process and for N ranks: the layout
// (exec_parallelism: the description every strategy class reads), rendezvous (a world of one needs
// none), build the model and the strategy, train, measure this rank, save, and (rank 0) merge every
// rank's figures into measured.json. No LibTorch in this header.
//
// Measurement, alike for every world size: step time (median after warm-up; the slowest rank's),
// MFU against the peak of the device that ran (the plan's GPU, or --gpu, on CUDA; hwdb/cpu.json on
// the CPU) times the ranks, memory per rank (CPU: the counting allocator; CUDA: the caching
// allocator's peak reserved plus what the device holds outside it, as the planner's total predicts).
//
// --save DIR: the adapter (PEFT: adapter_model.safetensors + adapter_config.json) or the full
// weights (model.safetensors + config.json), in the parameters' dtype, under every layout: rank 0
// writes each unit as the strategy hands it over (sharded units gathered one at a time by rank 0's
// shard group, a pipeline's from the stage that owns them), into a temporary folder renamed into
// place (executor/save_folder.h); measured.json's "saved" says what was written, and each rank's
// "save_peak_extra_bytes" what saving held beyond its states.
//
// measured.json, beyond the keys of run_job.h: "world_size", "data_parallel_size",
// "first_step" (> 0 after --resume), "comm_bytes_per_step" (the largest over ranks), and "ranks": one
// entry per rank with "peak_memory_bytes", "components" {weights, gradients, optimizer, buffers,
// activations}, "comm_bytes" {all_reduce, reduce_scatter, all_gather, send} per optimizer step,
// "comm_calls", "comm_padding_bytes", "comm_control_bytes" (loss, gradient norm, barriers; left out
// of comm_bytes_per_step as the planner leaves them out), "comm_bytes_per_step", "comm_time_s" and
// "compute_time_s" (per step, mean over the timed steps), "step_time_s" (median).
//
// Checkpoints (--checkpoint-dir DIR --checkpoint-every K): DIR/step-<S>/rank-<r>.safetensors holds
// what rank r owns (its shards, or its stage; replicated strategies: rank 0 alone), rank-<r>.json the
// step, optimizer step count, data position (micro-batches drawn) and RNG state; every file is
// written to a temporary name, synced and renamed; each rank checksums its files, and rank 0 writes
// manifest.json (sizes, CRC-32s, the layout: executor/checkpoint.h) once every rank is done, then
// DIR/latest, then removes what --keep-last N leaves out. --resume continues from the newest complete
// checkpoint with the identical loss trajectory, after every rank has checked the manifest against
// this run and the size and checksum of every file it reads; a mismatch on any rank ends every rank
// with the same one-line InputError (exit 2).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "executor/exec_job.h"
#include "executor/launch.h"
#include "planner/errors.h"

namespace ftexec {

// Bad input that every rank found together (one rank's verdict shared by a collective), so every
// rank throws the same message. Under ftexec's own launcher the ranks share one stderr: rank 0
// alone prints it.
struct AgreedInputError : ftplan::InputError {
  using ftplan::InputError::InputError;
};

struct DistOptions {
  double timeout_s = 60;             // every collective and the rendezvous, e.g. 60
  std::string fault_inject;          // debug: "RANK:STEP:kill|hang|exit|throw", comma-separated
  std::string checkpoint_dir;        // "" for none
  int64_t checkpoint_every = 0;      // steps between checkpoints, e.g. 100; 0: one at the end
  bool resume = false;               // continue from the newest complete checkpoint in checkpoint_dir
  int64_t keep_last = 0;             // complete checkpoints kept, e.g. 3; 0: all
  double ddp_bucket_mb = 25;         // DDP bucket_cap_mb
  double zero_bucket_elements = 5e8; // DeepSpeed reduce_bucket_size
  std::string backend = "auto";      // auto (nccl on CUDA, gloo on CPU) | gloo | nccl
  int64_t shard_group_size = 0;      // --strategy fsdp_hybrid: ranks per shard group (dp_shard), e.g. 2;
                                     // 0: the job's gpus_per_node, else its GPU's in hwdb/
};

// Runs this rank. Returns the merged measured.json on rank 0 and null on the others. Throws
// RuntimeFailure (naming this rank, and the rank at fault where known) or InputError.
nlohmann::json run_rank(const ExecJob& job, const DistEnv& env, const DistOptions& options);

}  // namespace ftexec

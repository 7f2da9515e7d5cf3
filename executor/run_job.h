// Runs an ExecJob end to end in this one process (build or load the model, attach LoRA, train,
// measure, save) and returns measured.json: run_rank (executor/dist_run.h) as rank 0 of a world of
// one, so one process and N ranks share one run path (layout, measurement, MFU, memory, --save).
// Any layout of one rank runs here (single, zero3_offload on one GPU, ...). No LibTorch in this
// header, so the CLI compiles fast.
//
// measured.json: {"format": "ftexec-measured/1", "device", "torch_version", "job", "candidate",
//   "loss": [one per optimizer step], "step_time_s" (median after warm-up), "step_times_s",
//   "tokens_per_step", "tokens_per_s", "flops_per_step", "mfu" (null without a peak FLOP/s),
//   "ranks": [{"rank": 0, "peak_memory_bytes", "components": {"weights", "gradients", "optimizer",
//   "buffers", "host", "activations"}, ...}], "notes": [..], "candidate": {"strategy" (the preset's
//   name, or the layout's --parallel string), "parallel" (the layout's degrees and flags),
//   "micro_batch", "checkpointing", "attention", "gpus"}, and with --save "saved": {"dir", "format"
//   ("peft" or "hf-safetensors"), "files", "tensors", "weights_bytes"}}
#pragma once

#include <nlohmann/json.hpp>

#include "executor/exec_job.h"

namespace ftexec {

// Errors: ftplan::InputError for bad input (exit 2), RuntimeFailure for anything that went wrong
// while running (out of memory, a LibTorch error: exit 3). Nothing is written unless it succeeds.
struct RuntimeFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

nlohmann::json run_job(const ExecJob& job);

}  // namespace ftexec

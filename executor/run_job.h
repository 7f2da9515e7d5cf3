// Runs an ExecJob end to end (build or load the model, attach LoRA, train, measure, save) and
// returns measured.json. No LibTorch in this header, so the CLI compiles fast.
//
// measured.json: {"format": "ftexec-measured/1", "device", "torch_version", "job", "candidate",
//   "loss": [one per optimizer step], "step_time_s" (median after warm-up), "step_times_s",
//   "tokens_per_step", "tokens_per_s", "flops_per_step", "mfu" (null without a peak FLOP/s),
//   "ranks": [{"rank": 0, "peak_memory_bytes", "components": {"weights", "gradients", "optimizer",
//   "activations"}, ...}], "notes": [..]}
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

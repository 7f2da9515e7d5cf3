// `ftplan compare plan.json measured.json`: the planner's prediction beside what ftexec measured,
// one row per figure both files have, with the error (measured − predicted) / predicted in %.
// Computed once (compare_json), printed as a table (compare_report). No LibTorch.
//   memory: the peak per device and its components (weights, gradients, optimizer; the planner's
//           activations + logits_loss + temporary against the measured peak − static bytes);
//           the most loaded rank when several are measured, then every rank beside the prediction
//           (the planner's most loaded rank)
//   time:   step_time_s, tokens_per_s, mfu; comm_bytes_per_step when the run measured it, and a note
//           with the measured bytes by collective (all_reduce, reduce_scatter, all_gather, send)
// Other stacks' logs (run_logs.h: HF trainer_state.json, torchtune, DeepSpeed, accelerate, plain
// CSV/JSON) go through compare_run_log: each memory figure against the matching prediction
// (max_memory_allocated and torchtune's active against allocated_peak, max_memory_reserved against
// reserved_peak, nvidia-smi against device_peak), step_time_s, tokens_per_s, and a "missing" row
// for each of those the log lacks.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ftplan {

struct RunLog;

// The plan's prediction redone for another framework profile (the run's: ftexec for ftexec's
// measurements): its job and candidate as written, the profile's behaviour. InputError when the
// plan's job or model cannot be read.
nlohmann::json plan_for_framework(const nlohmann::json& plan, const std::string& framework);

// Where the measured run is not the planned job: one line per field that differs (model, method,
// LoRA rank and targets, precision, sequence length, micro-batch, gradient accumulation,
// checkpointing, strategy, GPU count), e.g. "method: plan lora, measured full". Empty when alike.
std::vector<std::string> job_differences(const nlohmann::json& plan, const nlohmann::json& measured);

// {"rows": [{"figure", "unit", "predicted", "measured", "error_pct" (null when predicted is 0)}],
//  "notes": [..], "differences": [..]}; InputError when either file lacks the object it must have,
// and, unless `force`, when the run is of a different job (naming every field that differs).
nlohmann::json compare_json(const nlohmann::json& plan, const nlohmann::json& measured, bool force = false);

// The plan beside one run log of any format: ftexec's measured.json as compare_json; the others
// {"rows": [...; a figure the log lacks has "measured": null, "missing": true], "notes", "differences",
//  "run": {"path", "format", "missing", "loss": [[step, loss], ...]}}. The job check of compare_json
// applies to what the log names (model and shape for plain JSON with "job"; only the micro-batch for
// HF's trainer_state.json; nothing for torchtune, DeepSpeed, accelerate and CSV, said in a note).
nlohmann::json compare_run_log(const nlohmann::json& plan, const RunLog& log, bool force = false);

// The rows as a table "figure | predicted | measured | error %", then the notes.
std::string compare_report(const nlohmann::json& plan, const nlohmann::json& measured, bool force = false);
// The same table from compare_json's result.
std::string compare_table(const nlohmann::json& comparison);

}  // namespace ftplan

// Run logs: the figures a training run wrote, read from the file's content (never its name), so that
// `ftplan compare PLAN RUN...` can hold them against the plan. One reader per stack; each states
// where its format comes from (file and commit) in run_logs.cpp and what it assumes in `notes`.
//
//   format              what is read                                               profile that predicts
//   ftexec-measured/1   ftexec's measured.json, as written (compare_json)          ftexec
//   hf-trainer-state    transformers' TrainerState JSON: log_history loss,         the plan's (the Trainer
//                       train_runtime / global_step, train_samples_per_second,     drives hf, deepspeed and
//                       train_tokens_per_second, the memory tracker's deltas       fsdp alike)
//   torchtune-log       DiskLogger/StdoutLogger "Step N | name:value ..." lines    torchtune
//                       and DiskLogger jsonl: loss, tokens_per_second_per_gpu,
//                       peak_memory_active/alloc/reserved
//   deepspeed-log       see_memory_usage "MA .. Max_MA .. CA .. Max_CA ..",        deepspeed
//                       ThroughputTimer "SamplesPerSec=..", wall_clock_breakdown
//                       "time (ms) | fwd: .. | bwd: .. | step: .."
//   accelerate-log      accelerate's/PEFT's TorchTracemalloc "Total Peak Memory   the plan's
//                       consumed during the train (max): N" (MiB)
//   plain-csv/-json     the documented columns (README, "Run logs")                the plan's, or "framework"
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ftplan {

struct RunLogOptions {
  // torchtune's peak_memory_* unit: "gib" (2^30, torchtune since PR #1348, 2024-08-15), "gb" (10^9,
  // before), or "auto": what the log says ("GPU peak memory allocation: 2.52 GiB" lines, a
  // log_<unix time>.txt name from before the change), else GiB.
  std::string torchtune_memory_unit = "auto";
};

struct RunLog {
  std::string path;       // as given, e.g. "runs/trainer_state.json"
  std::string format;     // one of the formats above, e.g. "hf-trainer-state"; "deepspeed-log+accelerate-log"
  std::string framework;  // profile that predicts this stack, e.g. "torchtune"; "" = the plan's
  nlohmann::json measured;   // ftexec-measured/1 only: the file as written
  nlohmann::json job;        // ftplan job keys the log names (model, method, seq_len, ...); null if none
  nlohmann::json candidate;  // strategy, micro_batch, checkpointing the log names; null if none
  std::optional<int64_t> world_size;  // GPUs of the run, when the log says

  // The figures; an empty optional is a figure the log does not contain.
  std::optional<double> step_time_s;           // one optimizer step, s
  std::optional<double> tokens_per_s;          // the whole job, tokens/s
  std::optional<double> tokens_per_s_per_gpu;  // tokens/s per GPU (torchtune, HF's train_tokens_per_second)
  std::optional<double> samples_per_s;         // the whole job, samples/s (HF, DeepSpeed)
  std::optional<double> allocated_peak_bytes;  // torch.cuda.max_memory_allocated, bytes
  std::optional<double> reserved_peak_bytes;   // torch.cuda.max_memory_reserved, bytes
  std::optional<double> active_peak_bytes;     // memory_stats()["active_bytes.all.peak"], bytes
  std::optional<double> device_peak_bytes;     // nvidia-smi memory.used, bytes
  std::vector<std::pair<int64_t, double>> loss;  // (optimizer step, training loss)
  int64_t steps_logged = 0;                      // step records read

  std::vector<std::string> notes;    // how each figure was read, what was assumed
  std::vector<std::string> missing;  // figures the log lacks: "allocated", "reserved", "device",
                                     // "step_time_s", "tokens_per_s", "loss"
};

// Reads the file and detects its format from the content. InputError (one line naming the file)
// when it cannot be read or is of no format above.
RunLog read_run_log(const std::string& path, const RunLogOptions& options = {});

// The same from text already read; `path` names it in messages and may carry torchtune's
// log_<unix time>.txt.
RunLog parse_run_log(const std::string& text, const std::string& path, const RunLogOptions& options = {});

// Ranks of one job, one log each: the most loaded rank's figures (the largest reserved, else
// allocated, else device peak), the slowest step time, and throughput from the first log that has
// it; says which file gave what.
RunLog merge_rank_logs(const std::vector<RunLog>& ranks);

}  // namespace ftplan

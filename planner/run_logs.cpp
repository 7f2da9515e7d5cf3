// Readers for the logs training stacks write. Each format is detected from the content and read
// as its writer writes it; the writer's file and commit are cited beside its reader.
#include "planner/run_logs.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "planner/errors.h"
#include "planner/format.h"

namespace ftplan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;
// torchtune PR #1348 ("Update peak memory stats to be logged in GiB", commit d0b89e20, merged
// 2024-08-15): peak_memory_* divided by 1e9 before, by 1024**3 since.
constexpr int64_t kTorchtuneGibSince = 1723680000;  // 2024-08-15 00:00 UTC, unix time

// A whole-string number ("12.5", "1e-3"); nullopt for anything else or a non-finite value.
std::optional<double> to_number(const std::string& s) {
  if (s.empty()) return std::nullopt;
  const char* begin = s.c_str();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  if (end == begin || *end != '\0' || !std::isfinite(v)) return std::nullopt;
  return v;
}

// The number at the start of `s` (after an optional "tensor("), e.g. "57.8 lr:..." -> 57.8.
std::optional<double> leading_number(const std::string& s, size_t pos) {
  if (s.compare(pos, 7, "tensor(") == 0) pos += 7;
  const char* begin = s.c_str() + pos;
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// The lines of a text log, each cut at 64 KiB: log lines are short, and std::regex recurses per
// character, so an absurd line must not reach it whole.
std::vector<std::string> split_lines(const std::string& text) {
  constexpr size_t kMaxLine = 1 << 16;
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.size() > kMaxLine) line.resize(kMaxLine);
    lines.push_back(line);
  }
  return lines;
}

// The median of the values after the first (the first step carries warm-up: allocator growth,
// compilation, cuDNN/cuBLAS autotuning); the one value when there is only one.
double median_after_first(std::vector<double> v) {
  if (v.size() > 1) v.erase(v.begin());
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string steps_phrase(size_t n) {
  return n > 1 ? "median of " + std::to_string(n - 1) + " logged steps after the first" : "the one logged step";
}

// The larger of the slot and v; a value that overflows once scaled to bytes is left out.
void keep_max(std::optional<double>& slot, double v) {
  if (std::isfinite(v)) slot = slot ? std::max(*slot, v) : v;
}

// Refuses a figure no run can have (a corrupted or mis-parsed log), naming it, then lists what the
// log lacks.
void finish(RunLog& log) {
  const std::pair<const char*, std::pair<const std::optional<double>*, double>> ceilings[] = {
      {"step time (s)", {&log.step_time_s, 1e7}},
      {"tokens/s", {&log.tokens_per_s, 1e12}},
      {"tokens/s per GPU", {&log.tokens_per_s_per_gpu, 1e12}},
      {"samples/s", {&log.samples_per_s, 1e12}},
      {"allocated peak (bytes)", {&log.allocated_peak_bytes, 1e15}},
      {"reserved peak (bytes)", {&log.reserved_peak_bytes, 1e15}},
      {"active peak (bytes)", {&log.active_peak_bytes, 1e15}},
      {"device memory (bytes)", {&log.device_peak_bytes, 1e15}},
  };
  for (const auto& [name, slot] : ceilings) {
    const std::optional<double>& v = *slot.first;
    if (v && (!std::isfinite(*v) || *v < 0 || *v > slot.second)) {
      std::ostringstream msg;
      msg << log.path << ": " << name << " " << *v << " is out of range [0, " << slot.second << "]: a corrupted log?";
      fail_input(msg.str());
    }
  }
  log.missing.clear();
  if (!log.allocated_peak_bytes) log.missing.push_back("allocated");
  if (!log.reserved_peak_bytes) log.missing.push_back("reserved");
  if (!log.device_peak_bytes) log.missing.push_back("device");
  if (!log.step_time_s) log.missing.push_back("step_time_s");
  if (!log.tokens_per_s && !log.tokens_per_s_per_gpu && !log.samples_per_s) log.missing.push_back("tokens_per_s");
  if (log.loss.empty()) log.missing.push_back("loss");
}

// ---------------------------------------------------------------------------------------------
// Hugging Face Trainer: trainer_state.json, TrainerState.save_to_json
// (huggingface/transformers src/transformers/trainer_callback.py, TrainerState, @01081ce2:
// epoch, global_step, max_steps, log_history, ...; train_batch_size in later versions). The
// last log_history entry of a finished train() carries speed_metrics("train", ...)
// (src/transformers/trainer_utils.py @007360d6: train_runtime, train_samples_per_second =
// max_steps x total batch / runtime, train_steps_per_second, train_tokens_per_second per device
// with include_tokens_per_second) and, with skip_memory_metrics=False, TrainerMemoryTracker's
// before_init_mem_gpu, init_/train_mem_gpu_alloc_delta and train_mem_gpu_peaked_delta (bytes;
// peaked = max(0, max_memory_allocated - memory_allocated at the stage's end)).
bool is_hf_trainer_state(const nlohmann::json& j) {
  return j.is_object() && j.contains("log_history") && j["log_history"].is_array() && j.contains("global_step");
}

void read_hf_trainer_state(const nlohmann::json& j, RunLog& log) {
  log.format = "hf-trainer-state";
  // The Trainer drives the hf, deepspeed and fsdp profiles alike and the file does not say which
  // backend ran: the plan's profile predicts.
  log.framework = "";
  const double global_step = j["global_step"].is_number() ? j["global_step"].get<double>() : 0.0;
  auto num = [](const nlohmann::json& o, const char* k) -> std::optional<double> {
    if (!o.is_object() || !o.contains(k) || !o[k].is_number()) return std::nullopt;
    const double v = o[k].get<double>();
    return std::isfinite(v) ? std::optional<double>(v) : std::nullopt;
  };
  const nlohmann::json* final_entry = nullptr;
  for (const auto& e : j["log_history"]) {
    if (!e.is_object()) continue;
    const auto loss = num(e, "loss"), step = num(e, "step");
    if (loss && step && *step >= 0 && *step < 1e15) log.loss.emplace_back(static_cast<int64_t>(*step), *loss);
    if (e.contains("train_runtime")) final_entry = &e;
  }
  log.steps_logged = static_cast<int64_t>(log.loss.size());
  if (final_entry) {
    const auto runtime = num(*final_entry, "train_runtime");
    if (runtime && global_step > 0) {
      log.step_time_s = *runtime / global_step;
      log.notes.push_back("step_time_s: train_runtime " + format_fixed(*runtime, 4) + " s / global_step " +
                          format_fixed(global_step, 0) +
                          " (HF logs no per-step times; train_runtime spans train(), evaluation and "
                          "checkpoint saving during training included)");
    }
    if (const auto sps = num(*final_entry, "train_samples_per_second")) {
      log.samples_per_s = *sps;
      log.notes.push_back("train_samples_per_second " + format_fixed(*sps, 3) +
                          " (max_steps x per-device batch x accumulation x processes / train_runtime)");
    }
    if (const auto tps = num(*final_entry, "train_tokens_per_second")) {
      log.tokens_per_s_per_gpu = *tps;
      log.notes.push_back("train_tokens_per_second " + format_fixed(*tps, 3) +
                          " is per device (TrainingArguments.include_tokens_per_second)");
    }
    const auto before = num(*final_entry, "before_init_mem_gpu"), init = num(*final_entry, "init_mem_gpu_alloc_delta");
    const auto alloc = num(*final_entry, "train_mem_gpu_alloc_delta"), peaked = num(*final_entry, "train_mem_gpu_peaked_delta");
    if (before && init && alloc && peaked) {
      log.allocated_peak_bytes = *before + *init + *alloc + *peaked;
      log.notes.push_back("allocated: before_init_mem_gpu + init_mem_gpu_alloc_delta + train_mem_gpu_alloc_delta + "
                          "train_mem_gpu_peaked_delta (TrainerMemoryTracker; assumes nothing was allocated "
                          "between Trainer.__init__ and train())");
    } else if (alloc || peaked) {
      log.notes.push_back("the memory tracker's train deltas are there but not before_init_mem_gpu and "
                          "init_mem_gpu_alloc_delta, so the absolute peak is unknown");
    }
  } else {
    log.notes.push_back("no train_runtime in log_history: a checkpoint's trainer_state.json, written before "
                        "train() ended (the final one is in the output folder after trainer.save_state())");
  }
  if (j.contains("train_batch_size") && j["train_batch_size"].is_number_integer())
    log.candidate = {{"micro_batch", j["train_batch_size"]}};
  log.notes.push_back("trainer_state.json names no model, method, sequence length or GPU count: only the micro-batch "
                      "(train_batch_size) is checked against the plan");
}

// ---------------------------------------------------------------------------------------------
// torchtune: DiskLogger / StdoutLogger (pytorch/torchtune torchtune/training/metric_logging.py
// @bd2a0fc7): log_dict writes "Step {step} | " then "{name}:{data} " per metric, one line per
// logged step (jsonl: {"step": step, name: data, ...}). The recipes
// (recipes/lora_finetune_single_device.py, lora_finetune_distributed.py,
// full_finetune_distributed.py @bd2a0fc7) log loss, lr, tokens_per_second_per_gpu = unmasked
// label tokens of the step / (time of the step x world size), and with log_peak_memory_stats
// training.get_memory_stats (torchtune/training/memory.py @bd2a0fc7): peak_memory_active =
// memory_stats()["active_bytes.all.peak"], peak_memory_alloc = max_memory_allocated,
// peak_memory_reserved = max_memory_reserved, divided by 1024**3 (1e9 before PR #1348), peaks
// reset after each call (reset_stats=True), so each line holds the peak since the last one.
struct TorchtuneStep {
  int64_t step = 0;
  std::map<std::string, double> values;
};

const char* const kTorchtuneKeys[] = {"loss", "tokens_per_second_per_gpu", "peak_memory_active", "peak_memory_alloc",
                                      "peak_memory_reserved"};

// "Step 12 | loss:1.04 lr:2e-05 tokens_per_second_per_gpu:542.97 " (values may print as
// "tensor(542.97, device='cuda:0')").
std::optional<TorchtuneStep> torchtune_text_step(const std::string& line) {
  static const std::regex head(R"(^\s*Step (\d{1,15}) \| )");
  std::smatch m;
  if (!std::regex_search(line, m, head)) return std::nullopt;
  TorchtuneStep s;
  s.step = std::stoll(m[1].str());
  const std::string body = " " + m.suffix().str();
  for (const char* key : kTorchtuneKeys) {
    const std::string needle = std::string(" ") + key + ":";
    const size_t at = body.find(needle);
    if (at == std::string::npos) continue;
    if (const auto v = leading_number(body, at + needle.size())) s.values[key] = *v;
  }
  if (body.find(':') == std::string::npos) return std::nullopt;
  return s;
}

std::optional<TorchtuneStep> torchtune_jsonl_step(const std::string& line) {
  const std::string t = trim(line);
  if (t.empty() || t[0] != '{') return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(t, nullptr, false);
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) return std::nullopt;
  TorchtuneStep s;
  s.step = j["step"].get<int64_t>();
  for (const char* key : kTorchtuneKeys)
    if (j.contains(key) && j[key].is_number() && std::isfinite(j[key].get<double>())) s.values[key] = j[key].get<double>();
  return s;
}

bool read_torchtune(const std::vector<std::string>& lines, const std::string& path, const RunLogOptions& o,
                    RunLog& log) {
  std::vector<TorchtuneStep> steps;
  bool jsonl = false;
  std::string unit_said;                // "GiB" or "GB", from "GPU peak memory allocation: 2.52 GiB"
  std::optional<int64_t> log_time;      // from log_<unix time>.txt
  static const std::regex said(R"(GPU peak memory (?:allocation|reserved|active): [0-9.]+ (GiB|GB)\b)");
  static const std::regex stamp(R"(log_(\d{9,11})\.(?:txt|jsonl))");
  std::smatch m;
  if (std::regex_search(path, m, stamp)) log_time = std::stoll(m[1].str());
  for (const auto& line : lines) {
    if (line.find("Step ") != std::string::npos) {
      if (auto s = torchtune_text_step(line)) {
        if (!s->values.empty()) steps.push_back(*s);
        continue;
      }
    }
    if (line.find("\"step\"") != std::string::npos) {
      if (auto s = torchtune_jsonl_step(line)) {
        if (!s->values.empty()) {
          jsonl = true;
          // DiskLogger.log (one metric per call) writes one line per metric: merge by step.
          if (!steps.empty() && steps.back().step == s->step)
            for (const auto& [k, v] : s->values) steps.back().values[k] = v;
          else
            steps.push_back(*s);
        }
        continue;
      }
    }
    if (unit_said.empty() && line.find("GPU peak memory") != std::string::npos && std::regex_search(line, m, said))
      unit_said = m[1].str();
    if (!log_time && line.find("log_") != std::string::npos && std::regex_search(line, m, stamp))
      log_time = std::stoll(m[1].str());
  }
  if (steps.empty()) return false;
  log.format = "torchtune-log";
  log.framework = "torchtune";
  log.steps_logged = static_cast<int64_t>(steps.size());
  std::vector<double> tps;
  bool any_memory = false;
  for (const auto& s : steps) {
    for (const auto& [k, v] : s.values) {
      if (k == "loss") log.loss.emplace_back(s.step, v);
      if (k == "tokens_per_second_per_gpu") tps.push_back(v);
      if (k.rfind("peak_memory_", 0) == 0) any_memory = true;
    }
  }
  if (!tps.empty()) {
    log.tokens_per_s_per_gpu = median_after_first(tps);
    log.notes.push_back("tokens_per_second_per_gpu: " + steps_phrase(tps.size()) +
                        "; torchtune counts the step's label tokens (labels != ignore_index), not padding "
                        "or masked prompt tokens, and divides by the world size");
  }
  log.notes.push_back("torchtune logs no step time (the step's duration only enters tokens_per_second_per_gpu)");
  if (any_memory) {
    std::string unit = o.torchtune_memory_unit;
    std::string why = "--torchtune-memory-unit " + unit;
    if (unit == "auto") {
      if (!unit_said.empty()) {
        unit = unit_said == "GiB" ? "gib" : "gb";
        why = "the log's memory-stats lines say " + unit_said;
      } else if (log_time && *log_time < kTorchtuneGibSince) {
        unit = "gb";
        why = "log_" + std::to_string(*log_time) + " was written before 2024-08-15 (torchtune PR #1348), when "
              "torchtune divided by 1e9";
      } else {
        unit = "gib";
        why = "assumed: torchtune divides by 1024**3 since PR #1348 (2024-08-15); --torchtune-memory-unit gb "
              "for logs of torchtune 0.2 and older";
      }
    }
    const double scale = unit == "gb" ? 1e9 : kGiB;
    for (const auto& s : steps) {
      for (const auto& [k, v] : s.values) {
        if (k == "peak_memory_alloc") keep_max(log.allocated_peak_bytes, v * scale);
        if (k == "peak_memory_reserved") keep_max(log.reserved_peak_bytes, v * scale);
        if (k == "peak_memory_active") keep_max(log.active_peak_bytes, v * scale);
      }
    }
    log.notes.push_back("peak_memory_*: the largest over " + std::to_string(steps.size()) +
                        " logged steps (torchtune resets the peaks at each log), in " +
                        (unit == "gb" ? "GB (1e9 bytes)" : "GiB (2^30 bytes)") + ": " + why);
  } else {
    log.notes.push_back("no peak_memory_* in the log (the recipe's log_peak_memory_stats was off)");
  }
  if (jsonl) log.notes.push_back("read as DiskLogger jsonl");
  log.notes.push_back("torchtune's metric log names no model, method or shape: the run is not checked against the "
                      "planned job");
  return true;
}

// ---------------------------------------------------------------------------------------------
// DeepSpeed's engine log (deepspeedai/DeepSpeed):
//  - deepspeed/runtime/utils.py see_memory_usage @03959e2b: "MA {memory_allocated/1024**3, 2
//    decimals} GB Max_MA {max_memory_allocated, 2 decimals} GB CA {memory_reserved, 2 decimals} GB
//    Max_CA {max_memory_reserved, rounded to a whole number} GB", then the peaks are reset;
//  - deepspeed/utils/timer.py ThroughputTimer.stop @038beb63: "epoch=E/micro_step=M/global_step=G,
//    RunningAvgSamplesPerSec=X, CurrSamplesPerSec=Y, MemAllocated=aGB, MaxMemAllocated=bGB" with
//    X = train_batch_size / mean step time since start_step (older releases: "E/S,
//    SamplesPerSec=X, MemAllocated=aGB, MaxMemAllocated=bGB"), a and b in 1024**3;
//  - wall_clock_breakdown: SynchronizedWallClockTimer.log "time (ms) | fwd: .. | bwd: .. |
//    bwd_inner: .. | bwd_allreduce: .. | step: .." at each gradient-accumulation boundary (the
//    global timers, reset at each log: one optimizer step), and "fwd_microstep: .." per micro-step.
bool read_deepspeed(const std::vector<std::string>& lines, RunLog& log) {
  static const std::regex see(R"(MA ([0-9.]+) GB\s+Max_MA ([0-9.]+) GB\s+CA ([0-9.]+) GB\s+Max_CA ([0-9.]+) GB)");
  static const std::regex running(R"(RunningAvgSamplesPerSec=([-+0-9.eE]+|inf|-inf|nan))");
  static const std::regex old_rate(R"((?:^|[ ,])SamplesPerSec=([-+0-9.eE]+))");
  static const std::regex max_alloc(R"(MaxMemAllocated=([0-9.]+)GB)");
  static const std::regex timer_pair(R"(\|\s*([A-Za-z_]+):\s*([-+0-9.eE]+))");
  int see_lines = 0, rate_lines = 0;
  std::optional<double> samples, ma, ca;
  std::vector<double> step_ms;
  std::smatch m;
  for (const auto& line : lines) {
    if (line.find("Max_MA") != std::string::npos && std::regex_search(line, m, see)) {
      ++see_lines;
      for (int g : {1, 2})
        if (auto v = to_number(m[g].str())) keep_max(ma, *v);
      for (int g : {3, 4})
        if (auto v = to_number(m[g].str())) keep_max(ca, *v);
      continue;
    }
    if (line.find("SamplesPerSec=") != std::string::npos) {
      std::optional<double> rate;
      if (std::regex_search(line, m, running)) rate = to_number(m[1].str());
      else if (std::regex_search(line, m, old_rate)) rate = to_number(m[1].str());
      if (rate && *rate > 0) {
        samples = rate;  // a running average: the last one covers the most steps
        ++rate_lines;
      }
      if (std::regex_search(line, m, max_alloc))
        if (auto v = to_number(m[1].str())) keep_max(ma, *v);
      continue;
    }
    const size_t t = line.find("time (ms)");
    if (t != std::string::npos) {
      std::map<std::string, double> timers;
      const std::string rest = line.substr(t);
      for (auto it = std::sregex_iterator(rest.begin(), rest.end(), timer_pair); it != std::sregex_iterator(); ++it)
        if (auto v = to_number((*it)[2].str())) timers[(*it)[1].str()] = *v;
      if (timers.count("fwd") && timers.count("bwd") && timers.count("step"))
        step_ms.push_back(timers["fwd"] + timers["bwd"] + timers["step"]);
    }
  }
  if (see_lines == 0 && rate_lines == 0 && step_ms.empty()) return false;
  log.format = "deepspeed-log";
  log.framework = "deepspeed";
  if (ma) log.allocated_peak_bytes = *ma * kGiB;
  if (ca) log.reserved_peak_bytes = *ca * kGiB;
  if (see_lines)
    log.notes.push_back("memory: the largest of " + std::to_string(see_lines) +
                        " see_memory_usage lines (GB there is 2^30 bytes; MA/Max_MA/CA to 0.01, Max_CA rounded to a "
                        "whole GiB by DeepSpeed, so reserved is the larger of CA and Max_CA)");
  if (samples) {
    log.samples_per_s = samples;
    log.notes.push_back("samples/s: the last of " + std::to_string(rate_lines) +
                        " ThroughputTimer lines (a running average over the steps since start_step, all ranks)");
  }
  if (!step_ms.empty()) {
    log.step_time_s = median_after_first(step_ms) / 1000.0;
    log.notes.push_back("step_time_s: fwd + bwd + step of the wall_clock_breakdown lines, " +
                        steps_phrase(step_ms.size()) + " (data loading not included)");
  }
  log.notes.push_back("DeepSpeed's log names no model or shape: the run is not checked against the planned job");
  return true;
}

// ---------------------------------------------------------------------------------------------
// accelerate's peak-memory example and the PEFT examples copied from it
// (huggingface/accelerate examples/by_feature/fsdp_with_peak_mem_tracking.py @13e79ccf,
// TorchTracemalloc): "Total Peak Memory consumed during the train (max): {peaked + b2mb(begin)}"
// ("GPU Total Peak ..." in PEFT's copies) with b2mb(x) = int(x / 2**20) and peak =
// torch.cuda.max_memory_allocated() over the epoch's training loop. accelerate logs no throughput.
bool read_accelerate(const std::vector<std::string>& lines, RunLog& log) {
  static const std::regex total(R"((?:^|[^A-Za-z])Total Peak Memory consumed during the train \(max\): (\d+))");
  int n = 0;
  std::optional<double> mib;
  std::smatch m;
  for (const auto& line : lines) {
    if (line.find("Total Peak Memory consumed during the train") == std::string::npos) continue;
    if (line.find("CPU Total Peak") != std::string::npos) continue;
    if (std::regex_search(line, m, total))
      if (auto v = to_number(m[1].str())) {
        keep_max(mib, *v);
        ++n;
      }
  }
  if (!n) return false;
  log.format = log.format.empty() ? "accelerate-log" : log.format + "+accelerate-log";
  log.allocated_peak_bytes = std::max(log.allocated_peak_bytes.value_or(0.0), *mib * kMiB);
  log.notes.push_back("allocated: the largest of " + std::to_string(n) +
                      " TorchTracemalloc \"Total Peak Memory consumed during the train (max)\" lines (whole MiB, "
                      "rounded down; torch.cuda.max_memory_allocated over each epoch's training loop)");
  return true;
}

// ---------------------------------------------------------------------------------------------
// Plain CSV or JSON with the documented columns (README, "Run logs"): anything else that records
// step time and torch.cuda.max_memory_allocated/reserved.
enum class Col { step, loss, step_time_s, tokens_per_s, tokens_per_s_per_gpu, samples_per_s, allocated, reserved,
                 active, device, rank };
struct ColumnSpec {
  const char* name;
  Col col;
  double scale;  // to bytes, for memory columns
};
const ColumnSpec kColumns[] = {
    {"step", Col::step, 1},
    {"loss", Col::loss, 1},
    {"step_time_s", Col::step_time_s, 1},
    {"tokens_per_s", Col::tokens_per_s, 1},
    {"tokens_per_s_per_gpu", Col::tokens_per_s_per_gpu, 1},
    {"samples_per_s", Col::samples_per_s, 1},
    {"max_memory_allocated_bytes", Col::allocated, 1},
    {"max_memory_allocated_gib", Col::allocated, kGiB},
    {"max_memory_reserved_bytes", Col::reserved, 1},
    {"max_memory_reserved_gib", Col::reserved, kGiB},
    {"max_memory_active_bytes", Col::active, 1},
    {"max_memory_active_gib", Col::active, kGiB},
    {"device_memory_bytes", Col::device, 1},
    {"device_memory_gib", Col::device, kGiB},
    {"rank", Col::rank, 1},
};

const ColumnSpec* column(const std::string& name) {
  for (const auto& c : kColumns)
    if (name == c.name) return &c;
  return nullptr;
}

std::string column_names() {
  std::string s;
  for (const auto& c : kColumns) s += (s.empty() ? "" : ", ") + std::string(c.name);
  return s;
}

using Row = std::vector<std::pair<const ColumnSpec*, double>>;

void read_plain_rows(const std::vector<Row>& rows, RunLog& log) {
  std::vector<double> times, tps, tps_gpu, sps;
  std::set<int64_t> ranks;
  int64_t index = 0;
  for (const auto& row : rows) {
    ++index;
    std::optional<int64_t> step;
    std::optional<double> loss;
    for (const auto& [c, v] : row) {
      switch (c->col) {
        case Col::step: if (v < 1e15) step = static_cast<int64_t>(v); break;
        case Col::loss: loss = v; break;
        case Col::step_time_s: times.push_back(v); break;
        case Col::tokens_per_s: tps.push_back(v); break;
        case Col::tokens_per_s_per_gpu: tps_gpu.push_back(v); break;
        case Col::samples_per_s: sps.push_back(v); break;
        case Col::allocated: keep_max(log.allocated_peak_bytes, v * c->scale); break;
        case Col::reserved: keep_max(log.reserved_peak_bytes, v * c->scale); break;
        case Col::active: keep_max(log.active_peak_bytes, v * c->scale); break;
        case Col::device: keep_max(log.device_peak_bytes, v * c->scale); break;
        case Col::rank: if (v < 1e15) ranks.insert(static_cast<int64_t>(v)); break;
      }
    }
    if (loss) log.loss.emplace_back(step.value_or(index), *loss);
  }
  log.steps_logged = static_cast<int64_t>(rows.size());
  if (!times.empty()) {
    log.step_time_s = median_after_first(times);
    log.notes.push_back("step_time_s: " + steps_phrase(times.size()));
  }
  if (!tps.empty()) {
    log.tokens_per_s = median_after_first(tps);
    log.notes.push_back("tokens_per_s: " + steps_phrase(tps.size()));
  }
  if (!tps_gpu.empty()) log.tokens_per_s_per_gpu = median_after_first(tps_gpu);
  if (!sps.empty()) log.samples_per_s = median_after_first(sps);
  if (log.allocated_peak_bytes || log.reserved_peak_bytes || log.device_peak_bytes)
    log.notes.push_back("memory: the largest value over " + std::to_string(rows.size()) + " row(s)" +
                        (ranks.size() > 1 ? " and " + std::to_string(ranks.size()) + " ranks (the most loaded rank)"
                                          : ""));
}

// A header line of column names, at least one of them documented; nullopt when the text is no CSV.
bool read_plain_csv(const std::vector<std::string>& lines, const std::string& path, RunLog& log) {
  size_t first = 0;
  while (first < lines.size() && trim(lines[first]).empty()) ++first;
  if (first == lines.size()) return false;
  std::vector<std::string> header;
  {
    std::istringstream in(lines[first]);
    std::string cell;
    while (std::getline(in, cell, ',')) header.push_back(trim(cell));
  }
  static const std::regex ident(R"([A-Za-z_][A-Za-z0-9_]*)");
  std::vector<const ColumnSpec*> cols;
  std::vector<std::string> unknown;
  for (const auto& h : header) {
    if (!std::regex_match(h, ident)) return false;
    cols.push_back(column(h));
    if (!cols.back()) unknown.push_back(h);
  }
  if (std::all_of(cols.begin(), cols.end(), [](const ColumnSpec* c) { return c == nullptr; })) return false;
  if (!unknown.empty()) {
    std::string u;
    for (const auto& n : unknown) u += (u.empty() ? "" : ", ") + n;
    fail_input(path + ": unknown column(s) " + u + " in a plain CSV run log (known: " + column_names() + ")");
  }
  std::vector<Row> rows;
  for (size_t i = first + 1; i < lines.size(); ++i) {
    if (trim(lines[i]).empty()) continue;
    std::vector<std::string> cells;
    std::istringstream in(lines[i]);
    std::string cell;
    while (std::getline(in, cell, ',')) cells.push_back(trim(cell));
    if (!lines[i].empty() && lines[i].back() == ',') cells.push_back("");
    if (cells.size() != cols.size())
      fail_input(path + ": line " + std::to_string(i + 1) + " has " + std::to_string(cells.size()) + " fields, the header " +
                 std::to_string(cols.size()));
    Row row;
    for (size_t k = 0; k < cells.size(); ++k) {
      if (cells[k].empty()) continue;
      const auto v = to_number(cells[k]);
      if (!v || *v < 0)
        fail_input(path + ": line " + std::to_string(i + 1) + ", " + cols[k]->name + ": expected a finite number >= 0, got \"" +
                   cells[k] + "\"");
      row.emplace_back(cols[k], *v);
    }
    rows.push_back(row);
  }
  log.format = "plain-csv";
  read_plain_rows(rows, log);
  log.notes.push_back("a plain CSV names no model or shape: the run is not checked against the planned job");
  return true;
}

Row json_row(const nlohmann::json& o, const std::string& where) {
  Row row;
  for (const auto& [k, v] : o.items()) {
    const ColumnSpec* c = column(k);
    if (!c) fail_input(where + ": unknown key \"" + k + "\" (known: " + column_names() + ")");
    if (v.is_null()) continue;
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
      fail_input(where + ": " + k + ": expected a finite number >= 0");
    row.emplace_back(c, v.get<double>());
  }
  return row;
}

bool is_plain_json(const nlohmann::json& j) {
  auto has_column = [](const nlohmann::json& o) {
    if (!o.is_object()) return false;
    for (const auto& [k, v] : o.items())
      if (column(k)) return true;
    return false;
  };
  if (j.is_array()) return !j.empty() && has_column(j[0]);
  return j.is_object() && (has_column(j) || (j.contains("steps") && j["steps"].is_array()));
}

void read_plain_json(const nlohmann::json& j, const std::string& path, RunLog& log) {
  log.format = "plain-json";
  std::vector<Row> rows;
  if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) {
      if (!j[i].is_object()) fail_input(path + ": [" + std::to_string(i) + "]: expected an object of columns");
      rows.push_back(json_row(j[i], path + ": [" + std::to_string(i) + "]"));
    }
  } else {
    nlohmann::json summary = nlohmann::json::object();
    for (const auto& [k, v] : j.items()) {
      if (k == "job" || k == "candidate") {
        if (!v.is_object()) fail_input(path + ": " + k + ": expected an object of ftplan job keys");
        (k == "job" ? log.job : log.candidate) = v;
      } else if (k == "world_size") {
        if (!v.is_number_integer() || v.get<int64_t>() < 1) fail_input(path + ": world_size: expected an integer >= 1");
        log.world_size = v.get<int64_t>();
      } else if (k == "framework") {
        if (!v.is_string()) fail_input(path + ": framework: expected a profile name, e.g. \"hf\"");
        log.framework = v.get<std::string>();
      } else if (k == "format") {
        if (!v.is_string()) fail_input(path + ": format: expected a string");
      } else if (k == "steps") {
        if (!v.is_array()) fail_input(path + ": steps: expected an array of rows");
        for (size_t i = 0; i < v.size(); ++i) {
          if (!v[i].is_object()) fail_input(path + ": steps[" + std::to_string(i) + "]: expected an object of columns");
          rows.push_back(json_row(v[i], path + ": steps[" + std::to_string(i) + "]"));
        }
      } else {
        if (!column(k))
          fail_input(path + ": unknown key \"" + k + "\" (known: job, candidate, world_size, framework, format, steps, " +
                     column_names() + ")");
        summary[k] = v;
      }
    }
    if (!summary.empty()) rows.insert(rows.begin(), json_row(summary, path));
  }
  read_plain_rows(rows, log);
  if (log.job.is_null() && log.candidate.is_null())
    log.notes.push_back("no \"job\" in the file: the run is not checked against the planned job");
}

std::string pick_most_loaded_reason(const RunLog& r) {
  if (r.reserved_peak_bytes) return "reserved " + format_bytes(*r.reserved_peak_bytes);
  if (r.allocated_peak_bytes) return "allocated " + format_bytes(*r.allocated_peak_bytes);
  if (r.device_peak_bytes) return "device " + format_bytes(*r.device_peak_bytes);
  return "no memory figure";
}

double load_of(const RunLog& r) {
  if (r.reserved_peak_bytes) return *r.reserved_peak_bytes;
  if (r.allocated_peak_bytes) return *r.allocated_peak_bytes;
  if (r.device_peak_bytes) return *r.device_peak_bytes;
  return -1;
}

}  // namespace

RunLog parse_run_log(const std::string& raw, const std::string& path, const RunLogOptions& options) {
  if (options.torchtune_memory_unit != "auto" && options.torchtune_memory_unit != "gib" &&
      options.torchtune_memory_unit != "gb")
    fail_input("--torchtune-memory-unit: expected auto, gib or gb, got \"" + options.torchtune_memory_unit + "\"");
  std::string text = raw;
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) text.erase(0, 3);  // UTF-8 byte-order mark
  RunLog log;
  log.path = path;
  const std::string head = trim(text.substr(0, 4096));
  const std::vector<std::string> lines = split_lines(text);
  if (head.empty()) fail_input(path + ": empty file: not a run log");

  // One JSON document: ftexec's measured.json, HF's trainer_state.json or the plain JSON.
  std::string json_error;
  if (head[0] == '{' || head[0] == '[') {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      json_error = e.what();
    }
    if (json_error.empty()) {
      if (j.is_object() && ((j.contains("format") && j["format"].is_string() &&
                             j["format"].get<std::string>().rfind("ftexec-measured", 0) == 0) ||
                            (j.contains("ranks") && j["ranks"].is_array()))) {
        log.format = "ftexec-measured/1";
        log.framework = j.contains("framework") && j["framework"].is_string() ? j["framework"].get<std::string>() : "ftexec";
        log.measured = j;
        return log;
      }
      if (is_hf_trainer_state(j)) {
        read_hf_trainer_state(j, log);
      } else if (is_plain_json(j)) {
        read_plain_json(j, path, log);
      } else {
        fail_input(path + ": a JSON file of no known run-log format (not ftexec's measured.json, an HF trainer_state.json "
                   "with log_history and global_step, or the plain JSON columns: " + column_names() + ")");
      }
      finish(log);
      return log;
    }
  }

  // Text logs (torchtune's jsonl is one object per line; DeepSpeed's lines start with "[date]"):
  // torchtune's metric lines, DeepSpeed's and accelerate's lines (a captured stdout may hold more
  // than one), else the plain CSV.
  const bool torchtune = read_torchtune(lines, path, options, log);
  if (!torchtune) read_deepspeed(lines, log);
  read_accelerate(lines, log);
  if (log.format.empty() && !read_plain_csv(lines, path, log)) {
    if (head[0] == '{') fail_input(path + ": malformed JSON (" + json_error.substr(json_error.find(']') + 2) + ")");
    fail_input(path + ": unknown run-log format (not ftexec's measured.json, an HF trainer_state.json, a torchtune "
               "metric log, DeepSpeed's or accelerate's log lines, or a plain CSV/JSON with the documented columns)");
  }
  finish(log);
  return log;
}

RunLog read_run_log(const std::string& path, const RunLogOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_input(path + ": cannot open file");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) fail_input(path + ": cannot read file");
  const std::string s = text.str();
  if (s.find('\0') != std::string::npos) fail_input(path + ": a binary file, not a run log");
  return parse_run_log(s, path, options);
}

RunLog merge_rank_logs(const std::vector<RunLog>& ranks) {
  if (ranks.empty()) fail_input("--ranks: no run logs");
  for (const auto& r : ranks)
    if (r.format == "ftexec-measured/1")
      fail_input(r.path + ": ftexec's measured.json already holds every rank: give it alone, without --ranks");
  size_t busiest = 0;
  for (size_t i = 1; i < ranks.size(); ++i)
    if (load_of(ranks[i]) > load_of(ranks[busiest])) busiest = i;
  RunLog out = ranks[busiest];
  out.notes.clear();
  out.notes.push_back("--ranks: " + std::to_string(ranks.size()) + " logs of one job; memory of the most loaded rank, " +
                      out.path + " (" + pick_most_loaded_reason(out) + ")");
  for (const auto& r : ranks)
    for (const auto& n : r.notes) out.notes.push_back(r.path + ": " + n);
  std::string slowest;
  for (const auto& r : ranks) {
    if (r.step_time_s && (!out.step_time_s || *r.step_time_s > *out.step_time_s)) {
      out.step_time_s = r.step_time_s;
      slowest = r.path;
    }
    if (!out.tokens_per_s && r.tokens_per_s) out.tokens_per_s = r.tokens_per_s;
    if (!out.tokens_per_s_per_gpu && r.tokens_per_s_per_gpu) out.tokens_per_s_per_gpu = r.tokens_per_s_per_gpu;
    if (!out.samples_per_s && r.samples_per_s) out.samples_per_s = r.samples_per_s;
    if (out.loss.empty() && !r.loss.empty()) out.loss = r.loss;
    if (out.job.is_null() && !r.job.is_null()) out.job = r.job;
    if (out.candidate.is_null() && !r.candidate.is_null()) out.candidate = r.candidate;
  }
  if (!slowest.empty() && slowest != out.path) out.notes.push_back("step_time_s of the slowest rank, " + slowest);
  finish(out);
  return out;
}

}  // namespace ftplan

// One table of every input a job can have: its job-file key, its flag, its type, range and unit.
// Job files (configs/jobs/*.json and a plan's "job"), ftplan's flags and ftexec's flags all read
// through it, so a value is accepted or refused the same way wherever it is given, and every refusal
// is one line that names the field ("job.json: seq_len: ..." or "--seq-len: ...").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "planner/hardware_spec.h"
#include "planner/model_spec.h"
#include "planner/training_setup.h"

namespace ftplan {

enum class FieldType { integer, number, text, choice, boolean, list, ignored };

// Where a field may be given (a bit mask).
enum FieldPlace : unsigned {
  kInJobFile = 1,    // configs/jobs/X.json, a plan's "job"
  kFtplanFlag = 2,   // ftplan memory/plan/check/sweep/simulate
  kFtexecFlag = 4,   // ftexec run
  kCheckFlag = 8,    // ftplan check: the limits a plan is judged against
  kSweepFlag = 16,   // ftplan sweep: the limits rows are filtered by
};

struct FieldSpec {
  const char* key;       // job-file key, dotted when nested ("lora.rank"); "" when flag-only
  const char* flag;      // e.g. "--lora-rank"; "" when file-only
  FieldType type;
  double min, max;       // integer and number: the range, e.g. 1 .. 1048576
  bool min_open, max_open;  // exclusive bounds, e.g. (0, 10] for the learning rate
  const char* unit;      // e.g. "samples per GPU", "tokens", "fraction of GPU memory"
  const char* choices;   // choice: "full|lora|qlora"; else ""
  const char* help;      // one line for --help
  unsigned places;       // FieldPlace bits
};

const std::vector<FieldSpec>& field_table();
// The spec of a key or flag; std::logic_error when absent (a programming error, not bad input).
const FieldSpec& field_by_key(const std::string& key);
const FieldSpec& field_by_flag(const std::string& flag);

// "[1, 1048576] samples per GPU", "(0, 10]", "full|lora|qlora": for --help and for errors.
std::string field_range_text(const FieldSpec& f);

// A value checked against its spec; `name` is how an error names it ("job.json: seq_len", "--seq-len").
// Numbers must be finite and in range; integers must be whole.
int64_t field_int(const FieldSpec& f, const nlohmann::json& value, const std::string& name);
double field_number(const FieldSpec& f, const nlohmann::json& value, const std::string& name);
std::string field_text(const FieldSpec& f, const nlohmann::json& value, const std::string& name);
bool field_bool(const FieldSpec& f, const nlohmann::json& value, const std::string& name);

// A flag's text as the JSON value a job file would hold: integers and numbers parsed strictly (all of
// the text, finite, no overflow: "1e400", "nan", "12abc" are errors naming the flag), booleans
// true/false/1/0, lists and text as given. The value is not range-checked yet (field_int does it).
nlohmann::json field_value_from_text(const FieldSpec& f, const std::string& text, const std::string& name);

// Applies one job field (kInJobFile) to the setup: the one place each field lands.
void apply_job_field(TrainingSetup& setup, const FieldSpec& f, const nlohmann::json& value, const std::string& name);

// What the model decides for the job, applied once after the model is loaded (before validate_job):
// "all-linear" becomes the model's own block linears (Phi-3: qkv_proj, o_proj, gate_up_proj, down_proj),
// a job that names no targets gets the family's PEFT default, and LoRA on a quantized base
// (quantization_config) is planned as QLoRA of the stored format (bitsandbytes' double quantisation as the
// config says).
void apply_model(TrainingSetup& setup, const ModelSpec& model);

// The checks that need the whole job and its model, every problem at once in one InputError:
// LoRA rank <= hidden size, tokens per micro-batch <= 2^32, a pipeline's stages <= layers, dataset
// mean row length <= seq_len ... `where` prefixes the message (a file name, or "" for flags).
void validate_job(const TrainingSetup& setup, const ModelSpec& model, const std::string& where = "");

// The job's topology on its hardware: --gpus-per-node overrides the hwdb entry's GPUs per node (at
// most its topology's GPUs), --nodes sets gpus = nodes x gpus-per-node (a --gpus that disagrees is an
// InputError naming both).
void apply_topology(TrainingSetup& setup, HardwareSpec& hw);

// A fixed layout (--strategy or --parallel) checked against the job: degrees multiplying to the GPU
// count, tp dividing the heads, pp within the layers, cp splitting the sequence ... every problem
// naming its operands, in one InputError (exit 2). `where` prefixes the message.
void validate_layout(const TrainingSetup& setup, const ModelSpec& model, const HardwareSpec& hw,
                     const std::string& where = "");

// What ftexec cannot run (an optimizer other than AdamW, fp32 gradient accumulation, a paged
// optimizer, a sequence beyond the model's positions, a --parallel layout it cannot run): one line
// each, empty when it can run it.
std::vector<std::string> exec_problems(const TrainingSetup& setup, const ModelSpec& model);

// The fields of a valid parallel layout (parallelism_problems) that ftexec cannot run yet, each
// naming the field and its value, e.g. "tp(2) > 1: ftexec has no tensor parallelism yet". It runs
// every preset, and any layout of replicas (dp_replicate), ZeRO-1/2 over all ranks (dp_shard,
// offload_optimizer at stage 2), stage 3 over dp_shard x dp_replicate (ZeRO-3 or FSDP,
// reshard_after_forward, offload of parameters with the optimizer), or a pipeline alone (pp,
// schedule naive|gpipe|1f1b).
std::vector<std::string> exec_layout_problems(const Parallelism& p);

}  // namespace ftplan

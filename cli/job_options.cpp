#include "cli/job_options.h"

#include <nlohmann/json.hpp>

#include "planner/data_paths.h"
#include "planner/errors.h"
#include "planner/json_fields.h"

namespace ftplan::cli {
namespace {

int64_t positive(const std::optional<int64_t>& v, const char* flag, int64_t max_value = INT64_C(1) << 40) {
  if (*v < 1) fail_input(std::string(flag) + ": " + std::to_string(*v) + " must be at least 1");
  if (*v > max_value) fail_input(std::string(flag) + ": " + std::to_string(*v) + " is absurdly large");
  return *v;
}

}  // namespace

void add_job_options(CLI::App& app, JobOptions& o) {
  app.add_option("job", o.job_file, "Job file (configs/jobs/X.json); flags override its fields");
  app.add_option("--model", o.model, "Model: short name (llama-3-8b) or path of a Hugging Face config.json");
  app.add_option("--method", o.method, "full | lora | qlora");
  app.add_option("--lora-rank", o.lora_rank, "LoRA rank r (default 16)");
  app.add_option("--lora-alpha", o.lora_alpha, "LoRA alpha (default 2r)");
  app.add_option("--lora-dropout", o.lora_dropout, "LoRA dropout (default 0)");
  app.add_option("--lora-targets", o.lora_targets, "q_proj,v_proj (default) | all-linear | a list");
  app.add_option("--gpu", o.gpu, "GPU id from hwdb/ (a100-80gb-sxm, h100-sxm, rtx-3090, ...)");
  app.add_option("--gpus", o.gpus, "Number of GPUs (default 1)");
  app.add_option("--seq-len", o.seq_len, "Sequence length in tokens (default 2048)");
  app.add_option("--micro-batch", o.micro_batch, "Samples per GPU per micro-batch");
  app.add_option("--grad-accum", o.grad_accum, "Micro-batches per optimizer step (pipeline: micro-batches)");
  app.add_option("--checkpointing", o.checkpointing, "none | full");
  app.add_option("--attention", o.attention, "fused (SDPA/flash) | eager");
  app.add_option("--precision", o.precision, "mixed | mixed-fp32-grads | bf16 | fp32");
  app.add_option("--optimizer", o.optimizer, "adamw | adamw8bit | sgd");
  app.add_flag("--paged-optimizer", o.paged_optimizer, "Optimizer states paged to host memory (bitsandbytes)");
  app.add_option("--strategy", o.strategy, "Fix the strategy (single, mp, pipeline, ddp, zero1, ..., fsdp)");
  app.add_option("--headroom", o.headroom, "Fraction of GPU memory kept free (default 0.05)");
  app.add_option("--efficiency", o.efficiency, "Achieved fraction of peak FLOP/s (default: from hwdb)");
  app.add_option("--epochs", o.epochs, "Epochs over the dataset (default 1)");
  app.add_option("--dataset-rows", o.dataset_rows, "Rows in the dataset");
  app.add_option("--mean-tokens-per-row", o.mean_tokens, "Mean tokens per row (default: seq-len)");
  app.add_option("--dataset-tokens", o.dataset_tokens, "Tokens in the dataset (instead of rows)");
  app.add_flag("--json", o.json, "Print JSON instead of a table");
}

LoadedJob load_job(const JobOptions& o) {
  TrainingSetup s;
  if (!o.job_file.empty()) {
    std::string path = resolve_data_file(o.job_file, "configs/jobs", "job");
    s = training_setup_from_json(read_json_file(path), path);
  } else if (!o.model) {
    fail_input("--model: required (or give a job file)");
  }
  if (o.model) s.model = *o.model;
  if (o.method) s.method = parse_method(*o.method, "--method");
  if (o.lora_rank) {
    s.lora.rank = positive(o.lora_rank, "--lora-rank", 1 << 16);
    if (!o.lora_alpha) s.lora.alpha = 2.0 * s.lora.rank;
  }
  if (o.lora_alpha) s.lora.alpha = *o.lora_alpha;
  if (o.lora_dropout) {
    if (!(*o.lora_dropout >= 0 && *o.lora_dropout < 1)) fail_input("--lora-dropout: must be in [0, 1)");
    s.lora.dropout = *o.lora_dropout;
  }
  if (o.lora_targets) s.lora.targets = parse_lora_targets(*o.lora_targets, "--lora-targets");
  if (o.gpu) s.gpu = *o.gpu;
  if (o.gpus) s.num_gpus = positive(o.gpus, "--gpus", 1 << 20);
  if (o.seq_len) s.seq_len = positive(o.seq_len, "--seq-len", 1 << 24);
  if (o.micro_batch) s.micro_batch = positive(o.micro_batch, "--micro-batch", 1 << 20);
  if (o.grad_accum) s.grad_accum = positive(o.grad_accum, "--grad-accum", 1 << 20);
  if (o.checkpointing) s.checkpointing = parse_checkpointing(*o.checkpointing, "--checkpointing");
  if (o.attention) s.attention = parse_attention(*o.attention, "--attention");
  if (o.precision) s.precision = parse_precision(*o.precision, "--precision");
  if (o.optimizer) s.optimizer = parse_optimizer(*o.optimizer, "--optimizer");
  if (o.paged_optimizer) s.paged_optimizer = true;
  if (o.strategy) s.strategy = parse_strategy(*o.strategy, "--strategy");
  if (o.headroom) {
    if (!(*o.headroom >= 0 && *o.headroom < 0.9)) fail_input("--headroom: must be in [0, 0.9)");
    s.headroom_fraction = *o.headroom;
  }
  if (o.efficiency) {
    if (!(*o.efficiency > 0 && *o.efficiency <= 1)) fail_input("--efficiency: must be in (0, 1]");
    s.efficiency = *o.efficiency;
  }
  if (o.epochs) s.epochs = positive(o.epochs, "--epochs", 1 << 20);
  if (o.dataset_rows) {
    s.dataset.rows = positive(o.dataset_rows, "--dataset-rows");
    s.dataset.tokens = 0;
  }
  if (o.mean_tokens) s.dataset.mean_tokens_per_row = positive(o.mean_tokens, "--mean-tokens-per-row", 1 << 24);
  if (o.dataset_tokens) {
    s.dataset.tokens = positive(o.dataset_tokens, "--dataset-tokens", INT64_C(1) << 50);
    s.dataset.rows = 0;
  }

  LoadedJob job;
  job.model = load_model(s.model);
  job.hardware = load_hardware(s.gpu);
  if (s.method != Method::full && s.lora.rank > job.model.hidden_size)
    fail_input("--lora-rank: " + std::to_string(s.lora.rank) + " exceeds hidden_size " +
               std::to_string(job.model.hidden_size));
  // Tokens per micro-batch beyond 2^32 would overflow the byte counts: reject as absurd.
  if (static_cast<double>(s.micro_batch.value_or(1)) * s.seq_len > 4294967296.0)
    fail_input("--micro-batch: " + std::to_string(s.micro_batch.value_or(1)) + " x --seq-len " +
               std::to_string(s.seq_len) + " tokens per micro-batch is absurd (limit 2^32)");
  job.setup = s;
  return job;
}

}  // namespace ftplan::cli

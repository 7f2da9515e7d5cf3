// ftexec: run a fine-tuning plan for real with LibTorch and measure it, on one device or several ranks.
//   ftexec run plan.json --out measured.json          the plan `ftplan plan -o plan.json` wrote
//   ftexec run --model tiny-test --method lora --steps 30 --device cpu --out m.json
//   ftexec run plan.json --nproc 4 --out m.json       starts 4 local ranks (strategy from the plan)
//   torchrun --nproc-per-node 4 --no-python ftexec run plan.json --out m.json   (or srun, mpirun)
// Flags override the plan's values. Exit codes: 0 ok, 2 bad input, 3 runtime failure (OOM, ...);
// on failure nothing is written.
#include <unistd.h>

#include <iostream>
#include <optional>

#include <CLI/CLI.hpp>

#include "executor/checkpoint.h"
#include "executor/dist_run.h"
#include "executor/exec_job.h"
#include "executor/launch.h"
#include "executor/run_job.h"
#include "planner/errors.h"
#include "planner/json_fields.h"

namespace {

struct RunOptions {
  std::string plan_file;
  std::string out;
  std::optional<std::string> model, method, lora_targets, checkpointing, attention, precision, device, data, gpu, strategy;
  std::optional<int64_t> lora_rank, seq_len, micro_batch, grad_accum, steps, seed;
  std::optional<double> lr, lora_alpha, lora_dropout;
  int64_t warmup = 1;
  int64_t threads = 0;
  double max_grad_norm = 1.0;
  double weight_decay = 0.0;
  double cpu_memory_limit_gib = 0;
  std::string save, load_weights;
  bool no_progress = false;
  int nproc = 0;                  // local ranks to start; 0: none (single device, or under torchrun/srun/mpirun)
  std::optional<int64_t> keep_last;  // --keep-last N, e.g. 3 (N >= 1); absent: keep every checkpoint
  ftexec::DistOptions dist;
};

void setup_run(CLI::App& app, RunOptions& o) {
  auto* run = app.add_subcommand("run", "Train a plan (or a job given by flags) and write measured.json");
  run->add_option("plan", o.plan_file, "plan.json written by `ftplan plan -o` (optional)");
  run->add_option("-o,--out", o.out, "where to write measured.json (atomically)");
  run->add_option("--model", o.model, "model config: short name (configs/models) or config.json path");
  run->add_option("--method", o.method, "full | lora | qlora (NF4 block linears + LoRA)");
  run->add_option("--lora-rank", o.lora_rank, "LoRA rank r, e.g. 16");
  run->add_option("--lora-alpha", o.lora_alpha, "LoRA alpha, e.g. 32");
  run->add_option("--lora-dropout", o.lora_dropout, "LoRA dropout, e.g. 0.05");
  run->add_option("--lora-targets", o.lora_targets, "q_proj,v_proj | all-linear | a comma list");
  run->add_option("--seq-len", o.seq_len, "tokens per sample, e.g. 2048");
  run->add_option("--micro-batch", o.micro_batch, "samples per micro-batch, e.g. 4");
  run->add_option("--grad-accum", o.grad_accum, "micro-batches per optimizer step");
  run->add_option("--checkpointing", o.checkpointing, "none | full");
  run->add_option("--attention", o.attention, "eager | fused (SDPA, libtorch >= 2.1)");
  run->add_option("--precision", o.precision, "fp32 | bf16 | mixed (bf16 compute, fp32 master weights)");
  run->add_option("--steps", o.steps, "optimizer steps");
  run->add_option("--lr", o.lr, "AdamW learning rate");
  run->add_option("--seed", o.seed, "seed for the initial weights, adapters and synthetic data");
  run->add_option("--data", o.data, "synthetic | PATH.jsonl (input_ids per line) | PATH.bin (uint32 tokens)");
  run->add_option("--device", o.device, "cpu | cuda | cuda:N");
  run->add_option("--gpu", o.gpu, "hwdb id for the MFU's peak FLOP/s on CUDA, e.g. h100-sxm");
  run->add_option("--warmup", o.warmup, "steps left out of the timings")->capture_default_str();
  run->add_option("--threads", o.threads, "intra-op threads (0: all cores)")->capture_default_str();
  run->add_option("--max-grad-norm", o.max_grad_norm, "gradient clipping (0: off)")->capture_default_str();
  run->add_option("--weight-decay", o.weight_decay, "AdamW weight decay")->capture_default_str();
  run->add_option("--cpu-memory-limit-gib", o.cpu_memory_limit_gib, "fail CPU allocations beyond this (0: none)");
  run->add_option("--save", o.save, "write the adapter (PEFT) or full weights (safetensors) to DIR");
  run->add_option("--load-weights", o.load_weights, "HF safetensors: file, folder or model.safetensors.index.json");
  run->add_flag("--no-progress", o.no_progress, "no progress bar even on a terminal");
  run->add_option("--strategy", o.strategy,
                  "single | ddp | zero1 | zero2 | zero2_offload | zero3 | zero3_offload | fsdp | fsdp_shard_grad_op | "
                  "fsdp_hybrid | mp | pipeline (GPipe) | pipeline_1f1b");
  run->add_option("--nproc", o.nproc, "start N local ranks (Gloo on CPU); under torchrun/srun/mpirun leave it out");
  run->add_option("--timeout-s", o.dist.timeout_s, "collective and rendezvous timeout in seconds")->capture_default_str();
  run->add_option("--fault-inject", o.dist.fault_inject, "debug: RANK:STEP:kill|hang|exit|throw[,...]");
  run->add_option("--checkpoint-dir", o.dist.checkpoint_dir, "write sharded checkpoints to DIR (distributed runs)");
  run->add_option("--checkpoint-every", o.dist.checkpoint_every, "steps between checkpoints (0: one at the end)")
      ->capture_default_str();
  run->add_option("--keep-last", o.keep_last, "keep the newest N complete checkpoints, remove older ones (default: all)");
  run->add_flag("--resume", o.dist.resume,
                "continue from the newest complete checkpoint in --checkpoint-dir (its manifest and checksums verified)");
  run->add_option("--bucket-mb", o.dist.ddp_bucket_mb, "DDP gradient bucket size in MiB")->capture_default_str();
  run->add_option("--zero-bucket-elements", o.dist.zero_bucket_elements, "ZeRO-1/2 reduce bucket in elements")
      ->capture_default_str();
  run->add_option("--shard-group-size", o.dist.shard_group_size,
                  "fsdp_hybrid: ranks per shard group (0: gpus_per_node of the --gpu hwdb entry)")
      ->capture_default_str();
  run->add_option("--backend", o.dist.backend, "auto (nccl on CUDA, gloo on CPU) | gloo | nccl")->capture_default_str();
}

std::vector<std::string> rank_args_;  // the command line for the ranks --nproc starts

// Arguments for the ranks: the same command line without --nproc.
std::vector<std::string> rank_args(int argc, char** argv) {
  std::vector<std::string> out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--nproc") {
      ++i;
      continue;
    }
    if (a.rfind("--nproc=", 0) == 0) continue;
    out.push_back(a);
  }
  return out;
}

int run_run(const RunOptions& o) {
  ftplan::TrainingSetup setup;
  std::optional<nlohmann::json> plan;
  if (!o.plan_file.empty()) {
    plan = ftplan::read_json_file(o.plan_file);
    setup = ftexec::setup_from_plan(*plan, o.plan_file);
  } else {
    if (!o.model) ftplan::fail_input("--model: required without a plan file");
    setup.device = "cpu";
  }
  const std::string f = "flags";
  if (o.model) setup.model = *o.model;
  if (o.method) setup.method = ftplan::parse_method(*o.method, "--method");
  if (o.lora_rank) setup.lora.rank = *o.lora_rank;
  if (o.lora_alpha) setup.lora.alpha = *o.lora_alpha;
  if (o.lora_dropout) setup.lora.dropout = *o.lora_dropout;
  if (o.lora_targets) setup.lora.targets = ftplan::parse_lora_targets(*o.lora_targets, "--lora-targets");
  if (o.seq_len) setup.seq_len = *o.seq_len;
  if (o.micro_batch) setup.micro_batch = *o.micro_batch;
  if (o.grad_accum) setup.grad_accum = *o.grad_accum;
  if (o.checkpointing) setup.checkpointing = ftplan::parse_checkpointing(*o.checkpointing, "--checkpointing");
  if (o.attention) setup.attention = ftplan::parse_attention(*o.attention, "--attention");
  if (o.precision) setup.precision = ftplan::parse_precision(*o.precision, "--precision");
  if (o.steps) setup.steps = *o.steps;
  if (o.lr) setup.learning_rate = *o.lr;
  if (o.seed) setup.seed = *o.seed;
  if (o.data) setup.data = *o.data;
  if (o.gpu) setup.gpu = *o.gpu;
  if (o.strategy) setup.strategy = ftplan::parse_strategy(*o.strategy, "--strategy");
  // A plan for hwdb's "cpu" pseudo device runs on the CPU unless --device says otherwise.
  const std::string device = o.device ? *o.device : (setup.gpu == "cpu" ? std::string("cpu") : setup.device);
  ftexec::ExecJob job = ftexec::make_exec_job(setup, device);
  job.plan = plan;
  job.warmup_steps = std::min<int64_t>(o.warmup, job.setup.steps - 1);
  job.threads = o.threads;
  job.max_grad_norm = o.max_grad_norm;
  job.weight_decay = o.weight_decay;
  job.cpu_memory_limit_bytes = static_cast<int64_t>(o.cpu_memory_limit_gib * double(1ll << 30));
  job.save_dir = o.save;
  job.load_weights = o.load_weights;
  job.progress = !o.no_progress;

  // The checkpoint flags, all problems at once.
  std::vector<std::string> problems;
  if (o.keep_last && *o.keep_last < 1)
    problems.push_back("--keep-last " + std::to_string(*o.keep_last) +
                       ": must be at least 1 (complete checkpoints to keep; leave it out to keep all)");
  if (o.dist.checkpoint_every < 0)
    problems.push_back("--checkpoint-every " + std::to_string(o.dist.checkpoint_every) + ": must be at least 0");
  if (o.dist.checkpoint_dir.empty()) {
    if (o.dist.resume) problems.push_back("--resume needs --checkpoint-dir");
    if (o.keep_last) problems.push_back("--keep-last needs --checkpoint-dir");
  }
  if (!problems.empty()) {
    std::string msg;
    for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
    ftplan::fail_input(msg);
  }
  ftexec::DistOptions dist = o.dist;
  dist.keep_last = o.keep_last.value_or(0);

  const bool launcher = o.nproc > 1 && !std::getenv("RANK");
  const ftexec::DistEnv env = launcher ? ftexec::DistEnv{} : ftexec::dist_env_from_environment();
  const int world = launcher ? o.nproc : env.world;
  if (plan && plan->contains("candidate") && (*plan)["candidate"].contains("gpus") &&
      (*plan)["candidate"]["gpus"].get<int64_t>() != world && (world > 1 || *job.setup.strategy != ftplan::Strategy::single))
    ftplan::fail_input("the plan's candidate gpus (" + (*plan)["candidate"]["gpus"].dump() + ") != WORLD_SIZE (" +
                       std::to_string(world) + (launcher ? ", --nproc" : ", from " + env.source) +
                       "): start as many ranks as the plan has GPUs");
  if (launcher) {
    // The job is valid (checked above, once): start the ranks, each of which runs this again.
    if (*job.setup.strategy == ftplan::Strategy::single)
      ftplan::fail_input("--nproc " + std::to_string(o.nproc) + " needs a distributed strategy (--strategy ddp, zero1, "
                         "zero2, zero3, fsdp, mp or pipeline, or a plan for several GPUs)");
    // Checked once here (the ranks check again, each on its own files): a missing checkpoint or a
    // DIR that holds another run's is one line before any rank starts.
    if (!o.dist.checkpoint_dir.empty()) ftexec::checkpoint_preflight(o.dist.checkpoint_dir, o.dist.resume);
    ftexec::LaunchOptions lo;
    lo.nproc = o.nproc;
    lo.timeout_s = o.dist.timeout_s;
    return ftexec::launch_local(lo, rank_args_, std::cerr);
  }
  const bool distributed = env.world > 1 || *job.setup.strategy != ftplan::Strategy::single;
  nlohmann::json measured;
  if (distributed) {
    measured = ftexec::run_rank(job, env, dist);
    if (env.rank != 0) return 0;
  } else {
    if (o.dist.resume || !o.dist.checkpoint_dir.empty() || !o.dist.fault_inject.empty() || o.keep_last)
      ftplan::fail_input("--checkpoint-dir, --resume, --keep-last and --fault-inject apply to distributed runs (a strategy "
                         "other than single)");
    measured = ftexec::run_job(job);
  }
  if (!o.out.empty()) ftplan::write_file_atomically(o.out, measured.dump(2) + "\n");
  const auto& rank = measured["ranks"][0];
  const auto& loss = measured["loss"];
  std::cout << "loss " << (loss.empty() ? 0.0 : loss.front().get<double>()) << " -> "
            << (loss.empty() ? 0.0 : loss.back().get<double>()) << ", step " << measured["step_time_s"].get<double>()
            << " s, " << measured["tokens_per_s"].get<double>() << " tokens/s, peak "
            << rank["peak_memory_bytes"].get<int64_t>() / double(1 << 20) << " MiB"
            << (measured["ranks"].size() > 1 ? " (rank 0 of " + std::to_string(measured["ranks"].size()) + ")" : "")
            << (o.out.empty() ? "" : ", wrote " + o.out) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ftexec: run a fine-tuning plan with LibTorch on one device or several ranks and measure it"};
  app.require_subcommand(1);
  RunOptions options;
  setup_run(app, options);
  // A rank of a distributed run leaves through _Exit on failure: c10d's destructors could wait on a
  // peer that is gone.
  const bool is_rank = std::getenv("RANK") || std::getenv("SLURM_PROCID") || std::getenv("OMPI_COMM_WORLD_RANK");
  auto finish = [&](int code) {
    if (is_rank && code != 0) {
      std::cerr.flush();
      std::cout.flush();
      std::_Exit(code);
    }
    return code;
  };
  try {
    app.parse(argc, argv);
    rank_args_ = rank_args(argc, argv);
    return finish(run_run(options));
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "ftexec: error: " << e.what() << "\n";
    return finish(2);
  } catch (const ftplan::InputError& e) {
    // Every rank throws the same AgreedInputError; the ranks of `--nproc` share one stderr, so one
    // line is enough: rank 0's.
    const char* r = std::getenv("RANK");
    const bool shared_stderr = std::getenv("FTEXEC_LAUNCHER") && r && std::string(r) != "0";
    if (!(shared_stderr && dynamic_cast<const ftexec::AgreedInputError*>(&e))) std::cerr << "ftexec: error: " << e.what() << "\n";
    return finish(2);
  } catch (const ftexec::RuntimeFailure& e) {
    std::cerr << "ftexec: failed: " << e.what() << "\n";
    return finish(3);
  } catch (const std::exception& e) {
    std::cerr << "ftexec: failed: " << e.what() << "\n";
    return finish(3);
  }
}

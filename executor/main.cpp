// ftexec: run a fine-tuning plan for real with LibTorch and measure it, on one device or several ranks.
//   ftexec run plan.json --out measured.json          the plan `ftplan plan -o plan.json` wrote
//   ftexec run --model tiny-test --method lora --steps 30 --device cpu --out m.json
//   ftexec run plan.json --nproc 4 --out m.json       starts 4 local ranks (strategy from the plan)
//   torchrun --nproc-per-node 4 --no-python ftexec run plan.json --out m.json   (or srun, mpirun)
// Flags override the plan's values. Exit codes: 0 ok, 2 bad input, 3 runtime failure (OOM, ...);
// on failure nothing is written.
//
// Two binaries from this file. `ftexec` (FTEXEC_FRONT) links no LibTorch: it parses and checks the
// command line and hands every run that passes to `ftexec-worker` by exec (same arguments,
// environment and process: exit codes and signals are the worker's). `ftexec-worker` is the whole
// program: it runs the job, or as the --nproc launcher forks the ranks (executor/launch.h), which
// then share its loaded LibTorch. Loading LibTorch (with Debian's build, ~290 shared libraries: ~1 s
// and ~0.6 s of CPU, almost all of it static initialisation) thus happens once per run, not once per
// rank, and a command line refused by the checks never loads it.
#include <limits.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>

#include <CLI/CLI.hpp>

#include "executor/calibrate.h"
#include "executor/checkpoint.h"
#include "executor/dist_run.h"
#include "executor/exec_job.h"
#include "executor/launch.h"
#include "executor/run_job.h"
#include "planner/errors.h"
#include "planner/json_fields.h"
#include "planner/output_file.h"
#include "cli/field_flags.h"

namespace {

struct RunOptions {
  std::string plan_file;            // a plan (`ftplan plan -o`) or a job file (configs/jobs/X.json)
  std::string out;
  ftplan::cli::FieldFlags flags;    // the field table's ftexec rows: the job's fields and run settings
  std::string save, load_weights;
  bool no_progress = false;
  ftexec::DistOptions dist;         // its numbers come from `flags`; strings and switches are bound here
};

// The run settings' defaults, from the structs that hold them (shown in --help).
nlohmann::json run_defaults() {
  nlohmann::json d = ftplan::cli::job_field_defaults();
  const ftexec::ExecJob job;
  const ftexec::DistOptions dist;
  d["--warmup"] = job.warmup_steps;
  d["--threads"] = job.threads;
  d["--max-grad-norm"] = job.max_grad_norm;
  d["--weight-decay"] = job.weight_decay;
  d["--adam-beta1"] = job.adam_beta1;
  d["--adam-beta2"] = job.adam_beta2;
  d["--adam-eps"] = job.adam_eps;
  d["--cpu-memory-limit-gib"] = 0;
  d["--nproc"] = 0;
  d["--timeout-s"] = dist.timeout_s;
  d["--checkpoint-every"] = dist.checkpoint_every;
  d["--bucket-mb"] = dist.ddp_bucket_mb;
  d["--zero-bucket-elements"] = dist.zero_bucket_elements;
  d["--shard-group-size"] = dist.shard_group_size;
  d["device"] = nullptr;  // cpu for a plan on hwdb's "cpu", else the job's (cuda)
  return d;
}

void setup_run(CLI::App& app, RunOptions& o) {
  auto* run = app.add_subcommand("run", "Train a plan (or a job given by a job file or flags) and write measured.json");
  run->add_option("plan", o.plan_file, "plan.json written by `ftplan plan -o`, or a job file (configs/jobs/X.json)");
  run->add_option("-o,--out", o.out, "where to write measured.json (atomically; - for standard output)");
  ftplan::cli::bind_field_flags(*run, o.flags, ftplan::kFtexecFlag, run_defaults());
  run->add_option("--save", o.save, "write the trained adapter (PEFT) or full weights (safetensors) to DIR at the end, "
                  "under every strategy (checked before training; written whole, via a temporary folder)");
  run->add_option("--load-weights", o.load_weights, "HF safetensors: file, folder or model.safetensors.index.json");
  run->add_flag("--no-progress", o.no_progress, "no progress bar even on a terminal");
  run->add_option("--fault-inject", o.dist.fault_inject, "debug: RANK:STEP:kill|hang|exit|throw[,...]");
  run->add_option("--checkpoint-dir", o.dist.checkpoint_dir, "write checkpoints to DIR (each rank its shards)");
  run->add_flag("--resume", o.dist.resume,
                "continue from the newest complete checkpoint in --checkpoint-dir (its manifest and checksums verified)");
  run->add_option("--backend", o.dist.backend, "auto (nccl on CUDA, gloo on CPU) | gloo | nccl")->capture_default_str();
}

struct CalibrateCmd {
  bool selected = false;
  RunOptions run;  // the job (plan or flags) whose shapes are timed; -o the calibration file
};

void setup_calibrate(CLI::App& app, CalibrateCmd& o) {
  auto* cal = app.add_subcommand("calibrate", "Measure the time model's efficiency parameters on this machine "
                                              "(GEMMs and attention at the job's shapes, the optimizer step, collectives "
                                              "with --nproc) and write them as a calibration for ftplan --calibration");
  cal->add_option("plan", o.run.plan_file, "plan.json or job file whose model and shapes are timed (or give --model ...)");
  cal->add_option("-o,--out", o.run.out, "where to write calibration.json (atomically; - for standard output)")->required();
  ftplan::cli::bind_field_flags(*cal, o.run.flags, ftplan::kFtexecFlag, run_defaults());
  cal->add_option("--backend", o.run.dist.backend, "auto (nccl on CUDA, gloo on CPU) | gloo | nccl")->capture_default_str();
  cal->callback([&o] { o.selected = true; });
}

std::vector<char*> argv_;             // this process's whole command line (the front execs the worker with it)

#ifdef FTEXEC_FRONT
// The LibTorch binary that trains: ftexec-worker beside this executable.
std::string worker_binary() {
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) throw std::runtime_error(std::string("readlink(/proc/self/exe): ") + std::strerror(errno));
  self[n] = '\0';
  return (std::filesystem::path(self).parent_path() / "ftexec-worker").string();
}

// The checks passed: the worker runs this very command line in this process.
[[noreturn]] void exec_worker() {
  const std::string worker = worker_binary();
  std::cout.flush();
  std::cerr.flush();
  ::execv(worker.c_str(), argv_.data());
  throw ftexec::RuntimeFailure("cannot start the LibTorch worker " + worker + ": " + std::strerror(errno));
}
#endif

// A rank of a distributed run leaves through _Exit on failure: c10d's destructors could wait on a
// peer that is gone. (Read at exit: a rank forked by the launcher gets RANK after the launcher started.)
int finish(int code) {
  const bool is_rank = std::getenv("RANK") || std::getenv("SLURM_PROCID") || std::getenv("OMPI_COMM_WORLD_RANK");
  if (is_rank && code != 0) {
    std::cerr.flush();
    std::cout.flush();
    std::_Exit(code);
  }
  return code;
}

// Runs a command (the whole process's, or a forked rank's) and turns what it throws into one line
// and the exit code: 2 bad input, 3 runtime failure.
int guarded(const std::function<int()>& body) {
  try {
    return finish(body());
  } catch (const ftplan::InputError& e) {
    // Every rank throws the same AgreedInputError; the ranks of `--nproc` share one stderr, so one
    // line is enough: rank 0's.
    const char* r = std::getenv("RANK");
    const bool shared_stderr = std::getenv("FTEXEC_LAUNCHER") && r && std::string(r) != "0";
    if (!(shared_stderr && dynamic_cast<const ftexec::AgreedInputError*>(&e))) std::cerr << "ftexec: error: " << e.what() << "\n";
    return finish(2);
  } catch (const std::exception& e) {  // ftexec::RuntimeFailure and anything else
    std::cerr << "ftexec: failed: " << e.what() << "\n";
    return finish(3);
  }
}

int run_run(const RunOptions& o) {
  const auto& f = o.flags;
  f.validate();
  // Every output is checked before any work: a bad path is reported now, not after the run.
  if (!o.out.empty()) ftplan::check_output_path(o.out, "--out");
  if (!o.save.empty()) ftplan::check_output_dir(o.save, "--save");
  if (!o.dist.checkpoint_dir.empty()) ftplan::check_output_dir(o.dist.checkpoint_dir, "--checkpoint-dir");
  if (!o.load_weights.empty() && !std::filesystem::exists(o.load_weights))
    ftplan::fail_input("--load-weights: " + o.load_weights + ": no such file or folder");
  if (o.dist.backend != "auto" && o.dist.backend != "gloo" && o.dist.backend != "nccl")
    ftplan::fail_input("--backend: '" + o.dist.backend + "' is not auto, gloo or nccl");

  ftplan::TrainingSetup setup;
  std::optional<nlohmann::json> plan;
  if (!o.plan_file.empty()) {
    plan = ftplan::read_json_file(o.plan_file);
    setup = ftexec::setup_from_plan(*plan, o.plan_file);
    if (!plan->contains("job")) plan.reset();  // a job file: nothing predicted to carry along
  } else {
    if (!f.has("--model")) ftplan::fail_input("--model: required without a plan or job file");
    setup.device = "cpu";
  }
  f.apply_job(setup);
  // A plan for hwdb's "cpu" pseudo device runs on the CPU unless --device says otherwise.
  const std::string device = f.has("--device") ? *f.get_text("--device") : (setup.gpu == "cpu" ? std::string("cpu") : setup.device);
  ftexec::ExecJob job = ftexec::make_exec_job(setup, device);
  job.plan = plan;
  job.warmup_steps = std::min<int64_t>(f.get_int("--warmup").value_or(job.warmup_steps), job.setup.steps - 1);
  job.threads = f.get_int("--threads").value_or(job.threads);
  job.max_grad_norm = f.get_number("--max-grad-norm").value_or(job.max_grad_norm);
  job.weight_decay = f.get_number("--weight-decay").value_or(job.weight_decay);
  job.adam_beta1 = f.get_number("--adam-beta1").value_or(job.adam_beta1);
  job.adam_beta2 = f.get_number("--adam-beta2").value_or(job.adam_beta2);
  job.adam_eps = f.get_number("--adam-eps").value_or(job.adam_eps);
  job.cpu_memory_limit_bytes = static_cast<int64_t>(f.get_number("--cpu-memory-limit-gib").value_or(0) * double(1ll << 30));
  job.save_dir = o.save;
  job.load_weights = o.load_weights;
  job.progress = !o.no_progress;
  ftexec::DistOptions dist = o.dist;
  dist.timeout_s = f.get_number("--timeout-s").value_or(dist.timeout_s);
  dist.checkpoint_every = f.get_int("--checkpoint-every").value_or(dist.checkpoint_every);
  dist.ddp_bucket_mb = f.get_number("--bucket-mb").value_or(dist.ddp_bucket_mb);
  dist.zero_bucket_elements = f.get_number("--zero-bucket-elements").value_or(dist.zero_bucket_elements);
  dist.shard_group_size = f.get_int("--shard-group-size").value_or(dist.shard_group_size);
  const int nproc = static_cast<int>(f.get_int("--nproc").value_or(0));

  // The checkpoint flags (their ranges are the table's): what needs what.
  if (dist.checkpoint_dir.empty()) {
    if (dist.resume) ftplan::fail_input("--resume needs --checkpoint-dir");
    if (f.has("--keep-last")) ftplan::fail_input("--keep-last needs --checkpoint-dir");
  }
  dist.keep_last = f.get_int("--keep-last").value_or(0);

  const bool launcher = nproc > 1 && !std::getenv("RANK");
  const ftexec::DistEnv env = launcher ? ftexec::DistEnv{} : ftexec::dist_env_from_environment();
  const int world = launcher ? nproc : env.world;
  if (plan && plan->contains("candidate") && (*plan)["candidate"].contains("gpus") &&
      (*plan)["candidate"]["gpus"].get<int64_t>() != world && (world > 1 || *job.setup.strategy != ftplan::Strategy::single))
    ftplan::fail_input("the plan's candidate gpus (" + (*plan)["candidate"]["gpus"].dump() + ") != WORLD_SIZE (" +
                       std::to_string(world) + (launcher ? ", --nproc" : ", from " + env.source) +
                       "): start as many ranks as the plan has GPUs");
  if (launcher) {
    // The job is valid (checked above, once): start the ranks, each of which runs this again.
    if (!job.setup.parallel && *job.setup.strategy == ftplan::Strategy::single)
      ftplan::fail_input("--nproc " + std::to_string(nproc) + " needs a distributed strategy (--strategy ddp, zero1, "
                         "zero2, zero3, fsdp, mp or pipeline, --parallel, or a plan for several GPUs)");
    // The layout's degrees against the ranks about to start (the ranks check again).
    (void)ftexec::exec_parallelism(job, nproc, dist.shard_group_size);
    // Checked once here (the ranks check again, each on its own files): a missing checkpoint or a
    // DIR that holds another run's is one line before any rank starts.
    if (!o.dist.checkpoint_dir.empty()) ftexec::checkpoint_preflight(o.dist.checkpoint_dir, o.dist.resume);
#ifdef FTEXEC_FRONT
    exec_worker();  // the worker launches: it loads LibTorch once and forks the ranks from it
#else
    ftexec::LaunchOptions lo;
    lo.nproc = nproc;
    lo.timeout_s = dist.timeout_s;
    lo.rank_main = [&o] { return guarded([&o] { return run_run(o); }); };  // RANK set: the rank path below
    return ftexec::launch_local(lo, std::cerr);
#endif
  }
#ifdef FTEXEC_FRONT
  exec_worker();
#else
  // One run path for one process and for N ranks (executor/dist_run.h).
  const nlohmann::json measured = ftexec::run_rank(job, env, dist);
  if (env.rank != 0) return 0;
  if (!o.out.empty()) ftplan::write_output(o.out, measured.dump(2) + "\n", "--out");
  const auto& rank = measured["ranks"][0];
  const auto& loss = measured["loss"];
  // With --out - the JSON owns standard output: the summary goes to standard error.
  (o.out == "-" ? std::cerr : std::cout) << "loss " << (loss.empty() ? 0.0 : loss.front().get<double>()) << " -> "
            << (loss.empty() ? 0.0 : loss.back().get<double>()) << ", step " << measured["step_time_s"].get<double>()
            << " s, " << measured["tokens_per_s"].get<double>() << " tokens/s, peak "
            << rank["peak_memory_bytes"].get<int64_t>() / double(1 << 20) << " MiB"
            << (measured["ranks"].size() > 1 ? " (rank 0 of " + std::to_string(measured["ranks"].size()) + ")" : "")
            << (o.out.empty() ? "" : ", wrote " + o.out) << "\n";
  return 0;
#endif
}

int run_calibrate(const CalibrateCmd& cmd) {
  const RunOptions& o = cmd.run;
  const auto& f = o.flags;
  f.validate();
  if (o.out != "-") ftplan::check_output_path(o.out, "--out");
  ftplan::TrainingSetup setup;
  if (!o.plan_file.empty()) {
    setup = ftexec::setup_from_plan(ftplan::read_json_file(o.plan_file), o.plan_file);
  } else {
    if (!f.has("--model")) ftplan::fail_input("--model: required without a plan or job file");
    setup.device = "cpu";
  }
  f.apply_job(setup);
  const std::string device = f.has("--device") ? *f.get_text("--device") : (setup.gpu == "cpu" ? std::string("cpu") : setup.device);
  ftexec::ExecJob job = ftexec::make_exec_job(setup, device);
  job.threads = f.get_int("--threads").value_or(job.threads);
  // The hwdb entry the efficiencies are relative to: --gpu, else hwdb/cpu.json for a CPU run.
  const std::string hw_id = f.has("--gpu") || device.rfind("cuda", 0) == 0 ? setup.gpu : std::string("cpu");
  (void)ftplan::load_hardware(hw_id);  // a bad --gpu is one line now, not after the timings
  const int nproc = static_cast<int>(f.get_int("--nproc").value_or(0));
  if (nproc > 1 && !std::getenv("RANK")) {
#ifdef FTEXEC_FRONT
    exec_worker();
#else
    ftexec::LaunchOptions lo;
    lo.nproc = nproc;
    lo.timeout_s = f.get_number("--timeout-s").value_or(ftexec::DistOptions{}.timeout_s);
    lo.rank_main = [&cmd] { return guarded([&cmd] { return run_calibrate(cmd); }); };
    return ftexec::launch_local(lo, std::cerr);
#endif
  }
#ifdef FTEXEC_FRONT
  exec_worker();
#else
  const ftexec::DistEnv env = ftexec::dist_env_from_environment();
  const nlohmann::json cal = ftexec::calibrate_rank(job, hw_id, env, f.get_number("--timeout-s").value_or(ftexec::DistOptions{}.timeout_s),
                                                   o.dist.backend);
  if (env.rank != 0) return 0;
  ftplan::write_output(o.out, cal.dump(2) + "\n", "--out");
  const auto& p = cal["parameters"];
  (o.out == "-" ? std::cerr : std::cout) << "calibrated " << hw_id << " (" << cal["precision"].get<std::string>()
      << "): GEMM efficiency " << p["gemm_efficiency"]["16"].get<double>() << " / " << p["gemm_efficiency"]["64"].get<double>()
      << " / " << p["gemm_efficiency"]["512"].get<double>() << " / " << p["gemm_efficiency"]["4096"].get<double>()
      << " at 16 / 64 / 512 / 4096, attention "
      << p["attention_efficiency"].get<double>() << ", optimizer bandwidth x" << p["optimizer_bandwidth_factor"].get<double>()
      << (env.world > 1 ? ", all-reduce bandwidth x" + std::to_string(p["link_bandwidth_factor"]["intra_node"].get<double>()) : std::string())
      << (o.out == "-" ? std::string() : ", wrote " + o.out) << "\n";
  return 0;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ftexec: run a fine-tuning plan with LibTorch on one device or several ranks and measure it"};
  app.require_subcommand(1);
  app.add_flag_callback("--version", [] { std::cout << "ftexec " FTPLAN_VERSION "\n"; std::exit(0); }, "Print the version and exit");
  RunOptions options;
  setup_run(app, options);
  CalibrateCmd calibrate;
  setup_calibrate(app, calibrate);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "ftexec: error: " << e.what() << "\n";
    return finish(2);
  }
  argv_.assign(argv, argv + argc);
  argv_.push_back(nullptr);
  return guarded([&] { return calibrate.selected ? run_calibrate(calibrate) : run_run(options); });
}

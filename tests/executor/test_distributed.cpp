// The distributed executor end to end ([dist]): `ftexec run --nproc N` on the tiny config with Gloo
// on CPU, against the single-process reference and the planner. See dist_test_util.h for how the
// equivalent runs are built.
#include <cmath>
#include <iostream>
#include <map>

#include "dist_test_util.h"
#include "executor/launch.h"
#include "planner/errors.h"
#include "executor_test_util.h"
#include "planner/hardware_spec.h"
#include "planner/memory_model.h"
#include "planner/step_time.h"

#undef CHECK
#include <catch2/catch.hpp>

using ftexec_test::run_ftexec;
using ftexec_test::ScratchDir;
using ftexec_test::tiny_job;
using Catch::Matchers::Contains;

namespace {

// One run per distinct command line, shared by the tests (each run takes 1-3 s).
nlohmann::json measured(const std::string& args) {
  static std::map<std::string, nlohmann::json> cache;
  static ScratchDir dir("dist_runs");
  auto it = cache.find(args);
  if (it != cache.end()) return it->second;
  const std::string out = dir / ("m" + std::to_string(cache.size()) + ".json");
  const auto r = run_ftexec(args + " --timeout-s 60 --out " + out);
  INFO("ftexec run " << args << "\n" << r.output);
  REQUIRE(r.exit_code == 0);
  return cache[args] = ftplan::read_json_file(out);
}

std::vector<double> losses(const nlohmann::json& m) { return m["loss"].get<std::vector<double>>(); }

double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
  return worst;
}

ftplan::TrainingSetup tiny_setup(int64_t seq_len, int64_t micro_batch, int64_t grad_accum, int64_t gpus) {
  ftplan::TrainingSetup s;
  s.model = "tiny-test";
  s.gpu = "cpu";
  s.method = ftplan::Method::full;
  s.precision = ftplan::Precision::fp32;
  s.seq_len = seq_len;
  s.micro_batch = micro_batch;
  s.grad_accum = grad_accum;
  s.num_gpus = gpus;
  s.device = "cpu";
  return s;
}

ftplan::Candidate candidate_of(ftplan::Strategy strategy, int64_t micro_batch) {
  ftplan::Candidate c;
  c.strategy = strategy;
  c.micro_batch = micro_batch;
  c.checkpointing = ftplan::Checkpointing::none;
  c.attention = ftplan::Attention::eager;
  return c;
}

}  // namespace

TEST_CASE("every strategy reproduces the single-process loss trajectory", "[dist]") {
  // strategy, ranks, grad_accum per rank, extra flags
  auto [strategy, nproc, accum, extra] = GENERATE(table<std::string, int, int, std::string>({
      {"ddp", 2, 1, ""},
      {"ddp", 4, 1, ""},
      {"ddp", 2, 2, "--bucket-mb 0.05"},  // several buckets, gradient accumulation (no_sync)
      {"zero1", 2, 1, ""},
      {"zero1", 4, 2, ""},
      {"zero2", 2, 2, ""},
      {"zero2", 4, 1, "--zero-bucket-elements 50000"},  // the bucket wraps around
      {"zero3", 2, 2, ""},
      {"zero3", 4, 1, ""},
      {"zero3", 2, 1, "--checkpointing full"},  // recompute reads re-gathered parameters
      {"fsdp", 2, 1, ""},
      {"fsdp", 4, 2, ""},
      {"mp", 2, 2, ""},
      {"pipeline", 2, 3, ""},
      {"ddp", 2, 1, "--method lora --lora-rank 4 --lora-targets all-linear"},
      {"zero2", 2, 1, "--method lora --lora-rank 4 --lora-targets all-linear"},
      {"zero3", 2, 1, "--method lora --lora-rank 4 --lora-targets all-linear"},
      {"pipeline", 2, 2, "--method lora --lora-rank 4 --lora-targets all-linear"},
  }));
  CAPTURE(strategy, nproc, accum, extra);
  const bool pipelined = strategy == "mp" || strategy == "pipeline";
  const int ref_accum = pipelined ? accum : accum * nproc;
  const std::string lr = " --lr 3e-3";
  const auto ref = measured(tiny_job(32, 2, ref_accum, 4) + lr + " " + extra);
  const auto dist = measured(tiny_job(32, 2, accum, 4) + lr + " " + extra + " --strategy " + strategy + " --nproc " +
                             std::to_string(nproc));
  CHECK(dist["ranks"].size() == size_t(nproc));
  CHECK(dist["tokens_per_step"] == ref["tokens_per_step"]);
  const auto a = losses(dist), b = losses(ref);
  CAPTURE(a, b);
  CHECK(b.back() < b.front());  // it trains
  CHECK(max_rel_diff(a, b) < 1e-5);
}

TEST_CASE("per-rank memory orders as the planner says and is within 10% of it", "[dist][memory]") {
  // Full fine-tuning, fp32, seq 32 x micro-batch 2: model states (16 B per parameter, 1.98 MB) and
  // the communication buffers dominate the activations.
  const int nproc = GENERATE(2, 4);
  const auto model = ftexec_test::tiny_spec();
  const auto hw = ftplan::load_hardware("cpu");
  std::map<std::string, double> peak;
  for (const std::string s : {"ddp", "zero1", "zero2", "zero3", "fsdp"}) {
    const auto m = measured(tiny_job(32, 2, 1, 3) + " --strategy " + s + " --nproc " + std::to_string(nproc));
    const auto setup = tiny_setup(32, 2, 1, nproc);
    const auto est = ftplan::estimate_memory(model, hw, setup, candidate_of(ftplan::parse_strategy(s, "test"), 2));
    for (const auto& rank : m["ranks"]) {
      const double measured_peak = rank["peak_memory_bytes"].get<double>();
      const auto& c = rank["components"];
      CAPTURE(s, nproc, rank["rank"], measured_peak, est.per_gpu.total, est.per_gpu.weights, est.per_gpu.gradients,
              est.per_gpu.optimizer, est.per_gpu.activations, est.per_gpu.logits_loss, est.per_gpu.temporary, c.dump());
      CHECK_THAT(measured_peak, Catch::Matchers::WithinRel(double(est.per_gpu.total), 0.10));
      // Model states: tensor sizes on both sides (the flat buffers' padding is 0 here).
      CHECK(c["weights"].get<int64_t>() == est.per_gpu.weights);
      CHECK(c["optimizer"].get<int64_t>() == est.per_gpu.optimizer);
      peak[s] = std::max(peak[s], measured_peak);
    }
    std::cout << "[dist][memory] " << s << " x" << nproc << ": measured " << peak[s] << " B, predicted "
              << est.per_gpu.total << " B (" << 100.0 * (peak[s] - est.per_gpu.total) / est.per_gpu.total << " %)\n";
  }
  CHECK(peak["zero3"] < peak["zero2"]);
  CHECK(peak["zero2"] < peak["zero1"]);
  CHECK(peak["zero1"] < peak["ddp"]);
}

TEST_CASE("measured bytes per collective equal the planner's communication volume", "[dist][comm]") {
  const auto [strategy, nproc, accum] = GENERATE(table<std::string, int, int>({
      {"ddp", 2, 1}, {"ddp", 4, 2}, {"zero1", 4, 2}, {"zero2", 2, 2}, {"zero2", 4, 1},
      {"zero3", 2, 2}, {"zero3", 4, 1}, {"fsdp", 4, 1}, {"fsdp", 2, 2}}));
  CAPTURE(strategy, nproc, accum);
  const auto model = ftexec_test::tiny_spec();
  const auto hw = ftplan::load_hardware("cpu");
  const auto setup = tiny_setup(32, 2, accum, nproc);
  const auto ctx = ftplan::prepare_plan(model, hw, setup, nproc);
  const double planned =
      ftplan::estimate_step(ctx, candidate_of(ftplan::parse_strategy(strategy, "test"), 2)).comm_bytes_per_step;
  const auto m = measured(tiny_job(32, 2, accum, 3) + " --strategy " + strategy + " --nproc " + std::to_string(nproc));
  for (const auto& rank : m["ranks"]) {
    CAPTURE(rank["comm_bytes"].dump(), rank["comm_padding_bytes"], planned);
    // Exact where no flat buffer needs padding (every unit of tiny-test divides by 2 and 4);
    // otherwise the difference is the padding, which the run reports.
    CHECK(std::abs(rank["comm_bytes_per_step"].get<double>() - planned) <= rank["comm_padding_bytes"].get<double>());
    CHECK(rank["comm_padding_bytes"].get<double>() == 0);
  }
  CHECK(m["comm_bytes_per_step"].get<double>() == planned);
}

TEST_CASE("pipelines send each micro-batch's activation forward and its gradient back", "[dist][comm]") {
  // The busiest stage sends one activation (B·S·hidden·4 bytes) per micro-batch and direction it
  // has: with two stages, stage 0 sends activations and stage 1 their gradients.
  const auto [strategy, accum] = GENERATE(table<std::string, int>({{"mp", 2}, {"pipeline", 3}}));
  const auto m = measured(tiny_job(32, 2, accum, 3) + " --strategy " + strategy + " --nproc 2");
  const double act = 2.0 * 32 * 64 * 4;
  for (const auto& rank : m["ranks"]) CHECK(rank["comm_bytes"]["send"].get<double>() == accum * act);
  // The planner's comm_bytes_per_step is the busiest stage's: one activation per micro-batch with
  // two stages (two for a middle stage of three or more).
  const auto model = ftexec_test::tiny_spec();
  const auto ctx = ftplan::prepare_plan(model, ftplan::load_hardware("cpu"), tiny_setup(32, 2, accum, 2), 2);
  const double planned =
      ftplan::estimate_step(ctx, candidate_of(ftplan::parse_strategy(strategy, "test"), 2)).comm_bytes_per_step;
  CHECK(planned == accum * act);
}

TEST_CASE("a rank that dies or hangs ends the run with an error naming it", "[dist][fault]") {
  ScratchDir dir("dist_fault");
  const std::string token = "ftexec_fault_" + std::to_string(::getpid());
  SECTION("killed (SIGKILL) at step 3 of 4 ranks: the others notice at once") {
    const auto r = run_ftexec(tiny_job(32, 2, 1, 6) + " --strategy zero3 --nproc 4 --timeout-s 30 --fault-inject 1:3:kill --out " +
                              dir / (token + ".json"));
    INFO(r.output);
    std::cout << "[dist][fault] kill: failed after " << r.seconds << " s (timeout 30 s)\n";
    CHECK(r.exit_code != 0);
    CHECK(r.seconds < 15);  // well inside the 30 s timeout
    CHECK_THAT(r.output, Contains("rank 1 was killed by signal 9"));
    CHECK_THAT(r.output, Contains("with rank 1 failed"));  // a neighbour names it from the broken ring
    CHECK_FALSE(std::filesystem::exists(dir / (token + ".json")));
  }
  SECTION("hung at step 3 of 2 ranks (DDP): the other times out naming it, the launcher kills it") {
    const auto r = run_ftexec(tiny_job(32, 2, 1, 6) + " --strategy ddp --nproc 2 --timeout-s 3 --fault-inject 1:3:hang --out " +
                              dir / (token + ".json"));
    INFO(r.output);
    std::cout << "[dist][fault] hang: failed after " << r.seconds << " s (timeout 3 s + 5 s grace)\n";
    CHECK(r.exit_code != 0);
    CHECK(r.seconds < 20);
    CHECK_THAT(r.output, Contains("rank 1 is alive but behind"));
    CHECK_THAT(r.output, Contains("rank(s) 1 still running"));
  }
  CHECK(ftexec_test::processes_with(token) == 0);  // no orphans
}

TEST_CASE("a run stopped after a checkpoint resumes with the identical loss", "[dist][checkpoint]") {
  const auto [strategy, nproc] = GENERATE(table<std::string, int>({{"ddp", 2}, {"zero2", 2}, {"zero3", 4}, {"pipeline", 2}}));
  CAPTURE(strategy, nproc);
  ScratchDir dir("dist_ckpt_" + strategy);
  const std::string job = tiny_job(32, 2, 2, 6) + " --lr 3e-3 --strategy " + strategy + " --nproc " + std::to_string(nproc);
  const auto full = measured(job);
  // Killed at step 5, after the checkpoint of step 4 (and 2) was complete.
  const std::string ck = " --checkpoint-dir " + dir / "ck" + " --checkpoint-every 2";
  const auto stopped = run_ftexec(job + ck + " --fault-inject 0:5:kill --out " + dir / "stopped.json");
  INFO(stopped.output);
  REQUIRE(stopped.exit_code != 0);
  CHECK(std::filesystem::exists(dir / "ck/step-4/manifest.json"));
  const auto resumed = run_ftexec(job + ck + " --resume --out " + dir / "resumed.json");
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  const auto m = ftplan::read_json_file(dir / "resumed.json");
  CHECK(m["first_step"] == 4);
  const auto all = losses(full), tail = losses(m);
  REQUIRE(tail.size() == 2);
  CHECK(tail[0] == all[4]);  // bit for bit
  CHECK(tail[1] == all[5]);
}

TEST_CASE("ranks read torchrun, Slurm and OpenMPI environments", "[dist][launch]") {
  const char* vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
                        "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                        "OMPI_COMM_WORLD_LOCAL_SIZE", "TORCHELASTIC_USE_AGENT_STORE", "FTEXEC_LAUNCHER"};
  for (const char* v : vars) ::unsetenv(v);
  CHECK(ftexec::dist_env_from_environment().world == 1);
  SECTION("torchrun with its agent store: every rank is a store client") {
    ::setenv("RANK", "3", 1), ::setenv("WORLD_SIZE", "8", 1), ::setenv("LOCAL_RANK", "1", 1);
    ::setenv("LOCAL_WORLD_SIZE", "2", 1), ::setenv("MASTER_ADDR", "node0", 1), ::setenv("MASTER_PORT", "29400", 1);
    ::setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    const auto e = ftexec::dist_env_from_environment();
    CHECK(e.source == "torchrun");
    CHECK((e.rank == 3 && e.world == 8 && e.local_rank == 1 && e.local_world == 2 && e.master_port == 29400));
    CHECK_FALSE(e.host_store);
  }
  SECTION("Slurm without MASTER_ADDR names what is missing") {
    ::setenv("SLURM_PROCID", "1", 1), ::setenv("SLURM_NTASKS", "4", 1), ::setenv("SLURM_LOCALID", "1", 1);
    CHECK_THROWS_WITH(ftexec::dist_env_from_environment(), Contains("MASTER_ADDR is not set") && Contains("slurm"));
    ::setenv("MASTER_ADDR", "10.0.0.1", 1), ::setenv("MASTER_PORT", "29500", 1);
    const auto e = ftexec::dist_env_from_environment();
    CHECK((e.source == "slurm" && e.rank == 1 && e.world == 4 && e.host_store));
  }
  SECTION("OpenMPI") {
    ::setenv("OMPI_COMM_WORLD_RANK", "0", 1), ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1), ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", "x", 1);
    CHECK_THROWS_WITH(ftexec::dist_env_from_environment(), Contains("MASTER_PORT=\"x\""));
  }
  for (const char* v : vars) ::unsetenv(v);
}

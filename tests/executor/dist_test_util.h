// Running the built ftexec as a subprocess for the distributed tests ([dist]): each test starts
// `ftexec run ... --nproc N` (N local Gloo ranks) and reads the measured.json it writes.
//
// Equivalent runs: with data parallelism each of N ranks takes `grad_accum` micro-batches of every
// global batch (disjoint, consecutive), so the single-process reference runs the same micro-batch
// with grad_accum × N; pipelines see every micro-batch, so their reference has the same grad_accum.
// The data is the synthetic stream of one seed, so every run draws the same tokens.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "planner/json_fields.h"

namespace ftexec_test {

inline std::string ftexec_binary() { return std::string(FTPLAN_BINARY_DIR) + "/executor/ftexec"; }

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

// Runs `ftexec run <args>` from the source dir (configs/ resolve there), capturing its output.
inline RunResult run_ftexec(const std::string& args) {
  RunResult r;
  const std::string cmd = "cd '" + std::string(FTPLAN_SOURCE_DIR) + "' && '" + ftexec_binary() + "' run " + args + " 2>&1";
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int status = ::pclose(p);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// The tiny job every distributed test shares: fp32, eager attention, synthetic data, 1 thread per rank.
inline std::string tiny_job(int64_t seq_len, int64_t micro_batch, int64_t grad_accum, int64_t steps) {
  return "--model tiny-test --precision fp32 --attention eager --seq-len " + std::to_string(seq_len) +
         " --micro-batch " + std::to_string(micro_batch) + " --grad-accum " + std::to_string(grad_accum) +
         " --steps " + std::to_string(steps) + " --threads 1 --no-progress --seed 0";
}

// Processes whose command line contains `token` (orphan check).
inline int processes_with(const std::string& token) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::FILE* f = std::fopen((entry.path() / "cmdline").c_str(), "rb");
    if (!f) continue;
    std::string cmdline;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) cmdline.append(buf, n);
    std::fclose(f);
    for (auto& c : cmdline)
      if (c == '\0') c = ' ';
    if (cmdline.find(token) != std::string::npos && cmdline.find("ftexec") != std::string::npos) ++count;
  }
  return count;
}

}  // namespace ftexec_test

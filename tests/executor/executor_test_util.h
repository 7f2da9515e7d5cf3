// Shared helpers for the executor tests: the tiny config (2 layers, hidden 64) and scratch folders.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include "planner/json_fields.h"
#include "planner/model_spec.h"
#include "planner/training_setup.h"

namespace ftexec_test {

inline ftplan::ModelSpec tiny_spec() {
  return ftplan::model_spec_from_json(ftplan::read_json_file(std::string(FTPLAN_SOURCE_DIR) + "/configs/models/tiny-test.json"),
                                      "tiny-test");
}

// The job whose measured CPU peak is checked against the planner's: activations dominate (fp32, eager
// attention, full fine-tuning, no checkpointing, one CPU "device" (hwdb/cpu.json), strategy single,
// seq 128 x micro-batch 8, 3 steps), predicted as ftexec runs it (framework ftexec).
inline ftplan::TrainingSetup activation_memory_setup(const std::string& model) {
  ftplan::TrainingSetup setup;
  setup.framework = "ftexec";
  setup.model = model;
  setup.gpu = "cpu";
  setup.method = ftplan::Method::full;
  setup.precision = ftplan::Precision::fp32;
  setup.seq_len = 128;
  setup.micro_batch = 8;
  setup.attention = ftplan::Attention::eager;
  setup.checkpointing = ftplan::Checkpointing::none;
  setup.strategy = ftplan::Strategy::single;
  setup.steps = 3;
  setup.device = "cpu";
  return setup;
}

// A fresh empty folder under the system temp dir, removed when the object dies.
struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& name)
      : path(std::filesystem::temp_directory_path() / ("ftexec_test_" + std::to_string(::getpid()) + "_" + name)) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string operator/(const std::string& file) const { return (path / file).string(); }
};

}  // namespace ftexec_test

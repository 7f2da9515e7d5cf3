// Hand-made StepInputs for the simulator tests: round numbers, so the expected figures can be
// worked out by hand in each test.
#pragma once

#include <cstdint>
#include <string>

#include "simulator/step_inputs.h"

namespace ftplan::sim::testing {

constexpr int64_t kMiB = INT64_C(1) << 20;
constexpr int64_t kGiB = INT64_C(1) << 30;

// A collective of `bytes`: latency + bytes / bandwidth (Calculon's form without efficiency).
inline double linear_comm_s(int64_t bytes, double latency_s, double bytes_per_s) {
  return latency_s + static_cast<double>(bytes) / bytes_per_s;
}

// An embedding, `blocks` identical decoder blocks and a head+loss, with every cost function set.
inline StepInputs model_inputs(Strategy strategy, int num_gpus, int blocks, int micro_batches) {
  StepInputs in;
  set_preset(in, strategy, num_gpus);
  in.num_gpus = num_gpus;
  in.micro_batches = micro_batches;
  LayerCost embedding{"embedding", 0.0002, 0.0002, 0.0001, 500 * kMiB, 500 * kMiB, 16 * kMiB, 16 * kMiB, false};
  LayerCost block{"", 0.010, 0.010, 0.010, 400 * kMiB, 400 * kMiB, 700 * kMiB, 16 * kMiB, true};
  LayerCost head{"head+loss", 0.004, 0.004, 0.004, 500 * kMiB, 500 * kMiB, 300 * kMiB, 16 * kMiB, false};
  in.layers.push_back(embedding);
  for (int i = 0; i < blocks; ++i) {
    block.name = "block " + std::to_string(i);
    in.layers.push_back(block);
  }
  in.layers.push_back(head);
  in.logits_bytes = 2 * kGiB;
  in.static_bytes_per_rank = 20 * kGiB;
  in.optimizer_step_s = 0.003;
  in.all_reduce_s = [](int64_t b) { return linear_comm_s(b, 30e-6, 100e9); };
  in.reduce_scatter_s = [](int64_t b) { return linear_comm_s(b, 20e-6, 200e9); };
  in.all_gather_s = [](int64_t b) { return linear_comm_s(b, 20e-6, 200e9); };
  in.replica_all_reduce_s = [](int64_t b) { return linear_comm_s(b / 8, 50e-6, 25e9); };
  in.p2p_s = [](int64_t b) { return linear_comm_s(b, 10e-6, 50e9); };
  in.host_copy_s = [](int64_t b) { return linear_comm_s(b, 10e-6, 25e9); };
  return in;
}

}  // namespace ftplan::sim::testing

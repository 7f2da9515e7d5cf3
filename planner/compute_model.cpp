#include "planner/compute_model.h"

#include <algorithm>

namespace ftplan {

FlopsPerToken flops_per_token(const ModelSpec& m, const TrainingSetup& setup) {
  const double L = static_cast<double>(m.num_layers);
  double block_matmul = 0, lora = 0;
  for (const auto& lin : block_linears(m)) {
    block_matmul += 2.0 * lin.in_features * lin.out_features;
    if (setup.method != Method::full &&
        std::find(setup.lora.targets.begin(), setup.lora.targets.end(), lin.name) != setup.lora.targets.end())
      lora += 2.0 * setup.lora.rank * (lin.in_features + lin.out_features);
  }
  // QK^T and P·V, forward, one layer: 4·S·q_dim; a local layer under fused attention attends over
  // min(S, window) keys (flash-attention skips the blocks outside the window), eager attention computes
  // the whole masked S x S. The mean over the layers.
  const double S = static_cast<double>(setup.seq_len);
  const bool windowed = setup.attention.value_or(Attention::fused) == Attention::fused;
  const double local = windowed ? static_cast<double>(m.num_sliding_layers()) : 0.0;
  const double keys = L > 0 ? ((L - local) * S + local * std::min(S, double(m.sliding_window))) / L : S;
  const double attention = 4.0 * keys * m.q_dim();
  const double head = 2.0 * m.vocab_size * m.hidden_size;    // lm_head (tied or not)
  FlopsPerToken f;
  f.block_forward = L * (block_matmul + attention + lora);
  f.forward = f.block_forward + head;
  const bool weights_train = setup.method == Method::full;
  // Backward: attention and input gradients always; weight gradients where weights train.
  f.backward = L * (2.0 * attention + (weights_train ? 2.0 : 1.0) * block_matmul + 2.0 * lora) +
               (weights_train ? 2.0 : 1.0) * head;
  f.model = f.forward + f.backward;
  f.block_matmul = block_matmul;
  f.block_attention = attention;
  f.block_lora = lora;
  f.head = head;
  f.weights_train = weights_train;
  return f;
}

double peak_flops(const HardwareSpec& hw, Precision precision) {
  return precision == Precision::fp32 ? hw.peak_flops_fp32 : hw.peak_flops_bf16;
}

double compute_efficiency(const HardwareSpec& hw, const TrainingSetup& setup) {
  return setup.efficiency.value_or(hw.matmul_efficiency);
}

double nf4_dequant_time_s(int64_t nf4_params, const HardwareSpec& hw) {
  return nf4_params * (0.516 + 2.0) / hw.hbm_bandwidth_bytes_per_s;
}

double optimizer_step_time_s(double trainable_params, const HardwareSpec& hw) {
  return trainable_params * 28.0 / hw.hbm_bandwidth_bytes_per_s;
}

}  // namespace ftplan

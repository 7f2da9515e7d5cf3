#include "planner/compute_model.h"

#include <algorithm>

namespace ftplan {

FlopsPerToken flops_per_token(const ModelSpec& m, const TrainingSetup& setup) {
  const double L = static_cast<double>(m.num_layers);
  double block_matmul = 0, lora = 0, expert = 0;
  // A block's matmuls per token: every linear once, a routed expert's linear top_k times (the experts the
  // token runs): the active parameters, not all of them. A MoE model with dense blocks: the mean block.
  auto add_layer = [&](const std::vector<LinearShape>& linears, double share) {
    for (const auto& lin : linears) {
      const double runs = is_expert_role(lin.role) ? double(m.moe.top_k) : 1.0;
      const double mm = share * runs * 2.0 * lin.in_features * lin.out_features;
      block_matmul += mm;
      if (is_expert_role(lin.role)) expert += mm;
      if (setup.method != Method::full &&
          std::find(setup.lora.targets.begin(), setup.lora.targets.end(), lin.name) != setup.lora.targets.end())
        lora += share * runs * 2.0 * setup.lora.rank * (lin.in_features + lin.out_features);
    }
  };
  if (!m.moe.active()) {
    add_layer(block_linears(m), 1.0);
  } else {
    const double moe_share = L > 0 ? double(m.moe.num_moe_layers()) / L : 1.0;
    add_layer(layer_linears(m, true), moe_share);
    if (!m.moe.uniform()) add_layer(layer_linears(m, false), 1.0 - moe_share);
  }
  // QK^T and P·V, forward, one layer: 4·S·q_dim; a local layer under fused attention attends over
  // min(S, window) keys (flash-attention skips the blocks outside the window), eager attention computes
  // the whole masked S x S. The mean over the layers.
  const double S = static_cast<double>(setup.seq_len);
  const bool windowed = setup.attention.value_or(Attention::fused) == Attention::fused;
  const double local = windowed ? static_cast<double>(m.num_sliding_layers()) : 0.0;
  const double keys = L > 0 ? ((L - local) * S + local * std::min(S, double(m.sliding_window))) / L : S;
  // Latent attention: QK^T over heads·(nope + rope), P·V over heads·v_head_dim.
  const double attention = m.mla.active() ? 2.0 * keys * double(m.q_dim() + m.attn_out_dim()) : 4.0 * keys * m.q_dim();
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
  f.block_expert = expert;
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

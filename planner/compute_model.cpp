#include "planner/compute_model.h"

#include <algorithm>
#include <cmath>

#include "planner/precision.h"

namespace ftplan {

double timed_row_tokens(const TrainingSetup& setup) {
  // Issue 11's rule for variable-length data: memory from the longest batch the data can produce
  // (dataset.max_tokens_per_row), time from the mean. Packed rows fill seq_len.
  return !setup.packing && setup.dataset.mean_tokens_per_row > 0
             ? std::min<double>(double(setup.dataset.mean_tokens_per_row), double(setup.seq_len))
             : static_cast<double>(setup.seq_len);
}

FlopsPerToken flops_per_token(const ModelSpec& m, const TrainingSetup& setup) { return flops_per_token(m, setup, true); }

FlopsPerToken flops_per_token(const ModelSpec& m, const TrainingSetup& setup, bool causal_blocks_skipped) {
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
  // A query's keys run to its own row's length: the row a step is timed at (timed_row_tokens).
  const double S = timed_row_tokens(setup);
  const bool windowed = setup.attention.value_or(Attention::fused) == Attention::fused;
  const double local = windowed ? static_cast<double>(m.num_sliding_layers()) : 0.0;
  const double keys = L > 0 ? ((L - local) * S + local * std::min(S, double(m.sliding_window))) / L : S;
  // Latent attention: QK^T over heads·(nope + rope), P·V over heads·v_head_dim.
  const double attention = m.mla.active() ? 2.0 * keys * double(m.q_dim() + m.attn_out_dim()) : 4.0 * keys * m.q_dim();
  // What the attention kernel executes, for time (the model FLOPs above stay the MFU numerator, as
  // PaLM's and torchtitan's MFU count them): a fused causal kernel skips the key blocks above the
  // diagonal and outside the window (flash-attention's compute_attn_1rowblock bounds n_block_max by
  // the causal diagonal plus window_size_right and n_block_min by window_size_left,
  // Dao-AILab/flash-attention csrc/flash_attn/src/flash_fwd_kernel.h at
  // 0142ff05acc56c45755638857e77e35f1c350098; FlashAttention-2, Dao 2023, sec. 3.1.1 "Causal masking"),
  // so query i attends to min(i + 1, window) keys: over S queries, a mean of m - m^2 / (2 S) keys with
  // m = min(S, window), S / 2 for a global layer. Eager attention computes the whole masked S x S, and so
  // does a fused kernel handed an explicit mask instead of is_causal (causal_blocks_skipped false).
  auto causal_keys = [&](double window) {
    const double mk = std::min(S, window);
    return S > 0 ? mk - mk * mk / (2.0 * S) : 0.0;
  };
  const double keys_executed =
      !windowed || !causal_blocks_skipped ? keys
                : L > 0 ? ((L - local) * causal_keys(S) + local * causal_keys(double(m.sliding_window))) / L : causal_keys(S);
  const double attention_executed = attention * (keys > 0 ? keys_executed / keys : 0.0);
  const double head = 2.0 * m.vocab_size * m.hidden_size;    // lm_head (tied or not)
  FlopsPerToken f;
  f.block_forward = L * (block_matmul + attention + lora);
  f.forward = f.block_forward + head;
  const bool weights_train = setup.method == Method::full;
  // Backward: attention and input gradients always; weight gradients where weights train.
  f.backward = L * (2.0 * attention + (weights_train ? 2.0 : 1.0) * block_matmul + 2.0 * lora) +
               (weights_train ? 2.0 : 1.0) * head;
  f.model = f.forward + f.backward;
  f.block_attention_executed = attention_executed;
  const double skipped = L * (attention - attention_executed);  // forward; backward skips twice that
  f.forward_executed = f.forward - skipped;
  f.backward_executed = f.backward - 2.0 * skipped;
  f.block_forward_executed = f.block_forward - skipped;
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

double gemm_efficiency(const EfficiencyModel& eff, double fallback, double smallest_dim) {
  if (eff.gemm.size() != size_t(kGemmAnchors)) return fallback;
  const double d = std::max(1.0, smallest_dim);
  if (d <= kGemmAnchorDims[0]) return eff.gemm[0];
  if (d >= kGemmAnchorDims[kGemmAnchors - 1]) return eff.gemm[kGemmAnchors - 1];
  int i = 0;
  while (d >= kGemmAnchorDims[i + 1]) ++i;
  const double t = (std::log2(d) - std::log2(kGemmAnchorDims[i])) / (std::log2(kGemmAnchorDims[i + 1]) - std::log2(kGemmAnchorDims[i]));
  // Interpolate the time per FLOP (1 / efficiency), log-linearly in the dimension.
  return 1.0 / ((1.0 - t) / eff.gemm[i] + t / eff.gemm[i + 1]);
}

std::vector<double> hwdb_gemm_anchors(const HardwareSpec& hw, Precision precision, double efficiency) {
  if (precision == Precision::fp32 || hw.gemm_efficiency_bf16.size() != size_t(kGemmAnchors)) return {};
  std::vector<double> anchors = hw.gemm_efficiency_bf16;
  const double largest = hw.gemm_efficiency_bf16.back();
  for (double& a : anchors) a *= efficiency / largest;
  return anchors;
}

PieceRates piece_rates(const ModelSpec& m, const HardwareSpec& hw, const TrainingSetup& setup, double rows, int64_t tp,
                       int64_t ep) {
  PieceRates r;
  const double peak = peak_flops(hw, setup.precision);
  const double e = compute_efficiency(hw, setup);
  r.rate = peak * e;
  r.block_matmul = r.attention = r.lora = r.head = r.rate;
  // A calibration's anchors, else the hwdb's measured bf16 GEMM anchors where the step runs its GEMMs on
  // bf16 tensor cores (not under fp32: its peak and kernels differ).
  EfficiencyModel eff = hw.efficiency;
  if (eff.gemm.empty()) eff.gemm = hwdb_gemm_anchors(hw, setup.precision, e);
  if (setup.efficiency || (eff.gemm.empty() && !eff.attention)) return r;
  r.uniform = false;
  r.attention = peak * eff.attention.value_or(e);
  tp = std::max<int64_t>(1, tp);
  // FLOPs and seconds per token of the block's GEMMs as one tensor-parallel rank runs them (the mean
  // block of a MoE model with dense layers, as flops_per_token weighs them).
  double mm_flops = 0, mm_s = 0, lora_flops = 0, lora_s = 0;
  const bool lora = setup.method != Method::full;
  auto add = [&](const std::vector<LinearShape>& linears, double share) {
    for (const auto& lin : linears) {
      const bool expert = is_expert_role(lin.role);
      const double runs = expert ? double(m.moe.top_k) : 1.0;
      const double gemm_rows = expert && m.moe.num_experts > 0
                                   ? rows * double(m.moe.top_k) * double(std::max<int64_t>(1, ep)) / double(m.moe.num_experts)
                                   : rows;
      const double f = share * runs * 2.0 * double(lin.in_features) * double(lin.out_features);
      mm_flops += f;
      mm_s += f / (peak * gemm_efficiency(eff, e, std::min({gemm_rows, double(lin.in_features), double(lin.out_features)})));
      if (lora && std::find(setup.lora.targets.begin(), setup.lora.targets.end(), lin.name) != setup.lora.targets.end()) {
        const double lf = share * runs * 2.0 * setup.lora.rank * double(lin.in_features + lin.out_features);
        lora_flops += lf;
        lora_s += lf / (peak * gemm_efficiency(eff, e, std::min<double>(gemm_rows, double(setup.lora.rank))));
      }
    }
  };
  const double L = double(std::max<int64_t>(1, m.num_layers));
  if (!m.moe.active()) {
    add(block_linears(m, tp), 1.0);
  } else {
    const double moe_share = double(m.moe.num_moe_layers()) / L;
    add(layer_linears(m, true), moe_share);
    if (!m.moe.uniform()) add(layer_linears(m, false), 1.0 - moe_share);
  }
  if (mm_s > 0) r.block_matmul = mm_flops / mm_s;
  if (lora_s > 0) r.lora = lora_flops / lora_s;
  // The head: rows x hidden x vocabulary / tp (vocabulary-parallel).
  r.head = peak * gemm_efficiency(eff, e, std::min({rows, double(m.hidden_size), double(m.vocab_size) / double(tp)}));
  return r;
}

double block_forward_s_per_token(const FlopsPerToken& f, const PieceRates& r) {
  if (r.uniform) return (f.block_matmul + f.block_attention_executed + f.block_lora) / r.rate;
  return f.block_matmul / r.block_matmul + f.block_attention_executed / r.attention + f.block_lora / r.lora;
}

double forward_s_per_token(const ModelSpec& m, const FlopsPerToken& f, const PieceRates& r) {
  if (r.uniform) return f.forward_executed / r.rate;
  return double(m.num_layers) * block_forward_s_per_token(f, r) + f.head / r.head;
}

double backward_s_per_token(const ModelSpec& m, const FlopsPerToken& f, const PieceRates& r) {
  if (r.uniform) return f.backward_executed / r.rate;
  const double k = f.weights_train ? 2.0 : 1.0;  // as flops_per_token: input gradients, and weights' where they train
  return double(m.num_layers) * (2.0 * f.block_attention_executed / r.attention + k * f.block_matmul / r.block_matmul + 2.0 * f.block_lora / r.lora) +
         k * f.head / r.head;
}

double eager_elementwise_bytes_per_token(const ModelSpec& model, const FrameworkProfile& fw, const TrainingSetup& setup) {
  if (setup.compile) return 0.0;
  constexpr double kFusedNorm = 4, kFusedRope = 4, kFusedMlpAct = 6;  // one read, one write (bf16)
  auto surplus = [](double eager, double fused) { return eager > 0 ? std::max(0.0, eager - fused) : 0.0; };
  const double h = double(model.hidden_size), qk = double(model.q_dim() + model.kv_dim()), I = double(model.intermediate_size);
  return 2.0 * surplus(fw.eager_norm_bytes_per_hidden, kFusedNorm) * h + surplus(fw.eager_rope_bytes_per_element, kFusedRope) * qk +
         surplus(fw.eager_mlp_act_bytes_per_intermediate, kFusedMlpAct) * I;
}

double nf4_dequant_time_s(int64_t nf4_params, const HardwareSpec& hw) {
  return nf4_params * (0.516 + 2.0) / hw.hbm_bandwidth_bytes_per_s;
}

double optimizer_step_bytes_per_param(Precision precision, Optimizer optimizer, bool foreach, bool paged) {
  const ParamBytes b = trainable_param_bytes(precision, optimizer, paged);
  if (paged) foreach = false;
  // The master weight's width: the optimizer bytes hold it beside the moments under mixed precision.
  const bool master = precision == Precision::mixed || precision == Precision::mixed_fp32_grads;
  const double P = master ? 4.0 : b.weight, G = b.gradient;
  const double moment = precision == Precision::bf16 && !paged ? 2.0 : 4.0;
  double step = 0;
  switch (optimizer) {
    case Optimizer::adamw: step = foreach ? 4 * P + 3 * G + 14 * moment : 2 * P + G + 4 * moment; break;
    case Optimizer::adamw8bit: step = 2 * P + G + 4 * 1.0; break;  // bitsandbytes' blockwise kernel, one byte per moment
    case Optimizer::sgd: step = foreach ? 2 * P + G + 5 * moment : 2 * P + G + 2 * moment; break;
  }
  return step + (master ? P + b.weight : 0.0);
}

double optimizer_step_time_s(double trainable_params, const HardwareSpec& hw, double bytes_per_param) {
  return trainable_params * bytes_per_param / (hw.hbm_bandwidth_bytes_per_s * hw.efficiency.optimizer_bandwidth_factor);
}

}  // namespace ftplan

#include "planner/precision.h"

namespace ftplan {

ParamBytes trainable_param_bytes(Precision precision, Optimizer optimizer, bool paged) {
  // Optimizer moments: AdamW keeps two, SGD with momentum one; 8-bit AdamW one byte per moment.
  auto moments = [&](double bytes_per_moment) {
    switch (optimizer) {
      case Optimizer::adamw: return 2 * bytes_per_moment;
      case Optimizer::adamw8bit: return 2.0;
      case Optimizer::sgd: return bytes_per_moment;
    }
    return 0.0;
  };
  switch (precision) {
    case Precision::mixed: return {2, 2, 4 + moments(4)};             // fp32 master + fp32 moments
    case Precision::mixed_fp32_grads: return {2, 4, 4 + moments(4)};  // Megatron/DeepSpeed's 18
    case Precision::amp: return {4, 4, moments(4)};                   // fp32 weights, autocast to bf16
    case Precision::bf16: return {2, 2, moments(paged ? 4 : 2)};      // torchtune/litgpt (bitsandbytes' paged: fp32 moments)
    case Precision::fp32: return {4, 4, moments(4)};
  }
  return {0, 0, 0};
}

int activation_bytes(Precision precision) { return precision == Precision::fp32 ? 4 : 2; }

int64_t nf4_storage_bytes(int64_t numel, bool double_quant) {
  const int64_t blocks = (numel + 63) / 64;
  if (!double_quant) return (numel + 1) / 2 + blocks * 4;  // an fp32 absmax per block
  return (numel + 1) / 2 + blocks + (blocks + 255) / 256 * 4;
}

double frozen_weight_bytes(Precision precision) { return precision == Precision::fp32 ? 4.0 : 2.0; }

}  // namespace ftplan

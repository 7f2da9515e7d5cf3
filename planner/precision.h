// Bytes per parameter under each precision convention and optimizer, and the 4-bit NF4 format.
// The convention is always named in the output, because tools disagree (8, 16, 18 or 20 B/param).
#pragma once

#include "planner/training_setup.h"  // Precision, Method

namespace ftplan {

struct ParamBytes {
  double weight;     // working copy used in forward/backward, e.g. 2 (bf16)
  double gradient;   // e.g. 2 (bf16) or 4 (fp32 accumulation)
  double optimizer;  // everything the optimizer keeps, fp32 master copy included, e.g. 12
};

// Bytes per *trainable* parameter. Mixed precision with AdamW: 2 + 2 + (4 master + 4 m + 4 v) = 16,
// the ZeRO paper's K = 12 (Rajbhandari et al. 2020, sec. 3.1). 8-bit AdamW keeps m and v in one byte
// each (Dettmers et al. 2022); SGD with momentum keeps one moment.
// paged: bitsandbytes' Paged* optimizers (the optimizers ftplan pages are bitsandbytes'), whose 32-bit
// AdamW keeps fp32 moments whatever the parameter's dtype (Optimizer2State.init_state:
// get_state_buffer(p, dtype=torch.float32), bitsandbytes/optim/optimizer.py at
// 06029dd6edcc719e5831443179bcb206c6355093): 8 B per parameter under pure bf16, not 4.
ParamBytes trainable_param_bytes(Precision precision, Optimizer optimizer, bool paged = false);

// Bytes of one activation element: 2 under mixed/amp/bf16 compute, 4 under fp32.
int activation_bytes(Precision precision);

// Bytes per frozen parameter as stored (LoRA's base weights): bf16 unless fp32. Under amp the
// trainable weights (the adapters) are fp32 and the frozen base is taken as loaded in bf16
// (torch_dtype=bfloat16, as PEFT's and TRL's LoRA examples load it).
double frozen_weight_bytes(Precision precision);

// NF4 with block size 64 and double quantization (QLoRA, Dettmers et al. 2023, sec. 3):
// 4 bits + an 8-bit absmax per 64 weights + an fp32 absmax per 256 blocks = 4.127 bits; without
// double quantization an fp32 absmax per 64 weights: 4.5 bits (bitsandbytes functional.py
// quantize_4bit, blocksize 64, L1164-L1272 at 64d382da786ad2dd51337496f35a6b516a695352).
constexpr double kNf4BitsPerParam = 4.0 + 8.0 / 64.0 + 32.0 / (64.0 * 256.0);
constexpr double kNf4BytesPerParam = kNf4BitsPerParam / 8.0;
// Exact bytes of one tensor of `numel` weights in NF4, as bitsandbytes stores it: two codes per
// byte, one absmax byte per block of 64 (the last one partial), one fp32 per 256 blocks (the last
// group partial). kNf4BytesPerParam × numel when numel is a multiple of 64 × 256. Without double
// quantization: two codes per byte and one fp32 absmax per block of 64.
int64_t nf4_storage_bytes(int64_t numel, bool double_quant = true);

}  // namespace ftplan
